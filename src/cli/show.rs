//! `rollgate runs show ID`: one run in words, from its JSON (`GET /v1/runs/{id}`): its
//! status, every step with its attempts and last outcome, each batch analysis's verdict
//! with its figures, and the history.

use serde_json::Value;
use std::fmt::Write;

/// The run `run` (the API's JSON) as a person reads it.
pub fn run_in_words(run: &Value) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let mut out = String::new();
    let target = run["target"]
        .as_str()
        .map(|t| format!(" → {t}"))
        .unwrap_or_default();
    let _ = writeln!(out, "run      {}", s(&run["id"]));
    let _ = writeln!(out, "kind     {}{target}", s(&run["kind"]));
    let _ = writeln!(out, "status   {}: {}", s(&run["status"]), s(&run["reason"]));
    let blockers: Vec<String> = strings(&run["blockers"]);
    if !blockers.is_empty() {
        let _ = writeln!(out, "held by  {}", blockers.join("; "));
    }
    let _ = writeln!(
        out,
        "created  {}, updated {}",
        s(&run["created_at"]),
        s(&run["updated_at"])
    );
    let steps = run["steps"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let labels: Vec<String> = steps.iter().map(label).collect();
    let width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(4);
    let _ = writeln!(
        out,
        "\n{:<width$}  {:<8}  {:>8}  OUTCOME",
        "STEP", "STATUS", "ATTEMPTS"
    );
    for (step, label) in steps.iter().zip(&labels) {
        let _ = writeln!(
            out,
            "{label:<width$}  {:<8}  {:>8}  {}",
            s(&step["status"]),
            step["attempts"].as_u64().unwrap_or(0),
            step["outcome"].as_str().unwrap_or("")
        );
    }
    let analyses = analyses_in_words(steps);
    if !analyses.is_empty() {
        let _ = write!(out, "\nBATCH ANALYSES\n{analyses}");
    }
    let _ = writeln!(out, "\nHISTORY");
    for t in run["history"].as_array().into_iter().flatten() {
        let by = t["by"]
            .as_str()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
        let step = t["step"]
            .as_str()
            .map(|st| format!(" at {st}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{}  {}{step}{by}: {}",
            s(&t["at"]),
            s(&t["to"]),
            s(&t["reason"])
        );
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b.as_str().map(str::to_owned))
        .collect()
}

/// `stage/name@node`.
fn label(step: &Value) -> String {
    let mut l = format!(
        "{}/{}",
        step["stage"].as_str().unwrap_or("-"),
        step["name"].as_str().unwrap_or("-")
    );
    if let Some(node) = step["node"].as_str() {
        l.push('@');
        l.push_str(node);
    }
    l
}

/// A figure to `digits` places; JSON's `null` change is an infinite one.
fn figure(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map_or_else(|| "∞".to_owned(), |x| format!("{x:.digits$}"))
}

/// Each analysis step's findings, batch by batch: the verdict, the effect and p-value, and
/// both groups' nodes with their changes.
fn analyses_in_words(steps: &[Value]) -> String {
    let mut out = String::new();
    let analysis_steps = steps.iter().filter(|s| s["name"] == "analysis");
    for (batch, step) in analysis_steps.enumerate() {
        for f in step["findings"].as_array().into_iter().flatten() {
            let judged = match f["why"].as_str() {
                Some(why) => why.to_owned(),
                None => format!(
                    "effect {} (tolerance {}, {} is bad), p = {}",
                    figure(&f["effect"], 2),
                    f["tolerance"],
                    f["direction"].as_str().unwrap_or("-"),
                    figure(&f["p_value"], 4)
                ),
            };
            let _ = writeln!(
                out,
                "batch {}  {}  {}  {}: {judged}",
                batch + 1,
                label(step),
                f["analysis"].as_str().unwrap_or("-"),
                f["verdict"].as_str().unwrap_or("-"),
            );
            for (name, group) in [("batch", &f["canary"]), ("comparison", &f["baseline"])] {
                let nodes = strings(&group["nodes"]);
                let changes = group["changes"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or(&[]);
                let each: Vec<String> = nodes
                    .iter()
                    .zip(changes)
                    .map(|(node, change)| format!("{node} {}", figure(change, 3)))
                    .collect();
                let median = if nodes.is_empty() {
                    "no data".to_owned()
                } else {
                    format!("median change {}", figure(&group["median"], 3))
                };
                let _ = writeln!(
                    out,
                    "  {name:<10}  {} node(s), {median}: {}",
                    nodes.len(),
                    each.join(", ")
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_run_in_words_names_its_steps_its_analyses_with_their_figures_and_its_history() {
        let run = json!({
            "id": "r1", "kind": "upgrade-k8s", "target": "1.34.5", "status": "halted",
            "reason": "step workers/analysis@w2: analysis latency fail",
            "blockers": [], "created_at": "2026-12-07T00:00:00Z", "updated_at": "2026-12-07T00:05:00Z",
            "steps": [
                {"stage": "workers", "name": "gate", "status": "done", "attempts": 1, "outcome": "gate open"},
                {"stage": "workers", "name": "analysis", "node": "w2", "status": "failed", "attempts": 1,
                 "outcome": "analysis latency fail",
                 "findings": [{"analysis": "latency", "verdict": "fail", "direction": "increase",
                     "tolerance": 1.2, "effect": 1.31, "p_value": 0.00202,
                     "canary": {"nodes": ["w1", "w2"], "changes": [1.3, null], "median": null},
                     "baseline": {"nodes": ["w3"], "changes": [1.01], "median": 1.01}}]},
                {"stage": "workers", "name": "analysis", "node": "w4", "status": "pending", "attempts": 0,
                 "findings": [{"analysis": "latency", "verdict": "inconclusive", "why": "no data for the batch",
                     "direction": "increase", "tolerance": 1.2, "effect": null, "p_value": null,
                     "canary": {"nodes": [], "changes": [], "median": null},
                     "baseline": {"nodes": [], "changes": [], "median": null}}]}
            ],
            "history": [{"at": "2026-12-07T00:05:00Z", "from": "running", "to": "halted",
                "step": "workers/analysis@w2", "reason": "analysis latency fail", "by": null}]
        });
        let words = run_in_words(&run);
        for want in [
            "kind     upgrade-k8s → 1.34.5",
            "status   halted: step workers/analysis@w2",
            "workers/analysis@w2  failed           1  analysis latency fail",
            "batch 1  workers/analysis@w2  latency  fail: effect 1.31 (tolerance 1.2, increase is bad), p = 0.0020",
            "  batch       2 node(s), median change ∞: w1 1.300, w2 ∞",
            "  comparison  1 node(s), median change 1.010: w3 1.010",
            "batch 2  workers/analysis@w4  latency  inconclusive: no data for the batch",
            "  batch       0 node(s), no data: ",
            "2026-12-07T00:05:00Z  halted at workers/analysis@w2: analysis latency fail",
        ] {
            assert!(words.contains(want), "{want:?} not in\n{words}");
        }
    }
}
