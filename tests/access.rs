//! Least privilege at the API: one token per client with its scopes, the audit of who
//! did what, tokens rotated and revoked while rollgate runs.

mod support;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::clients::{CLIENTS, clients_dir, token_of, write_token};
use support::cluster::IntakeCluster;
use support::{Rollgate, eventually, webhook};

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
    // The worker's log of each notification names the client it came from.
    eventually(
        "the notification logged with its client",
        Duration::from_secs(10),
        || async {
            rg.logs()
                .contains("source=rollgate/api/alertmanager")
                .then_some(())
        },
    )
    .await;
    drop(dir);
}

#[tokio::test]
async fn a_replaced_token_file_rotates_within_a_second_and_a_removed_one_revokes() {
    let (dir, env) = clients_dir();
    let rg = Rollgate::start(&borrowed(&env)).await;
    let old = token_of("viewer");
    let (status, _) = send(&rg, "GET", "/v1/runs", None, Some(old)).await;
    assert_eq!(status, 200);
    // A stream opened with the old token, read until it ends.
    let mut stream = reqwest::Client::new()
        .get(format!("{}/v1/events", rg.base()))
        .bearer_auth(old)
        .send()
        .await
        .expect("the event stream");
    assert_eq!(stream.status().as_u16(), 200);
    let first = stream.chunk().await.expect("a frame");
    assert!(first.is_some(), "the stream opened");
    let ended = tokio::spawn(async move {
        while let Ok(Some(_)) = stream.chunk().await {}
        Instant::now()
    });

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
    // The old token's open stream ends too: a rotation is not a reconnect away.
    let ended = tokio::time::timeout(Duration::from_secs(5), ended)
        .await
        .expect("the old token's stream ended")
        .expect("reader");
    eprintln!(
        "the old token's stream ended {:?} after the rotation",
        ended.saturating_duration_since(rotated)
    );

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

/// A run asked for by the detector, once its gate holds it (the intake cluster has no
/// Prometheus: the gate is unknown, closed).
async fn held_run(rg: &Rollgate) -> String {
    let (status, accepted) = send(
        rg,
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
    id
}

#[tokio::test]
async fn the_history_names_who_asked_for_the_run_who_halted_it_and_who_resumed_it() {
    let cluster = IntakeCluster::start().await;
    let (dir, env) = clients_dir();
    let mut rg = cluster.rollgate(&borrowed(&env)).await;
    rg.token = token_of("viewer").to_owned();

    let id = held_run(&rg).await;

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

#[tokio::test]
async fn rollgate_runs_with_a_read_token_lists_and_shows_but_controls_nothing() {
    let cluster = IntakeCluster::start().await;
    let (dir, env) = clients_dir();
    let mut rg = cluster.rollgate(&borrowed(&env)).await;
    rg.token = token_of("viewer").to_owned();
    let id = held_run(&rg).await;

    let cli = |client: &str, args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"));
        command
            .arg("runs")
            .arg("--token-file")
            .arg(dir.path().join(client))
            .args(args)
            .env("ROLLGATE__SERVER__LISTEN", format!("127.0.0.1:{}", rg.port))
            .env("ROLLGATE__DATA_DIR", rg.data_dir());
        command.output().expect("rollgate runs")
    };
    let list = cli("viewer", &["list"]);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(String::from_utf8_lossy(&list.stdout).contains(&id));
    let show = cli("viewer", &["show", &id]);
    assert!(show.status.success());
    for action in ["halt", "abort"] {
        let refused = cli("viewer", &[action, &id]);
        assert!(!refused.status.success(), "{action} with a read token");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains("403") && stderr.contains("lacks scope runs:control"),
            "{stderr}"
        );
    }
    // The Alertmanager's token cannot even look.
    let looked = cli("alertmanager", &["list"]);
    assert!(!looked.status.success());
    assert!(String::from_utf8_lossy(&looked.stderr).contains("lacks scope read"));
    // Nothing moved the run.
    let run = rg.run(&id).await;
    assert!(!run["history"].to_string().contains("halt by"), "{run}");
    // An operator's token does.
    let halted = cli("alice", &["halt", &id, "--reason", "change freeze"]);
    assert!(
        halted.status.success(),
        "{}",
        String::from_utf8_lossy(&halted.stderr)
    );
    rg.wait_run(&id, "halted by alice", |r| {
        r["reason"] == "halt by alice: change freeze"
    })
    .await;
}

#[tokio::test]
async fn whoami_names_the_client_and_its_scopes_for_any_known_token() {
    let (dir, env) = clients_dir();
    let rg = Rollgate::start(&borrowed(&env)).await;
    for (name, token, scopes) in CLIENTS {
        let (status, me) = send(&rg, "GET", "/v1/whoami", None, Some(token)).await;
        assert_eq!(status, 200, "{name}: {me}");
        assert_eq!(me["client"], *name);
        let mut want: Vec<&str> = scopes.split(',').filter(|s| !s.is_empty()).collect();
        want.sort();
        let mut got: Vec<&str> = me["scopes"]
            .as_array()
            .expect("scopes")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        got.sort();
        assert_eq!(got, want, "{name}");
    }
    let (status, _) = send(
        &rg,
        "GET",
        "/v1/whoami",
        None,
        Some("not-a-known-token-at-all"),
    )
    .await;
    assert_eq!(status, 401);
    drop(dir);
}

#[test]
fn check_config_lists_the_clients_with_their_scopes_and_names_a_bad_token_file() {
    let (dir, env) = clients_dir();
    let check = || support::check_config(dir.path(), &env);
    let good = check();
    let text = String::from_utf8_lossy(&good.stdout);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(
        text.contains("clients     alertmanager (alerts:write), alice (runs:control, read), bob"),
        "{text}"
    );
    assert!(
        text.contains("viewer (read)") && text.contains("nobody ()"),
        "{text}"
    );
    assert!(text.contains("tls         off (plain HTTP)"), "{text}");

    write_token(dir.path(), "alice", "short");
    let bad = check();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("alice") && err.contains("shorter than 16"),
        "{err}"
    );
    assert!(
        !err.contains("short\n") && !err.contains(": short"),
        "the token is shown: {err}"
    );
}
