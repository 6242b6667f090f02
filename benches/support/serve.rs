//! `rollgate serve` as a bench runs it: in a directory of its own (data in `./data`), on a
//! free loopback port, logging warnings only; stopped when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `rollgate serve`.
pub struct Serve {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The API token it generated.
    pub token: String,
    /// A client for it.
    pub http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Serve {
    /// Starts `serve` in `dir` with `env` on top of its defaults; waits until it answers.
    pub fn start_in(dir: tempfile::TempDir, env: &[(&str, String)]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_rollgate"))
            .arg("serve")
            .current_dir(dir.path())
            .env("ROLLGATE__SERVER__LISTEN", format!("127.0.0.1:{port}"))
            .env("ROLLGATE__LOG__LEVEL", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rollgate");
        let token_path = dir.path().join("data/api-token");
        let started = Instant::now();
        while !token_path.exists() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "rollgate did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let token = std::fs::read_to_string(token_path)
            .expect("token")
            .trim()
            .to_owned();
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            token,
            http: reqwest::Client::new(),
            _dir: dir,
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
