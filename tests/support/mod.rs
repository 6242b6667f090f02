//! Test harness: runs the real `rollgate` binary in a temp dir, and talks to the real
//! RabbitMQ on 127.0.0.1:5672 with names unique to each test.
#![allow(dead_code)]

pub mod clients;
pub mod cluster;
pub mod disk;
pub mod etcd;
pub mod etcd_pods;
pub mod ground;
pub mod k3s;
pub mod kube;
pub mod manifests;
pub mod node_metrics;
pub mod nodes;
pub mod openapi;
pub mod pki;
pub mod postgres;
pub mod rabbit;
pub mod rehearsal;
pub mod replicas;
pub mod sandbox;
pub mod scripted;
pub mod services;
pub mod shipped;
pub mod stacked;
pub mod timeline;
pub mod webdriver;
pub mod witness;

use serde_json::{Value, json};
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `rollgate` binary: the one cargo built for this test, or, for the sandbox example
/// (`target/<profile>/examples/sandbox`), the one beside its directory.
pub fn rollgate_bin() -> PathBuf {
    if let Some(bin) = option_env!("CARGO_BIN_EXE_rollgate") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("this program's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/examples/");
    profile_dir.join("rollgate")
}

/// A figure of `/proc/PROC/status` given in kB (`VmHWM`, `VmRSS`), in MB; `proc` is a pid
/// or `self`.
pub fn proc_status_mb(proc: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{proc}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// libfaketime, which scripts/test.sh installs: steps a process's wall clock.
pub const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// rollgate's kube adapter for the cluster of `kubeconfig` (namespace `default`, the
/// `rollgate.io` annotations, 10 s per request).
pub async fn rollgate_kube(kubeconfig: &std::path::Path) -> rollgate::adapters::kube::Kube {
    use rollgate::adapters::kube::{Kube, KubeSettings, Source};
    Kube::new(KubeSettings {
        source: Source::Kubeconfig {
            path: kubeconfig.to_owned(),
            context: None,
        },
        namespace: "default".into(),
        annotation_prefix: "rollgate.io".into(),
        request_timeout: Duration::from_secs(10),
    })
    .await
    .expect("rollgate's kube client")
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after `deadline`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free loopback port, below Linux's ephemeral range (32768–60999) and never handed out
/// twice by this process. A port from `bind(0)` is an ephemeral one: between the probe and
/// the service binding it, an outgoing connection (etcd peers, clients) can take it.
/// `ROLLGATE_TEST_PORTS=FIRST-LAST` narrows the range: `scripts/test.sh` gives each group
/// of test binaries it runs side by side a range of its own.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (first, span) = port_range();
    // Processes start at different offsets, so concurrent test binaries rarely meet.
    let offset = std::process::id().wrapping_mul(613) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(first + (offset + n) % span) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {first}..{}", first + span)
}

/// The first port `free_port` hands out and how many: 20000–31999, or
/// `ROLLGATE_TEST_PORTS`.
fn port_range() -> (u32, u32) {
    const WHOLE: (u32, u32) = (20_000, 12_000);
    let Ok(range) = std::env::var("ROLLGATE_TEST_PORTS") else {
        return WHOLE;
    };
    let parsed = range.split_once('-').and_then(|(a, b)| {
        let (a, b) = (a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?);
        (a >= 1024 && a <= b).then(|| (u32::from(a), u32::from(b) - u32::from(a) + 1))
    });
    parsed
        .unwrap_or_else(|| panic!("ROLLGATE_TEST_PORTS={range:?}: give FIRST-LAST, 1024 to 65535"))
}

/// A running `rollgate serve`.
pub struct Rollgate {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    pub token: String,
    pub http: reqwest::Client,
    /// `http`, or `https` for a TLS listener.
    pub scheme: &'static str,
    starts: u32,
    /// Where serve's output goes (`serve-N.log`): its temp dir unless a test says.
    log_dir: Option<PathBuf>,
}

impl Rollgate {
    /// Starts `rollgate serve` with `env` on top of a fresh data dir and port.
    pub async fn start(env: &[(&str, &str)]) -> Self {
        Self::start_on(free_port(), env).await
    }

    /// Starts `rollgate serve` on loopback `port` (one a Prometheus is already told to
    /// scrape, say).
    pub async fn start_on(port: u16, env: &[(&str, &str)]) -> Self {
        let http = Self::client_builder().build().expect("client");
        Self::start_with(port, env, "http", http).await
    }

    /// The HTTP client the harness talks to rollgate with, before any TLS settings.
    pub fn client_builder() -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            // Below actix's 5 s keep-alive: never reuse a connection the server is closing.
            .pool_idle_timeout(Duration::from_secs(2))
    }

    /// Starts `rollgate serve` reached at `scheme://127.0.0.1:port` with `http` (an
    /// HTTPS listener: scheme `https` and a client that trusts its CA).
    pub async fn start_with(
        port: u16,
        env: &[(&str, &str)],
        scheme: &'static str,
        http: reqwest::Client,
    ) -> Self {
        let mut rg = Self::unstarted(port, env, scheme, http, None);
        rg.spawn().await;
        rg
    }

    /// Starts `rollgate serve` with its output appended to `serve-N.log` under `dir`, as a
    /// VM's unit appends it to a file (`>> /var/log/rollgate.log 2>&1`).
    pub async fn start_logging_in(dir: &std::path::Path, env: &[(&str, &str)]) -> Self {
        std::fs::create_dir_all(dir).expect("log dir");
        let http = Self::client_builder().build().expect("client");
        let mut rg = Self::unstarted(free_port(), env, "http", http, Some(dir.to_owned()));
        rg.spawn().await;
        rg
    }

    fn unstarted(
        port: u16,
        env: &[(&str, &str)],
        scheme: &'static str,
        http: reqwest::Client,
        log_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
            port,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            token: String::new(),
            http,
            scheme,
            starts: 0,
            log_dir,
        }
    }

    /// The process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How the process ended, if it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The data dir: `data` in its temp dir, unless the test set `ROLLGATE__DATA_DIR`.
    pub fn data_dir(&self) -> PathBuf {
        self.env
            .iter()
            .find(|(k, _)| k == "ROLLGATE__DATA_DIR")
            .map_or_else(|| self.dir.path().join("data"), |(_, v)| PathBuf::from(v))
    }

    pub fn base(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    fn log_path(&self) -> PathBuf {
        self.log_dir
            .as_deref()
            .unwrap_or(self.dir.path())
            .join(format!("serve-{}.log", self.starts))
    }

    /// Sets (or replaces) an environment variable for the next start.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
    }

    pub fn remove_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
    }

    async fn spawn(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let mut cmd = Command::new(rollgate_bin());
        cmd.arg("serve")
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "ROLLGATE__SERVER__LISTEN",
                format!("127.0.0.1:{}", self.port),
            )
            .env("ROLLGATE__DATA_DIR", self.data_dir())
            .env("RUST_LOG", "info,rollgate=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn rollgate"));
        let base = self.base();
        let http = self.http.clone();
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("rollgate exited at start ({status}):\n{}", self.logs());
            }
            if let Ok(r) = http.get(format!("{base}/healthz")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "rollgate did not start:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        // The generated all-scopes token; none when only scoped tokens are configured (a
        // test then sets the token it talks with itself, kept across restarts).
        if let Ok(token) = std::fs::read_to_string(self.data_dir().join("api-token")) {
            self.token = token.trim().to_owned();
        }
    }

    /// Every log written so far, for failure messages.
    pub fn logs(&self) -> String {
        (1..=self.starts)
            .map(|i| {
                let p = self
                    .log_dir
                    .as_deref()
                    .unwrap_or(self.dir.path())
                    .join(format!("serve-{i}.log"));
                format!(
                    "--- start {i} ---\n{}",
                    std::fs::read_to_string(p).unwrap_or_default()
                )
            })
            .collect()
    }

    /// SIGKILL, no warning.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts again on the same data dir and port.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base()))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Asks for a `kind` upgrade to `target` (all stages); the run's id. Panics unless it
    /// is accepted (202).
    pub async fn detect(&self, target: &str, kind: &str) -> String {
        let (status, body) = self
            .post(
                "/v1/detections",
                &json!({"target_version": target, "kind": kind, "stages": "all"}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        body["run_id"].as_str().expect("run id").to_owned()
    }

    /// `POST /v1/runs/{id}/{action}` with `reason`; the status code.
    pub async fn control(&self, id: &str, action: &str, reason: &str) -> u16 {
        let path = format!("/v1/runs/{id}/{action}");
        self.post(&path, &json!({ "reason": reason })).await.0
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.base()))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The value of one metric sample (`name{labels}` exactly as exposed), 0 if absent.
    /// The whole `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base()))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    pub async fn metric(&self, sample: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| {
                l.strip_prefix(sample)
                    .and_then(|rest| rest.strip_prefix(' '))
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub async fn run(&self, id: &str) -> Value {
        let (status, run) = self.get(&format!("/v1/runs/{id}")).await;
        assert_eq!(status, 200, "GET run {id}: {run}");
        run
    }

    /// After a control that the worker applies later (resume, abort): waits until run `id`
    /// has left status `leaving`, then until it has status `want`.
    pub async fn wait_status_leaving(
        &self,
        id: &str,
        leaving: &str,
        want: &str,
        deadline: Duration,
    ) -> Value {
        self.wait_run_until(
            id,
            &format!("the run to leave {leaving}"),
            deadline,
            |run| run["status"] != leaving,
        )
        .await;
        self.wait_status(id, want, deadline).await
    }

    /// Waits (up to `deadline`) until run `id` has status `want`; fails at once if it
    /// ends in another status.
    pub async fn wait_status(&self, id: &str, want: &str, deadline: Duration) -> Value {
        eventually(&format!("run {want}"), deadline, || async {
            let run = self.run(id).await;
            let status = run["status"].as_str().unwrap_or_default().to_owned();
            if status == want {
                return Some(run);
            }
            assert!(
                !["failed", "aborted", "succeeded", "halted"].contains(&status.as_str()),
                "run ended {status} while waiting for {want}: {}\n{}",
                run["reason"],
                self.logs()
            );
            None
        })
        .await
    }

    /// Waits until run `id` is queued behind the cluster's lock, and asserts that it names
    /// run `holder` of `kind` as what it waits for.
    pub async fn wait_behind(&self, id: &str, holder: &str, kind: &str) {
        let run = self
            .wait_run_until(
                id,
                "the run to wait for the cluster",
                Duration::from_secs(120),
                |r| {
                    r["reason"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("waits for run"))
                },
            )
            .await;
        assert_eq!(
            run["reason"],
            format!("waits for run {holder} ({kind}) to release the cluster")
        );
    }

    /// Waits until run `id` satisfies `pred`.
    pub async fn wait_run(&self, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_run_until(id, what, Duration::from_secs(20), pred)
            .await
    }

    /// Waits up to `deadline` for run `id` to meet `pred`; returns it then.
    pub async fn wait_run_until(
        &self,
        id: &str,
        what: &str,
        deadline: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        eventually(what, deadline, || async {
            let (status, run) = self.get(&format!("/v1/runs/{id}")).await;
            (status == 200 && pred(&run)).then_some(run)
        })
        .await
    }
}

impl Drop for Rollgate {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// The same notification as [`webhook`], resolved now.
pub fn resolved(fingerprint: &str) -> Value {
    let mut body = webhook(fingerprint);
    body["status"] = json!("resolved");
    body["alerts"][0]["status"] = json!("resolved");
    body["alerts"][0]["endsAt"] = json!(chrono::Utc::now().to_rfc3339());
    body
}

/// Whether a history entry of `run` has `text` in its reason.
/// The step of `run` (as the API shows it) labelled `label`, e.g. `workers/gate@w2`.
pub fn find_step<'a>(run: &'a Value, label: &str) -> Option<&'a Value> {
    run["steps"]
        .as_array()?
        .iter()
        .find(|s| step_label(s).is_some_and(|l| l == label))
}

/// A step's `stage/name@node`, as the domain labels it.
pub fn step_label(step: &Value) -> Option<String> {
    rollgate::workflows::register();
    serde_json::from_value::<rollgate::domain::run::Step>(step.clone())
        .ok()
        .map(|s| s.label())
}

/// The workers of each batch of `run`, in plan order: the lanes between a workers' gate
/// and its soak.
pub fn worker_batches(run: &Value) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    for s in run["steps"].as_array().into_iter().flatten() {
        match (s["stage"].as_str(), s["name"].as_str()) {
            (Some("workers"), Some("gate")) => out.push(Vec::new()),
            (Some("workers"), Some("drain")) => out
                .last_mut()
                .expect("a drain after its batch's gate")
                .push(s["node"].as_str().unwrap_or_default().to_owned()),
            _ => {}
        }
    }
    out
}

pub fn history_has(run: &Value, text: &str) -> bool {
    run["history"].as_array().is_some_and(|h| {
        h.iter()
            .any(|e| e["reason"].as_str().unwrap_or_default().contains(text))
    })
}

/// An Alertmanager webhook body with one firing alert of `fingerprint`.
pub fn webhook(fingerprint: &str) -> Value {
    json!({
        "version": "4",
        "groupKey": "{}:{alertname=\"NodeNotReady\"}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "rollgate",
        "groupLabels": {"alertname": "NodeNotReady"},
        "commonLabels": {"alertname": "NodeNotReady"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [{
            "status": "firing",
            "labels": {"alertname": "NodeNotReady", "upgrade_gate": "true", "node": fingerprint},
            "annotations": {"summary": "node not ready"},
            "startsAt": "2026-11-30T06:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph",
            "fingerprint": fingerprint
        }]
    })
}

/// A queued wake for `run`, due `secs` from now.
pub fn wake_message(run: &str, secs: i64) -> rollgate::queue::Outgoing {
    use rollgate::domain::event::{CloudEvent, EventData, WakeRequest};
    let data = EventData::Wake(WakeRequest {
        run_id: run.into(),
        epoch: 1,
    });
    let event = CloudEvent::new(&data, "test", chrono::Utc::now());
    rollgate::queue::Outgoing {
        id: event.id.clone(),
        routing_key: "wake".into(),
        body: event.to_bytes(),
        not_before: Some(chrono::Utc::now() + chrono::Duration::seconds(secs)),
    }
}

/// Waits for the next delivery of `queue`, asserts it is `msg` and not early, and acks it.
pub async fn receive_on_time(queue: &dyn rollgate::queue::Queue, msg: &rollgate::queue::Outgoing) {
    let got = tokio::time::timeout(Duration::from_secs(10), queue.next())
        .await
        .expect("delivered within 10 s")
        .expect("next");
    let due = msg.not_before.expect("a delayed message");
    let now = chrono::Utc::now();
    assert!(
        now >= due,
        "delivered {} ms early",
        (due - now).num_milliseconds()
    );
    assert_eq!(got.body, msg.body);
    queue.ack(&got).await.expect("ack");
}

/// A detection body for a patch upgrade to `version`, every stage.
pub fn detection(version: &str) -> Value {
    json!({"target_version": version, "kind": "patch", "stages": "all"})
}

/// Whether `run` holds at its pre-flight gate because the gate cannot be evaluated (no
/// Prometheus configured: unknown is closed), as every run on an [`cluster::IntakeCluster`]
/// does.
pub fn held_at_preflight_gate(run: &Value) -> bool {
    let at_gate = run["current_step"]
        .as_u64()
        .and_then(|i| run["steps"].get(i as usize))
        .is_some_and(|s| s["stage"] == "preflight" && s["name"] == "gate");
    at_gate
        && run["status"] == "waiting"
        && run["reason"]
            .as_str()
            .is_some_and(|r| r.contains("gate unknown"))
}

/// `rollgate check-config` with only `env` (and a data dir under `dir`): its output.
pub fn check_config(dir: &std::path::Path, env: &[(String, String)]) -> std::process::Output {
    Command::new(rollgate_bin())
        .arg("check-config")
        .env_clear()
        .env("ROLLGATE__DATA_DIR", dir.join("data"))
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("check-config")
}

/// The alert board as fingerprint → times received.
pub async fn board(rg: &Rollgate) -> std::collections::HashMap<String, u64> {
    let (status, body) = rg.get("/v1/alerts").await;
    assert_eq!(status, 200, "{body}");
    body.as_array()
        .expect("array")
        .iter()
        .map(|e| {
            (
                e["alert"]["fingerprint"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                e["received"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

/// Follows `GET /v1/events?run=RUN` at `base` from the start of the log, reconnecting with
/// `Last-Event-ID` whenever the stream breaks (rollgate restarted), until a transition to
/// `until`; every transition seen, in the order received.
pub async fn follow_run_events(
    base: String,
    token: String,
    run: String,
    until: &str,
) -> Vec<Value> {
    let http = reqwest::Client::new();
    let mut seen: Vec<Value> = Vec::new();
    let mut last = "0".to_owned();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        assert!(
            Instant::now() < deadline,
            "no {until} in the stream: {seen:?}"
        );
        let connected = http
            .get(format!("{base}/v1/events"))
            .query(&[("run", run.as_str())])
            .bearer_auth(&token)
            .header("Last-Event-ID", &last)
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success());
        let Some(mut resp) = connected else {
            // rollgate is restarting: try again shortly.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut reader = rollgate::cli::watch::FrameReader::default();
        while let Ok(Some(chunk)) = resp.chunk().await {
            for frame in reader.push(&chunk) {
                if frame.event != "transition" {
                    continue;
                }
                let event: Value = serde_json::from_str(&frame.data).expect("a transition");
                last = frame.id.expect("a transition has an id");
                let done = event["to"] == until;
                seen.push(event);
                if done {
                    return seen;
                }
            }
        }
    }
}

/// A cheap xorshift seeded by the process id, for random moments that differ each run.
pub fn xorshift() -> impl FnMut() -> u64 {
    xorshift_from(std::process::id() as u64)
}

/// [`xorshift`] from `seed` (never 0), to replay a run's draws.
pub fn xorshift_from(seed: u64) -> impl FnMut() -> u64 {
    let mut seed = seed | 1;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// How many times `run`'s history records a restart of rollgate with the run unfinished.
pub fn restarts_recorded(run: &Value) -> usize {
    run["history"].as_array().map_or(0, |history| {
        history
            .iter()
            .filter(|h| {
                h["reason"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("rollgate restarted"))
            })
            .count()
    })
}

/// The labels of `run`'s workers' gates and soaks, in plan order.
pub fn workers_gates_and_soaks(run: &Value) -> Vec<String> {
    run["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .filter_map(step_label)
                .filter(|l| l.starts_with("workers/gate") || l.starts_with("workers/soak"))
                .collect()
        })
        .unwrap_or_default()
}

fn always(_: &rollgate::domain::run::Step) -> bool {
    true
}

/// An engine context at `now` where every step can execute, with the worker's retry policy
/// and no failure budget: for tests that drive runs through the engine by hand.
pub fn engine_context(
    now: chrono::DateTime<chrono::Utc>,
) -> rollgate::domain::engine::Context<'static> {
    rollgate::domain::engine::Context {
        now,
        can_execute: &always,
        max_attempts: 3,
        halt_after: chrono::Duration::minutes(30),
        retry: rollgate::worker::WorkerPolicy::STEP_RETRY,
        jitter: 0.5,
        failure_budget: Default::default(),
    }
}
