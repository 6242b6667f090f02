//! The queue's settings (section `queue`): which backend carries events and how it is
//! reached. The configuration assembles this section with the others.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

use crate::setting::Problems;

/// Which queue backend carries events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QueueBackend {
    /// On-disk SQLite queue under `data_dir` (default).
    Embedded,
    /// RabbitMQ through lapin.
    Amqp,
}

/// Queue settings (section `queue`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct QueueSettings {
    /// `embedded` (default) or `amqp`.
    pub backend: QueueBackend,
    /// Broker address, without a password (default `amqp://127.0.0.1:5672/%2f`, which
    /// logs in as guest).
    pub amqp_url: String,
    /// File holding `user:password` for the broker.
    pub amqp_credentials_file: Option<PathBuf>,
    /// Topic exchange events are published to (default `rollgate`).
    pub exchange: String,
    /// Quorum queue the worker consumes (default `rollgate.events`).
    pub queue: String,
    /// Where poison messages go (default `rollgate.dead`).
    pub dead_queue: String,
    /// Unacknowledged deliveries the broker may push (default 8).
    pub prefetch: u16,
    /// Deliveries of one message before it is dead-lettered (default 10).
    pub delivery_limit: u32,
    /// Bound on one broker connect attempt (default `3s`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub connect_timeout: Duration,
    /// How long an embedded delivery stays leased before redelivery (default `10m`).
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub lease: Duration,
    /// With the embedded queue, the free space intake keeps under `data_dir`, in bytes
    /// (default 64 MiB; 0 keeps none): below it new events are refused (503 with
    /// `Retry-After`), so that the runs in hand can still record their progress.
    pub min_free_bytes: u64,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            backend: QueueBackend::Embedded,
            amqp_url: "amqp://127.0.0.1:5672/%2f".into(),
            amqp_credentials_file: None,
            exchange: "rollgate".into(),
            queue: "rollgate.events".into(),
            dead_queue: "rollgate.dead".into(),
            prefetch: 8,
            delivery_limit: 10,
            connect_timeout: Duration::from_secs(3),
            lease: Duration::from_secs(600),
            min_free_bytes: 64 << 20,
        }
    }
}

impl QueueSettings {
    /// Every problem of the section, in `p`.
    pub fn check(&self, p: &mut Problems) {
        match self.amqp_url.parse::<lapin::uri::AMQPUri>() {
            Ok(_) if self.amqp_url.contains('@') => p.add(
                "amqp_url",
                "must not carry credentials; put user:password in the file named by queue.amqp_credentials_file",
            ),
            Ok(_) => {}
            Err(_) => p.add(
                "amqp_url",
                "is not an AMQP URL like amqp://127.0.0.1:5672/%2f",
            ),
        }
        p.path("amqp_credentials_file", self.amqp_credentials_file.as_ref());
        p.name("exchange", &self.exchange);
        p.name("queue", &self.queue);
        p.name("dead_queue", &self.dead_queue);
        p.range("prefetch", self.prefetch, 1, 1000);
        p.range("delivery_limit", self.delivery_limit, 1, 1000);
        p.duration("connect_timeout", self.connect_timeout, 100, 120_000);
        p.duration("lease", self.lease, 1000, 24 * 3_600_000);
        p.range("min_free_bytes", self.min_free_bytes, 0, 1 << 40);
    }
}
