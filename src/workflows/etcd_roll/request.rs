//! What an etcd roll request may ask: the StatefulSet, its namespace, the members'
//! endpoints and the roll's bounds. Validated field by field before anything is queued.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::input::{FieldErrors, read_body};
use crate::domain::run::ReadRequest;
use crate::domain::run_request::RunRequest;

/// A validated request to roll the etcd cluster that is a StatefulSet's pods
/// (`POST /v1/etcd-rolls`). The TLS files come from the configuration (`etcd_roll.*`),
/// never from the request; restart commands exist only in the CLI (`rollgate etcd-roll
/// --driver command`), so nothing that reaches a shell comes over the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EtcdRollRequest {
    /// The StatefulSet whose pods are the members (member name = pod name).
    #[schema(example = "etcd")]
    pub statefulset: String,
    /// Its namespace.
    #[schema(example = "etcd")]
    pub namespace: String,
    /// Client URL of every member, `http(s)://host:port`.
    #[schema(example = json!(["https://etcd-0.etcd.etcd.svc:2379"]))]
    pub endpoints: Vec<String>,
    /// How long a restarted member may take to be healthy, at target and caught up
    /// (1–3600, default 300).
    pub ready_timeout_secs: u64,
    /// A fixed pause after each member is back, on top of the wait until it is caught up
    /// (0–600, default 0: go on as soon as it is).
    pub cooldown_secs: u64,
    /// How far behind the leader's raft index another member may be (1–10000000, default
    /// 1000).
    pub max_lag: u64,
}

/// The body of `POST /v1/etcd-rolls` (and the `data` of a `rollgate.etcd-roll.v1`
/// event), as it is read and documented; [`EtcdRollRequest::from_json`] validates it.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"statefulset": "etcd", "namespace": "etcd", "endpoints": ["https://etcd-0.etcd.etcd.svc:2379", "https://etcd-1.etcd.etcd.svc:2379", "https://etcd-2.etcd.etcd.svc:2379"]}))]
pub struct EtcdRollBody {
    /// The StatefulSet whose pods are the members (member name = pod name).
    #[schema(required = true, value_type = String, example = "etcd")]
    pub statefulset: Option<String>,
    /// Its namespace.
    #[schema(required = true, value_type = String, example = "etcd")]
    pub namespace: Option<String>,
    /// Client URL of every member, `http(s)://host:port`, 1 to 15 of them.
    #[schema(required = true, value_type = Vec<String>)]
    pub endpoints: Option<Vec<String>>,
    /// How long a restarted member may take to be healthy, at target and caught up
    /// (1–3600, default 300).
    #[schema(required = false, value_type = u64, minimum = 1, maximum = 3600, default = 300)]
    pub ready_timeout_secs: Option<u64>,
    /// A fixed pause after each member is back, on top of the wait until it is caught up
    /// (0–600, default 0: go on as soon as it is).
    #[schema(required = false, value_type = u64, minimum = 0, maximum = 600, default = 0)]
    pub cooldown_secs: Option<u64>,
    /// How far behind the leader's raft index another member may be (1–10000000,
    /// default 1000).
    #[schema(required = false, value_type = u64, minimum = 1, maximum = 10000000, default = 1000)]
    pub max_lag: Option<u64>,
}

impl EtcdRollRequest {
    /// Most members a request may name.
    pub const MAX_MEMBERS: usize = 15;

    /// Reads and validates the JSON body of an etcd roll request, reporting every bad
    /// field.
    pub fn from_json(body: &Value) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let read: EtcdRollBody = read_body(body, &mut errors);
        let reported = errors.clone();
        let name = |key: &str, value: Option<&String>, errors: &mut FieldErrors| {
            let Some(value) = value else {
                if !reported.iter().any(|e| e.field == key) && !reported.is_empty_body() {
                    errors.push(key, "is required");
                }
                return None;
            };
            match dns_label_problem(value) {
                Some(problem) => {
                    errors.push(key, problem);
                    None
                }
                None => Some(value.clone()),
            }
        };
        let statefulset = name("statefulset", read.statefulset.as_ref(), &mut errors);
        let namespace = name("namespace", read.namespace.as_ref(), &mut errors);
        let endpoints = match &read.endpoints {
            Some(list) => endpoint_list(list, &mut errors),
            None if reported.iter().any(|e| e.field.starts_with("endpoints"))
                || reported.is_empty_body() =>
            {
                None
            }
            None => {
                errors.push("endpoints", "is required");
                None
            }
        };
        let mut within = |key: &str, value: Option<u64>, range: std::ops::RangeInclusive<u64>| {
            if let Some(v) = value.filter(|v| !range.contains(v)) {
                errors.push(
                    key,
                    format!(
                        "{v} must be a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                );
            }
        };
        within("ready_timeout_secs", read.ready_timeout_secs, 1..=3600);
        within("cooldown_secs", read.cooldown_secs, 0..=600);
        within("max_lag", read.max_lag, 1..=10_000_000);
        match (statefulset, namespace, endpoints) {
            (Some(statefulset), Some(namespace), Some(endpoints)) if errors.is_empty() => {
                Ok(Self {
                    statefulset,
                    namespace,
                    endpoints,
                    ready_timeout_secs: read.ready_timeout_secs.unwrap_or(300),
                    cooldown_secs: read.cooldown_secs.unwrap_or(0),
                    max_lag: read.max_lag.unwrap_or(1000),
                })
            }
            _ => Err(errors),
        }
    }

    /// The JSON body this request came from, defaults filled in.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "statefulset": self.statefulset,
            "namespace": self.namespace,
            "endpoints": self.endpoints,
            "ready_timeout_secs": self.ready_timeout_secs,
            "cooldown_secs": self.cooldown_secs,
            "max_lag": self.max_lag,
        })
    }

    /// What the roll acts on, `namespace/statefulset`: one roll at a time per target.
    pub fn target(&self) -> String {
        format!("{}/{}", self.namespace, self.statefulset)
    }

    /// Whether any endpoint uses TLS.
    pub fn uses_tls(&self) -> bool {
        self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

/// Why `value` is not a Kubernetes object name (an RFC 1123 label), if it is not.
fn dns_label_problem(value: &str) -> Option<String> {
    let ok = (1..=63).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    (!ok).then(|| {
        format!(
            "{value:?} is not a Kubernetes name (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
        )
    })
}

/// A list of 1..=MAX_MEMBERS distinct `http(s)://host:port` URLs.
fn endpoint_list(items: &[String], errors: &mut FieldErrors) -> Option<Vec<String>> {
    if items.is_empty() || items.len() > EtcdRollRequest::MAX_MEMBERS {
        errors.push(
            "endpoints",
            format!(
                "must name 1 to {} members, got {}",
                EtcdRollRequest::MAX_MEMBERS,
                items.len()
            ),
        );
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("endpoints[{i}]");
        let url = item.trim_end_matches('/');
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"));
        let plain = rest.is_some_and(|r| {
            !r.is_empty()
                && r.len() <= 253
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        });
        if !plain {
            errors.push(
                &field,
                format!("{url:?} is not http(s)://host:port (no path, no user, no query)"),
            );
        } else if out.iter().any(|e| e == url) {
            errors.push(&field, format!("{url:?} is listed twice"));
        } else {
            out.push(url.to_owned());
        }
    }
    Some(out)
}

impl ReadRequest for EtcdRollRequest {
    fn read(json: &Value) -> Result<Self, FieldErrors> {
        Self::from_json(json)
    }
}

impl RunRequest for EtcdRollRequest {
    fn to_json(&self) -> Value {
        EtcdRollRequest::to_json(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn etcd_roll_request_takes_the_documented_body_and_fills_defaults() {
        let req = EtcdRollRequest::from_json(&json!({
            "statefulset": "etcd", "namespace": "etcd",
            "endpoints": ["https://etcd-0.etcd.etcd.svc:2379/", "https://10.0.0.2:2379"],
        }))
        .unwrap();
        assert_eq!(req.target(), "etcd/etcd");
        assert_eq!(req.endpoints[0], "https://etcd-0.etcd.etcd.svc:2379");
        assert_eq!(
            (req.ready_timeout_secs, req.cooldown_secs, req.max_lag),
            (300, 0, 1000)
        );
        assert!(req.uses_tls());
        assert_eq!(EtcdRollRequest::from_json(&req.to_json()).unwrap(), req);
    }

    #[test]
    fn etcd_roll_request_rejects_each_broken_rule() {
        let good = json!({"statefulset": "etcd", "namespace": "db", "endpoints": ["http://127.0.0.1:2379"]});
        let with = |key: &str, value: Value| {
            let mut body = good.clone();
            body[key] = value;
            body
        };
        let cases = [
            (with("statefulset", json!("Etcd")), "statefulset"),
            (with("statefulset", json!("etcd;reboot")), "statefulset"),
            (with("namespace", json!("-db")), "namespace"),
            (with("namespace", json!(7)), "namespace: must be a string"),
            (with("endpoints", json!([])), "endpoints: must name 1 to 15"),
            (
                with("endpoints", json!("http://a:1")),
                "endpoints: must be a list",
            ),
            (with("endpoints", json!(["ftp://a:1"])), "endpoints[0]"),
            (with("endpoints", json!(["http://a:1/x"])), "endpoints[0]"),
            (with("endpoints", json!(["http://u@a:1"])), "endpoints[0]"),
            (with("endpoints", json!(["http://$(id):1"])), "endpoints[0]"),
            (
                with("endpoints", json!(["http://a:1", "http://a:1/"])),
                "listed twice",
            ),
            (with("ready_timeout_secs", json!(0)), "ready_timeout_secs"),
            (with("cooldown_secs", json!(-1)), "cooldown_secs"),
            (with("max_lag", json!("1")), "max_lag"),
            (
                with("driver", json!("command")),
                "driver: is not a known field",
            ),
            (
                json!({"endpoints": ["http://a:1"]}),
                "statefulset: is required",
            ),
        ];
        for (body, expected) in cases {
            let errors = EtcdRollRequest::from_json(&body).expect_err(&body.to_string());
            assert!(
                errors.to_string().contains(expected),
                "{body}: {errors} lacks {expected:?}"
            );
        }
    }

    #[test]
    fn every_refused_field_is_named_at_once_in_the_words_of_the_api() {
        let missing =
            EtcdRollRequest::from_json(&json!({"namespace": "db", "max_lag": 0})).unwrap_err();
        let got: Vec<String> = missing
            .iter()
            .map(|e| format!("{}: {}", e.field, e.problem))
            .collect();
        assert_eq!(
            got,
            [
                "statefulset: is required",
                "endpoints: is required",
                "max_lag: 0 must be a whole number from 1 to 10000000"
            ]
        );
    }
}
