//! `GET /v1/events`: Server-Sent Events of run transitions and gate changes.
//!
//! Transitions come from the store's log, numbered in commit order; each is sent with its
//! number as the SSE `id`, so a client that reconnects with `Last-Event-ID` (browsers do
//! it by themselves) gets every transition it missed, across restarts of rollgate. Gate
//! changes are live only: the current verdict is sent on connect, then each change.
//! A stream ends once its token no longer may read (rotated, revoked, its scope taken
//! away): within a poll, not at the next reconnect.

use actix_web::web::Bytes;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;
use std::collections::VecDeque;
use std::time::Duration;

use super::AppState;
use crate::domain::run::RunEvent;
use crate::store::{Store, StoreError};
use crate::workflows::gate::GateReport;

/// How many logged transitions one read takes.
const PAGE: usize = 256;
/// How often the log is read without a commit to wake the stream (another replica's
/// commits), and how many of those pass between keep-alive comments.
const POLL: Duration = Duration::from_secs(1);
const KEEP_ALIVE_POLLS: u32 = 15;

/// Options of `GET /v1/events`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct EventsQuery {
    /// Only this run's transitions.
    pub run: Option<String>,
    /// Send the logged transitions numbered above this first (`0`: the whole log). The
    /// `Last-Event-ID` header, when sent, wins. Without either, the stream starts now.
    pub after: Option<i64>,
}

/// One frame of the stream, as text.
fn frame(id: Option<i64>, event: &str, data: &str) -> Bytes {
    let id = id.map(|id| format!("id: {id}\n")).unwrap_or_default();
    Bytes::from(format!("{id}event: {event}\ndata: {data}\n\n"))
}

fn transition_frame(event: &RunEvent) -> Bytes {
    frame(
        Some(event.seq),
        "transition",
        &serde_json::to_string(event).unwrap_or_default(),
    )
}

fn gate_frame(report: &GateReport) -> Bytes {
    frame(
        None,
        "gate",
        &serde_json::to_string(report).unwrap_or_default(),
    )
}

/// Where a stream stands.
struct Feed {
    /// The token the stream was opened with, asked again before every frame.
    token: String,
    clients: std::sync::Arc<super::clients::Clients>,
    store: Store,
    run: Option<String>,
    after: i64,
    logged: tokio::sync::watch::Receiver<u64>,
    gate: tokio::sync::watch::Receiver<Option<GateReport>>,
    ready: VecDeque<Bytes>,
    quiet_polls: u32,
}

impl Feed {
    /// The next frame, waiting for one; `None` ends the stream (the store failed: the
    /// client reconnects and resumes from its last id).
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            let reads = self
                .clients
                .identify(&self.token)
                .is_some_and(|c| c.may(crate::domain::scope::Scope::READ));
            if !reads {
                tracing::info!("event stream ended: its token may no longer read");
                return None;
            }
            if let Some(frame) = self.ready.pop_front() {
                return Some(frame);
            }
            let events = self
                .store
                .events_after(self.after, self.run.clone(), PAGE)
                .await
                .ok()?;
            if let Some(last) = events.last() {
                self.after = last.seq;
                self.ready.extend(events.iter().map(transition_frame));
                self.quiet_polls = 0;
                continue;
            }
            tokio::select! {
                changed = self.logged.changed() => changed.ok()?,
                changed = self.gate.changed() => {
                    changed.ok()?;
                    if let Some(report) = self.gate.borrow_and_update().as_ref() {
                        self.ready.push_back(gate_frame(report));
                    }
                }
                () = tokio::time::sleep(POLL) => {
                    self.quiet_polls += 1;
                    if self.quiet_polls >= KEEP_ALIVE_POLLS {
                        self.quiet_polls = 0;
                        self.ready.push_back(Bytes::from_static(b": keep-alive\n\n"));
                    }
                }
            }
        }
    }
}

/// Where a new stream starts: after `Last-Event-ID`, else after `after`, else now.
async fn start_after(
    req: &HttpRequest,
    query: &EventsQuery,
    store: &Store,
) -> Result<i64, StoreError> {
    let header = req
        .headers()
        .get("Last-Event-ID")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    match header.or(query.after) {
        Some(after) => Ok(after),
        None => store.last_event_seq().await,
    }
}

/// `GET /v1/events`: run transitions (`event: transition`, `id` = its number, data a
/// [`RunEvent`]) and gate changes (`event: gate`, data a [`GateReport`]) as Server-Sent
/// Events. Reconnect with `Last-Event-ID` to miss none.
#[utoipa::path(get, path = "/v1/events", params(EventsQuery),
    responses((status = 200, description = "text/event-stream: `event: transition` frames (id = the transition's number; data = RunEvent) and `event: gate` frames (data = GateReport)", content_type = "text/event-stream", body = RunEvent),
        (status = 401, body = super::error::ErrorBody), (status = 503, body = super::error::ErrorBody)),
    security(("bearer" = ["read"])))]
pub async fn stream(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, super::error::ApiError> {
    let store = state.store.clone();
    let after = start_after(&req, &query, &store)
        .await
        .map_err(super::routes::store_down)?;
    let mut gate = state.gate.verdict_changes();
    let mut ready = VecDeque::from([Bytes::from_static(b"retry: 1000\n\n")]);
    if let Some(report) = gate.borrow_and_update().as_ref() {
        ready.push_back(gate_frame(report));
    }
    let feed = Feed {
        token: super::auth::bearer(req.headers())
            .unwrap_or_default()
            .to_owned(),
        clients: state.clients.clone(),
        logged: store.transitions_logged(),
        store,
        run: query.into_inner().run,
        after,
        gate,
        ready,
        quiet_polls: 0,
    };
    let frames = futures_util::stream::unfold(feed, |mut feed| async move {
        let frame = feed.next().await?;
        Some((Ok::<_, actix_web::Error>(frame), feed))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(frames))
}
