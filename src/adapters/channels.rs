//! The channel server of k3s or RKE2 (`https://update.k3s.io/v1-release/channels`): one
//! JSON collection whose `data` lists each channel (`stable`, `latest`, one per minor such
//! as `v1.34`) with the release it names as its latest.

use std::time::Duration;

use serde::Deserialize;

use crate::ports::{Channel, Failure, ReleaseChannels, RepoError};

/// Largest answer read: the real one is a few KB.
const MAX_BYTES: usize = 1 << 20;

/// A channel server.
pub struct ChannelServer {
    url: String,
    http: reqwest::Client,
}

impl ChannelServer {
    /// The channel server whose collection is at `url`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, RepoError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| failed(url, Failure::caused("no HTTP client", e)))?;
        Ok(Self {
            url: url.to_owned(),
            http,
        })
    }
}

fn failed(url: &str, failure: Failure) -> RepoError {
    RepoError {
        what: "channel server",
        url: url.to_owned(),
        failure,
    }
}

#[derive(Deserialize)]
struct Collection {
    data: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    latest: String,
}

/// The channels of a channel server's answer.
pub fn parse(body: &[u8]) -> Result<Vec<Channel>, String> {
    let collection: Collection =
        serde_json::from_slice(body).map_err(|e| format!("not a channel collection: {e}"))?;
    Ok(collection
        .data
        .into_iter()
        .map(|e| Channel {
            name: if e.name.is_empty() { e.id } else { e.name },
            latest: e.latest,
        })
        .collect())
}

#[async_trait::async_trait]
impl ReleaseChannels for ChannelServer {
    async fn channels(&self) -> Result<Vec<Channel>, RepoError> {
        let response = self
            .http
            .get(&self.url)
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| failed(&self.url, Failure::caused("no answer", e.without_url())))?;
        let status = response.status();
        if !status.is_success() {
            return Err(failed(
                &self.url,
                Failure::new(format!("answered {status}")),
            ));
        }
        let body = response.bytes().await.map_err(|e| {
            failed(
                &self.url,
                Failure::caused("answer cut short", e.without_url()),
            )
        })?;
        if body.len() > MAX_BYTES {
            return Err(failed(
                &self.url,
                Failure::new(format!(
                    "answer of {} bytes, more than {MAX_BYTES}",
                    body.len()
                )),
            ));
        }
        parse(&body).map_err(|why| failed(&self.url, Failure::new(why)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collection_as_update_k3s_io_serves_it() {
        let body = br#"{"type":"collection","links":{"self":"https://update.k3s.io/v1-release/channels"},"actions":{},"resourceType":"channel","data":[
            {"id":"stable","type":"channel","links":{"self":"https://update.k3s.io/v1-release/channels/stable"},"name":"stable","latest":"v1.33.5+k3s1"},
            {"id":"v1.34","type":"channel","links":{"self":"https://update.k3s.io/v1-release/channels/v1.34"},"name":"v1.34","latest":"v1.34.1+k3s1","latestRegexp":"v1\\.34\\..*","excludeRegexp":"^[^+]+-"}]}"#;
        assert_eq!(
            parse(body).expect("parsed"),
            [
                Channel {
                    name: "stable".into(),
                    latest: "v1.33.5+k3s1".into()
                },
                Channel {
                    name: "v1.34".into(),
                    latest: "v1.34.1+k3s1".into()
                },
            ]
        );
        assert!(parse(b"<html>").is_err());
        assert!(parse(br#"{"data": 3}"#).is_err());
    }
}
