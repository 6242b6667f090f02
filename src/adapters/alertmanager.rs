//! Alertmanager's API v2 as a gate source: the alerts it holds active, neither silenced
//! nor inhibited, that meet the board's matchers (`GET /api/v2/alerts`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::http_client::{BuildError, HttpSource};
use crate::config::GateSettings;
use crate::domain::alert::{Alert, AlertStatus};
use crate::domain::self_silence::{CREATED_BY, SilencePlan};
use crate::ports::{AlertSource, Silences};

/// One Alertmanager (or the load-balanced address of a cluster of them).
pub struct AlertmanagerApi {
    http: reqwest::Client,
    url: String,
    filters: Vec<String>,
}

/// An alert as `GET /api/v2/alerts` lists it (the fields the gate reads).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Listed {
    fingerprint: String,
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    starts_at: DateTime<Utc>,
    status: ListedStatus,
}

#[derive(Deserialize)]
struct ListedStatus {
    state: String,
}

impl AlertmanagerApi {
    /// A client for `url` with the gate's Alertmanager settings.
    pub fn new(url: &str, settings: &GateSettings) -> Result<Self, BuildError> {
        let http = HttpSource {
            section: "gate.alertmanager_",
            timeout: settings.timeout,
            bearer_token_file: settings.alertmanager_bearer_token_file.as_ref(),
            basic_auth_user: settings.alertmanager_basic_auth_user.as_ref(),
            basic_auth_password_file: settings.alertmanager_basic_auth_password_file.as_ref(),
            ca_file: settings.alertmanager_ca_file.as_ref(),
            identity: None,
        }
        .client()?;
        Ok(Self {
            http,
            url: url.trim_end_matches('/').to_owned(),
            filters: settings
                .board_matchers
                .iter()
                .map(|m| m.to_alertmanager())
                .collect(),
        })
    }
}

#[async_trait::async_trait]
impl AlertSource for AlertmanagerApi {
    async fn active(&self) -> Result<Vec<Alert>, String> {
        let mut query: Vec<(&str, &str)> = vec![
            ("active", "true"),
            ("silenced", "false"),
            ("inhibited", "false"),
            ("unprocessed", "true"),
        ];
        query.extend(self.filters.iter().map(|f| ("filter", f.as_str())));
        let request = self
            .http
            .get(format!("{}/api/v2/alerts", self.url))
            .query(&query);
        let listed: Vec<Listed> = self.call(request, "list alerts").await?;
        Ok(listed
            .into_iter()
            // Belt and braces: what the query asked for, whatever the server did with it.
            .filter(|a| a.status.state != "suppressed")
            .map(|a| Alert {
                fingerprint: a.fingerprint,
                status: AlertStatus::Firing,
                labels: a.labels,
                annotations: a.annotations,
                starts_at: a.starts_at,
                ends_at: None,
            })
            .collect())
    }

    async fn lists(&self, alertname: &str) -> Result<bool, String> {
        let filter = format!("alertname={alertname:?}");
        let request = self
            .http
            .get(format!("{}/api/v2/alerts", self.url))
            .query(&[("active", "true"), ("filter", filter.as_str())]);
        let listed: Vec<Listed> = self.call(request, "list the watchdog").await?;
        Ok(listed
            .iter()
            .any(|a| a.labels.get("alertname").map(String::as_str) == Some(alertname)))
    }

    fn describe(&self) -> String {
        format!(
            "{}/api/v2/alerts?filter={}",
            self.url,
            self.filters.join(",")
        )
    }
}

/// A silence as `GET /api/v2/silences` lists it (the fields rollgate reads).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedSilence {
    id: String,
    created_by: String,
    comment: String,
    starts_at: DateTime<Utc>,
    status: ListedStatus,
}

impl AlertmanagerApi {
    /// Sends `request` and reads its JSON answer; the error names Alertmanager and `what`.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, String> {
        let failed = |e: reqwest::Error| {
            format!(
                "Alertmanager at {}: {what}: {}",
                self.url,
                crate::error_chain(&e)
            )
        };
        request
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?
            .json()
            .await
            .map_err(failed)
    }
}

#[async_trait::async_trait]
impl Silences for AlertmanagerApi {
    async fn keep(&self, plan: &SilencePlan, until: DateTime<Utc>) -> Result<String, String> {
        let listed: Vec<ListedSilence> = self
            .call(
                self.http.get(format!("{}/api/v2/silences", self.url)),
                "list silences",
            )
            .await?;
        let mine = listed.into_iter().find(|s| {
            s.created_by == CREATED_BY
                && s.comment == plan.comment
                && matches!(s.status.state.as_str(), "active" | "pending")
        });
        let matchers: Vec<serde_json::Value> = plan
            .matchers
            .iter()
            .map(|m| {
                serde_json::json!({
                    "name": m.name, "value": m.value,
                    "isRegex": m.is_regex(), "isEqual": m.is_equal(),
                })
            })
            .collect();
        let mut body = serde_json::json!({
            "matchers": matchers,
            "startsAt": mine.as_ref().map_or_else(Utc::now, |s| s.starts_at).to_rfc3339(),
            "endsAt": until.to_rfc3339(),
            "createdBy": CREATED_BY,
            "comment": plan.comment,
        });
        if let Some(mine) = &mine {
            body["id"] = mine.id.clone().into();
        }
        let request = self
            .http
            .post(format!("{}/api/v2/silences", self.url))
            .json(&body);
        let answer: serde_json::Value = self.call(request, "keep a silence").await?;
        answer["silenceID"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("Alertmanager at {} gave no silence id", self.url))
    }
}
