//! The narrow traits the worker drives the world through. Adapters (prometheus, notify,
//! kube, ssh, etcd) implement them; the worker, the gate and the steps only see these.

use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::engine::StepOutcome;
use crate::domain::facts::{ClusterFacts, EtcdAlarm, Minor, NodeFacts, StaticPod};
use crate::domain::gate::PromReading;
use crate::domain::pods::{BudgetFacts, PodFacts};
use crate::domain::run::{Run, RunKind, RunStatus, Step};
use crate::domain::run_request::{RunDoor, RunRequest};
use crate::domain::version::Version;

/// Carries out one kind of step. A step must be idempotent: after a crash it is executed
/// again from the start.
#[async_trait::async_trait]
pub trait StepExecutor: Send + Sync {
    /// Executes step `index` of `run`.
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome;

    /// Whether it carries out `step` (one that hands steps on may have nobody to hand
    /// some to).
    fn carries_out(&self, _step: &Step) -> bool {
        true
    }
}

/// The executors the worker knows: the gate's, for the gate steps of every run kind, and
/// one per kind of run for the rest (a workflow hands some of its steps on to another
/// executor itself). A step whose executor is not configured, or does not carry it out,
/// parks its run.
#[derive(Clone, Default)]
pub struct Executors {
    /// The gate steps of every run kind.
    pub gate: Option<Arc<dyn StepExecutor>>,
    /// The batch analyses of every run kind (`gate.analysis`).
    pub analysis: Option<Arc<dyn StepExecutor>>,
    /// Every other step, by the kind of run it belongs to.
    pub by_kind: HashMap<RunKind, Arc<dyn StepExecutor>>,
}

impl Executors {
    /// The same executors, with `executor` for the steps of runs of `kind`.
    pub fn with(mut self, kind: RunKind, executor: Arc<dyn StepExecutor>) -> Self {
        self.by_kind.insert(kind, executor);
        self
    }

    /// The executor for `step`, if one is configured and carries it out.
    pub fn get(&self, step: &Step) -> Option<Arc<dyn StepExecutor>> {
        let executor = if step.kind.is_gate() {
            self.gate.as_ref()
        } else if step.kind.is_analysis() {
            self.analysis.as_ref()
        } else {
            self.by_kind.get(&step.kind.run_kind())
        };
        executor.filter(|e| e.carries_out(step)).cloned()
    }
}

/// Answers PromQL instant queries.
#[async_trait::async_trait]
pub trait MetricsSource: Send + Sync {
    /// The series `promql` returns now, or why there is no usable answer.
    async fn query(&self, promql: &str) -> PromReading;
    /// The names of the alerting rule groups it has loaded, or why they cannot be read.
    async fn rule_groups(&self) -> Result<Vec<String>, String>;
    /// The series `promql` returns from `start` to `end`, a point every `step`, or why
    /// there is no usable answer (an error, a partial answer, not a range vector).
    async fn query_range(
        &self,
        promql: &str,
        start: chrono::DateTime<chrono::Utc>,
        end: chrono::DateTime<chrono::Utc>,
        step: std::time::Duration,
    ) -> Result<Vec<crate::domain::analysis::RangeSeries>, String>;
}

/// Alertmanager's own view of the alerts, pulled at every gate evaluation.
#[async_trait::async_trait]
pub trait AlertSource: Send + Sync {
    /// The alerts active now, neither silenced nor inhibited, that meet the board's
    /// matchers; or why they cannot be read.
    async fn active(&self) -> Result<Vec<crate::domain::alert::Alert>, String>;
    /// Whether it holds an active alert called `alertname`, silenced or not (the watchdog:
    /// proof that Prometheus' alerts reach it); or why it cannot be asked.
    async fn lists(&self, alertname: &str) -> Result<bool, String>;
    /// What it reads, for `GET /v1/gates` (never a credential).
    fn describe(&self) -> String;
}

/// Alertmanager silences rollgate keeps for the node in hand.
#[async_trait::async_trait]
pub trait Silences: Send + Sync {
    /// Keeps the silence `plan` until `until`: creates it, or moves the end of the one
    /// rollgate made before (found by its comment); its id.
    async fn keep(
        &self,
        plan: &crate::domain::self_silence::SilencePlan,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<String, String>;
}

/// One transition of one run, as people are told about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The run's id.
    pub run_id: String,
    /// Its kind, e.g. `k8s-upgrade`.
    pub kind: String,
    /// Its target version, if any.
    pub target: Option<String>,
    /// Status before (`None` when the run was created).
    pub from: Option<RunStatus>,
    /// The status it moved to.
    pub to: RunStatus,
    /// The step in hand, with its node.
    pub step: Option<String>,
    /// Why, in words an operator can act on; kept in the history.
    pub reason: String,
    /// What holds the run, if a gate does.
    pub blockers: Vec<String>,
    /// When it happened (UTC).
    pub at: DateTime<Utc>,
}

/// Tells people about transitions. Never fails and never blocks the caller: a sink counts
/// and logs its own failures.
pub trait Notifier: Send + Sync {
    /// Sends `notice` in the background.
    fn notify(&self, notice: Notice);
}

/// What a Kubernetes Event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Regarding {
    /// A node, for `kubectl describe node`.
    Node(String),
    /// A namespace (the upgrade's in-flight namespace), for run-level transitions.
    Namespace(String),
}

/// One Kubernetes Event (events.k8s.io/v1) rollgate reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterEvent {
    /// The object it is about.
    pub regarding: Regarding,
    /// Why, in UpperCamelCase, e.g. `Cordoned`.
    pub reason: String,
    /// What rollgate did or was doing, e.g. `Drain`.
    pub action: String,
    /// In words, at most 1 kB.
    pub note: String,
    /// `Warning` rather than `Normal`.
    pub warning: bool,
}

/// Writes Kubernetes Events. A failure is reported to the caller, who logs it: an Event
/// never fails a step.
#[async_trait::async_trait]
pub trait EventRecorder: Send + Sync {
    /// Creates `event`.
    async fn record(&self, event: &ClusterEvent) -> Result<(), ClusterError>;
}

/// What became of one delivery of a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The sink took it.
    Sent,
    /// The sink refused it for good (e.g. 400): trying again would not help; go on.
    Refused,
    /// The sink cannot take it now (down, 5xx, 429): try the same one again later.
    Later,
}

/// A sink told of every transition from the store's log, in order, at least once (Slack).
#[async_trait::async_trait]
pub trait TransitionSink: Send + Sync {
    /// The sink's name, where its progress is kept.
    fn name(&self) -> &'static str;
    /// Delivers `notice`, with the sink's own retries.
    async fn deliver(&self, notice: &Notice) -> Delivery;
}

/// Reads what the planner and the checks need from the cluster.
#[async_trait::async_trait]
pub trait ClusterRead: Send + Sync {
    /// Every node with its role, versions and readiness.
    async fn facts(&self) -> Result<ClusterFacts, ClusterError>;
    /// One node as [`ClusterRead::facts`] reads it, `None` when it is not in the cluster:
    /// a read of that node alone, so that a batch's steps do not each list every node.
    async fn node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError>;
    /// Pods that should run (not Succeeded or Failed): `(ready, total)`.
    async fn pod_readiness(&self) -> Result<(usize, usize), ClusterError>;
    /// The API server's version (`GET /version`).
    async fn api_server_version(&self) -> Result<Version, ClusterError>;
    /// The control-plane static pods (mirror pods with a `component` label) on `node`.
    async fn static_pods(&self, node: &str) -> Result<Vec<StaticPod>, ClusterError>;
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
    /// Who holds `node`'s cordon now, as `owner` sees it; changes nothing.
    async fn cordon_holder(&self, node: &str, owner: &str) -> Result<Cordon, ClusterError>;
    /// The pods on `node` and every PodDisruptionBudget, for what may hold its drain.
    async fn drain_facts(&self, node: &str) -> Result<DrainFacts, ClusterError>;
}

/// How a node boots, as the reboot steps read and mark it.
#[async_trait::async_trait]
pub trait NodeBoots: Send + Sync {
    /// The node's boot now: its boot id, Ready, and the reboot rollgate marked on it.
    async fn boot(&self, node: &str) -> Result<NodeBoot, ClusterError>;
    /// Marks on `node` the reboot about to be asked (the `reboot` annotation), before the
    /// command is sent: a step redone after a crash finds it and does not reboot twice.
    async fn mark_reboot(&self, node: &str, mark: &RebootMark) -> Result<(), ClusterError>;
    /// Sets (`Some`) or removes (`None`) labels on `node`.
    async fn label(
        &self,
        node: &str,
        labels: &[(String, Option<String>)],
    ) -> Result<(), ClusterError>;
}

/// A node's boot as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBoot {
    /// `status.nodeInfo.bootID`: changes with every boot.
    pub boot_id: String,
    /// Its Ready condition is True.
    pub ready: bool,
    /// The reboot rollgate marked on it last, if any.
    pub mark: Option<RebootMark>,
}

/// The reboot rollgate asked of a node: kept on the node as an annotation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebootMark {
    /// The run that asked.
    pub run_id: String,
    /// The boot id before the reboot.
    pub boot_id: String,
    /// When the command was about to be sent.
    pub at: chrono::DateTime<chrono::Utc>,
}

/// What the holds before a drain are decided from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainFacts {
    /// The pods on the node.
    pub pods: Vec<PodFacts>,
    /// Every PodDisruptionBudget of the cluster.
    pub budgets: Vec<BudgetFacts>,
}

/// Keeps the in-flight annotations on the upgrade namespace.
#[async_trait::async_trait]
pub trait InFlightMarks: Send + Sync {
    /// Sets (`Some`) or clears (`None`) the marks.
    async fn set_in_flight(&self, marks: Option<&InFlight>) -> Result<(), ClusterError>;
}

/// A lock another tool keeps on the cluster (kured's reboot lock), which rollgate honours
/// before it takes the cluster and holds while it has it.
#[async_trait::async_trait]
pub trait ForeignLock: Send + Sync {
    /// Takes the lock for rollgate: `None` once rollgate holds it (or there is no such
    /// tool here), or who holds it instead, in words.
    async fn take(&self) -> Result<Option<String>, ClusterError>;
    /// Lets go of rollgate's part of the lock, if it holds one.
    async fn release(&self) -> Result<(), ClusterError>;
}

/// The in-flight marks of a run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InFlight {
    /// The run's id.
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
    /// rollgate's own pod, when it runs in the cluster it drains: a drain evicts it after
    /// every other pod of its node is gone, so that rollgate is rescheduled last.
    pub own_pod: Option<PodRef>,
}

/// A pod by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
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
#[derive(Debug, Clone, thiserror::Error)]
pub enum DrainError {
    /// PodDisruptionBudgets still refused evictions at the timeout.
    #[error("drain of {node} timed out after {secs}s; still blocked: {blocked}")]
    Blocked {
        node: String,
        secs: u64,
        /// Each pod and what blocks it.
        blocked: String,
    },
    /// Pods evicted but not gone at the timeout.
    #[error("drain of {node} timed out after {secs}s; pods still terminating: {pods}")]
    Terminating {
        node: String,
        secs: u64,
        pods: String,
    },
    /// The API failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The error beneath a port error, kept so that logs and run reasons can show the whole
/// chain (see [`crate::error_chain`]).
pub type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// `error` as a [`Cause`].
pub fn cause(error: impl std::error::Error + Send + Sync + 'static) -> Cause {
    Arc::new(error)
}

/// A failure of another system: what was being done, and the error beneath it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}")]
pub struct Failure {
    /// What failed, e.g. `pushgateway http://pg:9091/metrics/job/x: HTTP 400: …`.
    pub what: String,
    /// The client's own error, when there is one.
    #[source]
    pub source: Option<Cause>,
}

impl Failure {
    /// A failure with no error beneath (a refusal, a bad answer).
    pub fn new(what: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            source: None,
        }
    }

    /// A failure caused by `source`.
    pub fn caused(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            what: what.into(),
            source: Some(cause(source)),
        }
    }
}

/// A Kubernetes API failure: what was being done, in words an operator can act on, and
/// the client's error beneath it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("Kubernetes API server: {0}")]
pub struct ClusterError(#[source] pub Failure);

impl ClusterError {
    /// A failure with no error beneath (a refusal, a bad answer).
    pub fn new(what: impl Into<String>) -> Self {
        Self(Failure::new(what))
    }

    /// A failure caused by `source`.
    pub fn caused(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self(Failure::caused(what, source))
    }
}

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

    /// Stops reusing `node`'s connection: it is going down (a reboot was sent), so its
    /// next command connects afresh.
    fn forget(&self, _node: &str) {}
}

/// Where a node is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTarget {
    /// The node's name.
    pub name: String,
    /// Its InternalIP, used unless the configuration names a host for it.
    pub address: Option<String>,
}

impl From<&NodeFacts> for NodeTarget {
    fn from(node: &NodeFacts) -> Self {
        Self {
            name: node.name.clone(),
            address: node.address.clone(),
        }
    }
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
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecError {
    /// The node's host key does not match known_hosts: nothing was run.
    #[error(
        "ssh to {node}: host key verification failed (the key differs from known_hosts, or is missing); nothing was run"
    )]
    HostKey { node: String },
    /// No connection.
    #[error("ssh to {node}: cannot connect: {failure}")]
    Connect {
        node: String,
        #[source]
        failure: Failure,
    },
    /// The command ran past its timeout and was ended.
    #[error("ssh to {node}: command ended after its {secs}s timeout")]
    Timeout { node: String, secs: u64 },
    /// Anything else.
    #[error("ssh to {node}: {failure}")]
    Other {
        node: String,
        #[source]
        failure: Failure,
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
    /// The snapshot file, as written (the temp file already renamed).
    pub path: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// sha256 of the whole file, hex.
    pub sha256: String,
}

/// Why no snapshot.
#[derive(Debug, Clone, thiserror::Error)]
#[error("etcd snapshot: {0}")]
pub struct SnapshotError(#[source] pub Failure);

/// The members of one etcd cluster, as a roll reads and moves them.
#[async_trait::async_trait]
pub trait EtcdMembers: Send + Sync {
    /// The client URLs asked, one per member.
    fn endpoints(&self) -> &[String];
    /// The member list, as the first member that answers gives it.
    async fn members(&self) -> Result<Vec<MemberInfo>, EtcdError>;
    /// The status of every member that answers, each asked at its own endpoint.
    async fn answering(&self) -> Vec<MemberStatus>;
    /// Moves leadership to member `to` (asking the leader itself), then waits until a
    /// majority follows `to`, at most `confirm_within`.
    async fn move_leader(&self, to: u64, confirm_within: Duration) -> Result<(), EtcdError>;
    /// The alarms raised on any member.
    async fn alarms(&self) -> Result<Vec<EtcdAlarm>, EtcdError>;
}

/// Runs an operator's command for one etcd member (the `command` driver of a foreground
/// roll). The caller validates `name` and `endpoint` before they reach a shell.
#[async_trait::async_trait]
pub trait MemberCommand: Send + Sync {
    /// Runs `template` with `{name}` / `{endpoint}` replaced and `ROLLGATE_MEMBER` /
    /// `ROLLGATE_ENDPOINT` set; `true` when it exits 0.
    async fn run(&self, template: &str, name: &str, endpoint: &str) -> Result<bool, Failure>;
}

/// Opens clients of the etcd clusters that queued rolls name.
pub trait EtcdConnect: Send + Sync {
    /// A client of the cluster whose members answer at `endpoints`; connects lazily.
    fn connect(&self, endpoints: &[String]) -> Result<Arc<dyn EtcdMembers>, EtcdError>;
}

/// What one member says about itself and the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// The endpoint asked.
    pub endpoint: String,
    /// The member's id.
    pub id: u64,
    /// The leader it follows (0: none).
    pub leader: u64,
    /// Its raft term.
    pub raft_term: u64,
    /// Its raft index.
    pub raft_index: u64,
    /// Its etcd version.
    pub version: String,
}

/// A member as the cluster lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    pub name: String,
    /// Its client URLs.
    pub client_urls: Vec<String>,
}

/// An etcd failure. Messages name the endpoint, never key material.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// `https://` members, and no TLS configured to reach them.
    #[error("https members need etcd_roll.ca_file (and a client certificate)")]
    TlsMissing,
    /// A TLS file cannot be read.
    #[error("etcd TLS: cannot read {path}: {error}")]
    TlsFile { path: String, error: String },
    /// No answer from a member.
    #[error("etcd member {endpoint}: {error}")]
    Member { endpoint: String, error: String },
    /// No leader agreed by a majority of the members.
    #[error("no leader agreed by a majority of {members} member(s)")]
    NoLeader {
        /// Members asked.
        members: usize,
    },
    /// A leadership transfer was not confirmed by a majority in time.
    #[error("leadership did not move to {to:x} on a majority within {within:?}")]
    NotConfirmed {
        /// The target member id.
        to: u64,
        /// How long the move had to be confirmed.
        within: Duration,
    },
}

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
    /// Watches `namespace/name` from `resource_version` and returns once it changed (or
    /// was deleted), once the server says the watch expired (410 Gone: its history is
    /// compacted), or after `timeout` without a change, whichever comes first; bookmarks
    /// are not changes. The caller reads it again either way.
    async fn wait_for_change(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        timeout: std::time::Duration,
    ) -> Result<(), ClusterError>;
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
    /// `status.currentRevision`: the revision the pods were made from before the update.
    pub current_revision: String,
    /// `metadata.resourceVersion`, where a watch for the next change starts.
    pub resource_version: String,
    /// `spec.serviceName`: the governing Service that names the pods in DNS.
    pub service_name: String,
}

/// A pod as a roll sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// Its `controller-revision-hash` label.
    pub revision: String,
    /// Its Ready condition is True (and it is not terminating).
    pub ready: bool,
}

/// Which of pkgs.k8s.io's two layouts a repository is read in: the one the control plane's
/// package manager reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoFormat {
    /// apt's: `/v1.NN/deb/Release` and `Packages`.
    Deb,
    /// dnf's and zypper's: `/v1.NN/rpm/repodata/repomd.xml` and the primary metadata it
    /// names.
    Rpm,
}

/// The Kubernetes package repository `rollgate detect` reads.
#[async_trait::async_trait]
pub trait PackageRepository: Send + Sync {
    /// Whether `minor`'s repository is published in `format` (its `Release` file, or its
    /// `repodata/repomd.xml`, exists).
    async fn published(&self, minor: Minor, format: RepoFormat) -> Result<bool, RepoError>;
    /// The kubeadm releases `minor`'s repository holds, read from its own metadata.
    async fn releases(&self, minor: Minor, format: RepoFormat) -> Result<Vec<Version>, RepoError>;
}

/// One release channel as a k3s or RKE2 channel server lists it (`stable`, `v1.34`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    /// Its name.
    pub name: String,
    /// The release it names as its latest, as the server wrote it (validated by the
    /// reader).
    pub latest: String,
}

/// The release channels of k3s or RKE2 that `rollgate detect` reads: the channel server
/// (`https://update.k3s.io/v1-release/channels`).
#[async_trait::async_trait]
pub trait ReleaseChannels: Send + Sync {
    /// Every channel the server lists.
    async fn channels(&self) -> Result<Vec<Channel>, RepoError>;
}

/// The package repository, or the channel server, could not be read.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what} {url}: {failure}")]
pub struct RepoError {
    /// What it is: `package repository`, `channel server`.
    pub what: &'static str,
    /// What was asked.
    pub url: String,
    /// What went wrong.
    #[source]
    pub failure: Failure,
}

/// What came of asking for the upgrade.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Submitted {
    /// A new run.
    Created {
        /// Its id.
        run_id: String,
    },
    /// A run for this target was in flight already.
    InFlight {
        /// Its id.
        run_id: String,
    },
    /// Another upgrade holds the cluster; next week's detection asks again.
    Held {
        /// rollgate's words.
        message: String,
    },
    /// Published on the AMQP exchange (publisher-confirmed).
    Published {
        /// The CloudEvent id.
        event_id: String,
    },
}

/// Asks rollgate for a run (an upgrade, reboots) through a workflow's door.
#[async_trait::async_trait]
pub trait Submitter: Send + Sync {
    /// Hands `request` over through `door`.
    async fn submit(
        &self,
        door: &'static RunDoor,
        request: Arc<dyn RunRequest>,
    ) -> Result<Submitted, Failure>;
}

/// Where detection metrics are pushed.
#[async_trait::async_trait]
pub trait MetricsPush: Send + Sync {
    /// Replaces the metrics of the job's group `group` (label pairs after the job; none:
    /// the job's own group) with `text` (Prometheus exposition format).
    async fn push(&self, group: &[(&str, &str)], text: String) -> Result<(), Failure>;
}

/// Another rollgate's API, asked for its view of the fleet (`GET /v1/fleet`): how a fleet
/// wave learns where its upstream clusters stand.
#[async_trait::async_trait]
pub trait FleetPeer: Send + Sync {
    /// The peer's answer as JSON, or why there is none (unreachable, a non-2xx status, not
    /// JSON).
    async fn fleet_view(&self) -> Result<serde_json::Value, String>;
}
