//! Bearer-token check for everything under `/v1`, in constant time.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{Error, ResponseError, web};
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::ApiError;

/// Lets the request through only with `Authorization: Bearer <token>`.
pub async fn require_token(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, Error> {
    let presented = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let expected = req
        .app_data::<web::Data<AppState>>()
        .map(|s| s.token.clone());
    let verdict = match (presented, expected) {
        (None, _) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing bearer token: send Authorization: Bearer <the token in server.token_file>",
        )),
        (Some(given), Some(token)) if bool::from(given.as_bytes().ct_eq(token.as_bytes())) => {
            Ok(())
        }
        (Some(_), _) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "invalid bearer token: use the token in server.token_file",
        )),
    };
    match verdict {
        Ok(()) => next
            .call(req)
            .await
            .map(ServiceResponse::map_into_boxed_body),
        Err(e) => Ok(req.into_response(e.error_response())),
    }
}
