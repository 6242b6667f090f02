//! Command line: `serve`, `check-config`, `plan`, `detect`, `etcd-roll`,
//! `runs list|show|halt|resume|abort`.

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{LogFormat, Settings};

/// rollgate: gated, event-driven Kubernetes and etcd upgrades.
#[derive(Parser, Debug)]
#[command(name = "rollgate", version, about)]
pub struct Cli {
    /// Configuration file (TOML); ROLLGATE__SECTION__KEY environment variables override it.
    #[arg(long, global = true, env = "ROLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the HTTP API, the queue consumer and the scheduler.
    Serve,
    /// Check the configuration and report every bad value (exit 2 when any).
    CheckConfig,
    /// Roll an etcd cluster in the foreground (command driver): followers first, one
    /// leadership transfer, the old leader last; a progress line per step, a JSON report.
    EtcdRoll(EtcdRollArgs),
    /// Plan a Kubernetes upgrade against the cluster as it is now: print the steps, the
    /// gates and what each step will do. Reads the cluster; changes nothing.
    Plan(PlanArgs),
    /// Detect the upgrade to make (what the weekly CronJob runs): the running version, the
    /// newest patch the control plane's apt repository offers, whether the next minor is
    /// released; push the result to the Pushgateway and ask rollgate for the upgrade.
    /// Exit 0: done (nothing to do, asked for, already in flight, or held by another
    /// upgrade); 2: configuration; 3: the facts could not be read, nothing pushed or asked
    /// for; 4: rollgate did not take the request; 5: the metrics were not pushed.
    Detect(DetectArgs),
    /// Look at and control runs through the API.
    Runs {
        /// API base URL (default: from server.listen).
        #[arg(long)]
        url: Option<String>,
        /// API token file (default: server.token_file).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// What to do.
        #[command(subcommand)]
        action: RunsAction,
    },
}

/// `detect` options.
#[derive(clap::Args, Debug)]
pub struct DetectArgs {
    /// Find, decide and push the metrics, but do not ask for the upgrade.
    #[arg(long)]
    pub dry_run: bool,
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
    /// Pause after each member is back.
    #[arg(long, default_value = "5s", value_parser = duration)]
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
    },
    /// Show one run with its steps and history (JSON).
    Show {
        /// The run's id, as `runs list` shows it.
        id: String,
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
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rollgate: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::CheckConfig => {
            println!("configuration OK");
            println!("  listen      {}", settings.server.listen);
            println!("  data_dir    {}", settings.data_dir.display());
            println!("  token_file  {}", settings.server.token_file.display());
            println!("  queue       {:?}", settings.queue.backend);
            let cluster = match (&settings.cluster.kubeconfig, settings.cluster.in_cluster) {
                (Some(path), _) => format!("kubeconfig {}", path.display()),
                (None, true) => "in-cluster service account".into(),
                (None, false) => "none (upgrade runs wait at their plan step)".into(),
            };
            println!("  cluster     {cluster}");
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
            println!(
                "  etcd rolls  TLS {}, timeout {:?}, transfer timeout {:?}",
                if settings.etcd_roll.ca_file.is_some() {
                    "configured"
                } else {
                    "off (http:// members only)"
                },
                settings.etcd_roll.timeout,
                settings.etcd_roll.transfer_timeout
            );
            let d = &settings.detect;
            println!(
                "  detect      repository {}, pushgateway {}, submit {} to {}",
                d.repo_url,
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
        Command::Runs {
            url,
            token_file,
            action,
        } => {
            let result = block_on(false, runs(&settings, url, token_file, action));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `rollgate detect`: the report as JSON on stdout, the exit code of what happened.
/// Errors are configuration problems (exit 2).
async fn detect(settings: &Settings, args: DetectArgs) -> anyhow::Result<u8> {
    use crate::adapters::pushgateway::Pushgateway;
    use crate::adapters::repo::PackageRepo;
    use crate::adapters::submit::{AmqpSubmitter, HttpSubmitter};
    use crate::config::DetectSubmit;
    use crate::domain::event::StageSelection;
    use crate::ports::Submitter;
    use crate::workflows::detect::Sources;
    use std::sync::Arc;
    let d = &settings.detect;
    let Some(kube) = crate::app::kube_client(settings).await? else {
        bail!("detect needs cluster.kubeconfig or cluster.in_cluster");
    };
    let sources = Sources {
        cluster: Arc::new(kube),
        exec: Arc::new(crate::app::ssh_client(settings)?),
        repo: Arc::new(PackageRepo::new(&d.repo_url, d.timeout)?),
    };
    let stages = StageSelection::parse(&d.stages).map_err(|e| anyhow::anyhow!(e))?;
    let push = match &d.pushgateway_url {
        Some(url) => Some(
            Pushgateway::new(url, &d.pushgateway_job, d.timeout).map_err(|e| anyhow::anyhow!(e))?,
        ),
        None => None,
    };
    let submitter: Option<Box<dyn Submitter>> = match (args.dry_run, d.submit) {
        (true, _) => None,
        (false, DetectSubmit::Http) => Some(Box::new(HttpSubmitter {
            url: d.rollgate_url.clone(),
            token: crate::app::read_token(&d.token_file)?,
            http: reqwest::Client::builder().timeout(d.timeout).build()?,
        })),
        (false, DetectSubmit::Amqp) => Some(Box::new(AmqpSubmitter(Arc::new(
            crate::queue::amqp::AmqpQueue::connect(settings.queue.clone())
                .await
                .context("cannot reach RabbitMQ (queue.amqp_url)")?,
        )))),
    };
    let (report, error) = crate::workflows::detect::detect(
        &sources,
        &stages,
        push.as_ref().map(|p| p as &dyn crate::ports::MetricsPush),
        submitter.as_deref(),
    )
    .await;
    if let Some(report) = &report {
        println!("{}", serde_json::to_string_pretty(report)?);
    }
    Ok(match error {
        None => 0,
        Some(e) => {
            eprintln!("rollgate detect: {}", crate::error_chain(&e));
            e.exit_code()
        }
    })
}

async fn etcd_roll(config: &Settings, args: EtcdRollArgs) -> anyhow::Result<()> {
    use crate::adapters::etcd::{Etcd, EtcdSettings, EtcdTls};
    use crate::adapters::prometheus::Prometheus;
    use crate::ports::MetricsSource;
    use std::sync::Arc;
    let gate = if args.no_gate {
        None
    } else {
        let prometheus: Option<Arc<dyn MetricsSource>> = match &config.gate.prometheus_url {
            Some(url) => Some(Arc::new(Prometheus::new(url, &config.gate)?)),
            None => None,
        };
        // No board in a one-shot roll: an empty store in memory.
        let store = crate::store::Store::open(std::path::Path::new(":memory:"))
            .context("cannot open an in-memory store for the gate")?;
        Some(crate::workflows::etcd_roll::RestartGate {
            gate: Arc::new(crate::workflows::gate::Gate::new(
                prometheus,
                store,
                crate::metrics::Metrics::new(),
                config.gate.clone(),
            )),
            halt_after: args.gate_timeout.unwrap_or(config.gate.halt_after),
        })
    };
    let etcd = Etcd::new(EtcdSettings {
        endpoints: args.endpoints.clone(),
        timeout: args.timeout,
        tls: args.ca_file.clone().map(|ca_file| EtcdTls {
            ca_file,
            cert_file: args.cert_file.clone(),
            key_file: args.key_file.clone(),
            domain: None,
        }),
    })?;
    let driver: Box<dyn crate::workflows::etcd_roll::Driver> = match args.driver {
        DriverArg::Command => {
            let (Some(restart_command), Some(probe_command)) =
                (args.restart_command.clone(), args.probe_command.clone())
            else {
                bail!("the command driver needs --restart-command and --probe-command");
            };
            Box::new(crate::workflows::etcd_roll::CommandDriver {
                restart_command,
                probe_command,
                runner: Arc::new(crate::adapters::shell::Shell {
                    timeout: args.ready_timeout,
                }),
            })
        }
        DriverArg::Statefulset => {
            let Some(name) = args.statefulset.clone() else {
                bail!("the statefulset driver needs --statefulset NAME");
            };
            let Some(kube) = crate::app::kube_client(config).await? else {
                bail!("the statefulset driver needs cluster.kubeconfig or cluster.in_cluster");
            };
            Box::new(crate::workflows::etcd_roll::StatefulSetDriver {
                api: Arc::new(kube),
                namespace: args.namespace.clone(),
                name,
            })
        }
    };
    let settings = crate::workflows::etcd_roll::RollSettings {
        ready_timeout: args.ready_timeout,
        cooldown: args.cooldown,
        max_lag: args.max_lag,
        transfer_timeout: args.transfer_timeout,
    };
    let started = std::time::Instant::now();
    let report = crate::workflows::etcd_roll::roll(
        Arc::new(etcd),
        driver.as_ref(),
        &settings,
        gate.as_ref(),
        |line| {
            println!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
        },
    )
    .await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
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
        .with_writer(std::io::stderr);
    match settings.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn runs(
    settings: &Settings,
    url: Option<String>,
    token_file: Option<PathBuf>,
    action: RunsAction,
) -> anyhow::Result<()> {
    let base = url.unwrap_or_else(|| format!("http://{}", settings.server.listen));
    let base = reqwest::Url::parse(&base).with_context(|| format!("--url {base:?}"))?;
    let token = crate::app::read_token(token_file.as_ref().unwrap_or(&settings.server.token_file))?;
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()?;
    let (method, target, body) = runs_request(&base, &action)?;
    let mut req = client.request(method, target).bearer_auth(token);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("cannot reach rollgate at {base}"))?;
    let status = resp.status();
    let value: serde_json::Value = resp.json().await.context("the answer is not JSON")?;
    if !status.is_success() {
        bail!(
            "{status}: {}",
            value
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or("no message")
        );
    }
    match action {
        RunsAction::List { .. } => print_runs(&value),
        _ => println!("{}", serde_json::to_string_pretty(&value)?),
    }
    Ok(())
}

/// The method, URL and body of `action`: every id and value encoded into the URL.
fn runs_request(
    base: &reqwest::Url,
    action: &RunsAction,
) -> anyhow::Result<(reqwest::Method, reqwest::Url, Option<serde_json::Value>)> {
    let mut url = base.clone();
    let mut segments: Vec<&str> = vec!["v1", "runs"];
    let (method, body) = match action {
        RunsAction::List { status, limit } => {
            let mut query = url.query_pairs_mut();
            query.append_pair("limit", &limit.to_string());
            if let Some(status) = status {
                query.append_pair("status", status.0.name());
            }
            drop(query);
            (reqwest::Method::GET, None)
        }
        RunsAction::Show { id } => {
            segments.push(id);
            (reqwest::Method::GET, None)
        }
        RunsAction::Halt { id, reason }
        | RunsAction::Resume { id, reason }
        | RunsAction::Abort { id, reason } => {
            let verb = match action {
                RunsAction::Halt { .. } => "halt",
                RunsAction::Resume { .. } => "resume",
                _ => "abort",
            };
            segments.extend([id.as_str(), verb]);
            (
                reqwest::Method::POST,
                Some(serde_json::json!({ "reason": reason })),
            )
        }
    };
    url.path_segments_mut()
        .map_err(|()| anyhow::anyhow!("--url {base} cannot carry a path"))?
        .pop_if_empty()
        .extend(segments);
    Ok((method, url, body))
}

fn print_runs(value: &serde_json::Value) {
    println!(
        "{:<36}  {:<9}  {:<11}  {:<8}  {:<16}  REASON",
        "ID", "STATUS", "KIND", "TARGET", "STEP"
    );
    for run in value.as_array().into_iter().flatten() {
        let s = |k: &str| {
            run.get(k)
                .and_then(|v| v.as_str())
                .unwrap_or("-")
                .to_owned()
        };
        let step = run
            .get("current_step")
            .and_then(|i| i.as_u64())
            .and_then(|i| run.get("steps")?.get(i as usize)?.get("name")?.as_str())
            .unwrap_or("-")
            .to_owned();
        println!(
            "{:<36}  {:<9}  {:<11}  {:<8}  {:<16}  {}",
            s("id"),
            s("status"),
            s("kind"),
            s("target"),
            step,
            s("reason")
        );
    }
}

/// The request or the plan is refused (exit 2), as the API would answer 422.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PlanRefused(String);

/// `rollgate plan`: the plan for `args` against the cluster now, as text.
async fn plan(settings: &Settings, args: PlanArgs) -> anyhow::Result<String> {
    use crate::domain::event::{DetectionRequest, StageSelection, UpgradeKind};
    use crate::domain::k8s_upgrade::{self as plan, PlanSettings, Role};
    use crate::domain::step::StepKind;
    use crate::domain::version::Version;
    use crate::ports::ClusterRead;
    use std::fmt::Write as _;

    let target = Version::parse(&args.target).map_err(|e| PlanRefused(e.to_string()))?;
    let stages = StageSelection::parse(&args.stages).map_err(PlanRefused)?;
    let Some(kube) = crate::app::kube_client(settings).await? else {
        bail!("no cluster configured: set cluster.kubeconfig or cluster.in_cluster");
    };
    let facts = kube.facts().await?;
    let kind = match args.kind {
        Some(KindArg::Patch) => UpgradeKind::Patch,
        Some(KindArg::Minor) => UpgradeKind::Minor,
        None => {
            let current = facts
                .nodes
                .iter()
                .find(|n| n.role == Role::ControlPlane)
                .map(|n| n.kubelet);
            match current {
                Some(c) if c.minor == target.minor => UpgradeKind::Patch,
                _ => UpgradeKind::Minor,
            }
        }
    };
    let request = DetectionRequest {
        target_version: target,
        kind,
        dry_run: args.dry_run,
        stages,
    };
    let planned = plan::plan(
        &request,
        &facts,
        &PlanSettings {
            worker_order: settings.cluster.worker_order.clone(),
        },
    )
    .map_err(|e| PlanRefused(e.to_string()))?;
    let mut steps = plan::initial_steps(&request);
    steps.extend(planned.steps);
    let mut out = String::new();
    let kind_name = match kind {
        UpgradeKind::Patch => "patch",
        UpgradeKind::Minor => "minor",
    };
    writeln!(
        out,
        "{kind_name} upgrade {} -> {target}{}",
        planned.current,
        if args.dry_run { " (dry run)" } else { "" }
    )?;
    writeln!(out, "control plane: {}", planned.control_plane)?;
    writeln!(out, "workers in order: {}", planned.workers.join(", "))?;
    for skipped in &planned.skipped {
        writeln!(out, "skipped: {skipped}")?;
    }
    let gates: Vec<String> = steps
        .iter()
        .filter(|s| s.kind.is_gate())
        .map(|s| s.label())
        .collect();
    writeln!(out, "gates ({}): {}", settings.gate.query, gates.join(", "))?;
    writeln!(out, "steps:")?;
    for (i, step) in steps.iter().enumerate() {
        writeln!(
            out,
            "{:>3}. {:<32} {}",
            i + 1,
            step.label(),
            match &step.kind {
                StepKind::K8sUpgrade(kind) => plan::describe(kind, target),
                StepKind::EtcdRoll(_) => String::new(),
            }
        )?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_requests_encode_ids_and_values_into_the_url() {
        let base = reqwest::Url::parse("http://127.0.0.1:8080/").unwrap();
        let cases = [
            (
                RunsAction::List {
                    status: Some(StatusArg(crate::domain::run::RunStatus::Halted)),
                    limit: 5,
                },
                "GET",
                "http://127.0.0.1:8080/v1/runs?limit=5&status=halted",
            ),
            (
                RunsAction::Show {
                    id: "a/b?c=d#e".into(),
                },
                "GET",
                "http://127.0.0.1:8080/v1/runs/a%2Fb%3Fc=d%23e",
            ),
            (
                RunsAction::Abort {
                    id: "r 1".into(),
                    reason: "x".into(),
                },
                "POST",
                "http://127.0.0.1:8080/v1/runs/r%201/abort",
            ),
        ];
        for (action, method, url) in cases {
            let (m, u, _) = runs_request(&base, &action).unwrap();
            assert_eq!((m.as_str(), u.as_str()), (method, url));
        }
        let prefixed = reqwest::Url::parse("https://ops.example/rollgate").unwrap();
        let (_, u, _) = runs_request(&prefixed, &RunsAction::Show { id: "r".into() }).unwrap();
        assert_eq!(u.as_str(), "https://ops.example/rollgate/v1/runs/r");
    }

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
