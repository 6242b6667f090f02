//! The least a `rollgate serve` needs to take Kubernetes upgrade requests: the fake API
//! server with a control plane and a worker at 1.34.2, one real etcd member, an SSH key and
//! a known_hosts file. No node answers SSH and no Prometheus is configured, so every run
//! holds at its pre-flight gate (unknown is closed): where tests of the API, the queue and
//! crash safety want a run that stays unfinished.

use super::Rollgate;
use super::etcd;
use super::kube::FakeKube;
use super::nodes::SshClient;

pub struct IntakeCluster {
    pub api: FakeKube,
    pub etcd: etcd::Cluster,
    pub ssh: SshClient,
    dir: tempfile::TempDir,
}

impl IntakeCluster {
    pub async fn start() -> Self {
        let api = FakeKube::start().await;
        api.add_namespace("k8s-upgrade");
        api.add_node("cp", true, "1.34.2", "1.7.20");
        api.add_static_pods("cp", "1.34.2", false);
        api.add_node("w1", false, "1.34.2", "1.7.20");
        let etcd = etcd::Cluster::start(1).await;
        let dir = tempfile::tempdir().expect("temp dir");
        api.write_kubeconfig(&dir.path().join("kubeconfig"));
        Self {
            api,
            etcd,
            ssh: SshClient::new(),
            dir,
        }
    }

    /// The settings that give `serve` this cluster.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            (
                "ROLLGATE__CLUSTER__KUBECONFIG",
                self.dir.path().join("kubeconfig").display().to_string(),
            ),
            (
                "ROLLGATE__SSH__KEY_FILE",
                self.ssh.key.display().to_string(),
            ),
            (
                "ROLLGATE__SSH__KNOWN_HOSTS_FILE",
                self.ssh.known_hosts.display().to_string(),
            ),
            ("ROLLGATE__ETCD__ENDPOINTS", self.etcd.endpoints().join(",")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// `rollgate serve` on this cluster, with `extra` settings on top.
    pub async fn rollgate(&self, extra: &[(&str, &str)]) -> Rollgate {
        let mut env = self.env();
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Rollgate::start(&env).await
    }
}
