//! The sections of the configuration, each deserialized on its own by serde with its
//! defaults, then checked by `check` for what a type cannot say (ranges, URLs, pairs of
//! keys that go together). A key's doc comment is its documentation.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::values::{self, Problems, host_list, matcher_list, string_list};
use crate::domain::analysis::{AnalysisRule, OnFail};
use crate::domain::gate::Matcher;
use crate::domain::run::FailurePolicy;
use crate::domain::scope::Scope;
use crate::workflows::WorkflowSettings;

pub use crate::queue::settings::{QueueBackend, QueueSettings};

/// Which database keeps runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// `store.db` under `data_dir` (default): one replica.
    Sqlite,
    /// A PostgreSQL database at `store.url`: several replicas may share it.
    Postgres,
}

/// The run store (section `store`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    /// `sqlite` (default; `store.db` under `data_dir`) or `postgres`.
    pub backend: StoreBackend,
    /// PostgreSQL URL without a password, e.g. `postgres://rollgate@db:5432/rollgate`
    /// (needed with `postgres`).
    pub url: Option<String>,
    /// File whose first line is the PostgreSQL password.
    pub password_file: Option<PathBuf>,
    /// PostgreSQL connections per replica (default 8).
    pub max_connections: usize,
    /// Bound on one store operation, connecting included (default `5s`): past it the API
    /// answers 503 and the worker retries.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub timeout: Duration,
    /// How long the active worker's lease lasts unless renewed (default `15s`, renewed
    /// every third of it): after a replica dies, another replica's worker takes over
    /// within about this long.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub lease_ttl: Duration,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Sqlite,
            url: None,
            password_file: None,
            max_connections: 8,
            timeout: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(15),
        }
    }
}

impl StoreSettings {
    fn check(&self, p: &mut Problems) {
        match (&self.url, self.backend) {
            (None, StoreBackend::Postgres) => p.add(
                "url",
                "is needed with store.backend = postgres, e.g. postgres://rollgate@db:5432/rollgate",
            ),
            (Some(url), _) => match url.parse::<tokio_postgres::Config>() {
                Ok(c) if c.get_password().is_some() => p.add(
                    "url",
                    "must not carry a password; put it in the file named by store.password_file",
                ),
                Ok(_) => {}
                Err(_) => p.add(
                    "url",
                    "is not a PostgreSQL URL like postgres://rollgate@db:5432/rollgate",
                ),
            },
            (None, StoreBackend::Sqlite) => {}
        }
        p.path("password_file", self.password_file.as_ref());
        p.range("max_connections", self.max_connections, 1, 200);
        p.duration("timeout", self.timeout, 100, 120_000);
        p.duration("lease_ttl", self.lease_ttl, 1_000, 600_000);
        if self.timeout * 3 > self.lease_ttl {
            p.add(
                "timeout",
                format!(
                    "{} is more than a third of store.lease_ttl ({}): the active worker could not notice a lost lease before another replica takes it",
                    humantime::format_duration(self.timeout),
                    humantime::format_duration(self.lease_ttl)
                ),
            );
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where `rollgate detect` sends what it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DetectSubmit {
    /// `POST /v1/detections` to `detect.rollgate_url`.
    Http,
    /// A `rollgate.detection.v1` CloudEvent on the AMQP exchange of `queue.*`.
    Amqp,
}

/// HTTP server settings (section `server`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to bind (default `127.0.0.1:8080`).
    pub listen: SocketAddr,
    /// File holding the API bearer token (default `<data_dir>/api-token`, generated on
    /// first start with mode 0600).
    pub token_file: PathBuf,
    /// Whether `token_file` is the default one, which rollgate may create.
    #[serde(skip)]
    pub token_file_is_default: bool,
    /// Largest request body accepted (default 1 MiB).
    pub max_body_bytes: usize,
    /// HTTP worker threads (default 2: one thread answering every connection became the
    /// intake's bottleneck under load — `cargo bench --bench intake` measured 1.3-1.5× the
    /// accepted notifications and half the p99 with two on 2 cores; more compete with the
    /// worker, the broker and the database on small nodes).
    pub workers: usize,
    /// Directory of API clients' token files (default: none, only `token_file`): each
    /// file's name is a client's name, its first line the client's token (16 characters or
    /// more). Re-read while rollgate runs: a replaced file rotates the token, a removed
    /// file revokes it, within a second.
    pub tokens_dir: Option<PathBuf>,
    /// What each client in `tokens_dir` may do: `scopes.<client> = ["alerts:write"]`, from
    /// `alerts:write`, `detections:write`, `etcd-rolls:write`, `reboots:write`,
    /// `runs:control`, `runs:approve` and `read`
    /// (from the environment, one comma-separated string). A client without an entry may
    /// do nothing; `token_file`'s token (client `admin`) may do everything.
    #[serde(
        deserialize_with = "values::scope_map",
        serialize_with = "crate::config::schema::scope_names"
    )]
    #[schemars(schema_with = "crate::config::schema::scope_map")]
    pub scopes: BTreeMap<String, BTreeSet<Scope>>,
    /// Certificate chain (PEM) to serve HTTPS with (default: none, plain HTTP); needs
    /// `tls_key_file`. Re-read when the file changes (cert-manager renews in place).
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// CA bundle (PEM) for mutual TLS: when set, only clients with a certificate it signed
    /// may connect (their bearer token is still required).
    pub client_ca_file: Option<PathBuf>,
    /// A line the status page shows above everything, and `GET /v1/whoami` returns (default
    /// none), e.g. "STAGING: practice here". One line, at most 200 characters. The sandbox
    /// sets it to say that its cluster is a local one.
    pub banner: Option<String>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            token_file: PathBuf::new(),
            token_file_is_default: true,
            max_body_bytes: 1 << 20,
            workers: 2,
            tokens_dir: None,
            scopes: BTreeMap::new(),
            tls_cert_file: None,
            tls_key_file: None,
            client_ca_file: None,
            banner: None,
        }
    }
}

impl ServerSettings {
    /// `https` when the listener serves TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls_cert_file.is_some() {
            "https"
        } else {
            "http"
        }
    }

    fn check(&self, p: &mut Problems) {
        p.range("max_body_bytes", self.max_body_bytes, 1024, 64 << 20);
        p.range("workers", self.workers, 1, 64);
        p.path("tokens_dir", self.tokens_dir.as_ref());
        p.path("tls_cert_file", self.tls_cert_file.as_ref());
        p.path("tls_key_file", self.tls_key_file.as_ref());
        p.path("client_ca_file", self.client_ca_file.as_ref());
        for client in self.scopes.keys() {
            if !crate::http::clients::is_client_name(client)
                || client == crate::http::clients::ADMIN
            {
                p.add(
                    &format!("scopes.{client}"),
                    "is not a client name (letters, digits, '.', '_', '-'; at most 64; no dot first; not admin)",
                );
            }
        }
        if self.tls_cert_file.is_some() != self.tls_key_file.is_some() {
            p.add(
                "tls_cert_file",
                "tls_cert_file and tls_key_file go together: set both, or neither for plain HTTP",
            );
        }
        if let Some(banner) = &self.banner
            && let Some(problem) = banner_problem(banner)
        {
            p.add("banner", problem);
        }
        if self.client_ca_file.is_some() && self.tls_cert_file.is_none() {
            p.add(
                "client_ca_file",
                "mutual TLS needs TLS: set tls_cert_file and tls_key_file too",
            );
        }
    }
}

/// What is wrong with `server.banner`, if anything: the status page shows it on one line.
fn banner_problem(banner: &str) -> Option<&'static str> {
    if banner.trim().is_empty() {
        Some("is empty: leave it out for no banner")
    } else if banner.contains(['\n', '\r']) {
        Some("is more than one line: the status page shows one")
    } else if banner.chars().count() > 200 {
        Some("is longer than 200 characters")
    } else {
        None
    }
}

/// Worker settings (section `worker`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerSettings {
    /// Accept and queue events but process none (default false).
    pub paused: bool,
    /// Starts of one step before it gives up (default 5).
    pub max_attempts: u32,
    /// When a step gives up: `halt` (default; resume after a fix) or `fail`.
    pub on_failure: FailurePolicy,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            paused: false,
            max_attempts: 5,
            on_failure: FailurePolicy::Halt,
        }
    }
}

impl WorkerSettings {
    fn check(&self, p: &mut Problems) {
        p.range("max_attempts", self.max_attempts, 1, 100);
    }
}

/// The gate query when alerts that are still pending count (`gate.count_pending`).
const QUERY_PENDING: &str = r#"ALERTS{alertstate=~"firing|pending",upgrade_gate="true"}"#;
/// The gate query by default.
const QUERY_FIRING: &str = r#"ALERTS{alertstate="firing",upgrade_gate="true"}"#;

/// Gate settings: when may a risky step go ahead (section `gate`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct GateSettings {
    /// Prometheus base URL. None (default): every gate is unknown, which holds runs
    /// (fail closed).
    pub prometheus_url: Option<String>,
    /// PromQL whose series are blocking alerts (default
    /// `ALERTS{alertstate="firing",upgrade_gate="true"}`; with `count_pending`, firing or
    /// pending).
    pub query: String,
    /// Alerts still pending block too (default false).
    pub count_pending: bool,
    /// Alert names that never block, e.g. alerts rollgate's own drains cause.
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::config::schema::string_list")]
    pub exclude_alerts: Vec<String>,
    /// Label matchers an Alertmanager alert must meet to block (default
    /// `upgrade_gate=true`).
    #[serde(
        deserialize_with = "matcher_list",
        serialize_with = "crate::config::schema::display_list"
    )]
    #[schemars(schema_with = "crate::config::schema::matcher_list")]
    pub board_matchers: Vec<Matcher>,
    /// How often a held step re-checks the gate (default `30s`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub poll_interval: Duration,
    /// A gate closed this long halts the run (default `30m`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub halt_after: Duration,
    /// PromQL for the pre-flight quiet period; any series means a gate alert fired within
    /// it (default: the last 24h).
    pub quiet_query: String,
    /// Connect and request timeout for Prometheus (default `5s`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub timeout: Duration,
    /// Failed evaluations in a row before the verdict is unknown; meanwhile the last good
    /// answer stands (default 1: at once).
    pub failures_before_unknown: u32,
    /// The always-firing alert that proves the alerting pipeline works (default
    /// `Watchdog`, as kube-prometheus ships it; rules/ does not define it): unless it fires
    /// in Prometheus and, with `alertmanager_url`, Alertmanager lists it, the gate is
    /// unknown. `""` turns the proof off (check-config warns).
    pub watchdog: String,
    /// The rule group Prometheus must have loaded for the gate to be known (default
    /// `Upgrade Gates`, rules/'s gate alerts); `""` turns the check off.
    pub rule_group: String,
    /// File with a bearer token for Prometheus.
    pub bearer_token_file: Option<PathBuf>,
    /// Basic-auth user for Prometheus.
    pub basic_auth_user: Option<String>,
    /// File with the basic-auth password.
    pub basic_auth_password_file: Option<PathBuf>,
    /// PEM CA bundle to trust for Prometheus over HTTPS.
    pub ca_file: Option<PathBuf>,
    /// Alertmanager base URL. Set: every evaluation reads its active, unsilenced,
    /// uninhibited alerts that meet `board_matchers`, which supersede the webhook board;
    /// unreachable, the gate is unknown (closed). None (default): the webhook board alone.
    pub alertmanager_url: Option<String>,
    /// File with a bearer token for Alertmanager.
    pub alertmanager_bearer_token_file: Option<PathBuf>,
    /// Basic-auth user for Alertmanager.
    pub alertmanager_basic_auth_user: Option<String>,
    /// File with the basic-auth password for Alertmanager.
    pub alertmanager_basic_auth_password_file: Option<PathBuf>,
    /// PEM CA bundle to trust for Alertmanager over HTTPS.
    pub alertmanager_ca_file: Option<PathBuf>,
    /// Matchers of the Alertmanager silence rollgate keeps for the node in hand, from its
    /// drain to its uncordon, `{node}` standing for its name (e.g.
    /// `alertname=~"KubeNodeUnschedulable|KubeletDown"`, `node={node}`); one must name the
    /// node. Gate alerts (`upgrade_gate="true"`) are kept out unless a matcher names that
    /// label. Needs `alertmanager_url` (default: none, no silence).
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::config::schema::string_list")]
    pub self_silences: Vec<String>,
    /// How long a self-silence lasts unless extended; rollgate extends it every third of
    /// this while the node is in hand (default `10m`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub self_silence_ttl: Duration,
    /// How long a self-silence outlives the node's uncordon (default `2m`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub self_silence_tail: Duration,
    /// Batch analyses (default: none). With any, each batch of workers is judged after its
    /// soak against the workers beside it, before the next batch's gate. TOML:
    /// `[[gate.analysis]]` tables.
    pub analysis: Vec<AnalysisSettings>,
    /// Checks with thresholds (default: none), asked at the gate before each node or batch
    /// is taken, once the gate is open. TOML: `[[gate.checks]]` tables.
    pub checks: Vec<CheckSettings>,
}

/// One check (`[[gate.checks]]`): any PromQL, each series' value held against a success
/// and a failure condition, `count` measurements `interval` apart; it fails past
/// `failure_limit` failed measurements (the run halts), is inconclusive past
/// `inconclusive_limit` (it holds like a closed gate, and halts past `gate.halt_after`),
/// and passes after `count` within both.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckSettings {
    /// Its name, in verdicts and the history (letters, digits, `_` and `-`).
    pub name: String,
    /// PromQL; every series it returns is measured (e.g.
    /// `sum(rate(http_requests_total{code=~"5.."}[5m])) / sum(rate(http_requests_total[5m]))`).
    pub query: String,
    /// What every series' value must meet for a successful measurement, e.g. `< 0.01`
    /// or, as Argo writes it, `result < 0.01` (default: none).
    #[serde(default)]
    pub success_condition: Option<String>,
    /// What any series' value meeting makes a failed measurement, e.g. `>= 0.05`
    /// (default: none). With both conditions, a value meeting neither is inconclusive.
    #[serde(default)]
    pub failure_condition: Option<String>,
    /// How many measurements make a verdict (default 1).
    #[serde(default = "CheckSettings::default_count")]
    pub count: u32,
    /// The time between two measurements (default `30s`).
    #[serde(default = "CheckSettings::default_interval", with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub interval: Duration,
    /// The most failed measurements that still pass (default 0).
    #[serde(default)]
    pub failure_limit: u32,
    /// The most inconclusive measurements (query errors, no data) that still pass
    /// (default 0).
    #[serde(default)]
    pub inconclusive_limit: u32,
}

impl CheckSettings {
    fn default_count() -> u32 {
        1
    }
    fn default_interval() -> Duration {
        Duration::from_secs(30)
    }

    /// The check as the gate asks it (conditions that do not read are left out:
    /// `check` refuses them first).
    pub fn rule(&self) -> crate::domain::check::CheckRule {
        let condition = |c: &Option<String>| {
            c.as_deref()
                .and_then(|c| crate::domain::check::Condition::parse(c).ok())
        };
        crate::domain::check::CheckRule {
            name: self.name.clone(),
            query: self.query.clone(),
            success: condition(&self.success_condition),
            failure: condition(&self.failure_condition),
            count: self.count,
            interval: self.interval,
            failure_limit: self.failure_limit,
            inconclusive_limit: self.inconclusive_limit,
        }
    }

    fn check(&self, key: &str, halt_after: Duration, p: &mut Problems) {
        if !valid_rule_name(&self.name) {
            p.add(
                &format!("{key}.name"),
                format!("{:?} must be 1-63 letters, digits, '_' and '-'", self.name),
            );
        }
        if self.query.trim().is_empty() {
            p.add(&format!("{key}.query"), "a PromQL query is needed");
        }
        for (field, condition) in [
            ("success_condition", &self.success_condition),
            ("failure_condition", &self.failure_condition),
        ] {
            if let Some(Err(e)) = condition
                .as_deref()
                .map(crate::domain::check::Condition::parse)
            {
                p.add(&format!("{key}.{field}"), e);
            }
        }
        if self.success_condition.is_none() && self.failure_condition.is_none() {
            p.add(
                &format!("{key}.success_condition"),
                "a check needs a success_condition, a failure_condition or both",
            );
        }
        p.range(&format!("{key}.count"), self.count, 1, 1000);
        p.duration(&format!("{key}.interval"), self.interval, 100, 3_600_000);
        if self.failure_limit >= self.count {
            p.add(
                &format!("{key}.failure_limit"),
                format!(
                    "{} must be below count ({}): the check could never fail",
                    self.failure_limit, self.count
                ),
            );
        }
        if self.inconclusive_limit >= self.count {
            p.add(
                &format!("{key}.inconclusive_limit"),
                format!(
                    "{} must be below count ({}): no data could pass the check",
                    self.inconclusive_limit, self.count
                ),
            );
        }
        let measuring = self.interval.saturating_mul(self.count.saturating_sub(1));
        if measuring >= halt_after {
            p.add(
                &format!("{key}.interval"),
                format!(
                    "{} measurements {} apart take longer than gate.halt_after ({})",
                    self.count,
                    humantime::format_duration(self.interval),
                    humantime::format_duration(halt_after)
                ),
            );
        }
    }
}

/// A gate analysis's or check's name: 1-63 letters, digits, `_` and `-`.
fn valid_rule_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One batch analysis (`[[gate.analysis]]`): after each batch's soak, the batch's change
/// of a per-node figure is compared with the change on the workers not yet touched (the
/// last batch: the workers done before it), by a one-sided Mann–Whitney U test and its
/// effect, the Hodges–Lehmann ratio of the batch's changes to the baseline's.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnalysisSettings {
    /// Its name, in verdicts, the history and the metrics (letters, digits, `_` and `-`).
    pub name: String,
    /// PromQL returning one series per node, labelled `node` (e.g.
    /// `histogram_quantile(0.99, sum by (node, le) (rate(http_request_duration_seconds_bucket[1m])))`,
    /// or a join onto `kube_pod_info` the operator writes). Read as a range over each
    /// window; a node's figure is the median of its points.
    pub query: String,
    /// Which change is bad: `increase` (default: latency, restarts, memory) or
    /// `decrease` (throughput, free memory).
    #[serde(default = "AnalysisSettings::default_direction")]
    pub direction: crate::domain::analysis::Direction,
    /// The largest effect that passes, as a ratio of the batch's change to the baseline's
    /// (default 1.2: 20 % worse); above 1.
    #[serde(default = "AnalysisSettings::default_tolerance")]
    pub tolerance: f64,
    /// The fewest nodes with data each group needs, else the verdict is inconclusive
    /// (default 3).
    #[serde(default = "AnalysisSettings::default_min_samples")]
    pub min_samples: usize,
    /// How long each window is: before the batch was taken, and after it came back
    /// (default `10m`). The batch is judged no sooner than this after its soak began.
    #[serde(default = "AnalysisSettings::default_window", with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub window: Duration,
    /// The largest one-sided p-value that counts as a difference (default 0.05).
    #[serde(default = "AnalysisSettings::default_significance")]
    pub significance: f64,
    /// `halt` (default) or `cordon`: what a fail does to the batch besides halting.
    #[serde(default = "AnalysisSettings::default_on_fail")]
    pub on_fail: OnFail,
}

impl AnalysisSettings {
    fn default_direction() -> crate::domain::analysis::Direction {
        crate::domain::analysis::Direction::Increase
    }
    fn default_tolerance() -> f64 {
        1.2
    }
    fn default_min_samples() -> usize {
        3
    }
    fn default_window() -> Duration {
        Duration::from_secs(600)
    }
    fn default_significance() -> f64 {
        0.05
    }
    fn default_on_fail() -> OnFail {
        OnFail::Halt
    }

    /// The analysis as the analysis step judges by it.
    pub fn rule(&self) -> AnalysisRule {
        AnalysisRule {
            name: self.name.clone(),
            query: self.query.clone(),
            criteria: crate::domain::analysis::Criteria {
                direction: self.direction,
                tolerance: self.tolerance,
                min_samples: self.min_samples,
                significance: self.significance,
            },
            window: self.window,
            on_fail: self.on_fail,
        }
    }

    fn check(&self, key: &str, p: &mut Problems) {
        if !valid_rule_name(&self.name) {
            p.add(
                &format!("{key}.name"),
                format!("{:?} must be 1-63 letters, digits, '_' and '-'", self.name),
            );
        }
        if self.query.trim().is_empty() {
            p.add(
                &format!("{key}.query"),
                "a PromQL query returning one series per node, labelled node, is needed",
            );
        }
        if !(self.tolerance.is_finite() && self.tolerance > 1.0 && self.tolerance <= 100.0) {
            p.add(
                &format!("{key}.tolerance"),
                format!(
                    "{} must be a ratio above 1 (1.2 lets the batch be 20 % worse), at most 100",
                    self.tolerance
                ),
            );
        }
        if !(self.significance > 0.0 && self.significance <= 0.5) {
            p.add(
                &format!("{key}.significance"),
                format!(
                    "{} must be a p-value above 0 and at most 0.5 (e.g. 0.05)",
                    self.significance
                ),
            );
        }
        p.range(&format!("{key}.min_samples"), self.min_samples, 1, 10_000);
        p.duration(&format!("{key}.window"), self.window, 1000, 7 * 86_400_000);
    }
}

impl Default for GateSettings {
    fn default() -> Self {
        Self {
            prometheus_url: None,
            query: String::new(),
            count_pending: false,
            exclude_alerts: Vec::new(),
            board_matchers: Matcher::parse("upgrade_gate=true").into_iter().collect(),
            poll_interval: Duration::from_secs(30),
            halt_after: Duration::from_secs(1800),
            quiet_query: r#"max_over_time(ALERTS{alertstate="firing",upgrade_gate="true"}[24h])"#
                .into(),
            timeout: Duration::from_secs(5),
            failures_before_unknown: 1,
            watchdog: "Watchdog".into(),
            rule_group: "Upgrade Gates".into(),
            bearer_token_file: None,
            basic_auth_user: None,
            basic_auth_password_file: None,
            ca_file: None,
            alertmanager_url: None,
            alertmanager_bearer_token_file: None,
            alertmanager_basic_auth_user: None,
            alertmanager_basic_auth_password_file: None,
            alertmanager_ca_file: None,
            self_silences: Vec::new(),
            self_silence_ttl: Duration::from_secs(600),
            self_silence_tail: Duration::from_secs(120),
            analysis: Vec::new(),
            checks: Vec::new(),
        }
    }
}

impl From<&GateSettings> for crate::workflows::gate::GateRules {
    fn from(settings: &GateSettings) -> Self {
        Self {
            query: settings.query.clone(),
            count_pending: settings.count_pending,
            exclude_alerts: settings.exclude_alerts.clone(),
            board_matchers: settings.board_matchers.clone(),
            poll_interval: settings.poll_interval,
            quiet_query: settings.quiet_query.clone(),
            failures_before_unknown: settings.failures_before_unknown,
            sight: crate::domain::sight::SightRules {
                watchdog: settings.watchdog.clone(),
                rule_group: settings.rule_group.clone(),
            },
        }
    }
}

impl GateSettings {
    /// Fills in what depends on other keys: the query follows `count_pending`.
    fn resolve(&mut self) {
        if self.query.is_empty() {
            self.query = if self.count_pending {
                QUERY_PENDING
            } else {
                QUERY_FIRING
            }
            .into();
        }
        self.prometheus_url = self.prometheus_url.take().filter(|u| !u.is_empty());
        self.alertmanager_url = self.alertmanager_url.take().filter(|u| !u.is_empty());
    }

    fn check(&self, p: &mut Problems) {
        for (key, url, example) in [
            (
                "prometheus_url",
                &self.prometheus_url,
                "http://prometheus:9090",
            ),
            (
                "alertmanager_url",
                &self.alertmanager_url,
                "http://alertmanager:9093",
            ),
        ] {
            if let Some(url) = url
                && !reqwest::Url::parse(url).is_ok_and(|u| matches!(u.scheme(), "http" | "https"))
            {
                p.add(key, format!("{url:?} is not a URL like {example}"));
            }
        }
        if !self.watchdog.is_empty() && !crate::domain::sight::valid_alert_name(&self.watchdog) {
            p.add(
                "watchdog",
                format!(
                    "{:?} is not an alert name like Watchdog (letters, digits, _), or \"\" for none",
                    self.watchdog
                ),
            );
        }
        if self.rule_group.chars().any(char::is_control) {
            p.add(
                "rule_group",
                "a rule group's name has no control characters",
            );
        }
        p.duration("poll_interval", self.poll_interval, 100, 3_600_000);
        p.duration("halt_after", self.halt_after, 1000, 7 * 86_400_000);
        p.duration("timeout", self.timeout, 100, 120_000);
        p.range(
            "failures_before_unknown",
            self.failures_before_unknown,
            1,
            100,
        );
        p.path("bearer_token_file", self.bearer_token_file.as_ref());
        p.path(
            "basic_auth_password_file",
            self.basic_auth_password_file.as_ref(),
        );
        p.path("ca_file", self.ca_file.as_ref());
        if self.basic_auth_user.is_some() != self.basic_auth_password_file.is_some() {
            p.add(
                "basic_auth_user",
                "basic auth needs both gate.basic_auth_user and gate.basic_auth_password_file",
            );
        }
        if self.bearer_token_file.is_some() && self.basic_auth_user.is_some() {
            p.add(
                "bearer_token_file",
                "use either a bearer token or basic auth for Prometheus, not both",
            );
        }
        p.path(
            "alertmanager_bearer_token_file",
            self.alertmanager_bearer_token_file.as_ref(),
        );
        p.path(
            "alertmanager_basic_auth_password_file",
            self.alertmanager_basic_auth_password_file.as_ref(),
        );
        p.path("alertmanager_ca_file", self.alertmanager_ca_file.as_ref());
        if self.alertmanager_basic_auth_user.is_some()
            != self.alertmanager_basic_auth_password_file.is_some()
        {
            p.add(
                "alertmanager_basic_auth_user",
                "basic auth needs both gate.alertmanager_basic_auth_user and gate.alertmanager_basic_auth_password_file",
            );
        }
        let mut names = BTreeSet::new();
        for (i, analysis) in self.analysis.iter().enumerate() {
            let key = format!("analysis[{i}]");
            analysis.check(&key, p);
            if !names.insert(analysis.name.as_str()) {
                p.add(
                    &format!("{key}.name"),
                    format!("{:?} names two analyses", analysis.name),
                );
            }
        }
        if !self.analysis.is_empty() && self.prometheus_url.is_none() {
            p.add(
                "analysis",
                "batch analyses read Prometheus: set gate.prometheus_url",
            );
        }
        let mut names = BTreeSet::new();
        for (i, check) in self.checks.iter().enumerate() {
            let key = format!("checks[{i}]");
            check.check(&key, self.halt_after, p);
            if !names.insert(check.name.as_str()) {
                p.add(
                    &format!("{key}.name"),
                    format!("{:?} names two checks", check.name),
                );
            }
        }
        if let Err(e) = crate::domain::self_silence::check_templates(&self.self_silences) {
            p.add("self_silences", e);
        }
        if !self.self_silences.is_empty() && self.alertmanager_url.is_none() {
            p.add(
                "self_silences",
                "self-silences are kept in Alertmanager: set gate.alertmanager_url",
            );
        }
        p.duration("self_silence_ttl", self.self_silence_ttl, 1000, 86_400_000);
        p.duration("self_silence_tail", self.self_silence_tail, 0, 3_600_000);
        if self.alertmanager_bearer_token_file.is_some()
            && self.alertmanager_basic_auth_user.is_some()
        {
            p.add(
                "alertmanager_bearer_token_file",
                "use either a bearer token or basic auth for Alertmanager, not both",
            );
        }
    }
}

/// Notification settings (section `notify`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct NotifySettings {
    /// File holding a Slack incoming-webhook URL; unset: the log only.
    pub slack_webhook_file: Option<PathBuf>,
    /// Bound on one Slack attempt (default `5s`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub timeout: Duration,
    /// Further attempts after a failed one, with back-off (default 3).
    pub retries: u32,
}

impl Default for NotifySettings {
    fn default() -> Self {
        Self {
            slack_webhook_file: None,
            timeout: Duration::from_secs(5),
            retries: 3,
        }
    }
}

impl NotifySettings {
    fn check(&self, p: &mut Problems) {
        p.path("slack_webhook_file", self.slack_webhook_file.as_ref());
        p.duration("timeout", self.timeout, 100, 60_000);
        p.range("retries", self.retries, 0, 10);
    }
}

/// Logging settings (section `log`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `text` (default) or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `rollgate=debug` (default `info`).
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

impl LogSettings {
    fn check(&self, p: &mut Problems) {
        if tracing_subscriber::EnvFilter::try_new(&self.level).is_err() {
            p.add(
                "level",
                format!(
                    "{:?} is not a tracing filter like info or rollgate=debug",
                    self.level
                ),
            );
        }
    }
}

/// The Kubernetes cluster rollgate upgrades (section `cluster`). Without `kubeconfig` or
/// `in_cluster`, no cluster is configured: detections are refused, naming the keys to set.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// Kubeconfig file to use.
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig; its current context when unset.
    pub context: Option<String>,
    /// Use the pod's service account.
    pub in_cluster: bool,
    /// How the nodes are installed, and so how rollgate upgrades them: `kubeadm` (the
    /// pkgs.k8s.io packages through apt, dnf or zypper, `scripts/node-upgrade.sh`), `k3s` or
    /// `rke2` (the release binary from `release_mirror`, checked against the release's
    /// sha256sum file before a node is drained, swapped keeping the previous one,
    /// `scripts/node-k3s.sh`). A node whose kubelet reports another distribution is refused
    /// at planning.
    pub distribution: crate::domain::distribution::Distribution,
    /// With `distribution` k3s or rke2: where the release artifacts are, laid out as the
    /// project's GitHub releases (`MIRROR/v1.31.4%2Bk3s1/sha256sum-amd64.txt`); unset, the
    /// project's own GitHub releases. Every node downloads from it.
    pub release_mirror: Option<String>,
    /// Namespace that carries the in-flight annotations.
    pub namespace: String,
    /// Prefix of rollgate's annotations.
    pub annotation_prefix: String,
    /// Workers in upgrade order; those not named follow by name.
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::config::schema::string_list")]
    pub worker_order: Vec<String>,
    /// How many workers are drained and upgraded together, each batch behind one gate
    /// and followed by one soak: a count (`2`) or a percentage of the workers (`"25%"`,
    /// rounded down, at least 1). PodDisruptionBudgets still bound every eviction.
    /// Control planes always go one at a time.
    #[serde(
        deserialize_with = "values::max_unavailable",
        serialize_with = "crate::config::schema::count_or_percent"
    )]
    #[schemars(schema_with = "crate::config::schema::max_unavailable")]
    pub max_unavailable: crate::workflows::k8s_upgrade::plan::MaxUnavailable,
    /// How many workers may fail their cycle (drain, node script or verify, after their
    /// attempts) and be left behind, cordoned and named, while the run goes on with the
    /// others: a count (`1`) or a percentage of the workers (`"10%"`, rounded down);
    /// default 0, the first failure halts. One failure more halts the run; a run with
    /// workers left behind holds at its end until they are fixed (resume retries exactly
    /// them) or it is aborted. Control planes have no budget.
    #[serde(
        deserialize_with = "values::failure_budget",
        serialize_with = "crate::config::schema::count_or_percent"
    )]
    #[schemars(schema_with = "crate::config::schema::failure_budget")]
    pub failure_budget: crate::workflows::k8s_upgrade::plan::FailureBudget,
    /// The circuit breaker: while more of the cluster's nodes than this are NotReady for
    /// any reason other than the run's own work (the nodes it has in hand are not counted),
    /// no new node is taken; the run holds at its gate naming the count, and halts past
    /// `gate.halt_after`. A count (`3`) or a percentage of all nodes (default `20%`, as
    /// Karpenter's node repair uses; `"100%"` turns it off).
    #[serde(
        deserialize_with = "values::unhealthy_limit",
        serialize_with = "crate::config::schema::count_or_percent"
    )]
    #[schemars(schema_with = "crate::config::schema::unhealthy_limit")]
    pub unhealthy_limit: crate::domain::budget::UnhealthyLimit,
    /// Pods that hold a node's drain while one runs on it (kured's blocking pods):
    /// `key=value`, `key!=value`, `key` or `!key`, any of which holds (default: none).
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::config::schema::string_list")]
    pub blocking_pod_selectors: Vec<String>,
    /// kured's DaemonSet, `namespace/name` (default `kube-system/kured`), whose reboot lock
    /// rollgate honours and holds: while kured holds it, no run that takes the cluster
    /// starts (it waits, naming kured's node); while rollgate has the cluster, it holds
    /// kured's lock too, written as kured writes it, so a kured still running waits. No
    /// such DaemonSet: nothing to honour. Empty: kured's lock is not read.
    pub kured_daemonset: String,
    /// The annotation kured keeps its lock in (kured's `--lock-annotation`).
    pub kured_lock_annotation: String,
    /// How long a drain may take before the step fails; rollgate uncordons a node it
    /// cordoned and the run halts, naming the pods that would not leave.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub drain_timeout: Duration,
    /// Pause between tries of an eviction that was refused (a PodDisruptionBudget, the
    /// server shedding load) or failed: jittered between half of it and all of it, never
    /// shorter than the server's `Retry-After`.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub eviction_retry: Duration,
    /// Grace period for evicted pods, in seconds; each pod's own when unset.
    pub grace_period: Option<u32>,
    /// How long each upgraded worker soaks before the next.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub soak: Duration,
    /// How long a node may take to report the target and Ready after its script.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub verify_timeout: Duration,
    /// How long the control planes (nodes, static pods, etcd) may stay unhealthy before
    /// or after a control plane's upgrade before the run halts.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub control_plane_health_timeout: Duration,
    /// Lowest ratio of Ready pods that post-flight accepts.
    pub pod_ready_ratio: f64,
    /// Bound on every API request.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub request_timeout: Duration,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            in_cluster: false,
            distribution: Default::default(),
            release_mirror: None,
            namespace: "k8s-upgrade".into(),
            annotation_prefix: "rollgate.io".into(),
            worker_order: Vec::new(),
            max_unavailable: Default::default(),
            failure_budget: Default::default(),
            unhealthy_limit: Default::default(),
            blocking_pod_selectors: Vec::new(),
            kured_daemonset: "kube-system/kured".into(),
            kured_lock_annotation: "weave.works/kured-node-lock".into(),
            drain_timeout: Duration::from_secs(600),
            eviction_retry: Duration::from_secs(5),
            grace_period: None,
            soak: Duration::from_secs(600),
            verify_timeout: Duration::from_secs(300),
            control_plane_health_timeout: Duration::from_secs(300),
            pod_ready_ratio: 0.9,
            request_timeout: Duration::from_secs(10),
        }
    }
}

impl ClusterSettings {
    /// kured's DaemonSet as (namespace, name), when one is named.
    pub fn kured_daemonset(&self) -> Option<(&str, &str)> {
        let (ns, name) = self.kured_daemonset.split_once('/')?;
        (values::is_dns_name(ns) && values::is_dns_name(name)).then_some((ns, name))
    }

    /// Where nodes download k3s or RKE2 releases from.
    pub fn release_mirror(&self) -> &str {
        self.release_mirror
            .as_deref()
            .unwrap_or(self.distribution.default_mirror())
    }

    fn check(&self, p: &mut Problems) {
        p.path("kubeconfig", self.kubeconfig.as_ref());
        if let Some(mirror) = &self.release_mirror {
            use crate::domain::distribution::Distribution;
            if self.distribution == Distribution::Kubeadm {
                p.add(
                    "release_mirror",
                    "is for k3s and rke2 clusters; kubeadm nodes upgrade from their package repository",
                );
            } else if !crate::domain::distribution::is_mirror_url(mirror) {
                p.add(
                    "release_mirror",
                    format!("{mirror:?} is not an http(s) URL of letters, digits and ._:/@%-"),
                );
            }
        }
        if self.kubeconfig.is_some() && self.in_cluster {
            p.add(
                "in_cluster",
                "set either cluster.kubeconfig or cluster.in_cluster, not both",
            );
        }
        p.name("namespace", &self.namespace);
        p.name("annotation_prefix", &self.annotation_prefix);
        for raw in &self.blocking_pod_selectors {
            if let Err(e) = crate::workflows::node_cycle::holds::Requirement::parse(raw) {
                p.add("blocking_pod_selectors", e);
            }
        }
        if !self.kured_daemonset.is_empty() && self.kured_daemonset().is_none() {
            p.add(
                "kured_daemonset",
                format!(
                    "{:?} is not namespace/name (kube-system/kured), nor empty",
                    self.kured_daemonset
                ),
            );
        }
        if self.kured_lock_annotation.is_empty() {
            p.add("kured_lock_annotation", "must not be empty");
        }
        for name in &self.worker_order {
            if !values::is_dns_name(name) {
                p.add("worker_order", format!("{name:?} is not a node name"));
            }
        }
        p.duration("drain_timeout", self.drain_timeout, 1000, 24 * 3_600_000);
        p.duration("eviction_retry", self.eviction_retry, 10, 300_000);
        p.range_if_set("grace_period", self.grace_period, 0, 86_400);
        p.duration("soak", self.soak, 0, 24 * 3_600_000);
        p.duration("verify_timeout", self.verify_timeout, 1000, 3_600_000);
        p.duration(
            "control_plane_health_timeout",
            self.control_plane_health_timeout,
            1000,
            3_600_000,
        );
        if !(0.0..=1.0).contains(&self.pod_ready_ratio) {
            p.add(
                "pod_ready_ratio",
                format!("{} must be a number from 0 to 1", self.pod_ready_ratio),
            );
        }
        p.duration("request_timeout", self.request_timeout, 100, 300_000);
    }
}

/// When rollgate may start work on a node (section `schedule`).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleSettings {
    /// Maintenance windows, a union (default: none, always open). Each is a line
    /// `[days] HH:MM-HH:MM [zone]` (e.g. `mon-fri 22:00-06:00 Europe/Berlin`; an end at or
    /// before the start is on the next day; days `mon-fri`, `sat,sun`, or none for every
    /// day; zone UTC unless named) or a table of `days`, `start`, `end`, `time_zone`; from
    /// the environment, lines separated by `;`. Outside them, the pre-flight gate, the
    /// snapshot, the gate before each node and each leadership move wait; a node in hand
    /// finishes.
    #[serde(
        deserialize_with = "values::window_list",
        serialize_with = "crate::config::schema::window_lines"
    )]
    #[schemars(schema_with = "crate::config::schema::window_list")]
    pub windows: crate::domain::schedule::Windows,
}

/// SSH to nodes (section `ssh`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
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
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub connect_timeout: Duration,
    /// Bound on one node-script run, enforced on the node.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub command_timeout: Duration,
    /// `node=[user@]host[:port]` entries for nodes not reached at their InternalIP with
    /// the default user and port.
    #[serde(
        deserialize_with = "host_list",
        serialize_with = "crate::config::schema::host_entries"
    )]
    #[schemars(schema_with = "crate::config::schema::host_list")]
    pub hosts: HashMap<String, SshHost>,
    /// SSH connections opened at once (default 16; 1–256). Sessions already open run side
    /// by side, a batch's whole; only the handshakes queue, so that a pre-flight over a
    /// thousand nodes does not open a thousand at once and time them all out.
    pub max_connecting: usize,
}

impl Default for SshConfig {
    fn default() -> Self {
        Self {
            user: "rollgate".into(),
            port: 22,
            key_file: None,
            known_hosts_file: None,
            connect_timeout: Duration::from_secs(10),
            command_timeout: Duration::from_secs(1800),
            hosts: HashMap::new(),
            max_connecting: 16,
        }
    }
}

impl SshConfig {
    fn check(&self, p: &mut Problems) {
        p.name("user", &self.user);
        p.range("port", self.port, 1, 65_535);
        p.path("key_file", self.key_file.as_ref());
        p.path("known_hosts_file", self.known_hosts_file.as_ref());
        p.duration("connect_timeout", self.connect_timeout, 100, 300_000);
        p.duration("command_timeout", self.command_timeout, 1000, 6 * 3_600_000);
        p.range("max_connecting", self.max_connecting, 1, 256);
    }
}

pub use super::values::SshHost;

/// The etcd cluster of the control plane (section `etcd`): the pre-upgrade snapshot, the
/// health checks between control planes, and (stacked etcd) their order and the one
/// leadership move.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client URLs of the members: every member's, so that each is asked at its own.
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::config::schema::string_list")]
    pub endpoints: Vec<String>,
    /// PEM CA bundle, for TLS.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate.
    pub cert_file: Option<PathBuf>,
    /// PEM client key (a secret: a path).
    pub key_file: Option<PathBuf>,
    /// Bound on connecting and on every request (default `10s`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub timeout: Duration,
    /// Where snapshots are written (default `<data_dir>/snapshots`).
    pub snapshot_dir: PathBuf,
    /// How many pre-upgrade snapshots stay in `snapshot_dir` (default 5): once a new one
    /// is verified, rollgate's oldest beyond this are removed (files it did not write are
    /// never touched). Before a snapshot is taken, about twice the last one's size must be
    /// free there, or the run halts naming the directory, before any node is touched.
    pub snapshot_keep: u32,
    /// How far a member may trail the leader's raft index before a control plane is
    /// touched (default 1000 entries).
    pub max_lag: u64,
    /// How long a leadership move may take to be confirmed by a majority (default `15s`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub transfer_timeout: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            timeout: Duration::from_secs(10),
            snapshot_dir: PathBuf::new(),
            snapshot_keep: 5,
            max_lag: 1000,
            transfer_timeout: Duration::from_secs(15),
        }
    }
}

impl EtcdConfig {
    fn check(&self, p: &mut Problems) {
        for e in &self.endpoints {
            if reqwest::Url::parse(e).is_err() {
                p.add(
                    "endpoints",
                    format!("{e:?} is not a URL like https://10.0.0.5:2379"),
                );
            }
        }
        p.tls_files(&self.ca_file, &self.cert_file, &self.key_file);
        p.duration("timeout", self.timeout, 100, 300_000);
        p.duration("transfer_timeout", self.transfer_timeout, 100, 600_000);
        p.range("snapshot_keep", self.snapshot_keep, 1, 1000);
    }
}

/// `rollgate detect`, the daily CronJob (section `detect`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DetectConfig {
    /// Base of the Kubernetes package repositories; `/v1.NN/deb/Release` and
    /// `/v1.NN/deb/Packages` are appended (default `https://pkgs.k8s.io/core:/stable:`).
    pub repo_url: String,
    /// With `cluster.distribution` k3s or rke2: the channel server whose channels (one per
    /// minor, `v1.34`) name the latest release, read in place of the package repository.
    /// Unset, the project's own: https://update.k3s.io/v1-release/channels for k3s,
    /// https://update.rke2.io/v1-release/channels for RKE2.
    pub channel_url: Option<String>,
    /// Where the detection metrics go (default: none, not pushed).
    pub pushgateway_url: Option<String>,
    /// The Pushgateway job (default `k8s_version_check`).
    pub pushgateway_job: String,
    /// `http` (default) or `amqp`.
    pub submit: DetectSubmit,
    /// The rollgate API for `http` (default `http://<server.listen>`).
    pub rollgate_url: String,
    /// The API token for `http` (default `server.token_file`): a client with
    /// `detections:write` is enough.
    pub token_file: PathBuf,
    /// CA bundle (PEM) to trust `rollgate_url`'s HTTPS certificate with, besides the
    /// system's (default: none).
    pub rollgate_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) to present to rollgate when it asks for mutual TLS
    /// (`server.client_ca_file`); needs `rollgate_key_file`.
    pub rollgate_cert_file: Option<PathBuf>,
    /// Private key (PEM) of `rollgate_cert_file`.
    pub rollgate_key_file: Option<PathBuf>,
    /// The stages the requested upgrade runs (default `all`).
    pub stages: String,
    /// Bound on every HTTP request (default `10s`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::config::schema::duration")]
    pub timeout: Duration,
}

impl Default for DetectConfig {
    fn default() -> Self {
        Self {
            repo_url: "https://pkgs.k8s.io/core:/stable:".into(),
            channel_url: None,
            pushgateway_url: None,
            pushgateway_job: "k8s_version_check".into(),
            submit: DetectSubmit::Http,
            rollgate_url: String::new(),
            token_file: PathBuf::new(),
            rollgate_ca_file: None,
            rollgate_cert_file: None,
            rollgate_key_file: None,
            stages: "all".into(),
            timeout: Duration::from_secs(10),
        }
    }
}

impl DetectConfig {
    /// Fills in what depends on other keys: the API and token of this rollgate.
    fn resolve(&mut self, server: &ServerSettings) {
        if self.rollgate_url.is_empty() {
            self.rollgate_url = format!("{}://{}", server.scheme(), server.listen);
        }
        if self.token_file.as_os_str().is_empty() {
            self.token_file = server.token_file.clone();
        }
        self.pushgateway_url = self.pushgateway_url.take().filter(|u| !u.is_empty());
        for url in [&mut self.repo_url, &mut self.rollgate_url]
            .into_iter()
            .chain(self.pushgateway_url.as_mut())
        {
            *url = url.trim_end_matches('/').to_owned();
        }
    }

    fn check(&self, p: &mut Problems) {
        p.http_url("repo_url", &self.repo_url);
        if let Some(url) = &self.channel_url {
            p.http_url("channel_url", url);
        }
        p.http_url("rollgate_url", &self.rollgate_url);
        p.path("rollgate_ca_file", self.rollgate_ca_file.as_ref());
        p.path("rollgate_cert_file", self.rollgate_cert_file.as_ref());
        p.path("rollgate_key_file", self.rollgate_key_file.as_ref());
        if self.rollgate_cert_file.is_some() != self.rollgate_key_file.is_some() {
            p.add(
                "rollgate_cert_file",
                "rollgate_cert_file and rollgate_key_file go together: set both, or neither",
            );
        }
        if let Some(url) = &self.pushgateway_url {
            p.http_url("pushgateway_url", url);
        }
        let job_ok = !self.pushgateway_job.is_empty()
            && self
                .pushgateway_job
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !job_ok {
            p.add("pushgateway_job", "must be letters, digits, '_' or '-'");
        }
        if let Err(e) = crate::domain::event::StageSelection::parse(&self.stages) {
            p.add("stages", e);
        }
        p.duration("timeout", self.timeout, 100, 300_000);
    }
}

/// Every setting, validated.
#[derive(Debug, Clone, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Settings {
    /// Where the embedded queue, the run store and the generated token live.
    pub data_dir: PathBuf,
    /// The HTTP API.
    pub server: ServerSettings,
    /// The queue events land in.
    pub queue: QueueSettings,
    /// Where runs are kept.
    pub store: StoreSettings,
    /// The worker that advances runs.
    pub worker: WorkerSettings,
    /// When a risky step may go ahead.
    pub gate: GateSettings,
    /// Who is told about transitions.
    pub notify: NotifySettings,
    /// Log format and filter.
    pub log: LogSettings,
    /// The Kubernetes cluster to upgrade.
    pub cluster: ClusterSettings,
    /// SSH to the nodes.
    pub ssh: SshConfig,
    /// The control plane's etcd, for the pre-upgrade snapshot.
    pub etcd: EtcdConfig,
    /// `rollgate detect`.
    pub detect: DetectConfig,
    /// Maintenance windows.
    pub schedule: ScheduleSettings,
    /// The workflows' own sections (`etcd_roll`, `reboot`, `fleet`, …), each defined in
    /// its workflow's folder.
    #[schemars(flatten)]
    pub workflows: WorkflowSettings,
}

impl Settings {
    /// Whether a cluster is configured (`cluster.kubeconfig` or `cluster.in_cluster`).
    pub fn cluster_configured(&self) -> bool {
        self.cluster.kubeconfig.is_some() || self.cluster.in_cluster
    }

    /// The keys a Kubernetes upgrade needs that are not set: the node script runs over
    /// SSH (`ssh.key_file`, `ssh.known_hosts_file`) and the snapshot, etcd's health and the
    /// control planes' order need etcd (`etcd.endpoints`). Etcd rolls need none of them.
    pub fn upgrade_keys_missing(&self) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.ssh.key_file.is_none() {
            missing.push("ssh.key_file");
        }
        if self.ssh.known_hosts_file.is_none() {
            missing.push("ssh.known_hosts_file");
        }
        if self.etcd.endpoints.is_empty() {
            missing.push("etcd.endpoints");
        }
        missing
    }

    /// Fills in the defaults that depend on other keys, then checks every section;
    /// problems are keyed by their full key.
    pub(super) fn resolve_and_check(&mut self, problems: &mut Vec<super::Problem>) {
        if self.server.token_file.as_os_str().is_empty() {
            self.server.token_file = self.data_dir.join("api-token");
            self.server.token_file_is_default = true;
        } else {
            self.server.token_file_is_default = false;
        }
        if self.etcd.snapshot_dir.as_os_str().is_empty() {
            self.etcd.snapshot_dir = self.data_dir.join("snapshots");
        }
        self.gate.resolve();
        self.detect.resolve(&self.server);
        self.check_sections(&mut |p| problems.extend(p.into_problems()));
    }

    /// The bounds each section's check holds its keys to, read off the checks of the
    /// embedded defaults: what the reference and the schema print.
    pub fn bounds() -> Vec<(String, super::schema::Bound)> {
        let defaults =
            Self::load_from(None, Some(HashMap::new())).expect("the embedded defaults are valid");
        let mut bounds = Vec::new();
        defaults.check_sections(&mut |p| bounds.extend(p.into_bounds()));
        bounds
    }

    /// Checks every section, handing each section's findings to `each`.
    fn check_sections(&self, each: &mut dyn FnMut(Problems)) {
        let mut check = |section: &'static str, f: &dyn Fn(&mut Problems)| {
            let mut p = Problems::new(section);
            f(&mut p);
            each(p);
        };
        check("server", &|p| self.server.check(p));
        check("queue", &|p| self.queue.check(p));
        check("store", &|p| self.store.check(p));
        check("worker", &|p| self.worker.check(p));
        check("gate", &|p| self.gate.check(p));
        check("notify", &|p| self.notify.check(p));
        check("log", &|p| self.log.check(p));
        check("cluster", &|p| self.cluster.check(p));
        check("ssh", &|p| self.ssh.check(p));
        check("etcd", &|p| self.etcd.check(p));
        check("detect", &|p| self.detect.check(p));
        self.workflows.check(each);
    }
}
