//! Prometheus Pushgateway: `PUT /metrics/job/<job>[/<label>/<value>…]` replaces that
//! group, and only that one.

use std::time::Duration;

use crate::ports::{Failure, MetricsPush};

/// One job's group on a Pushgateway.
pub struct Pushgateway {
    url: String,
    http: reqwest::Client,
}

impl Pushgateway {
    /// The group of `job` (letters, digits, `_`, `-`; checked by the configuration) on the
    /// Pushgateway at `base`.
    pub fn new(base: &str, job: &str, timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            url: format!("{}/metrics/job/{job}", base.trim_end_matches('/')),
            http,
        })
    }
}

#[async_trait::async_trait]
impl MetricsPush for Pushgateway {
    async fn push(&self, group: &[(&str, &str)], text: String) -> Result<(), Failure> {
        let url: String = group.iter().fold(self.url.clone(), |url, (label, value)| {
            format!("{url}/{label}/{value}")
        });
        let response = self
            .http
            .put(&url)
            .header(reqwest::header::CONTENT_TYPE, "text/plain; version=0.0.4")
            .body(text)
            .send()
            .await
            .map_err(|e| Failure::caused(format!("pushgateway {url}"), e.without_url()))?;
        if response.status().is_success() {
            Ok(())
        } else {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            Err(Failure::new(format!(
                "pushgateway {url}: HTTP {status}: {}",
                body.chars().take(300).collect::<String>()
            )))
        }
    }
}
