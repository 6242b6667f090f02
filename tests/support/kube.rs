//! A fake Kubernetes API server: the one fake the tests allow, because no API server can
//! be installed here. It behaves like the real one for what rollgate uses: nodes (get,
//! list, merge and strategic-merge patch, status patch), pods (get, list with the
//! `spec.nodeName` field selector, merge patch), the Eviction subresource with PodDisruptionBudget
//! refusals (429, or 500 when several budgets match), namespaces with annotations, 409 on a
//! stale resourceVersion, bearer-token auth, and Kubernetes `Status` error bodies.
//!
//! It also serves, as Prometheus targets, what a real cluster's exporters would say about
//! it: `/metrics` the API servers' `kubernetes_build_info` (one series per control plane,
//! from its kube-apiserver mirror pod's image), `/metrics/kubelet` every kubelet's, and
//! `/metrics/kube-state` kube-state-metrics' node conditions, unschedulable flags and
//! container waiting reasons, with node-exporter's boot times.
//!
//! Evicted pods terminate after `terminate_after`; pods owned by a ReplicaSet come back
//! under a new name on a schedulable node and turn Ready after `ready_after`, as a
//! Deployment's would. Time-driven changes are applied lazily on every request.

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One recorded API call that changed something, for assertions and benchmarks.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Cordon(String),
    Uncordon(String),
    Evicted { node: String, pod: String },
    Refused { node: String, pod: String },
    KubeletVersion { node: String, version: String },
}

/// A PodDisruptionBudget: `min_available` of the pods matching `selector` must stay Ready.
#[derive(Debug, Clone)]
pub struct Pdb {
    pub namespace: String,
    pub name: String,
    pub selector: BTreeMap<String, String>,
    pub min_available: usize,
}

#[derive(Debug, Default)]
struct PodTimers {
    delete_at: Option<Instant>,
    ready_at: Option<Instant>,
}

pub struct State {
    rv: u64,
    /// What `GET /version` reports: the first control plane's kubelet unless set.
    pub server_version: Option<String>,
    pub nodes: BTreeMap<String, Value>,
    pods: BTreeMap<(String, String), Value>,
    timers: BTreeMap<(String, String), PodTimers>,
    pub namespaces: BTreeMap<String, Value>,
    pub statefulsets: BTreeMap<(String, String), Value>,
    /// Pods the StatefulSet controller is restarting now.
    restarting: std::collections::BTreeSet<(String, String)>,
    pub pdbs: Vec<Pdb>,
    pub changes: Vec<(Instant, Change)>,
    /// Requests by method and path pattern.
    pub calls: BTreeMap<String, u64>,
    /// Every (API group, resource, verb) a client used, as RBAC names them.
    pub access: std::collections::BTreeSet<Access>,
    pub terminate_after: Duration,
    pub ready_after: Duration,
    serial: u64,
    /// What node-exporter reports as every node's boot time (seconds since the epoch).
    pub booted_at: i64,
    /// Events created (events.k8s.io/v1), in order.
    pub events: Vec<Value>,
    /// When set, creating an Event answers 500.
    pub events_fail: bool,
}

fn status(code: u16, reason: &str, message: &str) -> HttpResponse {
    HttpResponse::build(actix_web::http::StatusCode::from_u16(code).expect("code")).json(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    }))
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            let obj = target.as_object_mut().expect("object");
            for (k, v) in fields {
                if v.is_null() {
                    obj.remove(k);
                } else {
                    merge(obj.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

fn labels_match(selector: &BTreeMap<String, String>, pod: &Value) -> bool {
    selector
        .iter()
        .all(|(k, v)| pod["metadata"]["labels"][k].as_str() == Some(v.as_str()))
}

/// A budget as the API server shows it, its status computed as the disruption controller
/// would: the pods it covers, how many are Ready, how many may go.
fn budget_object(s: &State, pdb: &Pdb) -> Value {
    let covered: Vec<&Value> = s
        .pods
        .iter()
        .filter(|((ns, _), pod)| *ns == pdb.namespace && labels_match(&pdb.selector, pod))
        .map(|(_, pod)| pod)
        .collect();
    let healthy = covered.iter().filter(|p| pod_ready(p)).count();
    let allowed = healthy.saturating_sub(pdb.min_available);
    json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": pdb.name, "namespace": pdb.namespace},
        "spec": {"minAvailable": pdb.min_available, "selector": {"matchLabels": pdb.selector}},
        "status": {
            "currentHealthy": healthy, "desiredHealthy": pdb.min_available,
            "expectedPods": covered.len(), "disruptionsAllowed": allowed,
        },
    })
}

fn pod_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn set_ready(pod: &mut Value, ready: bool) {
    pod["status"]["conditions"] =
        json!([{"type": "Ready", "status": if ready {"True"} else {"False"}}]);
}

impl State {
    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// Applies what time has done: terminated pods go, replacements come and turn Ready.
    fn tick(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, String)> = self
            .timers
            .iter()
            .filter(|(_, t)| t.delete_at.is_some_and(|d| d <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.timers.remove(&key);
            if let Some(pod) = self.pods.remove(&key) {
                let owned_by_controller = pod["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| {
                        o.iter()
                            .any(|r| r["kind"] == "ReplicaSet" || r["kind"] == "StatefulSet")
                    });
                if owned_by_controller {
                    self.replace(&pod);
                }
            }
        }
        let ready: Vec<(String, String)> = self
            .timers
            .iter()
            .filter(|(_, t)| t.ready_at.is_some_and(|r| r <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in ready {
            if let Some(t) = self.timers.get_mut(&key) {
                t.ready_at = None;
            }
            if let Some(pod) = self.pods.get_mut(&key) {
                set_ready(pod, true);
            }
        }
    }

    /// A new pod in place of `old`, on the schedulable Ready worker with the fewest pods
    /// (control planes are tainted); a StatefulSet's pod keeps its name.
    fn replace(&mut self, old: &Value) {
        let from = old["spec"]["nodeName"].as_str().unwrap_or("").to_owned();
        let mut best: Option<(usize, String)> = None;
        for (name, node) in &self.nodes {
            let schedulable = node["spec"]["unschedulable"] != json!(true);
            let ready = node["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let control_plane =
                !node["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_null();
            if !schedulable || !ready || control_plane || *name == from {
                continue;
            }
            let count = self
                .pods
                .values()
                .filter(|p| p["spec"]["nodeName"] == json!(name))
                .count();
            if best.as_ref().is_none_or(|(c, _)| count < *c) {
                best = Some((count, name.clone()));
            }
        }
        self.serial += 1;
        let ns = old["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let base = old["metadata"]["generateName"]
            .as_str()
            .unwrap_or("pod-")
            .to_owned();
        let stateful = old["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|o| o.iter().any(|r| r["kind"] == "StatefulSet"));
        let name = if stateful {
            old["metadata"]["name"].as_str().unwrap_or("").to_owned()
        } else {
            format!("{base}{}", self.serial)
        };
        let mut pod = old.clone();
        pod["metadata"]["name"] = json!(name);
        pod["metadata"]["uid"] = json!(format!("uid-{}", self.serial));
        pod["metadata"]
            .as_object_mut()
            .expect("meta")
            .remove("deletionTimestamp");
        pod["metadata"]["resourceVersion"] = json!(self.bump());
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
                pod["spec"]
                    .as_object_mut()
                    .expect("spec")
                    .remove("nodeName");
                pod["status"]["phase"] = json!("Pending");
            }
        }
        self.pods.insert((ns, name), pod);
    }

    fn count(&mut self, key: &str) {
        *self.calls.entry(key.to_owned()).or_default() += 1;
    }

    fn pods_on(&self, node: &str) -> Vec<&Value> {
        self.pods
            .values()
            .filter(|p| p["spec"]["nodeName"].as_str() == Some(node))
            .collect()
    }
}

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

impl Access {
    /// The access a request makes, as the real API server's RBAC authorizer derives it.
    pub fn of(method: &str, path: &str, query: &str) -> Option<Self> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", "v1", rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => return None,
        };
        // namespaces/NS/RESOURCE/NAME/SUB, or RESOURCE/NAME/SUB.
        let rest = match rest {
            ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
            other => other,
        };
        let (resource, name, sub) = match rest {
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(*name), None),
            [resource, name, sub] => (*resource, Some(*name), Some(*sub)),
            _ => return None,
        };
        let verb = match (method, name, sub) {
            ("GET", None, _) if query.contains("watch=true") || query.contains("watch=1") => {
                "watch"
            }
            ("GET", None, _) => "list",
            ("GET", Some(_), _) => "get",
            ("POST", _, _) => "create",
            ("PUT", _, _) => "update",
            ("PATCH", _, _) => "patch",
            ("DELETE", None, _) => "deletecollection",
            ("DELETE", Some(_), _) => "delete",
            _ => return None,
        };
        Some(Self {
            group: group.to_owned(),
            resource: match sub {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            },
            verb: verb.to_owned(),
            name: name.map(str::to_owned),
        })
    }
}

/// The running fake API server.
#[derive(Clone)]
pub struct FakeKube {
    pub port: u16,
    pub token: String,
    pub state: Arc<Mutex<State>>,
    handle: actix_web::dev::ServerHandle,
}

type Shared = web::Data<(Arc<Mutex<State>>, String)>;

fn authorized(req: &HttpRequest, token: &str) -> bool {
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {token}"))
}

fn list(kind: &str, rv: u64, items: Vec<Value>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "kind": kind, "apiVersion": "v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    }))
}

/// Applies a merge patch to `object`; the error answer when it cannot.
fn patch_object(
    object: &mut Value,
    req: &HttpRequest,
    body: &[u8],
    rv: String,
) -> Option<HttpResponse> {
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !matches!(
        content_type,
        "application/merge-patch+json" | "application/strategic-merge-patch+json"
    ) {
        return Some(status(
            415,
            "UnsupportedMediaType",
            &format!("the fake API server takes merge patches only, not {content_type:?}"),
        ));
    }
    let mut patch: Value = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => return Some(status(400, "BadRequest", &format!("invalid patch: {e}"))),
    };
    let wanted = patch["metadata"]["resourceVersion"].as_str();
    if wanted.is_some() && wanted != object["metadata"]["resourceVersion"].as_str() {
        return Some(status(
            409,
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    if let Some(meta) = patch.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    merge(object, &patch);
    object["metadata"]["resourceVersion"] = json!(rv);
    None
}

/// The Prometheus text of the exporter at `/metrics/<path>` (see the module doc).
fn exposition(s: &State, path: &[&str]) -> Option<String> {
    let mut out = String::new();
    let mut line = |metric: &str, labels: &[(&str, &str)], value: f64| {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        out.push_str(&format!("{metric}{{{}}} {value}\n", labels.join(",")));
    };
    match path {
        [] => {
            for ((ns, name), pod) in &s.pods {
                let Some(node) = name.strip_prefix("kube-apiserver-") else {
                    continue;
                };
                let image = pod["spec"]["containers"][0]["image"].as_str().unwrap_or("");
                let version = image.rsplit_once(':').map_or("", |(_, v)| v);
                if ns == "kube-system" {
                    line(
                        "kubernetes_build_info",
                        &[("git_version", version), ("node", node)],
                        1.0,
                    );
                }
            }
        }
        ["kubelet"] => {
            for (name, node) in &s.nodes {
                let version = node["status"]["nodeInfo"]["kubeletVersion"]
                    .as_str()
                    .unwrap_or("");
                line(
                    "kubernetes_build_info",
                    &[("git_version", version), ("node", name)],
                    1.0,
                );
            }
        }
        ["kube-state"] => {
            for (name, node) in &s.nodes {
                let ready = node["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready")
                    .and_then(|c| c["status"].as_str())
                    .unwrap_or("Unknown")
                    .to_lowercase();
                for status in ["true", "false", "unknown"] {
                    let value = f64::from(u8::from(ready == status));
                    line(
                        "kube_node_status_condition",
                        &[("node", name), ("condition", "Ready"), ("status", status)],
                        value,
                    );
                }
                let cordoned = node["spec"]["unschedulable"] == json!(true);
                line(
                    "kube_node_spec_unschedulable",
                    &[("node", name)],
                    f64::from(u8::from(cordoned)),
                );
                line(
                    "node_boot_time_seconds",
                    &[("node", name)],
                    s.booted_at as f64,
                );
            }
            for ((ns, name), pod) in &s.pods {
                for c in pod["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    if let Some(reason) = c["state"]["waiting"]["reason"].as_str() {
                        let container = c["name"].as_str().unwrap_or("");
                        line(
                            "kube_pod_container_status_waiting_reason",
                            &[
                                ("namespace", ns),
                                ("pod", name),
                                ("container", container),
                                ("reason", reason),
                            ],
                            1.0,
                        );
                    }
                }
            }
        }
        _ => return None,
    }
    Some(out)
}

/// A watch of the StatefulSet `key` from resourceVersion `from` (0: from now, with an
/// ADDED event for it as it is), one JSON event per line, until `until`: MODIFIED each
/// time its resourceVersion moves on, DELETED when it goes.
fn watch_events(
    state: std::sync::Weak<Mutex<State>>,
    key: (String, String),
    from: u64,
    until: Instant,
) -> impl futures_util::Stream<Item = Result<web::Bytes, actix_web::Error>> {
    let seen = (from > 0).then_some(from);
    futures_util::stream::unfold((state, seen), move |(state, seen)| {
        let key = key.clone();
        async move {
            loop {
                if Instant::now() >= until {
                    return None;
                }
                let event = {
                    let s = state.upgrade()?;
                    let s = s.lock().unwrap();
                    match s.statefulsets.get(&key) {
                        None if seen.is_some() => Some((
                            "DELETED",
                            json!({"metadata": {"name": key.1, "namespace": key.0}}),
                            u64::MAX,
                        )),
                        None => None,
                        Some(sts) => {
                            let rv = sts["metadata"]["resourceVersion"]
                                .as_str()
                                .and_then(|v| v.parse::<u64>().ok())
                                .unwrap_or(0);
                            match seen {
                                None => Some(("ADDED", sts.clone(), rv)),
                                Some(last) if rv > last => Some(("MODIFIED", sts.clone(), rv)),
                                Some(_) => None,
                            }
                        }
                    }
                };
                if let Some((kind, object, rv)) = event {
                    let line = format!("{}\n", json!({"type": kind, "object": object}));
                    return Some((Ok(web::Bytes::from(line)), (state, Some(rv))));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    })
}

async fn handle(req: HttpRequest, body: web::Bytes, shared: Shared) -> HttpResponse {
    let (state, token) = (&shared.0, &shared.1);
    if !authorized(&req, token) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let mut s = state.lock().expect("state");
    s.tick();
    let method = req.method().as_str().to_owned();
    let path = req.path().to_owned();
    if let Some(access) = Access::of(&method, &path, req.query_string()) {
        s.access.insert(access);
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let query = web::Query::<BTreeMap<String, String>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or_default();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["metrics", rest @ ..]) => match exposition(&s, rest) {
            Some(text) => HttpResponse::Ok()
                .content_type("text/plain; version=0.0.4")
                .body(text),
            None => status(404, "NotFound", "the page cannot be found"),
        },
        ("GET", ["version"]) => {
            let git = s.server_version.clone().unwrap_or_default();
            let (major, minor) = {
                let mut it = git.split('.');
                (
                    it.next().unwrap_or("").to_owned(),
                    it.next().unwrap_or("").to_owned(),
                )
            };
            HttpResponse::Ok().json(json!({
                "major": major, "minor": minor, "gitVersion": format!("v{git}"),
                "gitCommit": "0", "gitTreeState": "clean", "buildDate": "2026-11-01T00:00:00Z",
                "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64",
            }))
        }
        ("GET", ["api", "v1", "nodes"]) => {
            s.count("list nodes");
            let items = s.nodes.values().cloned().collect();
            list("NodeList", s.rv, items)
        }
        ("GET", ["api", "v1", "nodes", name]) => {
            s.count("get node");
            match s.nodes.get(*name) {
                Some(n) => HttpResponse::Ok().json(n),
                None => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
            }
        }
        ("PATCH", ["api", "v1", "nodes", name, rest @ ..])
            if rest.is_empty() || rest == ["status"] =>
        {
            s.count("patch node");
            let rv = s.bump();
            let Some(mut node) = s.nodes.get(*name).cloned() else {
                return status(404, "NotFound", &format!("nodes \"{name}\" not found"));
            };
            let before = node["spec"]["unschedulable"] == json!(true);
            let kubelet_before = node["status"]["nodeInfo"]["kubeletVersion"].clone();
            if let Some(refused) = patch_object(&mut node, &req, &body, rv) {
                return refused;
            }
            let after = node["spec"]["unschedulable"] == json!(true);
            let now = Instant::now();
            if !before && after {
                s.changes.push((now, Change::Cordon(name.to_string())));
            } else if before && !after {
                s.changes.push((now, Change::Uncordon(name.to_string())));
            }
            let kubelet = &node["status"]["nodeInfo"]["kubeletVersion"];
            if *kubelet != kubelet_before {
                s.changes.push((
                    now,
                    Change::KubeletVersion {
                        node: name.to_string(),
                        version: kubelet.as_str().unwrap_or("").to_owned(),
                    },
                ));
            }
            s.nodes.insert(name.to_string(), node.clone());
            HttpResponse::Ok().json(node)
        }
        ("GET", ["apis", "policy", "v1", "poddisruptionbudgets"]) => {
            s.count("list poddisruptionbudgets");
            let items = s.pdbs.iter().map(|pdb| budget_object(&s, pdb)).collect();
            list("PodDisruptionBudgetList", s.rv, items)
        }
        ("GET", ["api", "v1", "pods"]) => {
            s.count("list pods");
            let selector = query.get("fieldSelector").cloned().unwrap_or_default();
            let node = match selector.as_str() {
                "" => None,
                sel => match sel.strip_prefix("spec.nodeName=") {
                    Some(n) => Some(n.to_owned()),
                    None => {
                        return status(
                            400,
                            "BadRequest",
                            &format!("field label not supported: {sel}"),
                        );
                    }
                },
            };
            let items = s
                .pods
                .values()
                .filter(|p| {
                    node.as_deref()
                        .is_none_or(|n| p["spec"]["nodeName"] == json!(n))
                })
                .cloned()
                .collect();
            list("PodList", s.rv, items)
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            s.count("get pod");
            match s.pods.get(&(ns.to_string(), name.to_string())) {
                Some(p) => HttpResponse::Ok().json(p),
                None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
            }
        }
        ("PATCH", ["api", "v1", "namespaces", ns, "pods", name]) => {
            s.count("patch pod");
            let rv = s.bump();
            let key = (ns.to_string(), name.to_string());
            let Some(mut pod) = s.pods.get(&key).cloned() else {
                return status(404, "NotFound", &format!("pods \"{name}\" not found"));
            };
            if let Some(refused) = patch_object(&mut pod, &req, &body, rv) {
                return refused;
            }
            s.pods.insert(key, pod.clone());
            HttpResponse::Ok().json(pod)
        }
        ("POST", ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            s.count("create event");
            if s.events_fail {
                return status(500, "InternalError", "etcdserver: request timed out");
            }
            create_event(&mut s, ns, &body)
        }
        ("POST", ["api", "v1", "namespaces", ns, "pods", name, "eviction"]) => {
            s.count("evict pod");
            evict(&mut s, ns, name)
        }
        ("GET", ["api", "v1", "namespaces", name]) => {
            s.count("get namespace");
            match s.namespaces.get(*name) {
                Some(n) => HttpResponse::Ok().json(n),
                None => status(404, "NotFound", &format!("namespaces \"{name}\" not found")),
            }
        }
        ("PATCH", ["api", "v1", "namespaces", name]) => {
            s.count("patch namespace");
            let rv = s.bump();
            let Some(mut ns) = s.namespaces.get(*name).cloned() else {
                return status(404, "NotFound", &format!("namespaces \"{name}\" not found"));
            };
            if let Some(refused) = patch_object(&mut ns, &req, &body, rv) {
                return refused;
            }
            s.namespaces.insert(name.to_string(), ns.clone());
            HttpResponse::Ok().json(ns)
        }
        ("GET", ["apis", "apps", "v1", "namespaces", ns, "statefulsets"])
            if query.get("watch").is_some_and(|w| w == "true" || w == "1") =>
        {
            s.count("watch statefulsets");
            let Some(name) = query
                .get("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
            else {
                return status(
                    400,
                    "BadRequest",
                    "this fake watches one StatefulSet by metadata.name",
                );
            };
            let from = query
                .get("resourceVersion")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            let timeout = query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(1800);
            let events = watch_events(
                Arc::downgrade(state),
                (ns.to_string(), name.to_owned()),
                from,
                Instant::now() + Duration::from_secs(timeout),
            );
            HttpResponse::Ok()
                .content_type("application/json")
                .streaming(events)
        }
        ("GET", ["apis", "apps", "v1", "namespaces", ns, "statefulsets", name]) => {
            s.count("get statefulset");
            match s.statefulsets.get(&(ns.to_string(), name.to_string())) {
                Some(o) => HttpResponse::Ok().json(o),
                None => status(
                    404,
                    "NotFound",
                    &format!("statefulsets.apps \"{name}\" not found"),
                ),
            }
        }
        ("PATCH", ["apis", "apps", "v1", "namespaces", ns, "statefulsets", name]) => {
            s.count("patch statefulset");
            let rv = s.bump();
            let key = (ns.to_string(), name.to_string());
            let Some(mut sts) = s.statefulsets.get(&key).cloned() else {
                return status(
                    404,
                    "NotFound",
                    &format!("statefulsets.apps \"{name}\" not found"),
                );
            };
            if let Some(refused) = patch_object(&mut sts, &req, &body, rv) {
                return refused;
            }
            s.statefulsets.insert(key, sts.clone());
            HttpResponse::Ok().json(sts)
        }
        _ => status(
            404,
            "NotFound",
            &format!("the fake API server has no {method} {path}"),
        ),
    }
}

/// Creates an events.k8s.io/v1 Event, refusing what the real API server's validation
/// refuses for the fields rollgate sets.
fn create_event(s: &mut State, ns: &str, body: &[u8]) -> HttpResponse {
    let Ok(mut event) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    let invalid = |why: &str| status(422, "Invalid", &format!("Event is invalid: {why}"));
    let text = |field: &str| event[field].as_str().unwrap_or_default().to_owned();
    if event["metadata"]["namespace"]
        .as_str()
        .is_some_and(|n| n != ns)
    {
        return invalid("metadata.namespace: does not match the namespace of the request");
    }
    let name = event["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if name.is_empty() {
        return invalid("metadata.name: Required value");
    }
    for field in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if text(field).is_empty() {
            return invalid(&format!("{field}: Required value"));
        }
    }
    if !["Normal", "Warning"].contains(&text("type").as_str()) {
        return invalid("type: Unsupported value");
    }
    if text("note").len() > 1024 {
        return invalid("note: Too long: must have at most 1024 bytes");
    }
    if event["regarding"]["kind"].as_str().is_none()
        || event["regarding"]["name"].as_str().is_none()
    {
        return invalid("regarding: Required value");
    }
    if s.events
        .iter()
        .any(|e| e["metadata"]["name"] == json!(name) && e["metadata"]["namespace"] == json!(ns))
    {
        return status(
            409,
            "AlreadyExists",
            &format!("events.events.k8s.io \"{name}\" already exists"),
        );
    }
    let rv = s.bump();
    event["metadata"]["namespace"] = json!(ns);
    event["metadata"]["resourceVersion"] = json!(rv);
    s.events.push(event.clone());
    HttpResponse::Created().json(event)
}

fn evict(s: &mut State, ns: &str, name: &str) -> HttpResponse {
    let key = (ns.to_owned(), name.to_owned());
    let Some(pod) = s.pods.get(&key).cloned() else {
        return status(404, "NotFound", &format!("pods \"{name}\" not found"));
    };
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_owned();
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return HttpResponse::Created()
            .json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}));
    }
    let budgets: Vec<Pdb> = s
        .pdbs
        .iter()
        .filter(|b| b.namespace == ns && labels_match(&b.selector, &pod))
        .cloned()
        .collect();
    if budgets.len() > 1 {
        return status(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        );
    }
    if let Some(budget) = budgets.first() {
        let healthy = s
            .pods
            .values()
            .filter(|p| p["metadata"]["namespace"] == json!(ns))
            .filter(|p| labels_match(&budget.selector, p) && pod_ready(p))
            .count();
        // The pod itself counts only if it is healthy now.
        let after = healthy.saturating_sub(usize::from(pod_ready(&pod)));
        if after < budget.min_available {
            s.changes.push((
                Instant::now(),
                Change::Refused {
                    node,
                    pod: name.to_owned(),
                },
            ));
            return HttpResponse::TooManyRequests().json(json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                "reason": "TooManyRequests", "code": 429,
                "details": {"causes": [{
                    "reason": "DisruptionBudget",
                    "message": format!(
                        "The disruption budget {} needs {} healthy pods and has {} currently",
                        budget.name, budget.min_available, healthy
                    ),
                }]},
            }));
        }
    }
    let rv = s.bump();
    let terminate_after = s.terminate_after;
    if let Some(p) = s.pods.get_mut(&key) {
        p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        p["metadata"]["resourceVersion"] = json!(rv);
        set_ready(p, false);
    }
    s.timers.insert(
        key,
        PodTimers {
            delete_at: Some(Instant::now() + terminate_after),
            ready_at: None,
        },
    );
    s.changes.push((
        Instant::now(),
        Change::Evicted {
            node,
            pod: name.to_owned(),
        },
    ));
    HttpResponse::Created()
        .json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}))
}

/// The pod a StatefulSet controller replaces next, marked as being replaced: none while
/// one is (one at a time), else the highest ordinal at or above the partition that is not
/// at the update revision.
/// As the StatefulSet controller does: once every pod runs the update revision, it is
/// the current revision too.
fn settle_current_revision(s: &mut State) {
    let keys: Vec<(String, String)> = s.statefulsets.keys().cloned().collect();
    for (ns, name) in keys {
        let sts = &s.statefulsets[&(ns.clone(), name.clone())];
        let replicas = sts["spec"]["replicas"].as_u64().unwrap_or(0);
        let update = sts["status"]["updateRevision"].clone();
        if sts["status"]["currentRevision"] == update {
            continue;
        }
        let all = (0..replicas).all(|o| {
            s.pods
                .get(&(ns.clone(), format!("{name}-{o}")))
                .is_some_and(|p| p["metadata"]["labels"]["controller-revision-hash"] == update)
        });
        if all {
            let rv = s.bump();
            let sts = s.statefulsets.get_mut(&(ns, name)).expect("statefulset");
            sts["status"]["currentRevision"] = update;
            sts["metadata"]["resourceVersion"] = json!(rv);
        }
    }
}

fn next_pod_to_replace(s: &mut State) -> Option<((String, String), String)> {
    if !s.restarting.is_empty() {
        return None;
    }
    for ((ns, name), sts) in &s.statefulsets {
        let replicas = sts["spec"]["replicas"].as_u64().unwrap_or(0);
        let partition = sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"]
            .as_u64()
            .unwrap_or(0);
        let update = sts["status"]["updateRevision"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        for ordinal in (partition..replicas).rev() {
            let key = (ns.clone(), format!("{name}-{ordinal}"));
            let behind = s.pods.get(&key).is_some_and(|p| {
                p["metadata"]["labels"]["controller-revision-hash"].as_str()
                    != Some(update.as_str())
            });
            if behind {
                if let Some(pod) = s.pods.get_mut(&key) {
                    set_ready(pod, false);
                }
                s.restarting.insert(key.clone());
                return Some((key, update));
            }
        }
    }
    None
}

impl FakeKube {
    pub async fn start() -> Self {
        let token = format!("fake-token-{}", std::process::id());
        let state = Arc::new(Mutex::new(State {
            rv: 1,
            nodes: BTreeMap::new(),
            pods: BTreeMap::new(),
            timers: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            statefulsets: BTreeMap::new(),
            restarting: std::collections::BTreeSet::new(),
            pdbs: Vec::new(),
            changes: Vec::new(),
            calls: BTreeMap::new(),
            access: Default::default(),
            server_version: None,
            terminate_after: Duration::from_millis(100),
            ready_after: Duration::from_millis(100),
            serial: 0,
            booted_at: chrono::Utc::now().timestamp() - 86_400,
            events: Vec::new(),
            events_fail: false,
        }));
        let shared = web::Data::new((state.clone(), token.clone()));
        let server = HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
                .app_data(web::PayloadConfig::new(1 << 20))
                .default_service(web::to(handle))
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind fake API server");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        let fake = Self {
            port,
            token,
            state,
            handle,
        };
        // Answering means the workers run on their own threads: from here on, blocking
        // callers (a script under `Command::output`) are served too.
        let http = reqwest::Client::new();
        super::eventually(
            "the fake API server to answer",
            Duration::from_secs(10),
            || async { http.get(fake.url()).send().await.ok().map(drop) },
        )
        .await;
        fake
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A kubeconfig file for this server.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: rollgate\n  user:\n    token: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: rollgate\ncurrent-context: fake\n",
            self.url(),
            self.token
        );
        std::fs::write(path, text).expect("kubeconfig");
    }

    pub fn add_node(&self, name: &str, control_plane: bool, kubelet: &str, containerd: &str) {
        let mut s = self.state.lock().unwrap();
        let rv = s.bump();
        let mut labels = json!({"kubernetes.io/hostname": name});
        if control_plane {
            labels["node-role.kubernetes.io/control-plane"] = json!("");
            s.server_version.get_or_insert_with(|| kubelet.to_owned());
        }
        s.nodes.insert(
            name.into(),
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": format!("node-{name}"), "resourceVersion": rv, "labels": labels},
                "spec": {},
                "status": {
                    "conditions": [{"type": "Ready", "status": "True"}],
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "nodeInfo": {
                        "kubeletVersion": format!("v{kubelet}"),
                        "containerRuntimeVersion": format!("containerd://{containerd}"),
                        "architecture": "amd64", "bootID": "", "kernelVersion": "", "kubeProxyVersion": "",
                        "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": "",
                    },
                },
            }),
        );
    }

    pub fn add_namespace(&self, name: &str) {
        let mut s = self.state.lock().unwrap();
        let rv = s.bump();
        s.namespaces.insert(
            name.into(),
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": name, "uid": format!("ns-{name}"), "resourceVersion": rv}}),
        );
    }

    /// `count` Ready pods of app `app` (owned by a ReplicaSet) on `node`.
    pub fn add_pods(&self, node: &str, app: &str, count: usize, empty_dir: bool) {
        let mut s = self.state.lock().unwrap();
        for _ in 0..count {
            s.serial += 1;
            let name = format!("{app}-{}", s.serial);
            let rv = s.bump();
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": "default", "uid": format!("uid-{}", s.serial),
                    "generateName": format!("{app}-"), "resourceVersion": rv,
                    "labels": {"app": app},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{app}-rs"), "uid": "rs", "controller": true}],
                },
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"},
            });
            if empty_dir {
                pod["spec"]["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
            }
            set_ready(&mut pod, true);
            s.pods.insert(("default".into(), name), pod);
        }
    }

    /// The mirror pods of kubeadm's static control-plane pods on `node` at `version`
    /// (kube-apiserver, kube-controller-manager, kube-scheduler, and etcd when `etcd`), as
    /// the kubelet registers them: labelled by `component`, Ready.
    pub fn add_static_pods(&self, node: &str, version: &str, etcd: bool) {
        let mut s = self.state.lock().unwrap();
        let components = [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ];
        for component in components.iter().chain(etcd.then_some(&"etcd")) {
            s.serial += 1;
            let rv = s.bump();
            let image = if *component == "etcd" {
                "registry.k8s.io/etcd:3.5.21-0".to_owned()
            } else {
                format!("registry.k8s.io/{component}:v{version}")
            };
            let name = format!("{component}-{node}");
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": "kube-system", "uid": format!("uid-{}", s.serial),
                    "resourceVersion": rv,
                    "labels": {"component": component, "tier": "control-plane"},
                    "annotations": {"kubernetes.io/config.mirror": "hash"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": format!("node-{node}"), "controller": true}],
                },
                "spec": {"nodeName": node, "containers": [{"name": component, "image": image}]},
                "status": {"phase": "Running"},
            });
            set_ready(&mut pod, true);
            s.pods.insert(("kube-system".into(), name), pod);
        }
    }

    /// rollgate's own pod `namespace/name` on `node`, owned by its StatefulSet: evicted,
    /// it comes back under the same name on another schedulable worker.
    pub fn add_own_pod(&self, namespace: &str, name: &str, node: &str) {
        let mut s = self.state.lock().unwrap();
        s.serial += 1;
        let rv = s.bump();
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "uid": format!("uid-{}", s.serial),
                "resourceVersion": rv, "labels": {"app.kubernetes.io/name": "rollgate"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "rollgate", "uid": "sts-rollgate", "controller": true}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "rollgate", "image": "rollgate"}]},
            "status": {"phase": "Running"},
        });
        set_ready(&mut pod, true);
        s.pods.insert((namespace.into(), name.into()), pod);
    }

    /// A DaemonSet pod and a mirror pod on `node`: a drain leaves both.
    pub fn add_node_agents(&self, node: &str) {
        let mut s = self.state.lock().unwrap();
        for (kind, name) in [("DaemonSet", "agent"), ("Node", "static")] {
            s.serial += 1;
            let name = format!("{name}-{node}");
            let rv = s.bump();
            let mut pod = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": "kube-system", "uid": format!("uid-{}", s.serial),
                    "resourceVersion": rv,
                    "ownerReferences": [{"apiVersion": "v1", "kind": kind, "name": "owner", "uid": "o", "controller": true}],
                },
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"},
            });
            if kind == "Node" {
                pod["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
            }
            set_ready(&mut pod, true);
            s.pods.insert(("kube-system".into(), name), pod);
        }
    }

    /// Puts the container of pod `namespace/name` in CrashLoopBackOff, or takes it out.
    pub fn set_crash_looping(&self, namespace: &str, name: &str, looping: bool) {
        let mut s = self.state.lock().unwrap();
        let rv = s.bump();
        let pod = s
            .pods
            .get_mut(&(namespace.to_owned(), name.to_owned()))
            .expect("pod");
        let container = pod["spec"]["containers"][0]["name"].clone();
        let state = if looping {
            json!({"waiting": {"reason": "CrashLoopBackOff"}})
        } else {
            json!({"running": {}})
        };
        pod["status"]["containerStatuses"] =
            json!([{"name": container, "state": state, "ready": !looping, "restartCount": 5}]);
        pod["metadata"]["resourceVersion"] = json!(rv);
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
        let mut s = self.state.lock().unwrap();
        let rv = s.bump();
        s.statefulsets.insert(
            ("default".into(), name.into()),
            json!({
                "apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": name, "namespace": "default", "uid": format!("sts-{name}"), "resourceVersion": rv},
                "spec": {
                    "replicas": replicas,
                    "serviceName": name,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"containers": [{"name": "etcd", "image": "etcd"}]}},
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}},
                },
                "status": {"replicas": replicas, "currentRevision": current, "updateRevision": update},
            }),
        );
        for ordinal in 0..replicas {
            let pod = format!("{name}-{ordinal}");
            let rv = s.bump();
            let mut p = json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": pod, "namespace": "default", "uid": format!("uid-{pod}"), "resourceVersion": rv,
                    "labels": {"app": name, "controller-revision-hash": current},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": "sts", "controller": true}],
                },
                "spec": {"nodeName": "w1", "containers": [{"name": "etcd", "image": "etcd"}]},
                "status": {"phase": "Running"},
            });
            set_ready(&mut p, true);
            s.pods.insert(("default".into(), pod), p);
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
                    let mut s = state.lock().unwrap();
                    next_pod_to_replace(&mut s)
                };
                let Some((key, update)) = next else { continue };
                restart(&key.1);
                let mut s = state.lock().unwrap();
                let rv = s.bump();
                if let Some(pod) = s.pods.get_mut(&key) {
                    pod["metadata"]["labels"]["controller-revision-hash"] = json!(update);
                    pod["metadata"]["resourceVersion"] = json!(rv);
                    set_ready(pod, true);
                }
                s.restarting.remove(&key);
                settle_current_revision(&mut s);
            }
        });
    }

    /// Moves the template of StatefulSet `default/name` on to `revision`, as an edit of its
    /// pod template would: a new update revision; the pods stay where the partition holds
    /// them.
    pub fn change_template(&self, name: &str, revision: &str) {
        let mut s = self.state.lock().unwrap();
        let rv = s.bump();
        let sts = s
            .statefulsets
            .get_mut(&("default".to_owned(), name.to_owned()))
            .expect("statefulset");
        sts["status"]["updateRevision"] = json!(revision);
        sts["metadata"]["resourceVersion"] = json!(rv);
    }

    pub fn statefulset(&self, name: &str) -> Value {
        self.state.lock().unwrap().statefulsets[&("default".to_owned(), name.to_owned())].clone()
    }

    pub fn pod(&self, name: &str) -> Value {
        self.pod_in("default", name)
    }

    /// Pod `namespace/name`, or null when there is none.
    pub fn pod_in(&self, namespace: &str, name: &str) -> Value {
        let mut s = self.state.lock().unwrap();
        s.tick();
        s.pods
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// A running pod `app-N` of a Job on `node`: evicted, it is not made again.
    pub fn add_job_pod(&self, node: &str, app: &str) {
        let mut s = self.state.lock().unwrap();
        s.serial += 1;
        let name = format!("{app}-{}", s.serial);
        let rv = s.bump();
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": "default", "uid": format!("uid-{}", s.serial),
                "resourceVersion": rv, "labels": {"app": app},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": app, "uid": "job", "controller": true}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        });
        set_ready(&mut pod, true);
        s.pods.insert(("default".into(), name), pod);
    }

    /// Changes pod `default/name` with `change`, as an update through the API would.
    fn edit_pod(&self, name: &str, change: impl FnOnce(&mut Value)) {
        let mut s = self.state.lock().unwrap();
        let rv = s.bump();
        let pod = s
            .pods
            .get_mut(&("default".to_owned(), name.to_owned()))
            .expect("pod");
        change(pod);
        pod["metadata"]["resourceVersion"] = json!(rv);
    }

    /// Sets the Ready condition of pod `default/name`.
    pub fn set_pod_ready(&self, name: &str, ready: bool) {
        self.edit_pod(name, |pod| set_ready(pod, ready));
    }

    /// Sets pod `default/name`'s phase (`Succeeded` when a Job's pod is done).
    pub fn set_pod_phase(&self, name: &str, phase: &str) {
        self.edit_pod(name, |pod| pod["status"]["phase"] = json!(phase));
    }

    pub fn set_pdb(&self, name: &str, app: &str, min_available: usize) {
        let mut s = self.state.lock().unwrap();
        s.pdbs.retain(|p| p.name != name);
        s.pdbs.push(Pdb {
            namespace: "default".into(),
            name: name.into(),
            selector: BTreeMap::from([("app".to_owned(), app.to_owned())]),
            min_available,
        });
    }

    /// The Events about the `kind` object `name`, in the order they were created.
    pub fn events_about(&self, kind: &str, name: &str) -> Vec<Value> {
        self.state
            .lock()
            .unwrap()
            .events
            .iter()
            .filter(|e| e["regarding"]["kind"] == kind && e["regarding"]["name"] == name)
            .cloned()
            .collect()
    }

    /// Makes creating an Event answer 500 (or stop doing so).
    pub fn fail_events(&self, fail: bool) {
        self.state.lock().unwrap().events_fail = fail;
    }

    pub fn node(&self, name: &str) -> Value {
        self.state.lock().unwrap().nodes[name].clone()
    }

    pub fn namespace(&self, name: &str) -> Value {
        self.state.lock().unwrap().namespaces[name].clone()
    }

    pub fn pods_on(&self, node: &str) -> Vec<Value> {
        let mut s = self.state.lock().unwrap();
        s.tick();
        s.pods_on(node).into_iter().cloned().collect()
    }

    pub fn changes(&self) -> Vec<Change> {
        self.state
            .lock()
            .unwrap()
            .changes
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// What `GET /version` reports from now on.
    pub fn set_server_version(&self, version: &str) {
        self.state.lock().unwrap().server_version = Some(version.to_owned());
    }

    /// Every access made so far.
    pub fn access(&self) -> std::collections::BTreeSet<Access> {
        self.state.lock().unwrap().access.clone()
    }

    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.state.lock().unwrap().calls.clone()
    }

    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}
