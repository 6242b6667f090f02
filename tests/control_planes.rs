//! HA control planes end to end through `rollgate serve`: 3 or 5 control-plane nodes, each
//! with a real etcd member of one stacked cluster (the stub `kubeadm` on a node restarts
//! that node's member, as the static-pod upgrade does), workers, a real sshd per node, the
//! fake API server, a real Prometheus for the gate. Every duration is the ground's
//! scaled one (soak 1s, health and verify 20s, gate 2s).

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::ground::Ground;
use support::kube::Change;
use support::{Rollgate, eventually};

const RUN_DEADLINE: Duration = Duration::from_secs(240);
const FROM: &str = "1.34.2";
const TO: &str = "1.34.5";

async fn detect(rg: &Rollgate) -> String {
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": TO, "kind": "patch", "stages": "all"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    body["run_id"].as_str().expect("run id").to_owned()
}

fn labels(run: &Value) -> Vec<String> {
    rollgate::workflows::register();
    run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| serde_json::from_value::<rollgate::domain::run::Step>(s.clone()).ok())
        .map(|s| s.label())
        .collect()
}

fn outcome_of(run: &Value, label: &str) -> Vec<String> {
    rollgate::workflows::register();
    run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| {
            serde_json::from_value::<rollgate::domain::run::Step>((*s).clone())
                .is_ok_and(|step| step.label() == label)
        })
        .filter_map(|s| s["outcome"].as_str().map(str::to_owned))
        .collect()
}

/// Which kubeadm upgrade each control plane ran, by node.
fn kubeadm_runs(ground: &Ground, node: &str) -> Vec<String> {
    ground
        .node(node)
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("kubeadm upgrade apply") || c == "kubeadm upgrade node")
        .collect()
}

/// What every finished HA upgrade must leave: every node at the target and schedulable,
/// control planes one at a time with the old leader's last, `apply` on a follower's node
/// and `node` on the others, the term risen by exactly one (read from etcd itself) and one
/// move recorded, no node drained twice; the stage's report says so.
async fn assert_ha_upgraded(ground: &Ground, run: &Value, leader: &str, term_before: u64) {
    let stacked = ground.etcd.stacked();
    let cps: Vec<String> = stacked.members.iter().map(|m| m.name.clone()).collect();
    ground.assert_all_at(TO);
    for cp in &cps {
        let pod = ground
            .api
            .pod_in("kube-system", &format!("kube-apiserver-{cp}"));
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            format!("registry.k8s.io/kube-apiserver:v{TO}")
        );
    }
    ground.assert_drained_once();

    // Control planes first, one at a time, the starting leader's last of them.
    let order = ground.cordon_order();
    assert!(
        order[..cps.len()].iter().all(|n| cps.contains(n)),
        "{order:?}"
    );
    assert_eq!(
        order[cps.len() - 1],
        leader,
        "the old leader's node goes last: {order:?}"
    );

    // apply on the first control plane upgraded (a follower's node; again only if a
    // restart of rollgate cut it short), node on every other.
    let first = &order[0];
    assert_ne!(first, leader);
    let apply = format!("kubeadm upgrade apply -y v{TO}");
    let runs = kubeadm_runs(ground, first);
    assert!(
        !runs.is_empty() && runs.iter().all(|c| *c == apply),
        "{first}: {runs:?}"
    );
    for cp in cps.iter().filter(|c| *c != first) {
        let runs = kubeadm_runs(ground, cp);
        assert!(
            !runs.is_empty() && runs.iter().all(|c| c == "kubeadm upgrade node"),
            "{cp}: {runs:?}"
        );
    }
    let labels = labels(run);
    assert!(
        labels.contains(&format!("control-plane/apply@{first}")),
        "{labels:?}"
    );

    // Exactly one leadership change over the whole run, read from etcd itself.
    let term_after = stacked.term().await;
    assert_eq!(
        term_after,
        term_before + 1,
        "raft term {term_before} -> {term_after}"
    );
    assert_eq!(
        run["memory"]["leader_moves"].as_array().map(Vec::len),
        Some(1),
        "{}",
        run["memory"]
    );
    assert_ne!(
        stacked.wait_for_leader().await,
        leader,
        "leadership left the old leader"
    );
    let report = outcome_of(run, "control-plane/next")
        .into_iter()
        .last()
        .expect("the last next step's report");
    assert!(
        report.contains("1 leadership change(s), transfers 1"),
        "{report}"
    );
    assert!(report.contains("uncontrolled 0"), "{report}");
    assert!(report.contains(&format!("{first} (apply)")), "{report}");
}

/// A 3 (or 5) control-plane upgrade with `leader` leading etcd at the start.
async fn upgrade_with_leader(control_planes: usize, leader: &str) {
    let ground = Ground::start_ha(FROM, control_planes, 3).await;
    let stacked = ground.etcd.stacked();
    stacked.lead(leader).await;
    let term_before = stacked.term().await;
    let rg = ground.rollgate(&[]).await;
    let id = detect(&rg).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_ha_upgraded(&ground, &run, leader, term_before).await;
    let sample = |name: &str| format!("{name}{{target=\"control-plane\"}}");
    for (name, want) in [
        ("etcd_roll_leadership_transfers_total", 1.0),
        ("etcd_roll_leadership_changes_total", 1.0),
        ("etcd_roll_uncontrolled_leadership_changes_total", 0.0),
    ] {
        assert_eq!(rg.metric(&sample(name)).await, want, "{name}");
    }
    let plan = outcome_of(&run, "plan").join("");
    assert!(plan.contains("etcd stacked"), "{plan}");
    assert!(
        plan.contains(&format!(
            "upgrade {leader} (kubeadm upgrade node): hosts the etcd leader"
        )),
        "{plan}"
    );
}

#[tokio::test]
async fn three_control_planes_with_cp_1_leading() {
    upgrade_with_leader(3, "cp-1").await;
}

#[tokio::test]
async fn three_control_planes_with_cp_2_leading() {
    upgrade_with_leader(3, "cp-2").await;
}

#[tokio::test]
async fn three_control_planes_with_cp_3_leading() {
    upgrade_with_leader(3, "cp-3").await;
}

#[tokio::test]
async fn five_control_planes_with_the_middle_one_leading() {
    upgrade_with_leader(5, "cp-3").await;
}

#[tokio::test]
async fn kill_9_at_random_moments_keeps_one_leadership_change_and_drains_nothing_twice() {
    let ground = Ground::start_ha(FROM, 3, 3).await;
    for node in &ground.nodes {
        node.slow_kubeadm(1);
    }
    ground.api.add_pods("w1", "web", 2, false);
    let stacked = ground.etcd.stacked();
    stacked.lead("cp-2").await;
    let term_before = stacked.term().await;
    let mut rg = ground
        .rollgate(&[("ROLLGATE__CLUSTER__SOAK", "2s".into())])
        .await;
    let id = detect(&rg).await;
    let mut next = support::xorshift();
    let mut kills = 0;
    let mut last_done = 0;
    while kills < 12 {
        // A random moment: some steps further on, plus a random pause into the next ones.
        let moment = last_done + 1 + (next() as usize) % 3;
        let run = eventually("the run to reach the next moment", RUN_DEADLINE, || async {
            let run = rg.run(&id).await;
            assert_ne!(run["status"], "succeeded", "finished after {kills} kills");
            let done = run["steps"]
                .as_array()
                .map_or(0, |s| s.iter().filter(|s| s["status"] == "done").count());
            (done >= moment).then_some(done)
        })
        .await;
        last_done = run;
        tokio::time::sleep(Duration::from_millis(next() % 700)).await;
        rg.kill9();
        kills += 1;
        rg.restart().await;
    }
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    println!("{kills} kill -9s during the run");
    // The move and the report span restarts: both are recorded in the run (the metrics
    // started over with each restart).
    assert_ha_upgraded(&ground, &run, "cp-2", term_before).await;
}

#[tokio::test]
async fn a_member_that_does_not_come_back_halts_the_run_before_the_next_control_plane() {
    let ground = Ground::start_ha(FROM, 3, 1).await;
    let stacked = ground.etcd.stacked();
    stacked.lead("cp-1").await;
    // cp-2 is the first follower's node: its member stops at its upgrade and stays down.
    ground.node("cp-2").break_etcd();
    let rg = ground
        .rollgate(&[(
            "ROLLGATE__CLUSTER__CONTROL_PLANE_HEALTH_TIMEOUT",
            "3s".into(),
        )])
        .await;
    let id = detect(&rg).await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("control-plane/healthy-after@cp-2"),
        "{reason}"
    );
    assert!(
        reason.contains("etcd member cp-2 does not answer"),
        "{reason}"
    );
    assert!(
        reason.contains("no further control plane was touched"),
        "{reason}"
    );
    // Nothing else touched: only cp-2 was cordoned (and uncordoned after its script).
    assert_eq!(ground.cordon_order(), ["cp-2"]);
    for node in ["cp-1", "cp-3", "w1"] {
        assert!(
            kubeadm_runs(&ground, node).is_empty(),
            "{node} was upgraded"
        );
        assert_eq!(
            ground.api.node(node)["status"]["nodeInfo"]["kubeletVersion"],
            format!("v{FROM}")
        );
    }
    // The member it names is the one down; the leader did not move.
    assert_eq!(stacked.wait_for_leader().await, "cp-1");
}

#[tokio::test]
async fn an_etcd_alarm_is_refused_at_pre_flight_naming_it() {
    let ground = Ground::start_ha(FROM, 3, 1).await;
    let stacked = ground.etcd.stacked();
    let endpoint = stacked.endpoints()[1].clone();
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("etcd");
    let id = client
        .status()
        .await
        .expect("status")
        .header()
        .expect("header")
        .member_id();
    let mut on = etcd_client::AlarmOptions::new();
    on.with_member(id);
    client
        .alarm(
            etcd_client::AlarmAction::Activate,
            etcd_client::AlarmType::Nospace,
            Some(on),
        )
        .await
        .expect("raise NOSPACE");
    let rg = ground.rollgate(&[]).await;
    let run_id = detect(&rg).await;
    let run = rg.wait_status(&run_id, "halted", RUN_DEADLINE).await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("preflight/etcd-healthy"), "{reason}");
    assert!(
        reason.contains("etcd alarm NOSPACE raised on member cp-2"),
        "{reason}"
    );
    assert!(
        reason.contains("refusing to start: no node was touched"),
        "{reason}"
    );
    assert!(ground.cordon_order().is_empty());
    ground.assert_nothing_installed();
}

#[tokio::test]
async fn rollgates_own_pod_is_evicted_last_and_the_run_carries_on_after_its_reschedule() {
    let ground = Ground::start(FROM, 3).await;
    ground.api.add_pods("w2", "web", 3, false);
    ground.api.add_own_pod("rollgate", "rollgate-0", "w2");
    let own = [
        ("POD_NAMESPACE", "rollgate".to_owned()),
        ("POD_NAME", "rollgate-0".to_owned()),
    ];
    let mut rg = ground.rollgate(&own).await;
    let id = detect(&rg).await;
    // The reschedule: when its eviction comes, this rollgate dies (kill -9, as a node
    // lost would do it) and a new one starts with the same data, as the StatefulSet's pod
    // with its volume would.
    eventually("rollgate's own eviction", RUN_DEADLINE, || async {
        ground
            .api
            .changes()
            .iter()
            .any(|c| matches!(c, Change::Evicted { pod, .. } if pod == "rollgate-0"))
            .then_some(())
    })
    .await;
    rg.kill9();
    let evicted_from_w2: Vec<String> = ground
        .api
        .changes()
        .iter()
        .filter_map(|c| match c {
            Change::Evicted { node, pod } if node == "w2" => Some(pod.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(evicted_from_w2.len(), 4, "{evicted_from_w2:?}");
    assert_eq!(
        evicted_from_w2.last().map(String::as_str),
        Some("rollgate-0"),
        "evicted last"
    );
    let moved = eventually("the pod rescheduled", Duration::from_secs(10), || async {
        let pod = ground.api.pod_in("rollgate", "rollgate-0");
        let node = pod["spec"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        (!node.is_empty() && node != "w2").then_some(node)
    })
    .await;
    assert_ne!(moved, "cp");
    rg.restart().await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert!(
        ground.api.node("w2")["spec"]["unschedulable"].is_null(),
        "w2 left cordoned"
    );
    ground.assert_drained_once();
    let drain = outcome_of(&run, "workers/drain@w2").join("");
    assert!(drain.contains("cordoned"), "{drain}");
    assert!(
        run["history"].to_string().contains("rollgate restarted"),
        "{}",
        run["history"]
    );
}

#[tokio::test]
async fn rollgate_plan_shows_the_control_plane_order_and_why() {
    let ground = Ground::start_ha(FROM, 3, 1).await;
    ground.etcd.stacked().lead("cp-2").await;
    let (code, text, err) = ground.rollgate_plan(&["--target", TO]);
    assert_eq!(code, Some(0), "{err}");
    let expected = [
        "etcd: stacked",
        "  1. upgrade cp-1 (kubeadm upgrade apply): an etcd follower's node",
        "  2. upgrade cp-3 (kubeadm upgrade node): an etcd follower's node",
        "  3. move etcd leadership cp-2 -> cp-1: the one leadership change",
        "  4. upgrade cp-2 (kubeadm upgrade node): hosts the etcd leader, so it goes last",
        "preflight/etcd-healthy",
        "preflight/kubeadm-plan@cp-1",
        "control-plane/next",
    ];
    for line in expected {
        assert!(text.contains(line), "{line:?} not in:\n{text}");
    }
    assert!(ground.api.changes().is_empty());
}
