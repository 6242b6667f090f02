//! Gates against real Prometheus (loading rules/) and Alertmanager from Debian's packages.

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::cluster::IntakeCluster;
use support::services::{Alertmanager, Loads, MiniServer, Prometheus};
use support::{Rollgate, board, eventually, webhook};

/// Metrics for the scrape target: a node that booted `ago` seconds ago.
fn booted(ago: i64) -> String {
    format!(
        "node_boot_time_seconds{{node=\"w2\"}} {}\n",
        chrono::Utc::now().timestamp() - ago
    )
}

async fn verdict(rg: &Rollgate) -> Value {
    let (status, report) = rg.get("/v1/gates").await;
    assert_eq!(status, 200, "{report}");
    report
}

async fn wait_verdict(rg: &Rollgate, want: &str) -> Value {
    eventually(
        &format!("the gate to be {want}"),
        Duration::from_secs(30),
        || async {
            let report = verdict(rg).await;
            (report["verdict"]["verdict"] == want).then_some(report)
        },
    )
    .await
}

fn gate_env(prom: &Prometheus, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("ROLLGATE__GATE__PROMETHEUS_URL", prom.url()),
        ("ROLLGATE__GATE__POLL_INTERVAL", "300ms".into()),
        ("ROLLGATE__GATE__TIMEOUT", "1s".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

async fn start_rollgate(prom: &Prometheus, extra: &[(&str, &str)]) -> Rollgate {
    let env = gate_env(prom, extra);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Rollgate::start(&env).await
}

/// As [`start_rollgate`], with `cluster` to upgrade (its nodes never answer SSH: a run
/// goes no further than its pre-flight checks, which is all these tests look at).
async fn start_upgrading(
    cluster: &IntakeCluster,
    prom: &Prometheus,
    extra: &[(&str, &str)],
) -> Rollgate {
    let env = gate_env(prom, extra);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    cluster.rollgate(&env).await
}

/// The run is past its pre-flight gate and quiet period.
fn past_the_gate(run: &Value) -> bool {
    run["steps"][0]["status"] == "done" && run["steps"][1]["status"] == "done"
}

/// Waits until the stream's newest gate frame has verdict `want`; that frame.
async fn stream_says(rg: &Rollgate, want: &str) -> Value {
    eventually(
        &format!("the stream to tell the gate {want}"),
        Duration::from_secs(10),
        || async {
            let frame = last_gate_frame(rg, Duration::from_millis(300)).await;
            (frame["verdict"]["verdict"] == want).then_some(frame)
        },
    )
    .await
}

fn blocker_names(report: &Value) -> Vec<(String, String)> {
    report["verdict"]["blockers"]
        .as_array()
        .map(|b| {
            b.iter()
                .map(|b| {
                    (
                        b["name"].as_str().unwrap_or_default().to_owned(),
                        b["source"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_prometheus_gate_alert_closes_the_gate_and_clearing_it_opens_it() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let rg = start_rollgate(&prom, &[]).await;
    let report = wait_verdict(&rg, "open").await;
    assert_eq!(report["prometheus"]["state"], "ok");

    target.set_metrics(&booted(30));
    let report = wait_verdict(&rg, "closed").await;
    assert_eq!(
        blocker_names(&report),
        [("NodeRecentlyRebooted".to_owned(), "prometheus".to_owned())]
    );
    assert_eq!(
        report["verdict"]["blockers"][0]["labels"]["upgrade_gate"],
        "true"
    );
    assert_eq!(report["prometheus"]["blocking"], 1);

    target.set_metrics(&booted(86_400));
    wait_verdict(&rg, "open").await;
    assert!(
        rg.metric("rollgate_gate_evaluations_total{outcome=\"ok\",source=\"prometheus\"}")
            .await
            >= 3.0
    );
}

#[tokio::test]
async fn an_alertmanager_webhook_closes_the_gate_and_its_resolution_opens_it() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let rg = start_rollgate(&prom, &[]).await;
    let am = Alertmanager::start(
        &format!("{}/v1/alerts", rg.base()),
        &rg.data_dir().join("api-token"),
    )
    .await;
    wait_verdict(&rg, "open").await;

    am.post_alert("EtcdMemberDown", false).await;
    let report = wait_verdict(&rg, "closed").await;
    assert_eq!(
        blocker_names(&report),
        [("EtcdMemberDown".to_owned(), "alertmanager".to_owned())]
    );
    assert_eq!(
        report["prometheus"]["blocking"], 0,
        "Prometheus has not fired anything"
    );

    am.post_alert("EtcdMemberDown", true).await;
    wait_verdict(&rg, "open").await;
    assert!(
        rg.metric(
            "rollgate_http_requests_total{client=\"admin\",code=\"202\",method=\"POST\",route=\"/v1/alerts\"}"
        )
        .await
            >= 2.0
    );
}

#[tokio::test]
async fn with_prometheus_down_the_gate_is_unknown_and_a_waiting_run_does_not_move() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let mut prom = Prometheus::start(&target.address()).await;
    let cluster = IntakeCluster::start().await;
    let rg = start_upgrading(&cluster, &prom, &[]).await;
    wait_verdict(&rg, "open").await;

    prom.process.stop();
    let report = wait_verdict(&rg, "unknown").await;
    assert_eq!(report["prometheus"]["state"], "error");
    let (status, accepted) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.9", "kind": "patch"}),
        )
        .await;
    assert_eq!(status, 202);
    let id = accepted["run_id"].as_str().unwrap().to_owned();
    // Re-checked again and again while Prometheus is down, and held every time.
    let run = rg
        .wait_run(&id, "three closed gate checks", |r| {
            // Running while a check is under way; waiting once it has held the run.
            r["steps"][0]["attempts"].as_u64() >= Some(3) && r["status"] == "waiting"
        })
        .await;
    assert_eq!(run["status"], "waiting", "{run}");
    assert!(
        run["reason"].as_str().unwrap().contains("gate unknown"),
        "{run}"
    );
    assert_eq!(run["steps"][1]["status"], "pending");

    prom.process.start();
    prom.wait_ready().await;
    let run = rg
        .wait_run(&id, "the run past the gate", past_the_gate)
        .await;
    assert_eq!(run["steps"][0]["status"], "done", "{run}");
    assert_eq!(run["steps"][1]["name"], "quiet-period");
    assert_eq!(run["steps"][1]["status"], "done", "{run}");
    assert!(support::history_has(&run, "gate open again after"), "{run}");
}

#[tokio::test]
async fn a_gate_closed_past_halt_after_halts_the_run_tells_slack_and_resume_continues() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let slack = MiniServer::start().await;
    let secrets = tempfile::tempdir().unwrap();
    let slack_file = secrets.path().join("slack-url");
    std::fs::write(
        &slack_file,
        format!("http://{}/services/T000/B000/XXXX", slack.address()),
    )
    .unwrap();
    let slack_file = slack_file.display().to_string();
    let cluster = IntakeCluster::start().await;
    let rg = start_upgrading(
        &cluster,
        &prom,
        &[
            ("ROLLGATE__GATE__HALT_AFTER", "2s"),
            ("ROLLGATE__NOTIFY__SLACK_WEBHOOK_FILE", &slack_file),
        ],
    )
    .await;

    // Alertmanager's webhook has it; Prometheus has not fired anything.
    let (status, _) = rg.post("/v1/alerts", &webhook("dd01")).await;
    assert_eq!(status, 202);
    let (_, accepted) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.10", "kind": "patch"}),
        )
        .await;
    let id = accepted["run_id"].as_str().unwrap().to_owned();
    let run = rg
        .wait_run(&id, "the run halted", |r| r["status"] == "halted")
        .await;
    let reason = run["reason"].as_str().unwrap();
    assert!(reason.starts_with("gate closed for "), "{reason}");
    assert!(
        reason.contains("NodeNotReady {node=dd01} (alertmanager)"),
        "{reason}"
    );
    assert_eq!(
        run["blockers"],
        json!(["NodeNotReady {node=dd01} (alertmanager)"])
    );
    assert_eq!(
        run["steps"][1]["status"], "pending",
        "nothing past the gate ran"
    );
    let halted = eventually(
        "Slack told of the halt",
        Duration::from_secs(10),
        || async {
            slack
                .received()
                .into_iter()
                .find(|m| m["text"].as_str().is_some_and(|t| t.contains("→ halted")))
        },
    )
    .await;
    let blocks = halted["blocks"].to_string();
    assert!(
        blocks.contains(&id)
            && blocks.contains("NodeNotReady")
            && blocks.contains("preflight/gate"),
        "{halted}"
    );

    // Resume while still blocked: re-checked, held again (not run past the gate).
    let (status, _) = rg
        .post(
            &format!("/v1/runs/{id}/resume"),
            &json!({"reason": "looking"}),
        )
        .await;
    assert_eq!(status, 202);
    rg.wait_run(&id, "held again after resume", |r| r["status"] == "waiting")
        .await;
    // The alert resolves: the held run re-checks at once and goes on.
    let (status, _) = rg.post("/v1/alerts", &support::resolved("dd01")).await;
    assert_eq!(status, 202);
    let run = rg.wait_run(&id, "past the gate", past_the_gate).await;
    assert_eq!(run["steps"][0]["status"], "done");
    assert!(run["blockers"].as_array().unwrap().is_empty());
    eventually(
        "Slack told of the resume",
        Duration::from_secs(10),
        || async {
            slack.received().into_iter().find(|m| {
                m["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("resume by admin: looking"))
            })
        },
    )
    .await;
    assert!(
        rg.metric("rollgate_notifications_total{outcome=\"sent\",sink=\"slack\"}")
            .await
            >= 3.0
    );
    let secret = std::fs::read_to_string(&slack_file).unwrap();
    assert!(
        !rg.logs().contains(secret.trim()),
        "the Slack URL leaked into the log"
    );
}

#[tokio::test]
async fn a_slack_outage_does_not_touch_the_run_and_shows_in_metrics() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let secrets = tempfile::tempdir().unwrap();
    let slack_file = secrets.path().join("slack-url");
    std::fs::write(
        &slack_file,
        format!("http://127.0.0.1:{}/hook", support::free_port()),
    )
    .unwrap();
    let slack_file = slack_file.display().to_string();
    let cluster = IntakeCluster::start().await;
    let rg = start_upgrading(
        &cluster,
        &prom,
        &[
            ("ROLLGATE__NOTIFY__SLACK_WEBHOOK_FILE", &slack_file),
            ("ROLLGATE__NOTIFY__RETRIES", "1"),
        ],
    )
    .await;
    let (_, accepted) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.11", "kind": "patch"}),
        )
        .await;
    let id = accepted["run_id"].as_str().unwrap().to_owned();
    let run = rg
        .wait_run(&id, "the run past the gate", past_the_gate)
        .await;
    assert_eq!(run["steps"][0]["status"], "done");
    eventually(
        "failed notifications counted",
        Duration::from_secs(20),
        || async {
            (rg.metric("rollgate_notifications_total{outcome=\"failed\",sink=\"slack\"}")
                .await
                >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert!(
        rg.metric("rollgate_notifications_total{outcome=\"retried\",sink=\"slack\"}")
            .await
            >= 1.0
    );
}

/// How many of the requests `slack` received from the `from`th on carry `needle` in
/// their text.
fn told(slack: &MiniServer, from: usize, needle: &str) -> usize {
    slack.received()[from..]
        .iter()
        .filter(|m| m["text"].as_str().is_some_and(|t| t.contains(needle)))
        .count()
}

#[tokio::test]
async fn a_transition_committed_before_a_kill_9_reaches_slack_after_the_restart_once() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let slack = MiniServer::start().await;
    let secrets = tempfile::tempdir().unwrap();
    let slack_file = secrets.path().join("slack-url");
    std::fs::write(&slack_file, format!("http://{}/hook", slack.address())).unwrap();
    let slack_file = slack_file.display().to_string();
    let cluster = IntakeCluster::start().await;
    let mut rg = start_upgrading(
        &cluster,
        &prom,
        &[
            ("ROLLGATE__NOTIFY__SLACK_WEBHOOK_FILE", &slack_file),
            ("ROLLGATE__NOTIFY__RETRIES", "0"),
        ],
    )
    .await;
    // The run is held at its gate by an alert; Slack has been told so far.
    assert_eq!(rg.post("/v1/alerts", &webhook("ob01")).await.0, 202);
    let (_, accepted) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.12", "kind": "patch"}),
        )
        .await;
    let id = accepted["run_id"].as_str().unwrap().to_owned();
    rg.wait_run(&id, "held at its gate", |r| {
        r["status"] == "waiting"
            && r["reason"]
                .as_str()
                .is_some_and(|t| t.contains("gate closed at step preflight/gate"))
    })
    .await;
    eventually(
        "Slack told of the hold",
        Duration::from_secs(10),
        || async { (told(&slack, 0, "gate closed") >= 1).then_some(()) },
    )
    .await;

    // Slack goes down; the halt is committed but cannot be told; rollgate dies.
    slack.set_reply(503, "down");
    let refused_from = slack.received().len();
    assert_eq!(rg.control(&id, "halt", "outbox check").await, 202);
    rg.wait_run(&id, "halted", |r| r["status"] == "halted")
        .await;
    eventually(
        "the halt tried and refused",
        Duration::from_secs(10),
        || async { (told(&slack, refused_from, "outbox check") >= 1).then_some(()) },
    )
    .await;
    rg.kill9();

    // Slack is back; after the restart the halt arrives, once, and nothing told before
    // is told again.
    slack.set_reply(200, "ok");
    let back_from = slack.received().len();
    rg.restart().await;
    eventually(
        "the halt told after the restart",
        Duration::from_secs(20),
        || async { (told(&slack, back_from, "outbox check") >= 1).then_some(()) },
    )
    .await;
    // Delivery is in order: once a later transition is told, a duplicate of the halt
    // would have come before it.
    assert_eq!(rg.control(&id, "abort", "the end").await, 202);
    eventually("the abort told", Duration::from_secs(20), || async {
        (told(&slack, back_from, "abort by admin: the end") >= 1).then_some(())
    })
    .await;
    assert_eq!(told(&slack, back_from, "outbox check"), 1, "told once");
    assert_eq!(
        told(&slack, back_from, "gate closed"),
        0,
        "nothing told twice"
    );
}

/// Alertmanager on `port`, routing every alert to `rg`'s board, where `Maintenance` on a
/// node inhibits `NodeNotReady` on the same node.
async fn alertmanager_for(rg: &Rollgate, port: u16) -> Alertmanager {
    let config = format!(
        "route:\n  receiver: rollgate\n  group_by: ['...']\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\n\
         receivers:\n  - name: rollgate\n    webhook_configs:\n      - url: {}/v1/alerts\n        send_resolved: true\n        http_config:\n          authorization:\n            type: Bearer\n            credentials_file: {}\n\
         inhibit_rules:\n  - source_matchers: ['alertname=\"Maintenance\"']\n    target_matchers: ['alertname=\"NodeNotReady\"']\n    equal: [node]\n",
        rg.base(),
        rg.data_dir().join("api-token").display()
    );
    Alertmanager::with_config(&config, port).await
}

fn node_not_ready(node: &str) -> Value {
    json!({"alertname": "NodeNotReady", "node": node, "upgrade_gate": "true", "severity": "critical"})
}

#[tokio::test]
async fn alertmanager_silences_inhibitions_and_lost_resolutions_count_at_the_next_evaluation() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let am_port = prom.alertmanager_port;
    let am_url = format!("http://127.0.0.1:{am_port}");
    let rg = start_rollgate(&prom, &[("ROLLGATE__GATE__ALERTMANAGER_URL", &am_url)]).await;
    let mut am = alertmanager_for(&rg, am_port).await;
    wait_verdict(&rg, "open").await;

    // Firing in Alertmanager: closed, seen there.
    am.post_labelled(node_not_ready("w2"), false).await;
    let report = wait_verdict(&rg, "closed").await;
    assert_eq!(
        blocker_names(&report),
        [("NodeNotReady".to_owned(), "alertmanager".to_owned())]
    );
    assert!(
        report["alertmanager"]["query"]
            .as_str()
            .is_some_and(|q| q.contains("upgrade_gate=\"true\"")),
        "{report}"
    );

    // On-call silences it: open at the next evaluation, no webhook needed; the board still
    // has it firing (alone it would have kept the gate closed).
    let silence = am.silence(&[("alertname", "NodeNotReady")]).await;
    wait_verdict(&rg, "open").await;
    let on_board = board_entry(&rg, "NodeNotReady").await;
    assert_eq!(on_board["alert"]["status"], "firing", "{on_board}");

    // The silence ends: closed again.
    am.expire(&silence).await;
    wait_verdict(&rg, "closed").await;

    // Maintenance on w2 inhibits it: open again.
    am.post_labelled(
        json!({"alertname": "Maintenance", "node": "w2", "severity": "none"}),
        false,
    )
    .await;
    wait_verdict(&rg, "open").await;

    // An alert on the board whose resolution never arrived (Alertmanager no longer has
    // it): it does not hold the gate.
    let (status, _) = rg.post("/v1/alerts", &webhook("lost01")).await;
    assert_eq!(status, 202);
    eventually(
        "the lost alert on the board",
        Duration::from_secs(10),
        || async {
            support::board(&rg)
                .await
                .contains_key("lost01")
                .then_some(())
        },
    )
    .await;
    assert_eq!(verdict(&rg).await["verdict"]["verdict"], "open");

    // Alertmanager stops: the board's own alerts hold the gate, named.
    am.process.stop();
    let report = wait_verdict(&rg, "closed").await;
    assert_eq!(report["alertmanager"]["state"], "error", "{report}");
    assert!(
        report["alertmanager"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(&am_url)),
        "{report}"
    );
}

/// The board entry of the alert called `name`.
async fn board_entry(rg: &Rollgate, name: &str) -> Value {
    let (_, board) = rg.get("/v1/alerts").await;
    board
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["alert"]["labels"]["alertname"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {name} on the board: {board}"))
}

#[tokio::test]
async fn with_alertmanager_down_the_gate_is_unknown_names_it_and_nothing_goes_past() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let am_port = prom.alertmanager_port;
    let am_url = format!("http://127.0.0.1:{am_port}");
    let cluster = IntakeCluster::start().await;
    let rg = start_upgrading(
        &cluster,
        &prom,
        &[("ROLLGATE__GATE__ALERTMANAGER_URL", &am_url)],
    )
    .await;
    // Not started yet: nothing answers at the URL.
    let report = wait_verdict(&rg, "unknown").await;
    let reason = report["verdict"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("Alertmanager at {am_url}")),
        "{reason}"
    );

    let (status, accepted) = rg
        .post("/v1/detections", &support::detection("1.34.5"))
        .await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["run_id"].as_str().unwrap().to_owned();
    let run = rg
        .wait_run(&id, "held at its gate", |r| {
            r["status"] == "waiting" && r["steps"][0]["attempts"].as_u64() >= Some(2)
        })
        .await;
    assert!(
        run["reason"]
            .as_str()
            .is_some_and(|r| r.contains("Alertmanager at")),
        "{run}"
    );
    assert_eq!(
        run["steps"][1]["status"], "pending",
        "nothing past the gate"
    );

    // Alertmanager comes up: the run goes past its gate.
    let _am = alertmanager_for(&rg, am_port).await;
    rg.wait_run(&id, "past the gate", past_the_gate).await;
}

/// The API server's requests that change the cluster: any but a read or an Event.
fn writes(cluster: &IntakeCluster) -> Vec<String> {
    cluster
        .api
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET" && !r.path.starts_with("/apis/events.k8s.io/"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

/// Issue 44: a gate that reads nothing is open by accident. Without the watchdog firing in
/// Prometheus, or without the gate's rule group loaded there, the gate is unknown and a run
/// holds at it, by the API server's own log; with both, the run goes past its gate.
#[tokio::test]
async fn a_gate_without_its_watchdog_or_its_rule_group_is_unknown_and_holds_the_run() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let mut prom = Prometheus::loading(
        &target.address(),
        Loads {
            gate_rules: true,
            watchdog: false,
        },
    )
    .await;
    let cluster = IntakeCluster::start().await;
    let rg = start_upgrading(&cluster, &prom, &[]).await;
    let report = wait_verdict(&rg, "unknown").await;
    let reason = report["verdict"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("the watchdog alert Watchdog is not firing in Prometheus"),
        "{reason}"
    );
    assert_eq!(report["prometheus"]["state"], "ok", "Prometheus answers");
    assert_eq!(report["sight"]["watchdog"], "Watchdog");
    assert_eq!(report["sight"]["rule_group"], "Upgrade Gates");

    let before = writes(&cluster);
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_run(&id, "held at its gate for the watchdog", |r| {
            r["status"] == "waiting"
                && r["steps"][0]["attempts"].as_u64() >= Some(2)
                && r["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("Watchdog is not firing"))
        })
        .await;
    assert_eq!(run["steps"][1]["status"], "pending", "{run}");

    // The watchdog back, the gate's rules gone (a rollout that dropped the PrometheusRule).
    prom.reload(Loads {
        gate_rules: false,
        watchdog: true,
    })
    .await;
    let report = eventually(
        "the gate unknown for the rule group",
        Duration::from_secs(30),
        || async {
            let report = verdict(&rg).await;
            let reason = report["verdict"]["reason"].as_str()?.to_owned();
            reason
                .contains(
                    r#"has not loaded the rule group "Upgrade Gates" (loaded: general.rules)"#,
                )
                .then_some(report)
        },
    )
    .await;
    assert!(
        !report["verdict"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("Watchdog"),
        "the watchdog fires again: {report}"
    );
    let run = rg
        .wait_run(&id, "held at its gate for the rule group", |r| {
            r["status"] == "waiting"
                && r["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("has not loaded the rule group"))
        })
        .await;
    assert_eq!(run["steps"][1]["status"], "pending", "{run}");
    assert_eq!(
        writes(&cluster),
        before,
        "nothing was asked of the cluster while the gate could not see"
    );

    // Both loaded: the gate opens and the run goes past it.
    prom.reload(Loads::ALL).await;
    let run = rg
        .wait_run(&id, "the run past the gate", past_the_gate)
        .await;
    assert!(support::history_has(&run, "gate open again after"), "{run}");
}

/// Issue 44: with `gate.alertmanager_url`, the watchdog must reach Alertmanager too. A
/// Prometheus that sends its alerts elsewhere keeps the gate unknown, though Alertmanager
/// itself answers; sent there, the gate opens.
#[tokio::test]
async fn an_alertmanager_that_prometheus_alerts_do_not_reach_keeps_the_gate_unknown() {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let mut prom = Prometheus::start(&target.address()).await;
    // Not where this Prometheus sends its alerts.
    let am_port = support::free_port();
    let am_url = format!("http://127.0.0.1:{am_port}");
    let rg = start_rollgate(&prom, &[("ROLLGATE__GATE__ALERTMANAGER_URL", &am_url)]).await;
    let _am = alertmanager_for(&rg, am_port).await;
    let report = eventually(
        "the gate unknown for the watchdog in Alertmanager",
        Duration::from_secs(30),
        || async {
            let report = verdict(&rg).await;
            (report["alertmanager"]["state"] == "ok"
                && report["verdict"]["reason"]
                    .as_str()?
                    .contains("Alertmanager does not list the watchdog alert Watchdog"))
            .then_some(report)
        },
    )
    .await;
    assert_eq!(report["verdict"]["verdict"], "unknown", "{report}");

    prom.alertmanager_port = am_port;
    prom.reload(Loads::ALL).await;
    let report = wait_verdict(&rg, "open").await;
    assert_eq!(report["sight"]["blind"], Value::Null, "{report}");
}

/// The newest `event: gate` frame's data on the event stream, read for `span`; null when
/// none came (the gate not evaluated yet).
async fn last_gate_frame(rg: &Rollgate, span: Duration) -> Value {
    let mut stream = reqwest::Client::new()
        .get(format!("{}/v1/events", rg.base()))
        .bearer_auth(&rg.token)
        .send()
        .await
        .expect("the event stream");
    assert_eq!(stream.status().as_u16(), 200);
    let mut text = String::new();
    let until = tokio::time::Instant::now() + span;
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(until, stream.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text.split("\n\n")
        .filter(|f| f.lines().any(|l| l == "event: gate"))
        .last()
        .and_then(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .map_or(Value::Null, |data| {
            serde_json::from_str(data).expect("JSON")
        })
}

#[tokio::test]
async fn every_view_of_the_gate_tells_one_evaluation_blockers_included() {
    // As a new user tries it: embedded defaults, no Prometheus, one blocking alert. The
    // poll is the default 30 s, so only the board change can bring the views along.
    let rg = Rollgate::start(&[]).await;
    stream_says(&rg, "unknown").await;

    let (status, _) = rg.post("/v1/alerts", &webhook("4e1c0ffee0ddba11")).await;
    assert_eq!(status, 202);
    let streamed = stream_says(&rg, "closed").await;
    let (_, cached) = rg.get("/v1/gates?cached=true").await;
    let (_, fresh) = rg.get("/v1/gates").await;
    for (view, report) in [
        ("stream", &streamed),
        ("cached", &cached),
        ("fresh", &fresh),
    ] {
        assert_eq!(report["verdict"]["verdict"], "closed", "{view}: {report}");
        assert_eq!(
            blocker_names(report),
            [("NodeNotReady".to_owned(), "alertmanager".to_owned())],
            "{view}: {report}"
        );
        assert_eq!(report["alertmanager"]["blocking"], 1, "{view}: {report}");
        assert_eq!(report["prometheus"]["blocking"], 0, "{view}: {report}");
        assert_eq!(
            report["prometheus"]["state"], "not configured",
            "{view}: {report}"
        );
    }
    assert_eq!(
        rg.metric("rollgate_gate_verdict{verdict=\"closed\"}").await,
        1.0
    );
    assert_eq!(
        rg.metric("rollgate_gate_verdict{verdict=\"unknown\"}")
            .await,
        0.0
    );
    let metrics = rg.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("rollgate_gate_blockers{")
                && l.contains("NodeNotReady")
                && l.ends_with(" 1")),
        "{metrics}"
    );

    // Resolved: back to unknown (no Prometheus), everywhere, with nothing named.
    let (status, _) = rg
        .post("/v1/alerts", &support::resolved("4e1c0ffee0ddba11"))
        .await;
    assert_eq!(status, 202);
    let streamed = stream_says(&rg, "unknown").await;
    let (_, fresh) = rg.get("/v1/gates").await;
    for report in [&streamed, &fresh] {
        assert!(blocker_names(report).is_empty(), "{report}");
        assert_eq!(report["alertmanager"]["blocking"], 0);
    }
    assert_eq!(
        rg.metric("rollgate_gate_verdict{verdict=\"unknown\"}")
            .await,
        1.0
    );
}

/// `amtool alert add …` against the real Alertmanager.
fn amtool(am: &Alertmanager, args: &[&str]) {
    let out = std::process::Command::new("amtool")
        .arg(format!("--alertmanager.url=http://127.0.0.1:{}", am.port))
        .args(["alert", "add"])
        .args(args)
        .output()
        .expect("amtool (prometheus-alertmanager)");
    assert!(
        out.status.success(),
        "amtool {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What Alertmanager sent for the alert labelled `trial`: (status, startsAt) of each
/// notification, in the order sent.
fn sent_for(capture: &MiniServer, trial: &str) -> Vec<(String, String, Value)> {
    capture
        .received()
        .into_iter()
        .flat_map(|body| {
            body["alerts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter(|a| a["labels"]["trial"] == trial)
                .map(move |a| {
                    let status = a["status"].as_str().unwrap_or_default().to_owned();
                    let starts = a["startsAt"].as_str().unwrap_or_default().to_owned();
                    (status, starts, body.clone())
                })
        })
        .collect()
}

/// Issue 40, on the webhook-only board (no gate.alertmanager_url): a client fires an
/// alert and resolves it with a whole-second `endsAt` and no `startsAt`, as amtool and
/// scripts do. Alertmanager starts that resolution at its end, before the start it
/// stamped on the firing, and sends it so; the gate opens all the same, every trial.
/// Then a resolution of an older episode, delivered late after a new firing (a retried
/// notification, Alertmanager's own body), leaves the gate closed.
#[tokio::test]
async fn a_whole_second_resolution_from_amtool_opens_the_gate_and_an_older_episodes_late_one_does_not()
 {
    let target = MiniServer::start().await;
    target.set_metrics(&booted(86_400));
    let prom = Prometheus::start(&target.address()).await;
    let rg = start_rollgate(&prom, &[]).await;
    let capture = MiniServer::start().await;
    let config = format!(
        "route:\n  receiver: rollgate\n  group_by: ['...']\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\n\
         receivers:\n  - name: rollgate\n    webhook_configs:\n      - url: {}/v1/alerts\n        send_resolved: true\n        http_config:\n          authorization:\n            type: Bearer\n            credentials_file: {}\n\
         \x20     - url: http://{}/\n        send_resolved: true\n",
        rg.base(),
        rg.data_dir().join("api-token").display(),
        capture.address()
    );
    let am = Alertmanager::with_config(&config, support::free_port()).await;
    wait_verdict(&rg, "open").await;

    for trial in 0..5 {
        let label = format!("trial={trial}");
        // Early in a second, so that the firing's stamp and the resolution's whole
        // second are the same second, as when a script resolves at once.
        let into = chrono::Utc::now().timestamp_subsec_millis();
        if into > 100 {
            tokio::time::sleep(Duration::from_millis(u64::from(1000 - into) + 5)).await;
        }
        amtool(&am, &["EtcdNoLeader", "upgrade_gate=true", &label]);
        let end = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
        wait_verdict(&rg, "closed").await;
        amtool(
            &am,
            &[
                "EtcdNoLeader",
                "upgrade_gate=true",
                &label,
                &format!("--end={end}"),
            ],
        );
        wait_verdict(&rg, "open").await;
        // The case was the one that matters: Alertmanager sent a resolution starting
        // before the firing it resolved.
        let sent = sent_for(&capture, &trial.to_string());
        let firing = sent
            .iter()
            .find(|(s, ..)| s == "firing")
            .expect("the firing sent");
        let resolved = sent
            .iter()
            .find(|(s, ..)| s == "resolved")
            .expect("the resolution sent");
        let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).unwrap();
        assert!(
            at(&resolved.1) < at(&firing.1),
            "trial {trial}: resolution starts {} before the firing's {}",
            resolved.1,
            firing.1
        );
    }

    // An older episode: fired a minute ago, resolved half a minute ago.
    let label = "trial=older";
    let ago = |s: i64| {
        (chrono::Utc::now() - chrono::Duration::seconds(s))
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    amtool(
        &am,
        &[
            "EtcdNoLeader",
            "upgrade_gate=true",
            label,
            &format!("--start={}", ago(60)),
        ],
    );
    wait_verdict(&rg, "closed").await;
    amtool(
        &am,
        &[
            "EtcdNoLeader",
            "upgrade_gate=true",
            label,
            &format!("--start={}", ago(60)),
            &format!("--end={}", ago(30)),
        ],
    );
    wait_verdict(&rg, "open").await;
    let late = eventually(
        "the older resolution sent",
        Duration::from_secs(10),
        || async {
            sent_for(&capture, "older")
                .into_iter()
                .find(|(s, ..)| s == "resolved")
                .map(|(.., body)| body)
        },
    )
    .await;
    // A new episode fires; then the older episode's resolution arrives again, late.
    amtool(&am, &["EtcdNoLeader", "upgrade_gate=true", label]);
    wait_verdict(&rg, "closed").await;
    let (status, answer) = rg.post("/v1/alerts", &late).await;
    assert_eq!(status, 202, "{answer}");
    // A marker after it on the same queue: once the board has it, it has the late one.
    rg.post("/v1/alerts", &webhook("feedfacefeedface")).await;
    eventually(
        "the marker on the board",
        Duration::from_secs(10),
        || async {
            board(&rg)
                .await
                .contains_key("feedfacefeedface")
                .then_some(())
        },
    )
    .await;
    let report = verdict(&rg).await;
    assert_eq!(report["verdict"]["verdict"], "closed", "{report}");
    assert!(
        blocker_names(&report)
            .iter()
            .any(|(name, _)| name == "EtcdNoLeader"),
        "{report}"
    );
}
