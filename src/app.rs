//! `rollgate serve`: build the adapters from the settings, run the HTTP server and the
//! worker, stop gracefully on SIGTERM or SIGINT.

use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};
use anyhow::{Context as _, bail};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::adapters::alertmanager::AlertmanagerApi;
use crate::adapters::etcd::{Etcd, EtcdClients, EtcdSettings, EtcdTls};
use crate::adapters::kube::{Kube, KubeSettings, Source};
use crate::adapters::notify::{Fanout, LogNotifier, SlackNotifier};
use crate::adapters::prometheus::Prometheus;
use crate::adapters::snapshot::EtcdSnapshots;
use crate::adapters::ssh::{Ssh, SshSettings};
use crate::config::{QueueBackend, Settings, StoreBackend};
use crate::http::clients::{Clients, TokenSources};
use crate::http::tls::{Tls, TlsFiles};
use crate::http::{self, AppState};
use crate::metrics::Metrics;
use crate::ports::{
    AlertSource, ClusterRead, DrainOptions, EtcdMembers, EventRecorder, Executors, MetricsSource,
    Notifier, PodRef, Silences, Snapshots, StepExecutor,
};
use crate::queue::Queue;
use crate::queue::amqp::AmqpQueue;
use crate::queue::embedded::EmbeddedQueue;
use crate::store::Store;
use crate::worker::{Worker, WorkerPolicy};
use crate::workflows::analysis::AnalysisStep;
use crate::workflows::control_plane_cycle::{ControlPlaneCycle, ControlPlaneSettings};
use crate::workflows::etcd_roll::intake::RollIntake;
use crate::workflows::etcd_roll::roll_watch::{WatchTarget, WatchedRoll};
use crate::workflows::etcd_roll::steps::EtcdRollSteps;
use crate::workflows::etcd_roll::watch::{RollStarter, RollWatch};
use crate::workflows::events::{EventNotifier, EventSink};
use crate::workflows::fleet::{Fleet, UpstreamsStep};
use crate::workflows::gate::{Gate, GateStep, QuietPeriodStep};
use crate::workflows::intake::Intake;
use crate::workflows::k8s_upgrade::plan::PlanSettings;
use crate::workflows::k8s_upgrade::{UpgradeExecutors, UpgradeSettings, UpgradeSteps};
use crate::workflows::node_cycle::driver::NodeDriver;
use crate::workflows::node_cycle::{CycleSettings, NodeCycle, SelfSilences};
use crate::workflows::node_reboot::config::{AfterUpgrade, RebootConfig};
use crate::workflows::node_reboot::{NodeReboots, RebootAction, RebootPlanSettings, RebootSteps};

/// How long the worker may take to finish the message in hand after a stop signal.
const WORKER_STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the service until a stop signal.
pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    crate::workflows::register();
    std::fs::create_dir_all(&settings.data_dir)
        .with_context(|| format!("cannot create data_dir {}", settings.data_dir.display()))?;
    let _lock = lock_data_dir(&settings.data_dir)?;
    let clients = Arc::new(load_clients(&settings)?);
    let store = open_store(&settings).await?;
    let queue: Arc<dyn Queue> = match settings.queue.backend {
        QueueBackend::Embedded => Arc::new(
            EmbeddedQueue::open(
                &settings.data_dir.join("queue.db"),
                settings.queue.lease,
                settings.queue.delivery_limit,
            )
            .context("cannot open the embedded queue")?,
        ),
        QueueBackend::Amqp => Arc::new(
            AmqpQueue::connect(settings.queue.clone(), crate::workflows::DOORS)
                .await
                .context("cannot reach RabbitMQ (queue.amqp_url)")?,
        ),
    };
    let metrics = Metrics::new();
    let prometheus: Option<Arc<dyn MetricsSource>> = match &settings.gate.prometheus_url {
        Some(url) => Some(Arc::new(Prometheus::new(url, &settings.gate)?)),
        None => {
            warn!(
                "gate.prometheus_url is not set: every gate is unknown, so runs hold at their gates"
            );
            None
        }
    };
    let alertmanager_api = match &settings.gate.alertmanager_url {
        Some(url) => Some(Arc::new(AlertmanagerApi::new(url, &settings.gate)?)),
        None => None,
    };
    let alertmanager = alertmanager_api.clone().map(|a| a as Arc<dyn AlertSource>);
    let gate = Arc::new(
        Gate::new(
            prometheus.clone(),
            store.clone(),
            metrics.clone(),
            (&settings.gate).into(),
        )
        .asking(alertmanager),
    );
    let kube = kube_client(&settings).await?.map(Arc::new);
    let events = kube
        .clone()
        .map(|k| EventSink::start(k as Arc<dyn EventRecorder>, metrics.clone()));
    let mut sinks: Vec<Arc<dyn Notifier>> = vec![Arc::new(LogNotifier)];
    // Slack is told from the store's log of transitions, not from memory (see below).
    let slack = SlackNotifier::new(&settings.notify, metrics.clone())?;
    if let Some(events) = &events {
        sinks.push(Arc::new(EventNotifier::new(
            events.clone(),
            settings.cluster.namespace.clone(),
        )));
    }
    let notifier: Arc<dyn Notifier> = Arc::new(Fanout(sinks));
    let mut executors = Executors::default();
    let mut upgrades = UpgradeExecutors {
        quiet_period: Some(Arc::new(QuietPeriodStep(gate.clone()))),
        ..UpgradeExecutors::default()
    };
    let watch_kube = kube.clone();
    let etcd_rolls = match &kube {
        Some(kube) => {
            let connect = etcd_roll_clients(&settings);
            let rolls = EtcdRollSteps::new(
                kube.clone(),
                connect.clone(),
                settings.workflows.etcd_roll.transfer_timeout,
                metrics.clone(),
            );
            executors = executors.with(crate::workflows::etcd_roll::step::ETCD_ROLL, Arc::new(rolls));
            RollIntake {
                unavailable: None,
                tls: settings.workflows.etcd_roll.ca_file.is_some(),
                connect: Some(connect),
            }
        }
        None => RollIntake {
            unavailable: Some(
                "etcd rolls need the Kubernetes API (cluster.kubeconfig or cluster.in_cluster): the roll drives a StatefulSet's partition".into(),
            ),
            tls: false,
            connect: None,
        },
    };
    let upgrades_unavailable = upgrades_unavailable(&settings);
    let kube = if upgrades_unavailable.is_some() {
        None
    } else {
        kube
    };
    let silences = alertmanager_api.map(|a| a as Arc<dyn Silences>);
    let mut drains: Option<Arc<dyn crate::ports::NodeDrain>> = None;
    let (cluster, etcd, node_reboots) =
        match build_upgrade_steps(&settings, kube, silences, events, metrics.clone()).await? {
            Some((steps, reboots, cluster)) => {
                drains = Some(steps.cycle.nodes.clone());
                let etcd = steps.control_planes.etcd.clone();
                let node_reboots = reboots.reboots.clone();
                upgrades.steps = Some(steps as Arc<dyn StepExecutor>);
                executors =
                    executors.with(crate::workflows::node_reboot::step::NODE_REBOOT, reboots);
                (Some(cluster), etcd, Some(node_reboots))
            }
            None => {
                if let Some(why) = &upgrades_unavailable {
                    warn!("{why}: detections are refused (422 over HTTP, dead-lettered over AMQP)");
                }
                (None, None, None)
            }
        };
    executors.analysis = Some(Arc::new(AnalysisStep::new(
        prometheus.clone(),
        settings.gate.analysis.iter().map(|a| a.rule()).collect(),
        drains,
        settings.gate.poll_interval,
        &metrics,
    )));
    let gate_step = GateStep::new(gate.clone()).with_checks(
        prometheus.clone(),
        settings.gate.checks.iter().map(|c| c.rule()).collect(),
        settings.gate.halt_after,
    );
    executors.gate = Some(Arc::new(match &cluster {
        Some(cluster) => gate_step.with_breaker(cluster.clone(), settings.cluster.unhealthy_limit),
        None => gate_step,
    }));
    let mut peers: Vec<Arc<dyn crate::ports::FleetPeer>> = Vec::new();
    for (i, upstream) in settings.workflows.fleet.upstreams.iter().enumerate() {
        let peer = crate::adapters::fleet_peer::HttpFleetPeer::new(
            &format!("fleet.upstreams[{i}]."),
            &upstream.url,
            upstream.token_file.as_ref(),
            upstream.ca_file.as_ref(),
            settings.workflows.fleet.timeout,
        )
        .context("cannot ask the fleet's upstreams")?;
        peers.push(Arc::new(peer));
    }
    let fleet = Arc::new(
        Fleet::new(
            settings.workflows.fleet.clone(),
            store.clone(),
            gate.clone(),
            cluster.clone(),
            metrics.clone(),
            peers,
        )
        .context("cannot ask the fleet's upstreams")?,
    );
    upgrades.upstreams = Some(Arc::new(UpstreamsStep(fleet.clone())));
    let executors = executors.with(crate::domain::upgrade_step::K8S_UPGRADE, Arc::new(upgrades));
    let etcd_rolls = Arc::new(etcd_rolls);
    let intakes: Vec<Arc<dyn Intake>> = vec![
        Arc::new(crate::workflows::k8s_upgrade::intake::UpgradeIntake {
            unavailable: upgrades_unavailable.clone(),
            cluster: cluster.clone(),
            etcd,
            plan: plan_settings(&settings),
            store: store.clone(),
        }),
        etcd_rolls.clone(),
        Arc::new(crate::workflows::node_reboot::intake::RebootIntake {
            unavailable: upgrades_unavailable.clone(),
            cluster,
            plan: reboot_plan_settings(&settings),
            reboots: node_reboots,
            gate: gate.clone(),
            windows: settings.schedule.windows.clone(),
            store: store.clone(),
        }),
    ];
    let writes = Arc::new(crate::worker::WriteHealth::default());
    let state = web::Data::new(AppState {
        gate: gate.clone(),
        queue: queue.clone(),
        store: store.clone(),
        metrics: metrics.clone(),
        clients: clients.clone(),
        max_body_bytes: settings.server.max_body_bytes,
        on_failure: settings.worker.on_failure,
        intakes,
        windows: settings.schedule.windows.clone(),
        reserve: (settings.queue.backend == QueueBackend::Embedded)
            .then(|| crate::disk::Reserve::new(&settings.data_dir, settings.queue.min_free_bytes)),
        writes: writes.clone(),
        asks_upstreams: fleet.has_upstreams(),
        views: vec![fleet.clone()],
        banner: settings.server.banner.clone(),
    });
    let served = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(served.clone())
            .wrap(from_fn(http::observe))
            .configure(http::configure)
    })
    .workers(settings.server.workers)
    .disable_signals()
    .shutdown_timeout(10);
    let tls = match (
        &settings.server.tls_cert_file,
        &settings.server.tls_key_file,
    ) {
        (Some(cert), Some(key)) => Some(
            Tls::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: settings.server.client_ca_file.clone(),
            })
            .context("cannot serve TLS")?,
        ),
        _ => None,
    };
    let listen = settings.server.listen;
    let cannot_listen = || format!("cannot listen on {listen} (server.listen)");
    let server = match &tls {
        Some(tls) => server
            .bind_rustls_0_23(listen, tls.server_config().context("cannot serve TLS")?)
            .with_context(cannot_listen)?,
        None => server.bind(listen).with_context(cannot_listen)?,
    }
    .run();
    let server_handle = server.handle();
    let server_task = tokio::spawn(server);
    info!(listen = %settings.server.listen, tls = settings.server.tls_cert_file.is_some(), mutual_tls = settings.server.client_ca_file.is_some(), backend = queue.backend(), store = store.backend(), replica = store.replica(), data_dir = %settings.data_dir.display(), "rollgate serving");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(gate.clone().keep_current(stop_rx.clone()));
    tokio::spawn(fleet.clone().keep_quiet_since(stop_rx.clone()));
    tokio::spawn(clients.watch(stop_rx.clone()));
    if let Some(tls) = tls {
        tokio::spawn(tls.watch(stop_rx.clone()));
    }
    let leading = crate::workflows::leader::campaign(
        store.clone(),
        settings.store.lease_ttl,
        metrics.clone(),
        stop_rx.clone(),
    );
    if let Some(slack) = slack {
        tokio::spawn(crate::workflows::outbox::deliver_while_leading(
            store.clone(),
            Arc::new(slack),
            leading.clone(),
            stop_rx.clone(),
        ));
    }
    let kured_lock = match (&watch_kube, settings.cluster.kured_daemonset()) {
        (Some(kube), Some((namespace, name))) => Some(Arc::new(kube.kured_lock(
            namespace,
            name,
            &settings.cluster.kured_lock_annotation,
        ))),
        _ => None,
    };
    spawn_roll_watches(&settings, watch_kube, state.clone(), etcd_rolls, &stop_rx);
    let mut worker_task = if settings.worker.paused {
        warn!("worker.paused is true: events are queued but not processed");
        None
    } else {
        let policy = WorkerPolicy {
            max_attempts: settings.worker.max_attempts,
            halt_after: settings.gate.halt_after,
            on_failure: settings.worker.on_failure,
            failure_budget: settings.cluster.failure_budget,
            asks_upstreams: fleet.has_upstreams(),
        };
        let mut worker = Worker::new(queue, store, metrics, executors, policy, notifier)
            .telling(gate.clone())
            .refusing(
                crate::domain::upgrade_step::K8S_UPGRADE,
                upgrades_unavailable,
            )
            .within(settings.schedule.windows.clone())
            .led_by(leading)
            .reporting_writes_to(writes);
        if let Some(lock) = kured_lock {
            worker = worker.honouring(lock, settings.gate.poll_interval);
        }
        Some(tokio::spawn(worker.run(stop_rx)))
    };

    let mut term = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let worker_ended = async {
        match worker_task.as_mut() {
            Some(task) => drop(task.await),
            None => std::future::pending().await,
        }
    };
    let worker_died = tokio::select! {
        _ = term.recv() => { info!("SIGTERM: stopping"); false }
        _ = int.recv() => { info!("SIGINT: stopping"); false }
        () = worker_ended => true,
    };
    server_handle.stop(true).await;
    let _ = stop_tx.send(true);
    if let Some(task) = worker_task.take()
        && !worker_died
        && tokio::time::timeout(WORKER_STOP_TIMEOUT, task)
            .await
            .is_err()
    {
        warn!("the worker did not stop in time; its message in hand will be redelivered");
    }
    let _ = server_task.await;
    if worker_died {
        bail!(
            "the worker stopped on its own (queue closed); exiting so that a supervisor restarts rollgate"
        );
    }
    info!("stopped");
    Ok(())
}

/// The run store the settings name: SQLite under `data_dir`, or PostgreSQL.
pub async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    crate::workflows::register();
    let s = &settings.store;
    match s.backend {
        StoreBackend::Sqlite => {
            Store::open(&settings.data_dir.join("store.db")).context("cannot open the run store")
        }
        StoreBackend::Postgres => {
            let url = s
                .url
                .clone()
                .context("store.backend = postgres needs store.url")?;
            let password = match &s.password_file {
                Some(path) => Some(read_first_line(path, "store.password_file")?),
                None => None,
            };
            let pg = crate::store::postgres::PgSettings {
                url,
                password,
                max_connections: s.max_connections,
                timeout: s.timeout,
            };
            Store::connect(&pg)
                .await
                .context("cannot open the PostgreSQL run store (store.url)")
        }
    }
}

/// The first line of a secret file, trimmed; the value is never logged.
fn read_first_line(path: &Path, key: &str) -> anyhow::Result<String> {
    let raw = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {} ({key})", path.display()))?;
    let line = raw.lines().next().unwrap_or_default().trim().to_owned();
    if line.is_empty() {
        bail!("{} ({key}) is empty", path.display());
    }
    Ok(line)
}

/// The Kubernetes client the settings describe; `None` when no cluster is configured.
pub async fn kube_client(settings: &Settings) -> anyhow::Result<Option<Kube>> {
    let c = &settings.cluster;
    let source = match (&c.kubeconfig, c.in_cluster) {
        (Some(path), _) => Source::Kubeconfig {
            path: path.clone(),
            context: c.context.clone(),
        },
        (None, true) => Source::InCluster,
        (None, false) => return Ok(None),
    };
    let kube = Kube::new(KubeSettings {
        source,
        namespace: c.namespace.clone(),
        annotation_prefix: c.annotation_prefix.clone(),
        request_timeout: c.request_timeout,
    })
    .await?;
    Ok(Some(kube))
}

/// SSH to nodes as the settings describe; the key and known_hosts files must be set.
pub fn ssh_client(settings: &Settings) -> anyhow::Result<Ssh> {
    let (Some(key_file), Some(known_hosts_file)) = (
        settings.ssh.key_file.clone(),
        settings.ssh.known_hosts_file.clone(),
    ) else {
        bail!(
            "upgrading a configured cluster needs ssh.key_file and ssh.known_hosts_file (the node script runs over SSH)"
        );
    };
    Ok(Ssh::new(SshSettings {
        user: settings.ssh.user.clone(),
        port: settings.ssh.port,
        key_file,
        known_hosts_file,
        connect_timeout: settings.ssh.connect_timeout,
        command_timeout: settings.ssh.command_timeout,
        hosts: settings.ssh.hosts.clone(),
        control_dir: settings.data_dir.join("ssh"),
        max_connecting: settings.ssh.max_connecting,
    })?)
}

/// The upgrade and reboot steps over kube, ssh and etcd, when a cluster is configured;
/// also the cluster reader the API checks requests with.
pub async fn build_upgrade_steps(
    settings: &Settings,
    kube: Option<Arc<Kube>>,
    silences: Option<Arc<dyn Silences>>,
    events: Option<EventSink>,
    metrics: Metrics,
) -> anyhow::Result<Option<(Arc<UpgradeSteps>, Arc<RebootSteps>, Arc<dyn ClusterRead>)>> {
    let c = &settings.cluster;
    let Some(kube) = kube else {
        return Ok(None);
    };
    let ssh = ssh_client(settings)?;
    let etcd = etcd_client(settings)?.map(Arc::new);
    if etcd.is_none() {
        warn!(
            "etcd.endpoints is not set: upgrade runs fail at their snapshot stage, and clusters with several control planes are refused"
        );
    }
    let snapshots = etcd
        .clone()
        .map(|e| Arc::new(EtcdSnapshots::new(e)) as Arc<dyn Snapshots>);
    let etcd = etcd.map(|e| e as Arc<dyn EtcdMembers>);
    let exec: Arc<dyn crate::ports::NodeExec> = Arc::new(ssh);
    let cycle = node_cycle(settings, kube.clone(), silences, events);
    let control_planes = ControlPlaneCycle {
        cluster: kube.clone(),
        etcd,
        settings: ControlPlaneSettings {
            health_timeout: c.control_plane_health_timeout,
            transfer_timeout: settings.etcd.transfer_timeout,
            etcd_max_lag: settings.etcd.max_lag,
            distribution: c.distribution,
        },
        metrics: metrics.clone(),
    };
    let r = &settings.workflows.reboot;
    let node_reboots = NodeReboots {
        cluster: kube.clone(),
        boots: kube.clone(),
        exec: exec.clone(),
        cycle: cycle.clone(),
        settings: RebootAction {
            sentinel_script: r.sentinel_script(),
            command: r.command.clone(),
            timeout: r.timeout,
            labels_before: RebootConfig::labels(&r.labels_before),
            labels_after: RebootConfig::labels(&r.labels_after),
        },
        metrics: metrics.clone(),
    };
    let steps = UpgradeSteps {
        cluster: kube.clone(),
        marks: kube.clone(),
        exec: exec.clone(),
        driver: node_driver(settings),
        snapshots,
        control_planes: control_planes.clone(),
        settings: UpgradeSettings {
            plan: plan_settings(settings),
            verify_timeout: c.verify_timeout,
            pod_ready_ratio: c.pod_ready_ratio,
            snapshot_dir: settings.etcd.snapshot_dir.clone(),
            snapshot_keep: settings.etcd.snapshot_keep as usize,
        },
        metrics,
        cycle: cycle.clone(),
        reboot_after: (r.after_upgrade == AfterUpgrade::IfRequired).then(|| node_reboots.clone()),
    };
    let reboots = RebootSteps {
        cluster: kube.clone(),
        reboots: node_reboots,
        cycle,
        control_planes,
        plan: reboot_plan_settings(settings),
        metrics: steps.metrics.clone(),
    };
    Ok(Some((Arc::new(steps), Arc::new(reboots), kube)))
}

/// The node cycle over kube: drains, holds, soaks, silences and Events as configured.
pub fn node_cycle(
    settings: &Settings,
    kube: Arc<Kube>,
    silences: Option<Arc<dyn Silences>>,
    events: Option<EventSink>,
) -> NodeCycle {
    let c = &settings.cluster;
    NodeCycle {
        nodes: kube,
        settings: CycleSettings {
            drain: DrainOptions {
                timeout: c.drain_timeout,
                retry_every: c.eviction_retry,
                grace_period: c.grace_period,
                own_pod: own_pod(),
            },
            soak: c.soak,
            blocking_pods: c
                .blocking_pod_selectors
                .iter()
                .filter_map(|raw| crate::workflows::node_cycle::holds::Requirement::parse(raw).ok())
                .collect(),
            hold_poll: settings.gate.poll_interval,
        },
        silences: self_silences(settings, silences),
        events,
    }
}

/// How reboots are planned, from the settings.
pub fn reboot_plan_settings(settings: &Settings) -> RebootPlanSettings {
    RebootPlanSettings {
        workers: plan_settings(settings),
        control_planes: settings.workflows.reboot.control_planes,
    }
}

/// The driver of the cluster's nodes (`cluster.distribution`, `cluster.release_mirror`).
pub fn node_driver(settings: &Settings) -> NodeDriver {
    NodeDriver {
        distribution: settings.cluster.distribution,
        mirror: settings.cluster.release_mirror().to_owned(),
    }
}

/// The planner's choices from the settings.
pub fn plan_settings(settings: &Settings) -> PlanSettings {
    PlanSettings {
        worker_order: settings.cluster.worker_order.clone(),
        max_unavailable: settings.cluster.max_unavailable,
        failure_budget: settings.cluster.failure_budget,
        etcd_max_lag: settings.etcd.max_lag,
        reboot_after_upgrade: settings.workflows.reboot.after_upgrade == AfterUpgrade::IfRequired,
        distribution: settings.cluster.distribution,
        judge_batches: !settings.gate.analysis.is_empty(),
    }
}

/// rollgate's own pod, from the downward API (`POD_NAMESPACE`, `POD_NAME`), when it runs
/// in a cluster.
fn own_pod() -> Option<PodRef> {
    let read = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    Some(PodRef {
        namespace: read("POD_NAMESPACE")?,
        name: read("POD_NAME")?,
    })
}

/// The cluster's etcd as the planner and `rollgate plan` see it, when configured.
pub fn etcd_client(settings: &Settings) -> anyhow::Result<Option<Etcd>> {
    let e = &settings.etcd;
    if e.endpoints.is_empty() {
        return Ok(None);
    }
    Ok(Some(Etcd::new(EtcdSettings {
        endpoints: e.endpoints.clone(),
        timeout: e.timeout,
        tls: etcd_tls(&e.ca_file, &e.cert_file, &e.key_file),
    })?))
}

/// TLS to etcd when a CA is configured.
fn etcd_tls(
    ca_file: &Option<PathBuf>,
    cert_file: &Option<PathBuf>,
    key_file: &Option<PathBuf>,
) -> Option<EtcdTls> {
    ca_file.clone().map(|ca_file| EtcdTls {
        ca_file,
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
        domain: None,
    })
}

/// Clients of the etcd clusters `serve` rolls, with the `etcd_roll` TLS files.
pub fn etcd_roll_clients(settings: &Settings) -> Arc<EtcdClients> {
    let e = &settings.workflows.etcd_roll;
    Arc::new(EtcdClients {
        tls: etcd_tls(&e.ca_file, &e.cert_file, &e.key_file),
        timeout: e.timeout,
    })
}

/// Evaluates the gate every poll interval, so that `GET /v1/gates` and the
/// `rollgate_gate_verdict` metric stay current even when no run waits at a gate.
/// The self-silences the settings ask for, kept through `api`.
fn self_silences(settings: &Settings, api: Option<Arc<dyn Silences>>) -> Option<SelfSilences> {
    let g = &settings.gate;
    let templates = crate::domain::self_silence::check_templates(&g.self_silences).ok()?;
    if templates.is_empty() {
        return None;
    }
    Some(SelfSilences {
        api: api?,
        templates,
        gate_label: "upgrade_gate".into(),
        ttl: g.self_silence_ttl,
        tail: g.self_silence_tail,
    })
}

/// Why this rollgate cannot upgrade Kubernetes, naming every key to set; `None` when it can.
pub fn upgrades_unavailable(settings: &Settings) -> Option<String> {
    let mut missing = Vec::new();
    if !settings.cluster_configured() {
        missing.push("cluster.kubeconfig (or cluster.in_cluster)");
    }
    missing.extend(settings.upgrade_keys_missing());
    (!missing.is_empty()).then(|| {
        let rolls = if settings.cluster_configured() {
            "this rollgate runs etcd rolls only"
        } else {
            "this rollgate has no cluster configured"
        };
        format!(
            "Kubernetes upgrades need {} set; {rolls}",
            missing.join(", ")
        )
    })
}

/// Starts the watch of every `etcd_roll.watch` StatefulSet (with a cluster configured).
fn spawn_roll_watches(
    settings: &Settings,
    kube: Option<Arc<Kube>>,
    state: web::Data<AppState>,
    intake: Arc<RollIntake>,
    stop: &tokio::sync::watch::Receiver<bool>,
) {
    let targets = settings.workflows.etcd_roll.watch_targets();
    if targets.is_empty() {
        return;
    }
    let Some(kube) = kube else {
        warn!(
            "etcd_roll.watch is set but no cluster is configured (cluster.kubeconfig or cluster.in_cluster): nothing is watched"
        );
        return;
    };
    let watch = Arc::new(RollWatch {
        statefulsets: kube,
        starter: Arc::new(IntakeStarter(state, intake)),
        tls: settings.workflows.etcd_roll.ca_file.is_some(),
        retry: ROLL_WATCH_RETRY,
    });
    for target in targets {
        tokio::spawn(watch.clone().run(target, stop.clone()));
    }
}

/// Pause of a roll watch after a failure (API or members unreachable).
const ROLL_WATCH_RETRY: Duration = Duration::from_secs(10);

/// Starts watched rolls through the API's intake, with the etcd roll's checks.
struct IntakeStarter(web::Data<AppState>, Arc<RollIntake>);

#[async_trait::async_trait]
impl RollStarter for IntakeStarter {
    async fn start(
        &self,
        target: &WatchTarget,
        revision: &str,
        seed: &str,
    ) -> Result<WatchedRoll, String> {
        let run_id = target.run_id(revision);
        let stored = self.0.store.get_run(&run_id).await;
        if let Some(run) = stored.map_err(|e| crate::error_chain(&e))? {
            return Ok(WatchedRoll::AlreadyRolled(run.id));
        }
        let request = self
            .1
            .watched_request(target, seed)
            .await
            .map_err(|e| e.to_string())?;
        let taken = http::intake::take_new(&self.0, &*self.1, run_id, request, None).await;
        Ok(match taken.map_err(|e| e.to_string())? {
            http::intake::Taken::New(id) => WatchedRoll::Started(id),
            http::intake::Taken::InFlight { run_id, .. } => WatchedRoll::Waiting(run_id),
        })
    }
}

/// One `serve` per data directory: two would share the embedded queue and store.
fn lock_data_dir(dir: &Path) -> anyhow::Result<File> {
    let path = dir.join("rollgate.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(_) => bail!(
            "another rollgate serve is using data_dir {} (it holds {})",
            dir.display(),
            path.display()
        ),
    }
}

/// Where the API's tokens come from: `server.tokens_dir`, and `server.token_file`'s
/// all-scopes token (client `admin`) unless only scoped tokens are wanted (`tokens_dir`
/// set and `token_file` left at its default).
pub fn token_sources(settings: &Settings) -> TokenSources {
    let server = &settings.server;
    let with_admin = server.tokens_dir.is_none() || !server.token_file_is_default;
    TokenSources {
        admin_file: with_admin.then(|| server.token_file.clone()),
        dir: server.tokens_dir.clone(),
        scopes: server.scopes.clone(),
    }
}

/// The API's clients for `serve`, the all-scopes token generated on first start.
fn load_clients(settings: &Settings) -> anyhow::Result<Clients> {
    let sources = token_sources(settings);
    if sources.admin_file.is_some() {
        load_or_create_token(settings)?;
    } else {
        info!("server.tokens_dir without server.token_file: no all-scopes token");
    }
    Clients::load(sources)
        .context("cannot read the API tokens (server.token_file, server.tokens_dir)")
}

/// Checks the API token file; generates it on first start when the default path is used.
fn load_or_create_token(settings: &Settings) -> anyhow::Result<()> {
    let path = &settings.server.token_file;
    if !path.exists() && settings.server.token_file_is_default {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| anyhow::anyhow!("no randomness for the API token: {e}"))?;
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create the API token file {}", path.display()))?;
        file.write_all(hex::encode(bytes).as_bytes())?;
        file.sync_all()?;
        info!(token_file = %path.display(), "generated an API token");
    }
    read_token(path)?;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        warn!(token_file = %path.display(), "the API token file is readable by group or others");
    }
    Ok(())
}

/// Reads a token file: trimmed, at least 16 characters. The value is never logged.
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    let raw = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read the API token file {} (server.token_file)",
            path.display()
        )
    })?;
    let token = raw.trim().to_owned();
    if token.len() < 16 {
        bail!(
            "the API token in {} is shorter than 16 characters",
            path.display()
        );
    }
    Ok(token)
}
