//! Planning a Kubernetes version upgrade: from the request and the cluster's facts to the
//! steps of stages 0–7. Version rules and stage-subset rules live here, so that the API,
//! the CLI (`rollgate plan`) and the worker give the same answer for the same facts.

use std::collections::BTreeSet;

use crate::domain::distribution::Distribution;
use crate::domain::event::{DetectionRequest, Stage, StageSelection, UpgradeKind};
use crate::domain::run::Step;
use crate::domain::run::{FailurePolicy, Run};
use crate::domain::upgrade_step::UpgradeStep;
use crate::domain::version::Version;
use crate::workflows::control_plane_cycle::plan::{
    self as cps, ControlPlaneAction, EtcdFacts, EtcdLayout, Kubeadm, LayoutError,
};
use crate::workflows::node_cycle::driver::NodeDriver;
use crate::workflows::node_cycle::plan::{self as node_cycle, Part};
use chrono::{DateTime, Utc};

pub use crate::domain::facts::{ClusterFacts, NodeFacts, Role};

pub use crate::domain::budget::{FailureBudget, MaxUnavailable};

/// Planning choices from the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanSettings {
    /// Workers in the order to upgrade them; workers not named follow, by name.
    pub worker_order: Vec<String>,
    /// How many workers are drained and upgraded together, behind one gate.
    pub max_unavailable: MaxUnavailable,
    /// How many workers may be left behind; a count larger than the cluster's workers is
    /// refused at planning.
    pub failure_budget: FailureBudget,
    /// How far an etcd member may trail the leader's raft index before a control plane
    /// is touched.
    pub etcd_max_lag: u64,
    /// After each node's script, reboot the node inside its drain when the script left
    /// its sentinel set (`reboot.after_upgrade = "if-required"`).
    pub reboot_after_upgrade: bool,
    /// The distribution the nodes run (`cluster.distribution`).
    pub distribution: Distribution,
    /// Each batch of workers is judged after its soak (`gate.analysis` is set).
    pub judge_batches: bool,
}

/// Why a request cannot be planned against these facts. Each message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No node has the control-plane role.
    #[error(
        "no control-plane node found (none has the label node-role.kubernetes.io/control-plane)"
    )]
    NoControlPlane,
    /// etcd does not line up with the control planes in a way rollgate knows.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The control planes cannot be upgraded one at a time without losing etcd quorum,
    /// or no member can take leadership.
    #[error("the control planes cannot be upgraded safely: {0}")]
    ControlPlanes(String),
    /// The target breaks the version rules.
    #[error("{0}")]
    Version(String),
    /// The nodes do not run the configured distribution, or the request does not fit it.
    #[error("{0}")]
    Distribution(String),
    /// The stage subset does not make sense.
    #[error("stages {stages}: {why}")]
    Stages {
        /// The subset as asked.
        stages: String,
        /// What is wrong with it.
        why: String,
    },
    /// `cluster.failure_budget` does not fit the cluster.
    #[error("{0}")]
    FailureBudget(String),
    /// The configured worker order names a node that is not a worker.
    #[error("cluster.worker_order names {0}, which is not a worker node of this cluster")]
    UnknownWorker(String),
}

/// A planned upgrade.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The control plane's version now (its oldest node's).
    pub current: Version,
    /// Where etcd runs.
    pub layout: EtcdLayout,
    /// The control-plane actions in the order they are expected to come, each with why;
    /// the run decides each one again from the cluster as it is then.
    pub control_planes: Vec<String>,
    /// Workers in upgrade order (those already at the target left out).
    pub workers: Vec<String>,
    /// How many workers go together, each batch behind one gate.
    pub batch_size: usize,
    /// What the plan leaves out and why, one line each.
    pub skipped: Vec<String>,
    /// The steps after `plan` (the gate and quiet period of pre-flight come before it).
    pub steps: Vec<Step>,
}

/// A run's steps before its plan is known: with pre-flight (or a dry run), the gate and
/// the quiet period first, so that not even the cluster is read during an incident; then
/// `plan`, which appends the rest.
pub fn initial_steps(request: &DetectionRequest, upstreams: bool) -> Vec<Step> {
    let mut out = Vec::new();
    // A fleet wave's wait comes first: nothing of the cluster is read or marked while the
    // clusters upstream have not run the version. A dry run waits for nobody.
    if upstreams && !request.dry_run && request.stages.0.contains(&Stage::Preflight) {
        out.push(Step::new(UpgradeStep::Upstreams));
    }
    if request.dry_run || request.stages.0.contains(&Stage::Preflight) {
        out.push(Step::new(UpgradeStep::Gate {
            stage: Stage::Preflight,
            node: None,
        }));
        out.push(Step::new(UpgradeStep::QuietPeriod));
    }
    out.push(Step::new(UpgradeStep::Plan));
    out
}

fn version_error(msg: String) -> PlanError {
    PlanError::Version(msg)
}

/// Checks that every node runs `distribution`, as its kubelet version shows, and that a
/// build is asked of k3s and RKE2 only.
pub fn check_distribution(
    request: &DetectionRequest,
    facts: &ClusterFacts,
    distribution: Distribution,
) -> Result<(), PlanError> {
    if let Some(other) = facts.nodes.iter().find(|n| n.distribution != distribution) {
        return Err(PlanError::Distribution(format!(
            "node {} runs {} (its kubelet version says so), and cluster.distribution is {distribution}: set cluster.distribution to the cluster's",
            other.name, other.distribution
        )));
    }
    for node in &facts.nodes {
        let Some(named) = &node.package_manager else {
            continue;
        };
        let label = crate::domain::facts::PACKAGE_MANAGER_LABEL;
        if distribution != Distribution::Kubeadm {
            return Err(PlanError::Distribution(format!(
                "node {} has the label {label}={named:?}, which is for kubeadm nodes; {distribution} nodes take their release from cluster.release_mirror: remove the label",
                node.name
            )));
        }
        if !crate::domain::facts::PACKAGE_MANAGERS.contains(&named.as_str()) {
            return Err(PlanError::Distribution(format!(
                "node {} has the label {label}={named:?}: it must be apt, dnf or zypper",
                node.name
            )));
        }
    }
    if request.build.is_some() && distribution == Distribution::Kubeadm {
        return Err(PlanError::Distribution(
            "build names a k3s or RKE2 build, and this cluster runs kubeadm: leave it out".into(),
        ));
    }
    Ok(())
}

/// Checks `target` against the control plane's `current` version and every node.
pub fn check_target(
    kind: UpgradeKind,
    target: Version,
    current: Version,
    facts: &ClusterFacts,
) -> Result<(), PlanError> {
    if target < current {
        return Err(version_error(format!(
            "target {target} is older than the control plane's {current}: downgrades are not supported"
        )));
    }
    if target.major != current.major {
        return Err(version_error(format!(
            "target {target} changes the major version of {current}: not supported"
        )));
    }
    if let Some(newer) = facts.nodes.iter().find(|n| n.kubelet > target) {
        return Err(version_error(format!(
            "node {} already runs {}, newer than target {target}",
            newer.name, newer.kubelet
        )));
    }
    if target == current {
        // Finishing a rollout that stopped part-way is allowed; a no-op is not.
        return if facts.behind(target).is_empty() {
            Err(version_error(format!(
                "every node already runs {target}: nothing to do"
            )))
        } else {
            Ok(())
        };
    }
    match kind {
        UpgradeKind::Patch if target.minor == current.minor => Ok(()),
        UpgradeKind::Patch => Err(version_error(format!(
            "target {target} is not a patch of {current} (a patch upgrade keeps the minor {}.{}); use kind=minor for a minor upgrade",
            current.major, current.minor
        ))),
        UpgradeKind::Minor if target.minor == current.minor + 1 => Ok(()),
        UpgradeKind::Minor if target.minor == current.minor => Err(version_error(format!(
            "target {target} is a patch of {current}: use kind=patch"
        ))),
        UpgradeKind::Minor => Err(version_error(format!(
            "target {target} skips minors: from {current} the next minor is {}.{}",
            current.major,
            current.minor + 1
        ))),
    }
}

fn stage_error(selection: &StageSelection, why: impl Into<String>) -> PlanError {
    PlanError::Stages {
        stages: selection.to_text(),
        why: why.into(),
    }
}

/// Checks that the stage subset makes sense for this request and these facts.
fn check_stages(
    request: &DetectionRequest,
    cp_at_target: bool,
    workers_behind: bool,
) -> Result<(), PlanError> {
    let selection = &request.stages;
    let has = |s: Stage| selection.0.contains(&s);
    let all = selection.0.len() == Stage::ALL.len();
    let changes_nodes = [
        Stage::Containerd,
        Stage::AptRepo,
        Stage::ControlPlane,
        Stage::Workers,
    ]
    .into_iter()
    .any(has);
    if changes_nodes && !has(Stage::Preflight) {
        return Err(stage_error(
            selection,
            "stages that change nodes need preflight in the same run",
        ));
    }
    if has(Stage::AptRepo) && request.kind == UpgradeKind::Patch && !all {
        return Err(stage_error(
            selection,
            "apt-repo rewrites the repository to a new minor: it is for kind=minor only",
        ));
    }
    if has(Stage::ControlPlane) && !cp_at_target {
        if !has(Stage::Snapshot) {
            return Err(stage_error(
                selection,
                "upgrading the control plane needs a fresh etcd snapshot: add snapshot",
            ));
        }
        if request.kind == UpgradeKind::Minor && !has(Stage::AptRepo) {
            return Err(stage_error(
                selection,
                "a minor upgrade of the control plane needs the package repository of the new minor: add apt-repo",
            ));
        }
    }
    if has(Stage::Workers) && workers_behind && !cp_at_target && !has(Stage::ControlPlane) {
        return Err(stage_error(
            selection,
            format!(
                "workers may only move to {} once the control plane runs it: add control-plane",
                request.target_version
            ),
        ));
    }
    Ok(())
}

/// Workers in upgrade order: the configured order first, then the rest by name.
pub fn worker_order(
    facts: &ClusterFacts,
    settings: &PlanSettings,
) -> Result<Vec<String>, PlanError> {
    let workers: BTreeSet<&str> = facts
        .nodes
        .iter()
        .filter(|n| n.role == Role::Worker)
        .map(|n| n.name.as_str())
        .collect();
    let mut order = Vec::new();
    for name in &settings.worker_order {
        if !workers.contains(name.as_str()) {
            return Err(PlanError::UnknownWorker(name.clone()));
        }
        if !order.contains(name) {
            order.push(name.clone());
        }
    }
    for name in workers {
        if !order.iter().any(|o| o == name) {
            order.push(name.to_owned());
        }
    }
    Ok(order)
}

/// Gate, drain, upgrade (by `upgrade`), the reboot if required (with `reboot`), verify,
/// uncordon, then `checked` (if any), and soak of `node` in `stage`.
fn node_steps(
    stage: Stage,
    node: &str,
    upgrade: UpgradeStep,
    reboot: bool,
    checked: Option<UpgradeStep>,
) -> Vec<UpgradeStep> {
    let node = || node.to_owned();
    let mut steps = vec![
        UpgradeStep::Gate {
            stage,
            node: Some(node()),
        },
        UpgradeStep::Drain {
            stage,
            node: node(),
        },
        upgrade,
    ];
    if reboot {
        steps.push(UpgradeStep::Reboot {
            stage,
            node: node(),
        });
    }
    steps.extend([
        UpgradeStep::Verify {
            stage,
            node: node(),
        },
        UpgradeStep::Uncordon {
            stage,
            node: node(),
        },
    ]);
    steps.extend(checked);
    steps.push(UpgradeStep::Soak {
        stage,
        node: node(),
    });
    steps
}

/// The workers' node cycle: the driver's download and check of the release come before the
/// drain, the node script is its action; with `REBOOT`, a reboot follows the script when
/// it left the node needing one.
struct WorkerCycle<const REBOOT: bool>;

impl<const REBOOT: bool> node_cycle::CycleSteps for WorkerCycle<REBOOT> {
    type Step = UpgradeStep;
    const PARTS: &'static [Part] = if REBOOT {
        &[
            Part::Fetch,
            Part::Drain,
            Part::Action,
            Part::RebootIfRequired,
            Part::Verify,
            Part::Uncordon,
        ]
    } else {
        &[
            Part::Fetch,
            Part::Drain,
            Part::Action,
            Part::Verify,
            Part::Uncordon,
        ]
    };

    fn gate(node: &str) -> UpgradeStep {
        UpgradeStep::Gate {
            stage: Stage::Workers,
            node: Some(node.to_owned()),
        }
    }

    fn part(part: Part, node: &str) -> UpgradeStep {
        let (stage, node) = (Stage::Workers, node.to_owned());
        match part {
            // The workers' cycle has no check part (PARTS): a drain begins it.
            Part::Check | Part::Drain => UpgradeStep::Drain { stage, node },
            Part::Fetch => UpgradeStep::Fetch { stage, node },
            Part::Action => UpgradeStep::Upgrade { stage, node },
            Part::RebootIfRequired => UpgradeStep::Reboot { stage, node },
            Part::Verify => UpgradeStep::Verify { stage, node },
            Part::Uncordon => UpgradeStep::Uncordon { stage, node },
        }
    }

    fn soak(node: &str) -> UpgradeStep {
        UpgradeStep::Soak {
            stage: Stage::Workers,
            node: node.to_owned(),
        }
    }
    fn analysis(node: &str) -> UpgradeStep {
        UpgradeStep::Analysis {
            node: node.to_owned(),
        }
    }
}

/// The steps that carry out a control-plane action, ending with the `next` that decides
/// the one after. A control plane is checked healthy before its gate and after its
/// uncordon; the leadership move is a step of its own.
///
/// With `reboot`, the control plane is rebooted after its script when the script left
/// its sentinel set.
pub fn control_plane_steps(
    action: &ControlPlaneAction,
    reboot: bool,
    distribution: Distribution,
) -> Vec<Step> {
    let stage = Stage::ControlPlane;
    let steps = match action {
        ControlPlaneAction::Done => Vec::new(),
        ControlPlaneAction::MoveLeader { to, .. } => vec![
            UpgradeStep::MoveLeader { node: to.clone() },
            UpgradeStep::ControlPlaneNext,
        ],
        ControlPlaneAction::Upgrade { node, kubeadm } => {
            // k3s and RKE2 servers all take the same upgrade: there is no `apply` first.
            let upgrade = match (kubeadm, distribution) {
                (Kubeadm::Apply, Distribution::Kubeadm) => {
                    UpgradeStep::Apply { node: node.clone() }
                }
                _ => UpgradeStep::Upgrade {
                    stage,
                    node: node.clone(),
                },
            };
            let healthy = |after| UpgradeStep::ControlPlaneHealthy {
                node: node.clone(),
                after,
            };
            let mut steps = vec![
                UpgradeStep::Fetch {
                    stage,
                    node: node.clone(),
                },
                healthy(false),
            ];
            steps.extend(node_steps(
                stage,
                node,
                upgrade,
                reboot,
                Some(healthy(true)),
            ));
            steps.push(UpgradeStep::ControlPlaneNext);
            steps
        }
    };
    steps.into_iter().map(Step::new).collect()
}

/// Plans `request` against `facts` and, when rollgate can reach it, `etcd`: the steps
/// that follow the `plan` step.
pub fn plan(
    request: &DetectionRequest,
    facts: &ClusterFacts,
    etcd: Option<&EtcdFacts>,
    settings: &PlanSettings,
) -> Result<Plan, PlanError> {
    let control_planes = cps::control_planes(&facts.nodes);
    let current = control_planes
        .iter()
        .map(|n| n.kubelet)
        .min()
        .ok_or(PlanError::NoControlPlane)?;
    let layout = cps::layout(&control_planes, etcd)?;
    let target = request.target_version;
    check_distribution(request, facts, settings.distribution)?;
    check_target(request.kind, target, current, facts)?;
    let order = worker_order(facts, settings)?;
    let mut skipped = Vec::new();
    let workers: Vec<String> = order
        .into_iter()
        .filter(|name| {
            let at_target = facts.node(name).is_some_and(|n| n.kubelet == target);
            if at_target {
                skipped.push(format!("worker {name} already runs {target}"));
            }
            !at_target
        })
        .collect();
    let behind: Vec<&NodeFacts> = control_planes
        .iter()
        .copied()
        .filter(|n| n.kubelet != target)
        .collect();
    for n in control_planes.iter().filter(|n| n.kubelet == target) {
        skipped.push(format!("control plane {} already runs {target}", n.name));
    }
    check_stages(request, behind.is_empty(), !workers.is_empty())?;

    let predicted = cps::predict(&control_planes, layout, etcd, target, settings.etcd_max_lag);
    let order_notes = match &predicted {
        Ok(order) => cps::explain(order, layout, etcd),
        Err(refusal) if refusal.may_pass() => vec![format!(
            "decided once etcd is healthy (now: {refusal}); the run waits for it"
        )],
        Err(refusal) => return Err(PlanError::ControlPlanes(refusal.to_string())),
    };
    // `kubeadm upgrade plan` where `apply` will run.
    let applies_on = predicted
        .ok()
        .and_then(|order| {
            order.into_iter().find_map(|a| match a {
                ControlPlaneAction::Upgrade { node, .. } => Some(node),
                _ => None,
            })
        })
        .or_else(|| control_planes.first().map(|n| n.name.clone()))
        .unwrap_or_default();

    let has = |s: Stage| request.stages.0.contains(&s);
    let kubeadm = settings.distribution == Distribution::Kubeadm;
    let mut out = Vec::new();
    let preflight = |out: &mut Vec<Step>| {
        out.push(Step::new(UpgradeStep::NodesReady));
        out.push(Step::new(UpgradeStep::SshReachable));
        if etcd.is_some() {
            out.push(Step::new(UpgradeStep::EtcdHealthy));
        }
        // k3s and RKE2 have no upgrade plan to ask: ssh-reachable found the release on
        // the mirror, and each node's fetch checks it before its drain.
        if kubeadm {
            out.push(Step::new(UpgradeStep::KubeadmPlan {
                node: applies_on.clone(),
            }));
        }
    };
    let worker_count = facts
        .nodes
        .iter()
        .filter(|n| n.role == Role::Worker)
        .count();
    let batch_size = settings.max_unavailable.of(worker_count);
    settings
        .failure_budget
        .check(worker_count)
        .map_err(PlanError::FailureBudget)?;
    let finish = |steps: Vec<Step>, skipped: Vec<String>| Plan {
        current,
        layout,
        control_planes: order_notes.clone(),
        workers: workers.clone(),
        batch_size,
        skipped,
        steps,
    };
    if request.dry_run {
        preflight(&mut out);
        skipped.push("dry run: nothing is changed".into());
        return Ok(finish(out, skipped));
    }
    out.push(Step::new(UpgradeStep::MarkInFlight));
    if has(Stage::Preflight) {
        preflight(&mut out);
    }
    if has(Stage::Snapshot) {
        out.push(Step::new(UpgradeStep::EtcdSnapshot));
    }
    if has(Stage::Containerd) && !kubeadm {
        skipped.push(format!(
            "containerd: {} bundles its own, upgraded with the release",
            settings.distribution
        ));
    } else if has(Stage::Containerd) {
        let newest_worker = facts
            .nodes
            .iter()
            .filter(|n| n.role == Role::Worker)
            .filter_map(|n| n.containerd)
            .max();
        for cp in &control_planes {
            match (cp.containerd, newest_worker) {
                (Some(on_cp), Some(newest)) if on_cp < newest => {
                    out.push(Step::new(UpgradeStep::Containerd {
                        node: cp.name.clone(),
                    }))
                }
                (Some(on_cp), _) => skipped.push(format!(
                    "containerd: {}'s {on_cp} is not behind the workers",
                    cp.name
                )),
                (None, _) => skipped.push(format!(
                    "containerd: {} does not report a containerd version",
                    cp.name
                )),
            }
        }
    }
    if has(Stage::AptRepo) && !kubeadm {
        skipped.push(format!(
            "apt-repo: {} nodes take the release from cluster.release_mirror",
            settings.distribution
        ));
    } else if has(Stage::AptRepo) && request.kind == UpgradeKind::Minor {
        let nodes = behind
            .iter()
            .map(|n| n.name.clone())
            .chain(workers.iter().cloned());
        for node in nodes {
            out.push(Step::new(UpgradeStep::AptRepo { node }));
        }
    } else if has(Stage::AptRepo) {
        skipped.push("apt-repo: a patch upgrade stays on the current repository".into());
    }
    if has(Stage::ControlPlane) && !behind.is_empty() {
        out.push(Step::new(UpgradeStep::ControlPlaneNext));
    }
    if has(Stage::Workers) {
        for batch in workers.chunks(batch_size) {
            out.extend(
                if settings.reboot_after_upgrade {
                    node_cycle::worker_batch::<WorkerCycle<true>>(batch, settings.judge_batches)
                } else {
                    node_cycle::worker_batch::<WorkerCycle<false>>(batch, settings.judge_batches)
                }
                .into_iter()
                .map(Step::new),
            );
        }
    }
    if has(Stage::Postflight) {
        out.push(Step::new(UpgradeStep::NodesAtTarget));
        out.push(Step::new(UpgradeStep::Gate {
            stage: Stage::Postflight,
            node: None,
        }));
        out.push(Step::new(UpgradeStep::PodReady));
    }
    out.push(Step::new(UpgradeStep::ClearInFlight));
    Ok(finish(out, skipped))
}

/// What `step` will do, in words, for `rollgate plan`, with `driver` upgrading the nodes.
pub fn describe(step: &UpgradeStep, target: Version, driver: &NodeDriver) -> String {
    use UpgradeStep as S;
    let k3s = driver.distribution != Distribution::Kubeadm;
    let release = driver.release(target, None);
    match step {
        S::Fetch { node, .. } if k3s => format!(
            "download {release} from {} to {node} and check it against the release's sha256sum file, before its drain",
            driver.mirror
        ),
        S::Fetch { node, .. } => format!(
            "download kubeadm, kubelet and kubectl {release} into {node}'s package cache, checked against its repository's checksums, before its drain"
        ),
        S::Upgrade { node, stage } if k3s => {
            let (role, unit) = match (stage, driver.distribution) {
                (Stage::ControlPlane, Distribution::Rke2) => ("server", "rke2-server"),
                (_, Distribution::Rke2) => ("agent", "rke2-agent"),
                (Stage::ControlPlane, _) => ("server", "k3s"),
                _ => ("agent", "k3s-agent"),
            };
            format!(
                "run node-k3s.sh --apply --role {role} --release {release} on {node}: swap the binary (the previous kept beside it), systemctl restart {unit}"
            )
        }
        S::Plan => "read the nodes and plan the run".into(),
        S::Upstreams => format!(
            "wait until every upstream cluster (fleet.upstreams) runs {target} and stayed quiet for fleet.soak"
        ),
        S::MarkInFlight => format!(
            "annotate the upgrade namespace in-flight (target {target}); set k8s_upgrade_in_flight=1"
        ),
        S::NodesReady => "check that every node is Ready".into(),
        S::SshReachable => "check that every node answers over SSH with a known host key".into(),
        S::Gate { .. } => "wait for the gate to open (no blocking alert firing)".into(),
        S::QuietPeriod => "check that no blocking alert fired in the quiet period".into(),
        S::EtcdHealthy => "check that etcd has a leader, every member answers and keeps up, and no alarm is raised; record the raft term".into(),
        S::ControlPlaneNext => "read the nodes and etcd; upgrade the next control plane (etcd followers' nodes first) or move leadership once".into(),
        S::ControlPlaneHealthy { node, after: false } => format!(
            "before {node}: every control plane Ready, its static pods Ready, every etcd member healthy and caught up, quorum kept with one down"
        ),
        S::ControlPlaneHealthy { node, after: true } => format!(
            "after {node}: the same checks, and its static pods at {target}"
        ),
        S::MoveLeader { node } => format!(
            "move etcd leadership to {node}'s member (MoveLeader on the leader), confirmed by a majority"
        ),
        S::Apply { node } => format!(
            "run node-upgrade.sh --role control-plane --kubeadm apply --release {target} on {node} (kubeadm upgrade apply)"
        ),
        S::KubeadmPlan { node } => {
            format!("run `kubeadm upgrade plan` on {node} and check it offers {target}")
        }
        S::EtcdSnapshot => format!(
            "stream an etcd snapshot to k8s-upgrade-pre-{target}-EPOCH.db, fsync, verify, record its sha256"
        ),
        S::Containerd { node } => format!("upgrade containerd on {node} to the workers' version"),
        S::AptRepo { node } => format!(
            "point {node}'s Kubernetes package repository at v{}.{}",
            target.major, target.minor
        ),
        S::Drain { node, .. } => format!(
            "cordon {node}, evict its pods through the Eviction API (PDBs honoured), wait until they are gone"
        ),
        S::Upgrade {
            stage: Stage::ControlPlane,
            node,
        } => format!(
            "run node-upgrade.sh --role control-plane --kubeadm node --release {target} on {node} (kubeadm upgrade node)"
        ),
        S::Upgrade { node, .. } => format!(
            "run node-upgrade.sh --role worker --release {target} on {node} (kubeadm upgrade node)"
        ),
        S::Reboot { node, .. } => format!(
            "read {node}'s reboot sentinel; if the script left it set, reboot {node} (its boot id marked first) and wait until it is back Ready with another boot id, still drained"
        ),
        S::Verify { node, .. } => format!("wait until {node} is Ready with kubelet {target}"),
        S::Uncordon { node, .. } => format!("uncordon {node} if rollgate cordoned it"),
        S::Soak { node, .. } => format!("let {node} soak before the next node"),
        S::Analysis { node } => format!(
            "judge the batch ending with {node} against the workers beside it (gate.analysis): pass goes on, fail halts, inconclusive holds"
        ),
        S::NodesAtTarget => format!("check that every node runs {target}"),
        S::PodReady => "check the ratio of Ready pods".into(),
        S::ClearInFlight => "clear the in-flight annotations; set k8s_upgrade_in_flight=0".into(),
    }
}

/// A new upgrade run: with `upstreams` (a fleet wave) the wait for them, then the gate,
/// the quiet period and `plan`, which appends the rest.
pub fn new_run(
    id: String,
    request: &DetectionRequest,
    upstreams: bool,
    on_failure: FailurePolicy,
    now: DateTime<Utc>,
) -> Run {
    Run::new(
        id,
        crate::domain::upgrade_step::K8S_UPGRADE,
        request.to_json(),
        Some(request.target_version.to_string()),
        initial_steps(request, upstreams),
        now,
        "accepted",
    )
    .failing(on_failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::{StepStatus, Steps};
    use crate::workflows::node_cycle::plan::drains_ahead;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    fn node(name: &str, role: Role, kubelet: &str, containerd: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            role,
            kubelet: v(kubelet),
            distribution: Default::default(),
            package_manager: None,
            containerd: Some(v(containerd)),
            ready: true,
            address: None,
        }
    }

    fn cluster(cp: &str, workers: &[&str]) -> ClusterFacts {
        let mut nodes = vec![node("cp", Role::ControlPlane, cp, "1.7.20")];
        for (i, w) in workers.iter().enumerate() {
            nodes.push(node(&format!("w{}", i + 1), Role::Worker, w, "1.7.20"));
        }
        ClusterFacts { nodes }
    }

    fn request(target: &str, kind: UpgradeKind, stages: &str) -> DetectionRequest {
        DetectionRequest {
            target_version: v(target),
            kind,
            dry_run: false,
            stages: StageSelection::parse(stages).unwrap(),
            build: None,
        }
    }

    fn labels(plan: &Plan) -> Vec<String> {
        plan.steps.iter().map(Step::label).collect()
    }

    /// Expected: `Ok(())`, or an error whose message holds this text.
    type Want = Result<(), &'static str>;

    fn on(distribution: Distribution, mut facts: ClusterFacts) -> ClusterFacts {
        for n in &mut facts.nodes {
            n.distribution = distribution;
        }
        facts
    }

    #[test]
    fn a_k3s_plan_fetches_before_each_drain_and_has_no_kubeadm_stages() {
        let settings = PlanSettings {
            distribution: Distribution::K3s,
            ..PlanSettings::default()
        };
        let facts = on(Distribution::K3s, cluster("1.34.2", &["1.34.2", "1.34.2"]));
        let p = plan(
            &request("1.35.0", UpgradeKind::Minor, "all"),
            &facts,
            None,
            &settings,
        )
        .expect("plan");
        let labels = labels(&p);
        assert!(
            !labels.iter().any(|l| l.contains("kubeadm-plan")),
            "{labels:?}"
        );
        assert!(
            !labels.iter().any(|l| l.contains("containerd/")),
            "{labels:?}"
        );
        assert!(
            !labels.iter().any(|l| l.contains("apt-repo/")),
            "{labels:?}"
        );
        for w in ["w1", "w2"] {
            let at = |name: &str| {
                labels
                    .iter()
                    .position(|l| *l == format!("workers/{name}@{w}"))
                    .unwrap_or_else(|| panic!("workers/{name}@{w} in {labels:?}"))
            };
            assert!(at("fetch") < at("drain"), "{labels:?}");
        }
        assert!(
            p.skipped.iter().any(|s| s.contains("bundles its own")),
            "{:?}",
            p.skipped
        );
        let action = ControlPlaneAction::Upgrade {
            node: "cp".into(),
            kubeadm: Kubeadm::Apply,
        };
        let cp: Vec<String> = control_plane_steps(&action, false, Distribution::K3s)
            .iter()
            .map(Step::label)
            .collect();
        assert_eq!(cp[0], "control-plane/fetch@cp", "{cp:?}");
        assert!(
            cp.contains(&"control-plane/upgrade@cp".to_owned()),
            "{cp:?}"
        );
        assert!(!cp.iter().any(|l| l.contains("apply")), "{cp:?}");
    }

    #[test]
    fn nodes_of_another_distribution_or_a_stray_build_are_refused() {
        let kubeadm = PlanSettings::default();
        let k3s = PlanSettings {
            distribution: Distribution::K3s,
            ..PlanSettings::default()
        };
        let mut with_build = request("1.34.5", UpgradeKind::Patch, "all");
        with_build.build = Some(2);
        let labelled = |distribution, manager: &str| {
            let mut facts = on(distribution, cluster("1.34.2", &["1.34.2"]));
            facts.nodes[1].package_manager = Some(manager.to_owned());
            facts
        };
        let patch = request("1.34.5", UpgradeKind::Patch, "all");
        let cases: [(&PlanSettings, ClusterFacts, &DetectionRequest, Want); 7] = [
            (
                &kubeadm,
                labelled(Distribution::Kubeadm, "dnf"),
                &patch,
                Ok(()),
            ),
            (
                &kubeadm,
                labelled(Distribution::Kubeadm, "yum"),
                &patch,
                Err(
                    "node w1 has the label rollgate.io/package-manager=\"yum\": it must be apt, dnf or zypper",
                ),
            ),
            (
                &k3s,
                labelled(Distribution::K3s, "apt"),
                &patch,
                Err("which is for kubeadm nodes"),
            ),
            (
                &kubeadm,
                on(Distribution::K3s, cluster("1.34.2", &["1.34.2"])),
                &request("1.34.5", UpgradeKind::Patch, "all"),
                Err(
                    "node cp runs k3s (its kubelet version says so), and cluster.distribution is kubeadm",
                ),
            ),
            (
                &k3s,
                on(Distribution::Rke2, cluster("1.34.2", &["1.34.2"])),
                &request("1.34.5", UpgradeKind::Patch, "all"),
                Err("node cp runs rke2"),
            ),
            (
                &kubeadm,
                cluster("1.34.2", &["1.34.2"]),
                &with_build,
                Err("build names a k3s or RKE2 build"),
            ),
            (
                &k3s,
                on(Distribution::K3s, cluster("1.34.2", &["1.34.2"])),
                &with_build,
                Ok(()),
            ),
        ];
        for (settings, facts, request, want) in cases {
            let got = plan(request, &facts, None, settings).map(drop);
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(text)) => assert!(e.to_string().contains(text), "{e}"),
                (got, want) => panic!("got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn version_rules() {
        use UpgradeKind::*;
        let cases: &[(&str, UpgradeKind, &str, &[&str], Want)] = &[
            ("1.34.5", Patch, "1.34.2", &["1.34.2"], Ok(())),
            ("1.35.0", Minor, "1.34.2", &["1.34.2"], Ok(())),
            ("1.35.4", Minor, "1.34.2", &["1.34.2"], Ok(())),
            ("1.34.1", Patch, "1.34.2", &["1.34.2"], Err("downgrades")),
            ("1.33.9", Minor, "1.34.2", &["1.34.2"], Err("downgrades")),
            (
                "1.35.0",
                Patch,
                "1.34.2",
                &["1.34.2"],
                Err("use kind=minor"),
            ),
            (
                "1.34.5",
                Minor,
                "1.34.2",
                &["1.34.2"],
                Err("use kind=patch"),
            ),
            (
                "1.36.0",
                Minor,
                "1.34.2",
                &["1.34.2"],
                Err("next minor is 1.35"),
            ),
            ("2.0.0", Minor, "1.34.2", &["1.34.2"], Err("major")),
            ("1.34.2", Patch, "1.34.2", &["1.34.2"], Err("nothing to do")),
            // The control plane got there, a worker did not: finishing is allowed.
            ("1.34.5", Patch, "1.34.5", &["1.34.2"], Ok(())),
            (
                "1.34.5",
                Patch,
                "1.34.2",
                &["1.34.6"],
                Err("newer than target"),
            ),
        ];
        for (target, kind, cp, workers, want) in cases {
            let facts = cluster(cp, workers);
            let got = check_target(*kind, v(target), v(cp), &facts);
            match (want, got) {
                (Ok(()), Ok(())) => {}
                (Err(needle), Err(e)) => assert!(
                    e.to_string().contains(needle),
                    "{target} {kind:?} from {cp}: {e} lacks {needle:?}"
                ),
                (want, got) => panic!("{target} {kind:?} from {cp}: want {want:?}, got {got:?}"),
            }
        }
    }

    /// The plan of a patch upgrade to 1.34.5 of every stage.
    fn patch_plan(facts: &ClusterFacts, settings: &PlanSettings) -> Plan {
        plan(
            &request("1.34.5", UpgradeKind::Patch, "all"),
            facts,
            None,
            settings,
        )
        .unwrap()
    }

    #[test]
    fn a_full_patch_plan_goes_stage_by_stage_in_the_configured_order() {
        let facts = cluster("1.34.2", &["1.34.2", "1.34.2", "1.34.2"]);
        let settings = PlanSettings {
            worker_order: vec!["w3".into(), "w1".into()],
            ..PlanSettings::default()
        };
        let plan = patch_plan(&facts, &settings);
        assert_eq!(plan.workers, ["w3", "w1", "w2"]);
        let labels = labels(&plan);
        let expected_head = [
            "accept/mark-in-flight",
            "preflight/nodes-ready",
            "preflight/ssh-reachable",
            "preflight/kubeadm-plan@cp",
            "snapshot/etcd-snapshot",
            "control-plane/next",
            "workers/fetch@w3",
            "workers/gate@w3",
            "workers/drain@w3",
        ];
        assert_eq!(&labels[..expected_head.len()], expected_head);
        assert_eq!(
            &labels[labels.len() - 4..],
            [
                "postflight/nodes-at-target",
                "postflight/gate",
                "postflight/pod-ready",
                "finish/clear-in-flight"
            ]
        );
        assert!(!labels.iter().any(|l| l.starts_with("apt-repo")));
        assert!(!labels.iter().any(|l| l.starts_with("containerd")));
        // Every drain is preceded by a gate on the same node.
        for (i, step) in plan.steps.iter().enumerate() {
            if let Some(UpgradeStep::Drain { stage, node }) = step.kind.get::<UpgradeStep>() {
                let gate = UpgradeStep::Gate {
                    stage: *stage,
                    node: Some(node.clone()),
                };
                assert_eq!(plan.steps[i - 1].kind, gate.into());
            }
        }
    }

    #[test]
    fn a_reboot_if_required_follows_each_nodes_script_inside_its_drain() {
        let facts = cluster("1.34.2", &["1.34.2", "1.34.2"]);
        for reboot in [false, true] {
            let settings = PlanSettings {
                reboot_after_upgrade: reboot,
                ..PlanSettings::default()
            };
            let plan = patch_plan(&facts, &settings);
            let w1: Vec<String> = labels(&plan)
                .into_iter()
                .filter(|l| l.ends_with("@w1"))
                .collect();
            let mut want = vec![
                "workers/fetch@w1",
                "workers/gate@w1",
                "workers/drain@w1",
                "workers/upgrade@w1",
            ];
            if reboot {
                want.push("workers/reboot-if-required@w1");
            }
            want.extend([
                "workers/verify@w1",
                "workers/uncordon@w1",
                "workers/soak@w1",
            ]);
            assert_eq!(w1, want, "reboot_after_upgrade {reboot}");
            let cp = ControlPlaneAction::Upgrade {
                node: "cp".into(),
                kubeadm: Kubeadm::Node,
            };
            let cp_steps: Vec<String> = control_plane_steps(&cp, reboot, Distribution::Kubeadm)
                .iter()
                .map(Step::label)
                .collect();
            assert_eq!(
                cp_steps.contains(&"control-plane/reboot-if-required@cp".to_owned()),
                reboot,
                "{cp_steps:?}"
            );
        }
    }

    #[test]
    fn workers_go_in_batches_each_behind_one_gate_with_one_soak() {
        let facts = cluster("1.34.2", &["1.34.2"; 5]);
        let settings = PlanSettings {
            max_unavailable: MaxUnavailable::Count(2),
            ..PlanSettings::default()
        };
        let plan = patch_plan(&facts, &settings);
        assert_eq!(plan.batch_size, 2);
        let workers: Vec<String> = labels(&plan)
            .into_iter()
            .filter(|l| l.starts_with("workers/"))
            .collect();
        let batch = |a: &str, b: &str| {
            [
                format!("workers/fetch@{a}"),
                format!("workers/fetch@{b}"),
                format!("workers/gate@{a}"),
                format!("workers/drain@{a}"),
                format!("workers/upgrade@{a}"),
                format!("workers/verify@{a}"),
                format!("workers/uncordon@{a}"),
                format!("workers/drain@{b}"),
                format!("workers/upgrade@{b}"),
                format!("workers/verify@{b}"),
                format!("workers/uncordon@{b}"),
                format!("workers/soak@{b}"),
            ]
        };
        let mut want: Vec<String> = batch("w1", "w2").into();
        want.extend(batch("w3", "w4"));
        want.extend(
            [
                "workers/fetch@w5",
                "workers/gate@w5",
                "workers/drain@w5",
                "workers/upgrade@w5",
                "workers/verify@w5",
                "workers/uncordon@w5",
                "workers/soak@w5",
            ]
            .map(String::from),
        );
        assert_eq!(workers, want);

        // Each drain of a batch looks at the batch's other drains not finished.
        let at = |label: &str| {
            plan.steps
                .iter()
                .position(|s| s.label() == label)
                .expect(label)
        };
        let steps = Steps::from(plan.steps.clone());
        assert_eq!(drains_ahead(&steps, at("workers/drain@w1")), ["w2"]);
        assert_eq!(drains_ahead(&steps, at("workers/drain@w2")), ["w1"]);
        assert!(drains_ahead(&steps, at("workers/drain@w5")).is_empty());
        let mut started = steps.clone();
        started[at("workers/drain@w2")].status = StepStatus::Done;
        assert!(
            drains_ahead(&started, at("workers/drain@w1")).is_empty(),
            "a drained node has nothing left to check"
        );
        // Every step of a worker's cycle is in its lane; gates and soaks run alone.
        let lanes: Vec<Option<&str>> = plan.steps[at("workers/gate@w1")..=at("workers/soak@w2")]
            .iter()
            .map(|s| s.kind.lane())
            .collect();
        let mut want = vec![None];
        want.extend([Some("w1"); 4]);
        want.extend([Some("w2"); 4]);
        want.push(None);
        assert_eq!(lanes, want);
    }

    #[test]
    fn with_analyses_each_batch_is_judged_after_its_soak_and_before_the_next_gate() {
        let facts = cluster("1.34.2", &["1.34.2"; 3]);
        for (judge_batches, want) in [
            (
                true,
                vec![
                    "workers/gate@w1",
                    "workers/soak@w2",
                    "workers/analysis@w2",
                    "workers/gate@w3",
                    "workers/soak@w3",
                    "workers/analysis@w3",
                ],
            ),
            (
                false,
                vec![
                    "workers/gate@w1",
                    "workers/soak@w2",
                    "workers/gate@w3",
                    "workers/soak@w3",
                ],
            ),
        ] {
            let settings = PlanSettings {
                max_unavailable: MaxUnavailable::Count(2),
                judge_batches,
                ..PlanSettings::default()
            };
            let plan = patch_plan(&facts, &settings);
            let got: Vec<String> = labels(&plan)
                .into_iter()
                .filter(|l| {
                    ["gate", "soak", "analysis"]
                        .iter()
                        .any(|n| l.starts_with(&format!("workers/{n}@")))
                })
                .collect();
            assert_eq!(got, want, "judge_batches {judge_batches}");
            let analysis = plan.steps.iter().find(|s| s.kind.is_analysis());
            assert_eq!(analysis.is_some(), judge_batches);
            assert!(analysis.is_none_or(|s| s.kind.lane().is_none()), "alone");
        }
    }

    #[test]
    fn a_failure_budget_fits_the_cluster() {
        use FailureBudget::Count;
        let facts = cluster("1.34.2", &["1.34.2"; 3]);
        let settings = |failure_budget| PlanSettings {
            failure_budget,
            ..PlanSettings::default()
        };
        let req = request("1.34.5", UpgradeKind::Patch, "all");
        assert!(plan(&req, &facts, Option::None, &settings(Count(3))).is_ok());
        let err = plan(&req, &facts, Option::None, &settings(Count(4))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cluster.failure_budget 4 is larger than the cluster's 3 worker(s)"
        );
    }

    #[test]
    fn a_minor_plan_rewrites_the_repository_on_every_node_first() {
        let mut facts = cluster("1.34.2", &["1.34.2", "1.34.2"]);
        facts.nodes[1].containerd = Some(v("1.7.24"));
        let plan = plan(
            &request("1.35.0", UpgradeKind::Minor, "all"),
            &facts,
            None,
            &PlanSettings::default(),
        )
        .unwrap();
        let labels = labels(&plan);
        let pos = |l: &str| labels.iter().position(|x| x == l).unwrap();
        assert!(pos("containerd@cp") < pos("apt-repo@cp"));
        assert!(pos("apt-repo@w2") < pos("control-plane/next"));
    }

    #[test]
    fn nodes_already_at_target_are_left_out() {
        let facts = cluster("1.34.5", &["1.34.5", "1.34.2"]);
        let plan = plan(
            &request("1.34.5", UpgradeKind::Patch, "all"),
            &facts,
            None,
            &PlanSettings::default(),
        )
        .unwrap();
        let labels = labels(&plan);
        assert!(!labels.iter().any(|l| l.ends_with("@w1")), "{labels:?}");
        assert!(!labels.iter().any(|l| l.starts_with("control-plane/")));
        assert!(labels.contains(&"workers/drain@w2".to_owned()));
        for skipped in [
            "worker w1 already runs 1.34.5",
            "control plane cp already runs 1.34.5",
        ] {
            assert!(
                plan.skipped.iter().any(|s| s == skipped),
                "{:?}",
                plan.skipped
            );
        }
    }

    #[test]
    fn a_dry_run_only_checks() {
        let facts = cluster("1.34.2", &["1.34.2"]);
        let mut req = request("1.34.5", UpgradeKind::Patch, "all");
        req.dry_run = true;
        let plan = plan(&req, &facts, None, &PlanSettings::default()).unwrap();
        let names: Vec<&str> = plan.steps.iter().map(|s| s.kind.name()).collect();
        assert_eq!(names, ["nodes-ready", "ssh-reachable", "kubeadm-plan"]);
    }

    #[test]
    fn the_gate_comes_before_the_plan_when_preflight_runs() {
        let names = |req: &DetectionRequest| -> Vec<String> {
            initial_steps(req, false).iter().map(Step::label).collect()
        };
        let all = request("1.34.5", UpgradeKind::Patch, "all");
        assert_eq!(
            names(&all),
            ["preflight/gate", "preflight/quiet-period", "plan"]
        );
        let snapshot = request("1.34.5", UpgradeKind::Patch, "snapshot");
        assert_eq!(names(&snapshot), ["plan"]);
        let mut dry = snapshot.clone();
        dry.dry_run = true;
        assert_eq!(names(&dry).len(), 3);
    }

    #[test]
    fn stage_subsets_that_make_no_sense_are_refused() {
        use UpgradeKind::*;
        let behind = cluster("1.34.2", &["1.34.2"]);
        let cp_done = cluster("1.34.5", &["1.34.2"]);
        let cases: &[(&str, UpgradeKind, &str, &ClusterFacts, Want)] = &[
            ("1.34.5", Patch, "preflight,snapshot", &behind, Ok(())),
            ("1.34.5", Patch, "preflight,workers", &cp_done, Ok(())),
            (
                "1.34.5",
                Patch,
                "preflight,workers",
                &behind,
                Err("add control-plane"),
            ),
            ("1.34.5", Patch, "workers", &cp_done, Err("need preflight")),
            (
                "1.34.5",
                Patch,
                "preflight,control-plane",
                &behind,
                Err("add snapshot"),
            ),
            (
                "1.35.0",
                Minor,
                "preflight,snapshot,control-plane",
                &behind,
                Err("add apt-repo"),
            ),
            (
                "1.34.5",
                Patch,
                "preflight,apt-repo",
                &behind,
                Err("kind=minor only"),
            ),
            ("1.34.5", Patch, "snapshot", &behind, Ok(())),
        ];
        for (target, kind, stages, facts, want) in cases {
            let got = plan(
                &request(target, *kind, stages),
                facts,
                None,
                &PlanSettings::default(),
            );
            match (want, got) {
                (Ok(()), Ok(_)) => {}
                (Err(needle), Err(e)) => {
                    assert!(e.to_string().contains(needle), "{stages}: {e}")
                }
                (want, got) => panic!("{stages}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn cluster_shape_errors_name_the_problem() {
        let mut facts = cluster("1.34.2", &["1.34.2"]);
        let req = request("1.34.5", UpgradeKind::Patch, "all");
        let unknown = PlanSettings {
            worker_order: vec!["w9".into()],
            ..PlanSettings::default()
        };
        assert_eq!(
            plan(&req, &facts, None, &unknown),
            Err(PlanError::UnknownWorker("w9".into()))
        );
        facts.nodes[1].role = Role::ControlPlane;
        facts.nodes[1].name = "cp2".into();
        assert_eq!(
            plan(&req, &facts, None, &PlanSettings::default()),
            Err(PlanError::Layout(LayoutError::Unseen(2)))
        );
        let two_stacked = etcd(&["cp", "cp2"], 0);
        let refused = plan(&req, &facts, Some(&two_stacked), &PlanSettings::default());
        assert!(
            matches!(&refused, Err(PlanError::ControlPlanes(why)) if why.contains("2 member(s) cannot keep quorum")),
            "{refused:?}"
        );
        facts.nodes.iter_mut().for_each(|n| n.role = Role::Worker);
        assert_eq!(
            plan(&req, &facts, None, &PlanSettings::default()),
            Err(PlanError::NoControlPlane)
        );
    }

    fn etcd(members: &[&str], leader: usize) -> EtcdFacts {
        EtcdFacts {
            members: members
                .iter()
                .enumerate()
                .map(|(i, name)| cps::EtcdMemberFacts {
                    id: 10 + i as u64,
                    name: name.to_string(),
                    answering: true,
                    raft_index: 100,
                    raft_term: 3,
                })
                .collect(),
            leader: Some(10 + leader as u64),
            alarms: Vec::new(),
        }
    }

    #[test]
    fn three_stacked_control_planes_are_planned_one_at_a_time_with_the_order_explained() {
        let mut facts = cluster("1.34.2", &["1.34.2"]);
        facts.nodes[0].name = "cp-a".into();
        for name in ["cp-b", "cp-c"] {
            facts
                .nodes
                .push(node(name, Role::ControlPlane, "1.34.2", "1.7.20"));
        }
        let etcd = etcd(&["cp-a", "cp-b", "cp-c"], 1);
        let req = request("1.34.5", UpgradeKind::Patch, "all");
        let plan = plan(&req, &facts, Some(&etcd), &PlanSettings::default()).unwrap();
        assert_eq!(plan.layout, EtcdLayout::Stacked);
        let labels = labels(&plan);
        assert!(
            labels.contains(&"preflight/etcd-healthy".to_owned()),
            "{labels:?}"
        );
        // kubeadm upgrade plan runs where apply will: a follower's node.
        assert!(
            labels.contains(&"preflight/kubeadm-plan@cp-a".to_owned()),
            "{labels:?}"
        );
        assert_eq!(
            labels
                .iter()
                .filter(|l| l.starts_with("control-plane/"))
                .collect::<Vec<_>>(),
            ["control-plane/next"]
        );
        assert_eq!(plan.control_planes.len(), 4, "{:?}", plan.control_planes);
        assert!(
            plan.control_planes[0]
                .starts_with("upgrade cp-a (kubeadm upgrade apply): an etcd follower's node")
        );
        assert!(
            plan.control_planes[2]
                .starts_with("move etcd leadership cp-b -> cp-a: the one leadership change")
        );
        assert!(
            plan.control_planes[3]
                .starts_with("upgrade cp-b (kubeadm upgrade node): hosts the etcd leader")
        );
    }

    #[test]
    fn a_control_plane_action_becomes_checked_gated_soaked_steps() {
        let names = |steps: Vec<Step>| steps.iter().map(Step::label).collect::<Vec<_>>();
        let upgrade = ControlPlaneAction::Upgrade {
            node: "cp-2".into(),
            kubeadm: Kubeadm::Apply,
        };
        assert_eq!(
            names(control_plane_steps(&upgrade, false, Distribution::Kubeadm)),
            [
                "control-plane/fetch@cp-2",
                "control-plane/healthy-before@cp-2",
                "control-plane/gate@cp-2",
                "control-plane/drain@cp-2",
                "control-plane/apply@cp-2",
                "control-plane/verify@cp-2",
                "control-plane/uncordon@cp-2",
                "control-plane/healthy-after@cp-2",
                "control-plane/soak@cp-2",
                "control-plane/next",
            ]
        );
        let node = ControlPlaneAction::Upgrade {
            node: "cp-1".into(),
            kubeadm: Kubeadm::Node,
        };
        assert!(
            names(control_plane_steps(&node, false, Distribution::Kubeadm))
                .contains(&"control-plane/upgrade@cp-1".to_owned())
        );
        let transfer = ControlPlaneAction::MoveLeader {
            from: "cp-1".into(),
            to: "cp-2".into(),
        };
        assert_eq!(
            names(control_plane_steps(&transfer, false, Distribution::Kubeadm)),
            ["control-plane/move-leader@cp-2", "control-plane/next"]
        );
        assert!(
            control_plane_steps(&ControlPlaneAction::Done, false, Distribution::Kubeadm).is_empty()
        );
    }
}
