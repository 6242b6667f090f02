//! `POST /v1/reboots`: the reboot workflow's door in the HTTP API. The request is checked
//! against the cluster (every node named exists; a control plane only when allowed) before
//! anything is queued; a request while a reboot run waits for the cluster merges into it.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;

use super::error::ApiError;
use super::routes::{
    DetectionAccepted, State, caller, enqueue, read_request, store_down, take_run_request,
};
use crate::domain::event::EventData;
use crate::domain::run::{RunKind, RunStatus};
use crate::workflows::node_reboot::RebootRequest;

/// `POST /v1/reboots`: reboot the nodes named, or every node whose sentinel is set.
#[utoipa::path(post, path = "/v1/reboots", request_body = crate::workflows::node_reboot::request::RebootBody,
    responses((status = 202, body = DetectionAccepted, description = "a new run"),
        (status = 200, body = crate::workflows::node_reboot::dry_run::RebootDryRun, description = "with `dry_run`: what a run would do now; nothing queued"),
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
    if request.dry_run {
        return dry_run(&state, &request, &facts).await;
    }
    let waiting = crate::workflows::node_reboot::plan::waiting_for_the_cluster(
        state.store.not_ended().await.map_err(store_down)?,
    );
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

/// The answer to a dry run: the plan as it would be made now, and what would hold it (the
/// gate, the windows, another run holding the cluster, a node's drain). Nothing is queued.
async fn dry_run(
    state: &State,
    request: &RebootRequest,
    facts: &crate::workflows::k8s_upgrade::plan::ClusterFacts,
) -> Result<HttpResponse, ApiError> {
    let Some(reboots) = &state.node_reboots else {
        return Err(ApiError::invalid(
            "node reboots are not available here: no cluster is configured",
        ));
    };
    let mut answer = reboots
        .dry_run(request, facts, &state.reboot_plan)
        .await
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let mut holds = Vec::new();
    let verdict = state.gate.evaluate().await.verdict_for(RunKind::NodeReboot);
    holds.extend(verdict.reasons().into_iter().map(|r| match verdict {
        crate::domain::gate::Verdict::Closed { .. } => format!("gate closed: {r}"),
        _ => r,
    }));
    if let crate::domain::schedule::Now::Closed { opens } = state.windows.at(Utc::now()) {
        holds.push(format!(
            "outside the maintenance windows: the next opens at {}",
            opens.format("%Y-%m-%d %H:%M:%S UTC")
        ));
    }
    let holder = state
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
    Ok(HttpResponse::Ok().json(answer))
}
