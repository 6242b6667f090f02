//! Whole upgrades rehearsed at 1/120 of real time (`support::rehearsal`): the shipped rules
//! in a real Prometheus that scrapes rollgate and the fake cluster's exporters, a real
//! Alertmanager routing to rollgate, every timeline duration scaled by the same factor.
//! What would have halted a healthy run at the default timings (its own version skew
//! closing its gate) shows here; so do the gates that must still close.

mod support;

use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::k3s::Distro;
use support::rehearsal::{self, Rehearsal, SCALE};
use support::{eventually, find_step, history_has};

/// The k3s rehearsal's factor: see its test.
const K3S_SCALE: rehearsal::Scale = rehearsal::Scale(1.0 / 40.0);

/// Far beyond the scaled run (about 50 s for 1 + 6 nodes) on a loaded 2-core machine.
const RUN_DEADLINE: Duration = Duration::from_secs(240);

async fn detect(r: &Rehearsal, target: &str, stages: &str) -> String {
    let (status, body) =
        r.rg.post(
            "/v1/detections",
            &json!({"target_version": target, "kind": "patch", "stages": stages}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    body["run_id"].as_str().expect("run id").to_owned()
}

fn cordoned(r: &Rehearsal, node: &str) -> bool {
    r.ground.api.node(node)["spec"]["unschedulable"] == json!(true)
}

/// The label of the step `run` has in hand.
fn current_label(run: &Value) -> String {
    let index = run["current_step"].as_u64().expect("a current step") as usize;
    let step: rollgate::domain::run::Step =
        serde_json::from_value(run["steps"][index].clone()).expect("a step");
    step.label()
}

/// The names of the series `promql` returns, by `label`.
async fn label_values(r: &Rehearsal, promql: &str, label: &str) -> BTreeSet<String> {
    r.query(promql)
        .await
        .iter()
        .filter_map(|s| s["metric"][label].as_str().map(str::to_owned))
        .collect()
}

/// What a healthy upgrade leaves, over the last `window` seconds: no gate closed and no
/// halt in its history; no gate alert fired at any moment, in Prometheus or at
/// Alertmanager's receiver (rollgate's board); and not for want of skew: the cluster ran
/// two versions for longer than the rule's scaled 30 minutes, which without `unless in
/// flight` would have fired and closed the gate.
async fn assert_no_gate_of_its_own(r: &Rehearsal, run: &Value, window: u64) {
    assert!(!history_has(run, "gate closed"), "{run}");
    assert!(!history_has(run, "halted"), "{run}");
    let fired = label_values(
        r,
        &format!(r#"max_over_time(ALERTS{{alertstate="firing",upgrade_gate="true"}}[{window}s])"#),
        "alertname",
    )
    .await;
    assert!(
        fired.is_empty(),
        "gate alerts fired during the run: {fired:?}"
    );
    let (_, board) = r.rg.get("/v1/alerts").await;
    assert_eq!(board, json!([]), "rollgate's board");
    let skew = r
        .query(&format!(
            r#"count_over_time((count(count by (git_version) (kubernetes_build_info{{job=~"apiserver|kubelet"}})) > 1)[{window}s:250ms]) * 0.25"#
        ))
        .await;
    let skew_seconds: f64 = skew[0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("skew seconds");
    let rule_for = r.scale.duration(Duration::from_secs(1800)).as_secs_f64();
    assert!(
        skew_seconds > rule_for,
        "skew lasted {skew_seconds}s, the rule waits {rule_for}s: this run proves nothing"
    );
}

#[test]
fn the_rules_scale_by_one_factor() {
    assert_eq!(SCALE, 1.0 / 120.0);
    assert_eq!(rehearsal::scaled(Duration::from_secs(600)), "5000ms");
    assert_eq!(
        rehearsal::scale_ranges("increase(x[1h]) > 3 and y[24h]"),
        "increase(x[30000ms]) > 3 and y[720000ms]"
    );
    assert_eq!(
        rehearsal::scale_time_constants("time() - t > 3 * 3600"),
        "time() - t > 90 "
    );
    assert_eq!(
        rehearsal::scale_time_constants("(time() - b) < 600 and c > 1"),
        "(time() - b) < 5  and c > 1"
    );
    let rules = rehearsal::scaled_rules();
    for real in ["for: 30m", "[1h]", "3 * 3600", "< 600", "> 3600"] {
        assert!(!rules.contains(real), "{real} left unscaled:\n{rules}");
    }
    assert!(rules.contains("for: 15000ms"), "{rules}");
}

#[tokio::test]
async fn a_healthy_upgrade_of_one_control_plane_and_six_workers_closes_no_gate_of_its_own() {
    // Batch analyses and checks on (at their defaults, the durations scaled): judging the
    // batches adds no gate of its own either.
    let r = Rehearsal::start_judged_alone("1.34.2", 6).await;
    // w3's node script takes a while (a slow mirror), as a real one does: rollgate has
    // the node in hand long enough to see what the inhibition does there.
    r.ground.node("w3").slow_kubeadm(4);
    let started = Instant::now();
    let id = detect(&r, "1.34.5", "all").await;
    r.rg.wait_run_until(&id, "w3's upgrade in hand", RUN_DEADLINE, |run| {
        find_step(run, "workers/upgrade@w3").is_some_and(|s| s["status"] == "running")
    })
    .await;
    // What the drain causes there (kube-prometheus' KubeNodeUnschedulable) is inhibited by
    // the shipped example while w3 is in hand, and pages again once it is not.
    let unschedulable =
        json!({"alertname": "KubeNodeUnschedulable", "node": "w3", "severity": "warning"});
    r.alertmanager
        .post_labelled(unschedulable.clone(), false)
        .await;
    let inhibited = |alerts: Vec<Value>| {
        alerts.first().is_some_and(|a| {
            !a["status"]["inhibitedBy"]
                .as_array()
                .is_none_or(Vec::is_empty)
        })
    };
    eventually(
        "KubeNodeUnschedulable{w3} inhibited",
        Duration::from_secs(10),
        || async {
            inhibited(r.alertmanager.alerts_named("KubeNodeUnschedulable").await).then_some(())
        },
    )
    .await;
    let run = r.rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    let window = started.elapsed().as_secs() + 1;
    eventually(
        "KubeNodeUnschedulable{w3} no longer inhibited",
        Duration::from_secs(20),
        || async {
            (!inhibited(r.alertmanager.alerts_named("KubeNodeUnschedulable").await)).then_some(())
        },
    )
    .await;
    r.alertmanager.post_labelled(unschedulable, true).await;

    r.ground.assert_all_at("1.34.5");
    r.ground.assert_drained_once();
    assert_no_gate_of_its_own(&r, &run, window).await;
    // One worker a batch, min_samples 3: the first two batches wait for a third; from
    // then on each batch is judged with the two before it, and every judgement passes.
    let said = |text: &str| {
        run["history"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["reason"].as_str().is_some_and(|r| r.contains(text)))
            .count()
    };
    assert_eq!(said("analysis latency-p99 pass"), 4, "{run}");
    assert_eq!(said("analysis latency-p99 inconclusive"), 0, "{run}");
    let not_yet = run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| {
            s["outcome"]
                .as_str()
                .is_some_and(|o| o.starts_with("not judged yet"))
        })
        .count();
    assert_eq!(not_yet, 2, "{run}");
    // The check passed at each gate before a node: the control plane's and the six
    // workers'.
    assert_eq!(said("check latency-ceiling pass"), 7, "{run}");
    assert_eq!(said("check latency-ceiling inconclusive"), 0, "{run}");
    // The node in hand was exported and its inhibition source fired for real nodes.
    let in_hand = label_values(
        &r,
        &format!(r#"max_over_time(ALERTS{{alertname="RollgateNodeInHand",alertstate="firing"}}[{window}s])"#),
        "node",
    )
    .await;
    let nodes: BTreeSet<String> = r.ground.nodes.iter().map(|n| n.name.clone()).collect();
    assert!(
        !in_hand.is_empty() && in_hand.is_subset(&nodes),
        "{in_hand:?}"
    );
    assert_eq!(r.rg.metric("k8s_upgrade_in_flight").await, 0.0);
    assert!(
        !r.rg
            .metrics_text()
            .await
            .contains("k8s_upgrade_node_in_hand{"),
        "no node in hand after the run"
    );
}

/// The same clock on k3s: 1 server over a real etcd member and 6 agents, the release
/// fetched and checked before each drain, the service restarted: no gate of its own closes
/// although the cluster runs two releases for longer than the skew rule's scaled wait.
/// The server's restart restarts its etcd member, which takes a second or so of real time
/// at any factor; at 1/120 that second would stand for minutes and outlast
/// EtcdMemberDown's scaled 2 minutes (1 s), which a real k3s restart of seconds never
/// does. So this one rehearses at 1/40: the rule waits 3 s, the restart keeps about its
/// real share of it, and every other duration is scaled by the same factor. Agents go two
/// at a time, so that the run stays short and still spans the skew rule's wait.
#[tokio::test]
async fn a_healthy_k3s_upgrade_of_one_server_and_six_agents_closes_no_gate_of_its_own() {
    let r = Rehearsal::start_release_alone(
        K3S_SCALE,
        (Distro::K3s, "1.34.2"),
        (1, 6),
        &[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "2")],
    )
    .await;
    let started = Instant::now();
    let id = detect(&r, "1.34.5", "all").await;
    let run = r.rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    let window = started.elapsed().as_secs() + 1;
    for node in &r.ground.nodes {
        assert_eq!(
            r.ground.api.node(&node.name)["status"]["nodeInfo"]["kubeletVersion"],
            "v1.34.5+k3s1",
            "{}",
            node.name
        );
    }
    r.ground.assert_drained_once();
    assert_no_gate_of_its_own(&r, &run, window).await;
}

#[tokio::test]
async fn a_worker_that_stays_not_ready_halts_the_run_at_that_worker() {
    let r = Rehearsal::start("1.34.2", 6).await;
    r.ground.node("w2").stay_not_ready();
    let id = detect(&r, "1.34.5", "all").await;
    let run = r.rg.wait_status(&id, "halted", RUN_DEADLINE).await;

    assert_eq!(current_label(&run), "workers/verify@w2", "{run}");
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("w2") && reason.contains("not Ready"),
        "{reason}"
    );
    // w4 and w3 came before it and are done; w2 stays cordoned; nothing after it moved.
    for done in ["cp", "w4", "w3"] {
        assert!(!cordoned(&r, done), "{done}");
    }
    assert!(cordoned(&r, "w2"));
    let cordons = r.ground.cordon_order();
    assert_eq!(cordons, ["cp", "w4", "w3", "w2"]);
    // The shipped rules see it too: KubeNodeNotReady for w2 and the halt; the node in
    // hand no longer inhibits anything while a run is halted.
    eventually(
        "KubeNodeNotReady{w2} and RollgateRunHalted to fire, RollgateNodeInHand to stop",
        Duration::from_secs(30),
        || async {
            let firing = r.firing().await;
            (firing.contains(&"KubeNodeNotReady{w2}".to_owned())
                && firing.contains(&"RollgateRunHalted".to_owned())
                && !firing.iter().any(|a| a.starts_with("RollgateNodeInHand")))
            .then_some(())
        },
    )
    .await;
    assert_eq!(
        r.rg.metric("k8s_upgrade_in_flight").await,
        1.0,
        "a halted run stays in flight"
    );
}

#[tokio::test]
async fn an_unrelated_alert_holds_the_run_and_it_goes_on_when_the_alert_resolves() {
    let r = Rehearsal::start("1.34.2", 6).await;
    let id = detect(&r, "1.34.5", "all").await;
    // The first worker soaks: a DaemonSet pod on the control plane starts crash-looping.
    r.rg.wait_run_until(&id, "w4 to soak", RUN_DEADLINE, |run| {
        find_step(run, "workers/soak@w4").is_some_and(|s| s["status"] != "pending")
    })
    .await;
    r.ground
        .api
        .set_crash_looping("kube-system", "agent-cp", true);
    let held =
        r.rg.wait_run_until(
            &id,
            "a worker's gate to hold the run",
            RUN_DEADLINE,
            |run| {
                run["status"] == "waiting"
                    && run["blockers"].to_string().contains("KubePodCrashLooping")
            },
        )
        .await;
    // Alertmanager told rollgate as well: over HTTPS, with the token that may only post
    // alerts, as the example site configures it.
    let from_alertmanager = "rollgate_http_requests_total{client=\"alertmanager\",code=\"202\",method=\"POST\",route=\"/v1/alerts\"}";
    eventually(
        "Alertmanager's webhook taken over HTTPS",
        Duration::from_secs(60),
        || async { (r.rg.metric(from_alertmanager).await >= 1.0).then_some(()) },
    )
    .await;
    let gate = current_label(&held);
    let node = gate
        .strip_prefix("workers/gate@")
        .unwrap_or_else(|| panic!("held at {gate}"))
        .to_owned();
    assert!(!cordoned(&r, &node), "{node} is cordoned while held");

    r.ground
        .api
        .set_crash_looping("kube-system", "agent-cp", false);
    let run = r.rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert!(
        history_has(&run, &format!("gate closed at step {gate}")),
        "{run}"
    );
    assert!(!history_has(&run, "halted"), "{run}");
    r.ground.assert_all_at("1.34.5");
    r.ground.assert_drained_once();
}

#[tokio::test]
async fn a_rollout_left_part_done_fires_the_skew_and_the_run_that_finishes_it_is_not_held() {
    let r = Rehearsal::start("1.34.2", 2).await;
    // A run that stops after the control plane, as a person might ask.
    let first = detect(&r, "1.34.5", "preflight,snapshot,control-plane").await;
    r.rg.wait_status(&first, "succeeded", RUN_DEADLINE).await;
    eventually(
        "K8sVersionSkew to fire for the skew left behind",
        Duration::from_secs(60),
        || async {
            r.firing()
                .await
                .contains(&"K8sVersionSkew".to_owned())
                .then_some(())
        },
    )
    .await;
    let (_, gates) = r.rg.get("/v1/gates").await;
    assert_eq!(gates["verdict"]["verdict"], "closed", "{gates}");

    // The daily detection's "finish the rollout": the skew does not hold it.
    let finish = detect(&r, "1.34.5", "all").await;
    let run = r.rg.wait_status(&finish, "succeeded", RUN_DEADLINE).await;
    assert!(!history_has(&run, "gate closed"), "{run}");
    let gate_passed = find_step(&run, "preflight/gate").expect("a pre-flight gate")["ended_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .expect("the gate's end");
    let at_gate = r
        .query(&format!(
            r#"ALERTS{{alertname="K8sVersionSkew",alertstate="firing"}} @ {:.3}"#,
            gate_passed.timestamp_millis() as f64 / 1000.0
        ))
        .await;
    assert_eq!(
        at_gate.len(),
        1,
        "the skew fired when the gate let the run by ({gate_passed}): {at_gate:?}, {:?}",
        r.query(r#"ALERTS{alertname="K8sVersionSkew"}[2m]"#).await
    );
    r.ground.assert_all_at("1.34.5");
    eventually("the skew to resolve", Duration::from_secs(30), || async {
        (!r.firing().await.contains(&"K8sVersionSkew".to_owned())).then_some(())
    })
    .await;
}

/// Asks for the reboot of every node whose sentinel is set; the run's id.
async fn reboot_all(r: &Rehearsal) -> String {
    let (status, body) = r.rg.post("/v1/reboots", &json!({})).await;
    assert_eq!(status, 202, "{body}");
    body["run_id"].as_str().expect("run id").to_owned()
}

fn set_ready(r: &Rehearsal, node: &str, ready: bool) {
    r.ground.api.edit_node(node, |n| {
        n["status"]["conditions"] =
            json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
    });
}

#[tokio::test]
async fn a_healthy_reboot_of_one_control_plane_and_six_workers_closes_no_gate_of_its_own() {
    let r = Rehearsal::start("1.34.2", 6).await;
    for node in &r.ground.nodes {
        node.need_reboot();
    }
    // w3 is a server slow to come back (6 minutes, scaled): long enough for
    // KubeNodeNotReady's `for: 5m` while rollgate has it in hand.
    r.ground
        .node("w3")
        .reboot_delay(Duration::from_secs(360).mul_f64(SCALE).as_secs_f64());
    let started = Instant::now();
    let id = reboot_all(&r).await;
    let run = r.rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    let window = started.elapsed().as_secs() + 1;

    for node in &r.ground.nodes {
        assert_eq!(node.reboots(), 1, "{}", node.name);
        assert!(!cordoned(&r, &node.name), "{}", node.name);
    }
    r.ground.assert_drained_once();
    assert!(!history_has(&run, "gate closed"), "{run}");
    assert!(!history_has(&run, "halted"), "{run}");
    // Every node's boot time changed as the exporters saw it: without the rule's exception
    // for rollgate's own reboots, NodeRecentlyRebooted would have held each next node.
    let booted = label_values(
        &r,
        &format!("changes(node_boot_time_seconds[{window}s]) > 0"),
        "node",
    )
    .await;
    let nodes: BTreeSet<String> = r.ground.nodes.iter().map(|n| n.name.clone()).collect();
    assert_eq!(booted, nodes);
    // The only gate alert that fired is the slow node's NotReady while rollgate had it in
    // hand: no gate is asked then, and it resolved before the next one.
    let fired = r
        .query(&format!(
            r#"max_over_time(ALERTS{{alertstate="firing",upgrade_gate="true"}}[{window}s])"#
        ))
        .await;
    let fired: BTreeSet<String> = fired
        .iter()
        .map(|s| {
            format!(
                "{}{{{}}}",
                s["metric"]["alertname"].as_str().unwrap_or_default(),
                s["metric"]["node"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        fired,
        BTreeSet::from(["KubeNodeNotReady{w3}".to_owned()]),
        "gate alerts fired during the run"
    );
    // Its resolution reaches rollgate's board (where resolved alerts stay for a while) on
    // Alertmanager's next group interval; then nothing is firing there.
    eventually(
        "nothing firing on rollgate's board",
        Duration::from_secs(30),
        || async {
            let (_, board) = r.rg.get("/v1/alerts").await;
            let firing = board
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["alert"]["status"] != "resolved");
            (!firing).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_node_nobody_rebooted_going_not_ready_holds_the_reboot_run() {
    let r = Rehearsal::start("1.34.2", 6).await;
    for name in ["w1", "w2", "w3", "w4"] {
        r.ground.node(name).need_reboot();
    }
    let id = reboot_all(&r).await;
    r.rg.wait_run_until(&id, "the first batch to soak", RUN_DEADLINE, |run| {
        run["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == "soak" && s["status"] != "pending")
    })
    .await;
    // w6, which rollgate is not rebooting, goes down on its own.
    set_ready(&r, "w6", false);
    let held =
        r.rg.wait_run_until(&id, "the next gate to hold the run", RUN_DEADLINE, |run| {
            run["status"] == "waiting" && run["blockers"].to_string().contains("KubeNodeNotReady")
        })
        .await;
    let gate = current_label(&held);
    assert!(gate.starts_with("reboot/gate@"), "held at {gate}");
    // It comes back from a reboot nobody planned: now NodeRecentlyRebooted holds the run.
    r.ground.api.edit_node("w6", |n| {
        n["status"]["nodeInfo"]["bootID"] = json!("boot-w6-unplanned");
    });
    set_ready(&r, "w6", true);
    r.rg.wait_run_until(
        &id,
        "NodeRecentlyRebooted to hold the run",
        RUN_DEADLINE,
        |run| {
            run["status"] == "waiting"
                && run["blockers"].to_string().contains("NodeRecentlyRebooted")
        },
    )
    .await;
    // Once it has settled (10 minutes, scaled) the run goes on and completes.
    let run = r.rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert!(
        history_has(&run, &format!("gate closed at step {gate}")),
        "{run}"
    );
    assert!(!history_has(&run, "halted"), "{run}");
    for name in ["w1", "w2", "w3", "w4"] {
        assert_eq!(r.ground.node(name).reboots(), 1, "{name}");
    }
    assert_eq!(r.ground.node("w6").reboots(), 0);
    r.ground.assert_drained_once();
}
