//! Fake nodes for the fake cluster: each is a real sshd (Debian's openssh-server) on
//! loopback, with its own host key, whose PATH puts stub package tools first. The stubs
//! record every call; `apt-get install` records versions, `apt-cache madison` answers from
//! the repository of the minor the node's apt source names, and `systemctl restart kubelet`
//! reports the installed kubelet version to the fake API server, as a real kubelet would.
//! On a control plane, `kubeadm upgrade apply|node` moves the node's static pods to the
//! new version and restarts its stacked etcd member (once per version), as the kubelet
//! does when kubeadm writes new static-pod manifests.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::free_port;
use super::kube::FakeKube;
use super::services::Process;

/// Every package version the fake repositories hold: `1.MINOR.PATCH-1.1`.
pub const REPOSITORY: &[&str] = &[
    "1.34.2-1.1",
    "1.34.3-1.1",
    "1.34.5-1.1",
    "1.35.0-1.1",
    "1.35.1-1.1",
];

/// The stubbed package tools. `$STUB_STATE` holds installed versions and the repository.
const STUBS: &[(&str, &str)] = &[
    (
        "apt-get",
        r#"#!/bin/bash
echo "apt-get $*" >> "$STUB_LOG"
[ "$1" = update ] && exit 0
# --download-only fetches into the cache: nothing is installed.
into=installed
case " $* " in *" --download-only "*) into=downloaded ;; esac
for a in "$@"; do
  case "$a" in
    *=*) pkg=${a%%=*}; ver=${a#*=}
         STUB_LOG=/dev/null apt-cache madison "$pkg" | awk '{print $3}' | grep -qx -- "$ver" || { echo "E: Version '$ver' for '$pkg' was not found" >&2; exit 100; }
         echo "$ver" > "$STUB_STATE/$into-$pkg" ;;
  esac
done
"#,
    ),
    (
        "apt-cache",
        r#"#!/bin/bash
echo "apt-cache $*" >> "$STUB_LOG"
[ "$1" = madison ] || exit 0
pkg=$2
minor=$(grep -oE '/v[0-9]+\.[0-9]+/deb' "$K8S_APT_SOURCE" | head -1 | sed -E 's#/v([0-9.]+)/deb#\1#')
if [ "$pkg" = containerd.io ]; then list="$STUB_STATE/repo-containerd"; else list="$STUB_STATE/repo"; fi
while read -r v; do
  case "$v" in
    "$minor".*|1.7.*) printf '   %s | %s | https://pkgs.k8s.io/core:/stable:/v%s/deb  Packages\n' "$pkg" "$v" "$minor" ;;
  esac
done < "$list"
"#,
    ),
    (
        "apt-mark",
        r#"#!/bin/bash
echo "apt-mark $*" >> "$STUB_LOG"
"#,
    ),
    (
        "dpkg-query",
        r#"#!/bin/bash
echo "dpkg-query $*" >> "$STUB_LOG"
pkg=${!#}
[ -f "$STUB_STATE/installed-$pkg" ] || exit 1
tr -d '\n' < "$STUB_STATE/installed-$pkg"
"#,
    ),
    (
        "kubeadm",
        r#"#!/bin/bash
echo "kubeadm $*" >> "$STUB_LOG"
# The installed version of $1, from the node's package database (rpm on a dnf node).
version_of() {
  if [ -n "${RPM_ROOT:-}" ]; then rpm -q --qf '%{VERSION}-%{RELEASE}' "$1"
  else STUB_LOG=/dev/null dpkg-query -W -f='${Version}' "$1"; fi
}
if [ "$1" = upgrade ] && [ "$2" != plan ]; then
  echo "start $(date +%s.%N)" >> "$STUB_STATE/upgrade-spans"
  trap 'echo "end $(date +%s.%N)" >> "$STUB_STATE/upgrade-spans"' EXIT
  if [ -f "$STUB_STATE/fail-upgrade" ]; then echo "kubeadm: [preflight] injected failure on $FAKE_NODE" >&2; exit 1; fi
fi
if [ -f "$STUB_STATE/slow" ]; then sleep "$(cat "$STUB_STATE/slow")"; fi
if [ "$1" = upgrade ]; then while [ -f "$STUB_STATE/hold" ]; do sleep 0.1; done; fi
if [ "$1" = upgrade ] && [ "$2" != plan ] && [ -f "$STUB_STATE/cut-session" ]; then
  # The SSH session drops while kubeadm works (the network, a killed sshd): the sshd
  # process of this connection dies; kubeadm itself goes on to its end a moment later.
  rm -f "$STUB_STATE/cut-session"
  sid=$(ps -o sid= -p $$ | tr -d ' ')
  kill -9 "$(ps -o ppid= -p "$sid" | tr -d ' ')" 2>/dev/null
  sleep 1
fi
installed=$(version_of kubeadm)
static_pods() {
  [ -f "$STUB_STATE/control-plane" ] || return 0
  local v=${installed%%-*} c
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    curl -sf -X PATCH -H 'Content-Type: application/merge-patch+json'       -H "Authorization: Bearer $FAKE_TOKEN"       --data "{\"spec\":{\"containers\":[{\"name\":\"$c\",\"image\":\"registry.k8s.io/$c:v$v\"}]}}"       "$FAKE_API/api/v1/namespaces/kube-system/pods/$c-$FAKE_NODE" > /dev/null \
      || { echo "static pod $c-$FAKE_NODE not updated" >&2; exit 1; }
  done
  if [ -x "$STUB_STATE/etcd-ctl" ] && [ "$(cat "$STUB_STATE/etcd-at" 2>/dev/null)" != "$v" ]; then
    echo "kubeadm: restarting etcd-$FAKE_NODE" >> "$STUB_LOG"
    if [ -f "$STUB_STATE/etcd-broken" ]; then "$STUB_STATE/etcd-ctl" stop; else "$STUB_STATE/etcd-ctl" restart; fi
    echo "$v" > "$STUB_STATE/etcd-at"
  fi
}
case "$1 $2" in
  "upgrade apply")
    want=${!#}; want=${want#v}
    [ "${installed%%-*}" = "$want" ] || { echo "kubeadm $installed cannot apply v$want" >&2; exit 1; }
    static_pods ;;
  "upgrade node")
    static_pods
    # Packages the upgrade pulled in may ask for a reboot (a new kernel, libc).
    if [ -f "$STUB_STATE/sentinel-after-upgrade" ]; then touch "$STUB_STATE/reboot-required"; fi ;;
  "upgrade plan")
    echo "[upgrade] Running cluster health checks"
    echo "Upgrade to the latest version in the series: kubeadm upgrade apply v${installed%%-*}" ;;
esac
"#,
    ),
    (
        "systemctl",
        r#"#!/bin/bash
echo "systemctl $*" >> "$STUB_LOG"
# The installed version of $1, from the node's package database (rpm on a dnf node).
version_of() {
  if [ -n "${RPM_ROOT:-}" ]; then rpm -q --qf '%{VERSION}-%{RELEASE}' "$1"
  else STUB_LOG=/dev/null dpkg-query -W -f='${Version}' "$1"; fi
}
patch() {
  curl -sf -X PATCH -H 'Content-Type: application/merge-patch+json' \
    -H "Authorization: Bearer $FAKE_TOKEN" --data "$1" \
    "$FAKE_API/api/v1/nodes/$FAKE_NODE/status" > /dev/null
}
case "$1 $2" in
  "restart kubelet")
    v=$(version_of kubelet); ready=True
    [ -f "$STUB_STATE/stay-not-ready" ] && ready=False
    patch "{\"status\":{\"nodeInfo\":{\"kubeletVersion\":\"v${v%%-*}\"},\"conditions\":[{\"type\":\"Ready\",\"status\":\"$ready\"}]}}" ;;
  "restart containerd")
    v=$(cat "$STUB_STATE/installed-containerd.io"); patch "{\"status\":{\"nodeInfo\":{\"containerRuntimeVersion\":\"containerd://${v%%-*}\"}}}" ;;
  "restart k3s"|"restart k3s-agent"|"restart rke2-server"|"restart rke2-agent")
    while [ -f "$STUB_STATE/hold-restart" ]; do sleep 0.1; done
    if [ -f "$STUB_STATE/cut-session" ]; then
      # The SSH session drops while the service restarts: this connection's sshd dies;
      # the restart goes on to its end a moment later.
      rm -f "$STUB_STATE/cut-session"
      sid=$(ps -o sid= -p $$ | tr -d ' ')
      kill -9 "$(ps -o ppid= -p "$sid" | tr -d ' ')" 2>/dev/null
      sleep 1
    fi
    # The service starts the binary now installed; the kubelet inside reports its release.
    r=$("$ROLLGATE_BIN_DIR/${2%%-*}" --version | awk 'NR == 1 { print $3 }')
    echo "$2 $r $(date +%s.%N)" >> "$STUB_STATE/restarts"
    # A server's embedded etcd member stops and starts with its service.
    if [ -x "$STUB_STATE/etcd-ctl" ]; then
      if [ -f "$STUB_STATE/etcd-broken" ]; then "$STUB_STATE/etcd-ctl" stop; else "$STUB_STATE/etcd-ctl" restart; fi
    fi
    # An RKE2 server's control plane runs as static pods of the release's image.
    if [ "$2" = rke2-server ]; then
      for c in kube-apiserver kube-controller-manager kube-scheduler; do
        curl -sf -X PATCH -H 'Content-Type: application/merge-patch+json' -H "Authorization: Bearer $FAKE_TOKEN" \
          --data "{\"spec\":{\"containers\":[{\"name\":\"$c\",\"image\":\"docker.io/rancher/hardened-kubernetes:${r/+/-}-build20250101\"}]}}" \
          "$FAKE_API/api/v1/namespaces/kube-system/pods/$c-$FAKE_NODE" > /dev/null || { echo "static pod $c-$FAKE_NODE not updated" >&2; exit 1; }
      done
    fi
    ready=True
    [ -f "$STUB_STATE/stay-not-ready" ] && ready=False
    patch "{\"status\":{\"nodeInfo\":{\"kubeletVersion\":\"$r\"},\"conditions\":[{\"type\":\"Ready\",\"status\":\"$ready\"}]}}" ;;
  "is-active "*)
    # A unit is active when the test made it so (FakeNode::activate).
    [ -f "$STUB_STATE/active-${!#}" ] && exit 0
    exit 3 ;;
  "reboot "*)
    # The node goes down: NotReady, no SSH, this session cut; it comes back after the
    # delay with the next boot id, Ready, and no sentinel (unless told never to).
    echo "reboot $(date +%s.%N)" >> "$STUB_STATE/reboots"
    touch "$STUB_STATE/down"
    patch '{"status":{"conditions":[{"type":"Ready","status":"False"}]}}'
    # A control plane's stacked etcd member goes down with it, and starts with it.
    [ -x "$STUB_STATE/etcd-ctl" ] && "$STUB_STATE/etcd-ctl" stop
    boot=$(( $(cat "$STUB_STATE/boot" 2>/dev/null || echo 1) + 1 ))
    delay=$(cat "$STUB_STATE/reboot-delay" 2>/dev/null || echo 1)
    if [ ! -f "$STUB_STATE/never-back" ]; then
      setsid bash -c "sleep $delay
        [ -x '$STUB_STATE/etcd-ctl' ] && '$STUB_STATE/etcd-ctl' start
        rm -f '$STUB_STATE/reboot-required'
        echo $boot > '$STUB_STATE/boot'
        curl -sf -X PATCH -H 'Content-Type: application/merge-patch+json' -H 'Authorization: Bearer $FAKE_TOKEN' \
          --data '{\"status\":{\"nodeInfo\":{\"bootID\":\"boot-$FAKE_NODE-$boot\"},\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}' \
          '$FAKE_API/api/v1/nodes/$FAKE_NODE/status' > /dev/null
        rm -f '$STUB_STATE/down'" > /dev/null 2>&1 < /dev/null &
    fi
    # systemd takes a moment to stop the sessions.
    sleep "$(cat "$STUB_STATE/shutdown-delay" 2>/dev/null || echo 0)"
    # Cut the session as a node going down does: the sshd process of this connection.
    sid=$(ps -o sid= -p $$ | tr -d ' ')
    kill -9 "$(ps -o ppid= -p "$sid" | tr -d ' ')" 2>/dev/null
    exit 0 ;;
esac
"#,
    ),
];

/// sudo as a node whose sudoers has `deploy/node/sudoers` runs it, or, with
/// `$STUB_STATE/sudo-refuses`, as one without the rule: `-n` never asks for a password,
/// so it refuses with sudo's own words. `-l CMD` lists whether CMD is allowed. The real
/// sudo would reset PATH (secure_path) and reach the machine's own tools: never here.
const SUDO: &str = r#"#!/bin/bash
echo "sudo $*" >> "$STUB_LOG"
[ "$1" = -n ] && shift
list=""
if [ "$1" = -l ]; then list=1; shift; fi
if [ -f "$STUB_STATE/sudo-refuses" ]; then echo "sudo: a password is required" >&2; exit 1; fi
if [ -n "$list" ]; then echo "/usr/bin/$*"; exit 0; fi
exec "$@"
"#;

/// id as it answers for a login that is not root, with `$STUB_STATE/non-root` (the node
/// script then runs its privileged commands through sudo); else the real one.
const ID: &str = r#"#!/bin/bash
if [ -f "$STUB_STATE/non-root" ]; then
  case "$1" in -u) echo 1000; exit 0 ;; -un) echo rollgate; exit 0 ;; esac
fi
exec /usr/bin/id "$@"
"#;

/// The /etc/os-release a fake node has unless a test gives it another.
const UBUNTU: &str = "NAME=\"Ubuntu\"\nVERSION_ID=\"24.04\"\nID=ubuntu\nID_LIKE=debian\nPRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\n";

/// Rocky Linux's /etc/os-release, as its 9.4 release writes it.
pub const ROCKY: &str = "NAME=\"Rocky Linux\"\nVERSION=\"9.4 (Blue Onyx)\"\nID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.4\"\nPRETTY_NAME=\"Rocky Linux 9.4 (Blue Onyx)\"\n";

/// openSUSE Leap's /etc/os-release, as its 15.6 release writes it.
pub const OPENSUSE: &str = "NAME=\"openSUSE Leap\"\nVERSION=\"15.6\"\nID=\"opensuse-leap\"\nID_LIKE=\"suse opensuse\"\nVERSION_ID=\"15.6\"\nPRETTY_NAME=\"openSUSE Leap 15.6\"\n";

/// Flatcar Container Linux's /etc/os-release: no package manager the node script serves
/// (its updates come whole, from update_engine).
pub const FLATCAR: &str = "NAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\nID_LIKE=coreos\nVERSION=4081.2.0\nVERSION_ID=4081.2.0\nPRETTY_NAME=\"Flatcar Container Linux by Kinvolk 4081.2.0 (Oklo)\"\n";

/// The client side: one key pair and one known_hosts file for every node.
pub struct SshClient {
    pub dir: tempfile::TempDir,
    pub key: PathBuf,
    pub known_hosts: PathBuf,
}

impl SshClient {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let key = dir.path().join("id_ed25519");
        keygen(&key);
        let known_hosts = dir.path().join("known_hosts");
        std::fs::write(&known_hosts, "").expect("known_hosts");
        Self {
            dir,
            key,
            known_hosts,
        }
    }
}

fn keygen(path: &Path) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen (openssh-client)")
        .success();
    assert!(ok, "ssh-keygen failed");
}

/// A node's files: stub tools in `bin`, installed versions and the repository in `state`,
/// an apt source naming `minor`. Returns the environment a session on the node gets.
pub fn node_files(d: &Path, name: &str, api: &FakeKube, minor: &str) -> Vec<(String, String)> {
    let bin = d.join("bin");
    let state = d.join("state");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(&state).expect("state");
    for (tool, text) in STUBS.iter().chain(&[("sudo", SUDO), ("id", ID)]) {
        super::stacked::write_executable(&bin.join(tool), text);
    }
    std::fs::write(state.join("repo"), REPOSITORY.join("\n") + "\n").expect("repo");
    std::fs::write(state.join("repo-containerd"), "1.7.20-1\n1.7.24-1\n").expect("repo");
    let node = api.node(name);
    let kubelet = node["status"]["nodeInfo"]["kubeletVersion"]
        .as_str()
        .expect("kubelet")
        .trim_start_matches('v')
        .to_owned();
    for pkg in ["kubeadm", "kubelet", "kubectl"] {
        std::fs::write(
            state.join(format!("installed-{pkg}")),
            format!("{kubelet}-1.1\n"),
        )
        .expect("installed");
    }
    std::fs::write(state.join("installed-containerd.io"), "1.7.20-1\n").expect("installed");
    std::fs::write(
        d.join("kubernetes.list"),
        format!("deb [signed-by=/etc/apt/keyrings/kubernetes.gpg] https://pkgs.k8s.io/core:/stable:/v{minor}/deb/ /\n"),
    )
    .expect("apt source");
    std::fs::write(d.join("calls.log"), "").expect("log");
    std::fs::write(d.join("os-release"), UBUNTU).expect("os-release");
    let d = d.display();
    [
        ("PATH", format!("{d}/bin:/usr/bin:/bin")),
        ("STUB_LOG", format!("{d}/calls.log")),
        ("STUB_STATE", format!("{d}/state")),
        ("FAKE_API", api.url()),
        ("FAKE_NODE", name.to_owned()),
        ("FAKE_TOKEN", api.token.clone()),
        ("K8S_APT_SOURCE", format!("{d}/kubernetes.list")),
        ("ROLLGATE_STATE_DIR", format!("{d}/state/rollgate")),
        ("OS_RELEASE", format!("{d}/os-release")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The node's package tools made Debian's own: apt-get, apt-cache, apt-mark and dpkg in a
/// root of the node's own (apt's `Dir`, dpkg's `--root` and `--admindir`), reading local
/// flat repositories laid out as pkgs.k8s.io's (`core:/stable:/v1.NN/deb/`, one per minor,
/// every version of `REPOSITORY`), built with dpkg-deb and apt-ftparchive. kubeadm, kubelet
/// and kubectl are installed at `installed` and held, as the kubeadm docs set a node up;
/// the node's source names `minor`. The stubs of the package tools are taken away, so the
/// script meets the real ones; kubeadm, systemctl and sudo stay stubs. Returns the dpkg
/// database the witnesses read.
pub fn real_apt(
    d: &Path,
    env: &mut Vec<(String, String)>,
    minor: &str,
    installed: &str,
) -> PathBuf {
    let repo = d.join("repo");
    for version in REPOSITORY {
        let minor_of = version.split('.').take(2).collect::<Vec<_>>().join(".");
        let dir = repo.join(format!("core:/stable:/v{minor_of}/deb"));
        std::fs::create_dir_all(&dir).expect("repository");
        for pkg in ["kubeadm", "kubelet", "kubectl"] {
            let tree = d.join("build").join(format!("{pkg}-{version}"));
            std::fs::create_dir_all(tree.join("DEBIAN")).expect("DEBIAN");
            std::fs::create_dir_all(tree.join(format!("usr/share/doc/{pkg}"))).expect("doc");
            std::fs::write(
                tree.join("DEBIAN/control"),
                format!("Package: {pkg}\nVersion: {version}\nArchitecture: all\nMaintainer: rollgate tests <tests@rollgate.invalid>\nDescription: {pkg} stand-in for the node script's tests\n"),
            )
            .expect("control");
            std::fs::write(tree.join(format!("usr/share/doc/{pkg}/version")), version)
                .expect("payload");
            run_ok(
                Command::new("dpkg-deb")
                    .args(["--root-owner-group", "--build"])
                    .arg(&tree)
                    .arg(dir.join(format!("{pkg}_{version}_all.deb"))),
            );
        }
    }
    for entry in std::fs::read_dir(repo.join("core:/stable:")).expect("minors") {
        let dir = entry.expect("minor").path().join("deb");
        let packages = run_ok(
            Command::new("apt-ftparchive")
                .args(["packages", "."])
                .current_dir(&dir),
        );
        std::fs::write(dir.join("Packages"), packages).expect("Packages");
    }
    let root = d.join("root");
    for sub in [
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "etc/apt/apt.conf.d",
        "var/lib/dpkg/info",
        "var/lib/dpkg/updates",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/log/apt",
    ] {
        std::fs::create_dir_all(root.join(sub)).expect("root");
    }
    let admin = root.join("var/lib/dpkg");
    std::fs::write(admin.join("status"), "").expect("status");
    std::fs::write(admin.join("available"), "").expect("available");
    let source = root.join("etc/apt/sources.list.d/kubernetes.list");
    std::fs::write(
        &source,
        format!(
            "deb [trusted=yes] file:{}/core:/stable:/v{minor}/deb/ /\n",
            repo.display()
        ),
    )
    .expect("source");
    let config = d.join("apt.conf");
    let (r, a) = (root.display(), admin.display());
    std::fs::write(
        &config,
        format!(
            "Dir \"{r}/\";\nDir::State::status \"{a}/status\";\nDPkg::Options {{ \"--root={r}\"; \"--admindir={a}\"; \"--log={r}/var/log/dpkg.log\"; }};\nAPT::Sandbox::User \"root\";\n"
        ),
    )
    .expect("apt.conf");
    for tool in ["apt-get", "apt-cache", "apt-mark", "dpkg-query"] {
        std::fs::remove_file(d.join("bin").join(tool)).expect("stub");
    }
    let set = |env: &mut Vec<(String, String)>, key: &str, value: String| {
        env.retain(|(k, _)| k != key);
        env.push((key.to_owned(), value));
    };
    set(env, "APT_CONFIG", config.display().to_string());
    set(env, "DPKG_ADMINDIR", admin.display().to_string());
    set(env, "K8S_APT_SOURCE", source.display().to_string());
    // dpkg, as root, wants ldconfig and start-stop-daemon on PATH.
    set(
        env,
        "PATH",
        format!("{}/bin:/usr/bin:/bin:/usr/sbin:/sbin", d.display()),
    );
    let apt = |args: &[&str]| {
        run_ok(
            Command::new(args[0])
                .args(&args[1..])
                .env("APT_CONFIG", &config)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    apt(&["apt-get", "update", "-q"]);
    let pins: Vec<String> = ["kubeadm", "kubelet", "kubectl"]
        .iter()
        .map(|pkg| format!("{pkg}={installed}"))
        .collect();
    let mut install = vec!["apt-get", "install", "-y", "-q"];
    install.extend(pins.iter().map(String::as_str));
    apt(&install);
    apt(&["apt-mark", "hold", "kubeadm", "kubelet", "kubectl"]);
    admin
}

/// The node's package tools made RHEL's: Debian's own dnf and rpm, in a root of the
/// node's own (dnf's `--installroot`, rpm's `--root`, through two wrappers on PATH that add
/// only those), reading local repositories laid out as pkgs.k8s.io's
/// (`core:/stable:/v1.NN/rpm/`, one per minor, every version of `REPOSITORY` as
/// `1.NN.P-150500.1.1`), built with rpmbuild and createrepo_c. The repository file is the
/// kubeadm docs': it excludes the Kubernetes packages. kubeadm, kubelet and kubectl are
/// installed at `installed` and, with `versionlock`, locked there. The node runs Rocky
/// Linux; apt's tools refuse to run. Returns the root.
pub fn real_dnf(
    d: &Path,
    env: &mut Vec<(String, String)>,
    minor: &str,
    installed: &str,
    versionlock: bool,
) -> PathBuf {
    let repo = rpm_repository(d);
    let root = d.join("root");
    for sub in ["etc/yum.repos.d", "etc/dnf/plugins"] {
        std::fs::create_dir_all(root.join(sub)).expect("root");
    }
    let source = root.join("etc/yum.repos.d/kubernetes.repo");
    std::fs::write(
        &source,
        format!(
            "[kubernetes]\nname=Kubernetes\nbaseurl=file://{}/core:/stable:/v{minor}/rpm/\nenabled=1\ngpgcheck=0\nexclude=kubelet kubeadm kubectl cri-tools kubernetes-cni\n",
            repo.display()
        ),
    )
    .expect("repo file");
    let plugins = Path::new(DNF_PLUGINS);
    assert!(
        plugins.join("dnf-plugins/versionlock.py").is_file(),
        "{DNF_PLUGINS} has no versionlock plugin: scripts/test.sh unpacks Debian's dnf-plugins-core there"
    );
    std::fs::write(
        root.join("etc/dnf/dnf.conf"),
        format!("[main]\ngpgcheck=0\npluginpath={DNF_PLUGINS}/dnf-plugins\n"),
    )
    .expect("dnf.conf");
    std::fs::write(
        root.join("etc/dnf/plugins/versionlock.conf"),
        format!(
            "[main]\nenabled = 1\nlocklist = {}/etc/dnf/plugins/versionlock.list\n",
            root.display()
        ),
    )
    .expect("versionlock.conf");
    std::fs::write(root.join("etc/dnf/plugins/versionlock.list"), "").expect("versionlock.list");
    let bin = rpm_node(
        d,
        env,
        &root,
        ("dnf", DNF_WRAPPER),
        ROCKY,
        ("K8S_RPM_REPO", &source),
    );
    let dnf = |args: &[&str]| {
        run_ok(
            Command::new(bin.join("dnf"))
                .args(args)
                .env("RPM_ROOT", &root),
        )
    };
    let pins: Vec<String> = ["kubeadm", "kubelet", "kubectl"]
        .iter()
        .map(|pkg| format!("{pkg}-{installed}"))
        .collect();
    let mut install = vec!["-q", "-y", "--disableexcludes=kubernetes", "install"];
    install.extend(pins.iter().map(String::as_str));
    dnf(&install);
    if versionlock {
        dnf(&[
            "-q",
            "-y",
            "versionlock",
            "add",
            "kubeadm",
            "kubelet",
            "kubectl",
        ]);
    }
    root
}

/// The node's package tools made SUSE's: Debian's own zypper and rpm, in a root of the
/// node's own (`--root`, through two wrappers on PATH that add only it), reading the same
/// local rpm repositories as [`real_dnf`], added as zypper adds a repository. kubeadm,
/// kubelet and kubectl are installed at `installed` and, with `locks`, locked by
/// `zypper addlock`. The node runs openSUSE Leap; apt's tools refuse to run. Returns the
/// root.
pub fn real_zypper(
    d: &Path,
    env: &mut Vec<(String, String)>,
    minor: &str,
    installed: &str,
    locks: bool,
) -> PathBuf {
    let repo = rpm_repository(d);
    let root = d.join("root");
    std::fs::create_dir_all(root.join("etc/zypp/repos.d")).expect("root");
    let source = root.join("etc/zypp/repos.d/kubernetes.repo");
    std::fs::write(
        &source,
        format!(
            "[kubernetes]\nname=Kubernetes\nbaseurl=file://{}/core:/stable:/v{minor}/rpm/\nenabled=1\nautorefresh=1\ngpgcheck=0\n",
            repo.display()
        ),
    )
    .expect("repo file");
    let bin = rpm_node(
        d,
        env,
        &root,
        ("zypper", ZYPPER_WRAPPER),
        OPENSUSE,
        ("K8S_ZYPP_REPO", &source),
    );
    let zypper = |args: &[&str]| {
        run_ok(
            Command::new(bin.join("zypper"))
                .arg("--non-interactive")
                .args(args)
                .env("RPM_ROOT", &root),
        )
    };
    zypper(&["refresh"]);
    let pins: Vec<String> = ["kubeadm", "kubelet", "kubectl"]
        .iter()
        .map(|pkg| format!("{pkg}={installed}"))
        .collect();
    let mut install = vec!["install", "-y"];
    install.extend(pins.iter().map(String::as_str));
    zypper(&install);
    if locks {
        zypper(&["addlock", "kubeadm", "kubelet", "kubectl"]);
    }
    root
}

/// dnf in the node's root, with Debian's dnf-plugins-core where it was unpacked.
const DNF_WRAPPER: &str = "#!/bin/bash\nexport PYTHONPATH=/opt/rollgate-tests/dnf-plugins-core/usr/lib/python3/dist-packages\nexec /usr/bin/dnf --installroot=\"$RPM_ROOT\" --releasever=9 --config=\"$RPM_ROOT/etc/dnf/dnf.conf\" --setopt=reposdir=\"$RPM_ROOT/etc/yum.repos.d\" --setopt=pluginconfpath=\"$RPM_ROOT/etc/dnf/plugins\" --disableplugin=local \"$@\"\n";

/// zypper in the node's root.
const ZYPPER_WRAPPER: &str =
    "#!/bin/bash\nexec /usr/bin/zypper --root \"$RPM_ROOT\" --no-gpg-checks \"$@\"\n";

/// An rpm node's tools: `manager` (name, wrapper) and rpm, each the real one in `root`;
/// apt's tools refusing; its os-release `os`; the session's environment naming the root
/// and the repository file (`repo`: the script's variable and the file). Returns its bin.
fn rpm_node(
    d: &Path,
    env: &mut Vec<(String, String)>,
    root: &Path,
    manager: (&str, &str),
    os: &str,
    repo: (&str, &Path),
) -> PathBuf {
    let bin = d.join("bin");
    let wrappers = [
        manager,
        (
            "rpm",
            "#!/bin/bash\nexec /usr/bin/rpm --root=\"$RPM_ROOT\" \"$@\"\n",
        ),
        ("apt-get", REFUSE),
        ("apt-cache", REFUSE),
        ("apt-mark", REFUSE),
        ("dpkg-query", REFUSE),
    ];
    for (tool, text) in wrappers {
        std::fs::write(bin.join(tool), text).expect("wrapper");
        run_ok(Command::new("chmod").arg("+x").arg(bin.join(tool)));
    }
    std::fs::write(d.join("os-release"), os).expect("os-release");
    for (key, value) in [("RPM_ROOT", root), repo] {
        env.retain(|(k, _)| k != key);
        env.push((key.to_owned(), value.display().to_string()));
    }
    bin
}

/// Local repositories laid out as pkgs.k8s.io's rpm ones (`core:/stable:/v1.NN/rpm/`, one
/// per minor, every version of `REPOSITORY` as `1.NN.P-150500.1.1`), built with rpmbuild
/// and createrepo_c under `d/repo`, which it returns.
fn rpm_repository(d: &Path) -> PathBuf {
    let repo = d.join("repo");
    rpm_repository_in(&repo, &d.join("rpmbuild"));
    repo
}

/// [`rpm_repository`]'s repositories under `repo`, built in `top`.
pub fn rpm_repository_in(repo: &Path, top: &Path) {
    std::fs::create_dir_all(top.join("SPECS")).expect("rpmbuild");
    for version in REPOSITORY {
        let release = version.split('-').next().expect("1.MINOR.PATCH-1.1");
        let minor_of = release.split('.').take(2).collect::<Vec<_>>().join(".");
        let dir = repo.join(format!("core:/stable:/v{minor_of}/rpm"));
        for pkg in ["kubeadm", "kubelet", "kubectl"] {
            let spec = top.join(format!("SPECS/{pkg}-{release}.spec"));
            std::fs::write(
                &spec,
                format!(
                    "Name: {pkg}\nVersion: {release}\nRelease: 150500.1.1\nSummary: {pkg} stand-in\nLicense: Apache-2.0\nBuildArch: noarch\n%description\n{pkg} stand-in for the node script's tests\n%install\nmkdir -p %{{buildroot}}/usr/share/doc/{pkg}\necho {release} > %{{buildroot}}/usr/share/doc/{pkg}/version\n%files\n/usr/share/doc/{pkg}/version\n"
                ),
            )
            .expect("spec");
            run_ok(
                Command::new("rpmbuild")
                    .args(["-bb", "--quiet", "--define"])
                    .arg(format!("_topdir {}", top.display()))
                    .arg("--define")
                    .arg(format!("_rpmdir {}", dir.display()))
                    .args([
                        "--define",
                        "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
                    ])
                    .arg(&spec),
            );
        }
    }
    for entry in std::fs::read_dir(repo.join("core:/stable:")).expect("minors") {
        run_ok(
            Command::new("createrepo_c")
                .arg("-q")
                .arg(entry.expect("minor").path().join("rpm")),
        );
    }
}

/// Debian's dnf-plugins-core (versionlock), unpacked by scripts/test.sh: it cannot be
/// installed beside zypper.
const DNF_PLUGINS: &str = "/opt/rollgate-tests/dnf-plugins-core/usr/lib/python3/dist-packages";

/// A package tool that does not belong on this node: fails naming itself.
const REFUSE: &str = "#!/bin/bash\necho \"$(basename \"$0\") is not on this node\" >&2\nexit 127\n";

/// The packages zypper's locks file in `root` locks, by name (`zypper addlock`).
pub fn zypper_locks(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("etc/zypp/locks"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("solvable_name: "))
        .map(str::to_owned)
        .collect()
}

/// One field of `pkg` as rpm's database in `root` has it (`%{VERSION}-%{RELEASE}`, …).
pub fn rpm_field(root: &Path, pkg: &str, format: &str) -> String {
    let out = Command::new("rpm")
        .arg(format!("--root={}", root.display()))
        .args(["-q", "--qf", format, pkg])
        .output()
        .expect("rpm");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One field of `pkg` as dpkg's database at `admin` has it (empty when not installed).
pub fn dpkg_field(admin: &Path, pkg: &str, field: &str) -> String {
    let out = Command::new("dpkg-query")
        .arg(format!("--admindir={}", admin.display()))
        .args(["-W", &format!("-f={field}"), pkg])
        .output()
        .expect("dpkg-query");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs `command`, failing the test with what it said unless it succeeds; its stdout.
fn run_ok(command: &mut Command) -> Vec<u8> {
    let out = command
        .output()
        .expect("runs (a Debian package of scripts/test.sh)");
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Set in every fake node's sessions: bash run by sshd sources the login's `~/.bashrc`
/// unless it is a nested shell, and this machine's root `.bashrc` (pyenv's init) costs
/// about 0.1 s of CPU a shell, which at a thousand nodes is the whole machine. A real
/// node's profile is its own business; the fake nodes share this machine's.
const NO_RC: &str = "SHLVL=1";

/// What every SSH session on a fake node runs: nothing while the node is down (rebooting),
/// else the command asked.
const SESSION: &str = r#"#!/bin/bash
printf '%s\n' "$SSH_CONNECTION" >> "$STUB_STATE/ssh-sessions"
if [ -f "$STUB_STATE/down" ]; then echo "ssh: connect to host: Connection refused" >&2; exit 255; fi
exec bash -c "$SSH_ORIGINAL_COMMAND"
"#;

/// A fake node's package tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packages {
    /// Stubs that record their calls (Ubuntu).
    Stubs,
    /// Debian's own apt and dpkg in the node's root (Ubuntu): [`real_apt`].
    Apt,
    /// Debian's own dnf and rpm in the node's root, versionlock in use (Rocky):
    /// [`real_dnf`].
    Dnf,
    /// Debian's own zypper and rpm in the node's root, locks in use (openSUSE):
    /// [`real_zypper`].
    Zypper,
    /// A k3s or RKE2 node: its binary at the release its kubelet reports
    /// ([`super::k3s::install`]).
    Release(super::k3s::Distro),
}

/// One fake node: an sshd with stub tools.
pub struct FakeNode {
    pub name: String,
    /// The loopback address its sshd is reached at: 127.0.0.1, or its own on a
    /// [`SharedSshd`].
    pub host: String,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// Its own sshd; none on a [`SharedSshd`].
    pub sshd: Option<Process>,
}

impl FakeNode {
    /// Starts the node's sshd, with stub package tools; adds its host key to the client's
    /// known_hosts.
    pub async fn start(name: &str, api: &FakeKube, client: &SshClient, minor: &str) -> Self {
        Self::start_with(name, api, client, minor, Packages::Stubs).await
    }

    /// As [`FakeNode::start`], with the package tools `packages`: kubeadm, kubelet and
    /// kubectl installed at the node's kubelet version and held.
    pub async fn start_with(
        name: &str,
        api: &FakeKube,
        client: &SshClient,
        minor: &str,
        packages: Packages,
    ) -> Self {
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let mut env = node_files(d, name, api, minor);
        let kubelet = api.node(name)["status"]["nodeInfo"]["kubeletVersion"]
            .as_str()
            .expect("kubelet")
            .trim_start_matches('v')
            .to_owned();
        match packages {
            Packages::Stubs => {}
            Packages::Apt => {
                real_apt(d, &mut env, minor, &format!("{kubelet}-1.1"));
            }
            Packages::Dnf => {
                real_dnf(d, &mut env, minor, &format!("{kubelet}-150500.1.1"), true);
            }
            Packages::Zypper => {
                real_zypper(d, &mut env, minor, &format!("{kubelet}-150500.1.1"), true);
            }
            Packages::Release(distro) => {
                super::k3s::install(d, &mut env, distro, &format!("v{kubelet}"));
            }
        }
        let session = d.join("bin/session");
        super::stacked::write_executable(&session, SESSION);
        let set_env: Vec<String> = env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .chain([NO_RC.to_owned()])
            .collect();
        let port = free_port();
        let sshd = start_sshd(
            d,
            client,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nMaxStartups 100\n\
                 ForceCommand {d}/bin/session\nSetEnv {}\n",
                set_env.join(" "),
                d = d.display(),
            ),
            port,
            false,
        )
        .await;
        let fake = Self {
            name: name.into(),
            host: "127.0.0.1".into(),
            port,
            dir,
            sshd: Some(sshd),
        };
        fake.trust(client);
        fake
    }

    /// Adds this node's current host key to the client's known_hosts.
    pub fn trust(&self, client: &SshClient) {
        let key = std::fs::read_to_string(self.dir.path().join("host_key.pub")).expect("host key");
        let key: Vec<&str> = key.split_whitespace().take(2).collect();
        let mut known = std::fs::read_to_string(&client.known_hosts).unwrap_or_default();
        known.push_str(&format!(
            "[{}]:{} {}\n",
            self.host,
            self.port,
            key.join(" ")
        ));
        std::fs::write(&client.known_hosts, known).expect("known_hosts");
    }

    /// Gives the node a new host key (as a reinstalled or impersonated host would have).
    pub fn change_host_key(&mut self) {
        let key = self.dir.path().join("host_key");
        std::fs::remove_file(&key).expect("old key");
        std::fs::remove_file(key.with_extension("pub")).expect("old key");
        keygen(&key);
        let sshd = self.sshd.as_mut().expect("a node with its own sshd");
        sshd.stop();
        sshd.start();
    }

    /// Makes this node a control plane for the stub kubeadm: its upgrade moves the static
    /// pods, and restarts the stacked etcd member `etcd_ctl` drives, if any.
    pub fn make_control_plane(&self, etcd_ctl: Option<&Path>) {
        let state = self.dir.path().join("state");
        std::fs::write(state.join("control-plane"), "").expect("marker");
        if let Some(ctl) = etcd_ctl {
            std::os::unix::fs::symlink(ctl, state.join("etcd-ctl")).expect("etcd-ctl");
        }
    }

    /// Makes systemd unit `unit` active on this node (`systemctl is-active` says so).
    pub fn activate(&self, unit: &str) {
        std::fs::write(self.dir.path().join(format!("state/active-{unit}")), "").expect("unit");
    }

    /// Gives this node a tool of its own, `name`, the shell script `text` (an OS's own
    /// tool, say, that the machine lacks).
    pub fn add_tool(&self, name: &str, text: &str) {
        super::stacked::write_executable(&self.dir.path().join("bin").join(name), text);
    }

    /// Makes this node's etcd member not come back from its upgrade.
    pub fn break_etcd(&self) {
        std::fs::write(self.dir.path().join("state/etcd-broken"), "").expect("broken");
    }

    /// Makes this node's kubelet come back NotReady from its restart.
    pub fn stay_not_ready(&self) {
        std::fs::write(self.dir.path().join("state/stay-not-ready"), "").expect("marker");
    }

    /// Makes every kubeadm call on this node take `secs` seconds.
    pub fn slow_kubeadm(&self, secs: u32) {
        std::fs::write(self.dir.path().join("state/slow"), secs.to_string()).expect("slow");
    }

    /// Makes `kubeadm upgrade` on this node wait until [`FakeNode::release_kubeadm`].
    pub fn hold_kubeadm(&self) {
        std::fs::write(self.dir.path().join("state/hold"), "").expect("hold");
    }

    /// Lets a held `kubeadm upgrade` go on.
    pub fn release_kubeadm(&self) {
        std::fs::remove_file(self.dir.path().join("state/hold")).expect("release");
    }

    /// Makes the next `kubeadm upgrade` on this node lose its SSH session (after any
    /// hold) and finish without it.
    pub fn cut_session_during_upgrade(&self) {
        std::fs::write(self.dir.path().join("state/cut-session"), "").expect("marker");
    }

    /// The times the node script ran its upgrade on this node: its `apt-get update`s, but
    /// for those of the download before the drain (`--stage`, which downloads only).
    pub fn script_runs(&self) -> usize {
        // Each run's calls, from its update to the next.
        let mut runs: Vec<Vec<String>> = Vec::new();
        for call in self.calls() {
            if call.starts_with("apt-get update") {
                runs.push(Vec::new());
            }
            if let Some(run) = runs.last_mut() {
                run.push(call);
            }
        }
        runs.iter()
            .filter(|run| !run.iter().any(|c| c.contains("--download-only")))
            .count()
    }

    /// Makes `kubeadm upgrade` on this node fail until [`FakeNode::fix_upgrade`].
    pub fn fail_upgrade(&self) {
        std::fs::write(self.dir.path().join("state/fail-upgrade"), "").expect("fail");
    }

    /// Lets `kubeadm upgrade` on this node succeed again.
    pub fn fix_upgrade(&self) {
        std::fs::remove_file(self.dir.path().join("state/fail-upgrade")).expect("fix");
    }

    /// Each `kubeadm upgrade` this node ran, from its start to its end, in seconds since
    /// the epoch by the node's own clock, in order; a run cut short has no end.
    pub fn upgrade_spans(&self) -> Vec<(f64, Option<f64>)> {
        let text = std::fs::read_to_string(self.dir.path().join("state/upgrade-spans"))
            .unwrap_or_default();
        let mut spans: Vec<(f64, Option<f64>)> = Vec::new();
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("start", t)) => spans.push((t.parse().expect("time"), None)),
                Some(("end", t)) => {
                    let open = spans.last_mut().expect("an end after a start");
                    open.1 = Some(t.parse().expect("time"));
                }
                _ => panic!("bad span line {line:?}"),
            }
        }
        spans
    }

    /// Leaves the reboot sentinel (`$STUB_STATE/reboot-required`) on this node.
    pub fn need_reboot(&self) {
        std::fs::write(self.dir.path().join("state/reboot-required"), "").expect("sentinel");
    }

    /// Whether the reboot sentinel is on this node.
    pub fn needs_reboot(&self) -> bool {
        self.dir.path().join("state/reboot-required").exists()
    }

    /// Makes a reboot of this node take `secs` seconds to come back.
    pub fn reboot_delay(&self, secs: f64) {
        std::fs::write(self.dir.path().join("state/reboot-delay"), secs.to_string())
            .expect("delay");
    }

    /// Makes the reboot command hold its session open `secs` seconds before the node cuts
    /// it (systemd stopping the sessions); the node is already going down.
    pub fn shutdown_delay(&self, secs: f64) {
        std::fs::write(
            self.dir.path().join("state/shutdown-delay"),
            secs.to_string(),
        )
        .expect("delay");
    }

    /// Makes this node's upgrade leave the reboot sentinel behind.
    pub fn sentinel_after_upgrade(&self) {
        std::fs::write(self.dir.path().join("state/sentinel-after-upgrade"), "").expect("marker");
    }

    /// Whether the node is down, rebooting.
    pub fn is_down(&self) -> bool {
        self.dir.path().join("state/down").exists()
    }

    /// This node's /etc/os-release reads `text` from now on.
    pub fn runs_os(&self, text: &str) {
        std::fs::write(self.dir.path().join("os-release"), text).expect("os-release");
    }

    /// From now on sudo on this node refuses: the login has no rule (deploy/node/sudoers).
    pub fn sudo_refuses(&self) {
        std::fs::write(self.dir.path().join("state/sudo-refuses"), "").expect("marker");
    }

    /// From now on sudo on this node allows the reboot again (the rule installed).
    pub fn sudo_allows(&self) {
        let _ = std::fs::remove_file(self.dir.path().join("state/sudo-refuses"));
    }

    /// From now on the login is not root: the node script goes through sudo.
    pub fn login_not_root(&self) {
        std::fs::write(self.dir.path().join("state/non-root"), "").expect("marker");
    }

    /// Makes this node never come back from a reboot.
    pub fn never_back(&self) {
        std::fs::write(self.dir.path().join("state/never-back"), "").expect("marker");
    }

    /// When this node took each reboot command, by its own clock (seconds since the epoch).
    pub fn reboot_times(&self) -> Vec<f64> {
        std::fs::read_to_string(self.dir.path().join("state/reboots"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("reboot ")?.parse().ok())
            .collect()
    }

    /// Each reboot command this node took, by its own clock.
    pub fn reboots(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("state/reboots"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// Every stubbed call made on this node, one per line.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The SSH sessions this node's sshd served, and over how many connections (told
    /// apart by the client's address and port, as sshd saw them).
    pub fn ssh_sessions(&self) -> (usize, usize) {
        let seen =
            std::fs::read_to_string(self.dir.path().join("state/ssh-sessions")).unwrap_or_default();
        let connections: std::collections::BTreeSet<Vec<&str>> = seen
            .lines()
            .map(|l| l.split_whitespace().take(2).collect())
            .collect();
        (seen.lines().count(), connections.len())
    }

    /// The version of `pkg` installed: dpkg's database on a node with the real apt, else
    /// what the stubs recorded.
    pub fn installed(&self, pkg: &str) -> String {
        if let Some(admin) = self.dpkg_admin() {
            return dpkg_field(&admin, pkg, "${Version}");
        }
        if let Some(root) = self.rpm_root() {
            return rpm_field(&root, pkg, "%{VERSION}-%{RELEASE}");
        }
        std::fs::read_to_string(
            self.dir
                .path()
                .join("state")
                .join(format!("installed-{pkg}")),
        )
        .unwrap_or_default()
        .trim()
        .to_owned()
    }

    /// The Kubernetes package repository the node's package manager reads: apt's source,
    /// or dnf's repository file.
    pub fn apt_source(&self) -> String {
        let root = self.dir.path().join("root");
        let path = [
            root.join("etc/apt/sources.list.d/kubernetes.list"),
            root.join("etc/yum.repos.d/kubernetes.repo"),
            root.join("etc/zypp/repos.d/kubernetes.repo"),
        ]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| self.dir.path().join("kubernetes.list"));
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Whether `pkg` is held at its installed version: by dpkg's database (`apt-mark
    /// hold`) on a node with the real apt, by dnf's versionlock list on one with the real
    /// dnf, by zypper's locks file on one with the real zypper.
    pub fn held(&self, pkg: &str) -> bool {
        if let Some(admin) = self.dpkg_admin() {
            return dpkg_field(&admin, pkg, "${db:Status-Want}") == "hold";
        }
        let root = self
            .rpm_root()
            .expect("a node with the real apt, dnf or zypper");
        if root.join("etc/zypp/repos.d").exists() {
            return zypper_locks(&root).iter().any(|l| l == pkg);
        }
        let locks = std::fs::read_to_string(root.join("etc/dnf/plugins/versionlock.list"))
            .unwrap_or_default();
        let want = format!("{pkg}-0:{}.*", self.installed(pkg));
        locks.lines().any(|l| l == want)
    }

    /// The root of rpm's database, on a node with the real dnf or zypper.
    fn rpm_root(&self) -> Option<PathBuf> {
        let root = self.dir.path().join("root");
        (root.join("etc/yum.repos.d").exists() || root.join("etc/zypp/repos.d").exists())
            .then_some(root)
    }

    /// dpkg's database, on a node with the real apt.
    fn dpkg_admin(&self) -> Option<PathBuf> {
        let admin = self.dir.path().join("root/var/lib/dpkg");
        admin.exists().then_some(admin)
    }

    /// `ssh.hosts` entry for rollgate.
    pub fn host_entry(&self) -> String {
        format!("{}={}:{}", self.name, self.host, self.port)
    }
}

/// One sshd for many nodes, each told apart by the loopback address it is reached at
/// (the whole of 127.0.0.0/8 is this machine): a thousand nodes cost one sshd, one host
/// key and a directory each. The sshd listens on every address at one port and lets in
/// only loopback clients with the client's key; its session reads the address the
/// connection reached (`SSH_CONNECTION`), takes that node's environment and runs the
/// node's own session, as a node's own sshd would. It runs at nice 19, sessions and all:
/// its nodes stand for machines of their own, whose work would not take rollgate's CPU.
pub struct SharedSshd {
    pub port: u16,
    dir: tempfile::TempDir,
    sshd: Process,
}

/// The key exchange fake nodes offer. OpenSSH's default, the post-quantum hybrid
/// sntrup761x25519, costs the connecting side about 0.14 s of CPU a handshake in Debian's
/// build; a real node's client runs elsewhere, but every fake node's handshake runs on
/// this machine, beside rollgate, a thousand at a time at scale.
const KEX: &str = "curve25519-sha256";

/// Starts an sshd in `d` with a new host key, trusting `client`'s key, and `own` (where
/// it listens, its session) on top of what every fake node's sshd has; once it listens
/// on `port`. `nice`: at the lowest CPU priority, sessions and all.
async fn start_sshd(d: &Path, client: &SshClient, own: String, port: u16, nice: bool) -> Process {
    keygen(&d.join("host_key"));
    std::fs::copy(client.key.with_extension("pub"), d.join("authorized_keys")).expect("keys");
    let config = d.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "{own}HostKey {d}/host_key\nPidFile none\n\
             AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\nLogLevel ERROR\nKexAlgorithms {KEX}\n",
            d = d.display(),
        ),
    )
    .expect("sshd_config");
    let sshd_args = vec![
        "-D".into(),
        "-e".into(),
        "-f".into(),
        config.display().to_string(),
    ];
    // nice execs sshd: the PID stopped is sshd's.
    let sshd = if nice {
        let args = ["-n", "19", "/usr/sbin/sshd"]
            .into_iter()
            .map(String::from)
            .chain(sshd_args)
            .collect();
        Process::spawn("sshd", "/usr/bin/nice", args, d.join("sshd.log"))
    } else {
        Process::spawn("sshd", "/usr/sbin/sshd", sshd_args, d.join("sshd.log"))
    };
    super::eventually(
        "sshd to listen",
        std::time::Duration::from_secs(10),
        || async {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(drop)
        },
    )
    .await;
    sshd
}

/// The shared sshd's session: the node by the address reached.
const DISPATCH: &str = r#"#!/bin/bash
read -r _ _ address _ <<< "$SSH_CONNECTION"
node="$(dirname "$0")/../by-address/$address"
[ -f "$node/env" ] || { echo "no node at $address" >&2; exit 255; }
set -a
. "$node/env"
set +a
exec "$node/bin/session"
"#;

impl SharedSshd {
    /// Starts the sshd, trusting `client`'s key.
    pub async fn start(client: &SshClient) -> Self {
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        std::fs::create_dir_all(d.join("bin")).expect("bin");
        std::fs::create_dir_all(d.join("by-address")).expect("by-address");
        super::stacked::write_executable(&d.join("bin/dispatch"), DISPATCH);
        let port = free_port();
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let sshd = start_sshd(
            d,
            client,
            format!(
                "Port {port}\nListenAddress 0.0.0.0\nAllowUsers {user}@127.0.0.0/8\n\
                 MaxStartups 400:30:1000\nForceCommand {d}/bin/dispatch\nSetEnv {NO_RC}\n",
                d = d.display(),
            ),
            port,
            true,
        )
        .await;
        Self { port, dir, sshd }
    }

    /// The `index`th node's address: 127.1.x.y, never 127.0.0.1 (where the rest listens).
    pub fn address(index: usize) -> String {
        format!("127.1.{}.{}", index / 200, index % 200 + 10)
    }

    /// Node `name`, the `index`th on this sshd, with the stub tools; trusted by `client`.
    pub fn add(
        &self,
        name: &str,
        index: usize,
        api: &FakeKube,
        client: &SshClient,
        minor: &str,
    ) -> FakeNode {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let env = node_files(d, name, api, minor);
        super::stacked::write_executable(&d.join("bin/session"), SESSION);
        let env: String = env
            .iter()
            .map(|(k, v)| format!("{k}='{}'\n", v.replace('\'', r"'\''")))
            .collect();
        std::fs::write(d.join("env"), env).expect("env");
        let host = Self::address(index);
        std::os::unix::fs::symlink(d, self.dir.path().join("by-address").join(&host))
            .expect("by-address");
        std::fs::copy(self.dir.path().join("host_key.pub"), d.join("host_key.pub"))
            .expect("host key");
        let node = FakeNode {
            name: name.into(),
            host,
            port: self.port,
            dir,
            sshd: None,
        };
        node.trust(client);
        node
    }

    /// The shared sshd's log.
    pub fn logs(&self) -> String {
        self.sshd.logs()
    }
}
