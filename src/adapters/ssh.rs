//! Running the node script over SSH with openssh (native mux): strict host-key checking
//! against rollgate's own known_hosts file, a key file, a connect timeout, and a
//! per-command timeout enforced on the node (`timeout` ends the remote command too).

use openssh::{ControlPersist, KnownHosts, SessionBuilder, Stdio};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tracing::info;

use crate::config::SshHost;
use crate::ports::{ExecError, ExecOutput, Failure, NodeExec, NodeTarget};

/// How long an SSH master with no command on it outlives the session that started it.
const MASTER_IDLE: std::num::NonZeroUsize =
    std::num::NonZeroUsize::new(60).expect("60 is not zero");

/// How rollgate reaches nodes.
#[derive(Debug, Clone)]
pub struct SshSettings {
    /// Login user.
    pub user: String,
    /// Default port.
    pub port: u16,
    /// Private key file.
    pub key_file: PathBuf,
    /// known_hosts file; host keys not in it, or different from it, are refused.
    pub known_hosts_file: PathBuf,
    /// Bound on connecting.
    pub connect_timeout: Duration,
    /// Bound on one command, enforced on the node.
    pub command_timeout: Duration,
    /// User, host and port per node name, when not the defaults and the InternalIP.
    pub hosts: HashMap<String, SshHost>,
    /// Where the mux sockets live (keep the path short).
    pub control_dir: PathBuf,
    /// Connections opened at once; more wait their turn before their connect timeout.
    pub max_connecting: usize,
}

/// SSH to nodes.
pub struct Ssh {
    settings: SshSettings,
    /// One permit per handshake in progress.
    connecting: tokio::sync::Semaphore,
}

/// Extra time, beyond the remote `timeout`, before the local side gives up.
const LOCAL_GRACE: Duration = Duration::from_secs(15);

impl Ssh {
    /// Checks that the key and known_hosts files exist; connects lazily.
    pub fn new(settings: SshSettings) -> Result<Self, ExecError> {
        for (what, path) in [
            ("ssh.key_file", &settings.key_file),
            ("ssh.known_hosts_file", &settings.known_hosts_file),
        ] {
            if !path.is_file() {
                return Err(ExecError::Other {
                    node: "-".into(),
                    failure: Failure::new(format!(
                        "{what} {} is not a readable file",
                        path.display()
                    )),
                });
            }
        }
        std::fs::create_dir_all(&settings.control_dir).map_err(|e| ExecError::Other {
            node: "-".into(),
            failure: Failure::caused(
                format!(
                    "cannot create ssh control dir {}",
                    settings.control_dir.display()
                ),
                e,
            ),
        })?;
        let connecting = tokio::sync::Semaphore::new(settings.max_connecting.max(1));
        Ok(Self {
            settings,
            connecting,
        })
    }

    /// User, host and port for `node`.
    fn destination(&self, node: &NodeTarget) -> (String, String, u16) {
        let s = &self.settings;
        match s.hosts.get(&node.name) {
            Some(h) => (
                h.user.clone().unwrap_or_else(|| s.user.clone()),
                h.host.clone(),
                h.port.unwrap_or(s.port),
            ),
            None => (
                s.user.clone(),
                node.address.clone().unwrap_or_else(|| node.name.clone()),
                s.port,
            ),
        }
    }

    async fn session(&self, node: &NodeTarget) -> Result<openssh::Session, ExecError> {
        let (user, host, port) = self.destination(node);
        // A node's InternalIP comes from the node itself: never let it become an option.
        if !plain_name(&host) || !plain_name(&user) {
            return Err(ExecError::Other {
                node: node.name.clone(),
                failure: Failure::new(format!(
                    "refusing to connect to {host:?} as {user:?}: not a plain host or user name"
                )),
            });
        }
        let mut builder = SessionBuilder::default();
        builder
            .user(user)
            .port(port)
            .keyfile(&self.settings.key_file)
            .known_hosts_check(KnownHosts::Strict)
            .user_known_hosts_file(&self.settings.known_hosts_file)
            .config_file("/dev/null")
            .connect_timeout(self.settings.connect_timeout)
            .server_alive_interval(Duration::from_secs(15))
            // The master ends with the session; if rollgate dies first (kill -9), it ends
            // by itself once no command uses it, instead of lingering (and its sshd
            // session on the node) forever.
            .control_persist(ControlPersist::IdleFor(MASTER_IDLE))
            .control_directory(&self.settings.control_dir);
        // The turn is waited for outside the bound: a node is not unreachable because a
        // thousand others were asked first.
        let _turn = self
            .connecting
            .acquire()
            .await
            .map_err(|_| ExecError::Other {
                node: node.name.clone(),
                failure: Failure::new("rollgate is stopping"),
            })?;
        let connect = builder.connect_mux(&host);
        let bound = self.settings.connect_timeout + Duration::from_secs(5);
        match tokio::time::timeout(bound, connect).await {
            Err(_) => Err(ExecError::Connect {
                node: node.name.clone(),
                failure: Failure::new(format!("no session with {host}:{port} within {bound:?}")),
            }),
            Ok(Err(e)) => {
                let text = crate::error_chain(&e);
                if text.contains("Host key verification failed")
                    || text.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
                    || text.contains("No ED25519 host key is known")
                {
                    Err(ExecError::HostKey {
                        node: node.name.clone(),
                    })
                } else {
                    Err(ExecError::Connect {
                        node: node.name.clone(),
                        failure: Failure::caused(format!("{host}:{port}"), e),
                    })
                }
            }
            Ok(Ok(session)) => Ok(session),
        }
    }
}

/// A host or user name that ssh cannot take for anything else: no leading `-`, no spaces
/// or shell characters.
fn plain_name(text: &str) -> bool {
    !text.is_empty()
        && !text.starts_with('-')
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

#[async_trait::async_trait]
impl NodeExec for Ssh {
    async fn run_script(
        &self,
        node: &NodeTarget,
        script: &str,
        args: &[String],
    ) -> Result<ExecOutput, ExecError> {
        let session = self.session(node).await?;
        let secs = self.settings.command_timeout.as_secs().max(1);
        let other = |e: openssh::Error| ExecError::Other {
            node: node.name.clone(),
            failure: Failure::caused("the session failed", e),
        };
        let mut command = session.command("timeout");
        command
            .arg("--kill-after=10")
            .arg(secs.to_string())
            .arg("bash")
            .arg("-s")
            .arg("--")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        info!(node = %node.name, ?args, "running the node script");
        let mut child = command.spawn().await.map_err(other)?;
        if let Some(mut stdin) = child.stdin().take() {
            stdin
                .write_all(script.as_bytes())
                .await
                .map_err(|e| ExecError::Other {
                    node: node.name.clone(),
                    failure: Failure::caused("cannot send the script", e),
                })?;
            drop(stdin);
        }
        let waited = tokio::time::timeout(
            self.settings.command_timeout + LOCAL_GRACE,
            child.wait_with_output(),
        )
        .await;
        let _ = session.close().await;
        let output = match waited {
            Err(_) => {
                return Err(ExecError::Timeout {
                    node: node.name.clone(),
                    secs,
                });
            }
            Ok(result) => result.map_err(other)?,
        };
        let status = output.status.code();
        let out = ExecOutput {
            status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        info!(node = %node.name, status = ?status, stdout = %out.stdout, stderr = %out.stderr, "node script output");
        // `timeout` exits 124 when it ended the command, 137 when it had to kill it.
        if matches!(status, Some(124 | 137)) {
            return Err(ExecError::Timeout {
                node: node.name.clone(),
                secs,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::plain_name;

    #[test]
    fn only_plain_hosts_and_users_reach_ssh() {
        for ok in ["10.0.0.5", "fd00::5", "node-1.lan", "wizard", "root"] {
            assert!(plain_name(ok), "{ok}");
        }
        for bad in ["", "-oProxyCommand=sh", "a b", "h;reboot", "$(id)", "u@h"] {
            assert!(!plain_name(bad), "{bad}");
        }
    }
}
