//! The steps of a node-reboot run, as data.

use crate::domain::run_kind::RunKind;
use crate::domain::step::{StepError, StepRole, WorkflowStep};
use crate::domain::step_kind::StepType;

/// The kind of a node-reboot run.
pub const NODE_REBOOT: RunKind = RunKind::new("node-reboot");

/// The node reboot's step type, for `workflows::register`.
pub const STEPS: StepType = StepType {
    run_kind: NODE_REBOOT,
    parse: |stage, name, node| RebootStep::from_wire(stage, name, node).map(|r| r.map(Into::into)),
};

/// The stage name of every step of a node-reboot run.
pub const REBOOT: &str = "reboot";

/// The stage of a node-reboot run's control planes, one at a time.
pub const REBOOT_CONTROL_PLANE: &str = "reboot-control-plane";

/// A step of a node-reboot run: the node cycle with a reboot as its action.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RebootStep {
    /// Reads the cluster and the nodes' sentinels, and appends the rest of the plan.
    Plan,
    /// Waits for the gate to open before the steps that follow touch `node` (the first
    /// node of a batch).
    Gate {
        /// The node the following steps touch.
        node: String,
    },
    /// The sentinel again, at the node's turn: a node that no longer needs a reboot is
    /// skipped, undrained.
    Required {
        /// The node.
        node: String,
    },
    /// Cordon `node` and evict its pods.
    Drain {
        /// The node.
        node: String,
    },
    /// Records the node's boot id, then sends the reboot command over SSH.
    Reboot {
        /// The node.
        node: String,
    },
    /// The node is back: another boot id, Ready, within `reboot.timeout`.
    Back {
        /// The node.
        node: String,
    },
    /// Undo rollgate's cordon of `node`.
    Uncordon {
        /// The node.
        node: String,
    },
    /// Let the batch run before the next one.
    Soak {
        /// The last node of the batch.
        node: String,
    },
    /// With `gate.analysis`: after the batch's soak, judges the batch (whose last node is
    /// `node`) against the workers beside it.
    Analysis {
        /// The last node of the batch.
        node: String,
    },
    /// Before any control plane: etcd healthy; records the raft term the run starts from.
    EtcdHealthy,
    /// Reads the cluster, etcd and the control planes' sentinels, and plans the next
    /// control-plane action (a reboot of one, or the one leadership move) in place of the
    /// control-plane steps that follow.
    ControlPlaneNext,
    /// Moves etcd leadership to the member of the control plane `node`.
    MoveLeader {
        /// The control plane whose member takes leadership.
        node: String,
    },
    /// One part of a control plane's reboot. A control plane goes alone, between health
    /// checks, and a failure halts the run: it has no lane.
    ControlPlane {
        /// The control-plane node.
        node: String,
        /// Which part of its cycle.
        part: ControlPlanePart,
    },
}

/// The parts of a control plane's reboot, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlPlanePart {
    /// The control planes are healthy before it is touched.
    HealthyBefore,
    /// Waits for the gate to open.
    Gate,
    /// Cordon and drain.
    Drain,
    /// Marks its boot id and sends the reboot command.
    Reboot,
    /// Back with another boot id, Ready.
    Back,
    /// Undo rollgate's cordon.
    Uncordon,
    /// The control planes are healthy again (nodes, static pods, etcd).
    HealthyAfter,
    /// Let it run before the next control plane.
    Soak,
}

impl ControlPlanePart {
    /// Every part, in the order a control plane goes through them.
    pub const ALL: [Self; 8] = [
        Self::HealthyBefore,
        Self::Gate,
        Self::Drain,
        Self::Reboot,
        Self::Back,
        Self::Uncordon,
        Self::HealthyAfter,
        Self::Soak,
    ];

    /// The part's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Self::HealthyBefore => "healthy-before",
            Self::Gate => "gate",
            Self::Drain => "drain",
            Self::Reboot => "reboot",
            Self::Back => "back",
            Self::Uncordon => "uncordon",
            Self::HealthyAfter => "healthy-after",
            Self::Soak => "soak",
        }
    }
}

impl RebootStep {
    /// The step's name on the wire, e.g. `reboot`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Plan => "plan-reboots",
            Self::Gate { .. } => "gate",
            Self::Required { .. } => "required",
            Self::Drain { .. } => "drain",
            Self::Reboot { .. } => "reboot",
            Self::Back { .. } => "back",
            Self::Uncordon { .. } => "uncordon",
            Self::Soak { .. } => "soak",
            Self::Analysis { .. } => "analysis",
            Self::EtcdHealthy => "etcd-healthy",
            Self::ControlPlaneNext => "next",
            Self::MoveLeader { .. } => "move-leader",
            Self::ControlPlane { part, .. } => part.name(),
        }
    }

    /// The stage's name: `reboot-control-plane` for the control planes' steps, `reboot`
    /// for the rest.
    pub fn stage_name(&self) -> &'static str {
        match self {
            Self::EtcdHealthy
            | Self::ControlPlaneNext
            | Self::MoveLeader { .. }
            | Self::ControlPlane { .. } => REBOOT_CONTROL_PLANE,
            _ => REBOOT,
        }
    }

    /// The node the step acts on, if any.
    pub fn node(&self) -> Option<&str> {
        match self {
            Self::Plan | Self::EtcdHealthy | Self::ControlPlaneNext => None,
            Self::MoveLeader { node } | Self::ControlPlane { node, .. } => Some(node),
            Self::Gate { node }
            | Self::Required { node }
            | Self::Drain { node }
            | Self::Reboot { node }
            | Self::Back { node }
            | Self::Uncordon { node }
            | Self::Soak { node }
            | Self::Analysis { node } => Some(node),
        }
    }

    /// The worker whose cycle this step belongs to, beside the others of its batch.
    pub fn lane(&self) -> Option<&str> {
        match self {
            Self::Required { node }
            | Self::Drain { node }
            | Self::Reboot { node }
            | Self::Back { node }
            | Self::Uncordon { node } => Some(node),
            _ => None,
        }
    }

    /// The step `stage`/`name`/`node` describe.
    pub fn parse(stage: &str, name: &str, node: Option<String>) -> Result<Self, StepError> {
        if stage == REBOOT_CONTROL_PLANE {
            return Self::parse_control_plane(name, node);
        }
        let has_node = node.is_some();
        let wrong = |why: &str| StepError::new(REBOOT, name, why);
        let node_of = |node: Option<String>| node.ok_or_else(|| wrong("this step needs a node"));
        let on_node: Option<fn(String) -> Self> = match name {
            "gate" => Some(|node| Self::Gate { node }),
            "required" => Some(|node| Self::Required { node }),
            "drain" => Some(|node| Self::Drain { node }),
            "reboot" => Some(|node| Self::Reboot { node }),
            "back" => Some(|node| Self::Back { node }),
            "uncordon" => Some(|node| Self::Uncordon { node }),
            "soak" => Some(|node| Self::Soak { node }),
            "analysis" => Some(|node| Self::Analysis { node }),
            _ => None,
        };
        let step = match (name, on_node) {
            (_, Some(make)) => make(node_of(node)?),
            ("plan-reboots", _) => Self::Plan,
            _ => return Err(wrong("no reboot step has this name")),
        };
        if step.node().is_none() && has_node {
            return Err(wrong("this step takes no node"));
        }
        Ok(step)
    }

    fn parse_control_plane(name: &str, node: Option<String>) -> Result<Self, StepError> {
        let wrong = |why: &str| StepError::new(REBOOT_CONTROL_PLANE, name, why);
        let part = ControlPlanePart::ALL.into_iter().find(|p| p.name() == name);
        match (name, part, node) {
            ("etcd-healthy", _, None) => Ok(Self::EtcdHealthy),
            ("next", _, None) => Ok(Self::ControlPlaneNext),
            ("move-leader", _, Some(node)) => Ok(Self::MoveLeader { node }),
            (_, Some(part), Some(node)) => Ok(Self::ControlPlane { node, part }),
            ("etcd-healthy" | "next", _, Some(_)) => Err(wrong("this step takes no node")),
            ("move-leader", _, None) | (_, Some(_), None) => Err(wrong("this step needs a node")),
            _ => Err(wrong("no control-plane reboot step has this name")),
        }
    }
}

impl RebootStep {
    /// The step a stored `stage`/`name`/`node` describes; `None` for another stage.
    pub fn from_wire(
        stage: &str,
        name: &str,
        node: Option<String>,
    ) -> Option<Result<Self, StepError>> {
        (stage == REBOOT || stage == REBOOT_CONTROL_PLANE).then(|| Self::parse(stage, name, node))
    }

    /// The part of a control plane's cycle, if the step is one.
    fn part(&self) -> Option<ControlPlanePart> {
        match self {
            Self::ControlPlane { part, .. } => Some(*part),
            _ => None,
        }
    }
}

impl WorkflowStep for RebootStep {
    fn name(&self) -> &'static str {
        RebootStep::name(self)
    }

    fn stage_name(&self) -> &'static str {
        RebootStep::stage_name(self)
    }

    fn node(&self) -> Option<&str> {
        RebootStep::node(self)
    }

    fn run_kind(&self) -> RunKind {
        NODE_REBOOT
    }

    fn lane(&self) -> Option<&str> {
        RebootStep::lane(self)
    }

    fn role(&self) -> StepRole {
        match (self, self.part()) {
            (Self::Gate { .. }, _) | (_, Some(ControlPlanePart::Gate)) => StepRole::Gate,
            (Self::Drain { .. }, _) | (_, Some(ControlPlanePart::Drain)) => StepRole::Drain,
            (Self::Uncordon { .. }, _) | (_, Some(ControlPlanePart::Uncordon)) => {
                StepRole::Uncordon
            }
            (Self::Soak { .. }, _) | (_, Some(ControlPlanePart::Soak)) => StepRole::Soak,
            (Self::Analysis { .. }, _) => StepRole::Analysis,
            _ => StepRole::Work,
        }
    }

    fn among_workers(&self) -> bool {
        self.lane().is_some()
            || matches!(
                self,
                Self::Gate { .. } | Self::Soak { .. } | Self::Analysis { .. }
            )
    }

    fn waits_for_window(&self) -> bool {
        matches!(
            self,
            Self::Gate { .. }
                | Self::MoveLeader { .. }
                | Self::ControlPlane {
                    part: ControlPlanePart::Gate,
                    ..
                }
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::step_kind::{StepKind, StepWire, register};

    /// Every step a node-reboot run can have.
    pub(crate) fn every_step() -> Vec<StepKind> {
        let node = || "n1".to_owned();
        let mut steps: Vec<StepKind> = vec![
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
            steps.push(RebootStep::ControlPlane { node: node(), part }.into());
        }
        steps
    }

    #[test]
    fn a_wire_step_that_is_no_reboot_step_is_refused_with_the_reason() {
        register(&[STEPS]);
        let cases = [
            ("drain", None, "needs a node"),
            ("plan-reboots", Some("w1"), "takes no node"),
            ("upgrade", Some("w1"), "no reboot step"),
        ];
        for (name, node, why) in cases {
            let wire = StepWire {
                stage: REBOOT.into(),
                name: name.into(),
                node: node.map(str::to_owned),
            };
            let err = StepKind::try_from(wire).unwrap_err().to_string();
            assert!(err.contains(why), "{name}: {err}");
        }
    }

    #[test]
    fn gates_and_leadership_moves_wait_for_a_window_and_a_node_in_hand_does_not() {
        let node = || "n1".to_owned();
        let cases = [
            (RebootStep::Gate { node: node() }, true),
            (RebootStep::MoveLeader { node: node() }, true),
            (
                RebootStep::ControlPlane {
                    node: node(),
                    part: ControlPlanePart::Gate,
                },
                true,
            ),
            (RebootStep::Back { node: node() }, false),
            (
                RebootStep::ControlPlane {
                    node: node(),
                    part: ControlPlanePart::Reboot,
                },
                false,
            ),
        ];
        for (step, want) in cases {
            assert_eq!(step.waits_for_window(), want, "{step:?}");
        }
    }
}
