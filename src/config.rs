//! Settings: embedded defaults, then `--config FILE`, then `ROLLGATE__SECTION__KEY`
//! environment variables. Every key is read and checked on its own so that
//! `rollgate check-config` can report every bad value at once.

use config::{Config, Environment, File, FileFormat, Value, ValueKind};

use crate::domain::run::FailurePolicy;
use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Which queue backend carries events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueBackend {
    /// On-disk SQLite queue under `data_dir` (default).
    Embedded,
    /// RabbitMQ through lapin.
    Amqp,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// HTTP server settings.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// `server.listen`: address to bind (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// `server.token_file`: file holding the API bearer token (default
    /// `<data_dir>/api-token`, generated on first start with mode 0600).
    pub token_file: PathBuf,
    /// Whether `token_file` is the default one, which rollgate may create.
    pub token_file_is_default: bool,
    /// `server.max_body_bytes`: largest request body accepted (default 1 MiB).
    pub max_body_bytes: usize,
    /// `server.workers`: HTTP worker threads (default 1: the API is light, and on small
    /// nodes every thread competes with the queue and the broker).
    pub workers: usize,
}

/// Queue settings.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// `queue.backend`: `embedded` (default) or `amqp`.
    pub backend: QueueBackend,
    /// `queue.amqp_url`: broker address, without a password (default
    /// `amqp://127.0.0.1:5672/%2f`, which logs in as guest).
    pub amqp_url: String,
    /// `queue.amqp_credentials_file`: optional file holding `user:password` for the broker.
    pub amqp_credentials_file: Option<PathBuf>,
    /// `queue.exchange`: topic exchange events are published to (default `rollgate`).
    pub exchange: String,
    /// `queue.queue`: quorum queue the worker consumes (default `rollgate.events`).
    pub queue: String,
    /// `queue.dead_queue`: where poison messages go (default `rollgate.dead`).
    pub dead_queue: String,
    /// `queue.prefetch`: unacknowledged deliveries the broker may push (default 8).
    pub prefetch: u16,
    /// `queue.delivery_limit`: deliveries of one message before it is dead-lettered (default 10).
    pub delivery_limit: u32,
    /// `queue.connect_timeout`: bound on one broker connect attempt (default `3s`).
    pub connect_timeout: Duration,
    /// `queue.lease`: how long an embedded delivery stays leased before redelivery (default `10m`).
    pub lease: Duration,
}

/// Worker settings.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// `worker.paused`: accept and queue events but process none (default false).
    pub paused: bool,
    /// `worker.max_attempts`: starts of one step before it gives up (default 5).
    pub max_attempts: u32,
    /// `worker.on_failure`: `halt` (default; resume after a fix) or `fail`, when a step
    /// gives up.
    pub on_failure: FailurePolicy,
}

/// Gate settings: when may a risky step go ahead.
#[derive(Debug, Clone)]
pub struct GateSettings {
    /// `gate.prometheus_url`: Prometheus base URL. Empty (default): no Prometheus, so every
    /// gate is unknown, which holds runs (fail closed).
    pub prometheus_url: Option<String>,
    /// `gate.query`: PromQL whose series are blocking alerts (default
    /// `ALERTS{alertstate="firing",upgrade_gate="true"}`; with `count_pending`, firing or pending).
    pub query: String,
    /// `gate.count_pending`: alerts still pending block too (default false).
    pub count_pending: bool,
    /// `gate.exclude_alerts`: alert names that never block, e.g. alerts drains cause.
    pub exclude_alerts: Vec<String>,
    /// `gate.board_matchers`: label matchers an Alertmanager alert must meet to block
    /// (default `upgrade_gate=true`).
    pub board_matchers: Vec<crate::domain::gate::Matcher>,
    /// `gate.poll_interval`: how often a held step re-checks the gate (default `30s`).
    pub poll_interval: Duration,
    /// `gate.halt_after`: a gate closed this long halts the run (default `30m`).
    pub halt_after: Duration,
    /// `gate.quiet_query`: PromQL for the pre-flight quiet period; any series means a gate
    /// alert fired within it (default: the last 24h).
    pub quiet_query: String,
    /// `gate.timeout`: connect and request timeout for Prometheus (default `5s`).
    pub timeout: Duration,
    /// `gate.failures_before_unknown`: failed evaluations in a row before the verdict is
    /// unknown; meanwhile the last good answer stands (default 1: at once).
    pub failures_before_unknown: u32,
    /// `gate.bearer_token_file`: file with a bearer token for Prometheus.
    pub bearer_token_file: Option<PathBuf>,
    /// `gate.basic_auth_user`: basic-auth user for Prometheus.
    pub basic_auth_user: Option<String>,
    /// `gate.basic_auth_password_file`: file with the basic-auth password.
    pub basic_auth_password_file: Option<PathBuf>,
    /// `gate.ca_file`: PEM CA bundle to trust for Prometheus over HTTPS.
    pub ca_file: Option<PathBuf>,
}

/// Notification settings.
#[derive(Debug, Clone)]
pub struct NotifySettings {
    /// `notify.slack_webhook_file`: file holding a Slack incoming-webhook URL; unset: log only.
    pub slack_webhook_file: Option<PathBuf>,
    /// `notify.timeout`: per attempt (default `5s`).
    pub timeout: Duration,
    /// `notify.retries`: further attempts after a failed one, with back-off (default 3).
    pub retries: u32,
}

/// Logging settings.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// `log.format`: `text` (default) or `json`.
    pub format: LogFormat,
    /// `log.level`: a tracing filter such as `info` or `rollgate=debug` (default `info`).
    pub level: String,
}

/// The Kubernetes cluster rollgate upgrades (section `cluster`). Without `kubeconfig` or
/// `in_cluster`, no cluster is configured and upgrade runs wait at their first step.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// Kubeconfig file to use.
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig; its current context when unset.
    pub context: Option<String>,
    /// Use the pod's service account.
    pub in_cluster: bool,
    /// Namespace that carries the in-flight annotations.
    pub namespace: String,
    /// Prefix of rollgate's annotations.
    pub annotation_prefix: String,
    /// Workers in upgrade order; those not named follow by name.
    pub worker_order: Vec<String>,
    /// How long a drain may take before the step fails (the node stays cordoned).
    pub drain_timeout: Duration,
    /// Pause between evictions refused by a PodDisruptionBudget.
    pub eviction_retry: Duration,
    /// Grace period for evicted pods, in seconds; each pod's own when unset.
    pub grace_period: Option<u32>,
    /// How long each upgraded worker soaks before the next.
    pub soak: Duration,
    /// How long a node may take to report the target and Ready after its script.
    pub verify_timeout: Duration,
    /// Lowest ratio of Ready pods that post-flight accepts.
    pub pod_ready_ratio: f64,
    /// Bound on every API request.
    pub request_timeout: Duration,
}

/// SSH to nodes (section `ssh`).
#[derive(Debug, Clone)]
pub struct SshConfig {
    /// Login user.
    pub user: String,
    /// Default port.
    pub port: u16,
    /// Private key file (a secret: a path, never the key).
    pub key_file: Option<PathBuf>,
    /// known_hosts file; host keys are checked strictly against it.
    pub known_hosts_file: Option<PathBuf>,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Bound on one node-script run, enforced on the node.
    pub command_timeout: Duration,
    /// `node=[user@]host[:port]` entries for nodes not reached at their InternalIP with
    /// the default user and port.
    pub hosts: std::collections::HashMap<String, SshHost>,
}

/// Where one node is reached over SSH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshHost {
    /// Login user, when not `ssh.user`.
    pub user: Option<String>,
    /// Host name or address.
    pub host: String,
    /// Port, when not `ssh.port`.
    pub port: Option<u16>,
}

/// The etcd cluster of the control plane (section `etcd`), for the pre-upgrade snapshot.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs of the members.
    pub endpoints: Vec<String>,
    /// PEM CA bundle, for TLS.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate.
    pub cert_file: Option<PathBuf>,
    /// PEM client key (a secret: a path).
    pub key_file: Option<PathBuf>,
    /// Bound on connecting and on every request.
    pub timeout: Duration,
    /// Where snapshots are written.
    pub snapshot_dir: PathBuf,
}

/// How `serve` reaches the etcd clusters it rolls (section `etcd_roll`). The members and
/// the StatefulSet come with each request; the client certificates never do.
#[derive(Debug, Clone)]
pub struct EtcdRollConfig {
    /// PEM CA bundle, for `https://` members.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate.
    pub cert_file: Option<PathBuf>,
    /// PEM client key (a secret: a path).
    pub key_file: Option<PathBuf>,
    /// Bound on connecting and on every etcd request.
    pub timeout: Duration,
    /// How long a leadership transfer may take to be confirmed by a majority.
    pub transfer_timeout: Duration,
}

/// Where `rollgate detect` sends what it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DetectSubmit {
    /// `POST /v1/detections` to `detect.rollgate_url`.
    Http,
    /// A `rollgate.detection.v1` CloudEvent on the AMQP exchange of `queue.*`.
    Amqp,
}

/// `rollgate detect`, the weekly CronJob (section `detect`).
#[derive(Debug, Clone)]
pub struct DetectConfig {
    /// `detect.repo_url`: base of the Kubernetes package repositories; `/v1.NN/deb/Release`
    /// and `/v1.NN/deb/Packages` are appended (default `https://pkgs.k8s.io/core:/stable:`).
    pub repo_url: String,
    /// `detect.pushgateway_url`: where the detection metrics go (default: none, not pushed).
    pub pushgateway_url: Option<String>,
    /// `detect.pushgateway_job`: the Pushgateway job (default `k8s_version_check`).
    pub pushgateway_job: String,
    /// `detect.submit`: `http` (default) or `amqp`.
    pub submit: DetectSubmit,
    /// `detect.rollgate_url`: the rollgate API for `http` (default `http://<server.listen>`).
    pub rollgate_url: String,
    /// `detect.token_file`: the API token for `http` (default `server.token_file`).
    pub token_file: PathBuf,
    /// `detect.stages`: the stages the requested upgrade runs (default `all`).
    pub stages: String,
    /// `detect.timeout`: bound on every HTTP request (default `10s`).
    pub timeout: Duration,
}

/// Every setting, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `data_dir`: where the embedded queue, the run store and the generated token live
    /// (default `./data`).
    pub data_dir: PathBuf,
    /// HTTP server.
    pub server: ServerSettings,
    /// Queue.
    pub queue: QueueSettings,
    /// Worker.
    pub worker: WorkerSettings,
    /// Gates.
    pub gate: GateSettings,
    /// Notifications.
    pub notify: NotifySettings,
    /// Logging.
    pub log: LogSettings,
    /// The Kubernetes cluster.
    pub cluster: ClusterSettings,
    /// SSH to nodes.
    pub ssh: SshConfig,
    /// The control plane's etcd.
    pub etcd: EtcdConfig,
    /// etcd clusters rolled by `serve`.
    pub etcd_roll: EtcdRollConfig,
    /// `rollgate detect`.
    pub detect: DetectConfig,
}

/// One bad setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The key, e.g. `server.listen`.
    pub key: String,
    /// What is wrong and what would be right.
    pub message: String,
}

/// Everything wrong with the settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError(pub Vec<Problem>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} bad setting(s):", self.0.len())?;
        for p in &self.0 {
            writeln!(f, "  {}: {}", p.key, p.message)?;
        }
        Ok(())
    }
}

const KEYS: &[&str] = &[
    "data_dir",
    "server.listen",
    "server.token_file",
    "server.max_body_bytes",
    "server.workers",
    "queue.backend",
    "queue.amqp_url",
    "queue.amqp_credentials_file",
    "queue.exchange",
    "queue.queue",
    "queue.dead_queue",
    "queue.prefetch",
    "queue.delivery_limit",
    "queue.connect_timeout",
    "queue.lease",
    "gate.prometheus_url",
    "gate.query",
    "gate.count_pending",
    "gate.exclude_alerts",
    "gate.board_matchers",
    "gate.poll_interval",
    "gate.halt_after",
    "gate.quiet_query",
    "gate.timeout",
    "gate.failures_before_unknown",
    "gate.bearer_token_file",
    "gate.basic_auth_user",
    "gate.basic_auth_password_file",
    "gate.ca_file",
    "notify.slack_webhook_file",
    "notify.timeout",
    "notify.retries",
    "worker.paused",
    "worker.max_attempts",
    "worker.on_failure",
    "cluster.kubeconfig",
    "cluster.context",
    "cluster.in_cluster",
    "cluster.namespace",
    "cluster.annotation_prefix",
    "cluster.worker_order",
    "cluster.drain_timeout",
    "cluster.eviction_retry",
    "cluster.grace_period",
    "cluster.soak",
    "cluster.verify_timeout",
    "cluster.pod_ready_ratio",
    "cluster.request_timeout",
    "ssh.user",
    "ssh.port",
    "ssh.key_file",
    "ssh.known_hosts_file",
    "ssh.connect_timeout",
    "ssh.command_timeout",
    "ssh.hosts",
    "etcd.endpoints",
    "etcd.ca_file",
    "etcd.cert_file",
    "etcd.key_file",
    "etcd.timeout",
    "etcd.snapshot_dir",
    "etcd_roll.ca_file",
    "etcd_roll.cert_file",
    "etcd_roll.key_file",
    "etcd_roll.timeout",
    "etcd_roll.transfer_timeout",
    "detect.repo_url",
    "detect.pushgateway_url",
    "detect.pushgateway_job",
    "detect.submit",
    "detect.rollgate_url",
    "detect.token_file",
    "detect.stages",
    "detect.timeout",
    "log.format",
    "log.level",
];

/// The environment variable prefix: `ROLLGATE__SERVER__LISTEN` sets `server.listen`.
pub const ENV_PREFIX: &str = "ROLLGATE";

impl Settings {
    /// Loads from embedded defaults, the optional file and the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, None)
    }

    /// Loads with an explicit environment (`None` = the process environment); for tests.
    pub fn load_from(
        file: Option<&Path>,
        env: Option<std::collections::HashMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let mut builder = Config::builder();
        if let Some(path) = file {
            if !path.is_file() {
                return Err(ConfigError(vec![Problem {
                    key: "--config".into(),
                    message: format!("{} does not exist or is not a file", path.display()),
                }]));
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        let env_source = Environment::with_prefix(ENV_PREFIX)
            .prefix_separator("__")
            .separator("__")
            .source(env);
        builder = builder.add_source(env_source);
        let cfg = builder.build().map_err(|e| {
            ConfigError(vec![Problem {
                key: file.map_or("environment".into(), |p| p.display().to_string()),
                message: e.to_string(),
            }])
        })?;
        Self::from_config(&cfg)
    }

    fn from_config(cfg: &Config) -> Result<Self, ConfigError> {
        let mut r = Reader {
            cfg,
            problems: Vec::new(),
        };
        r.unknown_keys();
        let data_dir = r.path("data_dir", "./data");
        let token_file_set = r.raw("server.token_file").is_some();
        let token_file = r.path("server.token_file", "");
        let server = ServerSettings {
            listen: r.socket_addr("server.listen", "127.0.0.1:8080"),
            token_file: if token_file_set {
                token_file
            } else {
                data_dir.join("api-token")
            },
            token_file_is_default: !token_file_set,
            max_body_bytes: r.int("server.max_body_bytes", 1 << 20, 1024, 64 << 20) as usize,
            workers: r.int("server.workers", 1, 1, 64) as usize,
        };
        let backend = match r.string("queue.backend", "embedded").as_str() {
            "embedded" => QueueBackend::Embedded,
            "amqp" => QueueBackend::Amqp,
            other => {
                r.problem(
                    "queue.backend",
                    format!("{other:?} is neither \"embedded\" nor \"amqp\""),
                );
                QueueBackend::Embedded
            }
        };
        let amqp_url = r.string("queue.amqp_url", "amqp://127.0.0.1:5672/%2f");
        match amqp_url.parse::<lapin::uri::AMQPUri>() {
            Ok(_) if amqp_url.contains('@') => {
                r.problem(
                    "queue.amqp_url",
                    "must not carry credentials; put user:password in the file named by queue.amqp_credentials_file",
                )
            }
            Ok(_) => {}
            Err(_) => r.problem(
                "queue.amqp_url",
                "is not an AMQP URL like amqp://127.0.0.1:5672/%2f".to_owned(),
            ),
        }
        let queue = QueueSettings {
            backend,
            amqp_credentials_file: r
                .raw("queue.amqp_credentials_file")
                .map(|_| r.path("queue.amqp_credentials_file", "")),
            amqp_url,
            exchange: r.name("queue.exchange", "rollgate"),
            queue: r.name("queue.queue", "rollgate.events"),
            dead_queue: r.name("queue.dead_queue", "rollgate.dead"),
            prefetch: r.int("queue.prefetch", 8, 1, 1000) as u16,
            delivery_limit: r.int("queue.delivery_limit", 10, 1, 1000) as u32,
            connect_timeout: r.duration(
                "queue.connect_timeout",
                "3s",
                Duration::from_millis(100),
                Duration::from_secs(120),
            ),
            lease: r.duration(
                "queue.lease",
                "10m",
                Duration::from_secs(1),
                Duration::from_secs(24 * 3600),
            ),
        };
        let worker = WorkerSettings {
            paused: r.bool("worker.paused", false),
            max_attempts: r.int("worker.max_attempts", 5, 1, 100) as u32,
            on_failure: match r.string("worker.on_failure", "halt").as_str() {
                "halt" => FailurePolicy::Halt,
                "fail" => FailurePolicy::Fail,
                other => {
                    r.problem(
                        "worker.on_failure",
                        format!("{other:?} is neither \"halt\" nor \"fail\""),
                    );
                    FailurePolicy::Halt
                }
            },
        };
        let count_pending = r.bool("gate.count_pending", false);
        let default_query = if count_pending {
            r#"ALERTS{alertstate=~"firing|pending",upgrade_gate="true"}"#
        } else {
            r#"ALERTS{alertstate="firing",upgrade_gate="true"}"#
        };
        let prometheus_url = r.string("gate.prometheus_url", "");
        if !prometheus_url.is_empty() && reqwest::Url::parse(&prometheus_url).is_err() {
            r.problem(
                "gate.prometheus_url",
                format!("{prometheus_url:?} is not a URL like http://prometheus:9090"),
            );
        }
        let board_matchers = r
            .list("gate.board_matchers", &["upgrade_gate=true"])
            .iter()
            .filter_map(|m| match crate::domain::gate::Matcher::parse(m) {
                Ok(m) => Some(m),
                Err(e) => {
                    r.problem("gate.board_matchers", e);
                    None
                }
            })
            .collect();
        let gate = GateSettings {
            prometheus_url: (!prometheus_url.is_empty()).then_some(prometheus_url),
            query: r.string("gate.query", default_query),
            count_pending,
            exclude_alerts: r.list("gate.exclude_alerts", &[]),
            board_matchers,
            poll_interval: r.duration(
                "gate.poll_interval",
                "30s",
                Duration::from_millis(100),
                Duration::from_secs(3600),
            ),
            halt_after: r.duration(
                "gate.halt_after",
                "30m",
                Duration::from_secs(1),
                Duration::from_secs(7 * 86_400),
            ),
            quiet_query: r.string(
                "gate.quiet_query",
                r#"max_over_time(ALERTS{alertstate="firing",upgrade_gate="true"}[24h])"#,
            ),
            timeout: r.duration(
                "gate.timeout",
                "5s",
                Duration::from_millis(100),
                Duration::from_secs(120),
            ),
            failures_before_unknown: r.int("gate.failures_before_unknown", 1, 1, 100) as u32,
            bearer_token_file: r.opt_path("gate.bearer_token_file"),
            basic_auth_user: r
                .raw("gate.basic_auth_user")
                .map(|_| r.string("gate.basic_auth_user", "")),
            basic_auth_password_file: r.opt_path("gate.basic_auth_password_file"),
            ca_file: r.opt_path("gate.ca_file"),
        };
        if gate.basic_auth_user.is_some() != gate.basic_auth_password_file.is_some() {
            r.problem(
                "gate.basic_auth_user",
                "basic auth needs both gate.basic_auth_user and gate.basic_auth_password_file",
            );
        }
        if gate.bearer_token_file.is_some() && gate.basic_auth_user.is_some() {
            r.problem(
                "gate.bearer_token_file",
                "use either a bearer token or basic auth for Prometheus, not both",
            );
        }
        let notify = NotifySettings {
            slack_webhook_file: r.opt_path("notify.slack_webhook_file"),
            timeout: r.duration(
                "notify.timeout",
                "5s",
                Duration::from_millis(100),
                Duration::from_secs(60),
            ),
            retries: r.int("notify.retries", 3, 0, 10) as u32,
        };
        let log = LogSettings {
            format: match r.string("log.format", "text").as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    r.problem(
                        "log.format",
                        format!("{other:?} is neither \"text\" nor \"json\""),
                    );
                    LogFormat::Text
                }
            },
            level: {
                let level = r.string("log.level", "info");
                if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
                    r.problem(
                        "log.level",
                        format!("{level:?} is not a tracing filter like info or rollgate=debug"),
                    );
                }
                level
            },
        };
        let cluster = cluster_settings(&mut r);
        let ssh = ssh_settings(&mut r);
        let etcd = etcd_settings(&mut r, &data_dir);
        let etcd_roll = etcd_roll_settings(&mut r);
        let detect = detect_settings(&mut r, &server);
        if r.problems.is_empty() {
            Ok(Self {
                detect,
                etcd_roll,
                cluster,
                ssh,
                etcd,
                data_dir,
                server,
                queue,
                worker,
                gate,
                notify,
                log,
            })
        } else {
            Err(ConfigError(r.problems))
        }
    }
}

fn cluster_settings(r: &mut Reader) -> ClusterSettings {
    let kubeconfig = r.opt_path("cluster.kubeconfig");
    let in_cluster = r.bool("cluster.in_cluster", false);
    if kubeconfig.is_some() && in_cluster {
        r.problem(
            "cluster.in_cluster",
            "set either cluster.kubeconfig or cluster.in_cluster, not both",
        );
    }
    let ratio = r.string("cluster.pod_ready_ratio", "0.9");
    let pod_ready_ratio = match ratio.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => x,
        _ => {
            r.problem(
                "cluster.pod_ready_ratio",
                format!("{ratio:?} must be a number from 0 to 1"),
            );
            0.9
        }
    };
    let worker_order = r.list("cluster.worker_order", &[]);
    for name in &worker_order {
        if !is_dns_label(name) {
            r.problem(
                "cluster.worker_order",
                format!("{name:?} is not a node name"),
            );
        }
    }
    ClusterSettings {
        kubeconfig,
        context: r
            .raw("cluster.context")
            .map(|_| r.string("cluster.context", "")),
        in_cluster,
        namespace: r.name("cluster.namespace", "k8s-upgrade"),
        annotation_prefix: r.name("cluster.annotation_prefix", "rollgate.io"),
        worker_order,
        drain_timeout: r.duration(
            "cluster.drain_timeout",
            "10m",
            Duration::from_secs(1),
            Duration::from_secs(24 * 3600),
        ),
        eviction_retry: r.duration(
            "cluster.eviction_retry",
            "5s",
            Duration::from_millis(10),
            Duration::from_secs(300),
        ),
        grace_period: r
            .raw("cluster.grace_period")
            .map(|_| r.int("cluster.grace_period", 30, 0, 86_400) as u32),
        soak: r.duration(
            "cluster.soak",
            "10m",
            Duration::ZERO,
            Duration::from_secs(24 * 3600),
        ),
        verify_timeout: r.duration(
            "cluster.verify_timeout",
            "5m",
            Duration::from_secs(1),
            Duration::from_secs(3600),
        ),
        pod_ready_ratio,
        request_timeout: r.duration(
            "cluster.request_timeout",
            "10s",
            Duration::from_millis(100),
            Duration::from_secs(300),
        ),
    }
}

/// A Kubernetes node name: lowercase letters, digits, `-` and `.`.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn ssh_settings(r: &mut Reader) -> SshConfig {
    let key_file = r.opt_path("ssh.key_file");
    let known_hosts_file = r.opt_path("ssh.known_hosts_file");
    let mut hosts = std::collections::HashMap::new();
    for entry in r.list("ssh.hosts", &[]) {
        let parsed = parse_host_entry(&entry);
        match parsed {
            Some((node, addr)) => {
                hosts.insert(node, addr);
            }
            None => r.problem(
                "ssh.hosts",
                format!("{entry:?} is not node=[user@]host[:port]"),
            ),
        }
    }
    SshConfig {
        user: r.name("ssh.user", "rollgate"),
        port: r.int("ssh.port", 22, 1, 65_535) as u16,
        key_file,
        known_hosts_file,
        connect_timeout: r.duration(
            "ssh.connect_timeout",
            "10s",
            Duration::from_millis(100),
            Duration::from_secs(300),
        ),
        command_timeout: r.duration(
            "ssh.command_timeout",
            "30m",
            Duration::from_secs(1),
            Duration::from_secs(6 * 3600),
        ),
        hosts,
    }
}

/// `node=[user@]host[:port]`.
fn parse_host_entry(entry: &str) -> Option<(String, SshHost)> {
    let (node, addr) = entry.split_once('=')?;
    let (user, addr) = match addr.split_once('@') {
        Some((u, rest)) => (Some(u), rest),
        None => (None, addr),
    };
    let (host, port) = match addr.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().ok()?)),
        None => (addr, None),
    };
    let user_ok = user.is_none_or(|u| {
        !u.is_empty()
            && u.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    });
    (is_dns_label(node) && user_ok && !host.is_empty() && !host.starts_with('-')).then(|| {
        (
            node.to_owned(),
            SshHost {
                user: user.map(str::to_owned),
                host: host.to_owned(),
                port,
            },
        )
    })
}

fn etcd_settings(r: &mut Reader, data_dir: &Path) -> EtcdConfig {
    let endpoints = r.list("etcd.endpoints", &[]);
    for e in &endpoints {
        if reqwest::Url::parse(e).is_err() {
            r.problem(
                "etcd.endpoints",
                format!("{e:?} is not a URL like https://10.0.0.5:2379"),
            );
        }
    }
    let (ca_file, cert_file, key_file) = tls_files(r, "etcd");
    let snapshot_dir = r
        .opt_path("etcd.snapshot_dir")
        .unwrap_or_else(|| data_dir.join("snapshots"));
    EtcdConfig {
        endpoints,
        ca_file,
        cert_file,
        key_file,
        timeout: r.duration(
            "etcd.timeout",
            "10s",
            Duration::from_millis(100),
            Duration::from_secs(300),
        ),
        snapshot_dir,
    }
}

/// `<section>.ca_file`, `.cert_file` and `.key_file`; a certificate needs its key.
fn tls_files(r: &mut Reader, section: &str) -> (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>) {
    let cert_file = r.opt_path(&format!("{section}.cert_file"));
    let key_file = r.opt_path(&format!("{section}.key_file"));
    if cert_file.is_some() != key_file.is_some() {
        r.problem(
            &format!("{section}.cert_file"),
            format!("a client certificate needs both {section}.cert_file and {section}.key_file"),
        );
    }
    (
        r.opt_path(&format!("{section}.ca_file")),
        cert_file,
        key_file,
    )
}

fn detect_settings(r: &mut Reader, server: &ServerSettings) -> DetectConfig {
    let url = |r: &mut Reader, key: &str, default: &str| {
        let value = r.string(key, default);
        let ok = value.is_empty()
            || reqwest::Url::parse(&value).is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
        if !ok {
            r.problem(key, format!("{value:?} is not an http(s) URL"));
        }
        value.trim_end_matches('/').to_owned()
    };
    let repo_url = url(r, "detect.repo_url", "https://pkgs.k8s.io/core:/stable:");
    let pushgateway_url = Some(url(r, "detect.pushgateway_url", "")).filter(|u| !u.is_empty());
    let rollgate_url = url(
        r,
        "detect.rollgate_url",
        &format!("http://{}", server.listen),
    );
    let pushgateway_job = r.string("detect.pushgateway_job", "k8s_version_check");
    if pushgateway_job.is_empty()
        || !pushgateway_job
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        r.problem(
            "detect.pushgateway_job",
            "must be letters, digits, '_' or '-'",
        );
    }
    let submit = match r.string("detect.submit", "http").as_str() {
        "http" => DetectSubmit::Http,
        "amqp" => DetectSubmit::Amqp,
        other => {
            r.problem(
                "detect.submit",
                format!("{other:?} is neither \"http\" nor \"amqp\""),
            );
            DetectSubmit::Http
        }
    };
    let stages = r.string("detect.stages", "all");
    if let Err(e) = crate::domain::event::StageSelection::parse(&stages) {
        r.problem("detect.stages", e);
    }
    DetectConfig {
        repo_url,
        pushgateway_url,
        pushgateway_job,
        submit,
        rollgate_url,
        token_file: r
            .opt_path("detect.token_file")
            .unwrap_or_else(|| server.token_file.clone()),
        stages,
        timeout: r.duration(
            "detect.timeout",
            "10s",
            Duration::from_millis(100),
            Duration::from_secs(300),
        ),
    }
}

fn etcd_roll_settings(r: &mut Reader) -> EtcdRollConfig {
    let (ca_file, cert_file, key_file) = tls_files(r, "etcd_roll");
    EtcdRollConfig {
        ca_file,
        cert_file,
        key_file,
        timeout: r.duration(
            "etcd_roll.timeout",
            "5s",
            Duration::from_millis(100),
            Duration::from_secs(300),
        ),
        transfer_timeout: r.duration(
            "etcd_roll.transfer_timeout",
            "15s",
            Duration::from_secs(1),
            Duration::from_secs(300),
        ),
    }
}

struct Reader<'a> {
    cfg: &'a Config,
    problems: Vec<Problem>,
}

impl Reader<'_> {
    fn problem(&mut self, key: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            message: message.into(),
        });
    }

    fn raw(&self, key: &str) -> Option<Value> {
        self.cfg.get::<Value>(key).ok()
    }

    fn unknown_keys(&mut self) {
        let mut found = BTreeSet::new();
        if let Ok(table) = self
            .cfg
            .clone()
            .try_deserialize::<config::Map<String, Value>>()
        {
            for (k, v) in table {
                flatten(&k, &v, &mut found);
            }
        }
        for key in found {
            if !KEYS.contains(&key.as_str()) {
                let hint = KEYS
                    .iter()
                    .find(|k| k.split('.').next_back() == key.split('.').next_back())
                    .map(|k| format!(" (did you mean {k}?)"))
                    .unwrap_or_default();
                self.problem(&key, format!("is not a known setting{hint}"));
            }
        }
    }

    fn string(&mut self, key: &str, default: &str) -> String {
        match self.raw(key) {
            None => default.to_owned(),
            Some(v) => match v.kind {
                ValueKind::String(s) => s,
                ValueKind::I64(_)
                | ValueKind::U64(_)
                | ValueKind::Float(_)
                | ValueKind::Boolean(_) => v.to_string(),
                _ => {
                    self.problem(key, "must be a string");
                    default.to_owned()
                }
            },
        }
    }

    fn path(&mut self, key: &str, default: &str) -> PathBuf {
        let s = self.string(key, default);
        if s.is_empty() && self.raw(key).is_some() {
            self.problem(key, "must not be empty");
        }
        PathBuf::from(s)
    }

    fn name(&mut self, key: &str, default: &str) -> String {
        let s = self.string(key, default);
        let ok = !s.is_empty()
            && s.len() <= 255
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b));
        if !ok {
            self.problem(
                key,
                format!("{s:?} must be 1-255 of letters, digits and . _ - :"),
            );
        }
        s
    }

    fn socket_addr(&mut self, key: &str, default: &str) -> SocketAddr {
        let s = self.string(key, default);
        s.parse().unwrap_or_else(|_| {
            self.problem(key, format!("{s:?} is not an address like 127.0.0.1:8080"));
            SocketAddr::from(([127, 0, 0, 1], 8080))
        })
    }

    fn int(&mut self, key: &str, default: u64, min: u64, max: u64) -> u64 {
        let s = self.string(key, &default.to_string());
        match s.trim().parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => n,
            _ => {
                self.problem(
                    key,
                    format!("{s:?} must be a whole number from {min} to {max}"),
                );
                default
            }
        }
    }

    fn opt_path(&mut self, key: &str) -> Option<PathBuf> {
        self.raw(key).map(|_| self.path(key, ""))
    }

    /// A TOML array of strings, or one comma-separated string (for the environment).
    fn list(&mut self, key: &str, default: &[&str]) -> Vec<String> {
        match self.raw(key).map(|v| v.kind) {
            None => default.iter().map(|s| s.to_string()).collect(),
            Some(ValueKind::Array(items)) => items
                .into_iter()
                .filter_map(|v| match v.kind {
                    ValueKind::String(s) => Some(s),
                    _ => {
                        self.problem(key, "must be a list of strings");
                        None
                    }
                })
                .collect(),
            Some(ValueKind::String(s)) => s
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            Some(_) => {
                self.problem(key, "must be a list of strings or a comma-separated string");
                Vec::new()
            }
        }
    }

    fn bool(&mut self, key: &str, default: bool) -> bool {
        match self.string(key, &default.to_string()).as_str() {
            "true" => true,
            "false" => false,
            other => {
                self.problem(key, format!("{other:?} must be true or false"));
                default
            }
        }
    }

    fn duration(&mut self, key: &str, default: &str, min: Duration, max: Duration) -> Duration {
        let s = self.string(key, default);
        match parse_duration(&s) {
            Some(d) if d >= min && d <= max => d,
            _ => {
                self.problem(
                    key,
                    format!("{s:?} must be a duration like 500ms, 30s, 5m or 1h, from {min:?} to {max:?}"),
                );
                parse_duration(default).unwrap_or_default()
            }
        }
    }
}

fn flatten(prefix: &str, value: &Value, out: &mut BTreeSet<String>) {
    match &value.kind {
        ValueKind::Table(table) => {
            for (k, v) in table {
                flatten(&format!("{prefix}.{k}"), v, out);
            }
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

/// Parses `500ms`, `30s`, `5m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n.checked_mul(1000)?,
        "m" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn embedded_defaults_need_nothing() {
        let s = Settings::load_from(None, env(&[])).unwrap();
        assert_eq!(s.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.server.token_file, PathBuf::from("./data/api-token"));
        assert_eq!(s.server.max_body_bytes, 1 << 20);
        assert_eq!(s.queue.backend, QueueBackend::Embedded);
        assert_eq!(s.queue.exchange, "rollgate");
        assert_eq!(s.queue.queue, "rollgate.events");
    }

    #[test]
    fn environment_overrides_nested_keys() {
        let s = Settings::load_from(
            None,
            env(&[
                ("ROLLGATE__SERVER__LISTEN", "127.0.0.1:9999"),
                ("ROLLGATE__DATA_DIR", "/tmp/rg"),
                ("ROLLGATE__QUEUE__BACKEND", "amqp"),
                ("ROLLGATE__QUEUE__CONNECT_TIMEOUT", "500ms"),
                ("ROLLGATE__SERVER__MAX_BODY_BYTES", "4096"),
            ]),
        )
        .unwrap();
        assert_eq!(s.server.listen.port(), 9999);
        assert_eq!(s.server.token_file, PathBuf::from("/tmp/rg/api-token"));
        assert_eq!(s.queue.backend, QueueBackend::Amqp);
        assert_eq!(s.queue.connect_timeout, Duration::from_millis(500));
        assert_eq!(s.server.max_body_bytes, 4096);
    }

    #[test]
    fn every_bad_value_is_reported_at_once() {
        let err = Settings::load_from(
            None,
            env(&[
                ("ROLLGATE__SERVER__LISTEN", "nowhere"),
                ("ROLLGATE__SERVER__MAX_BODY_BYTES", "-1"),
                ("ROLLGATE__QUEUE__BACKEND", "kafka"),
                ("ROLLGATE__QUEUE__AMQP_URL", "amqp://user:secret@host/%2f"),
                ("ROLLGATE__QUEUE__LEASE", "forever"),
                ("ROLLGATE__SERVER__LISEN", "x"),
                ("ROLLGATE__WORKER__PAUSED", "maybe"),
            ]),
        )
        .unwrap_err();
        let keys: BTreeSet<_> = err.0.iter().map(|p| p.key.as_str()).collect();
        for key in [
            "server.listen",
            "server.max_body_bytes",
            "queue.backend",
            "queue.amqp_url",
            "queue.lease",
            "server.lisen",
            "worker.paused",
        ] {
            assert!(keys.contains(key), "{key} not reported in {err}");
        }
        assert!(
            !err.to_string().contains("secret"),
            "a password leaked: {err}"
        );
    }

    #[test]
    fn ssh_host_entries_parse() {
        let host = |user: Option<&str>, host: &str, port: Option<u16>| SshHost {
            user: user.map(str::to_owned),
            host: host.into(),
            port,
        };
        let cases = [
            ("cp=10.0.0.5", Some(("cp", host(None, "10.0.0.5", None)))),
            (
                "w1=10.0.0.6:2222",
                Some(("w1", host(None, "10.0.0.6", Some(2222)))),
            ),
            (
                "w2=wizard@n2.lan:22",
                Some(("w2", host(Some("wizard"), "n2.lan", Some(22)))),
            ),
            ("w3", None),
            ("w3=", None),
            ("w3=h:notaport", None),
            ("W3=h", None),
            ("w3=-oProxyCommand=x", None),
            ("w3=a b@h", None),
        ];
        for (entry, want) in cases {
            let got = parse_host_entry(entry);
            let want = want.map(|(n, h)| (n.to_owned(), h));
            assert_eq!(got, want, "{entry}");
        }
    }

    #[test]
    fn durations_parse() {
        for (s, ms) in [
            ("500ms", 500),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("7", 7000),
        ] {
            assert_eq!(parse_duration(s), Some(Duration::from_millis(ms)), "{s}");
        }
        for s in ["", "s", "1d", "-1s", "1.5s"] {
            assert_eq!(parse_duration(s), None, "{s}");
        }
    }
}
