//! etcd rolls side by side on real raft (3 members of Debian's etcd 3.4, loopback), each
//! under the same continuous write load, for every starting leader:
//!
//! 1. naive: StatefulSet order (highest ordinal first), SIGTERM, wait until healthy;
//! 2. reference: move leadership to member 0, roll N-1..1, move it to N-1, roll 0
//!    (the in-house plan rollgate replaces);
//! 3. rollgate: `etcd_roll::roll` with the command driver (followers first, one transfer);
//! 4. naive with SIGKILL (a grace period too short).
//!
//! Reported per roll: leadership changes (the raft term's rise), transfers made by the
//! algorithm, transfers etcd made itself (a leader stopped with SIGTERM hands leadership
//! over before it exits), uncontrolled elections (what is left), writes per second over
//! the load's whole span (a slower roll does not look better), failed writes, the longest
//! write stall (from a write's first attempt to its success) and the roll's wall time.
//! Every algorithm restarts members asynchronously, as rollgate's driver does, so none
//! blocks the runtime that drives the write load. The writer retries only
//! what was provably not applied: what etcd documents so (Unavailable, "leader changed",
//! "no leader", "raft proposal dropped") and a request the HTTP/2 transport handed back
//! unsent because the member's connection had gone (hyper's canceled error, "connection
//! was not ready" / "connection closed": what Go's gRPC client retries on its own).
//! Anything else counts as a failed write. Failed writes are split: `drops` are puts in
//! flight on the connection of the member being restarted (connection reset, broken pipe,
//! connection closed) — every algorithm restarts each member once and pays these alike —
//! the rest would be the roll's own doing.
//!
//! Run: `cargo bench --bench etcd_roll`.

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/etcd_load.rs"]
mod etcd_load;

use etcd_load::{Load, max_term, wait_healthy, write_load};
use rollgate::adapters::etcd::Etcd;
use rollgate::workflows::etcd_roll::{RollSettings, roll};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::scripted::Scripted;

const COOLDOWN: Duration = Duration::from_millis(300);

async fn member_id(etcd: &Etcd, name: &str) -> u64 {
    etcd.members()
        .await
        .expect("members")
        .into_iter()
        .find(|m| m.name == name)
        .expect("member")
        .id
}

/// Restarts member `name` with `signal` and waits until the cluster is healthy; true when
/// it was the leader and went with SIGTERM, which makes etcd hand leadership over itself.
async fn restart_with(cluster: &Scripted, etcd: &Etcd, signal: &str, name: &str) -> bool {
    let id = member_id(etcd, name).await;
    let leading = etcd.leader().await.is_ok_and(|l| l.id == id);
    let ok = tokio::process::Command::new(cluster.path("restart.sh"))
        .args([name, signal])
        .status()
        .await
        .expect("restart script")
        .success();
    assert!(ok, "restart.sh {name} {signal}");
    wait_healthy(etcd).await;
    tokio::time::sleep(COOLDOWN).await;
    leading && signal == "TERM"
}

#[derive(Clone, Copy, PartialEq)]
enum Algorithm {
    NaiveTerm,
    Reference,
    Rollgate,
    NaiveKill,
}

impl Algorithm {
    fn label(self) -> &'static str {
        match self {
            Self::NaiveTerm => "naive, SIGTERM",
            Self::Reference => "reference plan",
            Self::Rollgate => "rollgate",
            Self::NaiveKill => "naive, SIGKILL",
        }
    }
}

/// One roll's figures.
struct Totals {
    algorithm: Algorithm,
    changes: u64,
    uncontrolled: u64,
    writes_per_sec: f64,
    failed: u64,
    dropped: u64,
    stall: u64,
}

/// Leadership transfers one roll made: by the algorithm, and by etcd itself.
#[derive(Default)]
struct Transfers {
    made: u64,
    by_etcd: u64,
}

/// Runs one roll.
async fn run(algorithm: Algorithm, cluster: &Scripted, etcd: Arc<Etcd>) -> Transfers {
    let n = cluster.names.len();
    let mut by_etcd = 0;
    match algorithm {
        Algorithm::NaiveTerm | Algorithm::NaiveKill => {
            let signal = if algorithm == Algorithm::NaiveTerm {
                "TERM"
            } else {
                "KILL"
            };
            for name in cluster.names.iter().rev() {
                by_etcd += u64::from(restart_with(cluster, &etcd, signal, name).await);
            }
            Transfers { made: 0, by_etcd }
        }
        Algorithm::Reference => {
            let mut transfers = 0;
            let first = member_id(&etcd, &cluster.names[0]).await;
            if etcd.leader().await.expect("leader").id != first {
                etcd.move_leader(first, Duration::from_secs(10))
                    .await
                    .expect("move");
                transfers += 1;
            }
            for name in cluster.names[1..].iter().rev() {
                by_etcd += u64::from(restart_with(cluster, &etcd, "TERM", name).await);
            }
            let last = member_id(&etcd, &cluster.names[n - 1]).await;
            etcd.move_leader(last, Duration::from_secs(10))
                .await
                .expect("move");
            transfers += 1;
            by_etcd += u64::from(restart_with(cluster, &etcd, "TERM", &cluster.names[0]).await);
            Transfers {
                made: transfers,
                by_etcd,
            }
        }
        Algorithm::Rollgate => {
            let driver = cluster.command_driver();
            let settings = RollSettings {
                ready_timeout: Duration::from_secs(30),
                cooldown: COOLDOWN,
                max_lag: 1000,
                transfer_timeout: Duration::from_secs(10),
            };
            let made = roll(etcd, &driver, &settings, None, |_| {})
                .await
                .expect("rollgate roll")
                .transfers;
            Transfers { made, by_etcd: 0 }
        }
    }
}

#[tokio::main]
async fn main() {
    println!(
        "compares: rolls of 3 real etcd members under one write load, from every starting leader: naive SIGTERM, the reference plan, rollgate, naive SIGKILL; changes = raft term rise, uncontrolled = changes - the algorithm's transfers - etcd's own transfers on SIGTERM"
    );
    println!(
        "{:<16} {:>6} {:>8} {:>10} {:>8} {:>13} {:>9} {:>7} {:>6} {:>10} {:>8}",
        "algorithm",
        "leader",
        "changes",
        "transfers",
        "by etcd",
        "uncontrolled",
        "writes/s",
        "failed",
        "drops",
        "stall ms",
        "roll s"
    );
    let algorithms = [
        Algorithm::NaiveTerm,
        Algorithm::Reference,
        Algorithm::Rollgate,
        Algorithm::NaiveKill,
    ];
    let mut totals: Vec<Totals> = Vec::new();
    for leader in 0..3 {
        for algorithm in algorithms {
            let cluster = Scripted::start(3).await;
            let etcd = Arc::new(cluster.etcd());
            let id = member_id(&etcd, &cluster.names[leader]).await;
            etcd.move_leader(id, Duration::from_secs(10))
                .await
                .expect("initial leader");
            wait_healthy(&etcd).await;
            let load = Arc::new(Load::default());
            let load_started = Instant::now();
            let writer = tokio::spawn(write_load(cluster.endpoints.clone(), load.clone()));
            tokio::time::sleep(Duration::from_millis(500)).await;
            let term_before = max_term(&etcd).await;
            let started = Instant::now();
            let transfers = run(algorithm, &cluster, etcd.clone()).await;
            let took = started.elapsed();
            tokio::time::sleep(Duration::from_millis(500)).await;
            load.stop.store(true, Ordering::Relaxed);
            let _ = writer.await;
            let load_secs = load_started.elapsed().as_secs_f64();
            let changes = max_term(&etcd).await.saturating_sub(term_before);
            let uncontrolled = changes.saturating_sub(transfers.made + transfers.by_etcd);
            let writes = load.ok.load(Ordering::Relaxed);
            let row = Totals {
                algorithm,
                changes,
                uncontrolled,
                writes_per_sec: writes as f64 / load_secs,
                failed: load.failed.load(Ordering::Relaxed),
                dropped: load.dropped.load(Ordering::Relaxed),
                stall: load.longest_stall_ms.load(Ordering::Relaxed),
            };
            println!(
                "{:<16} {:>6} {:>8} {:>10} {:>8} {:>13} {:>9.0} {:>7} {:>6} {:>10} {:>8.1}",
                algorithm.label(),
                cluster.names[leader],
                changes,
                transfers.made,
                transfers.by_etcd,
                uncontrolled,
                row.writes_per_sec,
                row.failed,
                row.dropped,
                row.stall,
                took.as_secs_f64()
            );
            totals.push(row);
            if let Ok(errors) = load.errors.lock() {
                for (kind, n) in errors.iter() {
                    println!("    {n} x {kind}");
                }
            }
        }
    }
    println!();
    println!(
        "{:<16} {:>13} {:>13} {:>9} {:>7} {:>6} {:>14}",
        "summary", "changes/roll", "uncontrolled", "writes/s", "failed", "drops", "worst stall ms"
    );
    for algorithm in algorithms {
        let rows: Vec<_> = totals.iter().filter(|t| t.algorithm == algorithm).collect();
        let n = rows.len() as f64;
        println!(
            "{:<16} {:>13.2} {:>13} {:>9.0} {:>7} {:>6} {:>14}",
            algorithm.label(),
            rows.iter().map(|r| r.changes).sum::<u64>() as f64 / n,
            rows.iter().map(|r| r.uncontrolled).sum::<u64>(),
            rows.iter().map(|r| r.writes_per_sec).sum::<f64>() / n,
            rows.iter().map(|r| r.failed).sum::<u64>(),
            rows.iter().map(|r| r.dropped).sum::<u64>(),
            rows.iter().map(|r| r.stall).max().unwrap_or(0)
        );
    }
    let sum = |a: Algorithm, f: fn(&Totals) -> u64| -> f64 {
        totals
            .iter()
            .filter(|t| t.algorithm == a)
            .map(f)
            .sum::<u64>() as f64
    };
    let worst = |a: Algorithm| -> f64 {
        totals
            .iter()
            .filter(|t| t.algorithm == a)
            .map(|t| t.stall)
            .max()
            .unwrap_or(0) as f64
    };
    println!();
    for other in [
        Algorithm::NaiveTerm,
        Algorithm::Reference,
        Algorithm::NaiveKill,
    ] {
        let rate = |a: Algorithm| -> f64 {
            totals
                .iter()
                .filter(|t| t.algorithm == a)
                .map(|t| t.writes_per_sec)
                .sum::<f64>()
        };
        println!(
            "rollgate / {:<15} changes {:.2}  writes/s {:.2}  worst stall {:.3}",
            other.label(),
            sum(Algorithm::Rollgate, |t| t.changes) / sum(other, |t| t.changes).max(1.0),
            rate(Algorithm::Rollgate) / rate(other).max(1.0),
            worst(Algorithm::Rollgate) / worst(other).max(1.0),
        );
    }
}
