//! Request handlers. Each one parses and validates fully before it queues anything.

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, ContentType};
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AppState;
use super::error::ApiError;
use crate::domain::alert::{AlertBatch, WebhookBody};
use crate::domain::engine::check_control;
use crate::domain::event::{CloudEvent, ControlAction, ControlRequest, EventData, ROLLGATE_SOURCE};
use crate::domain::run::{Run, RunStatus};
use crate::queue::Outgoing;
use crate::store::Events;
use crate::workflows::view::ViewDoor;

pub(crate) type State = web::Data<AppState>;

/// Answer to an accepted alert notification.
#[derive(Serialize, utoipa::ToSchema)]
pub struct AlertsAccepted {
    /// Id of the queued event.
    pub event_id: String,
    /// How many alerts it carried.
    pub alerts: usize,
}

/// Answer to a detection.
#[derive(Serialize, utoipa::ToSchema)]
pub struct DetectionAccepted {
    /// The run that handles it.
    pub run_id: String,
    /// That run's status.
    pub status: RunStatus,
}

/// Answer to an accepted control.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ControlAccepted {
    /// The run's id.
    pub run_id: String,
    /// The control queued.
    pub action: ControlAction,
    /// Id of the queued event.
    pub event_id: String,
}

/// Who a token belongs to and what it may do.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Whoami {
    /// The client's name (its token file's name; `admin` for `server.token_file`).
    pub client: String,
    /// What it may do.
    #[schema(value_type = Vec<String>)]
    pub scopes: Vec<crate::domain::scope::Scope>,
    /// `server.banner`, the line the status page shows above everything, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub banner: Option<String>,
}

/// Reads a JSON body: 415 unless JSON, 413 over the limit, 400 unless it parses.
/// A request body read as JSON and validated by `parse`: 422 with every bad field.
pub(crate) async fn read_request<T, E: std::fmt::Display>(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    parse: fn(&Value) -> Result<T, E>,
) -> Result<T, ApiError> {
    let body = read_json(req, payload, state.max_body_bytes).await?;
    parse(&body).map_err(|e| ApiError::invalid(e.to_string()))
}

pub(crate) async fn read_json(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Value, ApiError> {
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if mime != "application/json" && !mime.ends_with("+json") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Type {content_type:?} is not JSON: send Content-Type: application/json"
            ),
        ));
    }
    let too_large = |n: usize| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the body is over {limit} bytes ({n} seen); the limit is server.max_body_bytes"
            ),
        )
    };
    let declared = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(n) = declared.filter(|&n| n > limit) {
        return Err(too_large(n));
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_body",
                format!("cannot read the body: {e}"),
            )
        })?;
        if body.len() + chunk.len() > limit {
            return Err(too_large(body.len() + chunk.len()));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(ApiError::bad_json)
}

/// Refused events are logged once per interval: under load they come thousands a second.
static REFUSALS_LOGGED: crate::logging::Throttle =
    crate::logging::Throttle::new(std::time::Duration::from_secs(10));

/// Queues `data` as one event: 202 material, or an error and nothing queued.
pub(crate) async fn enqueue(
    state: &AppState,
    req: &HttpRequest,
    data: &EventData,
) -> Result<CloudEvent, ApiError> {
    let event = CloudEvent::new(data, &api_source(req), Utc::now());
    let kind = data.event_type();
    if let Some(low) = state.reserve.as_ref().and_then(|r| r.check().err()) {
        state
            .metrics
            .queue_errors
            .with_label_values(&["low_disk"])
            .inc();
        if let Some(held) = REFUSALS_LOGGED.admit(std::time::Instant::now()) {
            tracing::warn!(error = %low, more = held, "refusing events: the disk under data_dir is short (one line per 10 s; `more` were refused since the last)");
        }
        return Err(ApiError::unavailable(format!(
            "the event was not queued: {low}; nothing was accepted, retry later"
        )));
    }
    let msg = Outgoing::event(&event, kind);
    match state.queue.publish(msg).await {
        Ok(()) => {
            state
                .metrics
                .events_queued
                .with_label_values(&[kind.label()])
                .inc();
            Ok(event)
        }
        Err(e) => {
            state
                .metrics
                .queue_errors
                .with_label_values(&["publish"])
                .inc();
            if let Some(held) = REFUSALS_LOGGED.admit(std::time::Instant::now()) {
                tracing::warn!(error = %crate::error_chain(&e), more = held, "cannot queue events (one line per 10 s; `more` were refused since the last)");
            }
            Err(ApiError::unavailable(format!(
                "the event was not queued ({e}); nothing was accepted, retry later"
            )))
        }
    }
}

/// The CloudEvents source of what a client sends through the API: `rollgate/api/<client>`,
/// so that the worker's log of each event names who sent it.
fn api_source(req: &HttpRequest) -> String {
    format!("{ROLLGATE_SOURCE}/api/{}", caller(req))
}

/// The name of the client that made `req` (`-` if none was authenticated), for the audit.
pub(crate) fn caller(req: &HttpRequest) -> String {
    super::auth::Caller::of(req).map_or_else(|| "-".into(), |c| c.name.clone())
}

/// A 503 for a store that failed, logged.
pub(crate) fn store_down(e: crate::store::StoreError) -> ApiError {
    tracing::warn!(error = %crate::error_chain(&e), "run store failed");
    ApiError::unavailable("the run store is unavailable; retry later")
}

/// `POST /v1/alerts`: an Alertmanager webhook notification (version 4).
#[utoipa::path(post, path = "/v1/alerts", request_body = WebhookBody,
    responses((status = 202, body = AlertsAccepted), (status = 400, body = super::error::ErrorBody),
        (status = 401, body = super::error::ErrorBody), (status = 413, body = super::error::ErrorBody),
        (status = 415, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody),
        (status = 503, body = super::error::ErrorBody)),
    security(("bearer" = ["alerts:write"])))]
pub async fn post_alerts(
    state: State,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let batch = read_request(&req, payload, &state, AlertBatch::from_json).await?;
    let alerts = batch.alerts.len();
    // The worker logs it with its source, which names the client.
    let event = enqueue(&state, &req, &EventData::Alerts(batch)).await?;
    Ok(HttpResponse::Accepted().json(AlertsAccepted {
        event_id: event.id,
        alerts,
    }))
}

/// `GET /v1/alerts`: the alert board built from Alertmanager notifications.
#[utoipa::path(get, path = "/v1/alerts", responses((status = 200, body = Vec<crate::store::BoardEntry>)), security(("bearer" = ["read"])))]
pub async fn get_alerts(state: State) -> Result<HttpResponse, ApiError> {
    let board = state.store.board(Utc::now()).await.map_err(store_down)?;
    Ok(HttpResponse::Ok().json(board))
}

/// `GET /v1/whoami`: the client the token names and its scopes; any known client may ask.
#[utoipa::path(get, path = "/v1/whoami", responses((status = 200, body = Whoami), (status = 401, body = super::error::ErrorBody)),
    security(("bearer" = [])))]
pub async fn whoami(state: State, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let caller = super::auth::Caller::of(&req)
        .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "no client"))?;
    Ok(HttpResponse::Ok().json(Whoami {
        client: caller.name.clone(),
        scopes: caller.scopes.iter().copied().collect(),
        banner: state.banner.clone(),
    }))
}

/// Options of `GET /v1/gates`.
#[derive(Deserialize, utoipa::IntoParams)]
pub struct GateQuery {
    /// `true`: the last evaluation (rollgate checks every `gate.poll_interval`) instead of
    /// a fresh one.
    pub cached: Option<bool>,
}

/// `GET /v1/gates`: the verdict, each source's state and the evaluation time.
#[utoipa::path(get, path = "/v1/gates", params(GateQuery), responses((status = 200, body = crate::workflows::gate::GateReport)), security(("bearer" = ["read"])))]
pub async fn get_gates(state: State, query: web::Query<GateQuery>) -> HttpResponse {
    let last = if query.cached == Some(true) {
        state.gate.last()
    } else {
        None
    };
    match last {
        Some(report) => HttpResponse::Ok().json(report),
        None => HttpResponse::Ok().json(state.gate.evaluate().await),
    }
}

/// `GET /v1/<view>`: a workflow's view, answered by what it registered for it (described
/// in the API from the view's door).
pub async fn get_view(state: State, door: &'static ViewDoor) -> Result<HttpResponse, ApiError> {
    let view = state
        .views
        .iter()
        .find(|v| v.door().path == door.path)
        .ok_or_else(|| {
            ApiError::not_found(format!("/v1/{} is not served by this rollgate", door.path))
        })?;
    let answer = view.read().await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("/v1/{} cannot be told: {e}", door.path),
        )
    })?;
    Ok(HttpResponse::Ok().json(answer))
}

/// Filters for `GET /v1/runs`.
#[derive(Deserialize, utoipa::IntoParams)]
pub struct RunFilter {
    /// Only runs in this status.
    pub status: Option<String>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<usize>,
    /// `full` (default): every run whole, steps and history; `summary`: a line each
    /// (`RunSummary`), what a list shows.
    pub view: Option<String>,
}

/// `GET /v1/runs`: runs, newest first.
#[utoipa::path(get, path = "/v1/runs", params(RunFilter), responses((status = 200, description = "the runs: whole (`view=full`) or a `RunSummary` each (`view=summary`)", body = Vec<Run>), (status = 422, body = super::error::ErrorBody)), security(("bearer" = ["read"])))]
pub async fn list_runs(
    state: State,
    filter: web::Query<RunFilter>,
) -> Result<HttpResponse, ApiError> {
    let status = match filter.status.as_deref() {
        None => None,
        Some(s) => Some(RunStatus::from_name(s).ok_or_else(|| {
            ApiError::invalid(format!(
                "status {s:?} is not one of {}",
                RunStatus::ALL.map(RunStatus::name).join(", ")
            ))
        })?),
    };
    let limit = filter.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be from 1 to 1000"));
    }
    match filter.view.as_deref() {
        None | Some("full") => {
            let runs = state
                .store
                .list_runs(status, limit)
                .await
                .map_err(store_down)?;
            Ok(HttpResponse::Ok().json(runs))
        }
        Some("summary") => {
            let runs = state
                .store
                .list_summaries(status, limit)
                .await
                .map_err(store_down)?;
            Ok(HttpResponse::Ok().json(runs))
        }
        Some(other) => Err(ApiError::invalid(format!(
            "view {other:?} is not one of full, summary"
        ))),
    }
}

/// Which steps and transitions `GET /v1/runs/{id}` returns, for large runs (a 1,000-node
/// upgrade has over 4,000 steps): without these, all of them.
#[derive(Deserialize, utoipa::IntoParams)]
pub struct RunPageQuery {
    /// The first step to return (by index).
    pub steps_from: Option<usize>,
    /// At most this many steps (1 to 1000).
    pub steps_limit: Option<usize>,
    /// The first transition of the history to return.
    pub history_from: Option<usize>,
    /// At most this many transitions (1 to 1000).
    pub history_limit: Option<usize>,
    /// Only the newest this many transitions (1 to 1000), instead of `history_from`.
    pub history_last: Option<usize>,
}

/// Where a paged run's steps and history start, and how many there are in all.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunPage {
    /// The index of the first step returned.
    pub steps_from: usize,
    /// How many steps the run has.
    pub steps_total: usize,
    /// The index of the first transition returned.
    pub history_from: usize,
    /// How many transitions the run's history has.
    pub history_total: usize,
}

/// `GET /v1/runs/{id}`: one run with its steps and history, or a page of them.
#[utoipa::path(get, path = "/v1/runs/{id}", params(RunPageQuery), responses((status = 200, description = "the run; with paging, its `steps` and `history` are the page asked for and `page` says where they start", body = Run), (status = 404, body = super::error::ErrorBody), (status = 422, body = super::error::ErrorBody)), security(("bearer" = ["read"])))]
pub async fn get_run(
    state: State,
    id: web::Path<String>,
    page: web::Query<RunPageQuery>,
) -> Result<HttpResponse, ApiError> {
    let limits = [
        ("steps_limit", page.steps_limit),
        ("history_limit", page.history_limit),
        ("history_last", page.history_last),
    ];
    for (name, limit) in limits {
        if limit.is_some_and(|l| !(1..=1000).contains(&l)) {
            return Err(ApiError::invalid(format!("{name} must be from 1 to 1000")));
        }
    }
    if page.history_last.is_some() && (page.history_from.is_some() || page.history_limit.is_some())
    {
        return Err(ApiError::invalid(
            "history_last asks for the newest transitions: give it alone, or history_from and history_limit",
        ));
    }
    let events = match (page.history_last, page.history_from, page.history_limit) {
        (Some(last), _, _) => Events::Last(last),
        (None, None, None) => Events::All,
        (None, from, limit) => Events::Page {
            from: from.unwrap_or(0),
            limit,
        },
    };
    let Some(mut view) = state
        .store
        .view_run_json(&id, events)
        .await
        .map_err(store_down)?
    else {
        return Err(ApiError::not_found(format!(
            "no run {id:?}; GET /v1/runs lists them"
        )));
    };
    let paged = page.steps_from.is_some() || page.steps_limit.is_some() || events != Events::All;
    let body = if paged {
        view.keep_steps(page.steps_from.unwrap_or(0), page.steps_limit);
        let page = RunPage {
            steps_from: view.steps_from,
            steps_total: view.steps_total,
            history_from: view.history_from,
            history_total: view.history_total,
        };
        let page = serde_json::to_value(page).map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?;
        view.to_json(&[("page", page)])
    } else {
        view.to_json(&[])
    }
    .map_err(store_down)?;
    Ok(HttpResponse::Ok()
        .content_type(ContentType::json())
        .body(body))
}

/// `POST /v1/runs/{id}/{action}`: halt, resume or abort a run (scope `runs:control`), or
/// approve one that waits for an approval (scope `runs:approve`); optional body
/// `{"reason": "…"}`.
#[utoipa::path(post, path = "/v1/runs/{id}/{action}",
    params(("id" = String, Path), ("action" = String, Path, description = "halt, resume or abort; approve (scope runs:approve) for a run that waits for an approval")),
    responses((status = 202, body = ControlAccepted), (status = 404, body = super::error::ErrorBody),
        (status = 409, body = super::error::ErrorBody)),
    security(("bearer" = ["runs:control"])))]
pub async fn control_run(
    state: State,
    path: web::Path<(String, String)>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (run_id, action) = path.into_inner();
    let Some(action) = ControlAction::from_name(&action) else {
        return Err(ApiError::not_found(format!(
            "no action {action:?}; use halt, resume, abort or approve"
        )));
    };
    let has_body = req
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v != "0")
        || req.headers().contains_key("transfer-encoding");
    let reason = if has_body {
        let body = read_json(&req, payload, state.max_body_bytes).await?;
        match body.get("reason") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) if s.len() <= 1024 => s.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    "reason must be a string of at most 1024 bytes",
                ));
            }
        }
    } else {
        String::new()
    };
    let run = state
        .store
        .get_run(&run_id)
        .await
        .map_err(store_down)?
        .ok_or_else(|| {
            ApiError::not_found(format!("no run {run_id:?}; GET /v1/runs lists them"))
        })?;
    check_control(&run, action)
        .map_err(|e| ApiError::new(StatusCode::CONFLICT, "conflict", e.to_string()))?;
    let by = caller(&req);
    let event = enqueue(
        &state,
        &req,
        &EventData::Control(ControlRequest {
            run_id: run_id.clone(),
            action,
            reason,
            by: Some(by.clone()),
        }),
    )
    .await?;
    tracing::info!(%run_id, %action, client = %by, event_id = %event.id, "control accepted");
    Ok(HttpResponse::Accepted().json(ControlAccepted {
        run_id,
        action,
        event_id: event.id,
    }))
}

/// `GET /healthz`: the process answers.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// `GET /readyz`: the queue and the store answer, the store takes the worker's writes,
/// and (with the embedded queue) the disk under `data_dir` keeps its reserve.
pub async fn readyz(state: State) -> HttpResponse {
    let timeout = std::time::Duration::from_secs(2);
    let queue = tokio::time::timeout(timeout, state.queue.depth()).await;
    let store = tokio::time::timeout(timeout, state.store.ping()).await;
    let queue_ok = matches!(queue, Ok(Ok(_)));
    let store_ok = matches!(store, Ok(Ok(())));
    let disk = state.reserve.as_ref().and_then(|r| r.check().err());
    let writes = state.writes.trouble();
    let body = serde_json::json!({
        "queue": if queue_ok { "ok" } else { "unavailable" },
        "store": if store_ok { "ok" } else { "unavailable" },
        "writes": writes.as_ref().map_or_else(
            || "ok".to_owned(),
            |(since, why)| format!("failing since {}: {why}", since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        ),
        "disk": disk.as_ref().map_or_else(|| "ok".to_owned(), ToString::to_string),
        "backend": state.queue.backend(),
    });
    if queue_ok && store_ok && disk.is_none() && writes.is_none() {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(state: State) -> HttpResponse {
    let timeout = std::time::Duration::from_secs(2);
    if let Ok(Ok(n)) = tokio::time::timeout(timeout, state.queue.depth()).await {
        state.metrics.queue_depth.set(n as i64);
    }
    if let Ok(Ok(n)) = tokio::time::timeout(timeout, state.queue.dead_depth()).await {
        state.metrics.dead_depth.set(n as i64);
    }
    if let Ok(active) = state.store.unfinished().await {
        let stalest = active
            .iter()
            .map(|r| r.updated_at)
            .min()
            .unwrap_or_else(Utc::now);
        state
            .metrics
            .stalest_transition
            .set(stalest.timestamp_millis() as f64 / 1000.0);
    }
    if let Ok(counts) = state.store.count_by_status().await {
        for status in RunStatus::ALL {
            let n = counts
                .iter()
                .find(|(s, _)| *s == status)
                .map_or(0, |(_, n)| *n);
            state
                .metrics
                .runs
                .with_label_values(&[status.name()])
                .set(n as i64);
        }
    }
    let window = state.windows.at(Utc::now());
    state.metrics.window_open.set(i64::from(window.is_open()));
    state
        .metrics
        .window_opening
        .set(window.opening().map_or(0, |t| t.timestamp()));
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

/// Anything else: a JSON 404.
pub async fn not_found(req: HttpRequest) -> HttpResponse {
    use actix_web::ResponseError;
    ApiError::not_found(format!(
        "no route {} {}; see /openapi.json",
        req.method(),
        req.path()
    ))
    .error_response()
}
