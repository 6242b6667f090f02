//! What a reboot request may ask: nodes by name, and why. Validated field by field before
//! anything is queued; what runs on the nodes is never the request's.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::domain::input::{FieldErrors, read_body};
use crate::domain::run::ReadRequest;
use crate::domain::run_request::RunRequest;

/// A validated request to reboot nodes (`POST /v1/reboots`): the nodes named, or every
/// node whose sentinel is set when none is named. What runs on the nodes (the reboot
/// command, the sentinel's test) is the operator's setting (`reboot.*`), never the
/// request's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RebootRequest {
    /// The nodes to reboot, sorted; empty: every node whose sentinel is set.
    pub nodes: Vec<String>,
    /// Why, in words; kept in the run's history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Only say what a run would do now; queue nothing, touch nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// The body of `POST /v1/reboots` (and the `data` of a `rollgate.reboot.v1` event), as
/// it is read and documented; [`RebootRequest::from_json`] validates it.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"nodes": ["worker-3", "worker-7"], "reason": "kernel 6.1.0-28"}))]
pub struct RebootBody {
    /// Node names (1 to 1000 of them); leave out (or `[]`) for every node whose sentinel
    /// is set.
    #[schema(required = false, value_type = Vec<String>)]
    pub nodes: Option<Vec<String>>,
    /// Why, up to 500 characters, no control characters.
    #[schema(required = false, value_type = String)]
    pub reason: Option<String>,
    /// `true`: answer which nodes a run would reboot now, in which batches and order,
    /// and what would hold it; nothing is queued or touched (HTTP only).
    #[schema(required = false, value_type = bool)]
    pub dry_run: Option<bool>,
}

impl RebootRequest {
    /// Most nodes a request may name.
    pub const MAX_NODES: usize = 1000;
    /// Longest reason.
    pub const MAX_REASON: usize = 500;

    /// Reads and validates the JSON body of a reboot request, reporting every bad field.
    pub fn from_json(body: &Value) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let read: RebootBody = read_body(body, &mut errors);
        let mut nodes = read.nodes.unwrap_or_default();
        if nodes.len() > Self::MAX_NODES {
            errors.push(
                "nodes",
                format!(
                    "{} names; at most {} per request",
                    nodes.len(),
                    Self::MAX_NODES
                ),
            );
        }
        for (i, node) in nodes.iter().enumerate() {
            if let Some(problem) = node_name_problem(node) {
                errors.push(&format!("nodes[{i}]"), problem);
            }
        }
        nodes.sort();
        if let Some(twice) = nodes.windows(2).find(|w| w[0] == w[1]) {
            errors.push("nodes", format!("{} is named twice", twice[0]));
        }
        let reason = read.reason.filter(|r| !r.trim().is_empty());
        if let Some(reason) = &reason
            && (reason.chars().count() > Self::MAX_REASON || reason.chars().any(char::is_control))
        {
            errors.push(
                "reason",
                format!(
                    "must be at most {} characters, none of them control characters",
                    Self::MAX_REASON
                ),
            );
        }
        errors.into_result(Self {
            nodes,
            reason,
            dry_run: read.dry_run.unwrap_or(false),
        })
    }

    /// The request as the JSON the API takes.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// This request and `other` as one: the union of their nodes (every node when either
    /// names none), the reasons joined.
    pub fn merged(&self, other: &RebootRequest) -> RebootRequest {
        let nodes = if self.nodes.is_empty() || other.nodes.is_empty() {
            Vec::new()
        } else {
            let mut nodes: Vec<String> = self.nodes.iter().chain(&other.nodes).cloned().collect();
            nodes.sort();
            nodes.dedup();
            nodes
        };
        let reason = match (&self.reason, &other.reason) {
            (Some(a), Some(b)) if a != b => Some(format!("{a}; {b}")),
            (a, b) => a.clone().or_else(|| b.clone()),
        };
        RebootRequest {
            nodes,
            reason,
            dry_run: false,
        }
    }
}

/// Why `name` is not a Kubernetes node name (a DNS-1123 subdomain), if it is not.
fn node_name_problem(name: &str) -> Option<String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        None
    } else {
        Some(format!(
            "{:?} is not a node name (lowercase letters, digits, '-' and '.', at most 253)",
            name.chars().take(80).collect::<String>()
        ))
    }
}

impl ReadRequest for RebootRequest {
    fn read(json: &Value) -> Result<Self, FieldErrors> {
        Self::from_json(json)
    }
}

impl RunRequest for RebootRequest {
    fn to_json(&self) -> Value {
        RebootRequest::to_json(self)
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
    fn a_request_names_nodes_by_their_names_once_and_says_why_in_words() {
        let ok =
            RebootRequest::from_json(&json!({"nodes": ["w2", "w1"], "reason": "kernel"})).unwrap();
        assert_eq!(ok.nodes, ["w1", "w2"], "sorted");
        assert_eq!(ok.reason.as_deref(), Some("kernel"));
        assert_eq!(
            RebootRequest::from_json(&json!({})).unwrap().nodes,
            Vec::<String>::new()
        );
        let cases = [
            (json!({"nodes": ["W1;reboot"]}), "nodes[0]"),
            (json!({"nodes": ["w1", "w1"]}), "named twice"),
            (json!({"nodes": ["-w1"]}), "is not a node name"),
            (json!({"reason": "a\nb"}), "control characters"),
            (json!({"reason": "x".repeat(501)}), "at most 500"),
            (json!({"command": "rm -rf /"}), "command"),
            (json!(["w1"]), "JSON object"),
        ];
        for (body, says) in cases {
            let err = RebootRequest::from_json(&body).unwrap_err().to_string();
            assert!(err.contains(says), "{body}: {err}");
        }
        let many: Vec<String> = (0..1001).map(|i| format!("w{i}")).collect();
        assert!(RebootRequest::from_json(&json!({ "nodes": many })).is_err());
    }

    #[test]
    fn merging_unions_the_nodes_and_every_node_absorbs() {
        let r = |nodes: &[&str], reason: Option<&str>| RebootRequest {
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            reason: reason.map(str::to_owned),
            dry_run: false,
        };
        let cases = [
            (
                r(&["w1"], Some("a")),
                r(&["w2", "w1"], Some("b")),
                r(&["w1", "w2"], Some("a; b")),
            ),
            (r(&["w1"], None), r(&[], Some("b")), r(&[], Some("b"))),
            (
                r(&["w1"], Some("a")),
                r(&["w1"], Some("a")),
                r(&["w1"], Some("a")),
            ),
        ];
        for (a, b, want) in cases {
            assert_eq!(a.merged(&b), want, "{a:?} + {b:?}");
        }
    }
}
