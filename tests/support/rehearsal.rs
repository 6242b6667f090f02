//! A time-scaled rehearsal of a whole upgrade: the test ground's fake cluster (whose API
//! server also serves the exporters' metrics), `rollgate serve`, a real Prometheus that
//! scrapes both, the etcd member and loads the shipped rules, and a real Alertmanager with
//! the shipped receiver and inhibition routing to rollgate. Every duration that shapes
//! the timeline is the real one times [`SCALE`]: rollgate's defaults (soak, timeouts,
//! gate poll and halt, the quiet period, lease), the rules' `for:`, ranges and time
//! constants, Prometheus's scrape and evaluation intervals and lookback, Alertmanager's
//! group timings. Network bounds on one request (connect and request timeouts) are not
//! timeline durations and stay as they are.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Rollgate;
use super::free_port;
use super::ground::Ground;
use super::node_metrics::{METRIC, NodeExporters, Upgraded};
use super::pki::{TestCa, TlsFiles};
use super::services::{Alertmanager, Process, rules_dir, wait_http_ok};

/// Rehearsal time over real time: 10 minutes of soak take 5 seconds.
pub const SCALE: f64 = 1.0 / 120.0;

/// A rehearsal's time over real time. Most rehearse at [`SCALE`]; one whose timeline
/// holds a restart that no setting scales (an embedded etcd member's, seconds of real time
/// whatever the factor) rehearses at a factor where that restart keeps its real share of
/// the rules' waits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale(pub f64);

impl Default for Scale {
    fn default() -> Self {
        Self(SCALE)
    }
}

/// `real` at [`SCALE`], as a duration Prometheus, Alertmanager and rollgate all read.
pub fn scaled(real: Duration) -> String {
    Scale::default().text(real)
}

/// `expr` at [`SCALE`]: [`Scale::ranges`].
pub fn scale_ranges(expr: &str) -> String {
    Scale::default().ranges(expr)
}

/// `expr` at [`SCALE`]: [`Scale::time_constants`].
pub fn scale_time_constants(expr: &str) -> String {
    Scale::default().time_constants(expr)
}

/// The shipped rules at [`SCALE`]: [`Scale::rules`].
pub fn scaled_rules() -> String {
    Scale::default().rules()
}

/// A Prometheus duration (`30m`, `1h`, `90s`, `2d`) in seconds.
fn prometheus_seconds(text: &str) -> u64 {
    let (number, unit) = text.split_at(text.len() - 1);
    let n: u64 = number
        .parse()
        .unwrap_or_else(|_| panic!("{text:?} is not a duration this rehearsal scales"));
    n * match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => panic!("{text:?}: unit {unit:?}"),
    }
}

impl Scale {
    /// `real`, scaled, as a duration Prometheus, Alertmanager and rollgate all read.
    pub fn text(self, real: Duration) -> String {
        format!(
            "{}ms",
            ((real.as_secs_f64() * self.0) * 1000.0).round().max(1.0) as u64
        )
    }

    /// `real`, scaled, as a Duration.
    pub fn duration(self, real: Duration) -> Duration {
        real.mul_f64(self.0)
    }

    /// `expr` with every range selector `[D]` scaled.
    pub fn ranges(self, expr: &str) -> String {
        let mut out = String::new();
        let mut rest = expr;
        while let Some(open) = rest.find('[') {
            let close = rest[open..].find(']').expect("a closed range") + open;
            out.push_str(&rest[..open]);
            let seconds = prometheus_seconds(&rest[open + 1..close]);
            out.push('[');
            out.push_str(&self.text(Duration::from_secs(seconds)));
            out.push(']');
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        out
    }

    /// `expr` with the number every `time() - X` is compared with (`> 3 * 3600`, `< 600`)
    /// scaled; panics unless each `time()` had one, so a new form fails here, loudly.
    pub fn time_constants(self, expr: &str) -> String {
        let mut out = String::new();
        let mut rest = expr;
        while let Some(at) = rest.find("time()") {
            let cmp = rest[at..]
                .find(['<', '>'])
                .unwrap_or_else(|| panic!("time() without a comparison in {expr:?}"))
                + at
                + 1;
            let tail = &rest[cmp..];
            let digits = tail.trim_start();
            let len = digits
                .find(|c: char| !(c.is_ascii_digit() || c == ' ' || c == '*'))
                .unwrap_or(digits.len());
            let constant = digits[..len].trim();
            let seconds: u64 = constant
                .split('*')
                .map(|f| {
                    f.trim()
                        .parse::<u64>()
                        .unwrap_or_else(|_| panic!("{constant:?} in {expr:?}"))
                })
                .product();
            out.push_str(&rest[..cmp]);
            out.push_str(&format!(" {} ", seconds as f64 * self.0));
            rest = &digits[constant.len()..];
        }
        out.push_str(rest);
        out
    }

    /// The shipped rules (`rules/upgrade-gates.yml`) with every `for:`, range and time
    /// constant scaled, as YAML.
    pub fn rules(self) -> String {
        let text = std::fs::read_to_string(rules_dir().join("upgrade-gates.yml")).expect("rules");
        let mut doc: Value = serde_norway::from_str(&text).expect("rules parse");
        for group in doc["groups"].as_array_mut().expect("groups") {
            for rule in group["rules"].as_array_mut().expect("rules") {
                if let Some(f) = rule["for"].as_str() {
                    rule["for"] = self.text(Duration::from_secs(prometheus_seconds(f))).into();
                }
                let expr = rule["expr"].as_str().expect("expr");
                rule["expr"] = self.time_constants(&self.ranges(expr)).into();
            }
        }
        serde_norway::to_string(&doc).expect("yaml")
    }

    /// What rollgate's configuration would be in production, scaled: every timeline
    /// duration at its default times this factor.
    pub fn rollgate_env(self) -> Vec<(&'static str, String)> {
        let scaled = |d| self.text(d);
        let cluster = rollgate::config::ClusterSettings::default();
        let gate = rollgate::config::GateSettings::default();
        let ssh = rollgate::config::SshConfig::default();
        let etcd = rollgate::config::EtcdConfig::default();
        let queue = rollgate::config::QueueSettings::default();
        let reboot = rollgate::workflows::node_reboot::config::RebootConfig::default();
        vec![
            ("ROLLGATE__CLUSTER__SOAK", scaled(cluster.soak)),
            (
                "ROLLGATE__CLUSTER__VERIFY_TIMEOUT",
                scaled(cluster.verify_timeout),
            ),
            (
                "ROLLGATE__CLUSTER__CONTROL_PLANE_HEALTH_TIMEOUT",
                scaled(cluster.control_plane_health_timeout),
            ),
            (
                "ROLLGATE__CLUSTER__DRAIN_TIMEOUT",
                scaled(cluster.drain_timeout),
            ),
            (
                "ROLLGATE__CLUSTER__EVICTION_RETRY",
                scaled(cluster.eviction_retry),
            ),
            ("ROLLGATE__GATE__POLL_INTERVAL", scaled(gate.poll_interval)),
            ("ROLLGATE__GATE__HALT_AFTER", scaled(gate.halt_after)),
            (
                "ROLLGATE__GATE__QUIET_QUERY",
                self.ranges(&gate.quiet_query),
            ),
            (
                "ROLLGATE__SSH__COMMAND_TIMEOUT",
                scaled(ssh.command_timeout),
            ),
            (
                "ROLLGATE__ETCD__TRANSFER_TIMEOUT",
                scaled(etcd.transfer_timeout),
            ),
            ("ROLLGATE__QUEUE__LEASE", scaled(queue.lease)),
            ("ROLLGATE__REBOOT__TIMEOUT", scaled(reboot.timeout)),
            // The fake node's sentinel (reboot.sentinel_file's place on a real one).
            (
                "ROLLGATE__REBOOT__SENTINEL_COMMAND",
                "test -e \"$STUB_STATE/reboot-required\"".to_owned(),
            ),
        ]
    }
}

/// The ground, rollgate, and the Prometheus and Alertmanager that watch them.
pub struct Rehearsal {
    /// Its time over real time.
    pub scale: Scale,
    pub ground: Ground,
    pub rg: Rollgate,
    pub prometheus: Process,
    pub prometheus_port: u16,
    pub alertmanager: Alertmanager,
    /// With batch analyses on ([`Rehearsal::start_judged_alone`]): each node's exporter.
    pub node_exporters: Option<NodeExporters>,
    _dir: tempfile::TempDir,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

/// How many rehearsals run at once. Each is a whole site (seven sshd nodes, Prometheus,
/// Alertmanager, etcd, rollgate); all of them at once on two cores make an SSH connect
/// take seconds, which at 1/120 scale are minutes the scaled rules count (the pre-flight
/// alone outlasting `EtcdPreUpgradeSnapshotMissing`'s `for:`), a load no site has.
const AT_ONCE: usize = 3;

static SLOTS: std::sync::LazyLock<std::sync::Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(tokio::sync::Semaphore::new(AT_ONCE)));

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// The operators' token of the rehearsal (every scope, as `server.token_file`).
const ADMIN_TOKEN: &str = "rehearsal-admin-0123456789";

/// rollgate's listener as the example site runs it: HTTPS with a certificate for
/// `rollgate.rollgate.svc` from a CA Alertmanager and Prometheus trust, and Alertmanager
/// holding a token that may only post alerts.
struct Listener {
    ca: TestCa,
    ca_file: PathBuf,
    tls: TlsFiles,
    tokens_dir: PathBuf,
    alertmanager_token: PathBuf,
    admin_token: PathBuf,
}

impl Listener {
    fn write(d: &Path) -> Self {
        let ca = TestCa::new("rehearsal CA");
        let tls = ca
            .server_for("rollgate", &["rollgate.rollgate.svc"])
            .write(d, "tls");
        let ca_file = ca.write(d, "ca.crt");
        let tokens_dir = d.join("clients");
        std::fs::create_dir(&tokens_dir).expect("clients");
        let alertmanager_token = tokens_dir.join("alertmanager");
        std::fs::write(&alertmanager_token, "rehearsal-am-0123456789\n").expect("token");
        let admin_token = d.join("admin-token");
        std::fs::write(&admin_token, format!("{ADMIN_TOKEN}\n")).expect("token");
        Self {
            ca,
            ca_file,
            tls,
            tokens_dir,
            alertmanager_token,
            admin_token,
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        let path = |p: &Path| p.display().to_string();
        vec![
            (
                "ROLLGATE__SERVER__TLS_CERT_FILE".into(),
                path(&self.tls.cert),
            ),
            ("ROLLGATE__SERVER__TLS_KEY_FILE".into(), path(&self.tls.key)),
            (
                "ROLLGATE__SERVER__TOKENS_DIR".into(),
                path(&self.tokens_dir),
            ),
            (
                "ROLLGATE__SERVER__SCOPES__ALERTMANAGER".into(),
                "alerts:write".into(),
            ),
            (
                "ROLLGATE__SERVER__TOKEN_FILE".into(),
                path(&self.admin_token),
            ),
        ]
    }

    fn client(&self) -> reqwest::Client {
        Rollgate::client_builder()
            .add_root_certificate(self.ca.trust())
            .build()
            .expect("client")
    }
}

impl Rehearsal {
    /// A control plane and `workers` workers at `kubelet`, and everything watching them.
    pub async fn start(kubelet: &str, workers: usize) -> Self {
        Self::start_taking(1, kubelet, workers, false).await
    }

    /// As [`Rehearsal::start`], with the machine to itself: for a rehearsal whose scaled
    /// timeline has no room for the unscaled SSH handshakes of a loaded machine (the
    /// upgrade's pre-flight connects to every node between marking the upgrade in flight
    /// and the snapshot; three sites at once made that 4.7 s, close to the 5 s of
    /// `EtcdPreUpgradeSnapshotMissing`'s scaled `for:`).
    pub async fn start_alone(kubelet: &str, workers: usize) -> Self {
        Self::start_taking(AT_ONCE as u32, kubelet, workers, false).await
    }

    /// As [`Rehearsal::start_alone`], with batch analyses and checks on: one exporter per
    /// node (the same on every version, [`Upgraded::Same`]) scraped at the scaled
    /// interval, one `[[gate.analysis]]` over its latency at its defaults, its window
    /// scaled, and one `[[gate.checks]]` that the latency stays under a second.
    pub async fn start_judged_alone(kubelet: &str, workers: usize) -> Self {
        Self::start_taking(AT_ONCE as u32, kubelet, workers, true).await
    }

    /// As [`Rehearsal::start_alone`], on a k3s or RKE2 cluster at `version`: `servers`
    /// over real etcd members, `agents`, a mirror of its releases.
    /// At `scale`, with `extra` settings on top.
    pub async fn start_release_alone(
        scale: Scale,
        (distro, version): (super::k3s::Distro, &str),
        (servers, agents): (usize, usize),
        extra: &[(&str, &str)],
    ) -> Self {
        let slot = Self::slots(AT_ONCE as u32).await;
        let ground = Ground::start_release(distro, version, servers, agents).await;
        Self::start_on(slot, scale, ground, extra).await
    }

    async fn slots(slots: u32) -> tokio::sync::OwnedSemaphorePermit {
        SLOTS
            .clone()
            .acquire_many_owned(slots)
            .await
            .expect("the rehearsal slots")
    }

    async fn start_taking(slots: u32, kubelet: &str, workers: usize, judged: bool) -> Self {
        let slot = Self::slots(slots).await;
        let ground = Ground::start(kubelet, workers).await;
        Self::start_judging(slot, Scale::default(), ground, &[], judged).await
    }

    async fn start_on(
        slot: tokio::sync::OwnedSemaphorePermit,
        scale: Scale,
        ground: Ground,
        extra: &[(&str, &str)],
    ) -> Self {
        Self::start_judging(slot, scale, ground, extra, false).await
    }

    async fn start_judging(
        slot: tokio::sync::OwnedSemaphorePermit,
        scale: Scale,
        ground: Ground,
        extra: &[(&str, &str)],
        judged: bool,
    ) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let exporters = match judged {
            true => {
                let nodes: Vec<String> = ground.nodes.iter().map(|n| n.name.clone()).collect();
                Some(NodeExporters::start(&ground.api, &nodes, "0.0.0", Upgraded::Same).await)
            }
            false => None,
        };
        let (rg_port, prometheus_port, alertmanager_port) = (free_port(), free_port(), free_port());

        std::fs::write(d.join("rules.yml"), scale.rules()).expect("rules");
        std::fs::write(d.join("kube-token"), &ground.api.token).expect("token");
        let listener = Listener::write(d);
        let prometheus = start_prometheus(
            d,
            &ground,
            (prometheus_port, alertmanager_port),
            &Scrapes {
                rollgate_port: rg_port,
                rollgate_https: true,
                pushgateway: None,
                nodes: exporters.as_ref().map_or(&[], |e| e.targets.as_slice()),
            },
            scale,
        )
        .await;

        let mut env = ground.env();
        env.extend(
            scale
                .rollgate_env()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
        env.push((
            "ROLLGATE__GATE__PROMETHEUS_URL".into(),
            format!("http://127.0.0.1:{prometheus_port}"),
        ));
        env.extend(listener.env());
        if judged {
            let config = d.join("analysis.toml");
            let window = scale.text(Duration::from_secs(600));
            let interval = scale.text(Duration::from_secs(30));
            std::fs::write(
                &config,
                format!(
                    "[[gate.analysis]]\nname = \"latency-p99\"\nquery = \"max by (node) ({METRIC})\"\nwindow = \"{window}\"\n\
                     [[gate.checks]]\nname = \"latency-ceiling\"\nquery = \"max({METRIC})\"\nsuccess_condition = \"< 1\"\ninterval = \"{interval}\"\n"
                ),
            )
            .expect("analysis.toml");
            env.push(("ROLLGATE_CONFIG".into(), config.display().to_string()));
        }
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut rg = Rollgate::start_with(rg_port, &env, "https", listener.client()).await;
        rg.token = ADMIN_TOKEN.to_owned();

        let alertmanager = Alertmanager::with_config(
            &alertmanager_config(
                &format!("{}/v1/alerts", rg.base()),
                (&listener.alertmanager_token, Some(&listener.ca_file)),
                scale,
            ),
            alertmanager_port,
        )
        .await;
        let r = Self {
            scale,
            ground,
            rg,
            prometheus,
            prometheus_port,
            alertmanager,
            node_exporters: exporters,
            _dir: dir,
            _slot: slot,
        };
        let nodes = r.node_exporters.as_ref().map_or(0, |e| e.targets.len());
        load_rules_once_scraped(
            r._dir.path(),
            (r.prometheus_port, alertmanager_port),
            (5 + nodes, 5 + nodes),
        )
        .await;
        r
    }

    /// The instant query `promql` now: its result vector.
    pub async fn query(&self, promql: &str) -> Vec<Value> {
        query(self.prometheus_port, promql).await
    }

    /// The alerts firing in Prometheus now, as `name{node}` (node when labelled).
    pub async fn firing(&self) -> Vec<String> {
        self.query(r#"ALERTS{alertstate="firing"}"#)
            .await
            .iter()
            .map(|s| {
                let m = &s["metric"];
                match m["node"].as_str() {
                    Some(node) => format!("{}{{{node}}}", m["alertname"].as_str().unwrap_or("")),
                    None => m["alertname"].as_str().unwrap_or("").to_owned(),
                }
            })
            .collect()
    }
}

/// Loads the shipped rules and the watchdog into the Prometheus at `prometheus_port`
/// (config under `d`) once `up` has `targets` series of which `up_wanted` are 1; returns
/// once the watchdog fires there and the Alertmanager at `alertmanager_port` lists it. Prometheus applies
/// discovered targets only every 5 s, a delay no setting scales: before the first scrape
/// `up` is absent, which a real `for: 2m` outlasts but a scaled one does not.
pub async fn load_rules_once_scraped(
    d: &Path,
    (prometheus_port, alertmanager_port): (u16, u16),
    (up_wanted, targets): (usize, usize),
) {
    super::eventually(
        "every target scraped, and up",
        Duration::from_secs(30),
        || async {
            let up = query(prometheus_port, "up").await;
            let ups = up.iter().filter(|s| s["value"][1] == "1").count();
            (up.len() == targets && ups == up_wanted).then_some(())
        },
    )
    .await;
    let file = d.join("prometheus.yml");
    let config = std::fs::read_to_string(&file).expect("prometheus.yml");
    let with_rules = config.replacen(
        "scrape_configs:",
        &format!(
            "rule_files:\n  - {}\n  - {}\nscrape_configs:",
            d.join("rules.yml").display(),
            super::services::watchdog_rule().display()
        ),
        1,
    );
    std::fs::write(&file, with_rules).expect("prometheus.yml");
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", prometheus_port);
    let reload = http
        .post(format!("{base}/-/reload"))
        .send()
        .await
        .expect("prometheus reloads");
    assert!(reload.status().is_success(), "reload: {}", reload.status());
    super::eventually("the rules to load", Duration::from_secs(30), || async {
        let rules: Value = http
            .get(format!("{base}/api/v1/rules"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        // rules/'s two groups and the watchdog's.
        (rules["data"]["groups"].as_array()?.len() == 3).then_some(())
    })
    .await;
    // The site's monitoring works before anything is asked of the gate: the watchdog fires
    // in Prometheus and its Alertmanager lists it.
    super::eventually("the watchdog to fire", Duration::from_secs(30), || async {
        let firing = query(
            prometheus_port,
            r#"ALERTS{alertname="Watchdog",alertstate="firing"}"#,
        )
        .await;
        let listed: Value = http
            .get(format!(
                "http://127.0.0.1:{alertmanager_port}/api/v2/alerts"
            ))
            .query(&[("filter", r#"alertname="Watchdog""#)])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (!firing.is_empty() && !listed.as_array()?.is_empty()).then_some(())
    })
    .await;
}

/// The instant query `promql` to the Prometheus at `port`: its result vector.
pub async fn query(port: u16, promql: &str) -> Vec<Value> {
    let body: Value = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/api/v1/query"))
        .query(&[("query", promql)])
        .send()
        .await
        .expect("prometheus answers")
        .json()
        .await
        .expect("json");
    assert_eq!(body["status"], "success", "{promql}: {body}");
    body["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// What a rehearsal's or the sandbox's Prometheus scrapes besides the cluster's own
/// targets.
pub struct Scrapes<'a> {
    /// rollgate's port on loopback.
    pub rollgate_port: u16,
    /// Whether rollgate serves HTTPS (with the rehearsal's CA, by its service name).
    pub rollgate_https: bool,
    /// A Pushgateway's `host:port`, scraped with its pushed labels honoured.
    pub pushgateway: Option<&'a str>,
    /// Each node's own exporter (`(node, host:port)`, [`NodeExporters`]), as job `nodes`
    /// with the node's name in label `node`.
    pub nodes: &'a [(String, String)],
}

/// Prometheus on loopback `port` scraping `ground`'s API server (its metrics, kubelets'
/// and kube-state-metrics'), its first etcd member and `scrapes`, at `scale`, alerting to
/// the Alertmanager at `alertmanager_port`; without rules until
/// [`load_rules_once_scraped`].
pub async fn start_prometheus(
    d: &Path,
    ground: &Ground,
    (port, alertmanager_port): (u16, u16),
    scrapes: &Scrapes<'_>,
    scale: Scale,
) -> Process {
    let rg_port = scrapes.rollgate_port;
    let scaled = |d| scale.text(d);
    let api = host_port(&ground.api.url());
    let etcd = host_port(&ground.etcd.endpoints()[0]);
    let kube = |job: &str, path: &str| {
        format!(
            "  - job_name: {job}\n    metrics_path: {path}\n    authorization:\n      credentials_file: {}\n    static_configs:\n      - targets: ['{api}']\n",
            d.join("kube-token").display()
        )
    };
    let plain = |job: &str, target: &str| {
        format!("  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n")
    };
    // As the example's ServiceMonitor scrapes it: HTTPS, trusting the CA, by its name.
    let https = |job: &str, target: &str| {
        format!(
            "  - job_name: {job}\n    scheme: https\n    tls_config:\n      ca_file: {}\n      server_name: rollgate.rollgate.svc\n    static_configs:\n      - targets: ['{target}']\n",
            d.join("ca.crt").display()
        )
    };
    let config = format!(
        "global:\n  scrape_interval: {scrape}\n  evaluation_interval: {eval}\n\
         alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{alertmanager_port}']\n\
         scrape_configs:\n{apiserver}{kubelet}{ksm}{rollgate}{etcd}{pushgateway}{nodes}",
        scrape = scaled(Duration::from_secs(30)),
        eval = scaled(Duration::from_secs(60)),
        apiserver = kube("apiserver", "/metrics"),
        kubelet = kube("kubelet", "/metrics/kubelet"),
        ksm = kube("kube-state-metrics", "/metrics/kube-state"),
        rollgate = if scrapes.rollgate_https {
            https("rollgate", &format!("127.0.0.1:{rg_port}"))
        } else {
            plain("rollgate", &format!("127.0.0.1:{rg_port}"))
        },
        etcd = plain("etcd", &etcd),
        pushgateway = scrapes.pushgateway.map_or_else(String::new, |target| {
            format!("  - job_name: pushgateway\n    honor_labels: true\n    static_configs:\n      - targets: ['{target}']\n")
        }),
        nodes = if scrapes.nodes.is_empty() {
            String::new()
        } else {
            let targets: String = scrapes
                .nodes
                .iter()
                .map(|(node, target)| {
                    format!("      - targets: ['{target}']\n        labels: {{node: '{node}'}}\n")
                })
                .collect();
            format!("  - job_name: nodes\n    static_configs:\n{targets}")
        },
    );
    let file = d.join("prometheus.yml");
    std::fs::write(&file, config).expect("prometheus.yml");
    let args = vec![
        format!("--config.file={}", file.display()),
        format!("--storage.tsdb.path={}", d.join("tsdb").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        format!(
            "--query.lookback-delta={}",
            scaled(Duration::from_secs(300))
        ),
        "--web.enable-lifecycle".into(),
        format!(
            "--rules.alert.resend-delay={}",
            scaled(Duration::from_secs(60))
        ),
    ];
    let process = Process::spawn("prometheus", "prometheus", args, d.join("prometheus.log"));
    wait_http_ok(
        &format!("http://127.0.0.1:{port}/-/ready"),
        "prometheus",
        &process,
    )
    .await;
    process
}

/// The shipped Alertmanager example (`deploy/examples/alertmanager-receiver.yaml`), its
/// receiver pointed at `webhook` with `token_file` (trusting `ca_file` for HTTPS; none
/// for plain HTTP), its timings scaled.
pub fn alertmanager_config(
    webhook: &str,
    (token_file, ca_file): (&Path, Option<&Path>),
    scale: Scale,
) -> String {
    let scaled = |d| scale.text(d);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/examples/alertmanager-receiver.yaml");
    let text = std::fs::read_to_string(path).expect("example");
    let mut doc: Value = serde_norway::from_str(&text).expect("example parses");
    let scale = |v: &mut Value, default: u64| {
        let seconds = v.as_str().map_or(default, prometheus_seconds);
        *v = scaled(Duration::from_secs(seconds)).into();
    };
    doc["global"] = serde_json::json!({"resolve_timeout": scaled(Duration::from_secs(300))});
    // Alertmanager's defaults where the example leaves them.
    let route = &mut doc["route"];
    scale(&mut route["group_wait"], 30);
    scale(&mut route["group_interval"], 300);
    scale(&mut route["repeat_interval"], 4 * 3600);
    for sub in route["routes"].as_array_mut().expect("routes") {
        scale(&mut sub["group_wait"], 30);
        scale(&mut sub["group_interval"], 300);
        scale(&mut sub["repeat_interval"], 4 * 3600);
    }
    for receiver in doc["receivers"].as_array_mut().expect("receivers") {
        for hook in receiver["webhook_configs"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            hook["url"] = webhook.into();
            hook["http_config"]["authorization"]["credentials_file"] =
                token_file.display().to_string().into();
            match ca_file {
                // The example's server_name stays: the rehearsal's certificate carries it.
                Some(ca) => {
                    hook["http_config"]["tls_config"]["ca_file"] = ca.display().to_string().into()
                }
                None => {
                    if let Some(http) = hook["http_config"].as_object_mut() {
                        http.remove("tls_config");
                    }
                }
            }
        }
    }
    serde_norway::to_string(&doc).expect("yaml")
}
