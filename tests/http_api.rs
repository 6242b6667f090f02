//! The HTTP contract against a real `rollgate serve` on the embedded queue.

mod support;

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use support::cluster::IntakeCluster;
use support::{Rollgate, detection, webhook};

const PAUSED: (&str, &str) = ("ROLLGATE__WORKER__PAUSED", "true");

async fn depth(rg: &Rollgate) -> f64 {
    rg.metric("rollgate_queue_depth").await
}

async fn raw(
    rg: &Rollgate,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    token: Option<&str>,
) -> (u16, Value) {
    let mut req = rg
        .http
        .post(format!("{}{path}", rg.base()))
        .header("content-type", content_type)
        .body(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// name, path, content type, body, token, expected status, expected error code.
type Case<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Vec<u8>,
    Option<&'a str>,
    u16,
    &'a str,
);

#[tokio::test]
async fn every_bad_input_class_gets_its_code_and_queues_nothing() {
    let rg = Rollgate::start(&[PAUSED, ("ROLLGATE__SERVER__MAX_BODY_BYTES", "4096")]).await;
    let token = rg.token.clone();
    let json_ct = "application/json";
    let big = serde_json::to_vec(
        &json!({"target_version": "1.34.5", "kind": "patch", "pad": "x".repeat(5000)}),
    )
    .unwrap();
    let mut webhook_v3 = webhook("aa01");
    webhook_v3["version"] = json!("3");
    let mut webhook_bad_time = webhook("aa02");
    webhook_bad_time["alerts"][0]["startsAt"] = json!("yesterday");
    let cases: Vec<Case> = vec![
        (
            "missing token",
            "/v1/detections",
            json_ct,
            serde_json::to_vec(&detection("1.34.5")).unwrap(),
            None,
            401,
            "unauthorized",
        ),
        (
            "wrong token",
            "/v1/detections",
            json_ct,
            serde_json::to_vec(&detection("1.34.5")).unwrap(),
            Some("not-the-token-at-all"),
            401,
            "unauthorized",
        ),
        (
            "wrong token, alerts",
            "/v1/alerts",
            json_ct,
            serde_json::to_vec(&webhook("aa03")).unwrap(),
            Some("x"),
            401,
            "unauthorized",
        ),
        (
            "unparsable",
            "/v1/detections",
            json_ct,
            b"{\"target_version\": ".to_vec(),
            Some(&token),
            400,
            "malformed_json",
        ),
        (
            "unparsable alerts",
            "/v1/alerts",
            json_ct,
            b"[{,]".to_vec(),
            Some(&token),
            400,
            "malformed_json",
        ),
        (
            "too big",
            "/v1/detections",
            json_ct,
            big,
            Some(&token),
            413,
            "payload_too_large",
        ),
        (
            "not json",
            "/v1/detections",
            "text/plain",
            b"target_version=1.34.5".to_vec(),
            Some(&token),
            415,
            "unsupported_media_type",
        ),
        (
            "no content type",
            "/v1/alerts",
            "",
            serde_json::to_vec(&webhook("aa04")).unwrap(),
            Some(&token),
            415,
            "unsupported_media_type",
        ),
        (
            "short version",
            "/v1/detections",
            json_ct,
            serde_json::to_vec(&detection("1.34")).unwrap(),
            Some(&token),
            422,
            "invalid_request",
        ),
        (
            "shell in version",
            "/v1/detections",
            json_ct,
            serde_json::to_vec(&detection("1.34.5;reboot")).unwrap(),
            Some(&token),
            422,
            "invalid_request",
        ),
        (
            "subshell in version",
            "/v1/detections",
            json_ct,
            serde_json::to_vec(&detection("1.34.$(id)")).unwrap(),
            Some(&token),
            422,
            "invalid_request",
        ),
        (
            "bad kind",
            "/v1/detections",
            json_ct,
            serde_json::to_vec(&json!({"target_version": "1.34.5", "kind": "major"})).unwrap(),
            Some(&token),
            422,
            "invalid_request",
        ),
        (
            "unknown stage",
            "/v1/detections",
            json_ct,
            serde_json::to_vec(
                &json!({"target_version": "1.34.5", "kind": "patch", "stages": "preflight,reboot"}),
            )
            .unwrap(),
            Some(&token),
            422,
            "invalid_request",
        ),
        (
            "webhook v3",
            "/v1/alerts",
            json_ct,
            serde_json::to_vec(&webhook_v3).unwrap(),
            Some(&token),
            422,
            "invalid_request",
        ),
        (
            "webhook bad time",
            "/v1/alerts",
            json_ct,
            serde_json::to_vec(&webhook_bad_time).unwrap(),
            Some(&token),
            422,
            "invalid_request",
        ),
    ];
    for (name, path, ct, body, tok, want, code) in cases {
        let (status, answer) = raw(&rg, path, ct, body, tok).await;
        assert_eq!(status, want, "{name}: {answer}");
        assert_eq!(answer["error"], code, "{name}: {answer}");
        let message = answer["message"].as_str().unwrap_or_default();
        assert!(
            message.len() > 10,
            "{name}: a message a person can act on: {answer}"
        );
        assert!(!message.contains(&token), "{name}: the token leaked");
        assert_eq!(depth(&rg).await, 0.0, "{name} queued something");
    }
    let (status, runs) = rg.get("/v1/runs").await;
    assert_eq!(
        (status, runs),
        (200, json!([])),
        "a rejected detection left a run behind"
    );

    // The same measure sees a good request: the checks above could have failed.
    let (status, body) = rg.post("/v1/alerts", &webhook("aa05")).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["alerts"], 1);
    assert_eq!(depth(&rg).await, 1.0);
}

#[tokio::test]
async fn a_second_detection_for_an_in_flight_target_returns_the_same_run() {
    let cluster = IntakeCluster::start().await;
    let rg = cluster.rollgate(&[]).await;
    let all = json!({"target_version": "1.34.5", "kind": "patch"});
    let (status, first) = rg.post("/v1/detections", &all).await;
    assert_eq!(status, 202, "{first}");
    let (status, second) = rg.post("/v1/detections", &all).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(first["run_id"], second["run_id"]);
    let run_id = first["run_id"].as_str().unwrap();
    let run = rg
        .wait_run(run_id, "the worker to take the run", |r| {
            r["status"] == "waiting"
        })
        .await;
    // Without Prometheus the pre-flight gate is unknown, which holds the run: fail closed.
    assert_eq!(
        run["reason"],
        "gate closed at step preflight/gate: gate unknown: no Prometheus configured (gate.prometheus_url)"
    );
    assert_eq!(run["steps"][0]["status"], "waiting");
    assert_eq!(
        run["steps"][1]["status"], "pending",
        "nothing after the gate ran"
    );
    let steps: Vec<&str> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["gate", "quiet-period", "plan"]);
    // The first run holds the cluster (waiting at its gate): another target is refused
    // at intake, naming it, and nothing is queued.
    let (status, other) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.35.0", "kind": "minor"}),
        )
        .await;
    assert_eq!(status, 409, "{other}");
    assert!(
        other["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&format!("run {run_id} (target 1.34.5) is waiting")),
        "{other}"
    );
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn with_no_cluster_configured_a_detection_is_refused_naming_the_keys() {
    let rg = Rollgate::start(&[]).await;
    let (status, body) = rg.post("/v1/detections", &detection("1.34.5")).await;
    assert_eq!(status, 422, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    for key in [
        "cluster.kubeconfig (or cluster.in_cluster)",
        "ssh.key_file",
        "ssh.known_hosts_file",
        "etcd.endpoints",
    ] {
        assert!(message.contains(key), "{key} not named: {message}");
    }
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs, json!([]), "nothing half-written");
    assert_eq!(depth(&rg).await, 0.0, "nothing queued");
}

fn path(run: &Value) -> Vec<(String, String)> {
    run["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["from"].as_str().unwrap_or("-").to_owned(),
                h["to"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn halt_resume_abort_move_a_run_through_its_statuses_with_history() {
    let cluster = IntakeCluster::start().await;
    let rg = cluster.rollgate(&[]).await;
    let (_, accepted) = rg
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.6", "kind": "patch"}),
        )
        .await;
    let id = accepted["run_id"].as_str().unwrap().to_owned();
    rg.wait_run(&id, "held at its gate", support::held_at_preflight_gate)
        .await;

    let (status, body) = rg.post(&format!("/v1/runs/{id}/resume"), &json!({})).await;
    assert_eq!(status, 409, "resume of a waiting run: {body}");
    let (status, body) = rg
        .post(
            &format!("/v1/runs/{id}/halt"),
            &json!({"reason": "change freeze"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let run = rg
        .wait_run(&id, "halted", |r| r["status"] == "halted")
        .await;
    assert_eq!(run["reason"], "halt by admin: change freeze");
    let (status, _) = rg.post(&format!("/v1/runs/{id}/halt"), &json!({})).await;
    assert_eq!(status, 409, "halting a halted run");

    let (status, _) = rg
        .post(
            &format!("/v1/runs/{id}/resume"),
            &json!({"reason": "freeze over"}),
        )
        .await;
    assert_eq!(status, 202);
    let run = rg
        .wait_run(&id, "resumed and held again", |r| {
            support::held_at_preflight_gate(r) && r["history"].as_array().unwrap().len() >= 6
        })
        .await;
    assert!(support::held_at_preflight_gate(&run), "{run}");

    let (status, _) = rg
        .post(
            &format!("/v1/runs/{id}/abort"),
            &json!({"reason": "superseded"}),
        )
        .await;
    assert_eq!(status, 202);
    let run = rg
        .wait_run(&id, "aborted", |r| r["status"] == "aborted")
        .await;
    let expected: Vec<(String, String)> = [
        ("-", "queued"),
        ("queued", "running"),
        ("running", "waiting"),
        ("waiting", "halted"),
        ("halted", "queued"),
        ("queued", "running"),
        ("running", "waiting"),
        ("waiting", "aborted"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(path(&run), expected);
    assert!(
        run["history"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["at"].is_string() && h["reason"].is_string())
    );
    for action in ["halt", "resume", "abort"] {
        let (status, body) = rg
            .post(&format!("/v1/runs/{id}/{action}"), &json!({}))
            .await;
        assert_eq!(status, 409, "{action} of an aborted run: {body}");
    }
    // Paged: the steps and transitions asked for, and where they sit in the whole.
    let whole = run["history"].as_array().unwrap().len();
    let (status, page) = rg
        .get(&format!(
            "/v1/runs/{id}?steps_from=1&steps_limit=2&history_last=2"
        ))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["steps"], json!(run["steps"].as_array().unwrap()[1..3]));
    assert_eq!(
        page["history"],
        json!(run["history"].as_array().unwrap()[whole - 2..])
    );
    assert_eq!(
        page["page"],
        json!({"steps_from": 1, "steps_total": run["steps"].as_array().unwrap().len(), "history_from": whole - 2, "history_total": whole})
    );
    let (status, page) = rg
        .get(&format!("/v1/runs/{id}?history_from=1&history_limit=1"))
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["history"], json!([run["history"][1]]));
    assert_eq!(
        page["steps"], run["steps"],
        "all steps when only the history is paged"
    );
    for bad in [
        "steps_limit=0",
        "history_limit=1001",
        "history_last=5&history_from=1",
    ] {
        let (status, body) = rg.get(&format!("/v1/runs/{id}?{bad}")).await;
        assert_eq!(status, 422, "{bad}: {body}");
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
    }
    let (status, _) = rg.post("/v1/runs/no-such-run/halt", &json!({})).await;
    assert_eq!(status, 404);
    let (status, _) = rg.post(&format!("/v1/runs/{id}/explode"), &json!({})).await;
    assert_eq!(status, 404);
    let (status, _) = rg.get("/v1/runs?status=sleeping").await;
    assert_eq!(status, 422);
    let (status, body) = rg.get("/v1/runs?status=aborted").await;
    assert_eq!((status, body.as_array().map(Vec::len)), (200, Some(1)));
}

#[tokio::test]
async fn health_readiness_metrics_and_openapi_answer() {
    let rg = Rollgate::start(&[]).await;
    let get = |p: &str| rg.http.get(format!("{}{p}", rg.base())).send();
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    let ready = get("/readyz").await.unwrap();
    assert_eq!(ready.status(), 200);
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["backend"], "embedded");
    let spec: Value = get("/openapi.json").await.unwrap().json().await.unwrap();
    for p in [
        "/v1/alerts",
        "/v1/detections",
        "/v1/runs",
        "/v1/runs/{id}",
        "/v1/runs/{id}/{action}",
    ] {
        assert!(
            spec["paths"][p].is_object(),
            "{p} missing from the API description"
        );
    }
    rg.post("/v1/alerts", &webhook("bb01")).await;
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    for name in [
        "rollgate_http_requests_total{client=\"admin\",code=\"202\",method=\"POST\",route=\"/v1/alerts\"}",
        "rollgate_events_queued_total{type=\"alerts\"}",
        "rollgate_queue_depth",
        "rollgate_runs{status=\"queued\"}",
    ] {
        assert!(metrics.contains(name), "{name} not in /metrics");
    }
    let (status, _) = rg.get("/no/such/route").await;
    assert_eq!(status, 404);
}

/// The API description is the request types' own: every example it documents is taken,
/// every request body the tests send matches it, and what the service refuses, it refuses.
#[tokio::test]
async fn the_api_description_matches_what_the_service_takes() {
    use support::openapi::{problems, request_schema, resolve};
    let rg = Rollgate::start(&[PAUSED]).await;
    let spec: Value = rg
        .http
        .get(format!("{}/openapi.json", rg.base()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut examples = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        let Some(schema) = item["post"]["requestBody"]["content"]["application/json"]["schema"]
            .as_object()
            .map(|_| &item["post"]["requestBody"]["content"]["application/json"]["schema"])
        else {
            continue;
        };
        let schema = resolve(&spec, schema);
        let Some(example) = schema.get("example") else {
            continue;
        };
        examples += 1;
        assert_eq!(
            problems(&spec, schema, example),
            Vec::<String>::new(),
            "{path}"
        );
        let (status, body) = rg.post(path, example).await;
        // Without a cluster an etcd roll, an upgrade and a reboot are refused for want of one, after
        // the body was read and found good.
        let refused_for = |why: &str| {
            status == 422 && body["message"].as_str().is_some_and(|m| m.starts_with(why))
        };
        let taken = matches!(status, 200 | 202)
            || (path == "/v1/etcd-rolls" && refused_for("etcd rolls need the Kubernetes API"))
            || (path == "/v1/detections" && refused_for("Kubernetes upgrades need"))
            || (path == "/v1/reboots" && refused_for("node reboots are not available here"));
        assert!(taken, "the documented example of {path}: {status} {body}");
    }
    assert!(examples >= 3, "documented examples: {examples}");

    let detections = request_schema(&spec, "/v1/detections");
    let rolls = request_schema(&spec, "/v1/etcd-rolls");
    let alerts = request_schema(&spec, "/v1/alerts");
    let sent = [
        (alerts, webhook("aa01")),
        (detections, detection("1.34.5")),
        (
            detections,
            json!({"target_version": "1.35.0", "kind": "minor", "dry_run": true}),
        ),
        (
            rolls,
            json!({"statefulset": "etcd", "namespace": "default",
                   "endpoints": ["http://127.0.0.1:2379"], "ready_timeout_secs": 20, "cooldown_secs": 0}),
        ),
    ];
    for (schema, body) in &sent {
        assert_eq!(
            problems(&spec, schema, body),
            Vec::<String>::new(),
            "{body}"
        );
    }
    // Optional fields are optional, required ones required, and unknown ones refused by
    // both the description and the service.
    let required: Vec<&str> = detections["required"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, ["target_version", "kind"]);
    for bad in [
        json!({"kind": "patch"}),
        json!({"target_version": "1.34.5", "kind": "patch", "reboot": true}),
        json!({"target_version": "1.34.5", "kind": "major"}),
        json!({"target_version": "1.34.5", "kind": "patch", "dry_run": "yes"}),
    ] {
        assert!(!problems(&spec, detections, &bad).is_empty(), "{bad}");
        let (status, _) = rg.post("/v1/detections", &bad).await;
        assert_eq!(status, 422, "{bad}");
    }
    let mut bad_label = webhook("aa02");
    bad_label["alerts"][0]["labels"]["node"] = json!(1);
    assert!(!problems(&spec, alerts, &bad_label).is_empty());
    let (status, _) = rg.post("/v1/alerts", &bad_label).await;
    assert_eq!(status, 422);
}

#[tokio::test]
async fn token_is_generated_private_and_never_logged_and_sigterm_exits_zero() {
    let mut rg = Rollgate::start(&[]).await;
    let token_file = rg.data_dir().join("api-token");
    let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(rg.token.len() >= 32);
    // A request in flight while SIGTERM arrives is still answered.
    let (status, _) = rg.post("/v1/alerts", &webhook("t001")).await;
    assert_eq!(status, 202);
    let status = rg.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");
    let logs = rg.logs();
    assert!(logs.contains("api-token"), "the token's path is logged");
    assert!(
        !logs.contains(&rg.token),
        "the token's value leaked into the log"
    );
    rg.restart().await;
    let same = std::fs::read_to_string(&token_file).unwrap();
    assert_eq!(same.trim(), rg.token, "the token survives a restart");
}

#[tokio::test]
async fn a_second_serve_on_the_same_data_dir_is_refused() {
    let rg = Rollgate::start(&[]).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("serve")
        .env("ROLLGATE__DATA_DIR", rg.data_dir())
        .env(
            "ROLLGATE__SERVER__LISTEN",
            format!("127.0.0.1:{}", support::free_port()),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another rollgate serve"));
}

#[tokio::test]
async fn check_config_reports_every_bad_value_at_once() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("check-config")
        .env("ROLLGATE__SERVER__LISTEN", "nowhere")
        .env("ROLLGATE__QUEUE__BACKEND", "kafka")
        .env("ROLLGATE__QUEUE__PREFETCH", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for key in ["server.listen", "queue.backend", "queue.prefetch"] {
        assert!(err.contains(key), "{key} not reported:\n{err}");
    }
    // A bad maintenance window is named, from the environment and from a file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rollgate.toml");
    std::fs::write(
        &file,
        "[[schedule.windows]]\ndays = [\"sat\", \"sun\"]\nstart = \"22:00\"\nend = \"06:00\"\n\n[[schedule.windows]]\ndays = \"mon-fri\"\nstart = \"02:00\"\nend = \"04:00\"\ntime_zone = \"Europe/Atlantis\"\n",
    )
    .unwrap();
    let budget_file = dir.path().join("budget.toml");
    std::fs::write(&budget_file, "[cluster]\nfailure_budget = 1.5\n").unwrap();
    let cases = [
        (
            vec![(
                "ROLLGATE__SCHEDULE__WINDOWS",
                "sat,sun 22:00-06:00; mon-fri 25:00-06:00 Europe/Berlin",
            )],
            None,
            "schedule.windows: window 2: window \"mon-fri 25:00-06:00 Europe/Berlin\": start \"25:00\" is not a time of day",
        ),
        (
            vec![("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "0")],
            None,
            "cluster.max_unavailable: \"0\" is not a count of workers",
        ),
        (
            vec![("ROLLGATE__CLUSTER__FAILURE_BUDGET", "-1")],
            None,
            "cluster.failure_budget: \"-1\" is not a count of workers (0, 1, 2, …) or a percentage of them (0% to 100%)",
        ),
        (
            vec![("ROLLGATE__CLUSTER__FAILURE_BUDGET", "one")],
            None,
            "cluster.failure_budget: \"one\" is not a count of workers",
        ),
        (
            vec![("ROLLGATE__CLUSTER__FAILURE_BUDGET", "150%")],
            None,
            "cluster.failure_budget: \"150%\" is not a count of workers",
        ),
        (
            vec![],
            Some(&budget_file),
            "cluster.failure_budget: \"1.5\" is not a count of workers",
        ),
        (
            vec![],
            Some(&file),
            "schedule.windows: window 2: window \"mon-fri 02:00-04:00 Europe/Atlantis\": time zone \"Europe/Atlantis\" is not a known IANA zone",
        ),
    ];
    for (env, config, want) in cases {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"));
        if let Some(config) = config {
            cmd.arg("--config").arg(config);
        }
        cmd.arg("check-config").envs(env);
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "{want} not in:\n{err}");
    }
    let good = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("check-config")
        .env(
            "ROLLGATE__SCHEDULE__WINDOWS",
            "sat,sun 22:00-06:00 Europe/Berlin",
        )
        .env("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "25%")
        .env("ROLLGATE__CLUSTER__FAILURE_BUDGET", "10%")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&good.stdout);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(
        text.contains("windows     sat,sun 22:00-06:00 Europe/Berlin: ")
            && text.contains("workers     25% at a time"),
        "{text}"
    );
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("check-config")
        .env_remove("ROLLGATE__SERVER__LISTEN")
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains(
            "upgrades    off: Kubernetes upgrades need cluster.kubeconfig (or cluster.in_cluster), ssh.key_file, ssh.known_hosts_file, etcd.endpoints set; this rollgate has no cluster configured"
        ),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    // A cluster without what upgrades need: named, and still a valid configuration (etcd
    // rolls need none of it).
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "").unwrap();
    let named = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("check-config")
        .env("ROLLGATE__CLUSTER__KUBECONFIG", &kubeconfig)
        .env("ROLLGATE__ETCD_ROLL__WATCH", "kube-system/etcd")
        .env("ROLLGATE__REBOOT__SENTINEL_PRESET", "zypper")
        .env("ROLLGATE__FLEET__NAME", "prod")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&named.stdout);
    assert!(
        named.status.success(),
        "{}",
        String::from_utf8_lossy(&named.stderr)
    );
    assert!(
        text.contains(
            "upgrades    off: Kubernetes upgrades need ssh.key_file, ssh.known_hosts_file, etcd.endpoints set; this rollgate runs etcd rolls only"
        ),
        "{text}"
    );
    // Each workflow's section says what it will do, in its own lines.
    for line in [
        "etcd watch  kube-system/etcd",
        "etcd rolls  TLS off (http:// members only), timeout 5s, transfer timeout 15s",
        "reboots     sentinel zypper needs-rebooting, command `sudo -n systemctl reboot`, timeout 15m, control planes too, after an upgrade never",
        "fleet       prod: no upstreams",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    // Batch analyses: each named with what it judges by; a bad one names its key.
    let analyses = dir.path().join("analyses.toml");
    std::fs::write(
        &analyses,
        "[gate]\nprometheus_url = \"http://prometheus:9090\"\n\
         [[gate.analysis]]\nname = \"latency-p99\"\nquery = \"max by (node) (latency)\"\n\
         [[gate.analysis]]\nname = \"free-memory\"\nquery = \"min by (node) (free)\"\n\
         direction = \"decrease\"\ntolerance = 1.5\nwindow = \"5m\"\non_fail = \"cordon\"\n\
         [[gate.checks]]\nname = \"error-ratio\"\nquery = \"sum(rate(errors[5m]))\"\n\
         success_condition = \"result < 0.01\"\nfailure_condition = \">= 0.05\"\ncount = 3\n\
         interval = \"1m\"\nfailure_limit = 1\n",
    )
    .unwrap();
    let judged = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("--config")
        .arg(&analyses)
        .arg("check-config")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&judged.stdout);
    assert!(
        judged.status.success(),
        "{}",
        String::from_utf8_lossy(&judged.stderr)
    );
    assert!(
        text.contains(
            "analyses    latency-p99 (an increase past 1.2x is bad, window 10m); free-memory (a decrease past 1.5x is bad, window 5m, a failed batch cordoned)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "checks      error-ratio (success result < 0.01, failure >= 0.05; 3 x 1m, failure_limit 1, inconclusive_limit 0)"
        ),
        "{text}"
    );
    std::fs::write(
        &analyses,
        "[[gate.analysis]]\nname = \"latency\"\nquery = \"up\"\ntolerance = 0.8\n\
         [[gate.checks]]\nname = \"errors\"\nquery = \"up\"\nsuccess_condition = \"~ 1\"\n",
    )
    .unwrap();
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("--config")
        .arg(&analyses)
        .arg("check-config")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    for want in [
        "gate.analysis[0].tolerance: 0.8 must be a ratio above 1",
        "gate.analysis: batch analyses read Prometheus: set gate.prometheus_url",
        "gate.checks[0].success_condition: \"~ 1\" is not a condition like \"< 0.05\"",
    ] {
        assert!(err.contains(want), "{want} not in:\n{err}");
    }
    // A watch with no cluster to watch it in is named, not silently dropped.
    let unwatched = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("check-config")
        .env("ROLLGATE__ETCD_ROLL__WATCH", "kube-system/etcd")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&unwatched.stdout);
    assert!(
        text.contains("etcd watch  1 StatefulSet(s) named, but nothing is watched"),
        "{text}"
    );
}

#[tokio::test]
async fn the_cli_lists_shows_and_controls_runs() {
    let cluster = IntakeCluster::start().await;
    let rg = cluster.rollgate(&[]).await;
    let (_, accepted) = rg.post("/v1/detections", &detection("1.34.8")).await;
    let id = accepted["run_id"].as_str().unwrap().to_owned();
    rg.wait_run(&id, "held at its gate", support::held_at_preflight_gate)
        .await;
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
            .args(args)
            .env("ROLLGATE__SERVER__LISTEN", format!("127.0.0.1:{}", rg.port))
            .env("ROLLGATE__DATA_DIR", rg.data_dir())
            .output()
            .unwrap()
    };
    let list = cli(&["runs", "list"]);
    assert!(list.status.success());
    assert!(String::from_utf8_lossy(&list.stdout).contains(&id));
    let halt = cli(&["runs", "halt", &id, "--reason", "from the cli"]);
    assert!(
        halt.status.success(),
        "{}",
        String::from_utf8_lossy(&halt.stderr)
    );
    let run = rg
        .wait_run(&id, "halted by the cli", |r| r["status"] == "halted")
        .await;
    assert_eq!(run["reason"], "halt by admin: from the cli");
    let show = cli(&["runs", "show", &id, "--json"]);
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown["status"], "halted");
    let words = String::from_utf8_lossy(&cli(&["runs", "show", &id]).stdout).into_owned();
    assert!(
        words.contains("status   halted: halt by admin: from the cli"),
        "{words}"
    );
    assert!(words.contains("preflight/gate"), "{words}");
    let again = cli(&["runs", "halt", &id]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("409"));
    // The table and the JSON of `runs list`.
    let table = String::from_utf8_lossy(&cli(&["runs", "list"]).stdout).into_owned();
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "ID", "STATUS", "KIND", "TARGET", "PROGRESS", "STEP", "REASON",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = table
        .lines()
        .find(|l| l.contains(&id))
        .expect("the run's row");
    assert!(
        row.contains("halted") && row.contains("preflight/gate"),
        "{row}"
    );
    let listed: Value = serde_json::from_slice(&cli(&["runs", "list", "--json"]).stdout).unwrap();
    assert_eq!(listed[0]["id"], json!(id));
    assert!(listed[0]["steps"].is_array(), "--json gives whole runs");
    let (status, summaries) = rg.get("/v1/runs?view=summary").await;
    assert_eq!(status, 200);
    assert_eq!(summaries[0]["id"], json!(id));
    assert_eq!(summaries[0]["step"], "preflight/gate");
    assert!(
        summaries[0]["steps_total"].as_u64() > Some(0),
        "{summaries}"
    );
    assert!(summaries[0].get("history").is_none(), "a line, not the run");
    let (status, refused) = rg.get("/v1/runs?view=everything").await;
    assert_eq!(status, 422);
    assert!(
        refused["message"].as_str().unwrap().contains("view"),
        "{refused}"
    );
    // `runs watch` ends with the run's end: halted 3, aborted 5.
    let watch = cli(&["runs", "watch", &id]);
    assert_eq!(
        watch.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&watch.stdout)
    );
    assert!(String::from_utf8_lossy(&watch.stdout).contains("halted"));
    assert!(cli(&["runs", "abort", &id]).status.success());
    rg.wait_run(&id, "aborted", |r| r["status"] == "aborted")
        .await;
    assert_eq!(cli(&["runs", "watch", &id]).status.code(), Some(5));
    let unknown = cli(&["runs", "watch", "no-such-run"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("404"));
}

/// Shell completions and the manual page come from the command line's own definition
/// (every subcommand in them, `fleet` and `approve` included), need no configuration, and
/// the shells accept what they are given.
#[test]
fn completions_and_the_manual_page_name_every_command() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
            .args(args)
            // A configuration that would not load: these never read it.
            .env("ROLLGATE__SERVER__LISTEN", "not an address")
            .output()
            .expect("rollgate");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let commands = [
        "serve",
        "check-config",
        "plan",
        "detect",
        "runs",
        "fleet",
        "etcd-roll",
    ];
    let dir = tempfile::tempdir().unwrap();
    for (shell, marker) in [
        ("bash", "complete -F _rollgate"),
        ("zsh", "#compdef rollgate"),
        ("fish", "complete -c rollgate"),
    ] {
        let script = run(&["completions", shell]);
        assert!(script.contains(marker), "{shell}: {marker:?} missing");
        for command in commands {
            assert!(script.contains(command), "{shell}: no {command}");
        }
        assert!(script.contains("approve"), "{shell}: no runs approve");
        let file = dir.path().join(format!("rollgate.{shell}"));
        std::fs::write(&file, &script).unwrap();
        if shell == "bash" {
            // bash parses it without running it.
            let checked = std::process::Command::new("bash")
                .arg("-n")
                .arg(&file)
                .output()
                .expect("bash");
            assert!(
                checked.status.success(),
                "{}",
                String::from_utf8_lossy(&checked.stderr)
            );
        }
    }
    // roff writes a hyphen as `\-`.
    let man = run(&["man"]).replace("\\-", "-");
    assert!(
        man.starts_with(".ie") || man.starts_with(".TH"),
        "{}",
        &man[..man.len().min(200)]
    );
    assert!(man.contains(".TH rollgate 1"), "no title line");
    for command in commands {
        assert!(man.contains(command), "the manual page lacks {command}");
    }
}
