//! Running the node script over SSH with openssh (native mux): strict host-key checking
//! against rollgate's own known_hosts file, a key file, a connect timeout, and a
//! per-command timeout enforced on the node (`timeout` ends the remote command too).
//!
//! A node's connection (its SSH master) is kept for the node's next command while it is
//! used at least every [`REUSE_IDLE`]: a node's steps (its download, its upgrade) then cost
//! the node one handshake, not one each. The host key was checked when the connection was
//! made and cannot change under it; a connection that broke, failed a command, or belongs
//! to a node sent a reboot is dropped, and the next command connects afresh.

use openssh::{ControlPersist, KnownHosts, SessionBuilder, Stdio};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
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

/// How long a node's connection is kept for its next command after its last one ended;
/// shorter than [`MASTER_IDLE`], so that a kept master has not ended by itself.
const REUSE_IDLE: Duration = Duration::from_secs(30);

/// SSH to nodes.
pub struct Ssh {
    settings: SshSettings,
    /// One permit per handshake in progress.
    connecting: tokio::sync::Semaphore,
    /// Each node's kept connection, by node name.
    masters: Mutex<HashMap<String, Master>>,
}

/// User, host and port.
type Destination = (String, String, u16);

/// A node's connection, kept between its commands.
struct Master {
    session: Arc<openssh::Session>,
    destination: Destination,
    /// Commands on it now.
    in_use: usize,
    /// When its last command ended (or its first began).
    last_used: Instant,
}

/// A connection lent to one command.
struct Lease {
    session: Arc<openssh::Session>,
    /// It was made for an earlier command.
    reused: bool,
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
            masters: Mutex::new(HashMap::new()),
        })
    }

    /// User, host and port for `node`.
    fn destination(&self, node: &NodeTarget) -> Destination {
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

    /// The kept masters, whatever a panicking holder left.
    fn masters(&self) -> std::sync::MutexGuard<'_, HashMap<String, Master>> {
        self.masters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection to `node` for one command: its kept one when that still answers, else
    /// a new one, kept unless another command on the node keeps one already.
    async fn lease(&self, node: &NodeTarget) -> Result<Lease, ExecError> {
        close_all(self.take_idle()).await;
        let destination = self.destination(node);
        if let Some(session) = self.borrow_kept(&node.name, &destination) {
            if session.check().await.is_ok() {
                return Ok(Lease {
                    session,
                    reused: true,
                });
            }
            self.give_back(&node.name, session, false).await;
        }
        self.connect_kept(node, destination).await
    }

    /// A new connection to `node`, kept when the node has none.
    async fn connect_kept(
        &self,
        node: &NodeTarget,
        destination: Destination,
    ) -> Result<Lease, ExecError> {
        let session = Arc::new(self.session(node, destination.clone()).await?);
        let mut masters = self.masters();
        if !masters.contains_key(&node.name) {
            masters.insert(
                node.name.clone(),
                Master {
                    session: session.clone(),
                    destination,
                    in_use: 1,
                    last_used: Instant::now(),
                },
            );
        }
        Ok(Lease {
            session,
            reused: false,
        })
    }

    /// `node`'s kept connection to `destination`, counted in use.
    fn borrow_kept(&self, node: &str, destination: &Destination) -> Option<Arc<openssh::Session>> {
        let mut masters = self.masters();
        let master = masters.get_mut(node)?;
        if &master.destination != destination {
            return None;
        }
        master.in_use += 1;
        master.last_used = Instant::now();
        Some(master.session.clone())
    }

    /// Ends a command's use of `session`: kept for the next one when `healthy`, else the
    /// node's kept connection is dropped if it is this one. A connection no longer kept is
    /// closed once its last command is done.
    async fn give_back(&self, node: &str, session: Arc<openssh::Session>, healthy: bool) {
        {
            let mut masters = self.masters();
            if let Some(master) = masters.get_mut(node)
                && Arc::ptr_eq(&master.session, &session)
            {
                master.in_use = master.in_use.saturating_sub(1);
                master.last_used = Instant::now();
                if healthy {
                    return;
                }
                masters.remove(node);
            }
        }
        close_all(vec![session]).await;
    }

    /// Starts `bash -s -- args` on `session`, bounded on the node by `secs`,
    /// its stdin, stdout and stderr piped.
    async fn spawn(
        &self,
        node: &NodeTarget,
        session: &Arc<openssh::Session>,
        args: &[String],
        secs: u64,
    ) -> Result<openssh::Child<Arc<openssh::Session>>, openssh::Error> {
        let mut command = session.clone().arc_command("timeout");
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
        command.spawn().await
    }

    /// Sends `script` to the command `spawned` and waits for its end, within the command
    /// timeout and the local grace.
    async fn finish(
        &self,
        node: &NodeTarget,
        spawned: Result<openssh::Child<Arc<openssh::Session>>, openssh::Error>,
        script: &str,
        secs: u64,
    ) -> Result<std::process::Output, ExecError> {
        let mut child = spawned.map_err(|e| session_failed(node, e))?;
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
        tokio::time::timeout(
            self.settings.command_timeout + LOCAL_GRACE,
            child.wait_with_output(),
        )
        .await
        .map_err(|_| ExecError::Timeout {
            node: node.name.clone(),
            secs,
        })?
        .map_err(|e| session_failed(node, e))
    }

    /// Removes the kept connections no command used for [`REUSE_IDLE`].
    fn take_idle(&self) -> Vec<Arc<openssh::Session>> {
        let mut masters = self.masters();
        let idle: Vec<String> = masters
            .iter()
            .filter(|(_, m)| m.in_use == 0 && m.last_used.elapsed() >= REUSE_IDLE)
            .map(|(name, _)| name.clone())
            .collect();
        idle.iter()
            .filter_map(|name| masters.remove(name))
            .map(|m| m.session)
            .collect()
    }

    async fn session(
        &self,
        node: &NodeTarget,
        (user, host, port): Destination,
    ) -> Result<openssh::Session, ExecError> {
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
            // The master ends when rollgate closes it; if rollgate dies first (kill -9), it
            // ends by itself once no command uses it, instead of lingering (and its sshd
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

/// The session under a command broke.
fn session_failed(node: &NodeTarget, e: openssh::Error) -> ExecError {
    ExecError::Other {
        node: node.name.clone(),
        failure: Failure::caused("the session failed", e),
    }
}

/// Closes each connection no command holds any more (one still held closes with its
/// last holder).
async fn close_all(sessions: Vec<Arc<openssh::Session>>) {
    let closing = sessions
        .into_iter()
        .filter_map(|s| Arc::try_unwrap(s).ok())
        .map(openssh::Session::close);
    for closed in futures_util::future::join_all(closing).await {
        if let Err(e) = closed {
            tracing::debug!(error = %crate::error_chain(&e), "closing an ssh master");
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
    fn forget(&self, node: &str) {
        // Dropped here; closed by its last command.
        self.masters().remove(node);
    }

    async fn run_script(
        &self,
        node: &NodeTarget,
        script: &str,
        args: &[String],
    ) -> Result<ExecOutput, ExecError> {
        let secs = self.settings.command_timeout.as_secs().max(1);
        let lease = self.lease(node).await?;
        let (lease, spawned) = match self.spawn(node, &lease.session, args, secs).await {
            Err(e) if lease.reused => {
                // The kept connection could not open a session, so nothing ran: once more
                // on a new one.
                tracing::debug!(node = %node.name, error = %crate::error_chain(&e), "a kept ssh master failed; connecting afresh");
                self.give_back(&node.name, lease.session, false).await;
                let fresh = self.connect_kept(node, self.destination(node)).await?;
                let spawned = self.spawn(node, &fresh.session, args, secs).await;
                (fresh, spawned)
            }
            spawned => (lease, spawned),
        };
        let finished = self.finish(node, spawned, script, secs).await;
        // ssh's own 255: the connection broke under the command.
        let healthy = matches!(&finished, Ok(o) if !matches!(o.status.code(), None | Some(255)));
        self.give_back(&node.name, lease.session, healthy).await;
        let output = finished?;
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
