//! What each API client may do: the scopes, and the scope every API route needs.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One permission a client's token carries.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
pub enum Scope {
    /// `POST /v1/alerts` (Alertmanager).
    #[serde(rename = "alerts:write")]
    AlertsWrite,
    /// `POST /v1/detections` (the detection CronJob).
    #[serde(rename = "detections:write")]
    DetectionsWrite,
    /// `POST /v1/etcd-rolls`.
    #[serde(rename = "etcd-rolls:write")]
    EtcdRollsWrite,
    /// `POST /v1/reboots`.
    #[serde(rename = "reboots:write")]
    RebootsWrite,
    /// `POST /v1/runs/{id}/{halt|resume|abort}`.
    #[serde(rename = "runs:control")]
    RunsControl,
    /// `POST /v1/runs/{id}/approve`: lets a fleet wave that waits for an approval go on.
    #[serde(rename = "runs:approve")]
    RunsApprove,
    /// Every `GET` under `/v1`: runs, alerts, gates, the event stream.
    #[serde(rename = "read")]
    Read,
}

impl Scope {
    /// Every scope, as `server.token_file` grants them.
    pub const ALL: [Scope; 7] = [
        Scope::AlertsWrite,
        Scope::DetectionsWrite,
        Scope::EtcdRollsWrite,
        Scope::RebootsWrite,
        Scope::RunsControl,
        Scope::RunsApprove,
        Scope::Read,
    ];

    /// The scope's name, as written in config and in 403 answers.
    pub fn name(self) -> &'static str {
        match self {
            Scope::AlertsWrite => "alerts:write",
            Scope::DetectionsWrite => "detections:write",
            Scope::EtcdRollsWrite => "etcd-rolls:write",
            Scope::RebootsWrite => "reboots:write",
            Scope::RunsControl => "runs:control",
            Scope::RunsApprove => "runs:approve",
            Scope::Read => "read",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The scope a request to `path` (under `/v1`) with `method` needs; `None` for
/// `GET /v1/whoami`, which any known client may ask (so that a page or a script can say
/// what its token lacks). Reads need `read`; each kind of write its own scope; a write to
/// a path no route serves needs `runs:control`, the widest, so that probing unknown paths
/// tells an under-scoped client nothing. A workflow's door (a route `door` answers with
/// a scope for) needs the scope it names.
pub fn required(method: &str, path: &str, door: impl Fn(&str) -> Option<Scope>) -> Option<Scope> {
    let rest = path.strip_prefix("/v1").unwrap_or(path);
    let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let read = method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD");
    if let [segment] = segments.as_slice()
        && !read
        && let Some(scope) = door(segment)
    {
        return Some(scope);
    }
    Some(match segments.as_slice() {
        ["whoami"] if read => return None,
        _ if read => Scope::Read,
        ["alerts"] => Scope::AlertsWrite,
        ["runs", _, "approve"] => Scope::RunsApprove,
        _ => Scope::RunsControl,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A door needs the scope it names for a write, and `read` for a read; what is not a
    /// door keeps rollgate's own rules.
    #[test]
    fn a_door_needs_its_scope() {
        let door = |p: &str| (p == "widgets").then_some(Scope::RebootsWrite);
        let cases = [
            ("POST", "/v1/widgets", Some(Scope::RebootsWrite)),
            ("GET", "/v1/widgets", Some(Scope::Read)),
            ("POST", "/v1/widgets/w-1", Some(Scope::RunsControl)),
            ("POST", "/v1/gadgets", Some(Scope::RunsControl)),
            ("POST", "/v1/alerts", Some(Scope::AlertsWrite)),
            ("GET", "/v1/whoami", None),
        ];
        for (method, path, scope) in cases {
            assert_eq!(required(method, path, door), scope, "{method} {path}");
        }
    }

    #[test]
    fn scope_names_round_trip_through_config() {
        for scope in Scope::ALL {
            let json = serde_json::to_string(&scope).expect("serialize");
            assert_eq!(json, format!("\"{}\"", scope.name()));
            let back: Scope = serde_json::from_str(&json).expect("parse");
            assert_eq!(back, scope);
        }
        assert!(serde_json::from_str::<Scope>("\"admin\"").is_err());
    }
}
