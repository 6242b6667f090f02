//! The narrow traits the worker drives the world through. Later adapters (kube, ssh,
//! etcd, prometheus, notify) implement them; the worker only sees these.

use crate::domain::engine::StepOutcome;
use crate::domain::run::{Run, RunKind};
use std::collections::HashMap;
use std::sync::Arc;

/// Carries out the steps of one run kind. A step must be idempotent: after a crash it is
/// executed again from the start.
#[async_trait::async_trait]
pub trait StepExecutor: Send + Sync {
    /// Executes step `index` of `run`.
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome;
}

/// The executors the worker knows, by run kind.
#[derive(Clone, Default)]
pub struct Executors(HashMap<RunKind, Arc<dyn StepExecutor>>);

impl Executors {
    /// Registers `executor` for `kind`.
    pub fn with(mut self, kind: RunKind, executor: Arc<dyn StepExecutor>) -> Self {
        self.0.insert(kind, executor);
        self
    }
    /// The executor for `kind`, if any.
    pub fn get(&self, kind: RunKind) -> Option<Arc<dyn StepExecutor>> {
        self.0.get(&kind).cloned()
    }
}
