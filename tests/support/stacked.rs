//! Stacked etcd for the HA test ground: one real etcd member (Debian's etcd 3.4) per
//! control-plane node, named after the node as kubeadm names it. Each member is driven by
//! its own `ctl` script (start, stop, restart by PID), so that the stub `kubeadm` on a
//! node restarts that node's member as the kubelet restarts the etcd static pod during
//! `kubeadm upgrade`. Dropping the ground kills every member by PID.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::etcd::member_args;
use super::free_port;
use rollgate::adapters::etcd::{Etcd, EtcdSettings};

/// Starts, stops or restarts one member by the PID in its directory. `stop` waits (up to
/// 10 s) for the process to exit after SIGTERM, as the kubelet waits for a static pod.
const CTL: &str = r#"#!/bin/bash
d="$(dirname "$(readlink -f "$0")")"
start() {
  mapfile -t args < "$d/args"
  # The kubelet starts a static pod, not whoever asked for the restart: none of the
  # caller's files stays open in the member (the node script's lock among them).
  (
    for fd in /proc/self/fd/*; do
      n=${fd##*/}
      if [ "$n" -gt 2 ]; then eval "exec $n>&-"; fi
    done
    exec setsid etcd "${args[@]}" >> "$d/etcd.log" 2>&1 < /dev/null
  ) &
  echo $! > "$d/pid"
}
stop() {
  [ -f "$d/pid" ] || return 0
  local pid state
  pid=$(cat "$d/pid")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    state=$(ps -o stat= -p "$pid" 2>/dev/null || true)
    case "$state" in ""|Z*) break ;; esac
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$d/pid"
}
case "$1" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  *) echo "usage: ctl start|stop|restart" >&2; exit 2 ;;
esac
"#;

pub struct StackedMember {
    pub name: String,
    /// The node it runs on: its name (kubeadm), or its name without the 8 hex digits k3s
    /// and RKE2 add.
    pub node: String,
    pub client_port: u16,
    /// Holds `ctl`, `args`, `pid`, `etcd.log` and the data dir.
    pub dir: PathBuf,
}

impl StackedMember {
    /// The script that starts, stops and restarts this member.
    pub fn ctl(&self) -> PathBuf {
        self.dir.join("ctl")
    }

    fn run(&self, action: &str) {
        let ok = std::process::Command::new(self.ctl())
            .arg(action)
            .status()
            .expect("ctl runs")
            .success();
        assert!(ok, "ctl {action} of {} failed", self.name);
    }

    pub fn stop(&self) {
        self.run("stop");
    }

    pub fn start(&self) {
        self.run("start");
    }

    /// Freezes the member (SIGSTOP): it stops answering without dying, its sockets open.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen member go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = std::fs::read_to_string(self.dir.join("pid")).expect("the member runs");
        let ok = std::process::Command::new("kill")
            .args([signal, pid.trim()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {signal} {}", self.name);
    }

    fn kill(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid.trim()])
                .status();
        }
    }
}

pub struct StackedEtcd {
    pub members: Vec<StackedMember>,
    _dir: tempfile::TempDir,
}

impl Drop for StackedEtcd {
    fn drop(&mut self) {
        for m in &self.members {
            m.kill();
        }
    }
}

/// Writes `text` to `path`, makes it executable, and returns once no process holds it
/// open for writing, so that running it cannot fail with "Text file busy".
///
/// A child forked by another test thread while this write's descriptor is open inherits
/// that descriptor and holds it until its own `exec`; running the file in that window
/// fails with ETXTBSY. Linux refuses a read lease while any process has the file open for
/// writing, so taking one proves the window has closed, for this process's runs and for a
/// node's sshd alike.
pub fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
    wait_until_no_writer(path);
}

fn wait_until_no_writer(path: &Path) {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::open(path).expect("open for reading");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: fcntl with integer arguments on a descriptor this function owns.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_RDLCK) } == 0 {
            // SAFETY: as above; closing the file would drop the lease too.
            unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
            return;
        }
        let err = std::io::Error::last_os_error();
        assert!(
            err.raw_os_error() == Some(libc::EAGAIN),
            "a read lease on {}: {err}",
            path.display()
        );
        assert!(
            Instant::now() < deadline,
            "{} is still open for writing after 10 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl StackedEtcd {
    /// One member per name in `names`, started, with a leader elected.
    pub async fn start(names: &[String]) -> Self {
        Self::start_as(names, |node| node.to_owned()).await
    }

    /// One member per node in `nodes`, named `member_name(node)` (k3s and RKE2 add 8 hex
    /// digits: `server-1-3f2a9c1d`), started, with a leader elected. Members are found and
    /// led by their node's name.
    pub async fn start_as(nodes: &[String], member_name: impl Fn(&str) -> String) -> Self {
        let names: Vec<String> = nodes.iter().map(|n| member_name(n)).collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let token = format!("rg-{}", uuid::Uuid::now_v7().simple());
        let ports: Vec<(u16, u16)> = names.iter().map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = names
            .iter()
            .zip(&ports)
            .map(|(name, (_, peer))| format!("{name}=http://127.0.0.1:{peer}"))
            .collect();
        let members: Vec<StackedMember> = names
            .iter()
            .zip(nodes)
            .zip(&ports)
            .map(|((name, node), (client, peer))| {
                let d = dir.path().join(name);
                std::fs::create_dir_all(&d).expect("member dir");
                let args = member_args(
                    name,
                    &d.join("data"),
                    ("http", *client, *peer),
                    &initial,
                    &token,
                );
                std::fs::write(d.join("args"), args.join("\n") + "\n").expect("args");
                write_executable(&d.join("ctl"), CTL);
                StackedMember {
                    name: name.clone(),
                    node: node.clone(),
                    client_port: *client,
                    dir: d,
                }
            })
            .collect();
        for m in &members {
            m.start();
        }
        let etcd = Self { members, _dir: dir };
        etcd.wait_for_leader().await;
        etcd
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect()
    }

    pub fn client(&self) -> Etcd {
        Etcd::new(EtcdSettings {
            endpoints: self.endpoints(),
            timeout: Duration::from_secs(2),
            tls: None,
        })
        .expect("client")
    }

    /// The member of node `node`.
    pub fn member(&self, node: &str) -> &StackedMember {
        self.members
            .iter()
            .find(|m| m.node == node)
            .unwrap_or_else(|| panic!("no member on {node}"))
    }

    /// The node whose member leads, once one does.
    pub async fn wait_for_leader(&self) -> String {
        let etcd = self.client();
        let started = Instant::now();
        loop {
            if let Ok(leader) = etcd.leader().await {
                return self.name_of(&etcd, leader.id).await;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the etcd cluster elected no leader"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn name_of(&self, etcd: &Etcd, id: u64) -> String {
        let name = etcd
            .members()
            .await
            .expect("member list")
            .into_iter()
            .find(|m| m.id == id)
            .map(|m| m.name)
            .expect("the leader is a member");
        self.members
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.node.clone())
            .expect("a member of this cluster")
    }

    /// The highest raft term the members report, read from etcd itself.
    pub async fn term(&self) -> u64 {
        self.client()
            .answering()
            .await
            .iter()
            .map(|s| s.raft_term)
            .max()
            .expect("a member answers")
    }

    /// Moves leadership to the member of node `node` (before a run: the ground's starting
    /// leader).
    pub async fn lead(&self, node: &str) {
        let etcd = self.client();
        let member = &self.member(node).name;
        let id = etcd
            .members()
            .await
            .expect("member list")
            .into_iter()
            .find(|m| m.name == *member)
            .map(|m| m.id)
            .expect("member");
        super::etcd::lead_to(&etcd, id).await;
        assert_eq!(self.wait_for_leader().await, node);
    }
}
