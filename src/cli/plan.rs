//! `rollgate plan`: the plan for the cluster now, changing nothing.

use anyhow::bail;

use super::{KindArg, PlanArgs};
use crate::config::Settings;

/// The request or the plan is refused (exit 2), as the API would answer 422.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct PlanRefused(String);

/// `rollgate plan`: the plan for `args` against the cluster now, as text.
pub(super) async fn plan(settings: &Settings, args: PlanArgs) -> anyhow::Result<String> {
    use crate::domain::event::{DetectionRequest, StageSelection, UpgradeKind};
    use crate::domain::upgrade_step::UpgradeStep;
    use crate::domain::version::Version;
    use crate::ports::ClusterRead;
    use crate::workflows::k8s_upgrade::plan::{self as plan, Role};
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
        build: None,
    };
    let etcd = match crate::app::etcd_client(settings)? {
        Some(etcd) => Some(
            crate::workflows::k8s_upgrade::read_etcd(&etcd, settings.cluster.distribution).await?,
        ),
        None => None,
    };
    let planned = plan::plan(
        &request,
        &facts,
        etcd.as_ref(),
        &crate::app::plan_settings(settings),
    )
    .map_err(|e| PlanRefused(e.to_string()))?;
    let mut steps = plan::initial_steps(&request, !settings.workflows.fleet.upstreams.is_empty());
    steps.extend(planned.steps);
    let driver = crate::app::node_driver(settings);
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
    writeln!(out, "etcd: {}", planned.layout)?;
    writeln!(
        out,
        "control planes, in the order expected now (decided again before each):"
    )?;
    for (i, line) in planned.control_planes.iter().enumerate() {
        writeln!(out, "  {}. {line}", i + 1)?;
    }
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
            step.kind
                .get::<UpgradeStep>()
                .map_or_else(String::new, |kind| plan::describe(kind, target, &driver))
        )?;
    }
    Ok(out)
}
