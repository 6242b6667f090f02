//! Prometheus instant queries through prometheus-http-query, on our own reqwest client:
//! the crate sets no timeout, so connect and request timeouts are set here, with the
//! optional bearer token, basic auth and CA.

use std::collections::BTreeMap;

use super::http_client::HttpSource;
use crate::config::GateSettings;
use crate::domain::gate::{PromReading, PromSeries};
use crate::ports::MetricsSource;

/// A Prometheus server.
pub struct Prometheus {
    client: prometheus_http_query::Client,
    timeout_ms: i64,
}

pub use super::http_client::BuildError;

impl Prometheus {
    /// A client for `url` with the gate's Prometheus settings.
    pub fn new(url: &str, settings: &GateSettings) -> Result<Self, BuildError> {
        let http = HttpSource {
            section: "gate.",
            timeout: settings.timeout,
            bearer_token_file: settings.bearer_token_file.as_ref(),
            basic_auth_user: settings.basic_auth_user.as_ref(),
            basic_auth_password_file: settings.basic_auth_password_file.as_ref(),
            ca_file: settings.ca_file.as_ref(),
            identity: None,
        }
        .client()?;
        let client = prometheus_http_query::Client::from(http, url)
            .map_err(|e| BuildError(format!("Prometheus client: {e}")))?;
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
