//! `GET /openapi.json`, generated from the handlers and types.

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "rollgate", description = "Gated, event-driven Kubernetes and etcd upgrades"),
    paths(
        super::routes::whoami,
        super::routes::post_alerts,
        super::routes::get_alerts,
        super::routes::get_gates,
        super::routes::get_fleet,
        super::routes::post_detections,
        super::routes::post_etcd_rolls,
        crate::http::reboots::post_reboots,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::scope;

    /// The scopes the description lists are the ones the API enforces.
    #[test]
    fn every_documented_route_names_the_scope_it_needs() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("description");
        let paths = doc["paths"].as_object().expect("paths");
        let mut checked = 0;
        for (path, operations) in paths {
            for (method, operation) in operations.as_object().expect("operations") {
                let listed: Vec<&str> = operation["security"][0]["bearer"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{method} {path}: no bearer security"))
                    .iter()
                    .filter_map(|s| s.as_str())
                    .collect();
                let needed = scope::required(&method.to_uppercase(), path);
                assert_eq!(
                    listed,
                    needed.map(|s| s.name()).into_iter().collect::<Vec<_>>(),
                    "{method} {path}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 10, "only {checked} operations");
    }
}
