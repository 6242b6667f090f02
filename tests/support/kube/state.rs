//! The fake's store and its controllers: objects by resource, namespace and name, one
//! resourceVersion counter, a bounded history of changes for watches (older entries are
//! compacted away, as etcd's are), and what the kubelet, the ReplicaSet and StatefulSet
//! controllers and the disruption controller would do, applied lazily on each request.

use super::budget;
use super::resources::Resource;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// An object's place: resource plural, namespace ("" when cluster-scoped), name.
pub type Key = (&'static str, String, String);

/// One recorded API call that changed something, for assertions and benchmarks.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Cordon(String),
    Uncordon(String),
    /// A StatefulSet's partition written (`namespace/name`, the new value).
    Partition {
        set: String,
        to: u64,
    },
    /// A pod replaced by its StatefulSet's controller onto another revision.
    Replaced(String),
    Evicted {
        node: String,
        pod: String,
    },
    Refused {
        node: String,
        pod: String,
    },
    KubeletVersion {
        node: String,
        version: String,
    },
}

/// One change in the watch history.
#[derive(Debug, Clone)]
pub struct Record {
    pub rv: u64,
    pub resource: &'static str,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    pub object: Value,
    /// The object before the change (for selector-filtered watches).
    pub previous: Option<Value>,
}

#[derive(Debug, Default)]
pub(super) struct PodTimers {
    pub delete_at: Option<Instant>,
    pub ready_at: Option<Instant>,
}

/// A write another client makes right after a read of one object: a concurrent writer.
pub(super) struct AfterRead {
    pub resource: &'static str,
    pub name: String,
    pub remaining: usize,
    pub change: Box<dyn FnMut(&mut Value) + Send>,
}

/// The annotation that makes a fake pod ignore SIGTERM: it goes only when its grace
/// period ends.
pub const IGNORES_SIGTERM: &str = "fake.rollgate.io/ignores-sigterm";

/// How long an evicted pod stays in a budget's `disruptedPods` before the controller
/// forgets it (the real controller's DeletionTimeout).
const DISRUPTED_TIMEOUT: Duration = Duration::from_secs(120);

pub struct State {
    rv: u64,
    objects: BTreeMap<Key, Value>,
    /// The pods bound to each node (`spec.nodeName`, empty for none), by namespace and
    /// name: the real API server's watch cache indexes pods by node the same way, so a
    /// list of one node's pods reads those pods alone.
    pods_on_node: BTreeMap<String, BTreeSet<(String, String)>>,
    history: VecDeque<Record>,
    /// How many changes the watch history keeps before the oldest are compacted.
    pub history_limit: usize,
    /// Watches and continue tokens from a resourceVersion below this are answered 410.
    pub compacted: u64,
    /// Moves on when every open watch is ended with 410 (see `FakeKube::expire_watches`).
    pub watch_epoch: u64,
    /// How often a watch that asked for them gets a BOOKMARK.
    pub bookmark_every: Duration,
    /// Watches open now, by resource.
    pub open_watches: BTreeMap<&'static str, usize>,
    pub(super) timers: BTreeMap<(String, String), PodTimers>,
    /// Pods the StatefulSet controller is restarting now.
    pub(super) restarting: BTreeSet<(String, String)>,
    /// What `GET /version` reports: the first control plane's kubelet unless set.
    pub server_version: Option<String>,
    pub changes: Vec<(Instant, Change)>,
    /// Requests by method and path pattern.
    pub calls: BTreeMap<String, u64>,
    /// Every (API group, resource, verb) a client used, as RBAC names them.
    pub access: BTreeSet<super::Access>,
    /// How long a pod takes to exit after SIGTERM (never longer than its grace period).
    pub terminate_after: Duration,
    /// How long a replacement pod takes to turn Ready.
    pub ready_after: Duration,
    /// How long the disruption controller takes to bring a budget's status up to date.
    pub pdb_lag: Duration,
    /// The eviction subresource admits every eviction, budgets or not (and writes no
    /// budget's status): only the disruption controller's recount, after `pdb_lag`,
    /// tells a client what a budget allows.
    pub admit_every_eviction: bool,
    /// Per budget, since when its status has been out of date.
    pdb_stale_since: BTreeMap<(String, String), Instant>,
    pub(super) serial: u64,
    /// What node-exporter reports as every node's boot time (seconds since the epoch).
    pub booted_at: i64,
    /// The boot time of each node that came back with another boot id since.
    pub node_booted: BTreeMap<String, i64>,
    /// When set, creating an Event answers 500.
    pub events_fail: bool,
    /// Per budget, the lowest `healthy - desiredHealthy` the fake's own count has seen.
    pub budget_low: BTreeMap<String, i64>,
    pub(super) after_read: Vec<AfterRead>,
    /// Per resource, after how many more pages of a list the history is compacted (so the
    /// list's continue token expires).
    pub(super) compact_after_pages: BTreeMap<&'static str, usize>,
    /// Injected faults and the log of every request.
    pub faults: super::fault::Faults,
}

pub(super) fn key_of(resource: &'static Resource, object: &Value) -> Key {
    let ns = if resource.namespaced {
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned()
    } else {
        String::new()
    };
    (
        resource.plural,
        ns,
        object["metadata"]["name"].as_str().unwrap_or("").to_owned(),
    )
}

/// An object's namespace and name ("" where missing).
pub fn ns_name(object: &Value) -> (String, String) {
    let meta = &object["metadata"];
    (
        meta["namespace"].as_str().unwrap_or("").to_owned(),
        meta["name"].as_str().unwrap_or("").to_owned(),
    )
}

pub fn pod_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

pub fn set_ready(pod: &mut Value, ready: bool) {
    pod["status"]["conditions"] =
        json!([{"type": "Ready", "status": if ready {"True"} else {"False"}}]);
}

fn owner_kind(pod: &Value) -> Option<&str> {
    pod["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == json!(true))
        .and_then(|o| o["kind"].as_str())
}

pub fn now_rfc3339(offset: Duration) -> String {
    (chrono::Utc::now() + chrono::Duration::from_std(offset).unwrap_or_default())
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl State {
    pub(super) fn new() -> Self {
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            pods_on_node: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: 100_000,
            compacted: 0,
            watch_epoch: 0,
            bookmark_every: Duration::from_secs(1),
            open_watches: BTreeMap::new(),
            timers: BTreeMap::new(),
            restarting: BTreeSet::new(),
            server_version: None,
            changes: Vec::new(),
            calls: BTreeMap::new(),
            access: BTreeSet::new(),
            terminate_after: Duration::from_millis(100),
            ready_after: Duration::from_millis(100),
            pdb_lag: Duration::ZERO,
            admit_every_eviction: false,
            pdb_stale_since: BTreeMap::new(),
            serial: 0,
            booted_at: chrono::Utc::now().timestamp() - 86_400,
            node_booted: BTreeMap::new(),
            events_fail: false,
            budget_low: BTreeMap::new(),
            after_read: Vec::new(),
            compact_after_pages: BTreeMap::new(),
            faults: Default::default(),
        }
    }

    /// The newest resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub(super) fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> Option<&Value> {
        let resource = Resource::named(resource);
        self.objects
            .get(&(resource.plural, ns.to_owned(), name.to_owned()))
    }

    /// The objects of `resource`, in the order etcd keeps them (namespace, then name).
    pub fn all<'a>(&'a self, resource: &'static str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .range((resource, String::new(), String::new())..)
            .take_while(move |(k, _)| k.0 == resource)
            .map(|(_, v)| v)
    }

    /// The objects of `resource` with their keys, from just after `after` on.
    pub fn all_after<'a>(
        &'a self,
        resource: &'static str,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        let start = match after {
            Some((ns, name)) => std::ops::Bound::Excluded((resource, ns, name)),
            None => std::ops::Bound::Included((resource, String::new(), String::new())),
        };
        self.objects
            .range((start, std::ops::Bound::Unbounded))
            .take_while(move |(k, _)| k.0 == resource)
    }

    /// The pods on `node` with their keys, from just after `after` on, in the order of
    /// [`State::all_after`].
    pub fn pods_on_node_after<'a>(
        &'a self,
        node: &str,
        after: Option<(String, String)>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        let start = match after {
            Some(key) => std::ops::Bound::Excluded(key),
            None => std::ops::Bound::Unbounded,
        };
        self.pods_on_node
            .get(node)
            .into_iter()
            .flat_map(move |pods| pods.range((start.clone(), std::ops::Bound::Unbounded)))
            .filter_map(|(ns, name)| {
                self.objects
                    .get_key_value(&("pods", ns.clone(), name.clone()))
            })
    }

    /// Keeps [`State::pods_on_node`] up to date with a pod's write: `before` and `after`
    /// it (`None` where it did not or no longer exists).
    fn index_pod(&mut self, key: &Key, before: Option<&Value>, after: Option<&Value>) {
        let node = |pod: &Value| {
            pod["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        let name = (key.1.clone(), key.2.clone());
        if let Some(old) = before
            && let Some(pods) = self.pods_on_node.get_mut(&node(old))
        {
            pods.remove(&name);
            if pods.is_empty() {
                self.pods_on_node.remove(&node(old));
            }
        }
        if let Some(new) = after {
            self.pods_on_node.entry(node(new)).or_default().insert(name);
        }
    }

    fn record(&mut self, record: Record) {
        self.history.push_back(record);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
    }

    /// Stores `object` (created or replaced) at a new resourceVersion, as the API server
    /// commits a write: uid and creationTimestamp kept or made, generation moved on when
    /// the spec changed. Returns what was stored.
    pub fn put(&mut self, resource: &'static str, mut object: Value) -> Value {
        let resource = Resource::named(resource);
        let key = key_of(resource, &object);
        let previous = self.objects.get(&key).cloned();
        self.rv += 1;
        let rv = self.rv;
        object["apiVersion"] = json!(resource.api_version());
        object["kind"] = json!(resource.kind);
        let meta = &mut object["metadata"];
        meta["resourceVersion"] = json!(rv.to_string());
        match &previous {
            Some(old) => {
                meta["uid"] = old["metadata"]["uid"].clone();
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                if resource.generation {
                    let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
                    let moved = old["spec"] != object["spec"];
                    object["metadata"]["generation"] =
                        json!(if moved { generation + 1 } else { generation });
                }
            }
            None => {
                if meta["uid"].is_null() {
                    meta["uid"] = json!(format!("uid-{}-{rv}", resource.singular));
                }
                if meta["creationTimestamp"].is_null() {
                    meta["creationTimestamp"] = json!(now_rfc3339(Duration::ZERO));
                }
                if resource.generation {
                    object["metadata"]["generation"] = json!(1);
                }
            }
        }
        self.observe(resource.plural, previous.as_ref(), &object);
        if resource.plural == "pods" {
            self.index_pod(&key, previous.as_ref(), Some(&object));
        }
        self.objects.insert(key, object.clone());
        self.record(Record {
            rv,
            resource: resource.plural,
            kind: if previous.is_some() {
                "MODIFIED"
            } else {
                "ADDED"
            },
            object: object.clone(),
            previous,
        });
        object
    }

    /// Removes an object at once; what was removed.
    pub fn remove(&mut self, resource: &'static str, ns: &str, name: &str) -> Option<Value> {
        let resource = Resource::named(resource);
        let key = (resource.plural, ns.to_owned(), name.to_owned());
        let mut object = self.objects.remove(&key)?;
        if resource.plural == "pods" {
            self.index_pod(&key, Some(&object), None);
        }
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(Record {
            rv: self.rv,
            resource: resource.plural,
            kind: "DELETED",
            object: object.clone(),
            previous: None,
        });
        if resource.plural == "pods" {
            self.timers.remove(&(ns.to_owned(), name.to_owned()));
        }
        Some(object)
    }

    /// Changes `resource` `ns/name` with `change` (a no-op when it is absent).
    pub fn edit(
        &mut self,
        resource: &'static str,
        ns: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let mut object = self.get(resource, ns, name)?.clone();
        change(&mut object);
        Some(self.put(resource, object))
    }

    /// The changes after `rv` (for watches); `Err` with the oldest resourceVersion still
    /// kept when `rv` has been compacted away.
    pub fn history_after(&self, rv: u64) -> Result<impl Iterator<Item = &Record>, u64> {
        if rv < self.compacted {
            return Err(self.compacted);
        }
        let start = self.history.partition_point(|r| r.rv <= rv);
        Ok(self.history.range(start..))
    }

    /// A write to something the fake does not serve (a node's Lease, renewed all the
    /// time): the resourceVersion moves on.
    pub fn touch(&mut self) {
        self.rv += 1;
    }

    /// Drops the whole history: watches and continue tokens from before now get 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// What the fake records about a node write.
    fn observe(&mut self, resource: &str, before: Option<&Value>, after: &Value) {
        if resource == "statefulsets" || resource == "pods" {
            self.observe_rollout(resource, before, after);
            return;
        }
        if resource != "nodes" {
            return;
        }
        let Some(before) = before else { return };
        let name = after["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let cordoned = |n: &Value| n["spec"]["unschedulable"] == json!(true);
        let now = Instant::now();
        match (cordoned(before), cordoned(after)) {
            (false, true) => self.changes.push((now, Change::Cordon(name.clone()))),
            (true, false) => self.changes.push((now, Change::Uncordon(name.clone()))),
            _ => {}
        }
        let boot = &after["status"]["nodeInfo"]["bootID"];
        if !boot.is_null() && *boot != before["status"]["nodeInfo"]["bootID"] {
            self.node_booted
                .insert(name.clone(), chrono::Utc::now().timestamp());
        }
        let kubelet = &after["status"]["nodeInfo"]["kubeletVersion"];
        if *kubelet != before["status"]["nodeInfo"]["kubeletVersion"] {
            self.changes.push((
                now,
                Change::KubeletVersion {
                    node: name,
                    version: kubelet.as_str().unwrap_or("").to_owned(),
                },
            ));
        }
    }

    /// A StatefulSet's partition moving, and a pod moving to another revision: the
    /// API server's own record of a rollout, beside its record of cordons.
    fn observe_rollout(&mut self, resource: &str, before: Option<&Value>, after: &Value) {
        let Some(before) = before else { return };
        let now = Instant::now();
        let (ns, name) = ns_name(after);
        if resource == "statefulsets" {
            let partition =
                |s: &Value| s["spec"]["updateStrategy"]["rollingUpdate"]["partition"].as_u64();
            if let (Some(to), true) = (partition(after), partition(after) != partition(before)) {
                self.changes.push((
                    now,
                    Change::Partition {
                        set: format!("{ns}/{name}"),
                        to,
                    },
                ));
            }
        } else {
            let revision = |p: &Value| p["metadata"]["labels"]["controller-revision-hash"].clone();
            if !revision(before).is_null() && revision(after) != revision(before) {
                self.changes.push((now, Change::Replaced(name)));
            }
        }
    }

    pub fn count(&mut self, key: &str) {
        *self.calls.entry(key.to_owned()).or_default() += 1;
    }

    pub fn pods_on(&self, node: &str) -> Vec<&Value> {
        self.all("pods")
            .filter(|p| p["spec"]["nodeName"].as_str() == Some(node))
            .collect()
    }

    /// Starts the graceful deletion of pod `ns/name` with `grace` seconds (the pod's own
    /// `terminationGracePeriodSeconds`, default 30, when `None`): it is marked, stops
    /// being Ready, and goes when its containers exit (`terminate_after`, or the end of
    /// the grace period for a pod that ignores SIGTERM). A pod on no node, or a grace of
    /// 0, goes at once. A ReplicaSet's controller makes its replacement right away.
    pub fn delete_pod(&mut self, ns: &str, name: &str, grace: Option<i64>) -> Option<Value> {
        let pod = self.get("pods", ns, name)?.clone();
        if !pod["metadata"]["deletionTimestamp"].is_null() {
            return Some(pod);
        }
        let grace = grace
            .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
            .unwrap_or(30)
            .max(0);
        if grace == 0 || pod["spec"]["nodeName"].is_null() {
            let gone = self.remove("pods", ns, name);
            if let Some(old) = &gone {
                self.replace(old);
            }
            return gone;
        }
        let grace_span = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let exits = if pod["metadata"]["annotations"][IGNORES_SIGTERM] == "true" {
            grace_span
        } else {
            self.terminate_after.min(grace_span)
        };
        let marked = self.edit("pods", ns, name, |p| {
            p["metadata"]["deletionTimestamp"] = json!(now_rfc3339(grace_span));
            p["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            set_ready(p, false);
        });
        self.timers.insert(
            (ns.to_owned(), name.to_owned()),
            PodTimers {
                delete_at: Some(Instant::now() + exits),
                ready_at: None,
            },
        );
        if let Some(p) = &marked
            && owner_kind(p) == Some("ReplicaSet")
        {
            self.replace(p);
        }
        marked
    }

    /// Applies what time has done: terminated pods go (a StatefulSet's come back under
    /// the same name), replacements turn Ready; then the StatefulSet and disruption
    /// controllers bring their statuses up to date.
    pub fn tick(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, String)> = self
            .timers
            .iter()
            .filter(|(_, t)| t.delete_at.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for (ns, name) in due {
            if let Some(pod) = self.remove("pods", &ns, &name)
                && owner_kind(&pod) == Some("StatefulSet")
            {
                self.replace(&pod);
            }
        }
        let ready: Vec<(String, String)> = self
            .timers
            .iter()
            .filter(|(_, t)| t.ready_at.is_some_and(|r| r <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for (ns, name) in ready {
            self.timers.remove(&(ns.clone(), name.clone()));
            self.edit("pods", &ns, &name, |p| set_ready(p, true));
        }
        self.sync_statefulsets();
        self.sync_budgets(now);
        self.watch_budgets();
    }

    /// A new pod in place of `old`, on the schedulable Ready worker with the fewest pods
    /// (control planes are tainted); a StatefulSet's pod keeps its name. Pods of no
    /// controller are not made again.
    pub(super) fn replace(&mut self, old: &Value) {
        let stateful = match owner_kind(old) {
            Some("ReplicaSet") => false,
            Some("StatefulSet") => true,
            _ => return,
        };
        let from = old["spec"]["nodeName"].as_str().unwrap_or("").to_owned();
        let mut load: BTreeMap<&str, usize> = BTreeMap::new();
        for pod in self.all("pods") {
            if let Some(node) = pod["spec"]["nodeName"].as_str() {
                *load.entry(node).or_default() += 1;
            }
        }
        let mut best: Option<(usize, String)> = None;
        for node in self.all("nodes") {
            let name = node["metadata"]["name"].as_str().unwrap_or("");
            let schedulable = node["spec"]["unschedulable"] != json!(true);
            let control_plane =
                !node["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_null();
            if !schedulable || !node_ready(node) || control_plane || name == from {
                continue;
            }
            let count = load.get(name).copied().unwrap_or(0);
            if best.as_ref().is_none_or(|(c, _)| count < *c) {
                best = Some((count, name.to_owned()));
            }
        }
        let serial = self.next_serial();
        let ns = old["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = if stateful {
            old["metadata"]["name"].as_str().unwrap_or("").to_owned()
        } else {
            let base = old["metadata"]["generateName"].as_str().unwrap_or("pod-");
            format!("{base}{serial}")
        };
        let mut pod = old.clone();
        pod["metadata"]["name"] = json!(name);
        if let Some(meta) = pod["metadata"].as_object_mut() {
            for field in [
                "uid",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "creationTimestamp",
                "resourceVersion",
            ] {
                meta.remove(field);
            }
        }
        set_ready(&mut pod, false);
        match best {
            Some((_, node)) => {
                pod["spec"]["nodeName"] = json!(node);
                pod["status"]["phase"] = json!("Running");
                self.timers.insert(
                    (ns.clone(), name.clone()),
                    PodTimers {
                        delete_at: None,
                        ready_at: Some(Instant::now() + self.ready_after),
                    },
                );
            }
            None => {
                if let Some(spec) = pod["spec"].as_object_mut() {
                    spec.remove("nodeName");
                }
                pod["status"]["phase"] = json!("Pending");
            }
        }
        self.put("pods", pod);
    }

    /// The StatefulSet controller's status: replicas, ready, current and updated counts,
    /// the observed generation, and the current revision once every pod is updated.
    fn sync_statefulsets(&mut self) {
        let sets: Vec<Value> = self.all("statefulsets").cloned().collect();
        for sts in sets {
            let (ns, name) = ns_name(&sts);
            let replicas = sts["spec"]["replicas"].as_u64().unwrap_or(1);
            let current = sts["status"]["currentRevision"].clone();
            let update = sts["status"]["updateRevision"].clone();
            let pods: Vec<&Value> = (0..replicas)
                .filter_map(|o| self.get("pods", &ns, &format!("{name}-{o}")))
                .collect();
            let revision = |p: &&Value| p["metadata"]["labels"]["controller-revision-hash"].clone();
            let ready = pods.iter().filter(|p| pod_ready(p)).count();
            let updated = pods.iter().filter(|p| revision(p) == update).count();
            let at_current = pods.iter().filter(|p| revision(p) == current).count();
            let mut status = sts["status"].clone();
            status["replicas"] = json!(pods.len());
            status["readyReplicas"] = json!(ready);
            status["availableReplicas"] = json!(ready);
            status["updatedReplicas"] = json!(updated);
            status["currentReplicas"] = json!(at_current);
            status["observedGeneration"] = sts["metadata"]["generation"].clone();
            if updated as u64 == replicas && current != update {
                status["currentRevision"] = update.clone();
                status["currentReplicas"] = json!(updated);
            }
            if status != sts["status"] {
                self.edit("statefulsets", &ns, &name, |s| s["status"] = status);
            }
        }
    }

    /// The disruption controller: each budget's status from the pods it covers, with the
    /// pods evicted but not yet seen deleted still counted out; a status goes out of date
    /// when its pods change and is brought up to date `pdb_lag` later.
    fn sync_budgets(&mut self, now: Instant) {
        let budgets: Vec<Value> = self.all("poddisruptionbudgets").cloned().collect();
        for pdb in budgets {
            let (ns, name) = ns_name(&pdb);
            let mut disrupted = serde_json::Map::new();
            for (pod, at) in pdb["status"]["disruptedPods"]
                .as_object()
                .into_iter()
                .flatten()
            {
                let still = self
                    .get("pods", &ns, pod)
                    .is_some_and(|p| p["metadata"]["deletionTimestamp"].is_null());
                let fresh = at
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|t| {
                        (chrono::Utc::now() - t.with_timezone(&chrono::Utc))
                            .to_std()
                            .unwrap_or_default()
                            < DISRUPTED_TIMEOUT
                    });
                if still && fresh {
                    disrupted.insert(pod.clone(), at.clone());
                }
            }
            let names: Vec<String> = disrupted.keys().cloned().collect();
            let status = match budget::numbers(&pdb, self.all("pods"), &names) {
                Ok(n) => json!({
                    "observedGeneration": pdb["metadata"]["generation"],
                    "disruptionsAllowed": n.allowed(),
                    "currentHealthy": n.healthy,
                    "desiredHealthy": n.desired,
                    "expectedPods": n.expected,
                    "disruptedPods": disrupted,
                    "conditions": [{
                        "type": "DisruptionAllowed",
                        "status": if n.allowed() > 0 { "True" } else { "False" },
                        "reason": if n.allowed() > 0 { "SufficientPods" } else { "InsufficientPods" },
                        "message": "", "observedGeneration": pdb["metadata"]["generation"],
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }],
                }),
                Err(why) => json!({
                    "observedGeneration": pdb["metadata"]["generation"],
                    "disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0,
                    "expectedPods": 0,
                    "conditions": [{"type": "DisruptionAllowed", "status": "False",
                                    "reason": "SyncFailed", "message": why,
                                    "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                }),
            };
            let key = (ns.clone(), name.clone());
            if status == pdb["status"] {
                self.pdb_stale_since.remove(&key);
                continue;
            }
            let since = *self.pdb_stale_since.entry(key.clone()).or_insert(now);
            if now.duration_since(since) >= self.pdb_lag {
                self.pdb_stale_since.remove(&key);
                self.edit("poddisruptionbudgets", &ns, &name, |p| p["status"] = status);
            }
        }
    }

    /// The fake's own count: per budget, the lowest `healthy - desired` ever seen.
    pub fn watch_budgets(&mut self) {
        let mut seen = Vec::new();
        for pdb in self.all("poddisruptionbudgets") {
            if let Ok(n) = budget::numbers(pdb, self.all("pods"), &[]) {
                let name = pdb["metadata"]["name"].as_str().unwrap_or("").to_owned();
                seen.push((name, n.healthy - n.desired));
            }
        }
        for (name, margin) in seen {
            let low = self.budget_low.entry(name).or_insert(margin);
            *low = (*low).min(margin);
        }
    }
}

/// Whether a node's Ready condition is True.
fn node_ready(node: &Value) -> bool {
    node["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}
