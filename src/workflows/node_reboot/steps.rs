//! The acting half of a node-reboot run, through the ports: the plan reads every
//! candidate's sentinel over SSH; each worker goes through the shared node cycle with a
//! reboot as its action. A reboot is asked once: the node's boot id is marked on it
//! before the command is sent, and a step redone after a crash finds the mark and does
//! not send it again.

use chrono::Utc;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

use super::plan::{self, RebootPlanSettings};
use crate::domain::control_planes::NextControlPlane;
use crate::domain::engine::StepOutcome;
use crate::domain::event::RebootRequest;
use crate::domain::k8s_upgrade::{NodeFacts, Role};
use crate::domain::run::{Run, Step, StepStatus};
use crate::domain::step::{ControlPlanePart, RebootStep, StepKind};
use crate::error_chain;
use crate::metrics::Metrics;
use crate::ports::{
    ClusterRead, Cordon, ExecError, NodeBoots, NodeExec, NodeTarget, RebootMark, StepExecutor,
};
use crate::workflows::control_plane_cycle::ControlPlaneCycle;
use crate::workflows::node_cycle::NodeCycle;

/// What a reboot runs on nodes, and how long a node may take to come back.
#[derive(Debug, Clone)]
pub struct RebootSettings {
    /// Worker order, batches, failure budget, control planes.
    pub plan: RebootPlanSettings,
    /// The script that tells whether a node needs a reboot: exit 0 yes, 1 no.
    pub sentinel_script: String,
    /// The reboot command.
    pub command: String,
    /// From the command to Ready with another boot id.
    pub timeout: Duration,
    /// Labels set before the reboot.
    pub labels_before: Vec<(String, Option<String>)>,
    /// Labels set once the node is back.
    pub labels_after: Vec<(String, Option<String>)>,
}

/// The ports the reboot steps drive.
pub struct RebootSteps {
    /// Reads nodes.
    pub cluster: Arc<dyn ClusterRead>,
    /// Boot ids, the reboot mark, labels.
    pub boots: Arc<dyn NodeBoots>,
    /// Commands over SSH.
    pub exec: Arc<dyn NodeExec>,
    /// The shared node cycle.
    pub cycle: NodeCycle,
    /// The control planes one at a time: etcd's health and leadership, health checks.
    pub control_planes: ControlPlaneCycle,
    /// Commands and limits.
    pub settings: RebootSettings,
    /// Where it counts what it does.
    pub metrics: Metrics,
}

/// Whether a node's sentinel is set, or why it cannot be told.
async fn sentinel(
    exec: &dyn NodeExec,
    target: &NodeTarget,
    script: &str,
) -> Result<bool, StepOutcome> {
    match exec.run_script(target, script, &[]).await {
        Ok(out) if out.status == Some(0) => Ok(true),
        Ok(out) if out.status == Some(1) => Ok(false),
        Ok(out) => Err(StepOutcome::retry(format!(
            "the sentinel check on {} exited with {:?}: {}",
            target.name,
            out.status,
            out.tail(4)
        ))),
        Err(e @ ExecError::HostKey { .. }) => Err(StepOutcome::failed(error_chain(&e))),
        Err(e) => Err(StepOutcome::retry(error_chain(&e))),
    }
}

impl RebootSteps {
    async fn target(&self, name: &str) -> Result<NodeTarget, StepOutcome> {
        let facts = self
            .cluster
            .facts()
            .await
            .map_err(|e| StepOutcome::retry(error_chain(&e)))?;
        let node = facts.node(name).ok_or_else(|| {
            StepOutcome::failed(format!("node {name} is no longer in the cluster"))
        })?;
        Ok(NodeTarget::from(node))
    }

    /// Reads the candidates' sentinels and plans their cycles.
    async fn plan(&self, run: &Run, request: &RebootRequest) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        };
        let candidates = plan::candidates(request, &facts, &self.settings.plan);
        let checks = candidates
            .iter()
            .filter_map(|name| facts.node(name))
            .map(|n| {
                let target = NodeTarget::from(n);
                async move {
                    let needs =
                        sentinel(&*self.exec, &target, &self.settings.sentinel_script).await;
                    (target.name, needs)
                }
            });
        let mut needs = BTreeMap::new();
        for (name, answer) in futures_util::future::join_all(checks).await {
            match answer {
                Ok(set) => {
                    needs.insert(name, set);
                }
                Err(outcome) => return outcome,
            }
        }
        match plan::plan(request, &facts, &needs, &self.settings.plan) {
            Err(e) => StepOutcome::failed(e.to_string()),
            Ok(p) => {
                let mut note = if p.workers.is_empty() && p.control_planes.is_empty() {
                    "no node needs a reboot".to_owned()
                } else {
                    format!(
                        "{} node(s) to reboot, {} at a time: {}",
                        p.workers.len(),
                        p.batch_size,
                        p.workers.join(", ")
                    )
                };
                if !p.control_planes.is_empty() {
                    note = format!(
                        "{} control plane(s) to reboot first, one at a time, the etcd leader's last: {}; {note}",
                        p.control_planes.len(),
                        p.control_planes.join(", ")
                    );
                }
                if !p.left_out.is_empty() {
                    note.push_str("; left out: ");
                    note.push_str(&p.left_out.join("; "));
                }
                info!(run_id = %run.id, %note, "planned");
                StepOutcome::Planned {
                    note,
                    steps: p.steps,
                }
            }
        }
    }

    /// The sentinel again at the node's turn: a node that no longer needs its reboot is
    /// skipped before it is drained.
    async fn required(&self, run: &Run, node: &str) -> StepOutcome {
        match self.cycle.nodes.cordon_holder(node, &run.id).await {
            Ok(Cordon::Ours) => {
                return StepOutcome::done(format!(
                    "{node} is cordoned by this run already: its cycle goes on"
                ));
            }
            Ok(_) => {}
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        }
        let target = match self.target(node).await {
            Ok(t) => t,
            Err(outcome) => return outcome,
        };
        match sentinel(&*self.exec, &target, &self.settings.sentinel_script).await {
            Ok(true) => StepOutcome::done(format!("{node} still needs a reboot")),
            Ok(false) => StepOutcome::SkipCycle {
                note: format!("{node}'s sentinel has cleared: it no longer needs a reboot"),
            },
            Err(outcome) => outcome,
        }
    }

    /// Marks the node's boot id, then sends the reboot command; once only.
    async fn reboot(&self, run: &Run, step: &Step, node: &str) -> StepOutcome {
        let boot = match self.cycle_boot(node).await {
            Ok(b) => b,
            Err(outcome) => return outcome,
        };
        if let Some(mark) = boot.mark.as_ref().filter(|m| m.run_id == run.id) {
            if mark.boot_id != boot.boot_id {
                return StepOutcome::done(format!(
                    "{node} has rebooted already (boot id {} -> {}): not rebooted again",
                    mark.boot_id, boot.boot_id
                ));
            }
            let not_sent = step
                .outcome
                .as_deref()
                .is_some_and(|o| o.starts_with(NOT_SENT));
            if !not_sent {
                return StepOutcome::done(format!(
                    "the reboot command was sent to {node} at {} (before a restart): not sent again; waiting for it to come back",
                    mark.at.format("%H:%M:%S")
                ));
            }
        }
        let target = match self.target(node).await {
            Ok(t) => t,
            Err(outcome) => return outcome,
        };
        if let Err(e) = self.boots.label(node, &self.settings.labels_before).await {
            return StepOutcome::retry(error_chain(&e));
        }
        let mark = RebootMark {
            run_id: run.id.clone(),
            boot_id: boot.boot_id.clone(),
            at: Utc::now(),
        };
        if let Err(e) = self.boots.mark_reboot(node, &mark).await {
            return StepOutcome::retry(format!("{NOT_SENT}{}", error_chain(&e)));
        }
        let sent = match self
            .exec
            .run_script(&target, &format!("{}\n", self.settings.command), &[])
            .await
        {
            Ok(out) => format!("exited with {:?}", out.status),
            Err(e @ ExecError::HostKey { .. }) => return StepOutcome::failed(error_chain(&e)),
            // No session: nothing was sent.
            Err(e @ ExecError::Connect { .. }) => {
                return StepOutcome::retry(format!("{NOT_SENT}{}", error_chain(&e)));
            }
            // The node going down takes the session with it: expected.
            Err(e) => format!("the session ended ({})", error_chain(&e)),
        };
        self.cycle.tell(
            node,
            "Rebooting",
            "Reboot",
            format!("run {} reboots the node (boot id {})", run.id, boot.boot_id),
        );
        StepOutcome::done(format!(
            "reboot command sent to {node} (boot id {}): {sent}",
            boot.boot_id
        ))
    }

    async fn cycle_boot(&self, node: &str) -> Result<crate::ports::NodeBoot, StepOutcome> {
        self.boots
            .boot(node)
            .await
            .map_err(|e| StepOutcome::retry(error_chain(&e)))
    }

    /// The node is back: another boot id than the one marked, and Ready, within the
    /// timeout counted from the reboot command.
    async fn back(&self, run: &Run, node: &str) -> StepOutcome {
        let boot = match self.cycle_boot(node).await {
            Ok(b) => b,
            Err(outcome) => return outcome,
        };
        let Some(mark) = boot.mark.as_ref().filter(|m| m.run_id == run.id) else {
            return StepOutcome::failed(format!(
                "{node} carries no reboot mark of this run: the reboot was not asked"
            ));
        };
        let now = Utc::now();
        let waited = (now - mark.at).to_std().unwrap_or_default();
        let rebooted = boot.boot_id != mark.boot_id;
        if rebooted && boot.ready {
            if let Err(e) = self.boots.label(node, &self.settings.labels_after).await {
                return StepOutcome::retry(error_chain(&e));
            }
            self.cycle.tell(
                node,
                "Rebooted",
                "Reboot",
                format!("back with boot id {}, Ready", boot.boot_id),
            );
            return StepOutcome::done(format!(
                "{node} is back: boot id {} -> {}, Ready {}s after the reboot command",
                mark.boot_id,
                boot.boot_id,
                waited.as_secs()
            ));
        }
        let state = match (rebooted, boot.ready) {
            (false, true) => "has not rebooted yet (same boot id, Ready)",
            (false, false) => "is down (same boot id, not Ready)",
            (true, _) => "has rebooted and is not Ready yet",
        };
        if waited >= self.settings.timeout {
            return StepOutcome::failed(format!(
                "{node} did not come back within reboot.timeout ({}s): it {state}; it stays cordoned",
                self.settings.timeout.as_secs()
            ));
        }
        let poll =
            (self.settings.timeout / 60).clamp(Duration::from_millis(250), Duration::from_secs(10));
        StepOutcome::Wait {
            until: now + chrono::Duration::from_std(poll).unwrap_or_default(),
            reason: format!("waiting for {node}: it {state}"),
        }
    }

    /// The control planes this run still has to reboot: their sentinel set now and no
    /// reboot mark of this run on them.
    async fn control_planes_pending(
        &self,
        run: &Run,
        request: &RebootRequest,
    ) -> Result<Vec<String>, StepOutcome> {
        let facts = self
            .cluster
            .facts()
            .await
            .map_err(|e| StepOutcome::retry(error_chain(&e)))?;
        let mut needs = BTreeMap::new();
        let mut marked = Vec::new();
        for name in plan::candidates(request, &facts, &self.settings.plan) {
            let Some(node) = facts.node(&name).filter(|n| n.role == Role::ControlPlane) else {
                continue;
            };
            if self
                .cycle_boot(&name)
                .await?
                .mark
                .is_some_and(|m| m.run_id == run.id)
            {
                marked.push(name);
                continue;
            }
            let set = sentinel(
                &*self.exec,
                &NodeTarget::from(node),
                &self.settings.sentinel_script,
            )
            .await?;
            needs.insert(name, set);
        }
        Ok(plan::control_planes_pending(
            request,
            &facts,
            &needs,
            &marked,
            &self.settings.plan,
        ))
    }

    /// Decides the next control plane to reboot (or the one leadership move).
    async fn control_plane_next(
        &self,
        run: &Run,
        step: &Step,
        request: &RebootRequest,
    ) -> StepOutcome {
        let pending = match self.control_planes_pending(run, request).await {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let cycle = &self.control_planes;
        let now = match cycle.now().await {
            Ok(now) => now,
            Err(outcome) => return outcome,
        };
        let is_pending = |n: &NodeFacts| pending.contains(&n.name);
        let decided = now
            .next(&is_pending, cycle.settings.etcd_max_lag)
            .map(|next| match next {
                NextControlPlane::Done => None,
                next => {
                    let steps = plan::control_plane_steps(&next);
                    Some((next, steps))
                }
            });
        let rebooted: Vec<String> = run
            .steps
            .iter()
            .filter(|s| s.status == StepStatus::Done)
            .filter_map(|s| match &s.kind {
                StepKind::NodeReboot(RebootStep::ControlPlane {
                    node,
                    part: ControlPlanePart::Reboot,
                }) => Some(node.clone()),
                _ => None,
            })
            .collect();
        cycle.decided(run, step, &now, decided, ("rebooted", &rebooted))
    }

    /// Moves etcd leadership to `node`'s member, unless no longer needed.
    async fn move_leader(&self, run: &Run, request: &RebootRequest, node: &str) -> StepOutcome {
        let pending = match self.control_planes_pending(run, request).await {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let is_pending = |n: &NodeFacts| pending.contains(&n.name);
        self.control_planes
            .move_leader(node, &is_pending, Step::new(RebootStep::ControlPlaneNext))
            .await
    }

    /// One part of a control plane's reboot: the node cycle's, between health checks.
    async fn control_plane(
        &self,
        run: &Run,
        index: usize,
        node: &str,
        part: ControlPlanePart,
    ) -> StepOutcome {
        let step = &run.steps[index];
        let next = || Step::new(RebootStep::ControlPlaneNext);
        match part {
            ControlPlanePart::HealthyBefore => {
                self.control_planes
                    .healthy(step, node, false, None, next())
                    .await
            }
            ControlPlanePart::HealthyAfter => {
                self.control_planes
                    .healthy(step, node, true, None, next())
                    .await
            }
            ControlPlanePart::Drain => self.cycle.drain(run, index, node).await,
            ControlPlanePart::Reboot => self.reboot(run, step, node).await,
            ControlPlanePart::Back => self.back(run, node).await,
            ControlPlanePart::Uncordon => self.cycle.uncordon(run, step, node).await,
            ControlPlanePart::Soak => self.cycle.soak(step, node),
            ControlPlanePart::Gate => {
                StepOutcome::failed(format!("{} is the gate's step", step.label()))
            }
        }
    }

    async fn run_step(&self, run: &Run, index: usize, kind: &RebootStep) -> StepOutcome {
        let step = &run.steps[index];
        let request = match RebootRequest::from_json(&run.request) {
            Ok(r) => r,
            Err(e) => {
                return StepOutcome::failed(format!("the run's request no longer validates: {e}"));
            }
        };
        match kind {
            RebootStep::Plan => self.plan(run, &request).await,
            RebootStep::Required { node } => self.required(run, node).await,
            RebootStep::Drain { node } => self.cycle.drain(run, index, node).await,
            RebootStep::Reboot { node } => self.reboot(run, step, node).await,
            RebootStep::Back { node } => self.back(run, node).await,
            RebootStep::Uncordon { node } => self.cycle.uncordon(run, step, node).await,
            RebootStep::Soak { node } => self.cycle.soak(step, node),
            RebootStep::EtcdHealthy => self.control_planes.etcd_healthy(step).await,
            RebootStep::ControlPlaneNext => self.control_plane_next(run, step, &request).await,
            RebootStep::MoveLeader { node } => self.move_leader(run, &request, node).await,
            RebootStep::ControlPlane { node, part } => {
                self.control_plane(run, index, node, *part).await
            }
            RebootStep::Gate { .. } => {
                StepOutcome::failed(format!("{} is the gate's step", step.label()))
            }
        }
    }
}

/// How a reboot step's outcome starts when the command surely was not sent: the redo may
/// send it.
const NOT_SENT: &str = "reboot command not sent: ";

#[async_trait::async_trait]
impl StepExecutor for RebootSteps {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let step = &run.steps[index];
        let StepKind::NodeReboot(kind) = &step.kind else {
            return StepOutcome::failed(format!("{} is not a step of a reboot", step.label()));
        };
        let in_hand = matches!(
            kind,
            RebootStep::Drain { .. }
                | RebootStep::Reboot { .. }
                | RebootStep::Back { .. }
                | RebootStep::Uncordon { .. }
                | RebootStep::ControlPlane {
                    part: ControlPlanePart::Drain
                        | ControlPlanePart::Reboot
                        | ControlPlanePart::Back
                        | ControlPlanePart::Uncordon,
                    ..
                }
        );
        self.cycle
            .act(
                &self.metrics,
                run,
                index,
                in_hand,
                self.run_step(run, index, kind),
            )
            .await
    }
}
