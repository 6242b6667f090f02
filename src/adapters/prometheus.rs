//! Prometheus instant queries through prometheus-http-query, on our own reqwest client:
//! the crate sets no timeout, so connect and request timeouts are set here, with the
//! optional bearer token, basic auth and CA.

use std::collections::BTreeMap;

use crate::config::GateSettings;
use crate::domain::gate::{PromReading, PromSeries};
use crate::ports::MetricsSource;

/// A Prometheus server.
pub struct Prometheus {
    client: prometheus_http_query::Client,
    timeout_ms: i64,
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("Prometheus client: {0}")]
pub struct BuildError(String);

fn read_secret(path: &std::path::Path, what: &str) -> Result<String, BuildError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| BuildError(format!("cannot read {what} {}: {e}", path.display())))
}

impl Prometheus {
    /// A client for `settings.prometheus_url`.
    pub fn new(url: &str, settings: &GateSettings) -> Result<Self, BuildError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(path) = &settings.bearer_token_file {
            let token = read_secret(path, "gate.bearer_token_file")?;
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| {
                    BuildError("the bearer token has characters a header cannot carry".into())
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        if let (Some(user), Some(path)) = (
            &settings.basic_auth_user,
            &settings.basic_auth_password_file,
        ) {
            use base64_auth::encode;
            let password = read_secret(path, "gate.basic_auth_password_file")?;
            let mut value = reqwest::header::HeaderValue::from_str(&format!(
                "Basic {}",
                encode(user, &password)
            ))
            .map_err(|_| {
                BuildError(
                    "the basic-auth credentials have characters a header cannot carry".into(),
                )
            })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(settings.timeout)
            .timeout(settings.timeout)
            .default_headers(headers);
        if let Some(path) = &settings.ca_file {
            let pem = std::fs::read(path).map_err(|e| {
                BuildError(format!("cannot read gate.ca_file {}: {e}", path.display()))
            })?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| BuildError(format!("gate.ca_file: {e}")))?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder.build().map_err(|e| BuildError(e.to_string()))?;
        let client = prometheus_http_query::Client::from(http, url)
            .map_err(|e| BuildError(e.to_string()))?;
        Ok(Self {
            client,
            timeout_ms: i64::try_from(settings.timeout.as_millis()).unwrap_or(i64::MAX),
        })
    }
}

#[async_trait::async_trait]
impl MetricsSource for Prometheus {
    async fn query(&self, promql: &str) -> PromReading {
        let answer = self
            .client
            .query(promql)
            .timeout(self.timeout_ms)
            .get()
            .await;
        match answer {
            Err(e) => PromReading::Failed(format!(
                "Prometheus query failed: {}",
                crate::error_chain(&e)
            )),
            Ok(result) => match result.data() {
                prometheus_http_query::response::Data::Vector(vector) => PromReading::Series(
                    vector
                        .iter()
                        .map(|v| PromSeries {
                            labels: v
                                .metric()
                                .iter()
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect::<BTreeMap<_, _>>(),
                        })
                        .collect(),
                ),
                _ => PromReading::Failed(format!(
                    "the query {promql:?} must return an instant vector"
                )),
            },
        }
    }
}

/// RFC 7617 basic credentials, without pulling a base64 crate for one header.
mod base64_auth {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(user: &str, password: &str) -> String {
        let input = format!("{user}:{password}");
        let bytes = input.as_bytes();
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn encodes_like_rfc_7617() {
            assert_eq!(
                super::encode("Aladdin", "open sesame"),
                "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
            );
            assert_eq!(super::encode("a", "b"), "YTpi");
            assert_eq!(super::encode("ab", "c"), "YWI6Yw==");
        }
    }
}
