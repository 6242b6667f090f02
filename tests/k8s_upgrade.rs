//! The Kubernetes version upgrade end to end through `rollgate serve`: the fake API server,
//! a real sshd per node running scripts/node-upgrade.sh with stub package tools, a real
//! etcd for the snapshot, a real Prometheus for the gate, a Slack capture server.

mod support;

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use support::ground::{Ground, WORKER_ORDER};
use support::kube::Change;
use support::rabbit::{self, Names};
use support::{Rollgate, eventually};

const RUN_DEADLINE: Duration = Duration::from_secs(180);

async fn start(ground: &Ground, extra: &[(&str, String)]) -> Rollgate {
    let mut env = ground.env();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Rollgate::start(&env).await
}

async fn detect(rg: &Rollgate, target: &str, kind: &str) -> String {
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": target, "kind": kind, "stages": "all"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    body["run_id"].as_str().expect("run id").to_owned()
}

async fn wait_status(rg: &Rollgate, id: &str, want: &str) -> Value {
    eventually(&format!("run {want}"), RUN_DEADLINE, || async {
        let run = rg.run(id).await;
        let status = run["status"].as_str().unwrap_or_default().to_owned();
        if status == want {
            return Some(run);
        }
        assert!(
            !["failed", "aborted", "succeeded", "halted"].contains(&status.as_str()),
            "run ended {status} while waiting for {want}: {}\n{}",
            run["reason"],
            rg.logs()
        );
        None
    })
    .await
}

fn step<'a>(run: &'a Value, label: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            let name = s["name"].as_str().unwrap();
            let stage = s["stage"].as_str().unwrap();
            let mut l = if stage == name {
                name.to_owned()
            } else {
                format!("{stage}/{name}")
            };
            if let Some(node) = s["node"].as_str() {
                l.push('@');
                l.push_str(node);
            }
            l == label
        })
        .unwrap_or_else(|| panic!("no step {label} in {run}"))
}

/// Nodes in the order they were cordoned.
fn cordon_order(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::Cordon(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

/// Checks what a finished upgrade must leave: every node at `target` and schedulable,
/// nodes rolled in order, no node drained after its uncordon, in-flight marks cleared, a
/// verified snapshot, every transition told to Slack.
async fn assert_upgraded(ground: &Ground, rg: &Rollgate, run: &Value, target: &str) {
    for node in &ground.nodes {
        let n = ground.api.node(&node.name);
        assert_eq!(
            n["status"]["nodeInfo"]["kubeletVersion"],
            format!("v{target}"),
            "{}",
            node.name
        );
        assert!(
            n["spec"]["unschedulable"].is_null(),
            "{} left cordoned: {n}",
            node.name
        );
        assert!(
            n["metadata"]["annotations"]["rollgate.io/cordoned-by"].is_null(),
            "{n}"
        );
        assert!(node.installed("kubelet").starts_with(&format!("{target}-")));
    }
    let changes = ground.api.changes();
    let mut expected = vec!["cp".to_owned()];
    expected.extend(WORKER_ORDER.iter().map(|w| w.to_string()));
    assert_eq!(cordon_order(&changes), expected);
    assert_no_drain_after_uncordon(&changes);

    let annotations = &ground.api.namespace("k8s-upgrade")["metadata"]["annotations"];
    assert!(
        annotations.as_object().is_none_or(|a| a.is_empty()),
        "in-flight marks left: {annotations}"
    );

    let note = step(run, "snapshot/etcd-snapshot")["outcome"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = note
        .strip_prefix("snapshot ")
        .and_then(|r| r.split(' ').next())
        .expect("snapshot path in the outcome");
    assert!(path.starts_with(&ground.snapshot_dir().display().to_string()));
    assert!(
        path.contains(&format!("k8s-upgrade-pre-{target}-")),
        "{path}"
    );
    let status = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", path, "-w", "json"])
        .output()
        .expect("etcdctl (etcd-client)");
    assert!(
        status.status.success(),
        "etcdctl snapshot status: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let info: Value = serde_json::from_slice(&status.stdout).expect("json");
    assert!(info["totalKey"].as_u64() > Some(0), "{info}");

    assert_eq!(rg.metric("k8s_upgrade_in_flight").await, 0.0);
    assert_eq!(rg.metric("k8s_upgrade_snapshot_taken").await, 1.0);

    let history = run["history"].as_array().unwrap();
    let texts = eventually(
        "every transition in Slack",
        Duration::from_secs(15),
        || async {
            let texts = ground.slack_texts();
            (texts.len() >= history.len()).then_some(texts)
        },
    )
    .await;
    for h in history {
        let reason = h["reason"].as_str().unwrap();
        assert!(
            texts.iter().any(|t| t.ends_with(reason)),
            "no Slack message for {reason:?}"
        );
    }
}

fn assert_no_drain_after_uncordon(changes: &[Change]) {
    let mut uncordoned: BTreeMap<String, bool> = BTreeMap::new();
    for c in changes {
        match c {
            Change::Uncordon(n) => {
                uncordoned.insert(n.clone(), true);
            }
            Change::Cordon(n) | Change::Evicted { node: n, .. } => {
                assert!(
                    !uncordoned.get(n).copied().unwrap_or(false),
                    "{n} was drained again after its uncordon: {changes:?}"
                );
            }
            _ => {}
        }
    }
}

#[tokio::test]
async fn a_patch_upgrade_runs_end_to_end_embedded() {
    let ground = Ground::start("1.34.2", 4).await;
    ground.api.add_pods("w4", "web", 3, true);
    ground.api.add_pods("w2", "web", 2, false);
    ground.api.set_pdb("web", "web", 3);
    let rg = start(&ground, &[]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "succeeded").await;
    assert_upgraded(&ground, &rg, &run, "1.34.5").await;
    // The kubeadm commands each role needs, on the nodes that needed them.
    assert!(
        ground
            .node("cp")
            .calls()
            .contains(&"kubeadm upgrade apply -y v1.34.5".to_owned()),
        "{:?}",
        ground.node("cp").calls()
    );
    assert!(
        ground
            .node("w1")
            .calls()
            .contains(&"kubeadm upgrade node".to_owned())
    );
    // The web pods were evicted, the PDB made the last one wait for a replacement, and
    // the DaemonSet and mirror pods stayed.
    let changes = ground.api.changes();
    let evicted_from_w4: Vec<&Change> = changes
        .iter()
        .filter(|c| matches!(c, Change::Evicted { node, .. } if node == "w4"))
        .collect();
    assert_eq!(evicted_from_w4.len(), 3, "{changes:?}");
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::Refused { node, .. } if node == "w4")),
        "{changes:?}"
    );
    let on_w4: Vec<String> = ground
        .api
        .pods_on("w4")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(on_w4.contains(&"agent-w4".to_owned()) && on_w4.contains(&"static-w4".to_owned()));
    let drain = step(&run, "workers/drain@w4")["outcome"].as_str().unwrap();
    assert!(
        drain.contains("3 pod(s) evicted, 2 DaemonSet/mirror pod(s) left"),
        "{drain}"
    );
}

#[tokio::test]
async fn a_minor_upgrade_runs_end_to_end_amqp() {
    let names = Names::unique();
    let ground = Ground::start("1.34.2", 4).await;
    // The control plane's containerd is behind a worker's: stage 3 catches it up.
    ground
        .api
        .state
        .lock()
        .unwrap()
        .nodes
        .get_mut("w3")
        .unwrap()["status"]["nodeInfo"]["containerRuntimeVersion"] = json!("containerd://1.7.24");
    let rg = start(&ground, &names.env()).await;
    let id = detect(&rg, "1.35.0", "minor").await;
    let run = wait_status(&rg, &id, "succeeded").await;
    assert_upgraded(&ground, &rg, &run, "1.35.0").await;
    for node in &ground.nodes {
        assert!(
            node.apt_source().contains("/v1.35/deb/"),
            "{}",
            node.apt_source()
        );
    }
    assert_eq!(
        ground.api.node("cp")["status"]["nodeInfo"]["containerRuntimeVersion"],
        "containerd://1.7.24"
    );
    rabbit::cleanup(&names).await;
}
