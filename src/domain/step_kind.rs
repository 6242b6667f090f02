//! Steps as data: one enum of step kinds per run kind, with their parameters as fields,
//! each in a file of its own beside this one and known to the engine through [`WorkflowStep`]
//! and one registration here (a `StepKind` variant, its arm in `step`, its wire parser).
//!
//! The executors pick what to do with an exhaustive `match`, so a step kind nobody carries
//! out is a compile error, not a run parked at run time. On the wire (the API, the run
//! store) a step keeps the flat shape readers already use — `stage`, `name`, `node` — and
//! a stored step whose name, stage or node does not make a known step is refused when it
//! is read, with the reason.

use serde::{Deserialize, Serialize};

pub use super::etcd_roll_step::{ETCD_ROLL, EtcdRollStep};
pub use super::reboot_step::{ControlPlanePart, REBOOT, REBOOT_CONTROL_PLANE, RebootStep};
use super::run_kind::RunKind;
use super::step::{StepError, StepRole, WorkflowStep};
pub use super::upgrade_step::UpgradeStep;

/// What a step does, whichever run kind it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "StepWire", into = "StepWire")]
pub enum StepKind {
    /// A step of a Kubernetes version upgrade.
    K8sUpgrade(UpgradeStep),
    /// A step of an etcd roll.
    EtcdRoll(EtcdRollStep),
    /// A step of a node-reboot run.
    NodeReboot(RebootStep),
}

impl From<RebootStep> for StepKind {
    fn from(step: RebootStep) -> Self {
        Self::NodeReboot(step)
    }
}

impl From<UpgradeStep> for StepKind {
    fn from(step: UpgradeStep) -> Self {
        Self::K8sUpgrade(step)
    }
}

impl From<EtcdRollStep> for StepKind {
    fn from(step: EtcdRollStep) -> Self {
        Self::EtcdRoll(step)
    }
}

/// A workflow's wire parser: `None` for a stage that is not its own.
type WireParser = fn(&str, &str, Option<String>) -> Option<Result<StepKind, StepError>>;

/// The workflows' wire parsers, in the order they are asked. Registering a workflow adds
/// its line here.
const PARSERS: [WireParser; 3] = [
    |stage, name, node| EtcdRollStep::from_wire(stage, name, node).map(|r| r.map(Into::into)),
    |stage, name, node| RebootStep::from_wire(stage, name, node).map(|r| r.map(Into::into)),
    |stage, name, node| UpgradeStep::from_wire(stage, name, node).map(|r| r.map(Into::into)),
];

impl StepKind {
    /// The step, as the engine sees every workflow's: the one place that knows them all.
    pub fn step(&self) -> &dyn WorkflowStep {
        match self {
            Self::K8sUpgrade(s) => s,
            Self::EtcdRoll(s) => s,
            Self::NodeReboot(s) => s,
        }
    }

    /// The kind of run the step belongs to: whose executor carries it out.
    pub fn run_kind(&self) -> RunKind {
        match self {
            Self::K8sUpgrade(_) => RunKind::K8sUpgrade,
            Self::EtcdRoll(_) => RunKind::EtcdRoll,
            Self::NodeReboot(_) => RunKind::NodeReboot,
        }
    }

    /// The step's name, e.g. `drain` or `etcd-restart`.
    pub fn name(&self) -> &'static str {
        self.step().name()
    }

    /// The stage's name, e.g. `workers` or `etcd-roll`.
    pub fn stage_name(&self) -> &'static str {
        self.step().stage_name()
    }

    /// The node or etcd member the step acts on, if any.
    pub fn node(&self) -> Option<&str> {
        self.step().node()
    }

    /// The worker whose cycle the step belongs to, if it runs beside others of its batch.
    pub fn lane(&self) -> Option<&str> {
        self.step().lane()
    }

    /// A step of the workers' batches (a gate, a worker's cycle, a soak): a worker left
    /// behind does not stop the batches that follow.
    pub fn among_workers(&self) -> bool {
        self.step().among_workers()
    }

    /// Whether it starts work a maintenance window must allow (each workflow says which
    /// of its steps do); work in progress is never interrupted by a window closing.
    pub fn waits_for_window(&self) -> bool {
        self.step().waits_for_window()
    }

    /// Whether it waits outside the cluster, before the run takes the cluster's lock.
    pub fn outside_the_cluster(&self) -> bool {
        self.step().outside_the_cluster()
    }

    /// A soak: the wait after a node or a batch is back.
    pub fn is_soak(&self) -> bool {
        self.step().role() == StepRole::Soak
    }

    /// A drain: a node's cycle begins with it.
    pub fn is_drain(&self) -> bool {
        self.step().role() == StepRole::Drain
    }

    /// An uncordon: a node's cycle ends with it.
    pub fn is_uncordon(&self) -> bool {
        self.step().role() == StepRole::Uncordon
    }

    /// A gate step: the engine starts it only from the queue.
    pub fn is_gate(&self) -> bool {
        self.step().role() == StepRole::Gate
    }

    /// `stage/name@node`, leaving out what is empty or repeated.
    pub fn label(&self) -> String {
        let (stage, name) = (self.stage_name(), self.name());
        let mut label = if stage == name {
            name.to_owned()
        } else {
            format!("{stage}/{name}")
        };
        if let Some(node) = self.node() {
            label.push('@');
            label.push_str(node);
        }
        label
    }
}

/// A step as the API shows it and the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StepWire {
    /// The stage it belongs to, e.g. `preflight`, `workers` or `etcd-roll`.
    pub stage: String,
    /// What the step is, e.g. `gate` or `drain`.
    pub name: String,
    /// The node (or etcd member) it acts on, if any.
    pub node: Option<String>,
}

impl TryFrom<StepWire> for StepKind {
    type Error = StepError;

    fn try_from(wire: StepWire) -> Result<Self, StepError> {
        PARSERS
            .iter()
            .find_map(|parse| parse(&wire.stage, &wire.name, wire.node.clone()))
            .unwrap_or_else(|| Err(StepError::new(&wire.stage, &wire.name, "no such stage")))
    }
}

impl From<StepKind> for StepWire {
    fn from(kind: StepKind) -> Self {
        Self {
            stage: kind.stage_name().to_owned(),
            name: kind.name().to_owned(),
            node: kind.node().map(str::to_owned),
        }
    }
}

impl utoipa::PartialSchema for StepKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        StepWire::schema()
    }
}

impl utoipa::ToSchema for StepKind {
    fn name() -> std::borrow::Cow<'static, str> {
        "StepWire".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Stage;

    fn every_kind() -> Vec<StepKind> {
        let node = || "n1".to_owned();
        let member = || "etcd-0".to_owned();
        let mut kinds: Vec<StepKind> = vec![
            UpgradeStep::Plan.into(),
            UpgradeStep::MarkInFlight.into(),
            UpgradeStep::NodesReady.into(),
            UpgradeStep::SshReachable.into(),
            UpgradeStep::KubeadmPlan { node: node() }.into(),
            UpgradeStep::QuietPeriod.into(),
            UpgradeStep::EtcdSnapshot.into(),
            UpgradeStep::Containerd { node: node() }.into(),
            UpgradeStep::AptRepo { node: node() }.into(),
            UpgradeStep::EtcdHealthy.into(),
            UpgradeStep::ControlPlaneNext.into(),
            UpgradeStep::ControlPlaneHealthy {
                node: node(),
                after: false,
            }
            .into(),
            UpgradeStep::ControlPlaneHealthy {
                node: node(),
                after: true,
            }
            .into(),
            UpgradeStep::MoveLeader { node: node() }.into(),
            UpgradeStep::Apply { node: node() }.into(),
            UpgradeStep::NodesAtTarget.into(),
            UpgradeStep::PodReady.into(),
            UpgradeStep::ClearInFlight.into(),
            EtcdRollStep::Begin.into(),
            EtcdRollStep::Next.into(),
            EtcdRollStep::Gate { member: member() }.into(),
            EtcdRollStep::Restart { member: member() }.into(),
            EtcdRollStep::Ready { member: member() }.into(),
            EtcdRollStep::Cooldown { member: member() }.into(),
            EtcdRollStep::Transfer { member: member() }.into(),
            EtcdRollStep::Finish.into(),
            RebootStep::Plan.into(),
            RebootStep::Gate { node: node() }.into(),
            RebootStep::Required { node: node() }.into(),
            RebootStep::Drain { node: node() }.into(),
            RebootStep::Reboot { node: node() }.into(),
            RebootStep::Back { node: node() }.into(),
            RebootStep::Uncordon { node: node() }.into(),
            RebootStep::Soak { node: node() }.into(),
            RebootStep::EtcdHealthy.into(),
            RebootStep::ControlPlaneNext.into(),
            RebootStep::MoveLeader { node: node() }.into(),
        ];
        for part in ControlPlanePart::ALL {
            kinds.push(RebootStep::ControlPlane { node: node(), part }.into());
        }
        for stage in Stage::ALL {
            kinds.push(UpgradeStep::Gate { stage, node: None }.into());
            kinds.push(
                UpgradeStep::Gate {
                    stage,
                    node: Some(node()),
                }
                .into(),
            );
        }
        for stage in [Stage::ControlPlane, Stage::Workers] {
            for make in [
                |stage, node| UpgradeStep::Drain { stage, node },
                |stage, node| UpgradeStep::Upgrade { stage, node },
                |stage, node| UpgradeStep::Reboot { stage, node },
                |stage, node| UpgradeStep::Verify { stage, node },
                |stage, node| UpgradeStep::Uncordon { stage, node },
                |stage, node| UpgradeStep::Soak { stage, node },
            ] {
                kinds.push(make(stage, node()).into());
            }
        }
        kinds
    }

    #[test]
    fn every_step_kind_round_trips_through_its_wire_form() {
        let kinds = every_kind();
        for kind in &kinds {
            let json = serde_json::to_value(kind).unwrap();
            let back: StepKind = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(&back, kind, "{json}");
        }
        let labels: std::collections::HashSet<String> = kinds.iter().map(StepKind::label).collect();
        assert_eq!(labels.len(), kinds.len(), "two kinds share a label");
    }

    #[test]
    fn the_wire_form_is_the_flat_shape_readers_use() {
        let cases: [(StepKind, serde_json::Value); 4] = [
            (
                UpgradeStep::Drain {
                    stage: Stage::Workers,
                    node: "w1".into(),
                }
                .into(),
                serde_json::json!({"stage": "workers", "name": "drain", "node": "w1"}),
            ),
            (
                UpgradeStep::MarkInFlight.into(),
                serde_json::json!({"stage": "accept", "name": "mark-in-flight", "node": null}),
            ),
            (
                UpgradeStep::Plan.into(),
                serde_json::json!({"stage": "plan", "name": "plan", "node": null}),
            ),
            (
                EtcdRollStep::Restart {
                    member: "etcd-2".into(),
                }
                .into(),
                serde_json::json!({"stage": "etcd-roll", "name": "etcd-restart", "node": "etcd-2"}),
            ),
        ];
        for (kind, wire) in cases {
            assert_eq!(serde_json::to_value(&kind).unwrap(), wire);
        }
    }

    #[test]
    fn a_wire_step_that_is_no_known_step_is_refused_with_the_reason() {
        let cases = [
            (
                "workers",
                "dran",
                Some("w1"),
                "no upgrade step has this name",
            ),
            ("workers", "drain", None, "this step needs a node"),
            ("preflight", "drain", Some("w1"), "control-plane or workers"),
            (
                "workers",
                "etcd-snapshot",
                None,
                "belongs to stage snapshot",
            ),
            ("preflight", "nodes-ready", Some("w1"), "takes no node"),
            ("bogus", "gate", None, "unknown stage"),
            ("", "plan", None, "belongs to stage plan"),
            ("etcd-roll", "etcd-restart", None, "needs a member"),
            ("etcd-roll", "etcd-begin", Some("m"), "takes no member"),
            ("etcd-roll", "drain", Some("m"), "no etcd roll step"),
            ("reboot", "drain", None, "needs a node"),
            ("reboot", "plan-reboots", Some("w1"), "takes no node"),
            ("reboot", "upgrade", Some("w1"), "no reboot step"),
        ];
        for (stage, name, node, why) in cases {
            let wire = StepWire {
                stage: stage.into(),
                name: name.into(),
                node: node.map(str::to_owned),
            };
            let err = StepKind::try_from(wire).unwrap_err().to_string();
            assert!(err.contains(why), "{stage}/{name}: {err}");
        }
    }

    #[test]
    fn labels_leave_out_what_is_repeated() {
        let cases: [(StepKind, &str); 4] = [
            (UpgradeStep::Plan.into(), "plan"),
            (
                UpgradeStep::Containerd { node: "cp".into() }.into(),
                "containerd@cp",
            ),
            (
                UpgradeStep::Gate {
                    stage: Stage::Preflight,
                    node: None,
                }
                .into(),
                "preflight/gate",
            ),
            (EtcdRollStep::Finish.into(), "etcd-roll/etcd-finish"),
        ];
        for (kind, label) in cases {
            assert_eq!(kind.label(), label);
        }
    }
}
