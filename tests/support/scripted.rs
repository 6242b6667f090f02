//! etcd members run by shell scripts in a temp dir, so that a roll (or a StatefulSet
//! controller) can restart them the way an operator's command would: SIGTERM, wait for
//! the exit, mark the new revision, start again.

use rollgate::adapters::etcd::{Etcd, EtcdSettings};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const START: &str = r#"#!/bin/sh
# start.sh NAME: starts member NAME from NAME.args in the background, records its PID.
cd "$(dirname "$0")"
setsid etcd $(cat "$1.args") >> "$1.log" 2>&1 < /dev/null &
echo $! > "$1.pid"
"#;

const RESTART: &str = r#"#!/bin/sh
# restart.sh NAME [SIGNAL]: SIGNAL (default TERM; KILL = a grace period too short), wait
# for the exit, mark the new revision, start again.
cd "$(dirname "$0")"
pid=$(cat "$1.pid")
kill "-${2:-TERM}" "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
echo v2 > "$1.rev"
./start.sh "$1"
"#;

/// Members run by scripts in a temp dir; killed by PID when dropped.
pub struct Scripted {
    pub dir: tempfile::TempDir,
    pub names: Vec<String>,
    pub endpoints: Vec<String>,
    pub tls: Option<super::etcd::Certs>,
}

impl Scripted {
    pub async fn start(n: usize) -> Self {
        Self::start_with(n, false, "m").await
    }

    /// Members serving clients over TLS with client-certificate auth.
    pub async fn start_tls(n: usize) -> Self {
        Self::start_with(n, true, "m").await
    }

    /// Members named like the pods of StatefulSet `sts`: `sts-0`, `sts-1`, …
    pub async fn start_pods(n: usize, sts: &str) -> Self {
        Self::start_with(n, false, &format!("{sts}-")).await
    }

    pub async fn start_with(n: usize, tls: bool, prefix: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let certs = tls.then(|| super::etcd::Certs::make(dir.path()));
        let scheme = if tls { "https" } else { "http" };
        for (file, body) in [("start.sh", START), ("restart.sh", RESTART)] {
            super::stacked::write_executable(&dir.path().join(file), body);
        }
        let token = format!("rg-{}", uuid::Uuid::now_v7().simple());
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| (super::free_port(), super::free_port()))
            .collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("{prefix}{i}=http://127.0.0.1:{p}"))
            .collect();
        let mut names = Vec::new();
        let mut endpoints = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("{prefix}{i}");
            let mut args = format!(
                "--name={name} --data-dir={} --listen-client-urls={scheme}://127.0.0.1:{client} --advertise-client-urls={scheme}://127.0.0.1:{client} --listen-peer-urls=http://127.0.0.1:{peer} --initial-advertise-peer-urls=http://127.0.0.1:{peer} --initial-cluster={} --initial-cluster-state=new --initial-cluster-token={token} --pre-vote=true --log-level=warn",
                dir.path().join(&name).display(),
                initial.join(",")
            );
            if let Some(c) = &certs {
                args.push_str(&format!(
                    " --cert-file={} --key-file={} --trusted-ca-file={} --client-cert-auth",
                    c.server_cert.display(),
                    c.server_key.display(),
                    c.ca.display()
                ));
            }
            std::fs::write(dir.path().join(format!("{name}.args")), args).unwrap();
            assert!(
                Command::new(dir.path().join("start.sh"))
                    .arg(&name)
                    .status()
                    .unwrap()
                    .success()
            );
            names.push(name);
            endpoints.push(format!("{scheme}://127.0.0.1:{client}"));
        }
        let s = Self {
            dir,
            names,
            endpoints,
            tls: certs,
        };
        super::eventually(
            "every member answering, one leader",
            Duration::from_secs(30),
            || async {
                let etcd = s.etcd();
                let all = etcd.statuses().await.iter().all(Result::is_ok);
                (all && etcd.leader().await.is_ok()).then_some(())
            },
        )
        .await;
        s
    }

    pub fn etcd(&self) -> Etcd {
        Etcd::new(EtcdSettings {
            endpoints: self.endpoints.clone(),
            timeout: Duration::from_secs(2),
            tls: self
                .tls
                .as_ref()
                .map(|c| rollgate::adapters::etcd::EtcdTls {
                    ca_file: c.ca.clone(),
                    cert_file: Some(c.client_cert.clone()),
                    key_file: Some(c.client_key.clone()),
                    domain: None,
                }),
        })
        .unwrap()
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn marked(&self) -> Vec<String> {
        self.names
            .iter()
            .filter(|n| self.path(&format!("{n}.rev")).exists())
            .cloned()
            .collect()
    }

    pub fn roll(&self, restart: &str) -> (bool, String, String) {
        self.roll_within(restart, "15s")
    }

    /// `rollgate etcd-roll` over this cluster; the probe reads the revision markers.
    pub fn roll_command(&self, restart: &str, ready_timeout: &str) -> Command {
        let probe = format!(
            "test \"$(cat {}/$ROLLGATE_MEMBER.rev 2>/dev/null)\" = v2",
            self.dir.path().display()
        );
        let mut cmd = Command::new(super::rollgate_bin());
        cmd.args(["etcd-roll", "--cooldown", "300ms", "--timeout", "2s"])
            .args(["--ready-timeout", ready_timeout])
            .arg("--endpoints")
            .arg(self.endpoints.join(","))
            .arg("--restart-command")
            .arg(restart)
            .arg("--probe-command")
            .arg(probe)
            .current_dir(self.dir.path());
        if let Some(c) = &self.tls {
            cmd.arg("--ca-file")
                .arg(&c.ca)
                .arg("--cert-file")
                .arg(&c.client_cert)
                .arg("--key-file")
                .arg(&c.client_key);
        }
        cmd
    }

    pub fn roll_within(&self, restart: &str, ready_timeout: &str) -> (bool, String, String) {
        let out = self
            .roll_command(restart, ready_timeout)
            .arg("--no-gate")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn restart_command(&self) -> String {
        format!("{}/restart.sh {{name}}", self.dir.path().display())
    }

    /// rollgate's command driver for these members: restart with `restart.sh`, and a
    /// member counts as at the target once its revision file says `v2`.
    pub fn command_driver(&self) -> rollgate::workflows::etcd_roll::CommandDriver {
        rollgate::workflows::etcd_roll::CommandDriver {
            restart_command: self.restart_command(),
            probe_command: format!(
                "test \"$(cat {}/$ROLLGATE_MEMBER.rev 2>/dev/null)\" = v2",
                self.dir.path().display()
            ),
            runner: std::sync::Arc::new(rollgate::adapters::shell::Shell {
                timeout: std::time::Duration::from_secs(30),
            }),
        }
    }
}

impl Scripted {
    /// Freezes member `name` (SIGSTOP): it stops answering without dying, its sockets open.
    pub fn freeze(&self, name: &str) {
        self.signal(name, "-STOP");
    }

    /// Lets a frozen member go on (SIGCONT).
    pub fn thaw(&self, name: &str) {
        self.signal(name, "-CONT");
    }

    fn signal(&self, name: &str, signal: &str) {
        let pid =
            std::fs::read_to_string(self.path(&format!("{name}.pid"))).expect("the member runs");
        let ok = Command::new("kill")
            .args([signal, pid.trim()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {signal} {name}");
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        for name in &self.names {
            if let Ok(pid) = std::fs::read_to_string(self.path(&format!("{name}.pid"))) {
                let _ = Command::new("kill")
                    .args(["-KILL", pid.trim()])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
    }
}
