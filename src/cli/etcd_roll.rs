//! `rollgate etcd-roll`: a roll in the foreground, command or StatefulSet driver.

use anyhow::{Context as _, bail};

use super::{DriverArg, EtcdRollArgs};
use crate::config::Settings;

/// `rollgate etcd-roll`: one roll; a progress line per step, then the report as JSON, on
/// stdout.
pub(super) async fn etcd_roll(config: &Settings, args: EtcdRollArgs) -> anyhow::Result<()> {
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
        let alertmanager: Option<Arc<dyn crate::ports::AlertSource>> =
            match &config.gate.alertmanager_url {
                Some(url) => Some(Arc::new(
                    crate::adapters::alertmanager::AlertmanagerApi::new(url, &config.gate)?,
                )),
                None => None,
            };
        // No webhook board in a one-shot roll: an empty store in memory.
        let store = crate::store::Store::open(std::path::Path::new(":memory:"))
            .context("cannot open an in-memory store for the gate")?;
        Some(crate::workflows::etcd_roll::RestartGate {
            gate: Arc::new(
                crate::workflows::gate::Gate::new(
                    prometheus,
                    store,
                    crate::metrics::Metrics::new(),
                    (&config.gate).into(),
                )
                .asking(alertmanager),
            ),
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
