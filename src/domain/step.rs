//! Steps as data: one enum of step kinds per run kind, with their parameters as fields.
//!
//! The executors pick what to do with an exhaustive `match`, so a step kind nobody carries
//! out is a compile error, not a run parked at run time. On the wire (the API, the run
//! store) a step keeps the flat shape readers already use — `stage`, `name`, `node` — and
//! a stored step whose name, stage or node does not make a known step is refused when it
//! is read, with the reason.

use serde::{Deserialize, Serialize};

use super::event::Stage;

/// The stage name of the bookend step that marks a run in flight.
pub const ACCEPT: &str = "accept";
/// The stage name of the `plan` step.
pub const PLAN: &str = "plan";
/// The stage name of the step that clears the in-flight marks.
pub const FINISH: &str = "finish";
/// The stage name of every step of an etcd roll.
pub const ETCD_ROLL: &str = "etcd-roll";
/// The stage name of every step of a node-reboot run.
pub const REBOOT: &str = "reboot";

/// The stage of a node-reboot run's control planes, one at a time.
pub const REBOOT_CONTROL_PLANE: &str = "reboot-control-plane";

/// A step of a Kubernetes version upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UpgradeStep {
    /// Reads the cluster and appends the rest of the plan.
    Plan,
    /// Stage 0: the in-flight annotations and gauge.
    MarkInFlight,
    /// Every node is Ready.
    NodesReady,
    /// Every node answers over SSH with a known host key.
    SshReachable,
    /// `kubeadm upgrade plan` on the control-plane `node` offers the target.
    KubeadmPlan {
        /// The control-plane node.
        node: String,
    },
    /// Waits for the gate to open before the steps that follow touch anything.
    Gate {
        /// The stage it guards.
        stage: Stage,
        /// The node the following steps touch, when they touch one.
        node: Option<String>,
    },
    /// No blocking alert fired in the quiet period.
    QuietPeriod,
    /// Pre-flight: etcd answers, has a leader, no alarm, no member lagging; records the
    /// raft term the run starts from.
    EtcdHealthy,
    /// Stage 2: the pre-upgrade etcd snapshot.
    EtcdSnapshot,
    /// Stage 3: containerd on the control-plane `node` brought up to the workers'.
    Containerd {
        /// The control-plane node.
        node: String,
    },
    /// Stage 4: `node`'s apt repository pointed at the new minor.
    AptRepo { node: String },
    /// Cordon `node` and evict its pods.
    Drain {
        /// `control-plane` or `workers`.
        stage: Stage,
        node: String,
    },
    /// Reads the cluster and etcd, and plans the next control-plane action (an upgrade
    /// of one control plane, or the one leadership move) in place of the control-plane
    /// steps that follow.
    ControlPlaneNext,
    /// The control planes are healthy (nodes, static pods, etcd), checked before
    /// (`after: false`) and after (`after: true`) the control plane `node` is upgraded.
    ControlPlaneHealthy {
        /// The control plane about to be, or just, upgraded.
        node: String,
        /// Checked after its upgrade.
        after: bool,
    },
    /// Moves etcd leadership to the member of the control plane `node`.
    MoveLeader {
        /// The control plane whose member takes leadership.
        node: String,
    },
    /// The node script on the first control plane: `kubeadm upgrade apply`.
    Apply {
        /// The control-plane node.
        node: String,
    },
    /// The node script over SSH: `kubeadm upgrade node`.
    Upgrade {
        /// `control-plane` (a control plane after the first) or `workers`.
        stage: Stage,
        node: String,
    },
    /// With `reboot.after_upgrade = "if-required"`: after the node script, `node` is
    /// rebooted when its sentinel is set, inside the same drain, and waited for.
    Reboot {
        /// `control-plane` or `workers`.
        stage: Stage,
        node: String,
    },
    /// `node` reports the target and Ready.
    Verify {
        /// `control-plane` or `workers`.
        stage: Stage,
        node: String,
    },
    /// Undo rollgate's cordon of `node`.
    Uncordon {
        /// `control-plane` or `workers`.
        stage: Stage,
        node: String,
    },
    /// Let the upgraded `node` run before the next one.
    Soak {
        /// `control-plane` or `workers`.
        stage: Stage,
        node: String,
    },
    /// Stage 7: every node at the target and Ready.
    NodesAtTarget,
    /// Stage 7: enough pods Ready.
    PodReady,
    /// Last: clear the in-flight marks.
    ClearInFlight,
}

/// A step of an etcd roll. The roll is planned one action at a time: `Next` reads the
/// cluster and appends the steps of the next action, ending with another `Next`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EtcdRollStep {
    /// Partition lock and the first look: refuses a cluster that is not safe to touch.
    Begin,
    /// Reads the cluster and plans the next action.
    Next,
    /// Waits for the gate to open before `member` is restarted.
    Gate {
        /// The member about to be restarted.
        member: String,
    },
    /// Starts moving `member` onto the target.
    Restart { member: String },
    /// Waits until `member` is healthy, at the target and caught up.
    Ready { member: String },
    /// Pause after `member` before the next action.
    Cooldown {
        /// The member restarted last.
        member: String,
    },
    /// Moves leadership to `member`.
    Transfer {
        /// The member that receives leadership.
        member: String,
    },
    /// Restores the partition lock and reports.
    Finish,
}

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
            | Self::Soak { node } => Some(node),
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

impl UpgradeStep {
    /// The step's name on the wire, e.g. `drain`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Plan => "plan",
            Self::MarkInFlight => "mark-in-flight",
            Self::NodesReady => "nodes-ready",
            Self::SshReachable => "ssh-reachable",
            Self::KubeadmPlan { .. } => "kubeadm-plan",
            Self::Gate { .. } => "gate",
            Self::QuietPeriod => "quiet-period",
            Self::EtcdHealthy => "etcd-healthy",
            Self::ControlPlaneNext => "next",
            Self::ControlPlaneHealthy { after: false, .. } => "healthy-before",
            Self::ControlPlaneHealthy { after: true, .. } => "healthy-after",
            Self::MoveLeader { .. } => "move-leader",
            Self::Apply { .. } => "apply",
            Self::EtcdSnapshot => "etcd-snapshot",
            Self::Containerd { .. } => "containerd",
            Self::AptRepo { .. } => "apt-repo",
            Self::Drain { .. } => "drain",
            Self::Upgrade { .. } => "upgrade",
            Self::Reboot { .. } => "reboot-if-required",
            Self::Verify { .. } => "verify",
            Self::Uncordon { .. } => "uncordon",
            Self::Soak { .. } => "soak",
            Self::NodesAtTarget => "nodes-at-target",
            Self::PodReady => "pod-ready",
            Self::ClearInFlight => "clear-in-flight",
        }
    }

    /// The stage the step belongs to; `None` for the bookends (`accept`, `plan`, `finish`).
    pub fn stage(&self) -> Option<Stage> {
        match self {
            Self::Plan | Self::MarkInFlight | Self::ClearInFlight => None,
            Self::NodesReady
            | Self::SshReachable
            | Self::KubeadmPlan { .. }
            | Self::QuietPeriod
            | Self::EtcdHealthy => Some(Stage::Preflight),
            Self::EtcdSnapshot => Some(Stage::Snapshot),
            Self::Containerd { .. } => Some(Stage::Containerd),
            Self::AptRepo { .. } => Some(Stage::AptRepo),
            Self::ControlPlaneNext
            | Self::ControlPlaneHealthy { .. }
            | Self::MoveLeader { .. }
            | Self::Apply { .. } => Some(Stage::ControlPlane),
            Self::Gate { stage, .. }
            | Self::Soak { stage, .. }
            | Self::Drain { stage, .. }
            | Self::Upgrade { stage, .. }
            | Self::Reboot { stage, .. }
            | Self::Verify { stage, .. }
            | Self::Uncordon { stage, .. } => Some(*stage),
            Self::NodesAtTarget | Self::PodReady => Some(Stage::Postflight),
        }
    }

    /// The stage's name on the wire, bookends included.
    pub fn stage_name(&self) -> &'static str {
        match (self, self.stage()) {
            (_, Some(stage)) => stage.name(),
            (Self::Plan, None) => PLAN,
            (Self::ClearInFlight, None) => FINISH,
            (_, None) => ACCEPT,
        }
    }

    /// Whether this step works on a node rollgate has in hand (from its drain to its
    /// uncordon): what a self-silence covers.
    pub fn has_node_in_hand(&self) -> bool {
        matches!(
            self,
            Self::Drain { .. }
                | Self::Upgrade { .. }
                | Self::Reboot { .. }
                | Self::Apply { .. }
                | Self::Verify { .. }
                | Self::Uncordon { .. }
        )
    }

    /// The worker whose cycle this step belongs to, beside the other workers of its batch:
    /// a batch's workers go through their cycles concurrently, each cycle's steps in order.
    /// `None` for every step that runs alone (control planes included).
    pub fn lane(&self) -> Option<&str> {
        match self {
            Self::Drain { stage, node }
            | Self::Upgrade { stage, node }
            | Self::Reboot { stage, node }
            | Self::Verify { stage, node }
            | Self::Uncordon { stage, node }
                if *stage == Stage::Workers =>
            {
                Some(node)
            }
            _ => None,
        }
    }

    /// The node the step acts on, if any.
    pub fn node(&self) -> Option<&str> {
        match self {
            Self::KubeadmPlan { node }
            | Self::Containerd { node }
            | Self::AptRepo { node }
            | Self::Drain { node, .. }
            | Self::Upgrade { node, .. }
            | Self::Reboot { node, .. }
            | Self::Verify { node, .. }
            | Self::Uncordon { node, .. }
            | Self::Soak { node, .. }
            | Self::ControlPlaneHealthy { node, .. }
            | Self::MoveLeader { node }
            | Self::Apply { node } => Some(node),
            Self::Gate { node, .. } => node.as_deref(),
            Self::Plan
            | Self::MarkInFlight
            | Self::NodesReady
            | Self::SshReachable
            | Self::QuietPeriod
            | Self::EtcdHealthy
            | Self::ControlPlaneNext
            | Self::EtcdSnapshot
            | Self::NodesAtTarget
            | Self::PodReady
            | Self::ClearInFlight => None,
        }
    }

    /// The step `stage`/`name`/`node` describe.
    pub fn parse(stage: &str, name: &str, node: Option<String>) -> Result<Self, StepError> {
        let has_node = node.is_some();
        let wrong = |why: &str| StepError::new(stage, name, why);
        let node_stage = || match Stage::from_name(stage) {
            Some(s @ (Stage::ControlPlane | Stage::Workers)) => Ok(s),
            _ => Err(wrong("this step belongs to control-plane or workers")),
        };
        let node_of = |node: Option<String>| node.ok_or_else(|| wrong("this step needs a node"));
        let on_node: Option<fn(String) -> Self> = match name {
            "kubeadm-plan" => Some(|node| Self::KubeadmPlan { node }),
            "containerd" => Some(|node| Self::Containerd { node }),
            "apt-repo" => Some(|node| Self::AptRepo { node }),
            "healthy-before" => Some(|node| Self::ControlPlaneHealthy { node, after: false }),
            "healthy-after" => Some(|node| Self::ControlPlaneHealthy { node, after: true }),
            "move-leader" => Some(|node| Self::MoveLeader { node }),
            "apply" => Some(|node| Self::Apply { node }),
            _ => None,
        };
        let on_staged_node: Option<fn(Stage, String) -> Self> = match name {
            "drain" => Some(|stage, node| Self::Drain { stage, node }),
            "upgrade" => Some(|stage, node| Self::Upgrade { stage, node }),
            "reboot-if-required" => Some(|stage, node| Self::Reboot { stage, node }),
            "verify" => Some(|stage, node| Self::Verify { stage, node }),
            "uncordon" => Some(|stage, node| Self::Uncordon { stage, node }),
            "soak" => Some(|stage, node| Self::Soak { stage, node }),
            _ => None,
        };
        let step = match (name, on_node, on_staged_node) {
            (_, Some(make), _) => make(node_of(node)?),
            (_, _, Some(make)) => make(node_stage()?, node_of(node)?),
            ("gate", ..) => Self::Gate {
                stage: Stage::from_name(stage).ok_or_else(|| wrong("unknown stage"))?,
                node,
            },
            ("plan", ..) => Self::Plan,
            ("mark-in-flight", ..) => Self::MarkInFlight,
            ("nodes-ready", ..) => Self::NodesReady,
            ("ssh-reachable", ..) => Self::SshReachable,
            ("quiet-period", ..) => Self::QuietPeriod,
            ("etcd-healthy", ..) => Self::EtcdHealthy,
            ("next", ..) => Self::ControlPlaneNext,
            ("etcd-snapshot", ..) => Self::EtcdSnapshot,
            ("nodes-at-target", ..) => Self::NodesAtTarget,
            ("pod-ready", ..) => Self::PodReady,
            ("clear-in-flight", ..) => Self::ClearInFlight,
            _ => return Err(wrong("no upgrade step has this name")),
        };
        if step.stage_name() != stage {
            return Err(wrong(&format!(
                "this step belongs to stage {}",
                step.stage_name()
            )));
        }
        if step.node().is_none() && !matches!(step, Self::Gate { .. }) && has_node {
            return Err(wrong("this step takes no node"));
        }
        Ok(step)
    }
}

impl EtcdRollStep {
    /// The step's name on the wire, e.g. `etcd-restart`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Begin => "etcd-begin",
            Self::Next => "etcd-next",
            Self::Gate { .. } => "gate",
            Self::Restart { .. } => "etcd-restart",
            Self::Ready { .. } => "etcd-ready",
            Self::Cooldown { .. } => "etcd-cooldown",
            Self::Transfer { .. } => "etcd-transfer",
            Self::Finish => "etcd-finish",
        }
    }

    /// The member the step acts on, if any.
    pub fn member(&self) -> Option<&str> {
        match self {
            Self::Gate { member }
            | Self::Restart { member }
            | Self::Ready { member }
            | Self::Cooldown { member }
            | Self::Transfer { member } => Some(member),
            Self::Begin | Self::Next | Self::Finish => None,
        }
    }

    /// The step `name`/`member` describe.
    pub fn parse(name: &str, member: Option<String>) -> Result<Self, StepError> {
        let has_member = member.is_some();
        let wrong = |why: &str| StepError::new(ETCD_ROLL, name, why);
        let member_of =
            |member: Option<String>| member.ok_or_else(|| wrong("this step needs a member"));
        let on_member: Option<fn(String) -> Self> = match name {
            "gate" => Some(|member| Self::Gate { member }),
            "etcd-restart" => Some(|member| Self::Restart { member }),
            "etcd-ready" => Some(|member| Self::Ready { member }),
            "etcd-cooldown" => Some(|member| Self::Cooldown { member }),
            "etcd-transfer" => Some(|member| Self::Transfer { member }),
            _ => None,
        };
        let step = match (name, on_member) {
            (_, Some(make)) => make(member_of(member)?),
            ("etcd-begin", _) => Self::Begin,
            ("etcd-next", _) => Self::Next,
            ("etcd-finish", _) => Self::Finish,
            _ => return Err(wrong("no etcd roll step has this name")),
        };
        if step.member().is_none() && has_member {
            return Err(wrong("this step takes no member"));
        }
        Ok(step)
    }
}

impl StepKind {
    /// The step's name, e.g. `drain` or `etcd-restart`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::K8sUpgrade(s) => s.name(),
            Self::EtcdRoll(s) => s.name(),
            Self::NodeReboot(s) => s.name(),
        }
    }

    /// The stage's name, e.g. `workers` or `etcd-roll`.
    pub fn stage_name(&self) -> &'static str {
        match self {
            Self::K8sUpgrade(s) => s.stage_name(),
            Self::EtcdRoll(_) => ETCD_ROLL,
            Self::NodeReboot(s) => s.stage_name(),
        }
    }

    /// The node or etcd member the step acts on, if any.
    pub fn node(&self) -> Option<&str> {
        match self {
            Self::K8sUpgrade(s) => s.node(),
            Self::EtcdRoll(s) => s.member(),
            Self::NodeReboot(s) => s.node(),
        }
    }

    /// The worker whose cycle the step belongs to, if it runs beside others of its batch.
    pub fn lane(&self) -> Option<&str> {
        match self {
            Self::K8sUpgrade(s) => s.lane(),
            Self::EtcdRoll(_) => None,
            Self::NodeReboot(s) => s.lane(),
        }
    }

    /// A step of the workers' batches (a gate, a worker's cycle, a soak): a worker left
    /// behind does not stop the batches that follow.
    pub fn among_workers(&self) -> bool {
        match self {
            Self::K8sUpgrade(s) => s.stage() == Some(Stage::Workers),
            Self::EtcdRoll(_) => false,
            Self::NodeReboot(s) => {
                s.lane().is_some() || matches!(s, RebootStep::Gate { .. } | RebootStep::Soak { .. })
            }
        }
    }

    /// A soak: the wait after a node or a batch is back.
    pub fn is_soak(&self) -> bool {
        matches!(
            self,
            Self::K8sUpgrade(UpgradeStep::Soak { .. }) | Self::NodeReboot(RebootStep::Soak { .. })
        )
    }

    /// A drain: a node's cycle begins with it.
    pub fn is_drain(&self) -> bool {
        matches!(
            self,
            Self::K8sUpgrade(UpgradeStep::Drain { .. })
                | Self::NodeReboot(
                    RebootStep::Drain { .. }
                        | RebootStep::ControlPlane {
                            part: ControlPlanePart::Drain,
                            ..
                        }
                )
        )
    }

    /// An uncordon: a node's cycle ends with it.
    pub fn is_uncordon(&self) -> bool {
        matches!(
            self,
            Self::K8sUpgrade(UpgradeStep::Uncordon { .. })
                | Self::NodeReboot(
                    RebootStep::Uncordon { .. }
                        | RebootStep::ControlPlane {
                            part: ControlPlanePart::Uncordon,
                            ..
                        }
                )
        )
    }

    /// A gate step: the engine starts it only from the queue.
    pub fn is_gate(&self) -> bool {
        matches!(
            self,
            Self::K8sUpgrade(UpgradeStep::Gate { .. })
                | Self::EtcdRoll(EtcdRollStep::Gate { .. })
                | Self::NodeReboot(
                    RebootStep::Gate { .. }
                        | RebootStep::ControlPlane {
                            part: ControlPlanePart::Gate,
                            ..
                        }
                )
        )
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

/// A stored or posted step that does not describe a known step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("step {stage}/{name}: {why}")]
pub struct StepError {
    stage: String,
    name: String,
    why: String,
}

impl StepError {
    fn new(stage: &str, name: &str, why: &str) -> Self {
        Self {
            stage: stage.to_owned(),
            name: name.to_owned(),
            why: why.to_owned(),
        }
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
        if wire.stage == ETCD_ROLL {
            EtcdRollStep::parse(&wire.name, wire.node).map(Self::EtcdRoll)
        } else if wire.stage == REBOOT || wire.stage == REBOOT_CONTROL_PLANE {
            RebootStep::parse(&wire.stage, &wire.name, wire.node).map(Self::NodeReboot)
        } else {
            UpgradeStep::parse(&wire.stage, &wire.name, wire.node).map(Self::K8sUpgrade)
        }
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
