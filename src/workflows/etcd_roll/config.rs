//! The etcd roll's settings (section `etcd_roll`): a key's doc comment is its
//! documentation.

use schemars::JsonSchema;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

use super::roll_watch::WatchTarget;
use crate::setting::{Around, Problems, Section, string_list};

/// How `serve` reaches the etcd clusters it rolls (section `etcd_roll`). The members and
/// the StatefulSet come with each request; the client certificates never do.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdRollConfig {
    /// PEM CA bundle, for `https://` members.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate.
    pub cert_file: Option<PathBuf>,
    /// PEM client key (a secret: a path).
    pub key_file: Option<PathBuf>,
    /// Bound on connecting and on every etcd request.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub timeout: Duration,
    /// How long a leadership transfer may take to be confirmed by a majority.
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::setting::schemas::duration")]
    pub transfer_timeout: Duration,
    /// StatefulSets `serve` rolls by itself, one roll per new revision of their template:
    /// `namespace/name`, or `namespace/name=http(s)://host:port` where the members answer
    /// (default: the StatefulSet's governing Service on port 2379). The roll's endpoints
    /// are the members' advertised client URLs (default: none watched).
    #[serde(deserialize_with = "string_list")]
    #[schemars(schema_with = "crate::setting::schemas::string_list")]
    pub watch: Vec<String>,
}

impl Default for EtcdRollConfig {
    fn default() -> Self {
        Self {
            ca_file: None,
            cert_file: None,
            key_file: None,
            timeout: Duration::from_secs(5),
            transfer_timeout: Duration::from_secs(15),
            watch: Vec::new(),
        }
    }
}

impl EtcdRollConfig {
    /// The watched StatefulSets, parsed (`check` has refused any that does not parse).
    pub fn watch_targets(&self) -> Vec<WatchTarget> {
        self.watch
            .iter()
            .filter_map(|raw| WatchTarget::parse(raw).ok())
            .collect()
    }
}

impl Section for EtcdRollConfig {
    fn check(&self, p: &mut Problems) {
        for raw in &self.watch {
            if let Err(e) = WatchTarget::parse(raw) {
                p.add("watch", e);
            }
        }
        p.tls_files(&self.ca_file, &self.cert_file, &self.key_file);
        p.duration("timeout", self.timeout, 100, 300_000);
        p.duration("transfer_timeout", self.transfer_timeout, 1000, 300_000);
    }

    fn summary(&self, around: &Around) -> Vec<(&'static str, String)> {
        let watched = self.watch_targets();
        let watch = match (watched.is_empty(), around.cluster_configured) {
            (true, _) => "none".to_owned(),
            (false, true) => watched
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            (false, false) => format!(
                "{} StatefulSet(s) named, but nothing is watched: set cluster.kubeconfig or cluster.in_cluster",
                watched.len()
            ),
        };
        let tls = if self.ca_file.is_some() {
            "configured"
        } else {
            "off (http:// members only)"
        };
        vec![
            ("etcd watch", watch),
            (
                "etcd rolls",
                format!(
                    "TLS {tls}, timeout {:?}, transfer timeout {:?}",
                    self.timeout, self.transfer_timeout
                ),
            ),
        ]
    }
}
