//! The acting half of a node-reboot run, through the ports: the plan reads every
//! candidate's sentinel over SSH; the control planes go one at a time through the shared
//! control-plane cycle, and each worker through the shared node cycle, with a reboot
//! (`action`) as their action.

use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::info;

use super::action::NodeReboots;
use super::plan::{self, RebootPlanSettings};
use super::step::{ControlPlanePart, RebootStep};
use crate::domain::engine::StepOutcome;
use crate::domain::run::{Run, Step, StepStatus};
use crate::error_chain;
use crate::metrics::Metrics;
use crate::ports::{ClusterRead, Cordon, NodeTarget, StepExecutor};
use crate::workflows::control_plane_cycle::ControlPlaneCycle;
use crate::workflows::control_plane_cycle::plan::NextControlPlane;
use crate::workflows::k8s_upgrade::plan::{ClusterFacts, NodeFacts, Role};
use crate::workflows::node_cycle::NodeCycle;
use crate::workflows::node_cycle::own_reboot_managers;
use crate::workflows::node_reboot::RebootRequest;

/// The ports the reboot steps drive.
pub struct RebootSteps {
    /// Reads nodes.
    pub cluster: Arc<dyn ClusterRead>,
    /// The reboot itself: sentinel, command, back.
    pub reboots: NodeReboots,
    /// The shared node cycle.
    pub cycle: NodeCycle,
    /// The control planes one at a time: etcd's health and leadership, health checks.
    pub control_planes: ControlPlaneCycle,
    /// Worker order, batches, failure budget, control planes.
    pub plan: RebootPlanSettings,
    /// Where it counts what it does.
    pub metrics: Metrics,
}

impl RebootSteps {
    /// Reads the candidates' sentinels and plans their cycles.
    async fn plan(&self, run: &Run, request: &RebootRequest) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        };
        let candidates = plan::candidates(request, &facts, &self.plan);
        let checks = candidates
            .iter()
            .filter_map(|name| facts.node(name))
            .map(|n| {
                let target = NodeTarget::from(n);
                async move {
                    let needs = self.reboots.read_sentinel(&target).await;
                    let managers = match needs {
                        Ok(true) => own_reboot_managers(&*self.reboots.exec, &target).await,
                        _ => Ok(Vec::new()),
                    };
                    (target.name, needs, managers)
                }
            });
        let mut needs = BTreeMap::new();
        for (name, answer, managers) in futures_util::future::join_all(checks).await {
            match (answer, managers) {
                // A reboot manager of the node's own would reboot it besides rollgate.
                (Ok(_), Ok(found)) if !found.is_empty() => {
                    return StepOutcome::failed(format!("{name}: {}", found.join("; ")));
                }
                (Ok(_), Err(e)) => {
                    return StepOutcome::retry(format!(
                        "cannot tell {name}'s own reboot managers: {e}"
                    ));
                }
                (Ok(set), Ok(_)) => {
                    needs.insert(name, set);
                }
                (Err(outcome), _) => return outcome,
            }
        }
        match plan::plan(request, &facts, &needs, &self.plan) {
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
        match self.reboots.required(node).await {
            Ok(true) => StepOutcome::done(format!("{node} still needs a reboot")),
            Ok(false) => StepOutcome::SkipCycle {
                note: format!("{node}'s sentinel has cleared: it no longer needs a reboot"),
            },
            Err(outcome) => outcome,
        }
    }

    /// The control planes this run still has to reboot, of the cluster as `facts` show
    /// it: their sentinel set now and no reboot mark of this run on them.
    async fn control_planes_pending(
        &self,
        run: &Run,
        request: &RebootRequest,
        facts: &ClusterFacts,
    ) -> Result<Vec<String>, StepOutcome> {
        let mut needs = BTreeMap::new();
        let mut marked = Vec::new();
        for name in plan::candidates(request, facts, &self.plan) {
            let Some(node) = facts.node(&name).filter(|n| n.role == Role::ControlPlane) else {
                continue;
            };
            if self
                .reboots
                .boot(&name)
                .await?
                .mark
                .is_some_and(|m| m.run_id == run.id)
            {
                marked.push(name);
                continue;
            }
            let set = self.reboots.read_sentinel(&NodeTarget::from(node)).await?;
            needs.insert(name, set);
        }
        Ok(plan::control_planes_pending(
            request, facts, &needs, &marked, &self.plan,
        ))
    }

    /// Decides the next control plane to reboot (or the one leadership move).
    async fn control_plane_next(
        &self,
        run: &Run,
        step: &Step,
        request: &RebootRequest,
    ) -> StepOutcome {
        let cycle = &self.control_planes;
        let now = match cycle.now().await {
            Ok(now) => now,
            Err(outcome) => return outcome,
        };
        let pending = match self.control_planes_pending(run, request, &now.facts).await {
            Ok(p) => p,
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
            .filter_map(|s| match s.kind.get::<RebootStep>() {
                Some(RebootStep::ControlPlane {
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
        let cycle = &self.control_planes;
        let now = match cycle.now().await {
            Ok(now) => now,
            Err(outcome) => return outcome,
        };
        let pending = match self.control_planes_pending(run, request, &now.facts).await {
            Ok(p) => p,
            Err(outcome) => return outcome,
        };
        let is_pending = |n: &NodeFacts| pending.contains(&n.name);
        let next = Step::new(RebootStep::ControlPlaneNext);
        cycle.move_leader(&now, node, &is_pending, next).await
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
            ControlPlanePart::Reboot => self.reboots.reboot(run, step, node).await,
            ControlPlanePart::Back => self.reboots.back(run, node).await,
            ControlPlanePart::Uncordon => self.cycle.uncordon(run, step, node).await,
            ControlPlanePart::Soak => self.cycle.soak(step, node),
            ControlPlanePart::Gate => {
                StepOutcome::failed(format!("{} is the gate's step", step.label()))
            }
        }
    }

    async fn run_step(&self, run: &Run, index: usize, kind: &RebootStep) -> StepOutcome {
        let step = &run.steps[index];
        let request = match run.request_as::<RebootRequest>() {
            Ok(r) => r,
            Err(e) => {
                return StepOutcome::failed(format!("the run's request no longer validates: {e}"));
            }
        };
        match kind {
            RebootStep::Plan => self.plan(run, &request).await,
            RebootStep::Required { node } => self.required(run, node).await,
            RebootStep::Drain { node } => self.cycle.drain(run, index, node).await,
            RebootStep::Reboot { node } => self.reboots.reboot(run, step, node).await,
            RebootStep::Back { node } => self.reboots.back(run, node).await,
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
            RebootStep::Analysis { .. } => {
                StepOutcome::failed(format!("{} is the analysis's step", step.label()))
            }
        }
    }
}

#[async_trait::async_trait]
impl StepExecutor for RebootSteps {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let step = &run.steps[index];
        let Some(kind) = step.kind.get::<RebootStep>() else {
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
