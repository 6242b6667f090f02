//! `POST /v1/reboots`: the reboot workflow's door in the HTTP API. The request is checked
//! against the cluster (every node named exists; a control plane only when allowed) before
//! anything is queued; a request while a reboot run waits for the cluster merges into it.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;

use super::RebootRequest;
use crate::domain::event::EventData;
use crate::domain::run::{RunKind, RunStatus};
use crate::http::error::ApiError;
use crate::http::routes::{
    DetectionAccepted, State, caller, enqueue, read_request, store_down, take_run_request,
};

/// `POST /v1/reboots`: reboot the nodes named, or every node whose sentinel is set.
#[utoipa::path(post, path = "/v1/reboots", request_body = crate::workflows::node_reboot::request::RebootBody,
    responses((status = 202, body = DetectionAccepted, description = "a new run"),
        (status = 200, body = DetectionAccepted, description = "merged into the reboot run that waits for the cluster"),
        (status = 422, body = crate::http::error::ErrorBody), (status = 503, body = crate::http::error::ErrorBody)),
    security(("bearer" = ["reboots:write"])))]
pub async fn post_reboots(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let request = read_request(&req, payload, &state, RebootRequest::from_json).await?;
    // Reboots are carried out by the same cluster, SSH and etcd wiring as upgrades.
    if let Some(why) = &state.upgrades_unavailable {
        return Err(ApiError::invalid(format!(
            "node reboots are not available here: {why}"
        )));
    }
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::invalid(
            "no cluster is configured (cluster.kubeconfig or cluster.in_cluster): rollgate has no nodes to reboot",
        ));
    };
    let facts = cluster.facts().await.map_err(|e| {
        tracing::warn!(error = %crate::error_chain(&e), "cannot read the cluster to check a reboot request");
        ApiError::unavailable(format!(
            "cannot read the cluster to check the request; retry later ({e})"
        ))
    })?;
    crate::workflows::node_reboot::check_request(&request, &facts, &state.reboot_plan)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let waiting = state
        .store
        .not_ended()
        .await
        .map_err(store_down)?
        .into_iter()
        .find(|r| r.kind == RunKind::NodeReboot && r.status == RunStatus::Queued);
    if let Some(waiting) = waiting {
        // The worker merges it into the waiting run, which has not planned yet.
        let data = EventData::Reboot {
            run_id: None,
            request,
        };
        enqueue(&state, &req, &data).await?;
        return Ok(HttpResponse::Ok().json(DetectionAccepted {
            run_id: waiting.id,
            status: waiting.status,
        }));
    }
    let run_id = uuid::Uuid::now_v7().to_string();
    let run = crate::workflows::node_reboot::plan::new_run(
        run_id.clone(),
        &request,
        state.on_failure,
        Utc::now(),
    )
    .credited(&caller(&req));
    let event = EventData::Reboot {
        run_id: Some(run_id),
        request,
    };
    take_run_request(&state, run, event, async { Ok(()) }).await
}
