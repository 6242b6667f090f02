//! What each API client may do: the scopes, and the scope every API route needs.
//! rollgate's own routes have their scopes here; a workflow's door names its own
//! (`Scope::new`), so that adding a workflow adds its scope without a line here.

use serde::{Serialize, Serializer};
use std::fmt;

/// One permission a client's token carries, by its name as written in config and in 403
/// answers (`alerts:write`, `read`, or a workflow's own such as `reboots:write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scope(&'static str);

impl Scope {
    /// `POST /v1/alerts` (Alertmanager).
    pub const ALERTS_WRITE: Scope = Scope("alerts:write");
    /// `POST /v1/detections` (the detection CronJob).
    pub const DETECTIONS_WRITE: Scope = Scope("detections:write");
    /// `POST /v1/runs/{id}/{halt|resume|abort}`.
    pub const RUNS_CONTROL: Scope = Scope("runs:control");
    /// `POST /v1/runs/{id}/approve`: lets a fleet wave that waits for an approval go on.
    pub const RUNS_APPROVE: Scope = Scope("runs:approve");
    /// Every `GET` under `/v1`: runs, alerts, gates, the event stream.
    pub const READ: Scope = Scope("read");

    /// The scopes of rollgate's own routes; the workflows' doors add theirs.
    pub const OWN: [Scope; 5] = [
        Scope::ALERTS_WRITE,
        Scope::DETECTIONS_WRITE,
        Scope::RUNS_CONTROL,
        Scope::RUNS_APPROVE,
        Scope::READ,
    ];

    /// A workflow's scope, named `<noun>:write` by custom (e.g. `reboots:write`).
    pub const fn new(name: &'static str) -> Self {
        Scope(name)
    }

    /// The scope's name, as written in config and in 403 answers.
    pub fn name(self) -> &'static str {
        self.0
    }
}

/// Listed as clients and the schema show them: the write scopes by name, then
/// `runs:control`, `runs:approve` and `read`.
impl Ord for Scope {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let rank = |s: &Scope| match *s {
            Scope::RUNS_CONTROL => 1,
            Scope::RUNS_APPROVE => 2,
            Scope::READ => 3,
            _ => 0,
        };
        (rank(self), self.0).cmp(&(rank(other), other.0))
    }
}

impl PartialOrd for Scope {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for Scope {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
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
        _ if read => Scope::READ,
        ["alerts"] => Scope::ALERTS_WRITE,
        ["runs", _, "approve"] => Scope::RUNS_APPROVE,
        _ => Scope::RUNS_CONTROL,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const WIDGETS: Scope = Scope::new("widgets:write");

    /// A door needs the scope it names for a write, and `read` for a read; what is not a
    /// door keeps rollgate's own rules.
    #[test]
    fn a_door_needs_its_scope() {
        let door = |p: &str| (p == "widgets").then_some(WIDGETS);
        let cases = [
            ("POST", "/v1/widgets", Some(WIDGETS)),
            ("GET", "/v1/widgets", Some(Scope::READ)),
            ("POST", "/v1/widgets/w-1", Some(Scope::RUNS_CONTROL)),
            ("POST", "/v1/gadgets", Some(Scope::RUNS_CONTROL)),
            ("POST", "/v1/alerts", Some(Scope::ALERTS_WRITE)),
            ("GET", "/v1/whoami", None),
        ];
        for (method, path, scope) in cases {
            assert_eq!(required(method, path, door), scope, "{method} {path}");
        }
    }
}
