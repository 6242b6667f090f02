//! Drain and per-worker overhead, measured in one run:
//!
//! 1. Drain of a node with BENCH_PODS (default 200) pods on the fake API server, over its
//!    HTTPS listener: rollgate's kube adapter (cordon, evictions in parallel, one list call
//!    per wait round) beside the real `kubectl drain --ignore-daemonsets
//!    --delete-emptydir-data`, timed as a process, on the same cluster with the same pods
//!    and grace periods. Two rounds, each tool draining first once; wall time and API
//!    calls for each, and the ratios.
//! 2. rollgate's own overhead per worker in a full patch upgrade (1 control plane + 4
//!    workers, `rollgate serve`, embedded queue): the worker's wall time, from its gate
//!    step's start to its soak's end, minus the soak and the node-script time.
//!
//! Run: `cargo bench --bench drain` (needs kubectl and the test ground's Debian packages:
//! etcd-server, prometheus, openssh-server, curl).

#[path = "../tests/support/mod.rs"]
mod support;

use chrono::{DateTime, Utc};
use rollgate::ports::{DrainOptions, NodeDrain};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use support::ground::{Ground, WORKER_ORDER};
use support::kube::FakeKube;

fn pods() -> usize {
    std::env::var("BENCH_PODS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

fn total(calls: &BTreeMap<String, u64>) -> u64 {
    calls
        .iter()
        .filter(|(k, _)| !k.ends_with(|c: char| c.is_ascii_digit()))
        .map(|(_, v)| v)
        .sum()
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> u64 {
    total(after) - total(before)
}

/// A fake cluster: nodes `a` and `b` with `n` pods each (emptyDir volumes, a 30 s grace
/// period, gone 50 ms after SIGTERM), a DaemonSet and a mirror pod on every node, and
/// three spare nodes for the replacements.
async fn cluster(n: usize) -> FakeKube {
    let api = FakeKube::start().await;
    {
        let mut s = api.lock();
        s.terminate_after = Duration::from_millis(50);
        s.ready_after = Duration::from_millis(50);
    }
    api.add_namespace("default");
    api.add_namespace("kube-system");
    for node in ["a", "b", "spare1", "spare2", "spare3"] {
        api.add_node(node, false, "1.34.2", "1.7.20");
        api.add_node_agents(node);
    }
    api.add_pods("a", "web", n, true);
    api.add_pods("b", "web", n, true);
    api
}

/// rollgate's cordon and drain of `node`: wall time and API calls.
async fn rollgate_drain(
    api: &FakeKube,
    kubeconfig: &std::path::Path,
    node: &str,
) -> (Duration, u64) {
    let kube = support::rollgate_kube(kubeconfig).await;
    let options = DrainOptions {
        timeout: Duration::from_secs(600),
        retry_every: Duration::from_millis(200),
        grace_period: None,
        own_pod: None,
    };
    let before = api.calls();
    let started = Instant::now();
    kube.cordon(node, "bench").await.expect("cordon");
    let report = kube.drain(node, &options).await.expect("drain");
    let took = started.elapsed();
    assert_eq!(report.evicted, pods());
    (took, diff(&api.calls(), &before))
}

/// `kubectl drain` of `node`, timed as a process: wall time and API calls.
async fn kubectl_drain(
    api: &FakeKube,
    kubeconfig: &std::path::Path,
    home: &std::path::Path,
    node: &str,
) -> (Duration, u64) {
    let before = api.calls();
    let started = Instant::now();
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=600s",
        ])
        .env("HOME", home)
        .output()
        .await
        .expect("run kubectl drain");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "kubectl drain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (took, diff(&api.calls(), &before))
}

async fn drain_bench() {
    let n = pods();
    let mut rows = Vec::new();
    for round in 0..2 {
        let api = cluster(n).await;
        let dir = tempfile::tempdir().expect("dir");
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_tls_kubeconfig(&kubeconfig);
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        // Discovery cached for kubectl, as on an operator's machine.
        kubectl_warm(&kubeconfig, &home).await;
        let (ours, theirs) = if round == 0 {
            let ours = rollgate_drain(&api, &kubeconfig, "a").await;
            (ours, kubectl_drain(&api, &kubeconfig, &home, "b").await)
        } else {
            let theirs = kubectl_drain(&api, &kubeconfig, &home, "a").await;
            (rollgate_drain(&api, &kubeconfig, "b").await, theirs)
        };
        for node in ["a", "b"] {
            assert_eq!(
                api.pods_on(node).len(),
                2,
                "only the DaemonSet and mirror pods stay on {node}"
            );
        }
        rows.push((ours, theirs));
        api.stop().await;
    }
    println!(
        "compares: cordon + drain of a node with {n} pods on the fake API server over HTTPS (each pod gone 50 ms after its eviction), rollgate's kube adapter against the real `kubectl drain`, each tool first in one round"
    );
    println!(
        "{:<8} {:>14} {:>14} {:>14} {:>14} {:>10} {:>10}",
        "round",
        "rollgate ms",
        "kubectl ms",
        "rollgate calls",
        "kubectl calls",
        "wall ratio",
        "call ratio"
    );
    let mut ratios = Vec::new();
    for (i, ((ours, ours_calls), (theirs, theirs_calls))) in rows.iter().enumerate() {
        let wall = ours.as_secs_f64() / theirs.as_secs_f64();
        let calls = *ours_calls as f64 / *theirs_calls as f64;
        ratios.push(wall);
        println!(
            "{:<8} {:>14.0} {:>14.0} {:>14} {:>14} {:>10.3} {:>10.3}",
            if i == 0 { "1 (rg 1st)" } else { "2 (kc 1st)" },
            ours.as_secs_f64() * 1e3,
            theirs.as_secs_f64() * 1e3,
            ours_calls,
            theirs_calls,
            wall,
            calls
        );
    }
    println!(
        "ratio rollgate/kubectl drain, wall time, mean of the rounds: {:.3}",
        ratios.iter().sum::<f64>() / ratios.len() as f64
    );
}

/// One `kubectl get nodes`, so that both rounds' kubectl has its discovery cached.
async fn kubectl_warm(kubeconfig: &std::path::Path, home: &std::path::Path) {
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["get", "nodes", "-o", "name"])
        .env("HOME", home)
        .output()
        .await
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn at(step: &Value, field: &str) -> DateTime<Utc> {
    step[field]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{field} of {step}"))
}

fn find<'a>(run: &'a Value, name: &str, node: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name && s["node"] == node && s["stage"] == "workers")
        .unwrap_or_else(|| panic!("no {name}@{node}"))
}

async fn overhead_bench() {
    let ground = Ground::start("1.34.2", 4).await;
    for w in WORKER_ORDER {
        ground.api.add_pods(w, "web", 10, false);
    }
    let mut env = ground.env();
    env.push(("ROLLGATE__LOG__LEVEL".into(), "warn".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let rg = support::Rollgate::start(&env).await;
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.5", "kind": "patch"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["run_id"].as_str().unwrap().to_owned();
    let run = support::eventually("the run to finish", Duration::from_secs(300), || async {
        let run = rg.run(&id).await;
        match run["status"].as_str() {
            Some("succeeded") => Some(run),
            Some("failed" | "halted" | "aborted") => panic!("run ended: {run}"),
            _ => None,
        }
    })
    .await;
    println!();
    println!("per-worker time in a full patch upgrade (soak 1s; 10 pods per worker)");
    println!(
        "{:<8} {:>10} {:>10} {:>10} {:>12}",
        "worker", "total ms", "soak ms", "script ms", "overhead ms"
    );
    let mut overheads = Vec::new();
    for w in WORKER_ORDER {
        let gate = find(&run, "gate", w);
        let soak = find(&run, "soak", w);
        let upgrade = find(&run, "upgrade", w);
        let total = (at(soak, "ended_at") - at(gate, "started_at")).num_milliseconds();
        let soaked = (at(soak, "ended_at") - at(soak, "started_at")).num_milliseconds();
        let script = (at(upgrade, "ended_at") - at(upgrade, "started_at")).num_milliseconds();
        let overhead = total - soaked - script;
        overheads.push(overhead);
        println!("{w:<8} {total:>10} {soaked:>10} {script:>10} {overhead:>12}");
    }
    overheads.sort();
    println!(
        "overhead per worker: median {} ms, max {} ms (drain, verify, uncordon, gate, persistence, queue)",
        overheads[overheads.len() / 2],
        overheads[overheads.len() - 1]
    );
}

#[tokio::main]
async fn main() {
    drain_bench().await;
    overhead_bench().await;
}
