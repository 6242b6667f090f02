//! The steps of a Kubernetes version upgrade, as data.

use serde::{Deserialize, Serialize};

use super::run_kind::RunKind;
use super::step::{ACCEPT, FINISH, PLAN, StepError, StepRole, WorkflowStep};
use super::step_kind::StepType;

/// The kind of a Kubernetes version upgrade's runs.
pub const K8S_UPGRADE: RunKind = RunKind::new("k8s-upgrade");

/// The upgrade's step type, for `workflows::register`.
pub const STEPS: StepType = StepType {
    run_kind: K8S_UPGRADE,
    parse: |stage, name, node| UpgradeStep::from_wire(stage, name, node).map(|r| r.map(Into::into)),
};

/// The stages of a Kubernetes version upgrade after stage 0 (accept), in order.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// 1: all nodes Ready, gate open, quiet period, target plannable.
    Preflight,
    /// 2: etcd snapshot, streamed and checksummed.
    Snapshot,
    /// 3: control-plane containerd bump when behind the workers.
    Containerd,
    /// 4: apt repository rewrite to the new minor (minor upgrades only).
    AptRepo,
    /// 5: the control-plane node.
    ControlPlane,
    /// 6: each worker in the configured order.
    Workers,
    /// 7: all nodes at target, gate open, pods ready.
    Postflight,
}

impl Stage {
    /// Every stage, in execution order.
    pub const ALL: [Stage; 7] = [
        Stage::Preflight,
        Stage::Snapshot,
        Stage::Containerd,
        Stage::AptRepo,
        Stage::ControlPlane,
        Stage::Workers,
        Stage::Postflight,
    ];

    /// The name used in requests and plans.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Preflight => "preflight",
            Stage::Snapshot => "snapshot",
            Stage::Containerd => "containerd",
            Stage::AptRepo => "apt-repo",
            Stage::ControlPlane => "control-plane",
            Stage::Workers => "workers",
            Stage::Postflight => "postflight",
        }
    }

    /// The stage with this name, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// A step of a Kubernetes version upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UpgradeStep {
    /// Reads the cluster and appends the rest of the plan.
    Plan,
    /// Pre-flight, first: every upstream cluster (`fleet.upstreams`) ran the target and
    /// stayed quiet for `fleet.soak` (and, with `fleet.require_approval`, an operator
    /// approved).
    Upstreams,
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
    /// Before `node`'s drain: its driver downloads the release and checks it against its
    /// checksums (the package repository's on kubeadm, the release's `sha256sum` file on
    /// k3s and RKE2), so that a bad release is refused before anything is disturbed and
    /// the node is out of service no longer than its upgrade.
    Fetch {
        /// `control-plane` or `workers`.
        stage: Stage,
        node: String,
    },
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
    /// With `gate.analysis`: after a batch's soak, judges the batch (whose last worker is
    /// `node`) against the workers beside it.
    Analysis {
        /// The batch's last worker.
        node: String,
    },
    /// Stage 7: every node at the target and Ready.
    NodesAtTarget,
    /// Stage 7: enough pods Ready.
    PodReady,
    /// Last: clear the in-flight marks.
    ClearInFlight,
}

impl UpgradeStep {
    /// The step's name on the wire, e.g. `drain`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Plan => "plan",
            Self::Upstreams => "upstreams",
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
            Self::Fetch { .. } => "fetch",
            Self::Drain { .. } => "drain",
            Self::Upgrade { .. } => "upgrade",
            Self::Reboot { .. } => "reboot-if-required",
            Self::Verify { .. } => "verify",
            Self::Uncordon { .. } => "uncordon",
            Self::Soak { .. } => "soak",
            Self::Analysis { .. } => "analysis",
            Self::NodesAtTarget => "nodes-at-target",
            Self::PodReady => "pod-ready",
            Self::ClearInFlight => "clear-in-flight",
        }
    }

    /// The stage the step belongs to; `None` for the bookends (`accept`, `plan`, `finish`).
    pub fn stage(&self) -> Option<Stage> {
        match self {
            Self::Plan | Self::MarkInFlight | Self::ClearInFlight => None,
            Self::Upstreams
            | Self::NodesReady
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
            | Self::Fetch { stage, .. }
            | Self::Drain { stage, .. }
            | Self::Upgrade { stage, .. }
            | Self::Reboot { stage, .. }
            | Self::Verify { stage, .. }
            | Self::Uncordon { stage, .. } => Some(*stage),
            Self::Analysis { .. } => Some(Stage::Workers),
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
            Self::Fetch { stage, node }
            | Self::Drain { stage, node }
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
            | Self::Fetch { node, .. }
            | Self::Drain { node, .. }
            | Self::Upgrade { node, .. }
            | Self::Reboot { node, .. }
            | Self::Verify { node, .. }
            | Self::Uncordon { node, .. }
            | Self::Soak { node, .. }
            | Self::Analysis { node }
            | Self::ControlPlaneHealthy { node, .. }
            | Self::MoveLeader { node }
            | Self::Apply { node } => Some(node),
            Self::Gate { node, .. } => node.as_deref(),
            Self::Plan
            | Self::Upstreams
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
            "analysis" => Some(|node| Self::Analysis { node }),
            _ => None,
        };
        let on_staged_node: Option<fn(Stage, String) -> Self> = match name {
            "fetch" => Some(|stage, node| Self::Fetch { stage, node }),
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
            ("upstreams", ..) => Self::Upstreams,
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

impl UpgradeStep {
    /// The step a stored `stage`/`name`/`node` describes; `None` for a stage of another
    /// workflow (the upgrade's are its [`Stage`]s and the bookends).
    pub fn from_wire(
        stage: &str,
        name: &str,
        node: Option<String>,
    ) -> Option<Result<Self, StepError>> {
        let ours = Stage::from_name(stage).is_some() || [ACCEPT, PLAN, FINISH].contains(&stage);
        ours.then(|| Self::parse(stage, name, node))
    }
}

impl WorkflowStep for UpgradeStep {
    fn name(&self) -> &'static str {
        UpgradeStep::name(self)
    }

    fn stage_name(&self) -> &'static str {
        UpgradeStep::stage_name(self)
    }

    fn node(&self) -> Option<&str> {
        UpgradeStep::node(self)
    }

    fn run_kind(&self) -> RunKind {
        K8S_UPGRADE
    }

    fn lane(&self) -> Option<&str> {
        UpgradeStep::lane(self)
    }

    fn role(&self) -> StepRole {
        match self {
            Self::Gate { .. } => StepRole::Gate,
            Self::Drain { .. } => StepRole::Drain,
            Self::Uncordon { .. } => StepRole::Uncordon,
            Self::Soak { .. } => StepRole::Soak,
            Self::Analysis { .. } => StepRole::Analysis,
            _ => StepRole::Work,
        }
    }

    fn among_workers(&self) -> bool {
        self.stage() == Some(Stage::Workers)
    }

    fn waits_for_window(&self) -> bool {
        match self {
            Self::Gate { stage, node } => node.is_some() || *stage == Stage::Preflight,
            Self::EtcdSnapshot | Self::MoveLeader { .. } => true,
            _ => false,
        }
    }

    fn outside_the_cluster(&self) -> bool {
        matches!(self, Self::Upstreams)
    }
}
