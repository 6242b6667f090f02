//! Which etcd member restarts next, and when leadership moves: the rules every restart
//! of an etcd member follows, whether an etcd roll or a control-plane cycle asks. From
//! what the cluster looks like now, the next safe action.
//!
//! Deciding from the current state (rather than following a precomputed list) makes a
//! crashed roll resume by itself: members already at the target are skipped, and the
//! preconditions are checked again before every restart.
//!
//! One leadership change per roll is the minimum: restart followers first, move
//! leadership once to a member that is already restarted and caught up, restart the old
//! leader last. A StatefulSet forces restarts from the highest ordinal down; there the
//! minimum is one move, or two when the leader starts at the highest ordinal.

use std::fmt;

/// One etcd member as the roll sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Member id (raft).
    pub id: u64,
    /// Name, e.g. `etcd-2`.
    pub name: String,
    /// StatefulSet ordinal, for the `statefulset` driver.
    pub ordinal: Option<u32>,
    /// Already running the target revision.
    pub at_target: bool,
    /// Answers health and status.
    pub healthy: bool,
    /// Its raft applied index.
    pub raft_index: u64,
}

/// The cluster now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Every member.
    pub members: Vec<Member>,
    /// The leader's member id, if there is one.
    pub leader: Option<u64>,
}

/// How members can be restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Any order (members restarted by a command).
    Free,
    /// Highest ordinal first (a StatefulSet's partition).
    StatefulSet,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Restart this member (never the leader).
    Restart { id: u64, name: String },
    /// Move leadership to this member.
    MoveLeader { to: u64, name: String },
    /// Every member is at the target.
    Done,
}

/// Why nothing may be done now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No leader: an election is under way or quorum is lost.
    NoLeader,
    /// These members do not answer.
    Unhealthy(Vec<String>),
    /// Too few members to keep quorum while one restarts.
    QuorumAtRisk {
        /// Members in the cluster.
        members: usize,
    },
    /// These members lag the leader by more than the bound.
    Lagging(Vec<String>),
    /// The leader must move before its restart, and no member can take it.
    NoTransferTarget,
    /// A StatefulSet member has no ordinal.
    MissingOrdinal(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoLeader => f.write_str("the cluster has no leader"),
            Self::Unhealthy(names) => write!(f, "unhealthy member(s): {}", names.join(", ")),
            Self::QuorumAtRisk { members } => {
                write!(
                    f,
                    "{members} member(s) cannot keep quorum with one restarting (3 or more needed)"
                )
            }
            Self::Lagging(names) => write!(
                f,
                "member(s) not caught up with the leader: {}",
                names.join(", ")
            ),
            Self::NoTransferTarget => f.write_str("no caught-up member can take leadership"),
            Self::MissingOrdinal(name) => write!(f, "member {name} has no StatefulSet ordinal"),
        }
    }
}

impl Refusal {
    /// Whether this may pass by itself (a member coming back, an election settling), so
    /// that waiting is worth it; the others need an operator.
    pub fn may_pass(&self) -> bool {
        matches!(self, Self::Unhealthy(_) | Self::NoLeader | Self::Lagging(_))
    }
}

/// The next action for `view` under `order`; `max_lag` bounds how far behind the leader's
/// raft index another member may be before a restart or transfer.
pub fn next_action(view: &ClusterView, order: Order, max_lag: u64) -> Result<Action, Refusal> {
    let pending: Vec<&Member> = view.members.iter().filter(|m| !m.at_target).collect();
    if pending.is_empty() {
        return Ok(Action::Done);
    }
    let unhealthy: Vec<String> = view
        .members
        .iter()
        .filter(|m| !m.healthy)
        .map(|m| m.name.clone())
        .collect();
    if !unhealthy.is_empty() {
        return Err(Refusal::Unhealthy(unhealthy));
    }
    if view.members.len() < 3 {
        return Err(Refusal::QuorumAtRisk {
            members: view.members.len(),
        });
    }
    let leader = view
        .leader
        .and_then(|id| view.members.iter().find(|m| m.id == id))
        .ok_or(Refusal::NoLeader)?;
    let caught_up = |m: &Member| m.raft_index.saturating_add(max_lag) >= leader.raft_index;

    let next = match order {
        Order::Free => pending
            .iter()
            .filter(|m| m.id != leader.id)
            .min_by(|a, b| a.name.cmp(&b.name))
            .copied()
            .unwrap_or(leader),
        Order::StatefulSet => {
            if let Some(m) = view.members.iter().find(|m| m.ordinal.is_none()) {
                return Err(Refusal::MissingOrdinal(m.name.clone()));
            }
            pending
                .iter()
                .max_by_key(|m| m.ordinal)
                .copied()
                .unwrap_or(leader)
        }
    };

    if next.id != leader.id {
        let lagging: Vec<String> = view
            .members
            .iter()
            .filter(|m| m.id != next.id && !caught_up(m))
            .map(|m| m.name.clone())
            .collect();
        if !lagging.is_empty() {
            return Err(Refusal::Lagging(lagging));
        }
        return Ok(Action::Restart {
            id: next.id,
            name: next.name.clone(),
        });
    }

    // The leader is next: move leadership first, to the most caught-up restarted member.
    // Under a StatefulSet with nobody restarted yet (the leader is at the highest
    // ordinal), the lowest ordinal takes it: it restarts last, so one more move suffices.
    let candidates = view
        .members
        .iter()
        .filter(|m| m.id != leader.id && caught_up(m));
    let target = candidates
        .clone()
        .filter(|m| m.at_target)
        .max_by(|a, b| {
            a.raft_index
                .cmp(&b.raft_index)
                .then_with(|| b.name.cmp(&a.name))
        })
        .or_else(|| match order {
            Order::StatefulSet => candidates.min_by_key(|m| m.ordinal),
            Order::Free => None,
        })
        .ok_or(Refusal::NoTransferTarget)?;
    Ok(Action::MoveLeader {
        to: target.id,
        name: target.name.clone(),
    })
}

/// Why a roll's `endpoints` cannot be matched to the members, given each member's name and
/// advertised client URLs: every member needs its own endpoint in the list (the roll asks
/// each member at its own), and every endpoint must be a member's. `None`: they match.
pub fn endpoint_mismatch(
    endpoints: &[String],
    members: &[(String, Vec<String>)],
) -> Option<String> {
    let same = |a: &str, b: &str| a.trim_end_matches('/') == b.trim_end_matches('/');
    let unmatched_members: Vec<&str> = members
        .iter()
        .filter(|(_, urls)| !urls.iter().any(|u| endpoints.iter().any(|e| same(e, u))))
        .map(|(name, _)| name.as_str())
        .collect();
    let strangers: Vec<&str> = endpoints
        .iter()
        .filter(|e| {
            !members
                .iter()
                .any(|(_, urls)| urls.iter().any(|u| same(e, u)))
        })
        .map(String::as_str)
        .collect();
    if unmatched_members.is_empty() && strangers.is_empty() {
        return None;
    }
    let advertised: Vec<String> = members
        .iter()
        .map(|(name, urls)| format!("{name}: {}", urls.join(" ")))
        .collect();
    let mut why = Vec::new();
    if !unmatched_members.is_empty() {
        why.push(format!(
            "no endpoint for member(s) {}",
            unmatched_members.join(", ")
        ));
    }
    if !strangers.is_empty() {
        why.push(format!(
            "endpoint(s) {} advertised by no member",
            strangers.join(", ")
        ));
    }
    Some(format!(
        "endpoints [{}] do not match the members' advertised client URLs [{}]: {}; list each member's advertised client URL",
        endpoints.join(", "),
        advertised.join("; "),
        why.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_must_be_the_members_advertised_client_urls() {
        let members = |urls: &[&str]| -> Vec<(String, Vec<String>)> {
            urls.iter()
                .enumerate()
                .map(|(i, u)| (format!("etcd-{i}"), vec![u.to_string()]))
                .collect()
        };
        let list = |e: &[&str]| -> Vec<String> { e.iter().map(|s| s.to_string()).collect() };
        let advertised = [
            "http://10.0.0.1:2379",
            "http://10.0.0.2:2379",
            "http://10.0.0.3:2379",
        ];
        let cases: &[(&[&str], Option<&str>)] = &[
            (&advertised, None),
            (
                &[
                    "http://10.0.0.1:2379/",
                    "http://10.0.0.2:2379",
                    "http://10.0.0.3:2379",
                ],
                None,
            ),
            (
                &["http://10.0.0.1:2379", "http://10.0.0.2:2379"],
                Some("no endpoint for member(s) etcd-2"),
            ),
            (
                &[
                    "http://etcd-0.etcd:2379",
                    "http://10.0.0.2:2379",
                    "http://10.0.0.3:2379",
                ],
                Some(
                    "no endpoint for member(s) etcd-0; endpoint(s) http://etcd-0.etcd:2379 advertised by no member",
                ),
            ),
        ];
        for (endpoints, want) in cases {
            let got = endpoint_mismatch(&list(endpoints), &members(&advertised));
            match (want, &got) {
                (None, None) => {}
                (Some(needle), Some(why)) => {
                    assert!(why.contains(needle), "{why}");
                    assert!(why.contains("etcd-0: http://10.0.0.1:2379"), "{why}");
                }
                _ => panic!("{endpoints:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn only_passing_refusals_are_waited_out() {
        assert!(Refusal::NoLeader.may_pass());
        assert!(Refusal::Unhealthy(vec!["etcd-1".into()]).may_pass());
        assert!(Refusal::Lagging(vec!["etcd-1".into()]).may_pass());
        assert!(!Refusal::QuorumAtRisk { members: 2 }.may_pass());
        assert!(!Refusal::NoTransferTarget.may_pass());
    }

    fn cluster(n: u32, leader: u32) -> ClusterView {
        ClusterView {
            members: (0..n)
                .map(|i| Member {
                    id: 100 + u64::from(i),
                    name: format!("etcd-{i}"),
                    ordinal: Some(i),
                    at_target: false,
                    healthy: true,
                    raft_index: 1000,
                })
                .collect(),
            leader: Some(100 + u64::from(leader)),
        }
    }

    /// Plays the roll to the end: a restart puts the member at the target, a move changes
    /// the leader. Returns the actions taken.
    fn play(mut view: ClusterView, order: Order) -> Vec<Action> {
        let mut actions = Vec::new();
        for _ in 0..50 {
            let action = next_action(&view, order, 10).expect("allowed");
            match &action {
                Action::Done => return actions,
                Action::Restart { id, .. } => {
                    assert_ne!(Some(*id), view.leader, "restarted the leader");
                    view.members
                        .iter_mut()
                        .find(|m| m.id == *id)
                        .unwrap()
                        .at_target = true;
                }
                Action::MoveLeader { to, .. } => view.leader = Some(*to),
            }
            actions.push(action);
        }
        panic!("the roll did not end: {actions:?}");
    }

    fn moves(actions: &[Action]) -> usize {
        actions
            .iter()
            .filter(|a| matches!(a, Action::MoveLeader { .. }))
            .count()
    }

    #[test]
    fn free_order_moves_leadership_exactly_once_for_every_starting_leader() {
        for n in [3, 5] {
            for leader in 0..n {
                let actions = play(cluster(n, leader), Order::Free);
                assert_eq!(moves(&actions), 1, "n={n} leader={leader}: {actions:?}");
                assert_eq!(actions.len(), n as usize + 1);
                let old_leader = format!("etcd-{leader}");
                assert!(
                    matches!(actions.last(), Some(Action::Restart { name, .. }) if *name == old_leader),
                    "the old leader restarts last: {actions:?}"
                );
            }
        }
    }

    #[test]
    fn statefulset_order_is_high_to_low_with_one_move_or_two_from_the_top() {
        for n in [3, 5] {
            for leader in 0..n {
                let actions = play(cluster(n, leader), Order::StatefulSet);
                let restarts: Vec<&str> = actions
                    .iter()
                    .filter_map(|a| match a {
                        Action::Restart { name, .. } => Some(name.as_str()),
                        _ => None,
                    })
                    .collect();
                let expected: Vec<String> = (0..n).rev().map(|i| format!("etcd-{i}")).collect();
                assert_eq!(restarts, expected, "n={n} leader={leader}");
                let want = if leader == n - 1 { 2 } else { 1 };
                assert_eq!(moves(&actions), want, "n={n} leader={leader}: {actions:?}");
            }
        }
    }

    #[test]
    fn a_resumed_roll_skips_members_at_the_target_and_needs_no_extra_move() {
        let mut view = cluster(3, 2);
        view.members[0].at_target = true;
        view.members[1].at_target = true;
        view.leader = Some(100); // leadership already moved to a restarted member
        let actions = play(view, Order::Free);
        assert_eq!(
            actions,
            vec![Action::Restart {
                id: 102,
                name: "etcd-2".into()
            }]
        );
        let mut done = cluster(3, 0);
        done.members.iter_mut().for_each(|m| m.at_target = true);
        assert_eq!(next_action(&done, Order::Free, 10), Ok(Action::Done));
    }

    #[test]
    fn the_transfer_goes_to_the_most_caught_up_restarted_member() {
        let mut view = cluster(5, 4);
        for m in &mut view.members[..4] {
            m.at_target = true;
        }
        view.members[1].raft_index = 1005;
        view.members[4].raft_index = 1005;
        assert_eq!(
            next_action(&view, Order::Free, 10),
            Ok(Action::MoveLeader {
                to: 101,
                name: "etcd-1".into()
            })
        );
    }

    #[test]
    fn refusals_name_what_is_wrong_and_restart_nothing() {
        let mut unhealthy = cluster(3, 0);
        unhealthy.members[2].healthy = false;
        let mut no_leader = cluster(3, 0);
        no_leader.leader = None;
        let mut lagging = cluster(3, 0);
        lagging.members[2].raft_index = 900;
        let mut no_ordinal = cluster(3, 0);
        no_ordinal.members[1].ordinal = None;
        let cases = [
            (
                unhealthy,
                Order::Free,
                Refusal::Unhealthy(vec!["etcd-2".into()]),
            ),
            (no_leader, Order::Free, Refusal::NoLeader),
            (
                cluster(2, 0),
                Order::Free,
                Refusal::QuorumAtRisk { members: 2 },
            ),
            (
                lagging,
                Order::Free,
                Refusal::Lagging(vec!["etcd-2".into()]),
            ),
            (
                no_ordinal,
                Order::StatefulSet,
                Refusal::MissingOrdinal("etcd-1".into()),
            ),
        ];
        for (view, order, want) in cases {
            assert_eq!(next_action(&view, order, 10), Err(want.clone()), "{want}");
            assert!(!want.to_string().is_empty());
        }
    }

    #[test]
    fn a_lagging_member_may_itself_be_restarted_but_never_receives_leadership() {
        // etcd-1 lags; restarting etcd-1 is fine (it is the one going down).
        let mut view = cluster(3, 0);
        view.members[1].raft_index = 900;
        assert_eq!(
            next_action(&view, Order::Free, 10),
            Ok(Action::Restart {
                id: 101,
                name: "etcd-1".into()
            })
        );
        // Only etcd-0 (the leader) is left and the restarted etcd-1 lags: no transfer target
        // but etcd-2, which is caught up.
        view.members[1].at_target = true;
        view.members[2].at_target = true;
        assert_eq!(
            next_action(&view, Order::Free, 10),
            Ok(Action::MoveLeader {
                to: 102,
                name: "etcd-2".into()
            })
        );
    }
}
