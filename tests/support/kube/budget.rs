//! PodDisruptionBudgets as the disruption controller and the eviction subresource treat
//! them: `minAvailable` or `maxUnavailable`, integers or percentages, selectors with
//! `matchLabels` and `matchExpressions`; only Running, Ready pods that are not being
//! deleted count as healthy.

use super::selector::LabelSelector;
use serde_json::Value;

/// A budget's numbers at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numbers {
    pub expected: i64,
    pub desired: i64,
    pub healthy: i64,
}

impl Numbers {
    /// `disruptionsAllowed`: how many more may go.
    pub fn allowed(&self) -> i64 {
        (self.healthy - self.desired).max(0)
    }
}

/// An `IntOrString` scaled against `total`: an integer as it is, `"N%"` as N % of
/// `total`, rounded up when `round_up`.
pub fn scaled(value: &Value, total: i64, round_up: bool) -> Result<i64, String> {
    match value {
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| format!("invalid value {n}: must be an integer")),
        Value::String(s) => {
            let pct: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("invalid value {s:?}: an integer or a percentage"))?;
            let scaled = pct * total;
            Ok(if round_up {
                (scaled + 99) / 100
            } else {
                scaled / 100
            })
        }
        other => Err(format!("invalid value {other}: an integer or a percentage")),
    }
}

/// The budget's selector.
pub fn selector(pdb: &Value) -> Result<LabelSelector, String> {
    LabelSelector::from_object(&pdb["spec"]["selector"])
}

/// Whether `pod` is covered by `pdb`: same namespace and the selector matches (in
/// policy/v1 an empty selector matches every pod of the namespace).
pub fn covers(pdb: &Value, pod: &Value) -> bool {
    pdb["metadata"]["namespace"] == pod["metadata"]["namespace"]
        && selector(pdb).is_ok_and(|s| s.matches(pod))
}

/// Running, Ready and not being deleted.
pub fn healthy(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["phase"] == "Running"
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn replaced(pod: &Value) -> bool {
    pod["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|o| {
            o.iter()
                .any(|o| o["kind"] == "ReplicaSet" && o["controller"] == true)
        })
}

fn terminal(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// The budget's numbers over `pods` (every pod of the cluster); pods named in
/// `disrupted` (evicted, deletion not yet seen) do not count as healthy.
pub fn numbers<'a>(
    pdb: &Value,
    pods: impl Iterator<Item = &'a Value>,
    disrupted: &[String],
) -> Result<Numbers, String> {
    let covered: Vec<&Value> = pods.filter(|p| covers(pdb, p) && !terminal(p)).collect();
    // The controller's scale: a ReplicaSet's terminating pod has its replacement already.
    let expected = covered
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null() || !replaced(p))
        .count() as i64;
    let healthy = covered
        .iter()
        .filter(|p| healthy(p))
        .filter(|p| {
            p["metadata"]["name"]
                .as_str()
                .is_none_or(|n| !disrupted.iter().any(|d| d == n))
        })
        .count() as i64;
    let spec = &pdb["spec"];
    let desired = if !spec["maxUnavailable"].is_null() {
        (expected - scaled(&spec["maxUnavailable"], expected, true)?).max(0)
    } else if !spec["minAvailable"].is_null() {
        scaled(&spec["minAvailable"], expected, true)?
    } else {
        expected
    };
    Ok(Numbers {
        expected,
        desired,
        healthy,
    })
}
