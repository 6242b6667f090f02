//! Scale, measured (issue 28; the parts built so far):
//!
//! - **transitions**: the cost of one run transition (the engine deciding it, the store
//!   committing it) for a patch upgrade of 1 control plane + 10, 100 and 1,000 workers,
//!   on both backends: CPU time of this process per transition, and bytes written per
//!   transition (SQLite: what this process hands to `write`, from `/proc/self/io`;
//!   PostgreSQL: the WAL it generates, from `pg_current_wal_lsn`). Each size runs
//!   `BENCH_TRANSITIONS` (default 200) transitions of the same run, each step done at once.
//! - **plan**: `rollgate plan`'s own work for 1 + 5,000 nodes read from the fake API
//!   server (listing the nodes and planning), timed in this process.
//! - **peak_rss_mb**: this process's peak resident set (the fake API server with its
//!   5,000 nodes runs in it too).
//!
//! With `BENCH_JSON=FILE` the figures are also written there as JSON
//! (`transitions.<backend>.cpu_ms.<workers>`, `transitions.<backend>.bytes.<workers>`,
//! `plan.ms.5000`, `peak_rss_mb`).
//!
//! Run: `cargo bench --bench scale` (PostgreSQL's server binaries, as for the tests).

#[path = "../tests/support/mod.rs"]
mod support;

use chrono::Utc;
use rollgate::adapters::kube::Kube;
use rollgate::domain::engine::{Context, Input, Next, StepOutcome, advance};
use rollgate::domain::event::{DetectionRequest, StageSelection, UpgradeKind};
use rollgate::domain::k8s_upgrade::{self, MaxUnavailable, PlanSettings};
use rollgate::domain::run::{FailurePolicy, Run};
use rollgate::domain::version::Version;
use rollgate::ports::ClusterRead;
use rollgate::store::{Commit, Store};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::kube::FakeKube;

const SIZES: [usize; 3] = [10, 100, 1000];

fn transitions() -> usize {
    std::env::var("BENCH_TRANSITIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

/// The CPU time of this process's threads so far (the first field of each thread's
/// `schedstat`, in nanoseconds): rollgate's side only, not the PostgreSQL server's.
fn cpu() -> Duration {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let ns: u64 = tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// Bytes this process has handed to `write` so far (`wchar` of `/proc/self/io`).
fn written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A fake cluster of 1 control plane + `workers` workers, and rollgate's client of it.
async fn cluster(workers: usize) -> (FakeKube, Kube, tempfile::TempDir) {
    let fake = FakeKube::start().await;
    fake.add_namespace("default");
    fake.add_node("cp", true, "1.34.2", "1.7.24");
    for w in 0..workers {
        fake.add_node(&format!("w{w:05}"), false, "1.34.2", "1.7.24");
    }
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("kubeconfig");
    fake.write_kubeconfig(&path);
    let kube = support::rollgate_kube(&path).await;
    (fake, kube, dir)
}

fn request() -> DetectionRequest {
    DetectionRequest {
        target_version: Version::parse("1.34.5").expect("version"),
        kind: UpgradeKind::Patch,
        dry_run: false,
        stages: StageSelection::all(),
    }
}

/// The run of a patch upgrade of `kube`'s cluster, every step planned.
async fn planned_run(kube: &Kube) -> Run {
    let facts = kube.facts().await.expect("facts");
    let settings = PlanSettings {
        worker_order: Vec::new(),
        max_unavailable: MaxUnavailable::Count(1),
        failure_budget: Default::default(),
        etcd_max_lag: 1000,
    };
    let plan = k8s_upgrade::plan(&request(), &facts, None, &settings).expect("plan");
    let mut run = Run::k8s_upgrade(
        uuid::Uuid::now_v7().to_string(),
        &request(),
        FailurePolicy::default(),
        Utc::now(),
    );
    run.steps = k8s_upgrade::initial_steps(&request());
    run.steps.extend(plan.steps);
    run
}

fn always(_: &rollgate::domain::run::Step) -> bool {
    true
}

/// Per transition: CPU ms and bytes written, over `n` transitions of runs of `run`'s plan
/// on `store` (a new one each time one ends; each run's insert is counted too); `wal`
/// reads PostgreSQL's WAL position when the store is PostgreSQL.
async fn measure(
    store: &Store,
    mut run: Run,
    n: usize,
    wal: Option<&tokio_postgres::Client>,
) -> (f64, f64) {
    let template = run.clone();
    let ctx = Context {
        now: Utc::now(),
        can_execute: &always,
        max_attempts: 3,
        halt_after: chrono::Duration::minutes(30),
        retry: rollgate::domain::backoff::Backoff::new(
            Duration::from_secs(2),
            Duration::from_secs(300),
        ),
        jitter: 0.5,
        failure_budget: Default::default(),
    };
    let lsn = async |client: Option<&tokio_postgres::Client>| -> f64 {
        match client {
            Some(c) => c
                .query_one(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8",
                    &[],
                )
                .await
                .map_or(0.0, |r| r.get::<_, f64>(0)),
            None => 0.0,
        }
    };
    let (cpu_before, bytes_before, wal_before) = (cpu(), written(), lsn(wal).await);
    let mut next = Next::Nothing;
    let mut done = 0;
    while done < n {
        let input = match next {
            Next::RunStep { epoch, .. } => Input::StepFinished {
                epoch,
                outcome: StepOutcome::done("ok"),
            },
            // The worker delivers a wake through the queue, then runs the step.
            Next::WakeAt { epoch, .. } => Input::Wake { epoch },
            Next::All(_) => unreachable!("one worker at a time: one step in hand"),
            Next::Nothing => {
                // A fresh run of the same plan once one has ended.
                assert!(
                    done == 0 || run.status.is_terminal(),
                    "the run stopped at {:?}: {}",
                    run.status,
                    run.reason
                );
                run = template.clone();
                run.id = uuid::Uuid::now_v7().to_string();
                assert!(store.insert_run_if_absent(&run).await.expect("insert"));
                next = advance(&mut run, Input::Start, &ctx).expect("start");
                continue;
            }
        };
        next = advance(&mut run, input, &ctx).expect("advance");
        store
            .commit(Commit {
                runs: vec![run.clone()],
                ..Commit::default()
            })
            .await
            .expect("commit");
        done += 1;
    }
    assert!(done > 0, "no transition ran");
    let cpu_ms = (cpu() - cpu_before).as_secs_f64() * 1e3 / done as f64;
    let bytes = match wal {
        Some(_) => lsn(wal).await - wal_before,
        None => (written() - bytes_before) as f64,
    } / done as f64;
    (cpu_ms, bytes)
}

#[tokio::main]
async fn main() {
    let n = transitions();
    let mut results = json!({"transitions": {}, "plan": {"ms": {}}});
    println!(
        "compares: one run transition (engine + store commit) for 1 control plane + 10, 100 and 1,000 workers, on SQLite and PostgreSQL; the target is the 1,000-worker cost within 1.5x of the 10-worker one"
    );
    println!(
        "{:<10} {:>8} {:>7} {:>14} {:>16}",
        "backend", "workers", "steps", "cpu ms/trans", "bytes/trans"
    );
    let pg = support::postgres::Postgres::start();
    for backend in ["sqlite", "postgres"] {
        let mut cpu_at = serde_json::Map::new();
        let mut bytes_at = serde_json::Map::new();
        for workers in SIZES {
            let (_fake, kube, dir) = cluster(workers).await;
            let run = planned_run(&kube).await;
            let steps = run.steps.len();
            let (cpu_ms, bytes) = match backend {
                "sqlite" => {
                    let store = Store::open(&dir.path().join("store.db")).expect("store");
                    measure(&store, run, n, None).await
                }
                _ => {
                    let url = pg.database().await;
                    let store = Store::connect(&rollgate::store::postgres::PgSettings {
                        url: url.clone(),
                        password: None,
                        max_connections: 4,
                        timeout: Duration::from_secs(10),
                    })
                    .await
                    .expect("postgres store");
                    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .expect("connect");
                    tokio::spawn(connection);
                    measure(&store, run, n, Some(&client)).await
                }
            };
            println!("{backend:<10} {workers:>8} {steps:>7} {cpu_ms:>14.3} {bytes:>16.0}");
            cpu_at.insert(workers.to_string(), json!(cpu_ms));
            bytes_at.insert(workers.to_string(), json!(bytes));
        }
        let ratio = |m: &serde_json::Map<String, Value>| {
            m["1000"].as_f64().unwrap_or(0.0) / m["10"].as_f64().unwrap_or(0.0)
        };
        println!(
            "{backend}: 1,000 workers / 10 workers: cpu {:.1}x, bytes {:.1}x",
            ratio(&cpu_at),
            ratio(&bytes_at)
        );
        results["transitions"][backend] = json!({"cpu_ms": cpu_at, "bytes": bytes_at});
    }

    println!();
    println!(
        "compares: rollgate plan's work (list the nodes, plan) for 1 + 5,000 nodes against the 2 s target"
    );
    let (_fake, kube, _dir) = cluster(5000).await;
    let started = Instant::now();
    let run = planned_run(&kube).await;
    let took = started.elapsed();
    println!(
        "plan, 1 + 5,000 nodes: {:.0} ms ({} steps)",
        took.as_secs_f64() * 1e3,
        run.steps.len()
    );
    results["plan"]["ms"]["5000"] = json!(took.as_secs_f64() * 1e3);
    results["peak_rss_mb"] = json!(peak_rss_mb());
    println!("peak RSS of this process: {:.0} MB", peak_rss_mb());
    if let Ok(path) = std::env::var("BENCH_JSON") {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&results).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
}
