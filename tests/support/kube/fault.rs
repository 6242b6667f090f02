//! Faults the API server can be made to show, per verb and path, for a number of
//! requests or a span of time: an error status (with `Retry-After` where the real server
//! sends one), a connection dropped before a whole answer, or a delay before the answer.
//! Every request, faulted or not, is logged with its time, so tests count what a client
//! sent from the server's side.

use actix_web::{HttpResponse, web};
use serde_json::json;
use std::time::{Duration, Instant};

/// How a faulted request is answered.
#[derive(Debug, Clone)]
pub enum Answer {
    /// An error `Status` with this code; `retry_after` seconds go in the `Retry-After`
    /// header and `details.retryAfterSeconds`, as the API server sends them with 429s
    /// (API Priority and Fairness) and 503s.
    Status { code: u16, retry_after: Option<u32> },
    /// The connection drops before a complete answer (a reset, a restarting server).
    Reset,
    /// The request is served as usual after this delay.
    Delay(Duration),
}

/// How long a fault lasts.
#[derive(Debug, Clone, Copy)]
pub enum Lasting {
    /// The next this many matching requests.
    Requests(usize),
    /// Every matching request until then.
    Until(Instant),
}

/// A fault injected into the requests it matches.
#[derive(Debug, Clone)]
pub struct Fault {
    /// HTTP method (`GET`, `POST`, `PATCH`, …); `None`: every method.
    pub method: Option<&'static str>,
    /// A part of the path with its decoded query (`/eviction`, `/nodes/w2`,
    /// `spec.nodeName=w2`); `None`: every path.
    pub path: Option<String>,
    pub answer: Answer,
    pub lasting: Lasting,
}

impl Fault {
    /// Every request, of any verb and path, dropped for `span` from now: an outage.
    pub fn outage(span: Duration) -> Self {
        Self {
            method: None,
            path: None,
            answer: Answer::Reset,
            lasting: Lasting::Until(Instant::now() + span),
        }
    }

    /// Requests of `method` whose path contains `path` answered `answer` for `lasting`.
    pub fn on(method: &'static str, path: &str, answer: Answer, lasting: Lasting) -> Self {
        Self {
            method: Some(method),
            path: Some(path.to_owned()),
            answer,
            lasting,
        }
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.method.is_none_or(|m| m == method)
            && self.path.as_deref().is_none_or(|p| path.contains(p))
    }

    fn live(&self, now: Instant) -> bool {
        match self.lasting {
            Lasting::Requests(n) => n > 0,
            Lasting::Until(end) => now < end,
        }
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Request {
    pub at: Instant,
    pub method: String,
    /// The path with its decoded query.
    pub path: String,
    /// How it was answered when a fault answered it: `500`, `429`, `reset`, `delay`.
    pub faulted: Option<String>,
}

/// The faults in force and the log of requests.
#[derive(Default)]
pub struct Faults {
    faults: Vec<Fault>,
    pub log: Vec<Request>,
}

impl Faults {
    pub fn add(&mut self, fault: Fault) {
        self.faults.push(fault);
    }

    /// Logs the request and takes the answer of the first live fault it matches, if any.
    pub fn take(&mut self, method: &str, path: &str) -> Option<Answer> {
        let now = Instant::now();
        self.faults.retain(|f| f.live(now));
        let answer = self
            .faults
            .iter_mut()
            .find(|f| f.matches(method, path))
            .map(|f| {
                if let Lasting::Requests(n) = &mut f.lasting {
                    *n -= 1;
                }
                f.answer.clone()
            });
        self.log.push(Request {
            at: now,
            method: method.to_owned(),
            path: path.to_owned(),
            faulted: answer.as_ref().map(|a| match a {
                Answer::Status { code, .. } => code.to_string(),
                Answer::Reset => "reset".to_owned(),
                Answer::Delay(_) => "delay".to_owned(),
            }),
        });
        answer
    }
}

/// The path and its decoded query parameters (`/api/v1/pods?fieldSelector=spec.nodeName=w2`),
/// what a fault's `path` is looked for in.
pub fn uri(path: &str, query: &std::collections::BTreeMap<String, String>) -> String {
    if query.is_empty() {
        return path.to_owned();
    }
    let params: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{path}?{}", params.join("&"))
}

/// The answer to a faulted request (for [`Answer::Delay`], the caller waits and serves).
pub fn respond(answer: &Answer) -> HttpResponse {
    match answer {
        Answer::Status { code, retry_after } => {
            let (reason, message) = match code {
                429 => (
                    "TooManyRequests",
                    "the server has received too many requests and has asked us to try again later",
                ),
                503 => (
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                ),
                504 => (
                    "Timeout",
                    "the server was unable to return a response in the time allotted",
                ),
                _ => ("InternalError", "Internal error occurred: injected fault"),
            };
            let mut response = super::server::status(
                *code,
                reason,
                message,
                retry_after.map_or(serde_json::Value::Null, |s| json!({"retryAfterSeconds": s})),
            );
            if let Some(secs) = retry_after {
                response.headers_mut().insert(
                    actix_web::http::header::RETRY_AFTER,
                    actix_web::http::header::HeaderValue::from(*secs),
                );
            }
            response
        }
        // Headers go out, then the body fails: the server closes the connection and the
        // client is left without a complete answer.
        Answer::Reset | Answer::Delay(_) => HttpResponse::Ok()
            .content_type("application/json")
            .streaming(futures_util::stream::once(async {
                Err::<web::Bytes, std::io::Error>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected connection reset",
                ))
            })),
    }
}
