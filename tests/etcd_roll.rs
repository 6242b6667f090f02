//! `rollgate etcd-roll` (command driver) against real etcd: members are processes that a
//! restart script stops with SIGTERM and starts again with a new revision marker.

mod support;

use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};
use support::scripted::Scripted;
use support::witness::RaftWitness;

fn report(stdout: &str) -> Value {
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or(Value::Null)
}

async fn roll_with_leader_at(k: usize) {
    roll_members_with_leader_at(3, k).await;
}

async fn roll_members_with_leader_at(n: usize, k: usize) {
    let cluster = Scripted::start(n).await;
    let etcd = cluster.etcd();
    let members = etcd.members().await.unwrap();
    let target = members.iter().find(|m| m.name == format!("m{k}")).unwrap();
    etcd.move_leader(target.id, Duration::from_secs(10))
        .await
        .unwrap();
    let witness = RaftWitness::start(cluster.etcd()).await;
    let started = Instant::now();
    let (ok, stdout, stderr) = cluster.roll(&cluster.restart_command());
    assert!(ok, "roll failed:\n{stdout}\n{stderr}");
    // Read from etcd itself, sampled all along: one term, one new leader.
    let seen = witness.stop().await;
    assert_eq!(seen.term_rise(), 1, "{seen:?}\n{stdout}");
    assert_eq!(seen.leader_changes(), 1, "{seen:?}");
    assert_eq!(seen.leaders[0], target.id, "{seen:?}");
    let report = report(&stdout);
    assert_eq!(report["transfers"], 1, "{stdout}");
    assert_eq!(report["uncontrolled_changes"], 0, "{stdout}");
    assert_eq!(report["leadership_changes"], 1, "{stdout}");
    let restarted: Vec<&str> = report["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(restarted.len(), n, "{stdout}");
    assert_eq!(
        restarted[n - 1],
        format!("m{k}"),
        "the old leader restarts last: {stdout}"
    );
    assert_eq!(cluster.marked().len(), n);
    assert!(
        stdout.lines().any(|l| l.contains("moving leadership to")),
        "{stdout}"
    );
    eprintln!(
        "{n} members, leader m{k}: {} in {:?}",
        stdout.lines().last().unwrap_or_default(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_with_the_leader_at_m0_moves_leadership_once_and_elects_nobody() {
    roll_with_leader_at(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_with_the_leader_at_m1_moves_leadership_once_and_elects_nobody() {
    roll_with_leader_at(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_with_the_leader_at_m2_moves_leadership_once_and_elects_nobody() {
    roll_with_leader_at(2).await;
}

#[tokio::test]
async fn an_unhealthy_member_before_the_roll_is_named_and_nothing_restarts() {
    let cluster = Scripted::start(3).await;
    let pid = std::fs::read_to_string(cluster.path("m1.pid")).unwrap();
    Command::new("kill")
        .args(["-TERM", pid.trim()])
        .status()
        .unwrap();
    let (ok, stdout, stderr) = cluster.roll_within(&cluster.restart_command(), "2s");
    assert!(!ok, "{stdout}");
    assert!(stderr.contains("unhealthy member(s): m1"), "{stderr}");
    assert!(
        stdout.contains("waiting: unhealthy member(s): m1"),
        "it waited before refusing: {stdout}"
    );
    assert!(
        cluster.marked().is_empty(),
        "something was restarted: {:?}",
        cluster.marked()
    );
}

#[tokio::test]
async fn a_member_that_does_not_come_back_stops_the_roll_before_any_other_restart() {
    let cluster = Scripted::start(3).await;
    // Stops the member, waits for its exit and marks it, but never starts it again.
    // Marking before the exit would let the dying process pass the readiness check.
    let broken = format!(
        "pid=$(cat {dir}/{{name}}.pid); kill -TERM $pid; \
         while kill -0 $pid 2>/dev/null; do sleep 0.05; done; echo v2 > {dir}/{{name}}.rev",
        dir = cluster.dir.path().display()
    );
    let (ok, stdout, stderr) = cluster.roll(&broken);
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains("within") && stderr.contains("the roll stops here"),
        "{stderr}"
    );
    assert_eq!(
        cluster.marked().len(),
        1,
        "only one member was touched: {:?}",
        cluster.marked()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_rolls_the_same_way() {
    let cluster = Scripted::start_tls(3).await;
    let etcd = cluster.etcd();
    let before = etcd.leader().await.expect("leader over TLS");
    let witness = RaftWitness::start(cluster.etcd()).await;
    let (ok, stdout, stderr) = cluster.roll(&cluster.restart_command());
    assert!(ok, "{stdout}\n{stderr}");
    let seen = witness.stop().await;
    assert_eq!(seen.term_rise(), 1, "{seen:?}\n{stdout}");
    assert_eq!(seen.leader_changes(), 1, "{seen:?}");
    assert_eq!(cluster.marked().len(), 3);
    let report = report(&stdout);
    assert_eq!(report["transfers"], 1, "{report}");
    assert_eq!(report["leadership_changes"], 1, "{report}");
    assert_eq!(report["uncontrolled_changes"], 0, "{report}");
    let restarted: Vec<&str> = report["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let old_leader = etcd
        .members()
        .await
        .unwrap()
        .into_iter()
        .find(|m| m.id == before.id)
        .unwrap()
        .name;
    assert_eq!(
        restarted.last(),
        Some(&old_leader.as_str()),
        "the old leader goes last"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_members_roll_with_one_move_from_every_starting_leader() {
    for k in 0..5 {
        roll_members_with_leader_at(5, k).await;
    }
}

#[tokio::test]
async fn a_roll_killed_mid_way_resumes_and_the_whole_costs_one_leadership_change() {
    use std::io::{BufRead, BufReader};
    let cluster = Scripted::start(3).await;
    let etcd = cluster.etcd();
    let term_before = etcd.leader().await.unwrap().raft_term;
    let mut child = cluster
        .roll_command(&cluster.restart_command(), "15s")
        .arg("--no-gate")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill -9 as the second member starts restarting.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut restarts = 0;
    while let Some(Ok(line)) = lines.next() {
        if line.contains("restarting") {
            restarts += 1;
            if restarts == 2 {
                child.kill().unwrap();
                break;
            }
        }
    }
    child.wait().unwrap();
    assert_eq!(restarts, 2, "killed mid-roll");

    let (ok, stdout, stderr) = cluster.roll(&cluster.restart_command());
    assert!(ok, "the resumed roll failed:\n{stdout}\n{stderr}");
    assert_eq!(report(&stdout)["uncontrolled_changes"], 0, "{stdout}");
    assert_eq!(cluster.marked().len(), 3);
    let term_after = support::eventually("a leader", Duration::from_secs(10), || async {
        etcd.leader().await.ok()
    })
    .await
    .raft_term;
    assert_eq!(
        term_after,
        term_before + 1,
        "one leadership change for the whole roll, kill included: {stdout}"
    );
}

/// Prometheus's firing Upgrade Gates alerts, by name.
async fn firing(prom: &support::services::Prometheus) -> Vec<String> {
    let url = format!(
        "{}/api/v1/query?query=ALERTS%7Balertstate%3D%22firing%22%2Cupgrade_gate%3D%22true%22%7D",
        prom.url()
    );
    let Ok(reply) = reqwest::get(url).await else {
        return vec!["unreachable".into()];
    };
    let body: Value = reply.json().await.unwrap_or_default();
    body["data"]["result"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|s| s["metric"]["alertname"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn booted(ago: i64) -> String {
    format!(
        "node_boot_time_seconds{{node=\"m1\"}} {}\n",
        chrono::Utc::now().timestamp() - ago
    )
}

// Multi-threaded: the roll runs as a blocking child process while Prometheus keeps
// scraping the stand-in target served from this runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_is_asked_before_every_restart_and_a_closed_gate_restarts_nothing() {
    use support::services::{MiniServer, Prometheus};
    let cluster = Scripted::start(3).await;
    let target = MiniServer::start().await;
    target.set_metrics(&booted(60));
    let prom = Prometheus::start(&target.address()).await;
    support::eventually(
        "a blocking alert to fire",
        Duration::from_secs(30),
        || async {
            firing(&prom)
                .await
                .contains(&"NodeRecentlyRebooted".to_owned())
                .then_some(())
        },
    )
    .await;
    let gated = |extra: &[(&str, String)]| {
        let mut cmd = cluster.roll_command(&cluster.restart_command(), "15s");
        cmd.args(["--gate-timeout", "2s"])
            .env("ROLLGATE__GATE__POLL_INTERVAL", "200ms");
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let with_prom = [("ROLLGATE__GATE__PROMETHEUS_URL", prom.url())];

    let (ok, stdout, stderr) = gated(&with_prom);
    assert!(!ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("gate closed before restarting"), "{stdout}");
    assert!(
        stderr.contains("the gate stayed closed") && stderr.contains("NodeRecentlyRebooted"),
        "{stderr}"
    );
    assert!(
        cluster.marked().is_empty(),
        "nothing restarted: {:?}",
        cluster.marked()
    );

    // No Prometheus at all: the gate is unknown, which is closed.
    let (ok, _, stderr) = gated(&[]);
    assert!(!ok);
    assert!(stderr.contains("gate unknown"), "{stderr}");
    assert!(cluster.marked().is_empty());

    target.set_metrics(&booted(86_400));
    support::eventually("the alert to resolve", Duration::from_secs(30), || async {
        firing(&prom).await.is_empty().then_some(())
    })
    .await;
    let (ok, stdout, stderr) = gated(&with_prom);
    assert!(ok, "{stdout}\n{stderr}");
    assert_eq!(cluster.marked().len(), 3);
    let report = report(&stdout);
    assert_eq!(report["transfers"], 1, "{report}");
    assert_eq!(report["uncontrolled_changes"], 0, "{report}");
}

/// The statefulset driver against the fake API server, whose StatefulSet controller
/// replaces a pod by restarting its real etcd member (SIGTERM, start again at the new
/// revision) and marks it Ready once the member answers /health.
async fn statefulset_roll_with_leader_at(k: usize, moves: u64) {
    let sts = support::etcd_pods::EtcdStatefulSet::start(3, k).await;
    let witness = RaftWitness::start(sts.cluster.etcd()).await;
    let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args([
            "etcd-roll",
            "--no-gate",
            "--driver",
            "statefulset",
            "--statefulset",
            "etcd",
        ])
        .args([
            "--cooldown",
            "300ms",
            "--timeout",
            "2s",
            "--ready-timeout",
            "20s",
        ])
        .arg("--endpoints")
        .arg(sts.cluster.endpoints.join(","))
        .env("ROLLGATE__CLUSTER__KUBECONFIG", &sts.kubeconfig)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let seen = witness.stop().await;
    assert_eq!(seen.term_rise(), moves, "{seen:?}\n{stdout}");
    assert_eq!(seen.leader_changes() as u64, moves, "{seen:?}");
    let report = report(&stdout);
    assert_eq!(report["transfers"], moves, "{stdout}");
    assert_eq!(report["leadership_changes"], moves, "{stdout}");
    assert_eq!(report["uncontrolled_changes"], 0, "{stdout}");
    // Forced high to low by the controller, one pod at a time.
    assert_eq!(sts.restarted(), ["etcd-2", "etcd-1", "etcd-0"]);
    assert!(sts.all_at_update_revision());
    assert_eq!(sts.partition(), 3, "the partition lock is restored");
    assert!(
        sts.cluster.marked().len() == 3,
        "every member restarted once"
    );
    eprintln!(
        "statefulset, leader etcd-{k}: {}",
        stdout.lines().last().unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_roll_with_the_leader_at_ordinal_0_moves_leadership_once() {
    statefulset_roll_with_leader_at(0, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_roll_with_the_leader_at_ordinal_1_moves_leadership_once() {
    statefulset_roll_with_leader_at(1, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_roll_with_the_leader_at_the_highest_ordinal_moves_it_twice() {
    statefulset_roll_with_leader_at(2, 2).await;
}
