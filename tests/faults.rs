//! Faults survived (issue 30), one case per fault, each asserting what an operator relies
//! on: nothing accepted is lost, the gate never opens on a fault, and what rollgate says
//! names the fault. This first part: Alertmanager notifications out of order and resent.

mod support;

use serde_json::{Value, json};
use std::time::Duration;
use support::ground::Ground;
use support::services::{MiniServer, Prometheus};
use support::{Rollgate, eventually};

const ZERO: &str = "0001-01-01T00:00:00Z";

/// A notification of the gate alert `KubeNodeNotReady{node="w2"}` (one fingerprint).
fn notification(status: &str, starts: &str, ends: &str) -> Value {
    let mut body = support::webhook("w2");
    body["status"] = status.into();
    body["alerts"][0]["labels"]["alertname"] = "KubeNodeNotReady".into();
    body["alerts"][0]["status"] = status.into();
    body["alerts"][0]["startsAt"] = starts.into();
    body["alerts"][0]["endsAt"] = ends.into();
    body
}

async fn verdict_becomes(rg: &Rollgate, want: &str) -> Value {
    eventually(
        &format!("the gate to be {want}"),
        Duration::from_secs(30),
        || async {
            let (_, report) = rg.get("/v1/gates").await;
            (report["verdict"]["verdict"] == want).then_some(report)
        },
    )
    .await
}

/// The board's one alert: (status, startsAt, notifications received).
async fn board(rg: &Rollgate) -> (String, String, u64) {
    let (status, board) = rg.get("/v1/alerts").await;
    assert_eq!(status, 200, "{board}");
    let alerts = board.as_array().expect("a list");
    assert_eq!(alerts.len(), 1, "{board}");
    let entry = &alerts[0];
    let alert = if entry["alert"].is_object() {
        &entry["alert"]
    } else {
        entry
    };
    (
        alert["status"].as_str().unwrap_or_default().to_owned(),
        alert["starts_at"].as_str().unwrap_or_default().to_owned(),
        entry["received"].as_u64().unwrap_or_default(),
    )
}

#[tokio::test]
async fn out_of_order_and_resent_notifications_keep_the_newest_by_the_alerts_own_times() {
    // Prometheus answers and has nothing firing: the board alone decides the gate.
    let target = MiniServer::start().await;
    target.set_metrics("up 1\n");
    let prom = Prometheus::start(&target.address()).await;
    let rg = Rollgate::start(&[
        ("ROLLGATE__GATE__PROMETHEUS_URL", &prom.url()),
        ("ROLLGATE__GATE__POLL_INTERVAL", "300ms"),
    ])
    .await;
    verdict_becomes(&rg, "open").await;
    let post = |body: Value| {
        let rg = &rg;
        async move {
            let (status, answer) = rg.post("/v1/alerts", &body).await;
            assert_eq!(status, 202, "{answer}");
        }
    };
    let (start, end) = ("2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z");

    // The resolution arrives before the firing it resolves (Alertmanager's retries after a
    // timeout, two Alertmanagers of a cluster): the late firing must not close the gate.
    post(notification("resolved", start, end)).await;
    post(notification("firing", start, ZERO)).await;
    eventually(
        "both notifications on the board",
        Duration::from_secs(20),
        || async { (board(&rg).await.2 == 2).then_some(()) },
    )
    .await;
    let (status, starts, _) = board(&rg).await;
    assert_eq!(
        status, "resolved",
        "the late firing won over its resolution"
    );
    assert!(starts.starts_with("2026-12-01T10:00:00"), "{starts}");
    let report = verdict_becomes(&rg, "open").await;
    assert_eq!(report["verdict"]["verdict"], "open", "{report}");

    // The same group resent: counted, nothing changes.
    post(notification("resolved", start, end)).await;
    eventually("the resend counted", Duration::from_secs(20), || async {
        (board(&rg).await.2 == 3).then_some(())
    })
    .await;
    assert_eq!(board(&rg).await.0, "resolved");

    // It fires again: a new start, the gate closes and names it.
    post(notification("firing", "2026-12-01T11:00:00Z", ZERO)).await;
    let closed = verdict_becomes(&rg, "closed").await;
    assert!(closed.to_string().contains("KubeNodeNotReady"), "{closed}");
    // A late copy of the first resolution does not reopen it.
    post(notification("resolved", start, end)).await;
    eventually("the late copy counted", Duration::from_secs(20), || async {
        (board(&rg).await.2 == 5).then_some(())
    })
    .await;
    assert_eq!(board(&rg).await.0, "firing");
    let (_, report) = rg.get("/v1/gates").await;
    assert_eq!(report["verdict"]["verdict"], "closed", "{report}");
}

const EMPTY_VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;

/// The gate's verdict and why, once it has become `want`.
async fn reason_once(rg: &Rollgate, want: &str) -> String {
    verdict_becomes(rg, want).await["verdict"].to_string()
}

#[tokio::test]
async fn a_prometheus_answering_badly_never_opens_the_gate_and_says_why() {
    // A server in Prometheus' place, answering as each case says.
    let prom = MiniServer::start().await;
    prom.set_reply(200, EMPTY_VECTOR);
    let url = format!("http://{}", prom.address());
    let rg = Rollgate::start(&[
        ("ROLLGATE__GATE__PROMETHEUS_URL", &url),
        ("ROLLGATE__GATE__POLL_INTERVAL", "300ms"),
        ("ROLLGATE__GATE__TIMEOUT", "1s"),
    ])
    .await;
    verdict_becomes(&rg, "open").await;
    // (what Prometheus does, the reply, what the gate's reason says)
    let cases: [(&str, u16, &str, Duration, &str); 4] = [
        (
            "slower than gate.timeout",
            200,
            EMPTY_VECTOR,
            Duration::from_secs(3),
            "failed",
        ),
        (
            "a body that is not JSON",
            200,
            "<html>proxy error</html>",
            Duration::ZERO,
            "failed",
        ),
        (
            "a partial result (warnings)",
            200,
            r#"{"status":"success","warnings":["remote read of store-2 failed: connection refused"],"data":{"resultType":"vector","result":[]}}"#,
            Duration::ZERO,
            "remote read of store-2 failed",
        ),
        (
            "an error answer",
            422,
            r#"{"status":"error","errorType":"execution","error":"query timed out in expression evaluation"}"#,
            Duration::ZERO,
            "query timed out in expression evaluation",
        ),
    ];
    for (what, status, body, delay, says) in cases {
        *prom.delay.lock().unwrap() = delay;
        prom.set_reply(status, body);
        let reason = reason_once(&rg, "unknown").await;
        assert!(reason.contains(says), "{what}: {reason}");
        // Healthy again: it opens, so each case above is shown closing an open gate.
        *prom.delay.lock().unwrap() = Duration::ZERO;
        prom.set_reply(200, EMPTY_VECTOR);
        verdict_becomes(&rg, "open").await;
    }
}

#[tokio::test]
async fn an_alertmanager_listing_an_alert_whose_end_has_passed_closes_the_gate() {
    let prom = MiniServer::start().await;
    prom.set_reply(200, EMPTY_VECTOR);
    let am = MiniServer::start().await;
    am.set_reply(200, "[]");
    let (prom_url, am_url) = (
        format!("http://{}", prom.address()),
        format!("http://{}", am.address()),
    );
    let rg = Rollgate::start(&[
        ("ROLLGATE__GATE__PROMETHEUS_URL", &prom_url),
        ("ROLLGATE__GATE__ALERTMANAGER_URL", &am_url),
        ("ROLLGATE__GATE__POLL_INTERVAL", "300ms"),
        ("ROLLGATE__GATE__TIMEOUT", "1s"),
    ])
    .await;
    verdict_becomes(&rg, "open").await;
    // Alertmanager still holds it active, though its endsAt is an hour ago by rollgate's
    // clock (the two clocks disagree, or Alertmanager has not swept it yet): Alertmanager
    // is the authority on what is active, so it blocks.
    let ended = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let listed = serde_json::json!([{
        "fingerprint": "f00d",
        "labels": {"alertname": "KubeNodeNotReady", "upgrade_gate": "true", "node": "w2"},
        "annotations": {},
        "startsAt": "2026-12-01T10:00:00Z",
        "endsAt": ended,
        "updatedAt": ended,
        "generatorURL": "",
        "receivers": [{"name": "rollgate"}],
        "status": {"state": "active", "silencedBy": [], "inhibitedBy": []}
    }]);
    am.set_reply(200, &listed.to_string());
    let reason = reason_once(&rg, "closed").await;
    assert!(reason.contains("KubeNodeNotReady"), "{reason}");
    // An answer that is not a list is no answer: unknown, never open.
    am.set_reply(200, r#"{"alerts": "all clear"}"#);
    let reason = reason_once(&rg, "unknown").await;
    assert!(reason.to_lowercase().contains("alertmanager"), "{reason}");
}

/// Every step outcome and the run's reason, as one text to look for words in.
fn said(run: &Value) -> String {
    let mut text = run["reason"].as_str().unwrap_or_default().to_owned();
    for step in run["steps"].as_array().into_iter().flatten() {
        text.push('\n');
        text.push_str(step["outcome"].as_str().unwrap_or_default());
    }
    text
}

#[tokio::test]
async fn a_frozen_etcd_member_holds_the_control_planes_naming_it_and_the_run_goes_on_after() {
    let ground = Ground::start_ha("1.34.2", 3, 1).await;
    let stacked = ground.etcd.stacked();
    stacked.lead("cp-1").await;
    let term_before = stacked.term().await;
    let rg = ground.rollgate(&[]).await;
    let id = rg.detect("1.34.5", "patch").await;
    let deadline = Duration::from_secs(240);
    // The first control plane is upgraded and checked: a follower not yet upgraded
    // freezes (SIGSTOP: alive, its sockets open, answering nothing).
    let run = rg
        .wait_run_until(&id, "the first control plane checked", deadline, |r| {
            r["steps"].as_array().into_iter().flatten().any(|s| {
                s["stage"] == "control-plane"
                    && s["name"] == "healthy-after"
                    && s["status"] == "done"
            })
        })
        .await;
    let first = run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == "healthy-after" && s["status"] == "done")
        .and_then(|s| s["node"].as_str())
        .expect("the first control plane")
        .to_owned();
    let frozen = if first == "cp-2" { "cp-3" } else { "cp-2" };
    stacked.member(frozen).freeze();
    // Held within control_plane_health_timeout (the ground's 20 s), naming the member.
    let held = rg
        .wait_run_until(
            &id,
            "the control planes to hold on the frozen member",
            deadline,
            |r| {
                r["status"] == "halted"
                    || said(r).contains(&format!("unhealthy member(s): {frozen}"))
            },
        )
        .await;
    assert_ne!(held["status"], "halted", "{}", said(&held));
    assert_ne!(
        ground.api.node(frozen)["spec"]["unschedulable"],
        json!(true),
        "{frozen} was cordoned while its member was frozen"
    );
    stacked.member(frozen).thaw();
    let run = rg.wait_status(&id, "succeeded", deadline).await;
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();
    // A frozen follower is no election: still exactly the one planned leadership change.
    let term_after = stacked.term().await;
    assert_eq!(
        term_after,
        term_before + 1,
        "raft term {term_before} -> {term_after}"
    );
    assert!(said(&run).contains("uncontrolled 0"), "{}", said(&run));
}

#[tokio::test]
async fn an_etcd_member_frozen_past_the_health_timeout_halts_the_run_naming_it() {
    let ground = Ground::start_ha("1.34.2", 3, 1).await;
    let stacked = ground.etcd.stacked();
    stacked.lead("cp-1").await;
    let rg = ground
        .rollgate(&[(
            "ROLLGATE__CLUSTER__CONTROL_PLANE_HEALTH_TIMEOUT",
            "5s".into(),
        )])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    let deadline = Duration::from_secs(240);
    rg.wait_run_until(&id, "the control-plane stage", deadline, |r| {
        r["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["stage"] == "control-plane" && s["name"] == "next" && s["status"] == "done")
    })
    .await;
    stacked.member("cp-3").freeze();
    let run = rg.wait_status(&id, "halted", deadline).await;
    stacked.member("cp-3").thaw();
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("cp-3") && reason.contains("no further control plane was touched")
            || reason.contains("cp-3") && reason.contains("it was not touched"),
        "{reason}"
    );
}
