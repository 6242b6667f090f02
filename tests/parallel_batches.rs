//! A batch's workers worked together (issue 28): their cycles overlap by the fake nodes'
//! own logs, never more than `max_unavailable` cordoned by the API server's own log, one
//! gate and one soak per batch; a failure budget that leaves failed workers behind; a
//! budget spanning two nodes of a batch; kill -9 while several node scripts run.

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::ground::Ground;
use support::{Rollgate, eventually, find_step};

const RUN_DEADLINE: Duration = Duration::from_secs(240);

fn step<'a>(run: &'a Value, label: &str) -> &'a Value {
    find_step(run, label).unwrap_or_else(|| panic!("no step {label} in {run}"))
}

fn cordoned(ground: &Ground, node: &str) -> bool {
    ground.api.node(node)["spec"]["unschedulable"] == json!(true)
}

/// How many workers' node scripts are in hand (`workers/upgrade` running) in `run`.
fn scripts_running(run: &Value) -> usize {
    run["steps"].as_array().map_or(0, |steps| {
        steps
            .iter()
            .filter(|s| {
                s["stage"] == "workers" && s["name"] == "upgrade" && s["status"] == "running"
            })
            .count()
    })
}

/// Resumes halted run `id` and waits until the resume has applied.
async fn resume(rg: &Rollgate, id: &str, reason: &str) {
    assert_eq!(rg.control(id, "resume", reason).await, 202);
    rg.wait_run_until(id, "the resume to apply", RUN_DEADLINE, |r| {
        r["status"] != "halted"
    })
    .await;
}

#[tokio::test]
async fn a_batch_of_four_works_its_workers_together_by_the_nodes_own_logs() {
    let ground = Ground::start("1.34.2", 12).await;
    for node in &ground.nodes {
        node.slow_kubeadm(2);
    }
    let rg = ground
        .rollgate(&[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "4".into())])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    // While the run goes on, the API's run lines name several steps in hand.
    let seen = eventually("four node scripts in hand", RUN_DEADLINE, || async {
        let (_, runs) = rg.get("/v1/runs?view=summary").await;
        let line = runs.as_array()?.iter().find(|r| r["id"] == id)?.clone();
        let in_hand = line["in_hand"].as_array()?;
        let scripts = in_hand
            .iter()
            .filter(|l| {
                l.as_str()
                    .is_some_and(|l| l.starts_with("workers/upgrade@"))
            })
            .count();
        (scripts == 4).then_some(line)
    })
    .await;
    assert_eq!(seen["status"], "running", "{seen}");

    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    let (most, _) = ground.most_workers_cordoned_at_once();
    assert_eq!(most, 4, "never more than max_unavailable out at once");

    let batches = support::worker_batches(&run);
    assert_eq!(batches.len(), 3, "{batches:?}");
    for batch in &batches {
        assert_eq!(batch.len(), 4, "{batches:?}");
        // By the nodes' own clocks (one machine): every script of the batch had started
        // before any of them ended.
        let spans: Vec<(f64, f64)> = batch
            .iter()
            .map(|n| {
                let spans = ground.node(n).upgrade_spans();
                assert_eq!(spans.len(), 1, "{n} ran kubeadm upgrade {spans:?}");
                (spans[0].0, spans[0].1.expect("the script ended"))
            })
            .collect();
        let last_start = spans.iter().map(|s| s.0).fold(f64::MIN, f64::max);
        let first_end = spans.iter().map(|s| s.1).fold(f64::MAX, f64::min);
        assert!(
            last_start < first_end,
            "the scripts of {batch:?} did not overlap: {spans:?}"
        );
    }
    // One gate and one soak per batch, each asked once.
    let labels = support::workers_gates_and_soaks(&run);
    assert_eq!(labels.len(), 6, "{labels:?}");
    for batch in &batches {
        let gate = step(&run, &format!("workers/gate@{}", batch[0]));
        assert_eq!(gate["attempts"], 1, "{gate}");
        let soak_started = step(&run, &format!("workers/soak@{}", batch[3]))["started_at"]
            .as_str()
            .unwrap()
            .to_owned();
        for node in batch {
            let uncordon = step(&run, &format!("workers/uncordon@{node}"));
            assert!(
                uncordon["ended_at"].as_str().unwrap() <= soak_started.as_str(),
                "the soak began before {node} was back: {run}"
            );
        }
    }
}

#[tokio::test]
async fn a_failure_budget_of_one_leaves_a_worker_behind_halts_on_the_second_and_resume_retries_only_them()
 {
    let ground = Ground::start("1.34.2", 6).await;
    // Batches of two in the order w4, w3 | w2, w1 | w5, w6.
    ground.node("w3").fail_upgrade();
    ground.node("w5").fail_upgrade();
    let rg = ground
        .rollgate(&[
            ("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "2".into()),
            ("ROLLGATE__CLUSTER__FAILURE_BUDGET", "1".into()),
            ("ROLLGATE__WORKER__MAX_ATTEMPTS", "1".into()),
        ])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let reason = run["reason"].as_str().unwrap();
    assert!(
        reason.contains("step workers/upgrade@w5 gave up after 1 attempt(s)")
            && reason.contains("injected failure on w5")
            && reason.contains("failure budget (1 worker(s)) used up"),
        "{reason}"
    );
    assert!(
        support::history_has(
            &run,
            "w3 is left behind, cordoned (1 of the failure budget's 1 used); the others go on"
        ),
        "{run}"
    );
    // The others went on: w3's batch mate and the batch after are done; w5's batch mate
    // finished at least its script (the halt let the step it had in hand finish).
    assert_eq!(step(&run, "workers/upgrade@w6")["status"], "done", "{run}");
    for node in ["w4", "w2", "w1"] {
        assert_eq!(
            step(&run, &format!("workers/uncordon@{node}"))["status"],
            "done",
            "{node}: {run}"
        );
        assert!(!cordoned(&ground, node), "{node}");
    }
    assert!(cordoned(&ground, "w3") && cordoned(&ground, "w5"));

    // w5 is fixed, w3 is not: resume retries both; w3 fails again, within the budget, and
    // the run holds at its end naming it.
    ground.node("w5").fix_upgrade();
    resume(&rg, &id, "w5 fixed").await;
    let run = rg
        .wait_run_until(&id, "the run to hold naming w3", RUN_DEADLINE, |r| {
            r["status"] == "halted" && r["reason"].as_str().unwrap_or("").contains("left behind")
        })
        .await;
    let reason = run["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "1 worker(s) left behind, each cordoned: w3 (workers/upgrade@w3 gave up: "
        ) && reason.ends_with(
            "fix them and resume to retry exactly these, or abort to leave them cordoned"
        ),
        "{reason}"
    );
    for node in ["w5", "w6"] {
        assert_eq!(
            step(&run, &format!("workers/uncordon@{node}"))["status"],
            "done",
            "{run}"
        );
    }
    assert_eq!(
        step(&run, "postflight/nodes-at-target")["status"],
        "pending",
        "held before post-flight: {run}"
    );
    assert!(cordoned(&ground, "w3") && !cordoned(&ground, "w5"));

    ground.node("w3").fix_upgrade();
    resume(&rg, &id, "w3 fixed").await;
    rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    // Resume retried exactly the failed nodes' scripts.
    for (node, runs) in [
        ("w3", 3),
        ("w5", 2),
        ("w4", 1),
        ("w2", 1),
        ("w1", 1),
        ("w6", 1),
    ] {
        assert_eq!(ground.node(node).upgrade_spans().len(), runs, "{node}");
    }
}

#[tokio::test]
async fn a_budget_spanning_two_nodes_of_one_batch_holds_their_concurrent_evictions_together() {
    // Batches w3, w2 | w1: the budget's pods are on the first batch's two nodes, and w1
    // takes their replacements (with both nodes of a batch cordoned and no third worker,
    // the replacements could not be scheduled and no drain could finish, as on a real
    // cluster).
    let ground = Ground::start("1.34.2", 3).await;
    ground.api.add_pods("w3", "web", 1, false);
    ground.api.add_pods("w2", "web", 1, false);
    ground.api.add_pdb(
        "web",
        json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}),
    );
    // The disruption controller is slow to see the replacement: the second eviction waits
    // until it does.
    ground.api.set_pdb_lag(Duration::from_millis(800));
    let rg: Rollgate = ground
        .rollgate(&[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "2".into())])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    let (most, peaks) = ground.most_workers_cordoned_at_once();
    assert_eq!(most, 2, "{peaks:?}");
    assert_eq!(
        peaks,
        [["w2".to_owned(), "w3".to_owned()].into()],
        "one batch out together"
    );
    let low = ground
        .api
        .budget_low("web")
        .expect("the budget was counted");
    assert!(
        low >= 0,
        "the budget was overrun: lowest healthy - desired {low}"
    );
    let refusals: u64 = ["w3", "w2"]
        .iter()
        .map(|n| {
            let outcome = step(&run, &format!("workers/drain@{n}"))["outcome"]
                .as_str()
                .unwrap()
                .to_owned();
            outcome
                .rsplit_once(" PDB refusal(s) waited out")
                .and_then(|(head, _)| head.rsplit(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{outcome}"))
        })
        .sum();
    assert!(
        refusals >= 1,
        "the two drains did not meet the budget together: {run}"
    );
    // rollgate held the second eviction itself, across the two drains: the API server
    // never had to refuse one.
    assert_eq!(
        ground
            .api
            .calls()
            .get("evict pod 429")
            .copied()
            .unwrap_or(0),
        0,
        "{:?}",
        ground.api.calls()
    );
}

/// Seconds since the epoch by this machine's clock, the one the nodes' logs use.
fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// A node of `among` whose `kubeadm upgrade` is running now by its own log (its last
/// span open).
fn scripts_open<'a>(ground: &Ground, among: &'a [String]) -> Vec<&'a String> {
    among
        .iter()
        .filter(|n| {
            ground
                .node(n)
                .upgrade_spans()
                .last()
                .is_some_and(|(_, end)| end.is_none())
        })
        .collect()
}

/// Twelve kill -9s, each while a node script runs by the nodes' own logs: every worker's
/// `kubeadm upgrade` is held (it waits inside its span until released), so a kill drawn
/// among the held scripts lands inside one for certain; after the restart that node is
/// released, and the batch goes on. Which held node, and a pause before each kill, come
/// from the seed (printed; `KILL_SEED` replays it). Whatever the kills cut, no node is
/// drained twice, no batch is overrun, and every script ends at the target.
#[tokio::test]
async fn kill_9_at_twelve_moments_while_node_scripts_run_drains_no_node_twice() {
    let ground = Ground::start("1.34.2", 12).await;
    let mut held: Vec<String> = Vec::new();
    for node in &ground.nodes {
        node.slow_kubeadm(1);
        if node.name.starts_with('w') {
            node.hold_kubeadm();
            held.push(node.name.clone());
        }
    }
    let mut rg = ground
        .rollgate(&[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "4".into())])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    let seed = std::env::var("KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::from(std::process::id()));
    eprintln!("KILL_SEED={seed} replays these kill moments");
    let mut next = support::xorshift_from(seed);
    let mut kills: Vec<(String, f64)> = Vec::new();
    while !held.is_empty() {
        let open: Vec<String> = eventually(
            "a held node script running, by the nodes' logs",
            RUN_DEADLINE,
            || async {
                let open = scripts_open(&ground, &held);
                (!open.is_empty()).then(|| open.into_iter().cloned().collect::<Vec<_>>())
            },
        )
        .await;
        let node = open[(next() as usize) % open.len()].clone();
        tokio::time::sleep(Duration::from_millis(next() % 500)).await;
        kills.push((node.clone(), epoch_now()));
        rg.kill9();
        rg.restart().await;
        ground.node(&node).release_kubeadm();
        held.retain(|n| *n != node);
    }
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    // The nodes' own logs: each kill came while that node's kubeadm ran (held, it could
    // end only once released, after the kill).
    for (node, at) in &kills {
        let spans = ground.node(node).upgrade_spans();
        assert!(
            spans
                .iter()
                .any(|(start, end)| *start <= *at && end.is_none_or(|e| e >= *at)),
            "the kill at {at} came while no script ran on {node}: {spans:?}"
        );
    }
    assert_eq!(kills.len(), 12);
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    assert!(ground.most_workers_cordoned_at_once().0 <= 4);
    let restarts = support::restarts_recorded(&run);
    assert!(
        restarts >= 10,
        "{restarts} restarts recorded for 12 kills: {run}"
    );
    // Every node's script ended at the target, however often it was cut short.
    for node in &ground.nodes {
        let spans = node.upgrade_spans();
        if node.name.starts_with('w') {
            assert!(
                spans.last().is_some_and(|s| s.1.is_some()),
                "{}: {spans:?}",
                node.name
            );
        }
    }
}

#[tokio::test]
async fn a_halt_lets_the_batchs_scripts_finish_and_starts_nothing_after_them() {
    let ground = Ground::start("1.34.2", 4).await;
    for node in &ground.nodes {
        node.slow_kubeadm(3);
    }
    let rg = ground
        .rollgate(&[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "4".into())])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    rg.wait_run_until(&id, "the four scripts running", RUN_DEADLINE, |r| {
        scripts_running(r) == 4
    })
    .await;
    assert_eq!(rg.control(&id, "halt", "look first").await, 202);
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    assert!(
        support::history_has(&run, "(after the 4 steps in hand)"),
        "{run}"
    );
    for node in ["w1", "w2", "w3", "w4"] {
        assert_eq!(
            step(&run, &format!("workers/upgrade@{node}"))["status"],
            "done",
            "{run}"
        );
        assert_eq!(
            step(&run, &format!("workers/verify@{node}"))["status"],
            "pending",
            "{run}"
        );
        assert!(
            cordoned(&ground, node),
            "{node} is left as the halt found it"
        );
        assert_eq!(ground.node(node).upgrade_spans().len(), 1);
    }
    resume(&rg, &id, "looked").await;
    rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    for node in &ground.nodes {
        assert!(
            node.upgrade_spans().len() <= 1,
            "{}: script run again",
            node.name
        );
    }
}

fn set_node_ready(ground: &Ground, node: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    ground.api.edit_node(node, |n| {
        n["status"]["conditions"] = json!([{"type": "Ready", "status": status}]);
    });
}

/// Issue 44, the circuit breaker: while the first batch works, 3 of the 12 workers go
/// NotReady through the API server, none of them in hand. The next batch's gate holds,
/// naming "3 of 13 nodes NotReady" and the three, and the API server's own log shows no
/// node of that batch cordoned; Ready again, the run goes on to succeed.
#[tokio::test]
async fn too_many_nodes_not_ready_hold_the_next_batch_naming_the_count() {
    let ground = Ground::start("1.34.2", 12).await;
    let rg = ground
        .rollgate(&[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "4".into())])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_run_until(&id, "the first batch in hand", RUN_DEADLINE, |r| {
            let plan = support::worker_batches(r);
            plan.first().and_then(|b| b.first()).is_some_and(|first| {
                step(r, &format!("workers/drain@{first}"))["status"] != "pending"
            })
        })
        .await;
    let plan = support::worker_batches(&run);
    assert_eq!(plan.len(), 3, "{plan:?}");
    let sick: Vec<&str> = plan[2].iter().take(3).map(String::as_str).collect();
    for node in &sick {
        set_node_ready(&ground, node, false);
    }
    let held = rg
        .wait_run_until(&id, "the second batch held", RUN_DEADLINE, |r| {
            r["status"] == "waiting"
                && r["reason"]
                    .as_str()
                    .is_some_and(|reason| reason.contains("3 of 13 nodes NotReady"))
        })
        .await;
    let reason = held["reason"].as_str().unwrap_or_default();
    for node in &sick {
        assert!(reason.contains(node), "{node} not named: {reason}");
    }
    assert!(reason.contains("cluster.unhealthy_limit 20%"), "{reason}");
    for node in &plan[0] {
        assert_eq!(
            step(&held, &format!("workers/uncordon@{node}"))["status"],
            "done",
            "the first batch finished: {held}"
        );
    }
    // The API server's own log: no node of the second batch was cordoned or drained.
    let touched: Vec<String> = ground
        .api
        .requests()
        .into_iter()
        .filter(|r| {
            r.method != "GET"
                && plan[1].iter().any(|n| {
                    r.path.contains(&format!("/nodes/{n}"))
                        || r.path.contains(&format!("spec.nodeName={n}"))
                })
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        touched,
        Vec::<String>::new(),
        "the second batch was touched"
    );
    for node in &plan[1] {
        assert!(!cordoned(&ground, node), "{node} cordoned");
    }

    for node in &sick {
        set_node_ready(&ground, node, true);
    }
    let done = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert!(
        support::history_has(&done, "3 of 13 nodes NotReady"),
        "the hold is in the history: {done}"
    );
}
