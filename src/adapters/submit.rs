//! How `rollgate detect` hands its requests over: `POST /v1/<door>` (detections,
//! reboots), or CloudEvents on the AMQP exchange.

use chrono::Utc;
use std::sync::Arc;

use crate::domain::event::{CloudEvent, EventData};
use crate::domain::run_request::{RunAsked, RunDoor, RunRequest};
use crate::ports::{Failure, Submitted, Submitter};
use crate::queue::{Outgoing, Queue};

/// `POST /v1/<door>`.
pub struct HttpSubmitter {
    /// rollgate's base URL.
    pub url: String,
    /// The API token (read from a file; never logged).
    pub token: String,
    /// The client, with its timeout.
    pub http: reqwest::Client,
}

impl HttpSubmitter {
    /// Posts `body` to `path`; what rollgate answered.
    async fn post(&self, path: &str, body: &serde_json::Value) -> Result<Submitted, Failure> {
        let url = format!("{}{path}", self.url);
        let response = self
            .http
            .post(&url)
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .map_err(|e| Failure::caused(url.clone(), e.without_url()))?;
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let field = |name: &str| body[name].as_str().unwrap_or_default().to_owned();
        match status {
            202 => Ok(Submitted::Created {
                run_id: field("run_id"),
            }),
            200 => Ok(Submitted::InFlight {
                run_id: field("run_id"),
            }),
            409 => Ok(Submitted::Held {
                message: field("message"),
            }),
            other => Err(Failure::new(format!(
                "{url}: HTTP {other}: {}",
                field("message")
            ))),
        }
    }
}

#[async_trait::async_trait]
impl Submitter for HttpSubmitter {
    async fn submit(
        &self,
        door: &'static RunDoor,
        request: Arc<dyn RunRequest>,
    ) -> Result<Submitted, Failure> {
        self.post(&format!("/v1/{}", door.path), &request.to_json())
            .await
    }
}

/// A CloudEvent (`rollgate.detection.v1`, `rollgate.reboot.v1`) on the exchange.
pub struct AmqpSubmitter(pub Arc<dyn Queue>);

#[async_trait::async_trait]
impl Submitter for AmqpSubmitter {
    async fn submit(
        &self,
        door: &'static RunDoor,
        request: Arc<dyn RunRequest>,
    ) -> Result<Submitted, Failure> {
        let data = EventData::Run(RunAsked {
            door,
            run_id: None,
            request,
        });
        let event = CloudEvent::new(&data, "rollgate-detect", Utc::now());
        self.0
            .publish(Outgoing::event(&event, data.event_type()))
            .await
            .map_err(|e| Failure::caused("publish to the exchange", e))?;
        Ok(Submitted::Published { event_id: event.id })
    }
}
