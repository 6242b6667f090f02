//! `GET /openapi.json`, generated from the handlers and types.

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, schema::Schema};
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
        super::routes::list_runs,
        super::routes::get_run,
        super::routes::control_run,
        super::events::stream,
    ),
    components(schemas(super::error::ErrorBody, crate::domain::run::RunSummary)),
    modifiers(&Bearer, &RunDoors, &Views)
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

/// Describes each workflow's door, `POST /v1/<door>`, from what the door says of itself.
struct RunDoors;

impl Modify for RunDoors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{HttpMethod, OperationBuilder};
        use utoipa::openapi::request_body::RequestBodyBuilder;
        use utoipa::openapi::security::SecurityRequirement;
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let mut schemas = Vec::new();
        let mut json = |named: crate::domain::run_request::NamedSchemas| {
            let reference = Ref::from_schema_name(&named.name);
            schemas.extend(named.all);
            ContentBuilder::new().schema(Some(reference)).build()
        };
        let error = || {
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build()
        };
        let accepted = crate::domain::run_request::schema_of::<super::routes::DetectionAccepted>;
        for door in crate::workflows::DOORS.iter() {
            let answer = |description: &str, content| {
                ResponseBuilder::new()
                    .description(description)
                    .content("application/json", content)
                    .build()
            };
            let mut operation = OperationBuilder::new()
                .summary(Some(format!("`POST /v1/{}`: {}", door.path, door.summary)))
                .request_body(Some(
                    RequestBodyBuilder::new()
                        .content("application/json", json((door.body)()))
                        .required(Some(utoipa::openapi::Required::True))
                        .build(),
                ))
                .response("202", answer("a new run", json(accepted())))
                .response(
                    "200",
                    answer(
                        "a run for this target is already in flight",
                        json(accepted()),
                    ),
                )
                .response(
                    "422",
                    answer(
                        "the request is well-formed but refused; the message says why",
                        error(),
                    ),
                )
                .response(
                    "503",
                    answer("the queue or the store is unavailable; retry", error()),
                );
            for extra in door.answers {
                let content = match extra.body {
                    Some(body) => json(body()),
                    None => error(),
                };
                operation = operation
                    .response(extra.status.to_string(), answer(extra.description, content));
            }
            let operation = operation
                .security(SecurityRequirement::new("bearer", [door.scope.name()]))
                .build();
            openapi.paths.add_path_operation(
                format!("/v1/{}", door.path),
                vec![HttpMethod::Post],
                operation,
            );
        }
        add_schemas(openapi, schemas);
    }
}

/// Describes each workflow's view, `GET /v1/<view>`, from what the view says of itself.
struct Views;

impl Modify for Views {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{HttpMethod, OperationBuilder};
        use utoipa::openapi::security::SecurityRequirement;
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let mut schemas = Vec::new();
        for view in crate::workflows::VIEWS {
            let body = (view.body)();
            let content = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name(&body.name)))
                .build();
            schemas.extend(body.all);
            let operation = OperationBuilder::new()
                .summary(Some(format!("`GET /v1/{}`: {}", view.path, view.summary)))
                .response(
                    "200",
                    ResponseBuilder::new()
                        .description("OK")
                        .content("application/json", content)
                        .build(),
                )
                .security(SecurityRequirement::new(
                    "bearer",
                    [crate::domain::scope::Scope::READ.name()],
                ))
                .build();
            openapi.paths.add_path_operation(
                format!("/v1/{}", view.path),
                vec![HttpMethod::Get],
                operation,
            );
        }
        add_schemas(openapi, schemas);
    }
}

/// Adds the schemas the doors' and views' entries refer to, each once.
fn add_schemas(openapi: &mut utoipa::openapi::OpenApi, schemas: Vec<(String, RefOr<Schema>)>) {
    let components = openapi.components.get_or_insert_with(Default::default);
    for (name, schema) in schemas {
        components.schemas.entry(name).or_insert(schema);
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
                let needed = scope::required(&method.to_uppercase(), path, |p| {
                    crate::workflows::DOORS.scope_at(p)
                });
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
