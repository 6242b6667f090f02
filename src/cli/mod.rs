//! Command line: `serve`, `check-config`, `plan`, `detect`, `etcd-roll`,
//! `runs list|show|halt|resume|abort`.

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{LogFormat, Settings};

mod detect;
mod etcd_roll;
mod fleet;
mod plan;
mod runs;
mod show;
pub mod watch;

use detect::detect;
use etcd_roll::etcd_roll;
use plan::{PlanRefused, plan};
use runs::runs;

/// What `rollgate --version` prints: the release and the commit it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ROLLGATE_COMMIT"),
    ")"
);

/// rollgate: gated, event-driven Kubernetes and etcd upgrades.
#[derive(Parser, Debug)]
#[command(name = "rollgate", version = VERSION, about)]
pub struct Cli {
    /// Configuration file (TOML); ROLLGATE__SECTION__KEY environment variables override it.
    #[arg(long, global = true, env = "ROLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What `rollgate config` prints, generated from the configuration's types; no settings
/// are read.
#[derive(Subcommand, Debug, Clone, Copy)]
pub enum ConfigDoc {
    /// The JSON Schema of a configuration file (draft 7), e.g. for an editor's TOML
    /// language server.
    Schema,
    /// Every key with its type, default, bounds, environment variable and documentation
    /// (Markdown).
    Reference,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the HTTP API, the queue consumer and the scheduler.
    Serve,
    /// Check the configuration and report every bad value (exit 2 when any). Files that
    /// only the pod mounts (the API tokens, the TLS certificate) are read when they are
    /// here and reported "not checked here" when they are not, so a site's configuration
    /// can be checked on a workstation or in CI.
    CheckConfig {
        /// Also require those files to be here and valid, as inside the pod
        /// (`kubectl exec … rollgate check-config --strict`).
        #[arg(long)]
        strict: bool,
    },
    /// Roll an etcd cluster in the foreground (command driver): followers first, one
    /// leadership transfer, the old leader last; a progress line per step, a JSON report.
    EtcdRoll(EtcdRollArgs),
    /// Plan a Kubernetes upgrade against the cluster as it is now: print the steps, the
    /// gates and what each step will do. Reads the cluster; changes nothing.
    Plan(PlanArgs),
    /// Detect the upgrade to make (what the daily CronJob runs): the running version, the
    /// newest patch the control plane's package repository (apt, dnf or zypper) offers,
    /// whether the next minor is released; push the result to the Pushgateway and ask
    /// rollgate for the upgrade.
    /// Exit 0: done (nothing to do, asked for, already in flight, or held by another
    /// upgrade); 2: configuration; 3: some facts could not be read (that part pushed and
    /// asked nothing; with --reboots the other part was acted on); 4: rollgate did not take
    /// a request; 5: the metrics were not pushed.
    Detect(DetectArgs),
    /// Look at and control runs through the API.
    Runs {
        /// How to reach the API: a client with `read` looks, one with `runs:control` also
        /// halts, resumes and aborts, one with `runs:approve` approves.
        #[command(flatten)]
        api: ApiArgs,
        /// What to do.
        #[command(subcommand)]
        action: RunsAction,
    },
    /// Print a shell completion script, e.g.
    /// `rollgate completions bash > /etc/bash_completion.d/rollgate`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), e.g. `rollgate man > /usr/share/man/man1/rollgate.1`.
    Man,
    /// Describe the configuration: its JSON Schema (for editors) or its reference page.
    Config {
        /// What to print.
        #[command(subcommand)]
        what: ConfigDoc,
    },
    /// Write the handbook's generated reference pages (configuration, its schema, the
    /// command line, the HTTP API, the metrics) into a directory, e.g. `docs/src/reference`.
    Docs {
        /// The directory to write into.
        dir: PathBuf,
    },
    /// This cluster's place in a fleet wave, through the API (a token with `read`).
    Fleet {
        /// How to reach the API.
        #[command(flatten)]
        api: ApiArgs,
        /// What to do.
        #[command(subcommand)]
        action: FleetAction,
    },
}

/// How `rollgate runs` and `rollgate fleet` reach rollgate's API.
#[derive(clap::Args, Debug, Default)]
pub struct ApiArgs {
    /// API base URL (default: from server.listen, https when server.tls_cert_file is set).
    #[arg(long)]
    pub url: Option<String>,
    /// API token file (default: server.token_file).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// How to reach an HTTPS listener.
    #[command(flatten)]
    pub tls: ApiTlsArgs,
}

/// TLS to rollgate's API for `rollgate runs`.
#[derive(clap::Args, Debug, Default)]
pub struct ApiTlsArgs {
    /// CA bundle (PEM) to trust the listener's certificate with, besides the system's.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs --key-file.
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of --cert-file.
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// The name the listener's certificate is checked against, when --url reaches it by
    /// another (`kubectl port-forward` to https://127.0.0.1:8443 of a certificate made out
    /// to rollgate.rollgate.svc): the connection goes to --url's address, TLS names this.
    #[arg(long)]
    pub tls_server_name: Option<String>,
}

/// `detect` options.
#[derive(clap::Args, Debug)]
pub struct DetectArgs {
    /// Find, decide and push the metrics, but do not ask for the upgrade (or reboots).
    #[arg(long)]
    pub dry_run: bool,
    /// Also read every node's reboot sentinel over SSH (`reboot.sentinel_file` or
    /// `reboot.sentinel_command`), push `rollgate_node_reboot_required{node}` and ask for
    /// the reboots of the nodes whose sentinel is set.
    #[arg(long)]
    pub reboots: bool,
    /// Check for an upgrade only on these days (UTC; e.g. `sun` or `sat,sun`), so that a
    /// daily run reads the sentinels every day and the upgrade weekly. Default: every run.
    #[arg(long, value_delimiter = ',', value_parser = parse_weekday)]
    pub upgrades_on: Vec<chrono::Weekday>,
}

/// A day of the week as `--upgrades-on` takes it: `mon` … `sun`, or the whole name.
fn parse_weekday(text: &str) -> Result<chrono::Weekday, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a day of the week (mon, tue, … sun)"))
}

/// `plan` options.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The version to reach, MAJOR.MINOR.PATCH.
    #[arg(long)]
    pub target: String,
    /// Inferred from the control plane's version when left out.
    #[arg(long, value_enum)]
    pub kind: Option<KindArg>,
    /// `all` or a comma list of stages.
    #[arg(long, default_value = "all")]
    pub stages: String,
    /// Plan a dry run (checks only).
    #[arg(long)]
    pub dry_run: bool,
}

/// `etcd-roll` options.
#[derive(clap::Args, Debug)]
pub struct EtcdRollArgs {
    /// Client URL of every member, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// How members are restarted.
    #[arg(long, value_enum, default_value_t = DriverArg::Command)]
    pub driver: DriverArg,
    /// command driver: shell command restarting one member (`{name}`, `{endpoint}`, or
    /// $ROLLGATE_MEMBER, $ROLLGATE_ENDPOINT).
    #[arg(long)]
    pub restart_command: Option<String>,
    /// command driver: shell command exiting 0 when a member runs the target revision
    /// (same variables).
    #[arg(long)]
    pub probe_command: Option<String>,
    /// statefulset driver: the StatefulSet whose pods are the members (member name = pod
    /// name).
    #[arg(long)]
    pub statefulset: Option<String>,
    /// statefulset driver: its namespace.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// How long a restarted member may take to be healthy, at target and caught up.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub ready_timeout: std::time::Duration,
    /// How long a leadership transfer may take to be confirmed by a majority.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub transfer_timeout: std::time::Duration,
    /// A fixed pause after each member is back, on top of the wait until it is caught
    /// up (default none: go on as soon as it is).
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub cooldown: std::time::Duration,
    /// How far behind the leader's raft index another member may be.
    #[arg(long, default_value_t = 1000)]
    pub max_lag: u64,
    /// Timeout of every etcd call.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub timeout: std::time::Duration,
    /// PEM CA bundle for etcd over TLS.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for etcd.
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// PEM key of the client certificate.
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Roll without asking the gate before each restart (not recommended). Otherwise the
    /// gate's Prometheus query (gate.prometheus_url, gate.query) is asked before every
    /// restart; a one-shot roll has no Alertmanager board, and no Prometheus means the
    /// gate is unknown, which holds the roll.
    #[arg(long)]
    pub no_gate: bool,
    /// How long a closed gate may hold the roll before it stops (default gate.halt_after).
    #[arg(long, value_parser = duration)]
    pub gate_timeout: Option<std::time::Duration>,
}

/// `plan --kind`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindArg {
    /// Same minor, newer patch.
    Patch,
    /// The next minor.
    Minor,
}

/// `etcd-roll --driver`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverArg {
    /// Members restarted by --restart-command, "at target" told by --probe-command.
    Command,
    /// The pods of --statefulset, through cluster.kubeconfig or cluster.in_cluster.
    Statefulset,
}

/// `runs list --status`: one of the run statuses, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusArg(pub crate::domain::run::RunStatus);

impl clap::ValueEnum for StatusArg {
    fn value_variants<'a>() -> &'a [Self] {
        use crate::domain::run::RunStatus as S;
        &[
            Self(S::Queued),
            Self(S::Running),
            Self(S::Waiting),
            Self(S::Halted),
            Self(S::Failed),
            Self(S::Succeeded),
            Self(S::Aborted),
        ]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.0.name()))
    }
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 500ms, 30s or 5m: {e}"))
}

/// `runs` sub-commands.
#[derive(Subcommand, Debug)]
pub enum RunsAction {
    /// List runs, newest first.
    List {
        /// Only runs in this status.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Print the runs as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one run: every step with its attempts and last outcome, each batch analysis's
    /// verdict with its figures, and the history.
    Show {
        /// The run's id, as `runs list` shows it.
        id: String,
        /// Print the run as the API's JSON instead.
        #[arg(long)]
        json: bool,
    },
    /// Follow a run live until it ends, a line per transition with its progress. Exit 0
    /// when it succeeds, 3 when it halts, 4 when it fails, 5 when it is aborted.
    Watch {
        /// The run's id, as `runs list` shows it.
        id: String,
        /// Stop as soon as the run is held (waiting on a closed or unknown gate, naming
        /// what holds it): exit 0 then, 6 when it ends without being held.
        #[arg(long)]
        until_held: bool,
    },
    /// Finish the current step, then hold.
    Halt {
        /// The run's id, as `runs list` shows it.
        id: String,
        /// Why, for the history.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Continue a halted run from the held step.
    Resume {
        /// The run's id, as `runs list` shows it.
        id: String,
        /// Why, for the history.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Stop a run for good.
    Abort {
        /// The run's id, as `runs list` shows it.
        id: String,
        /// Why, for the history.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Let an upgrade that waits for an approval (`fleet.require_approval`) go on; needs a
    /// token with `runs:approve`.
    Approve {
        /// The run's id, as `runs list` shows it.
        id: String,
        /// Why, for the history.
        #[arg(long, default_value = "")]
        reason: String,
    },
}

/// What `rollgate fleet` does.
#[derive(Subcommand, Debug)]
pub enum FleetAction {
    /// The chain of clusters upstream of this one: each with its versions, last upgrade,
    /// gate and the soak left.
    Status {
        /// Print `GET /v1/fleet` as JSON instead.
        #[arg(long)]
        json: bool,
    },
}

/// What the listener will serve, read as `serve` reads it: the API's clients with their
/// scopes, and TLS. An error names the file that cannot be used (never a token).
/// The files the listener reads at start: the API tokens and the TLS certificate. Inside
/// the pod they are mounted Secrets; elsewhere they are usually absent. The default token
/// file is left out: serve generates it at its first start.
fn listener_files(settings: &Settings) -> Vec<PathBuf> {
    let s = &settings.server;
    let sources = crate::app::token_sources(settings);
    let admin = sources.admin_file.filter(|_| !s.token_file_is_default);
    [
        admin,
        sources.dir,
        s.tls_cert_file.clone(),
        s.tls_key_file.clone(),
        s.client_ca_file.clone(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn check_listener(settings: &Settings) -> anyhow::Result<(String, String)> {
    use crate::http::clients::Clients;
    let mut sources = crate::app::token_sources(settings);
    let with_admin = sources.admin_file.is_some();
    // serve generates the default token file on first start.
    if settings.server.token_file_is_default {
        sources.admin_file = sources.admin_file.filter(|p| p.exists());
    }
    let clients = Clients::load(sources)
        .context("cannot read the API tokens (server.token_file, server.tokens_dir)")?;
    let listed: Vec<String> = clients
        .list()
        .iter()
        .map(|c| {
            let scopes: Vec<&str> = c.scopes.iter().map(|s| s.name()).collect();
            format!("{} ({})", c.name, scopes.join(", "))
        })
        .collect();
    let clients = match (listed.is_empty(), with_admin) {
        (false, _) => listed.join(", "),
        (true, true) => "admin (every scope; its token is generated at the first start)".into(),
        (true, false) => "none: every request under /v1 is refused".into(),
    };
    let s = &settings.server;
    let tls = match (&s.tls_cert_file, &s.tls_key_file) {
        (Some(cert), Some(key)) => {
            crate::http::tls::Tls::load(crate::http::tls::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: s.client_ca_file.clone(),
            })
            .context("cannot serve TLS")?;
            match &s.client_ca_file {
                Some(ca) => format!("https, mutual TLS (clients signed by {})", ca.display()),
                None => "https".to_owned(),
            }
        }
        _ => "off (plain HTTP)".to_owned(),
    };
    Ok((clients, tls))
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    crate::workflows::register();
    // Generated from the command line's own definition: no settings are read for them.
    match &cli.command {
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(*shell, &mut command, "rollgate", &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Config { what } => {
            let text = match what {
                ConfigDoc::Schema => crate::reference::schema_json(),
                ConfigDoc::Reference => crate::config::schema::reference(),
            };
            // A pager quitting early is no error.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
            return ExitCode::SUCCESS;
        }
        Command::Docs { dir } => {
            for (name, text) in crate::reference::pages(<Cli as clap::CommandFactory>::command()) {
                let path = dir.join(name);
                if let Err(e) = std::fs::write(&path, text) {
                    eprintln!("rollgate: cannot write {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
                println!("wrote {}", path.display());
            }
            return ExitCode::SUCCESS;
        }
        Command::Man => {
            let command = <Cli as clap::CommandFactory>::command();
            return match clap_mangen::Man::new(command).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rollgate: cannot write the manual page: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rollgate: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::CheckConfig { strict } => {
            println!("configuration OK");
            println!("  listen      {}", settings.server.listen);
            println!("  data_dir    {}", settings.data_dir.display());
            println!("  token_file  {}", settings.server.token_file.display());
            let absent = listener_files(&settings)
                .into_iter()
                .filter(|p| !p.exists())
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>();
            let checked = if absent.is_empty() || strict {
                check_listener(&settings)
            } else {
                let not_here = format!(
                    "not checked here: {} (mounted in the pod; check-config --strict there)",
                    absent.join(", ")
                );
                Ok((not_here.clone(), not_here))
            };
            match checked {
                Ok((clients, tls)) => {
                    println!("  clients     {clients}");
                    println!("  tls         {tls}");
                }
                Err(e) => {
                    eprintln!("rollgate: {e:#}");
                    return ExitCode::from(2);
                }
            }
            println!("  queue       {:?}", settings.queue.backend);
            let cluster = match (&settings.cluster.kubeconfig, settings.cluster.in_cluster) {
                (Some(path), _) => format!("kubeconfig {}", path.display()),
                (None, true) => "in-cluster service account".into(),
                (None, false) => "none".into(),
            };
            println!("  cluster     {cluster}");
            let upgrades = match crate::app::upgrades_unavailable(&settings) {
                None => "on".to_owned(),
                Some(why) => format!("off: {why} (detections are refused)"),
            };
            println!("  upgrades    {upgrades}");
            let windows = &settings.schedule.windows;
            let schedule = match windows.at(chrono::Utc::now()) {
                crate::domain::schedule::Now::Always => "always (no maintenance window)".into(),
                crate::domain::schedule::Now::Open { closes, .. } => format!(
                    "{}: open now, until {}",
                    windows.describe(),
                    closes.format("%Y-%m-%d %H:%M:%S UTC")
                ),
                crate::domain::schedule::Now::Closed { opens } => format!(
                    "{}: closed now, next opens at {}",
                    windows.describe(),
                    opens.format("%Y-%m-%d %H:%M:%S UTC")
                ),
            };
            println!("  windows     {schedule}");
            let gate = &settings.gate;
            println!(
                "  gate        prometheus {}, alertmanager {}, watchdog {}, rule group {}",
                gate.prometheus_url
                    .as_deref()
                    .map_or("none (every gate unknown)".into(), without_userinfo),
                gate.alertmanager_url
                    .as_deref()
                    .map_or("none (webhooks alone)".into(), without_userinfo),
                if gate.watchdog.is_empty() {
                    "off"
                } else {
                    gate.watchdog.as_str()
                },
                if gate.rule_group.is_empty() {
                    "off".to_owned()
                } else {
                    format!("{:?}", gate.rule_group)
                },
            );
            if gate.watchdog.is_empty() {
                println!(
                    "  warning     gate.watchdog is off: a gate whose Prometheus evaluates no \
                     rules, or whose alerts never reach Alertmanager, reads nothing and opens"
                );
            }
            let analyses = if gate.analysis.is_empty() {
                "none (batches are not judged)".to_owned()
            } else {
                gate.analysis
                    .iter()
                    .map(|a| {
                        format!(
                            "{} ({} past {}x is bad, window {}{})",
                            a.name,
                            match a.direction {
                                crate::domain::analysis::Direction::Increase => "an increase",
                                crate::domain::analysis::Direction::Decrease => "a decrease",
                            },
                            a.tolerance,
                            humantime::format_duration(a.window),
                            if a.on_fail == crate::domain::analysis::OnFail::Cordon {
                                ", a failed batch cordoned"
                            } else {
                                ""
                            }
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            println!("  analyses    {analyses}");
            let checks = if gate.checks.is_empty() {
                "none (the gate reads alerts alone)".to_owned()
            } else {
                gate.checks
                    .iter()
                    .map(|c| {
                        let conditions: Vec<String> = [
                            c.success_condition.as_ref().map(|s| format!("success {s}")),
                            c.failure_condition.as_ref().map(|f| format!("failure {f}")),
                        ]
                        .into_iter()
                        .flatten()
                        .collect();
                        format!(
                            "{} ({}; {} x {}, failure_limit {}, inconclusive_limit {})",
                            c.name,
                            conditions.join(", "),
                            c.count,
                            humantime::format_duration(c.interval),
                            c.failure_limit,
                            c.inconclusive_limit
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            println!("  checks      {checks}");
            println!(
                "  workers     {} at a time (cluster.max_unavailable); none taken while more \
                 than {} of the nodes are NotReady (cluster.unhealthy_limit)",
                settings.cluster.max_unavailable, settings.cluster.unhealthy_limit
            );
            println!(
                "  ssh         user {}, key {}, known_hosts {}",
                settings.ssh.user,
                settings
                    .ssh
                    .key_file
                    .as_ref()
                    .map_or("unset".into(), |p| p.display().to_string()),
                settings
                    .ssh
                    .known_hosts_file
                    .as_ref()
                    .map_or("unset".into(), |p| p.display().to_string()),
            );
            println!(
                "  etcd        {} endpoint(s), snapshots in {}",
                settings.etcd.endpoints.len(),
                settings.etcd.snapshot_dir.display()
            );
            let around = crate::setting::Around {
                cluster_configured: settings.cluster_configured(),
            };
            for (label, text) in settings.workflows.summary(&around) {
                println!("  {label:<11} {text}");
            }
            let d = &settings.detect;
            let source = match settings.cluster.distribution {
                crate::domain::distribution::Distribution::Kubeadm => {
                    format!("repository {}", d.repo_url)
                }
                distribution => format!(
                    "{distribution} channels {}",
                    d.channel_url
                        .as_deref()
                        .unwrap_or(distribution.default_channel_url())
                ),
            };
            println!(
                "  detect      {source}, pushgateway {}, submit {} to {}",
                d.pushgateway_url.as_deref().unwrap_or("none"),
                match d.submit {
                    crate::config::DetectSubmit::Http => "http",
                    crate::config::DetectSubmit::Amqp => "amqp",
                },
                match d.submit {
                    crate::config::DetectSubmit::Http => d.rollgate_url.as_str(),
                    crate::config::DetectSubmit::Amqp => "queue.amqp_url",
                }
            );
            ExitCode::SUCCESS
        }
        // Answered before the settings are read.
        Command::Completions { .. }
        | Command::Man
        | Command::Config { .. }
        | Command::Docs { .. } => ExitCode::SUCCESS,
        Command::Serve => {
            init_logging(&settings);
            let result = block_on(true, crate::app::serve(settings));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("rollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::EtcdRoll(args) => {
            init_logging(&settings);
            let result = block_on(true, etcd_roll(&settings, args));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Plan(args) => {
            let result = block_on(false, plan(&settings, args));
            match result {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) if e.is::<PlanRefused>() => {
                    eprintln!("rollgate: {e:#}");
                    ExitCode::from(2)
                }
                Err(e) => {
                    eprintln!("rollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Detect(args) => {
            init_logging(&settings);
            let result = block_on(false, detect(&settings, args));
            match result {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("rollgate: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Fleet {
            api,
            action: FleetAction::Status { json },
        } => {
            let result = runs::Api::new(&settings, api)
                .and_then(|api| block_on(false, async move { fleet::status(&api, json).await }));
            match result {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("rollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Runs { api, action } => {
            let result = block_on(false, runs(&settings, api, action));
            match result {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("rollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Runs `future` to completion on a fresh runtime (`multi_thread` for the long-running
/// commands).
fn block_on<T>(
    multi_thread: bool,
    future: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder
        .enable_all()
        .build()
        .context("cannot start the runtime")?
        .block_on(future)
}

fn init_logging(settings: &Settings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&settings.log.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::logging::LossyStderr)
        .log_internal_errors(false)
        // Colour only for a person at a terminal, never in a log file or a pod's log.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match settings.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// `base` with the path `segments` appended, each encoded as one segment.
pub(crate) fn api_url(base: &reqwest::Url, segments: &[&str]) -> anyhow::Result<reqwest::Url> {
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("--url {base} cannot carry a path"))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// `url` as it may be printed: without a user or password written into it.
fn without_userinfo(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if !parsed.username().is_empty() || parsed.password().is_some() => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_sets_are_refused_by_the_parser() {
        let cases = [
            vec!["rollgate", "plan", "--target", "1.34.5", "--kind", "major"],
            vec![
                "rollgate",
                "etcd-roll",
                "--endpoints",
                "http://a",
                "--driver",
                "ssh",
            ],
            vec!["rollgate", "runs", "list", "--status", "done"],
        ];
        for args in cases {
            let err = Cli::try_parse_from(&args).unwrap_err().to_string();
            assert!(err.contains("invalid value"), "{args:?}: {err}");
        }
        let ok = Cli::try_parse_from([
            "rollgate",
            "etcd-roll",
            "--endpoints",
            "http://a",
            "--transfer-timeout",
            "40s",
        ])
        .unwrap();
        let Command::EtcdRoll(args) = ok.command else {
            panic!("not etcd-roll");
        };
        assert_eq!(args.transfer_timeout, std::time::Duration::from_secs(40));
        assert_eq!(args.ready_timeout, std::time::Duration::from_secs(60));
    }
}
