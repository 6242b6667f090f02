//! `rollgate fleet status`: the chain of clusters upstream of this one, as this rollgate
//! and each upstream last saw them.

use std::fmt::Write as _;
use std::process::ExitCode;

use super::runs::Api;
use crate::workflows::fleet::view::{FleetView, UpstreamView};

/// Prints this cluster and, indented below it, each upstream with its own upstreams.
pub(super) async fn status(api: &Api, json: bool) -> anyhow::Result<ExitCode> {
    let value = api.get(&["v1", "fleet"]).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    let view: FleetView = serde_json::from_value(value)
        .map_err(|e| anyhow::anyhow!("the answer is not a fleet view: {e}"))?;
    print!("{}", render(&view));
    Ok(ExitCode::SUCCESS)
}

/// The chain as text: a line per cluster, its upstreams below it, each indented further.
pub fn render(view: &FleetView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", cluster_line(view, None));
    chain(&mut out, &view.upstreams, 1);
    out
}

fn chain(out: &mut String, upstreams: &[UpstreamView], depth: usize) {
    for upstream in upstreams {
        let indent = "  ".repeat(depth);
        match &upstream.view {
            Some(view) => {
                let _ = writeln!(out, "{indent}↑ {}", cluster_line(view, Some(upstream)));
                for blocker in &upstream.blockers {
                    let _ = writeln!(out, "{indent}    holds: {blocker}");
                }
                chain(out, &view.upstreams, depth + 1);
            }
            None => {
                let _ = writeln!(
                    out,
                    "{indent}↑ {} ({}): {}",
                    upstream.name,
                    upstream.url,
                    upstream.blockers.join("; ")
                );
            }
        }
    }
}

fn cluster_line(view: &FleetView, seen: Option<&UpstreamView>) -> String {
    let versions: Vec<String> = view
        .versions
        .api_server
        .keys()
        .chain(view.versions.kubelet.keys())
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let upgrade = view.last_runs.get("k8s-upgrade").map_or_else(
        || "no upgrade yet".to_owned(),
        |r| {
            format!(
                "last upgrade {} {}{}",
                r.target.as_deref().unwrap_or("-"),
                r.status,
                r.ended_at
                    .map(|t| format!(" at {}", t.format("%Y-%m-%dT%H:%M:%SZ")))
                    .unwrap_or_default()
            )
        },
    );
    let quiet = view.gate.quiet_since.map_or_else(
        || "not quiet".to_owned(),
        |t| format!("quiet since {}", t.format("%Y-%m-%dT%H:%M:%SZ")),
    );
    let soak = seen.map_or_else(String::new, |u| match (u.ready, u.soak_remaining_secs) {
        (true, _) => format!("; ready for {}", u.version.as_deref().unwrap_or("-")),
        (false, Some(left)) if left > 0 => format!("; soak left {left}s"),
        _ => "; not ready".to_owned(),
    });
    format!(
        "{}: runs {}; {upgrade}; gate {} ({quiet}){soak}",
        view.name,
        if versions.is_empty() {
            "-".to_owned()
        } else {
            versions.join(", ")
        },
        view.gate.verdict
    )
}
