//! An upstream rollgate asked over HTTP(S) for its fleet view, with its token and CA read
//! from their files.

use std::path::PathBuf;
use std::time::Duration;

use super::http_client::{BuildError, HttpSource};
use crate::ports::FleetPeer;

/// One upstream rollgate's `GET /v1/fleet`.
pub struct HttpFleetPeer {
    url: String,
    client: reqwest::Client,
}

impl HttpFleetPeer {
    /// The peer at base URL `url`; `section` names its keys in errors (e.g.
    /// `fleet.upstreams[0].`). The files are read now, so a missing one stops `serve`.
    pub fn new(
        section: &str,
        url: &str,
        token_file: Option<&PathBuf>,
        ca_file: Option<&PathBuf>,
        timeout: Duration,
    ) -> Result<Self, BuildError> {
        let client = HttpSource {
            section,
            timeout,
            bearer_token_file: token_file,
            basic_auth_user: None,
            basic_auth_password_file: None,
            ca_file,
            identity: None,
        }
        .client()?;
        Ok(Self {
            url: format!("{}/v1/fleet", url.trim_end_matches('/')),
            client,
        })
    }
}

#[async_trait::async_trait]
impl FleetPeer for HttpFleetPeer {
    async fn fleet_view(&self) -> Result<serde_json::Value, String> {
        let response = self
            .client
            .get(&self.url)
            .send()
            .await
            .map_err(|e| crate::error_chain(&e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        let body = response.bytes().await.map_err(|e| crate::error_chain(&e))?;
        serde_json::from_slice(&body).map_err(|e| format!("its answer is not JSON: {e}"))
    }
}
