//! etcd rolls run by `rollgate serve` (`POST /v1/etcd-rolls`, AMQP `etcd-rolls`) over a
//! StatefulSet in the fake API server whose controller restarts real etcd members; the
//! gate before every restart asks a real Prometheus.

mod support;

use chrono::Utc;
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;
use support::etcd_pods::EtcdStatefulSet;
use support::rabbit::{self, Names};
use support::services::{MiniServer, Prometheus};
use support::witness::RaftWitness;
use support::{Rollgate, eventually};

const RUN_DEADLINE: Duration = Duration::from_secs(120);

/// A quiet Prometheus (no gate alert fires) and the files `serve` needs with a cluster.
struct Around {
    _target: MiniServer,
    prom: Prometheus,
    dir: tempfile::TempDir,
}

impl Around {
    async fn start() -> Self {
        let target = MiniServer::start().await;
        target.set_metrics(&support::ground::quiet_metrics());
        let prom = Prometheus::start(&target.address()).await;
        let dir = tempfile::tempdir().unwrap();
        Self {
            _target: target,
            prom,
            dir,
        }
    }

    fn env(&self, sts: &EtcdStatefulSet) -> Vec<(String, String)> {
        [
            (
                "ROLLGATE__CLUSTER__KUBECONFIG",
                sts.kubeconfig.display().to_string(),
            ),
            // No SSH and no etcd.endpoints: etcd rolls need neither.
            ("ROLLGATE__GATE__PROMETHEUS_URL", self.prom.url()),
            ("ROLLGATE__GATE__POLL_INTERVAL", "300ms".into()),
            ("ROLLGATE__ETCD_ROLL__TIMEOUT", "2s".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

async fn serve(env: Vec<(String, String)>) -> Rollgate {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Rollgate::start(&env).await
}

fn request(sts: &EtcdStatefulSet) -> Value {
    json!({
        "statefulset": "etcd", "namespace": "default",
        "endpoints": sts.cluster.endpoints, "ready_timeout_secs": 20, "cooldown_secs": 0
    })
}

async fn wait_status(rg: &Rollgate, id: &str, want: &str) -> Value {
    rg.wait_status(id, want, RUN_DEADLINE).await
}

fn labels(run: &Value) -> Vec<String> {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let mut l = s["name"].as_str().unwrap().to_owned();
            if let Some(n) = s["node"].as_str() {
                l = format!("{l}@{n}");
            }
            l
        })
        .collect()
}

fn finish_note(run: &Value) -> String {
    let last = run["steps"].as_array().unwrap().last().unwrap();
    assert_eq!(last["name"], "etcd-finish", "{run}");
    last["outcome"].as_str().unwrap().to_owned()
}

async fn term(sts: &EtcdStatefulSet) -> u64 {
    let etcd = sts.cluster.etcd();
    eventually("a leader", Duration::from_secs(10), || async {
        etcd.leader().await.ok()
    })
    .await
    .raft_term
}

/// Checks a finished roll: `moves` leadership changes as the witness saw them in etcd,
/// pods high to low, each once, every restart after a gate, the lock restored, and the
/// same counts in the run and in the metrics.
async fn check_rolled(
    rg: &Rollgate,
    sts: &EtcdStatefulSet,
    run: &Value,
    moves: u64,
    witness: RaftWitness,
) {
    // Read from etcd itself, sampled all along the roll: `moves` terms and new leaders.
    let seen = witness.stop().await;
    assert_eq!(seen.term_rise(), moves, "{seen:?}");
    assert_eq!(seen.leader_changes() as u64, moves, "{seen:?}");
    assert_eq!(sts.restarted(), ["etcd-2", "etcd-1", "etcd-0"]);
    assert!(sts.all_at_update_revision());
    assert_eq!(sts.partition(), 3, "the partition lock is restored");
    let labels = labels(run);
    for (i, l) in labels.iter().enumerate() {
        if l.starts_with("etcd-restart@") {
            let member = l.trim_start_matches("etcd-restart@");
            assert_eq!(labels[i - 1], format!("gate@{member}"), "{labels:?}");
        }
    }
    let note = finish_note(run);
    eprintln!("{note}\n{labels:?}");
    assert!(note.contains(&format!("transfers {moves};")), "{note}");
    assert!(
        note.contains(&format!("leadership changes {moves};")),
        "{note}"
    );
    assert!(note.contains("uncontrolled 0;"), "{note}");
    let target = "{target=\"default/etcd\"}";
    for (metric, want) in [
        ("etcd_roll_completed_total", 1.0),
        ("etcd_roll_member_restarts_total", 3.0),
        ("etcd_roll_leadership_transfers_total", moves as f64),
        ("etcd_roll_leadership_changes_total", moves as f64),
        ("etcd_roll_uncontrolled_leadership_changes_total", 0.0),
    ] {
        assert_eq!(
            rg.metric(&format!("{metric}{target}")).await,
            want,
            "{metric}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_asked_over_http_survives_kill_9_and_costs_one_leadership_move() {
    let sts = EtcdStatefulSet::start(3, 0).await;
    let around = Around::start().await;
    let mut rg = serve(around.env(&sts)).await;
    let term_before = term(&sts).await;
    let witness = RaftWitness::start(sts.cluster.etcd()).await;

    // An endpoint that reaches etcd-0 by another name than it advertises: that member
    // could never be seen at the target, so the request is refused before anything runs.
    let mut mismatched = request(&sts);
    let first = mismatched["endpoints"][0]
        .as_str()
        .unwrap()
        .replace("127.0.0.1", "localhost");
    mismatched["endpoints"][0] = first.clone().into();
    let (status, body) = rg.post("/v1/etcd-rolls", &mismatched).await;
    assert_eq!(status, 422, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    for part in [
        "do not match the members' advertised client URLs",
        first.as_str(),
        sts.cluster.endpoints[0].as_str(),
        "advertised by no member",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(
        runs.as_array().map(Vec::len),
        Some(0),
        "nothing queued: {runs}"
    );
    assert!(sts.restarted().is_empty());

    let (status, body) = rg.post("/v1/etcd-rolls", &request(&sts)).await;
    assert_eq!(status, 202, "{body}");
    let id = body["run_id"].as_str().unwrap().to_owned();
    let (status, again) = rg.post("/v1/etcd-rolls", &request(&sts)).await;
    assert_eq!(
        (status, &again["run_id"]),
        (200, &body["run_id"]),
        "one roll per StatefulSet"
    );

    // Kill -9 while the second member comes back.
    eventually("etcd-1 restarting", RUN_DEADLINE, || async {
        let run = rg.run(&id).await;
        assert_ne!(run["status"], "halted", "{run}");
        run["steps"]
            .as_array()?
            .iter()
            .any(|s| s["name"] == "etcd-restart" && s["node"] == "etcd-1" && s["status"] == "done")
            .then_some(())
    })
    .await;
    rg.kill9();
    rg.restart().await;

    let run = wait_status(&rg, &id, "succeeded").await;
    check_rolled(&rg, &sts, &run, 1, witness).await;
    assert!(
        support::history_has(&run, "rollgate restarted"),
        "the restart is in the history"
    );
    assert_eq!(
        term(&sts).await,
        term_before + 1,
        "one change, kill included"
    );
    assert_eq!(sts.cluster.marked().len(), 3, "each member restarted once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_published_on_amqp_with_the_leader_at_the_top_moves_it_twice() {
    let sts = EtcdStatefulSet::start(3, 2).await;
    let around = Around::start().await;
    let names = Names::unique();
    let mut env = around.env(&sts);
    env.extend(names.env().into_iter().map(|(k, v)| (k.to_owned(), v)));
    let rg = serve(env).await;
    let witness = RaftWitness::start(sts.cluster.etcd()).await;

    let event = serde_json::to_vec(&json!({
        "specversion": "1.0", "id": "roll-1", "source": "test/publisher",
        "type": "rollgate.etcd-roll.v1", "time": Utc::now().to_rfc3339(), "data": request(&sts)
    }))
    .unwrap();
    rabbit::publish(&names.exchange, "etcd-rolls", &event, "roll-1").await;
    let run = eventually("the published roll makes a run", RUN_DEADLINE, || async {
        let (_, runs) = rg.get("/v1/runs").await;
        runs.as_array()?
            .iter()
            .find(|r| r["kind"] == "etcd-roll")
            .cloned()
    })
    .await;
    assert_eq!(run["target"], "default/etcd");
    let run = wait_status(&rg, run["id"].as_str().unwrap(), "succeeded").await;
    check_rolled(&rg, &sts, &run, 2, witness).await;
    rabbit::cleanup(&names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_member_halts_the_roll_before_anything_restarts() {
    let sts = EtcdStatefulSet::start(3, 0).await;
    let pid = std::fs::read_to_string(sts.cluster.path("etcd-1.pid")).unwrap();
    Command::new("kill")
        .args(["-TERM", pid.trim()])
        .status()
        .unwrap();
    let around = Around::start().await;
    let rg = serve(around.env(&sts)).await;
    let (status, body) = rg.post("/v1/etcd-rolls", &request(&sts)).await;
    assert_eq!(status, 202, "{body}");
    let run = rg
        .wait_run(body["run_id"].as_str().unwrap(), "halted", |r| {
            r["status"] == "halted"
        })
        .await;
    let reason = run["reason"].as_str().unwrap();
    assert!(reason.contains("etcd-begin"), "{reason}");
    assert!(reason.contains("unhealthy member(s): etcd-1"), "{reason}");
    assert!(reason.contains("nothing was restarted"), "{reason}");
    assert!(sts.restarted().is_empty(), "{:?}", sts.restarted());
    assert_eq!(sts.partition(), 3, "the lock holds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_gate_alert_holds_the_roll_before_any_restart() {
    let sts = EtcdStatefulSet::start(3, 0).await;
    let around = Around::start().await;
    let rg = serve(around.env(&sts)).await;
    let witness = RaftWitness::start(sts.cluster.etcd()).await;
    let (status, _) = rg.post("/v1/alerts", &support::webhook("e7c0")).await;
    assert_eq!(status, 202);
    let (status, body) = rg.post("/v1/etcd-rolls", &request(&sts)).await;
    assert_eq!(status, 202, "{body}");
    let id = body["run_id"].as_str().unwrap().to_owned();
    let run = rg
        .wait_run(&id, "the roll held at its first gate", |r| {
            r["status"] == "waiting" && !r["blockers"].as_array().unwrap().is_empty()
        })
        .await;
    let held = run["steps"][run["current_step"].as_u64().unwrap() as usize].clone();
    assert_eq!(
        (&held["name"], &held["node"]),
        (&json!("gate"), &json!("etcd-2"))
    );
    assert!(
        sts.restarted().is_empty(),
        "nothing restarts behind a closed gate"
    );
    assert_eq!(sts.partition(), 3);

    let (status, _) = rg.post("/v1/alerts", &support::resolved("e7c0")).await;
    assert_eq!(status, 202);
    let run = wait_status(&rg, &id, "succeeded").await;
    check_rolled(&rg, &sts, &run, 1, witness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_not_back_within_ready_timeout_halts_the_roll_and_nothing_else_restarts() {
    // No controller: the lowered partition never brings etcd-2 to the update revision.
    let sts = EtcdStatefulSet::start_with(3, 0, false).await;
    let around = Around::start().await;
    let rg = serve(around.env(&sts)).await;
    let mut body = request(&sts);
    body["ready_timeout_secs"] = json!(3);
    let (status, answer) = rg.post("/v1/etcd-rolls", &body).await;
    assert_eq!(status, 202, "{answer}");
    let run = rg
        .wait_run(answer["run_id"].as_str().unwrap(), "halted", |r| {
            r["status"] == "halted"
        })
        .await;
    let reason = run["reason"].as_str().unwrap();
    assert!(reason.contains("etcd-ready@etcd-2"), "{reason}");
    assert!(
        reason.contains("member etcd-2 is not healthy, at target and caught up within 3s"),
        "{reason}"
    );
    assert_eq!(sts.partition(), 2, "only etcd-2's ordinal was released");
    assert!(
        labels(&run)
            .iter()
            .all(|l| !l.contains("etcd-1") && !l.contains("etcd-0")),
        "{:?}",
        labels(&run)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_roll_requests_are_refused_and_nothing_is_queued() {
    // No Kubernetes API: nothing could carry a roll out.
    let rg = Rollgate::start(&[]).await;
    let good = json!({"statefulset": "etcd", "namespace": "default", "endpoints": ["http://127.0.0.1:2379"]});
    let (status, body) = rg.post("/v1/etcd-rolls", &good).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cluster.kubeconfig"),
        "{body}"
    );
    drop(rg);

    let api = support::kube::FakeKube::start().await;
    let around = Around::start().await;
    let kubeconfig = around.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig);
    let env = vec![(
        "ROLLGATE__CLUSTER__KUBECONFIG".to_owned(),
        kubeconfig.display().to_string(),
    )];
    let rg = serve(env).await;
    // Upgrades need what etcd rolls do not: a detection is refused naming the keys.
    let (status, body) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.5", "kind": "patch"}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ssh.key_file, ssh.known_hosts_file, etcd.endpoints"),
        "{body}"
    );
    let with = |key: &str, value: Value| {
        let mut body = good.clone();
        body[key] = value;
        body
    };
    let cases = [
        (with("statefulset", json!("etcd;reboot")), "statefulset"),
        (
            with("endpoints", json!(["http://$(id):2379"])),
            "endpoints[0]",
        ),
        (with("endpoints", json!([])), "endpoints"),
        (with("ready_timeout_secs", json!(0)), "ready_timeout_secs"),
        (
            with("restart_command", json!("reboot")),
            "not a known field",
        ),
        (
            with("endpoints", json!(["https://127.0.0.1:2379"])),
            "etcd_roll.ca_file",
        ),
    ];
    for (body, expected) in cases {
        let (status, answer) = rg.post("/v1/etcd-rolls", &body).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert_eq!(answer["error"], "invalid_request", "{answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(expected),
            "{body}: {answer}"
        );
    }
    assert_eq!(rg.metric("rollgate_queue_depth").await, 0.0);
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs, json!([]), "no run was created");
    assert!(api.changes().is_empty(), "nothing changed in the cluster");
}

/// `serve` watching StatefulSet `default/etcd`, reached at one member (a roll's endpoints
/// are what the members advertise).
async fn watching(around: &Around, sts: &EtcdStatefulSet) -> Rollgate {
    let mut env = around.env(sts);
    let seed = sts.cluster.endpoints[0].clone();
    env.push((
        "ROLLGATE__ETCD_ROLL__WATCH".into(),
        format!("default/etcd={seed}"),
    ));
    serve(env).await
}

/// The runs `serve` holds, newest first.
async fn runs(rg: &Rollgate) -> Vec<Value> {
    let (_, runs) = rg.get("/v1/runs").await;
    runs.as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_statefulset_gets_one_roll_per_new_revision_and_none_while_one_is_in_flight() {
    let sts = EtcdStatefulSet::start(3, 0).await;
    let around = Around::start().await;
    let mut rg = watching(&around, &sts).await;

    // The template is at rev-2, the pods at rev-1: a roll starts by itself.
    let first = "watch-default-etcd-rev-2";
    eventually(
        "the watch to start the rev-2 roll",
        RUN_DEADLINE,
        || async {
            let run = rg.get(&format!("/v1/runs/{first}")).await;
            (run.0 == 200).then_some(())
        },
    )
    .await;
    let run = rg.run(first).await;
    let mut want = sts.cluster.endpoints.clone();
    want.sort();
    let mut got: Vec<String> = serde_json::from_value(run["request"]["endpoints"].clone()).unwrap();
    got.sort();
    assert_eq!(got, want, "the members' advertised client URLs");
    // Restarted mid-roll: the same run goes on, no second one.
    eventually("etcd-2 restarted", RUN_DEADLINE, || async {
        let run = rg.run(first).await;
        run["steps"]
            .as_array()?
            .iter()
            .any(|s| s["name"] == "etcd-restart" && s["node"] == "etcd-2" && s["status"] == "done")
            .then_some(())
    })
    .await;
    rg.kill9();
    rg.restart().await;
    wait_status(&rg, first, "succeeded").await;
    assert!(sts.all_at_update_revision());
    assert_eq!(runs(&rg).await.len(), 1, "one roll for rev-2");
    assert_eq!(sts.restarted(), ["etcd-2", "etcd-1", "etcd-0"]);

    // A new revision while an incident holds every gate: its roll starts and holds
    // before any restart; a further revision meanwhile waits for it.
    let (status, _) = rg.post("/v1/alerts", &support::webhook("w1c0")).await;
    assert_eq!(status, 202);
    sts.api.change_template("etcd", "rev-3");
    let second = "watch-default-etcd-rev-3";
    rg.wait_run_until(
        second,
        "the rev-3 roll held at its gate",
        RUN_DEADLINE,
        |r| r["status"] == "waiting" && !r["blockers"].as_array().is_none_or(Vec::is_empty),
    )
    .await;
    sts.api.change_template("etcd", "rev-4");
    eventually("the watch to see rev-4 wait", RUN_DEADLINE, || async {
        rg.logs()
            .contains("new revision waits for the roll in flight")
            .then_some(())
    })
    .await;
    assert_eq!(
        runs(&rg).await.len(),
        2,
        "no roll for rev-4 while rev-3's is in flight"
    );
    assert_eq!(sts.restarted().len(), 3, "nothing restarts behind the gate");

    // The incident ends: the roll in flight takes the pods to the newest revision, which
    // leaves rev-4 nothing to do.
    let (status, _) = rg.post("/v1/alerts", &support::resolved("w1c0")).await;
    assert_eq!(status, 202);
    wait_status(&rg, second, "succeeded").await;
    assert!(sts.all_at_update_revision());
    eventually("rev-4 to be the current revision", RUN_DEADLINE, || async {
        (sts.api.statefulset("etcd")["status"]["currentRevision"] == "rev-4").then_some(())
    })
    .await;
    let all = runs(&rg).await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.iter().all(|r| r["status"] == "succeeded"), "{all:?}");
    assert_eq!(sts.partition(), 3, "the partition lock is restored");
    assert!(
        sts.api
            .access()
            .iter()
            .any(|a| a.resource == "statefulsets" && a.verb == "watch"),
        "the watch used the watch verb"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_answered_410_gone_in_the_middle_of_an_automatic_roll_misses_no_revision() {
    let sts = EtcdStatefulSet::start(3, 0).await;
    let around = Around::start().await;
    let rg = watching(&around, &sts).await;

    // In the middle of rev-2's roll, the API server ends every watch with 410 Gone.
    let first = "watch-default-etcd-rev-2";
    eventually(
        "etcd-2 restarted by the rev-2 roll",
        RUN_DEADLINE,
        || async {
            let (status, run) = rg.get(&format!("/v1/runs/{first}")).await;
            (status == 200
                && run["steps"].as_array()?.iter().any(|s| {
                    s["name"] == "etcd-restart" && s["node"] == "etcd-2" && s["status"] == "done"
                }))
            .then_some(())
        },
    )
    .await;
    // Ended while rollgate's watch is open (it may be between two, reading).
    eventually("rollgate to see a 410", RUN_DEADLINE, || async {
        if rg.logs().contains("watch expired (410 Gone)") {
            return Some(());
        }
        if sts.api.open_watches("statefulsets") > 0 {
            sts.api.expire_watches();
        }
        None
    })
    .await;
    wait_status(&rg, first, "succeeded").await;
    assert!(sts.all_at_update_revision());

    // Once more, and the template moves on right after the compaction, while rollgate's
    // watch is ended: the read after the 410 finds rev-3, and its roll starts.
    eventually("rollgate's watch open", RUN_DEADLINE, || async {
        (sts.api.open_watches("statefulsets") > 0).then_some(())
    })
    .await;
    sts.api.expire_watches();
    sts.api.change_template("etcd", "rev-3");
    let second = "watch-default-etcd-rev-3";
    eventually("the rev-3 roll to start", RUN_DEADLINE, || async {
        (rg.get(&format!("/v1/runs/{second}")).await.0 == 200).then_some(())
    })
    .await;
    wait_status(&rg, second, "succeeded").await;
    assert!(sts.all_at_update_revision());

    let all = runs(&rg).await;
    let mut ids: Vec<&str> = all.iter().filter_map(|r| r["id"].as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        [first, second],
        "exactly one roll per revision: {all:?}"
    );
    assert_eq!(
        sts.restarted(),
        ["etcd-2", "etcd-1", "etcd-0", "etcd-2", "etcd-1", "etcd-0"],
        "each member once per revision"
    );
}
