//! A PostgreSQL server of the test's own: Debian's `postgresql` binaries, a cluster made
//! by `initdb` in a temp dir, listening on a loopback port, stopped and started by PID
//! (as the `postgres` user when the tests run as root, which the server requires).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The role the tests (and rollgate) connect as; trust authentication on loopback.
pub const ROLE: &str = "rollgate";

pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
    child: Option<Child>,
}

/// The newest `/usr/lib/postgresql/N/bin` (Debian's layout).
fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect(
            "PostgreSQL is installed (/usr/lib/postgresql; scripts/test.sh installs postgresql)",
        )
        .filter_map(|e| {
            let e = e.ok()?;
            let n = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((n, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("a PostgreSQL server under /usr/lib/postgresql")
        .1
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

impl Postgres {
    /// `initdb` and start a server on a free loopback port.
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let data = dir.path().join("data");
        let out = Self::command(&bin, "initdb")
            .args([
                "-D",
                data.to_str().unwrap(),
                "-U",
                ROLE,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut pg = Self {
            dir,
            bin,
            port: super::free_port(),
            child: None,
        };
        pg.spawn();
        pg
    }

    fn command(bin: &std::path::Path, program: &str) -> Command {
        let path = bin.join(program);
        if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        }
    }

    fn spawn(&mut self) {
        let data = self.dir.path().join("data");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .expect("log");
        std::fs::set_permissions(
            self.dir.path().join("postgres.log"),
            std::fs::Permissions::from_mode(0o666),
        )
        .expect("chmod log");
        let child = Self::command(&self.bin, "postgres")
            .args(["-D", data.to_str().unwrap()])
            .args(["-p", &self.port.to_string()])
            .args(["-k", self.dir.path().to_str().unwrap()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "max_connections=200"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("postgres starts");
        self.child = Some(child);
        // Listening is not enough: a server still starting up refuses sessions.
        let start = Instant::now();
        while !self.accepting() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "PostgreSQL did not accept sessions within 30 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop_with_this_process();
    }

    /// Stops the server (SIGQUIT to its postmaster, by PID) and removes its files once this
    /// test process is gone, however it ends: a server a `static` holds is never dropped.
    fn stop_with_this_process(&self) {
        let Some(pid) = self.postmaster_pid() else {
            return;
        };
        let dir = self.dir.path().display().to_string();
        // Only that postmaster: after a restart its PID may be another process's.
        let script = format!(
            "while kill -0 {me} 2>/dev/null; do sleep 1; done; \
             if grep -qF '{dir}' /proc/{pid}/cmdline 2>/dev/null; then kill -QUIT {pid}; \
             for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 {pid} 2>/dev/null || break; sleep 1; done; fi; \
             rm -rf '{dir}'",
            me = std::process::id()
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
    }

    /// Whether the server accepts sessions now (`pg_isready`).
    fn accepting(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// The postmaster's PID, from its pid file (the child may be `runuser`).
    fn postmaster_pid(&self) -> Option<String> {
        let pid_file = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid")).ok()?;
        pid_file.lines().next().map(str::to_owned)
    }

    fn signal(&mut self, signal: &str) {
        if let Some(mut child) = self.child.take() {
            let pid = self
                .postmaster_pid()
                .unwrap_or_else(|| child.id().to_string());
            let _ = Command::new("kill").args([signal, &pid]).status();
            let _ = child.wait();
        }
    }

    /// Stops the server (fast shutdown: SIGINT to the postmaster, by PID) and waits for it.
    pub fn stop(&mut self) {
        self.signal("-INT");
    }

    /// Starts the stopped server again on the same port and data.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "running already");
        self.spawn();
    }

    /// A new, empty database; its URL (no password: trust on loopback).
    pub async fn database(&self) -> String {
        let name = format!("rg_{}", uuid::Uuid::now_v7().simple());
        let client = self.client("postgres").await;
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        self.url(&name)
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://{ROLE}@127.0.0.1:{}/{database}", self.port)
    }

    /// A client of `database` (its connection driven in the background).
    pub async fn client(&self, database: &str) -> tokio_postgres::Client {
        let url = self.url(database);
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test PostgreSQL");
        tokio::spawn(connection);
        client
    }

    /// A client of the database at `url` (one [`Postgres::database`] made).
    pub async fn client_of(url: &str) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test PostgreSQL");
        tokio::spawn(connection);
        client
    }

    /// rollgate's settings for the database at `url`, with several replicas' timings
    /// scaled for a test: a 2 s lease (renewed every 0.67 s), 600 ms operations.
    pub fn env(url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("ROLLGATE__STORE__BACKEND", "postgres".into()),
            ("ROLLGATE__STORE__URL", url.into()),
            ("ROLLGATE__STORE__LEASE_TTL", "2s".into()),
            ("ROLLGATE__STORE__TIMEOUT", "600ms".into()),
        ]
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.signal("-QUIT");
    }
}
