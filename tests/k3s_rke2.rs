//! k3s and RKE2 end to end through `rollgate serve`: servers whose embedded etcd members
//! are real etcd (named as k3s names them), agents in gated batches, every node a real
//! sshd whose k3s or RKE2 binary is swapped by scripts/node-k3s.sh from a local release
//! mirror laid out as GitHub's releases; `rollgate detect` following a local channel
//! server. Every duration is the ground's scaled one (soak 1s, health and verify 20s).

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::ground::Ground;
use support::k3s::{self, Distro};
use support::{find_step, step_label};

const RUN_DEADLINE: Duration = Duration::from_secs(240);
const FROM: &str = "1.34.2";
const TO: &str = "1.34.5";

fn labels(run: &Value) -> Vec<String> {
    run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(step_label)
        .collect()
}

/// The outcome of the step labelled `label`.
fn outcome_of(run: &Value, label: &str) -> String {
    find_step(run, label)
        .and_then(|s| s["outcome"].as_str())
        .unwrap_or_default()
        .to_owned()
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
    let id = rg.detect(TO, "patch").await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_release_upgraded(&ground, &run, Distro::K3s, "server-2", term_before).await;
    let (most, _) = ground.most_workers_cordoned_at_once();
    assert_eq!(most, 2, "agents go two at a time");
    let plan = outcome_of(&run, "plan");
    assert!(plan.contains("etcd stacked"), "{plan}");
    assert!(plan.contains("containerd: k3s bundles its own"), "{plan}");
    let report = run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| step_label(s).as_deref() == Some("control-plane/next"))
        .filter_map(|s| s["outcome"].as_str())
        .next_back()
        .expect("the last next step's report")
        .to_owned();
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
    let id = rg.detect(TO, "patch").await;
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
    let id = rg.detect(TO, "patch").await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let fetch = outcome_of(&run, "control-plane/fetch@server-1");
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
    let id = rg.detect(TO, "patch").await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let check = outcome_of(&run, "preflight/ssh-reachable");
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
    let id = rg.detect(TO, "patch").await;
    let run = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_release_upgraded(&ground, &run, Distro::K3s, "server-1", term_before).await;
    let upgrade = find_step(&run, "workers/upgrade@agent-1").expect("upgrade@agent-1");
    assert_eq!(upgrade["attempts"], 2, "{upgrade}");
}

/// `rollgate detect` on a k3s cluster follows the channel server: the channel of the
/// running minor names a newer build of a newer patch (`v1.34.5+k3s2`), which detect asks
/// for, build and all; the run takes that build from the mirror to every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detect_follows_the_k3s_channel_server_and_the_run_installs_the_build_it_names() {
    let ground = Ground::start_release(Distro::K3s, FROM, 1, 2).await;
    let mirror = ground.mirror.as_ref().expect("mirror");
    let release = format!("v{TO}+k3s2");
    mirror.publish_release(&release);
    let channels = support::services::MiniServer::start().await;
    channels.set_reply(
        200,
        &json!({"type": "collection", "resourceType": "channel", "data": [
            {"id": "stable", "type": "channel", "name": "stable", "latest": "v1.33.9+k3s1"},
            {"id": "latest", "type": "channel", "name": "latest", "latest": "v1.35.1+k3s1"},
            {"id": "v1.34", "type": "channel", "name": "v1.34", "latest": release},
            {"id": "v1.35", "type": "channel", "name": "v1.35", "latest": "v1.35.1+k3s1"},
        ]})
        .to_string(),
    );
    let rg = ground.rollgate(&[]).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("detect")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ROLLGATE__DATA_DIR", ground.dir.path().join("detect"))
        .envs(ground.env())
        .env(
            "ROLLGATE__DETECT__CHANNEL_URL",
            format!("http://{}/v1-release/channels", channels.address()),
        )
        .env("ROLLGATE__DETECT__ROLLGATE_URL", rg.base())
        .env(
            "ROLLGATE__DETECT__TOKEN_FILE",
            rg.data_dir().join("api-token"),
        )
        .output()
        .expect("rollgate detect");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report["findings"]["latest_patch"], TO, "{report}");
    assert_eq!(report["findings"]["builds"][TO], 2, "{report}");
    assert_eq!(report["decision"]["kind"], "patch", "{report}");
    assert_eq!(report["submitted"]["result"], "created", "{report}");
    let heads = channels.heads();
    assert!(
        heads
            .iter()
            .any(|h| h.starts_with("GET /v1-release/channels ")),
        "{heads:?}"
    );

    let id = report["submitted"]["run_id"].as_str().expect("run id");
    let run = rg.wait_status(id, "succeeded", RUN_DEADLINE).await;
    assert_eq!(run["request"]["build"], 2, "{}", run["request"]);
    for node in &ground.nodes {
        assert_eq!(
            k3s::installed(node.dir.path(), Distro::K3s),
            release,
            "{}",
            node.name
        );
        assert_eq!(
            ground.api.node(&node.name)["status"]["nodeInfo"]["kubeletVersion"],
            release.as_str()
        );
    }
    assert_eq!(mirror.downloads(&release), ground.nodes.len());
}

/// k3s on Flatcar with locksmithd running: the upgrade's pre-flight names the agent and
/// what to change, before anything is drained.
#[tokio::test]
async fn a_k3s_node_whose_locksmithd_would_reboot_it_is_refused_in_pre_flight() {
    let ground = Ground::start_release(Distro::K3s, FROM, 1, 1).await;
    ground.node("agent-1").runs_os(support::nodes::FLATCAR);
    ground.node("agent-1").activate("locksmithd.service");
    let rg = ground.rollgate(&[]).await;
    let id = rg.detect(TO, "patch").await;
    let run = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let check = outcome_of(&run, "preflight/ssh-reachable");
    assert!(
        check.starts_with("agent-1: locksmithd is active"),
        "{check}"
    );
    ground.assert_nothing_drained();
}
