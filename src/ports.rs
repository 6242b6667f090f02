//! The narrow traits the worker drives the world through. Adapters (prometheus, notify,
//! and later kube, ssh, etcd) implement them; the worker and the gate only see these.

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::Arc;

use crate::domain::engine::StepOutcome;
use crate::domain::gate::PromReading;
use crate::domain::run::{Run, RunStatus, Step};

/// Carries out one kind of step. A step must be idempotent: after a crash it is executed
/// again from the start.
#[async_trait::async_trait]
pub trait StepExecutor: Send + Sync {
    /// Executes step `index` of `run`.
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome;
}

/// The executors the worker knows, by step name.
#[derive(Clone, Default)]
pub struct Executors(HashMap<String, Arc<dyn StepExecutor>>);

impl Executors {
    /// Registers `executor` for steps named `name`.
    pub fn with(mut self, name: &str, executor: Arc<dyn StepExecutor>) -> Self {
        self.0.insert(name.to_owned(), executor);
        self
    }
    /// The executor for `step`, if any.
    pub fn get(&self, step: &Step) -> Option<Arc<dyn StepExecutor>> {
        self.0.get(&step.name).cloned()
    }
}

/// Answers PromQL instant queries.
#[async_trait::async_trait]
pub trait MetricsSource: Send + Sync {
    /// The series `promql` returns now, or why there is no usable answer.
    async fn query(&self, promql: &str) -> PromReading;
}

/// One transition of one run, as people are told about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The run.
    pub run_id: String,
    /// Its kind, e.g. `k8s-upgrade`.
    pub kind: String,
    /// Its target version, if any.
    pub target: Option<String>,
    /// Status before (`None` when the run was created).
    pub from: Option<RunStatus>,
    /// Status after.
    pub to: RunStatus,
    /// The step in hand, with its node.
    pub step: Option<String>,
    /// Why.
    pub reason: String,
    /// What holds the run, if a gate does.
    pub blockers: Vec<String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// Tells people about transitions. Never fails and never blocks the caller: a sink counts
/// and logs its own failures.
pub trait Notifier: Send + Sync {
    /// Sends `notice` in the background.
    fn notify(&self, notice: Notice);
}
