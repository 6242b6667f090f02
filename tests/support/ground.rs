//! The test ground for Kubernetes upgrades: the fake API server with one control plane and
//! workers, each backed by a real sshd with stub package tools; a real etcd member for the
//! snapshot; a real Prometheus for the gate; a capture server standing in for Slack.

use serde_json::Value;
use std::path::PathBuf;

use super::etcd;
use super::kube::FakeKube;
use super::nodes::{FakeNode, SshClient};
use super::services::{MiniServer, Prometheus};

/// Metrics for Prometheus's scrape target: nodes that booted a day ago (no gate fires).
pub fn quiet_metrics() -> String {
    format!(
        "node_boot_time_seconds{{node=\"w1\"}} {}\n",
        chrono::Utc::now().timestamp() - 86_400
    )
}

pub struct Ground {
    pub api: FakeKube,
    pub nodes: Vec<FakeNode>,
    pub client: SshClient,
    pub etcd: etcd::Cluster,
    pub target: MiniServer,
    pub prom: Prometheus,
    pub slack: MiniServer,
    pub dir: tempfile::TempDir,
}

/// The workers' upgrade order given to rollgate, as in the reference pipeline.
pub const WORKER_ORDER: [&str; 4] = ["w4", "w3", "w2", "w1"];

impl Ground {
    /// A control plane `cp` and workers `w1..=workers`, all at `kubelet`.
    pub async fn start(kubelet: &str, workers: usize) -> Self {
        let api = FakeKube::start().await;
        api.add_namespace("k8s-upgrade");
        api.add_node("cp", true, kubelet, "1.7.20");
        for i in 1..=workers {
            api.add_node(&format!("w{i}"), false, kubelet, "1.7.20");
        }
        let minor = kubelet
            .rsplit_once('.')
            .map(|(m, _)| m)
            .unwrap_or(kubelet)
            .to_owned();
        let client = SshClient::new();
        let mut nodes = Vec::new();
        for name in std::iter::once("cp".to_owned()).chain((1..=workers).map(|i| format!("w{i}"))) {
            api.add_node_agents(&name);
            nodes.push(FakeNode::start(&name, &api, &client, &minor).await);
        }
        let etcd = etcd::Cluster::start(1).await;
        let target = MiniServer::start().await;
        target.set_metrics(&quiet_metrics());
        let prom = Prometheus::start(&target.address()).await;
        let slack = MiniServer::start().await;
        let dir = tempfile::tempdir().expect("temp dir");
        api.write_kubeconfig(&dir.path().join("kubeconfig"));
        std::fs::write(
            dir.path().join("slack-url"),
            format!("http://{}/hook", slack.address()),
        )
        .expect("slack url");
        Self {
            api,
            nodes,
            client,
            etcd,
            target,
            prom,
            slack,
            dir,
        }
    }

    pub fn node(&self, name: &str) -> &FakeNode {
        self.nodes.iter().find(|n| n.name == name).expect("node")
    }

    pub fn snapshot_dir(&self) -> PathBuf {
        self.dir.path().join("snapshots")
    }

    /// The workers of this ground in [`WORKER_ORDER`].
    pub fn worker_order(&self) -> Vec<&str> {
        WORKER_ORDER
            .into_iter()
            .filter(|w| self.nodes.iter().any(|n| n.name == *w))
            .collect()
    }

    /// The rollgate environment for this ground.
    pub fn env(&self) -> Vec<(String, String)> {
        let hosts: Vec<String> = self.nodes.iter().map(FakeNode::host_entry).collect();
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        [
            (
                "ROLLGATE__CLUSTER__KUBECONFIG",
                self.dir.path().join("kubeconfig").display().to_string(),
            ),
            (
                "ROLLGATE__CLUSTER__WORKER_ORDER",
                self.worker_order().join(","),
            ),
            ("ROLLGATE__CLUSTER__SOAK", "1s".into()),
            ("ROLLGATE__CLUSTER__VERIFY_TIMEOUT", "20s".into()),
            ("ROLLGATE__CLUSTER__DRAIN_TIMEOUT", "20s".into()),
            ("ROLLGATE__CLUSTER__EVICTION_RETRY", "200ms".into()),
            ("ROLLGATE__SSH__USER", user),
            (
                "ROLLGATE__SSH__KEY_FILE",
                self.client.key.display().to_string(),
            ),
            (
                "ROLLGATE__SSH__KNOWN_HOSTS_FILE",
                self.client.known_hosts.display().to_string(),
            ),
            ("ROLLGATE__SSH__HOSTS", hosts.join(",")),
            ("ROLLGATE__SSH__CONNECT_TIMEOUT", "5s".into()),
            ("ROLLGATE__SSH__COMMAND_TIMEOUT", "60s".into()),
            ("ROLLGATE__ETCD__ENDPOINTS", self.etcd.endpoints().join(",")),
            (
                "ROLLGATE__ETCD__SNAPSHOT_DIR",
                self.snapshot_dir().display().to_string(),
            ),
            ("ROLLGATE__GATE__PROMETHEUS_URL", self.prom.url()),
            ("ROLLGATE__GATE__POLL_INTERVAL", "300ms".into()),
            ("ROLLGATE__GATE__TIMEOUT", "2s".into()),
            (
                "ROLLGATE__NOTIFY__SLACK_WEBHOOK_FILE",
                self.dir.path().join("slack-url").display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The Slack messages received so far, as text.
    pub fn slack_texts(&self) -> Vec<String> {
        self.slack
            .received()
            .iter()
            .filter_map(|m: &Value| m["text"].as_str().map(str::to_owned))
            .collect()
    }
}
