//! What rollgate reads from the cluster, as plain data: the nodes, etcd's members and
//! alarms, the control planes' static pods, and a version's minor. The adapters fill them,
//! the ports carry them, and the workflows' planners decide from them.

use std::fmt;

use super::distribution::Distribution;
use super::version::Version;

/// What a node is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Runs the control plane (label `node-role.kubernetes.io/control-plane`).
    ControlPlane,
    /// Runs workloads.
    Worker,
}

/// What the cluster says about one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Node name.
    pub name: String,
    /// Control plane or worker.
    pub role: Role,
    /// The kubelet version it reports.
    pub kubelet: Version,
    /// The distribution its kubelet version shows (`+k3s1`, `+rke2r1`, else kubeadm).
    pub distribution: Distribution,
    /// The package manager its `rollgate.io/package-manager` label names, in place of the
    /// one the node script reads off `/etc/os-release` (as written: the planner checks it).
    pub package_manager: Option<String>,
    /// The containerd version it reports, when its runtime is containerd.
    pub containerd: Option<Version>,
    /// Its Ready condition is True.
    pub ready: bool,
    /// Its InternalIP, if it reports one.
    pub address: Option<String>,
}

/// The label that names a kubeadm node's package manager, overriding `/etc/os-release`.
pub const PACKAGE_MANAGER_LABEL: &str = "rollgate.io/package-manager";

/// The package managers the kubeadm node script drives.
pub const PACKAGE_MANAGERS: [&str; 3] = ["apt", "dnf", "zypper"];

/// What the cluster says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterFacts {
    /// Every node.
    pub nodes: Vec<NodeFacts>,
}

impl ClusterFacts {
    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeFacts> {
        self.nodes.iter().find(|n| n.name == name)
    }
    /// Nodes not Ready, by name.
    pub fn not_ready(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|n| !n.ready)
            .map(|n| n.name.as_str())
            .collect()
    }
    /// Nodes whose kubelet is not at `target`, with what they run.
    pub fn behind(&self, target: Version) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.kubelet != target)
            .map(|n| format!("{} runs {}", n.name, n.kubelet))
            .collect()
    }
}

/// One etcd member as rollgate reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMemberFacts {
    /// Member id.
    pub id: u64,
    /// Member name (the node's name when stacked).
    pub name: String,
    /// It answered a status request.
    pub answering: bool,
    /// Its raft applied index (0 when it does not answer).
    pub raft_index: u64,
    /// Its raft term (0 when it does not answer).
    pub raft_term: u64,
}

/// An alarm raised on a member (`NOSPACE`, `CORRUPT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAlarm {
    /// The member that raised it.
    pub member: u64,
    /// The alarm's name.
    pub alarm: String,
}

/// What etcd says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdFacts {
    /// The member list.
    pub members: Vec<EtcdMemberFacts>,
    /// The leader a majority follows.
    pub leader: Option<u64>,
    /// Alarms raised.
    pub alarms: Vec<EtcdAlarm>,
}

impl EtcdFacts {
    /// The name of member `id`, or its id in hex.
    pub fn name_of(&self, id: u64) -> String {
        self.members
            .iter()
            .find(|m| m.id == id)
            .map_or_else(|| format!("{id:x}"), |m| m.name.clone())
    }

    /// The highest raft term any member reports.
    pub fn term(&self) -> u64 {
        self.members
            .iter()
            .map(|m| m.raft_term)
            .max()
            .unwrap_or_default()
    }

    /// The leader's name, if there is one.
    pub fn leader_name(&self) -> Option<String> {
        self.leader.map(|id| self.name_of(id))
    }
}

/// A control-plane static pod (its mirror pod) as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPod {
    /// The node it runs on.
    pub node: String,
    /// Its `component` label: `kube-apiserver`, ..., `etcd`.
    pub component: String,
    /// Its Ready condition is True.
    pub ready: bool,
    /// The version its image tag names, when the tag is `vX.Y.Z`.
    pub version: Option<Version>,
}

/// `MAJOR.MINOR` of a version, for repository paths and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minor {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
}

impl fmt::Display for Minor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}", self.major, self.minor)
    }
}

/// The minor `v` belongs to.
pub fn minor_of(v: Version) -> Minor {
    Minor {
        major: v.major,
        minor: v.minor,
    }
}

/// The minor after `v`'s.
pub fn next_minor(v: Version) -> Minor {
    Minor {
        major: v.major,
        minor: v.minor + 1,
    }
}

/// The leader a strict majority of `members` follows, given the leader each answering
/// member follows (0: none).
pub fn agreed_leader(followed: impl IntoIterator<Item = u64>, members: usize) -> Option<u64> {
    let mut votes: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for leader in followed.into_iter().filter(|l| *l != 0) {
        *votes.entry(leader).or_default() += 1;
    }
    votes
        .into_iter()
        .find(|(_, n)| *n > members / 2)
        .map(|(id, _)| id)
}
