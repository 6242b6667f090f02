//! Faults survived (issue 30), one case per fault, each asserting what an operator relies
//! on: nothing accepted is lost, the gate never opens on a fault, and what rollgate says
//! names the fault. This first part: Alertmanager notifications out of order and resent.

mod support;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::disk::SmallDisk;
use support::etcd_pods::EtcdStatefulSet;
use support::ground::Ground;
use support::kube::fault::{Answer, Fault, Lasting, Request};
use support::services::{MiniServer, Prometheus};
use support::witness::RaftWitness;
use support::{Rollgate, eventually, find_step};

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

/// How many notifications of the board's one alert were received; 0 while the worker has
/// not committed the first (the board is still empty).
async fn received(rg: &Rollgate) -> u64 {
    let (status, board) = rg.get("/v1/alerts").await;
    assert_eq!(status, 200, "{board}");
    if board.as_array().is_some_and(|a| a.is_empty()) {
        return 0;
    }
    self::board(rg).await.2
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
        || async { (received(&rg).await == 2).then_some(()) },
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
        (received(&rg).await == 3).then_some(())
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
        (received(&rg).await == 5).then_some(())
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
    // It answers every path alike, so the proofs that the gate can see (the watchdog, the
    // rule group) are off: tests/gates.rs shows them against a real Prometheus.
    let rg = Rollgate::start(&[
        ("ROLLGATE__GATE__PROMETHEUS_URL", &url),
        ("ROLLGATE__GATE__POLL_INTERVAL", "300ms"),
        ("ROLLGATE__GATE__TIMEOUT", "1s"),
        ("ROLLGATE__GATE__WATCHDOG", ""),
        ("ROLLGATE__GATE__RULE_GROUP", ""),
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
        // Servers that answer every path alike: the proofs of sight are off.
        ("ROLLGATE__GATE__WATCHDOG", ""),
        ("ROLLGATE__GATE__RULE_GROUP", ""),
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
    let thawed = Instant::now();
    let run = rg.wait_status(&id, "succeeded", deadline).await;
    eprintln!(
        "recovery: the run succeeded {:?} after the thaw",
        thawed.elapsed()
    );
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

// ---- The API server misbehaving ----

/// The invariants every whole-upgrade fault case ends on, from the ground's own records:
/// every node at `target` and schedulable, none drained twice (the API server's log of
/// changes), each node's `kubeadm upgrade` run once (its sshd's log of calls).
fn assert_upgraded_once(ground: &Ground, target: &str) {
    ground.assert_all_at(target);
    ground.assert_drained_once();
    for node in &ground.nodes {
        let calls = node.calls();
        let upgrades = calls
            .iter()
            .filter(|c| c.starts_with("kubeadm upgrade apply") || *c == "kubeadm upgrade node")
            .count();
        assert_eq!(upgrades, 1, "{}: {calls:?}", node.name);
    }
}

/// Serves rollgate on `ground`, upgrades it to 1.34.5, and asserts the run succeeded with
/// [`assert_upgraded_once`]; the run.
async fn upgrade_through(ground: &Ground) -> Value {
    let rg = ground.rollgate(&[]).await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_status(&id, "succeeded", Duration::from_secs(180))
        .await;
    assert_upgraded_once(ground, "1.34.5");
    run
}

/// The requests the fake API server received of `method` whose path contains `path`.
fn requests(ground: &Ground, method: &str, path: &str) -> Vec<Request> {
    ground
        .api
        .requests()
        .into_iter()
        .filter(|r| r.method == method && r.path.contains(path))
        .collect()
}

/// Waits until the fake API server answers again (its outage over).
async fn api_answers(ground: &Ground) -> Instant {
    let http = reqwest::Client::new();
    let url = format!("{}/version", ground.api.url());
    let token = ground.api.token.clone();
    eventually("the API server to answer", Duration::from_secs(120), || {
        let (http, url, token) = (&http, &url, &token);
        async move {
            let answer = http.get(url).bearer_auth(token).send().await.ok()?;
            answer.status().is_success().then(Instant::now)
        }
    })
    .await
}

#[tokio::test]
async fn api_server_errors_and_dropped_connections_during_a_drain_are_retried_and_drain_nothing_twice()
 {
    let ground = Ground::start("1.34.2", 3).await;
    for w in ["w1", "w2", "w3"] {
        ground.api.add_pods(w, "web", 2, false);
    }
    // w2's drain: listing its pods drops the connection twice, and each of its pods'
    // first two evictions answers 500.
    ground.api.inject(Fault::on(
        "GET",
        "fieldSelector=spec.nodeName=w2",
        Answer::Reset,
        Lasting::Requests(2),
    ));
    let w2_pods: Vec<String> = ground
        .api
        .pods_on("w2")
        .iter()
        .filter(|p| p["metadata"]["labels"]["app"] == "web")
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    for pod in &w2_pods {
        ground.api.inject(Fault::on(
            "POST",
            &format!("/pods/{pod}/eviction"),
            Answer::Status {
                code: 500,
                retry_after: None,
            },
            Lasting::Requests(2),
        ));
    }
    upgrade_through(&ground).await;
    let faulted: Vec<Request> = ground
        .api
        .requests()
        .into_iter()
        .filter(|r| r.faulted.is_some())
        .collect();
    assert_eq!(
        faulted
            .iter()
            .filter(|r| r.faulted.as_deref() == Some("reset"))
            .count(),
        2,
        "{faulted:?}"
    );
    for pod in &w2_pods {
        let tries = requests(&ground, "POST", &format!("/pods/{pod}/eviction"));
        assert_eq!(tries.len(), 3, "{pod}: two 500s, then evicted: {tries:?}");
    }
}

#[tokio::test]
async fn an_eviction_answered_429_with_retry_after_is_asked_again_no_sooner() {
    let ground = Ground::start("1.34.2", 3).await;
    ground.api.add_pods("w3", "web", 2, false);
    // The server sheds load: the next six evictions (w3's two pods, three times each)
    // answer 429 with Retry-After: 2, ten times the drain's pace.
    ground.api.inject(Fault::on(
        "POST",
        "/eviction",
        Answer::Status {
            code: 429,
            retry_after: Some(2),
        },
        Lasting::Requests(6),
    ));
    upgrade_through(&ground).await;
    let evictions = requests(&ground, "POST", "/eviction");
    let mut by_pod: std::collections::BTreeMap<&str, Vec<&Request>> = Default::default();
    for r in &evictions {
        by_pod.entry(r.path.as_str()).or_default().push(r);
    }
    let refused: usize = evictions.iter().filter(|r| r.faulted.is_some()).count();
    assert_eq!(refused, 6, "{evictions:?}");
    for (pod, tries) in &by_pod {
        for pair in tries.windows(2) {
            if pair[0].faulted.is_some() {
                let gap = pair[1].at - pair[0].at;
                assert!(
                    gap >= Duration::from_millis(1950),
                    "{pod} asked again {gap:?} after a 429 with Retry-After: 2"
                );
            }
        }
    }
    for tries in by_pod.values() {
        if let (Some(last_refused), Some(done)) = (
            tries.iter().rev().find(|r| r.faulted.is_some()),
            tries.iter().rev().find(|r| r.faulted.is_none()),
        ) {
            eprintln!(
                "recovery: evicted {:?} after the last 429",
                done.at - last_refused.at
            );
        }
    }
    // Not hammered: each refused pod was asked once per Retry-After, not every 200 ms.
    assert!(
        evictions.len() <= refused + by_pod.len(),
        "{} evictions for {} pods: {evictions:?}",
        evictions.len(),
        by_pod.len()
    );
}

/// Resumes the halted run `id` with `reason` and waits for it to succeed.
async fn resume_to_success(rg: &Rollgate, id: &str, reason: &str) {
    assert_eq!(rg.control(id, "resume", reason).await, 202);
    rg.wait_run(id, "the resume to be taken", |run| {
        run["status"] != "halted"
    })
    .await;
    rg.wait_status(id, "succeeded", Duration::from_secs(120))
        .await;
}

/// Makes `node` come back NotReady from its script and waits until the run's verify of it
/// says so; returns the run.
async fn verify_waiting_on(ground: &Ground, rg: &Rollgate, id: &str, node: &str) -> Value {
    ground.node(node).stay_not_ready();
    rg.wait_run_until(
        id,
        &format!("verify of {node} to wait for it"),
        Duration::from_secs(120),
        |run| {
            find_step(run, &format!("workers/verify@{node}")).is_some_and(|s| {
                s["outcome"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("not Ready")
            })
        },
    )
    .await
}

#[tokio::test]
async fn an_api_server_outage_during_a_verify_is_waited_out_within_the_verify_bound() {
    let ground = Ground::start("1.34.2", 3).await;
    ground.api.add_pods("w2", "web", 2, false);
    // verify_timeout 20 s stands for the default 5 min: the 8 s outage for 2 minutes.
    let rg = ground.rollgate(&[]).await;
    let id = rg.detect("1.34.5", "patch").await;
    verify_waiting_on(&ground, &rg, &id, "w2").await;
    ground.api.inject(Fault::outage(Duration::from_secs(8)));
    rg.wait_run_until(
        &id,
        "verify to say the API server does not answer",
        Duration::from_secs(30),
        |run| {
            find_step(run, "workers/verify@w2").is_some_and(|s| {
                s["outcome"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("no answer about w2: Kubernetes API server")
            })
        },
    )
    .await;
    // The kubelet reports Ready while the API server is out to rollgate.
    ground.api.edit_node("w2", |n| {
        n["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    });
    let back = api_answers(&ground).await;
    let run = rg
        .wait_run_until(&id, "verify of w2 done", Duration::from_secs(60), |run| {
            find_step(run, "workers/verify@w2").is_some_and(|s| s["status"] == "done")
        })
        .await;
    eprintln!(
        "verify of w2 done {:?} after the outage ended",
        back.elapsed()
    );
    assert_ne!(run["status"], "halted", "{}", said(&run));
    rg.wait_status(&id, "succeeded", Duration::from_secs(120))
        .await;
    assert_upgraded_once(&ground, "1.34.5");
    let dropped = ground
        .api
        .requests()
        .iter()
        .filter(|r| r.faulted.as_deref() == Some("reset"))
        .count();
    assert!(dropped > 0, "the outage met no request");
}

#[tokio::test]
async fn an_api_server_outage_past_the_verify_bound_halts_naming_it_and_resume_completes() {
    let ground = Ground::start("1.34.2", 3).await;
    let rg = ground
        .rollgate(&[("ROLLGATE__CLUSTER__VERIFY_TIMEOUT", "6s".into())])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    verify_waiting_on(&ground, &rg, &id, "w2").await;
    ground.api.inject(Fault::outage(Duration::from_secs(15)));
    ground.api.edit_node("w2", |n| {
        n["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    });
    let run = rg.wait_status(&id, "halted", Duration::from_secs(60)).await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("no answer about w2: Kubernetes API server")
            && reason.contains("it stays cordoned"),
        "{reason}"
    );
    // Nothing further was touched: w1 not cordoned, not upgraded.
    assert_eq!(ground.api.node("w1")["spec"]["unschedulable"], Value::Null);
    assert!(
        !ground
            .node("w1")
            .calls()
            .iter()
            .any(|c| c.starts_with("kubeadm upgrade")),
        "w1 was upgraded while the run could not see w2"
    );
    let back = api_answers(&ground).await;
    resume_to_success(&rg, &id, "the API server is back").await;
    eprintln!(
        "resumed run succeeded {:?} after the outage ended",
        back.elapsed()
    );
    assert_upgraded_once(&ground, "1.34.5");
}

#[tokio::test]
async fn conflicting_writes_to_a_node_are_merged_not_overwritten_and_the_run_completes() {
    let ground = Ground::start("1.34.2", 3).await;
    // Another controller writes w2 right after each of rollgate's next eight reads of it.
    // The first two are the reads of w2 alone by its steps before the drain (their node
    // scripts' address), with no write of rollgate's to conflict with; then the cordon's
    // patch at the resourceVersion it read is refused (409) five times over, the step
    // gives up, and its retry meets one more conflict before it goes through.
    let mut n = 0;
    ground
        .api
        .write_after_reads_of_node("w2", 8, move |node: &mut Value| {
            n += 1;
            node["metadata"]["labels"]["example.com/other-writer"] = json!(n.to_string());
        });
    upgrade_through(&ground).await;
    let calls = ground.api.calls();
    assert!(
        calls.get("patch node 409").copied().unwrap_or(0) >= 5,
        "{calls:?}"
    );
    // The other writer's last write stands: rollgate's patches merged into it.
    assert_eq!(
        ground.api.node("w2")["metadata"]["labels"]["example.com/other-writer"],
        "8"
    );
}

// ---- SSH cut mid-script ----

/// Waits until `node`'s `kubeadm upgrade node` has started (held, if it is).
async fn kubeadm_started(ground: &Ground, node: &str) {
    eventually(
        &format!("{node}'s kubeadm upgrade to start"),
        Duration::from_secs(120),
        || async {
            let calls = ground.node(node).calls();
            calls
                .iter()
                .any(|c| c == "kubeadm upgrade node")
                .then_some(())
        },
    )
    .await;
}

/// Whether `node`'s kubelet was restarted after its last kubelet package install: it runs
/// the new binary.
fn kubelet_restarted_on_the_new_binary(node: &support::nodes::FakeNode) -> bool {
    let calls = node.calls();
    let installed = calls.iter().rposition(|c| {
        c.starts_with("apt-get install") && !c.contains("--download-only") && c.contains("kubelet=")
    });
    let restarted = calls.iter().rposition(|c| c == "systemctl restart kubelet");
    matches!((installed, restarted), (Some(i), Some(r)) if r > i)
}

#[tokio::test]
async fn an_ssh_session_cut_while_kubeadm_runs_is_redone_and_the_upgrade_applies_once() {
    let ground = Ground::start("1.34.2", 3).await;
    ground.node("w2").cut_session_during_upgrade();
    let run = upgrade_through(&ground).await;
    let w2 = ground.node("w2");
    // The script ran again after the cut, and its second run repeated no kubeadm upgrade.
    assert_eq!(w2.script_runs(), 2, "{:?}", w2.calls());
    assert!(kubelet_restarted_on_the_new_binary(w2), "{:?}", w2.calls());
    let upgrade = find_step(&run, "workers/upgrade@w2").expect("upgrade@w2");
    assert_eq!(upgrade["attempts"], 2, "{upgrade}");
    eprintln!(
        "recovery: w2's upgrade step, cut and redone, took {} to {}",
        upgrade["started_at"], upgrade["ended_at"]
    );
}

#[tokio::test]
async fn a_host_key_changed_before_the_redo_is_refused_and_halts_naming_the_node() {
    let mut ground = Ground::start("1.34.2", 3).await;
    ground.node("w2").hold_kubeadm();
    ground.node("w2").cut_session_during_upgrade();
    let rg = ground.rollgate(&[]).await;
    let id = rg.detect("1.34.5", "patch").await;
    kubeadm_started(&ground, "w2").await;
    // While kubeadm works, w2 answers with another host key (a reinstalled host, or
    // another one taking its address); then the session drops.
    let w2 = ground
        .nodes
        .iter_mut()
        .find(|n| n.name == "w2")
        .expect("w2");
    w2.change_host_key();
    w2.release_kubeadm();
    let run = rg.wait_status(&id, "halted", Duration::from_secs(60)).await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("ssh to w2: host key verification failed"),
        "{reason}"
    );
    let w2 = ground.node("w2");
    assert_eq!(w2.script_runs(), 1, "the redo reached w2: {:?}", w2.calls());
    assert_ne!(
        ground.api.node("w1")["spec"]["unschedulable"],
        json!(true),
        "w1 was touched after the halt"
    );
    // The operator checks the new key and trusts it: the resumed run finishes w2 without
    // a second kubeadm upgrade.
    w2.trust(&ground.client);
    let trusted = Instant::now();
    resume_to_success(&rg, &id, "w2's new host key checked").await;
    eprintln!(
        "recovery: the resumed run succeeded {:?} after the key was trusted",
        trusted.elapsed()
    );
    assert_upgraded_once(&ground, "1.34.5");
    assert!(kubelet_restarted_on_the_new_binary(ground.node("w2")));
}

// ---- A full disk ----

/// `PRAGMA integrity_check` of the SQLite file at `path`, opened read-only beside rollgate.
fn integrity(path: &std::path::Path) -> String {
    let db =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    db.query_row("PRAGMA integrity_check", [], |r| r.get::<_, String>(0))
        .expect("integrity_check")
}

#[tokio::test]
async fn a_full_disk_under_data_dir_refuses_intake_holds_the_run_and_it_carries_on_once_freed() {
    let ground = Ground::start("1.34.2", 3).await;
    let disk = SmallDisk::mount(48);
    let data = disk.join("data");
    let rg = ground
        .rollgate(&[
            ("ROLLGATE__DATA_DIR", data.display().to_string()),
            ("ROLLGATE__QUEUE__MIN_FREE_BYTES", (4u64 << 20).to_string()),
        ])
        .await;
    // An alert notification accepted before the disk fills stays accepted.
    let (status, body) = rg
        .post("/v1/alerts", &support::resolved("beforefull"))
        .await;
    assert_eq!(status, 202, "{body}");
    ground.node("w2").hold_kubeadm();
    let id = rg.detect("1.34.5", "patch").await;
    kubeadm_started(&ground, "w2").await;
    // Something else fills the disk. The store's write-ahead log has not wrapped yet (it
    // does at 4 MiB), so its next commit needs new blocks.
    let wal = std::fs::metadata(data.join("store.db-wal")).map_or(0, |m| m.len());
    assert!(wal < 4 << 20, "the WAL is {wal} bytes");
    disk.fill();

    // Intake refuses with 503 and Retry-After, naming the disk, and keeps nothing.
    let refused = rg
        .http
        .post(format!("{}/v1/alerts", rg.base()))
        .bearer_auth(&rg.token)
        .json(&support::resolved("whilefull"))
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.expect("json");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the disk under") && message.contains("nothing was accepted"),
        "{message}"
    );
    let (ready, _) = rg.get("/readyz").await;
    assert_eq!(ready, 503);

    // w2's script ends while the store cannot take it: the run holds, and rollgate says why.
    ground.node("w2").release_kubeadm();
    let ready = eventually(
        "readyz to say the store's writes fail",
        Duration::from_secs(60),
        || async {
            let (_, ready) = rg.get("/readyz").await;
            ready["writes"]
                .as_str()
                .is_some_and(|w| w.contains("full"))
                .then_some(ready)
        },
    )
    .await;
    assert!(
        ready["disk"]
            .as_str()
            .unwrap_or_default()
            .contains("below queue.min_free_bytes"),
        "{ready}"
    );
    let held = rg.run(&id).await;
    assert_eq!(held["status"], "running", "{}", said(&held));
    let upgrade = find_step(&held, "workers/upgrade@w2").expect("upgrade@w2");
    assert_ne!(upgrade["status"], "done", "{upgrade}");
    assert_ne!(
        ground.api.node("w1")["spec"]["unschedulable"],
        json!(true),
        "w1 was touched while the store could not record it"
    );

    disk.unfill();
    let freed = Instant::now();
    rg.wait_run_until(
        &id,
        "w2's upgrade to be recorded",
        Duration::from_secs(120),
        |run| find_step(run, "workers/upgrade@w2").is_some_and(|s| s["status"] == "done"),
    )
    .await;
    eprintln!(
        "the held outcome was written {:?} after the disk was freed",
        freed.elapsed()
    );
    rg.wait_status(&id, "succeeded", Duration::from_secs(120))
        .await;
    assert_upgraded_once(&ground, "1.34.5");
    let (ready, body) = rg.get("/readyz").await;
    assert_eq!(ready, 200, "{body}");
    // Nothing accepted was lost; nothing refused was kept.
    let board = support::board(&rg).await;
    assert!(board.contains_key("beforefull"), "{board:?}");
    assert!(!board.contains_key("whilefull"), "{board:?}");
    for db in ["store.db", "queue.db"] {
        assert_eq!(integrity(&data.join(db)), "ok", "{db}");
    }
}

#[tokio::test]
async fn an_etcd_snapshot_that_cannot_be_written_fails_the_preflight_and_touches_no_node() {
    let ground = Ground::start("1.34.2", 3).await;
    let disk = SmallDisk::mount(1);
    disk.fill();
    let rg = ground
        .rollgate(&[
            (
                "ROLLGATE__ETCD__SNAPSHOT_DIR",
                disk.join("snapshots").display().to_string(),
            ),
            ("ROLLGATE__WORKER__MAX_ATTEMPTS", "2".into()),
        ])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_status(&id, "halted", Duration::from_secs(120))
        .await;
    let snapshot = run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == "etcd-snapshot")
        .expect("the snapshot step");
    assert_eq!(snapshot["status"], "failed", "{}", said(&run));
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("snapshot"), "{reason}");
    // Nothing was touched: no cordon, no eviction, no package; no partial file left.
    ground.assert_nothing_drained();
    ground.assert_nothing_installed();
    let left: Vec<_> = std::fs::read_dir(disk.join("snapshots"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    // Space freed, a resume takes the snapshot and completes the run.
    disk.unfill();
    resume_to_success(&rg, &id, "space freed under the snapshot dir").await;
    assert_upgraded_once(&ground, "1.34.5");
}

// ---- An etcd member frozen during an etcd roll ----

/// An etcd roll under way: three members as a StatefulSet's pods (etcd-0 leading), a
/// quiet Prometheus for the gate, `rollgate serve`, and a witness of the raft terms.
struct Rolling {
    sts: EtcdStatefulSet,
    _target: MiniServer,
    _prom: Prometheus,
    rg: Rollgate,
    witness: RaftWitness,
    /// The roll's run.
    id: String,
}

impl Rolling {
    /// Starts the roll, each member to be ready within `ready_secs`.
    async fn start(ready_secs: u64) -> Self {
        let sts = EtcdStatefulSet::start(3, 0).await;
        let target = MiniServer::start().await;
        target.set_metrics(&support::ground::quiet_metrics());
        let prom = Prometheus::start(&target.address()).await;
        let rg = serve_rolls(&sts, &prom).await;
        let witness = RaftWitness::start(sts.cluster.etcd()).await;
        let id = roll(&rg, &sts, ready_secs).await;
        Self {
            sts,
            _target: target,
            _prom: prom,
            rg,
            witness,
            id,
        }
    }
}

/// Waits until the roll `id` has done its step `name` (`etcd-restart`, `etcd-ready`) of
/// `member`.
async fn roll_step_done(rg: &Rollgate, id: &str, name: &str, member: &str) {
    rg.wait_run_until(
        id,
        &format!("{name} of {member}"),
        Duration::from_secs(120),
        |run| roll_steps(run, name).any(|s| s["node"] == member && s["status"] == "done"),
    )
    .await;
}
/// `rollgate serve` for etcd rolls of `sts`, its gate on a quiet Prometheus.
async fn serve_rolls(sts: &EtcdStatefulSet, prom: &Prometheus) -> Rollgate {
    let kubeconfig = sts.kubeconfig.display().to_string();
    let url = prom.url();
    Rollgate::start(&[
        ("ROLLGATE__CLUSTER__KUBECONFIG", kubeconfig.as_str()),
        ("ROLLGATE__GATE__PROMETHEUS_URL", url.as_str()),
        ("ROLLGATE__GATE__POLL_INTERVAL", "300ms"),
        ("ROLLGATE__ETCD_ROLL__TIMEOUT", "2s"),
        ("ROLLGATE__ETCD_ROLL__TRANSFER_TIMEOUT", "3s"),
    ])
    .await
}

/// Asks for the roll of `sts` (members ready within `ready_secs`); the run's id.
async fn roll(rg: &Rollgate, sts: &EtcdStatefulSet, ready_secs: u64) -> String {
    let (status, body) = rg
        .post(
            "/v1/etcd-rolls",
            &json!({
                "statefulset": "etcd", "namespace": "default",
                "endpoints": sts.cluster.endpoints,
                "ready_timeout_secs": ready_secs, "cooldown_secs": 0
            }),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    body["run_id"].as_str().expect("run id").to_owned()
}

/// The etcd roll steps named `name` of `run`, with their member.
fn roll_steps<'a>(run: &'a Value, name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    run["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |s| s["name"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_member_frozen_while_leadership_moves_to_it_costs_still_one_leadership_change() {
    let Rolling {
        sts,
        rg,
        witness,
        id,
        _target,
        _prom,
    } = Rolling::start(30).await;
    // The followers etcd-2 and etcd-1 are restarted first. From etcd-1's restart on the
    // roll reads the pods slowly (the API server answers each after 2 s): the transfer's
    // look at the members (healthy) and its move lie that far apart, and the member the
    // move goes to freezes in between.
    roll_step_done(&rg, &id, "etcd-restart", "etcd-1").await;
    sts.api.inject(Fault::on(
        "GET",
        "/namespaces/default/pods/etcd-",
        Answer::Delay(Duration::from_secs(2)),
        Lasting::Until(Instant::now() + Duration::from_secs(40)),
    ));
    let run = rg
        .wait_run_until(&id, "the leadership move", Duration::from_secs(60), |run| {
            roll_steps(run, "etcd-transfer").any(|s| s["status"] == "running")
        })
        .await;
    let to = roll_steps(&run, "etcd-transfer")
        .find_map(|s| s["node"].as_str())
        .expect("the transfer's member")
        .to_owned();
    sts.cluster.freeze(&to);
    // Asked again right before the move, the member does not answer: the roll holds on it.
    let held = rg
        .wait_run_until(
            &id,
            "the roll to hold on the frozen member",
            Duration::from_secs(60),
            |run| {
                run["status"] == "halted"
                    || said(run).contains(&format!("unhealthy member(s): {to}"))
            },
        )
        .await;
    assert_ne!(held["status"], "halted", "{}", said(&held));
    // Looked at, or asked again right before the move, the member did not answer: no
    // move was made.
    let transfer = roll_steps(&held, "etcd-transfer")
        .next()
        .expect("the transfer");
    let outcome = transfer["outcome"].as_str().unwrap_or_default();
    assert!(
        outcome.starts_with("not moving leadership") && outcome.contains(&to),
        "{transfer}"
    );
    assert_eq!(
        sts.restarted(),
        ["etcd-2", "etcd-1"],
        "the old leader was restarted"
    );
    sts.cluster.thaw(&to);
    let thawed = Instant::now();
    let run = rg
        .wait_status(&id, "succeeded", Duration::from_secs(120))
        .await;
    eprintln!(
        "recovery: the roll succeeded {:?} after the thaw",
        thawed.elapsed()
    );
    // From etcd itself: one leadership change in the whole roll, whatever the move met.
    let seen = witness.stop().await;
    assert_eq!(seen.term_rise(), 1, "{seen:?}");
    assert_eq!(seen.leader_changes(), 1, "{seen:?}");
    assert_eq!(sts.restarted(), ["etcd-2", "etcd-1", "etcd-0"]);
    assert!(said(&run).contains("uncontrolled 0;"), "{}", said(&run));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_member_frozen_before_the_move_halts_the_roll_naming_it_and_resume_completes() {
    let Rolling {
        sts,
        rg,
        witness,
        id,
        _target,
        _prom,
    } = Rolling::start(5).await;
    // An alert closes the gate while etcd-2 comes back from its restart: the roll holds
    // at the gate before etcd-1's, with etcd-2 restarted and a candidate for the move.
    roll_step_done(&rg, &id, "etcd-restart", "etcd-2").await;
    let (status, body) = rg.post("/v1/alerts", &support::webhook("holdroll")).await;
    assert_eq!(status, 202, "{body}");
    roll_step_done(&rg, &id, "etcd-ready", "etcd-2").await;
    rg.wait_run(&id, "the gate before etcd-1 to hold", |run| {
        run["status"] == "waiting" && said(run).contains("gate")
    })
    .await;
    // etcd-2 stops answering, and the gate opens: with one of three members frozen,
    // restarting another would lose quorum, and the leader may not move either.
    sts.cluster.freeze("etcd-2");
    let (status, body) = rg.post("/v1/alerts", &support::resolved("holdroll")).await;
    assert_eq!(status, 202, "{body}");
    let run = rg.wait_status(&id, "halted", Duration::from_secs(60)).await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("etcd-2"), "{reason}");
    assert_eq!(
        sts.restarted(),
        ["etcd-2"],
        "restarted with a member frozen"
    );
    sts.cluster.thaw("etcd-2");
    let thawed = Instant::now();
    resume_to_success(&rg, &id, "etcd-2 answers again").await;
    eprintln!(
        "recovery: the resumed roll succeeded {:?} after the thaw",
        thawed.elapsed()
    );
    let seen = witness.stop().await;
    assert_eq!(seen.term_rise(), 1, "{seen:?}");
    assert_eq!(sts.restarted(), ["etcd-2", "etcd-1", "etcd-0"]);
}

// ---- The clock jumps ----

/// rollgate's wall clock, stepped at will: libfaketime (Debian's faketime) reads the
/// offset from a file; the monotonic clock is left alone, as NTP leaves it.
struct SteppedClock {
    file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SteppedClock {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("faketime");
        std::fs::write(&file, "+0").expect("offset");
        Self { file, _dir: dir }
    }

    /// The environment that runs rollgate on this clock.
    fn env(&self) -> Vec<(&'static str, String)> {
        let lib = support::FAKETIME_LIB;
        assert!(
            std::path::Path::new(lib).exists(),
            "{lib} is missing: apt-get install faketime"
        );
        vec![
            ("LD_PRELOAD", lib.to_owned()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.display().to_string()),
            ("FAKETIME_CACHE_DURATION", "1".to_owned()),
            ("DONT_FAKE_MONOTONIC", "1".to_owned()),
        ]
    }

    /// Steps the wall clock to `offset` from the true time (`+1h`, `+0`, `-2h`).
    fn step_to(&self, offset: &str) {
        std::fs::write(&self.file, offset).expect("offset");
    }

    /// Steps the wall clock to `offset` and waits until rollgate's own clock shows it
    /// (the `Date` of its answers `secs` from the true time, within 5 s); libfaketime
    /// reads the file again after a second.
    async fn step_and_see(&self, rg: &Rollgate, offset: &str, secs: i64) {
        self.step_to(offset);
        eventually(
            &format!("rollgate's clock at {offset}"),
            Duration::from_secs(20),
            || async {
                let answer = rg
                    .http
                    .get(format!("{}/healthz", rg.base()))
                    .send()
                    .await
                    .ok()?;
                let date = answer.headers().get("date")?.to_str().ok()?;
                let theirs = chrono::DateTime::parse_from_rfc2822(date).ok()?;
                let off = (theirs.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
                ((off - secs).abs() <= 5).then_some(())
            },
        )
        .await;
    }
}

/// When each node was cordoned and uncordoned, from the API server's own log.
fn cordon_times(ground: &Ground) -> Vec<(Instant, support::kube::Change)> {
    ground
        .api
        .lock()
        .changes
        .iter()
        .filter(|(_, c)| {
            matches!(
                c,
                support::kube::Change::Cordon(_) | support::kube::Change::Uncordon(_)
            )
        })
        .cloned()
        .collect()
}

/// The time from `node`'s uncordon to the next cordon: the soak between them.
fn soak_after(times: &[(Instant, support::kube::Change)], node: &str) -> Duration {
    let uncordoned = times
        .iter()
        .position(|(_, c)| matches!(c, support::kube::Change::Uncordon(n) if n == node))
        .unwrap_or_else(|| panic!("{node} never uncordoned: {times:?}"));
    let next = times[uncordoned + 1..]
        .iter()
        .find(|(_, c)| matches!(c, support::kube::Change::Cordon(_)))
        .unwrap_or_else(|| panic!("nothing cordoned after {node}: {times:?}"));
    next.0 - times[uncordoned].0
}

#[tokio::test]
async fn a_wall_clock_stepped_forward_and_back_an_hour_neither_shortens_nor_stretches_a_soak() {
    let ground = Ground::start("1.34.2", 3).await;
    let clock = SteppedClock::new();
    let soak = Duration::from_secs(8);
    let mut env = clock.env();
    env.push(("ROLLGATE__CLUSTER__SOAK", "8s".into()));
    let rg = ground.rollgate(&env).await;
    let id = rg.detect("1.34.5", "patch").await;
    let soaking = |node: &'static str| {
        move |run: &Value| {
            find_step(run, &format!("workers/soak@{node}"))
                .is_some_and(|s| s["status"] == "waiting" || s["status"] == "running")
        }
    };
    // Workers go w3, w2, w1. NTP steps the clock an hour forward while w3 soaks, and back
    // an hour while w2 soaks.
    rg.wait_run_until(&id, "w3 soaking", Duration::from_secs(120), soaking("w3"))
        .await;
    clock.step_and_see(&rg, "+1h", 3600).await;
    rg.wait_run_until(&id, "w2 soaking", Duration::from_secs(120), soaking("w2"))
        .await;
    // rollgate's clock did run an hour ahead: w2's soak started then, by its clock.
    let run = rg.run(&id).await;
    let started = find_step(&run, "workers/soak@w2")
        .and_then(|s| s["started_at"].as_str())
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .expect("w2's soak start");
    let ahead = started.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::minutes(59),
        "rollgate's clock is {ahead} ahead"
    );
    clock.step_and_see(&rg, "+0", 0).await;
    rg.wait_status(&id, "succeeded", Duration::from_secs(120))
        .await;
    assert_upgraded_once(&ground, "1.34.5");
    let times = cordon_times(&ground);
    for node in ["w3", "w2"] {
        let soaked = soak_after(&times, node);
        eprintln!("{node} soaked {soaked:?}");
        assert!(soaked >= soak, "{node}'s soak ended early: {soaked:?}");
        assert!(
            soaked < soak + Duration::from_secs(10),
            "{node}'s soak ran late: {soaked:?}"
        );
    }
}

#[tokio::test]
async fn a_wall_clock_stepped_back_out_of_the_window_starts_no_node_until_it_is_open_again() {
    let ground = Ground::start("1.34.2", 3).await;
    let clock = SteppedClock::new();
    // One daily window around the true time now: open from 10 s ago for 20 minutes.
    let t0 = chrono::Utc::now();
    let at = |secs: i64| {
        (t0 + chrono::Duration::seconds(secs))
            .format("%H:%M:%S")
            .to_string()
    };
    let mut env = clock.env();
    env.push((
        "ROLLGATE__SCHEDULE__WINDOWS",
        format!("{}-{} UTC", at(-10), at(1200)),
    ));
    let rg = ground.rollgate(&env).await;
    ground.node("w3").hold_kubeadm();
    let id = rg.detect("1.34.5", "patch").await;
    kubeadm_started(&ground, "w3").await;
    // w3 is in hand when NTP steps the clock back an hour, before the window's opening.
    clock.step_and_see(&rg, "-1h", -3600).await;
    ground.node("w3").release_kubeadm();
    let run = rg
        .wait_run_until(
            &id,
            "w2's gate to wait for the window",
            Duration::from_secs(120),
            |run| {
                run["status"] == "waiting"
                    && run["reason"]
                        .as_str()
                        .is_some_and(|t| t.contains("outside the maintenance windows"))
            },
        )
        .await;
    // w3, in hand, finished; nothing else was started.
    assert_eq!(
        find_step(&run, "workers/uncordon@w3").map(|s| &s["status"]),
        Some(&json!("done"))
    );
    assert_eq!(
        ground.cordon_order(),
        ["cp", "w3"],
        "a node started outside the window"
    );
    // The clock comes right: the window is open by it again, and the run goes on at once.
    clock.step_to("+0");
    let stepped = Instant::now();
    rg.wait_status(&id, "succeeded", Duration::from_secs(120))
        .await;
    assert_upgraded_once(&ground, "1.34.5");
    let times = cordon_times(&ground);
    let w2 = times
        .iter()
        .find(|(_, c)| matches!(c, support::kube::Change::Cordon(n) if n == "w2"))
        .map(|(at, _)| *at)
        .expect("w2 cordoned");
    assert!(w2 > stepped, "w2 started before the clock was right again");
    eprintln!("w2 started {:?} after the clock came right", w2 - stepped);
    assert!(
        w2 - stepped < Duration::from_secs(15),
        "the wake for the opening came late"
    );
}

/// Issue 40: `rollgate serve` with its output appended to a file on the disk that fills
/// (as a VM's unit runs it), its data_dir on the same disk. Under alert load it answers
/// 202, then 503 once the disk is short, and never stops: a log line that cannot be
/// written is dropped and counted. Freed, the disk takes events again.
#[tokio::test]
async fn a_full_disk_under_the_log_drops_lines_and_never_stops_the_service() {
    let disk = SmallDisk::mount(48);
    let data = disk.join("data").display().to_string();
    let mut rg = Rollgate::start_logging_in(
        &disk.join("log"),
        &[
            ("ROLLGATE__DATA_DIR", data.as_str()),
            ("ROLLGATE__QUEUE__MIN_FREE_BYTES", "4194304"),
        ],
    )
    .await;
    async fn post(rg: &Rollgate, i: usize) -> u16 {
        rg.post("/v1/alerts", &support::webhook(&format!("load{i:012}")))
            .await
            .0
    }
    for i in 0..20 {
        assert_eq!(post(&rg, i).await, 202);
    }
    disk.fill();
    // The filler takes whole pages: the last page of the log file still has room. Fill
    // it too, so that the next line written finds the disk full.
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(disk.join("log/serve-1.log"))
        .expect("the log");
    while std::io::Write::write_all(&mut log, b"#").is_ok() {}
    let mut answers = std::collections::BTreeMap::<u16, usize>::new();
    for round in 0..50 {
        let statuses =
            futures_util::future::join_all((0..8).map(|k| post(&rg, 1000 + round * 8 + k))).await;
        for status in statuses {
            *answers.entry(status).or_default() += 1;
        }
    }
    assert_eq!(
        answers.keys().copied().collect::<Vec<_>>(),
        [503],
        "a full disk refuses every event and answers every request: {answers:?}"
    );
    assert_eq!(rg.exited(), None, "serve stopped:\n{}", rg.logs());
    let (health, _) = rg.get("/healthz").await;
    assert_eq!(health, 200);
    let dropped = rg.metric("rollgate_log_lines_dropped_total").await;
    assert!(dropped >= 1.0, "no log line was dropped: {dropped}");

    disk.unfill();
    support::eventually("an event taken again", Duration::from_secs(20), || async {
        (post(&rg, 9999).await == 202).then_some(())
    })
    .await;
    assert_eq!(rg.exited(), None);
}

/// Issue 40: pre-upgrade snapshots do not pile up. Seven runs (pre-flight and snapshot
/// only) leave the newest five (`etcd.snapshot_keep`), the ones the last five runs name,
/// and a file rollgate did not write stays. Then the disk fills: the next run halts at its
/// snapshot naming the directory and what is free, before any node is touched.
#[tokio::test]
async fn seven_snapshots_leave_five_and_a_snapshot_dir_without_room_halts_before_any_node() {
    let ground = Ground::start("1.34.2", 2).await;
    let disk = SmallDisk::mount(4);
    let dir = disk.join("snapshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("manual-backup.db"), b"the operator's").unwrap();
    let rg = ground
        .rollgate(&[
            ("ROLLGATE__ETCD__SNAPSHOT_DIR", dir.display().to_string()),
            ("ROLLGATE__ETCD__SNAPSHOT_KEEP", "5".into()),
            ("ROLLGATE__WORKER__MAX_ATTEMPTS", "2".into()),
        ])
        .await;
    let mut taken = Vec::new();
    for _ in 0..7 {
        // Snapshot names carry the second they were taken in.
        let after = chrono::Utc::now().timestamp();
        eventually("the next second", Duration::from_secs(2), || async {
            (chrono::Utc::now().timestamp() > after).then_some(())
        })
        .await;
        let (status, body) = rg
            .post(
                "/v1/detections",
                &json!({"target_version": "1.34.5", "kind": "patch", "stages": "preflight,snapshot"}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        let id = body["run_id"].as_str().unwrap().to_owned();
        let run = rg
            .wait_status(&id, "succeeded", Duration::from_secs(120))
            .await;
        let outcome =
            find_step(&run, "snapshot/etcd-snapshot").expect("the snapshot step")["outcome"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
        let path = outcome
            .strip_prefix("snapshot ")
            .and_then(|o| o.split_once(' '))
            .map(|(p, _)| p.to_owned())
            .unwrap_or_else(|| panic!("{outcome}"));
        taken.push(path);
    }
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    left.sort();
    let mut want: Vec<String> = taken[2..].to_vec();
    want.push(dir.join("manual-backup.db").display().to_string());
    want.sort();
    assert_eq!(left, want, "taken: {taken:?}");
    ground.assert_nothing_installed();

    disk.fill();
    let id = rg.detect("1.34.5", "patch").await;
    let run = rg
        .wait_status(&id, "halted", Duration::from_secs(120))
        .await;
    let reason = run["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("{} has ", dir.display()))
            && reason.contains(" free; the last snapshot took "),
        "{reason}"
    );
    assert_eq!(
        find_step(&run, "snapshot/etcd-snapshot").unwrap()["attempts"],
        1,
        "refused at once, not retried"
    );
    ground.assert_nothing_drained();
    ground.assert_nothing_installed();
}
