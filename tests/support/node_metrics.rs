//! One small exporter per node, as a real cluster's per-node exporters are, for the batch
//! analyses: each serves `node_request_latency_p99_seconds`, the p99 latency of the
//! requests its pods serve. Nodes differ in level (each its own base) and every scrape
//! has its own noise. From the moment a node's kubelet reports the target version (read
//! from the fake API server at each scrape), its exporter says what `Upgraded` says.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::kube::FakeKube;

/// The metric every exporter serves.
pub const METRIC: &str = "node_request_latency_p99_seconds";

/// What a node's exporter says once its kubelet runs the target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Upgraded {
    /// The same as before: no regression.
    Same,
    /// Latency times this factor (1.3: 30 % slower).
    Slower(f64),
    /// No series at all: the query returns nothing for the node.
    Silent,
}

/// Every node's exporter.
pub struct NodeExporters {
    /// `(node, address)` of each, for [`super::services::Prometheus::scrape_nodes`].
    pub targets: Vec<(String, String)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Each scrape's noise: ±`NOISE` around the node's level, uniform.
const NOISE: f64 = 0.05;

impl NodeExporters {
    /// An exporter for each of `nodes`, on loopback: a node whose kubelet reports `target`
    /// serves what `upgraded` says.
    pub async fn start(api: &FakeKube, nodes: &[String], target: &str, upgraded: Upgraded) -> Self {
        let mut targets = Vec::new();
        let mut tasks = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let address = listener.local_addr().expect("addr").to_string();
            targets.push((node.clone(), address));
            let exporter = Exporter {
                api: api.clone(),
                node: node.clone(),
                target: format!("v{}", target.trim_start_matches('v')),
                upgraded,
                level: 0.100 + 0.010 * i as f64,
                scrapes: Arc::new(AtomicU64::new(i as u64 * 7919)),
            };
            tasks.push(tokio::spawn(exporter.serve(listener)));
        }
        Self { targets, tasks }
    }
}

impl Drop for NodeExporters {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[derive(Clone)]
struct Exporter {
    api: FakeKube,
    node: String,
    target: String,
    upgraded: Upgraded,
    level: f64,
    scrapes: Arc<AtomicU64>,
}

impl Exporter {
    async fn serve(self, listener: tokio::net::TcpListener) {
        while let Ok((mut sock, _)) = listener.accept().await {
            let me = self.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut chunk = [0u8; 2048];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = me.exposition();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(answer.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    }

    /// This scrape's text: the node's level, its noise, and what its version makes it.
    fn exposition(&self) -> String {
        let node = self.api.node(&self.node);
        let upgraded = node["status"]["nodeInfo"]["kubeletVersion"] == self.target.as_str();
        let factor = match (upgraded, self.upgraded) {
            (false, _) | (true, Upgraded::Same) => 1.0,
            (true, Upgraded::Slower(f)) => f,
            (true, Upgraded::Silent) => return String::new(),
        };
        let n = self.scrapes.fetch_add(1, Ordering::Relaxed);
        let value = self.level * factor * (1.0 + NOISE * (2.0 * uniform(n) - 1.0));
        format!("# TYPE {METRIC} gauge\n{METRIC} {value}\n")
    }
}

/// A uniform number in [0, 1) from `n` (splitmix64): the same noise on every run.
fn uniform(n: u64) -> f64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}
