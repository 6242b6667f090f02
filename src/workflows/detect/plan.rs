//! What the daily detection decides: from the running versions, the patches the control
//! plane's apt repository offers, and whether the next minor's repository carries a
//! release, the one upgrade to ask for (or none).

use serde::Serialize;

use crate::domain::distribution::{Distribution, Release};
use crate::domain::event::UpgradeKind;
use crate::domain::facts::{ClusterFacts, Role};
pub use crate::domain::facts::{Minor, minor_of, next_minor};
use crate::domain::version::{Version, debian_release};
use crate::ports::{Channel, RepoFormat};

/// What detection found out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// The control plane's version (the API server's).
    pub running: Version,
    /// Nodes whose kubelet is older than the API server (a rollout left part-done).
    pub behind: Vec<String>,
    /// The newest patch of the running minor the control plane's repository offers.
    pub latest_patch: Option<Version>,
    /// The next minor's repository.
    pub next_minor: NextMinor,
    /// On k3s and RKE2, the build of each release found (`1.34.5` → 2 for `v1.34.5+k3s2`),
    /// which the request asks for.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub builds: std::collections::BTreeMap<String, u32>,
}

/// Whether the next minor can be upgraded to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "latest")]
pub enum NextMinor {
    /// Not read: a patch comes first.
    NotChecked,
    /// Its repository is not published (no Release file).
    NotPublished,
    /// Published, but it holds no release yet (only pre-releases, or nothing).
    NoRelease,
    /// Published with this newest release.
    Released(Version),
}

/// The upgrade to ask for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "decision")]
pub enum Decision {
    /// Nothing to do.
    Nothing {
        /// Why, in words.
        why: String,
    },
    /// Ask for this upgrade.
    Upgrade {
        /// Patch or minor.
        kind: UpgradeKind,
        /// The version running now.
        running: Version,
        /// The version to reach.
        target: Version,
        /// Why, in words.
        why: String,
    },
}

/// Why the running version cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunningError {
    /// No node has the control-plane role.
    #[error("no control-plane node in the cluster (label node-role.kubernetes.io/control-plane)")]
    NoControlPlane,
    /// Kubelets newer than the API server: a skew Kubernetes does not support.
    #[error("kubelets newer than the API server's {api_server}: {nodes}")]
    NewerKubelet {
        /// The API server's version.
        api_server: Version,
        /// The nodes, with their versions.
        nodes: String,
    },
}

/// The running version (the API server's) and the nodes whose kubelet is behind it.
pub fn running(
    facts: &ClusterFacts,
    api_server: Version,
) -> Result<(Version, Vec<String>), RunningError> {
    if !facts.nodes.iter().any(|n| n.role == Role::ControlPlane) {
        return Err(RunningError::NoControlPlane);
    }
    let newer: Vec<String> = facts
        .nodes
        .iter()
        .filter(|n| n.kubelet > api_server)
        .map(|n| format!("{} {}", n.name, n.kubelet))
        .collect();
    if !newer.is_empty() {
        return Err(RunningError::NewerKubelet {
            api_server,
            nodes: newer.join(", "),
        });
    }
    let running = api_server;
    let behind = facts
        .nodes
        .iter()
        .filter(|n| n.kubelet < running)
        .map(|n| n.name.clone())
        .collect();
    Ok((running, behind))
}

/// The repository layout the control plane reads, from the node script's `--available`
/// output (`rollgate: package-manager dnf`): rpm for dnf and zypper, deb for apt.
pub fn repo_format(available: &str) -> RepoFormat {
    let manager = available
        .lines()
        .find_map(|l| l.strip_prefix("rollgate: package-manager "))
        .map(str::trim);
    match manager {
        Some("dnf" | "zypper") => RepoFormat::Rpm,
        _ => RepoFormat::Deb,
    }
}

/// The release the channel of `minor` (`v1.34`) names as its latest on a k3s or RKE2
/// channel server; `None` when the server has no such channel (the minor is not out). A
/// latest that is not a release of `distribution` and of that minor is an error: the
/// server is not to be followed.
pub fn channel_latest(
    channels: &[Channel],
    distribution: Distribution,
    minor: Minor,
) -> Result<Option<Release>, String> {
    let name = minor.to_string();
    let Some(channel) = channels.iter().find(|c| c.name == name) else {
        return Ok(None);
    };
    let release = Release::parse(&channel.latest, distribution)
        .map_err(|e| format!("channel {name}: {e}"))?;
    if minor_of(release.version) != minor {
        return Err(format!(
            "channel {name} names {release}, which is not of {name}"
        ));
    }
    Ok(Some(release))
}

/// Patch first when behind on patch; then finishing a part-done rollout; then the next
/// minor when it has a release; else nothing.
pub fn decide(f: &Findings) -> Decision {
    let running = f.running;
    if let Some(latest) = f.latest_patch.filter(|l| *l > running) {
        return Decision::Upgrade {
            kind: UpgradeKind::Patch,
            running,
            target: latest,
            why: format!("{latest} is the newest patch of {}", minor_of(running)),
        };
    }
    if !f.behind.is_empty() {
        return Decision::Upgrade {
            kind: UpgradeKind::Patch,
            running,
            target: running,
            why: format!(
                "finish the rollout: {} still older than the control plane's {running}",
                f.behind.join(", ")
            ),
        };
    }
    let next = next_minor(running);
    match &f.next_minor {
        NextMinor::Released(latest) => Decision::Upgrade {
            kind: UpgradeKind::Minor,
            running,
            target: *latest,
            why: format!("{} is published; its newest release is {latest}", next),
        },
        NextMinor::NoRelease => Decision::Nothing {
            why: format!(
                "{running} is the newest patch; {next} is published but holds no release yet"
            ),
        },
        NextMinor::NotPublished => Decision::Nothing {
            why: format!("{running} is the newest patch; {next} is not published yet"),
        },
        NextMinor::NotChecked => Decision::Nothing {
            why: format!("{running} is the newest patch; {next} was not checked"),
        },
    }
}

/// The Pushgateway exposition of a detection at `now` (seconds since the epoch):
/// `k8s_upgrade_available{kind,running,target} 1` when an upgrade is asked for, and
/// `k8s_version_check_last_run_timestamp`, the staleness watchdog. The group is replaced
/// as a whole, so an availability from an earlier week does not linger.
pub fn pushgateway_text(decision: &Decision, now: i64) -> String {
    let mut text = String::from(
        "# HELP k8s_upgrade_available 1 when detection found an upgrade to ask for.\n\
         # TYPE k8s_upgrade_available gauge\n",
    );
    if let Decision::Upgrade {
        kind,
        running,
        target,
        ..
    } = decision
    {
        text.push_str(&format!(
            "k8s_upgrade_available{{kind=\"{}\",running=\"{running}\",target=\"{target}\"}} 1\n",
            kind.name()
        ));
    }
    text.push_str(&format!(
        "# HELP k8s_version_check_last_run_timestamp When detection last completed.\n\
         # TYPE k8s_version_check_last_run_timestamp gauge\n\
         k8s_version_check_last_run_timestamp {now}\n"
    ));
    text
}

/// The Pushgateway text of reboot detection: per node read, 1 when its sentinel is set,
/// else 0 (kured's `kured_reboot_required`).
pub fn reboot_text(required: &std::collections::BTreeMap<String, bool>) -> String {
    let mut text = String::from(
        "# HELP rollgate_node_reboot_required 1 when the node's reboot sentinel is set.\n\
         # TYPE rollgate_node_reboot_required gauge\n",
    );
    for (node, set) in required {
        text.push_str(&format!(
            "rollgate_node_reboot_required{{node=\"{node}\"}} {}\n",
            u8::from(*set)
        ));
    }
    text
}

/// The releases of `minor` in `apt-cache madison kubeadm` output (`kubeadm | 1.34.5-1.1 |
/// https://…/v1.34/deb Packages`); pre-releases and other minors are left out.
pub fn madison_releases(stdout: &str, minor: Minor) -> Vec<Version> {
    let mut out: Vec<Version> = stdout
        .lines()
        .filter_map(|line| {
            let mut cols = line.split('|').map(str::trim);
            (cols.next()? == "kubeadm").then_some(())?;
            debian_release(cols.next()?)
        })
        .filter(|v| minor_of(*v) == minor)
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflows::k8s_upgrade::plan::NodeFacts;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn the_layout_read_is_the_control_planes_package_managers() {
        for (stdout, want) in [
            (
                "rollgate: package-manager dnf\n   kubeadm | 1.34.5-150500.1.1 | kubernetes\n",
                RepoFormat::Rpm,
            ),
            ("rollgate: package-manager zypper\n", RepoFormat::Rpm),
            (
                "rollgate: package-manager apt\n   kubeadm | 1.34.5-1.1 | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages\n",
                RepoFormat::Deb,
            ),
            ("   kubeadm | 1.34.5-1.1 | https://x\n", RepoFormat::Deb),
        ] {
            assert_eq!(repo_format(stdout), want, "{stdout}");
        }
    }

    #[test]
    fn the_channel_of_a_minor_names_its_latest_release() {
        let channels = |pairs: &[(&str, &str)]| -> Vec<Channel> {
            pairs
                .iter()
                .map(|(name, latest)| Channel {
                    name: (*name).into(),
                    latest: (*latest).into(),
                })
                .collect()
        };
        let minor = minor_of(v("1.34.2"));
        let served = channels(&[("stable", "v1.33.5+k3s1"), ("v1.34", "v1.34.5+k3s2")]);
        /// The release a channel names, or the error's words.
        type Want<'a> = Result<Option<&'a str>, &'a str>;
        let cases: [(&[Channel], Distribution, Want); 6] = [
            (&served, Distribution::K3s, Ok(Some("v1.34.5+k3s2"))),
            (&served[..1], Distribution::K3s, Ok(None)),
            (&served, Distribution::Rke2, Err("is not a rke2 release")),
            (
                &channels(&[("v1.34", "v1.35.0+k3s1")]),
                Distribution::K3s,
                Err("which is not of v1.34"),
            ),
            (
                &channels(&[("v1.34", "v1.34.5+k3s1; reboot")]),
                Distribution::K3s,
                Err("is not a k3s release"),
            ),
            (
                &channels(&[("v1.34", "")]),
                Distribution::K3s,
                Err("is not a k3s release"),
            ),
        ];
        for (channels, distribution, want) in cases {
            let got = channel_latest(channels, distribution, minor);
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    assert_eq!(got.map(|r| r.to_string()).as_deref(), want)
                }
                (Err(e), Err(text)) => assert!(e.contains(text), "{e}"),
                (got, want) => panic!("got {got:?}, want {want:?}"),
            }
        }
    }

    fn findings(latest: Option<&str>, next: NextMinor, behind: &[&str]) -> Findings {
        Findings {
            builds: Default::default(),
            running: v("1.34.2"),
            behind: behind.iter().map(|s| s.to_string()).collect(),
            latest_patch: latest.map(v),
            next_minor: next,
        }
    }

    #[test]
    fn every_branch_of_the_decision() {
        let released = || NextMinor::Released(v("1.35.1"));
        /// Findings, the upgrade wanted (none: nothing), words the reason must have.
        type Case = (Findings, Option<(UpgradeKind, &'static str)>, &'static str);
        let cases: Vec<Case> = vec![
            // Behind on patch: the patch first, even with the next minor out.
            (
                findings(Some("1.34.5"), released(), &[]),
                Some((UpgradeKind::Patch, "1.34.5")),
                "newest patch",
            ),
            // On the newest patch, next minor released: the minor's newest release.
            (
                findings(Some("1.34.2"), released(), &[]),
                Some((UpgradeKind::Minor, "1.35.1")),
                "v1.35 is published",
            ),
            // Nothing newer anywhere.
            (
                findings(Some("1.34.2"), NextMinor::NotPublished, &[]),
                None,
                "v1.35 is not published yet",
            ),
            // Next minor published without a release (release candidates only).
            (
                findings(Some("1.34.2"), NextMinor::NoRelease, &[]),
                None,
                "holds no release yet",
            ),
            // The repository offers nothing for this minor (e.g. lists not refreshed).
            (
                findings(None, NextMinor::NotPublished, &[]),
                None,
                "not published",
            ),
            // A part-done rollout is finished before a minor is started.
            (
                findings(Some("1.34.2"), released(), &["w2"]),
                Some((UpgradeKind::Patch, "1.34.2")),
                "finish the rollout: w2",
            ),
        ];
        for (f, want, why_has) in cases {
            let decision = decide(&f);
            match (&decision, want) {
                (
                    Decision::Upgrade {
                        kind, target, why, ..
                    },
                    Some((want_kind, want_target)),
                ) => {
                    assert_eq!((*kind, target.to_string()), (want_kind, want_target.into()));
                    assert!(why.contains(why_has), "{why}");
                }
                (Decision::Nothing { why }, None) => assert!(why.contains(why_has), "{why}"),
                other => panic!("{f:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_pushgateway_text_carries_the_availability_only_when_there_is_one() {
        let upgrade = Decision::Upgrade {
            kind: UpgradeKind::Minor,
            running: v("1.34.2"),
            target: v("1.35.1"),
            why: String::new(),
        };
        let text = pushgateway_text(&upgrade, 1_700_000_000);
        assert!(text.contains(
            "k8s_upgrade_available{kind=\"minor\",running=\"1.34.2\",target=\"1.35.1\"} 1\n"
        ));
        assert!(text.contains("k8s_version_check_last_run_timestamp 1700000000\n"));
        let nothing = pushgateway_text(&Decision::Nothing { why: String::new() }, 5);
        assert!(!nothing.contains("k8s_upgrade_available{"), "{nothing}");
        assert!(nothing.contains("k8s_version_check_last_run_timestamp 5\n"));
    }

    #[test]
    fn madison_lines_give_the_releases_of_one_minor() {
        let out = "   kubeadm | 1.34.5-1.1 | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages\n\
                   kubeadm | 1.34.10-1.1 | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages\n\
                   kubeadm | 1.34.2-1.1 | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages\n\
                   kubeadm | 1.35.0~rc.1-1.1 | https://pkgs.k8s.io/core:/stable:/v1.35/deb  Packages\n\
                   kubeadm | 1.33.9-1.1 | https://pkgs.k8s.io/core:/stable:/v1.33/deb  Packages\n\
                   kubelet | 1.34.11-1.1 | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages\n\
                   N: Unable to locate package\n";
        let got = madison_releases(out, minor_of(v("1.34.0")));
        assert_eq!(got, vec![v("1.34.2"), v("1.34.5"), v("1.34.10")]);
        assert!(madison_releases("", minor_of(v("1.34.0"))).is_empty());
    }

    #[test]
    fn the_running_version_is_the_api_server_and_older_kubelets_are_behind() {
        let node = |name: &str, role, kubelet: &str| NodeFacts {
            name: name.into(),
            role,
            kubelet: v(kubelet),
            distribution: Default::default(),
            package_manager: None,
            containerd: None,
            ready: true,
            address: None,
        };
        let facts = ClusterFacts {
            nodes: vec![
                node("cp", Role::ControlPlane, "1.34.2"),
                node("w1", Role::Worker, "1.34.2"),
                node("w2", Role::Worker, "1.34.1"),
            ],
        };
        assert_eq!(
            running(&facts, v("1.34.2")),
            Ok((v("1.34.2"), vec!["w2".to_owned()]))
        );
        // kubeadm upgrade apply ran, the control plane's kubelet did not follow yet.
        assert_eq!(
            running(&facts, v("1.34.3")),
            Ok((
                v("1.34.3"),
                vec!["cp".to_owned(), "w1".to_owned(), "w2".to_owned()]
            ))
        );
        assert_eq!(
            running(
                &ClusterFacts {
                    nodes: vec![node("w1", Role::Worker, "1.34.2")]
                },
                v("1.34.2")
            ),
            Err(RunningError::NoControlPlane)
        );
        assert!(matches!(
            running(&facts, v("1.34.1")),
            Err(RunningError::NewerKubelet { .. })
        ));
    }
}
