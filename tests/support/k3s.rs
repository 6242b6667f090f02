//! k3s and RKE2 for the fake cluster: a release mirror laid out as the projects' GitHub
//! releases (`RELEASE/ARTIFACT`, `RELEASE/sha256sum-amd64.txt`), served over HTTP on
//! loopback by a thread of its own, and nodes whose installed binary is one of its
//! releases. A release's binary is a stub that reports its release (`k3s --version`); the
//! node's `systemctl restart k3s|k3s-agent|rke2-server|rke2-agent` reports it to the fake
//! API server as the kubelet would, and restarts the server's embedded etcd member.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::stacked::write_executable;

/// The releases every mirror holds, by version.
pub const VERSIONS: &[&str] = &["1.34.2", "1.34.3", "1.34.5", "1.35.0", "1.35.1"];

/// `k3s` or `rke2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distro {
    K3s,
    Rke2,
}

impl Distro {
    pub fn name(self) -> &'static str {
        match self {
            Self::K3s => "k3s",
            Self::Rke2 => "rke2",
        }
    }

    /// The release of `version`, first build: `v1.34.5+k3s1`.
    pub fn release(self, version: &str) -> String {
        match self {
            Self::K3s => format!("v{version}+k3s1"),
            Self::Rke2 => format!("v{version}+rke2r1"),
        }
    }

    /// The artifact that carries the binary on amd64.
    pub fn artifact(self) -> &'static str {
        match self {
            Self::K3s => "k3s",
            Self::Rke2 => "rke2.linux-amd64.tar.gz",
        }
    }
}

/// The binary of `release`: it reports its release, as the real one's `--version` does.
pub fn binary(distro: Distro, release: &str) -> String {
    format!(
        "#!/bin/bash\nif [ \"$1\" = --version ]; then echo \"{} version {release} (0000000)\"; echo \"go version go1.23.4\"; fi\n",
        distro.name()
    )
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A release mirror: every release of [`VERSIONS`] of one distribution.
pub struct ReleaseMirror {
    pub distro: Distro,
    pub port: u16,
    pub root: tempfile::TempDir,
    /// Every GET and HEAD it answered: `METHOD PATH STATUS`.
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl ReleaseMirror {
    pub fn start(distro: Distro) -> Self {
        let root = tempfile::tempdir().expect("mirror dir");
        for version in VERSIONS {
            Self::publish(root.path(), distro, &distro.release(version));
        }
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let dir = root.path().to_owned();
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (dir, log) = (dir.clone(), log.clone());
                std::thread::spawn(move || serve(stream, &dir, &log));
            }
        });
        Self {
            distro,
            port,
            root,
            requests,
        }
    }

    /// Builds `release`'s directory: the artifact and its sha256sum file.
    fn publish(root: &Path, distro: Distro, release: &str) {
        let dir = root.join(release);
        std::fs::create_dir_all(&dir).expect("release dir");
        let artifact = dir.join(distro.artifact());
        match distro {
            Distro::K3s => write_executable(&artifact, &binary(distro, release)),
            Distro::Rke2 => {
                let build = dir.join("build");
                std::fs::create_dir_all(build.join("bin")).expect("bin");
                write_executable(&build.join("bin/rke2"), &binary(distro, release));
                let ok = Command::new("tar")
                    .arg("-czf")
                    .arg(&artifact)
                    .arg("-C")
                    .arg(&build)
                    .arg("bin/rke2")
                    .status()
                    .expect("tar")
                    .success();
                assert!(ok, "tar of {release}");
                std::fs::remove_dir_all(&build).expect("build dir");
            }
        }
        let sum = sha256_hex(&std::fs::read(&artifact).expect("artifact"));
        std::fs::write(
            dir.join("sha256sum-amd64.txt"),
            format!(
                "{sum}  {}\n{}  k3s-airgap-images-amd64.tar\n",
                distro.artifact(),
                "0".repeat(64)
            ),
        )
        .expect("sums");
    }

    /// Publishes one more release (another build: `v1.34.5+k3s2`).
    pub fn publish_release(&self, release: &str) {
        Self::publish(self.root.path(), self.distro, release);
    }

    /// The URL rollgate is given (`cluster.release_mirror`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/releases", self.port)
    }

    /// Changes `release`'s artifact after its checksums were published, as a corrupted or
    /// tampered download would be.
    pub fn corrupt(&self, release: &str) {
        let artifact = self.root.path().join(release).join(self.distro.artifact());
        let mut bytes = std::fs::read(&artifact).expect("artifact");
        bytes.extend_from_slice(b"\n# tampered\n");
        std::fs::write(&artifact, bytes).expect("artifact");
    }

    /// Takes `release` off the mirror.
    pub fn withdraw(&self, release: &str) {
        std::fs::remove_dir_all(self.root.path().join(release)).expect("release dir");
    }

    /// The sha256 of `release`'s artifact as the mirror serves it now.
    pub fn artifact_sum(&self, release: &str) -> String {
        let artifact = self.root.path().join(release).join(self.distro.artifact());
        sha256_hex(&std::fs::read(artifact).expect("artifact"))
    }

    /// How many times the artifact of `release` was downloaded.
    pub fn downloads(&self, release: &str) -> usize {
        let path = format!(
            "GET /releases/{}/{} 200",
            release.replace('+', "%2B"),
            self.distro.artifact()
        );
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| **r == path)
            .count()
    }
}

/// Answers one request: a file under `root` for `/releases/PATH` (`%2B` read as `+`), or
/// 404.
fn serve(stream: std::net::TcpStream, root: &Path, log: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => break,
            Ok(_) if header == "\r\n" || header == "\n" => break,
            Ok(_) => {}
        }
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let file: Option<PathBuf> = target
        .strip_prefix("/releases/")
        .map(|p| p.replace("%2B", "+").replace("%2b", "+"))
        .filter(|p| !p.split('/').any(|s| s == ".." || s.is_empty()))
        .map(|p| root.join(p))
        .filter(|p| p.is_file());
    let body = file.and_then(|f| std::fs::read(f).ok());
    let status = if body.is_some() { 200 } else { 404 };
    log.lock()
        .unwrap()
        .push(format!("{method} {target} {status}"));
    let body = body.unwrap_or_else(|| b"404 page not found\n".to_vec());
    let mut out = stream;
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        if status == 200 { "OK" } else { "Not Found" },
        body.len()
    );
    let _ = out.write_all(head.as_bytes());
    if method != "HEAD" {
        let _ = out.write_all(&body);
    }
}

/// Makes the node at `d` a `distro` node at `release`: its binary installed in its own
/// bin dir (`ROLLGATE_BIN_DIR`), the one the node script swaps.
pub fn install(d: &Path, env: &mut Vec<(String, String)>, distro: Distro, release: &str) {
    let bin = d.join("usr-local-bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    write_executable(&bin.join(distro.name()), &binary(distro, release));
    env.push(("ROLLGATE_BIN_DIR".into(), bin.display().to_string()));
}

/// The release the node's installed binary reports.
pub fn installed(d: &Path, distro: Distro) -> String {
    reported(&d.join("usr-local-bin").join(distro.name()))
}

/// The release the node's previous binary (kept beside by the swap) reports, if any.
pub fn previous(d: &Path, distro: Distro) -> Option<String> {
    let path = d
        .join("usr-local-bin")
        .join(format!("{}.previous", distro.name()));
    path.exists().then(|| reported(&path))
}

/// What `binary --version` says its release is.
fn reported(binary: &Path) -> String {
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .expect("the binary runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_owned()
}

/// Labels and annotates node `n` as `distro` does: a server carries the control-plane,
/// etcd and master roles set to "true", and names its etcd member (`member`).
pub fn label_node(n: &mut serde_json::Value, distro: Distro, server: bool, member: &str) {
    let (prefix, etcd) = match distro {
        Distro::K3s => ("k3s.io", "etcd.k3s.cattle.io"),
        Distro::Rke2 => ("rke2.io", "etcd.rke2.cattle.io"),
    };
    let labels = &mut n["metadata"]["labels"];
    labels["node.kubernetes.io/instance-type"] = distro.name().into();
    if server {
        for role in ["control-plane", "etcd", "master"] {
            labels[format!("node-role.kubernetes.io/{role}")] = "true".into();
        }
    }
    let name = n["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let annotations = &mut n["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = serde_json::json!({});
    }
    annotations[format!("{prefix}/hostname")] = name.into();
    annotations[format!("{prefix}/internal-ip")] = "127.0.0.1".into();
    annotations[format!("{prefix}/node-args")] = if server {
        r#"["server","--cluster-init"]"#
    } else {
        r#"["agent"]"#
    }
    .into();
    annotations[format!("{prefix}/node-config-hash")] = "C6Q4TZ5NMZNQAGB4FCGHNXYT5NSIRGGM".into();
    if server {
        annotations[format!("{etcd}/node-name")] = member.into();
        annotations[format!("{etcd}/node-address")] = "127.0.0.1".into();
    }
}
