//! The HTTP API (actix-web).

pub mod auth;
pub mod clients;
pub mod error;
pub mod events;
pub mod intake;
pub mod openapi;
pub mod routes;
pub mod tls;
pub mod ui;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::{Next, from_fn};
use actix_web::{Error, HttpMessage, web};
use std::sync::Arc;
use std::time::Instant;

use crate::metrics::Metrics;
use crate::queue::Queue;
use crate::store::Store;

/// What every handler shares.
pub struct AppState {
    /// The gate, for `GET /v1/gates`.
    pub gate: Arc<crate::workflows::gate::Gate>,
    /// The event queue.
    pub queue: Arc<dyn Queue>,
    /// The run store.
    pub store: Store,
    /// Where it counts what it does.
    pub metrics: Metrics,
    /// The API's clients and their tokens.
    pub clients: Arc<clients::Clients>,
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// What new runs do when a step gives up.
    pub on_failure: crate::domain::run::FailurePolicy,
    /// Each workflow's intake: what its requests are checked against.
    pub intakes: Vec<Arc<dyn crate::workflows::intake::Intake>>,
    /// The maintenance windows, for the metrics of the next opening.
    pub windows: crate::domain::schedule::Windows,
    /// The free space intake keeps under `data_dir` (with the embedded queue).
    pub reserve: Option<crate::disk::Reserve>,
    /// Whether the worker can write the store now, and why not.
    pub writes: std::sync::Arc<crate::worker::WriteHealth>,
    /// Whether a new upgrade waits for the clusters upstream of this one.
    pub asks_upstreams: bool,
    /// What answers each of the workflows' views (`workflows::VIEWS`).
    pub views: Vec<Arc<dyn crate::workflows::view::View>>,
    /// `server.banner`: the line the status page shows above everything.
    pub banner: Option<String>,
}

impl AppState {
    /// What new runs are made with.
    pub fn run_policy(&self) -> crate::domain::run_request::RunPolicy {
        crate::domain::run_request::RunPolicy {
            on_failure: self.on_failure,
            asks_upstreams: self.asks_upstreams,
        }
    }
}

/// Calls `reread` (which reads files: blocking) on the blocking pool every `period` until
/// `stop` fires, handing each result to `then`: how the token and certificate files are
/// followed while rollgate runs.
pub(crate) async fn reread_every<T: Send + 'static>(
    period: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    reread: impl Fn() -> T + Clone + Send + 'static,
    mut then: impl FnMut(T),
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // A slow volume must not stall the runtime.
                if let Ok(result) = tokio::task::spawn_blocking(reread.clone()).await {
                    then(result);
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Registers every route on an actix `App`: rollgate's own, one door per workflow that
/// makes runs, and the workflows' views.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let mut v1 = web::scope("/v1").wrap(from_fn(auth::require_scope));
    for door in crate::workflows::DOORS.iter() {
        v1 = v1.route(
            &format!("/{}", door.path),
            web::post().to(move |state, req, payload| intake::post_run(state, req, payload, door)),
        );
    }
    for view in crate::workflows::VIEWS {
        v1 = v1.route(
            &format!("/{}", view.path),
            web::get().to(move |state| routes::get_view(state, view)),
        );
    }
    ui::configure(cfg);
    cfg.route("/healthz", web::get().to(routes::healthz))
        .route("/readyz", web::get().to(routes::readyz))
        .route("/metrics", web::get().to(routes::metrics))
        .route("/openapi.json", web::get().to(openapi::openapi_json))
        .service(
            v1.route("/whoami", web::get().to(routes::whoami))
                .route("/alerts", web::post().to(routes::post_alerts))
                .route("/alerts", web::get().to(routes::get_alerts))
                .route("/gates", web::get().to(routes::get_gates))
                .route("/events", web::get().to(events::stream))
                .route("/runs", web::get().to(routes::list_runs))
                .route("/runs/{id}", web::get().to(routes::get_run))
                .route("/runs/{id}/{action}", web::post().to(routes::control_run)),
        )
        .default_service(web::to(routes::not_found));
}

/// Counts requests by route pattern, method and code, and times them.
pub async fn observe(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let started = Instant::now();
    let method = req.method().to_string();
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let res = next.call(req).await?;
    if let Some(m) = state.as_ref().map(|s| &s.metrics) {
        let route = res
            .request()
            .match_pattern()
            .unwrap_or_else(|| "unmatched".into());
        let client = res
            .request()
            .extensions()
            .get::<auth::Caller>()
            .map(|c| c.0.name.clone())
            .unwrap_or_else(|| "-".into());
        m.http_requests
            .with_label_values(&[&route, &method, res.status().as_str(), &client])
            .inc();
        m.http_duration
            .with_label_values(&[&route])
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(res)
}
