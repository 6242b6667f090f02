//! `GET /openapi.json`, generated from the handlers and types.

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "rollgate", description = "Gated, event-driven Kubernetes and etcd upgrades"),
    paths(
        super::routes::post_alerts,
        super::routes::get_alerts,
        super::routes::get_gates,
        super::routes::post_detections,
        super::routes::post_etcd_rolls,
        super::routes::list_runs,
        super::routes::get_run,
        super::routes::control_run,
        super::events::stream,
    ),
    components(schemas(super::error::ErrorBody, crate::domain::run::RunSummary)),
    modifiers(&Bearer)
)]
pub struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Serves the description.
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}
