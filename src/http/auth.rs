//! Who is calling, and may they: the bearer token names the client (401 when it names
//! none), the route's scope must be among the client's (403 naming the missing scope).
//! The client rides on the request for the handlers' audit and the request metrics.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{Error, HttpMessage, HttpRequest, ResponseError, web};
use std::sync::Arc;

use super::AppState;
use super::clients::Client;
use super::error::ApiError;
use crate::domain::scope;

/// The client that made a request, once its token was checked.
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Client>);

impl Caller {
    /// The client that made `req`, if it was authenticated.
    pub fn of(req: &HttpRequest) -> Option<Arc<Client>> {
        req.extensions().get::<Caller>().map(|c| c.0.clone())
    }
}

/// The token of `Authorization: Bearer <token>`, if one is sent.
pub fn bearer(headers: &actix_web::http::header::HeaderMap) -> Option<&str> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Lets the request through only with `Authorization: Bearer <token>` of a client that
/// holds the route's scope.
pub async fn require_scope(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let presented = bearer(req.headers());
    let clients = req
        .app_data::<web::Data<AppState>>()
        .map(|s| s.clients.clone());
    let client = match (presented, clients) {
        (None, _) => {
            return Ok(req.into_response(
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "missing bearer token: send Authorization: Bearer <your client's token>",
                )
                .error_response(),
            ));
        }
        (Some(token), Some(clients)) => clients.identify(token),
        (Some(_), None) => None,
    };
    let Some(client) = client else {
        return Ok(req.into_response(
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "unknown bearer token: use the token of a client in server.tokens_dir, or the one in server.token_file",
            )
            .error_response(),
        ));
    };
    if let Some(needed) = scope::required(req.method().as_str(), req.path(), |p| {
        crate::workflows::DOORS.scope_at(p)
    }) && !client.may(needed)
    {
        tracing::info!(client = %client.name, scope = %needed, path = %req.path(), "refused: missing scope");
        return Ok(req.into_response(
            ApiError::forbidden(
                needed.name(),
                format!(
                    "client {} lacks scope {needed}: grant it in server.scopes.{}",
                    client.name, client.name
                ),
            )
            .error_response(),
        ));
    }
    req.extensions_mut().insert(Caller(client));
    next.call(req)
        .await
        .map(ServiceResponse::map_into_boxed_body)
}
