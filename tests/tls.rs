//! HTTPS on the listener: a real Alertmanager posting over TLS (and with mutual TLS), plain
//! HTTP refused, and a certificate replaced in place taking effect without a restart.

mod support;

use std::path::Path;
use std::time::Duration;
use support::pki::{TestCa, TlsFiles};
use support::services::Alertmanager;
use support::{Rollgate, board, eventually, free_port};

/// The settings for serving `files`, with `client_ca` for mutual TLS.
fn tls_env(files: &TlsFiles, client_ca: Option<&Path>) -> Vec<(String, String)> {
    let mut env = vec![
        (
            "ROLLGATE__SERVER__TLS_CERT_FILE".to_owned(),
            files.cert.display().to_string(),
        ),
        (
            "ROLLGATE__SERVER__TLS_KEY_FILE".to_owned(),
            files.key.display().to_string(),
        ),
    ];
    if let Some(ca) = client_ca {
        env.push((
            "ROLLGATE__SERVER__CLIENT_CA_FILE".to_owned(),
            ca.display().to_string(),
        ));
    }
    env
}

fn borrowed(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// A client that trusts `ca` (and presents `identity`).
fn https_client(ca: &TestCa, identity: Option<reqwest::Identity>) -> reqwest::Client {
    let mut builder = Rollgate::client_builder().add_root_certificate(ca.trust());
    if let Some(identity) = identity {
        builder = builder.identity(identity);
    }
    builder.build().expect("https client")
}

/// The certificate rollgate presents to a new client trusting `cas` now. A new client each
/// time: one that resumed a TLS session would only recall the certificate of that session.
async fn served_certificate(cas: &[&TestCa], base: &str) -> Option<Vec<u8>> {
    let mut builder = Rollgate::client_builder().tls_info(true);
    for ca in cas {
        builder = builder.add_root_certificate(ca.trust());
    }
    let client = builder.build().expect("client");
    let r = client.get(format!("{base}/healthz")).send().await.ok()?;
    r.extensions()
        .get::<reqwest::tls::TlsInfo>()?
        .peer_certificate()
        .map(<[u8]>::to_vec)
}

/// An alert posted to Alertmanager reaches rollgate's board through its webhook.
async fn alert_reaches_the_board(am: &Alertmanager, rg: &Rollgate, name: &str) {
    am.post_labelled(
        serde_json::json!({"alertname": name, "upgrade_gate": "true", "node": name}),
        false,
    )
    .await;
    eventually(
        &format!("{name} on the board, posted by Alertmanager over HTTPS"),
        Duration::from_secs(20),
        || async {
            let (status, body) = rg.get("/v1/alerts").await;
            (status == 200
                && body
                    .as_array()
                    .is_some_and(|a| a.iter().any(|e| e["alert"]["labels"]["alertname"] == name)))
            .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn alertmanager_posts_over_https_with_the_test_ca_and_plain_http_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("rollgate test CA");
    let files = ca.server("rollgate").write(dir.path(), "tls");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let env = tls_env(&files, None);
    let port = free_port();
    let rg = Rollgate::start_with(port, &borrowed(&env), "https", https_client(&ca, None)).await;

    let am = Alertmanager::with_tls(
        &format!("{}/v1/alerts", rg.base()),
        &rg.data_dir().join("api-token"),
        Some(&[("ca_file", ca_file.as_path())]),
    )
    .await;
    alert_reaches_the_board(&am, &rg, "OverHttps").await;
    assert!(
        rg.logs().contains("tls=true"),
        "serving HTTPS is logged:\n{}",
        rg.logs()
    );

    // Plain HTTP to the TLS listener gets no answer from rollgate.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let answer = plain
        .post(format!("http://127.0.0.1:{port}/v1/alerts"))
        .bearer_auth(&rg.token)
        .json(&support::webhook("ab01"))
        .send()
        .await;
    assert!(
        answer.is_err(),
        "plain HTTP was answered: {:?}",
        answer.map(|r| r.status())
    );
    // A client that does not trust the CA refuses the certificate.
    let stranger = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    assert!(
        stranger
            .get(format!("{}/healthz", rg.base()))
            .send()
            .await
            .is_err()
    );
    // Neither wrote anything.
    assert!(!board(&rg).await.contains_key("ab01"));
}

#[tokio::test]
async fn with_mutual_tls_only_clients_with_a_certificate_of_the_client_ca_connect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("rollgate server CA");
    let client_ca = TestCa::new("rollgate client CA");
    let files = ca.server("rollgate").write(dir.path(), "tls");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let client_ca_file = client_ca.write(dir.path(), "client-ca.crt");
    let harness = client_ca.client("harness");
    let env = tls_env(&files, Some(&client_ca_file));
    let rg = Rollgate::start_with(
        free_port(),
        &borrowed(&env),
        "https",
        https_client(&ca, Some(harness.identity())),
    )
    .await;

    let am_files = client_ca.client("alertmanager").write(dir.path(), "am");
    let am = Alertmanager::with_tls(
        &format!("{}/v1/alerts", rg.base()),
        &rg.data_dir().join("api-token"),
        Some(&[
            ("ca_file", ca_file.as_path()),
            ("cert_file", am_files.cert.as_path()),
            ("key_file", am_files.key.as_path()),
        ]),
    )
    .await;
    alert_reaches_the_board(&am, &rg, "OverMutualTls").await;

    // Without a client certificate, or with one another CA signed: no connection, even
    // with the right bearer token.
    let outsider = TestCa::new("someone else").client("mallory");
    for identity in [None, Some(outsider.identity())] {
        let client = https_client(&ca, identity);
        let answer = client
            .post(format!("{}/v1/alerts", rg.base()))
            .bearer_auth(&rg.token)
            .json(&support::webhook("cd01"))
            .send()
            .await;
        assert!(
            answer.is_err(),
            "answered without a trusted client certificate: {:?}",
            answer.map(|r| r.status())
        );
    }
    assert!(!board(&rg).await.contains_key("cd01"));
}

#[tokio::test]
async fn a_certificate_replaced_in_place_is_served_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("rollgate test CA");
    let first = ca.server("rollgate-first");
    let files = first.write(dir.path(), "tls");
    let env = tls_env(&files, None);
    let rg = Rollgate::start_with(
        free_port(),
        &borrowed(&env),
        "https",
        https_client(&ca, None),
    )
    .await;
    let base = rg.base();
    assert_eq!(
        served_certificate(&[&ca], &base).await.as_deref(),
        Some(first.der.as_slice())
    );

    // A half-written renewal (key replaced, certificate not yet) keeps the old one in
    // service; once both are written the new one is served, to new connections.
    let second = ca.server("rollgate-second");
    std::fs::write(&files.key, &second.key_pem).expect("write key");
    eventually(
        "the mismatched renewal refused",
        Duration::from_secs(5),
        || async {
            rg.logs()
                .contains("previous certificate stays in service")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        served_certificate(&[&ca], &base).await.as_deref(),
        Some(first.der.as_slice()),
        "a key that does not fit its certificate was taken"
    );
    std::fs::write(&files.cert, &second.cert_pem).expect("write cert");
    eventually(
        "the renewed certificate served",
        Duration::from_secs(5),
        || async {
            (served_certificate(&[&ca], &base).await.as_deref() == Some(second.der.as_slice()))
                .then_some(())
        },
    )
    .await;

    // Renewed by another CA altogether (a re-issued chain): served the same way.
    let other_ca = TestCa::new("rollgate next CA");
    let third = other_ca.server("rollgate-third");
    third.write_to(&files);
    eventually(
        "the re-issued certificate served",
        Duration::from_secs(5),
        || async {
            (served_certificate(&[&ca, &other_ca], &base)
                .await
                .as_deref()
                == Some(third.der.as_slice()))
            .then_some(())
        },
    )
    .await;
    let logs = rg.logs();
    assert!(logs.contains("TLS certificate reloaded"), "{logs}");
    // The same process all along.
    assert_eq!(
        logs.matches("rollgate serving").count(),
        1,
        "rollgate restarted:\n{logs}"
    );
}

#[test]
fn check_config_names_a_key_that_does_not_fit_its_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("rollgate test CA");
    let files = ca.server("rollgate").write(dir.path(), "tls");
    let client_ca = ca.write(dir.path(), "client-ca.crt");
    let check = || support::check_config(dir.path(), &tls_env(&files, Some(&client_ca)));
    let good = check();
    let text = String::from_utf8_lossy(&good.stdout);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(text.contains("tls         https, mutual TLS"), "{text}");

    std::fs::write(&files.key, ca.server("another").key_pem).expect("write key");
    let bad = check();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.contains("tls_key_file") && err.contains("does not fit the certificate"),
        "{err}"
    );
}

/// `rollgate runs … list` from a workstation, as the operator page says.
fn cli_list(base: &str, token: &Path, ca: &Path, extra: &[&str]) -> std::process::Output {
    let data = tempfile::tempdir().expect("tempdir");
    std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["runs", "--url", base, "--token-file"])
        .arg(token)
        .arg("--ca-file")
        .arg(ca)
        .args(extra)
        .arg("list")
        .env_clear()
        .env("ROLLGATE__DATA_DIR", data.path())
        .output()
        .expect("rollgate runs")
}

/// Issue 40, from a workstation: `kubectl port-forward` ends the connection on the
/// workstation's loopback. The shipped certificate (the example overlay's, its names read
/// from the file) names localhost and 127.0.0.1, so the CLI reaches the listener at
/// https://127.0.0.1 and https://localhost. A certificate made out to the in-cluster
/// service alone is refused at 127.0.0.1 unless the CLI is told the name to check
/// (--tls-server-name).
#[tokio::test]
async fn from_a_workstation_the_cli_reaches_the_listener_through_loopback() {
    let shipped: serde_json::Value = {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/overlays/example/certificate.yaml"),
        )
        .unwrap();
        serde_norway::from_str(&text).unwrap()
    };
    let names = |key: &str| -> Vec<String> {
        shipped["spec"][key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (dns, ips) = (names("dnsNames"), names("ipAddresses"));
    assert!(dns.contains(&"localhost".to_owned()) && ips.contains(&"127.0.0.1".to_owned()));
    let ips: Vec<std::net::IpAddr> = ips.iter().map(|ip| ip.parse().unwrap()).collect();

    let dir = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new("site CA");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let files = ca
        .server_exactly("rollgate", &dns, &ips)
        .write(dir.path(), "tls");
    let env = tls_env(&files, None);
    let port = free_port();
    let rg = Rollgate::start_with(port, &borrowed(&env), "https", https_client(&ca, None)).await;
    let token = rg.data_dir().join("api-token");
    let loopback = format!("https://127.0.0.1:{port}");
    for base in [loopback.clone(), format!("https://localhost:{port}")] {
        let out = cli_list(&base, &token, &ca_file, &[]);
        assert!(
            out.status.success(),
            "{base}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // The certificate is replaced in place by one for the service alone.
    let service = vec!["rollgate.rollgate.svc".to_owned()];
    ca.server_exactly("rollgate", &service, &[])
        .write_to(&files);
    let refused = eventually(
        "the service's certificate served",
        Duration::from_secs(20),
        || async {
            let out = cli_list(&loopback, &token, &ca_file, &[]);
            (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
        },
    )
    .await;
    assert!(refused.contains("cannot reach rollgate"), "{refused}");
    let out = cli_list(
        &loopback,
        &token,
        &ca_file,
        &["--tls-server-name", "rollgate.rollgate.svc"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
