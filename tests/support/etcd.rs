//! Real etcd members (Debian's etcd-server 3.4) on loopback, each with its own ports and
//! data dir, stopped and started by PID.

use std::time::{Duration, Instant};

use super::free_port;
use super::services::Process;
use rollgate::adapters::etcd::{Etcd, EtcdSettings, EtcdTls};
use std::path::{Path, PathBuf};

pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub process: Process,
}

pub struct Cluster {
    pub members: Vec<Member>,
    pub tls: Option<Certs>,
    _dir: tempfile::TempDir,
}

/// A test CA and the certificates it signed.
#[derive(Clone)]
pub struct Certs {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Certs {
    /// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl.
    pub fn make(dir: &Path) -> Self {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "1",
                "-subj",
                "/CN=rollgate-test-ca",
            ],
        );
        for (name, usage) in [
            ("server", "serverAuth,clientAuth"),
            ("client", "clientAuth"),
        ] {
            std::fs::write(
                dir.join(format!("{name}.ext")),
                format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"),
            )
            .expect("ext");
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            openssl(
                dir,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={name}"),
                ],
            );
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "1",
                    "-extfile",
                    &ext,
                ],
            );
        }
        Self {
            ca: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        }
    }
}

/// The flags of member `name` of a new cluster: its data dir, its client and peer URLs on
/// loopback, the initial cluster, and pre-vote (etcd 3.5's default, and kubeadm's), so that
/// a restarted follower does not start an election.
pub fn member_args(
    name: &str,
    data_dir: &Path,
    (scheme, client, peer): (&str, u16, u16),
    initial: &[String],
    token: &str,
) -> Vec<String> {
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={scheme}://127.0.0.1:{client}"),
        format!("--advertise-client-urls={scheme}://127.0.0.1:{client}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster={}", initial.join(",")),
        "--initial-cluster-state=new".into(),
        format!("--initial-cluster-token={token}"),
        "--pre-vote=true".into(),
        "--log-level=warn".into(),
    ]
}

impl Cluster {
    /// Starts `n` members and waits until they agree on a leader.
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, false).await
    }

    /// Like [`Cluster::start`], serving clients over TLS with client-certificate auth.
    pub async fn start_tls(n: usize) -> Self {
        Self::start_with(n, true).await
    }

    async fn start_with(n: usize, tls: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let certs = tls.then(|| Certs::make(dir.path()));
        let scheme = if tls { "https" } else { "http" };
        let token = format!("rg-{}", uuid::Uuid::now_v7().simple());
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let name = format!("m{i}");
                let mut args = member_args(
                    &name,
                    &dir.path().join(&name),
                    (scheme, *client, *peer),
                    &initial,
                    &token,
                );
                if let Some(c) = &certs {
                    args.push(format!("--cert-file={}", c.server_cert.display()));
                    args.push(format!("--key-file={}", c.server_key.display()));
                    args.push(format!("--trusted-ca-file={}", c.ca.display()));
                    args.push("--client-cert-auth".into());
                }
                let process =
                    Process::spawn("etcd", "etcd", args, dir.path().join(format!("{name}.log")));
                Member {
                    name,
                    client_port: *client,
                    process,
                }
            })
            .collect();
        let cluster = Self {
            members,
            tls: certs,
            _dir: dir,
        };
        cluster.wait_for_leader().await;
        cluster
    }

    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// A client with the cluster's TLS (CA and client certificate) when it has TLS.
    pub fn client(&self) -> Etcd {
        Etcd::new(EtcdSettings {
            endpoints: self.endpoints(),
            timeout: Duration::from_secs(2),
            tls: self.tls.as_ref().map(|c| EtcdTls {
                ca_file: c.ca.clone(),
                cert_file: Some(c.client_cert.clone()),
                key_file: Some(c.client_key.clone()),
                domain: None,
            }),
        })
        .expect("client")
    }

    /// Waits until every member answers and all follow one leader: a majority's leader is
    /// not enough, a member may still be opening its client port.
    pub async fn wait_for_leader(&self) {
        let etcd = self.client();
        let started = Instant::now();
        loop {
            let statuses = etcd.statuses().await;
            let leaders: std::collections::BTreeSet<u64> = statuses
                .iter()
                .map(|s| s.as_ref().map_or(0, |s| s.leader))
                .collect();
            if leaders.len() == 1 && !leaders.contains(&0) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the etcd cluster did not come up with one leader: {statuses:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Moves leadership to member `id` for a test's starting position, asking again until it
/// leads: on a loaded machine one transfer can outlast the client's timeout (and then
/// complete, or not).
pub async fn lead_to(etcd: &Etcd, id: u64) {
    super::eventually(
        "leadership on the member asked",
        Duration::from_secs(30),
        || async {
            if etcd.leader().await.is_ok_and(|l| l.id == id) {
                return Some(());
            }
            if let Err(e) = etcd.move_leader(id, Duration::from_secs(10)).await {
                eprintln!("moving leadership to {id:x}: {e}; asking again");
            }
            None
        },
    )
    .await;
}
