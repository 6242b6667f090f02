//! Runs: what was asked, where it stands, and every transition it went through.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::any::Any;
use std::fmt;
use std::sync::{Arc, OnceLock};

use super::analysis::Finding;
use super::input::FieldErrors;

pub use super::run_kind::RunKind;
use super::shared_list::SharedList;
use super::step_kind::StepKind;

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Accepted, not started (or no executor can start it yet).
    Queued,
    /// A step is in hand.
    Running,
    /// Waiting on a gate or a timer; a wake is scheduled.
    Waiting,
    /// Held by an operator or by a rule; `resume` continues it.
    Halted,
    /// Stopped on an error.
    Failed,
    /// Every step done.
    Succeeded,
    /// Stopped by an operator.
    Aborted,
}

impl RunStatus {
    /// Every status, for metrics.
    pub const ALL: [RunStatus; 7] = [
        Self::Queued,
        Self::Running,
        Self::Waiting,
        Self::Halted,
        Self::Failed,
        Self::Succeeded,
        Self::Aborted,
    ];
    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Halted => "halted",
            Self::Failed => "failed",
            Self::Succeeded => "succeeded",
            Self::Aborted => "aborted",
        }
    }
    /// The status with this name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
    /// Nothing more will happen to a run in this status.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Failed | Self::Succeeded | Self::Aborted)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    /// Not started.
    Pending,
    /// In hand.
    Running,
    /// Started, waiting on a gate or timer before it can go on.
    Waiting,
    /// Finished.
    Done,
    /// Gave up.
    Failed,
}

/// What holds a waiting step, when something other than its own clock does: the engine
/// and the worker match it, the outcome's words are for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Held {
    /// A closed (or unknown) gate: a board change wakes it, and past `gate.halt_after` the
    /// run halts.
    Gate,
    /// An operator's approval (`POST /v1/runs/{id}/approve`).
    Approval,
}

/// One idempotent step of a run's plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Step {
    /// What the step does; on the wire its `stage`, `name` and `node`.
    #[serde(flatten)]
    pub kind: StepKind,
    /// Pending, running, waiting, done or failed.
    pub status: StepStatus,
    /// How many times it was started.
    pub attempts: u32,
    /// First start.
    pub started_at: Option<DateTime<Utc>>,
    /// When it finished or gave up.
    pub ended_at: Option<DateTime<Utc>>,
    /// The last outcome, in words.
    pub outcome: Option<String>,
    /// What holds it while it waits: a closed gate or an approval (none: its own clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// The epoch it was last started or scheduled with: its outcome and its wake carry it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
    /// When a waiting step comes back (its wake is in the queue under `epoch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<DateTime<Utc>>,
    /// A batch analysis step's last verdicts on its batch, one per `gate.analysis`, with
    /// the figures behind them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
}

/// A run's steps, in plan order, shared between the run's copies: the run as a step
/// started costs one pointer per step, and an outcome copies the one step it changes.
pub type Steps = SharedList<Step>;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Step {
    /// A pending step.
    pub fn new(kind: impl Into<StepKind>) -> Self {
        Self {
            kind: kind.into(),
            status: StepStatus::Pending,
            attempts: 0,
            started_at: None,
            ended_at: None,
            outcome: None,
            held: None,
            epoch: 0,
            wake_at: None,
            findings: Vec::new(),
        }
    }
    /// `stage/name@node`, leaving out what is empty or repeated.
    pub fn label(&self) -> String {
        self.kind.label()
    }

    /// Whether it waits, held by `what`.
    pub fn is_held(&self, what: Held) -> bool {
        self.status == StepStatus::Waiting && self.held == Some(what)
    }
}

/// One change of a run's status, kept forever in its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Transition {
    /// When it happened (UTC).
    pub at: DateTime<Utc>,
    /// The status before; `None` when the run was created.
    pub from: Option<RunStatus>,
    /// The status after.
    pub to: RunStatus,
    /// The step in hand, if any.
    pub step: Option<String>,
    /// Why, in words an operator can act on; kept in the history.
    pub reason: String,
    /// Who caused it: the API client (its token's name) or the AMQP message's source;
    /// none when rollgate did it on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// One transition of one run as the event stream (`GET /v1/events`) carries it: numbered
/// in the order the store committed it, so that a client that reconnects with the last
/// number it saw misses none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunEvent {
    /// Its number in the stream (the SSE id), rising.
    pub seq: i64,
    /// The run's id.
    pub run_id: String,
    /// The run's kind.
    pub kind: RunKind,
    /// The run's target, if any.
    pub target: Option<String>,
    /// The transition.
    #[serde(flatten)]
    pub transition: Transition,
    /// What held the run, when this was its newest transition and a gate held it.
    pub blockers: Vec<String>,
}

/// A run in a line, as lists show it (`GET /v1/runs?view=summary`, the status page,
/// `rollgate runs list`): small, and kept beside the run in the store so that a list of
/// hundreds of runs reads no steps or history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunSummary {
    /// The run's id.
    pub id: String,
    /// What it does.
    pub kind: RunKind,
    /// Its target, if any.
    pub target: Option<String>,
    /// Where it stands.
    pub status: RunStatus,
    /// Why, in words.
    pub reason: String,
    /// Steps done.
    pub steps_done: usize,
    /// Steps planned so far.
    pub steps_total: usize,
    /// The step in hand (or last acted on), `stage/name@node`, if any.
    pub step: Option<String>,
    /// Every step in hand, `stage/name@node`: several while a batch's workers go through
    /// their cycles together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_hand: Vec<String>,
    /// The workers left behind, cordoned, after their cycle gave up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_behind: Vec<String>,
    /// What holds it, if a gate does.
    pub blockers: Vec<String>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last transition.
    pub updated_at: DateTime<Utc>,
}

/// What to do when a step gives up.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum FailurePolicy {
    /// Hold the run so an operator can fix things and resume.
    #[default]
    Halt,
    /// End the run as failed.
    Fail,
}

/// What earlier steps of a run learned that later steps need, in typed fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunMemory {
    /// etcd roll: the raft term when the roll began, recorded by its `begin` step.
    /// Kubernetes upgrade: the raft term at pre-flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_start_term: Option<u64>,
    /// Kubernetes upgrade: the etcd leadership moves rollgate made, `from -> to`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leader_moves: Vec<String>,
}

/// Something a step learned, for [`RunMemory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Learned {
    /// The raft term at the start of an etcd roll or an upgrade.
    EtcdStartTerm(u64),
    /// rollgate moved etcd leadership (`from -> to`).
    LeaderMoved(String),
}

impl RunMemory {
    /// Keeps what a step learned.
    pub fn keep(&mut self, learned: Learned) {
        match learned {
            Learned::EtcdStartTerm(term) => self.etcd_start_term = Some(term),
            Learned::LeaderMoved(moved) => self.leader_moves.push(moved),
        }
    }
}

/// An upgrade run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Run {
    /// Unique id (UUID v7, so ids sort by creation).
    pub id: String,
    /// What it does.
    pub kind: RunKind,
    /// The request as accepted. Change it with [`Run::set_request`], which forgets the
    /// reading of the one before.
    #[schema(value_type = Object)]
    pub request: Value,
    /// The request read into its workflow's type, by the first step that asked.
    #[serde(skip)]
    #[schema(ignore)]
    pub(crate) read: ReadOnce,
    /// The version it upgrades to, when it has one; used to find duplicates.
    pub target: Option<String>,
    /// Its status; `reason` says why it stands there.
    pub status: RunStatus,
    /// Why it stands there.
    pub reason: String,
    /// The plan.
    #[schema(value_type = Vec<Step>)]
    pub steps: Steps,
    /// Index of the step last started, finished or held: the one its transitions name.
    pub current_step: Option<usize>,
    /// Indexes of the steps in hand: started, or waiting on their wake.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_hand: Vec<usize>,
    /// Every step before this index is done (or belongs to a worker left behind): where the
    /// engine looks for what may start, instead of scanning the whole plan.
    #[serde(default)]
    pub cursor: usize,
    /// Indexes of the steps that gave up and left their worker behind, within the failure
    /// budget.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_behind: Vec<usize>,
    /// Why the run halts once the steps in hand have finished (a rule's halt, as opposed
    /// to an operator's), while they finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt_pending: Option<String>,
    /// When a waiting run wakes.
    pub wake_at: Option<DateTime<Utc>>,
    /// Bumped whenever work is scheduled or cancelled; stale wakes and step results carry
    /// an older epoch and are ignored.
    pub epoch: u64,
    /// An operator asked to halt while a step was in hand.
    pub halt_requested: bool,
    /// Who asked for that halt, credited when it is applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt_requested_by: Option<String>,
    /// Since when the step in hand has been held by a closed gate.
    #[serde(default)]
    pub blocked_since: Option<DateTime<Utc>>,
    /// Who approved the run, when it waited for an approval (`fleet.require_approval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// What holds it: the gate's blocking alerts, or why the gate is unknown.
    #[serde(default)]
    pub blockers: Vec<String>,
    /// What to do when a step gives up.
    pub on_failure: FailurePolicy,
    /// What earlier steps learned that later steps need.
    #[serde(default)]
    pub memory: RunMemory,
    /// When the run was accepted; runs list newest first by it.
    pub created_at: DateTime<Utc>,
    /// When anything of the run last changed.
    pub updated_at: DateTime<Utc>,
    /// Its transitions: every one when read for a view, only those since it was read when
    /// read for work (see `history_before`).
    pub history: Vec<Transition>,
    /// How many transitions come before `history[0]` that this copy does not hold: a run
    /// read for a step reads its steps, not its past, and the worker forgets what it has
    /// written. Never stored.
    #[serde(skip)]
    #[schema(ignore)]
    pub history_before: usize,
    /// What changed since the run was read from the store or last written to it: what the
    /// next commit writes.
    #[serde(skip)]
    #[schema(ignore)]
    pub touched: Touched,
}

/// A request type a run's JSON request is read into: each workflow's.
pub trait ReadRequest: Sized + Send + Sync + 'static {
    /// Reads and validates the request.
    fn read(json: &Value) -> Result<Self, FieldErrors>;
}

/// A run's request read into its workflow's type once, and kept with the run in memory:
/// the steps that follow share the reading. Never part of a run's equality, never stored.
#[derive(Clone, Default)]
pub(crate) struct ReadOnce(OnceLock<Arc<dyn Any + Send + Sync>>);

impl fmt::Debug for ReadOnce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "read"
        } else {
            "unread"
        })
    }
}

impl PartialEq for ReadOnce {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The steps of a run changed since it was read or written, so that a commit writes those
/// alone. Never part of a run's equality. A run not read from the store (new, or decoded
/// from elsewhere) has every step to write.
#[derive(Debug, Clone)]
pub struct Touched {
    /// Every step (a new run, or a plan that replaced steps).
    pub all: bool,
    /// These steps, by index.
    pub steps: std::collections::BTreeSet<usize>,
    /// How many of the run's transitions the store holds.
    pub logged: usize,
}

impl Default for Touched {
    fn default() -> Self {
        Self {
            all: true,
            steps: Default::default(),
            logged: 0,
        }
    }
}

impl Touched {
    /// Nothing to write: the run as the store holds it, with `logged` transitions.
    pub fn nothing(logged: usize) -> Self {
        Self {
            all: false,
            steps: Default::default(),
            logged,
        }
    }
}

impl PartialEq for Touched {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Run {
    /// A new queued run.
    pub fn new(
        id: String,
        kind: RunKind,
        request: Value,
        target: Option<String>,
        steps: Vec<Step>,
        now: DateTime<Utc>,
        reason: impl Into<String>,
    ) -> Self {
        let reason = reason.into();
        Self {
            id,
            kind,
            request,
            read: ReadOnce::default(),
            target,
            status: RunStatus::Queued,
            reason: reason.clone(),
            steps: steps.into(),
            current_step: None,
            in_hand: Vec::new(),
            cursor: 0,
            left_behind: Vec::new(),
            halt_pending: None,
            wake_at: None,
            epoch: 0,
            halt_requested: false,
            halt_requested_by: None,
            blocked_since: None,
            approved_by: None,
            blockers: Vec::new(),
            on_failure: FailurePolicy::default(),
            memory: RunMemory::default(),
            created_at: now,
            updated_at: now,
            history: vec![Transition {
                at: now,
                from: None,
                to: RunStatus::Queued,
                step: None,
                reason,
                by: None,
            }],
            history_before: 0,
            touched: Touched::default(),
        }
    }

    /// The request as its workflow's type `T`: read the first time it is asked for, then
    /// kept, so the run's steps do not each read it again.
    pub fn request_as<T: ReadRequest>(&self) -> Result<Arc<T>, FieldErrors> {
        if let Some(read) = self.read.0.get()
            && let Ok(request) = read.clone().downcast::<T>()
        {
            return Ok(request);
        }
        let request = Arc::new(T::read(&self.request)?);
        // A run read as another type keeps that reading; this one is answered all the same.
        let _ = self.read.0.set(request.clone());
        Ok(request)
    }

    /// Replaces the request (a merge): the next reading is of the new one.
    pub fn set_request(&mut self, request: Value) {
        self.request = request;
        self.read = ReadOnce::default();
    }

    /// Step `index`, to change: the next commit writes it.
    pub fn step_mut(&mut self, index: usize) -> &mut Step {
        self.touched.steps.insert(index);
        &mut self.steps[index]
    }

    /// The steps changed in more places than one: the next commit writes them all.
    pub fn touch_all_steps(&mut self) {
        self.touched.all = true;
    }

    /// `self` with `on_failure` as its policy when a step gives up.
    pub fn failing(mut self, on_failure: FailurePolicy) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Whether this run holds the cluster's one lock while it has not ended. Every kind
    /// does: upgrades and reboots take nodes down; an etcd roll restarts members on those
    /// nodes, and a node drained under a roll's restart can take a second member away where
    /// the quorum allowed one. A run that still waits outside the cluster (a fleet wave's
    /// upstreams) holds nothing yet: a weekly reboot need not wait a soak of days for it.
    pub fn holds_cluster(&self) -> bool {
        !self.outside_the_cluster()
    }

    /// How many of the first steps wait outside the cluster, before the run needs its lock.
    pub fn steps_outside_the_cluster(&self) -> usize {
        self.steps
            .iter()
            .take_while(|s| s.kind.outside_the_cluster())
            .count()
    }

    /// Whether the run is still at one of its first steps that wait outside the cluster.
    pub fn outside_the_cluster(&self) -> bool {
        self.cursor < self.steps_outside_the_cluster()
            && self.steps[self.cursor].status != StepStatus::Done
    }

    /// The step in hand or held.
    pub fn current(&self) -> Option<&Step> {
        self.current_step.and_then(|i| self.steps.get(i))
    }

    /// The steps in hand.
    pub fn steps_in_hand(&self) -> impl Iterator<Item = &Step> {
        self.in_hand.iter().filter_map(|&i| self.steps.get(i))
    }

    /// The workers left behind, cordoned, after their cycle gave up.
    pub fn workers_left_behind(&self) -> impl Iterator<Item = &str> {
        self.left_behind
            .iter()
            .filter_map(|&i| self.steps.get(i).and_then(|s| s.kind.lane()))
    }

    /// A run stored before several steps could be in hand kept its one step in hand in
    /// `current_step`, under the run's epoch: it is taken into `in_hand`.
    pub fn adopt_single_step_in_hand(&mut self) {
        if !self.in_hand.is_empty()
            || !matches!(self.status, RunStatus::Running | RunStatus::Waiting)
        {
            return;
        }
        if let Some(i) = self.current_step
            && let Some(step) = self.steps.get(i)
            && step.epoch == 0
            && step.status != StepStatus::Done
        {
            let epoch = self.epoch;
            self.step_mut(i).epoch = epoch;
            self.in_hand.push(i);
        }
    }

    /// The steps in hand that were running (to redo after a restart) with their epochs.
    pub fn running_in_hand(&self) -> Vec<(usize, u64)> {
        self.in_hand
            .iter()
            .filter(|&&i| {
                self.steps
                    .get(i)
                    .is_some_and(|s| s.status == StepStatus::Running)
            })
            .map(|&i| (i, self.steps[i].epoch))
            .collect()
    }

    /// Records `reason` in the history without changing the status.
    pub fn note(&mut self, reason: impl Into<String>, now: DateTime<Utc>) {
        self.history.push(Transition {
            at: now,
            from: Some(self.status),
            to: self.status,
            step: self.current().map(Step::label),
            reason: reason.into(),
            by: None,
        });
        self.updated_at = now;
    }

    /// How many transitions the run has made, held here or not.
    pub fn history_len(&self) -> usize {
        self.history_before + self.history.len()
    }

    /// The transitions from number `since` on (counted over the whole history), each with
    /// its number; those before `history_before` are not held, so not given.
    pub fn history_since(&self, since: usize) -> impl Iterator<Item = (usize, &Transition)> {
        let skip = since.saturating_sub(self.history_before);
        self.history
            .iter()
            .enumerate()
            .skip(skip)
            .map(|(i, t)| (self.history_before + i, t))
    }

    /// Lets go of the transitions the store holds (`touched.logged`): a run in hand keeps
    /// its size as its history grows. Those not yet written stay.
    pub fn forget_logged_history(&mut self) {
        let logged = self
            .touched
            .logged
            .saturating_sub(self.history_before)
            .min(self.history.len());
        self.history.drain(..logged);
        self.history_before += logged;
    }

    /// Credits `by` with the transitions from number `since` on that no one is credited
    /// with yet.
    pub fn credit(&mut self, since: usize, by: &str) {
        let skip = since.saturating_sub(self.history_before);
        for t in self.history.iter_mut().skip(skip) {
            if t.by.is_none() {
                t.by = Some(by.to_owned());
            }
        }
    }

    /// The run with its whole history so far credited to `by` (who asked for it).
    pub fn credited(mut self, by: &str) -> Self {
        self.credit(0, by);
        self
    }

    /// The run in a line.
    pub fn summary(&self) -> RunSummary {
        RunSummary {
            id: self.id.clone(),
            kind: self.kind,
            target: self.target.clone(),
            status: self.status,
            reason: self.reason.clone(),
            steps_done: self
                .steps
                .iter()
                .filter(|s| s.status == StepStatus::Done)
                .count(),
            steps_total: self.steps.len(),
            step: self.current().map(Step::label),
            in_hand: self.steps_in_hand().map(Step::label).collect(),
            left_behind: self.workers_left_behind().map(str::to_owned).collect(),
            blockers: self.blockers.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }

    /// Moves to `to` for `reason`, recording a transition unless nothing changed.
    pub fn transition(&mut self, to: RunStatus, reason: impl Into<String>, now: DateTime<Utc>) {
        let reason = reason.into();
        if self.status == to && self.reason == reason {
            return;
        }
        self.history.push(Transition {
            at: now,
            from: Some(self.status),
            to,
            step: self.current().map(Step::label),
            reason: reason.clone(),
            by: None,
        });
        self.status = to;
        self.reason = reason;
        self.updated_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::upgrade_step::UpgradeStep;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static READINGS: AtomicUsize = AtomicUsize::new(0);

    #[derive(Debug, PartialEq)]
    struct Asked(Vec<String>);

    impl ReadRequest for Asked {
        fn read(json: &Value) -> Result<Self, FieldErrors> {
            READINGS.fetch_add(1, Ordering::SeqCst);
            let mut errors = FieldErrors::default();
            match serde_json::from_value(json["nodes"].clone()) {
                Ok(nodes) => Ok(Asked(nodes)),
                Err(e) => {
                    errors.push("nodes", e.to_string());
                    Err(errors)
                }
            }
        }
    }

    /// A run with `n` transitions, the store holding the first `logged`.
    fn with_transitions(n: usize, logged: usize) -> Run {
        let mut run = Run::new(
            "r1".into(),
            crate::domain::upgrade_step::K8S_UPGRADE,
            Value::Null,
            None,
            Vec::new(),
            Utc::now(),
            "t0",
        );
        for i in 1..n {
            run.note(format!("t{i}"), Utc::now());
        }
        run.touched = Touched::nothing(logged);
        run
    }

    fn reasons<'a>(it: impl Iterator<Item = (usize, &'a Transition)>) -> Vec<(usize, String)> {
        it.map(|(i, t)| (i, t.reason.clone())).collect()
    }

    #[test]
    fn a_run_forgets_the_transitions_the_store_holds_and_counts_them_still() {
        // (transitions, logged, forgotten after, held after)
        let cases = [(3, 3, 3, 0), (3, 1, 1, 2), (3, 0, 0, 3), (1, 5, 1, 0)];
        for (n, logged, before, held) in cases {
            let mut run = with_transitions(n, logged);
            run.forget_logged_history();
            assert_eq!(
                (run.history_before, run.history.len(), run.history_len()),
                (before, held, n),
                "{n} transitions, {logged} logged"
            );
            let expected: Vec<_> = (before..n).map(|i| (i, format!("t{i}"))).collect();
            assert_eq!(reasons(run.history_since(0)), expected);
            run.forget_logged_history();
            assert_eq!(
                run.history_before, before,
                "forgetting again changes nothing"
            );
        }
    }

    #[test]
    fn transitions_are_numbered_over_the_whole_history_when_its_past_is_not_held() {
        let mut run = with_transitions(4, 4);
        run.forget_logged_history();
        run.note("t4", Utc::now());
        run.note("t5", Utc::now());
        assert_eq!(run.history_len(), 6);
        assert_eq!(
            reasons(run.history_since(5)),
            [(5, "t5".to_owned())],
            "from a number past what is forgotten"
        );
        assert_eq!(reasons(run.history_since(2)).len(), 2, "from within it");
        run.credit(5, "alice");
        let by: Vec<_> = run.history.iter().map(|t| t.by.as_deref()).collect();
        assert_eq!(
            by,
            [None, Some("alice")],
            "credit counts over the whole history"
        );
    }

    #[test]
    fn a_request_is_read_once_and_read_again_only_when_replaced() {
        let mut run = Run::new(
            "r1".into(),
            crate::domain::upgrade_step::K8S_UPGRADE,
            serde_json::json!({"nodes": ["w1"]}),
            None,
            vec![Step::new(UpgradeStep::Plan)],
            Utc::now(),
            "accepted",
        );
        let before = READINGS.load(Ordering::SeqCst);
        for _ in 0..3 {
            assert_eq!(
                *run.request_as::<Asked>().unwrap(),
                Asked(vec!["w1".into()])
            );
        }
        let copy = run.clone();
        assert_eq!(
            *copy.request_as::<Asked>().unwrap(),
            Asked(vec!["w1".into()])
        );
        assert_eq!(
            READINGS.load(Ordering::SeqCst) - before,
            1,
            "one reading, shared"
        );
        run.set_request(serde_json::json!({"nodes": ["w1", "w2"]}));
        assert_eq!(
            *run.request_as::<Asked>().unwrap(),
            Asked(vec!["w1".into(), "w2".into()])
        );
        assert_eq!(READINGS.load(Ordering::SeqCst) - before, 2);
        run.set_request(serde_json::json!({"nodes": 5}));
        assert!(run.request_as::<Asked>().is_err());
        // Equality ignores what was read.
        assert_eq!(copy, copy.clone());
    }
}
