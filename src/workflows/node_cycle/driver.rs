//! Node drivers: how one node is checked, staged, upgraded and restarted, by the
//! distribution it runs. Every driver is a script piped over SSH (`bash -s -- ARGS`); the
//! driver says which script and which arguments, and what its exit statuses mean. The
//! arguments are built here from validated values only (versions, releases, a mirror URL
//! checked by `check-config`), so nothing else reaches a node's shell.
//!
//! | | kubeadm | k3s, RKE2 |
//! |---|---|---|
//! | detect | `/etc/os-release`: apt, dnf or zypper; kubeadm, kubelet installed | the binary's `--version` |
//! | stage | kubeadm, kubelet and kubectl downloaded into the package manager's cache, checked against the repository's checksums, before the drain | the release artifact, checked against its `sha256sum` file, before the drain |
//! | apply | `kubeadm upgrade apply\|node`, then kubelet and kubectl, held again | the binary swapped atomically, the previous kept as `NAME.previous` |
//! | restart | `systemctl restart kubelet` | `systemctl restart k3s\|k3s-agent\|rke2-server\|rke2-agent` |
//! | verify | the node reports the version and Ready (rollgate's verify step) | the same |
//! | roll back | no: kubeadm does not downgrade | the previous binary stays beside the new one |

use crate::domain::distribution::{Distribution, Release};
use crate::domain::facts::{NodeFacts, PACKAGE_MANAGERS};
use crate::domain::version::Version;

/// The kubeadm node script.
pub const KUBEADM_SCRIPT: &str = include_str!("../../../scripts/node-upgrade.sh");
/// The k3s and RKE2 node script.
pub const K3S_SCRIPT: &str = include_str!("../../../scripts/node-k3s.sh");

/// The script that names a node's own reboot managers (locksmithd, unattended-upgrades or
/// dnf-automatic set to reboot), which would reboot it while rollgate has it in hand.
pub const REBOOT_MANAGERS_SCRIPT: &str = include_str!("../../../scripts/reboot-managers.sh");
/// Its exit status when it found some.
pub const REBOOT_MANAGERS_FOUND: i32 = 5;

/// What [`REBOOT_MANAGERS_SCRIPT`] says of a node: `Ok` with the managers found (none: an
/// empty list), or `Err` when its answer makes no sense (not 0 or 5), so that pre-flight
/// does not pass on a node it could not read.
pub fn reboot_managers(status: Option<i32>, stdout: &str) -> Result<Vec<String>, String> {
    match status {
        Some(0) => Ok(Vec::new()),
        Some(REBOOT_MANAGERS_FOUND) => Ok(stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()),
        other => Err(format!(
            "reboot-managers.sh exited with {}",
            other.map_or("a signal".into(), |s| s.to_string())
        )),
    }
}

/// The exit status of the kubeadm script on a node whose OS it does not serve.
pub const UNSUPPORTED_OS: i32 = 3;
/// The exit status of the k3s script when the release is missing from the mirror or does
/// not match its checksum, and of the kubeadm script when the node's repository does not
/// offer the release: no retry makes it right.
pub const RELEASE_REFUSED: i32 = 4;

/// What a node is to the upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// The first control plane (kubeadm's `upgrade apply`).
    FirstControlPlane,
    /// Another control plane (a k3s or RKE2 server).
    ControlPlane,
    /// A worker (a k3s or RKE2 agent).
    Worker,
}

/// The driver of a cluster's nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDriver {
    /// The distribution the nodes run.
    pub distribution: Distribution,
    /// Where k3s and RKE2 releases are downloaded from (a URL `check-config` validated).
    pub mirror: String,
}

impl NodeDriver {
    /// The kubeadm driver.
    pub fn kubeadm() -> Self {
        Self {
            distribution: Distribution::Kubeadm,
            mirror: String::new(),
        }
    }

    /// The script piped to the node.
    pub fn script(&self) -> &'static str {
        match self.distribution {
            Distribution::Kubeadm => KUBEADM_SCRIPT,
            Distribution::K3s | Distribution::Rke2 => K3S_SCRIPT,
        }
    }

    /// The script's name, for messages.
    pub fn script_name(&self) -> &'static str {
        match self.distribution {
            Distribution::Kubeadm => "node-upgrade.sh",
            Distribution::K3s | Distribution::Rke2 => "node-k3s.sh",
        }
    }

    /// The release a node is upgraded to: kubeadm's is the version itself, k3s's and
    /// RKE2's a build of it (`build` 1 when the request names none).
    pub fn release(&self, target: Version, build: Option<u32>) -> String {
        match self.distribution {
            Distribution::Kubeadm => target.to_string(),
            d => Release {
                distribution: d,
                version: target,
                build: build.unwrap_or(1),
            }
            .to_string(),
        }
    }

    /// Whether the node keeps what it ran before, so that an operator can go back to it.
    pub fn can_roll_back(&self) -> bool {
        self.distribution != Distribution::Kubeadm
    }

    fn k3s_args(&self, action: &str, release: &str) -> Vec<String> {
        [
            action,
            "--distribution",
            self.distribution.name(),
            "--release",
            release,
            "--mirror",
            &self.mirror,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// Pre-flight on every node: it answers, runs what the driver serves, has the tools
    /// and sudo rules; for k3s and RKE2, the mirror has the release.
    /// On kubeadm, a patch release is looked for in each node's repository as its lists
    /// stand (`patch`); a minor's repository is set only at the apt-repo stage.
    pub fn check(&self, target: Version, build: Option<u32>, patch: bool) -> Vec<String> {
        match self.distribution {
            Distribution::Kubeadm if patch => {
                vec!["--check".into(), "--release".into(), target.to_string()]
            }
            Distribution::Kubeadm => vec!["--check".into()],
            _ => self.k3s_args("--check", &self.release(target, build)),
        }
    }

    /// Before the drain: download the release and check it against its checksums, so that
    /// the node is drained only for the install and a bad download is refused undrained.
    pub fn stage(&self, target: Version, build: Option<u32>) -> Vec<String> {
        match self.distribution {
            Distribution::Kubeadm => {
                vec!["--stage".into(), "--release".into(), target.to_string()]
            }
            _ => self.k3s_args("--stage", &self.release(target, build)),
        }
    }

    /// The upgrade of a node as `role`: apply, restart.
    pub fn apply(&self, role: NodeRole, target: Version, build: Option<u32>) -> Vec<String> {
        match self.distribution {
            Distribution::Kubeadm => {
                let (role, kubeadm) = match role {
                    NodeRole::FirstControlPlane => ("control-plane", "apply"),
                    NodeRole::ControlPlane => ("control-plane", "node"),
                    NodeRole::Worker => ("worker", "node"),
                };
                ["--role", role, "--kubeadm", kubeadm, "--release"]
                    .map(str::to_owned)
                    .into_iter()
                    .chain([target.to_string()])
                    .collect()
            }
            _ => {
                let role = match role {
                    NodeRole::FirstControlPlane | NodeRole::ControlPlane => "server",
                    NodeRole::Worker => "agent",
                };
                let mut args = self.k3s_args("--apply", &self.release(target, build));
                args.extend(["--role".to_owned(), role.to_owned()]);
                args
            }
        }
    }

    /// `args` for `node`: on kubeadm, the package manager its label names
    /// (`rollgate.io/package-manager`, checked by the planner) goes with them, in place of
    /// the one its `/etc/os-release` suggests.
    pub fn on_node(&self, node: &NodeFacts, mut args: Vec<String>) -> Vec<String> {
        let named = node
            .package_manager
            .as_deref()
            .filter(|m| PACKAGE_MANAGERS.contains(m));
        if let (Distribution::Kubeadm, Some(manager)) = (self.distribution, named) {
            args.extend(["--manager".to_owned(), manager.to_owned()]);
        }
        args
    }

    /// What a refusal from the script means, when it is one no retry mends.
    pub fn refusal(&self, status: Option<i32>) -> Option<&'static str> {
        match (self.distribution, status) {
            (Distribution::Kubeadm, Some(UNSUPPORTED_OS)) => Some("runs an OS no driver serves"),
            (Distribution::Kubeadm, Some(RELEASE_REFUSED)) => {
                Some("its repository does not offer the release")
            }
            (Distribution::K3s | Distribution::Rke2, Some(RELEASE_REFUSED)) => {
                Some("the release is refused")
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).expect("version")
    }

    fn k3s() -> NodeDriver {
        NodeDriver {
            distribution: Distribution::K3s,
            mirror: "http://127.0.0.1:9/m".into(),
        }
    }

    #[test]
    fn each_driver_says_what_its_script_does() {
        let kubeadm = NodeDriver::kubeadm();
        let rke2 = NodeDriver {
            distribution: Distribution::Rke2,
            ..k3s()
        };
        let cases: [(&NodeDriver, NodeRole, Option<u32>, &str); 6] = [
            (
                &kubeadm,
                NodeRole::FirstControlPlane,
                None,
                "--role control-plane --kubeadm apply --release 1.34.5",
            ),
            (
                &kubeadm,
                NodeRole::ControlPlane,
                None,
                "--role control-plane --kubeadm node --release 1.34.5",
            ),
            (
                &kubeadm,
                NodeRole::Worker,
                None,
                "--role worker --kubeadm node --release 1.34.5",
            ),
            (
                &k3s(),
                NodeRole::FirstControlPlane,
                None,
                "--apply --distribution k3s --release v1.34.5+k3s1 --mirror http://127.0.0.1:9/m --role server",
            ),
            (
                &k3s(),
                NodeRole::Worker,
                Some(2),
                "--apply --distribution k3s --release v1.34.5+k3s2 --mirror http://127.0.0.1:9/m --role agent",
            ),
            (
                &rke2,
                NodeRole::ControlPlane,
                None,
                "--apply --distribution rke2 --release v1.34.5+rke2r1 --mirror http://127.0.0.1:9/m --role server",
            ),
        ];
        for (driver, role, build, want) in cases {
            assert_eq!(driver.apply(role, v("1.34.5"), build).join(" "), want);
        }
        assert_eq!(
            kubeadm.stage(v("1.34.5"), None),
            ["--stage", "--release", "1.34.5"]
        );
        assert_eq!(kubeadm.check(v("1.35.0"), None, false), ["--check"]);
        assert_eq!(
            kubeadm.check(v("1.34.5"), None, true),
            ["--check", "--release", "1.34.5"]
        );
        assert_eq!(
            k3s().stage(v("1.34.5"), None).join(" "),
            "--stage --distribution k3s --release v1.34.5+k3s1 --mirror http://127.0.0.1:9/m"
        );
        assert!(!kubeadm.can_roll_back() && k3s().can_roll_back());
        assert_eq!(kubeadm.script_name(), "node-upgrade.sh");
        assert_eq!(rke2.script(), K3S_SCRIPT);
    }

    #[test]
    fn a_node_label_names_the_package_manager_on_kubeadm_only() {
        let node = |label: Option<&str>| NodeFacts {
            name: "w1".into(),
            role: crate::domain::facts::Role::Worker,
            kubelet: v("1.34.2"),
            distribution: Distribution::Kubeadm,
            package_manager: label.map(str::to_owned),
            containerd: None,
            ready: true,
            address: None,
        };
        let check = || vec!["--check".to_owned()];
        let cases: [(&NodeDriver, Option<&str>, &str); 5] = [
            (&NodeDriver::kubeadm(), None, "--check"),
            (&NodeDriver::kubeadm(), Some("dnf"), "--check --manager dnf"),
            (
                &NodeDriver::kubeadm(),
                Some("zypper"),
                "--check --manager zypper",
            ),
            (&NodeDriver::kubeadm(), Some("pacman; reboot"), "--check"),
            (&k3s(), Some("dnf"), "--check"),
        ];
        for (driver, label, want) in cases {
            assert_eq!(
                driver.on_node(&node(label), check()).join(" "),
                want,
                "{label:?}"
            );
        }
    }

    #[test]
    fn a_nodes_own_reboot_managers_are_read_from_the_script() {
        assert_eq!(reboot_managers(Some(0), ""), Ok(vec![]));
        assert_eq!(
            reboot_managers(
                Some(5),
                "locksmithd is active: x\n\nunattended-upgrades y\n"
            ),
            Ok(vec![
                "locksmithd is active: x".into(),
                "unattended-upgrades y".into()
            ])
        );
        assert!(reboot_managers(Some(2), "").is_err());
        assert!(reboot_managers(None, "").is_err());
    }

    #[test]
    fn only_its_own_refusals_stop_a_run() {
        assert!(NodeDriver::kubeadm().refusal(Some(3)).is_some());
        assert!(NodeDriver::kubeadm().refusal(Some(4)).is_some());
        assert!(NodeDriver::kubeadm().refusal(Some(2)).is_none());
        assert!(k3s().refusal(Some(4)).is_some());
        assert!(k3s().refusal(Some(2)).is_none());
        assert!(k3s().refusal(None).is_none());
    }
}
