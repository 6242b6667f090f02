//! How a kind of run is asked for: the door each workflow that makes runs registers, and
//! its requests as the queue carries them. The HTTP intake, the queue's bindings and
//! decoding, the scopes and the metrics read the doors; nothing below the registry names a
//! workflow's request type.

use serde_json::Value;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use utoipa::openapi::{RefOr, schema::Schema};

use super::input::FieldErrors;
use super::run::{FailurePolicy, Run, RunKind, RunStatus};
use super::scope::Scope;
use super::step_kind::StepType;

/// A workflow's request for a run, read and checked once: the typed form the queue carries
/// and the workflow makes its run from.
pub trait RunRequest: fmt::Debug + Send + Sync + 'static {
    /// The request as JSON: the event's `data`, and the run's `request`.
    fn to_json(&self) -> Value;
    /// The request as its own type, for the workflow that reads it back.
    fn as_any(&self) -> &dyn Any;
}

/// Reads a request from JSON, with every problem found.
pub type ReadRequest = fn(&Value) -> Result<Arc<dyn RunRequest>, FieldErrors>;

/// Makes the run a request asks for, with id `id`, accepted at `now`; `None` for a request
/// of another workflow's type.
pub type NewRun = fn(String, &dyn RunRequest, &RunPolicy, DateTime<Utc>) -> Option<Run>;

/// Merges a request (from the source named) into a run of the door's kind that waits for
/// the cluster and can still take it in: the nodes taken in, in words, or `None` when the
/// run cannot take it.
pub type MergeRequest = fn(&mut Run, &dyn RunRequest, &str, DateTime<Utc>) -> Option<String>;

/// A type's schema for the API's description: its name, and its definition with those of
/// the types it refers to.
pub struct NamedSchemas {
    /// The type's name, which references use.
    pub name: String,
    /// Its schema, and every schema it refers to.
    pub all: Vec<(String, RefOr<Schema>)>,
}

/// The schemas of `T`.
pub fn schema_of<T: utoipa::ToSchema>() -> NamedSchemas {
    let mut all = vec![(T::name().into_owned(), T::schema())];
    T::schemas(&mut all);
    NamedSchemas {
        name: T::name().into_owned(),
        all,
    }
}

/// An answer a door gives beside the common ones (202 with a new run, 200 with the run in
/// flight, 422, 503), for the API's description.
#[derive(Debug)]
pub struct DoorAnswer {
    /// The HTTP status.
    pub status: u16,
    /// What it means.
    pub description: &'static str,
    /// Its body's schema; `None`: the API's error body.
    pub body: Option<fn() -> NamedSchemas>,
}

/// What every new run is made with, whichever its workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunPolicy {
    /// What the run does when a step gives up.
    pub on_failure: FailurePolicy,
    /// Whether upgrades wait for the fleet's upstream clusters first.
    pub asks_upstreams: bool,
}

/// The names a kind of run is asked for by, and how its requests are read off the queue.
#[derive(Debug)]
pub struct RunDoor {
    /// The steps of the runs it makes, and their kind: read back from the store and the
    /// API once registered (`workflows::register`).
    pub steps: StepType,
    /// The route under `/v1` its requests are posted to, e.g. `reboots`.
    pub path: &'static str,
    /// The scope a client needs to post there.
    pub scope: Scope,
    /// The CloudEvents `type` of its requests on the queue, e.g. `rollgate.reboot.v1`.
    pub event_type: &'static str,
    /// The AMQP routing key its requests are published with.
    pub routing_key: &'static str,
    /// A short label for metrics and logs.
    pub label: &'static str,
    /// Reads a request published to the queue (which nobody answers: never a dry run).
    pub read_published: ReadRequest,
    /// Makes the run a request asks for.
    pub new_run: NewRun,
    /// How a request that names no run joins a run of this kind that waits for the
    /// cluster, for a workflow whose requests merge (reboots); `None`: each makes its run.
    pub merge: Option<MergeRequest>,
    /// One run of this kind at a time per cluster: a new one fails while another is
    /// active, naming it.
    pub one_at_a_time: bool,
    /// What a request asks for, in a line, for the API's description.
    pub summary: &'static str,
    /// The request body's schema.
    pub body: fn() -> NamedSchemas,
    /// Answers beside the common ones.
    pub answers: &'static [DoorAnswer],
}

impl RunDoor {
    /// The kind of run it makes.
    pub fn kind(&self) -> RunKind {
        self.steps.run_kind
    }

    /// The run of this door's kind that waits for the cluster among `runs`, for a door
    /// whose requests merge: a request that names no run joins it rather than make a run
    /// of its own.
    pub fn waiting_run(&self, runs: impl IntoIterator<Item = Run>) -> Option<Run> {
        self.merge?;
        runs.into_iter()
            .find(|r| r.kind == self.kind() && r.status == RunStatus::Queued)
    }
}

/// The doors of every workflow that makes runs: the registry's, handed down to the layers
/// that cannot see the workflows.
#[derive(Debug, Clone, Copy)]
pub struct Doors(pub &'static [&'static RunDoor]);

impl Doors {
    /// Every door.
    pub fn iter(self) -> impl Iterator<Item = &'static RunDoor> {
        self.0.iter().copied()
    }

    /// The scope a request to the door at `path` (under `/v1`) needs, if a door is there.
    pub fn scope_at(self, path: &str) -> Option<Scope> {
        self.by_path(path).map(|d| d.scope)
    }

    /// The door at `path` (under `/v1`).
    pub fn by_path(self, path: &str) -> Option<&'static RunDoor> {
        self.iter().find(|d| d.path == path)
    }
}

/// A request for a run as it travels on the queue: whose door it came through, the run id
/// chosen at intake (if the HTTP intake already named the run), and the request.
#[derive(Debug, Clone)]
pub struct RunAsked {
    /// The door, which names the kind of run.
    pub door: &'static RunDoor,
    /// The run id chosen at intake, if any.
    pub run_id: Option<String>,
    /// The request, typed by its workflow.
    pub request: Arc<dyn RunRequest>,
}

impl PartialEq for RunAsked {
    fn eq(&self, other: &Self) -> bool {
        self.door.kind() == other.door.kind()
            && self.run_id == other.run_id
            && self.request.to_json() == other.request.to_json()
    }
}
