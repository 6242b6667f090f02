//! The Kubernetes API through kube-rs: node facts, cordon with an owner mark, drain through
//! the Eviction API, pod readiness, and the in-flight annotations.
//!
//! Every verb used here is listed in [`API_USE`], which the RBAC manifests are checked
//! against.

use crate::domain::distribution::Distribution;
use futures_util::future::join_all;
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::domain::backoff::Backoff;
use crate::domain::facts::StaticPod;
use crate::domain::facts::{ClusterFacts, NodeFacts, Role};
use crate::domain::pods::{BudgetFacts, PodFacts, eviction_may_go};
use crate::domain::version::Version;
use crate::ports::{
    ClusterError, ClusterEvent, ClusterRead, Cordon, DrainError, DrainFacts, DrainOptions,
    DrainReport, EventRecorder, ForeignLock, InFlight, InFlightMarks, NodeBoot, NodeBoots,
    NodeDrain, PodRef, PodState, RebootMark, Regarding, StatefulSetState, StatefulSets,
};

/// Every (API group, resource, verb) this adapter uses.
pub const API_USE: &[(&str, &str, &str)] = &[
    ("", "nodes", "list"),
    ("", "nodes", "get"),
    ("", "nodes", "patch"),
    ("", "pods", "list"),
    ("", "pods/eviction", "create"),
    ("", "pods", "get"),
    ("apps", "statefulsets", "get"),
    ("apps", "statefulsets", "patch"),
    ("apps", "statefulsets", "watch"),
    ("", "namespaces", "patch"),
    ("apps", "daemonsets", "get"),
    ("apps", "daemonsets", "patch"),
    ("policy", "poddisruptionbudgets", "list"),
    ("policy", "poddisruptionbudgets", "get"),
    ("events.k8s.io", "events", "create"),
];

/// The label that marks control-plane nodes.
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// How often a drain looks whether evicted pods are gone.
const GONE_POLL: Duration = Duration::from_millis(250);
/// How many times a patch is retried after a resourceVersion conflict.
const CONFLICT_RETRIES: usize = 5;

/// Where the client comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A kubeconfig file, with an optional context.
    Kubeconfig {
        path: PathBuf,
        /// The context; the file's current one when `None`.
        context: Option<String>,
    },
    /// The pod's service account.
    InCluster,
}

/// How rollgate uses the cluster.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// Where the client comes from.
    pub source: Source,
    /// The namespace that carries the in-flight annotations.
    pub namespace: String,
    /// Prefix of rollgate's annotations, e.g. `rollgate.io`.
    pub annotation_prefix: String,
    /// Bound on every API request.
    pub request_timeout: Duration,
}

/// The cluster.
#[derive(Clone)]
pub struct Kube {
    client: Client,
    settings: KubeSettings,
    /// Per PodDisruptionBudget, held across each check and eviction under it by every
    /// drain of this process (a batch drains several nodes at once), with the
    /// resourceVersion read before the last eviction under it.
    budget_holds: Arc<std::sync::Mutex<BudgetHolds>>,
}

/// The hold of each budget: (namespace, name) → the resourceVersion before rollgate's last
/// eviction under it.
type BudgetHolds =
    std::collections::HashMap<(String, String), Arc<tokio::sync::Mutex<Option<String>>>>;

fn api_error(what: &str, e: kube::Error) -> ClusterError {
    match e {
        // The API's own answer says it all: status, reason, message.
        kube::Error::Api(status) => ClusterError::new(format!(
            "{what}: {} {} ({})",
            status.code, status.reason, status.message
        )),
        other => ClusterError::caused(what, other),
    }
}

fn status_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// `v1.34.5` (or `1.34.5+k3s1`, `containerd://1.7.24`) as a version.
fn reported_version(raw: &str) -> Option<Version> {
    let raw = raw.rsplit("://").next().unwrap_or(raw);
    let raw = raw.strip_prefix('v').unwrap_or(raw);
    let core = raw.split(['+', '-']).next().unwrap_or(raw);
    Version::parse(core).ok()
}

fn node_facts(node: &Node) -> Result<NodeFacts, ClusterError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let status = node.status.clone().unwrap_or_default();
    let info = status.node_info.unwrap_or_default();
    let kubelet = reported_version(&info.kubelet_version).ok_or_else(|| {
        ClusterError::new(format!(
            "node {name} reports kubelet version {:?}, not MAJOR.MINOR.PATCH",
            info.kubelet_version
        ))
    })?;
    let containerd = info
        .container_runtime_version
        .starts_with("containerd://")
        .then(|| reported_version(&info.container_runtime_version))
        .flatten();
    let ready = status
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let address = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address);
    Ok(NodeFacts {
        role: if labels.contains_key(CONTROL_PLANE_LABEL) {
            Role::ControlPlane
        } else {
            Role::Worker
        },
        name,
        kubelet,
        distribution: Distribution::of_reported(&info.kubelet_version),
        package_manager: labels
            .get(crate::domain::facts::PACKAGE_MANAGER_LABEL)
            .cloned(),
        containerd,
        ready,
        address,
    })
}

/// Whether the pod's Ready condition is True.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `node` is cordoned, and the owner its `mark` annotation names.
fn cordon_state(node: &Node, mark: &str) -> (bool, Option<String>) {
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let by = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(mark))
        .cloned();
    (cordoned, by)
}

/// A budget as the drain holds read it: its selector as requirements, its status.
fn budget_facts(pdb: PodDisruptionBudget) -> BudgetFacts {
    use crate::domain::pods::{Operator, Requirement, Selector};
    let selector = pdb
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    let mut requirements: Vec<Requirement> = selector
        .match_labels
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| Requirement {
            key,
            operator: Operator::In,
            values: vec![value],
        })
        .collect();
    for e in selector.match_expressions.unwrap_or_default() {
        let operator = match e.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            // The API admits no operator but these four.
            _ => Operator::DoesNotExist,
        };
        requirements.push(Requirement {
            key: e.key,
            operator,
            values: e.values.unwrap_or_default(),
        });
    }
    let status = pdb.status.unwrap_or_default();
    BudgetFacts {
        namespace: pdb.metadata.namespace.unwrap_or_default(),
        name: pdb.metadata.name.unwrap_or_default(),
        selector: Selector { requirements },
        disruptions_allowed: status.disruptions_allowed,
        current_healthy: status.current_healthy,
        expected_pods: status.expected_pods,
        desired_healthy: status.desired_healthy,
        generation: pdb.metadata.generation.unwrap_or_default(),
        observed_generation: status.observed_generation.unwrap_or_default(),
        resource_version: pdb.metadata.resource_version.unwrap_or_default(),
    }
}

/// Why a pod stays on the node during a drain, if it does.
fn stays(pod: &Pod) -> Option<&'static str> {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    if mirror {
        return Some("mirror pod");
    }
    let daemon = pod
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| o.iter().any(|r| r.kind == "DaemonSet"));
    daemon.then_some("DaemonSet pod")
}

/// Whether `pod` is `own` (rollgate's own pod).
fn is_own(pod: &Pod, own: Option<&PodRef>) -> bool {
    own.is_some_and(|own| {
        pod.metadata.namespace.as_deref() == Some(own.namespace.as_str())
            && pod.metadata.name.as_deref() == Some(own.name.as_str())
    })
}

/// A mirror pod of a control-plane component, as the health checks read it.
fn static_pod(node: &str, pod: &Pod) -> Option<StaticPod> {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let component = pod.metadata.labels.as_ref()?.get("component")?;
    if !mirror {
        return None;
    }
    let image = pod
        .spec
        .as_ref()?
        .containers
        .first()?
        .image
        .clone()
        .unwrap_or_default();
    let tag = image.rsplit_once(':').map_or("", |(_, tag)| tag);
    Some(StaticPod {
        node: node.to_owned(),
        component: component.clone(),
        ready: pod_ready(pod),
        version: reported_version(tag),
    })
}

fn pod_key(pod: &Pod) -> (String, String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
        pod.metadata.uid.clone().unwrap_or_default(),
    )
}

/// How long to wait before asking for an eviction again: the drain's pace through the one
/// jittered policy (evictions of one drain run side by side and must not retry in step),
/// never sooner than the server asked (`Retry-After`, which the API server also sends as
/// `details.retryAfterSeconds`).
fn eviction_pause(e: &kube::Error, every: Duration) -> Duration {
    let asked = match e {
        kube::Error::Api(status) => status.details.as_ref().map_or(0, |d| d.retry_after_seconds),
        _ => 0,
    };
    retry_pause(every).max(Duration::from_secs(asked.into()))
}

/// A pause of between half of `every` and all of it, jittered.
fn retry_pause(every: Duration) -> Duration {
    crate::jitter::pause(&Backoff::new(every, every), 1)
}

/// The PodDisruptionBudget named by a 429's causes or message, if any.
fn blocking_budget(status: &kube::core::Status) -> String {
    let from_causes = status.details.as_ref().and_then(|d| {
        d.causes
            .iter()
            .find(|c| c.reason == "DisruptionBudget")
            .map(|c| c.message.clone())
    });
    from_causes.unwrap_or_else(|| status.message.clone())
}

/// How many objects one list request asks for: kubectl's own chunk size. A large cluster
/// is read a page at a time, and only what each caller keeps stays in memory.
const PAGE: u32 = 500;

/// How often a list starts again after the API server expired its continue token (410).
const LIST_RESTARTS: usize = 3;

/// Lists `api` with `params` a page at a time, folding each object into the accumulator
/// `init` makes. A continue token the server has compacted away (410 Gone) starts the list
/// again from a fresh accumulator, as the API server advises.
async fn fold_pages<K, A>(
    api: &Api<K>,
    params: &ListParams,
    what: &str,
    init: impl Fn() -> A,
    mut step: impl FnMut(&mut A, K) -> Result<(), ClusterError>,
) -> Result<A, ClusterError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut restarts = 0;
    'list: loop {
        let mut acc = init();
        let mut token: Option<String> = None;
        loop {
            let mut page = params.clone().limit(PAGE);
            if let Some(t) = &token {
                page = page.continue_token(t);
            }
            let list = match api.list(&page).await {
                Ok(list) => list,
                Err(e) if status_code(&e) == Some(410) && restarts < LIST_RESTARTS => {
                    restarts += 1;
                    info!(
                        what,
                        restarts, "list expired between pages (410 Gone): listing again"
                    );
                    continue 'list;
                }
                Err(e) => return Err(api_error(what, e)),
            };
            for item in list.items {
                step(&mut acc, item)?;
            }
            match list.metadata.continue_.filter(|t| !t.is_empty()) {
                Some(next) => token = Some(next),
                None => return Ok(acc),
            }
        }
    }
}

impl Kube {
    /// Builds the client; nothing is asked of the API server yet.
    pub async fn new(settings: KubeSettings) -> Result<Self, ClusterError> {
        let mut config = match &settings.source {
            Source::Kubeconfig { path, context } => {
                let file = Kubeconfig::read_from(path).map_err(|e| {
                    ClusterError::caused(format!("cannot read kubeconfig {}", path.display()), e)
                })?;
                let options = KubeConfigOptions {
                    context: context.clone(),
                    ..KubeConfigOptions::default()
                };
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|e| {
                        ClusterError::caused(format!("kubeconfig {}", path.display()), e)
                    })?
            }
            Source::InCluster => Config::incluster()
                .map_err(|e| ClusterError::caused("in-cluster configuration", e))?,
        };
        // kube retries 429s itself by default; a PDB refusal must reach the drain, which
        // paces its own retries and knows its deadline.
        config.default_retry = false;
        config.connect_timeout = Some(settings.request_timeout);
        config.read_timeout = Some(settings.request_timeout);
        config.write_timeout = Some(settings.request_timeout);
        let client = Client::try_from(config)
            .map_err(|e| ClusterError::caused("cannot build the client", e))?;
        Ok(Self {
            client,
            settings,
            budget_holds: Arc::default(),
        })
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn cordon_mark(&self) -> String {
        format!("{}/cordoned-by", self.settings.annotation_prefix)
    }

    /// The annotation that records the reboot rollgate asked of a node.
    fn reboot_mark(&self) -> String {
        format!("{}/reboot", self.settings.annotation_prefix)
    }

    /// Merge-patches `node` with `patch` at the resourceVersion `decide` saw; re-reads and
    /// decides again after a 409.
    async fn patch_node_checked(
        &self,
        name: &str,
        decide: impl Fn(&Node) -> Result<Option<Value>, Cordon>,
    ) -> Result<Cordon, ClusterError> {
        let nodes = self.nodes();
        for _ in 0..CONFLICT_RETRIES {
            let node = nodes
                .get(name)
                .await
                .map_err(|e| api_error(&format!("get node {name}"), e))?;
            let mut patch = match decide(&node) {
                Err(state) => return Ok(state),
                Ok(None) => return Ok(Cordon::None),
                Ok(Some(patch)) => patch,
            };
            patch["metadata"]["resourceVersion"] = json!(node.metadata.resource_version);
            match nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(Cordon::Ours),
                Err(e) if status_code(&e) == Some(409) => continue,
                Err(e) => return Err(api_error(&format!("patch node {name}"), e)),
            }
        }
        Err(ClusterError::new(format!(
            "patch node {name}: still conflicting after {CONFLICT_RETRIES} tries"
        )))
    }

    async fn pods_on(&self, node: &str) -> Result<Vec<Pod>, ClusterError> {
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        fold_pages(
            &Api::<Pod>::all(self.client.clone()),
            &params,
            &format!("list pods on {node}"),
            Vec::new,
            |pods, pod| {
                pods.push(pod);
                Ok(())
            },
        )
        .await
    }

    /// Evicts one pod, retrying while a PodDisruptionBudget refuses, until `deadline`.
    /// `Err` carries what blocked it.
    async fn evict(
        &self,
        pod: &Pod,
        options: &DrainOptions,
        deadline: Instant,
        refusals: &std::sync::atomic::AtomicUsize,
    ) -> Result<(), String> {
        let (ns, name, _) = pod_key(pod);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                grace_period_seconds: options.grace_period,
                ..DeleteParams::default()
            }),
            ..EvictParams::default()
        };
        loop {
            let e = match api.evict(&name, &params).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(e) => e,
            };
            let pause = eviction_pause(&e, options.retry_every);
            let why = match &e {
                kube::Error::Api(status) if status.code == 429 || status.code == 500 => {
                    // 429: a PDB refuses now (or the server sheds load); 500: several PDBs
                    // match the pod. Both may clear (pods elsewhere become Ready, or
                    // someone fixes the budgets).
                    refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    blocking_budget(status)
                }
                other => {
                    warn!(pod = %name, error = %crate::error_chain(other), "eviction failed; retrying");
                    other.to_string()
                }
            };
            if Instant::now() + pause > deadline {
                return Err(format!("{ns}/{name}: {why}"));
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Evicts `pods` of `node` and waits until they are gone, by `deadline`. In parallel,
    /// as kubectl drain does: one pod blocked by its budget does not hold the others. The
    /// pods a PodDisruptionBudget covers go one at a time, each once rollgate's own read of
    /// the budget lets it ([`eviction_may_go`]): the budget is kept even by a server that
    /// would admit the eviction.
    async fn evict_all(
        &self,
        node: &str,
        pods: &[&Pod],
        options: &DrainOptions,
        deadline: Instant,
        refusals: &std::sync::atomic::AtomicUsize,
    ) -> Result<(), DrainError> {
        let budgets = self.budgets().await?;
        let mut free = Vec::new();
        let mut under: BTreeMap<(String, String), Vec<&Pod>> = BTreeMap::new();
        for pod in pods {
            let (ns, _, _) = pod_key(pod);
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            match budgets
                .iter()
                .find(|b| b.namespace == ns && b.selector.matches(&labels))
            {
                Some(b) => under
                    .entry((b.namespace.clone(), b.name.clone()))
                    .or_default()
                    .push(pod),
                None => free.push(*pod),
            }
        }
        let (free, budgeted) = futures_util::future::join(
            join_all(
                free.iter()
                    .map(|pod| self.evict(pod, options, deadline, refusals)),
            ),
            join_all(under.iter().map(|((ns, name), pods)| {
                self.evict_under_budget(ns, name, pods, options, deadline, refusals)
            })),
        )
        .await;
        let results = free.into_iter().chain(budgeted);
        let blocked: Vec<String> = results.into_iter().filter_map(Result::err).collect();
        if !blocked.is_empty() {
            return Err(DrainError::Blocked {
                node: node.to_owned(),
                secs: options.timeout.as_secs(),
                blocked: blocked.join("; "),
            });
        }
        let keys: Vec<_> = pods.iter().map(|p| pod_key(p)).collect();
        let left = self.wait_gone(node, &keys, deadline).await?;
        if !left.is_empty() {
            return Err(DrainError::Terminating {
                node: node.to_owned(),
                secs: options.timeout.as_secs(),
                pods: left.join(", "),
            });
        }
        Ok(())
    }

    /// Every PodDisruptionBudget of the cluster, as its status says now.
    async fn budgets(&self) -> Result<Vec<BudgetFacts>, ClusterError> {
        fold_pages(
            &Api::<PodDisruptionBudget>::all(self.client.clone()),
            &ListParams::default(),
            "list poddisruptionbudgets",
            Vec::new,
            |budgets, pdb| {
                budgets.push(budget_facts(pdb));
                Ok(())
            },
        )
        .await
    }

    /// Evicts `pods`, all covered by budget `namespace/name`, one at a time: each once a
    /// fresh read of the budget lets it go, by `deadline`.
    async fn evict_under_budget(
        &self,
        namespace: &str,
        name: &str,
        pods: &[&Pod],
        options: &DrainOptions,
        deadline: Instant,
        refusals: &std::sync::atomic::AtomicUsize,
    ) -> Result<(), String> {
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        let hold = self
            .budget_holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((namespace.to_owned(), name.to_owned()))
            .or_default()
            .clone();
        for pod in pods {
            // Another drain's check and eviction under this budget go first, whole.
            let mut evicted_at = hold.lock().await;
            loop {
                let why = match api.get(name).await {
                    Ok(pdb) => {
                        let budget = budget_facts(pdb);
                        match eviction_may_go(&budget, pod_ready(pod), evicted_at.as_deref()) {
                            Ok(()) => {
                                *evicted_at = Some(budget.resource_version);
                                break;
                            }
                            Err(why) => why,
                        }
                    }
                    // The budget is gone: nothing left to keep.
                    Err(e) if status_code(&e) == Some(404) => {
                        *evicted_at = None;
                        break;
                    }
                    Err(e) => api_error(&format!("get poddisruptionbudget {namespace}/{name}"), e)
                        .to_string(),
                };
                refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (ns, pod_name, _) = pod_key(pod);
                let pause = retry_pause(options.retry_every);
                if Instant::now() + pause > deadline {
                    return Err(format!("{ns}/{pod_name}: {why}"));
                }
                // Others' drains may go meanwhile; their evictions move the status on.
                drop(evicted_at);
                tokio::time::sleep(pause).await;
                evicted_at = hold.lock().await;
            }
            self.evict(pod, options, deadline, refusals).await?;
        }
        Ok(())
    }

    /// Waits until none of `pods` (by uid) is left on `node`, or `deadline`; one list call
    /// per round, however many pods. Returns those left.
    async fn wait_gone(
        &self,
        node: &str,
        pods: &[(String, String, String)],
        deadline: Instant,
    ) -> Result<Vec<String>, ClusterError> {
        loop {
            let present: std::collections::HashSet<String> = self
                .pods_on(node)
                .await?
                .iter()
                .filter_map(|p| p.metadata.uid.clone())
                .collect();
            let left: Vec<String> = pods
                .iter()
                .filter(|(_, _, uid)| present.contains(uid))
                .map(|(ns, name, _)| format!("{ns}/{name}"))
                .collect();
            if left.is_empty() || Instant::now() >= deadline {
                return Ok(left);
            }
            tokio::time::sleep(GONE_POLL).await;
        }
    }
}

#[async_trait::async_trait]
impl ClusterRead for Kube {
    async fn facts(&self) -> Result<ClusterFacts, ClusterError> {
        let nodes = fold_pages(
            &self.nodes(),
            &ListParams::default(),
            "list nodes",
            Vec::new,
            |nodes, node| {
                nodes.push(node_facts(&node)?);
                Ok(())
            },
        )
        .await?;
        Ok(ClusterFacts { nodes })
    }

    async fn node(&self, name: &str) -> Result<Option<NodeFacts>, ClusterError> {
        let nodes = self.nodes();
        let read = match nodes.get_opt(name).await {
            // No answer from the server (a pooled connection it had just closed): a GET
            // is safe to send again, at once, once.
            Err(e) if status_code(&e).is_none() => nodes.get_opt(name).await,
            read => read,
        };
        read.map_err(|e| api_error(&format!("get node {name}"), e))?
            .map(|node| node_facts(&node))
            .transpose()
    }

    async fn pod_readiness(&self) -> Result<(usize, usize), ClusterError> {
        // Only the two counts are kept: a cluster's pods are read a page at a time.
        fold_pages(
            &Api::<Pod>::all(self.client.clone()),
            &ListParams::default(),
            "list pods",
            || (0, 0),
            |(ready, total), pod| {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                if !matches!(phase, Some("Succeeded" | "Failed")) {
                    *total += 1;
                    if pod_ready(&pod) {
                        *ready += 1;
                    }
                }
                Ok(())
            },
        )
        .await
    }

    async fn static_pods(&self, node: &str) -> Result<Vec<StaticPod>, ClusterError> {
        Ok(self
            .pods_on(node)
            .await?
            .iter()
            .filter_map(|p| static_pod(node, p))
            .collect())
    }

    async fn api_server_version(&self) -> Result<Version, ClusterError> {
        let info = self
            .client
            .apiserver_version()
            .await
            .map_err(|e| api_error("get /version", e))?;
        reported_version(&info.git_version).ok_or_else(|| {
            ClusterError::new(format!(
                "the API server reports version {:?}, not MAJOR.MINOR.PATCH",
                info.git_version
            ))
        })
    }
}

#[async_trait::async_trait]
impl NodeBoots for Kube {
    async fn boot(&self, node: &str) -> Result<NodeBoot, ClusterError> {
        let n = self
            .nodes()
            .get(node)
            .await
            .map_err(|e| api_error(&format!("get node {node}"), e))?;
        let status = n.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let boot_id = status.node_info.map(|i| i.boot_id).unwrap_or_default();
        let mark = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&self.reboot_mark()))
            .and_then(|text| serde_json::from_str(text).ok());
        Ok(NodeBoot {
            boot_id,
            ready,
            mark,
        })
    }

    async fn mark_reboot(&self, node: &str, mark: &RebootMark) -> Result<(), ClusterError> {
        let text = serde_json::to_string(mark).unwrap_or_default();
        let patch = json!({"metadata": {"annotations": {self.reboot_mark(): text}}});
        self.nodes()
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| api_error(&format!("patch node {node}"), e))
    }

    async fn label(
        &self,
        node: &str,
        labels: &[(String, Option<String>)],
    ) -> Result<(), ClusterError> {
        if labels.is_empty() {
            return Ok(());
        }
        let labels: BTreeMap<&str, Value> = labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_ref().map_or(Value::Null, |v| json!(v))))
            .collect();
        let patch = json!({"metadata": {"labels": labels}});
        self.nodes()
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| api_error(&format!("patch node {node}"), e))
    }
}

#[async_trait::async_trait]
impl NodeDrain for Kube {
    async fn cordon(&self, node: &str, owner: &str) -> Result<Cordon, ClusterError> {
        let mark = self.cordon_mark();
        self.patch_node_checked(node, |n| {
            let (cordoned, by) = cordon_state(n, &mark);
            match (cordoned, by) {
                (true, Some(by)) if by == owner => Err(Cordon::Ours),
                (true, _) => Err(Cordon::Theirs),
                (false, _) => Ok(Some(json!({
                    "metadata": {"annotations": {mark.clone(): owner}},
                    "spec": {"unschedulable": true},
                }))),
            }
        })
        .await
    }

    async fn cordon_holder(&self, node: &str, owner: &str) -> Result<Cordon, ClusterError> {
        let n = self
            .nodes()
            .get(node)
            .await
            .map_err(|e| api_error(&format!("get node {node}"), e))?;
        Ok(match cordon_state(&n, &self.cordon_mark()) {
            (false, _) => Cordon::None,
            (true, Some(by)) if by == owner => Cordon::Ours,
            (true, _) => Cordon::Theirs,
        })
    }

    async fn drain_facts(&self, node: &str) -> Result<DrainFacts, ClusterError> {
        let pods = self
            .pods_on(node)
            .await?
            .iter()
            .map(|pod| PodFacts {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                labels: pod.metadata.labels.clone().unwrap_or_default(),
                running: pod.metadata.deletion_timestamp.is_none()
                    && !matches!(
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    ),
                evictable: stays(pod).is_none(),
            })
            .collect();
        let budgets = self.budgets().await?;
        Ok(DrainFacts { pods, budgets })
    }

    async fn drain(&self, node: &str, options: &DrainOptions) -> Result<DrainReport, DrainError> {
        let deadline = Instant::now() + options.timeout;
        let pods = self.pods_on(node).await?;
        let own = options.own_pod.as_ref();
        let mut report = DrainReport::default();
        let mut evict = Vec::new();
        let mut own_pod = None;
        for pod in &pods {
            match stays(pod) {
                Some(_) => report.skipped += 1,
                None if is_own(pod, own) => own_pod = Some(pod),
                None => evict.push(pod),
            }
        }
        let refusals = std::sync::atomic::AtomicUsize::new(0);
        self.evict_all(node, &evict, options, deadline, &refusals)
            .await?;
        report.evicted = evict.len();
        if let Some(pod) = own_pod {
            // Last, once every other pod is gone: this process is asked to stop, and the
            // run carries on where its pod is rescheduled (the drain step runs again and
            // finds the node empty).
            info!(node, pod = ?pod.metadata.name, "evicting rollgate's own pod last");
            self.evict_all(node, &[pod], options, deadline, &refusals)
                .await?;
            report.evicted += 1;
        }
        report.refusals = refusals.load(std::sync::atomic::Ordering::Relaxed);
        info!(
            node,
            evicted = report.evicted,
            skipped = report.skipped,
            refusals = report.refusals,
            "drained"
        );
        Ok(report)
    }

    async fn uncordon(&self, node: &str, owner: &str) -> Result<Cordon, ClusterError> {
        let mark = self.cordon_mark();
        let result = self
            .patch_node_checked(node, |n| {
                let (cordoned, by) = cordon_state(n, &mark);
                match (cordoned, by) {
                    (true, Some(by)) if by == owner => Ok(Some(json!({
                        "metadata": {"annotations": {mark.clone(): null}},
                        "spec": {"unschedulable": null},
                    }))),
                    (true, _) => Err(Cordon::Theirs),
                    (false, Some(by)) if by == owner => Ok(Some(json!({
                        "metadata": {"annotations": {mark.clone(): null}},
                    }))),
                    (false, _) => Ok(None),
                }
            })
            .await?;
        // `Ours` here means the patch that lifted our cordon went through.
        Ok(match result {
            Cordon::Ours => Cordon::None,
            other => other,
        })
    }
}

#[async_trait::async_trait]
impl InFlightMarks for Kube {
    async fn set_in_flight(&self, marks: Option<&InFlight>) -> Result<(), ClusterError> {
        let prefix = &self.settings.annotation_prefix;
        let mut annotations = BTreeMap::new();
        let key = |k: &str| format!("{prefix}/k8s-upgrade-{k}");
        match marks {
            Some(m) => {
                annotations.insert(key("in-flight"), json!("true"));
                annotations.insert(key("run-id"), json!(m.run_id));
                annotations.insert(key("target"), json!(m.target));
                if let Some(path) = &m.snapshot_path {
                    annotations.insert(key("snapshot-path"), json!(path));
                }
            }
            None => {
                for k in ["in-flight", "run-id", "target", "snapshot-path"] {
                    annotations.insert(key(k), Value::Null);
                }
            }
        }
        let ns = &self.settings.namespace;
        Api::<Namespace>::all(self.client.clone())
            .patch(
                ns,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": annotations}})),
            )
            .await
            .map(drop)
            .map_err(|e| api_error(&format!("annotate namespace {ns}"), e))
    }
}

/// kured's reboot lock: an annotation on kured's DaemonSet (see
/// [`crate::domain::kured_lock`]), read and written with the DaemonSet's resourceVersion
/// as a precondition, as kured's own update is.
pub struct KuredLock {
    client: Client,
    namespace: String,
    name: String,
    annotation: String,
}

impl Kube {
    /// kured's lock on DaemonSet `namespace/name`, kept in `annotation`.
    pub fn kured_lock(&self, namespace: &str, name: &str, annotation: &str) -> KuredLock {
        KuredLock {
            client: self.client.clone(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            annotation: annotation.to_owned(),
        }
    }
}

/// What to do with the DaemonSet's annotation: write a value, or remove it.
enum LockChange {
    Write(String),
    Remove,
}

impl KuredLock {
    fn api(&self) -> Api<DaemonSet> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn what(&self) -> String {
        format!(
            "kured's lock ({} on daemonset {}/{})",
            self.annotation, self.namespace, self.name
        )
    }

    /// Reads the lock and applies what `decide` makes of it, again on a conflict; `Ok(None)`
    /// when the DaemonSet is absent (no kured here).
    async fn change<T>(
        &self,
        decide: impl Fn(Option<&str>) -> Result<(Option<LockChange>, T), ClusterError>,
    ) -> Result<Option<T>, ClusterError> {
        let api = self.api();
        for _ in 0..CONFLICT_RETRIES {
            let ds = match api.get(&self.name).await {
                Ok(ds) => ds,
                Err(e) if status_code(&e) == Some(404) => return Ok(None),
                Err(e) => return Err(api_error(&format!("read {}", self.what()), e)),
            };
            let value = ds
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(&self.annotation))
                .map(String::as_str);
            let (change, answer) = decide(value)?;
            let value = match change {
                None => return Ok(Some(answer)),
                Some(LockChange::Write(v)) => json!(v),
                Some(LockChange::Remove) => Value::Null,
            };
            let patch = json!({"metadata": {
                "annotations": {self.annotation.clone(): value},
                "resourceVersion": ds.metadata.resource_version,
            }});
            match api
                .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(Some(answer)),
                Err(e) if status_code(&e) == Some(409) => continue,
                Err(e) => return Err(api_error(&format!("write {}", self.what()), e)),
            }
        }
        Err(ClusterError::new(format!(
            "write {}: still conflicting after {CONFLICT_RETRIES} tries",
            self.what()
        )))
    }
}

#[async_trait::async_trait]
impl ForeignLock for KuredLock {
    async fn take(&self) -> Result<Option<String>, ClusterError> {
        use crate::domain::kured_lock::{Take, describe, take};
        let now = chrono::Utc::now();
        let holders = self
            .change(|value| {
                let taken = take(value, now)
                    .map_err(|e| ClusterError::new(format!("{}: {e}", self.what())))?;
                Ok(match taken {
                    Take::Held => (None, None),
                    Take::Write(v) => (Some(LockChange::Write(v)), None),
                    Take::Theirs(holders) => (None, Some(describe(&holders))),
                })
            })
            .await?;
        match holders {
            // No kured DaemonSet here: nothing to honour.
            None => Ok(None),
            Some(None) => {
                info!(daemonset = %format!("{}/{}", self.namespace, self.name), "holding kured's reboot lock");
                Ok(None)
            }
            Some(theirs) => Ok(theirs),
        }
    }

    async fn release(&self) -> Result<(), ClusterError> {
        use crate::domain::kured_lock::{Release, release};
        self.change(|value| {
            let change = match release(value)
                .map_err(|e| ClusterError::new(format!("{}: {e}", self.what())))?
            {
                Release::Nothing => None,
                Release::Remove => Some(LockChange::Remove),
                Release::Write(v) => Some(LockChange::Write(v)),
            };
            Ok((change, ()))
        })
        .await
        .map(drop)
    }
}

#[async_trait::async_trait]
impl StatefulSets for Kube {
    async fn statefulset(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<StatefulSetState, ClusterError> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), namespace);
        let sts = api
            .get(name)
            .await
            .map_err(|e| api_error(&format!("get statefulset {namespace}/{name}"), e))?;
        let spec = sts.spec.unwrap_or_default();
        let status = sts.status.unwrap_or_default();
        let partition = spec
            .update_strategy
            .and_then(|u| u.rolling_update)
            .and_then(|r| r.partition)
            .unwrap_or(0);
        Ok(StatefulSetState {
            replicas: u32::try_from(spec.replicas.unwrap_or(1)).unwrap_or(0),
            partition: u32::try_from(partition).unwrap_or(0),
            update_revision: status.update_revision.unwrap_or_default(),
            current_revision: status.current_revision.unwrap_or_default(),
            resource_version: sts.metadata.resource_version.unwrap_or_default(),
            service_name: spec.service_name.unwrap_or_default(),
        })
    }

    async fn wait_for_change(
        &self,
        namespace: &str,
        name: &str,
        resource_version: &str,
        timeout: Duration,
    ) -> Result<(), ClusterError> {
        use futures_util::StreamExt;
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), namespace);
        // The client's read timeout is the request timeout: the server must end a quiet
        // watch before it, or the read fails.
        let timeout = timeout.min(self.settings.request_timeout / 2);
        let seconds = u32::try_from(timeout.as_secs().max(1)).unwrap_or(u32::MAX);
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(seconds);
        let what = format!("watch statefulset {namespace}/{name}");
        let events = api
            .watch(&params, resource_version)
            .await
            .map_err(|e| api_error(&what, e))?;
        let mut events = std::pin::pin!(events);
        // The server ends the watch at its timeout; this bound covers one that does not.
        let until = tokio::time::Instant::now() + timeout + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(until, events.next()).await {
                // A bookmark only moves the watch's resourceVersion on: nothing changed.
                Ok(Some(Ok(WatchEvent::Bookmark(_)))) => continue,
                Ok(Some(Err(e))) => return Err(api_error(&what, e)),
                // 410 Gone: the history this watch started from is compacted away. As a
                // reflector does, the caller reads the object again at once (anything
                // missed shows in what it reads) and watches from there.
                Ok(Some(Ok(WatchEvent::Error(status)))) if status.code == 410 => {
                    info!(%namespace, %name, message = %status.message, "watch expired (410 Gone): reading again");
                    return Ok(());
                }
                Ok(Some(Ok(WatchEvent::Error(status)))) => {
                    return Err(ClusterError::new(format!(
                        "{what}: {} ({})",
                        status.message, status.code
                    )));
                }
                _ => return Ok(()),
            }
        }
    }

    async fn set_partition(
        &self,
        namespace: &str,
        name: &str,
        partition: u32,
    ) -> Result<(), ClusterError> {
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(drop)
            .map_err(|e| api_error(&format!("set the partition of {namespace}/{name}"), e))
    }

    async fn pod_state(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<Option<PodState>, ClusterError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let Some(pod) = api
            .get_opt(pod)
            .await
            .map_err(|e| api_error(&format!("get pod {namespace}/{pod}"), e))?
        else {
            return Ok(None);
        };
        let revision = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("controller-revision-hash"))
            .cloned()
            .unwrap_or_default();
        let ready = pod.metadata.deletion_timestamp.is_none() && pod_ready(&pod);
        Ok(Some(PodState { revision, ready }))
    }
}

/// Who writes rollgate's Events (`reportingController`).
const REPORTING_CONTROLLER: &str = "rollgate.io/rollgate";
/// The longest note the API server accepts.
const NOTE_LIMIT: usize = 1024;

/// `text` cut to at most `limit` bytes, on a character boundary.
fn clip(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[async_trait::async_trait]
impl EventRecorder for Kube {
    async fn record(&self, event: &ClusterEvent) -> Result<(), ClusterError> {
        let now = chrono::Utc::now();
        // Node events live in `default`, as the kubelet's do.
        let (namespace, regarding) = match &event.regarding {
            Regarding::Node(name) => (
                "default",
                json!({"apiVersion": "v1", "kind": "Node", "name": name}),
            ),
            Regarding::Namespace(name) => (
                name.as_str(),
                json!({"apiVersion": "v1", "kind": "Namespace", "name": name}),
            ),
        };
        let about = match &event.regarding {
            Regarding::Node(name) | Regarding::Namespace(name) => name,
        };
        let name = format!(
            "{about}.{:x}",
            now.timestamp_nanos_opt().unwrap_or_default()
        );
        let instance = std::env::var("POD_NAME")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "rollgate".into());
        let body: k8s_openapi::api::events::v1::Event = serde_json::from_value(json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": instance,
            "action": event.action,
            "reason": event.reason,
            "note": clip(&event.note, NOTE_LIMIT),
            "type": if event.warning { "Warning" } else { "Normal" },
            "regarding": regarding,
        }))
        .map_err(|e| ClusterError::caused("build an Event", e))?;
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(self.client.clone(), namespace)
            .create(&kube::api::PostParams::default(), &body)
            .await
            .map(drop)
            .map_err(|e| api_error(&format!("create Event {} on {about}", event.reason), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_versions_parse() {
        let cases = [
            ("v1.34.5", Some("1.34.5")),
            ("1.34.5", Some("1.34.5")),
            ("v1.34.5+k3s1", Some("1.34.5")),
            ("containerd://1.7.24", Some("1.7.24")),
            ("containerd://1.7.24-1", Some("1.7.24")),
            ("v1.34", None),
            ("", None),
        ];
        for (raw, want) in cases {
            assert_eq!(
                reported_version(raw).map(|v| v.to_string()).as_deref(),
                want,
                "{raw}"
            );
        }
    }
}
