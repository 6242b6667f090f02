//! Which Kubernetes distribution a cluster runs, and the releases of k3s and RKE2. A
//! release such as `v1.31.4+k3s1` is a Kubernetes version and a build of it; anything of
//! one that reaches a node's shell passes through [`Release::parse`] first.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::version::Version;

/// How the cluster's nodes are installed and upgraded (`cluster.distribution`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    /// kubeadm with the pkgs.k8s.io packages (apt, dnf or zypper on each node).
    #[default]
    Kubeadm,
    /// k3s: one binary per node, `k3s` (servers) or `k3s-agent` (agents) under systemd,
    /// embedded etcd on the servers.
    K3s,
    /// RKE2: one binary per node, `rke2-server` or `rke2-agent` under systemd, the control
    /// plane as static pods, embedded etcd on the servers.
    Rke2,
}

impl Distribution {
    /// Its name in settings and messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kubeadm => "kubeadm",
            Self::K3s => "k3s",
            Self::Rke2 => "rke2",
        }
    }

    /// The build tag of its releases (`k3s` of `+k3s1`, `rke2r` of `+rke2r1`); none for
    /// kubeadm, whose releases are Kubernetes' own.
    pub fn build_tag(self) -> Option<&'static str> {
        match self {
            Self::Kubeadm => None,
            Self::K3s => Some("k3s"),
            Self::Rke2 => Some("rke2r"),
        }
    }

    /// The distribution a node's reported kubelet version shows (`v1.31.4+k3s1` is k3s).
    pub fn of_reported(raw: &str) -> Self {
        let build = raw.split_once('+').map_or("", |(_, b)| b);
        if build.starts_with("rke2r") {
            Self::Rke2
        } else if build.starts_with("k3s") {
            Self::K3s
        } else {
            Self::Kubeadm
        }
    }

    /// Where its release artifacts are published when `cluster.release_mirror` is unset.
    pub fn default_mirror(self) -> &'static str {
        match self {
            Self::Kubeadm => "",
            Self::K3s => "https://github.com/k3s-io/k3s/releases/download",
            Self::Rke2 => "https://github.com/rancher/rke2/releases/download",
        }
    }

    /// The channel server `rollgate detect` reads when `detect.channel_url` is unset.
    pub fn default_channel_url(self) -> &'static str {
        match self {
            Self::Kubeadm => "",
            Self::K3s => "https://update.k3s.io/v1-release/channels",
            Self::Rke2 => "https://update.rke2.io/v1-release/channels",
        }
    }

    /// Whether its control plane runs as static pods rollgate can read (kubeadm, RKE2); k3s
    /// runs it inside its own process.
    pub fn has_static_pods(self) -> bool {
        !matches!(self, Self::K3s)
    }

    /// The node a member of its stacked etcd belongs to. kubeadm names a member after its
    /// node; k3s and RKE2 after the node and 8 hex digits (`server-1-3f2a9c1d`).
    pub fn member_node(self, member: &str) -> &str {
        if self == Self::Kubeadm {
            return member;
        }
        match member.rsplit_once('-') {
            Some((node, hash))
                if !node.is_empty()
                    && hash.len() == 8
                    && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                node
            }
            _ => member,
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `url` may be given to a node as a release mirror: `http://` or `https://` and
/// then only letters, digits and `._:/@%-`, no `..`, as the node script checks it again.
pub fn is_mirror_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|r| {
        !r.is_empty()
            && !url.contains("..")
            && r.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/@%-".contains(&b))
    })
}

/// The most builds of one Kubernetes version a release may name.
pub const MAX_BUILD: u32 = 999;

/// A release of k3s or RKE2: `v1.31.4+k3s1`, `v1.31.4+rke2r2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Release {
    /// The distribution it belongs to.
    pub distribution: Distribution,
    /// The Kubernetes version it carries.
    pub version: Version,
    /// Its build of that version, from 1.
    pub build: u32,
}

/// Why a string is not a release.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a {distribution} release: {why} (expected e.g. {example})")]
pub struct ReleaseError {
    input: String,
    distribution: Distribution,
    why: String,
    example: String,
}

impl Release {
    /// Parses `vMAJOR.MINOR.PATCH+TAGN` (the `v` may be left out) of `distribution`: the
    /// version as [`Version::parse`] takes it, the distribution's tag, a build from 1 to 999
    /// without a leading zero. Nothing else: no spaces, no other suffix.
    pub fn parse(input: &str, distribution: Distribution) -> Result<Self, ReleaseError> {
        let tag = distribution.build_tag().unwrap_or("");
        let fail = |why: String| ReleaseError {
            input: input.chars().take(40).collect(),
            distribution,
            why,
            example: format!("v1.31.4+{tag}1"),
        };
        if tag.is_empty() {
            return Err(fail("kubeadm releases carry no build".into()));
        }
        let bare = input.strip_prefix('v').unwrap_or(input);
        let (version, build) = bare
            .split_once('+')
            .ok_or_else(|| fail(format!("it has no +{tag}N build")))?;
        let version = Version::parse(version).map_err(|e| fail(e.to_string()))?;
        let number = build
            .strip_prefix(tag)
            .ok_or_else(|| fail(format!("its build {build:?} is not {tag}N")))?;
        let digits_ok = !number.is_empty()
            && number.len() <= 3
            && number.bytes().all(|b| b.is_ascii_digit())
            && !number.starts_with('0');
        let build = digits_ok
            .then(|| number.parse::<u32>().ok())
            .flatten()
            .filter(|n| (1..=MAX_BUILD).contains(n))
            .ok_or_else(|| fail(format!("its build number {number:?} is not 1 to 999")))?;
        Ok(Self {
            distribution,
            version,
            build,
        })
    }

    /// The first build of `version`, which a request that names no build gets.
    pub fn first(distribution: Distribution, version: Version) -> Self {
        Self {
            distribution,
            version,
            build: 1,
        }
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = self.distribution.build_tag().unwrap_or("");
        write!(f, "v{}+{tag}{}", self.version, self.build)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_and_print_as_their_projects_name_them() {
        for (input, distribution, printed) in [
            ("v1.31.4+k3s1", Distribution::K3s, "v1.31.4+k3s1"),
            ("1.31.4+k3s2", Distribution::K3s, "v1.31.4+k3s2"),
            ("v1.30.10+rke2r1", Distribution::Rke2, "v1.30.10+rke2r1"),
            ("v1.32.0+rke2r999", Distribution::Rke2, "v1.32.0+rke2r999"),
        ] {
            let release = Release::parse(input, distribution).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(release.to_string(), printed, "{input}");
        }
    }

    #[test]
    fn anything_else_is_refused_before_it_reaches_a_shell() {
        for (input, distribution) in [
            ("v1.31.4", Distribution::K3s),
            ("v1.31.4+rke2r1", Distribution::K3s),
            ("v1.31.4+k3s1", Distribution::Rke2),
            ("v1.31.4+k3s0", Distribution::K3s),
            ("v1.31.4+k3s01", Distribution::K3s),
            ("v1.31.4+k3s1000", Distribution::K3s),
            ("v1.31.4+k3s", Distribution::K3s),
            ("v1.31.4+k3s1;reboot", Distribution::K3s),
            ("v1.31.4+k3s1 ", Distribution::K3s),
            ("v1.31+k3s1", Distribution::K3s),
            ("vv1.31.4+k3s1", Distribution::K3s),
            ("v1.31.4-rc1+k3s1", Distribution::K3s),
            ("$(id)+k3s1", Distribution::K3s),
            ("v1.31.4+k3s1", Distribution::Kubeadm),
        ] {
            let err = Release::parse(input, distribution).expect_err(input);
            assert!(err.to_string().contains("expected e.g."), "{err}");
        }
    }

    #[test]
    fn a_mirror_is_a_plain_http_url() {
        for (url, ok) in [
            ("https://github.com/k3s-io/k3s/releases/download", true),
            ("http://127.0.0.1:8080/mirror", true),
            ("ftp://mirror/k3s", false),
            ("https://mirror/k3s; reboot", false),
            ("https://mirror/../etc", false),
            ("https://mirror/$(id)", false),
            ("https://", false),
        ] {
            assert_eq!(is_mirror_url(url), ok, "{url}");
        }
    }

    #[test]
    fn a_node_shows_its_distribution_in_its_kubelet_version() {
        for (raw, want) in [
            ("v1.31.4+k3s1", Distribution::K3s),
            ("v1.31.4+rke2r1", Distribution::Rke2),
            ("v1.31.4", Distribution::Kubeadm),
            ("v1.31.4-eks-1234", Distribution::Kubeadm),
        ] {
            assert_eq!(Distribution::of_reported(raw), want, "{raw}");
        }
    }

    #[test]
    fn embedded_etcd_members_are_named_after_their_nodes_and_a_hash() {
        for (distribution, member, node) in [
            (Distribution::K3s, "server-1-3f2a9c1d", "server-1"),
            (Distribution::Rke2, "cp-a1b2c3d4", "cp"),
            (Distribution::K3s, "server-1", "server-1"),
            (Distribution::K3s, "server-1-xyz", "server-1-xyz"),
            (Distribution::K3s, "-3f2a9c1d", "-3f2a9c1d"),
            (Distribution::Kubeadm, "cp-3f2a9c1d", "cp-3f2a9c1d"),
        ] {
            assert_eq!(distribution.member_node(member), node, "{member}");
        }
    }
}
