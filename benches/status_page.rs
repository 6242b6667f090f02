//! The status page's server side with 1,000 runs in the store (each a 1 + 12-worker
//! upgrade half done: ~90 steps, ~100 transitions), in one run of `rollgate serve`:
//!
//! 1. time to answer what the page asks first: `GET /ui`, the runs list
//!    (`GET /v1/runs?limit=200&view=summary`) and one run's page (`GET /v1/runs/{id}`),
//!    beside the smallest API answer (`GET /v1/runs?limit=1`) as the baseline and the
//!    same list of whole runs;
//! 2. event-stream fan-out: 50 clients on `GET /v1/events` while runs are halted and
//!    resumed; the delay from each transition (its `at`) to its delivery to each client,
//!    beside the same with one client.
//!
//! Run: `cargo bench --bench status_page` (BENCH_REQUESTS=200, BENCH_TRANSITIONS=100).

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/serve.rs"]
mod serve;

use serve::Serve;

use chrono::Utc;
use hdrhistogram::Histogram;
use rollgate::domain::event::DetectionRequest;
use rollgate::domain::run::{Run, RunStatus, StepStatus};
use rollgate::domain::version::Version;
use rollgate::store::Store;
use rollgate::workflows::k8s_upgrade::plan::{ClusterFacts, NodeFacts, PlanSettings, Role, plan};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RUNS: usize = 1000;

fn env_number(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A 1 + 12-worker patch upgrade, half done, with its transitions.
fn half_done_run(i: usize) -> Run {
    let version = |v: &str| Version::parse(v).expect("version");
    let node = |name: String, role| NodeFacts {
        name,
        role,
        kubelet: version("1.34.2"),
        distribution: Default::default(),
        package_manager: None,
        containerd: Some(version("1.7.20")),
        ready: true,
        address: None,
    };
    let mut nodes = vec![node("cp".into(), Role::ControlPlane)];
    nodes.extend((1..=12).map(|w| node(format!("w{w}"), Role::Worker)));
    let body = json!({"target_version": "1.34.5", "kind": "patch", "stages": "all"});
    let request = DetectionRequest::from_json(&body).expect("request");
    let planned = plan(
        &request,
        &ClusterFacts { nodes },
        None,
        &PlanSettings::default(),
    )
    .expect("a plan");
    let now = Utc::now() - chrono::Duration::hours(2);
    let mut run = Run::new(
        format!("bench-{i:04}"),
        rollgate::domain::upgrade_step::K8S_UPGRADE,
        body,
        Some("1.34.5".into()),
        planned.steps,
        now,
        "accepted",
    );
    let half = run.steps.len() / 2;
    for (n, index) in (0..half).enumerate() {
        let at = now + chrono::Duration::seconds(n as i64 * 30);
        run.current_step = Some(index);
        let label = run.steps[index].label();
        run.transition(RunStatus::Running, format!("step {label} (attempt 1)"), at);
        let step = &mut run.steps[index];
        step.status = StepStatus::Done;
        step.attempts = 1;
        step.started_at = Some(at);
        step.ended_at = Some(at + chrono::Duration::seconds(20));
        step.outcome = Some(format!("{label} done"));
        run.transition(RunStatus::Waiting, format!("step {label}: soaks"), at);
    }
    run.current_step = Some(half);
    run
}

impl Serve {
    /// `rollgate serve` on a data dir holding `RUNS` runs.
    async fn with_runs() -> (Self, Vec<String>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data dir");
        let store = Store::open(&data.join("store.db")).expect("store");
        let mut ids = Vec::new();
        for i in 0..RUNS {
            let run = half_done_run(i);
            ids.push(run.id.clone());
            assert!(store.insert_run_if_absent(&run).await.expect("insert"));
        }
        drop(store);
        (Serve::start_in(dir, &[]), ids)
    }

    async fn time_get(&self, path: &str) -> u64 {
        let started = Instant::now();
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("answer");
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        let body = resp.bytes().await.expect("body");
        assert!(!body.is_empty());
        started.elapsed().as_micros() as u64
    }

    async fn control(&self, id: &str, action: &str) {
        let resp = self
            .http
            .post(format!("{}/v1/runs/{id}/{action}", self.base))
            .bearer_auth(&self.token)
            .json(&json!({"reason": "bench"}))
            .send()
            .await
            .expect("answer");
        assert_eq!(resp.status().as_u16(), 202, "{action} {id}");
    }
}

fn row(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<50} {:>6} {:>9.2} {:>9.2} {:>9.2}",
        h.len(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
}

/// Connects `clients` streams; each records, for every transition it receives, the delay
/// from the transition's time to its arrival (µs).
async fn listen(
    serve: &Serve,
    clients: usize,
    delays: Arc<Mutex<Histogram<u64>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut resp = serve
            .http
            .get(format!("{}/v1/events", serve.base))
            .bearer_auth(&serve.token)
            .send()
            .await
            .expect("stream");
        assert!(resp.status().is_success());
        let delays = delays.clone();
        tasks.push(tokio::spawn(async move {
            let mut reader = rollgate::cli::watch::FrameReader::default();
            while let Ok(Some(chunk)) = resp.chunk().await {
                let arrived = Utc::now();
                for frame in reader.push(&chunk) {
                    if frame.event != "transition" {
                        continue;
                    }
                    let event: Value = serde_json::from_str(&frame.data).expect("JSON");
                    let at = event["at"]
                        .as_str()
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                        .expect("at");
                    let delay = (arrived - at.with_timezone(&Utc))
                        .num_microseconds()
                        .unwrap_or(0)
                        .max(1) as u64;
                    if let Ok(mut h) = delays.lock() {
                        let _ = h.record(delay);
                    }
                }
            }
        }));
    }
    tasks
}

/// Halts and resumes runs `transitions / 2` times, one control at a time, each once its
/// transition has reached every client.
async fn drive(
    serve: &Serve,
    ids: &[String],
    transitions: usize,
    delays: &Arc<Mutex<Histogram<u64>>>,
    clients: usize,
) {
    for n in 0..transitions {
        let id = &ids[(n / 2) % ids.len()];
        let action = if n % 2 == 0 { "halt" } else { "resume" };
        let before = delays.lock().map(|h| h.len()).unwrap_or(0);
        serve.control(id, action).await;
        let started = Instant::now();
        // A resume of a run nobody can execute makes two transitions (queued, then parked).
        while delays.lock().map(|h| h.len()).unwrap_or(0) < before + clients as u64 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "transition {n} not delivered"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() {
    rollgate::workflows::register();
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let requests = env_number("BENCH_REQUESTS", 200);
    let transitions = env_number("BENCH_TRANSITIONS", 100);
    let (serve, ids) = Serve::with_runs().await;

    let paths = [
        (
            "GET /v1/runs?limit=1 (baseline)",
            "/v1/runs?limit=1".to_owned(),
        ),
        ("GET /ui", "/ui".to_owned()),
        (
            "GET /v1/runs?limit=200&view=summary (the list)",
            "/v1/runs?limit=200&view=summary".to_owned(),
        ),
        (
            "GET /v1/runs?limit=200 (whole runs)",
            "/v1/runs?limit=200".to_owned(),
        ),
        (
            "GET /v1/runs/{id} (a run's page)",
            format!("/v1/runs/{}", ids[RUNS / 2]),
        ),
    ];
    let mut histograms: Vec<Histogram<u64>> = paths
        .iter()
        .map(|_| Histogram::new(3).expect("histogram"))
        .collect();
    for _ in 0..requests {
        for ((_, path), h) in paths.iter().zip(histograms.iter_mut()) {
            h.record(serve.time_get(path).await).expect("record");
        }
    }
    println!();
    println!("{RUNS} runs in the store, {requests} requests each, interleaved");
    println!(
        "{:<50} {:>6} {:>9} {:>9} {:>9}",
        "server side (ms)", "n", "p50", "p99", "max"
    );
    for ((name, _), h) in paths.iter().zip(&histograms) {
        row(name, h);
    }
    let base = histograms[0].value_at_quantile(0.5).max(1) as f64;
    println!(
        "list / baseline p50: {:.2}; run page / baseline p50: {:.2}",
        histograms[2].value_at_quantile(0.5) as f64 / base,
        histograms[4].value_at_quantile(0.5) as f64 / base
    );

    println!();
    println!(
        "{:<50} {:>6} {:>9} {:>9} {:>9}",
        "event stream, transition → delivery (ms)", "n", "p50", "p99", "max"
    );
    let mut results = Vec::new();
    for clients in [1, 50] {
        let delays = Arc::new(Mutex::new(Histogram::<u64>::new(3).expect("histogram")));
        let tasks = listen(&serve, clients, delays.clone()).await;
        drive(&serve, &ids, transitions, &delays, clients).await;
        for t in tasks {
            t.abort();
        }
        let h = delays.lock().expect("histogram").clone();
        row(&format!("{clients} client(s)"), &h);
        results.push(h);
    }
    println!(
        "50 clients / 1 client: p50 {:.2}, p99 {:.2}",
        results[1].value_at_quantile(0.5) as f64 / results[0].value_at_quantile(0.5).max(1) as f64,
        results[1].value_at_quantile(0.99) as f64
            / results[0].value_at_quantile(0.99).max(1) as f64
    );
}
