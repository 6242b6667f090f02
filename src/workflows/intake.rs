//! A workflow's intake: the checks a request for one of its runs passes before anything is
//! queued. The HTTP API drives it through one handler for every workflow; the workflow
//! speaks no HTTP, only these answers and refusals.

use serde_json::Value;
use std::sync::Arc;

use crate::domain::input::FieldErrors;
use crate::domain::run::Run;
use crate::domain::run_request::{RunDoor, RunRequest};

/// Why a request is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It cannot be carried out as asked: asking again will not help.
    #[error("{0}")]
    Invalid(String),
    /// It cannot be checked now (a part it needs did not answer): ask again later.
    #[error("{0}")]
    Unavailable(String),
    /// Another run is in the way.
    #[error("{message}")]
    Conflict {
        /// A word for scripts, e.g. `upgrade_in_flight`.
        code: &'static str,
        /// What is in the way, and what to do.
        message: String,
    },
}

/// What a request that passed the first checks makes.
#[derive(Debug)]
pub enum Admit {
    /// A run of its own (unless one of its kind and target is in flight).
    New,
    /// This answer, and nothing queued: a dry run.
    Answer(Value),
    /// Nothing of its own: it is queued naming no run, and joins this run, which waits
    /// for the cluster (the door's `merge`).
    MergeInto(Box<Run>),
}

/// The checks of one workflow's requests, with what they need.
#[async_trait::async_trait]
pub trait Intake: Send + Sync {
    /// The workflow's door: its kind, route, scope and event type.
    fn door(&self) -> &'static RunDoor;

    /// Reads a posted body: what the API takes (a dry run too, where the workflow has
    /// them); by default what the queue takes.
    fn read_posted(&self, body: &Value) -> Result<Arc<dyn RunRequest>, FieldErrors> {
        (self.door().read_published)(body)
    }

    /// The checks every request passes first, and what it makes.
    async fn admit(&self, _request: &Arc<dyn RunRequest>) -> Result<Admit, Refusal> {
        Ok(Admit::New)
    }

    /// The checks a new run passes, made only when no run of its kind and target is in
    /// flight (a repeated request is answered with that run, unchecked).
    async fn check(&self, _request: &Arc<dyn RunRequest>) -> Result<(), Refusal> {
        Ok(())
    }

    /// The refusal of a new run while `holder`, of the same kind, holds the cluster (for a
    /// door that takes one run at a time).
    fn held(&self, holder: &Run) -> Refusal {
        Refusal::Conflict {
            code: "run_in_flight",
            message: format!(
                "run {} ({}) is {}: one at a time; let it finish, or resume or abort it first",
                holder.id,
                holder.kind.name(),
                holder.status
            ),
        }
    }
}
