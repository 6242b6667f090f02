//! Least privilege at the API: one token per client with its scopes, the audit of who
//! did what, tokens rotated and revoked while rollgate runs.

mod support;

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use support::cluster::IntakeCluster;
use support::{Rollgate, eventually, webhook};

/// The clients of these tests: name, token, scopes (as configured).
const CLIENTS: &[(&str, &str, &str)] = &[
    ("alertmanager", "am-0123456789abcdef", "alerts:write"),
    ("detector", "det-0123456789abcdef", "detections:write"),
    ("roller", "roll-0123456789abcdef", "etcd-rolls:write"),
    ("alice", "alice-0123456789abcdef", "runs:control,read"),
    ("bob", "bob-0123456789abcdef", "runs:control,read"),
    ("viewer", "view-0123456789abcdef", "read"),
    ("nobody", "nobody-0123456789abcdef", ""),
];

fn token_of(name: &str) -> &'static str {
    CLIENTS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, t, _)| *t)
        .expect("known client")
}

/// Writes a token file the way a Secret volume update lands: a new file renamed over.
fn write_token(dir: &Path, name: &str, token: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, format!("{token}\n")).expect("write token");
    std::fs::rename(&tmp, dir.join(name)).expect("rename token");
}

/// A tokens directory with every client of [`CLIENTS`], and the settings naming it.
fn clients_dir() -> (tempfile::TempDir, Vec<(String, String)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut env = vec![(
        "ROLLGATE__SERVER__TOKENS_DIR".to_owned(),
        dir.path().display().to_string(),
    )];
    for (name, token, scopes) in CLIENTS {
        write_token(dir.path(), name, token);
        if !scopes.is_empty() {
            env.push((
                format!("ROLLGATE__SERVER__SCOPES__{}", name.to_uppercase()),
                (*scopes).to_owned(),
            ));
        }
    }
    (dir, env)
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

async fn send(
    rg: &Rollgate,
    method: &str,
    path: &str,
    body: Option<&Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let url = format!("{}{path}", rg.base());
    let mut req = match method {
        "GET" => rg.http.get(url),
        _ => rg.http.post(url),
    };
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(body);
    }
    let r = req.send().await.expect("answer");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Every event counted as queued, of every type.
async fn queued(rg: &Rollgate) -> f64 {
    rg.metrics_text()
        .await
        .lines()
        .filter(|l| l.starts_with("rollgate_events_queued_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The routes under `/v1`, each with a body that would be taken, and the scope it needs.
fn routes() -> Vec<(&'static str, String, Option<Value>, &'static str)> {
    vec![
        (
            "POST",
            "/v1/alerts".into(),
            Some(webhook("fa01")),
            "alerts:write",
        ),
        ("GET", "/v1/alerts".into(), None, "read"),
        (
            "POST",
            "/v1/detections".into(),
            Some(json!({"target_version": "1.34.6", "kind": "patch"})),
            "detections:write",
        ),
        (
            "POST",
            "/v1/etcd-rolls".into(),
            Some(
                json!({"statefulset": "etcd", "namespace": "db", "endpoints": ["http://127.0.0.1:1"]}),
            ),
            "etcd-rolls:write",
        ),
        ("GET", "/v1/gates".into(), None, "read"),
        ("GET", "/v1/runs".into(), None, "read"),
        ("GET", "/v1/runs/no-such-run".into(), None, "read"),
        (
            "POST",
            "/v1/runs/no-such-run/halt".into(),
            Some(json!({})),
            "runs:control",
        ),
        (
            "POST",
            "/v1/runs/no-such-run/resume".into(),
            Some(json!({})),
            "runs:control",
        ),
        (
            "POST",
            "/v1/runs/no-such-run/abort".into(),
            Some(json!({})),
            "runs:control",
        ),
    ]
}

#[tokio::test]
async fn every_route_answers_each_scope_allowed_403_naming_it_or_401_and_refusals_queue_nothing() {
    let (dir, env) = clients_dir();
    let mut rg = Rollgate::start(&borrowed(&env)).await;
    assert!(
        rg.token.is_empty(),
        "tokens_dir alone must not create an all-scopes token"
    );
    rg.token = token_of("viewer").to_owned();

    // First every refusal, and nothing may be queued by them.
    let mut refusals = 0;
    for (method, path, body, scope) in routes() {
        for (name, token, scopes) in CLIENTS {
            if scopes.split(',').any(|s| s == scope) {
                continue;
            }
            let (status, answer) = send(&rg, method, &path, body.as_ref(), Some(token)).await;
            assert_eq!(status, 403, "{name} {method} {path}: {answer}");
            assert_eq!(answer["missing_scope"], scope, "{name} {method} {path}");
            assert!(
                answer["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(scope) && m.contains(name)),
                "{answer}"
            );
            refusals += 1;
        }
        for token in [None, Some("not-a-known-token-at-all"), Some("")] {
            let (status, answer) = send(&rg, method, &path, body.as_ref(), token).await;
            assert_eq!(status, 401, "{token:?} {method} {path}: {answer}");
        }
    }
    assert!(refusals >= 40, "only {refusals} refusals tried");
    assert_eq!(queued(&rg).await, 0.0, "a refused request queued an event");
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs.as_array().map(Vec::len), Some(0), "{runs}");

    // Then every allowed pair gets past the check (what the route itself says is its own).
    for (method, path, body, scope) in routes() {
        for (name, token, scopes) in CLIENTS {
            if !scopes.split(',').any(|s| s == scope) {
                continue;
            }
            let (status, answer) = send(&rg, method, &path, body.as_ref(), Some(token)).await;
            assert!(
                status != 401 && status != 403,
                "{name} {method} {path}: {status} {answer}"
            );
        }
    }
    // The Alertmanager token feeds the gate and nothing else.
    let (status, _) = send(
        &rg,
        "POST",
        "/v1/alerts",
        Some(&webhook("fa02")),
        Some(token_of("alertmanager")),
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(
        rg.metric("rollgate_http_requests_total{client=\"alertmanager\",code=\"202\",method=\"POST\",route=\"/v1/alerts\"}")
            .await,
        2.0
    );
    let unauthenticated: f64 = rg
        .metrics_text()
        .await
        .lines()
        .filter(|l| l.starts_with("rollgate_http_requests_total{client=\"-\",code=\"401\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(unauthenticated >= 30.0, "401s counted: {unauthenticated}");
    drop(dir);
}

#[tokio::test]
async fn a_replaced_token_file_rotates_within_a_second_and_a_removed_one_revokes() {
    let (dir, env) = clients_dir();
    let rg = Rollgate::start(&borrowed(&env)).await;
    let old = token_of("viewer");
    let (status, _) = send(&rg, "GET", "/v1/runs", None, Some(old)).await;
    assert_eq!(status, 200);

    let new = "view-rotated-0123456789";
    write_token(dir.path(), "viewer", new);
    let rotated = Instant::now();
    eventually(
        "the new token accepted, the old refused",
        Duration::from_secs(1),
        || async {
            let (new_status, _) = send(&rg, "GET", "/v1/runs", None, Some(new)).await;
            let (old_status, _) = send(&rg, "GET", "/v1/runs", None, Some(old)).await;
            (new_status == 200 && old_status == 401).then_some(())
        },
    )
    .await;
    eprintln!("rotation seen after {:?}", rotated.elapsed());

    std::fs::remove_file(dir.path().join("viewer")).expect("remove");
    eventually(
        "the removed client refused",
        Duration::from_secs(1),
        || async {
            let (status, _) = send(&rg, "GET", "/v1/runs", None, Some(new)).await;
            (status == 401).then_some(())
        },
    )
    .await;
    // The others were never affected.
    let (status, _) = send(&rg, "GET", "/v1/runs", None, Some(token_of("alice"))).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn the_history_names_who_asked_for_the_run_who_halted_it_and_who_resumed_it() {
    let cluster = IntakeCluster::start().await;
    let (dir, env) = clients_dir();
    let mut rg = cluster.rollgate(&borrowed(&env)).await;
    rg.token = token_of("viewer").to_owned();

    let (status, accepted) = send(
        &rg,
        "POST",
        "/v1/detections",
        Some(&json!({"target_version": "1.34.6", "kind": "patch"})),
        Some(token_of("detector")),
    )
    .await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["run_id"].as_str().expect("run id").to_owned();
    rg.wait_run(&id, "held at its gate", support::held_at_preflight_gate)
        .await;

    let (status, body) = send(
        &rg,
        "POST",
        &format!("/v1/runs/{id}/halt"),
        Some(&json!({"reason": "change freeze"})),
        Some(token_of("alice")),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    rg.wait_run(&id, "halted", |r| r["status"] == "halted")
        .await;
    let (status, body) = send(
        &rg,
        "POST",
        &format!("/v1/runs/{id}/resume"),
        Some(&json!({"reason": "freeze over"})),
        Some(token_of("bob")),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let run = rg
        .wait_run(&id, "resumed", |r| {
            r["history"]
                .as_array()
                .is_some_and(|h| h.iter().any(|t| t["by"] == "bob"))
        })
        .await;
    let history = run["history"].as_array().expect("history");
    let by = |who: &str| -> Vec<&Value> { history.iter().filter(|t| t["by"] == who).collect() };
    assert_eq!(
        by("detector").first().map(|t| &t["to"]),
        Some(&json!("queued")),
        "{run}"
    );
    let halted = by("alice");
    assert!(
        halted
            .iter()
            .any(|t| t["to"] == "halted" && t["reason"] == "halt by alice: change freeze"),
        "{run}"
    );
    let resumed = by("bob");
    assert!(
        resumed
            .iter()
            .any(|t| t["from"] == "halted" && t["reason"] == "resume by bob: freeze over"),
        "{run}"
    );
    // Steps rollgate took on its own are nobody's.
    assert!(history.iter().any(|t| t.get("by").is_none()), "{run}");
    let logs = rg.logs();
    for line in ["client=alice", "client=bob"] {
        assert!(logs.contains(line), "the log does not name {line}");
    }
    drop(dir);
}
