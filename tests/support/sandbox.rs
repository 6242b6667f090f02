//! The sandbox: a whole site on this machine for a newcomer to run rollgate against, built
//! from the test ground itself (`cargo run --example sandbox`, `scripts/serve.sh`). The
//! fake API server with control planes behind real sshd each and workers behind one
//! shared sshd (each at its own loopback address), all with the stub tools,
//! a real etcd member per control plane, a StatefulSet of real etcd members to roll,
//! Prometheus with the shipped rules, Alertmanager with the shipped receiver pointed at
//! rollgate, and a Pushgateway; every duration scaled by one factor, as in a rehearsal.
//! It writes a `rollgate.toml` for that site and an `env` file for the shell; everything
//! it started stops, by PID, when it is dropped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::etcd_pods::EtcdStatefulSet;
use super::free_port;
use super::ground::Ground;
use super::rehearsal::{self, Scale, Scrapes};
use super::services::{Alertmanager, Process, Pushgateway};

/// What the sandbox is told to be.
#[derive(Debug, Clone)]
pub struct Options {
    /// Control planes `cp-1..`, each with its stacked etcd member.
    pub control_planes: usize,
    /// Workers `w1..`.
    pub workers: usize,
    /// The version every node runs at first.
    pub kubelet: String,
    /// Where rollgate will listen, on loopback (`rollgate.toml`'s `server.listen`).
    pub rollgate_port: u16,
    /// Where the files for the newcomer go: `rollgate.toml`, `env`, tokens, the data dir.
    pub dir: PathBuf,
    /// Nodes whose reboot sentinel is set from the start.
    pub needing_reboot: Vec<String>,
    /// `cluster.max_unavailable`: workers in hand at once (`2`, `10%`).
    pub max_unavailable: String,
    /// The sandbox's time over real time.
    pub scale: Scale,
}

/// The sandbox's line on the status page and in `GET /v1/whoami`.
pub const BANNER: &str =
    "LOCAL SANDBOX: every node, etcd member and alert here is a stand-in on this machine";

/// The all-scopes token the sandbox writes (`server.token_file`).
pub const ADMIN_TOKEN: &str = "sandbox-admin-token-0123456789";

/// A running sandbox.
pub struct Sandbox {
    pub options: Options,
    pub ground: Ground,
    /// The StatefulSet of etcd members the tour rolls.
    pub etcd_roll: EtcdStatefulSet,
    pub prometheus: Process,
    pub prometheus_port: u16,
    pub alertmanager: Alertmanager,
    pub pushgateway: Pushgateway,
    /// How long it took to come up.
    pub started_in: Duration,
    _prometheus_dir: tempfile::TempDir,
}

impl Sandbox {
    /// Brings the whole site up and writes its files into `options.dir`.
    pub async fn start(options: Options) -> Self {
        let began = Instant::now();
        let dir = options.dir.clone();
        std::fs::create_dir_all(dir.join("clients")).expect("sandbox dir");
        let scale = options.scale;
        let ground =
            Ground::start_ha_shared(&options.kubelet, options.control_planes, options.workers)
                .await;
        for node in &options.needing_reboot {
            ground.node(node).need_reboot();
        }
        let etcd_roll = EtcdStatefulSet::start_in(ground.api.clone(), 3, 1, true).await;
        let pushgateway = Pushgateway::start().await;

        let prometheus_dir = tempfile::tempdir().expect("temp dir");
        let d = prometheus_dir.path();
        std::fs::write(d.join("rules.yml"), scale.rules()).expect("rules");
        std::fs::write(d.join("kube-token"), &ground.api.token).expect("token");
        let (prometheus_port, alertmanager_port) = (free_port(), free_port());
        let pushgateway_target = format!("127.0.0.1:{}", pushgateway.port);
        let prometheus = rehearsal::start_prometheus(
            d,
            &ground,
            (prometheus_port, alertmanager_port),
            &Scrapes {
                rollgate_port: options.rollgate_port,
                rollgate_https: false,
                pushgateway: Some(&pushgateway_target),
                nodes: &[],
            },
            scale,
        )
        .await;

        let alertmanager_token = dir.join("clients/alertmanager");
        std::fs::write(&alertmanager_token, "sandbox-alertmanager-0123456789\n").expect("token");
        std::fs::write(dir.join("admin-token"), format!("{ADMIN_TOKEN}\n")).expect("token");
        let alertmanager = Alertmanager::with_config(
            &rehearsal::alertmanager_config(
                &format!("http://127.0.0.1:{}/v1/alerts", options.rollgate_port),
                (&alertmanager_token, None),
                scale,
            ),
            alertmanager_port,
        )
        .await;
        // Six targets: the API server's three, etcd, the Pushgateway up; rollgate not yet.
        rehearsal::load_rules_once_scraped(d, (prometheus_port, alertmanager_port), (5, 6)).await;

        let mut sandbox = Self {
            options,
            ground,
            etcd_roll,
            prometheus,
            prometheus_port,
            alertmanager,
            pushgateway,
            started_in: Duration::ZERO,
            _prometheus_dir: prometheus_dir,
        };
        sandbox.write_files();
        sandbox.started_in = began.elapsed();
        sandbox
    }

    /// rollgate's address.
    pub fn rollgate_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.options.rollgate_port)
    }

    /// Alertmanager's address.
    pub fn alertmanager_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.alertmanager.port)
    }

    /// `rollgate.toml` in the sandbox's dir.
    pub fn config_file(&self) -> PathBuf {
        self.options.dir.join("rollgate.toml")
    }

    fn write_files(&self) {
        let dir = &self.options.dir;
        std::fs::write(self.config_file(), self.config()).expect("rollgate.toml");
        let kubeconfig = dir.join("kubeconfig");
        self.ground.api.write_tls_kubeconfig(&kubeconfig);
        let roll = serde_json::json!({
            "statefulset": "etcd",
            "namespace": "default",
            "endpoints": self.etcd_roll.cluster.endpoints,
        });
        std::fs::write(dir.join("etcd-roll.json"), format!("{roll}\n")).expect("etcd-roll.json");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let link = bin.join("rollgate");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(super::rollgate_bin(), &link).expect("rollgate link");
        let env = format!(
            "# The sandbox's shell settings: . {dir}/env\n\
             export ROLLGATE_CONFIG={config}\n\
             export KUBECONFIG={kubeconfig}\n\
             export PATH={bin}:$PATH\n\
             export ROLLGATE={rollgate}\n\
             export ALERTMANAGER={alertmanager}\n\
             export TOKEN={ADMIN_TOKEN}\n\
             export SANDBOX={dir}\n",
            dir = dir.display(),
            config = self.config_file().display(),
            kubeconfig = kubeconfig.display(),
            bin = bin.display(),
            rollgate = self.rollgate_url(),
            alertmanager = self.alertmanager_url(),
        );
        std::fs::write(dir.join("env"), env).expect("env");
        let nodes: String = self
            .ground
            .nodes
            .iter()
            .map(|n| format!("{}\t{}\n", n.name, n.dir.path().display()))
            .collect();
        std::fs::write(dir.join("nodes"), nodes).expect("nodes");
    }

    /// The `rollgate.toml` for this site: every timeline duration rollgate's default
    /// times the scale.
    pub fn config(&self) -> String {
        let o = &self.options;
        let dir = &o.dir;
        let q = |s: &str| toml::Value::String(s.to_owned()).to_string();
        let p = |p: &Path| q(&p.display().to_string());
        let mut sections: Vec<(&str, Vec<(String, String)>)> = vec![
            (
                "server",
                vec![
                    (
                        "listen".into(),
                        q(&format!("127.0.0.1:{}", o.rollgate_port)),
                    ),
                    ("token_file".into(), p(&dir.join("admin-token"))),
                    ("tokens_dir".into(), p(&dir.join("clients"))),
                    ("banner".into(), q(BANNER)),
                ],
            ),
            (
                "server.scopes",
                vec![("alertmanager".into(), "[\"alerts:write\"]".into())],
            ),
            (
                "gate",
                vec![(
                    "prometheus_url".into(),
                    q(&format!("http://127.0.0.1:{}", self.prometheus_port)),
                )],
            ),
            (
                "cluster",
                vec![
                    (
                        "kubeconfig".into(),
                        p(&self.ground.dir.path().join("kubeconfig")),
                    ),
                    ("max_unavailable".into(), q(&o.max_unavailable)),
                ],
            ),
            (
                "ssh",
                vec![
                    (
                        "user".into(),
                        q(&std::env::var("USER").unwrap_or_else(|_| "root".into())),
                    ),
                    ("key_file".into(), p(&self.ground.client.key)),
                    (
                        "known_hosts_file".into(),
                        p(&self.ground.client.known_hosts),
                    ),
                    (
                        "hosts".into(),
                        format!(
                            "[{}]",
                            self.ground
                                .nodes
                                .iter()
                                .map(|n| q(&n.host_entry()))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ),
                    ("connect_timeout".into(), q("5s")),
                ],
            ),
            (
                "etcd",
                vec![
                    (
                        "endpoints".into(),
                        format!(
                            "[{}]",
                            self.ground
                                .etcd
                                .endpoints()
                                .iter()
                                .map(|e| q(e))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ),
                    ("snapshot_dir".into(), p(&dir.join("snapshots"))),
                ],
            ),
            ("queue", vec![]),
            ("reboot", vec![]),
        ];
        for (env, value) in o.scale.rollgate_env() {
            let mut parts = env.trim_start_matches("ROLLGATE__").split("__");
            let (Some(section), Some(key)) = (parts.next(), parts.next()) else {
                panic!("{env} is not ROLLGATE__SECTION__KEY");
            };
            let (section, key) = (section.to_lowercase(), key.to_lowercase());
            let entries = &mut sections
                .iter_mut()
                .find(|(s, _)| *s == section)
                .unwrap_or_else(|| panic!("no [{section}] in the sandbox's config"))
                .1;
            entries.retain(|(k, _)| *k != key);
            entries.push((key, q(&value)));
        }
        let mut text = format!(
            "# rollgate's configuration for the LOCAL SANDBOX that `cargo run --example sandbox`\n\
             # (scripts/serve.sh) started: a fake API server, nodes behind sshd with stub tools,\n\
             # real etcd, Prometheus and Alertmanager, all on this machine.\n\
             #\n\
             # Time runs at 1/{divisor}: every duration below is its default divided by {divisor}\n\
             # (the 10-minute soak takes {soak}), and so are the shipped rules' waits in\n\
             # Prometheus and Alertmanager's timings, so that what a real site does in an hour\n\
             # happens here in half a minute, in the same order.\n\
             data_dir = {data}\n",
            divisor = (1.0 / o.scale.0).round(),
            soak = o.scale.text(Duration::from_secs(600)),
            data = p(&dir.join("data")),
        );
        for (section, entries) in sections {
            let _ = write!(text, "\n[{section}]\n");
            for (key, value) in entries {
                let _ = writeln!(text, "{key} = {value}");
            }
        }
        text
    }

    /// The node named `name`'s own directory (its logs and state).
    pub fn node_dir(&self, name: &str) -> PathBuf {
        self.ground.node(name).dir.path().to_owned()
    }
}
