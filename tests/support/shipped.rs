//! The shipped site on the test ground: an overlay of deploy/ as `kubectl kustomize`
//! renders it, run as an adopter runs it.
//!
//! The rendered rollgate.toml changes only where a test ground must differ from a site:
//! - addresses and ports (the listener, Prometheus, Alertmanager, the Pushgateway, etcd,
//!   RabbitMQ and PostgreSQL, an upstream), the broker's and database's names, and the
//!   nodes' names and SSH addresses (the ground's `w1…` for the site's workers, by
//!   position in `cluster.worker_order`) and the SSH login;
//! - file paths: every path under a mount of the pod is the same file in the site's temp
//!   dir (`/var/run/secrets/rollgate/ssh-key` is `secrets/ssh-key`), written with the
//!   ground's key, known hosts, etcd certificates, tokens and a certificate issued for
//!   exactly the names of the overlay's Certificate;
//! - `cluster.in_cluster`, which needs a pod, becomes the ground's kubeconfig;
//! - the maintenance windows become one window open now (a test does not choose its
//!   moment), and the reboot sentinel is the fake node's file;
//! - every timeline duration, set or default, is scaled by the rehearsal's one factor
//!   ([`SCALE`](super::rehearsal::SCALE)); bounds on one request are not.
//!
//! Every container's environment is the rendered one, its paths mapped the same way.

use serde_json::Value;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::Rollgate;
use super::free_port;
use super::ground::Ground;
use super::manifests::kustomize;
use super::pki::TestCa;
use super::postgres::Postgres;
use super::rabbit;
use super::rehearsal::{Scale, alertmanager_config, scale_ranges, scaled};
use super::services::{Alertmanager, Pushgateway};

/// An overlay as `kubectl kustomize` built it.
pub struct Rendered {
    pub name: String,
    pub dir: tempfile::TempDir,
    pub docs: Vec<Value>,
}

impl Rendered {
    pub fn of(overlay: &str) -> Self {
        let (dir, docs) = kustomize(overlay);
        Self {
            name: overlay.to_owned(),
            dir,
            docs,
        }
    }

    fn object(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{}: no {kind} {name}", self.name))
    }

    /// The site's rollgate.toml, as the ConfigMap carries it.
    pub fn config(&self) -> String {
        self.object("ConfigMap", "rollgate")["data"]["rollgate.toml"]
            .as_str()
            .expect("rollgate.toml")
            .to_owned()
    }

    /// The first container of the StatefulSet's pod.
    fn serve_container(&self) -> &Value {
        &self.object("StatefulSet", "rollgate")["spec"]["template"]["spec"]["containers"][0]
    }

    /// The detection CronJob's container.
    fn detect_container(&self) -> &Value {
        &self.object("CronJob", "rollgate-detect")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            ["containers"][0]
    }

    /// The CronJob's arguments, as rendered.
    pub fn cronjob_args(&self) -> Vec<String> {
        strings(&self.detect_container()["args"])
    }

    /// The clients the rollgate-clients Secret holds a token for.
    pub fn clients(&self) -> Vec<String> {
        self.object("Secret", "rollgate-clients")["data"]
            .as_object()
            .expect("the clients' tokens")
            .keys()
            .cloned()
            .collect()
    }

    /// The names the Certificate asks for: DNS names and IP addresses.
    pub fn certificate_names(&self) -> (Vec<String>, Vec<IpAddr>) {
        let spec = &self.object("Certificate", "rollgate")["spec"];
        let ips = strings(&spec["ipAddresses"])
            .iter()
            .map(|ip| ip.parse().expect("an IP address"))
            .collect();
        (strings(&spec["dnsNames"]), ips)
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// The pod's mounts and where the site keeps each: the longest prefix wins.
const MOUNTS: [(&str, &str); 6] = [
    ("/etc/rollgate", "etc"),
    ("/var/lib/rollgate", "data"),
    ("/var/run/secrets/rollgate-clients", "clients"),
    ("/var/run/secrets/rollgate-tls", "tls"),
    ("/var/run/secrets/rollgate-fleet", "fleet"),
    ("/var/run/secrets/rollgate", "secrets"),
];

/// The shipped site running on the ground.
pub struct Site {
    pub rendered: Rendered,
    pub ground: Ground,
    pub rg: Rollgate,
    pub alertmanager: Alertmanager,
    pub pushgateway: Pushgateway,
    /// The site's directory: the mounts' files (`etc/rollgate.toml`, `secrets/…`).
    pub dir: tempfile::TempDir,
    /// The on-call engineer's working directory: `oncall.token`, `ca.crt`, and `scripts/`
    /// of a checkout.
    pub desk: PathBuf,
    /// The ground's names of the site's workers, by the site's names.
    pub names: Vec<(String, String)>,
    /// The broker's names (the ha overlay), removed at the end.
    pub amqp: Option<rabbit::Names>,
    _postgres: Option<Postgres>,
}

/// A token for `client`.
fn token_of(client: &str) -> String {
    format!("shipped-{client}-0123456789abcdef")
}

impl Site {
    /// `overlay` rendered and running on a ground at `kubelet`: one control plane with
    /// its TLS etcd member and as many workers as the site orders.
    pub async fn start(overlay: &str, kubelet: &str) -> Self {
        let rendered = Rendered::of(overlay);
        let site: toml::Table = rendered.config().parse().expect("the site's TOML");
        let order = strings(&serde_json::to_value(&site["cluster"]["worker_order"]).unwrap());
        let ground = Ground::start_etcd_tls(kubelet, order.len()).await;
        let names: Vec<(String, String)> = order
            .iter()
            .zip(ground.worker_order())
            .map(|(site, ground)| (site.clone(), ground.to_owned()))
            .collect();

        let dir = tempfile::tempdir().expect("site dir");
        let d = dir.path();
        for (_, local) in MOUNTS {
            std::fs::create_dir_all(d.join(local)).expect("mount dir");
        }
        let ca = TestCa::new("site CA");
        let (dns, ips) = rendered.certificate_names();
        ca.server_exactly("rollgate", &dns, &ips)
            .write_to(&super::pki::TlsFiles {
                cert: d.join("tls/tls.crt"),
                key: d.join("tls/tls.key"),
            });
        ca.write(&d.join("tls"), "ca.crt");
        for client in rendered.clients() {
            std::fs::write(d.join("clients").join(&client), token_of(&client)).expect("token");
        }

        let port = free_port();
        let pushgateway = Pushgateway::start().await;
        let am_port = ground.prom.alertmanager_port;
        let alertmanager = Alertmanager::with_config(
            &alertmanager_config(
                &format!("https://127.0.0.1:{port}/v1/alerts"),
                (&d.join("clients/alertmanager"), Some(&d.join("tls/ca.crt"))),
                Scale::default(),
            ),
            am_port,
        )
        .await;
        // A site's monitoring works: the ground's Prometheus has sent its watchdog here.
        alertmanager.wait_lists("Watchdog").await;

        let (amqp, postgres) = match site.get("queue").and_then(|q| q.get("backend")) {
            Some(b) if b.as_str() == Some("amqp") => {
                let pg = Postgres::start();
                (Some(rabbit::Names::unique()), Some(pg))
            }
            _ => (None, None),
        };
        let database = match &postgres {
            Some(pg) => Some(pg.database().await),
            None => None,
        };

        let mut config = site.clone();
        let ctx = Rewrite {
            dir: d,
            ground: &ground,
            names: &names,
            port,
            alertmanager: format!("http://127.0.0.1:{am_port}"),
            pushgateway: pushgateway.url(),
            amqp: amqp.as_ref(),
            database: database.as_deref(),
        };
        ctx.rewrite(&mut config);
        ctx.write_secrets(&config);
        std::fs::write(
            d.join("etc/rollgate.toml"),
            toml::to_string(&config).expect("TOML"),
        )
        .expect("rollgate.toml");

        let env = container_env(rendered.serve_container(), d);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let http = Rollgate::client_builder()
            .add_root_certificate(ca.trust())
            .build()
            .expect("client");
        let mut rg = Rollgate::start_with(port, &env, "https", http).await;
        rg.token = token_of("oncall");

        let desk = d.join("desk");
        std::fs::create_dir(&desk).expect("desk");
        std::fs::write(desk.join("oncall.token"), token_of("oncall")).expect("token");
        ca.write(&desk, "ca.crt");
        std::os::unix::fs::symlink(
            super::manifests::root().join("scripts"),
            desk.join("scripts"),
        )
        .expect("scripts");
        Self {
            rendered,
            ground,
            rg,
            alertmanager,
            pushgateway,
            dir,
            desk,
            names,
            amqp,
            _postgres: postgres,
        }
    }

    /// `kubectl -n rollgate exec rollgate-0 -- rollgate ARGS`: the binary with the
    /// StatefulSet container's environment.
    pub fn exec(&self, args: &[String]) -> Output {
        let env = container_env(self.rendered.serve_container(), self.dir.path());
        rollgate_command(args, &env)
    }

    /// The detection CronJob's container as rendered (its arguments and environment),
    /// its clock at `at` when given (libfaketime: the day `--upgrades-on` reads).
    pub fn run_cronjob(&self, at: Option<chrono::DateTime<chrono::Utc>>) -> Output {
        let mut env = container_env(self.rendered.detect_container(), self.dir.path());
        if let Some(at) = at {
            env.push(("LD_PRELOAD".into(), super::FAKETIME_LIB.into()));
            env.push((
                "FAKETIME".into(),
                at.format("@%Y-%m-%d %H:%M:%S").to_string(),
            ));
            env.push(("TZ".into(), "UTC".into()));
        }
        rollgate_command(&self.rendered.cronjob_args(), &env)
    }

    /// Ends what the site made outside its processes (the broker's names).
    pub async fn cleanup(&self) {
        if let Some(names) = &self.amqp {
            rabbit::cleanup(names).await;
        }
    }
}

/// The rollgate binary with `args`, and `env` alone besides PATH.
fn rollgate_command(args: &[String], env: &[(String, String)]) -> Output {
    Command::new(super::rollgate_bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("rollgate runs")
}

/// `path` under the pod's mounts, as the site keeps it.
fn local_path(dir: &Path, path: &str) -> Option<PathBuf> {
    MOUNTS
        .iter()
        .filter(|(mount, _)| path == *mount || path.starts_with(&format!("{mount}/")))
        .max_by_key(|(mount, _)| mount.len())
        .map(|(mount, local)| {
            dir.join(local)
                .join(path[mount.len()..].trim_start_matches('/'))
        })
}

/// A container's environment as rendered: values with paths mapped, the downward API's
/// pod name and namespace as rollgate-0's.
fn container_env(container: &Value, dir: &Path) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().expect("name").to_owned();
            let value = match (
                e["value"].as_str(),
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            ) {
                (Some(v), _) => {
                    local_path(dir, v).map_or_else(|| v.to_owned(), |p| p.display().to_string())
                }
                (None, Some("metadata.name")) => "rollgate-0".to_owned(),
                (None, Some("metadata.namespace")) => "rollgate".to_owned(),
                other => panic!("{name}: an environment value this site cannot give: {other:?}"),
            };
            (name, value)
        })
        .collect()
}

/// What the site's configuration becomes on the ground.
struct Rewrite<'a> {
    dir: &'a Path,
    ground: &'a Ground,
    names: &'a [(String, String)],
    port: u16,
    alertmanager: String,
    pushgateway: String,
    amqp: Option<&'a rabbit::Names>,
    database: Option<&'a str>,
}

impl Rewrite<'_> {
    fn rewrite(&self, config: &mut toml::Table) {
        map_paths(self.dir, config);
        let section = |config: &mut toml::Table, name: &str| -> toml::Table {
            config
                .remove(name)
                .and_then(|v| v.as_table().cloned())
                .unwrap_or_default()
        };
        let ground = self.ground;
        let s = |v: &str| toml::Value::String(v.to_owned());

        let mut server = section(config, "server");
        server.insert("listen".into(), s(&format!("127.0.0.1:{}", self.port)));
        config.insert("server".into(), server.into());

        let mut gate = section(config, "gate");
        gate.insert("prometheus_url".into(), s(&ground.prom.url()));
        if gate.contains_key("alertmanager_url") {
            gate.insert("alertmanager_url".into(), s(&self.alertmanager));
        }
        config.insert("gate".into(), gate.into());

        let mut cluster = section(config, "cluster");
        cluster.remove("in_cluster");
        cluster.insert(
            "kubeconfig".into(),
            s(&ground.dir.path().join("kubeconfig").display().to_string()),
        );
        let order: Vec<toml::Value> = self.names.iter().map(|(_, g)| s(g)).collect();
        cluster.insert("worker_order".into(), order.into());
        config.insert("cluster".into(), cluster.into());

        if config.contains_key("schedule") {
            let now = chrono::Utc::now();
            let (from, to) = (
                now - chrono::Duration::hours(1),
                now + chrono::Duration::hours(3),
            );
            let window = format!("{}-{} UTC", from.format("%H:%M"), to.format("%H:%M"));
            let mut schedule = section(config, "schedule");
            schedule.insert("windows".into(), vec![s(&window)].into());
            config.insert("schedule".into(), schedule.into());
        }

        let mut ssh = section(config, "ssh");
        ssh.insert(
            "user".into(),
            s(&std::env::var("USER").unwrap_or_else(|_| "root".into())),
        );
        let hosts: Vec<toml::Value> = ground.nodes.iter().map(|n| s(&n.host_entry())).collect();
        ssh.insert("hosts".into(), hosts.into());
        config.insert("ssh".into(), ssh.into());

        let mut etcd = section(config, "etcd");
        let endpoints: Vec<toml::Value> = ground.etcd.endpoints().iter().map(|e| s(e)).collect();
        etcd.insert("endpoints".into(), endpoints.into());
        config.insert("etcd".into(), etcd.into());

        let mut reboot = section(config, "reboot");
        reboot.insert(
            "sentinel_command".into(),
            s("test -e \"$STUB_STATE/reboot-required\""),
        );
        config.insert("reboot".into(), reboot.into());

        if let Some(mut detect) = config.remove("detect").and_then(|v| v.as_table().cloned()) {
            detect.insert(
                "rollgate_url".into(),
                s(&format!("https://localhost:{}", self.port)),
            );
            detect.insert("pushgateway_url".into(), s(&self.pushgateway));
            config.insert("detect".into(), detect.into());
        }

        if let Some(names) = self.amqp {
            let mut queue = section(config, "queue");
            queue.insert("amqp_url".into(), s(rabbit::URL));
            queue.insert("exchange".into(), s(&names.exchange));
            queue.insert("queue".into(), s(&names.queue));
            queue.insert("dead_queue".into(), s(&names.dead));
            config.insert("queue".into(), queue.into());
        }
        if let Some(url) = self.database {
            let mut store = section(config, "store");
            store.insert("url".into(), s(url));
            config.insert("store".into(), store.into());
        }
        if let Some(fleet) = config.get_mut("fleet").and_then(|f| f.as_table_mut()) {
            for upstream in fleet
                .get_mut("upstreams")
                .and_then(|u| u.as_array_mut())
                .into_iter()
                .flatten()
            {
                // An upstream nobody answers at: the site waits for it.
                let url = format!("https://127.0.0.1:{}", free_port());
                upstream
                    .as_table_mut()
                    .expect("an upstream")
                    .insert("url".into(), s(&url));
            }
        }
        scale_timeline(config);
    }

    /// The files the site's Secrets hold, from the ground.
    fn write_secrets(&self, config: &toml::Table) {
        let file = |section: &str, key: &str| -> Option<PathBuf> {
            config.get(section)?.get(key)?.as_str().map(PathBuf::from)
        };
        let copy = |to: Option<PathBuf>, from: &Path| {
            if let Some(to) = to {
                std::fs::copy(from, &to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
            }
        };
        let write = |to: Option<PathBuf>, text: &str| {
            if let Some(to) = to {
                std::fs::write(&to, text).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
            }
        };
        let ground = self.ground;
        let key = file("ssh", "key_file");
        copy(key.clone(), &ground.client.key);
        if let Some(key) = key {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o600)).expect("0600");
        }
        copy(file("ssh", "known_hosts_file"), &ground.client.known_hosts);
        write(
            file("notify", "slack_webhook_file"),
            &format!("http://{}/hook", ground.slack.address()),
        );
        if let Some(certs) = ground.etcd.tls() {
            copy(file("etcd", "ca_file"), &certs.ca);
            copy(file("etcd", "cert_file"), &certs.client_cert);
            copy(file("etcd", "key_file"), &certs.client_key);
        }
        write(file("queue", "amqp_credentials_file"), "guest:guest\n");
        write(file("store", "password_file"), "unused-on-trust-auth\n");
        if let Some(upstreams) = config
            .get("fleet")
            .and_then(|f| f.get("upstreams"))
            .and_then(|u| u.as_array())
        {
            for upstream in upstreams {
                let path = |k: &str| upstream.get(k).and_then(|v| v.as_str()).map(PathBuf::from);
                write(path("token_file"), "upstream-token-0123456789\n");
                if let Some(ca) = path("ca_file") {
                    TestCa::new("upstream CA").write(
                        ca.parent().expect("dir"),
                        ca.file_name().and_then(|n| n.to_str()).expect("name"),
                    );
                }
            }
        }
    }
}

/// Every string in `value` that names a path under the pod's mounts, mapped.
fn map_paths(dir: &Path, config: &mut toml::Table) {
    fn walk(dir: &Path, v: &mut toml::Value) {
        match v {
            toml::Value::String(s) => {
                if let Some(p) = local_path(dir, s) {
                    *s = p.display().to_string();
                }
            }
            toml::Value::Array(a) => a.iter_mut().for_each(|v| walk(dir, v)),
            toml::Value::Table(t) => t.iter_mut().for_each(|(_, v)| walk(dir, v)),
            _ => {}
        }
    }
    for (_, v) in config.iter_mut() {
        walk(dir, v);
    }
}

/// Every timeline duration the rehearsal scales, scaled: the site's own value where it
/// sets one, else the default (as [`Scale::rollgate_env`] gives it).
fn scale_timeline(config: &mut toml::Table) {
    for (env, default_scaled) in Scale::default().rollgate_env() {
        let mut path = env
            .trim_start_matches("ROLLGATE__")
            .split("__")
            .map(str::to_lowercase);
        let (section, key) = (path.next().expect("section"), path.next().expect("key"));
        if key == "sentinel_command" {
            continue;
        }
        let table = config
            .entry(section)
            .or_insert_with(|| toml::Table::new().into())
            .as_table_mut()
            .expect("a section");
        let value = match table.get(&key).and_then(|v| v.as_str()) {
            Some(set) if key == "quiet_query" => scale_ranges(set),
            Some(set) => scaled(
                humantime::parse_duration(set).unwrap_or_else(|e| panic!("{key} = {set:?}: {e}")),
            ),
            None => default_scaled,
        };
        table.insert(key, toml::Value::String(value));
    }
}

/// How long a shipped journey's run may take on the ground.
pub const RUN_DEADLINE: Duration = Duration::from_secs(240);
