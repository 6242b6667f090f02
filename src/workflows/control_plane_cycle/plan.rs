//! Control planes of an HA cluster: how etcd sits beside them, which one to upgrade next,
//! and whether they are healthy enough to touch the next one.
//!
//! With stacked etcd (kubeadm's default: one member per control-plane node, named after
//! the node) every control-plane upgrade restarts that node's etcd member, so the order
//! comes from the etcd roll planner: followers' nodes first, leadership moved once to the
//! most caught-up member already upgraded, the old leader's node last. One leadership
//! change for the whole control plane, and no election. The decision is made again from
//! the cluster as it is before every action, so a restarted rollgate skips what is done
//! and sees where the leader is now.

use std::fmt;

use crate::domain::etcd_order::{self, Action, ClusterView, Member, Order, Refusal};
pub use crate::domain::facts::{EtcdAlarm, EtcdFacts, EtcdMemberFacts, StaticPod};
use crate::domain::facts::{NodeFacts, Role};
use crate::domain::version::Version;

/// Where the cluster's etcd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdLayout {
    /// One member per control-plane node, named after it: upgrading a control plane
    /// restarts its member.
    Stacked,
    /// Members elsewhere: control-plane upgrades do not touch them.
    External,
    /// rollgate was given no etcd endpoints (allowed with one control plane only).
    Unseen,
}

impl fmt::Display for EtcdLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Stacked => "stacked",
            Self::External => "external",
            Self::Unseen => "not configured",
        })
    }
}

/// etcd's members do not line up with the control-plane nodes in a way rollgate knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Several control planes and no etcd endpoints configured.
    #[error(
        "{0} control-plane nodes and etcd.endpoints is not set: rollgate must see etcd to order the control planes (stacked) or to check it (external)"
    )]
    Unseen(usize),
    /// Some members are named after control-plane nodes, some not.
    #[error(
        "etcd members [{members}] do not match the control-plane nodes [{nodes}] one to one: neither stacked (one member per control plane, named after it) nor external (none named after one)"
    )]
    Mixed {
        /// Member names.
        members: String,
        /// Control-plane node names.
        nodes: String,
    },
}

/// The control-plane nodes of `nodes`, by name.
pub fn control_planes(nodes: &[NodeFacts]) -> Vec<&NodeFacts> {
    let mut cps: Vec<&NodeFacts> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    cps.sort_by(|a, b| a.name.cmp(&b.name));
    cps
}

/// How etcd sits beside `cps`: stacked when every member is named after a control-plane
/// node and every control-plane node has one, external when none is.
pub fn layout(cps: &[&NodeFacts], etcd: Option<&EtcdFacts>) -> Result<EtcdLayout, LayoutError> {
    let Some(etcd) = etcd else {
        return if cps.len() > 1 {
            Err(LayoutError::Unseen(cps.len()))
        } else {
            Ok(EtcdLayout::Unseen)
        };
    };
    let is_cp = |name: &str| cps.iter().any(|n| n.name == name);
    let named = etcd.members.iter().filter(|m| is_cp(&m.name)).count();
    let every_cp_has_one = cps
        .iter()
        .all(|n| etcd.members.iter().any(|m| m.name == n.name));
    if named == 0 {
        Ok(EtcdLayout::External)
    } else if named == etcd.members.len() && every_cp_has_one {
        Ok(EtcdLayout::Stacked)
    } else {
        let names = |it: &mut dyn Iterator<Item = &str>| it.collect::<Vec<_>>().join(", ");
        Err(LayoutError::Mixed {
            members: names(&mut etcd.members.iter().map(|m| m.name.as_str())),
            nodes: names(&mut cps.iter().map(|n| n.name.as_str())),
        })
    }
}

/// Which kubeadm command upgrades a control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kubeadm {
    /// `kubeadm upgrade apply vX.Y.Z`: the first control plane, which moves the cluster's
    /// configuration to the target.
    Apply,
    /// `kubeadm upgrade node`: every other control plane, which follows that configuration.
    Node,
}

/// What to do next with the control planes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlPlaneAction {
    /// Upgrade this control-plane node.
    Upgrade {
        /// The node.
        node: String,
        /// The kubeadm command it runs.
        kubeadm: Kubeadm,
    },
    /// Move etcd leadership from the node about to be upgraded to `to`.
    MoveLeader {
        /// The member (node) that leads now.
        from: String,
        /// The member (node) that takes leadership.
        to: String,
    },
    /// Every control plane runs the target.
    Done,
}

impl fmt::Display for ControlPlaneAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Upgrade {
                node,
                kubeadm: Kubeadm::Apply,
            } => write!(f, "upgrade {node} (kubeadm upgrade apply)"),
            Self::Upgrade {
                node,
                kubeadm: Kubeadm::Node,
            } => write!(f, "upgrade {node} (kubeadm upgrade node)"),
            Self::MoveLeader { from, to } => write!(f, "move etcd leadership {from} -> {to}"),
            Self::Done => f.write_str("every control plane runs the target"),
        }
    }
}

/// The etcd roll planner's view of stacked members: a member is at the target when its
/// node needs nothing more (`pending` says which nodes still do).
fn stacked_view(
    cps: &[&NodeFacts],
    etcd: &EtcdFacts,
    pending: &dyn Fn(&NodeFacts) -> bool,
) -> ClusterView {
    ClusterView {
        members: etcd
            .members
            .iter()
            .map(|m| Member {
                id: m.id,
                name: m.name.clone(),
                ordinal: None,
                at_target: cps.iter().any(|n| n.name == m.name && !pending(n)),
                healthy: m.answering,
                raft_index: m.raft_index,
            })
            .collect(),
        leader: etcd.leader,
    }
}

/// The next disruptive action among control planes that each need one (an upgrade, a
/// reboot), whatever that action is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextControlPlane {
    /// Touch this control-plane node.
    Touch(String),
    /// Move etcd leadership from the node about to be touched to `to`.
    MoveLeader {
        /// The member (node) that leads now.
        from: String,
        /// The member (node) that takes leadership, among those that need nothing more.
        to: String,
    },
    /// No control plane is pending.
    Done,
}

impl fmt::Display for NextControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Touch(node) => write!(f, "{node} next"),
            Self::MoveLeader { from, to } => write!(f, "move etcd leadership {from} -> {to}"),
            Self::Done => f.write_str("no control plane is pending"),
        }
    }
}

/// The next control plane to touch, one at a time, for the cluster as it is now:
/// `pending` says which nodes still need the action. With stacked etcd the followers'
/// nodes go first, leadership moves once to the most caught-up member whose node needs
/// nothing more, and the old leader's node goes last. `max_lag` bounds how far a member
/// may trail the leader's raft index before anything is touched or moved.
pub fn next_in_order(
    cps: &[&NodeFacts],
    layout: EtcdLayout,
    etcd: Option<&EtcdFacts>,
    pending: &dyn Fn(&NodeFacts) -> bool,
    max_lag: u64,
) -> Result<NextControlPlane, Refusal> {
    let Some(first_pending) = cps.iter().find(|n| pending(n)) else {
        return Ok(NextControlPlane::Done);
    };
    let etcd = match (layout, etcd) {
        (EtcdLayout::Stacked, Some(etcd)) if etcd.members.len() > 1 => etcd,
        // A single stacked member cannot keep quorum through its own restart: that is
        // what running one control plane means.
        _ => return Ok(NextControlPlane::Touch(first_pending.name.clone())),
    };
    let view = stacked_view(cps, etcd, pending);
    match etcd_order::next_action(&view, Order::Free, max_lag)? {
        Action::Restart { name, .. } => Ok(NextControlPlane::Touch(name)),
        Action::MoveLeader { name, .. } => Ok(NextControlPlane::MoveLeader {
            from: etcd.leader_name().unwrap_or_default(),
            to: name,
        }),
        // The members are all at the target only if their nodes are: not reached.
        Action::Done => Ok(NextControlPlane::Done),
    }
}

/// The upgrade's action for `next`: a control plane to touch is upgraded with `apply`
/// while none of `cps` runs the target yet (apply moves the cluster's configuration; the
/// rest follow it), with `node` after.
pub fn upgrade_action(
    cps: &[&NodeFacts],
    next: NextControlPlane,
    target: Version,
) -> ControlPlaneAction {
    match next {
        NextControlPlane::Touch(node) => {
            let kubeadm = if cps.iter().all(|n| n.kubelet != target) {
                Kubeadm::Apply
            } else {
                Kubeadm::Node
            };
            ControlPlaneAction::Upgrade { node, kubeadm }
        }
        NextControlPlane::MoveLeader { from, to } => ControlPlaneAction::MoveLeader { from, to },
        NextControlPlane::Done => ControlPlaneAction::Done,
    }
}

/// The next control-plane action of an upgrade to `target` for the cluster as it is now.
pub fn next_action(
    cps: &[&NodeFacts],
    layout: EtcdLayout,
    etcd: Option<&EtcdFacts>,
    target: Version,
    max_lag: u64,
) -> Result<ControlPlaneAction, Refusal> {
    let behind = |n: &NodeFacts| n.kubelet != target;
    let next = next_in_order(cps, layout, etcd, &behind, max_lag)?;
    Ok(upgrade_action(cps, next, target))
}

/// The whole order `next_action` will take if nothing else changes, for `rollgate plan`.
pub fn predict(
    cps: &[&NodeFacts],
    layout: EtcdLayout,
    etcd: Option<&EtcdFacts>,
    target: Version,
    max_lag: u64,
) -> Result<Vec<ControlPlaneAction>, Refusal> {
    let mut nodes: Vec<NodeFacts> = cps.iter().map(|n| (*n).clone()).collect();
    let mut etcd = etcd.cloned();
    let mut out = Vec::new();
    for _ in 0..3 * cps.len() + 1 {
        let refs: Vec<&NodeFacts> = nodes.iter().collect();
        let action = next_action(&refs, layout, etcd.as_ref(), target, max_lag)?;
        match &action {
            ControlPlaneAction::Done => return Ok(out),
            ControlPlaneAction::Upgrade { node, .. } => {
                if let Some(n) = nodes.iter_mut().find(|n| n.name == *node) {
                    n.kubelet = target;
                }
            }
            ControlPlaneAction::MoveLeader { to, .. } => {
                if let Some(e) = etcd.as_mut() {
                    e.leader = e.members.iter().find(|m| m.name == *to).map(|m| m.id);
                }
            }
        }
        out.push(action);
    }
    Ok(out)
}

/// Why each control plane comes where it does in `order`, one line each.
pub fn explain(
    order: &[ControlPlaneAction],
    layout: EtcdLayout,
    etcd: Option<&EtcdFacts>,
) -> Vec<String> {
    let leader = etcd.and_then(EtcdFacts::leader_name);
    order
        .iter()
        .map(|action| match (action, layout) {
            (ControlPlaneAction::Upgrade { node, .. }, EtcdLayout::Stacked)
                if leader.as_deref() == Some(node.as_str()) =>
            {
                format!("{action}: hosts the etcd leader, so it goes last, after the move")
            }
            (ControlPlaneAction::Upgrade { .. }, EtcdLayout::Stacked) => {
                format!(
                    "{action}: an etcd follower's node, its member restarts without an election"
                )
            }
            (ControlPlaneAction::Upgrade { .. }, EtcdLayout::External) => {
                format!("{action}: by name; etcd is external, so no member restarts with it")
            }
            (ControlPlaneAction::Upgrade { .. }, EtcdLayout::Unseen) => {
                format!("{action}: the only control plane")
            }
            (ControlPlaneAction::MoveLeader { .. }, _) => format!(
                "{action}: the one leadership change, to the most caught-up member already upgraded"
            ),
            (ControlPlaneAction::Done, _) => action.to_string(),
        })
        .collect()
}

/// The static pods kubeadm runs on every control-plane node, besides etcd.
pub const COMPONENTS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// One thing that makes the control planes unsafe to touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unhealthy {
    /// A control-plane node is not Ready.
    NodeNotReady(String),
    /// A static pod is missing on a control-plane node.
    PodMissing { node: String, component: String },
    /// A static pod is not Ready.
    PodNotReady { node: String, component: String },
    /// A static pod of an upgraded node does not run the target.
    PodBehind {
        node: String,
        component: String,
        /// What its image names.
        runs: String,
    },
    /// A member in the list does not answer.
    MemberDown(String),
    /// A stacked control-plane node has no member in the list.
    MemberMissing(String),
    /// An alarm is raised.
    Alarm { member: String, alarm: String },
    /// No leader agreed by a majority.
    NoLeader,
    /// A member trails the leader by more than the bound.
    Lagging { member: String, behind: u64 },
    /// Losing one more member would lose quorum.
    QuorumAtRisk { answering: usize, members: usize },
}

impl Unhealthy {
    /// Whether waiting may clear it. An alarm stays until an operator disarms it (and a
    /// NOSPACE alarm makes etcd refuse writes until then).
    pub fn may_pass(&self) -> bool {
        !matches!(self, Self::Alarm { .. })
    }
}

impl fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeNotReady(n) => write!(f, "control-plane node {n} is not Ready"),
            Self::PodMissing { node, component } => {
                write!(f, "{component} has no static pod on {node}")
            }
            Self::PodNotReady { node, component } => {
                write!(f, "{component}-{node} is not Ready")
            }
            Self::PodBehind {
                node,
                component,
                runs,
            } => write!(f, "{component}-{node} runs {runs}, not the target"),
            Self::MemberDown(m) => write!(f, "etcd member {m} does not answer"),
            Self::MemberMissing(n) => write!(f, "control-plane node {n} has no etcd member"),
            Self::Alarm { member, alarm } => {
                write!(f, "etcd alarm {alarm} raised on member {member}")
            }
            Self::NoLeader => f.write_str("etcd has no leader agreed by a majority"),
            Self::Lagging { member, behind } => {
                write!(
                    f,
                    "etcd member {member} trails the leader by {behind} raft entries"
                )
            }
            Self::QuorumAtRisk { answering, members } => write!(
                f,
                "{answering} of {members} etcd members answer: quorum would not survive one more down"
            ),
        }
    }
}

/// What Cluster API's KubeadmControlPlane checks before it touches the next machine: every
/// control-plane node Ready; its static pods there and Ready, and at `target` once its
/// kubelet is (when there is a `target`: a reboot has none); every etcd member answering,
/// listed, without alarms and within `max_lag` of the leader; quorum kept with one member
/// down. Empty: healthy. `pods` is `None` where the control plane runs no static pods.
pub fn problems(
    cps: &[&NodeFacts],
    pods: Option<&[StaticPod]>,
    layout: EtcdLayout,
    etcd: Option<&EtcdFacts>,
    target: Option<Version>,
    max_lag: u64,
) -> Vec<Unhealthy> {
    let mut out = Vec::new();
    let stacked = layout == EtcdLayout::Stacked;
    for node in cps {
        if !node.ready {
            out.push(Unhealthy::NodeNotReady(node.name.clone()));
        }
        // Without static pods (k3s runs its control plane in its own process), the node's
        // Ready, its kubelet version and its etcd member say it all.
        let upgraded = target.filter(|t| node.kubelet == *t);
        let components = COMPONENTS.iter().chain(stacked.then_some(&"etcd"));
        for component in components.filter(|_| pods.is_some()) {
            let pods = pods.unwrap_or_default();
            let pod = pods
                .iter()
                .find(|p| p.node == node.name && p.component == *component);
            let (node, component) = (node.name.clone(), component.to_string());
            match pod {
                None => out.push(Unhealthy::PodMissing { node, component }),
                Some(p) if !p.ready => out.push(Unhealthy::PodNotReady { node, component }),
                // etcd's image follows etcd's own versions.
                Some(p) if upgraded.is_some() && component != "etcd" && p.version != upgraded => {
                    let runs = p
                        .version
                        .map_or("an untagged image".into(), |v| v.to_string());
                    out.push(Unhealthy::PodBehind {
                        node,
                        component,
                        runs,
                    })
                }
                Some(_) => {}
            }
        }
        if stacked && !etcd.is_some_and(|e| e.members.iter().any(|m| m.name == node.name)) {
            out.push(Unhealthy::MemberMissing(node.name.clone()));
        }
    }
    if let Some(etcd) = etcd {
        out.extend(etcd_problems(etcd, max_lag));
    }
    out
}

/// The etcd half of [`problems`]: also what pre-flight checks before anything changes.
pub fn etcd_problems(etcd: &EtcdFacts, max_lag: u64) -> Vec<Unhealthy> {
    let mut out: Vec<Unhealthy> = etcd
        .alarms
        .iter()
        .map(|a| Unhealthy::Alarm {
            member: etcd.name_of(a.member),
            alarm: a.alarm.clone(),
        })
        .collect();
    let down: Vec<&EtcdMemberFacts> = etcd.members.iter().filter(|m| !m.answering).collect();
    out.extend(down.iter().map(|m| Unhealthy::MemberDown(m.name.clone())));
    let members = etcd.members.len();
    let answering = members - down.len();
    if members > 1 && answering.saturating_sub(1) < members / 2 + 1 {
        out.push(Unhealthy::QuorumAtRisk { answering, members });
    }
    match etcd
        .leader
        .and_then(|id| etcd.members.iter().find(|m| m.id == id))
    {
        None => out.push(Unhealthy::NoLeader),
        Some(leader) => out.extend(
            etcd.members
                .iter()
                .filter(|m| m.answering && m.raft_index.saturating_add(max_lag) < leader.raft_index)
                .map(|m| Unhealthy::Lagging {
                    member: m.name.clone(),
                    behind: leader.raft_index - m.raft_index,
                }),
        ),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    const FROM: &str = "1.34.2";
    const TO: &str = "1.34.5";

    fn cp(name: &str, kubelet: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            role: Role::ControlPlane,
            kubelet: v(kubelet),
            distribution: Default::default(),
            package_manager: None,
            containerd: None,
            ready: true,
            address: None,
        }
    }

    fn nodes(n: usize) -> Vec<NodeFacts> {
        (1..=n).map(|i| cp(&format!("cp-{i}"), FROM)).collect()
    }

    /// Members named after `nodes` (stacked) or `ext-N` (external), `leader` leading.
    fn etcd(nodes: &[NodeFacts], stacked: bool, leader: usize) -> EtcdFacts {
        EtcdFacts {
            members: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| EtcdMemberFacts {
                    id: 100 + i as u64,
                    name: if stacked {
                        n.name.clone()
                    } else {
                        format!("ext-{i}")
                    },
                    answering: true,
                    raft_index: 500,
                    raft_term: 7,
                })
                .collect(),
            leader: Some(100 + leader as u64),
            alarms: Vec::new(),
        }
    }

    fn short(action: &ControlPlaneAction) -> String {
        match action {
            ControlPlaneAction::Upgrade {
                node,
                kubeadm: Kubeadm::Apply,
            } => format!("apply {node}"),
            ControlPlaneAction::Upgrade { node, .. } => format!("node {node}"),
            ControlPlaneAction::MoveLeader { from, to } => format!("move {from}->{to}"),
            ControlPlaneAction::Done => "done".into(),
        }
    }

    #[test]
    fn the_order_for_every_size_layout_and_leader() {
        // (control planes, stacked, leader index, expected order)
        let cases: &[(usize, bool, usize, &[&str])] = &[
            (1, true, 0, &["apply cp-1"]),
            (1, false, 0, &["apply cp-1"]),
            (
                3,
                true,
                0,
                &["apply cp-2", "node cp-3", "move cp-1->cp-2", "node cp-1"],
            ),
            (
                3,
                true,
                1,
                &["apply cp-1", "node cp-3", "move cp-2->cp-1", "node cp-2"],
            ),
            (
                3,
                true,
                2,
                &["apply cp-1", "node cp-2", "move cp-3->cp-1", "node cp-3"],
            ),
            (3, false, 0, &["apply cp-1", "node cp-2", "node cp-3"]),
            (3, false, 2, &["apply cp-1", "node cp-2", "node cp-3"]),
            (
                5,
                true,
                0,
                &[
                    "apply cp-2",
                    "node cp-3",
                    "node cp-4",
                    "node cp-5",
                    "move cp-1->cp-2",
                    "node cp-1",
                ],
            ),
            (
                5,
                true,
                2,
                &[
                    "apply cp-1",
                    "node cp-2",
                    "node cp-4",
                    "node cp-5",
                    "move cp-3->cp-1",
                    "node cp-3",
                ],
            ),
            (
                5,
                true,
                4,
                &[
                    "apply cp-1",
                    "node cp-2",
                    "node cp-3",
                    "node cp-4",
                    "move cp-5->cp-1",
                    "node cp-5",
                ],
            ),
            (
                5,
                false,
                3,
                &[
                    "apply cp-1",
                    "node cp-2",
                    "node cp-3",
                    "node cp-4",
                    "node cp-5",
                ],
            ),
        ];
        for (n, stacked, leader, want) in cases {
            let all = nodes(*n);
            let cps = control_planes(&all);
            let etcd = etcd(&all, *stacked, *leader);
            let layout = layout(&cps, Some(&etcd)).unwrap();
            assert_eq!(
                layout,
                if *stacked && *n > 0 {
                    EtcdLayout::Stacked
                } else {
                    EtcdLayout::External
                }
            );
            let order = predict(&cps, layout, Some(&etcd), v(TO), 10).unwrap();
            let got: Vec<String> = order.iter().map(short).collect();
            assert_eq!(
                got, *want,
                "{n} control planes, stacked {stacked}, leader {leader}"
            );
            let moves = order
                .iter()
                .filter(|a| matches!(a, ControlPlaneAction::MoveLeader { .. }))
                .count();
            assert_eq!(moves, usize::from(*stacked && *n > 1));
            let applies = got.iter().filter(|a| a.starts_with("apply")).count();
            assert_eq!(applies, 1, "{got:?}");
            // The apply never runs on the leader's node.
            if *stacked && *n > 1 {
                assert_ne!(got[0], format!("apply cp-{}", leader + 1));
            }
        }
    }

    #[test]
    fn every_leader_of_three_and_five_costs_one_move_and_the_leader_goes_last() {
        for n in [3, 5] {
            for leader in 0..n {
                let all = nodes(n);
                let cps = control_planes(&all);
                let etcd = etcd(&all, true, leader);
                let order = predict(&cps, EtcdLayout::Stacked, Some(&etcd), v(TO), 10).unwrap();
                assert_eq!(order.len(), n + 1);
                assert_eq!(
                    short(&order[n]),
                    format!("node cp-{}", leader + 1),
                    "{order:?}"
                );
                assert!(matches!(
                    order[n - 1],
                    ControlPlaneAction::MoveLeader { .. }
                ));
            }
        }
    }

    #[test]
    fn a_restarted_rollgate_skips_what_is_done_and_follows_the_leader() {
        let mut all = nodes(3);
        all[1].kubelet = v(TO);
        let cps = control_planes(&all);
        // cp-2 was upgraded (apply); the leader moved to cp-3 by itself meanwhile.
        let etcd = etcd(&all, true, 2);
        let order = predict(&cps, EtcdLayout::Stacked, Some(&etcd), v(TO), 10).unwrap();
        let got: Vec<String> = order.iter().map(short).collect();
        assert_eq!(got, ["node cp-1", "move cp-3->cp-1", "node cp-3"]);
        all.iter_mut().for_each(|n| n.kubelet = v(TO));
        let cps = control_planes(&all);
        assert_eq!(
            next_action(&cps, EtcdLayout::Stacked, Some(&etcd), v(TO), 10),
            Ok(ControlPlaneAction::Done)
        );
    }

    #[test]
    fn nothing_is_touched_while_a_member_is_down_or_quorum_is_thin() {
        let all = nodes(3);
        let cps = control_planes(&all);
        let mut down = etcd(&all, true, 0);
        down.members[2].answering = false;
        assert_eq!(
            next_action(&cps, EtcdLayout::Stacked, Some(&down), v(TO), 10),
            Err(Refusal::Unhealthy(vec!["cp-3".into()]))
        );
        let two = nodes(2);
        let cps = control_planes(&two);
        let etcd2 = etcd(&two, true, 0);
        assert_eq!(
            next_action(&cps, EtcdLayout::Stacked, Some(&etcd2), v(TO), 10),
            Err(Refusal::QuorumAtRisk { members: 2 })
        );
    }

    #[test]
    fn the_layout_is_read_from_the_member_names() {
        let all = nodes(3);
        let cps = control_planes(&all);
        let mut mixed = etcd(&all, true, 0);
        mixed.members[0].name = "elsewhere".into();
        assert!(matches!(
            layout(&cps, Some(&mixed)),
            Err(LayoutError::Mixed { .. })
        ));
        let mut fewer = etcd(&all, true, 0);
        fewer.members.pop();
        assert!(matches!(
            layout(&cps, Some(&fewer)),
            Err(LayoutError::Mixed { .. })
        ));
        assert_eq!(layout(&cps, None), Err(LayoutError::Unseen(3)));
        let one = nodes(1);
        assert_eq!(layout(&control_planes(&one), None), Ok(EtcdLayout::Unseen));
    }

    fn pods(nodes: &[NodeFacts], version: &str) -> Vec<StaticPod> {
        nodes
            .iter()
            .flat_map(|n| {
                COMPONENTS.iter().chain(&["etcd"]).map(|c| StaticPod {
                    node: n.name.clone(),
                    component: c.to_string(),
                    ready: true,
                    version: (*c != "etcd").then(|| v(version)),
                })
            })
            .collect()
    }

    #[test]
    fn health_names_what_is_wrong() {
        type Break = fn(&mut Vec<NodeFacts>, &mut Vec<StaticPod>, &mut EtcdFacts);
        let cases: &[(&str, Break, &[&str])] = &[
            ("healthy", |_, _, _| {}, &[]),
            (
                "node not ready",
                |n, _, _| n[1].ready = false,
                &["control-plane node cp-2 is not Ready"],
            ),
            (
                "pod missing",
                |_, p, _| p.retain(|p| !(p.node == "cp-3" && p.component == "kube-scheduler")),
                &["kube-scheduler has no static pod on cp-3"],
            ),
            (
                "etcd pod not ready",
                |_, p, _| p[3].ready = false,
                &["etcd-cp-1 is not Ready"],
            ),
            (
                "upgraded node with an old apiserver",
                |n, _, _| n[0].kubelet = v(TO),
                &[
                    "kube-apiserver-cp-1 runs 1.34.2, not the target",
                    "kube-controller-manager-cp-1 runs 1.34.2, not the target",
                    "kube-scheduler-cp-1 runs 1.34.2, not the target",
                ],
            ),
            (
                "member down",
                |_, _, e| e.members[1].answering = false,
                &[
                    "etcd member cp-2 does not answer",
                    "2 of 3 etcd members answer: quorum would not survive one more down",
                ],
            ),
            (
                "alarm",
                |_, _, e| {
                    e.alarms.push(EtcdAlarm {
                        member: 101,
                        alarm: "NOSPACE".into(),
                    })
                },
                &["etcd alarm NOSPACE raised on member cp-2"],
            ),
            (
                "lagging",
                |_, _, e| e.members[2].raft_index = 100,
                &["etcd member cp-3 trails the leader by 400 raft entries"],
            ),
            (
                "no leader",
                |_, _, e| e.leader = None,
                &["etcd has no leader agreed by a majority"],
            ),
            (
                "member missing",
                |_, _, e| e.members[2].name = "cp-9".into(),
                &["control-plane node cp-3 has no etcd member"],
            ),
        ];
        for (what, break_it, want) in cases {
            let mut all = nodes(3);
            let mut static_pods = pods(&all, FROM);
            let mut e = etcd(&all, true, 0);
            break_it(&mut all, &mut static_pods, &mut e);
            let cps = control_planes(&all);
            let got: Vec<String> = problems(
                &cps,
                Some(&static_pods),
                EtcdLayout::Stacked,
                Some(&e),
                Some(v(TO)),
                50,
            )
            .iter()
            .map(ToString::to_string)
            .collect();
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn only_an_alarm_is_not_waited_out() {
        assert!(
            !Unhealthy::Alarm {
                member: "cp-1".into(),
                alarm: "NOSPACE".into()
            }
            .may_pass()
        );
        assert!(Unhealthy::MemberDown("cp-1".into()).may_pass());
        assert!(Unhealthy::NoLeader.may_pass());
    }

    #[test]
    fn external_etcd_needs_no_etcd_pod_and_one_member_keeps_no_quorum_rule() {
        let all = nodes(1);
        let cps = control_planes(&all);
        let mut static_pods = pods(&all, FROM);
        static_pods.retain(|p| p.component != "etcd");
        let e = EtcdFacts {
            members: vec![EtcdMemberFacts {
                id: 1,
                name: "m0".into(),
                answering: true,
                raft_index: 9,
                raft_term: 2,
            }],
            leader: Some(1),
            alarms: Vec::new(),
        };
        assert_eq!(layout(&cps, Some(&e)), Ok(EtcdLayout::External));
        assert!(
            problems(
                &cps,
                Some(&static_pods),
                EtcdLayout::External,
                Some(&e),
                Some(v(TO)),
                10
            )
            .is_empty()
        );
    }

    /// Reboots: a node is pending until it is in `done`; versions play no part.
    #[test]
    fn reboots_take_the_followers_first_one_move_and_the_old_leader_last() {
        for leader in 0..3 {
            for needing in [
                vec!["cp-1", "cp-2", "cp-3"],
                vec!["cp-1", "cp-3"],
                vec!["cp-2"],
            ] {
                let all = nodes(3);
                let cps = control_planes(&all);
                let mut e = etcd(&all, true, leader);
                let old_leader = format!("cp-{}", leader + 1);
                let mut done: Vec<String> = Vec::new();
                let mut touched = Vec::new();
                let mut moves = 0;
                for _ in 0..10 {
                    let pending = |n: &NodeFacts| {
                        needing.contains(&n.name.as_str()) && !done.contains(&n.name)
                    };
                    match next_in_order(&cps, EtcdLayout::Stacked, Some(&e), &pending, 10) {
                        Ok(NextControlPlane::Done) => break,
                        Ok(NextControlPlane::Touch(node)) => {
                            touched.push(node.clone());
                            done.push(node);
                        }
                        Ok(NextControlPlane::MoveLeader { from, to }) => {
                            assert_eq!(from, old_leader);
                            assert!(
                                !needing.contains(&to.as_str()) || done.contains(&to),
                                "{to}"
                            );
                            e.leader = e.members.iter().find(|m| m.name == to).map(|m| m.id);
                            moves += 1;
                        }
                        Err(refusal) => panic!("{refusal}"),
                    }
                }
                let mut want: Vec<&str> = needing.clone();
                let mut got: Vec<&str> = touched.iter().map(String::as_str).collect();
                let case = format!("leader {old_leader}, needing {needing:?}: {got:?}");
                if needing.contains(&old_leader.as_str()) {
                    assert_eq!(got.last().copied(), Some(old_leader.as_str()), "{case}");
                    assert_eq!(moves, 1, "{case}");
                } else {
                    assert_eq!(moves, 0, "{case}");
                }
                want.sort_unstable();
                got.sort_unstable();
                assert_eq!(got, want, "{case}");
            }
        }
    }
}
