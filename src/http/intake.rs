//! The one door in the HTTP API through which every workflow's runs are asked for:
//! `POST /v1/<door>`. The body is read and checked by the workflow's intake before
//! anything is queued; the run and the event that starts it are then written together.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use std::sync::Arc;

use super::AppState;
use super::error::ApiError;
use super::routes::{DetectionAccepted, State, caller, enqueue, read_json, store_down};
use crate::domain::event::{CloudEvent, EventData, ROLLGATE_SOURCE};
use crate::domain::run::{Run, RunStatus};
use crate::domain::run_request::{RunAsked, RunDoor, RunRequest};
use crate::queue::Outgoing;
use crate::store::Claim;
use crate::workflows::intake::{Admit, Intake, Refusal};

/// A workflow's refusal as the API answers it.
pub(crate) fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::Invalid(why) => ApiError::invalid(why),
        Refusal::Unavailable(why) => ApiError::unavailable(why),
        Refusal::Conflict { code, message } => {
            ApiError::new(actix_web::http::StatusCode::CONFLICT, code, message)
        }
    }
}

/// `POST /v1/<door>`: a request for a run of the door's workflow. 202 with a new run;
/// 200 with the run in flight for the same target, or the waiting run it merged into, or
/// a dry run's answer; 422, 409 or 503 with nothing queued.
pub async fn post_run(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
    door: &'static RunDoor,
) -> Result<HttpResponse, ApiError> {
    let Some(intake) = state
        .intakes
        .iter()
        .find(|i| i.door().kind() == door.kind())
    else {
        return Err(ApiError::invalid(format!(
            "{} runs are not taken here",
            door.kind().name()
        )));
    };
    let body = read_json(&req, payload, state.max_body_bytes).await?;
    let request = intake
        .read_posted(&body)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    match intake.admit(&request).await.map_err(refused)? {
        Admit::Answer(answer) => Ok(HttpResponse::Ok().json(answer)),
        Admit::MergeInto(waiting) => {
            let data = EventData::Run(RunAsked {
                door,
                run_id: None,
                request,
            });
            enqueue(&state, &req, &data).await?;
            Ok(HttpResponse::Ok().json(DetectionAccepted {
                run_id: waiting.id,
                status: waiting.status,
            }))
        }
        Admit::New => {
            let run_id = uuid::Uuid::now_v7().to_string();
            Ok(
                match take_new(&state, &**intake, run_id, request, Some(&caller(&req))).await? {
                    Taken::New(run_id) => HttpResponse::Accepted().json(DetectionAccepted {
                        run_id,
                        status: RunStatus::Queued,
                    }),
                    Taken::InFlight { run_id, status } => {
                        HttpResponse::Ok().json(DetectionAccepted { run_id, status })
                    }
                },
            )
        }
    }
}

/// What became of a run request.
pub enum Taken {
    /// Queued as a new run with this id.
    New(String),
    /// A run of the same kind and target is in flight: nothing was queued.
    InFlight {
        /// That run.
        run_id: String,
        /// Its status.
        status: RunStatus,
    },
}

/// Takes a new run `run_id` for `request` (credited to `by`) unless one of its kind and
/// target is in flight; the intake's checks run (and may refuse) only when a new run would
/// be taken. The run and the event that starts it are written in one transaction of the
/// store that sees every replica's claims (the database decides, not this process), then
/// the event is published; one the queue cannot take now stays in the outbox, and the
/// active worker publishes it.
pub async fn take_new(
    state: &AppState,
    intake: &dyn Intake,
    run_id: String,
    request: Arc<dyn RunRequest>,
    by: Option<&str>,
) -> Result<Taken, ApiError> {
    let door = intake.door();
    let Some(mut run) = (door.new_run)(run_id.clone(), &*request, &state.run_policy(), Utc::now())
    else {
        return Err(ApiError::invalid(format!(
            "not a request for a {} run",
            door.kind().name()
        )));
    };
    if let Some(by) = by {
        run = run.credited(by);
    }
    let target = run.target.clone().unwrap_or_default();
    let in_flight = |existing: Run| Taken::InFlight {
        run_id: existing.id,
        status: existing.status,
    };
    if let Some(existing) = state
        .store
        .in_flight(run.kind, &target)
        .await
        .map_err(store_down)?
    {
        return Ok(in_flight(existing));
    }
    intake.check(&request).await.map_err(refused)?;
    let event = EventData::Run(RunAsked {
        door,
        run_id: Some(run_id),
        request,
    });
    let kind = event.event_type();
    let start = Outgoing::event(&CloudEvent::new(&event, ROLLGATE_SOURCE, Utc::now()), kind);
    match state
        .store
        .claim_run(&run, &start)
        .await
        .map_err(store_down)?
    {
        Claim::InFlight(existing) => Ok(in_flight(existing)),
        Claim::Held(holder) => Err(refused(intake.held(&holder))),
        Claim::New(seq) => {
            tracing::info!(run_id = %run.id, kind = run.kind.name(), target = %target, by = run.history.first().and_then(|t| t.by.as_deref()).unwrap_or("-"), "run taken");
            state
                .metrics
                .events_queued
                .with_label_values(&[kind.label()])
                .inc();
            match state.queue.publish(start).await {
                Ok(()) => {
                    if let Err(e) = state.store.outbox_sent(seq).await {
                        tracing::warn!(error = %crate::error_chain(&e), run_id = %run.id, "published; the outbox keeps a copy the worker publishes again (processed once)");
                    }
                }
                Err(e) => {
                    state
                        .metrics
                        .queue_errors
                        .with_label_values(&["publish"])
                        .inc();
                    tracing::warn!(error = %crate::error_chain(&e), run_id = %run.id, "the run is taken; its start waits in the outbox for the queue");
                }
            }
            Ok(Taken::New(run.id))
        }
    }
}
