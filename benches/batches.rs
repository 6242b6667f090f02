//! Worker batches: the wall time of a 1 + 12-worker patch upgrade in the fake cluster
//! (`rollgate serve`, embedded queue, a real sshd per node running the node script) with
//! `cluster.max_unavailable` 1, 2 and 4, side by side in one run, and each one's ratio to
//! one worker at a time. Every worker carries 10 pods to evict. The soak is scaled down
//! alike for all three (BENCH_SOAK, default 5s: ten minutes at the rehearsal's 1/120), so
//! the ratio shows what batches save where soaks dominate, as they do in production.
//!
//! Run: `cargo bench --bench batches` (needs the test ground's Debian packages:
//! etcd-server, prometheus, openssh-server, curl).

#[path = "../tests/support/mod.rs"]
mod support;

use chrono::{DateTime, Utc};
use serde_json::Value;
use std::time::{Duration, Instant};
use support::ground::Ground;

const WORKERS: usize = 12;

fn soak() -> String {
    std::env::var("BENCH_SOAK").unwrap_or_else(|_| "5s".into())
}

fn at(step: &Value, field: &str) -> DateTime<Utc> {
    step[field]
        .as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("no {field} in {step}"))
        .with_timezone(&Utc)
}

/// One upgrade with `max_unavailable`: its wall time (POST to succeeded), the workers
/// stage's time (first worker gate's start to last soak's end) and the most workers
/// cordoned at once.
async fn upgrade(max_unavailable: &str) -> (Duration, Duration, usize) {
    let ground = Ground::start("1.34.2", WORKERS).await;
    for i in 1..=WORKERS {
        ground.api.add_pods(&format!("w{i}"), "web", 10, false);
    }
    let mut env = ground.env();
    env.extend([
        ("ROLLGATE__LOG__LEVEL".to_owned(), "warn".to_owned()),
        ("ROLLGATE__CLUSTER__SOAK".to_owned(), soak()),
        (
            "ROLLGATE__CLUSTER__MAX_UNAVAILABLE".to_owned(),
            max_unavailable.to_owned(),
        ),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let rg = support::Rollgate::start(&env).await;
    let started = Instant::now();
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_status(&id, "succeeded", Duration::from_secs(900))
        .await;
    let wall = started.elapsed();
    ground.assert_all_at("1.34.5");
    let workers: Vec<&Value> = run["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["stage"] == "workers")
        .collect();
    let (first, last) = (
        workers.first().expect("a step"),
        workers.last().expect("a step"),
    );
    let stage = (at(last, "ended_at") - at(first, "started_at"))
        .to_std()
        .unwrap_or_default();
    let (most, _) = ground.most_workers_cordoned_at_once();
    (wall, stage, most)
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mut rows = Vec::new();
    for max_unavailable in ["1", "2", "4"] {
        rows.push((max_unavailable, upgrade(max_unavailable).await));
    }
    let (base_wall, base_stage) = (rows[0].1.0.as_secs_f64(), rows[0].1.1.as_secs_f64());
    println!();
    println!(
        "1 control plane + {WORKERS} workers, patch upgrade, soak {} (same for all)",
        soak()
    );
    println!(
        "{:<16} {:>10} {:>8} {:>14} {:>8} {:>16}",
        "max_unavailable", "wall s", "ratio", "workers s", "ratio", "most cordoned"
    );
    for (max_unavailable, (wall, stage, most)) in &rows {
        println!(
            "{max_unavailable:<16} {:>10.1} {:>8.2} {:>14.1} {:>8.2} {most:>16}",
            wall.as_secs_f64(),
            wall.as_secs_f64() / base_wall,
            stage.as_secs_f64(),
            stage.as_secs_f64() / base_stage,
        );
    }
}
