//! The JSON error body every failing request gets: `{"error": code, "message": text}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use std::fmt;

/// An error answered to an HTTP client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// What went wrong and what to do about it.
    pub message: String,
    /// Seconds after which a retry may succeed (503).
    pub retry_after: Option<u32>,
    /// The scope the client lacks (403).
    pub missing_scope: Option<&'static str>,
}

/// The error body, for the API description.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// Stable code, e.g. `invalid_request`.
    pub error: String,
    /// Text a person can act on.
    pub message: String,
    /// On a 403: the scope the client's token lacks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_scope: Option<String>,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            missing_scope: None,
        }
    }
    /// 403: the client is known but its token lacks `scope`.
    pub fn forbidden(scope: &'static str, message: impl Into<String>) -> Self {
        Self {
            missing_scope: Some(scope),
            ..Self::new(StatusCode::FORBIDDEN, "forbidden", message)
        }
    }
    /// 400: the body is not parsable JSON.
    pub fn bad_json(e: impl fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the body is not valid JSON: {e}"),
        )
    }
    /// 422: valid JSON that breaks a rule.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }
    /// 404.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", what)
    }
    /// 503 with Retry-After: the queue or store cannot take the request now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(5),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }
    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status);
        if let Some(secs) = self.retry_after {
            resp.insert_header(("Retry-After", secs.to_string()));
        }
        resp.json(ErrorBody {
            error: self.code.into(),
            message: self.message.clone(),
            missing_scope: self.missing_scope.map(str::to_owned),
        })
    }
}
