//! Scale, measured (issues 28 and 41). `BENCH_PARTS` picks parts (default all:
//! `transitions,outcomes,plan,memory,batches,etcd_roll`).
//!
//! - **transitions**: the cost of one run transition (the engine deciding it, the store
//!   committing it) for a patch upgrade of 1 control plane + 10, 100 and 1,000 workers,
//!   on both backends: CPU time of this process per transition, and bytes written per
//!   transition (SQLite: what this process hands to `write`, from `/proc/self/io`;
//!   PostgreSQL: the WAL it generates, from `pg_current_wal_lsn`). Each size runs
//!   `BENCH_TRANSITIONS` (default 200) transitions of the same run, each step done at once.
//!   A run's creation (every step written once, once per run) is not counted.
//! - **outcomes**: the worker's own path for each step outcome, as `serve` runs it (the
//!   read of the run under its lock, the engine, the commit, the hand-off to the executor,
//!   wakes through the embedded queue), on a real store of each backend: a patch upgrade of
//!   1 control plane + 10, 100 and 1,000 workers driven from its queued event to its end
//!   with every step done at once. CPU of this process per outcome, and for the whole run.
//! - **plan**: `rollgate plan`'s own work for 1 + 5,000 nodes read from the fake API
//!   server (listing the nodes and planning), timed in this process.
//! - **peak_rss_mb**: this process's peak resident set (the fake API server with its
//!   5,000 nodes runs in it too).
//! - **memory**: what the kube adapter adds to this process's peak resident set reading
//!   1 + 5,000 nodes and 150,000 pods from the fake API server (in this process too, so
//!   its own memory is the baseline): the nodes, every pod's readiness (in pages of 500),
//!   one node's drain facts.
//! - **batches**: `rollgate serve` upgrading 1 control plane + `BENCH_WORKERS` (48)
//!   workers of the test ground (a real sshd per node), node script 2 s, soak 5 s, with
//!   `max_unavailable` 1, 4 and 12: the efficiency ideal / measured, where measured is the
//!   control-plane and workers stages' time and ideal = ceil(workers / k) x (one node's
//!   drain + script + verify + uncordon, the median at k = 1, + the soak) + the
//!   control-plane stage's time of the same run.
//! - **etcd_roll**: 5 real etcd members rolled by rollgate (`cooldown` 0: it goes on when
//!   the member has caught up) beside a naive loop (restart a member, wait until every
//!   member answers, a leader is agreed and all are within 1000 of its index: the same
//!   readiness check), in the same run; the wall-time ratio and each one's leadership
//!   changes.
//!
//! With `BENCH_JSON=FILE` the figures are also written there as JSON
//! (`transitions.<backend>.cpu_ms.<workers>`, `transitions.<backend>.bytes.<workers>`,
//! `outcome.<backend>.cpu_ms.<workers>`, `whole_run.<backend>.cpu_ms.<workers>`,
//! `plan.ms.5000`, `peak_rss_mb`, `batches.efficiency.<k>`, `etcd_roll.wall_ratio`).
//!
//! Run: `cargo bench --bench scale` (PostgreSQL's server binaries, as for the tests).

#[path = "../tests/support/mod.rs"]
mod support;

// Its readiness check and term reading; the write load is the etcd_roll bench's.
#[allow(dead_code)]
#[path = "support/etcd_load.rs"]
mod etcd_load;

use chrono::Utc;
use rollgate::adapters::kube::Kube;
use rollgate::adapters::notify::LogNotifier;
use rollgate::domain::engine::{Context, Input, Next, StepOutcome, advance};
use rollgate::domain::event::{CloudEvent, EventData, ROLLGATE_SOURCE};
use rollgate::domain::event::{DetectionRequest, StageSelection, UpgradeKind};
use rollgate::domain::run::{FailurePolicy, Run, RunStatus};
use rollgate::domain::run_request::RunAsked;
use rollgate::domain::version::Version;
use rollgate::metrics::Metrics;
use rollgate::ports::{ClusterRead, Executors, NodeDrain, StepExecutor};
use rollgate::queue::embedded::EmbeddedQueue;
use rollgate::queue::{Outgoing, Queue};
use rollgate::store::{Commit, Store};
use rollgate::worker::{Worker, WorkerPolicy};
use rollgate::workflows::k8s_upgrade::plan::{self as k8s_upgrade, MaxUnavailable, PlanSettings};
use serde_json::{Value, json};
use std::sync::Arc;
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
    support::proc_status_mb("self", "VmHWM").unwrap_or(0.0)
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
        build: None,
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
        reboot_after_upgrade: false,
        distribution: Default::default(),
        judge_batches: false,
    };
    let plan = k8s_upgrade::plan(&request(), &facts, None, &settings).expect("plan");
    let mut run = rollgate::workflows::k8s_upgrade::plan::new_run(
        uuid::Uuid::now_v7().to_string(),
        &request(),
        false,
        FailurePolicy::default(),
        Utc::now(),
    );
    run.steps = k8s_upgrade::initial_steps(&request(), false).into();
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
    let bytes_now = async || match wal {
        Some(_) => lsn(wal).await,
        None => written() as f64,
    };
    let (cpu_before, bytes_before) = (cpu(), bytes_now().await);
    // A run's creation (once per run: every step written once) is not a transition.
    let (mut cpu_apart, mut bytes_apart) = (Duration::ZERO, 0.0);
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
                let (cpu_at, bytes_at) = (cpu(), bytes_now().await);
                run = template.clone();
                run.id = uuid::Uuid::now_v7().to_string();
                let mut commit = Commit {
                    runs: vec![run],
                    ..Commit::default()
                };
                store.commit_keeping(&mut commit).await.expect("insert");
                run = commit.runs.pop().expect("the run back");
                next = advance(&mut run, Input::Start, &ctx).expect("start");
                cpu_apart += cpu() - cpu_at;
                bytes_apart += bytes_now().await - bytes_at;
                continue;
            }
        };
        next = advance(&mut run, input, &ctx).expect("advance");
        // As the worker does: the run goes into the commit and comes back written.
        let mut commit = Commit {
            runs: vec![run],
            ..Commit::default()
        };
        store.commit_keeping(&mut commit).await.expect("commit");
        run = commit.runs.pop().expect("the run back");
        done += 1;
    }
    assert!(done > 0, "no transition ran");
    let cpu_ms = (cpu() - cpu_before - cpu_apart).as_secs_f64() * 1e3 / done as f64;
    let bytes = (bytes_now().await - bytes_before - bytes_apart) / done as f64;
    (cpu_ms, bytes)
}

#[tokio::main]
async fn main() {
    rollgate::workflows::register();
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let parts = std::env::var("BENCH_PARTS")
        .unwrap_or_else(|_| "transitions,outcomes,plan,memory,batches,etcd_roll".into());
    let parts: Vec<&str> = parts.split(',').map(str::trim).collect();
    let mut results = json!({"transitions": {}, "outcome": {}, "whole_run": {}, "plan": {"ms": {}}, "batches": {"efficiency": {}}, "etcd_roll": {}});
    if parts.contains(&"transitions") {
        transitions_part(&mut results).await;
    }
    if parts.contains(&"outcomes") {
        outcomes_part(&mut results).await;
    }
    if parts.contains(&"plan") {
        plan_part(&mut results).await;
    }
    if parts.contains(&"memory") {
        memory_part(&mut results).await;
    }
    if parts.contains(&"batches") {
        batches_part(&mut results).await;
    }
    if parts.contains(&"etcd_roll") {
        etcd_roll_part(&mut results).await;
    }
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

/// A store on the PostgreSQL database at `url`.
async fn pg_store(url: &str) -> Store {
    Store::connect(&rollgate::store::postgres::PgSettings {
        url: url.to_owned(),
        password: None,
        max_connections: 4,
        timeout: Duration::from_secs(10),
    })
    .await
    .expect("postgres store")
}

async fn transitions_part(results: &mut Value) {
    let n = transitions();
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
                    let store = pg_store(&url).await;
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
}

/// The executor of every step in the `outcomes` part: done at once, so that what is
/// measured is rollgate's own work for each outcome.
struct AtOnce;

#[async_trait::async_trait]
impl StepExecutor for AtOnce {
    async fn execute(&self, _run: &Run, _index: usize) -> StepOutcome {
        StepOutcome::done("done")
    }
}

/// The CPU of this process while `serve`'s worker drives `run` (written to `store` as the
/// intake writes it, its event queued on an embedded queue in `dir`) from start to its end,
/// every step done at once; and how many step outcomes it took in.
async fn whole_run(store: Store, dir: &std::path::Path, run: Run) -> (Duration, usize) {
    let queue: Arc<dyn Queue> = Arc::new(
        EmbeddedQueue::open(&dir.join("queue.db"), Duration::from_secs(600), 10).expect("queue"),
    );
    let every: Arc<dyn StepExecutor> = Arc::new(AtOnce);
    let executors = Executors {
        gate: Some(every.clone()),
        ..Executors::default()
    }
    .with(rollgate::domain::upgrade_step::K8S_UPGRADE, every.clone())
    .with(
        rollgate::workflows::etcd_roll::step::ETCD_ROLL,
        every.clone(),
    )
    .with(rollgate::workflows::node_reboot::step::NODE_REBOOT, every);
    let policy = WorkerPolicy {
        max_attempts: 3,
        halt_after: Duration::from_secs(1800),
        on_failure: FailurePolicy::default(),
        failure_budget: Default::default(),
        asks_upstreams: false,
    };
    let id = run.id.clone();
    let steps = run.steps.len();
    store
        .commit(Commit {
            runs: vec![run],
            ..Commit::default()
        })
        .await
        .expect("the run written as the intake writes it");
    let data = EventData::Run(RunAsked {
        door: &rollgate::workflows::k8s_upgrade::intake::DOOR,
        run_id: Some(id.clone()),
        request: Arc::new(request()),
    });
    let event = CloudEvent::new(&data, ROLLGATE_SOURCE, Utc::now());
    queue
        .publish(Outgoing::event(&event, data.event_type()))
        .await
        .expect("queued");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = cpu();
    // As `serve` does: the worker acts while this replica holds the store's lease.
    let leading = rollgate::workflows::leader::campaign(
        store.clone(),
        Duration::from_secs(15),
        Metrics::new(),
        stopped.clone(),
    );
    let worker = Worker::new(
        queue,
        store.clone(),
        Metrics::new(),
        executors,
        policy,
        Arc::new(LogNotifier),
    )
    .led_by(leading);
    let serving = tokio::spawn(worker.run(stopped));
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            Instant::now() < deadline,
            "the run has not ended within an hour"
        );
        let ended = store
            .list_summaries(None, 1)
            .await
            .expect("summaries")
            .first()
            .is_some_and(|s| s.status.is_terminal());
        if ended {
            break;
        }
    }
    let took = cpu() - started;
    let _ = stop.send(true);
    let _ = serving.await;
    let run = store.get_run(&id).await.expect("read").expect("the run");
    assert_eq!(run.status, RunStatus::Succeeded, "{}", run.reason);
    assert!(run.steps.len() >= steps);
    let outcomes = run.steps.iter().map(|s| s.attempts as usize).sum();
    (took, outcomes)
}

/// The worker's own path for each step outcome, as `serve` runs it: the read of the run,
/// the engine, the commit, the hand-off to the executor, through the queue for wakes.
async fn outcomes_part(results: &mut Value) {
    println!();
    println!(
        "compares: CPU per step outcome through the worker's own path (read, advance, commit, hand-off) for 1 control plane + 10, 100 and 1,000 workers, on SQLite and PostgreSQL; targets: 1,000 workers within 1.5x of 10 per outcome, a whole run at 1,000 within 12x of 100"
    );
    println!(
        "{:<10} {:>8} {:>9} {:>15} {:>13}",
        "backend", "workers", "outcomes", "cpu ms/outcome", "whole run s"
    );
    let pg = support::postgres::Postgres::start();
    for backend in ["sqlite", "postgres"] {
        let mut per_outcome = serde_json::Map::new();
        let mut whole = serde_json::Map::new();
        for workers in SIZES {
            let (_fake, kube, dir) = cluster(workers).await;
            let run = planned_run(&kube).await;
            let store = match backend {
                "sqlite" => Store::open(&dir.path().join("store.db")).expect("store"),
                _ => pg_store(&pg.database().await).await,
            };
            let (took, outcomes) = whole_run(store, dir.path(), run).await;
            let ms = took.as_secs_f64() * 1e3 / outcomes.max(1) as f64;
            println!(
                "{backend:<10} {workers:>8} {outcomes:>9} {ms:>15.3} {:>13.1}",
                took.as_secs_f64()
            );
            per_outcome.insert(workers.to_string(), json!(ms));
            whole.insert(workers.to_string(), json!(took.as_secs_f64() * 1e3));
        }
        let ratio = |m: &serde_json::Map<String, Value>, a: &str, b: &str| {
            m[a].as_f64().unwrap_or(0.0) / m[b].as_f64().unwrap_or(f64::NAN)
        };
        println!(
            "{backend}: per outcome 1,000 / 10 workers: {:.1}x; whole run 1,000 / 100 workers: {:.1}x",
            ratio(&per_outcome, "1000", "10"),
            ratio(&whole, "1000", "100")
        );
        results["outcome"][backend] = json!({"cpu_ms": per_outcome});
        results["whole_run"][backend] = json!({"cpu_ms": whole});
    }
}

async fn plan_part(results: &mut Value) {
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
}

/// This process's resident set now, in MB.
fn rss_mb() -> f64 {
    support::proc_status_mb("self", "VmRSS").unwrap_or(0.0)
}

async fn memory_part(results: &mut Value) {
    println!();
    println!(
        "compares: what rollgate's kube adapter adds to this process's memory reading 1 + 5,000 nodes and 150,000 pods (the nodes, every pod's readiness, one node's drain facts) against the 200 MB bound"
    );
    let (fake, kube, _dir) = cluster(5000).await;
    for w in 0..5000 {
        fake.add_pods(&format!("w{w:05}"), "web", 30, false);
    }
    let resident = rss_mb();
    let started = Instant::now();
    let facts = kube.facts().await.expect("facts");
    let (ready, total) = kube.pod_readiness().await.expect("pod readiness");
    let drain = kube.drain_facts("w00042").await.expect("drain facts");
    let took = started.elapsed();
    let added = (peak_rss_mb() - resident).max(0.0);
    println!(
        "{} nodes, {ready} of {total} pods Ready, {} pods on w00042: {:.1} s; resident before {resident:.0} MB (the fake API server's 150,000 pods), peak after {:.0} MB: the adapter added at most {added:.0} MB",
        facts.nodes.len(),
        drain.pods.len(),
        took.as_secs_f64(),
        peak_rss_mb()
    );
    results["memory"] =
        json!({"nodes": facts.nodes.len(), "pods": total, "adapter_added_mb": added});
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// One upgrade of the ground's cluster with `max_unavailable` `k`.
struct BatchRun {
    /// The control-plane stage: its first step's start to its last step's end.
    control_plane: f64,
    /// The control-plane and workers stages together.
    measured: f64,
    /// Each worker's drain start to its uncordon's end.
    cycles: Vec<f64>,
    /// Each workers' soak.
    soaks: Vec<f64>,
    /// The most workers cordoned at once (the API server's own log).
    most: usize,
}

async fn batch_upgrade(workers: usize, k: usize) -> BatchRun {
    let ground = support::ground::Ground::start("1.34.2", workers).await;
    for node in &ground.nodes {
        node.slow_kubeadm(2);
    }
    let rg = ground
        .rollgate(&[
            ("ROLLGATE__LOG__LEVEL", "warn".into()),
            ("ROLLGATE__CLUSTER__SOAK", "5s".into()),
            ("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", k.to_string()),
        ])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_status(&id, "succeeded", Duration::from_secs(3600))
        .await;
    ground.assert_all_at("1.34.5");
    let timeline = support::timeline::Timeline::of(&run);
    BatchRun {
        control_plane: timeline.control_plane,
        measured: timeline.measured,
        cycles: timeline.cycles,
        soaks: timeline.soaks,
        most: ground.most_workers_cordoned_at_once().0,
    }
}

async fn batches_part(results: &mut Value) {
    let workers: usize = std::env::var("BENCH_WORKERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48);
    println!();
    println!(
        "compares: 1 control plane + {workers} workers upgraded with max_unavailable 1, 4 and 12 (node script 2 s, soak 5 s) against the ideal ceil({workers}/k) x (one node's cycle + soak) + the control plane's time"
    );
    let mut runs = Vec::new();
    for k in [1usize, 4, 12] {
        runs.push((k, batch_upgrade(workers, k).await));
    }
    let cycle = median(runs[0].1.cycles.clone());
    let soak = median(runs[0].1.soaks.clone());
    println!("one node's cycle (median at k = 1): {cycle:.2} s; soak {soak:.2} s");
    println!(
        "{:>4} {:>12} {:>12} {:>12} {:>11} {:>14}",
        "k", "measured s", "ideal s", "control s", "efficiency", "most cordoned"
    );
    for (k, run) in &runs {
        let ideal = workers.div_ceil(*k) as f64 * (cycle + soak) + run.control_plane;
        let efficiency = ideal / run.measured;
        println!(
            "{k:>4} {:>12.1} {ideal:>12.1} {:>12.1} {efficiency:>11.2} {:>14}",
            run.measured, run.control_plane, run.most
        );
        results["batches"]["efficiency"][k.to_string()] = json!(efficiency);
    }
}

/// Rolls 5 members with rollgate, or with the naive loop; wall seconds and the raft term's
/// rise.
async fn etcd_roll_once(rollgate_roll: bool) -> (f64, u64) {
    use rollgate::workflows::etcd_roll::{RollSettings, roll};
    use std::sync::Arc;
    let cluster = support::scripted::Scripted::start(5).await;
    let etcd = Arc::new(cluster.etcd());
    etcd_load::wait_healthy(&etcd).await;
    let term = etcd_load::max_term(&etcd).await;
    let started = Instant::now();
    if rollgate_roll {
        let driver = cluster.command_driver();
        let settings = RollSettings {
            ready_timeout: Duration::from_secs(30),
            cooldown: Duration::ZERO,
            max_lag: 1000,
            transfer_timeout: Duration::from_secs(10),
        };
        roll(etcd.clone(), &driver, &settings, None, |_| {})
            .await
            .expect("rollgate roll");
    } else {
        for name in cluster.names.iter().rev() {
            let ok = tokio::process::Command::new(cluster.path("restart.sh"))
                .args([name.as_str(), "TERM"])
                .status()
                .await
                .expect("restart script")
                .success();
            assert!(ok, "restart.sh {name}");
            etcd_load::wait_healthy(&etcd).await;
        }
    }
    let took = started.elapsed().as_secs_f64();
    (took, etcd_load::max_term(&etcd).await.saturating_sub(term))
}

async fn etcd_roll_part(results: &mut Value) {
    println!();
    println!(
        "compares: a 5-member etcd roll by rollgate (goes on once a member has caught up) against a naive restart-then-wait-healthy loop with the same readiness check, in the same run"
    );
    let (naive, naive_changes) = etcd_roll_once(false).await;
    let (ours, our_changes) = etcd_roll_once(true).await;
    println!(
        "naive loop {naive:.2} s ({naive_changes} leadership change(s)); rollgate {ours:.2} s ({our_changes}); ratio {:.2}",
        ours / naive
    );
    results["etcd_roll"]["wall_ratio"] = json!(ours / naive);
    results["etcd_roll"]["changes"] = json!({"rollgate": our_changes, "naive": naive_changes});
}
