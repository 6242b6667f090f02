//! Sustained `POST /v1/alerts` from 32 concurrent clients against `rollgate serve`, beside
//! the raw ceiling of the same backend measured in the same run:
//! - embedded: fsync'd SQLite appends (WAL, synchronous=FULL) with the same group commit as
//!   rollgate's embedded queue (one writer, up to 512 appends per transaction), and, as a
//!   second row, one fsync'd INSERT per append;
//! - amqp: a raw lapin publish-with-confirm loop, 32 publishers, persistent messages to a
//!   quorum queue.
//!
//! - amqp + postgres: the same, with the run store on a PostgreSQL server of the bench's own
//!   (initdb on loopback), one replica and three (the clients spread over them); and the
//!   failover of the active worker: kill -9 of its replica, then the time until another
//!   replica's worker has processed an event posted after the kill, over 20 kills.
//!
//! - tls: the same serve over plain HTTP and over TLS, side by side (the ratio is TLS / plain).
//!
//! The amqp ceilings come twice: publishing alone, and publishing while a raw consumer takes
//! every message (the broker's work for one event end to end, without rollgate). Every
//! amqp scenario runs on queues of its own, deleted after it, so that no backlog (the
//! worker-paused scenario leaves one) reaches the next. Requests that failed are counted
//! and shown beside the accepted ones.
//!
//! Run: `cargo bench --bench intake` (BENCH_SECS=10 per scenario; RabbitMQ on 127.0.0.1:5672;
//! BENCH_ROUNDS=3 rounds of the amqp and replicas parts, medians reported; BENCH_KILLS=20;
//! BENCH_PARTS=embedded,amqp,tls,replicas,failover picks parts).

#[path = "../tests/support/mod.rs"]
#[allow(unused_imports)]
mod support;

use hdrhistogram::Histogram;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CLIENTS: usize = 32;
const AMQP_URL: &str = "amqp://127.0.0.1:5672/%2f";

struct Figures {
    name: String,
    accepted_per_s: f64,
    /// Requests that did not succeed while measuring.
    failed: u64,
    p50_ms: f64,
    p99_ms: f64,
    rss_mb: Option<f64>,
}

fn secs() -> Duration {
    Duration::from_secs(
        std::env::var("BENCH_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    )
}

/// Runs `op` from `CLIENTS` tasks for the bench duration after a 1 s warm-up.
async fn drive<F, Fut>(op: F) -> (f64, Histogram<u64>, u64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (op, stop, measuring) = (op.clone(), stop.clone(), measuring.clone());
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let started = Instant::now();
                let success = op(client, seq).await;
                if measuring.load(Ordering::Relaxed) {
                    if success {
                        ok += 1;
                        let _ = hist.record(started.elapsed().as_micros().max(1) as u64);
                    } else {
                        failed += 1;
                    }
                }
            }
            (ok, hist, failed)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(secs()).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (mut total, mut failures) = (0, 0);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    for t in tasks {
        let (ok, h, failed) = t.await.expect("client task");
        total += ok;
        failures += failed;
        hist.add(h).expect("merge");
    }
    (total as f64 / elapsed, hist, failures)
}

fn figures(
    name: &str,
    (rate, hist, failed): (f64, Histogram<u64>, u64),
    rss_mb: Option<f64>,
) -> Figures {
    Figures {
        name: name.into(),
        accepted_per_s: rate,
        failed,
        p50_ms: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_ms: hist.value_at_quantile(0.99) as f64 / 1000.0,
        rss_mb,
    }
}

struct Serve {
    child: Child,
    port: u16,
    token: String,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start(env: &[(&str, String)]) -> Self {
        Self::start_logging(env, "warn")
    }

    fn start_logging(env: &[(&str, String)], level: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollgate"));
        cmd.arg("serve")
            .current_dir(dir.path())
            .env("ROLLGATE__SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("ROLLGATE__LOG__LEVEL", level)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn rollgate");
        let token_path = dir.path().join("data/api-token");
        let started = Instant::now();
        while !token_path.exists() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "rollgate did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let token = std::fs::read_to_string(&token_path)
            .expect("token")
            .trim()
            .to_owned();
        Self {
            child,
            port,
            token,
            _dir: dir,
        }
    }

    /// Peak resident set size (VmHWM).
    fn peak_rss_mb(&self) -> Option<f64> {
        support::proc_status_mb(&self.child.id().to_string(), "VmHWM")
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn alert_body(client: usize, seq: u64) -> serde_json::Value {
    serde_json::json!({
        "version": "4", "groupKey": "{}:{alertname=\"Bench\"}", "status": "firing", "receiver": "rollgate",
        "alerts": [{"status": "firing", "labels": {"alertname": "Bench", "upgrade_gate": "true"},
            "annotations": {}, "startsAt": "2026-11-30T06:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": format!("c{client}s{seq}")}]
    })
}

/// One serve on `env` over plain HTTP.
async fn bench_rollgate(name: &str, env: &[(&str, String)]) -> Figures {
    bench_over(name, env, 1, None).await
}

/// `replicas` serves on `env`, the clients spread over them (client `i` posts to replica
/// `i % replicas`), over HTTPS when `tls` holds the CA whose certificate the serves present
/// (each of the 32 clients keeps its connection, as Alertmanager does); RSS is the largest
/// replica's.
async fn bench_over(
    name: &str,
    env: &[(&str, String)],
    replicas: usize,
    tls: Option<&support::pki::TestCa>,
) -> Figures {
    let serves: Vec<Serve> = (0..replicas).map(|_| Serve::start(env)).collect();
    let mut builder = reqwest::Client::builder().pool_max_idle_per_host(CLIENTS);
    if let Some(ca) = tls {
        builder = builder.add_root_certificate(ca.trust());
    }
    let http = builder.build().expect("client");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let targets: Arc<Vec<(String, String)>> = Arc::new(
        serves
            .iter()
            .map(|s| {
                (
                    format!("{scheme}://127.0.0.1:{}/v1/alerts", s.port),
                    s.token.clone(),
                )
            })
            .collect(),
    );
    let result = drive(move |client, seq| {
        let (url, token) = &targets[client % targets.len()];
        let req = http
            .post(url)
            .bearer_auth(token)
            .json(&alert_body(client, seq))
            .send();
        async move { matches!(req.await, Ok(r) if r.status().as_u16() == 202) }
    })
    .await;
    let rss = serves
        .iter()
        .filter_map(Serve::peak_rss_mb)
        .fold(None, |max: Option<f64>, r| {
            Some(max.map_or(r, |m| m.max(r)))
        });
    figures(name, result, rss)
}

/// Whether the serve at `port` says its worker is the active one.
async fn is_active(http: &reqwest::Client, port: u16) -> bool {
    let Ok(r) = http
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
    else {
        return false;
    };
    r.text()
        .await
        .is_ok_and(|t| t.lines().any(|l| l == "rollgate_worker_active 1"))
}

/// Whether alert `fingerprint` is on the board of the serve at `port`.
async fn on_board(http: &reqwest::Client, serve: &Serve, fingerprint: &str) -> bool {
    let Ok(r) = http
        .get(format!("http://127.0.0.1:{}/v1/alerts", serve.port))
        .bearer_auth(&serve.token)
        .timeout(Duration::from_secs(2))
        .send()
        .await
    else {
        return false;
    };
    r.json::<serde_json::Value>().await.is_ok_and(|board| {
        board
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["alert"]["fingerprint"] == fingerprint))
    })
}

/// Three replicas; `BENCH_KILLS` times: kill -9 the active worker's replica, post an alert
/// to another at once, and time until it is processed (on the board), which needs another
/// replica's worker to have taken over. The killed replica is started again as a standby.
async fn bench_failover(env: &[(&str, String)]) -> (Histogram<u64>, usize) {
    let kills: usize = std::env::var("BENCH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut serves: Vec<Serve> = (0..3).map(|_| Serve::start(env)).collect();
    let http = reqwest::Client::new();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram");
    for kill in 0..kills {
        let active = loop {
            let mut found = None;
            for (i, s) in serves.iter().enumerate() {
                if is_active(&http, s.port).await {
                    found = Some(i);
                }
            }
            if let Some(i) = found {
                break i;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let other = (active + 1) % 3;
        let _ = serves[active].child.kill();
        let killed = Instant::now();
        let fingerprint = format!("failover{kill}");
        let posted = http
            .post(format!("http://127.0.0.1:{}/v1/alerts", serves[other].port))
            .bearer_auth(&serves[other].token)
            .json(&{
                let mut body = alert_body(0, 0);
                body["alerts"][0]["fingerprint"] = fingerprint.clone().into();
                body
            })
            .send()
            .await;
        match posted {
            Ok(r) if r.status().as_u16() == 202 => {}
            Ok(r) => panic!(
                "failover alert: {} {}",
                r.status(),
                r.text().await.unwrap_or_default()
            ),
            Err(e) => panic!("failover alert: {e}"),
        }
        while !on_board(&http, &serves[other], &fingerprint).await {
            assert!(
                killed.elapsed() < Duration::from_secs(120),
                "no takeover in 120 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = hist.record(killed.elapsed().as_micros().max(1) as u64);
        serves[active] = Serve::start(env);
    }
    (hist, kills)
}

/// The raw append log's one migration.
fn log_table(tx: &rusqlite::Transaction<'_>) -> Result<(), rollgate::sqlite::MigrationError> {
    tx.execute_batch(
        "CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, body BLOB NOT NULL)",
    )?;
    Ok(())
}

/// The best plain embedded append: one writer thread takes what the callers queued, up to
/// 512 appends, writes them in one fsync'd transaction and answers each caller, as
/// rollgate's embedded queue commits.
async fn bench_raw_sqlite_grouped() -> Figures {
    type Append = (Vec<u8>, tokio::sync::oneshot::Sender<bool>);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut conn =
        rollgate::sqlite::open(&dir.path().join("raw.db"), &[log_table]).expect("sqlite");
    let (tx, rx) = std::sync::mpsc::channel::<Append>();
    let writer = std::thread::spawn(move || {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < 512 {
                match rx.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let written = conn.transaction().and_then(|t| {
                {
                    let mut insert = t.prepare_cached("INSERT INTO log (body) VALUES (?1)")?;
                    for (body, _) in &batch {
                        insert.execute([body])?;
                    }
                }
                t.commit()
            });
            for (_, answer) in batch {
                let _ = answer.send(written.is_ok());
            }
        }
    });
    let tx = Arc::new(std::sync::Mutex::new(tx));
    let result = drive(move |client, seq| {
        let tx = tx.clone();
        async move {
            let body = serde_json::to_vec(&alert_body(client, seq)).unwrap_or_default();
            let (answer, answered) = tokio::sync::oneshot::channel();
            let sent = tx
                .lock()
                .map(|t| t.send((body, answer)).is_ok())
                .unwrap_or(false);
            sent && answered.await.unwrap_or(false)
        }
    })
    .await;
    drop(writer);
    figures("ceiling: raw SQLite, group commit (<= 512)", result, None)
}

async fn bench_raw_sqlite() -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = rollgate::sqlite::open(&dir.path().join("raw.db"), &[log_table]).expect("sqlite");
    let conn = Arc::new(std::sync::Mutex::new(conn));
    let result = drive(move |client, seq| {
        let conn = conn.clone();
        async move {
            let body = serde_json::to_vec(&alert_body(client, seq)).unwrap_or_default();
            tokio::task::spawn_blocking(move || {
                conn.lock()
                    .map(|c| {
                        c.execute("INSERT INTO log (body) VALUES (?1)", [body])
                            .is_ok()
                    })
                    .unwrap_or(false)
            })
            .await
            .unwrap_or(false)
        }
    })
    .await;
    figures("raw SQLite, one fsync per append", result, None)
}

/// The broker's ceiling: 32 publishers with confirms on one channel, persistent messages to
/// a quorum queue; with `consume`, a consumer on a connection of its own also takes every
/// message (prefetch 256, one `basic.ack multiple` per 32), as rollgate's worker must.
async fn bench_raw_amqp(consume: bool) -> Figures {
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .expect("RabbitMQ");
    let ch = conn.create_channel().await.expect("channel");
    let queue = format!("rg-bench-raw-{}", uuid::Uuid::now_v7().simple());
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        args,
    )
    .await
    .expect("declare");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let consumer = if consume {
        Some(raw_consumer(&queue).await)
    } else {
        None
    };
    let q = queue.clone();
    let channel = ch.clone();
    let result = drive(move |client, seq| {
        let ch = channel.clone();
        let q = q.clone();
        async move {
            let body = serde_json::to_vec(&alert_body(client, seq)).unwrap_or_default();
            let Ok(confirm) = ch
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
            else {
                return false;
            };
            matches!(confirm.await, Ok(c) if c.is_ack())
        }
    })
    .await;
    if let Some((connection, task)) = consumer {
        task.abort();
        let _ = connection.close(200, "bench done".into()).await;
    }
    let _ = ch
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let name = if consume {
        "ceiling: raw publish+confirm, and consume"
    } else {
        "ceiling: raw lapin publish+confirm"
    };
    figures(name, result, None)
}

/// A consumer of `queue` that acks everything it is given, 32 at a time.
async fn raw_consumer(queue: &str) -> (Connection, tokio::task::JoinHandle<()>) {
    use futures_util::StreamExt;
    let conn = Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .expect("RabbitMQ");
    let ch = conn.create_channel().await.expect("channel");
    ch.basic_qos(256, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut deliveries = ch
        .basic_consume(
            queue.into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    let task = tokio::spawn(async move {
        let mut taken = 0u64;
        while let Some(Ok(d)) = deliveries.next().await {
            taken += 1;
            if taken.is_multiple_of(32) {
                let _ = d.ack(BasicAckOptions { multiple: true }).await;
            }
        }
    });
    (conn, task)
}

/// Scenario rounds in the amqp and replicas parts (`BENCH_ROUNDS`, default 3): the machine
/// drifts between scenarios, so each round measures its own ceilings and the summary takes
/// the median of the rounds' ratios.
fn rounds() -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// What a part compares, in one line, then its table's header.
fn compares(what: &str) {
    println!("compares: {what}");
    println!(
        "{:<44} {:>10} {:>8} {:>9} {:>9} {:>9} {:>8}",
        "scenario", "accepted/s", "failed", "p50 ms", "p99 ms", "RSS MB", "ratio"
    );
}

fn report(rows: &[&Figures], ceiling: &Figures) {
    for f in rows {
        println!(
            "{:<44} {:>10.0} {:>8} {:>9.2} {:>9.2} {:>9} {:>8.2}",
            f.name,
            f.accepted_per_s,
            f.failed,
            f.p50_ms,
            f.p99_ms,
            f.rss_mb.map_or("-".into(), |m| format!("{m:.1}")),
            f.accepted_per_s / ceiling.accepted_per_s,
        );
    }
}

async fn cleanup(names: &str) {
    let Ok(conn) = Connection::connect(AMQP_URL, ConnectionProperties::default()).await else {
        return;
    };
    let Ok(ch) = conn.create_channel().await else {
        return;
    };
    for q in [format!("{names}.events"), format!("{names}.dead")] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for x in [names.to_owned(), format!("{names}.dlx")] {
        let _ = ch
            .exchange_delete(x.as_str().into(), Default::default())
            .await;
    }
}

fn amqp_env(names: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ROLLGATE__QUEUE__BACKEND", "amqp".to_owned()),
        ("ROLLGATE__QUEUE__EXCHANGE", names.to_owned()),
        ("ROLLGATE__QUEUE__QUEUE", format!("{names}.events")),
        ("ROLLGATE__QUEUE__DEAD_QUEUE", format!("{names}.dead")),
    ]
}

fn bench_names() -> String {
    format!("rg-bench-{}", uuid::Uuid::now_v7().simple())
}

async fn part_embedded() {
    compares(
        "rollgate serve on the embedded store beside raw SQLite appends with the same group commit (the ratios' ceiling) and with one fsync per append",
    );
    let ceiling = bench_raw_sqlite_grouped().await;
    let single = bench_raw_sqlite().await;
    let embedded = bench_rollgate("rollgate serve, embedded", &[]).await;
    let paused = bench_rollgate(
        "rollgate serve, embedded, worker paused",
        &[("ROLLGATE__WORKER__PAUSED", "true".into())],
    )
    .await;
    report(&[&ceiling, &single, &embedded, &paused], &ceiling);
    println!(
        "embedded: {:.2} of the group-commit ceiling, {:.2} of one fsync per append",
        embedded.accepted_per_s / ceiling.accepted_per_s,
        embedded.accepted_per_s / single.accepted_per_s,
    );
}

/// `bench_over` on queues of its own (extra `env` on top), deleted afterwards.
async fn on_fresh_queues(name: &str, extra: &[(&'static str, String)], replicas: usize) -> Figures {
    let names = bench_names();
    let env = [amqp_env(&names).as_slice(), extra].concat();
    let figures = bench_over(name, &env, replicas, None).await;
    cleanup(&names).await;
    figures
}

async fn part_amqp() {
    compares(
        "rollgate serve on amqp (and with its worker paused) beside a raw lapin publish+confirm loop, alone and with a raw consumer, each scenario on fresh queues",
    );
    let paused_env = [("ROLLGATE__WORKER__PAUSED", "true".into())];
    let (mut whole, mut intake, mut whole_consumed) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds() {
        let ceiling = bench_raw_amqp(false).await;
        let consumed = bench_raw_amqp(true).await;
        let amqp = on_fresh_queues("rollgate serve, amqp", &[], 1).await;
        let paused = on_fresh_queues("rollgate serve, amqp, worker paused", &paused_env, 1).await;
        report(&[&ceiling, &consumed, &amqp, &paused], &ceiling);
        whole.push(amqp.accepted_per_s / ceiling.accepted_per_s);
        intake.push(paused.accepted_per_s / ceiling.accepted_per_s);
        whole_consumed.push(amqp.accepted_per_s / consumed.accepted_per_s);
    }
    println!(
        "amqp, median of {} rounds: {:.2} of the publish ceiling ({:.2} of publish+consume), worker paused {:.2}",
        whole.len(),
        median(whole),
        median(whole_consumed),
        median(intake),
    );
}

/// The same serve over plain HTTP and over TLS (a server certificate of a test CA, 32 kept
/// connections), on the embedded store and on amqp, alternating plain and TLS twice so
/// that drift of the machine falls on both alike.
async fn part_tls() {
    compares(
        "the same rollgate serve over plain HTTP and over TLS, embedded and amqp, alternating twice",
    );
    let ca = support::pki::TestCa::new("rollgate bench CA");
    let dir = tempfile::tempdir().expect("tempdir");
    let files = ca.server("rollgate").write(dir.path(), "tls");
    let tls_env: [(&'static str, String); 2] = [
        (
            "ROLLGATE__SERVER__TLS_CERT_FILE",
            files.cert.display().to_string(),
        ),
        (
            "ROLLGATE__SERVER__TLS_KEY_FILE",
            files.key.display().to_string(),
        ),
    ];
    for backend in ["embedded", "amqp"] {
        let mut plain = Vec::new();
        let mut tls = Vec::new();
        // Each scenario on its own queues (amqp), deleted after it.
        let scenario = async |name: String, extra: &[(&'static str, String)], ca| {
            let names = bench_names();
            let mut env = if backend == "amqp" {
                amqp_env(&names)
            } else {
                Vec::new()
            };
            env.extend_from_slice(extra);
            let figures = bench_over(&name, &env, 1, ca).await;
            cleanup(&names).await;
            figures
        };
        for _ in 0..2 {
            plain.push(scenario(format!("{backend}, plain HTTP"), &[], None).await);
            tls.push(scenario(format!("{backend}, TLS"), &tls_env, Some(&ca)).await);
        }
        let rows: Vec<&Figures> = plain.iter().chain(&tls).collect();
        report(&rows, &plain[0]);
        let mean = |f: &[Figures]| f.iter().map(|f| f.accepted_per_s).sum::<f64>() / f.len() as f64;
        let worst_p99 = |f: &[Figures]| f.iter().map(|f| f.p99_ms).fold(0.0, f64::max);
        println!(
            "{backend}: TLS / plain throughput {:.2} (TLS costs {:.0} %), p99 plain {:.2} ms, TLS {:.2} ms",
            mean(&tls) / mean(&plain),
            (1.0 - mean(&tls) / mean(&plain)) * 100.0,
            worst_p99(&plain),
            worst_p99(&tls),
        );
    }
}

/// RabbitMQ under `names` and a new database on `pg`.
async fn replicated_env(
    names: &str,
    pg: &support::postgres::Postgres,
) -> Vec<(&'static str, String)> {
    let mut env = amqp_env(names);
    env.push(("ROLLGATE__STORE__BACKEND", "postgres".to_owned()));
    env.push(("ROLLGATE__STORE__URL", pg.database().await));
    env
}

async fn part_replicas(pg: &support::postgres::Postgres) {
    compares(
        "rollgate serve on amqp + PostgreSQL, 1 and 3 replicas, beside the raw publish ceilings, each scenario on fresh queues and a new database",
    );
    let (mut one_ratio, mut one_consumed, mut scaling) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds() {
        let ceiling = bench_raw_amqp(false).await;
        let consumed = bench_raw_amqp(true).await;
        // A new database for each scenario: the board an earlier one left (every alert it
        // posted) would make this one's gate evaluations larger.
        let names = bench_names();
        let env = replicated_env(&names, pg).await;
        let one = bench_over("rollgate serve, amqp + postgres, 1 replica", &env, 1, None).await;
        cleanup(&names).await;
        let names = bench_names();
        let env = replicated_env(&names, pg).await;
        let three = bench_over("rollgate serve, amqp + postgres, 3 replicas", &env, 3, None).await;
        cleanup(&names).await;
        report(&[&ceiling, &consumed, &one, &three], &ceiling);
        one_ratio.push(one.accepted_per_s / ceiling.accepted_per_s);
        one_consumed.push(one.accepted_per_s / consumed.accepted_per_s);
        scaling.push(three.accepted_per_s / one.accepted_per_s);
    }
    println!(
        "amqp + postgres, median of {} rounds: 1 replica {:.2} of the publish ceiling ({:.2} of publish+consume); 3 replicas / 1 replica {:.2}",
        scaling.len(),
        median(one_ratio),
        median(one_consumed),
        median(scaling),
    );
}

async fn part_failover(pg: &support::postgres::Postgres) {
    let names = bench_names();
    let env = replicated_env(&names, pg).await;
    let (hist, kills) = bench_failover(&env).await;
    println!(
        "failover (store.lease_ttl 15s, the default): kill -9 of the active worker's replica \
         -> an event processed by another, {kills} kills: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0,
        hist.max() as f64 / 1000.0,
    );
    cleanup(&names).await;
}

fn main() {
    // `cargo test --benches` lists or runs bench targets; this one only runs under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!(
            "{CLIENTS} concurrent clients, {:?} per scenario after 1 s warm-up",
            secs()
        );
        let parts = std::env::var("BENCH_PARTS")
            .unwrap_or_else(|_| "embedded,amqp,tls,replicas,failover".into());
        let part = |name: &str| parts.split(',').any(|p| p.trim() == name);
        if part("embedded") {
            part_embedded().await;
        }
        if part("amqp") {
            part_amqp().await;
        }
        if part("tls") {
            part_tls().await;
        }
        if part("replicas") || part("failover") {
            let pg = support::postgres::Postgres::start();
            if part("replicas") {
                part_replicas(&pg).await;
            }
            if part("failover") {
                part_failover(&pg).await;
            }
        }
    });
}
