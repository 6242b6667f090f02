//! A fake Kubernetes API server: the one fake the tests allow, because no API server can
//! be installed here. The real `kubectl` examines it (tests/fake_apiserver.rs): what
//! kubectl and rollgate do against it goes as against a real API server.
//!
//! - Discovery (`/api`, `/apis`, resource lists with `pods/eviction`), `/version`.
//! - Nodes, namespaces, pods, StatefulSets, DaemonSets, ReplicaSets,
//!   PodDisruptionBudgets and events.k8s.io Events: get, list (label and field
//!   selectors, `limit`/`continue`), watch (from a resourceVersion or from now, BOOKMARKs,
//!   410 Gone once the history is compacted), create, update and patch (merge, strategic
//!   merge, JSON patch) with 409 Conflict on a stale resourceVersion, delete, and a
//!   separate `/status` subresource.
//! - The Eviction subresource with budgets as the disruption controller keeps them
//!   (`minAvailable` or `maxUnavailable`, integers or percentages, `matchLabels` and
//!   `matchExpressions`, only Running and Ready pods healthy, status after
//!   `pdb_lag`); graceful deletion: a pod terminates when its containers exit, never after
//!   its grace period; a ReplicaSet's pods are made again on another node at once, a
//!   StatefulSet's under the same name once the old one is gone.
//! - `Status` bodies as the real server sends them, bearer-token auth.
//! - As Prometheus targets, what the cluster's exporters would say (see `exporters`).
//!
//! Time-driven changes are applied lazily on every request.

mod budget;
mod exporters;
pub mod fault;
mod patch;
mod resources;
mod selector;
mod server;
mod state;
mod table;

pub use state::{Change, State};

use actix_web::{App, HttpServer, web};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One use of the API as RBAC sees it: API group ("" for core), resource (with its
/// subresource, e.g. `pods/eviction`), verb, and the object's name for cluster-scoped
/// objects named in the path (RBAC's resourceNames).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
}

/// The annotation kured keeps its reboot lock in.
pub const KURED_LOCK: &str = "weave.works/kured-node-lock";

/// The running fake API server.
#[derive(Clone)]
pub struct FakeKube {
    pub port: u16,
    /// The HTTPS listener's port: clients that send credentials only over TLS (kubectl,
    /// as every client-go program) use it.
    pub tls_port: u16,
    /// The certificate the HTTPS listener presents (self-signed, for 127.0.0.1), PEM.
    pub ca_pem: String,
    pub token: String,
    pub state: Arc<Mutex<State>>,
    handle: actix_web::dev::ServerHandle,
}

fn ready_pod(pod: &mut Value) {
    state::set_ready(pod, true);
}

impl FakeKube {
    /// Starts on a free loopback port.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0").await
    }

    /// Starts on `listen` (`host:port`).
    pub async fn start_on(listen: &str) -> Self {
        let token = format!("fake-token-{}", std::process::id());
        let state = Arc::new(Mutex::new(State::new()));
        let shared = web::Data::new((state.clone(), token.clone()));
        let (tls, ca_pem) = tls_config();
        let host = listen.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
                .app_data(web::PayloadConfig::new(1 << 20))
                .default_service(web::to(server::handle))
        })
        .workers(1)
        // As kube-apiserver (Go's http.Server with a 90 s idle timeout): a client's pooled
        // connection is not closed under it between two requests a few seconds apart.
        .keep_alive(std::time::Duration::from_secs(90))
        .disable_signals()
        .bind(listen)
        .unwrap_or_else(|e| panic!("bind the fake API server on {listen}: {e}"))
        .bind_rustls_0_23(format!("{host}:0"), tls)
        .unwrap_or_else(|e| panic!("bind the fake API server's HTTPS listener: {e}"));
        let addrs = server.addrs();
        let (port, tls_port) = (addrs[0].port(), addrs[1].port());
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        let fake = Self {
            port,
            tls_port,
            ca_pem,
            token,
            state,
            handle,
        };
        // Answering means the workers run on their own threads: from here on, blocking
        // callers (a script under `Command::output`) are served too.
        let http = reqwest::Client::new();
        let started = Instant::now();
        while http.get(fake.url()).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the fake API server did not answer within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        fake
    }

    /// The state, locked, with what time has done applied.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.tick();
        s
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig for the HTTPS listener, with the server's certificate beside it
    /// (`<path>.ca.pem`): what kubectl needs, since client-go sends a token only over TLS.
    pub fn write_tls_kubeconfig(&self, path: &std::path::Path) {
        let ca = path.with_extension("ca.pem");
        std::fs::write(&ca, &self.ca_pem).expect("CA file");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: {}\nusers:\n- name: rollgate\n  user:\n    token: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: rollgate\n    namespace: default\ncurrent-context: fake\n",
            self.tls_port,
            ca.display(),
            self.token
        );
        std::fs::write(path, text).expect("kubeconfig");
    }

    /// A kubeconfig file for the plain HTTP listener.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: rollgate\n  user:\n    token: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: rollgate\n    namespace: default\ncurrent-context: fake\n",
            self.url(),
            self.token
        );
        std::fs::write(path, text).expect("kubeconfig");
    }

    pub fn add_node(&self, name: &str, control_plane: bool, kubelet: &str, containerd: &str) {
        let mut s = self.lock();
        let mut labels = json!({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"});
        if control_plane {
            labels["node-role.kubernetes.io/control-plane"] = json!("");
            s.server_version.get_or_insert_with(|| kubelet.to_owned());
        }
        s.put(
            "nodes",
            json!({
                "metadata": {"name": name, "uid": format!("node-{name}"), "labels": labels},
                "spec": {},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                    "nodeInfo": {
                        "kubeletVersion": format!("v{kubelet}"),
                        "containerRuntimeVersion": format!("containerd://{containerd}"),
                        "architecture": "amd64", "bootID": format!("boot-{name}-1"), "kernelVersion": "", "kubeProxyVersion": "",
                        "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": "",
                    },
                },
            }),
        );
    }

    pub fn add_namespace(&self, name: &str) {
        self.lock().put(
            "namespaces",
            json!({"metadata": {"name": name, "uid": format!("ns-{name}")}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
        );
    }

    /// `count` Ready pods of app `app` (owned by a ReplicaSet) on `node`.
    pub fn add_pods(&self, node: &str, app: &str, count: usize, empty_dir: bool) {
        let mut s = self.lock();
        for _ in 0..count {
            let serial = s.next_serial();
            let mut pod = json!({
                "metadata": {
                    "name": format!("{app}-{serial}"), "namespace": "default", "uid": format!("uid-{serial}"),
                    "generateName": format!("{app}-"),
                    "labels": {"app": app},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-rs"), "uid": "rs", "controller": true}],
                },
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}], "terminationGracePeriodSeconds": 30},
                "status": {"phase": "Running"},
            });
            if empty_dir {
                pod["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
            }
            ready_pod(&mut pod);
            s.put("pods", pod);
        }
    }

    /// The mirror pods of kubeadm's static control-plane pods on `node` at `version`
    /// (kube-apiserver, kube-controller-manager, kube-scheduler, and etcd when `etcd`), as
    /// the kubelet registers them: labelled by `component`, Ready.
    pub fn add_static_pods(&self, node: &str, version: &str, etcd: bool) {
        let mut s = self.lock();
        let components = [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ];
        for component in components.iter().chain(etcd.then_some(&"etcd")) {
            let serial = s.next_serial();
            let image = if *component == "etcd" {
                "registry.k8s.io/etcd:3.5.21-0".to_owned()
            } else {
                format!("registry.k8s.io/{component}:v{version}")
            };
            let mut pod = json!({
                "metadata": {
                    "name": format!("{component}-{node}"), "namespace": "kube-system", "uid": format!("uid-{serial}"),
                    "labels": {"component": component, "tier": "control-plane"},
                    "annotations": {"kubernetes.io/config.mirror": "hash"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": format!("node-{node}"), "controller": true}],
                },
                "spec": {"nodeName": node, "containers": [{"name": component, "image": image}]},
                "status": {"phase": "Running"},
            });
            ready_pod(&mut pod);
            s.put("pods", pod);
        }
    }

    /// rollgate's own pod `namespace/name` on `node`, owned by its StatefulSet: evicted,
    /// it comes back under the same name on another schedulable worker.
    pub fn add_own_pod(&self, namespace: &str, name: &str, node: &str) {
        let mut s = self.lock();
        let serial = s.next_serial();
        let mut pod = json!({
            "metadata": {
                "name": name, "namespace": namespace, "uid": format!("uid-{serial}"),
                "labels": {"app.kubernetes.io/name": "rollgate"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "rollgate", "uid": "sts-rollgate", "controller": true}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "rollgate", "image": "rollgate"}], "terminationGracePeriodSeconds": 30},
            "status": {"phase": "Running"},
        });
        ready_pod(&mut pod);
        s.put("pods", pod);
    }

    /// A pod of DaemonSet `kube-system/agent` (made if missing) and a mirror pod on
    /// `node`: a drain leaves both.
    pub fn add_node_agents(&self, node: &str) {
        let mut s = self.lock();
        if s.get("daemonsets", "kube-system", "agent").is_none() {
            s.put(
                "daemonsets",
                json!({
                    "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-agent"},
                    "spec": {"selector": {"matchLabels": {"app": "agent"}},
                             "template": {"metadata": {"labels": {"app": "agent"}},
                                          "spec": {"containers": [{"name": "agent", "image": "agent"}]}}},
                    "status": {},
                }),
            );
        }
        for (kind, owner, name) in [("DaemonSet", "agent", "agent"), ("Node", node, "static")] {
            let serial = s.next_serial();
            let mut pod = json!({
                "metadata": {
                    "name": format!("{name}-{node}"), "namespace": "kube-system", "uid": format!("uid-{serial}"),
                    "labels": {"app": name},
                    "ownerReferences": [{"apiVersion": if kind == "Node" {"v1"} else {"apps/v1"}, "kind": kind, "name": owner, "uid": if kind == "Node" { format!("node-{node}") } else { "ds-agent".to_owned() }, "controller": true}],
                },
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"},
            });
            if kind == "Node" {
                pod["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
            }
            ready_pod(&mut pod);
            s.put("pods", pod);
        }
    }

    /// Puts the container of pod `namespace/name` in CrashLoopBackOff, or takes it out.
    pub fn set_crash_looping(&self, namespace: &str, name: &str, looping: bool) {
        self.lock()
            .edit("pods", namespace, name, |pod| {
                let container = pod["spec"]["containers"][0]["name"].clone();
                let state = if looping {
                    json!({"waiting": {"reason": "CrashLoopBackOff"}})
                } else {
                    json!({"running": {}})
                };
                pod["status"]["containerStatuses"] = json!([{"name": container, "state": state, "ready": !looping, "restartCount": 5}]);
            })
            .expect("pod");
    }

    /// A StatefulSet `name` with `replicas` Ready pods `name-0..` at revision `current`,
    /// whose template has moved on to revision `update`, its rolling update held at
    /// `partition`.
    pub fn add_statefulset(
        &self,
        name: &str,
        replicas: u32,
        partition: u32,
        current: &str,
        update: &str,
    ) {
        let mut s = self.lock();
        s.put(
            "statefulsets",
            json!({
                "metadata": {"name": name, "namespace": "default", "uid": format!("sts-{name}")},
                "spec": {
                    "replicas": replicas,
                    "serviceName": name,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}},
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
                },
                "status": {"replicas": replicas, "currentRevision": current, "updateRevision": update, "observedGeneration": 1},
            }),
        );
        for ordinal in 0..replicas {
            let pod = format!("{name}-{ordinal}");
            let mut p = json!({
                "metadata": {
                    "name": pod, "namespace": "default", "uid": format!("uid-{pod}"),
                    "labels": {"app": name, "controller-revision-hash": current},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": "sts", "controller": true}],
                },
                "spec": {"nodeName": "w1", "containers": [{"name": "etcd", "image": "etcd"}]},
                "status": {"phase": "Running"},
            });
            ready_pod(&mut p);
            s.put("pods", p);
        }
    }

    /// Runs a StatefulSet controller in a thread: like the real one with a RollingUpdate
    /// partition, it replaces one pod at a time — the highest ordinal at or above the
    /// partition not at the update revision — by calling `restart(pod)` (which returns once
    /// the replacement is up), then marks the pod at the update revision and Ready.
    pub fn run_statefulset_controller(&self, restart: impl Fn(&str) + Send + 'static) {
        let state = Arc::downgrade(&self.state);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(20));
                let Some(state) = state.upgrade() else { return };
                let next = {
                    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                    next_pod_to_replace(&mut s)
                };
                let Some(((ns, pod), update)) = next else {
                    continue;
                };
                restart(&pod);
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                s.edit("pods", &ns, &pod, |p| {
                    p["metadata"]["labels"]["controller-revision-hash"] = json!(update);
                    ready_pod(p);
                });
                s.restarting.remove(&(ns, pod));
                s.tick();
            }
        });
    }

    /// Moves the template of StatefulSet `default/name` on to `revision`, as an edit of its
    /// pod template would: a new update revision; the pods stay where the partition holds
    /// them.
    pub fn change_template(&self, name: &str, revision: &str) {
        self.lock()
            .edit("statefulsets", "default", name, |sts| {
                sts["status"]["updateRevision"] = json!(revision);
            })
            .expect("statefulset");
    }

    pub fn statefulset(&self, name: &str) -> Value {
        self.lock()
            .get("statefulsets", "default", name)
            .cloned()
            .expect("statefulset")
    }

    pub fn pod(&self, name: &str) -> Value {
        self.pod_in("default", name)
    }

    /// Pod `namespace/name`, or null when there is none.
    pub fn pod_in(&self, namespace: &str, name: &str) -> Value {
        self.lock()
            .get("pods", namespace, name)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// kured's DaemonSet `kube-system/kured`, its lock annotation holding `lock` (none:
    /// free), as kured leaves it.
    pub fn add_kured(&self, lock: Option<&str>) {
        let mut annotations = serde_json::Map::new();
        if let Some(lock) = lock {
            annotations.insert(KURED_LOCK.into(), json!(lock));
        }
        self.lock().put(
            "daemonsets",
            json!({
                "metadata": {"name": "kured", "namespace": "kube-system", "uid": "ds-kured",
                             "annotations": annotations},
                "spec": {"selector": {"matchLabels": {"name": "kured"}},
                         "template": {"metadata": {"labels": {"name": "kured"}},
                                      "spec": {"containers": [{"name": "kured", "image": "kured"}]}}},
                "status": {},
            }),
        );
    }

    /// kured's lock annotation now, as kured would read it (none: free).
    pub fn kured_lock(&self) -> Option<String> {
        self.lock()
            .get("daemonsets", "kube-system", "kured")
            .and_then(|ds| {
                ds["metadata"]["annotations"][KURED_LOCK]
                    .as_str()
                    .map(str::to_owned)
            })
    }

    /// Sets kured's lock annotation (none: removes it), as a kured pod takes or releases
    /// its lock: an update at a new resourceVersion.
    pub fn set_kured_lock(&self, lock: Option<&str>) {
        let mut s = self.lock();
        let mut ds = s
            .get("daemonsets", "kube-system", "kured")
            .cloned()
            .expect("kured's DaemonSet");
        match lock {
            Some(lock) => ds["metadata"]["annotations"][KURED_LOCK] = json!(lock),
            None => {
                if let Some(a) = ds["metadata"]["annotations"].as_object_mut() {
                    a.remove(KURED_LOCK);
                }
            }
        }
        s.put("daemonsets", ds);
    }

    /// A running pod `app-N` of a Job on `node`: evicted, it is not made again.
    pub fn add_job_pod(&self, node: &str, app: &str) {
        let mut s = self.lock();
        let serial = s.next_serial();
        let mut pod = json!({
            "metadata": {
                "name": format!("{app}-{serial}"), "namespace": "default", "uid": format!("uid-{serial}"),
                "labels": {"app": app},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": app, "uid": "job", "controller": true}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        });
        ready_pod(&mut pod);
        s.put("pods", pod);
    }

    /// Makes pod `namespace/name` ignore SIGTERM with a grace period of `grace_secs`: a
    /// deletion takes the whole grace period.
    pub fn ignore_sigterm(&self, namespace: &str, name: &str, grace_secs: i64) {
        self.lock()
            .edit("pods", namespace, name, |pod| {
                pod["metadata"]["annotations"][state::IGNORES_SIGTERM] = json!("true");
                pod["spec"]["terminationGracePeriodSeconds"] = json!(grace_secs);
            })
            .expect("pod");
    }

    /// Sets the Ready condition of pod `default/name`.
    pub fn set_pod_ready(&self, name: &str, ready: bool) {
        self.lock()
            .edit("pods", "default", name, |pod| state::set_ready(pod, ready))
            .expect("pod");
    }

    /// Sets pod `default/name`'s phase (`Succeeded` when a Job's pod is done).
    pub fn set_pod_phase(&self, name: &str, phase: &str) {
        self.lock()
            .edit("pods", "default", name, |pod| {
                pod["status"]["phase"] = json!(phase)
            })
            .expect("pod");
    }

    /// A budget `default/name` keeping `min_available` pods of app `app`.
    pub fn set_pdb(&self, name: &str, app: &str, min_available: usize) {
        self.add_pdb(
            name,
            json!({"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}),
        );
    }

    /// A budget `default/name` with `spec` as given (`minAvailable` or `maxUnavailable`,
    /// `selector`), replacing one of that name. Its status comes from the disruption
    /// controller.
    pub fn add_pdb(&self, name: &str, spec: Value) {
        let mut s = self.lock();
        let existing = s.get("poddisruptionbudgets", "default", name).cloned();
        let mut pdb = existing.unwrap_or_else(
            || json!({"metadata": {"name": name, "namespace": "default"}, "status": {}}),
        );
        pdb["spec"] = spec;
        s.put("poddisruptionbudgets", pdb);
        s.tick();
    }

    /// How long the disruption controller takes to update a budget's status.
    pub fn set_pdb_lag(&self, lag: Duration) {
        self.lock().pdb_lag = lag;
    }

    /// The lowest `healthy - desiredHealthy` of budget `name` the fake's own count has
    /// seen (negative: the budget was overrun).
    pub fn budget_low(&self, name: &str) -> Option<i64> {
        self.lock().budget_low.get(name).copied()
    }

    /// The Events about the `kind` object `name`, in the order they were created.
    pub fn events_about(&self, kind: &str, name: &str) -> Vec<Value> {
        let s = self.lock();
        let mut events: Vec<Value> = s
            .all("events")
            .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
            .cloned()
            .collect();
        events.sort_by_key(|e| {
            e["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        });
        events
    }

    /// Injects `fault` into the requests it matches (see [`fault::Fault`]).
    pub fn inject(&self, fault: fault::Fault) {
        self.lock().faults.add(fault);
    }

    /// Every request received so far, faulted or not, oldest first.
    pub fn requests(&self) -> Vec<fault::Request> {
        self.lock().faults.log.clone()
    }

    /// Makes creating an Event answer 500 (or stop doing so).
    pub fn fail_events(&self, fail: bool) {
        self.lock().events_fail = fail;
    }

    pub fn node(&self, name: &str) -> Value {
        self.lock().get("nodes", "", name).cloned().expect("node")
    }

    /// Changes node `name` with `change`, as a write through the API would.
    pub fn edit_node(&self, name: &str, change: impl FnOnce(&mut Value)) {
        self.lock().edit("nodes", "", name, change).expect("node");
    }

    /// After each of the next `times` reads of node `name`, another client writes it with
    /// `change`: a concurrent writer between a client's read and its write.
    pub fn write_after_reads_of_node(
        &self,
        name: &str,
        times: usize,
        change: impl FnMut(&mut Value) + Send + 'static,
    ) {
        self.lock().after_read.push(state::AfterRead {
            resource: "nodes",
            name: name.to_owned(),
            remaining: times,
            change: Box::new(change),
        });
    }

    pub fn namespace(&self, name: &str) -> Value {
        self.lock()
            .get("namespaces", "", name)
            .cloned()
            .expect("namespace")
    }

    pub fn pods_on(&self, node: &str) -> Vec<Value> {
        self.lock().pods_on(node).into_iter().cloned().collect()
    }

    /// Every change with when the fake made it.
    pub fn changes_timed(&self) -> Vec<(std::time::Instant, Change)> {
        self.lock().changes.clone()
    }

    pub fn changes(&self) -> Vec<Change> {
        self.lock().changes.iter().map(|(_, c)| c.clone()).collect()
    }

    /// What `GET /version` reports from now on.
    pub fn set_server_version(&self, version: &str) {
        self.lock().server_version = Some(version.to_owned());
    }

    /// Every access made so far.
    pub fn access(&self) -> std::collections::BTreeSet<Access> {
        self.lock().access.clone()
    }

    /// Requests by kind (`list nodes`, `patch node` …), and refusals by kind and code
    /// (`patch node 409`).
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.lock().calls.clone()
    }

    /// Compacts the history: watches and continue tokens from before now get 410 Gone.
    pub fn compact(&self) {
        self.lock().compact();
    }

    /// Ends every open watch with a 410 Gone ERROR event and compacts the history, as an
    /// API server does when its watch cache is re-initialised: clients must list again.
    pub fn expire_watches(&self) {
        let mut s = self.lock();
        s.compact();
        s.watch_epoch += 1;
    }

    /// After the next `pages` pages of a list of `resource`, other writes go on and the
    /// history is compacted: the list's continue token expires (410 Gone).
    pub fn expire_list_after(&self, resource: &'static str, pages: usize) {
        self.lock().compact_after_pages.insert(resource, pages);
    }

    /// How many watches of `resource` (a plural: `statefulsets`) are open now.
    pub fn open_watches(&self, resource: &str) -> usize {
        self.lock()
            .open_watches
            .iter()
            .filter(|(r, _)| **r == resource)
            .map(|(_, n)| *n)
            .sum()
    }

    /// How often a watch that asked for them gets a BOOKMARK.
    pub fn set_bookmark_every(&self, every: Duration) {
        self.lock().bookmark_every = every;
    }

    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}

/// A self-signed certificate for 127.0.0.1 and localhost, and the TLS configuration that
/// presents it.
fn tls_config() -> (rustls::ServerConfig, String) {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("certificate");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("TLS configuration");
    (config, cert.pem())
}

/// The pod a StatefulSet controller replaces next, marked as being replaced: none while
/// one is (one at a time), else the highest ordinal at or above the partition that is not
/// at the update revision.
fn next_pod_to_replace(s: &mut State) -> Option<((String, String), String)> {
    if !s.restarting.is_empty() {
        return None;
    }
    let sets: Vec<Value> = s.all("statefulsets").cloned().collect();
    for sts in sets {
        let (ns, name) = state::ns_name(&sts);
        let replicas = sts["spec"]["replicas"].as_u64().unwrap_or(0);
        let partition = sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"]
            .as_u64()
            .unwrap_or(0);
        let update = sts["status"]["updateRevision"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        for ordinal in (partition..replicas).rev() {
            let pod = format!("{name}-{ordinal}");
            let behind = s.get("pods", &ns, &pod).is_some_and(|p| {
                p["metadata"]["labels"]["controller-revision-hash"].as_str()
                    != Some(update.as_str())
            });
            if behind {
                s.edit("pods", &ns, &pod, |p| state::set_ready(p, false));
                s.restarting.insert((ns.clone(), pod.clone()));
                return Some(((ns, pod), update));
            }
        }
    }
    None
}
