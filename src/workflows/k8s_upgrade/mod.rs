//! The steps of a Kubernetes version upgrade, carried out through the ports. Each step is
//! idempotent: after a crash it runs again from its start and does no harm (a drain of a
//! drained node evicts nothing; an uncordon of a node we no longer hold changes nothing;
//! the node script checks what is installed before it installs).

mod control_planes;
pub mod intake;
pub mod plan;
pub mod snapshots;
pub use crate::domain::upgrade_step as step;

pub use crate::workflows::control_plane_cycle::{METRICS_TARGET, read_etcd};

use chrono::Utc;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::info;

use crate::domain::engine::StepOutcome;
use crate::domain::event::{DetectionRequest, Stage, UpgradeKind};
use crate::domain::run::{Run, Step};
use crate::domain::step_kind::StepKind;
use crate::domain::upgrade_step::UpgradeStep;
use crate::domain::version::Version;
use crate::error_chain;
use crate::metrics::Metrics;
use crate::ports::{
    ClusterError, ClusterRead, ExecError, ExecOutput, InFlight, InFlightMarks, NodeExec,
    NodeTarget, Snapshots, StepExecutor,
};
use crate::workflows::control_plane_cycle::ControlPlaneCycle;
use crate::workflows::k8s_upgrade::plan::{NodeFacts, PlanSettings, Role};
use crate::workflows::node_cycle::driver::{NodeDriver, NodeRole};
use crate::workflows::node_cycle::{NodeCycle, own_reboot_managers};
use crate::workflows::node_reboot::NodeReboots;

/// The kubeadm node script, piped to `bash -s`.
pub use crate::workflows::node_cycle::driver::KUBEADM_SCRIPT as NODE_SCRIPT;
pub use crate::workflows::node_cycle::driver::UNSUPPORTED_OS;

/// Lines of script output kept in the run history.
const TAIL_LINES: usize = 6;

/// Upgrade settings the steps need.
#[derive(Debug, Clone)]
pub struct UpgradeSettings {
    /// Planning choices.
    pub plan: PlanSettings,
    /// How long a node may take to report the target after its script.
    pub verify_timeout: Duration,
    /// Lowest ratio of Ready pods post-flight accepts.
    pub pod_ready_ratio: f64,
    /// Where snapshots go.
    pub snapshot_dir: PathBuf,
    /// How many of rollgate's snapshots stay there.
    pub snapshot_keep: usize,
}

/// The ports the steps drive.
pub struct UpgradeSteps {
    /// Reads nodes and pods.
    pub cluster: Arc<dyn ClusterRead>,
    /// In-flight annotations.
    pub marks: Arc<dyn InFlightMarks>,
    /// The node scripts over SSH.
    pub exec: Arc<dyn NodeExec>,
    /// Which script upgrades a node, and with what arguments.
    pub driver: NodeDriver,
    /// etcd snapshots; `None` when no etcd endpoint is configured.
    pub snapshots: Option<Arc<dyn Snapshots>>,
    /// The control planes one at a time: etcd's health and leadership, health checks.
    pub control_planes: ControlPlaneCycle,
    /// Drain, soak, verify and snapshot settings from the configuration.
    pub settings: UpgradeSettings,
    /// Where it counts what it does.
    pub metrics: Metrics,
    /// The node cycle: holds, cordon and drain, uncordon, soak, silences, Events.
    pub cycle: NodeCycle,
    /// With `reboot.after_upgrade = "if-required"`: the reboot a node's script may leave
    /// it needing, inside the same drain.
    pub reboot_after: Option<NodeReboots>,
}

/// The stage number (0–7) of a step, for the `k8s_upgrade_stage` gauge.
pub fn stage_number(step: &UpgradeStep) -> i64 {
    match (step, step.stage()) {
        (_, Some(stage)) => stage as i64 + 1,
        (UpgradeStep::ClearInFlight, None) => 7,
        (_, None) => 0,
    }
}

/// A failed SSH run: a changed host key never gets better by retrying.
fn exec_failure(e: ExecError) -> StepOutcome {
    match e {
        ExecError::HostKey { .. } => StepOutcome::failed(error_chain(&e)),
        other => StepOutcome::retry(other.to_string()),
    }
}

fn script_result(what: &str, out: ExecOutput) -> StepOutcome {
    match out.status {
        Some(0) => StepOutcome::done(format!("{what}: {}", out.tail(TAIL_LINES))),
        status => StepOutcome::retry(format!(
            "{what} exited with {}: {}",
            status.map_or("a signal".into(), |s| s.to_string()),
            out.tail(TAIL_LINES)
        )),
    }
}

impl UpgradeSteps {
    async fn node_facts(&self, name: &str) -> Result<NodeFacts, ClusterError> {
        self.cluster
            .node(name)
            .await?
            .ok_or_else(|| ClusterError::new(format!("node {name} is no longer in the cluster")))
    }

    /// The driver's script's output on `node`, or the outcome when it could not run.
    async fn script_on(&self, node: &str, args: &[String]) -> Result<ExecOutput, StepOutcome> {
        let node = self
            .node_facts(node)
            .await
            .map_err(|e| StepOutcome::retry(error_chain(&e)))?;
        let args = self.driver.on_node(&node, args.to_vec());
        self.exec
            .run_script(&NodeTarget::from(&node), self.driver.script(), &args)
            .await
            .map_err(exec_failure)
    }

    /// The driver's upgrade of `node` as `role`.
    async fn upgrade(&self, node: &str, role: NodeRole, request: &DetectionRequest) -> StepOutcome {
        let args = self
            .driver
            .apply(role, request.target_version, request.build);
        let what = format!("{} on {node}", self.driver.script_name());
        self.run_on(node, args, &what).await
    }

    /// The driver's download and check of the release on `node`, before its drain.
    async fn fetch(&self, node: &str, request: &DetectionRequest) -> StepOutcome {
        let args = self.driver.stage(request.target_version, request.build);
        let what = format!(
            "release {} on {node}",
            self.driver.release(request.target_version, request.build)
        );
        self.run_on(node, args, &what).await
    }

    async fn run_on(&self, node: &str, args: Vec<String>, what: &str) -> StepOutcome {
        match self.script_on(node, &args).await {
            Ok(out) if self.driver.refusal(out.status).is_some() => StepOutcome::failed(format!(
                "{what}: {}",
                refused_line(&out.stderr, self.driver.script_name())
            )),
            Ok(out) => script_result(what, out),
            Err(outcome) => outcome,
        }
    }

    async fn plan(&self, run: &Run, request: &DetectionRequest) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        };
        let etcd = match self.control_planes.etcd_facts().await {
            Ok(etcd) => etcd,
            Err(e) => return StepOutcome::retry(e),
        };
        match plan::plan(request, &facts, etcd.as_ref(), &self.settings.plan) {
            Err(e) => StepOutcome::failed(error_chain(&e)),
            Ok(p) => {
                let batches = match p.batch_size {
                    1 => String::new(),
                    n => format!(" in batches of {n}"),
                };
                let mut note = format!(
                    "control plane at {}, etcd {}: {}; {} steps; workers{batches} in order: {}",
                    p.current,
                    p.layout,
                    p.control_planes.join("; "),
                    p.steps.len(),
                    if p.workers.is_empty() {
                        "none".into()
                    } else {
                        p.workers.join(", ")
                    }
                );
                if !p.skipped.is_empty() {
                    note.push_str("; skipped: ");
                    note.push_str(&p.skipped.join("; "));
                }
                info!(run_id = %run.id, %note, "planned");
                StepOutcome::Planned {
                    note,
                    steps: p.steps,
                }
            }
        }
    }

    async fn mark(
        &self,
        run: &Run,
        target: Version,
        snapshot: Option<String>,
    ) -> Result<(), ClusterError> {
        let marks = InFlight {
            run_id: run.id.clone(),
            target: target.to_string(),
            snapshot_path: snapshot,
        };
        self.marks.set_in_flight(Some(&marks)).await
    }

    async fn nodes_ready(&self) -> StepOutcome {
        match self.cluster.facts().await {
            Err(e) => StepOutcome::retry(error_chain(&e)),
            Ok(facts) => match facts.not_ready().as_slice() {
                [] => StepOutcome::done(format!("all {} nodes Ready", facts.nodes.len())),
                not_ready => StepOutcome::retry(format!("not Ready: {}", not_ready.join(", "))),
            },
        }
    }

    async fn ssh_reachable(&self, request: &DetectionRequest) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        };
        let patch = request.kind == UpgradeKind::Patch;
        let args = self
            .driver
            .check(request.target_version, request.build, patch);
        let checks = facts.nodes.iter().map(|node| {
            let target = NodeTarget::from(node);
            let args = self.driver.on_node(node, args.clone());
            async move {
                let checked = self
                    .exec
                    .run_script(&target, self.driver.script(), &args)
                    .await;
                let managers = match &checked {
                    Ok(out) if out.status == Some(0) => {
                        Some(own_reboot_managers(&*self.exec, &target).await)
                    }
                    _ => None,
                };
                (target.name.clone(), checked, managers)
            }
        });
        let mut answered = Vec::new();
        for (name, result, managers) in futures_util::future::join_all(checks).await {
            match (result, managers) {
                // A reboot manager of the node's own would reboot it under the upgrade.
                (Ok(_), Some(Ok(found))) if !found.is_empty() => {
                    return StepOutcome::failed(format!("{name}: {}", found.join("; ")));
                }
                (Ok(_), Some(Err(e))) => {
                    return StepOutcome::retry(format!(
                        "cannot tell {name}'s own reboot managers: {e}"
                    ));
                }
                (result, _) => match result {
                    Ok(out) if out.status == Some(0) => answered.push(name),
                    // An OS no driver serves, a release the mirror lacks: no retry mends them.
                    Ok(out) if self.driver.refusal(out.status).is_some() => {
                        return StepOutcome::failed(format!(
                            "{name} {}",
                            refused_line(&out.stderr, self.driver.script_name())
                        ));
                    }
                    Ok(out) => {
                        return StepOutcome::retry(format!(
                            "node check on {name} failed: {}",
                            out.tail(TAIL_LINES)
                        ));
                    }
                    Err(e) => return exec_failure(e),
                },
            }
        }
        StepOutcome::done(format!(
            "answered over SSH, no reboot manager of their own: {}",
            answered.join(", ")
        ))
    }

    async fn kubeadm_plan(&self, request: &DetectionRequest, node: &str) -> StepOutcome {
        let target = request.target_version;
        let args = vec!["--plan".into(), "--release".into(), target.to_string()];
        let out = match self.script_on(node, &args).await {
            Ok(out) => out,
            Err(outcome) => return outcome,
        };
        if out.status != Some(0) {
            return StepOutcome::retry(format!(
                "kubeadm upgrade plan failed: {}",
                out.tail(TAIL_LINES)
            ));
        }
        let offered = parse_candidate(&out.stdout);
        match (request.kind, offered) {
            (UpgradeKind::Patch, None) => StepOutcome::failed(format!(
                "the package repository on {node} does not offer kubeadm {target} (apt-cache madison kubeadm, or dnf list --showduplicates --disableexcludes=kubernetes kubeadm)"
            )),
            (UpgradeKind::Patch, Some(pkg)) => StepOutcome::done(format!(
                "kubeadm upgrade plan passed its health checks; kubeadm {pkg} is available"
            )),
            (UpgradeKind::Minor, _) => StepOutcome::done(format!(
                "kubeadm upgrade plan passed its health checks; the v{}.{} repository is set at apt-repo",
                target.major, target.minor
            )),
        }
    }

    async fn snapshot(&self, run: &Run, target: Version) -> StepOutcome {
        let Some(snapshots) = &self.snapshots else {
            return StepOutcome::failed(
                "etcd.endpoints is not set: rollgate cannot take the pre-upgrade snapshot",
            );
        };
        let dir = &self.settings.snapshot_dir;
        if let Err(outcome) = self.room_for_a_snapshot(dir) {
            return outcome;
        }
        let path = dir.join(snapshots::name(target, Utc::now().timestamp()));
        let info = match snapshots.save(&path).await {
            Ok(info) => info,
            Err(e) => {
                return StepOutcome::retry(error_chain(&e));
            }
        };
        if let Err(e) = self.mark(run, target, Some(info.path.clone())).await {
            // The snapshot exists; only the annotation is missing. The retry takes a new
            // snapshot, which costs disk, not safety.
            return StepOutcome::retry(format!(
                "snapshot {} taken, annotation failed: {}",
                info.path,
                error_chain(&e)
            ));
        }
        self.metrics.upgrade_snapshot_taken.set(1);
        StepOutcome::done(format!(
            "snapshot {} ({} bytes, sha256 {}){}",
            info.path,
            info.bytes,
            info.sha256,
            self.prune_snapshots(dir)
        ))
    }

    /// Refuses, before anything is written, a snapshot dir without room for about twice
    /// the last snapshot: a failed step halts the run with no node touched.
    fn room_for_a_snapshot(&self, dir: &std::path::Path) -> Result<(), StepOutcome> {
        let names = snapshots::names_in(dir)
            .map_err(|e| StepOutcome::retry(format!("cannot list {}: {e}", dir.display())))?;
        let last = snapshots::newest_first(names)
            .first()
            .and_then(|n| std::fs::metadata(dir.join(n)).ok())
            .map(|m| m.len());
        let Some(last_bytes) = last else {
            return Ok(());
        };
        let free = crate::disk::free_bytes(dir).unwrap_or(0);
        snapshots::room(free, last).map_err(|wanted| {
            StepOutcome::failed(format!(
                "{} has {} free; the last snapshot took {}, and the next needs about {}: free space there or lower etcd.snapshot_keep",
                dir.display(),
                crate::disk::human(free),
                crate::disk::human(last_bytes),
                crate::disk::human(wanted)
            ))
        })
    }

    /// Removes rollgate's snapshots beyond the newest `etcd.snapshot_keep`, once the new
    /// one is verified; says what it removed, for the step's outcome.
    fn prune_snapshots(&self, dir: &std::path::Path) -> String {
        let Ok(names) = snapshots::names_in(dir) else {
            return String::new();
        };
        let mut removed = Vec::new();
        for name in snapshots::beyond(names, self.settings.snapshot_keep) {
            match std::fs::remove_file(dir.join(&name)) {
                Ok(()) => removed.push(name),
                Err(e) => {
                    tracing::warn!(file = %dir.join(&name).display(), error = %e, "cannot prune an old snapshot")
                }
            }
        }
        if removed.is_empty() {
            String::new()
        } else {
            format!(
                "; pruned {} older snapshot(s) beyond etcd.snapshot_keep ({}): {}",
                removed.len(),
                self.settings.snapshot_keep,
                removed.join(", ")
            )
        }
    }

    async fn containerd(&self, node: &str) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return StepOutcome::retry(error_chain(&e)),
        };
        let newest = facts
            .nodes
            .iter()
            .filter(|n| n.role == Role::Worker)
            .filter_map(|n| n.containerd)
            .max();
        let Some(newest) = newest else {
            return StepOutcome::done("no worker reports a containerd version; nothing to match");
        };
        if facts.node(node).and_then(|n| n.containerd) >= Some(newest) {
            return StepOutcome::done(format!("{node} already runs containerd {newest} or newer"));
        }
        let args = vec!["--containerd".into(), newest.to_string()];
        self.run_on(node, args, &format!("containerd {newest} on {node}"))
            .await
    }

    async fn verify(&self, step: &Step, node: &str, target: Version) -> StepOutcome {
        let now = Utc::now();
        let started = step.started_at.unwrap_or(now);
        // The API server not answering says nothing of the node: verify waits it out
        // within its own bound, as it waits for the node.
        let state = match self.cluster.node(node).await {
            Err(e) => format!("no answer about {node}: {}", error_chain(&e)),
            Ok(found) => {
                let Some(n) = found else {
                    return StepOutcome::failed(format!("node {node} is no longer in the cluster"));
                };
                if n.kubelet == target && n.ready {
                    self.cycle.tell(
                        node,
                        "Upgraded",
                        "Upgrade",
                        format!("upgraded to v{target}: kubelet v{target}, Ready"),
                    );
                    return StepOutcome::done(format!("{node} is Ready with kubelet {target}"));
                }
                format!(
                    "{node} reports kubelet {} and {}",
                    n.kubelet,
                    if n.ready { "Ready" } else { "not Ready" }
                )
            }
        };
        let waited = crate::clock::since(started);
        if waited >= self.settings.verify_timeout {
            return StepOutcome::failed(format!(
                "{state} {}s after the script; it stays cordoned",
                waited.as_secs()
            ));
        }
        let poll = (self.settings.verify_timeout / 20)
            .clamp(Duration::from_millis(500), Duration::from_secs(10));
        StepOutcome::Wait {
            until: now + chrono::Duration::from_std(poll).unwrap_or_default(),
            reason: format!("waiting for {node}: {state}"),
        }
    }

    async fn nodes_at_target(&self, target: Version) -> StepOutcome {
        match self.cluster.facts().await {
            Err(e) => StepOutcome::retry(error_chain(&e)),
            Ok(facts) => {
                let behind = facts.behind(target);
                let not_ready = facts.not_ready();
                if behind.is_empty() && not_ready.is_empty() {
                    StepOutcome::done(format!(
                        "all {} nodes run {target} and are Ready",
                        facts.nodes.len()
                    ))
                } else {
                    StepOutcome::retry(format!(
                        "not at target: [{}]; not Ready: [{}]",
                        behind.join(", "),
                        not_ready.join(", ")
                    ))
                }
            }
        }
    }

    async fn pod_ready(&self) -> StepOutcome {
        match self.cluster.pod_readiness().await {
            Err(e) => StepOutcome::retry(error_chain(&e)),
            Ok((ready, total)) => {
                let ratio = if total == 0 {
                    1.0
                } else {
                    ready as f64 / total as f64
                };
                let text = format!(
                    "{ready}/{total} pods Ready ({:.2}, need {:.2})",
                    ratio, self.settings.pod_ready_ratio
                );
                if ratio >= self.settings.pod_ready_ratio {
                    StepOutcome::done(text)
                } else {
                    StepOutcome::retry(text)
                }
            }
        }
    }

    async fn clear(&self) -> StepOutcome {
        match self.marks.set_in_flight(None).await {
            Ok(()) => {
                clear_gauges(&self.metrics);
                StepOutcome::done("in-flight annotations cleared")
            }
            Err(e) => StepOutcome::retry(error_chain(&e)),
        }
    }
}

impl UpgradeSteps {
    /// Does `step` (of kind `kind`) of `run`, which asks for `request`.
    async fn run_step(
        &self,
        run: &Run,
        index: usize,
        kind: &UpgradeStep,
        request: &DetectionRequest,
    ) -> StepOutcome {
        let step = &run.steps[index];
        let target = request.target_version;
        use UpgradeStep as S;
        match kind {
            S::Plan => self.plan(run, request).await,
            S::MarkInFlight => match self.mark(run, target, None).await {
                Ok(()) => {
                    self.metrics.upgrade_in_flight.set(1);
                    self.metrics.upgrade_snapshot_taken.set(0);
                    StepOutcome::done(format!("in flight: target {target}"))
                }
                Err(e) => StepOutcome::retry(error_chain(&e)),
            },
            S::NodesReady => self.nodes_ready().await,
            S::SshReachable => self.ssh_reachable(request).await,
            S::KubeadmPlan { node } => self.kubeadm_plan(request, node).await,
            S::EtcdSnapshot => self.snapshot(run, target).await,
            S::Containerd { node } => self.containerd(node).await,
            S::AptRepo { node } => {
                let minor = format!("{}.{}", target.major, target.minor);
                let args = vec!["--apt-minor".into(), minor.clone()];
                self.run_on(
                    node,
                    args,
                    &format!("package repository v{minor} on {node}"),
                )
                .await
            }
            S::Fetch { node, .. } => self.fetch(node, request).await,
            S::Drain { node, .. } => self.cycle.drain(run, index, node).await,
            S::Apply { node } => {
                self.upgrade(node, NodeRole::FirstControlPlane, request)
                    .await
            }
            S::Upgrade { stage, node } => {
                let role = if *stage == Stage::ControlPlane {
                    NodeRole::ControlPlane
                } else {
                    NodeRole::Worker
                };
                self.upgrade(node, role, request).await
            }
            S::EtcdHealthy => self.control_planes.etcd_healthy(step).await,
            S::ControlPlaneNext => self.control_plane_next(run, step, target).await,
            S::ControlPlaneHealthy { node, after } => {
                self.control_plane_healthy(step, node, *after, target).await
            }
            S::MoveLeader { node } => self.move_leader(node, target).await,
            S::Reboot { node, .. } => match &self.reboot_after {
                Some(reboots) => reboots.if_required(run, step, node).await,
                None => StepOutcome::done(format!(
                    "reboot.after_upgrade is never: {node} is not rebooted inside its drain"
                )),
            },
            S::Verify { node, .. } => self.verify(step, node, target).await,
            S::Uncordon { node, .. } => self.cycle.uncordon(run, step, node).await,
            S::Soak { node, .. } => self.cycle.soak(step, node),
            S::NodesAtTarget => self.nodes_at_target(target).await,
            S::PodReady => self.pod_ready().await,
            S::ClearInFlight => self.clear().await,
            S::Gate { .. } | S::QuietPeriod => {
                StepOutcome::failed(format!("{} is the gate's step", step.label()))
            }
            S::Analysis { .. } => {
                StepOutcome::failed(format!("{} is the analysis's step", step.label()))
            }
            S::Upstreams => StepOutcome::failed(format!("{} is the fleet's step", step.label())),
        }
    }
}

/// The script's last line on stderr, without the script's own prefix: the refusal.
fn refused_line(stderr: &str, script: &str) -> String {
    let prefix = format!("{}: ", script.trim_end_matches(".sh"));
    let said = stderr.lines().last().unwrap_or_default();
    said.trim_start_matches(prefix.as_str()).to_owned()
}

/// The kubeadm package version the node script found for the target, if any.
fn parse_candidate(stdout: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("rollgate: kubeadm-candidate "))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// An upgrade's steps, each to the executor that carries it out: the pre-flight quiet
/// period to the gate's, a fleet wave's wait for its upstreams to the fleet's, and every
/// other step to the upgrade's own (none when no cluster is configured: those park).
#[derive(Default)]
pub struct UpgradeExecutors {
    /// The pre-flight quiet period.
    pub quiet_period: Option<Arc<dyn StepExecutor>>,
    /// The wait for the fleet's upstream clusters.
    pub upstreams: Option<Arc<dyn StepExecutor>>,
    /// Every other step.
    pub steps: Option<Arc<dyn StepExecutor>>,
}

impl UpgradeExecutors {
    fn pick(&self, step: &Step) -> Option<&Arc<dyn StepExecutor>> {
        match step.kind.get::<UpgradeStep>() {
            Some(UpgradeStep::QuietPeriod) => self.quiet_period.as_ref(),
            Some(UpgradeStep::Upstreams) => self.upstreams.as_ref(),
            _ => self.steps.as_ref(),
        }
    }
}

#[async_trait::async_trait]
impl StepExecutor for UpgradeExecutors {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        match self.pick(&run.steps[index]) {
            Some(executor) => executor.execute(run, index).await,
            None => StepOutcome::failed(format!(
                "nothing here carries out {}",
                run.steps[index].label()
            )),
        }
    }

    fn carries_out(&self, step: &Step) -> bool {
        self.pick(step).is_some()
    }
}

#[async_trait::async_trait]
impl StepExecutor for UpgradeSteps {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let step = &run.steps[index];
        let Some(kind) = step.kind.get::<UpgradeStep>() else {
            return StepOutcome::failed(format!("{} is not a step of an upgrade", step.label()));
        };
        self.metrics.upgrade_stage.set(stage_number(kind));
        let request = match run.request_as::<DetectionRequest>() {
            Ok(r) => r,
            Err(e) => {
                return StepOutcome::failed(format!("the run's request no longer validates: {e}"));
            }
        };
        self.cycle
            .act(
                &self.metrics,
                run,
                index,
                kind.has_node_in_hand(),
                self.run_step(run, index, kind, &request),
            )
            .await
    }
}

/// No upgrade in flight: the gauges the Upgrade Gates rules read go back to rest.
pub fn clear_gauges(metrics: &Metrics) {
    metrics.upgrade_in_flight.set(0);
    metrics.upgrade_snapshot_taken.set(0);
    metrics.upgrade_stage.set(-1);
    metrics.upgrade_node_in_hand.reset();
}

/// Sets `k8s_upgrade_node_in_hand` to 1 for `nodes` alone.
fn show_nodes_in_hand(metrics: &Metrics, nodes: &[&str]) {
    metrics.upgrade_node_in_hand.reset();
    for node in nodes {
        metrics
            .upgrade_node_in_hand
            .with_label_values(&[node])
            .set(1);
    }
}

/// The nodes `run` has in hand: drained (or being drained) and not yet uncordoned, in
/// the order of their drains.
pub fn nodes_in_hand(run: &Run) -> Vec<&str> {
    crate::workflows::node_cycle::plan::nodes_in_hand(&run.steps)
}

/// Whether `run` has done its step `kind`.
fn has_done(run: &Run, kind: UpgradeStep) -> bool {
    let kind = StepKind::from(kind);
    run.steps
        .iter()
        .any(|s| s.kind == kind && s.status == crate::domain::run::StepStatus::Done)
}

/// Whether `run` set the in-flight marks (and the gauges with them); a run refused before
/// its `mark-in-flight` (another upgrade holds the cluster) never did.
pub fn marked_in_flight(run: &Run) -> bool {
    has_done(run, UpgradeStep::MarkInFlight)
}

/// Restores the upgrade gauges after a restart from the runs in progress (a halted run is
/// still in flight: its marks are on the cluster).
pub fn restore_gauges(metrics: &Metrics, runs: &[Run]) {
    let in_flight = runs
        .iter()
        .find(|r| marked_in_flight(r) && !has_done(r, UpgradeStep::ClearInFlight));
    metrics
        .upgrade_in_flight
        .set(i64::from(in_flight.is_some()));
    metrics.upgrade_snapshot_taken.set(i64::from(
        in_flight.is_some_and(|r| has_done(r, UpgradeStep::EtcdSnapshot)),
    ));
    show_nodes_in_hand(metrics, &in_flight.map(nodes_in_hand).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_numbers_follow_the_reference() {
        let node = || "n".to_owned();
        let cases = [
            (UpgradeStep::Plan, 0),
            (UpgradeStep::MarkInFlight, 0),
            (UpgradeStep::NodesReady, 1),
            (UpgradeStep::QuietPeriod, 1),
            (UpgradeStep::EtcdSnapshot, 2),
            (UpgradeStep::Containerd { node: node() }, 3),
            (UpgradeStep::AptRepo { node: node() }, 4),
            (
                UpgradeStep::Drain {
                    stage: Stage::ControlPlane,
                    node: node(),
                },
                5,
            ),
            (
                UpgradeStep::Soak {
                    stage: Stage::Workers,
                    node: node(),
                },
                6,
            ),
            (UpgradeStep::ControlPlaneNext, 5),
            (UpgradeStep::EtcdHealthy, 1),
            (
                UpgradeStep::Gate {
                    stage: Stage::Postflight,
                    node: None,
                },
                7,
            ),
            (UpgradeStep::ClearInFlight, 7),
        ];
        for (step, n) in cases {
            assert_eq!(stage_number(&step), n, "{step:?}");
        }
    }

    #[test]
    fn a_node_is_in_hand_from_its_drain_to_its_uncordon() {
        use crate::domain::run::{Step, StepStatus};
        let w = |n: &str| n.to_owned();
        let stage = Stage::Workers;
        let steps = |statuses: &[StepStatus]| -> Run {
            let kinds = [
                UpgradeStep::Drain {
                    stage,
                    node: w("w1"),
                },
                UpgradeStep::Uncordon {
                    stage,
                    node: w("w1"),
                },
                UpgradeStep::Soak {
                    stage,
                    node: w("w1"),
                },
                UpgradeStep::Drain {
                    stage,
                    node: w("w2"),
                },
                UpgradeStep::Uncordon {
                    stage,
                    node: w("w2"),
                },
            ];
            let steps = kinds
                .into_iter()
                .zip(statuses)
                .map(|(k, status)| Step {
                    status: *status,
                    ..Step::new(k)
                })
                .collect();
            Run::new(
                "r".into(),
                crate::domain::upgrade_step::K8S_UPGRADE,
                serde_json::Value::Null,
                None,
                steps,
                chrono::Utc::now(),
                "t",
            )
        };
        use StepStatus::{Done, Failed, Pending, Running, Waiting};
        let cases: [(&[StepStatus], &[&str]); 7] = [
            (&[Pending, Pending, Pending, Pending, Pending], &[]),
            (&[Running, Pending, Pending, Pending, Pending], &["w1"]),
            (&[Failed, Pending, Pending, Pending, Pending], &["w1"]),
            (&[Done, Waiting, Pending, Pending, Pending], &["w1"]),
            (&[Done, Done, Waiting, Pending, Pending], &[]),
            (&[Done, Done, Done, Running, Pending], &["w2"]),
            (&[Done, Done, Done, Done, Done], &[]),
        ];
        for (statuses, want) in cases {
            let run = steps(statuses);
            assert_eq!(nodes_in_hand(&run), want, "{statuses:?}");
        }
    }

    #[test]
    fn the_candidate_line_is_found() {
        assert_eq!(
            parse_candidate("x\nrollgate: kubeadm-candidate 1.34.5-1.1\ny"),
            Some("1.34.5-1.1".into())
        );
        assert_eq!(parse_candidate("rollgate: kubeadm-candidate \n"), None);
        assert_eq!(parse_candidate(""), None);
    }
}
