//! The Kubernetes version upgrade end to end through `rollgate serve`: the fake API server,
//! a real sshd per node running scripts/node-upgrade.sh with stub package tools (or, in one
//! test, Debian's own apt and dpkg), a real etcd for the snapshot, a real Prometheus for
//! the gate, a Slack capture server.

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::ground::{Ground, WORKER_ORDER};
use support::kube::Change;
use support::nodes::Packages;
use support::rabbit::{self, Names};
use support::services::Alertmanager;
use support::{Rollgate, eventually, find_step, webhook};

const RUN_DEADLINE: Duration = Duration::from_secs(180);

async fn start(ground: &Ground, extra: &[(&str, String)]) -> Rollgate {
    ground.rollgate(extra).await
}

async fn detect(rg: &Rollgate, target: &str, kind: &str) -> String {
    rg.detect(target, kind).await
}

/// No upgrade in flight: the gauges the Upgrade Gates rules read are back to rest. They
/// follow the store's commit (a reader may see the run's end a moment before them), so
/// they are given a few seconds to get there.
async fn assert_gauges_at_rest(rg: &Rollgate) {
    eventually(
        "the upgrade gauges at rest",
        Duration::from_secs(5),
        || async {
            let gauges = (
                rg.metric("k8s_upgrade_in_flight").await,
                rg.metric("k8s_upgrade_snapshot_taken").await,
                rg.metric("k8s_upgrade_stage").await,
            );
            (gauges == (0.0, 0.0, -1.0)).then_some(())
        },
    )
    .await;
}

async fn wait_status(rg: &Rollgate, id: &str, want: &str) -> Value {
    rg.wait_status(id, want, RUN_DEADLINE).await
}

fn step<'a>(run: &'a Value, label: &str) -> &'a Value {
    find_step(run, label).unwrap_or_else(|| panic!("no step {label} in {run}"))
}

/// Whether every transition must have reached Slack: notices are sent after the commit,
/// so a kill -9 between the two loses that notice (at-most-once).
#[derive(PartialEq)]
enum Told {
    Everything,
    TheEnd,
}

/// Checks what a finished upgrade must leave: every node at `target` and schedulable,
/// nodes rolled in order, no node drained after its uncordon, in-flight marks cleared, a
/// verified snapshot, transitions told to Slack.
async fn assert_upgraded(ground: &Ground, rg: &Rollgate, run: &Value, target: &str, told: Told) {
    ground.assert_all_at(target);
    let mut expected = vec!["cp".to_owned()];
    expected.extend(WORKER_ORDER.iter().map(|w| w.to_string()));
    assert_eq!(ground.cordon_order(), expected);
    ground.assert_drained_once();

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

    assert_gauges_at_rest(rg).await;

    let history = run["history"].as_array().unwrap();
    if told == Told::TheEnd {
        eventually("the success in Slack", Duration::from_secs(15), || async {
            let texts = ground.slack_texts();
            texts
                .iter()
                .any(|t| t.ends_with("every step done"))
                .then_some(())
        })
        .await;
        return;
    }
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

#[tokio::test]
async fn a_patch_upgrade_runs_end_to_end_embedded() {
    let ground = Ground::start("1.34.2", 4).await;
    ground.api.add_pods("w4", "web", 3, true);
    ground.api.add_pods("w2", "web", 2, false);
    ground.api.set_pdb("web", "web", 3);
    let rg = start(&ground, &[]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "succeeded").await;
    assert_upgraded(&ground, &rg, &run, "1.34.5", Told::Everything).await;
    // A node's commands reuse its connection, by each node's own sshd: its pre-flight
    // check and reboot-manager probe, its download and its upgrade, one handshake.
    for node in &ground.nodes {
        let (sessions, connections) = node.ssh_sessions();
        assert!(
            sessions >= 4 && connections == 1,
            "{}: {sessions} sessions over {connections} connections",
            node.name
        );
    }
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
    // The web pods were evicted, the PDB made the last one wait for a replacement (rollgate
    // read the budget again before it), the budget was never overrun by the API server's
    // own count, and the DaemonSet and mirror pods stayed.
    let changes = ground.api.changes();
    let evicted_from_w4: Vec<&Change> = changes
        .iter()
        .filter(|c| matches!(c, Change::Evicted { node, .. } if node == "w4"))
        .collect();
    assert_eq!(evicted_from_w4.len(), 3, "{changes:?}");
    assert!(ground.api.budget_low("web").is_some_and(|low| low >= 0));
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
    assert!(!drain.contains(" 0 PDB refusal(s)"), "{drain}");
    // `kubectl describe node` tells each node's story, in order; the upgrade namespace
    // tells the run's.
    for node in ["cp", "w4", "w3", "w2", "w1"] {
        let events = eventually("the node's events", Duration::from_secs(10), || async {
            let events = ground.api.events_about("Node", node);
            (events.len() >= 5).then_some(events)
        })
        .await;
        assert_eq!(
            reasons(&events),
            [
                "Cordoned",
                "DrainStarted",
                "Drained",
                "Upgraded",
                "Uncordoned"
            ],
            "{node}: {events:?}"
        );
        let event = &events[0];
        assert_eq!(event["type"], "Normal");
        assert_eq!(event["reportingController"], "rollgate.io/rollgate");
        assert_eq!(event["metadata"]["namespace"], "default");
        assert!(
            events[3]["note"]
                .as_str()
                .unwrap()
                .contains("upgraded to v1.34.5")
        );
    }
    assert!(
        ground.api.events_about("Node", "w4")[2]["note"]
            .as_str()
            .unwrap()
            .contains("3 pod(s) evicted")
    );
    let run_events = eventually("the run's events", Duration::from_secs(10), || async {
        let events = ground.api.events_about("Namespace", "k8s-upgrade");
        reasons(&events)
            .contains(&"RunSucceeded".to_owned())
            .then_some(events)
    })
    .await;
    assert_eq!(
        reasons(&run_events),
        ["RunAccepted", "RunStarted", "RunSucceeded"]
    );
    assert!(run_events[2]["note"].as_str().unwrap().contains(&id));
}

fn reasons(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn an_events_api_that_fails_changes_nothing_in_the_run() {
    let ground = Ground::start("1.34.2", 2).await;
    ground.api.fail_events(true);
    let rg = start(&ground, &[]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "succeeded").await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    assert!(ground.api.events_about("Node", "w1").is_empty());
    // Not a step outcome, not a retry, not a line of the history mentions it.
    let text = run.to_string();
    assert!(
        !text.contains("Event") && !text.contains("retrying"),
        "{run}"
    );
    eventually("the refusals counted", Duration::from_secs(10), || async {
        let failed = rg
            .metric("rollgate_notifications_total{outcome=\"failed\",sink=\"kube-events\"}")
            .await;
        (failed >= 10.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_minor_upgrade_runs_end_to_end_amqp() {
    let names = Names::unique();
    let ground = Ground::start("1.34.2", 4).await;
    // The control plane's containerd is behind a worker's: stage 3 catches it up.
    ground.api.edit_node("w3", |n| {
        n["status"]["nodeInfo"]["containerRuntimeVersion"] = json!("containerd://1.7.24");
    });
    let rg = start(&ground, &names.env()).await;
    let id = detect(&rg, "1.35.0", "minor").await;
    let run = wait_status(&rg, &id, "succeeded").await;
    assert_upgraded(&ground, &rg, &run, "1.35.0", Told::Everything).await;
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

/// A mixed cluster on real package managers: an Ubuntu control plane and worker on
/// Debian's own apt and dpkg, an openEuler worker on Debian's own dnf and rpm (versionlock
/// in use, the repository excluding the Kubernetes packages; its os-release names no family
/// the script knows, its `rollgate.io/package-manager` label names dnf), an openSUSE worker
/// on Debian's own zypper and rpm (locks in use), each over repositories laid out as
/// pkgs.k8s.io's. A patch and then a minor upgrade each finish in one run; every node's own package
/// database reads the target for kubeadm, kubelet and kubectl, held or locked again; after
/// the minor every node's repository names the new minor, and the dnf node's still
/// excludes the packages.
/// openEuler's /etc/os-release: dnf, though it names no family the node script knows.
const OPEN_EULER: &str = "NAME=\"openEuler\"\nID=\"openEuler\"\nVERSION_ID=\"24.03\"\nPRETTY_NAME=\"openEuler 24.03 (LTS)\"\n";

#[tokio::test]
async fn a_patch_then_a_minor_upgrade_on_a_mixed_apt_dnf_and_zypper_cluster() {
    let ground = Ground::start_with_packages("1.34.2", 3, |name| match name {
        "cp" | "w1" => Packages::Apt,
        "w2" => Packages::Dnf,
        _ => Packages::Zypper,
    })
    .await;
    // w2 runs openEuler, a dnf distribution its os-release does not show: its label names
    // the package manager.
    ground.node("w2").runs_os(OPEN_EULER);
    ground.api.edit_node("w2", |n| {
        n["metadata"]["labels"]["rollgate.io/package-manager"] = json!("dnf");
    });
    let rg = start(&ground, &[]).await;
    for (target, kind) in [("1.34.5", "patch"), ("1.35.0", "minor")] {
        let id = detect(&rg, target, kind).await;
        wait_status(&rg, &id, "succeeded").await;
        ground.assert_all_at(target);
        for node in &ground.nodes {
            for pkg in ["kubeadm", "kubelet", "kubectl"] {
                let installed = node.installed(pkg);
                assert!(
                    installed.starts_with(&format!("{target}-")),
                    "{} {pkg}: {installed}",
                    node.name
                );
                assert!(node.held(pkg), "{} {pkg} is not held", node.name);
            }
        }
    }
    for node in &ground.nodes {
        let repository = node.apt_source();
        let (want, excludes) = match node.name.as_str() {
            "cp" | "w1" => ("/core:/stable:/v1.35/deb/ /", false),
            "w2" => ("/core:/stable:/v1.35/rpm/", true),
            _ => ("/core:/stable:/v1.35/rpm/", false),
        };
        assert!(repository.contains(want), "{}: {repository}", node.name);
        assert_eq!(
            repository.contains("exclude=kubelet kubeadm kubectl"),
            excludes,
            "{}: {repository}",
            node.name
        );
    }
}

/// A worker whose repository lacks the patch (its mirror behind the others'): pre-flight
/// refuses the run on the spot, naming the worker and its repository; nothing is drained or
/// installed.
#[tokio::test]
async fn a_worker_whose_repository_lacks_the_patch_is_refused_in_pre_flight() {
    let ground = Ground::start("1.34.2", 3).await;
    let repo = ground.node("w2").dir.path().join("state/repo");
    let listed = std::fs::read_to_string(&repo).unwrap();
    std::fs::write(&repo, listed.replace("1.34.5-1.1\n", "")).unwrap();
    let rg = start(&ground, &[]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "halted").await;
    let check = step(&run, "preflight/ssh-reachable")["outcome"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        check.contains(
            "w2 kubeadm 1.34.5 is not in the apt repository (apt-cache madison kubeadm), as its lists stand"
        ),
        "{check}"
    );
    ground.assert_nothing_drained();
    ground.assert_nothing_installed();
}

/// A package in the control plane's repository that does not match the repository's
/// checksum (a mirror serving a corrupt file) is refused at the control plane's fetch,
/// before its health check, gate or drain: the run halts naming the file and both sums,
/// which sha256sum reads independently off the file as published and as served. apt,
/// Debian's own, checks it; nothing is drained or installed, and the node's own package
/// database still reads the old version.
#[tokio::test]
async fn a_package_that_does_not_match_its_checksum_is_refused_before_the_drain() {
    let ground = Ground::start_with_packages("1.34.2", 1, |_| Packages::Apt).await;
    let deb = ground
        .node("cp")
        .dir
        .path()
        .join("repo/core:/stable:/v1.34/deb/kubelet_1.34.5-1.1_all.deb");
    let sha256 = |path: &std::path::Path| {
        let out = std::process::Command::new("sha256sum")
            .arg(path)
            .output()
            .expect("sha256sum");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let published = sha256(&deb);
    // The same size, other bytes: only the checksum tells.
    let mut bytes = std::fs::read(&deb).expect("deb");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&deb, bytes).expect("corrupt deb");
    let served = sha256(&deb);

    let rg = start(&ground, &[]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "halted").await;
    let fetch = step(&run, "control-plane/fetch@cp");
    let said = fetch["outcome"].as_str().unwrap_or_default();
    assert!(
        said.contains(&format!(
            "kubelet_1.34.5-1.1_all.deb does not match its checksum: the repository says {published}, the download is {served}"
        )),
        "{fetch}"
    );
    assert!(run["reason"].to_string().contains("fetch@cp"), "{run}");
    ground.assert_nothing_drained();
    for pkg in ["kubeadm", "kubelet", "kubectl"] {
        let installed = ground.node("cp").installed(pkg);
        assert_eq!(installed, "1.34.2-1.1", "cp {pkg}");
        assert!(ground.node("cp").held(pkg), "cp {pkg} is not held");
    }
}

fn done_steps(run: &Value) -> usize {
    run["steps"]
        .as_array()
        .map_or(0, |s| s.iter().filter(|s| s["status"] == "done").count())
}

fn cordoned(ground: &Ground, node: &str) -> bool {
    ground.api.node(node)["spec"]["unschedulable"] == json!(true)
}

#[tokio::test]
async fn a_blocking_alert_during_a_soak_holds_the_next_drain_until_it_resolves() {
    let ground = Ground::start("1.34.2", 4).await;
    let rg = start(&ground, &[("ROLLGATE__CLUSTER__SOAK", "3s".into())]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    // The second worker in order (w3) soaks: an incident starts.
    eventually("w3 to soak", RUN_DEADLINE, || async {
        let run = rg.run(&id).await;
        let soak = find_step(&run, "workers/soak@w3")?;
        (soak["status"] == "waiting").then_some(())
    })
    .await;
    let (status, body) = rg.post("/v1/alerts", &webhook("incident1")).await;
    assert_eq!(status, 202, "{body}");
    let run = eventually(
        "the gate before w2 to hold the run",
        RUN_DEADLINE,
        || async {
            let run = rg.run(&id).await;
            let gate = step(&run, "workers/gate@w2");
            (run["status"] == "waiting" && gate["status"] == "waiting").then_some(run)
        },
    )
    .await;
    assert!(
        run["blockers"].to_string().contains("NodeNotReady"),
        "{run}"
    );
    // `kubectl describe node w2` says what holds it, once however often the gate asks.
    let held = eventually("w2's hold told", Duration::from_secs(10), || async {
        let events = ground.api.events_about("Node", "w2");
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(reasons(&held), ["HeldByGate"]);
    assert_eq!(held[0]["type"], "Warning");
    assert!(
        held[0]["note"].as_str().unwrap().contains("NodeNotReady"),
        "{held:?}"
    );
    // Held: w2 is neither cordoned nor drained while the alert fires.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!cordoned(&ground, "w2"));
    assert!(!ground.cordon_order().contains(&"w2".to_owned()));
    assert_eq!(
        step(&rg.run(&id).await, "workers/drain@w2")["status"],
        "pending"
    );

    let mut resolved = webhook("incident1");
    resolved["status"] = json!("resolved");
    resolved["alerts"][0]["status"] = json!("resolved");
    resolved["alerts"][0]["endsAt"] = json!(chrono::Utc::now().to_rfc3339());
    let (status, body) = rg.post("/v1/alerts", &resolved).await;
    assert_eq!(status, 202, "{body}");
    let run = wait_status(&rg, &id, "succeeded").await;
    assert_eq!(ground.cordon_order(), ["cp", "w4", "w3", "w2", "w1"]);
    assert_eq!(
        reasons(&ground.api.events_about("Node", "w2"))[..2],
        ["HeldByGate", "Cordoned"]
    );
    assert!(
        support::history_has(&run, "gate closed at step workers/gate@w2"),
        "{run}"
    );
}

#[tokio::test]
async fn an_alert_that_arrives_while_steps_run_is_on_the_board_before_the_next_gate() {
    let ground = Ground::start("1.34.2", 1).await;
    ground.node("cp").slow_kubeadm(2);
    let rg = start(&ground, &[]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    eventually(
        "the control plane's node script to run",
        RUN_DEADLINE,
        || async {
            let run = rg.run(&id).await;
            (find_step(&run, "control-plane/apply@cp")?["status"] == "running").then_some(())
        },
    )
    .await;
    // Known only to Alertmanager's webhook (Prometheus never sees it): the worker is busy
    // with the control plane, so the alert waits in the queue — and the next gate with it.
    let (status, body) = rg.post("/v1/alerts", &webhook("cpwindow")).await;
    assert_eq!(status, 202, "{body}");
    let run = eventually("the gate before w1 to hold", RUN_DEADLINE, || async {
        let run = rg.run(&id).await;
        let gate = find_step(&run, "workers/gate@w1")?;
        (run["status"] == "waiting" && gate["status"] == "waiting").then_some(run)
    })
    .await;
    assert!(
        run["blockers"].to_string().contains("node=cpwindow"),
        "{run}"
    );
    assert_eq!(step(&run, "control-plane/uncordon@cp")["status"], "done");
    assert!(!cordoned(&ground, "w1"));
    assert_eq!(ground.cordon_order(), ["cp"]);
}

#[tokio::test]
async fn a_budget_that_never_lets_a_pod_go_holds_the_node_uncordoned_then_halts_and_resume_finishes()
 {
    let ground = Ground::start("1.34.2", 4).await;
    // Both replicas on w4 and a budget that wants both: no eviction will ever be allowed.
    ground.api.add_pods("w4", "db", 2, false);
    ground.api.set_pdb("db-pdb", "db", 2);
    let mut rg = start(
        &ground,
        &[
            ("ROLLGATE__CLUSTER__DRAIN_TIMEOUT", "3s".into()),
            ("ROLLGATE__GATE__HALT_AFTER", "3s".into()),
        ],
    )
    .await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "halted").await;
    let drain = step(&run, "workers/drain@w4");
    assert_eq!(drain["status"], "waiting", "{run}");
    let reason = run["reason"].as_str().unwrap();
    assert!(reason.starts_with("gate closed for "), "{reason}");
    assert!(
        reason.contains("w4: PodDisruptionBudget default/db-pdb allows no eviction of db-"),
        "{reason}"
    );
    assert!(!cordoned(&ground, "w4"), "held before the cordon");
    assert!(!ground.cordon_order().contains(&"w4".to_owned()));
    assert!(
        !ground
            .node("w4")
            .calls()
            .iter()
            .any(|c| c.starts_with("kubeadm"))
    );
    // Told after the commit that the API already shows.
    eventually(
        "the halt told in Slack",
        Duration::from_secs(15),
        || async {
            ground
                .slack_texts()
                .iter()
                .any(|t| t.contains("db-pdb allows no eviction"))
                .then_some(())
        },
    )
    .await;
    // The halted run still holds the cluster: no second upgrade meanwhile.
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.3", "kind": "patch"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&format!("run {id} (target 1.34.5) is halted")),
        "{body}"
    );
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.5", "kind": "patch"}),
        )
        .await;
    assert_eq!((status, body["run_id"].as_str()), (200, Some(id.as_str())));

    // A restart while halted: the upgrade is still in flight, its snapshot taken.
    rg.kill9();
    rg.restart().await;
    // The worker restores the gauges from the store once it leads, after the API answers.
    eventually(
        "the upgrade gauges restored",
        Duration::from_secs(15),
        || async {
            let restored = rg.metric("k8s_upgrade_in_flight").await == 1.0
                && rg.metric("k8s_upgrade_snapshot_taken").await == 1.0;
            restored.then_some(())
        },
    )
    .await;
    assert_eq!(rg.run(&id).await["status"], "halted");

    ground.api.set_pdb("db-pdb", "db", 1);
    let (status, body) = rg
        .post(
            &format!("/v1/runs/{id}/resume"),
            &json!({"reason": "PDB relaxed"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    eventually("the resume to apply", RUN_DEADLINE, || async {
        (rg.run(&id).await["status"] != "halted").then_some(())
    })
    .await;
    let run = wait_status(&rg, &id, "succeeded").await;
    assert_upgraded(&ground, &rg, &run, "1.34.5", Told::Everything).await;
    assert!(
        run["history"]
            .to_string()
            .contains("resume by admin: PDB relaxed")
    );
}

#[tokio::test]
async fn kill_9_at_random_moments_of_a_run_loses_nothing_and_drains_nothing_twice() {
    let ground = Ground::start("1.34.2", 4).await;
    ground.api.add_pods("w4", "web", 2, false);
    ground.api.add_pods("w1", "web", 2, false);
    let mut rg = start(&ground, &[("ROLLGATE__CLUSTER__SOAK", "3s".into())]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = eventually("the plan", RUN_DEADLINE, || async {
        let run = rg.run(&id).await;
        (run["steps"].as_array().map_or(0, Vec::len) > 10).then_some(run)
    })
    .await;
    // Twelve moments, each "after step k is done, plus a random pause into the next
    // steps", k drawn at random without repeats from the whole plan.
    let steps = run["steps"].as_array().unwrap().len();
    let mut next = support::xorshift();
    let mut moments = std::collections::BTreeSet::new();
    // Up to the last worker's soak: every moment comes before the run can finish.
    while moments.len() < 12 {
        moments.insert(4 + (next() as usize) % (steps - 12));
    }
    let mut kills = 0;
    for moment in moments {
        eventually("the run to reach the next moment", RUN_DEADLINE, || async {
            let run = rg.run(&id).await;
            assert_ne!(run["status"], "succeeded", "finished before every kill");
            (done_steps(&run) >= moment).then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(next() % 400)).await;
        rg.kill9();
        kills += 1;
        rg.restart().await;
    }
    wait_status(&rg, &id, "succeeded").await;
    println!("{kills} kill -9s during the run");
    assert!(kills >= 10, "only {kills} kills before the run finished");
    let run = rg.run(&id).await;
    assert_upgraded(&ground, &rg, &run, "1.34.5", Told::TheEnd).await;
    let restarts = support::restarts_recorded(&run);
    assert!(
        restarts >= kills * 8 / 10,
        "{restarts} restarts recorded for {kills} kills: {run}"
    );
}

#[tokio::test]
async fn a_changed_host_key_fails_the_step_and_nothing_runs_on_that_node() {
    let mut ground = Ground::start("1.34.2", 2).await;
    let w2 = ground.nodes.iter_mut().find(|n| n.name == "w2").unwrap();
    w2.change_host_key();
    let rg = start(
        &ground,
        &[("ROLLGATE__CLUSTER__WORKER_ORDER", "w2,w1".into())],
    )
    .await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "halted").await;
    let check = step(&run, "preflight/ssh-reachable");
    assert_eq!(check["status"], "failed", "{run}");
    let reason = run["reason"].as_str().unwrap();
    assert!(
        reason.contains("ssh to w2: host key verification failed")
            && reason.contains("nothing was run"),
        "{reason}"
    );
    assert_eq!(check["attempts"], 1, "a changed host key is not retried");
    assert!(
        ground.node("w2").calls().is_empty(),
        "{:?}",
        ground.node("w2").calls()
    );
    assert!(
        !ground.node("cp").calls().is_empty(),
        "the nodes before w2 were checked"
    );
    assert!(
        ground.api.changes().is_empty(),
        "nothing changed in the cluster"
    );
}

#[tokio::test]
async fn bad_targets_are_refused_before_anything_reaches_a_node() {
    let ground = Ground::start("1.34.2", 1).await;
    let rg = start(&ground, &[]).await;
    let cases = [
        ("1.34.5;touch /tmp/pwned", "patch", "is not a version"),
        ("$(reboot)", "patch", "is not a version"),
        ("1.34.5 && true", "patch", "is not a version"),
        ("1.33.9", "patch", "downgrades are not supported"),
        ("1.36.0", "minor", "skips minors"),
        ("1.35.0", "patch", "use kind=minor"),
        ("1.34.2", "patch", "nothing to do"),
    ];
    for (target, kind, why) in cases {
        let (status, body) = rg
            .post(
                "/v1/detections",
                &json!({"target_version": target, "kind": kind}),
            )
            .await;
        assert_eq!(status, 422, "{target}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains(why),
            "{target}: {body}"
        );
    }
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs, json!([]));
    assert_eq!(rg.metric("rollgate_queue_depth").await, 0.0);
    for node in &ground.nodes {
        assert!(node.calls().is_empty(), "{}: {:?}", node.name, node.calls());
    }
}

#[tokio::test]
async fn a_dry_run_checks_everything_and_changes_nothing() {
    let ground = Ground::start("1.34.2", 2).await;
    let rg = start(&ground, &[]).await;
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.5", "kind": "patch", "dry_run": true}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["run_id"].as_str().unwrap();
    let run = wait_status(&rg, id, "succeeded").await;
    let names: Vec<&str> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "gate",
            "quiet-period",
            "plan",
            "nodes-ready",
            "ssh-reachable",
            "etcd-healthy",
            "kubeadm-plan"
        ]
    );
    assert!(ground.api.changes().is_empty());
    assert!(
        ground
            .node("cp")
            .calls()
            .contains(&"kubeadm upgrade plan".to_owned())
    );
    ground.assert_nothing_installed();
    assert!(!ground.snapshot_dir().exists(), "no snapshot on a dry run");
}

#[tokio::test]
async fn rollgate_plan_prints_the_steps_and_gates_and_changes_nothing() {
    let ground = Ground::start("1.34.2", 2).await;
    let plan = |args: &[&str]| ground.rollgate_plan(args);
    let (code, text, err) = plan(&["--target", "1.34.5"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        text.starts_with("patch upgrade 1.34.2 -> 1.34.5\n"),
        "{text}"
    );
    assert!(text.contains("workers in order: w2, w1"), "{text}");
    assert!(
        text.contains("preflight/gate, workers/gate@w2, workers/gate@w1, postflight/gate"),
        "{text}"
    );
    assert!(text.contains("control-plane/next"), "{text}");
    assert!(text.contains("etcd: external"), "{text}");
    assert!(
        text.contains("  1. upgrade cp (kubeadm upgrade apply): by name; etcd is external"),
        "{text}"
    );
    assert!(text.contains("snapshot/etcd-snapshot"), "{text}");

    let (code, text, _) = plan(&["--target", "1.35.0", "--dry-run"]);
    assert_eq!(code, Some(0));
    assert!(
        text.starts_with("minor upgrade 1.34.2 -> 1.35.0 (dry run)"),
        "{text}"
    );
    assert!(!text.contains("drain"), "{text}");

    let (code, _, err) = plan(&["--target", "1.33.0"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("downgrades are not supported"), "{err}");
    let (code, _, err) = plan(&["--target", "1.34.5;reboot"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("is not a version"), "{err}");

    assert!(ground.api.changes().is_empty());
    for node in &ground.nodes {
        assert!(node.calls().is_empty());
    }
}

#[tokio::test]
async fn a_run_that_fails_or_is_aborted_at_any_stage_leaves_nothing_in_flight() {
    let ground = Ground::start("1.34.2", 2).await;
    ground.node("cp").slow_kubeadm(2);
    // A budget that may recover (its other pod, on a node not in this upgrade, is not
    // Ready yet), so w1's drain goes ahead and times out waiting for it.
    ground.api.add_pods("w1", "db", 1, false);
    ground.api.add_pods("elsewhere", "db", 1, false);
    let elsewhere = ground.pod_named("elsewhere", "db");
    ground.api.set_pod_ready(&elsewhere, false);
    ground.api.set_pdb("db-pdb", "db", 1);
    let mut rg = start(
        &ground,
        &[
            ("ROLLGATE__CLUSTER__SOAK", "30s".into()),
            ("ROLLGATE__CLUSTER__DRAIN_TIMEOUT", "2s".into()),
            ("ROLLGATE__WORKER__ON_FAILURE", "fail".into()),
        ],
    )
    .await;
    // Aborted in each stage, at a step that holds long enough to be caught: pre-flight
    // (the slow kubeadm plan), the control plane (its slow kubeadm apply), the workers (a
    // soak). What the aborted runs did stays done; the next run goes on from there.
    for (stage, name) in [
        ("preflight", "kubeadm-plan"),
        ("control-plane", "apply"),
        ("workers", "soak"),
    ] {
        let id = detect(&rg, "1.34.3", "patch").await;
        eventually(&format!("{stage}/{name} in hand"), RUN_DEADLINE, || async {
            let run = rg.run(&id).await;
            let current = run["current_step"].as_u64()? as usize;
            let step = &run["steps"][current];
            (step["stage"] == stage && step["name"] == name).then_some(())
        })
        .await;
        assert_eq!(rg.metric("k8s_upgrade_in_flight").await, 1.0, "{stage}");
        let (status, body) = rg
            .post(
                &format!("/v1/runs/{id}/abort"),
                &json!({"reason": format!("test: {stage}")}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        wait_status(&rg, &id, "aborted").await;
        assert_gauges_at_rest(&rg).await;
    }
    // Failed: the PDB holds w1's drain past the timeout, and the policy is to fail.
    let id = detect(&rg, "1.34.3", "patch").await;
    let run = wait_status(&rg, &id, "failed").await;
    assert!(
        run["reason"].to_string().contains("drain of w1 timed out"),
        "{}",
        run["reason"]
    );
    assert_gauges_at_rest(&rg).await;
    // And after a restart, nothing comes back in flight.
    rg.kill9();
    rg.restart().await;
    assert_gauges_at_rest(&rg).await;
}

/// rollgate's silences for `node`, as Alertmanager lists them: (state, matchers).
async fn self_silences(am: &Alertmanager, node: &str) -> Vec<(String, Value)> {
    am.silences()
        .await
        .into_iter()
        .filter(|s| {
            s["createdBy"] == "rollgate"
                && s["comment"]
                    .as_str()
                    .is_some_and(|c| c.ends_with(&format!("node {node} in hand")))
        })
        .map(|s| {
            (
                s["status"]["state"].as_str().unwrap_or("").to_owned(),
                s["matchers"].clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn self_silences_cover_the_node_in_hand_and_lapse_after_it_or_after_a_kill_9() {
    let ground = Ground::start("1.34.2", 2).await;
    // w2 (first in order) takes a while to drain: its database replica may not leave
    // until the other replica (on w1) is Ready, which the test decides.
    ground.api.add_pods("w2", "db", 1, false);
    ground.api.add_pods("w1", "db", 1, false);
    let recovering = ground.pod_named("w1", "db");
    ground.api.set_pod_ready(&recovering, false);
    ground.api.set_pdb("db-pdb", "db", 1);
    let am_port = ground.prom.alertmanager_port;
    let am = Alertmanager::with_config(
        "route:\n  receiver: nobody\nreceivers:\n  - name: nobody\n",
        am_port,
    )
    .await;
    am.wait_lists("Watchdog").await;
    let mut rg = start(
        &ground,
        &[
            (
                "ROLLGATE__GATE__ALERTMANAGER_URL",
                format!("http://127.0.0.1:{am_port}"),
            ),
            (
                "ROLLGATE__GATE__SELF_SILENCES",
                "alertname=KubeNodeUnschedulable,node={node}".into(),
            ),
            ("ROLLGATE__GATE__SELF_SILENCE_TTL", "3s".into()),
            ("ROLLGATE__GATE__SELF_SILENCE_TAIL", "1s".into()),
        ],
    )
    .await;
    let id = detect(&rg, "1.34.5", "patch").await;
    // Until the replica on w1 is Ready, w2's drain cannot finish: it is mid-drain.
    rg.wait_run_until(&id, "w2's drain running", RUN_DEADLINE, |run| {
        find_step(run, "workers/drain@w2").is_some_and(|s| s["status"] == "running")
    })
    .await;
    // rollgate asks the budget again and again (the API server's count of reads).
    eventually("w2's eviction held by its budget", RUN_DEADLINE, || async {
        let reads = ground.api.calls().get("get poddisruptionbudget").copied();
        (reads.unwrap_or(0) >= 3).then_some(())
    })
    .await;

    // Alertmanager lists rollgate's silence for w2, gate alerts kept out; what it covers
    // is silenced.
    let silences = self_silences(&am, "w2").await;
    assert_eq!(silences.len(), 1, "{silences:?}");
    let (state, matchers) = &silences[0];
    assert_eq!(state, "active");
    let shown: Vec<String> = matchers
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}{}{}",
                m["name"].as_str().unwrap(),
                if m["isEqual"] == true { "=" } else { "!=" },
                m["value"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            "alertname=KubeNodeUnschedulable",
            "node=w2",
            "upgrade_gate!=true"
        ]
    );
    am.post_labelled(
        json!({"alertname": "KubeNodeUnschedulable", "node": "w2", "severity": "warning"}),
        false,
    )
    .await;
    eventually(
        "KubeNodeUnschedulable{w2} silenced",
        Duration::from_secs(10),
        || async {
            am.alerts_named("KubeNodeUnschedulable")
                .await
                .first()
                .is_some_and(|a| a["status"]["state"] == "suppressed")
                .then_some(())
        },
    )
    .await;

    // rollgate dies mid-drain: the silence lapses by its TTL, with nobody to extend it.
    rg.kill9();
    eventually("w2's silence to lapse", Duration::from_secs(10), || async {
        self_silences(&am, "w2")
            .await
            .iter()
            .all(|(state, _)| state == "expired")
            .then_some(())
    })
    .await;
    ground.api.set_pod_ready(&recovering, true);
    rg.restart().await;

    // The run carries on; w1 gets its own silence in its turn; once the run is done every
    // silence of rollgate's has lapsed.
    wait_status(&rg, &id, "succeeded").await;
    ground.assert_all_at("1.34.5");
    assert!(
        !self_silences(&am, "w1").await.is_empty(),
        "w1 had its silence"
    );
    eventually(
        "every self-silence to lapse",
        Duration::from_secs(10),
        || async {
            let mut all = self_silences(&am, "w1").await;
            all.extend(self_silences(&am, "w2").await);
            all.iter()
                .all(|(state, _)| state == "expired")
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_drain_that_times_out_gives_the_node_back_and_halts_naming_the_pods() {
    let ground = Ground::start("1.34.2", 4).await;
    // Three replicas, one of them (on w1) not Ready yet: the budget may recover, so the
    // drain goes ahead, but no eviction is allowed while it waits.
    ground.api.add_pods("w4", "db", 2, false);
    ground.api.add_pods("w1", "db", 1, false);
    let recovering = ground.pod_named("w1", "db");
    ground.api.set_pod_ready(&recovering, false);
    ground.api.set_pdb("db-pdb", "db", 2);
    let rg = start(
        &ground,
        &[("ROLLGATE__CLUSTER__DRAIN_TIMEOUT", "3s".into())],
    )
    .await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = wait_status(&rg, &id, "halted").await;
    assert_eq!(step(&run, "workers/drain@w4")["status"], "failed", "{run}");
    let reason = run["reason"].as_str().unwrap();
    for part in [
        "drain of w4 timed out after 3s",
        "default/db-",
        "PodDisruptionBudget default/db-pdb allows no disruption now (2 of 2 desired pods healthy)",
        "w4 uncordoned",
    ] {
        assert!(reason.contains(part), "{part:?} not in {reason}");
    }
    assert!(!cordoned(&ground, "w4"), "given back to the scheduler");
    assert!(
        !ground
            .node("w4")
            .calls()
            .iter()
            .any(|c| c.starts_with("kubeadm")),
        "nothing ran on w4"
    );

    // The replica recovers; resume drains w4 again and the run finishes.
    ground.api.set_pod_ready(&recovering, true);
    let (status, body) = rg
        .post(
            &format!("/v1/runs/{id}/resume"),
            &json!({"reason": "db recovered"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    eventually("the resume to apply", RUN_DEADLINE, || async {
        (rg.run(&id).await["status"] != "halted").then_some(())
    })
    .await;
    wait_status(&rg, &id, "succeeded").await;
    ground.assert_all_at("1.34.5");
}

#[tokio::test]
async fn a_blocking_pod_holds_its_nodes_drain_until_it_is_done() {
    let ground = Ground::start("1.34.2", 2).await;
    ground.api.add_job_pod("w2", "velero");
    let backup = ground.pod_named("w2", "velero");
    let rg = start(
        &ground,
        &[(
            "ROLLGATE__CLUSTER__BLOCKING_POD_SELECTORS",
            "app=velero,maintenance".into(),
        )],
    )
    .await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = rg
        .wait_run_until(&id, "w2's drain held", RUN_DEADLINE, |r| {
            r["status"] == "waiting"
                && find_step(r, "workers/drain@w2").is_some_and(|s| s["status"] == "waiting")
        })
        .await;
    assert_eq!(
        run["blockers"],
        json!([format!(
            "w2: pod default/{backup} matches the blocking selector app in (velero)"
        )])
    );
    assert!(!cordoned(&ground, "w2"), "held before the cordon");
    // The backup finishes: the drain goes ahead and the run completes.
    ground.api.set_pod_phase(&backup, "Succeeded");
    let run = wait_status(&rg, &id, "succeeded").await;
    assert!(
        support::history_has(&run, "gate closed at step workers/drain@w2"),
        "{run}"
    );
    ground.assert_all_at("1.34.5");
}

#[tokio::test]
async fn max_unavailable_2_takes_six_workers_in_three_gated_batches_never_three_at_once() {
    let ground = Ground::start("1.34.2", 6).await;
    // A backup runs on the second node of the first batch (w4, w3): the batch waits
    // before its first cordon.
    ground.api.add_job_pod("w3", "velero");
    let backup = ground.pod_named("w3", "velero");
    let rg = start(
        &ground,
        &[
            ("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "2".into()),
            (
                "ROLLGATE__CLUSTER__BLOCKING_POD_SELECTORS",
                "app=velero".into(),
            ),
        ],
    )
    .await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let run = rg
        .wait_run_until(&id, "the first batch held", RUN_DEADLINE, |r| {
            r["status"] == "waiting"
                && find_step(r, "workers/drain@w4").is_some_and(|s| s["status"] == "waiting")
        })
        .await;
    assert_eq!(
        run["blockers"],
        json!([format!(
            "w3: pod default/{backup} matches the blocking selector app in (velero)"
        )])
    );
    assert!(!cordoned(&ground, "w4") && !cordoned(&ground, "w3"));
    ground.api.set_pod_phase(&backup, "Succeeded");

    let run = wait_status(&rg, &id, "succeeded").await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    let (most, peaks) = ground.most_workers_cordoned_at_once();
    assert_eq!(most, 2, "never more than max_unavailable out at once");
    let pair = |a: &str, b: &str| -> std::collections::BTreeSet<String> {
        [a.to_owned(), b.to_owned()].into()
    };
    assert_eq!(
        peaks,
        [pair("w3", "w4"), pair("w1", "w2"), pair("w5", "w6")],
        "each batch out together"
    );
    // One gate per batch, in front of it, done before its first drain started.
    let labels = support::workers_gates_and_soaks(&run);
    assert_eq!(
        labels,
        [
            "workers/gate@w4",
            "workers/soak@w3",
            "workers/gate@w2",
            "workers/soak@w1",
            "workers/gate@w5",
            "workers/soak@w6"
        ]
    );
    for (gate, drains) in [
        ("w4", ["w4", "w3"]),
        ("w2", ["w2", "w1"]),
        ("w5", ["w5", "w6"]),
    ] {
        let gated = step(&run, &format!("workers/gate@{gate}"))["ended_at"]
            .as_str()
            .unwrap()
            .to_owned();
        for node in drains {
            let drain = step(&run, &format!("workers/drain@{node}"));
            assert!(
                drain["started_at"].as_str().unwrap() >= gated.as_str(),
                "{node} drained before its batch's gate: {run}"
            );
        }
    }
    assert!(
        step(&run, "plan")["outcome"]
            .as_str()
            .unwrap()
            .contains("workers in batches of 2 in order: w4, w3, w2, w1, w5, w6"),
        "{run}"
    );
}

/// The UTC time of day `secs` after `at`, as a window bound.
fn clock(at: chrono::DateTime<chrono::Utc>, secs: i64) -> String {
    (at + chrono::Duration::seconds(secs))
        .format("%H:%M:%S")
        .to_string()
}

fn time_of(step: &Value, field: &str) -> chrono::DateTime<chrono::Utc> {
    step[field]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("no {field} in {step}"))
        .with_timezone(&chrono::Utc)
}

#[tokio::test]
async fn a_run_waits_for_its_window_and_a_closing_window_lets_the_node_in_hand_finish() {
    let ground = Ground::start("1.34.2", 2).await;
    // Worker order: w2, then w1. w2's kubeadm waits until the test lets it go, so that
    // the first window closes while w2 is in hand, whatever the machine's speed.
    ground.node("w2").hold_kubeadm();
    let t0 = chrono::Utc::now();
    let (opens, closes, reopens) = (6, 60, 70);
    let windows = format!(
        "{}-{} UTC; daily {}-{}",
        clock(t0, opens),
        clock(t0, closes),
        clock(t0, reopens),
        clock(t0, reopens + 600)
    );
    let rg = start(&ground, &[("ROLLGATE__SCHEDULE__WINDOWS", windows)]).await;
    let id = detect(&rg, "1.34.5", "patch").await;

    // Outside every window: the pre-flight gate waits, naming the next opening.
    let run = rg
        .wait_run(&id, "waiting for the window", |r| {
            r["status"] == "waiting"
                && r["reason"]
                    .as_str()
                    .is_some_and(|t| t.contains("outside the maintenance windows"))
        })
        .await;
    let opening = t0 + chrono::Duration::seconds(opens);
    let first_opening = opening.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    assert!(
        run["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("the next opens at {first_opening}")),
        "{run}"
    );
    assert_eq!(step(&run, "preflight/gate")["status"], "waiting");
    assert_eq!(rg.metric("rollgate_maintenance_window_open").await, 0.0);
    assert_eq!(
        rg.metric("rollgate_maintenance_window_opening_timestamp_seconds")
            .await,
        opening.timestamp() as f64
    );
    assert!(ground.cordon_order().is_empty());

    // It starts at the opening and reaches w2 inside the first window.
    let run = rg
        .wait_run_until(
            &id,
            "w2 in hand",
            Duration::from_secs(closes as u64 - 2),
            |r| find_step(r, "workers/upgrade@w2").is_some_and(|s| s["status"] == "running"),
        )
        .await;
    assert!(
        time_of(step(&run, "preflight/gate"), "ended_at") >= opening - chrono::Duration::seconds(1)
    );
    assert_eq!(rg.metric("rollgate_maintenance_window_open").await, 1.0);

    // The window closes while w2 is in hand: w2 finishes, w1 waits for the next one.
    eventually("the first window to close", RUN_DEADLINE, || async {
        (rg.metric("rollgate_maintenance_window_open").await == 0.0).then_some(())
    })
    .await;
    ground.node("w2").release_kubeadm();
    let run = rg
        .wait_run_until(&id, "w1 waiting for the window", RUN_DEADLINE, |r| {
            r["status"] == "waiting"
                && find_step(r, "workers/gate@w1").is_some_and(|s| s["status"] == "waiting")
        })
        .await;
    for done in [
        "workers/upgrade@w2",
        "workers/verify@w2",
        "workers/uncordon@w2",
        "workers/soak@w2",
    ] {
        assert_eq!(step(&run, done)["status"], "done", "{done}: {run}");
    }
    assert!(
        run["reason"]
            .as_str()
            .unwrap()
            .contains("outside the maintenance windows"),
        "{run}"
    );
    assert!(
        run["blockers"].as_array().is_none_or(|b| b.is_empty()),
        "a window is not a blocker: {run}"
    );
    assert!(!cordoned(&ground, "w1"));

    // The second window opens: the run finishes.
    let run = wait_status(&rg, &id, "succeeded").await;
    let reopening = t0 + chrono::Duration::seconds(reopens);
    assert!(
        time_of(step(&run, "workers/gate@w1"), "ended_at")
            >= reopening - chrono::Duration::seconds(1)
    );
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
}

#[tokio::test]
async fn the_event_stream_loses_no_transition_across_a_restart_and_runs_watch_follows_to_the_end() {
    let ground = Ground::start("1.34.2", 2).await;
    let mut rg = start(&ground, &[]).await;
    let id = detect(&rg, "1.34.5", "patch").await;
    let follower = tokio::spawn(support::follow_run_events(
        rg.base(),
        rg.token.clone(),
        id.clone(),
        "succeeded",
    ));
    let watch = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["runs", "watch", &id])
        .env("ROLLGATE__SERVER__LISTEN", format!("127.0.0.1:{}", rg.port))
        .env("ROLLGATE__DATA_DIR", rg.data_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("rollgate runs watch");
    // Mid-run, rollgate dies and comes back: both clients reconnect where they were.
    rg.wait_run_until(&id, "the first worker drained", RUN_DEADLINE, |r| {
        find_step(r, "workers/drain@w2").is_some_and(|s| s["status"] == "done")
    })
    .await;
    rg.kill9();
    rg.restart().await;
    let run = wait_status(&rg, &id, "succeeded").await;
    let seen = tokio::time::timeout(Duration::from_secs(60), follower)
        .await
        .expect("the stream ends with the run")
        .expect("the follower");
    // Exactly the run's history, in order, each once.
    let key = |t: &Value| {
        (
            t["at"].as_str().map(str::to_owned),
            t["to"].clone(),
            t["step"].clone(),
            t["reason"].clone(),
        )
    };
    let history: Vec<_> = run["history"].as_array().unwrap().iter().map(key).collect();
    let streamed: Vec<_> = seen.iter().map(key).collect();
    assert_eq!(streamed, history);
    let seqs: Vec<i64> = seen.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");

    let out = watch.wait_with_output().expect("watch ends");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("succeeded") && text.contains("stage workers: +w2 >w1"),
        "{text}"
    );
}

/// Issue 40: a worker whose OS the node script does not serve (Flatcar) fails
/// the `ssh-reachable` pre-flight at once, in one line naming it and its OS; no node is
/// touched.
#[tokio::test]
async fn a_node_whose_os_the_script_does_not_serve_fails_the_preflight_naming_its_os() {
    let ground = Ground::start("1.34.2", 3).await;
    ground.node("w3").runs_os(support::nodes::FLATCAR);
    let rg = ground.rollgate(&[]).await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_status(&id, "halted", Duration::from_secs(120))
        .await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(
            "w3 runs Flatcar Container Linux by Kinvolk 4081.2.0 (no apt, dnf or zypper): the kubeadm node script supports apt (Debian, Ubuntu), dnf (RHEL, Rocky, Alma, Fedora) and zypper (SUSE, openSUSE) nodes"
        ),
        "{reason}"
    );
    let check = support::find_step(&run, "preflight/ssh-reachable").expect("the check");
    assert_eq!(check["attempts"], 1, "no retry makes it served: {check}");
    ground.assert_nothing_drained();
    ground.assert_nothing_installed();
}
