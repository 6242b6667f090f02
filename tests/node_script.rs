//! scripts/node-upgrade.sh run directly with stub package tools on PATH that record every
//! call; the stubbed `systemctl restart kubelet` reports to the fake API server.

mod support;

use std::path::Path;
use std::process::Command;
use support::kube::FakeKube;
use support::nodes::node_files;

fn script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/node-upgrade.sh")
        .display()
        .to_string()
}

struct Node {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Node {
    fn run(&self, args: &[&str]) -> (i32, String) {
        let out = Command::new("bash")
            .arg(script())
            .args(args)
            .env_clear()
            .envs(self.env.iter().cloned())
            .output()
            .expect("bash");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code().unwrap_or(-1), text)
    }

    /// Starts the script with `args` on its own thread.
    fn spawn(&self, args: &[&str]) -> std::thread::JoinHandle<std::process::Output> {
        let (script, env) = (script(), self.env.clone());
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        std::thread::spawn(move || {
            Command::new("bash")
                .arg(script)
                .args(args)
                .env_clear()
                .envs(env)
                .output()
                .expect("bash")
        })
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with("dpkg-query"))
            .map(str::to_owned)
            .collect()
    }

    fn clear_calls(&self) {
        std::fs::write(self.dir.path().join("calls.log"), "").expect("log");
    }
}

async fn node(api: &FakeKube, name: &str, minor: &str) -> Node {
    let dir = tempfile::tempdir().expect("dir");
    let env = node_files(dir.path(), name, api, minor);
    Node { dir, env }
}

#[test]
fn the_script_is_shellcheck_clean() {
    let out = Command::new("shellcheck")
        .arg(script())
        .output()
        .expect("shellcheck (Debian package shellcheck) is installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[tokio::test]
async fn a_worker_upgrade_installs_pinned_packages_in_order_and_a_rerun_changes_nothing() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = node(&api, "w1", "1.34").await;
    let (code, out) = w1.run(&["--role", "worker", "--release", "1.34.5"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        w1.calls(),
        [
            "apt-get update -q",
            "apt-cache madison kubeadm",
            "apt-mark unhold kubeadm",
            "apt-get install -y --allow-change-held-packages kubeadm=1.34.5-1.1",
            "apt-mark hold kubeadm",
            "kubeadm upgrade node",
            "apt-mark unhold kubelet",
            "apt-get install -y --allow-change-held-packages kubelet=1.34.5-1.1",
            "apt-mark hold kubelet",
            "apt-mark unhold kubectl",
            "apt-get install -y --allow-change-held-packages kubectl=1.34.5-1.1",
            "apt-mark hold kubectl",
            "systemctl daemon-reload",
            "systemctl restart kubelet",
        ]
    );
    assert_eq!(
        api.node("w1")["status"]["nodeInfo"]["kubeletVersion"],
        "v1.34.5"
    );

    w1.clear_calls();
    let (code, out) = w1.run(&["--role", "worker", "--release", "1.34.5"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("kubeadm 1.34.5-1.1 already installed"),
        "{out}"
    );
    assert!(
        !w1.calls().iter().any(|c| c.starts_with("apt-get install")),
        "{:?}",
        w1.calls()
    );
}

/// A real repository lists every build of every patch; the script must read madison's
/// whole answer (a reader that stops early kills apt-cache with SIGPIPE, and pipefail
/// makes that the script's exit status).
#[tokio::test]
async fn a_long_package_list_is_read_to_its_end() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = node(&api, "w1", "1.34").await;
    let older: Vec<String> = (0..3000).map(|i| format!("1.34.1-0.{i}")).collect();
    std::fs::write(
        w1.dir.path().join("state/repo"),
        format!("1.34.5-1.1\n{}\n", older.join("\n")),
    )
    .expect("repo");
    let (code, out) = w1.run(&["--role", "worker", "--release", "1.34.5"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        w1.calls()
            .contains(&"apt-get install -y --allow-change-held-packages kubeadm=1.34.5-1.1".into()),
        "{:?}",
        w1.calls()
    );
}

#[tokio::test]
async fn the_control_plane_runs_kubeadm_upgrade_apply() {
    let api = FakeKube::start().await;
    api.add_node("cp", true, "1.34.2", "1.7.20");
    let cp = node(&api, "cp", "1.34").await;
    let (code, out) = cp.run(&["--role", "control-plane", "--release", "1.34.5"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        cp.calls()
            .contains(&"kubeadm upgrade apply -y v1.34.5".to_owned())
    );
}

#[tokio::test]
async fn a_minor_upgrade_needs_the_repository_of_the_new_minor() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = node(&api, "w1", "1.34").await;
    let (code, out) = w1.run(&["--role", "worker", "--release", "1.35.0"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("kubeadm 1.35.0 is not in the apt repository"),
        "{out}"
    );
    assert!(!w1.calls().iter().any(|c| c.starts_with("apt-get install")));

    let (code, out) = w1.run(&["--apt-minor", "1.35"]);
    assert_eq!(code, 0, "{out}");
    let source = std::fs::read_to_string(w1.dir.path().join("kubernetes.list")).unwrap();
    assert!(source.contains("/v1.35/deb/"), "{source}");
    let (code, out) = w1.run(&["--apt-minor", "1.35"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already at v1.35"), "{out}");
    let (code, out) = w1.run(&["--role", "worker", "--release", "1.35.0"]);
    assert_eq!(code, 0, "{out}");
}

#[tokio::test]
async fn bad_arguments_stop_the_script_before_any_tool_runs() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = node(&api, "w1", "1.34").await;
    let cases: &[(&[&str], &str)] = &[
        (
            &["--role", "worker", "--release", "1.34.5;id"],
            "--release must be MAJOR.MINOR.PATCH",
        ),
        (
            &["--role", "worker", "--release", "$(id)"],
            "--release must be MAJOR.MINOR.PATCH",
        ),
        (
            &["--role", "worker", "--release", "v1.34.5"],
            "--release must be MAJOR.MINOR.PATCH",
        ),
        (
            &["--role", "master", "--release", "1.34.5"],
            "--role must be control-plane or worker",
        ),
        (
            &["--containerd", "1.7"],
            "--containerd must be MAJOR.MINOR.PATCH",
        ),
        (
            &["--apt-minor", "1.35/../x"],
            "--apt-minor must be MAJOR.MINOR",
        ),
        (&["--release"], "--release needs a value"),
        (&["--bogus"], "unknown argument: --bogus"),
    ];
    for (args, why) in cases {
        let (code, out) = w1.run(args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(out.contains(why), "{args:?}: {out}");
    }
    assert!(w1.calls().is_empty(), "{:?}", w1.calls());
}

#[tokio::test]
async fn a_second_run_while_the_first_still_runs_waits_for_it_and_repeats_no_kubeadm_upgrade() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = node(&api, "w1", "1.34").await;
    // The first run's kubeadm is held (as if slow, its SSH session gone); a second run
    // starts meanwhile, as rollgate's redo would.
    let hold = w1.dir.path().join("state/hold");
    std::fs::write(&hold, "").expect("hold");
    let args = ["--role", "worker", "--release", "1.34.5"];
    let first = w1.spawn(&args);
    support::eventually(
        "the first run's kubeadm upgrade",
        std::time::Duration::from_secs(10),
        || async {
            w1.calls()
                .contains(&"kubeadm upgrade node".to_owned())
                .then_some(())
        },
    )
    .await;
    let second = w1.spawn(&args);
    support::eventually(
        "the second run to wait for the lock",
        std::time::Duration::from_secs(10),
        || async {
            let lock = w1.dir.path().join("state/rollgate/node-upgrade.lock");
            let waiting = Command::new("bash")
                .arg("-c")
                .arg(format!("! flock -n {} true", lock.display()))
                .status()
                .is_ok_and(|s| s.success());
            (waiting && !second.is_finished()).then_some(())
        },
    )
    .await;
    std::fs::remove_file(&hold).expect("release");
    let first = first.join().expect("first run");
    let second = second.join().expect("second run");
    assert!(first.status.success(), "{first:?}");
    let out = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success(), "{second:?}");
    assert!(
        out.contains("another node-upgrade.sh runs on this node"),
        "{out}"
    );
    assert!(
        out.contains("kubeadm upgrade node to 1.34.5 already done"),
        "{out}"
    );
    let upgrades = w1
        .calls()
        .iter()
        .filter(|c| *c == "kubeadm upgrade node")
        .count();
    assert_eq!(upgrades, 1, "{:?}", w1.calls());
}
