//! Real Prometheus and Alertmanager (Debian's packages) on loopback in temp dirs, stopped
//! by PID; and a tiny HTTP server that stands in for a scrape target or a Slack webhook.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::free_port;

/// A child process that is killed when dropped.
pub struct Process {
    name: &'static str,
    program: &'static str,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    pub fn spawn(
        name: &'static str,
        program: &'static str,
        args: Vec<String>,
        log: PathBuf,
    ) -> Self {
        let mut p = Self {
            name,
            program,
            args,
            log,
            child: None,
        };
        p.start();
        p
    }

    /// Starts it (again) with the same arguments.
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let child = Command::new(self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} ({}): {e}; is its Debian package installed?",
                    self.name, self.program
                )
            });
        self.child = Some(child);
    }

    /// Stops it with SIGTERM and waits for the exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends it SIGHUP (Prometheus reloads its configuration).
    pub fn hangup(&self) {
        if let Some(child) = &self.child {
            let sent = Command::new("kill")
                .args(["-HUP", &child.id().to_string()])
                .status()
                .expect("kill");
            assert!(sent.success(), "SIGHUP to {}", self.name);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.name, self.logs());
        }
    }
}

pub async fn wait_http_ok(url: &str, what: &str, proc: &Process) {
    let http = reqwest::Client::new();
    let start = Instant::now();
    loop {
        if let Ok(r) = http.get(url).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} did not become ready:\n{}",
            proc.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The repository's rules directory.
pub fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rules")
}

/// The harness's always-firing `Watchdog` rule (`tests/support/watchdog.yml`), as
/// kube-prometheus ships it.
pub fn watchdog_rule() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/watchdog.yml")
}

/// What a [`Prometheus`] loads.
#[derive(Debug, Clone, Copy)]
pub struct Loads {
    /// rules/ (the gate's rule group).
    pub gate_rules: bool,
    /// The `Watchdog` rule.
    pub watchdog: bool,
}

impl Loads {
    /// What a site's Prometheus loads: rules/ and the watchdog.
    pub const ALL: Self = Self {
        gate_rules: true,
        watchdog: true,
    };
}

/// Prometheus scraping one target every second, loading rules/ and the watchdog, and
/// sending its alerts to the Alertmanager at `alertmanager_port` (reserved here: a test
/// that wants its alerts starts one there). The target stands in for the cluster, so its
/// job is `apiserver`: otherwise `KubeAPIServerDown` (rightly) fires after two minutes and
/// closes every gate.
pub struct Prometheus {
    pub port: u16,
    pub process: Process,
    /// Where it sends its alerts.
    pub alertmanager_port: u16,
    target: String,
    /// Scrape jobs besides `apiserver` (YAML list items), from [`Prometheus::scrape_nodes`].
    jobs: String,
    loads: Loads,
    dir: tempfile::TempDir,
}

impl Prometheus {
    pub async fn start(target: &str) -> Self {
        Self::loading(target, Loads::ALL).await
    }

    /// Prometheus loading `loads`; once ready and, with the watchdog, once it fires.
    pub async fn loading(target: &str, loads: Loads) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let (port, alertmanager_port) = (free_port(), free_port());
        write_prometheus_config(d, target, alertmanager_port, loads, "");
        let args = vec![
            format!("--config.file={}", d.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", d.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            // Firing alerts go to Alertmanager every second, not every minute: one started
            // after Prometheus has its watchdog within a second.
            "--rules.alert.resend-delay=1s".into(),
        ];
        let process = Process::spawn("prometheus", "prometheus", args, d.join("prometheus.log"));
        let p = Self {
            port,
            process,
            alertmanager_port,
            target: target.to_owned(),
            jobs: String::new(),
            loads,
            dir,
        };
        p.wait_loaded(loads).await;
        p
    }

    /// Loads `loads` instead (a restart with the new configuration, as a rollout of a
    /// site's Prometheus is); once ready and, with the watchdog, once it fires again.
    pub async fn reload(&mut self, loads: Loads) {
        self.loads = loads;
        write_prometheus_config(
            self.dir.path(),
            &self.target,
            self.alertmanager_port,
            loads,
            &self.jobs,
        );
        self.process.stop();
        self.process.start();
        self.wait_loaded(loads).await;
    }

    async fn wait_loaded(&self, loads: Loads) {
        self.wait_ready().await;
        if loads.watchdog {
            wait_json(
                &format!("{}/api/v1/query", self.url()),
                &[(
                    "query",
                    r#"ALERTS{alertname="Watchdog",alertstate="firing"}"#,
                )],
                ("the watchdog to fire", &self.process),
                |a| {
                    a["data"]["result"]
                        .as_array()
                        .is_some_and(|r| !r.is_empty())
                },
            )
            .await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Scrapes also each node's exporter (`(node, address)`) every second, as job `nodes`,
    /// its series labelled `node` as a real cluster's relabelling would: reloaded by
    /// SIGHUP, and back once every one of them is up.
    pub async fn scrape_nodes(&mut self, exporters: &[(String, String)]) {
        let mut jobs = String::from("  - job_name: nodes\n    static_configs:\n");
        for (node, address) in exporters {
            jobs.push_str(&format!(
                "      - targets: ['{address}']\n        labels: {{node: '{node}'}}\n"
            ));
        }
        self.jobs = jobs;
        write_prometheus_config(
            self.dir.path(),
            &self.target,
            self.alertmanager_port,
            self.loads,
            &self.jobs,
        );
        self.process.hangup();
        let want = exporters.len().to_string();
        wait_json(
            &format!("{}/api/v1/query", self.url()),
            &[("query", r#"count(up{job="nodes"} == 1)"#)],
            ("every node's exporter to be up", &self.process),
            |a| a["data"]["result"][0]["value"][1].as_str() == Some(want.as_str()),
        )
        .await;
    }

    pub async fn wait_ready(&self) {
        wait_http_ok(
            &format!("{}/-/ready", self.url()),
            "prometheus",
            &self.process,
        )
        .await;
    }
}

/// Polls `GET url?query` every 50 ms until its JSON answer meets `done`; after 30 s fails
/// naming `what`, with `process`'s log.
async fn wait_json(
    url: &str,
    query: &[(&str, &str)],
    (what, process): (&str, &Process),
    done: impl Fn(&Value) -> bool,
) {
    let start = Instant::now();
    loop {
        let answer: Option<Value> = match reqwest::Client::new().get(url).query(query).send().await
        {
            Ok(r) => r.json().await.ok(),
            Err(_) => None,
        };
        if answer.as_ref().is_some_and(&done) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}:\n{}",
            process.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `d/prometheus.yml`: `target` scraped every second, and `jobs`; `loads` loaded,
/// alerts sent to the Alertmanager at `alertmanager_port`.
fn write_prometheus_config(
    d: &Path,
    target: &str,
    alertmanager_port: u16,
    loads: Loads,
    jobs: &str,
) {
    let mut rules = Vec::new();
    if loads.gate_rules {
        rules.push(format!("{}/*.yml", rules_dir().display()));
    }
    if loads.watchdog {
        rules.push(watchdog_rule().display().to_string());
    }
    let rules: String = rules.iter().map(|r| format!("  - {r}\n")).collect();
    std::fs::write(
        d.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{alertmanager_port}']\n\
             rule_files:\n{rules}scrape_configs:\n  - job_name: apiserver\n    static_configs:\n      - targets: ['{target}']\n{jobs}",
        ),
    )
    .expect("config");
}

/// Alertmanager with one webhook receiver, bearer token from a file.
pub struct Alertmanager {
    pub port: u16,
    pub process: Process,
    _dir: tempfile::TempDir,
}

impl Alertmanager {
    pub async fn start(webhook_url: &str, token_file: &Path) -> Self {
        Self::with_tls(webhook_url, token_file, None).await
    }

    /// Alertmanager whose webhook receiver also sets `tls_config` with `tls` (name, path
    /// pairs such as `("ca_file", …)`, `("cert_file", …)`).
    pub async fn with_tls(
        webhook_url: &str,
        token_file: &Path,
        tls: Option<&[(&str, &Path)]>,
    ) -> Self {
        let mut config = format!(
            "route:\n  receiver: rollgate\n  group_by: ['...']\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: rollgate\n    webhook_configs:\n      - url: {webhook_url}\n        send_resolved: true\n        http_config:\n          authorization:\n            type: Bearer\n            credentials_file: {}\n",
            token_file.display()
        );
        if let Some(tls) = tls {
            config.push_str("          tls_config:\n");
            for (key, path) in tls {
                config.push_str(&format!("            {key}: {}\n", path.display()));
            }
        }
        Self::with_config(&config, free_port()).await
    }

    /// Alertmanager on loopback `port` with `config` (alertmanager.yml), once ready.
    pub async fn with_config(config: &str, port: u16) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("alertmanager.yml");
        std::fs::write(&file, config).expect("config");
        let args = vec![
            format!("--config.file={}", file.display()),
            format!("--storage.path={}", dir.path().join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--cluster.listen-address=".into(),
        ];
        let process = Process::spawn(
            "alertmanager",
            "prometheus-alertmanager",
            args,
            dir.path().join("alertmanager.log"),
        );
        let am = Self {
            port,
            process,
            _dir: dir,
        };
        wait_http_ok(
            &format!("http://127.0.0.1:{port}/-/ready"),
            "alertmanager",
            &am.process,
        )
        .await;
        am
    }

    /// Waits until it lists an active alert called `name`: the watchdog, once the
    /// Prometheus that alerts to it has sent it.
    pub async fn wait_lists(&self, name: &str) {
        let filter = format!("alertname={name:?}");
        wait_json(
            &format!("http://127.0.0.1:{}/api/v2/alerts", self.port),
            &[("active", "true"), ("filter", filter.as_str())],
            (&format!("Alertmanager to list {name}"), &self.process),
            |l| l.as_array().is_some_and(|a| !a.is_empty()),
        )
        .await;
    }

    /// Posts a gate alert to Alertmanager's API; `resolved` sets endsAt in the past.
    pub async fn post_alert(&self, name: &str, resolved: bool) {
        let labels =
            serde_json::json!({"alertname": name, "upgrade_gate": "true", "severity": "critical"});
        self.post_labelled(labels, resolved).await;
    }

    /// Posts an alert with `labels` to Alertmanager's API; `resolved` sets endsAt in the
    /// past.
    pub async fn post_labelled(&self, labels: Value, resolved: bool) {
        let now = chrono::Utc::now();
        let mut alert = serde_json::json!({
            "labels": labels,
            "annotations": {"summary": "test alert"},
            "startsAt": (now - chrono::Duration::minutes(1)).to_rfc3339(),
        });
        if resolved {
            alert["endsAt"] = Value::String((now - chrono::Duration::seconds(1)).to_rfc3339());
        }
        let r = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/api/v2/alerts", self.port))
            .json(&serde_json::json!([alert]))
            .send()
            .await
            .expect("alertmanager answers");
        assert!(
            r.status().is_success(),
            "alertmanager refused the alert: {}",
            r.status()
        );
    }

    /// Creates a silence of the alerts whose labels equal `matchers` for an hour; its id.
    pub async fn silence(&self, matchers: &[(&str, &str)]) -> String {
        let now = chrono::Utc::now();
        let matchers: Vec<Value> = matchers
            .iter()
            .map(|(name, value)| serde_json::json!({"name": name, "value": value, "isRegex": false, "isEqual": true}))
            .collect();
        let body = serde_json::json!({
            "matchers": matchers,
            "startsAt": now.to_rfc3339(),
            "endsAt": (now + chrono::Duration::hours(1)).to_rfc3339(),
            "createdBy": "on-call",
            "comment": "looking into it",
        });
        let request = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/api/v2/silences", self.port))
            .json(&body);
        let answer = answer_of(request).await;
        answer["silenceID"]
            .as_str()
            .unwrap_or_else(|| panic!("no silence id: {answer}"))
            .to_owned()
    }

    /// Every silence Alertmanager holds (active, pending and expired).
    pub async fn silences(&self) -> Vec<Value> {
        let request =
            reqwest::Client::new().get(format!("http://127.0.0.1:{}/api/v2/silences", self.port));
        let all = answer_of(request).await;
        all.as_array().cloned().unwrap_or_default()
    }

    /// Expires silence `id` now.
    pub async fn expire(&self, id: &str) {
        let r = reqwest::Client::new()
            .delete(format!(
                "http://127.0.0.1:{}/api/v2/silence/{id}",
                self.port
            ))
            .send()
            .await
            .expect("alertmanager answers");
        assert!(r.status().is_success(), "expire {id}: {}", r.status());
    }

    /// The alerts Alertmanager holds named `name`, with their status.
    pub async fn alerts_named(&self, name: &str) -> Vec<Value> {
        let request =
            reqwest::Client::new().get(format!("http://127.0.0.1:{}/api/v2/alerts", self.port));
        let all = answer_of(request).await;
        all.as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["labels"]["alertname"] == name)
            .cloned()
            .collect()
    }
}

/// The JSON answer to `request`, sent to Alertmanager.
async fn answer_of(request: reqwest::RequestBuilder) -> Value {
    request
        .send()
        .await
        .expect("alertmanager answers")
        .json()
        .await
        .expect("json")
}

/// A tiny HTTP/1.1 server: serves `metrics` at GET /metrics, records every other request
/// (head and JSON body) and answers it with `status` and `reply` after `delay`.
#[derive(Clone)]
pub struct MiniServer {
    pub port: u16,
    pub metrics: Arc<Mutex<String>>,
    pub received: Arc<Mutex<Vec<Value>>>,
    pub heads: Arc<Mutex<Vec<String>>>,
    pub status: Arc<Mutex<u16>>,
    pub reply: Arc<Mutex<String>>,
    pub delay: Arc<Mutex<Duration>>,
}

impl MiniServer {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = Self {
            port,
            metrics: Arc::new(Mutex::new(String::new())),
            received: Arc::new(Mutex::new(Vec::new())),
            heads: Arc::new(Mutex::new(Vec::new())),
            status: Arc::new(Mutex::new(200)),
            reply: Arc::new(Mutex::new("ok".into())),
            delay: Arc::new(Mutex::new(Duration::ZERO)),
        };
        let s = server.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let (head_end, length) = loop {
                        let Ok(n) = sock.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..pos]).to_ascii_lowercase();
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            break (pos + 4, length);
                        }
                    };
                    while buf.len() < head_end + length {
                        let Ok(n) = sock.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            break;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let (status, body) = if head.starts_with("GET /metrics") {
                        (200, s.metrics.lock().unwrap().clone())
                    } else {
                        let body = &buf[head_end..(head_end + length).min(buf.len())];
                        // The answer is the one in force when the request is recorded,
                        // decided under the same lock `set_reply` takes: a test that sees
                        // a request and then changes the reply never changes that
                        // request's answer.
                        let answer = {
                            let mut received = s.received.lock().unwrap();
                            let answer =
                                (*s.status.lock().unwrap(), s.reply.lock().unwrap().clone());
                            received.push(serde_json::from_slice(body).unwrap_or(Value::Null));
                            s.heads.lock().unwrap().push(head.clone());
                            answer
                        };
                        let delay = *s.delay.lock().unwrap();
                        tokio::time::sleep(delay).await;
                        answer
                    };
                    let content_type = if body.starts_with('{') {
                        "application/json"
                    } else {
                        "text/plain"
                    };
                    let answer = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(answer.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        server
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn set_metrics(&self, text: &str) {
        *self.metrics.lock().unwrap() = text.to_owned();
    }

    /// The answer to every request recorded from now on.
    pub fn set_reply(&self, status: u16, body: &str) {
        let _recording = self.received.lock().unwrap();
        *self.status.lock().unwrap() = status;
        *self.reply.lock().unwrap() = body.to_owned();
    }

    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }

    pub fn received(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }
}

/// Debian's Prometheus Pushgateway on loopback.
pub struct Pushgateway {
    pub port: u16,
    pub process: Process,
    _dir: tempfile::TempDir,
}

impl Pushgateway {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let process = Process::spawn(
            "pushgateway",
            "prometheus-pushgateway",
            vec![format!("--web.listen-address=127.0.0.1:{port}")],
            dir.path().join("pushgateway.log"),
        );
        let p = Self {
            port,
            process,
            _dir: dir,
        };
        wait_http_ok(&format!("{}/-/ready", p.url()), "pushgateway", &p.process).await;
        p
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The sample lines of `/metrics` for `metric` (`name{labels} value`).
    pub async fn samples(&self, metric: &str) -> Vec<String> {
        let text = reqwest::get(format!("{}/metrics", self.url()))
            .await
            .expect("pushgateway answers")
            .text()
            .await
            .expect("text");
        text.lines()
            .filter(|l| {
                l.starts_with(&format!("{metric}{{")) || l.starts_with(&format!("{metric} "))
            })
            .map(str::to_owned)
            .collect()
    }
}

/// A package repository laid out like pkgs.k8s.io (`/v1.NN/deb/Release`, `Packages`),
/// served from a temp dir: GET and HEAD of files, 404 for anything else.
pub struct RepoServer {
    pub port: u16,
    pub dir: tempfile::TempDir,
    handle: actix_web::dev::ServerHandle,
}

impl RepoServer {
    pub async fn start() -> Self {
        use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
        let dir = tempfile::tempdir().expect("tempdir");
        let root = web::Data::new(dir.path().to_owned());
        async fn serve(req: HttpRequest, root: web::Data<PathBuf>) -> HttpResponse {
            let rel = req.path().trim_start_matches('/');
            if rel.split('/').any(|p| p == "..") {
                return HttpResponse::BadRequest().finish();
            }
            match std::fs::read(root.join(rel)) {
                Ok(body) => HttpResponse::Ok().content_type("text/plain").body(body),
                Err(_) => HttpResponse::NotFound().finish(),
            }
        }
        let server = HttpServer::new(move || {
            App::new()
                .app_data(root.clone())
                .default_service(web::to(serve))
        })
        .workers(1)
        .disable_signals()
        .bind("127.0.0.1:0")
        .expect("bind");
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Self { port, dir, handle }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/core:/stable:", self.port)
    }

    /// Publishes minor `minor` (e.g. `1.35`) holding these kubeadm package versions.
    pub fn publish(&self, minor: &str, kubeadm: &[&str]) {
        let d = self.dir.path().join(format!("core:/stable:/v{minor}/deb"));
        std::fs::create_dir_all(&d).expect("repo dir");
        std::fs::write(
            d.join("Release"),
            format!("Origin: test\nSuite: v{minor}\n"),
        )
        .expect("Release");
        let index: Vec<String> = kubeadm
            .iter()
            .map(|v| format!("Package: kubeadm\nVersion: {v}\nArchitecture: amd64\n"))
            .collect();
        std::fs::write(d.join("Packages"), index.join("\n")).expect("Packages");
    }

    pub async fn stop(&self) {
        self.handle.stop(false).await;
    }
}
