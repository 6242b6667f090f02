//! The test ground for Kubernetes upgrades: the fake API server with control planes and
//! workers, each backed by a real sshd with stub package tools; real etcd (one external
//! member beside a single control plane, or one stacked member per control plane); a real
//! Prometheus for the gate; a capture server standing in for Slack.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

use super::Rollgate;
use super::etcd;
use super::k3s::{Distro, ReleaseMirror};
use super::kube::{Change, FakeKube};
use super::nodes::{FakeNode, Packages, SharedSshd, SshClient};
use super::services::{MiniServer, Prometheus};
use super::stacked::StackedEtcd;

/// The ground's etcd.
pub enum GroundEtcd {
    /// One member beside the single control plane `cp` (not named after it).
    External(etcd::Cluster),
    /// One member per control plane, named after it.
    Stacked(StackedEtcd),
}

impl GroundEtcd {
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            Self::External(c) => c.endpoints(),
            Self::Stacked(c) => c.endpoints(),
        }
    }

    /// The external member's certificates, when it serves TLS.
    pub fn tls(&self) -> Option<&etcd::Certs> {
        match self {
            Self::External(c) => c.tls.as_ref(),
            Self::Stacked(_) => None,
        }
    }

    /// The stacked members; panics on the external ground.
    pub fn stacked(&self) -> &StackedEtcd {
        match self {
            Self::Stacked(c) => c,
            Self::External(_) => panic!("this ground's etcd is external"),
        }
    }
}

/// Metrics for Prometheus's scrape target: nodes that booted a day ago (no gate fires).
pub fn quiet_metrics() -> String {
    format!(
        "node_boot_time_seconds{{node=\"w1\"}} {}\n",
        chrono::Utc::now().timestamp() - 86_400
    )
}

/// How the ground's etcd runs.
enum Etcd {
    /// One external member, plain HTTP.
    Plain,
    /// One external member, TLS with client certificates.
    Tls,
    /// One member per control plane.
    Stacked,
}

pub struct Ground {
    /// With k3s or RKE2 nodes: the mirror of their releases.
    pub mirror: Option<ReleaseMirror>,
    pub api: FakeKube,
    pub nodes: Vec<FakeNode>,
    pub client: SshClient,
    /// The one sshd of the workers, when they share one ([`Ground::start_ha_shared`]).
    pub shared_sshd: Option<SharedSshd>,
    pub etcd: GroundEtcd,
    pub target: MiniServer,
    pub prom: Prometheus,
    pub slack: MiniServer,
    pub dir: tempfile::TempDir,
}

/// The workers' upgrade order given to rollgate, as in the reference pipeline.
pub const WORKER_ORDER: [&str; 4] = ["w4", "w3", "w2", "w1"];

impl Ground {
    /// A control plane `cp` with an external etcd member, and workers `w1..=workers`, all
    /// at `kubelet`.
    pub async fn start(kubelet: &str, workers: usize) -> Self {
        Self::build(kubelet, &["cp".to_owned()], workers, Etcd::Plain, |_| {
            Packages::Stubs
        })
        .await
    }

    /// As [`Ground::start`], each node with the real package tools `packages` gives it
    /// (`nodes::real_apt`, `nodes::real_dnf`), over repositories laid out as pkgs.k8s.io's.
    pub async fn start_with_packages(
        kubelet: &str,
        workers: usize,
        packages: fn(&str) -> Packages,
    ) -> Self {
        Self::build(kubelet, &["cp".to_owned()], workers, Etcd::Plain, packages).await
    }

    /// As [`Ground::start`], its etcd member serving clients over TLS with client
    /// certificates, as a kubeadm control plane's etcd does.
    pub async fn start_etcd_tls(kubelet: &str, workers: usize) -> Self {
        Self::build(kubelet, &["cp".to_owned()], workers, Etcd::Tls, |_| {
            Packages::Stubs
        })
        .await
    }

    /// Control planes `cp-1..=control_planes`, each with its stacked etcd member, and
    /// workers `w1..=workers`, all at `kubelet`.
    pub async fn start_ha(kubelet: &str, control_planes: usize, workers: usize) -> Self {
        let names: Vec<String> = (1..=control_planes).map(|i| format!("cp-{i}")).collect();
        Self::build(kubelet, &names, workers, Etcd::Stacked, |_| Packages::Stubs).await
    }

    /// As [`Ground::start_ha`], the workers on one [`SharedSshd`], each at its own loopback
    /// address: a ground of a thousand workers.
    pub async fn start_ha_shared(kubelet: &str, control_planes: usize, workers: usize) -> Self {
        let names: Vec<String> = (1..=control_planes).map(|i| format!("cp-{i}")).collect();
        let worker_names: Vec<String> = (1..=workers).map(|i| format!("w{i}")).collect();
        Self::build_nodes(
            kubelet,
            &names,
            &worker_names,
            Etcd::Stacked,
            |_| Packages::Stubs,
            None,
            true,
        )
        .await
    }

    /// A k3s or RKE2 cluster at `version` (its first build): servers
    /// `server-1..=servers`, each with its embedded etcd member (named as the distribution
    /// names it, `server-1-` and 8 hex digits), and agents `agent-1..=agents`; the nodes
    /// labelled and annotated as the distribution does; a mirror of its releases.
    pub async fn start_release(
        distro: Distro,
        version: &str,
        servers: usize,
        agents: usize,
    ) -> Self {
        let servers: Vec<String> = (1..=servers).map(|i| format!("server-{i}")).collect();
        let agents: Vec<String> = (1..=agents).map(|i| format!("agent-{i}")).collect();
        let release = distro.release(version);
        let mut ground = Self::build_nodes(
            &release[1..],
            &servers,
            &agents,
            Etcd::Stacked,
            match distro {
                Distro::K3s => |_: &str| Packages::Release(Distro::K3s),
                Distro::Rke2 => |_: &str| Packages::Release(Distro::Rke2),
            },
            Some(distro),
            false,
        )
        .await;
        ground.mirror = Some(ReleaseMirror::start(distro));
        ground
    }

    async fn build(
        kubelet: &str,
        control_planes: &[String],
        workers: usize,
        etcd: Etcd,
        packages: fn(&str) -> Packages,
    ) -> Self {
        let worker_names: Vec<String> = (1..=workers).map(|i| format!("w{i}")).collect();
        Self::build_nodes(
            kubelet,
            control_planes,
            &worker_names,
            etcd,
            packages,
            None,
            false,
        )
        .await
    }

    async fn build_nodes(
        kubelet: &str,
        control_planes: &[String],
        worker_names: &[String],
        etcd: Etcd,
        packages: fn(&str) -> Packages,
        distro: Option<Distro>,
        shared_workers: bool,
    ) -> Self {
        let stacked = matches!(etcd, Etcd::Stacked);
        let api = FakeKube::start().await;
        api.add_namespace("k8s-upgrade");
        // k3s runs its control plane in its own process: no static pods.
        let static_pods = distro != Some(Distro::K3s);
        let version = kubelet.split('+').next().unwrap_or(kubelet);
        for cp in control_planes {
            api.add_node(cp, true, kubelet, "1.7.20");
            if static_pods {
                api.add_static_pods(cp, version, stacked);
            }
        }
        for w in worker_names {
            api.add_node(w, false, kubelet, "1.7.20");
        }
        let member_name = move |node: &str| match distro {
            None => node.to_owned(),
            // As k3s and RKE2 name a member: the node and 8 hex digits of its own.
            Some(_) => {
                let digest = <sha2::Sha256 as sha2::Digest>::digest(node.as_bytes());
                format!(
                    "{node}-{:02x}{:02x}{:02x}{:02x}",
                    digest[0], digest[1], digest[2], digest[3]
                )
            }
        };
        if let Some(distro) = distro {
            for name in control_planes.iter().chain(worker_names) {
                let server = control_planes.contains(name);
                let member = member_name(name);
                api.edit_node(name, |n| super::k3s::label_node(n, distro, server, &member));
            }
        }
        let minor = kubelet
            .rsplit_once('.')
            .map(|(m, _)| m)
            .unwrap_or(kubelet)
            .to_owned();
        let etcd = match etcd {
            Etcd::Stacked => {
                GroundEtcd::Stacked(StackedEtcd::start_as(control_planes, member_name).await)
            }
            Etcd::Plain => GroundEtcd::External(etcd::Cluster::start(1).await),
            Etcd::Tls => GroundEtcd::External(etcd::Cluster::start_tls(1).await),
        };
        let client = SshClient::new();
        let shared_sshd = match shared_workers {
            true => Some(SharedSshd::start(&client).await),
            false => None,
        };
        let mut nodes = Vec::new();
        for (index, name) in control_planes.iter().chain(worker_names).enumerate() {
            api.add_node_agents(name);
            let node = match &shared_sshd {
                Some(sshd) if !control_planes.contains(name) => {
                    sshd.add(name, index, &api, &client, &minor)
                }
                _ => FakeNode::start_with(name, &api, &client, &minor, packages(name)).await,
            };
            if control_planes.contains(name) {
                let ctl = match &etcd {
                    GroundEtcd::Stacked(e) => Some(e.member(name).ctl()),
                    GroundEtcd::External(_) => None,
                };
                node.make_control_plane(ctl.as_deref());
            }
            nodes.push(node);
        }
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
            mirror: None,
            api,
            nodes,
            client,
            shared_sshd,
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
            (
                "ROLLGATE__CLUSTER__CONTROL_PLANE_HEALTH_TIMEOUT",
                "20s".into(),
            ),
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
        .chain(self.mirror.iter().flat_map(|m| {
            [
                (
                    "ROLLGATE__CLUSTER__DISTRIBUTION".to_owned(),
                    m.distro.name().to_owned(),
                ),
                ("ROLLGATE__CLUSTER__RELEASE_MIRROR".to_owned(), m.url()),
            ]
        }))
        .collect()
    }

    /// `rollgate serve` on this ground, with `extra` settings on top.
    pub async fn rollgate(&self, extra: &[(&str, String)]) -> Rollgate {
        let mut env = self.env();
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Rollgate::start(&env).await
    }

    /// `rollgate plan ARGS` against this ground: exit code, stdout, stderr.
    pub fn rollgate_plan(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = std::process::Command::new(super::rollgate_bin())
            .arg("plan")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(self.env())
            .output()
            .expect("rollgate plan");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Nodes in the order they were cordoned.
    pub fn cordon_order(&self) -> Vec<String> {
        self.api
            .changes()
            .iter()
            .filter_map(|c| match c {
                Change::Cordon(n) => Some(n.clone()),
                _ => None,
            })
            .collect()
    }

    /// The name of the pod labelled `app` on `node`.
    pub fn pod_named(&self, node: &str, app: &str) -> String {
        self.api
            .pods_on(node)
            .into_iter()
            .find(|p| p["metadata"]["labels"]["app"] == app)
            .and_then(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .unwrap_or_else(|| panic!("no {app} pod on {node}"))
    }

    /// The most workers cordoned at one time, from the API server's log of changes, and
    /// each set of workers cordoned together at that most.
    pub fn most_workers_cordoned_at_once(&self) -> (usize, Vec<BTreeSet<String>>) {
        let mut out = BTreeSet::new();
        let (mut most, mut peaks) = (0, Vec::new());
        for change in self.api.changes() {
            match change {
                Change::Cordon(n) if n.starts_with('w') || n.starts_with("agent-") => {
                    out.insert(n);
                }
                Change::Uncordon(n) => {
                    out.remove(&n);
                }
                _ => continue,
            }
            if out.len() > most {
                (most, peaks) = (out.len(), Vec::new());
            }
            if out.len() == most && !peaks.contains(&out) {
                peaks.push(out.clone());
            }
        }
        (most, peaks)
    }

    /// Asserts that the API server's own log never had two nodes cordoned at once (two
    /// runs under one cluster lock, each one node at a time).
    pub fn assert_one_node_down_at_a_time(&self) {
        let mut cordoned = BTreeSet::new();
        for change in self.api.changes() {
            match change {
                Change::Cordon(n) => {
                    cordoned.insert(n);
                }
                Change::Uncordon(n) => {
                    cordoned.remove(&n);
                }
                _ => {}
            }
            assert!(cordoned.len() <= 1, "cordoned together: {cordoned:?}");
        }
    }

    /// Asserts that every node runs `target` (its kubelet reported, its package installed)
    /// and is schedulable, without rollgate's cordon mark.
    pub fn assert_all_at(&self, target: &str) {
        for node in &self.nodes {
            let n = self.api.node(&node.name);
            assert_eq!(
                n["status"]["nodeInfo"]["kubeletVersion"],
                format!("v{target}"),
                "{}",
                node.name
            );
            assert!(
                n["spec"]["unschedulable"].is_null(),
                "{} left cordoned: {n}",
                node.name
            );
            assert!(
                n["metadata"]["annotations"]["rollgate.io/cordoned-by"].is_null(),
                "{n}"
            );
            assert!(node.installed("kubelet").starts_with(&format!("{target}-")));
        }
    }

    /// Asserts that every node was drained once around its work and none twice: a node
    /// whose own log shows a `kubeadm upgrade apply|node` or a reboot was cordoned exactly
    /// once (by the API server's log), each node cordoned at most once, and nothing
    /// cordoned or evicted on a node after its uncordon.
    pub fn assert_drained_once(&self) {
        let changes = self.api.changes();
        let mut cordons: std::collections::BTreeMap<String, usize> = Default::default();
        let mut uncordoned = std::collections::BTreeSet::new();
        for c in &changes {
            match c {
                Change::Uncordon(n) => {
                    uncordoned.insert(n.clone());
                }
                Change::Cordon(n) | Change::Evicted { node: n, .. } => {
                    assert!(
                        !uncordoned.contains(n),
                        "{n} was drained again after its uncordon: {changes:?}"
                    );
                    if matches!(c, Change::Cordon(_)) {
                        *cordons.entry(n.clone()).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        assert!(
            cordons.values().all(|n| *n == 1),
            "cordons per node: {cordons:?}"
        );
        for node in &self.nodes {
            let upgraded = node.calls().iter().any(|c| {
                [
                    "kubeadm upgrade apply",
                    "kubeadm upgrade node",
                    "systemctl restart k3s",
                ]
                .iter()
                .chain(&["systemctl restart rke2"])
                .any(|started| c.starts_with(started))
            });
            if upgraded || node.reboots() > 0 {
                assert_eq!(
                    cordons.get(&node.name),
                    Some(&1),
                    "{} was upgraded or rebooted (its own log) without one drain: {changes:?}",
                    node.name
                );
            }
        }
    }

    /// Asserts that no node was cordoned and no pod evicted, by the API server's log.
    pub fn assert_nothing_drained(&self) {
        let changes = self.api.changes();
        assert!(
            changes
                .iter()
                .all(|c| !matches!(c, Change::Cordon(_) | Change::Evicted { .. })),
            "a node was drained: {changes:?}"
        );
    }

    /// Asserts that no node had a package installed.
    pub fn assert_nothing_installed(&self) {
        for node in &self.nodes {
            let calls = node.calls();
            assert!(
                !calls
                    .iter()
                    .any(|c| c.starts_with("apt-get install") && !c.contains("--download-only")),
                "{}: {calls:?}",
                node.name
            );
        }
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
