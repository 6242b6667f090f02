//! The Prometheus adapter's answers, against a server the test controls: credentials are
//! sent, a vector is read, and everything else — an error, a non-vector result, a hang,
//! nobody listening — is a failure (which the gate treats as unknown, i.e. closed).

mod support;

use rollgate::adapters::prometheus::Prometheus;
use rollgate::domain::gate::PromReading;
use rollgate::ports::MetricsSource;
use std::time::{Duration, Instant};
use support::services::MiniServer;

const VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[
  {"metric":{"__name__":"ALERTS","alertname":"EtcdNoLeader","alertstate":"firing","upgrade_gate":"true"},"value":[1800000000.0,"1"]}]}}"#;

fn settings(extra: &[(&str, String)]) -> rollgate::config::GateSettings {
    let mut env: std::collections::HashMap<String, String> =
        [("ROLLGATE__GATE__TIMEOUT".to_owned(), "300ms".to_owned())]
            .into_iter()
            .collect();
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    rollgate::config::Settings::load_from(None, Some(env))
        .expect("settings")
        .gate
}

fn authorization(server: &MiniServer) -> String {
    let heads = server.heads();
    let head = heads.last().expect("a request");
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_vector_is_read_and_the_bearer_token_is_sent() {
    let server = MiniServer::start().await;
    server.set_reply(200, VECTOR);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let gate = settings(&[(
        "ROLLGATE__GATE__BEARER_TOKEN_FILE",
        token.display().to_string(),
    )]);
    let prom = Prometheus::new(&format!("http://{}", server.address()), &gate).unwrap();
    let PromReading::Series(series) = prom.query(&gate.query).await else {
        panic!("a vector is a reading")
    };
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].labels["alertname"], "EtcdNoLeader");
    assert_eq!(authorization(&server), "Bearer s3cret-token");
    assert!(
        server.heads()[0].starts_with("GET /api/v1/query?"),
        "{}",
        server.heads()[0]
    );
}

#[tokio::test]
async fn basic_auth_is_sent() {
    let server = MiniServer::start().await;
    server.set_reply(200, VECTOR);
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "open sesame").unwrap();
    let gate = settings(&[
        ("ROLLGATE__GATE__BASIC_AUTH_USER", "Aladdin".into()),
        (
            "ROLLGATE__GATE__BASIC_AUTH_PASSWORD_FILE",
            password.display().to_string(),
        ),
    ]);
    let prom = Prometheus::new(&format!("http://{}", server.address()), &gate).unwrap();
    assert!(matches!(prom.query("up").await, PromReading::Series(_)));
    assert_eq!(authorization(&server), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
}

#[tokio::test]
async fn anything_but_a_vector_is_a_failure_and_says_why() {
    let server = MiniServer::start().await;
    let prom = Prometheus::new(&format!("http://{}", server.address()), &settings(&[])).unwrap();
    let cases = [
        (
            200,
            r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"b"},"values":[[1800000000,"1"]]}]}}"#,
            "instant vector",
        ),
        (
            200,
            r#"{"status":"success","data":{"resultType":"scalar","result":[1800000000,"1"]}}"#,
            "instant vector",
        ),
        (
            400,
            r#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#,
            "failed",
        ),
        (503, "Service Unavailable", "failed"),
        (200, "not json", "failed"),
    ];
    for (status, body, expect) in cases {
        server.set_reply(status, body);
        match prom.query("ALERTS").await {
            PromReading::Failed(reason) => {
                assert!(reason.contains(expect), "{status} {body}: {reason}")
            }
            other => panic!("{status} {body} gave {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_hanging_or_absent_prometheus_fails_within_the_timeout() {
    let server = MiniServer::start().await;
    server.set_reply(200, VECTOR);
    *server.delay.lock().unwrap() = Duration::from_secs(5);
    let gate = settings(&[]);
    let prom = Prometheus::new(&format!("http://{}", server.address()), &gate).unwrap();
    let started = Instant::now();
    assert!(matches!(prom.query("ALERTS").await, PromReading::Failed(_)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );

    let nobody =
        Prometheus::new(&format!("http://127.0.0.1:{}", support::free_port()), &gate).unwrap();
    assert!(matches!(
        nobody.query("ALERTS").await,
        PromReading::Failed(_)
    ));
}

#[tokio::test]
async fn a_missing_secret_file_is_a_clear_error_at_start() {
    let gate = settings(&[(
        "ROLLGATE__GATE__BEARER_TOKEN_FILE",
        "/nonexistent/token".into(),
    )]);
    let err = Prometheus::new("http://127.0.0.1:9090", &gate)
        .err()
        .expect("an error")
        .to_string();
    assert!(
        err.contains("gate.bearer_token_file") && err.contains("/nonexistent/token"),
        "{err}"
    );
}
