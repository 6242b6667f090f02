//! The upgrade's door: `POST /v1/detections` and `rollgate.detection.v1`. A request is
//! planned against the cluster as it is now before it is taken, and one upgrade at a time
//! holds the cluster.

use chrono::{DateTime, Utc};
use serde_json::Value;
use std::sync::Arc;

use crate::domain::event::DetectionRequest;
use crate::domain::input::FieldErrors;
use crate::domain::run::Run;
use crate::domain::run_request::{DoorAnswer, RunDoor, RunPolicy, RunRequest, schema_of};
use crate::domain::scope::Scope;
use crate::ports::{ClusterRead, EtcdMembers};
use crate::store::Store;
use crate::workflows::intake::{Intake, Refusal};
use crate::workflows::k8s_upgrade::plan::{self, PlanSettings};

/// Where Kubernetes upgrades are asked for.
pub static DOOR: RunDoor = RunDoor {
    steps: crate::domain::upgrade_step::STEPS,
    path: "detections",
    scope: Scope::DETECTIONS_WRITE,
    event_type: "rollgate.detection.v1",
    routing_key: "detections",
    label: "detection",
    read_published: read,
    new_run,
    merge: None,
    one_at_a_time: true,
    summary: "ask for a Kubernetes version upgrade.",
    body: schema_of::<crate::domain::event::DetectionBody>,
    answers: &[DoorAnswer {
        status: 409,
        description: "another upgrade run holds the cluster",
        body: None,
    }],
};

fn read(body: &Value) -> Result<Arc<dyn RunRequest>, FieldErrors> {
    Ok(Arc::new(DetectionRequest::from_json(body)?))
}

fn new_run(
    id: String,
    request: &dyn RunRequest,
    policy: &RunPolicy,
    now: DateTime<Utc>,
) -> Option<Run> {
    let request = request.as_any().downcast_ref::<DetectionRequest>()?;
    Some(plan::new_run(
        id,
        request,
        policy.asks_upstreams,
        policy.on_failure,
        now,
    ))
}

/// The 409 code of a request while another upgrade holds the cluster.
pub const HELD: &str = "upgrade_in_flight";

/// What an upgrade request is checked against.
pub struct UpgradeIntake {
    /// Why upgrades cannot be carried out here, though asked for (keys not set).
    pub unavailable: Option<String>,
    /// The cluster, when configured: requests are planned against it.
    pub cluster: Option<Arc<dyn ClusterRead>>,
    /// The cluster's etcd, when configured: how the control planes are planned.
    pub etcd: Option<Arc<dyn EtcdMembers>>,
    /// Planning choices.
    pub plan: PlanSettings,
    /// The runs, for the one upgrade that may hold the cluster.
    pub store: Store,
}

#[async_trait::async_trait]
impl Intake for UpgradeIntake {
    fn door(&self) -> &'static RunDoor {
        &DOOR
    }

    /// With a cluster configured, plans the request against the cluster as it is now: a
    /// request the version or stage rules refuse is refused, and one that cannot be
    /// checked (the cluster or etcd unread) waits for a retry.
    async fn check(&self, request: &Arc<dyn RunRequest>) -> Result<(), Refusal> {
        if let Some(why) = &self.unavailable {
            return Err(Refusal::Invalid(why.clone()));
        }
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let Some(request) = request.as_any().downcast_ref::<DetectionRequest>() else {
            return Err(Refusal::Invalid("not an upgrade request".into()));
        };
        let active = self
            .store
            .active(crate::domain::upgrade_step::K8S_UPGRADE, "")
            .await
            .map_err(|e| {
                tracing::warn!(error = %crate::error_chain(&e), "run store failed");
                Refusal::Unavailable("the run store is unavailable; retry later".into())
            })?;
        if let Some(holder) = active {
            return Err(held_by(&holder));
        }
        let facts = cluster.facts().await.map_err(|e| {
            tracing::warn!(error = %crate::error_chain(&e), "cannot read the cluster to check a detection");
            Refusal::Unavailable(format!(
                "cannot read the cluster to check the request; retry later ({e})"
            ))
        })?;
        let etcd = match &self.etcd {
            None => None,
            Some(etcd) => Some(super::read_etcd(&**etcd, self.plan.distribution).await.map_err(|e| {
                tracing::warn!(error = %crate::error_chain(&e), "cannot read etcd to check a detection");
                Refusal::Unavailable(format!(
                    "cannot read etcd to check the request; retry later ({e})"
                ))
            })?),
        };
        plan::plan(request, &facts, etcd.as_ref(), &self.plan)
            .map(drop)
            .map_err(|e| Refusal::Invalid(e.to_string()))
    }

    fn held(&self, holder: &Run) -> Refusal {
        held_by(holder)
    }
}

/// The refusal of an upgrade while `holder`, another upgrade, holds the cluster.
pub fn held_by(holder: &Run) -> Refusal {
    Refusal::Conflict {
        code: HELD,
        message: format!(
            "run {} (target {}) is {}: one upgrade at a time; let it finish, or resume or abort it first",
            holder.id,
            holder.target.as_deref().unwrap_or("-"),
            holder.status
        ),
    }
}
