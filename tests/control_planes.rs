//! HA control planes end to end through `rollgate serve`: 3 or 5 control-plane nodes, each
//! with a real etcd member of one stacked cluster (the stub `kubeadm` on a node restarts
//! that node's member, as the static-pod upgrade does), workers, a real sshd per node, the
//! fake API server, a real Prometheus for the gate. Every duration is the ground's
//! scaled one (soak 1s, health and verify 20s, gate 2s).

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::ground::Ground;
use support::k3s::{self, Distro};
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

/// What a finished k3s or RKE2 upgrade must leave: every node reporting the release and
/// running its binary, the previous one kept beside it, its service restarted once on it
/// (the node's own log), schedulable; servers one at a time before any agent, the starting
/// leader's last; the raft term risen by exactly one, read from etcd itself; each node's
/// fetch before its drain; the release downloaded once per node.
async fn assert_release_upgraded(
    ground: &Ground,
    run: &Value,
    distro: Distro,
    leader: &str,
    term_before: u64,
) {
    let (from, to) = (distro.release(FROM), distro.release(TO));
    let stacked = ground.etcd.stacked();
    let servers: Vec<String> = stacked.members.iter().map(|m| m.node.clone()).collect();
    for node in &ground.nodes {
        let n = ground.api.node(&node.name);
        assert_eq!(
            n["status"]["nodeInfo"]["kubeletVersion"],
            to.as_str(),
            "{}",
            node.name
        );
        assert!(
            n["spec"]["unschedulable"].is_null(),
            "{} left cordoned",
            node.name
        );
        let d = node.dir.path();
        assert_eq!(k3s::installed(d, distro), to, "{}", node.name);
        assert_eq!(
            k3s::previous(d, distro).as_deref(),
            Some(from.as_str()),
            "{}",
            node.name
        );
        let unit = match (distro, servers.contains(&node.name)) {
            (Distro::K3s, true) => "k3s",
            (Distro::K3s, false) => "k3s-agent",
            (Distro::Rke2, true) => "rke2-server",
            (Distro::Rke2, false) => "rke2-agent",
        };
        let restarts: Vec<String> = node
            .calls()
            .into_iter()
            .filter(|c| c.starts_with("systemctl restart"))
            .collect();
        assert_eq!(
            restarts,
            [format!("systemctl restart {unit}")],
            "{}",
            node.name
        );
    }
    ground.assert_drained_once();
    let order = ground.cordon_order();
    assert_eq!(order.len(), ground.nodes.len(), "{order:?}");
    assert!(
        order[..servers.len()].iter().all(|n| servers.contains(n)),
        "{order:?}"
    );
    assert_eq!(
        order[servers.len() - 1],
        leader,
        "the old leader's server goes last: {order:?}"
    );
    let term_after = stacked.term().await;
    assert_eq!(
        term_after,
        term_before + 1,
        "raft term {term_before} -> {term_after}"
    );
    if servers.len() > 1 {
        assert_ne!(
            stacked.wait_for_leader().await,
            leader,
            "leadership left the old leader"
        );
    }
    let labels = labels(run);
    for node in &ground.nodes {
        let at = |name: &str| {
            labels
                .iter()
                .position(|l| l.ends_with(&format!("/{name}@{}", node.name)))
                .unwrap_or_else(|| panic!("{name}@{} in {labels:?}", node.name))
        };
        assert!(at("fetch") < at("drain"), "{labels:?}");
    }
    assert!(
        !labels
            .iter()
            .any(|l| l.contains("apply@") || l.contains("kubeadm-plan")),
        "{labels:?}"
    );
    let mirror = ground.mirror.as_ref().expect("mirror");
    assert_eq!(
        mirror.downloads(&to),
        ground.nodes.len(),
        "one download per node"
    );
}

/// k3s: 3 servers over real etcd members named as k3s names them, 6 agents in batches of
/// 2; server-2 leads at the start.
#[tokio::test]
async fn k3s_three_servers_one_at_a_time_with_one_leadership_change_then_six_agents_in_batches() {
    let ground = Ground::start_release(Distro::K3s, FROM, 3, 6).await;
    let stacked = ground.etcd.stacked();
    stacked.lead("server-2").await;
    let term_before = stacked.term().await;
    let rg = ground
        .rollgate(&[("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "2".into())])
        .await;
    let id = detect(&rg).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_release_upgraded(&ground, &run, Distro::K3s, "server-2", term_before).await;
    let (most, _) = ground.most_workers_cordoned_at_once();
    assert_eq!(most, 2, "agents go two at a time");
    let plan = outcome_of(&run, "plan").join("");
    assert!(plan.contains("etcd stacked"), "{plan}");
    assert!(plan.contains("containerd: k3s bundles its own"), "{plan}");
    let report = outcome_of(&run, "control-plane/next")
        .into_iter()
        .last()
        .expect("report");
    assert!(
        report.contains("1 leadership change(s), transfers 1"),
        "{report}"
    );
    assert!(report.contains("uncontrolled 0"), "{report}");
}

/// RKE2 with one server (its control plane as static pods of the release's image) and 2
/// agents: the one member's restart is the one election.
#[tokio::test]
async fn rke2_one_server_then_its_agents() {
    let ground = Ground::start_release(Distro::Rke2, FROM, 1, 2).await;
    let term_before = ground.etcd.stacked().term().await;
    let rg = ground.rollgate(&[]).await;
    let id = detect(&rg).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_release_upgraded(&ground, &run, Distro::Rke2, "server-1", term_before).await;
    let pod = ground.api.pod_in("kube-system", "kube-apiserver-server-1");
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        format!("docker.io/rancher/hardened-kubernetes:v{TO}-rke2r1-build20250101")
    );
}

/// A release whose artifact does not match its sha256sum file is refused at the first
/// node's fetch, before that node (or any) is drained; the run halts naming the file and
/// both sums, and no node changed.
#[tokio::test]
async fn a_k3s_release_that_fails_its_checksum_halts_the_run_before_any_drain() {
    let ground = Ground::start_release(Distro::K3s, FROM, 1, 2).await;
    let mirror = ground.mirror.as_ref().expect("mirror");
    let to = Distro::K3s.release(TO);
    let published = mirror.artifact_sum(&to);
    mirror.corrupt(&to);
    let rg = ground.rollgate(&[]).await;
    let id = detect(&rg).await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let fetch = outcome_of(&run, "control-plane/fetch@server-1").join(" ");
    assert!(fetch.contains("checksum mismatch for"), "{fetch}");
    assert!(
        fetch.contains(&format!(
            "says {published}, the download is {}",
            mirror.artifact_sum(&to)
        )),
        "{fetch}"
    );
    ground.assert_nothing_drained();
    for node in &ground.nodes {
        assert_eq!(
            k3s::installed(node.dir.path(), Distro::K3s),
            Distro::K3s.release(FROM)
        );
        assert!(
            !node
                .calls()
                .iter()
                .any(|c| c.starts_with("systemctl restart")),
            "{}",
            node.name
        );
    }
}

/// A release the mirror does not have is refused in pre-flight, naming the node and the
/// URL; nothing is drained.
#[tokio::test]
async fn a_k3s_release_missing_from_the_mirror_is_refused_in_pre_flight() {
    let ground = Ground::start_release(Distro::K3s, FROM, 1, 1).await;
    let mirror = ground.mirror.as_ref().expect("mirror");
    mirror.withdraw(&Distro::K3s.release(TO));
    let rg = ground.rollgate(&[]).await;
    let id = detect(&rg).await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let check = outcome_of(&run, "preflight/ssh-reachable").join(" ");
    assert!(
        check.contains(&format!("the mirror has no release v{TO}+k3s1: {}/v{TO}%2Bk3s1/sha256sum-amd64.txt does not answer", mirror.url())),
        "{check}"
    );
    assert!(
        check.starts_with("server-1 ") || check.starts_with("agent-1 "),
        "{check}"
    );
    ground.assert_nothing_drained();
}

/// rollgate set to kubeadm meets k3s nodes: refused at planning, naming a node and the
/// setting, nothing touched.
#[tokio::test]
async fn k3s_nodes_under_a_kubeadm_setting_are_refused_naming_the_setting() {
    let ground = Ground::start_release(Distro::K3s, FROM, 1, 1).await;
    let env: Vec<(String, String)> = ground
        .env()
        .into_iter()
        .filter(|(k, _)| {
            !k.starts_with("ROLLGATE__CLUSTER__RELEASE_MIRROR")
                && !k.starts_with("ROLLGATE__CLUSTER__DISTRIBUTION")
        })
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let rg = support::Rollgate::start(&env).await;
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": TO, "kind": "patch", "stages": "all"}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let said = body.to_string();
    assert!(
        said.contains(
            "runs k3s (its kubelet version says so), and cluster.distribution is kubeadm"
        ),
        "{said}"
    );
    ground.assert_nothing_drained();
}

/// The SSH session drops while an agent's service restarts: the step is redone, the redo
/// waits for the first run on the node's lock and repeats nothing: one download, one swap,
/// one restart.
#[tokio::test]
async fn an_ssh_cut_during_a_k3s_apply_is_redone_without_a_second_swap_or_restart() {
    let ground = Ground::start_release(Distro::K3s, FROM, 1, 2).await;
    ground.node("agent-1").cut_session_during_upgrade();
    let term_before = ground.etcd.stacked().term().await;
    let rg = ground.rollgate(&[]).await;
    let id = detect(&rg).await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_release_upgraded(&ground, &run, Distro::K3s, "server-1", term_before).await;
    let upgrade = support::find_step(&run, "workers/upgrade@agent-1").expect("upgrade@agent-1");
    assert_eq!(upgrade["attempts"], 2, "{upgrade}");
}
