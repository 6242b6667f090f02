//! The circuit breaker: while more of the cluster's nodes are NotReady than
//! `cluster.unhealthy_limit` allows, for any reason other than rollgate's own work, no run
//! takes a new node. A cluster already losing nodes is no place to take more out; the run
//! holds at its gate, naming the count, and halts past `gate.halt_after` like any hold.

use std::collections::BTreeSet;
use std::fmt;

use super::budget::UnhealthyLimit;
use super::run::{Run, StepStatus};

/// The breaker's answer when it trips.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tripped {
    /// The NotReady nodes that are not rollgate's, by name.
    pub not_ready: Vec<String>,
    /// How many nodes the cluster has.
    pub nodes: usize,
    /// The limit they exceed.
    pub limit: UnhealthyLimit,
}

impl fmt::Display for Tripped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMED: usize = 10;
        let mut named = self
            .not_ready
            .iter()
            .take(NAMED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if self.not_ready.len() > NAMED {
            named.push_str(&format!(" and {} more", self.not_ready.len() - NAMED));
        }
        write!(
            f,
            "{} of {} nodes NotReady, not by rollgate's work ({named}): more than \
             cluster.unhealthy_limit {}, so no new node is taken",
            self.not_ready.len(),
            self.nodes,
            self.limit
        )
    }
}

/// Whether the breaker trips over `nodes` (each node's name and whether it is Ready), the
/// nodes in `in_hand` not counted as NotReady: they are rollgate's own work.
pub fn judge(
    nodes: &[(&str, bool)],
    in_hand: &BTreeSet<&str>,
    limit: UnhealthyLimit,
) -> Option<Tripped> {
    let mut not_ready: Vec<String> = nodes
        .iter()
        .filter(|(name, ready)| !ready && !in_hand.contains(name))
        .map(|(name, _)| (*name).to_owned())
        .collect();
    not_ready.sort();
    limit
        .exceeded(not_ready.len(), nodes.len())
        .then_some(Tripped {
            not_ready,
            nodes: nodes.len(),
            limit,
        })
}

/// Whether the gate at step `index` of `run` comes before a node is taken: it names the
/// node (or the batch's first) and a drain of the run waits after it. Only such gates ask
/// the breaker: not pre-flight's (its `nodes-ready` wants every node Ready), nor an etcd
/// roll's.
pub fn guards_nodes(run: &Run, index: usize) -> bool {
    run.steps
        .get(index)
        .is_some_and(|s| s.kind.node().is_some())
        && run
            .steps
            .iter()
            .skip(index + 1)
            .any(|s| s.kind.is_drain() && s.status == StepStatus::Pending)
}

/// The nodes `run` has in hand, which the breaker does not count: those of its steps in
/// hand (a batch's cycles, a soak) and the workers it left behind, cordoned within the
/// failure budget. A gate names the node it comes before, which is not yet in hand.
pub fn in_hand(run: &Run) -> BTreeSet<&str> {
    run.steps_in_hand()
        .filter(|s| !s.kind.is_gate())
        .filter_map(|s| s.kind.node())
        .chain(run.workers_left_behind())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(not_ready: &[&str], size: usize) -> Vec<(String, bool)> {
        (0..size)
            .map(|i| {
                let name = if i == 0 {
                    "cp".to_owned()
                } else {
                    format!("w{i}")
                };
                let ready = !not_ready.contains(&name.as_str());
                (name, ready)
            })
            .collect()
    }

    #[test]
    fn the_breaker_counts_nodes_not_ready_but_not_those_in_hand() {
        let limit = UnhealthyLimit::Percent(20);
        /// What, the NotReady nodes, those in hand, the nodes named when it trips.
        type Case<'a> = (&'a str, Vec<&'a str>, Vec<&'a str>, Option<Vec<&'a str>>);
        let cases: Vec<Case> = vec![
            ("all Ready", vec![], vec![], None),
            ("2 of 13: within 20 %", vec!["w4", "w5"], vec![], None),
            (
                "3 of 13: beyond",
                vec!["w6", "w4", "w5"],
                vec![],
                Some(vec!["w4", "w5", "w6"]),
            ),
            (
                "3 of 13, one rollgate's",
                vec!["w4", "w5", "w1"],
                vec!["w1"],
                None,
            ),
            (
                "the batch in hand NotReady, all of it rollgate's",
                vec!["w1", "w2", "w3", "w4"],
                vec!["w1", "w2", "w3", "w4"],
                None,
            ),
            (
                "a control plane counts as any node",
                vec!["cp", "w7", "w8"],
                vec![],
                Some(vec!["cp", "w7", "w8"]),
            ),
        ];
        for (what, not_ready, hand, names) in cases {
            let nodes = cluster(&not_ready, 13);
            let nodes: Vec<(&str, bool)> = nodes.iter().map(|(n, r)| (n.as_str(), *r)).collect();
            let hand: BTreeSet<&str> = hand.into_iter().collect();
            let tripped = judge(&nodes, &hand, limit);
            assert_eq!(
                tripped.as_ref().map(|t| t.not_ready.clone()),
                names.map(|n| n.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
                "{what}"
            );
        }
    }

    #[test]
    fn a_tripped_breaker_says_how_many_of_how_many() {
        let tripped = Tripped {
            not_ready: vec!["w4".into(), "w5".into(), "w6".into()],
            nodes: 13,
            limit: UnhealthyLimit::Percent(20),
        };
        let text = tripped.to_string();
        assert!(text.starts_with("3 of 13 nodes NotReady"), "{text}");
        assert!(text.contains("(w4, w5, w6)"), "{text}");
        assert!(text.contains("cluster.unhealthy_limit 20%"), "{text}");
        let many = Tripped {
            not_ready: (0..250).map(|i| format!("w{i:03}")).collect(),
            nodes: 1003,
            limit: UnhealthyLimit::Percent(20),
        };
        let text = many.to_string();
        assert!(text.contains("w009 and 240 more"), "{text}");
    }
}
