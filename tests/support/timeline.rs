//! A finished upgrade's timeline, read off its steps' start and end times as the API
//! shows them: what the benches compare with an ideal.

use serde_json::Value;

/// Where the time of one upgrade went, in seconds.
pub struct Timeline {
    /// The control-plane stage: its first step's start to its last step's end.
    pub control_plane: f64,
    /// The control-plane and workers stages together.
    pub measured: f64,
    /// Each worker's drain start to its uncordon's end.
    pub cycles: Vec<f64>,
    /// Each workers' soak.
    pub soaks: Vec<f64>,
}

impl Timeline {
    /// The timeline of `run` (`GET /v1/runs/{id}`), which has ended.
    pub fn of(run: &Value) -> Self {
        let steps = run["steps"].as_array().expect("steps");
        let stage =
            |name: &str| -> Vec<&Value> { steps.iter().filter(|s| s["stage"] == name).collect() };
        let (cps, ws) = (stage("control-plane"), stage("workers"));
        let (cp_first, cp_last) = (cps.first().expect("a step"), cps.last().expect("a step"));
        let w_last = ws.iter().map(|s| at(s, "ended_at")).max().expect("a step");
        let step = |name: &str, node: &str| -> &Value {
            ws.iter()
                .find(|s| s["name"] == name && s["node"] == node)
                .unwrap_or_else(|| panic!("no {name}@{node}"))
        };
        let drained: Vec<&str> = ws
            .iter()
            .filter(|s| s["name"] == "drain")
            .filter_map(|s| s["node"].as_str())
            .collect();
        Self {
            control_plane: secs(at(cp_first, "started_at"), at(cp_last, "ended_at")),
            measured: secs(at(cp_first, "started_at"), w_last),
            cycles: drained
                .iter()
                .map(|n| {
                    secs(
                        at(step("drain", n), "started_at"),
                        at(step("uncordon", n), "ended_at"),
                    )
                })
                .collect(),
            soaks: ws
                .iter()
                .filter(|s| s["name"] == "soak")
                .map(|s| secs(at(s, "started_at"), at(s, "ended_at")))
                .collect(),
        }
    }
}

/// A step's `field` (`started_at`, `ended_at`) as a time.
pub fn at(step: &Value, field: &str) -> chrono::DateTime<chrono::Utc> {
    step[field]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("no {field} in {step}"))
        .with_timezone(&chrono::Utc)
}

/// Seconds from `from` to `to` (0 when `to` is earlier).
pub fn secs(from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>) -> f64 {
    (to - from).to_std().unwrap_or_default().as_secs_f64()
}

/// The `q` quantile of `values` (0.5: the median), nearest rank.
pub fn quantile(mut values: Vec<f64>, q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let i = ((values.len() as f64 * q).ceil() as usize).saturating_sub(1);
    values.get(i).copied().unwrap_or(0.0)
}
