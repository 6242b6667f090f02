//! A 3-control-plane upgrade with stacked etcd, side by side in one run, for every
//! starting leader, under the same continuous etcd write load:
//!
//! 1. kubeadm's docs: control planes by name, `kubeadm upgrade apply` on the first,
//!    `kubeadm upgrade node` on the others, no leadership move — the node script over
//!    SSH, one node after the other once etcd is healthy again;
//! 2. rollgate: `rollgate serve` upgrading the same ground (pre-flight, snapshot, control
//!    planes: followers' nodes first, one leadership move, the old leader's node last).
//!
//! Both grounds are the test ground: a real sshd per node whose stub `kubeadm` restarts
//! the node's real etcd member (Debian's etcd 3.4, pre-vote on) as the static-pod upgrade
//! does. Reported per upgrade: leadership changes (the raft term's rise read from etcd),
//! failed writes, the longest write stall, writes stalled a second or more, wall time;
//! then the ratios rollgate / docs. `BENCH_ROUNDS` (default 3) repeats every leader.
//!
//! Run: `cargo bench --bench control_planes`.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/etcd_load.rs"]
mod etcd_load;

use etcd_load::{Load, max_term, wait_healthy, write_load};
use rollgate::workflows::k8s_upgrade::NODE_SCRIPT;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::ground::Ground;

const FROM: &str = "1.34.2";
const TO: &str = "1.34.5";

#[derive(Clone, Copy, PartialEq)]
enum Order {
    KubeadmDocs,
    Rollgate,
}

impl Order {
    fn label(self) -> &'static str {
        match self {
            Self::KubeadmDocs => "kubeadm docs",
            Self::Rollgate => "rollgate",
        }
    }
}

/// The node script on `node` over SSH, as an operator's loop would run it.
fn node_script(ground: &Ground, node: &str, kubeadm: &str) {
    let fake = ground.node(node);
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let mut child = Command::new("ssh")
        .args(["-i", &ground.client.key.display().to_string()])
        .args([
            "-o",
            &format!("UserKnownHostsFile={}", ground.client.known_hosts.display()),
        ])
        .args(["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"])
        .args(["-p", &fake.port.to_string(), &format!("{user}@127.0.0.1")])
        .arg(format!(
            "bash -s -- --role control-plane --kubeadm {kubeadm} --release {TO}"
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("ssh");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(NODE_SCRIPT.as_bytes())
        .expect("script");
    assert!(
        child.wait().expect("ssh").success(),
        "node script on {node}"
    );
}

/// The time between the first and the last control plane's work: for rollgate, from its
/// first control-plane step's start to its last one's end (serve's start, pre-flight and
/// the snapshot come before that window and are left out, as they are of the docs' loop).
fn control_plane_window(run: &serde_json::Value) -> Duration {
    let at = |step: &serde_json::Value, field: &str| {
        step[field]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    };
    let steps: Vec<&serde_json::Value> = run["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["stage"] == "control-plane")
        .collect();
    let first = steps.iter().filter_map(|s| at(s, "started_at")).min();
    let last = steps.iter().filter_map(|s| at(s, "ended_at")).max();
    match (first, last) {
        (Some(a), Some(b)) => (b - a).to_std().unwrap_or_default(),
        _ => panic!("no control-plane steps with times in {run}"),
    }
}

/// Upgrades the control planes; returns the window of their work (see
/// [`control_plane_window`]) and the whole time.
async fn upgrade(order: Order, ground: &Ground) -> (Duration, Duration) {
    let etcd = ground.etcd.stacked().client();
    let started = Instant::now();
    match order {
        Order::KubeadmDocs => {
            for (i, m) in ground.etcd.stacked().members.iter().enumerate() {
                node_script(ground, &m.name, if i == 0 { "apply" } else { "node" });
                wait_healthy(&etcd).await;
            }
            (started.elapsed(), started.elapsed())
        }
        Order::Rollgate => {
            let rg = ground.rollgate(&[]).await;
            let (status, body) = rg
                .post(
                    "/v1/detections",
                    &serde_json::json!({"target_version": TO, "kind": "patch", "stages": "preflight,snapshot,control-plane"}),
                )
                .await;
            assert_eq!(status, 202, "{body}");
            let id = body["run_id"].as_str().expect("run id");
            let run = rg
                .wait_status(id, "succeeded", Duration::from_secs(300))
                .await;
            (control_plane_window(&run), started.elapsed())
        }
    }
}

struct Row {
    order: Order,
    changes: u64,
    writes: u64,
    failed: u64,
    stall: u64,
    long_stalls: u64,
    /// Seconds from the first control plane's work to the last one's end.
    wall: f64,
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    println!(
        "compares: 3 stacked control planes upgraded in the order kubeadm's docs give and by rollgate serve, same ground and write load; wall = from the first control plane's work to the last one's end for both (rollgate's whole time, with serve's start, pre-flight and snapshot, beside it)"
    );
    println!(
        "{:<14} {:>6} {:>8} {:>7} {:>7} {:>10} {:>7} {:>8} {:>8}",
        "order", "leader", "changes", "writes", "failed", "stall ms", ">=1s", "wall s", "whole s"
    );
    let mut rows = Vec::new();
    let leaders = ["cp-1", "cp-2", "cp-3"];
    for leader in leaders.iter().cycle().take(leaders.len() * rounds) {
        for order in [Order::KubeadmDocs, Order::Rollgate] {
            let ground = Ground::start_ha(FROM, 3, 0).await;
            let stacked = ground.etcd.stacked();
            stacked.lead(leader).await;
            let load = Arc::new(Load::default());
            let writer = tokio::spawn(write_load(stacked.endpoints(), load.clone()));
            tokio::time::sleep(Duration::from_millis(500)).await;
            let etcd = stacked.client();
            let term_before = max_term(&etcd).await;
            let (took, whole) = upgrade(order, &ground).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            load.stop.store(true, Ordering::Relaxed);
            let _ = writer.await;
            let row = Row {
                order,
                changes: max_term(&etcd).await.saturating_sub(term_before),
                writes: load.ok.load(Ordering::Relaxed),
                failed: load.failed.load(Ordering::Relaxed),
                stall: load.longest_stall_ms.load(Ordering::Relaxed),
                long_stalls: load.long_stalls.load(Ordering::Relaxed),
                wall: took.as_secs_f64(),
            };
            println!(
                "{:<14} {:>6} {:>8} {:>7} {:>7} {:>10} {:>7} {:>8.1} {:>8.1}",
                order.label(),
                leader,
                row.changes,
                row.writes,
                row.failed,
                row.stall,
                row.long_stalls,
                took.as_secs_f64(),
                whole.as_secs_f64()
            );
            rows.push(row);
            if let Ok(errors) = load.errors.lock() {
                for (kind, n) in errors.iter() {
                    println!("    {n} x {kind}");
                }
            }
        }
    }
    let of = |order: Order| rows.iter().filter(move |r| r.order == order);
    let sum = |order: Order, f: fn(&Row) -> u64| of(order).map(f).sum::<u64>() as f64;
    let worst = |order: Order| of(order).map(|r| r.stall).max().unwrap_or(0) as f64;
    let upgrades = (leaders.len() * rounds) as f64;
    println!();
    for order in [Order::KubeadmDocs, Order::Rollgate] {
        println!(
            "{:<14} changes per upgrade {:.2}, failed writes {}, writes stalled >=1s {}, worst stall {} ms",
            order.label(),
            sum(order, |r| r.changes) / upgrades,
            sum(order, |r| r.failed),
            sum(order, |r| r.long_stalls),
            worst(order)
        );
    }
    let wall = |order: Order| of(order).map(|r| r.wall).sum::<f64>();
    println!(
        "rollgate / kubeadm docs: changes {:.2}, writes stalled >=1s {:.2}, worst stall {:.3}, wall (same window) {:.2}",
        sum(Order::Rollgate, |r| r.changes) / sum(Order::KubeadmDocs, |r| r.changes).max(1.0),
        sum(Order::Rollgate, |r| r.long_stalls)
            / sum(Order::KubeadmDocs, |r| r.long_stalls).max(1.0),
        worst(Order::Rollgate) / worst(Order::KubeadmDocs).max(1.0),
        wall(Order::Rollgate) / wall(Order::KubeadmDocs).max(f64::MIN_POSITIVE)
    );
}
