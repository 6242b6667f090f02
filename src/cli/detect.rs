//! `rollgate detect`: the daily detection, with its adapters wired here.

use anyhow::{Context as _, bail};

use super::DetectArgs;
use crate::config::Settings;

/// `rollgate detect`: the report as JSON on stdout, the exit code of what happened.
/// Errors are configuration problems (exit 2).
pub(super) async fn detect(settings: &Settings, args: DetectArgs) -> anyhow::Result<u8> {
    use crate::adapters::channels::ChannelServer;
    use crate::adapters::http_client::HttpSource;
    use crate::adapters::pushgateway::Pushgateway;
    use crate::adapters::repo::PackageRepo;
    use crate::adapters::submit::{AmqpSubmitter, HttpSubmitter};
    use crate::config::DetectSubmit;
    use crate::domain::distribution::Distribution;
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
        channels: match settings.cluster.distribution {
            Distribution::Kubeadm => None,
            distribution => {
                let url = d
                    .channel_url
                    .as_deref()
                    .unwrap_or(distribution.default_channel_url());
                let server: Arc<dyn crate::ports::ReleaseChannels> =
                    Arc::new(ChannelServer::new(url, d.timeout)?);
                Some((distribution, server))
            }
        },
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
            http: HttpSource {
                section: "detect.rollgate_",
                timeout: d.timeout,
                bearer_token_file: None,
                basic_auth_user: None,
                basic_auth_password_file: None,
                ca_file: d.rollgate_ca_file.as_ref(),
                identity: d
                    .rollgate_cert_file
                    .as_ref()
                    .zip(d.rollgate_key_file.as_ref()),
            }
            .client()?,
        })),
        (false, DetectSubmit::Amqp) => Some(Box::new(AmqpSubmitter(Arc::new(
            crate::queue::amqp::AmqpQueue::connect(settings.queue.clone(), crate::workflows::DOORS)
                .await
                .context("cannot reach RabbitMQ (queue.amqp_url)")?,
        )))),
    };
    let reboots = args.reboots.then(|| crate::workflows::detect::RebootCheck {
        sentinel_script: settings.workflows.reboot.sentinel_script(),
        control_planes: settings.workflows.reboot.control_planes,
    });
    let upgrades = crate::workflows::detect::Upgrades::on(&args.upgrades_on, chrono::Utc::now());
    let (report, error) = crate::workflows::detect::detect(
        &sources,
        &stages,
        upgrades,
        reboots.as_ref(),
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
