//! Node reboots (issue 29): the workers whose sentinel is set go through the node cycle
//! with a reboot as its action (the fake node goes NotReady, drops its SSH sessions and
//! comes back with another boot id); a node that does not come back halts the run naming
//! it; a reboot asked while an upgrade holds the cluster waits for it; bad requests are
//! refused and queue nothing.

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::Rollgate;
use support::ground::Ground;

const RUN_DEADLINE: Duration = Duration::from_secs(240);
const SENTINEL: &str = "test -e \"$STUB_STATE/reboot-required\"";

fn boot_id(ground: &Ground, node: &str) -> String {
    ground.api.node(node)["status"]["nodeInfo"]["bootID"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn reboot_rollgate(ground: &Ground, extra: &[(&str, String)]) -> Rollgate {
    let mut env = vec![
        ("ROLLGATE__REBOOT__SENTINEL_COMMAND", SENTINEL.to_owned()),
        ("ROLLGATE__REBOOT__TIMEOUT", "60s".to_owned()),
    ];
    env.extend(extra.iter().cloned());
    ground.rollgate(&env).await
}

async fn ask(rg: &Rollgate, body: Value) -> String {
    let (status, answer) = rg.post("/v1/reboots", &body).await;
    assert_eq!(status, 202, "{answer}");
    answer["run_id"].as_str().expect("run_id").to_owned()
}

/// The nodes of `run`'s steps named `stage/name`, in the run's order.
fn nodes_of(run: &Value, stage: &str, name: &str) -> Vec<String> {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["stage"] == stage && s["name"] == name)
        .map(|s| s["node"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The nodes of the workers' steps named `name`, in the run's order.
fn labels(run: &Value, name: &str) -> Vec<String> {
    nodes_of(run, "reboot", name)
}

/// `node` took one reboot command, came back with its second boot id, and is not left
/// cordoned.
fn assert_rebooted_once(ground: &Ground, node: &str) {
    assert_eq!(
        ground.node(node).reboots(),
        1,
        "{node} took another reboot command"
    );
    assert_eq!(boot_id(ground, node), format!("boot-{node}-2"), "{node}");
    assert_ne!(
        ground.api.node(node)["spec"]["unschedulable"],
        json!(true),
        "{node} left cordoned"
    );
}

#[tokio::test]
async fn the_four_workers_whose_sentinel_is_set_are_rebooted_each_drained_once() {
    let ground = Ground::start("1.34.2", 6).await;
    let needing = ["w1", "w3", "w4", "w6"];
    for name in needing {
        ground.node(name).need_reboot();
    }
    let rg = reboot_rollgate(&ground, &[]).await;
    let id = ask(&rg, json!({"reason": "kernel 6.1.0-28"})).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;

    for node in &ground.nodes {
        if needing.contains(&node.name.as_str()) {
            assert_rebooted_once(&ground, &node.name);
            assert!(!node.needs_reboot(), "{}: the sentinel stays", node.name);
        } else {
            assert_eq!(node.reboots(), 0, "{} was rebooted", node.name);
            assert_eq!(
                boot_id(&ground, &node.name),
                format!("boot-{}-1", node.name)
            );
            assert_ne!(
                ground.api.node(&node.name)["spec"]["unschedulable"],
                json!(true),
                "{} left cordoned",
                node.name
            );
        }
    }
    ground.assert_drained_once();
    let mut rebooted = labels(&run, "reboot");
    rebooted.sort();
    assert_eq!(rebooted, needing);
    // One gate before and one soak after each batch (of one, by default).
    assert_eq!(labels(&run, "soak").len(), 4, "{run}");
    assert_eq!(labels(&run, "gate").len(), 4, "{run}");
    let planned = support::find_step(&run, "reboot/plan-reboots").expect("the plan");
    assert!(
        planned["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("4 node(s) to reboot, 1 at a time")),
        "{planned}"
    );
}

#[tokio::test]
async fn three_stacked_control_planes_reboot_with_one_leadership_change_the_leader_last() {
    let ground = Ground::start_ha("1.34.2", 3, 2).await;
    for cp in ["cp-1", "cp-2", "cp-3"] {
        ground.node(cp).need_reboot();
    }
    ground.node("w2").need_reboot();
    let stacked = ground.etcd.stacked();
    stacked.lead("cp-2").await;
    let term_before = stacked.term().await;
    let rg = reboot_rollgate(&ground, &[]).await;
    let id = ask(&rg, json!({})).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;

    // Exactly one leadership change, read from etcd itself; the old leader's node last.
    let term_after = stacked.term().await;
    assert_eq!(
        term_after,
        term_before + 1,
        "raft term {term_before} -> {term_after}"
    );
    let order = nodes_of(&run, "reboot-control-plane", "reboot");
    assert_eq!(order.len(), 3, "{order:?}");
    // The order by the nodes' own clocks (each logs when it took its reboot command).
    let mut booted: Vec<(f64, &str)> = ["cp-1", "cp-2", "cp-3"]
        .into_iter()
        .map(|cp| {
            let times = ground.node(cp).reboot_times();
            assert_eq!(times.len(), 1, "{cp}: {times:?}");
            (times[0], cp)
        })
        .collect();
    booted.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(
        booted[2].1, "cp-2",
        "the old leader's node last: {booted:?}"
    );
    assert_eq!(order.last().map(String::as_str), Some("cp-2"), "{order:?}");
    let moved = nodes_of(&run, "reboot-control-plane", "move-leader");
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert!(
        order[..2].contains(&moved[0]),
        "leadership went to {} before it was rebooted: {order:?}",
        moved[0]
    );
    // Control planes first, then the worker.
    let rebooted_at = |node: &str| {
        ground
            .api
            .changes()
            .iter()
            .position(|c| matches!(c, support::kube::Change::Cordon(n) if n == node))
            .unwrap_or_else(|| panic!("{node} was never cordoned"))
    };
    assert!(rebooted_at("cp-2") < rebooted_at("w2"));
    for node in ["cp-1", "cp-2", "cp-3", "w2"] {
        assert_rebooted_once(&ground, node);
    }
    assert_eq!(ground.node("w1").reboots(), 0);
    ground.assert_drained_once();
    let report = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["stage"] == "reboot-control-plane" && s["name"] == "next")
        .filter_map(|s| s["outcome"].as_str())
        .next_back()
        .expect("the last next step's report")
        .to_owned();
    assert!(
        report.contains("1 leadership change(s), transfers 1") && report.contains("uncontrolled 0"),
        "{report}"
    );
    assert_eq!(
        rg.metric("etcd_roll_uncontrolled_leadership_changes_total{target=\"control-plane\"}")
            .await,
        0.0
    );
}

#[tokio::test]
async fn a_node_whose_sentinel_clears_before_its_turn_is_skipped_undrained() {
    let ground = Ground::start("1.34.2", 3).await;
    for name in ["w1", "w2", "w3"] {
        ground.node(name).need_reboot();
    }
    for node in &ground.nodes {
        node.reboot_delay(3.0);
    }
    let rg = reboot_rollgate(&ground, &[]).await;
    let id = ask(&rg, json!({})).await;
    let planned = rg
        .wait_run_until(&id, "the plan", RUN_DEADLINE, |r| {
            labels(r, "reboot").len() == 3
        })
        .await;
    let order = labels(&planned, "reboot");
    let (first, last) = (order[0].clone(), order[2].clone());
    // While the first reboots, the last one's sentinel clears (a package removed, say).
    rg.wait_run_until(&id, "the first reboot command", RUN_DEADLINE, |r| {
        support::find_step(r, &format!("reboot@{first}")).is_some_and(|s| s["status"] == "done")
    })
    .await;
    std::fs::remove_file(ground.node(&last).dir.path().join("state/reboot-required"))
        .expect("clear the sentinel");
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_eq!(ground.node(&last).reboots(), 0);
    assert_eq!(boot_id(&ground, &last), format!("boot-{last}-1"));
    let drain = support::find_step(&run, &format!("reboot/drain@{last}")).expect("its drain");
    assert!(
        drain["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with(&format!("skipped: {last}'s sentinel has cleared"))),
        "{drain}"
    );
    assert!(
        !ground
            .api
            .changes()
            .iter()
            .any(|c| matches!(c, support::kube::Change::Cordon(n) if *n == last)),
        "{last} was cordoned"
    );
    assert_eq!(ground.node(&order[1]).reboots(), 1);
}

#[tokio::test]
async fn kill_9_right_after_the_reboot_command_and_while_the_node_is_down_reboots_nothing_twice() {
    let ground = Ground::start("1.34.2", 3).await;
    for node in &ground.nodes {
        node.need_reboot();
        node.reboot_delay(4.0);
        node.shutdown_delay(2.0);
    }
    let mut rg = reboot_rollgate(&ground, &[]).await;
    let id = ask(&rg, json!({})).await;
    let planned = rg
        .wait_run_until(&id, "the plan", RUN_DEADLINE, |r| {
            labels(r, "reboot").len() == 3
        })
        .await;
    let order = labels(&planned, "reboot");

    // The first node has taken its reboot command, its session still open: kill -9.
    let first = ground.node(&order[0]);
    support::eventually("the first reboot command", RUN_DEADLINE, || async {
        (first.reboots() == 1).then_some(())
    })
    .await;
    rg.kill9();
    rg.restart().await;

    // The second node's reboot step is done and the node is down: kill -9.
    let second = ground.node(&order[1]);
    let label = format!("reboot@{}", order[1]);
    rg.wait_run_until(&id, "the second reboot command", RUN_DEADLINE, |r| {
        support::find_step(r, &label).is_some_and(|s| s["status"] == "done")
    })
    .await;
    assert!(second.is_down(), "{} is not down", order[1]);
    rg.kill9();
    rg.restart().await;

    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    for node in &ground.nodes {
        assert_rebooted_once(&ground, &node.name);
    }
    ground.assert_drained_once();
    let redone = support::find_step(&run, &format!("reboot@{}", order[0])).expect("its step");
    assert!(
        redone["outcome"]
            .as_str()
            .is_some_and(|o| o.contains("not sent again") || o.contains("not rebooted again")),
        "{redone}"
    );
}

#[tokio::test]
async fn a_node_that_does_not_come_back_halts_the_run_naming_it() {
    let ground = Ground::start("1.34.2", 3).await;
    for name in ["w1", "w2", "w3"] {
        ground.node(name).need_reboot();
    }
    ground.node("w2").never_back();
    let rg = reboot_rollgate(&ground, &[("ROLLGATE__REBOOT__TIMEOUT", "4s".into())]).await;
    let id = ask(&rg, json!({})).await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("w2 did not come back within reboot.timeout (4s)"),
        "{reason}"
    );
    let order = labels(&run, "reboot");
    let at = order.iter().position(|n| n == "w2").expect("w2 planned");
    for (i, node) in order.iter().enumerate() {
        let want = usize::from(i <= at);
        assert_eq!(ground.node(node).reboots(), want, "{node} in {order:?}");
        if i > at {
            assert!(
                !ground
                    .api
                    .changes()
                    .iter()
                    .any(|c| matches!(c, support::kube::Change::Cordon(n) if n == node)),
                "{node} was cordoned: nothing after w2 is touched"
            );
        }
    }
    assert_eq!(
        ground.api.node("w2")["spec"]["unschedulable"],
        json!(true),
        "w2 stays cordoned"
    );
}

#[tokio::test]
async fn a_reboot_asked_during_an_upgrade_waits_for_it_and_starts_after() {
    let ground = Ground::start("1.34.2", 3).await;
    for name in ["w1", "w2"] {
        ground.node(name).need_reboot();
    }
    let rg = reboot_rollgate(&ground, &[]).await;
    let upgrade = rg.detect("1.34.5", "patch").await;
    rg.wait_run(&upgrade, "the upgrade to start", |r| {
        r["status"] != "queued"
    })
    .await;
    let reboot = ask(&rg, json!({"nodes": ["w1"]})).await;
    rg.wait_behind(&reboot, &upgrade, "k8s-upgrade").await;
    // A second request while it waits is merged into it: same run, both nodes.
    let (status, merged) = rg.post("/v1/reboots", &json!({"nodes": ["w2"]})).await;
    assert_eq!(status, 200, "{merged}");
    assert_eq!(merged["run_id"], reboot);

    let upgraded = rg.wait_status(&upgrade, "succeeded", RUN_DEADLINE).await;
    let rebooted = rg.wait_status(&reboot, "succeeded", RUN_DEADLINE).await;
    let ended = upgraded["updated_at"].as_str().unwrap().to_owned();
    let first_step = rebooted["steps"][0]["started_at"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        first_step >= ended,
        "the reboot began ({first_step}) before the upgrade ended ({ended})"
    );
    assert_eq!(ground.node("w1").reboots(), 1);
    assert_eq!(ground.node("w2").reboots(), 1, "the merged request's node");
    ground.assert_all_at("1.34.5");
    // Each run takes one node at a time, and never both runs together: the ground never
    // has two nodes cordoned at once.
    ground.assert_one_node_down_at_a_time();
}

async fn roll(rg: &Rollgate, body: &Value) -> String {
    let (status, answer) = rg.post("/v1/etcd-rolls", body).await;
    assert_eq!(status, 202, "{answer}");
    answer["run_id"].as_str().expect("run_id").to_owned()
}

/// The time `run` ended, by its last update, and the time its first step started.
fn span(run: &Value) -> (String, String) {
    let ended = run["updated_at"].as_str().unwrap_or_default().to_owned();
    let began = run["steps"][0]["started_at"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (began, ended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_roll_and_a_reboot_wait_for_each_other_to_release_the_cluster() {
    let ground = Ground::start("1.34.2", 2).await;
    ground.node("w1").need_reboot();
    let sts = support::etcd_pods::EtcdStatefulSet::start_in(ground.api.clone(), 3, 0, true).await;
    let rg = reboot_rollgate(&ground, &[]).await;
    let roll_request = json!({
        "statefulset": "etcd", "namespace": "default",
        "endpoints": sts.cluster.endpoints, "ready_timeout_secs": 20, "cooldown_secs": 0
    });
    // A roll held at its first gate holds the cluster: a reboot asked meanwhile waits.
    let (status, _) = rg.post("/v1/alerts", &support::webhook("e7c0")).await;
    assert_eq!(status, 202);
    let first_roll = roll(&rg, &roll_request).await;
    rg.wait_run(&first_roll, "the roll held at its gate", |r| {
        r["status"] == "waiting" && !r["blockers"].as_array().unwrap().is_empty()
    })
    .await;
    let reboot = ask(&rg, json!({})).await;
    rg.wait_behind(&reboot, &first_roll, "etcd-roll").await;
    assert!(sts.restarted().is_empty());

    // Released, the roll goes first; the reboot starts once it has ended, and a roll asked
    // while the reboot is in flight waits for it in turn.
    let (status, _) = rg.post("/v1/alerts", &support::resolved("e7c0")).await;
    assert_eq!(status, 202);
    let rolled = rg.wait_status(&first_roll, "succeeded", RUN_DEADLINE).await;
    rg.wait_run(&reboot, "the reboot to start", |r| r["status"] != "queued")
        .await;
    let second_roll = roll(&rg, &roll_request).await;
    rg.wait_behind(&second_roll, &reboot, "node-reboot").await;
    let rebooted = rg.wait_status(&reboot, "succeeded", RUN_DEADLINE).await;
    let rolled_again = rg
        .wait_status(&second_roll, "succeeded", RUN_DEADLINE)
        .await;

    let (_, roll_ended) = span(&rolled);
    let (reboot_began, reboot_ended) = span(&rebooted);
    let (second_began, _) = span(&rolled_again);
    assert!(
        reboot_began >= roll_ended,
        "the reboot began ({reboot_began}) before the roll ended ({roll_ended})"
    );
    assert!(
        second_began >= reboot_ended,
        "the second roll began ({second_began}) before the reboot ended ({reboot_ended})"
    );
    assert_eq!(sts.restarted(), ["etcd-2", "etcd-1", "etcd-0"]);
    assert_rebooted_once(&ground, "w1");
    assert_eq!(ground.node("w2").reboots(), 0);

    // The same order by the API server's own record, not rollgate's: every write of a
    // roll (its partition, the pods it had replaced) comes before w1's drain (the second
    // roll finds every member at the target: it writes nothing).
    let changes = ground.api.changes();
    let at = |want: &support::kube::Change| changes.iter().position(|c| c == want);
    let cordon = at(&support::kube::Change::Cordon("w1".into())).expect("w1 cordoned");
    let rollout: Vec<usize> = changes
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            matches!(
                c,
                support::kube::Change::Partition { .. } | support::kube::Change::Replaced(_)
            )
        })
        .map(|(i, _)| i)
        .collect();
    let replaced = changes
        .iter()
        .filter(|c| matches!(c, support::kube::Change::Replaced(_)))
        .count();
    assert_eq!(replaced, 3, "{changes:?}");
    assert!(
        rollout.iter().all(|i| *i < cordon),
        "a roll wrote during or after w1's drain: {changes:?}"
    );
}

#[tokio::test]
async fn an_upgrade_that_leaves_the_sentinel_reboots_the_node_inside_its_one_drain() {
    let ground = Ground::start("1.34.2", 3).await;
    ground.node("w2").sentinel_after_upgrade();
    let rg = reboot_rollgate(
        &ground,
        &[("ROLLGATE__REBOOT__AFTER_UPGRADE", "if-required".into())],
    )
    .await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    assert_eq!(ground.node("w2").reboots(), 1);
    assert_eq!(boot_id(&ground, "w2"), "boot-w2-2");
    assert!(!ground.node("w2").needs_reboot());
    for node in ["cp", "w1", "w3"] {
        assert_eq!(ground.node(node).reboots(), 0, "{node}");
    }
    let cordons = ground
        .api
        .changes()
        .iter()
        .filter(|c| matches!(c, support::kube::Change::Cordon(n) if n == "w2"))
        .count();
    assert_eq!(cordons, 1, "w2 cordoned {cordons} times: one drain");
    let outcome = |label: &str| {
        support::find_step(&run, label)
            .and_then(|s| s["outcome"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no outcome for {label}: {run}"))
    };
    assert!(
        outcome("workers/reboot-if-required@w2")
            .contains("w2 is back: boot id boot-w2-1 -> boot-w2-2"),
        "{}",
        outcome("workers/reboot-if-required@w2")
    );
    assert!(outcome("workers/reboot-if-required@w1").contains("needs no reboot"));
    // The reboot is inside the drain: after the script, before verify and uncordon.
    let labels: Vec<String> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["node"] == "w2" && s["stage"] == "workers")
        .map(|s| s["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        labels,
        [
            "fetch",
            "gate",
            "drain",
            "upgrade",
            "reboot-if-required",
            "verify",
            "uncordon",
            "soak"
        ]
    );
}

/// `rollgate detect --reboots` against `ground`, asking `rg`; (exit code, report).
fn detect_reboots(
    ground: &Ground,
    rg: &Rollgate,
    repo: &support::services::RepoServer,
    push: &support::services::Pushgateway,
) -> (i32, Value) {
    detect_with(ground, rg, repo, push, &[])
}

/// `rollgate detect --reboots ARGS` against `ground`, asking `rg`; (exit code, report).
fn detect_with(
    ground: &Ground,
    rg: &Rollgate,
    repo: &support::services::RepoServer,
    push: &support::services::Pushgateway,
    args: &[&str],
) -> (i32, Value) {
    let data = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["detect", "--reboots"])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(ground.env())
        .env("ROLLGATE__DATA_DIR", data.path())
        .env("ROLLGATE__REBOOT__SENTINEL_COMMAND", SENTINEL)
        .env("ROLLGATE__DETECT__REPO_URL", repo.url())
        .env("ROLLGATE__DETECT__PUSHGATEWAY_URL", push.url())
        .env("ROLLGATE__DETECT__ROLLGATE_URL", rg.base())
        .env(
            "ROLLGATE__DETECT__TOKEN_FILE",
            rg.data_dir().join("api-token"),
        )
        .output()
        .expect("rollgate detect");
    let report = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert!(
        report != Value::Null,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), report)
}

#[tokio::test]
async fn detect_reads_every_sentinel_pushes_the_metric_and_asks_for_the_reboots() {
    // At the newest patch, the next minor unpublished: no upgrade to ask for.
    let ground = Ground::start("1.34.5", 3).await;
    ground.node("w1").need_reboot();
    ground.node("w3").need_reboot();
    let rg = reboot_rollgate(&ground, &[]).await;
    let repo = support::services::RepoServer::start().await;
    let push = support::services::Pushgateway::start().await;
    let (code, report) = detect_reboots(&ground, &rg, &repo, &push);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["decision"]["decision"], "nothing", "{report}");
    assert_eq!(report["reboots"]["required"], json!(["w1", "w3"]));
    assert_eq!(report["reboots"]["clear"], json!(["cp", "w2"]));
    assert_eq!(
        report["reboots"]["submitted"]["result"], "created",
        "{report}"
    );
    let mut samples = push.samples("rollgate_node_reboot_required").await;
    samples.sort();
    let want: Vec<String> = [("cp", 0), ("w1", 1), ("w2", 0), ("w3", 1)]
        .iter()
        .map(|(n, v)| {
            format!(
                "rollgate_node_reboot_required{{check=\"reboots\",instance=\"\",job=\"k8s_version_check\",node=\"{n}\"}} {v}"
            )
        })
        .collect();
    assert_eq!(samples, want);

    // The request became a reboot run of those two; serve exports what it read.
    let id = report["reboots"]["submitted"]["run_id"]
        .as_str()
        .expect("run id")
        .to_owned();
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_eq!(run["request"]["nodes"], json!(["w1", "w3"]));
    for (node, reboots) in [("w1", 1), ("w2", 0), ("w3", 1)] {
        assert_eq!(ground.node(node).reboots(), reboots, "{node}");
    }
    let gauge = |node: &str| format!("rollgate_node_reboot_required{{node=\"{node}\"}}");
    assert_eq!(
        rg.metric(&gauge("w1")).await,
        0.0,
        "back: no longer required"
    );

    // Nothing needs a reboot now: detect asks for nothing.
    let (code, report) = detect_reboots(&ground, &rg, &repo, &push);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["reboots"]["required"], json!([]));
    assert_eq!(report["reboots"]["submitted"], Value::Null);

    // The shipped CronJob's cadence: daily for the sentinels, the upgrade on its day. On
    // another day the sentinels are read and pushed, the upgrade check is not made, and
    // its metrics in the Pushgateway (its own group) stay as the last check left them.
    let checked = push.samples("k8s_version_check_last_run_timestamp").await;
    assert_eq!(checked.len(), 1, "{checked:?}");
    ground.node("w2").need_reboot();
    let not_today = {
        use chrono::Datelike;
        chrono::Utc::now()
            .weekday()
            .succ()
            .to_string()
            .to_lowercase()
    };
    let (code, report) = detect_with(&ground, &rg, &repo, &push, &["--upgrades-on", &not_today]);
    assert_eq!(code, 0, "{report}");
    assert!(
        report["upgrade_skipped"]
            .as_str()
            .is_some_and(|w| w.contains(&format!("upgrades are checked on {not_today}"))),
        "{report}"
    );
    assert_eq!(
        report["decision"],
        Value::Null,
        "no upgrade check: {report}"
    );
    assert_eq!(report["reboots"]["required"], json!(["w2"]));
    assert_eq!(
        push.samples("k8s_version_check_last_run_timestamp").await,
        checked
    );
    assert!(
        push.samples("rollgate_node_reboot_required")
            .await
            .iter()
            .any(|s| s.contains("node=\"w2\"") && s.ends_with(" 1")),
        "the sentinels of today are pushed"
    );
    let id = report["reboots"]["submitted"]["run_id"]
        .as_str()
        .expect("run id");
    rg.wait_status(id, "succeeded", RUN_DEADLINE).await;
}

#[tokio::test]
async fn bad_reboot_requests_are_refused_and_queue_nothing() {
    let ground = Ground::start("1.34.2", 2).await;
    let rg = reboot_rollgate(
        &ground,
        &[("ROLLGATE__REBOOT__CONTROL_PLANES", "false".into())],
    )
    .await;
    let cases = [
        (
            json!({"nodes": ["w9"]}),
            422,
            "node w9 is not in the cluster",
        ),
        (
            json!({"nodes": ["cp"]}),
            422,
            "reboot.control_planes is false",
        ),
        (json!({"nodes": ["W1;reboot"]}), 422, "is not a node name"),
        (json!({"nodes": ["w1", "w1"]}), 422, "named twice"),
        (json!({"command": "rm -rf /"}), 422, "command"),
        (json!(["w1"]), 422, "must be a JSON object"),
    ];
    for (body, want, says) in cases {
        let (status, answer) = rg.post("/v1/reboots", &body).await;
        assert_eq!(status, want, "{body}: {answer}");
        assert!(
            answer["message"].as_str().is_some_and(|m| m.contains(says)),
            "{body}: {answer}"
        );
    }
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs, json!([]), "nothing queued");
}

/// On the AMQP backend (the ha overlay's), a reboot asked over HTTP and one published by
/// another system with routing key `reboots` both reach the worker and run to the end: the
/// events queue is bound to every event type's key.
#[tokio::test]
async fn reboots_over_rabbitmq_asked_by_http_and_by_a_publisher_run_end_to_end() {
    let names = support::rabbit::Names::unique();
    let ground = Ground::start("1.34.2", 3).await;
    for name in ["w1", "w3"] {
        ground.node(name).need_reboot();
    }
    let rg = reboot_rollgate(&ground, &names.env()).await;

    let id = ask(&rg, json!({"nodes": ["w1"], "reason": "kernel"})).await;
    rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;

    let event = serde_json::to_vec(&json!({
        "specversion": "1.0", "id": "ext-reboot-1", "source": "test/publisher",
        "type": "rollgate.reboot.v1", "time": chrono::Utc::now().to_rfc3339(),
        "data": {"nodes": ["w3"], "reason": "published"}
    }))
    .unwrap();
    support::rabbit::publish(&names.exchange, "reboots", &event, "ext-reboot-1").await;
    let published = support::eventually(
        "the published reboot makes a run",
        Duration::from_secs(30),
        || async {
            let (_, runs) = rg.get("/v1/runs").await;
            runs.as_array()?
                .iter()
                .find(|r| r["id"] != id.as_str() && r["kind"] == "node-reboot")
                .and_then(|r| r["id"].as_str().map(str::to_owned))
        },
    )
    .await;
    rg.wait_status(&published, "succeeded", RUN_DEADLINE).await;

    // The nodes' own logs: w1 and w3 took one reboot each, w2 none.
    assert_rebooted_once(&ground, "w1");
    assert_rebooted_once(&ground, "w3");
    assert_eq!(ground.node("w2").reboots(), 0);
    support::rabbit::cleanup(&names).await;
}

/// The default reboot command (`sudo -n systemctl reboot`) on a node whose sudo has no rule
/// for rollgate's user: each attempt is a refusal, never "sent"; the run halts within the
/// retry budget (well under reboot.timeout) naming the node and sudo's own words, and the
/// node never took a reboot. With the rule in place, resume reboots it once.
#[tokio::test]
async fn a_reboot_command_the_node_refuses_halts_naming_it_within_the_retry_budget() {
    let ground = Ground::start("1.34.2", 2).await;
    ground.node("w1").need_reboot();
    ground.node("w1").sudo_refuses();
    let rg = reboot_rollgate(&ground, &[("ROLLGATE__REBOOT__TIMEOUT", "15m".into())]).await;
    let started = std::time::Instant::now();
    let id = ask(&rg, json!({"nodes": ["w1"]})).await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let took = started.elapsed();
    eprintln!("refused reboot: halted {took:?} after the request (reboot.timeout 15 min)");
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("reboot of w1 refused: sudo: a password is required (exit 1)"),
        "{reason}"
    );
    assert!(reason.contains("gave up after 5 attempt(s)"), "{reason}");
    assert!(
        took < Duration::from_secs(120),
        "halted after {took:?}; reboot.timeout is 15 min"
    );
    // The node's own log: five refused attempts, no reboot, the same boot.
    let node = ground.node("w1");
    let asked = node
        .calls()
        .iter()
        .filter(|c| c.as_str() == "sudo -n systemctl reboot")
        .count();
    assert_eq!(asked, 5, "{:?}", node.calls());
    assert_eq!(node.reboots(), 0);
    assert_eq!(boot_id(&ground, "w1"), "boot-w1-1");

    // The rule is added: resume sends the command again, and the node reboots once.
    std::fs::remove_file(node.dir.path().join("state/sudo-refuses")).unwrap();
    assert_eq!(rg.control(&id, "resume", "sudoers fixed").await, 202);
    rg.wait_run(&id, "the resume to be taken", |run| {
        run["status"] != "halted"
    })
    .await;
    rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_rebooted_once(&ground, "w1");
}

/// Issue 40: `"dry_run": true` answers which nodes a run would reboot, in which batches
/// and order, and what would hold it, and touches nothing: no run, no cordon, no reboot,
/// by the API server's and the nodes' own logs. The real run asked afterwards reboots
/// the nodes in the order the dry run gave.
#[tokio::test]
async fn a_reboot_dry_run_names_the_batches_and_what_holds_them_and_touches_nothing() {
    let ground = Ground::start("1.34.2", 6).await;
    for name in ["w1", "w2", "w4", "w6"] {
        ground.node(name).need_reboot();
    }
    let rg = reboot_rollgate(
        &ground,
        &[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "2".into())],
    )
    .await;
    let (status, answer) = rg.post("/v1/reboots", &json!({"dry_run": true})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["dry_run"], true);
    let batches: Vec<Vec<String>> = serde_json::from_value(answer["batches"].clone()).unwrap();
    assert_eq!(batches.len(), 2, "{answer}");
    assert!(batches.iter().all(|b| b.len() == 2), "{answer}");
    let mut named: Vec<String> = batches.concat();
    named.sort();
    assert_eq!(named, ["w1", "w2", "w4", "w6"]);
    assert_eq!(answer["holds"], json!([]), "nothing holds it: {answer}");

    // Named nodes whose sentinel is clear are left out, named.
    let (status, answer) = rg
        .post(
            "/v1/reboots",
            &json!({"dry_run": true, "nodes": ["w1", "w3"]}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["batches"], json!([["w1"]]));
    assert_eq!(answer["left_out"], json!(["w3 (its sentinel is not set)"]));

    // A blocking alert: the dry run names it as a hold.
    let mut blocker = support::webhook("d1e2a3d4b5e6e7f8");
    blocker["alerts"][0]["labels"]["alertname"] = json!("EtcdNoLeader");
    let (status, _) = rg.post("/v1/alerts", &blocker).await;
    assert_eq!(status, 202);
    let answer = support::eventually(
        "the dry run held by the gate",
        Duration::from_secs(10),
        || async {
            let (_, answer) = rg.post("/v1/reboots", &json!({"dry_run": true})).await;
            answer["holds"]
                .as_array()
                .is_some_and(|h| {
                    h.iter()
                        .any(|h| h.as_str().is_some_and(|h| h.starts_with("gate closed: ")))
                })
                .then_some(answer)
        },
    )
    .await;
    assert!(
        answer["holds"].to_string().contains("EtcdNoLeader"),
        "{answer}"
    );

    // Nothing was touched.
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs, json!([]), "a dry run queues nothing");
    ground.assert_nothing_drained();
    for node in &ground.nodes {
        assert_eq!(node.reboots(), 0, "{}", node.name);
    }

    // The real run goes as the dry run said.
    let mut resolved = blocker.clone();
    resolved["status"] = json!("resolved");
    resolved["alerts"][0]["status"] = json!("resolved");
    resolved["alerts"][0]["endsAt"] = json!(chrono::Utc::now().to_rfc3339());
    let (status, _) = rg.post("/v1/alerts", &resolved).await;
    assert_eq!(status, 202);
    let id = ask(&rg, json!({})).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_eq!(labels(&run, "reboot"), batches.concat());
}

/// kured's lock value as kured's daemonsetlock writes it: one holder.
fn kured_single(node: &str, created: chrono::DateTime<chrono::Utc>, ttl: Duration) -> String {
    json!({
        "nodeID": node,
        "metadata": {"unschedulable": false},
        "created": created.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
        "TTL": ttl.as_nanos() as u64,
    })
    .to_string()
}

/// Waits until `node` is cordoned (the API server's state); kured's lock annotation then.
async fn kured_lock_while_cordoned(ground: &Ground, node: &str) -> Value {
    support::eventually(
        &format!("{node} cordoned"),
        Duration::from_secs(60),
        || async { (ground.api.node(node)["spec"]["unschedulable"] == true).then_some(()) },
    )
    .await;
    let text = ground.api.kured_lock().expect("kured's lock is held");
    serde_json::from_str(&text).expect("kured's lock is JSON")
}

/// kured's lock (an annotation of its DaemonSet, in kured's own format): while a kured
/// node holds it, a reboot run does not start and names kured's node, asking again until
/// kured lets go; then rollgate takes the lock, written as kured writes it (so a kured
/// still running waits), for as long as it has the cluster, and lets go at the end. An
/// expired lock holds nothing, and with several owners rollgate takes every place.
#[tokio::test]
async fn kured_lock_is_honoured_while_kured_holds_it_and_held_while_rollgate_works() {
    let ground = Ground::start("1.34.2", 2).await;
    let now = chrono::Utc::now();
    let theirs = kured_single("w2", now - chrono::Duration::seconds(10), Duration::ZERO);
    ground.api.add_kured(Some(&theirs));
    for node in ["w1", "w2"] {
        ground.node(node).need_reboot();
        ground.node(node).reboot_delay(1.5);
    }
    let rg = reboot_rollgate(&ground, &[]).await;
    let id = ask(&rg, json!({"nodes": ["w1"]})).await;
    let run = rg
        .wait_run(&id, "the run to wait for kured", |r| {
            r["reason"].as_str().is_some_and(|t| {
                t.starts_with("waits for kured: kured holds its reboot lock for w2")
            })
        })
        .await;
    assert_eq!(run["status"], "queued", "{run}");
    // It asks again (gate.poll_interval), and still waits: the API server's own count.
    let reads = |g: &Ground| g.api.calls().get("get daemonset").copied().unwrap_or(0);
    let first = reads(&ground);
    support::eventually(
        "three more reads of kured's lock",
        Duration::from_secs(30),
        || async { (reads(&ground) >= first + 3).then_some(()) },
    )
    .await;
    assert_eq!(rg.run(&id).await["status"], "queued");
    ground.assert_nothing_drained();
    assert_eq!(ground.api.kured_lock().as_deref(), Some(theirs.as_str()));

    // kured lets go: the run starts, and holds kured's lock while it works.
    ground.api.set_kured_lock(None);
    let held = kured_lock_while_cordoned(&ground, "w1").await;
    assert_eq!(held["nodeID"], "rollgate", "{held}");
    assert_eq!(held["TTL"], 0, "{held}");
    let created: chrono::DateTime<chrono::Utc> = held["created"]
        .as_str()
        .expect("created")
        .parse()
        .expect("RFC 3339, as Go's time.Time reads it");
    assert!(
        (chrono::Utc::now() - created).num_seconds().abs() < 60,
        "{held}"
    );
    rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    support::eventually("kured's lock released", Duration::from_secs(10), || async {
        ground.api.kured_lock().is_none().then_some(())
    })
    .await;
    assert_rebooted_once(&ground, "w1");

    // Several owners (kured's --concurrency 2), the one holder's TTL run out: rollgate
    // takes both places, and leaves the list empty.
    let expired = json!({"maxOwners": 2, "locks": [serde_json::from_str::<Value>(
        &kured_single("w2", now - chrono::Duration::hours(2), Duration::from_secs(3600)),
    ).unwrap()]});
    ground.api.set_kured_lock(Some(&expired.to_string()));
    let id = ask(&rg, json!({"nodes": ["w2"]})).await;
    let held = kured_lock_while_cordoned(&ground, "w2").await;
    let owners: Vec<&str> = held["locks"]
        .as_array()
        .expect("locks")
        .iter()
        .filter_map(|l| l["nodeID"].as_str())
        .collect();
    assert_eq!(owners, ["rollgate", "rollgate/2"], "{held}");
    assert_eq!(held["maxOwners"], 2);
    rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    support::eventually(
        "rollgate's places released",
        Duration::from_secs(10),
        || async {
            let lock: Value = serde_json::from_str(&ground.api.kured_lock()?).ok()?;
            (lock == json!({"maxOwners": 2, "locks": []})).then_some(())
        },
    )
    .await;
    assert_rebooted_once(&ground, "w2");
}

/// A node whose own reboot manager (Flatcar's locksmithd) would reboot it besides rollgate
/// is refused at planning, named with what to change; nothing is drained or rebooted.
#[tokio::test]
async fn a_node_with_a_reboot_manager_of_its_own_is_refused_at_planning() {
    let ground = Ground::start("1.34.2", 2).await;
    for name in ["w1", "w2"] {
        ground.node(name).need_reboot();
    }
    ground.node("w2").activate("locksmithd.service");
    let rg = reboot_rollgate(&ground, &[]).await;
    let id = ask(&rg, json!({})).await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("w2: locksmithd is active: Flatcar reboots the node itself")
            && reason.contains("REBOOT_STRATEGY=off"),
        "{reason}"
    );
    ground.assert_nothing_drained();
    assert_eq!(ground.node("w1").reboots() + ground.node("w2").reboots(), 0);
}

/// `reboot.sentinel_preset = "auto"` on a cluster of four OSes: each node's sentinel is
/// read with its own OS's tool, chosen by its os-release. Ubuntu's sentinel file, Rocky's
/// `needs-restarting -r` and Flatcar's update_engine say a reboot is needed; openSUSE's
/// `zypper needs-rebooting` says not. Every tool answers from its own node's state, so the
/// wrong tool on a node (the shared file on openSUSE, say) would reboot the wrong node; the
/// witnesses are the nodes' own reboot logs and boot ids.
#[tokio::test]
async fn auto_reads_each_nodes_sentinel_with_its_own_oss_tool() {
    let ground = Ground::start("1.34.2", 4).await;
    let shared = tempfile::tempdir().expect("temp dir");
    let sentinel_file = shared.path().join("reboot-required");
    std::os::unix::fs::symlink(
        ground.node("w1").dir.path().join("state/reboot-required"),
        &sentinel_file,
    )
    .expect("symlink");
    ground.node("w2").runs_os(support::nodes::ROCKY);
    ground.node("w2").add_tool(
        "needs-restarting",
        "#!/bin/sh\n[ \"$1\" = -r ] || exit 9\ntest -e \"$STUB_STATE/reboot-required\" && { echo 'Reboot is required'; exit 1; }\nexit 0\n",
    );
    ground.node("w3").runs_os(support::nodes::OPENSUSE);
    ground.node("w4").runs_os(support::nodes::FLATCAR);
    ground.node("w3").add_tool(
        "zypper",
        "#!/bin/sh\n[ \"$2\" = needs-rebooting ] || exit 9\ntest -e \"$STUB_STATE/reboot-required\" && exit 102\nexit 0\n",
    );
    ground.node("w4").add_tool(
        "update_engine_client",
        "#!/bin/sh\nif test -e \"$STUB_STATE/reboot-required\"; then op=UPDATED_NEED_REBOOT; else op=IDLE; fi\nprintf 'LAST_CHECKED_TIME=1733300000\\nCURRENT_OP=UPDATE_STATUS_%s\\n' \"$op\"\n",
    );
    for node in ["w1", "w2", "w4"] {
        ground.node(node).need_reboot();
    }
    let rg = ground
        .rollgate(&[
            ("ROLLGATE__REBOOT__SENTINEL_PRESET", "auto".to_owned()),
            (
                "ROLLGATE__REBOOT__SENTINEL_FILE",
                sentinel_file.display().to_string(),
            ),
            ("ROLLGATE__REBOOT__TIMEOUT", "60s".to_owned()),
        ])
        .await;
    let id = ask(&rg, json!({})).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;

    for node in ["w1", "w2", "w4"] {
        assert_rebooted_once(&ground, node);
    }
    assert_eq!(ground.node("w3").reboots(), 0, "openSUSE w3 was rebooted");
    let mut rebooted = labels(&run, "reboot");
    rebooted.sort();
    assert_eq!(rebooted, ["w1", "w2", "w4"]);
}
