//! scripts/node-upgrade.sh run directly with stub package tools on PATH that record every
//! call, and with Debian's own apt and dpkg in a root of the node's own over repositories
//! laid out as pkgs.k8s.io's; the stubbed `systemctl restart kubelet` reports to the fake
//! API server.

mod support;

use std::path::Path;
use std::process::Command;
use support::k3s::{self, Distro, ReleaseMirror};
use support::kube::FakeKube;
use support::nodes::{dpkg_field, node_files, rpm_field};

fn script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/node-upgrade.sh")
        .display()
        .to_string()
}

fn k3s_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/node-k3s.sh")
        .display()
        .to_string()
}

struct Node {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Node {
    fn run(&self, args: &[&str]) -> (i32, String) {
        self.run_script(&script(), args)
    }

    fn run_script(&self, script: &str, args: &[&str]) -> (i32, String) {
        let out = Command::new("bash")
            .arg(script)
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
        self.spawn_script(&script(), args)
    }

    fn spawn_script(
        &self,
        script: &str,
        args: &[&str],
    ) -> std::thread::JoinHandle<std::process::Output> {
        let (script, env) = (script.to_owned(), self.env.clone());
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
fn the_scripts_are_shellcheck_clean() {
    let out = Command::new("shellcheck")
        .arg(script())
        .arg(k3s_script())
        .arg(reboot_managers_script())
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

    // The file is read whole before it is written back (a pipe into `tee FILE` from a
    // reader of FILE may find it already truncated): the rest of the line survives every
    // rewrite.
    let path = w1.dir.path().join("kubernetes.list");
    for round in 0..30 {
        let minor = if round % 2 == 0 { "1.34" } else { "1.35" };
        let (code, out) = w1.run(&["--apt-minor", minor]);
        assert_eq!(code, 0, "round {round}: {out}");
        let source = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            source,
            format!(
                "deb [signed-by=/etc/apt/keyrings/kubernetes.gpg] https://pkgs.k8s.io/core:/stable:/v{minor}/deb/ /\n"
            ),
            "round {round}"
        );
    }
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

/// `--check` as pre-flight runs it: an apt node answers ok; a node of an OS it does not serve is
/// refused with exit 3 in one line naming the OS and its package manager; a login that is
/// not root needs a sudo rule for every privileged command the script and a reboot run,
/// and each one missing is named.
#[tokio::test]
async fn check_names_an_unsupported_os_and_every_missing_sudo_rule() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = node(&api, "w1", "1.34").await;
    let state = w1.dir.path().join("state");
    let (code, out) = w1.run(&["--check"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        !w1.calls().iter().any(|c| c.starts_with("sudo")),
        "root needs no sudo: {:?}",
        w1.calls()
    );

    std::fs::write(state.join("non-root"), "").unwrap();
    let (code, out) = w1.run(&["--check"]);
    assert_eq!(code, 0, "with deploy/node/sudoers: {out}");
    for asked in [
        "sudo -n -l systemctl reboot",
        "sudo -n -l apt-get install -y --allow-change-held-packages kubeadm=1.0.0-1.1",
        "sudo -n -l kubeadm upgrade node",
    ] {
        assert!(
            w1.calls().iter().any(|c| c == asked),
            "{asked}: {:?}",
            w1.calls()
        );
    }

    std::fs::write(state.join("sudo-refuses"), "").unwrap();
    let (code, out) = w1.run(&["--check"]);
    assert_eq!(code, 2, "{out}");
    for rule in [
        "sudo does not let rollgate run these without a password: apt-get update -q; ",
        "; systemctl reboot; ",
        "; kubeadm upgrade apply -y v1.0.0; ",
        "add deploy/node/sudoers to /etc/sudoers.d",
    ] {
        assert!(out.contains(rule), "{rule}: {out}");
    }

    for (os, says) in [
        (
            "NAME=\"Alpine Linux\"\nID=alpine\nVERSION_ID=3.20.3\n",
            "node-upgrade: runs Alpine Linux 3.20.3 (no apt, dnf or zypper): the kubeadm node script supports apt (Debian, Ubuntu), dnf (RHEL, Rocky, Alma, Fedora) and zypper (SUSE, openSUSE) nodes\n",
        ),
        (
            "NAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\nVERSION_ID=4081.2.0\n",
            "node-upgrade: runs Flatcar Container Linux by Kinvolk 4081.2.0 (no apt, dnf or zypper): the kubeadm node script supports apt (Debian, Ubuntu), dnf (RHEL, Rocky, Alma, Fedora) and zypper (SUSE, openSUSE) nodes\n",
        ),
    ] {
        std::fs::write(w1.dir.path().join("os-release"), os).unwrap();
        let (code, out) = w1.run(&["--check"]);
        assert_eq!((code, out.as_str()), (3, says));
    }
}

/// `deploy/node/sudoers` as the real sudo reads it: visudo accepts it, and every command
/// the node script's `--check` asks sudo about (taken from a run of the script, with the
/// shipped paths) is allowed for `rollgate`, while commands beside them are not. sudo reads
/// the file through a private mount namespace (unshare), so the machine's own sudoers and
/// users are never touched.
#[tokio::test]
async fn the_shipped_sudoers_allows_what_the_node_script_asks_and_nothing_beside() {
    let sudoers = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/node/sudoers");
    let out = Command::new("visudo")
        .arg("-cf")
        .arg(&sudoers)
        .output()
        .expect("visudo (scripts/test.sh installs sudo)");
    assert!(
        out.status.success(),
        "visudo: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // What the script asks, with the paths a node has, on an apt node and a dnf node.
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let mut w1 = node(&api, "w1", "1.34").await;
    std::fs::write(w1.dir.path().join("state/non-root"), "").unwrap();
    for (key, value) in [
        ("K8S_APT_SOURCE", "/etc/apt/sources.list.d/kubernetes.list"),
        ("K8S_RPM_REPO", "/etc/yum.repos.d/kubernetes.repo"),
        ("ROLLGATE_STATE_DIR", "/var/lib/rollgate"),
    ] {
        w1.env.retain(|(k, _)| k != key);
        w1.env.push((key.into(), value.into()));
    }
    let mut asked: Vec<String> = Vec::new();
    for os in [
        None,
        Some(support::nodes::ROCKY),
        Some(support::nodes::OPENSUSE),
    ] {
        if let Some(os) = os {
            std::fs::write(w1.dir.path().join("os-release"), os).unwrap();
        }
        w1.clear_calls();
        let (code, out) = w1.run(&["--check"]);
        assert_eq!(code, 0, "{out}");
        asked.extend(
            w1.calls()
                .iter()
                .filter_map(|c| c.strip_prefix("sudo -n -l ").map(str::to_owned)),
        );
    }
    // A k3s and an RKE2 node, its binary where the installer puts it (missing here: the
    // check names it after asking sudo).
    w1.env
        .push(("ROLLGATE_BIN_DIR".into(), "/usr/local/bin".into()));
    for distribution in ["k3s", "rke2"] {
        w1.clear_calls();
        let (code, out) =
            w1.run_script(&k3s_script(), &["--check", "--distribution", distribution]);
        assert_eq!(code, 2, "{out}");
        assert!(
            out.contains(&format!(
                "/usr/local/bin/{distribution} is missing: this is not a {distribution} node"
            )),
            "{out}"
        );
        asked.extend(
            w1.calls()
                .iter()
                .filter_map(|c| c.strip_prefix("sudo -n -l ").map(str::to_owned)),
        );
    }
    assert!(
        [
            "apt-get ",
            "dnf ",
            "zypper ",
            "mv -f /usr/local/bin/k3s.new",
            "systemctl restart rke2-agent"
        ]
        .iter()
        .all(|tool| asked.iter().any(|a| a.starts_with(tool))),
        "{asked:?}"
    );

    let refused = [
        "systemctl poweroff",
        "systemctl restart sshd",
        "apt-get install -y --allow-change-held-packages nginx=1.0",
        "apt-get remove kubelet",
        "apt-mark hold nginx",
        "dnf -y --disableexcludes=kubernetes install nginx-1.0",
        "dnf -y remove kubelet",
        "dnf -q -y versionlock clear",
        "zypper --non-interactive install -y --oldpackage nginx=1.0",
        "zypper --non-interactive removelock sshd",
        "tee /etc/shadow",
        "kubeadm reset -f",
        "install -d -m 0755 -o rollgate /etc",
        "install -m 0755 /tmp/evil /usr/local/bin/k3s.new",
        "install -m 0755 /var/lib/rollgate/stage/v1/k3s /usr/local/bin/kubelet",
        "mv -f /tmp/evil /usr/local/bin/k3s",
        "ln -f /etc/shadow /usr/local/bin/k3s.previous",
        "systemctl restart k3s-evil",
        "systemctl stop rke2-server",
        "bash",
    ];
    let root = tempfile::tempdir().unwrap();
    let (passwd, rules) = (root.path().join("passwd"), root.path().join("sudoers"));
    let mut users = std::fs::read_to_string("/etc/passwd").unwrap();
    users.push_str("rollgate:x:64999:64999::/nonexistent:/usr/sbin/nologin\n");
    std::fs::write(&passwd, users).unwrap();
    std::fs::write(
        &rules,
        format!(
            "Defaults secure_path=\"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\nroot ALL=(ALL:ALL) ALL\n{}",
            std::fs::read_to_string(&sudoers).unwrap()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .arg("0440")
        .arg(&rules)
        .status()
        .unwrap();
    // sudo lists only commands that exist: this machine need not have kubeadm or
    // systemctl, so the namespace sees stand-ins over /usr/bin (an overlay, read-only).
    let tools = root.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    for tool in [
        "apt-get",
        "apt-mark",
        "dnf",
        "zypper",
        "tee",
        "install",
        "ln",
        "mv",
        "kubeadm",
        "systemctl",
        "bash",
    ] {
        std::fs::write(tools.join(tool), "#!/bin/sh\n").unwrap();
        Command::new("chmod")
            .arg("+x")
            .arg(tools.join(tool))
            .status()
            .unwrap();
    }
    // One line per probe: "<exit status> <command>".
    let mut script = format!(
        "mount -t overlay overlay -o lowerdir={}:/usr/bin /usr/bin && mount --bind {} /etc/passwd && mount --bind {} /etc/sudoers || exit 99\n",
        tools.display(),
        passwd.display(),
        rules.display()
    );
    for probe in asked.iter().map(String::as_str).chain(refused) {
        script.push_str(&format!(
            "sudo -n -l -U rollgate {probe} >/dev/null 2>&1; echo \"$? {probe}\"\n"
        ));
    }
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare (util-linux)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in lines.lines() {
        let (status, probe) = line.split_once(' ').unwrap();
        let want = if refused.contains(&probe) { "1" } else { "0" };
        assert_eq!(status, want, "sudo -l -U rollgate {probe}\n{lines}");
    }
    assert_eq!(
        lines.lines().count(),
        asked.len() + refused.len(),
        "{lines}"
    );
}

/// A node whose package tools are Debian's own apt and dpkg, in a root of its own, over
/// repositories laid out as pkgs.k8s.io's; kubeadm, kubelet and kubectl installed at
/// `installed` and held.
struct AptNode {
    node: Node,
    /// dpkg's database: the witness of what is installed and held.
    admin: std::path::PathBuf,
}

impl AptNode {
    async fn start(api: &FakeKube, name: &str, minor: &str, installed: &str) -> Self {
        let mut node = node(api, name, minor).await;
        let admin = support::nodes::real_apt(node.dir.path(), &mut node.env, minor, installed);
        Self { node, admin }
    }

    /// What dpkg's database says of `pkg`: its version and whether it is held.
    fn package(&self, pkg: &str) -> (String, String) {
        (
            dpkg_field(&self.admin, pkg, "${Version}"),
            dpkg_field(&self.admin, pkg, "${db:Status-Want}"),
        )
    }

    /// Every package dpkg installed or upgraded in this root, from its own log.
    fn dpkg_changes(&self) -> Vec<String> {
        let log = self.node.dir.path().join("root/var/log/dpkg.log");
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" install ") || l.contains(" upgrade "))
            .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
            .collect()
    }

    fn source(&self) -> String {
        std::fs::read_to_string(
            self.node
                .dir
                .path()
                .join("root/etc/apt/sources.list.d/kubernetes.list"),
        )
        .unwrap_or_default()
    }
}

/// On Debian's own apt and dpkg: a patch upgrade installs the release the repository
/// lists for each of kubeadm, kubelet and kubectl, the holds stand again, the kubelet
/// reports it; a rerun installs nothing; a release the repository lacks is refused before
/// anything changes.
#[tokio::test]
async fn on_a_real_apt_a_worker_upgrade_installs_the_release_and_the_holds_stand_again() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = AptNode::start(&api, "w1", "1.34", "1.34.2-1.1").await;
    let before = w1.dpkg_changes().len();
    let (code, out) = w1.node.run(&["--check"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok: kubeadm 1.34.2-1.1, kubelet 1.34.2-1.1"),
        "{out}"
    );

    let (code, out) = w1.node.run(&["--role", "worker", "--release", "1.34.4"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("kubeadm 1.34.4 is not in the apt repository"),
        "{out}"
    );
    assert_eq!(w1.dpkg_changes().len(), before, "nothing installed");

    let (code, out) = w1.node.run(&["--role", "worker", "--release", "1.34.5"]);
    assert_eq!(code, 0, "{out}");
    for pkg in ["kubeadm", "kubelet", "kubectl"] {
        assert_eq!(
            w1.package(pkg),
            ("1.34.5-1.1".into(), "hold".into()),
            "{pkg}"
        );
    }
    assert_eq!(
        w1.dpkg_changes()[before..],
        [
            "upgrade kubeadm:all 1.34.2-1.1 1.34.5-1.1",
            "upgrade kubelet:all 1.34.2-1.1 1.34.5-1.1",
            "upgrade kubectl:all 1.34.2-1.1 1.34.5-1.1",
        ]
    );
    assert_eq!(
        api.node("w1")["status"]["nodeInfo"]["kubeletVersion"],
        "v1.34.5"
    );

    let changed = w1.dpkg_changes().len();
    let (code, out) = w1.node.run(&["--role", "worker", "--release", "1.34.5"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(w1.dpkg_changes().len(), changed, "a rerun installs nothing");
}

/// On Debian's own apt: the release of the next minor is not in the node's repository
/// until `--apt-minor` points the source at it; then it installs, and the holds stand.
#[tokio::test]
async fn on_a_real_apt_a_minor_upgrade_moves_the_source_to_the_new_minor() {
    let api = FakeKube::start().await;
    api.add_node("cp", true, "1.34.5", "1.7.20");
    let cp = AptNode::start(&api, "cp", "1.34", "1.34.5-1.1").await;
    let (code, out) = cp
        .node
        .run(&["--role", "control-plane", "--release", "1.35.0"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("kubeadm 1.35.0 is not in the apt repository"),
        "{out}"
    );
    assert_eq!(cp.package("kubeadm"), ("1.34.5-1.1".into(), "hold".into()));

    let (code, out) = cp.node.run(&["--apt-minor", "1.35"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        cp.source().contains("/core:/stable:/v1.35/deb/ /"),
        "{}",
        cp.source()
    );
    let (code, out) = cp
        .node
        .run(&["--role", "control-plane", "--release", "1.35.0"]);
    assert_eq!(code, 0, "{out}");
    for pkg in ["kubeadm", "kubelet", "kubectl"] {
        assert_eq!(
            cp.package(pkg),
            ("1.35.0-1.1".into(), "hold".into()),
            "{pkg}"
        );
    }
    assert!(
        cp.node
            .calls()
            .contains(&"kubeadm upgrade apply -y v1.35.0".to_owned()),
        "{:?}",
        cp.node.calls()
    );
}

/// An rpm node whose package tools are Debian's own dnf (Rocky) or zypper (openSUSE) and
/// rpm, in a root of its own, over repositories laid out as pkgs.k8s.io's, set up as the
/// kubeadm docs say (dnf's repository excludes the Kubernetes packages); kubeadm, kubelet
/// and kubectl installed at `installed` and locked there (versionlock, `zypper addlock`).
struct RpmNode {
    node: Node,
    root: std::path::PathBuf,
    zypper: bool,
}

impl RpmNode {
    /// [`RpmNode`] with dnf.
    async fn dnf(api: &FakeKube, name: &str, minor: &str, installed: &str) -> Self {
        let mut node = node(api, name, minor).await;
        let root = support::nodes::real_dnf(node.dir.path(), &mut node.env, minor, installed, true);
        Self {
            node,
            root,
            zypper: false,
        }
    }

    /// [`RpmNode`] with zypper.
    async fn zypper(api: &FakeKube, name: &str, minor: &str, installed: &str) -> Self {
        let mut node = node(api, name, minor).await;
        let root =
            support::nodes::real_zypper(node.dir.path(), &mut node.env, minor, installed, true);
        Self {
            node,
            root,
            zypper: true,
        }
    }

    /// rpm's database: the version of `pkg` and when it was installed.
    fn package(&self, pkg: &str) -> (String, String) {
        (
            rpm_field(&self.root, pkg, "%{VERSION}-%{RELEASE}"),
            rpm_field(&self.root, pkg, "%{INSTALLTIME}"),
        )
    }

    /// dnf's versionlock list, as the plugin keeps it; zypper's locked names.
    fn locks(&self) -> Vec<String> {
        if self.zypper {
            return support::nodes::zypper_locks(&self.root);
        }
        std::fs::read_to_string(self.root.join("etc/dnf/plugins/versionlock.list"))
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    }

    /// `--check` passes at 1.34.2; 1.34.4, which the repository lacks, is refused naming
    /// `manager`'s repository with nothing installed; 1.34.5 installs for kubeadm, kubelet
    /// and kubectl, and the kubelet reports it to the API server (the node is `w1`).
    fn patch_from_1_34_2_to_1_34_5(&self, api: &FakeKube, manager: &str) {
        let (code, out) = self.node.run(&["--check"]);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("ok: kubeadm 1.34.2-150500.1.1, kubelet 1.34.2-150500.1.1"),
            "{out}"
        );
        let before = self.package("kubeadm");
        let (code, out) = self.node.run(&["--role", "worker", "--release", "1.34.4"]);
        assert_eq!(code, 2, "{out}");
        assert!(
            out.contains(&format!(
                "kubeadm 1.34.4 is not in the {manager} repository"
            )),
            "{out}"
        );
        assert_eq!(self.package("kubeadm"), before, "nothing installed");

        let (code, out) = self.node.run(&["--role", "worker", "--release", "1.34.5"]);
        assert_eq!(code, 0, "{out}");
        for pkg in ["kubeadm", "kubelet", "kubectl"] {
            assert_eq!(self.package(pkg).0, "1.34.5-150500.1.1", "{pkg}");
        }
        assert_eq!(
            api.node("w1")["status"]["nodeInfo"]["kubeletVersion"],
            "v1.34.5"
        );
    }

    /// Running 1.34.5 again says it is installed and installs nothing (rpm's install time
    /// stays).
    fn rerun_installs_nothing(&self) {
        let installed = self.package("kubeadm");
        let (code, out) = self.node.run(&["--role", "worker", "--release", "1.34.5"]);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains("kubeadm 1.34.5-150500.1.1 already installed"),
            "{out}"
        );
        assert_eq!(
            self.package("kubeadm"),
            installed,
            "a rerun installs nothing"
        );
    }

    fn repo_file(&self) -> String {
        let file = if self.zypper {
            "etc/zypp/repos.d/kubernetes.repo"
        } else {
            "etc/yum.repos.d/kubernetes.repo"
        };
        std::fs::read_to_string(self.root.join(file)).unwrap_or_default()
    }
}

/// On Debian's own dnf and rpm (a Rocky node): `--check` passes; a release the repository
/// lacks is refused naming the repository, nothing installed; a patch upgrade installs the
/// release for kubeadm, kubelet and kubectl past the repository's exclude, the locks stand
/// again at the new version and the exclude stays; the kubelet reports it; a rerun
/// installs nothing.
#[tokio::test]
async fn on_a_real_dnf_a_worker_upgrade_installs_the_release_and_the_locks_stand_again() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = RpmNode::dnf(&api, "w1", "1.34", "1.34.2-150500.1.1").await;
    w1.patch_from_1_34_2_to_1_34_5(&api, "dnf");
    let mut locks = w1.locks();
    locks.sort();
    assert_eq!(
        locks,
        [
            "kubeadm-0:1.34.5-150500.1.1.*",
            "kubectl-0:1.34.5-150500.1.1.*",
            "kubelet-0:1.34.5-150500.1.1.*",
        ]
    );
    assert!(
        w1.repo_file()
            .contains("exclude=kubelet kubeadm kubectl cri-tools kubernetes-cni"),
        "{}",
        w1.repo_file()
    );
    w1.rerun_installs_nothing();

    // What `rollgate detect` reads: dnf's lists, as `apt-cache madison` lines, which its
    // own reader takes.
    let (code, out) = w1.node.run(&["--available"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("   kubeadm | 1.34.5-150500.1.1 | kubernetes"),
        "{out}"
    );
    let releases = rollgate::workflows::detect::plan::madison_releases(
        &out,
        rollgate::workflows::detect::plan::minor_of("1.34.0".parse().unwrap()),
    );
    let releases: Vec<String> = releases.iter().map(ToString::to_string).collect();
    assert_eq!(releases, ["1.34.2", "1.34.3", "1.34.5"], "{out}");
}

/// openEuler's /etc/os-release names no family the script knows (its ID_LIKE is empty), yet
/// its package manager is dnf: refused as an unknown OS, then served with `--manager dnf`
/// (what the node's `rollgate.io/package-manager=dnf` label makes rollgate pass), on
/// Debian's own dnf; a manager the script does not drive is refused before anything runs.
#[tokio::test]
async fn a_named_package_manager_serves_an_os_the_script_does_not_know() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.34.2");
    let w1 = RpmNode::dnf(&api, "w1", "1.34", "1.34.2-150500.1.1").await;
    std::fs::write(
        w1.node.dir.path().join("os-release"),
        "NAME=\"openEuler\"\nVERSION=\"24.03 (LTS)\"\nID=\"openEuler\"\nVERSION_ID=\"24.03\"\nPRETTY_NAME=\"openEuler 24.03 (LTS)\"\n",
    )
    .unwrap();
    let (code, out) = w1.node.run(&["--check"]);
    assert_eq!(code, 3, "{out}");
    assert!(
        out.contains("runs openEuler 24.03 (no apt, dnf or zypper)"),
        "{out}"
    );
    let (code, out) = w1.node.run(&["--manager", "pacman", "--check"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--manager must be apt, dnf or zypper, got 'pacman'"),
        "{out}"
    );
    let (code, out) = w1.node.run(&["--check", "--manager", "dnf"]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = w1.node.run(&[
        "--role",
        "worker",
        "--release",
        "1.34.5",
        "--manager",
        "dnf",
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(w1.package("kubelet").0, "1.34.5-150500.1.1");
}

/// On Debian's own dnf: the release of the next minor is not in the node's repository
/// until `--apt-minor` points the repository file at it (its exclude kept); then it
/// installs, and the locks stand at it.
#[tokio::test]
async fn on_a_real_dnf_a_minor_upgrade_moves_the_repository_to_the_new_minor() {
    let api = FakeKube::start().await;
    api.add_node("cp", true, "1.34.5", "1.7.20");
    let cp = RpmNode::dnf(&api, "cp", "1.34", "1.34.5-150500.1.1").await;
    let (code, out) = cp
        .node
        .run(&["--role", "control-plane", "--release", "1.35.0"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("kubeadm 1.35.0 is not in the dnf repository"),
        "{out}"
    );

    let (code, out) = cp.node.run(&["--apt-minor", "1.35"]);
    assert_eq!(code, 0, "{out}");
    let repo = cp.repo_file();
    assert!(repo.contains("/core:/stable:/v1.35/rpm/"), "{repo}");
    assert!(!repo.contains("/v1.34/"), "{repo}");
    assert!(
        repo.contains("exclude=kubelet kubeadm kubectl cri-tools kubernetes-cni"),
        "{repo}"
    );
    let (code, out) = cp
        .node
        .run(&["--role", "control-plane", "--release", "1.35.0"]);
    assert_eq!(code, 0, "{out}");
    for pkg in ["kubeadm", "kubelet", "kubectl"] {
        assert_eq!(cp.package(pkg).0, "1.35.0-150500.1.1", "{pkg}");
        assert!(
            cp.locks().contains(&format!("{pkg}-0:1.35.0-150500.1.1.*")),
            "{pkg}: {:?}",
            cp.locks()
        );
    }
    assert!(
        cp.node
            .calls()
            .contains(&"kubeadm upgrade apply -y v1.35.0".to_owned()),
        "{:?}",
        cp.node.calls()
    );
}

/// On Debian's own dnf: a run killed between kubeadm's install and its lock (as a power
/// cut leaves it: the lock taken off, the new version in, the marker that it must go back)
/// is finished by the redo, which locks it again at the new version and installs nothing
/// twice.
#[tokio::test]
async fn on_a_real_dnf_a_redo_after_a_kill_between_install_and_lock_puts_the_lock_back() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = RpmNode::dnf(&api, "w1", "1.34", "1.34.2-150500.1.1").await;
    let dnf = |args: &[&str]| {
        let out = Command::new(w1.node.dir.path().join("bin/dnf"))
            .args(args)
            .env("RPM_ROOT", &w1.root)
            .output()
            .expect("dnf");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    dnf(&["-q", "-y", "versionlock", "delete", "kubeadm"]);
    dnf(&[
        "-q",
        "-y",
        "--disableexcludes=kubernetes",
        "install",
        "kubeadm-1.34.5-150500.1.1",
    ]);
    let state = w1.node.dir.path().join("state/rollgate");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("relock-kubeadm"), "").unwrap();
    let installed = w1.package("kubeadm");
    assert!(!w1.locks().iter().any(|l| l.starts_with("kubeadm-")));

    let (code, out) = w1.node.run(&["--role", "worker", "--release", "1.34.5"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(w1.package("kubeadm"), installed, "kubeadm installed twice");
    for pkg in ["kubeadm", "kubelet", "kubectl"] {
        assert!(
            w1.locks().contains(&format!("{pkg}-0:1.34.5-150500.1.1.*")),
            "{pkg}: {:?}",
            w1.locks()
        );
    }
    assert!(!state.join("relock-kubeadm").exists());
}

/// On Debian's own zypper and rpm (an openSUSE node): `--check` passes; a release the
/// repository lacks is refused naming it, nothing installed; a patch upgrade installs the
/// release for kubeadm, kubelet and kubectl and their locks stand again; a rerun installs
/// nothing; the next minor installs once `--apt-minor` points the repository file at it;
/// detection's list reads as madison lines.
#[tokio::test]
async fn on_a_real_zypper_a_patch_and_a_minor_upgrade_install_and_the_locks_stand_again() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let w1 = RpmNode::zypper(&api, "w1", "1.34", "1.34.2-150500.1.1").await;
    w1.patch_from_1_34_2_to_1_34_5(&api, "zypper");
    let mut locks = w1.locks();
    locks.sort();
    assert_eq!(locks, ["kubeadm", "kubectl", "kubelet"]);
    w1.rerun_installs_nothing();

    let (code, out) = w1.node.run(&["--available"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("   kubeadm | 1.34.5-150500.1.1 | Kubernetes"),
        "{out}"
    );

    let (code, out) = w1.node.run(&["--apt-minor", "1.35"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        w1.repo_file().contains("/core:/stable:/v1.35/rpm/"),
        "{}",
        w1.repo_file()
    );
    let (code, out) = w1.node.run(&["--role", "worker", "--release", "1.35.0"]);
    assert_eq!(code, 0, "{out}");
    for pkg in ["kubeadm", "kubelet", "kubectl"] {
        assert_eq!(w1.package(pkg).0, "1.35.0-150500.1.1", "{pkg}");
    }
    assert_eq!(w1.locks().len(), 3, "{:?}", w1.locks());
}

/// A node of `distro` at `from` (`1.34.2`), and a mirror of every release.
async fn k3s_node(api: &FakeKube, name: &str, distro: Distro, from: &str) -> (Node, ReleaseMirror) {
    api.add_node(name, false, &distro.release(from)[1..], "1.7.20");
    let mut node = node(api, name, "1.34").await;
    support::k3s::install(
        node.dir.path(),
        &mut node.env,
        distro,
        &distro.release(from),
    );
    (node, ReleaseMirror::start(distro))
}

fn k3s_args<'a>(
    action: &'a str,
    distro: Distro,
    release: &'a str,
    mirror: &'a str,
) -> Vec<&'a str> {
    vec![
        action,
        "--distribution",
        distro.name(),
        "--release",
        release,
        "--mirror",
        mirror,
    ]
}

fn restarts(node: &Node) -> Vec<String> {
    std::fs::read_to_string(node.dir.path().join("state/restarts"))
        .unwrap_or_default()
        .lines()
        .map(|l| l.rsplit_once(' ').map_or(l, |(head, _)| head).to_owned())
        .collect()
}

/// k3s: the release is downloaded once and checked against its sha256sum file; apply
/// swaps the binary atomically keeping the previous one, restarts the agent once, and the
/// kubelet reports the release; a rerun downloads, swaps and restarts nothing.
#[tokio::test]
async fn a_k3s_agent_is_staged_then_swapped_keeping_the_previous_binary_and_restarted_once() {
    let api = FakeKube::start().await;
    let (agent, mirror) = k3s_node(&api, "agent-1", Distro::K3s, "1.34.2").await;
    let (to, url) = (Distro::K3s.release("1.34.5"), mirror.url());
    let (code, out) = agent.run_script(&k3s_script(), &k3s_args("--stage", Distro::K3s, &to, &url));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("sha256 {}", mirror.artifact_sum(&to))),
        "{out}"
    );
    let (code, out) = agent.run_script(&k3s_script(), &k3s_args("--stage", Distro::K3s, &to, &url));
    assert_eq!(code, 0, "{out}");
    assert_eq!(mirror.downloads(&to), 1, "a verified stage is kept");
    assert_eq!(
        k3s::installed(agent.dir.path(), Distro::K3s),
        "v1.34.2+k3s1",
        "staging installs nothing"
    );
    assert!(restarts(&agent).is_empty());

    let mut apply = k3s_args("--apply", Distro::K3s, &to, &url);
    apply.extend(["--role", "agent"]);
    let (code, out) = agent.run_script(&k3s_script(), &apply);
    assert_eq!(code, 0, "{out}");
    assert_eq!(k3s::installed(agent.dir.path(), Distro::K3s), to);
    assert_eq!(
        k3s::previous(agent.dir.path(), Distro::K3s).as_deref(),
        Some("v1.34.2+k3s1")
    );
    assert_eq!(restarts(&agent), [format!("k3s-agent {to}")]);
    assert_eq!(
        api.node("agent-1")["status"]["nodeInfo"]["kubeletVersion"],
        to.as_str()
    );

    let (code, out) = agent.run_script(&k3s_script(), &apply);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("already at"), "{out}");
    assert_eq!(restarts(&agent).len(), 1, "no second restart");
    assert_eq!(mirror.downloads(&to), 1, "no second download");
    assert_eq!(
        k3s::previous(agent.dir.path(), Distro::K3s).as_deref(),
        Some("v1.34.2+k3s1")
    );
}

/// A download that does not match the release's sha256sum file is refused (exit 4) naming
/// the file and both sums; nothing is kept, installed or restarted, by stage or by apply.
#[tokio::test]
async fn a_checksum_that_does_not_match_is_refused_naming_the_file_and_both_sums() {
    let api = FakeKube::start().await;
    let (agent, mirror) = k3s_node(&api, "agent-1", Distro::K3s, "1.34.2").await;
    let (to, url) = (Distro::K3s.release("1.34.5"), mirror.url());
    let published = mirror.artifact_sum(&to);
    mirror.corrupt(&to);
    let served = mirror.artifact_sum(&to);
    let mut apply = k3s_args("--apply", Distro::K3s, &to, &url);
    apply.extend(["--role", "agent"]);
    for args in [k3s_args("--stage", Distro::K3s, &to, &url), apply] {
        let (code, out) = agent.run_script(&k3s_script(), &args);
        assert_eq!(code, 4, "{out}");
        assert!(
            out.contains(&format!("checksum mismatch for {url}/v1.34.5%2Bk3s1/k3s")),
            "{out}"
        );
        assert!(
            out.contains(&format!(
                "sha256sum-amd64.txt says {published}, the download is {served}"
            )),
            "{out}"
        );
    }
    let staged = agent.dir.path().join("state/rollgate/stage").join(&to);
    assert!(!staged.join("k3s").exists() && !staged.join("verified").exists());
    assert_eq!(
        k3s::installed(agent.dir.path(), Distro::K3s),
        "v1.34.2+k3s1"
    );
    assert!(restarts(&agent).is_empty());
}

/// A release the mirror lacks is refused by the pre-flight check (exit 4), naming the URL.
#[tokio::test]
async fn a_release_missing_from_the_mirror_is_refused_by_the_check_naming_the_url() {
    let api = FakeKube::start().await;
    let (agent, mirror) = k3s_node(&api, "agent-1", Distro::K3s, "1.34.2").await;
    let to = Distro::K3s.release("1.34.5");
    let (code, out) = agent.run_script(
        &k3s_script(),
        &k3s_args("--check", Distro::K3s, &to, &mirror.url()),
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok: k3s v1.34.2+k3s1"), "{out}");
    mirror.withdraw(&to);
    let (code, out) = agent.run_script(
        &k3s_script(),
        &k3s_args("--check", Distro::K3s, &to, &mirror.url()),
    );
    assert_eq!(code, 4, "{out}");
    assert!(
        out.contains(&format!(
            "the mirror has no release {to}: {}/v1.34.5%2Bk3s1/sha256sum-amd64.txt does not answer",
            mirror.url()
        )),
        "{out}"
    );
}

/// RKE2: the binary comes out of the release tarball; a server restarts rke2-server.
#[tokio::test]
async fn an_rke2_server_takes_its_binary_out_of_the_release_tarball() {
    let api = FakeKube::start().await;
    let (server, mirror) = k3s_node(&api, "server-1", Distro::Rke2, "1.34.2").await;
    api.add_static_pods("server-1", "1.34.2-rke2r1", false);
    let (to, url) = (Distro::Rke2.release("1.34.5"), mirror.url());
    let mut apply = k3s_args("--apply", Distro::Rke2, &to, &url);
    apply.extend(["--role", "server"]);
    let (code, out) = server.run_script(&k3s_script(), &apply);
    assert_eq!(code, 0, "{out}");
    assert_eq!(k3s::installed(server.dir.path(), Distro::Rke2), to);
    assert_eq!(
        k3s::previous(server.dir.path(), Distro::Rke2).as_deref(),
        Some("v1.34.2+rke2r1")
    );
    assert_eq!(restarts(&server), [format!("rke2-server {to}")]);
    assert_eq!(
        api.pod_in("kube-system", "kube-apiserver-server-1")["spec"]["containers"][0]["image"],
        "docker.io/rancher/hardened-kubernetes:v1.34.5-rke2r1-build20250101"
    );
}

/// A redo while the first apply still runs (its SSH session dropped) waits for it on the
/// node's lock and then swaps and restarts nothing more.
#[tokio::test]
async fn a_redo_during_an_apply_waits_for_it_and_restarts_nothing_twice() {
    let api = FakeKube::start().await;
    let (agent, mirror) = k3s_node(&api, "agent-1", Distro::K3s, "1.34.2").await;
    let (to, url) = (Distro::K3s.release("1.34.5"), mirror.url());
    let mut apply = k3s_args("--apply", Distro::K3s, &to, &url);
    apply.extend(["--role", "agent"]);
    let hold = agent.dir.path().join("state/hold-restart");
    std::fs::write(&hold, "").unwrap();
    let first = agent.spawn_script(&k3s_script(), &apply);
    support::eventually(
        "the first apply to swap the binary",
        std::time::Duration::from_secs(20),
        || async { (k3s::installed(agent.dir.path(), Distro::K3s) == to).then_some(()) },
    )
    .await;
    let redo = agent.spawn_script(&k3s_script(), &apply);
    std::fs::remove_file(&hold).unwrap();
    let (first, redo) = (first.join().unwrap(), redo.join().unwrap());
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        redo.status.success(),
        "{}",
        String::from_utf8_lossy(&redo.stderr)
    );
    let said = String::from_utf8_lossy(&redo.stdout);
    assert!(said.contains("already at"), "{said}");
    assert_eq!(restarts(&agent), [format!("k3s-agent {to}")]);
    assert_eq!(mirror.downloads(&to), 1);
    assert_eq!(
        k3s::previous(agent.dir.path(), Distro::K3s).as_deref(),
        Some("v1.34.2+k3s1")
    );
}

/// Anything but a release and a mirror URL as rollgate validates them stops the script
/// before it downloads or changes anything.
#[tokio::test]
async fn bad_k3s_arguments_stop_the_script_before_anything_runs() {
    let api = FakeKube::start().await;
    let (agent, mirror) = k3s_node(&api, "agent-1", Distro::K3s, "1.34.2").await;
    let url = mirror.url();
    for (args, says) in [
        (
            k3s_args("--stage", Distro::K3s, "v1.34.5+k3s1;reboot", &url),
            "--release must be",
        ),
        (
            k3s_args("--stage", Distro::K3s, "v1.34.5+rke2r1", &url),
            "--release must be",
        ),
        (
            k3s_args("--stage", Distro::K3s, "v1.34.5+k3s1", "file:///etc"),
            "--mirror must be",
        ),
        (
            k3s_args("--stage", Distro::K3s, "v1.34.5+k3s1", "http://x/../y"),
            "--mirror must be",
        ),
        (
            vec!["--stage", "--distribution", "kubeadm"],
            "--distribution must be",
        ),
        (
            vec![
                "--apply",
                "--distribution",
                "k3s",
                "--release",
                "v1.34.5+k3s1",
                "--mirror",
                &url,
                "--role",
                "root",
            ],
            "--role must be",
        ),
    ] {
        let (code, out) = agent.run_script(&k3s_script(), &args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(out.contains(says), "{args:?}: {out}");
    }
    assert!(mirror.requests.lock().unwrap().is_empty());
    assert!(restarts(&agent).is_empty());
    assert_eq!(
        k3s::installed(agent.dir.path(), Distro::K3s),
        "v1.34.2+k3s1"
    );
}

fn reboot_managers_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/reboot-managers.sh")
        .display()
        .to_string()
}

/// A node's own reboot managers, each found only when its unit is active and its setting
/// reboots: locksmithd (Flatcar), unattended-upgrades with Automatic-Reboot (read by apt's
/// own apt-config), dnf-automatic with `reboot = when-needed`.
#[tokio::test]
async fn reboot_managers_names_each_reboot_manager_of_the_nodes_own() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    let mut w1 = node(&api, "w1", "1.34").await;
    let d = w1.dir.path().to_owned();
    let apt_conf = d.join("apt.conf");
    std::fs::write(
        &apt_conf,
        "Unattended-Upgrade::Automatic-Reboot \"true\";\n",
    )
    .unwrap();
    let dnf_conf = d.join("automatic.conf");
    std::fs::write(
        &dnf_conf,
        "[commands]\napply_updates = yes\nreboot = when-needed\n",
    )
    .unwrap();
    w1.env
        .push(("APT_CONFIG".into(), apt_conf.display().to_string()));
    w1.env
        .push(("DNF_AUTOMATIC_CONF".into(), dnf_conf.display().to_string()));
    let activate = |unit: &str| std::fs::write(d.join(format!("state/active-{unit}")), "").unwrap();

    // Settings that reboot, but no unit running them: nothing.
    let (code, out) = w1.run_script(&reboot_managers_script(), &[]);
    assert_eq!((code, out.as_str()), (0, ""));
    activate("locksmithd.service");
    activate("apt-daily-upgrade.timer");
    activate("dnf-automatic-install.timer");
    let (code, out) = w1.run_script(&reboot_managers_script(), &[]);
    assert_eq!(code, 5, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("locksmithd is active: Flatcar reboots the node itself"),
        "{out}"
    );
    assert!(
        lines[1].contains("Unattended-Upgrade::Automatic-Reboot \"true\""),
        "{out}"
    );
    assert!(
        lines[2].contains(&format!(
            "reboot = when-needed or when-changed in {}",
            dnf_conf.display()
        )),
        "{out}"
    );

    // The settings that do not reboot: only locksmithd, whose running is its setting.
    std::fs::write(
        &apt_conf,
        "Unattended-Upgrade::Automatic-Reboot \"false\";\n",
    )
    .unwrap();
    std::fs::write(&dnf_conf, "[commands]\nreboot = never\n").unwrap();
    let (code, out) = w1.run_script(&reboot_managers_script(), &[]);
    assert_eq!(code, 5, "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.starts_with("locksmithd"), "{out}");
}

/// The sha256 of `path`, read by sha256sum.
fn sha256(path: &std::path::Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// `--stage` on Debian's own dnf and zypper: the release is downloaded into the package
/// manager's cache past the locks, installing nothing; a package in the repository that
/// does not match the repository's checksum (the same size, other bytes) is refused with
/// exit 4, naming the file and both sums, which sha256sum reads independently; the locks
/// stand and the node's own rpm database still reads the old version.
#[tokio::test]
async fn on_real_dnf_and_zypper_stage_downloads_past_the_locks_and_refuses_a_corrupt_package() {
    let api = FakeKube::start().await;
    api.add_node("w1", false, "1.34.2", "1.7.20");
    for zypper in [false, true] {
        let w1 = if zypper {
            RpmNode::zypper(&api, "w1", "1.34", "1.34.2-150500.1.1").await
        } else {
            RpmNode::dnf(&api, "w1", "1.34", "1.34.2-150500.1.1").await
        };
        let locks = w1.locks();
        let (code, out) = w1.node.run(&["--stage", "--release", "1.34.5"]);
        assert_eq!(code, 0, "zypper {zypper}: {out}");
        assert!(
            out.contains("kubeadm, kubelet and kubectl 1.34.5-150500.1.1 staged and verified"),
            "{out}"
        );
        assert_eq!(w1.package("kubelet").0, "1.34.2-150500.1.1");

        let rpm = w1
            .node
            .dir
            .path()
            .join("repo/core:/stable:/v1.34/rpm/kubelet-1.34.5-150500.1.1.noarch.rpm");
        let published = sha256(&rpm);
        let mut bytes = std::fs::read(&rpm).expect("rpm");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&rpm, bytes).expect("corrupt rpm");
        let served = sha256(&rpm);
        let (code, out) = w1.node.run(&["--stage", "--release", "1.34.5"]);
        assert_eq!(code, 4, "zypper {zypper}: {out}");
        assert!(
            out.contains(&format!("kubelet-1.34.5-150500.1.1.noarch.rpm does not match its checksum: the repository says {published}, the download is {served}")),
            "zypper {zypper}: {out}"
        );
        for pkg in ["kubeadm", "kubelet", "kubectl"] {
            assert_eq!(w1.package(pkg).0, "1.34.2-150500.1.1", "{pkg}");
        }
        assert_eq!(w1.locks(), locks, "zypper {zypper}");
    }
}

/// A stub written while other threads fork children runs at once. A child forked between
/// the write's open and close holds the write descriptor until its own exec, and running
/// the file then fails with "Text file busy" (ETXTBSY): the cause of a CI run's red.
#[test]
fn a_stub_written_while_other_threads_fork_runs_at_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    let stop = Arc::new(AtomicBool::new(false));
    let forkers: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    Command::new("true").status().expect("true runs");
                }
            })
        })
        .collect();
    let runs: Vec<std::io::Result<std::process::ExitStatus>> = (0..300)
        .map(|i| {
            let stub = dir.path().join(format!("stub-{i}"));
            support::stacked::write_executable(&stub, "#!/bin/sh\nexit 0\n");
            Command::new(&stub).status()
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    for forker in forkers {
        forker.join().expect("a forker");
    }
    let failed: Vec<String> = runs
        .iter()
        .enumerate()
        .filter(|(_, run)| !matches!(run, Ok(status) if status.success()))
        .map(|(i, run)| format!("stub-{i}: {run:?}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 300 stubs failed: {failed:?}",
        failed.len()
    );
}
