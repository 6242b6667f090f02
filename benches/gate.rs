//! Reaction time from a blocking alert to a closed gate, ≥ 100 trials each, in one run:
//! (a) an Alertmanager webhook arriving at rollgate → `GET /v1/gates` says closed;
//! (b) the Prometheus-only path: the scrape target's metric flips → Prometheus (scrape and
//!     rule evaluation every 1 s) fires `NodeRecentlyRebooted` → rollgate's own gate check,
//!     every `gate.poll_interval` (1 s), sees it (`GET /v1/gates?cached=true`).
//!
//! (c) the cost of one gate evaluation (`GET /v1/gates`, evaluated afresh), side by side
//!     and interleaved: Prometheus only, beside Prometheus + Alertmanager as a pulled
//!     source holding 1,000 active gate alerts (BENCH_AM_ALERTS), BENCH_EVALS (default
//!     1,000) evaluations each.
//!
//! Run: `cargo bench --bench gate` (BENCH_TRIALS=100; needs Debian's prometheus and
//! prometheus-alertmanager).

#[path = "support/serve.rs"]
mod serve;

#[path = "../tests/support/services.rs"]
#[allow(dead_code)]
mod services;

use hdrhistogram::Histogram;
use serde_json::{Value, json};
use serve::Serve;
use services::{Alertmanager, MiniServer, Prometheus};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
}

fn trials() -> usize {
    std::env::var("BENCH_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
}

impl Serve {
    fn start(prometheus: &str, extra: &[(&str, String)]) -> Self {
        let mut env = vec![
            ("ROLLGATE__GATE__PROMETHEUS_URL", prometheus.to_owned()),
            ("ROLLGATE__GATE__POLL_INTERVAL", "1s".to_owned()),
        ];
        env.extend(extra.iter().cloned());
        Serve::start_in(tempfile::tempdir().expect("tempdir"), &env)
    }

    async fn report(&self, cached: bool) -> Value {
        let r = self
            .http
            .get(format!("{}/v1/gates?cached={cached}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("gates");
        r.json().await.expect("json")
    }

    async fn verdict(&self, cached: bool) -> String {
        let report = self.report(cached).await;
        report["verdict"]["verdict"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    async fn wait_verdict(&self, want: &str, cached: bool, poll: Duration) {
        let started = Instant::now();
        while self.verdict(cached).await != want {
            if started.elapsed() > Duration::from_secs(60) {
                let report = self.report(cached).await;
                panic!("gate never became {want} (cached={cached}): {report}");
            }
            tokio::time::sleep(poll).await;
        }
    }

    async fn post_alert(&self, fingerprint: &str, firing: bool) {
        let status = if firing { "firing" } else { "resolved" };
        let body = json!({
            "version": "4", "groupKey": "bench", "status": status, "receiver": "rollgate",
            "alerts": [{"status": status, "labels": {"alertname": "BenchBlocker", "upgrade_gate": "true"},
                "annotations": {}, "startsAt": "2026-11-30T06:00:00Z",
                "endsAt": if firing { "0001-01-01T00:00:00Z".to_owned() } else { chrono::Utc::now().to_rfc3339() },
                "fingerprint": fingerprint}]
        });
        let r = self
            .http
            .post(format!("{}/v1/alerts", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .expect("post");
        assert_eq!(r.status().as_u16(), 202);
    }
}

fn booted(ago: i64) -> String {
    format!(
        "node_boot_time_seconds{{node=\"bench\"}} {}\n",
        chrono::Utc::now().timestamp() - ago
    )
}

fn row(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<58} {:>6} {:>9.1} {:>9.1} {:>9.1}",
        h.len(),
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let target = MiniServer::start().await;
        target.set_metrics(&booted(86_400));
        let prom = Prometheus::start(&target.address()).await;
        let rg = Serve::start(&prom.url(), &[]);
        rg.wait_verdict("open", false, Duration::from_millis(50))
            .await;

        let mut webhook = Histogram::<u64>::new(3).expect("histogram");
        for i in 0..trials() {
            let fp = format!("bench{i:05}");
            let started = Instant::now();
            rg.post_alert(&fp, true).await;
            rg.wait_verdict("closed", false, Duration::from_micros(200))
                .await;
            webhook
                .record(started.elapsed().as_micros() as u64)
                .expect("record");
            rg.post_alert(&fp, false).await;
            rg.wait_verdict("open", false, Duration::from_millis(1))
                .await;
        }

        let mut prometheus = Histogram::<u64>::new(3).expect("histogram");
        for _ in 0..trials() {
            let started = Instant::now();
            target.set_metrics(&booted(5));
            rg.wait_verdict("closed", true, Duration::from_millis(20))
                .await;
            prometheus
                .record(started.elapsed().as_micros() as u64)
                .expect("record");
            target.set_metrics(&booted(86_400));
            rg.wait_verdict("open", true, Duration::from_millis(20))
                .await;
        }

        println!(
            "{:<58} {:>6} {:>9} {:>9} {:>9}",
            "path (ms)", "trials", "p50", "p99", "max"
        );
        row("(a) webhook → verdict closed", &webhook);
        row(
            "(b) Prometheus only: scrape 1s + rules 1s + gate poll 1s",
            &prometheus,
        );
        evaluation_cost(&prom).await;
    });
}

fn env_number(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Posts `n` active gate alerts to Alertmanager in one request.
async fn fill_alertmanager(am: &Alertmanager, n: usize) {
    let now = chrono::Utc::now();
    let alerts: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "labels": {"alertname": format!("BenchGate{i:04}"), "upgrade_gate": "true",
                    "severity": "critical", "node": format!("w{}", i % 12)},
                "annotations": {"summary": "bench"},
                "startsAt": (now - chrono::Duration::minutes(1)).to_rfc3339(),
                "endsAt": (now + chrono::Duration::hours(2)).to_rfc3339(),
            })
        })
        .collect();
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/api/v2/alerts", am.port))
        .json(&alerts)
        .send()
        .await
        .expect("alertmanager answers");
    assert!(r.status().is_success(), "alerts refused: {}", r.status());
}

/// (c): one evaluation's cost with and without 1,000 alerts pulled from Alertmanager.
async fn evaluation_cost(prom: &Prometheus) {
    let alerts = env_number("BENCH_AM_ALERTS", 1000);
    let evals = env_number("BENCH_EVALS", 1000);
    let am = Alertmanager::with_config(
        "route:\n  receiver: nobody\nreceivers:\n  - name: nobody\n",
        prom.alertmanager_port,
    )
    .await;
    fill_alertmanager(&am, alerts).await;
    let prom_only = Serve::start(&prom.url(), &[]);
    let with_am = Serve::start(
        &prom.url(),
        &[(
            "ROLLGATE__GATE__ALERTMANAGER_URL",
            format!("http://127.0.0.1:{}", am.port),
        )],
    );
    prom_only
        .wait_verdict("open", false, Duration::from_millis(50))
        .await;
    with_am
        .wait_verdict("closed", false, Duration::from_millis(50))
        .await;
    let report = with_am.report(false).await;
    let blockers = report["verdict"]["blockers"].as_array().map_or(0, Vec::len);
    assert_eq!(blockers, alerts, "every pulled alert blocks: {report}");

    let mut plain = Histogram::<u64>::new(3).expect("histogram");
    let mut pulled = Histogram::<u64>::new(3).expect("histogram");
    let mut raw = Histogram::<u64>::new(3).expect("histogram");
    // What rollgate asks Alertmanager, asked directly: Alertmanager's own share.
    let am_query = format!(
        "http://127.0.0.1:{}/api/v2/alerts?active=true&silenced=false&inhibited=false&filter=upgrade_gate%3D%22true%22",
        am.port
    );
    let http = reqwest::Client::new();
    for _ in 0..evals {
        for (serve, h) in [(&prom_only, &mut plain), (&with_am, &mut pulled)] {
            let started = Instant::now();
            let report = serve.report(false).await;
            h.record(started.elapsed().as_micros() as u64)
                .expect("record");
            assert!(report["verdict"]["verdict"].is_string(), "{report}");
        }
        let started = Instant::now();
        let body = http
            .get(&am_query)
            .send()
            .await
            .expect("alertmanager answers")
            .bytes()
            .await
            .expect("body");
        raw.record(started.elapsed().as_micros() as u64)
            .expect("record");
        assert!(body.len() > alerts, "{} bytes", body.len());
    }
    println!();
    println!(
        "{:<58} {:>6} {:>9} {:>9} {:>9}",
        "one gate evaluation, GET /v1/gates (ms)", "evals", "p50", "p99", "max"
    );
    row("(c) Prometheus only", &plain);
    row(
        &format!("(c) Prometheus + Alertmanager, {alerts} active alerts"),
        &pulled,
    );
    row(
        &format!("    of which Alertmanager's own answer ({alerts} alerts)"),
        &raw,
    );
    println!(
        "ratio Alertmanager / Prometheus only: p50 {:.2}, p99 {:.2}",
        pulled.value_at_quantile(0.5) as f64 / plain.value_at_quantile(0.5).max(1) as f64,
        pulled.value_at_quantile(0.99) as f64 / plain.value_at_quantile(0.99).max(1) as f64
    );
}
