//! The node cycle's acting half, shared by every workflow that takes nodes out of service:
//! the holds before a drain (blocking pods, budgets), cordon and drain, uncordon, the soak,
//! the self-silences of the nodes in hand and the Kubernetes Events that tell each node's
//! story. A workflow brings its action (the node script, a reboot) and calls these for
//! the rest.

pub mod driver;
pub mod holds;
pub mod plan;

use chrono::Utc;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

use crate::domain::engine::StepOutcome;
use crate::domain::run::{Run, Step};
use crate::domain::self_silence::{self, SilenceMatcher};
use crate::error_chain;
use crate::metrics::Metrics;
use crate::ports::{
    ClusterError, Cordon, DrainError, DrainOptions, NodeDrain, NodeExec, NodeTarget, Silences,
};
use crate::workflows::events::EventSink;
use crate::workflows::node_cycle::holds as drain_holds;
use crate::workflows::node_cycle::plan as node_cycle;

/// The node's own reboot managers that would reboot it while rollgate has it in hand
/// ([`driver::REBOOT_MANAGERS_SCRIPT`]), each a line saying what to change; `Err` when the
/// node could not be read.
pub async fn own_reboot_managers(
    exec: &dyn NodeExec,
    target: &NodeTarget,
) -> Result<Vec<String>, String> {
    let out = exec
        .run_script(target, driver::REBOOT_MANAGERS_SCRIPT, &[])
        .await
        .map_err(|e| error_chain(&e))?;
    driver::reboot_managers(out.status, &out.stdout)
}

/// How the cycle drains and soaks.
#[derive(Debug, Clone)]
pub struct CycleSettings {
    /// How to drain.
    pub drain: DrainOptions,
    /// How long a node (or a batch) soaks before the next.
    pub soak: Duration,
    /// Pods that hold a node's drain while they run there.
    pub blocking_pods: Vec<drain_holds::Requirement>,
    /// How often a held drain looks again (the gate's poll interval).
    pub hold_poll: Duration,
}

/// The ports and settings of the node cycle.
#[derive(Clone)]
pub struct NodeCycle {
    /// Cordons and drains.
    pub nodes: Arc<dyn NodeDrain>,
    /// Drain and soak settings.
    pub settings: CycleSettings,
    /// The silences kept for the nodes in hand (`gate.self_silences`), if any.
    pub silences: Option<SelfSilences>,
    /// Kubernetes Events on the nodes it works on, when a cluster is configured.
    pub events: Option<EventSink>,
}

/// The Alertmanager silence kept for the node in hand while its steps run: extended every
/// third of `ttl` while a step works on it, left to lapse `tail` after its uncordon. A
/// rollgate that dies silences nothing for longer than `ttl`. Failing to reach
/// Alertmanager never fails a step: a silence spares people pages, it guards nothing.
#[derive(Clone)]
pub struct SelfSilences {
    /// Alertmanager.
    pub api: Arc<dyn Silences>,
    /// The configured matchers, `{node}` not yet filled in.
    pub templates: Vec<SilenceMatcher>,
    /// The label of gate alerts, kept out of every silence.
    pub gate_label: String,
    /// How long a silence lasts unless extended.
    pub ttl: Duration,
    /// How long it outlives the node's uncordon.
    pub tail: Duration,
}

impl SelfSilences {
    /// Keeps the silence of `node` in run `run_id` for `span` from now.
    pub async fn keep(&self, node: &str, run_id: &str, span: Duration) {
        let plan = self_silence::plan(&self.templates, &self.gate_label, node, run_id);
        let until = Utc::now() + chrono::Duration::from_std(span).unwrap_or_default();
        match self.api.keep(&plan, until).await {
            Ok(id) => tracing::debug!(%node, silence = %id, %until, "self-silence kept"),
            Err(error) => warn!(%node, %error, "cannot keep the self-silence"),
        }
    }

    /// Keeps the silences of `nodes` for the TTL from now.
    async fn keep_all(&self, nodes: &[String], run_id: &str) {
        for node in nodes {
            self.keep(node, run_id, self.ttl).await;
        }
    }

    /// Runs `work` with the silences of `nodes` (every node in hand: a batch's drained
    /// nodes wait while the others' steps run) kept: at once, then every third of the TTL.
    pub async fn during<T>(
        &self,
        nodes: &[&str],
        run_id: &str,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let nodes: Vec<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
        self.keep_all(&nodes, run_id).await;
        let keeper = tokio::spawn({
            let me = self.clone();
            let run_id = run_id.to_owned();
            async move {
                loop {
                    tokio::time::sleep(me.ttl / 3).await;
                    me.keep_all(&nodes, &run_id).await;
                }
            }
        });
        let out = work.await;
        keeper.abort();
        out
    }
}

impl NodeCycle {
    /// Tells `node`'s story as a Kubernetes Event (`kubectl describe node`).
    pub fn tell(&self, node: &str, reason: &str, action: &str, note: String) {
        if let Some(events) = &self.events {
            events.node(node, reason, action, note);
        }
    }

    /// Before a node is cordoned: what holds its drain (blocking pods, budgets that will
    /// not let a pod go by themselves), as a closed gate holds a step.
    async fn drain_holds(&self, run: &Run, node: &str) -> Result<Vec<String>, ClusterError> {
        if self.nodes.cordon_holder(node, &run.id).await? != Cordon::None {
            // Cordoned already (by this run before a restart, or by someone else): the
            // drain goes on from where it was.
            return Ok(Vec::new());
        }
        let facts = self.nodes.drain_facts(node).await?;
        Ok(drain_holds::holds(
            &facts.pods,
            &facts.budgets,
            &self.settings.blocking_pods,
        ))
    }

    /// What would hold the drain of `node` if it began now (a dry run's look).
    pub async fn holds_now(&self, node: &str) -> Result<Vec<String>, ClusterError> {
        let facts = self.nodes.drain_facts(node).await?;
        Ok(drain_holds::holds(
            &facts.pods,
            &facts.budgets,
            &self.settings.blocking_pods,
        ))
    }

    /// What holds the drain of `node` and of the batch's drains after it that have not
    /// started, each named with its node: a batch is not begun that cannot be finished.
    async fn batch_holds(
        &self,
        run: &Run,
        index: usize,
        node: &str,
    ) -> Result<Vec<String>, ClusterError> {
        let mut reasons = Vec::new();
        let ahead = node_cycle::drains_ahead(&run.steps, index);
        for node in std::iter::once(node).chain(ahead) {
            let holds = self.drain_holds(run, node).await?;
            reasons.extend(holds.into_iter().map(|h| format!("{node}: {h}")));
        }
        Ok(reasons)
    }

    /// Cordons `node` (step `index` of `run`) and evicts its pods, once nothing holds the
    /// drain of it or of the batch's drains ahead.
    pub async fn drain(&self, run: &Run, index: usize, node: &str) -> StepOutcome {
        match self.batch_holds(run, index, node).await {
            Ok(holds) if holds.is_empty() => {}
            Ok(holds) => {
                return StepOutcome::Blocked {
                    reasons: holds,
                    retry_at: Utc::now()
                        + chrono::Duration::from_std(self.settings.hold_poll).unwrap_or_default(),
                };
            }
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        }
        let cordon = match self.nodes.cordon(node, &run.id).await {
            Ok(c) => c,
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        };
        // Told once per drain: a retry or a restart goes on with the same drain.
        if run.steps[index].attempts <= 1 {
            if cordon == Cordon::Ours {
                self.tell(
                    node,
                    "Cordoned",
                    "Cordon",
                    format!("cordoned by rollgate for run {}", run.id),
                );
            }
            self.tell(
                node,
                "DrainStarted",
                "Drain",
                format!("run {} evicts the node's pods", run.id),
            );
        }
        match self.nodes.drain(node, &self.settings.drain).await {
            Ok(report) => {
                self.tell(
                    node,
                    "Drained",
                    "Drain",
                    format!(
                        "{} pod(s) evicted, {} DaemonSet/mirror pod(s) left",
                        report.evicted, report.skipped
                    ),
                );
                StepOutcome::done(format!(
                    "{node} {}; {} pod(s) evicted, {} DaemonSet/mirror pod(s) left, {} PDB refusal(s) waited out",
                    if cordon == Cordon::Theirs {
                        "was already cordoned by someone else (left so)"
                    } else {
                        "cordoned"
                    },
                    report.evicted,
                    report.skipped,
                    report.refusals
                ))
            }
            // The timeout was the retry budget: fail, and give the node back to the
            // scheduler if rollgate took it (the pods that would not leave are named).
            Err(e @ (DrainError::Blocked { .. } | DrainError::Terminating { .. })) => {
                if cordon == Cordon::Theirs {
                    return StepOutcome::failed(format!(
                        "{e}; {node} stays cordoned (not by rollgate)"
                    ));
                }
                if let Some(events) = &self.events {
                    events.node_warning(node, "DrainFailed", "Drain", error_chain(&e));
                }
                match self.nodes.uncordon(node, &run.id).await {
                    Ok(_) => {
                        self.tell(
                            node,
                            "Uncordoned",
                            "Uncordon",
                            format!(
                                "given back to the scheduler: run {}'s drain timed out",
                                run.id
                            ),
                        );
                        StepOutcome::failed(format!("{e}; {node} uncordoned"))
                    }
                    Err(u) => StepOutcome::failed(format!(
                        "{e}; {node} stays cordoned: the uncordon failed too ({})",
                        error_chain(&u)
                    )),
                }
            }
            Err(DrainError::Cluster(e)) => StepOutcome::retry(error_chain(&e)),
        }
    }

    /// Gives `node` back to the scheduler, if rollgate cordoned it.
    pub async fn uncordon(&self, run: &Run, step: &Step, node: &str) -> StepOutcome {
        match self.nodes.uncordon(node, &run.id).await {
            Ok(Cordon::Theirs) => StepOutcome::done(format!(
                "{node} left cordoned: someone else cordoned it before rollgate"
            )),
            Ok(_) => {
                // Told once: a retry or a restart finds the node uncordoned already.
                if step.attempts <= 1 {
                    self.tell(
                        node,
                        "Uncordoned",
                        "Uncordon",
                        format!("given back to the scheduler by run {}", run.id),
                    );
                }
                StepOutcome::done(format!("{node} uncordoned"))
            }
            Err(e) => StepOutcome::retry(error_chain(&e)),
        }
    }

    /// Waits `soak` from the step's first start.
    pub fn soak(&self, step: &Step, node: &str) -> StepOutcome {
        let now = Utc::now();
        // Measured, not read off the wall clock: a clock stepped forward must not end it.
        let soaked = step.started_at.map_or(Duration::ZERO, crate::clock::since);
        match self.settings.soak.checked_sub(soaked) {
            Some(left) if !left.is_zero() => {
                let until = now + chrono::Duration::from_std(left).unwrap_or_default();
                StepOutcome::Wait {
                    until,
                    reason: format!("{node} soaks until {}", until.format("%H:%M:%S")),
                }
            }
            _ => StepOutcome::done(format!("{node} soaked {:?}", self.settings.soak)),
        }
    }

    /// Runs `work` (step `index` of `run`) with the silences of the nodes in hand kept,
    /// when self-silences are configured and the step has nodes in hand.
    async fn silenced<T>(
        &self,
        run: &Run,
        in_hand: bool,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        let nodes = if in_hand {
            node_cycle::nodes_in_hand(&run.steps)
        } else {
            Vec::new()
        };
        match &self.silences {
            Some(silences) if !nodes.is_empty() => silences.during(&nodes, &run.id, work).await,
            _ => work.await,
        }
    }

    /// Does step `index` of `run` by `work`, as every workflow's node steps are done: the
    /// node shown in hand from its drain to its uncordon, the silences of the nodes in
    /// hand kept while `in_hand`, released after the uncordon, the step timed per node.
    pub async fn act(
        &self,
        metrics: &Metrics,
        run: &Run,
        index: usize,
        in_hand: bool,
        work: impl std::future::Future<Output = StepOutcome>,
    ) -> StepOutcome {
        let step = &run.steps[index];
        let node = step.kind.node();
        if let (true, Some(node)) = (step.kind.is_drain(), node) {
            metrics
                .upgrade_node_in_hand
                .with_label_values(&[node])
                .set(1);
        }
        let started = std::time::Instant::now();
        let outcome = self.silenced(run, in_hand, work).await;
        if let (true, Some(node), StepOutcome::Done { .. }) =
            (step.kind.is_uncordon(), node, &outcome)
        {
            if let Some(silences) = &self.silences {
                silences.keep(node, &run.id, silences.tail).await;
            }
            let _ = metrics.upgrade_node_in_hand.remove_label_values(&[node]);
        }
        if let Some(node) = node {
            metrics.node_step_took(step.kind.name(), node, started.elapsed().as_secs_f64());
        }
        if let StepOutcome::Retry { error, .. } | StepOutcome::Failed { error } = &outcome {
            warn!(run_id = %run.id, step = %step.label(), %error, "step did not succeed");
        }
        outcome
    }
}
