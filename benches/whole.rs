//! The whole system, measured: the real `rollgate serve` binary upgrades the sandbox
//! (`tests/support/sandbox.rs`, the ground the tests and `cargo run --example sandbox`
//! use): 3 control planes with stacked etcd and `WHOLE_WORKERS` workers (default
//! `10,100,1000`) on one shared sshd, batches of 10 %, a node script of 2 s (every kubeadm
//! call on a node takes 2 s), soaks of 5 s (every duration at 1/120).
//!
//! Every fake node's work runs on this machine, beside rollgate: its sshd, its shell, the
//! node script with its stub tools. The fake nodes' sessions skip the machine's
//! `~/.bashrc` and offer curve25519 key exchange (`tests/support/nodes.rs` says why), so
//! that a node's pre-flight costs about 0.06 s of CPU here, not 0.44 s: at 1,000 workers
//! the machine, not rollgate, was the limit.
//!
//! For each size:
//! - **efficiency**: the ideal over the measured control-plane-and-workers time, where
//!   ideal = batches x (one node's cycle, drain start to uncordon end, the median of the
//!   smallest size's run, + the soak) + this run's control-plane stage; and beside it the
//!   same with this run's own median node cycle, which holds what the machine's load did
//!   to every node's work, so that what is left is rollgate's own: the gaps between
//!   batches, the wait for a batch's slowest node, the gates and the analyses;
//! - **CPU per transition**: rollgate's own user + system time (its `/proc/PID/stat`,
//!   that process alone) over the run's transitions, and the ratio to the smallest size;
//! - **peak RSS**: its `VmHWM`;
//! - **p99** of `GET /v1/runs/{id}` (polled every 250 ms through the run) and of the event
//!   stream's delivery (a transition's receipt on `/v1/events` less its `at`), beside the
//!   p99 of `GET /healthz` polled the same way: the same process, threads and HTTP stack
//!   with a handler that does nothing, so the machine's share of a latency (a 2-core
//!   machine also running every fake node) is told from the run's own; and the machine's
//!   mean 1-minute load average through the run;
//! - the API server's own log: the most workers cordoned at once against the batch, and
//!   every node drained once.
//!
//! Then (`WHOLE_KILLS`, default 5) the largest size again with rollgate killed with
//! SIGKILL at that many random moments and started again each time: it must finish, with
//! no node drained twice (the API server's log) and no node's kubeadm upgrade run twice
//! (each node's own log).
//!
//! Run: `cargo bench --bench whole` (the sandbox's tools: etcd, Prometheus, Alertmanager,
//! the Pushgateway, OpenSSH).

#[path = "../tests/support/mod.rs"]
mod support;

use serde_json::Value;
use std::time::{Duration, Instant};
use support::rehearsal::Scale;
use support::sandbox::{ADMIN_TOKEN, Options, Sandbox};
use support::timeline::{Timeline, quantile};
use support::{Rollgate, free_port};

/// The slowest a run may be before the bench gives up on it.
const RUN_LIMIT: Duration = Duration::from_secs(3600);

/// rollgate's CPU seconds so far (user + system), from its own `/proc/PID/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command's closing parenthesis: utime and stime are 14th and 15th.
    let rest = stat.rsplit_once(')').expect("stat").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

/// rollgate's peak resident set in MB, from its own `/proc/PID/status`.
fn peak_rss_mb(pid: u32) -> f64 {
    support::proc_status_mb(&pid.to_string(), "VmHWM").expect("VmHWM")
}

/// What one run of the bench saw.
struct Whole {
    workers: usize,
    wall: f64,
    timeline: Timeline,
    batches: usize,
    transitions: usize,
    cpu: f64,
    rss_mb: f64,
    get_p99_ms: f64,
    healthz_p99_ms: f64,
    stream_p99_ms: f64,
    load: f64,
    most_cordoned: usize,
    batch_size: usize,
}

/// Polls `GET {path}` every 250 ms until told to stop; each answer's latency.
async fn poll(base: String, path: String, stop: tokio::sync::watch::Receiver<bool>) -> Vec<f64> {
    let http = reqwest::Client::new();
    let mut took = Vec::new();
    while !*stop.borrow() {
        let start = Instant::now();
        if let Ok(r) = http
            .get(format!("{base}{path}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            && r.status().is_success()
            && r.bytes().await.is_ok()
        {
            took.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    took
}

/// The machine's 1-minute load average every 5 s until told to stop.
async fn sample_load(stop: tokio::sync::watch::Receiver<bool>) -> Vec<f64> {
    let mut loads = Vec::new();
    while !*stop.borrow() {
        if let Some(load) = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
        {
            loads.push(load);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    loads
}

/// Follows the run's event stream until it ends; each transition's delivery delay.
async fn follow_stream(
    base: String,
    id: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<f64> {
    let http = reqwest::Client::new();
    let mut delays = Vec::new();
    let mut last = "0".to_owned();
    while !*stop.borrow() {
        let Ok(mut resp) = http
            .get(format!("{base}/v1/events"))
            .query(&[("run", id.as_str())])
            .bearer_auth(ADMIN_TOKEN)
            .header("Last-Event-ID", &last)
            .send()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut reader = rollgate::cli::watch::FrameReader::default();
        loop {
            let chunk = tokio::select! {
                c = resp.chunk() => c,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if *stop.borrow() { return delays; }
                    continue;
                }
            };
            let Ok(Some(chunk)) = chunk else { break };
            let received = chrono::Utc::now();
            for frame in reader.push(&chunk) {
                if frame.event != "transition" {
                    continue;
                }
                let event: Value = serde_json::from_str(&frame.data).unwrap_or_default();
                // A reconnect asks from the last one seen: nothing is counted twice.
                if let Some(seq) = frame.id {
                    last = seq;
                }
                if let Some(t) = event["at"]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                {
                    let delay = (received - t.with_timezone(&chrono::Utc))
                        .num_microseconds()
                        .unwrap_or(0);
                    delays.push(delay as f64 / 1000.0);
                }
            }
        }
    }
    delays
}

/// Brings up the sandbox with `workers`, runs one upgrade with `kills` SIGKILLs of
/// rollgate at random moments within `expected`, and measures it.
async fn whole(workers: usize, kills: usize, expected: f64) -> Whole {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let sandbox = Sandbox::start(Options {
        control_planes: 3,
        workers,
        kubelet: "1.34.2".into(),
        rollgate_port: port,
        dir: dir.path().join("sandbox"),
        needing_reboot: Vec::new(),
        max_unavailable: "10%".into(),
        scale: Scale::default(),
    })
    .await;
    for node in &sandbox.ground.nodes {
        node.slow_kubeadm(2);
    }
    let config = sandbox.config_file().display().to_string();
    let mut rg = Rollgate::start_on(
        port,
        &[
            ("ROLLGATE_CONFIG", config.as_str()),
            ("ROLLGATE__LOG__LEVEL", "warn"),
            ("RUST_LOG", "warn"),
        ],
    )
    .await;
    rg.token = ADMIN_TOKEN.to_owned();
    let cpu_before = cpu_seconds(rg.pid().expect("running"));
    let started = Instant::now();
    let id = rg.detect("1.34.3", "patch").await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let poller = tokio::spawn(poll(rg.base(), format!("/v1/runs/{id}"), stopped.clone()));
    let healthz = tokio::spawn(poll(rg.base(), "/healthz".into(), stopped.clone()));
    let load = tokio::spawn(sample_load(stopped.clone()));
    let stream = tokio::spawn(follow_stream(rg.base(), id.clone(), stopped));

    let mut next = support::xorshift();
    let mut moments: Vec<f64> = (0..kills)
        .map(|_| (next() % 10_000) as f64 / 10_000.0 * expected)
        .collect();
    moments.sort_by(f64::total_cmp);
    let mut cpu_spent = 0.0;
    for moment in &moments {
        let wait = (moment - started.elapsed().as_secs_f64()).max(0.0);
        tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        let (_, run) = rg.get(&format!("/v1/runs/{id}")).await;
        if run["status"] == "succeeded" {
            break;
        }
        cpu_spent += cpu_seconds(rg.pid().expect("running")) - cpu_before;
        println!("  kill -9 at {:.1} s", started.elapsed().as_secs_f64());
        rg.restart().await;
    }
    let run = rg.wait_status(&id, "succeeded", RUN_LIMIT).await;
    let wall = started.elapsed().as_secs_f64();
    let pid = rg.pid().expect("running");
    let (cpu, rss_mb) = if kills == 0 {
        (cpu_seconds(pid) - cpu_before, peak_rss_mb(pid))
    } else {
        (cpu_spent + cpu_seconds(pid), peak_rss_mb(pid))
    };
    stop.send(true).expect("stop");
    let gets = poller.await.expect("poller");
    let healthz = healthz.await.expect("healthz poller");
    let loads = load.await.expect("load sampler");
    let delays = stream.await.expect("stream");

    // The API server's own log and the nodes' own logs.
    let ground = &sandbox.ground;
    ground.assert_drained_once();
    for node in &ground.nodes {
        let starts = node.upgrade_spans().len();
        assert_eq!(
            starts, 1,
            "{}: kubeadm upgrade ran {starts} times",
            node.name
        );
    }
    ground.assert_all_at("1.34.3");
    let batch_size = workers.div_ceil(10);
    let most_cordoned = ground.most_workers_cordoned_at_once().0;
    assert!(
        most_cordoned <= batch_size,
        "{most_cordoned} workers cordoned at once, batches of {batch_size}"
    );

    let timeline = Timeline::of(&run);
    let batches = timeline.soaks.len();
    Whole {
        workers,
        wall,
        timeline,
        batches,
        transitions: run["history"].as_array().map_or(0, Vec::len),
        cpu,
        rss_mb,
        get_p99_ms: quantile(gets, 0.99),
        healthz_p99_ms: quantile(healthz, 0.99),
        stream_p99_ms: quantile(delays, 0.99),
        load: loads.iter().sum::<f64>() / loads.len().max(1) as f64,
        most_cordoned,
        batch_size,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes: Vec<usize> = std::env::var("WHOLE_WORKERS")
        .unwrap_or_else(|_| "10,100,1000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("WHOLE_WORKERS: counts"))
        .collect();
    let kills: usize = std::env::var("WHOLE_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!(
        "whole: rollgate serve upgrading the sandbox, 3 control planes + {sizes:?} workers, batches of 10 %, node script 2 s, soak 5 s"
    );
    let mut runs = Vec::new();
    for workers in &sizes {
        let run = whole(*workers, 0, 0.0).await;
        println!(
            "  {workers} workers: {:.1} s wall, {} transitions, {:.2} s CPU",
            run.wall, run.transitions, run.cpu
        );
        runs.push(run);
    }
    let base = &runs[0];
    let cycle = quantile(base.timeline.cycles.clone(), 0.5);
    let soak = quantile(base.timeline.soaks.clone(), 0.5);
    let base_cpu = base.cpu / base.transitions as f64;
    println!(
        "one node's cycle (median, {} workers): {cycle:.2} s; soak {soak:.2} s",
        base.workers
    );
    println!(
        "{:>7} {:>9} {:>9} {:>10} {:>9} {:>10} {:>6} {:>12} {:>9} {:>8} {:>11} {:>15} {:>13} {:>5} {:>9}",
        "workers",
        "wall s",
        "ideal s",
        "efficiency",
        "own cycle",
        "efficiency",
        "trans",
        "CPU ms/tr",
        "vs first",
        "RSS MB",
        "GET p99 ms",
        "/healthz p99 ms",
        "stream p99 ms",
        "load",
        "cordoned"
    );
    for run in &runs {
        let ideal = run.batches as f64 * (cycle + soak) + run.timeline.control_plane;
        let own_cycle = quantile(run.timeline.cycles.clone(), 0.5);
        let own_ideal = run.batches as f64 * (own_cycle + soak) + run.timeline.control_plane;
        let per = run.cpu / run.transitions as f64;
        println!(
            "{:>7} {:>9.1} {:>9.1} {:>10.2} {:>9.2} {:>10.2} {:>6} {:>12.2} {:>9.2} {:>8.1} {:>11.1} {:>15.1} {:>13.1} {:>5.1} {:>5}/{:<3}",
            run.workers,
            run.timeline.measured,
            ideal,
            ideal / run.timeline.measured,
            own_cycle,
            own_ideal / run.timeline.measured,
            run.transitions,
            per * 1000.0,
            per / base_cpu,
            run.rss_mb,
            run.get_p99_ms,
            run.healthz_p99_ms,
            run.stream_p99_ms,
            run.load,
            run.most_cordoned,
            run.batch_size,
        );
    }
    if kills > 0 {
        let largest = runs.last().expect("a size");
        let (workers, expected) = (largest.workers, largest.wall);
        println!("kill -9: {workers} workers, rollgate killed at {kills} random moments");
        let run = whole(workers, kills, expected).await;
        println!(
            "  finished in {:.1} s ({:.1} s without kills): every node drained once (the API server's log), kubeadm upgrade once on each node (their own logs)",
            run.wall, expected
        );
    }
}
