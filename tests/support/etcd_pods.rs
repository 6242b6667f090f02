//! An etcd cluster that is a StatefulSet's pods: real members run by scripts, the fake API
//! server holding the StatefulSet (template moved on to `rev-2`, partition lock in place),
//! and its controller, which restarts a pod's member (SIGTERM, start again, Ready once
//! `/health` answers) when the partition drops to the pod's ordinal.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::kube::FakeKube;
use super::scripted::Scripted;

pub struct EtcdStatefulSet {
    pub cluster: Scripted,
    pub api: FakeKube,
    /// Pods the controller restarted, in order.
    pub restarts: Arc<Mutex<Vec<String>>>,
    pub kubeconfig: PathBuf,
}

impl EtcdStatefulSet {
    /// `n` pods `etcd-0..n` with leadership moved to `etcd-{leader}`.
    pub async fn start(n: usize, leader: usize) -> Self {
        Self::start_with(n, leader, true).await
    }

    /// As [`start`](Self::start); without `controller` nothing restarts a pod whose
    /// partition is lowered (a controller that is stuck, a pod that never comes back).
    pub async fn start_with(n: usize, leader: usize, controller: bool) -> Self {
        Self::start_in(FakeKube::start().await, n, leader, controller).await
    }

    /// As [`start_with`](Self::start_with), its StatefulSet and pods in `api`, beside
    /// whatever else that API server holds (a test ground's nodes).
    pub async fn start_in(api: FakeKube, n: usize, leader: usize, controller: bool) -> Self {
        let cluster = Scripted::start_pods(n, "etcd").await;
        let etcd = cluster.etcd();
        let members = etcd.members().await.unwrap();
        let id = members
            .iter()
            .find(|m| m.name == format!("etcd-{leader}"))
            .unwrap()
            .id;
        super::etcd::lead_to(&etcd, id).await;

        let replicas = u32::try_from(n).unwrap();
        api.add_statefulset("etcd", replicas, replicas, "rev-1", "rev-2");
        let dir = cluster.dir.path().to_owned();
        let endpoints: std::collections::HashMap<String, String> = cluster
            .names
            .iter()
            .cloned()
            .zip(cluster.endpoints.iter().cloned())
            .collect();
        let restarts = Arc::new(Mutex::new(Vec::new()));
        let seen = restarts.clone();
        if controller {
            api.run_statefulset_controller(move |pod| {
                seen.lock().unwrap().push(pod.to_owned());
                assert!(
                    Command::new(dir.join("restart.sh"))
                        .arg(pod)
                        .status()
                        .unwrap()
                        .success()
                );
                let health = format!("{}/health", endpoints[pod]);
                let started = Instant::now();
                while !Command::new("curl")
                    .args(["-sf", &health])
                    .output()
                    .is_ok_and(|o| o.status.success())
                {
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "{pod} did not come back"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
        let kubeconfig = cluster.dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig);
        Self {
            cluster,
            api,
            restarts,
            kubeconfig,
        }
    }

    pub fn restarted(&self) -> Vec<String> {
        self.restarts.lock().unwrap().clone()
    }

    pub fn partition(&self) -> serde_json::Value {
        self.api.statefulset("etcd")["spec"]["updateStrategy"]["rollingUpdate"]["partition"].clone()
    }

    /// Every pod runs the update revision.
    pub fn all_at_update_revision(&self) -> bool {
        let update = self.api.statefulset("etcd")["status"]["updateRevision"].clone();
        (0..self.cluster.names.len()).all(|i| {
            self.api.pod(&format!("etcd-{i}"))["metadata"]["labels"]["controller-revision-hash"]
                == update
        })
    }
}
