//! The control-plane steps of an upgrade, through the shared control-plane cycle: an
//! upgrade touches a control plane by running its kubeadm upgrade, and a control plane is
//! pending while its kubelet is not at the target.

use super::UpgradeSteps;
use crate::domain::engine::StepOutcome;
use crate::domain::event::Stage;
use crate::domain::run::{Run, Step, StepStatus};
use crate::domain::upgrade_step::UpgradeStep;
use crate::domain::version::Version;
use crate::workflows::control_plane_cycle::plan::{self as cps, NextControlPlane};
use crate::workflows::k8s_upgrade::plan::{NodeFacts, control_plane_steps};

/// The control planes an upgrade to `target` still has to touch.
fn behind(target: Version) -> impl Fn(&NodeFacts) -> bool + Sync {
    move |n: &NodeFacts| n.kubelet != target
}

/// The control planes this run upgraded, in order, the first marked `(apply)`.
fn upgraded(run: &Run) -> Vec<String> {
    run.steps
        .iter()
        .filter(|s| s.status == StepStatus::Done)
        .filter_map(|s| match s.kind.get::<UpgradeStep>() {
            Some(UpgradeStep::Apply { node }) => Some(format!("{node} (apply)")),
            Some(UpgradeStep::Upgrade { stage, node }) if *stage == Stage::ControlPlane => {
                Some(node.clone())
            }
            _ => None,
        })
        .collect()
}

fn next_step() -> Step {
    Step::new(UpgradeStep::ControlPlaneNext)
}

impl UpgradeSteps {
    /// Decides the next control-plane action and plans its steps.
    pub(super) async fn control_plane_next(
        &self,
        run: &Run,
        step: &Step,
        target: Version,
    ) -> StepOutcome {
        let cycle = &self.control_planes;
        let now = match cycle.now().await {
            Ok(now) => now,
            Err(outcome) => return outcome,
        };
        let decided =
            now.next(&behind(target), cycle.settings.etcd_max_lag)
                .map(|next| match next {
                    NextControlPlane::Done => None,
                    next => {
                        let cps = cps::control_planes(&now.facts.nodes);
                        let action = cps::upgrade_action(&cps, next, target);
                        let steps = control_plane_steps(
                            &action,
                            self.reboot_after.is_some(),
                            self.settings.plan.distribution,
                        );
                        Some((action, steps))
                    }
                });
        cycle.decided(run, step, &now, decided, ("upgraded", &upgraded(run)))
    }

    /// The control planes are healthy before (`after: false`) or after `node`'s upgrade.
    pub(super) async fn control_plane_healthy(
        &self,
        step: &Step,
        node: &str,
        after: bool,
        target: Version,
    ) -> StepOutcome {
        self.control_planes
            .healthy(step, node, after, Some(target), next_step())
            .await
    }

    /// Moves etcd leadership to `node`'s member, unless the cluster no longer needs it.
    pub(super) async fn move_leader(&self, node: &str, target: Version) -> StepOutcome {
        let cycle = &self.control_planes;
        match cycle.now().await {
            Ok(now) => {
                cycle
                    .move_leader(&now, node, &behind(target), next_step())
                    .await
            }
            Err(outcome) => outcome,
        }
    }
}
