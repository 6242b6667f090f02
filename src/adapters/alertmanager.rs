//! Alertmanager's API v2 as a gate source: the alerts it holds active, neither silenced
//! nor inhibited, that meet the board's matchers (`GET /api/v2/alerts`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::http_client::{BuildError, HttpSource};
use crate::config::GateSettings;
use crate::domain::alert::{Alert, AlertStatus};
use crate::ports::AlertSource;

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
        let answer = self
            .http
            .get(format!("{}/api/v2/alerts", self.url))
            .query(&query)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("Alertmanager at {}: {}", self.url, crate::error_chain(&e)))?;
        let listed: Vec<Listed> = answer.json().await.map_err(|e| {
            format!(
                "Alertmanager at {} answered something that is not its alert list: {e}",
                self.url
            )
        })?;
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

    fn describe(&self) -> String {
        format!(
            "{}/api/v2/alerts?filter={}",
            self.url,
            self.filters.join(",")
        )
    }
}
