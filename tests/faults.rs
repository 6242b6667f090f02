//! Faults survived (issue 30), one case per fault, each asserting what an operator relies
//! on: nothing accepted is lost, the gate never opens on a fault, and what rollgate says
//! names the fault. This first part: Alertmanager notifications out of order and resent.

mod support;

use serde_json::Value;
use std::time::Duration;
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
