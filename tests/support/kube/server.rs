//! The HTTP side: authentication, routing, and each verb as the API server answers it,
//! with its `Status` bodies (kind, reason, code, details) for every refusal.

use super::budget;
use super::fault;
use super::patch;
use super::resources::{Resource, Target, route};
use super::selector::{FieldSelector, LabelSelector};
use super::state::{Change, Key, Record, State, pod_ready};
use super::{Access, exporters, table};
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

pub(super) type Shared = web::Data<(Arc<Mutex<State>>, String)>;

/// A `Status` failure body as the API server sends it.
pub(super) fn status(code: u16, reason: &str, message: &str, details: Value) -> HttpResponse {
    let code_status =
        actix_web::http::StatusCode::from_u16(code).unwrap_or(actix_web::http::StatusCode::OK);
    let mut body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    if !details.is_null() {
        body["details"] = details;
    }
    HttpResponse::build(code_status).json(body)
}

fn details(resource: &Resource, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": resource.plural});
    if !resource.group.is_empty() {
        d["group"] = json!(resource.group);
    }
    d
}

fn not_found(resource: &Resource, name: &str) -> HttpResponse {
    status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", resource.qualified()),
        details(resource, name),
    )
}

fn conflict(resource: &Resource, name: &str) -> HttpResponse {
    status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            resource.qualified()
        ),
        details(resource, name),
    )
}

fn invalid(resource: &Resource, name: &str, field: &str, reason: &str, why: &str) -> HttpResponse {
    let mut d = details(resource, name);
    d["kind"] = json!(resource.kind);
    d["causes"] = json!([{"reason": reason, "message": why, "field": field}]);
    status(
        422,
        "Invalid",
        &format!(
            "{}.{} \"{name}\" is invalid: {field}: {why}",
            resource.kind,
            if resource.group.is_empty() {
                ""
            } else {
                resource.group
            }
        )
        .replace(". \"", " \""),
        d,
    )
}

fn expired(message: String) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Expired", "code": 410,
    })
}

fn authorized(req: &HttpRequest, token: &str) -> bool {
    req.headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == format!("Bearer {token}"))
}

/// A request's query parameters.
struct Query(BTreeMap<String, String>);

impl Query {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// Which objects a list or a watch covers.
#[derive(Clone)]
struct Filter {
    resource: &'static Resource,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, object: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| object["metadata"]["namespace"] == ns)
            && self.labels.matches(object)
            && self.fields.matches(object)
    }
}

pub(super) async fn handle(req: HttpRequest, body: web::Bytes, shared: Shared) -> HttpResponse {
    let (state, token) = (&shared.0, &shared.1);
    if !authorized(&req, token) {
        return status(401, "Unauthorized", "Unauthorized", Value::Null);
    }
    let method = req.method().as_str().to_owned();
    let path = req.path().to_owned();
    let query = Query(
        web::Query::<BTreeMap<String, String>>::from_query(req.query_string())
            .map(|q| q.into_inner())
            .unwrap_or_default(),
    );
    // The exporters are other programs than the API server: its faults leave them be.
    if !path.starts_with("/metrics") {
        let fault = state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .faults
            .take(&method, &fault::uri(&path, &query.0));
        match fault {
            Some(fault::Answer::Delay(d)) => actix_web::rt::time::sleep(d).await,
            Some(answer) => return fault::respond(&answer),
            None => {}
        }
    }
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    s.tick();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["metrics", rest @ ..]) => {
            return match exporters::exposition(&s, rest) {
                Some(text) => HttpResponse::Ok()
                    .content_type("text/plain; version=0.0.4")
                    .body(text),
                None => status(404, "NotFound", "the page cannot be found", Value::Null),
            };
        }
        ("GET", ["version"]) => return version(&s),
        _ => {}
    }
    match route(&path) {
        Target::Discovery(doc) if method == "GET" => HttpResponse::Ok().json(doc),
        Target::Object {
            resource,
            namespace,
            name,
            subresource,
        } => {
            let request = ObjectRequest {
                resource,
                namespace,
                name,
                subresource,
            };
            if let Some(access) = request.access(&method, &query) {
                s.access.insert(access);
            }
            let answer = request.serve(&mut s, &req, &method, &query, &body, state);
            let key = request.call_key(&method, &query);
            s.count(&key);
            let code = answer.status().as_u16();
            if code >= 400 {
                s.count(&format!("{key} {code}"));
            }
            answer
        }
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            Value::Null,
        ),
    }
}

fn version(s: &State) -> HttpResponse {
    let git = s.server_version.clone().unwrap_or_default();
    let mut it = git.split('.');
    let major = it.next().unwrap_or("").to_owned();
    let minor = it.next().unwrap_or("").to_owned();
    HttpResponse::Ok().json(json!({
        "major": major, "minor": minor, "gitVersion": format!("v{git}"),
        "gitCommit": "0", "gitTreeState": "clean", "buildDate": "2026-11-01T00:00:00Z",
        "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64",
    }))
}

struct ObjectRequest {
    resource: &'static Resource,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
}

impl ObjectRequest {
    /// How the fake's call counter names this request: `list nodes`, `get node`,
    /// `patch node`, `evict pod`, `watch statefulsets` …
    fn call_key(&self, method: &str, query: &Query) -> String {
        let r = self.resource;
        match (method, &self.name, self.subresource.as_deref()) {
            ("GET", None, _) if query.flag("watch") => format!("watch {}", r.plural),
            ("GET", None, _) => format!("list {}", r.plural),
            ("POST", Some(_), Some("eviction")) => "evict pod".to_owned(),
            ("GET", Some(_), _) => format!("get {}", r.singular),
            ("PATCH", _, _) => format!("patch {}", r.singular),
            ("PUT", _, _) => format!("update {}", r.singular),
            ("DELETE", _, _) => format!("delete {}", r.singular),
            ("POST", _, _) => format!("create {}", r.singular),
            _ => format!("{} {}", method.to_lowercase(), r.plural),
        }
    }

    /// The access this request makes, as the API server's RBAC authorizer derives it.
    fn access(&self, method: &str, query: &Query) -> Option<Access> {
        let verb = match (method, &self.name) {
            ("GET", None) if query.flag("watch") => "watch",
            ("GET", None) => "list",
            ("GET", Some(_)) => "get",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", None) => "deletecollection",
            ("DELETE", Some(_)) => "delete",
            _ => return None,
        };
        Some(Access {
            group: self.resource.group.to_owned(),
            resource: match &self.subresource {
                Some(sub) => format!("{}/{sub}", self.resource.plural),
                None => self.resource.plural.to_owned(),
            },
            verb: verb.to_owned(),
            name: self.name.clone(),
        })
    }

    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    fn serve(
        &self,
        s: &mut State,
        req: &HttpRequest,
        method: &str,
        query: &Query,
        body: &[u8],
        state: &Arc<Mutex<State>>,
    ) -> HttpResponse {
        let sub = self.subresource.as_deref();
        let valid_sub = match sub {
            None => true,
            Some("status") => self.resource.status,
            Some("eviction") => self.resource.plural == "pods",
            Some(_) => false,
        };
        if !valid_sub {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                Value::Null,
            );
        }
        let accept = req
            .headers()
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let printing = table::wanted(accept).then(|| query.get("includeObject") == Some("Object"));
        match (method, &self.name, sub) {
            ("GET", None, _) if query.flag("watch") => self.watch(s, query, state, printing),
            ("GET", None, _) => self.list(s, query, printing),
            ("GET", Some(name), _) => self.get(s, name, printing),
            ("POST", None, _) => self.create(s, body),
            ("POST", Some(name), Some("eviction")) => evict(s, self.ns(), name, body),
            ("PUT", Some(name), _) => self.update(s, name, body),
            ("PATCH", Some(name), _) => self.patch(s, req, name, body),
            ("DELETE", Some(name), None) => self.delete(s, name, query, body),
            _ => status(
                405,
                "MethodNotAllowed",
                &format!(
                    "the server does not allow this method on the requested resource ({method})"
                ),
                Value::Null,
            ),
        }
    }

    fn get(&self, s: &mut State, name: &str, printing: Option<bool>) -> HttpResponse {
        let Some(object) = s.get(self.resource.plural, self.ns(), name).cloned() else {
            return not_found(self.resource, name);
        };
        // Another writer's change right after this read, as a test arranged.
        let plural = self.resource.plural;
        let mut writes = Vec::new();
        for hook in s.after_read.iter_mut() {
            if hook.resource == plural && hook.name == name && hook.remaining > 0 {
                hook.remaining -= 1;
                let mut changed = object.clone();
                (hook.change)(&mut changed);
                writes.push(changed);
            }
        }
        for changed in writes {
            s.put(plural, changed);
        }
        match printing {
            Some(include) => HttpResponse::Ok().json(table::table(
                self.resource,
                std::slice::from_ref(&object),
                json!({"resourceVersion": object["metadata"]["resourceVersion"]}),
                include,
                true,
            )),
            None => HttpResponse::Ok().json(object),
        }
    }

    fn filter(&self, query: &Query) -> Result<Filter, Box<HttpResponse>> {
        let bad = |why: String| Box::new(status(400, "BadRequest", &why, Value::Null));
        Ok(Filter {
            resource: self.resource,
            namespace: self.namespace.clone(),
            labels: LabelSelector::parse(query.get("labelSelector").unwrap_or("")).map_err(bad)?,
            fields: FieldSelector::parse(
                query.get("fieldSelector").unwrap_or(""),
                self.resource.plural,
            )
            .map_err(bad)?,
        })
    }

    /// A list, a page at a time with `limit` and `continue` (the token names the list's
    /// resourceVersion and the last key served; once compacted it is answered 410).
    fn list(&self, s: &mut State, query: &Query, printing: Option<bool>) -> HttpResponse {
        let filter = match self.filter(query) {
            Ok(f) => f,
            Err(answer) => return *answer,
        };
        let limit = query
            .get("limit")
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > 0);
        let (list_rv, after) = match query.get("continue") {
            None => (s.rv(), None),
            Some(token) => match decode_continue(token) {
                Some((rv, _)) if rv < s.compacted => {
                    return status(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                        Value::Null,
                    );
                }
                Some((rv, key)) => (rv, Some(key)),
                None => {
                    return status(400, "BadRequest", "continue key is not valid", Value::Null);
                }
            },
        };
        let node = filter.fields.equal_to("spec.nodeName").map(str::to_owned);
        let candidates: Box<dyn Iterator<Item = (&Key, &Value)>> = match node {
            Some(node) if self.resource.plural == "pods" => {
                Box::new(s.pods_on_node_after(&node, after))
            }
            _ => Box::new(s.all_after(self.resource.plural, after)),
        };
        let mut matching = candidates.filter(|(_, o)| filter.matches(o));
        let mut items = Vec::new();
        let mut last = None;
        for (key, object) in matching.by_ref() {
            items.push(object.clone());
            last = Some((key.1.clone(), key.2.clone()));
            if limit.is_some_and(|l| items.len() >= l) {
                break;
            }
        }
        let remaining = matching.count();
        let mut metadata = json!({"resourceVersion": list_rv.to_string()});
        if remaining > 0
            && let Some(key) = last
        {
            metadata["continue"] = json!(encode_continue(list_rv, &key));
            metadata["remainingItemCount"] = json!(remaining);
        }
        if let Some(left) = s.compact_after_pages.get_mut(self.resource.plural) {
            *left = left.saturating_sub(1);
            if *left == 0 {
                s.compact_after_pages.remove(self.resource.plural);
                s.touch();
                s.compact();
            }
        }
        if let Some(include) = printing {
            return HttpResponse::Ok().json(table::table(
                self.resource,
                &items,
                metadata,
                include,
                true,
            ));
        }
        HttpResponse::Ok().json(json!({
            "kind": format!("{}List", self.resource.kind),
            "apiVersion": self.resource.api_version(),
            "metadata": metadata,
            "items": items,
        }))
    }

    /// A watch: from `resourceVersion` (410 when compacted), or from now with an ADDED
    /// event for each object as it is; BOOKMARKs when asked for; ends at
    /// `timeoutSeconds`, or with 410 when the fake expires its watches.
    fn watch(
        &self,
        s: &mut State,
        query: &Query,
        state: &Arc<Mutex<State>>,
        printing: Option<bool>,
    ) -> HttpResponse {
        let filter = match self.filter(query) {
            Ok(f) => f,
            Err(answer) => return *answer,
        };
        let from = query
            .get("resourceVersion")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let mut pending = Vec::new();
        let start = if from == 0 {
            for object in s.all(self.resource.plural).filter(|o| filter.matches(o)) {
                pending.push(json!({"type": "ADDED", "object": object}));
            }
            s.rv()
        } else if from < s.compacted {
            pending.push(json!({"type": "ERROR", "object": expired(format!("too old resource version: {from} ({})", s.compacted))}));
            u64::MAX
        } else {
            from
        };
        let seconds = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(1800);
        *s.open_watches.entry(self.resource.plural).or_default() += 1;
        let watch = Watch {
            state: Arc::downgrade(state),
            filter,
            bookmarks: query.flag("allowWatchBookmarks"),
            until: Instant::now() + Duration::from_secs(seconds),
            epoch: s.watch_epoch,
            last: start,
            last_sent: Instant::now(),
            pending: pending.into(),
            done: start == u64::MAX,
            printing,
            columns_sent: false,
        };
        HttpResponse::Ok()
            .content_type("application/json")
            .streaming(watch.stream())
    }

    fn create(&self, s: &mut State, body: &[u8]) -> HttpResponse {
        let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the body is not JSON", Value::Null);
        };
        if self.resource.plural == "events" {
            if s.events_fail {
                return status(
                    500,
                    "InternalError",
                    "etcdserver: request timed out",
                    Value::Null,
                );
            }
            if let Err(answer) = validate_event(self.resource, self.ns(), &object) {
                return *answer;
            }
        }
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
        if name.is_empty() {
            return invalid(
                self.resource,
                "",
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            );
        }
        if self.resource.namespaced {
            object["metadata"]["namespace"] = json!(self.ns());
        }
        if s.get(self.resource.plural, self.ns(), &name).is_some() {
            return status(
                409,
                "AlreadyExists",
                &format!("{} \"{name}\" already exists", self.resource.qualified()),
                details(self.resource, &name),
            );
        }
        HttpResponse::Created().json(s.put(self.resource.plural, object))
    }

    /// Stores `new` in place of `old`: writes to the main resource keep the status, writes
    /// to `/status` change nothing but the status.
    fn commit(&self, s: &mut State, old: &Value, mut new: Value) -> HttpResponse {
        if new["metadata"]["name"] != old["metadata"]["name"]
            || (self.resource.namespaced
                && !new["metadata"]["namespace"].is_null()
                && new["metadata"]["namespace"] != old["metadata"]["namespace"])
        {
            return status(
                400,
                "BadRequest",
                "the name of the object does not match the name on the URL",
                Value::Null,
            );
        }
        if self.resource.namespaced {
            new["metadata"]["namespace"] = old["metadata"]["namespace"].clone();
        }
        if self.subresource.as_deref() == Some("status") {
            let mut kept = old.clone();
            kept["status"] = new["status"].clone();
            new = kept;
        } else if self.resource.status {
            new["status"] = old["status"].clone();
        }
        HttpResponse::Ok().json(s.put(self.resource.plural, new))
    }

    fn update(&self, s: &mut State, name: &str, body: &[u8]) -> HttpResponse {
        let Ok(new) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the body is not JSON", Value::Null);
        };
        let Some(old) = s.get(self.resource.plural, self.ns(), name).cloned() else {
            return not_found(self.resource, name);
        };
        let wanted = new["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !wanted.is_empty() && Some(wanted) != old["metadata"]["resourceVersion"].as_str() {
            return conflict(self.resource, name);
        }
        self.commit(s, &old, new)
    }

    fn patch(&self, s: &mut State, req: &HttpRequest, name: &str, body: &[u8]) -> HttpResponse {
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let Ok(patch_body) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "the patch is not JSON", Value::Null);
        };
        let Some(old) = s.get(self.resource.plural, self.ns(), name).cloned() else {
            return not_found(self.resource, name);
        };
        let mut new = old.clone();
        let applied = match content_type.as_str() {
            "application/merge-patch+json" => {
                patch::merge(&mut new, &patch_body);
                Ok(())
            }
            "application/strategic-merge-patch+json" => patch::strategic(&mut new, &patch_body),
            "application/json-patch+json" => patch::json_patch(&mut new, &patch_body),
            other => {
                return status(
                    415,
                    "UnsupportedMediaType",
                    &format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"
                    ),
                    Value::Null,
                );
            }
        };
        if let Err(why) = applied {
            return invalid(self.resource, name, "patch", "FieldValueInvalid", &why);
        }
        // A patch that names a resourceVersion is a precondition on it.
        let wanted = new["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !wanted.is_empty() && Some(wanted) != old["metadata"]["resourceVersion"].as_str() {
            return conflict(self.resource, name);
        }
        self.commit(s, &old, new)
    }

    fn delete(&self, s: &mut State, name: &str, query: &Query, body: &[u8]) -> HttpResponse {
        let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let Some(old) = s.get(self.resource.plural, self.ns(), name).cloned() else {
            return not_found(self.resource, name);
        };
        let uid = &options["preconditions"]["uid"];
        if !uid.is_null() && *uid != old["metadata"]["uid"] {
            return conflict(self.resource, name);
        }
        let grace = options["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok()));
        let gone = if self.resource.plural == "pods" {
            s.delete_pod(self.ns(), name, grace)
        } else {
            s.remove(self.resource.plural, self.ns(), name)
        };
        HttpResponse::Ok().json(gone.unwrap_or(old))
    }
}

fn encode_continue(rv: u64, key: &(String, String)) -> String {
    hex::encode(format!("{rv}\n{}\n{}", key.0, key.1))
}

fn decode_continue(token: &str) -> Option<(u64, (String, String))> {
    let text = String::from_utf8(hex::decode(token).ok()?).ok()?;
    let mut parts = text.splitn(3, '\n');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, (parts.next()?.to_owned(), parts.next()?.to_owned())))
}

/// One open watch.
struct Watch {
    state: Weak<Mutex<State>>,
    filter: Filter,
    bookmarks: bool,
    until: Instant,
    epoch: u64,
    /// The newest resourceVersion this watch has gone past.
    last: u64,
    last_sent: Instant,
    pending: std::collections::VecDeque<Value>,
    done: bool,
    /// Objects printed as Tables (with the whole object when `Some(true)`).
    printing: Option<bool>,
    columns_sent: bool,
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(state) = self.state.upgrade() {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(open) = s.open_watches.get_mut(self.filter.resource.plural) {
                *open = open.saturating_sub(1);
            }
        }
    }
}

impl Watch {
    /// The event `record` is to this watch, if any: an object that stops matching its
    /// selectors is DELETED to it, one that starts matching is ADDED.
    fn event(&self, record: &Record) -> Option<Value> {
        if record.resource != self.filter.resource.plural {
            return None;
        }
        let now = self.filter.matches(&record.object);
        let before = record
            .previous
            .as_ref()
            .is_some_and(|p| self.filter.matches(p));
        let kind = match (record.kind, before, now) {
            ("DELETED", _, true) => "DELETED",
            ("ADDED", _, true) => "ADDED",
            ("MODIFIED", true, true) => "MODIFIED",
            ("MODIFIED", false, true) => "ADDED",
            ("MODIFIED", true, false) => "DELETED",
            _ => return None,
        };
        Some(json!({"type": kind, "object": record.object}))
    }

    /// Moves on: queues what happened since `last`, a BOOKMARK when due, or the 410 that
    /// ends it.
    fn poll(&mut self) -> bool {
        let Some(state) = self.state.upgrade() else {
            return false;
        };
        let s = state.lock().unwrap_or_else(|e| e.into_inner());
        if s.watch_epoch != self.epoch {
            self.pending.push_back(json!({"type": "ERROR", "object": expired(format!("too old resource version: {} ({})", self.last, s.compacted))}));
            self.done = true;
            return true;
        }
        let events: Vec<Value> = match s.history_after(self.last) {
            Err(oldest) => {
                self.pending.push_back(json!({"type": "ERROR", "object": expired(format!("too old resource version: {} ({oldest})", self.last))}));
                self.done = true;
                return true;
            }
            Ok(records) => records.filter_map(|r| self.event(r)).collect(),
        };
        self.last = s.rv();
        if !events.is_empty() {
            self.pending.extend(events);
        } else if self.bookmarks && self.last_sent.elapsed() >= s.bookmark_every {
            let r = self.filter.resource;
            self.pending
                .push_back(json!({"type": "BOOKMARK", "object": {
                    "kind": r.kind, "apiVersion": r.api_version(),
                    "metadata": {"resourceVersion": self.last.to_string()},
                }}));
        }
        true
    }

    fn stream(self) -> impl futures_util::Stream<Item = Result<web::Bytes, actix_web::Error>> {
        futures_util::stream::unfold(self, |mut watch| async move {
            loop {
                if let Some(mut event) = watch.pending.pop_front() {
                    watch.last_sent = Instant::now();
                    let printable = !matches!(event["type"].as_str(), Some("ERROR" | "BOOKMARK"));
                    if let (Some(include), true) = (watch.printing, printable) {
                        let object = event["object"].clone();
                        event["object"] = table::table(
                            watch.filter.resource,
                            std::slice::from_ref(&object),
                            json!({"resourceVersion": object["metadata"]["resourceVersion"]}),
                            include,
                            !watch.columns_sent,
                        );
                        watch.columns_sent = true;
                    }
                    let line = format!("{event}\n");
                    return Some((Ok(web::Bytes::from(line)), watch));
                }
                if watch.done || Instant::now() >= watch.until || !watch.poll() {
                    return None;
                }
                if watch.pending.is_empty() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
    }
}

/// Refuses what the real API server's validation refuses for the Event fields rollgate
/// sets.
fn validate_event(resource: &Resource, ns: &str, event: &Value) -> Result<(), Box<HttpResponse>> {
    let name = event["metadata"]["name"].as_str().unwrap_or_default();
    let text = |field: &str| event[field].as_str().unwrap_or_default().to_owned();
    let refuse = |field: &str, reason: &str, why: &str| {
        Box::new(invalid(resource, name, field, reason, why))
    };
    if event["metadata"]["namespace"]
        .as_str()
        .is_some_and(|n| n != ns)
    {
        return Err(Box::new(status(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
            Value::Null,
        )));
    }
    if name.is_empty() {
        return Err(refuse(
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required",
        ));
    }
    for field in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if text(field).is_empty() {
            return Err(refuse(field, "FieldValueRequired", "Required value"));
        }
    }
    if !["Normal", "Warning"].contains(&text("type").as_str()) {
        return Err(refuse(
            "type",
            "FieldValueNotSupported",
            "Unsupported value",
        ));
    }
    if text("note").len() > 1024 {
        return Err(refuse(
            "note",
            "FieldValueTooLong",
            "Too long: may not be more than 1024 bytes",
        ));
    }
    if event["regarding"]["kind"].as_str().is_none()
        || event["regarding"]["name"].as_str().is_none()
    {
        return Err(refuse("regarding", "FieldValueRequired", "Required value"));
    }
    Ok(())
}

/// The Eviction subresource: a pod covered by a budget goes only while the budget's
/// status allows a disruption, and each eviction takes one from it at once (so
/// concurrent evictions cannot overrun it); a pod that is not Running, or already
/// terminating, is not held by any budget.
fn evict(s: &mut State, ns: &str, name: &str, body: &[u8]) -> HttpResponse {
    let pods = Resource::named("pods");
    let eviction: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if let Some(named) = eviction["metadata"]["name"].as_str()
        && named != name
    {
        return status(
            400,
            "BadRequest",
            &format!("name in URL does not match name in Eviction object: {named}"),
            Value::Null,
        );
    }
    let grace = eviction["deleteOptions"]["gracePeriodSeconds"].as_i64();
    let Some(pod) = s.get("pods", ns, name).cloned() else {
        return not_found(pods, name);
    };
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_owned();
    let success = || {
        HttpResponse::Created()
            .json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
    };
    let terminating = !pod["metadata"]["deletionTimestamp"].is_null();
    let ignores_budgets = terminating
        || matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed" | "Pending")
        );
    if terminating {
        return success();
    }
    let budgets: Vec<Value> = if ignores_budgets || s.admit_every_eviction {
        Vec::new()
    } else {
        s.all("poddisruptionbudgets")
            .filter(|b| budget::covers(b, &pod))
            .cloned()
            .collect()
    };
    if budgets.len() > 1 {
        return status(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            Value::Null,
        );
    }
    if let Some(pdb) = budgets.first() {
        let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let st = &pdb["status"];
        let unhealthy_goes = !pod_ready(&pod)
            && st["currentHealthy"].as_i64().unwrap_or(0)
                >= st["desiredHealthy"].as_i64().unwrap_or(0)
            && st["desiredHealthy"].as_i64().unwrap_or(0) > 0;
        if !unhealthy_goes {
            let observed = st["observedGeneration"].as_i64().unwrap_or(0);
            let allowed = st["disruptionsAllowed"].as_i64().unwrap_or(0);
            let refusal = if observed < pdb["metadata"]["generation"].as_i64().unwrap_or(1) {
                Some(format!(
                    "The disruption budget {pdb_name} is still being processed by the server."
                ))
            } else if allowed <= 0 {
                Some(format!(
                    "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                    st["desiredHealthy"].as_i64().unwrap_or(0),
                    st["currentHealthy"].as_i64().unwrap_or(0)
                ))
            } else {
                None
            };
            if let Some(why) = refusal {
                let pod = name.to_owned();
                s.changes
                    .push((Instant::now(), Change::Refused { node, pod }));
                return HttpResponse::TooManyRequests().json(json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                    "reason": "TooManyRequests", "code": 429,
                    "details": {"causes": [{"reason": "DisruptionBudget", "message": why}]},
                }));
            }
            let at = super::state::now_rfc3339(Duration::ZERO);
            let pdb_ns = pdb["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            s.edit("poddisruptionbudgets", &pdb_ns, &pdb_name, |b| {
                b["status"]["disruptionsAllowed"] = json!(allowed - 1);
                b["status"]["disruptedPods"][name] = json!(at);
            });
        }
    }
    s.delete_pod(ns, name, grace);
    s.changes.push((
        Instant::now(),
        Change::Evicted {
            node,
            pod: name.to_owned(),
        },
    ));
    s.watch_budgets();
    success()
}
