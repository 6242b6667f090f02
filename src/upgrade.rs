//! The steps of a Kubernetes version upgrade, carried out through the ports. Each step is
//! idempotent: after a crash it runs again from its start and does no harm (a drain of a
//! drained node evicts nothing; an uncordon of a node we no longer hold changes nothing;
//! the node script checks what is installed before it installs).

use chrono::{DateTime, Utc};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use crate::domain::engine::StepOutcome;
use crate::domain::event::{DetectionRequest, Stage, UpgradeKind};
use crate::domain::plan::{self, ACCEPT, FINISH, PlanSettings, Role, steps};
use crate::domain::run::{Run, Step};
use crate::domain::version::Version;
use crate::metrics::Metrics;
use crate::ports::{
    ClusterRead, Cordon, DrainError, DrainOptions, ExecError, ExecOutput, Executors, InFlight,
    InFlightMarks, NodeDrain, NodeExec, NodeTarget, Snapshots, StepExecutor,
};

/// The script run on nodes, piped to `bash -s`.
pub const NODE_SCRIPT: &str = include_str!("../scripts/node-upgrade.sh");

/// Lines of script output kept in the run history.
const TAIL_LINES: usize = 6;

/// Upgrade settings the steps need.
#[derive(Debug, Clone)]
pub struct UpgradeSettings {
    /// Planning choices.
    pub plan: PlanSettings,
    /// How to drain.
    pub drain: DrainOptions,
    /// How long each worker soaks.
    pub soak: Duration,
    /// How long a node may take to report the target after its script.
    pub verify_timeout: Duration,
    /// Lowest ratio of Ready pods post-flight accepts.
    pub pod_ready_ratio: f64,
    /// Where snapshots go.
    pub snapshot_dir: PathBuf,
}

/// The ports the steps drive.
pub struct UpgradeSteps {
    /// Reads nodes and pods.
    pub cluster: Arc<dyn ClusterRead>,
    /// Cordons and drains.
    pub nodes: Arc<dyn NodeDrain>,
    /// In-flight annotations.
    pub marks: Arc<dyn InFlightMarks>,
    /// The node script over SSH.
    pub exec: Arc<dyn NodeExec>,
    /// etcd snapshots; `None` when no etcd endpoint is configured.
    pub snapshots: Option<Arc<dyn Snapshots>>,
    /// Settings.
    pub settings: UpgradeSettings,
    /// Metrics.
    pub metrics: Metrics,
}

/// Every step name these executors handle (the gate steps are the gate's).
pub const STEP_NAMES: [&str; 16] = [
    steps::PLAN,
    steps::MARK_IN_FLIGHT,
    steps::NODES_READY,
    steps::SSH_REACHABLE,
    steps::KUBEADM_PLAN,
    steps::ETCD_SNAPSHOT,
    steps::CONTAINERD,
    steps::APT_REPO,
    steps::DRAIN,
    steps::UPGRADE,
    steps::VERIFY,
    steps::UNCORDON,
    steps::SOAK,
    steps::NODES_AT_TARGET,
    steps::POD_READY,
    steps::CLEAR_IN_FLIGHT,
];

impl UpgradeSteps {
    /// `executors` with these steps registered.
    pub fn register(self: Arc<Self>, mut executors: Executors) -> Executors {
        for name in STEP_NAMES {
            executors = executors.with(name, self.clone());
        }
        executors
    }
}

/// The stage number (0–7) of a step's stage, for the `k8s_upgrade_stage` gauge.
pub fn stage_number(stage: &str) -> i64 {
    match stage {
        ACCEPT | steps::PLAN => 0,
        FINISH => 7,
        other => Stage::from_name(other).map_or(-1, |s| s as i64 + 1),
    }
}

fn retry_at(step: &Step, now: DateTime<Utc>) -> DateTime<Utc> {
    let secs = 5u64.saturating_mul(1 << step.attempts.saturating_sub(1).min(6));
    now + chrono::Duration::seconds(secs.min(300) as i64)
}

fn retry(step: &Step, error: impl Into<String>) -> StepOutcome {
    StepOutcome::Retry {
        at: retry_at(step, Utc::now()),
        error: error.into(),
    }
}

/// A failed SSH run: a changed host key never gets better by retrying.
fn exec_failure(step: &Step, e: ExecError) -> StepOutcome {
    match e {
        ExecError::HostKey { .. } => StepOutcome::failed(e.to_string()),
        other => retry(step, other.to_string()),
    }
}

fn script_result(step: &Step, what: &str, out: ExecOutput) -> StepOutcome {
    match out.status {
        Some(0) => StepOutcome::done(format!("{what}: {}", out.tail(TAIL_LINES))),
        status => retry(
            step,
            format!(
                "{what} exited with {}: {}",
                status.map_or("a signal".into(), |s| s.to_string()),
                out.tail(TAIL_LINES)
            ),
        ),
    }
}

impl UpgradeSteps {
    async fn target_node(&self, name: &str) -> Result<NodeTarget, String> {
        let facts = self.cluster.facts().await.map_err(|e| e.to_string())?;
        let node = facts
            .node(name)
            .ok_or_else(|| format!("node {name} is no longer in the cluster"))?;
        Ok(NodeTarget {
            name: node.name.clone(),
            address: node.address.clone(),
        })
    }

    /// The node script's output on `node`, or the outcome when it could not run.
    async fn script_on(
        &self,
        step: &Step,
        node: &str,
        args: &[String],
    ) -> Result<ExecOutput, StepOutcome> {
        let target = self.target_node(node).await.map_err(|e| retry(step, e))?;
        self.exec
            .run_script(&target, NODE_SCRIPT, args)
            .await
            .map_err(|e| exec_failure(step, e))
    }

    async fn run_on(&self, step: &Step, node: &str, args: Vec<String>, what: &str) -> StepOutcome {
        match self.script_on(step, node, &args).await {
            Ok(out) => script_result(step, what, out),
            Err(outcome) => outcome,
        }
    }

    async fn plan(&self, run: &Run, request: &DetectionRequest, step: &Step) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return retry(step, e.to_string()),
        };
        match plan::plan(request, &facts, &self.settings.plan) {
            Err(e) => StepOutcome::failed(e.to_string()),
            Ok(p) => {
                let mut note = format!(
                    "control plane {} runs {}; {} steps; workers in order: {}",
                    p.control_plane,
                    p.current,
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
    ) -> Result<(), String> {
        let marks = InFlight {
            run_id: run.id.clone(),
            target: target.to_string(),
            snapshot_path: snapshot,
        };
        self.marks
            .set_in_flight(Some(&marks))
            .await
            .map_err(|e| e.to_string())
    }

    async fn nodes_ready(&self, step: &Step) -> StepOutcome {
        match self.cluster.facts().await {
            Err(e) => retry(step, e.to_string()),
            Ok(facts) => match facts.not_ready().as_slice() {
                [] => StepOutcome::done(format!("all {} nodes Ready", facts.nodes.len())),
                not_ready => retry(step, format!("not Ready: {}", not_ready.join(", "))),
            },
        }
    }

    async fn ssh_reachable(&self, step: &Step) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return retry(step, e.to_string()),
        };
        let checks = facts.nodes.iter().map(|node| {
            let target = NodeTarget {
                name: node.name.clone(),
                address: node.address.clone(),
            };
            async move {
                let args = ["--check".to_owned()];
                (
                    target.name.clone(),
                    self.exec.run_script(&target, NODE_SCRIPT, &args).await,
                )
            }
        });
        let mut answered = Vec::new();
        for (name, result) in futures_util::future::join_all(checks).await {
            match result {
                Ok(out) if out.status == Some(0) => answered.push(name),
                Ok(out) => {
                    return retry(
                        step,
                        format!("node check on {name} failed: {}", out.tail(TAIL_LINES)),
                    );
                }
                Err(e) => return exec_failure(step, e),
            }
        }
        StepOutcome::done(format!("answered over SSH: {}", answered.join(", ")))
    }

    async fn kubeadm_plan(
        &self,
        step: &Step,
        request: &DetectionRequest,
        node: &str,
    ) -> StepOutcome {
        let target = request.target_version;
        let args = vec!["--plan".into(), "--release".into(), target.to_string()];
        let out = match self.script_on(step, node, &args).await {
            Ok(out) => out,
            Err(outcome) => return outcome,
        };
        if out.status != Some(0) {
            return retry(
                step,
                format!("kubeadm upgrade plan failed: {}", out.tail(TAIL_LINES)),
            );
        }
        let offered = parse_candidate(&out.stdout);
        match (request.kind, offered) {
            (UpgradeKind::Patch, None) => StepOutcome::failed(format!(
                "the apt repository on {node} does not offer kubeadm {target} (apt-cache madison kubeadm)"
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
        let name = format!("k8s-upgrade-pre-{target}-{}.db", Utc::now().timestamp());
        let path = self.settings.snapshot_dir.join(name);
        let info = match snapshots.save(&path).await {
            Ok(info) => info,
            Err(e) => {
                return StepOutcome::Retry {
                    at: Utc::now() + chrono::Duration::seconds(10),
                    error: e.to_string(),
                };
            }
        };
        if let Err(e) = self.mark(run, target, Some(info.path.clone())).await {
            // The snapshot exists; only the annotation is missing. The retry takes a new
            // snapshot, which costs disk, not safety.
            return StepOutcome::Retry {
                at: Utc::now() + chrono::Duration::seconds(5),
                error: format!("snapshot {} taken, annotation failed: {e}", info.path),
            };
        }
        self.metrics.upgrade_snapshot_taken.set(1);
        StepOutcome::done(format!(
            "snapshot {} ({} bytes, sha256 {})",
            info.path, info.bytes, info.sha256
        ))
    }

    async fn containerd(&self, step: &Step, node: &str) -> StepOutcome {
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return retry(step, e.to_string()),
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
        self.run_on(step, node, args, &format!("containerd {newest} on {node}"))
            .await
    }

    async fn drain(&self, run: &Run, step: &Step, node: &str) -> StepOutcome {
        let cordon = match self.nodes.cordon(node, &run.id).await {
            Ok(c) => c,
            Err(e) => return retry(step, e.to_string()),
        };
        match self.nodes.drain(node, &self.settings.drain).await {
            Ok(report) => StepOutcome::done(format!(
                "{node} {}; {} pod(s) evicted, {} DaemonSet/mirror pod(s) left, {} PDB refusal(s) waited out",
                if cordon == Cordon::Theirs {
                    "was already cordoned by someone else (left so)"
                } else {
                    "cordoned"
                },
                report.evicted,
                report.skipped,
                report.refusals
            )),
            // The timeout was the retry budget: fail, the node stays cordoned.
            Err(e @ (DrainError::Blocked { .. } | DrainError::Terminating { .. })) => {
                StepOutcome::failed(format!("{e}; {node} stays cordoned"))
            }
            Err(DrainError::Cluster(e)) => retry(step, e.to_string()),
        }
    }

    async fn verify(&self, step: &Step, node: &str, target: Version) -> StepOutcome {
        let now = Utc::now();
        let started = step.started_at.unwrap_or(now);
        let facts = match self.cluster.facts().await {
            Ok(f) => f,
            Err(e) => return retry(step, e.to_string()),
        };
        let Some(n) = facts.node(node) else {
            return StepOutcome::failed(format!("node {node} is no longer in the cluster"));
        };
        if n.kubelet == target && n.ready {
            return StepOutcome::done(format!("{node} is Ready with kubelet {target}"));
        }
        let state = format!(
            "{node} reports kubelet {} and {}",
            n.kubelet,
            if n.ready { "Ready" } else { "not Ready" }
        );
        let timeout = chrono::Duration::from_std(self.settings.verify_timeout)
            .unwrap_or(chrono::Duration::MAX);
        if now - started >= timeout {
            return StepOutcome::failed(format!(
                "{state} {}s after the script; it stays cordoned",
                (now - started).num_seconds()
            ));
        }
        let poll = (self.settings.verify_timeout / 20)
            .clamp(Duration::from_millis(500), Duration::from_secs(10));
        StepOutcome::Wait {
            until: now + chrono::Duration::from_std(poll).unwrap_or_default(),
            reason: format!("waiting for {node}: {state}"),
        }
    }

    async fn uncordon(&self, run: &Run, step: &Step, node: &str) -> StepOutcome {
        match self.nodes.uncordon(node, &run.id).await {
            Ok(Cordon::Theirs) => StepOutcome::done(format!(
                "{node} left cordoned: someone else cordoned it before rollgate"
            )),
            Ok(_) => StepOutcome::done(format!("{node} uncordoned")),
            Err(e) => retry(step, e.to_string()),
        }
    }

    fn soak(&self, step: &Step, node: &str) -> StepOutcome {
        let now = Utc::now();
        let until = step.started_at.unwrap_or(now)
            + chrono::Duration::from_std(self.settings.soak).unwrap_or_default();
        if now >= until {
            StepOutcome::done(format!("{node} soaked {:?}", self.settings.soak))
        } else {
            StepOutcome::Wait {
                until,
                reason: format!("{node} soaks until {}", until.format("%H:%M:%S")),
            }
        }
    }

    async fn nodes_at_target(&self, step: &Step, target: Version) -> StepOutcome {
        match self.cluster.facts().await {
            Err(e) => retry(step, e.to_string()),
            Ok(facts) => {
                let behind = facts.behind(target);
                let not_ready = facts.not_ready();
                if behind.is_empty() && not_ready.is_empty() {
                    StepOutcome::done(format!(
                        "all {} nodes run {target} and are Ready",
                        facts.nodes.len()
                    ))
                } else {
                    retry(
                        step,
                        format!(
                            "not at target: [{}]; not Ready: [{}]",
                            behind.join(", "),
                            not_ready.join(", ")
                        ),
                    )
                }
            }
        }
    }

    async fn pod_ready(&self, step: &Step) -> StepOutcome {
        match self.cluster.pod_readiness().await {
            Err(e) => retry(step, e.to_string()),
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
                    retry(step, text)
                }
            }
        }
    }

    async fn clear(&self, step: &Step) -> StepOutcome {
        match self.marks.set_in_flight(None).await {
            Ok(()) => {
                self.metrics.upgrade_in_flight.set(0);
                self.metrics.upgrade_stage.set(-1);
                StepOutcome::done("in-flight annotations cleared")
            }
            Err(e) => retry(step, e.to_string()),
        }
    }
}

/// The kubeadm package version the node script found for the target, if any.
fn parse_candidate(stdout: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("rollgate: kubeadm-candidate "))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

#[async_trait::async_trait]
impl StepExecutor for UpgradeSteps {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let step = &run.steps[index];
        self.metrics.upgrade_stage.set(stage_number(&step.stage));
        let request = match DetectionRequest::from_json(&run.request) {
            Ok(r) => r,
            Err(e) => {
                return StepOutcome::failed(format!("the run's request no longer validates: {e}"));
            }
        };
        let target = request.target_version;
        let node = step.node.clone().unwrap_or_default();
        let role = if step.stage == Stage::ControlPlane.name() {
            "control-plane"
        } else {
            "worker"
        };
        let started = std::time::Instant::now();
        let outcome = match step.name.as_str() {
            steps::PLAN => self.plan(run, &request, step).await,
            steps::MARK_IN_FLIGHT => match self.mark(run, target, None).await {
                Ok(()) => {
                    self.metrics.upgrade_in_flight.set(1);
                    self.metrics.upgrade_snapshot_taken.set(0);
                    StepOutcome::done(format!("in flight: target {target}"))
                }
                Err(e) => retry(step, e),
            },
            steps::NODES_READY => self.nodes_ready(step).await,
            steps::SSH_REACHABLE => self.ssh_reachable(step).await,
            steps::KUBEADM_PLAN => self.kubeadm_plan(step, &request, &node).await,
            steps::ETCD_SNAPSHOT => self.snapshot(run, target).await,
            steps::CONTAINERD => self.containerd(step, &node).await,
            steps::APT_REPO => {
                let minor = format!("{}.{}", target.major, target.minor);
                let args = vec!["--apt-minor".into(), minor.clone()];
                self.run_on(
                    step,
                    &node,
                    args,
                    &format!("apt repository v{minor} on {node}"),
                )
                .await
            }
            steps::DRAIN => self.drain(run, step, &node).await,
            steps::UPGRADE => {
                let args = vec![
                    "--role".into(),
                    role.into(),
                    "--release".into(),
                    target.to_string(),
                ];
                self.run_on(step, &node, args, &format!("node-upgrade.sh on {node}"))
                    .await
            }
            steps::VERIFY => self.verify(step, &node, target).await,
            steps::UNCORDON => self.uncordon(run, step, &node).await,
            steps::SOAK => self.soak(step, &node),
            steps::NODES_AT_TARGET => self.nodes_at_target(step, target).await,
            steps::POD_READY => self.pod_ready(step).await,
            steps::CLEAR_IN_FLIGHT => self.clear(step).await,
            other => StepOutcome::failed(format!("no upgrade step is called {other}")),
        };
        if !node.is_empty() {
            self.metrics
                .node_step_duration
                .with_label_values(&[&step.name, &node])
                .observe(started.elapsed().as_secs_f64());
        }
        if let StepOutcome::Retry { error, .. } | StepOutcome::Failed { error } = &outcome {
            warn!(run_id = %run.id, step = %step.label(), %error, "step did not succeed");
        }
        outcome
    }
}

/// Restores the upgrade gauges after a restart from the runs in progress (a halted run is
/// still in flight: its marks are on the cluster).
pub fn restore_gauges(metrics: &Metrics, runs: &[Run]) {
    let done = |run: &Run, name: &str| {
        run.steps
            .iter()
            .any(|s| s.name == name && s.status == crate::domain::run::StepStatus::Done)
    };
    let in_flight = runs
        .iter()
        .find(|r| done(r, steps::MARK_IN_FLIGHT) && !done(r, steps::CLEAR_IN_FLIGHT));
    metrics
        .upgrade_in_flight
        .set(i64::from(in_flight.is_some()));
    metrics.upgrade_snapshot_taken.set(i64::from(
        in_flight.is_some_and(|r| done(r, steps::ETCD_SNAPSHOT)),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_numbers_follow_the_reference() {
        let cases = [
            ("plan", 0),
            ("accept", 0),
            ("preflight", 1),
            ("snapshot", 2),
            ("containerd", 3),
            ("apt-repo", 4),
            ("control-plane", 5),
            ("workers", 6),
            ("postflight", 7),
            ("finish", 7),
            ("bogus", -1),
        ];
        for (stage, n) in cases {
            assert_eq!(stage_number(stage), n, "{stage}");
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
