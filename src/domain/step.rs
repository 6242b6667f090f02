//! The one interface between the engine and the workflows' steps ([`WorkflowStep`]): what
//! the engine asks of a step, whichever workflow it belongs to, and the bookend stages
//! every run kind shares.

use super::run_kind::RunKind;

/// The stage name of the bookend step that marks a run in flight.
pub const ACCEPT: &str = "accept";
/// The stage name of the `plan` step.
pub const PLAN: &str = "plan";
/// The stage name of the step that clears the in-flight marks.
pub const FINISH: &str = "finish";
/// What the engine asks of a step, whichever workflow it belongs to: the one interface
/// between the engine and the workflows' steps. Each workflow's step type implements it
/// in the workflow's folder.
pub trait WorkflowStep {
    /// The step's name on the wire, e.g. `drain` or `etcd-restart`.
    fn name(&self) -> &'static str;
    /// The stage's name on the wire, e.g. `workers` or `etcd-roll`.
    fn stage_name(&self) -> &'static str;
    /// The node (or etcd member) the step acts on, if any.
    fn node(&self) -> Option<&str>;
    /// The kind of run the step belongs to: whose executor carries it out.
    fn run_kind(&self) -> RunKind;
    /// The worker whose cycle the step belongs to, when it runs beside the others of its
    /// batch.
    fn lane(&self) -> Option<&str> {
        None
    }
    /// What the engine treats the step as.
    fn role(&self) -> StepRole {
        StepRole::Work
    }
    /// A step of the workers' batches (a gate, a worker's cycle, a soak): a worker left
    /// behind does not stop the batches that follow.
    fn among_workers(&self) -> bool {
        false
    }
    /// Whether it starts work a maintenance window must allow (the gate in front of a
    /// node's drain or a member's restart, a leadership move); steps of a node in hand,
    /// soaks and post-flight never wait.
    fn waits_for_window(&self) -> bool {
        false
    }
    /// Whether it waits outside the cluster, before the run takes the cluster's lock (a
    /// fleet wave's wait for its upstreams): a run whose steps so far are all such steps
    /// holds nothing, and takes the lock through the queue when it leaves them.
    fn outside_the_cluster(&self) -> bool {
        false
    }
}

/// What the engine treats a step as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepRole {
    /// Waits for the gate to open; started only from the queue.
    Gate,
    /// Cordon and drain: a node's cycle begins with it.
    Drain,
    /// Undo the cordon: a node's cycle ends with it.
    Uncordon,
    /// The wait after a node or a batch is back.
    Soak,
    /// Judges the batch just soaked against the nodes beside it (`gate.analysis`):
    /// carried out by the analysis executor, whatever the run's kind.
    Analysis,
    /// Anything else.
    Work,
}

/// A stored or posted step that does not describe a known step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step {stage}/{name}: {why}")]
pub struct StepError {
    stage: String,
    name: String,
    why: String,
}

impl StepError {
    /// Step `stage`/`name` is refused for `why`.
    pub fn new(stage: &str, name: &str, why: &str) -> Self {
        Self {
            stage: stage.to_owned(),
            name: name.to_owned(),
            why: why.to_owned(),
        }
    }
}
