//! The narrow traits the worker drives the world through. Adapters (prometheus, notify,
//! kube, ssh, etcd) implement them; the worker, the gate and the steps only see these.

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::detect::Minor;
use crate::domain::engine::StepOutcome;
use crate::domain::gate::PromReading;
use crate::domain::plan::ClusterFacts;
use crate::domain::run::{Run, RunStatus, Step};
use crate::domain::version::Version;

/// Carries out one kind of step. A step must be idempotent: after a crash it is executed
/// again from the start.
#[async_trait::async_trait]
pub trait StepExecutor: Send + Sync {
    /// Executes step `index` of `run`.
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome;
}

/// The executors the worker knows, by step name.
#[derive(Clone, Default)]
pub struct Executors(HashMap<String, Arc<dyn StepExecutor>>);

impl Executors {
    /// Registers `executor` for steps named `name`.
    pub fn with(mut self, name: &str, executor: Arc<dyn StepExecutor>) -> Self {
        self.0.insert(name.to_owned(), executor);
        self
    }
    /// The executor for `step`, if any.
    pub fn get(&self, step: &Step) -> Option<Arc<dyn StepExecutor>> {
        self.0.get(&step.name).cloned()
    }
}

/// Answers PromQL instant queries.
#[async_trait::async_trait]
pub trait MetricsSource: Send + Sync {
    /// The series `promql` returns now, or why there is no usable answer.
    async fn query(&self, promql: &str) -> PromReading;
}

/// One transition of one run, as people are told about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The run.
    pub run_id: String,
    /// Its kind, e.g. `k8s-upgrade`.
    pub kind: String,
    /// Its target version, if any.
    pub target: Option<String>,
    /// Status before (`None` when the run was created).
    pub from: Option<RunStatus>,
    /// Status after.
    pub to: RunStatus,
    /// The step in hand, with its node.
    pub step: Option<String>,
    /// Why.
    pub reason: String,
    /// What holds the run, if a gate does.
    pub blockers: Vec<String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// Tells people about transitions. Never fails and never blocks the caller: a sink counts
/// and logs its own failures.
pub trait Notifier: Send + Sync {
    /// Sends `notice` in the background.
    fn notify(&self, notice: Notice);
}

/// Reads what the planner and the checks need from the cluster.
#[async_trait::async_trait]
pub trait ClusterRead: Send + Sync {
    /// Every node with its role, versions and readiness.
    async fn facts(&self) -> Result<ClusterFacts, ClusterError>;
    /// Pods that should run (not Succeeded or Failed): `(ready, total)`.
    async fn pod_readiness(&self) -> Result<(usize, usize), ClusterError>;
    /// The API server's version (`GET /version`).
    async fn api_server_version(&self) -> Result<Version, ClusterError>;
}

/// Cordons, drains and uncordons nodes.
#[async_trait::async_trait]
pub trait NodeDrain: Send + Sync {
    /// Cordons `node` on behalf of `owner` (a run id), unless someone else already did.
    async fn cordon(&self, node: &str, owner: &str) -> Result<Cordon, ClusterError>;
    /// Evicts every evictable pod from `node` and waits until they are gone.
    async fn drain(&self, node: &str, options: &DrainOptions) -> Result<DrainReport, DrainError>;
    /// Uncordons `node` if `owner` cordoned it; leaves anyone else's cordon alone.
    async fn uncordon(&self, node: &str, owner: &str) -> Result<Cordon, ClusterError>;
}

/// Keeps the in-flight annotations on the upgrade namespace.
#[async_trait::async_trait]
pub trait InFlightMarks: Send + Sync {
    /// Sets (`Some`) or clears (`None`) the marks.
    async fn set_in_flight(&self, marks: Option<&InFlight>) -> Result<(), ClusterError>;
}

/// The in-flight marks of a run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InFlight {
    /// The run.
    pub run_id: String,
    /// The target version.
    pub target: String,
    /// The pre-upgrade snapshot, once taken.
    pub snapshot_path: Option<String>,
}

/// Who holds a node's cordon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cordon {
    /// Schedulable.
    None,
    /// Cordoned by this owner (now or earlier).
    Ours,
    /// Cordoned by someone else; rollgate leaves it so.
    Theirs,
}

/// How to drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainOptions {
    /// Give up after this long.
    pub timeout: Duration,
    /// Pause between eviction attempts refused by a PodDisruptionBudget.
    pub retry_every: Duration,
    /// Grace period for the evicted pods; `None` = each pod's own.
    pub grace_period: Option<u32>,
}

/// What a drain did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DrainReport {
    /// Pods evicted and gone.
    pub evicted: usize,
    /// DaemonSet and mirror pods left in place.
    pub skipped: usize,
    /// Evictions refused by a PodDisruptionBudget and tried again.
    pub refusals: usize,
}

/// Why a drain did not finish.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DrainError {
    /// PodDisruptionBudgets still refused evictions at the timeout.
    #[error("drain of {node} timed out after {secs}s; still blocked: {blocked}")]
    Blocked {
        /// The node.
        node: String,
        /// The timeout.
        secs: u64,
        /// Each pod and what blocks it.
        blocked: String,
    },
    /// Pods evicted but not gone at the timeout.
    #[error("drain of {node} timed out after {secs}s; pods still terminating: {pods}")]
    Terminating {
        /// The node.
        node: String,
        /// The timeout.
        secs: u64,
        /// The pods.
        pods: String,
    },
    /// The API failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// A Kubernetes API failure, in words an operator can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kubernetes API: {0}")]
pub struct ClusterError(pub String);

/// Runs the node script on a node over SSH.
#[async_trait::async_trait]
pub trait NodeExec: Send + Sync {
    /// Runs `bash -s -- args` on `node` with `script` on stdin.
    async fn run_script(
        &self,
        node: &NodeTarget,
        script: &str,
        args: &[String],
    ) -> Result<ExecOutput, ExecError>;
}

/// Where a node is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTarget {
    /// The node's name.
    pub name: String,
    /// Its InternalIP, used unless the configuration names a host for it.
    pub address: Option<String>,
}

/// What a remote command printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit status (`None` when killed by a signal).
    pub status: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl ExecOutput {
    /// The last `lines` lines of stdout and stderr, for the run history.
    pub fn tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.stdout.lines().chain(self.stderr.lines()).collect();
        all[all.len().saturating_sub(lines)..].join(" | ")
    }
}

/// Why a remote command did not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The node's host key does not match known_hosts: nothing was run.
    #[error(
        "ssh to {node}: host key verification failed (the key differs from known_hosts, or is missing); nothing was run"
    )]
    HostKey {
        /// The node.
        node: String,
    },
    /// No connection.
    #[error("ssh to {node}: cannot connect: {error}")]
    Connect {
        /// The node.
        node: String,
        /// Why.
        error: String,
    },
    /// The command ran past its timeout and was ended.
    #[error("ssh to {node}: command ended after its {secs}s timeout")]
    Timeout {
        /// The node.
        node: String,
        /// The timeout.
        secs: u64,
    },
    /// Anything else.
    #[error("ssh to {node}: {error}")]
    Other {
        /// The node.
        node: String,
        /// Why.
        error: String,
    },
}

/// Takes etcd snapshots.
#[async_trait::async_trait]
pub trait Snapshots: Send + Sync {
    /// Streams a snapshot to `path` (through a temp file), verifies it, and says what it wrote.
    async fn save(&self, path: &Path) -> Result<SnapshotInfo, SnapshotError>;
}

/// A snapshot written and verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Where.
    pub path: String,
    /// Its size.
    pub bytes: u64,
    /// sha256 of the whole file, hex.
    pub sha256: String,
}

/// Why no snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("etcd snapshot: {0}")]
pub struct SnapshotError(pub String);

/// The parts of a StatefulSet's rolling update that an etcd roll drives.
#[async_trait::async_trait]
pub trait StatefulSets: Send + Sync {
    /// Replicas, partition and revisions of `namespace/name`.
    async fn statefulset(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<StatefulSetState, ClusterError>;
    /// Sets the rolling update's partition.
    async fn set_partition(
        &self,
        namespace: &str,
        name: &str,
        partition: u32,
    ) -> Result<(), ClusterError>;
    /// A pod's revision (`controller-revision-hash`) and readiness; `None` when it does not exist.
    async fn pod_state(&self, namespace: &str, pod: &str)
    -> Result<Option<PodState>, ClusterError>;
}

/// A StatefulSet's rolling-update state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatefulSetState {
    /// `spec.replicas`.
    pub replicas: u32,
    /// `spec.updateStrategy.rollingUpdate.partition` (0 when unset).
    pub partition: u32,
    /// `status.updateRevision`: the revision pods move to.
    pub update_revision: String,
}

/// A pod as a roll sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// Its `controller-revision-hash` label.
    pub revision: String,
    /// Its Ready condition is True (and it is not terminating).
    pub ready: bool,
}

/// The Kubernetes package repository `rollgate detect` reads.
#[async_trait::async_trait]
pub trait PackageRepository: Send + Sync {
    /// Whether `minor`'s repository is published (its Release file exists).
    async fn published(&self, minor: Minor) -> Result<bool, RepoError>;
    /// The kubeadm releases `minor`'s repository holds.
    async fn releases(&self, minor: Minor) -> Result<Vec<Version>, RepoError>;
}

/// The package repository could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("package repository {url}: {error}")]
pub struct RepoError {
    /// What was asked.
    pub url: String,
    /// What went wrong.
    pub error: String,
}

/// Where detection metrics are pushed.
#[async_trait::async_trait]
pub trait MetricsPush: Send + Sync {
    /// Replaces the job's metrics with `text` (Prometheus exposition format).
    async fn push(&self, text: String) -> Result<(), String>;
}
