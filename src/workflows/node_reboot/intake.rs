//! The reboots' door: `POST /v1/reboots` and `rollgate.reboot.v1`. A request is checked
//! against the cluster (every node named exists; a control plane only when allowed)
//! before anything is queued; a dry run is answered with the plan as it would be made
//! now; a request while a reboot run waits for the cluster merges into it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use std::sync::Arc;

use crate::domain::gate::Verdict;
use crate::domain::input::FieldErrors;
use crate::domain::run::{Run, RunStatus};
use crate::domain::run_request::{DoorAnswer, RunDoor, RunPolicy, RunRequest, schema_of};
use crate::domain::schedule::{Now, Windows};
use crate::domain::scope::Scope;
use crate::ports::ClusterRead;
use crate::store::Store;
use crate::workflows::gate::Gate;
use crate::workflows::intake::{Admit, Intake, Refusal};

use super::{NodeReboots, RebootPlanSettings, RebootRequest, plan};

/// Where node reboots are asked for.
pub static DOOR: RunDoor = RunDoor {
    steps: super::step::STEPS,
    path: "reboots",
    scope: Scope::new("reboots:write"),
    event_type: "rollgate.reboot.v1",
    routing_key: "reboots",
    label: "reboot",
    read_published,
    new_run,
    merge: Some(merge),
    one_at_a_time: false,
    summary: "reboot the nodes named, or every node whose sentinel is set.",
    body: schema_of::<super::request::RebootBody>,
    answers: &[DoorAnswer {
        status: 200,
        description: "with `dry_run`: what a run would do now, nothing queued; without: merged into the reboot run that waits for the cluster (the run's id and status)",
        body: Some(schema_of::<super::dry_run::RebootDryRun>),
    }],
};

/// A published request has nobody to answer a dry run: refused, never run as asked.
fn read_published(body: &Value) -> Result<Arc<dyn RunRequest>, FieldErrors> {
    let request = RebootRequest::from_json(body)?;
    if request.dry_run {
        let mut errors = FieldErrors::default();
        errors.push(
            "dry_run",
            "a dry run is answered by POST /v1/reboots; a published reboot request is never one",
        );
        return Err(errors);
    }
    Ok(Arc::new(request))
}

fn new_run(
    id: String,
    request: &dyn RunRequest,
    policy: &RunPolicy,
    now: DateTime<Utc>,
) -> Option<Run> {
    let request = request.as_any().downcast_ref::<RebootRequest>()?;
    Some(plan::new_run(id, request, policy.on_failure, now))
}

fn merge(
    run: &mut Run,
    request: &dyn RunRequest,
    source: &str,
    now: DateTime<Utc>,
) -> Option<String> {
    let request = request.as_any().downcast_ref::<RebootRequest>()?;
    plan::merge(run, request, source, now)
}

/// What a reboot request is checked against, and what its dry run reads.
pub struct RebootIntake {
    /// Why reboots cannot be carried out here, though a cluster is configured.
    pub unavailable: Option<String>,
    /// The cluster, when configured.
    pub cluster: Option<Arc<dyn ClusterRead>>,
    /// How requests are checked against the cluster.
    pub plan: RebootPlanSettings,
    /// The sentinels and drains, for a dry run (with a cluster).
    pub reboots: Option<NodeReboots>,
    /// The gate, for what would hold a dry run's reboots.
    pub gate: Arc<Gate>,
    /// The maintenance windows, likewise.
    pub windows: Windows,
    /// The runs: the one that waits to take a request in, and the one holding the cluster.
    pub store: Store,
}

fn store_down(e: crate::store::StoreError) -> Refusal {
    tracing::warn!(error = %crate::error_chain(&e), "run store failed");
    Refusal::Unavailable("the run store is unavailable; retry later".into())
}

#[async_trait::async_trait]
impl Intake for RebootIntake {
    fn door(&self) -> &'static RunDoor {
        &DOOR
    }

    fn read_posted(&self, body: &Value) -> Result<Arc<dyn RunRequest>, FieldErrors> {
        Ok(Arc::new(RebootRequest::from_json(body)?))
    }

    async fn admit(&self, request: &Arc<dyn RunRequest>) -> Result<Admit, Refusal> {
        let Some(request) = request.as_any().downcast_ref::<RebootRequest>() else {
            return Err(Refusal::Invalid("not a reboot request".into()));
        };
        // Reboots are carried out by the same cluster, SSH and etcd wiring as upgrades.
        if let Some(why) = &self.unavailable {
            return Err(Refusal::Invalid(format!(
                "node reboots are not available here: {why}"
            )));
        }
        let Some(cluster) = &self.cluster else {
            return Err(Refusal::Invalid(
                "no cluster is configured (cluster.kubeconfig or cluster.in_cluster): rollgate has no nodes to reboot".into(),
            ));
        };
        let facts = cluster.facts().await.map_err(|e| {
            tracing::warn!(error = %crate::error_chain(&e), "cannot read the cluster to check a reboot request");
            Refusal::Unavailable(format!(
                "cannot read the cluster to check the request; retry later ({e})"
            ))
        })?;
        super::check_request(request, &facts, &self.plan)
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        if request.dry_run {
            return self.dry_run(request, &facts).await.map(Admit::Answer);
        }
        let runs = self.store.not_ended().await.map_err(store_down)?;
        Ok(match DOOR.waiting_run(runs) {
            // The worker merges it into the waiting run, which has not planned yet.
            Some(waiting) => Admit::MergeInto(Box::new(waiting)),
            None => Admit::New,
        })
    }
}

impl RebootIntake {
    /// The plan as it would be made now, and what would hold it (the gate, the windows,
    /// another run holding the cluster, a node's drain).
    async fn dry_run(
        &self,
        request: &RebootRequest,
        facts: &crate::domain::facts::ClusterFacts,
    ) -> Result<Value, Refusal> {
        let Some(reboots) = &self.reboots else {
            return Err(Refusal::Invalid(
                "node reboots are not available here: no cluster is configured".into(),
            ));
        };
        let mut answer = reboots
            .dry_run(request, facts, &self.plan)
            .await
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        let mut holds = Vec::new();
        let verdict = self
            .gate
            .evaluate()
            .await
            .verdict_for(crate::workflows::node_reboot::step::NODE_REBOOT);
        holds.extend(verdict.reasons().into_iter().map(|r| match verdict {
            Verdict::Closed { .. } => format!("gate closed: {r}"),
            _ => r,
        }));
        if let Now::Closed { opens } = self.windows.at(Utc::now()) {
            holds.push(format!(
                "outside the maintenance windows: the next opens at {}",
                opens.format("%Y-%m-%d %H:%M:%S UTC")
            ));
        }
        let holder = self
            .store
            .not_ended()
            .await
            .map_err(store_down)?
            .into_iter()
            .find(|r| r.holds_cluster() && r.status != RunStatus::Queued);
        if let Some(holder) = holder {
            holds.push(format!(
                "run {} ({}) holds the cluster: the reboots would wait for it",
                holder.id,
                holder.kind.name()
            ));
        }
        holds.append(&mut answer.holds);
        answer.holds = holds;
        Ok(serde_json::to_value(answer).unwrap_or_default())
    }
}
