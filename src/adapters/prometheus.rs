//! Prometheus instant queries through prometheus-http-query, on our own reqwest client:
//! the crate sets no timeout, so connect and request timeouts are set here, with the
//! optional bearer token, basic auth and CA.

use std::collections::BTreeMap;

use super::http_client::HttpSource;
use crate::config::GateSettings;
use crate::domain::analysis::RangeSeries;
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

/// Prometheus' answer to a query, as its HTTP API documents it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<prometheus_http_query::response::Data>,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    /// Set when the answer is partial (a remote store or a shard did not answer).
    #[serde(default)]
    warnings: Vec<String>,
}

/// The data of an answer (HTTP `status`, `body`) from Prometheus' query API, for `what`
/// failed (`Prometheus query failed`): an error, a body that is not Prometheus' JSON, or a
/// partial answer (with `warnings`) is a failure, so that the gate is unknown rather than
/// open and an analysis inconclusive rather than passed.
fn read_data(
    what: &str,
    status: u16,
    body: &[u8],
) -> Result<Option<prometheus_http_query::response::Data>, String> {
    let answer: Answer = serde_json::from_slice(body).map_err(|_| {
        let text: String = String::from_utf8_lossy(body).chars().take(120).collect();
        format!("{what}: HTTP {status}, and the answer is not Prometheus' JSON: {text:?}")
    })?;
    if answer.status != "success" {
        return Err(format!(
            "{what}: HTTP {status}: {}: {}",
            answer.error_type.unwrap_or_default(),
            answer.error.unwrap_or_default()
        ));
    }
    if !answer.warnings.is_empty() {
        return Err(format!(
            "{what}: the answer is partial, with warnings: {}",
            answer.warnings.join("; ")
        ));
    }
    Ok(answer.data)
}

/// What an answer (HTTP `status`, `body`) to `promql` says. Only a complete instant
/// vector is a reading.
fn read_answer(promql: &str, status: u16, body: &[u8]) -> PromReading {
    match read_data("Prometheus query failed", status, body) {
        Err(e) => PromReading::Failed(e),
        Ok(Some(prometheus_http_query::response::Data::Vector(vector))) => PromReading::Series(
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
        Ok(_) => PromReading::Failed(format!(
            "the query {promql:?} must return an instant vector"
        )),
    }
}

/// What an answer (HTTP `status`, `body`) to the range query `promql` says: its series,
/// each value as a number (Prometheus writes them as strings). Only a complete range
/// vector is a reading.
fn read_range(promql: &str, status: u16, body: &[u8]) -> Result<Vec<RangeSeries>, String> {
    match read_data("Prometheus range query failed", status, body)? {
        Some(prometheus_http_query::response::Data::Matrix(matrix)) => Ok(matrix
            .iter()
            .map(|m| RangeSeries {
                labels: m
                    .metric()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                values: m.samples().iter().map(|s| s.value()).collect(),
            })
            .collect()),
        _ => Err(format!(
            "the query {promql:?} must return a range vector (one series per node)"
        )),
    }
}

/// The rule groups' names in Prometheus' answer to `GET /api/v1/rules` (HTTP `status`,
/// `body`).
fn read_rule_groups(status: u16, body: &[u8]) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct Group {
        name: String,
    }
    #[derive(serde::Deserialize)]
    struct Groups {
        groups: Vec<Group>,
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        status: String,
        data: Option<Groups>,
        #[serde(default)]
        error: Option<String>,
    }
    let answer: Answer = serde_json::from_slice(body).map_err(|_| {
        let text: String = String::from_utf8_lossy(body).chars().take(120).collect();
        format!(
            "Prometheus' rules: HTTP {status}, and the answer is not Prometheus' JSON: {text:?}"
        )
    })?;
    match (answer.status.as_str(), answer.data) {
        ("success", Some(data)) => Ok(data.groups.into_iter().map(|g| g.name).collect()),
        _ => Err(format!(
            "Prometheus' rules: HTTP {status}: {}",
            answer.error.unwrap_or_else(|| "no data".into())
        )),
    }
}

#[async_trait::async_trait]
impl MetricsSource for Prometheus {
    async fn query_range(
        &self,
        promql: &str,
        start: chrono::DateTime<chrono::Utc>,
        end: chrono::DateTime<chrono::Utc>,
        step: std::time::Duration,
    ) -> Result<Vec<RangeSeries>, String> {
        let response = self
            .client
            .query_range(
                promql,
                start.timestamp(),
                end.timestamp(),
                step.as_secs_f64().max(0.001),
            )
            .timeout(self.timeout_ms)
            .get_raw()
            .await
            .map_err(|e| format!("Prometheus range query failed: {}", crate::error_chain(&e)))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| {
            format!(
                "Prometheus range query failed: reading its answer: {}",
                crate::error_chain(&e)
            )
        })?;
        read_range(promql, status, &body)
    }

    async fn rule_groups(&self) -> Result<Vec<String>, String> {
        let response = self
            .client
            .rules()
            .kind(prometheus_http_query::RuleKind::Alerting)
            .get_raw()
            .await
            .map_err(|e| format!("Prometheus' rules: {}", crate::error_chain(&e)))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| {
            format!(
                "Prometheus' rules: reading its answer: {}",
                crate::error_chain(&e)
            )
        })?;
        read_rule_groups(status, &body)
    }

    async fn query(&self, promql: &str) -> PromReading {
        let answer = self
            .client
            .query(promql)
            .timeout(self.timeout_ms)
            .get_raw()
            .await;
        let response = match answer {
            Ok(r) => r,
            Err(e) => {
                return PromReading::Failed(format!(
                    "Prometheus query failed: {}",
                    crate::error_chain(&e)
                ));
            }
        };
        let status = response.status().as_u16();
        match response.bytes().await {
            Ok(body) => read_answer(promql, status, &body),
            Err(e) => PromReading::Failed(format!(
                "Prometheus query failed: reading its answer: {}",
                crate::error_chain(&e)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_complete_range_vector_is_a_range_reading() {
        let matrix = r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"node":"w1"},"values":[[1,"0.5"],[2,"0.25"]]}]}}"#;
        let got = read_range("q", 200, matrix.as_bytes()).expect("a reading");
        assert_eq!(got[0].labels["node"], "w1");
        assert_eq!(got[0].values, vec![0.5, 0.25]);
        // (status, body, what the failure says)
        let cases = [
            (
                200,
                r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
                "must return a range vector",
            ),
            (
                400,
                r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
                "bad_data: parse error",
            ),
            (
                200,
                r#"{"status":"success","warnings":["shard down"],"data":{"resultType":"matrix","result":[]}}"#,
                "partial",
            ),
            (502, "Bad Gateway", "not Prometheus' JSON"),
        ];
        for (status, body, says) in cases {
            match read_range("q", status, body.as_bytes()) {
                Err(e) => assert!(e.contains(says), "{body}: {e}"),
                Ok(s) => panic!("{body}: read as {s:?}"),
            }
        }
    }

    #[test]
    fn only_a_complete_instant_vector_is_a_reading() {
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"alertname":"X"},"value":[1,"1"]}]}}"#;
        match read_answer("ALERTS", 200, vector.as_bytes()) {
            PromReading::Series(s) => assert_eq!(s[0].labels["alertname"], "X"),
            other => panic!("{other:?}"),
        }
        // (status, body, what the failure says)
        let cases = [
            (
                200,
                r#"{"status":"success","warnings":["shard 2 down"],"data":{"resultType":"vector","result":[]}}"#,
                "partial, with warnings: shard 2 down",
            ),
            (
                422,
                r#"{"status":"error","errorType":"execution","error":"too many samples"}"#,
                "HTTP 422: execution: too many samples",
            ),
            (502, "<html>bad gateway</html>", "not Prometheus' JSON"),
            (
                200,
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#,
                "instant vector",
            ),
            (200, r#"{"status":"success"}"#, "instant vector"),
        ];
        for (status, body, says) in cases {
            match read_answer("ALERTS", status, body.as_bytes()) {
                PromReading::Failed(why) => assert!(why.contains(says), "{body}: {why}"),
                other => panic!("{body} gave {other:?}"),
            }
        }
    }

    #[test]
    fn rule_groups_are_read_by_name_and_anything_else_is_an_error() {
        let loaded = r#"{"status":"success","data":{"groups":[{"name":"Upgrade Gates","file":"a.yml","rules":[]},{"name":"Rollgate","rules":[]}]}}"#;
        assert_eq!(
            read_rule_groups(200, loaded.as_bytes()),
            Ok(vec!["Upgrade Gates".to_owned(), "Rollgate".to_owned()])
        );
        let cases = [
            (
                503,
                r#"{"status":"error","errorType":"unavailable","error":"not ready"}"#,
                "HTTP 503: not ready",
            ),
            (200, r#"{"status":"success"}"#, "no data"),
            (502, "<html>bad gateway</html>", "not Prometheus' JSON"),
        ];
        for (status, body, says) in cases {
            match read_rule_groups(status, body.as_bytes()) {
                Err(why) => assert!(why.contains(says), "{body}: {why}"),
                Ok(groups) => panic!("{body} gave {groups:?}"),
            }
        }
    }
}
