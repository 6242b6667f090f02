//! Drain and per-worker overhead, measured in one run:
//!
//! 1. Drain of a node with BENCH_PODS (default 200) pods on the fake API server: rollgate's
//!    kube adapter (evictions in parallel, one list call per wait round) beside a baseline
//!    that evicts one pod at a time and waits for it to go before the next — wall time and
//!    API calls for each, and the ratio.
//! 2. rollgate's own overhead per worker in a full patch upgrade (1 control plane + 4
//!    workers, `rollgate serve`, embedded queue): the worker's wall time, from its gate
//!    step's start to its soak's end, minus the soak and the node-script time.
//!
//! Run: `cargo bench --bench drain` (needs the test ground's Debian packages: etcd-server,
//! prometheus, openssh-server, curl).

#[path = "../tests/support/mod.rs"]
mod support;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams, ListParams};
use rollgate::adapters::kube::{Kube, KubeSettings, Source};
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
    calls.values().sum()
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> u64 {
    total(after) - total(before)
}

async fn client(api: &FakeKube, dir: &std::path::Path) -> kube::Client {
    let path = dir.join("kubeconfig");
    api.write_kubeconfig(&path);
    let file = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(file, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// kubectl-drain-like, one pod at a time: evict, poll until gone, next.
async fn baseline_drain(client: &kube::Client, node: &str) {
    let all: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = all.list(&params).await.expect("list").items;
    for pod in pods {
        let owners = pod.metadata.owner_references.clone().unwrap_or_default();
        let mirror = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
        if mirror || owners.iter().any(|o| o.kind == "DaemonSet") {
            continue;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        api.evict(&name, &EvictParams::default())
            .await
            .expect("evict");
        while api.get_opt(&name).await.expect("get").is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn drain_bench() {
    let n = pods();
    let api = FakeKube::start().await;
    {
        let mut s = api.state.lock().unwrap();
        s.terminate_after = Duration::from_millis(50);
        s.ready_after = Duration::from_millis(50);
    }
    for node in ["a", "b", "spare1", "spare2", "spare3"] {
        api.add_node(node, false, "1.34.2", "1.7.20");
        api.add_node_agents(node);
    }
    api.add_pods("a", "web", n, true);
    api.add_pods("b", "web", n, true);
    let dir = tempfile::tempdir().expect("dir");
    let raw = client(&api, dir.path()).await;
    let kube = Kube::new(KubeSettings {
        source: Source::Kubeconfig {
            path: dir.path().join("kubeconfig"),
            context: None,
        },
        namespace: "default".into(),
        annotation_prefix: "rollgate.io".into(),
        request_timeout: Duration::from_secs(10),
    })
    .await
    .expect("kube");

    let before = api.calls();
    let started = Instant::now();
    kube.cordon("a", "bench").await.expect("cordon");
    let options = DrainOptions {
        timeout: Duration::from_secs(600),
        retry_every: Duration::from_millis(200),
        grace_period: None,
        own_pod: None,
    };
    let report = kube.drain("a", &options).await.expect("drain");
    let ours = started.elapsed();
    let ours_calls = diff(&api.calls(), &before);
    assert_eq!(report.evicted, n);

    let before = api.calls();
    let started = Instant::now();
    kube.cordon("b", "bench").await.expect("cordon");
    baseline_drain(&raw, "b").await;
    let base = started.elapsed();
    let base_calls = diff(&api.calls(), &before);
    assert_eq!(
        api.pods_on("b").len(),
        2,
        "only the DaemonSet and mirror pods stay"
    );

    println!(
        "drain of a node with {n} pods (fake API server: a pod terminates 50 ms after its eviction)"
    );
    println!("{:<44} {:>10} {:>10}", "", "wall ms", "API calls");
    println!(
        "{:<44} {:>10.0} {:>10}",
        "baseline: one eviction at a time",
        base.as_secs_f64() * 1e3,
        base_calls
    );
    println!(
        "{:<44} {:>10.0} {:>10}",
        "rollgate: parallel evictions, list per round",
        ours.as_secs_f64() * 1e3,
        ours_calls
    );
    println!(
        "ratio rollgate/baseline: wall {:.3}, API calls {:.3}",
        ours.as_secs_f64() / base.as_secs_f64(),
        ours_calls as f64 / base_calls as f64
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
