//! What holds a node's drain before it is cordoned, the way a closed gate does: a pod
//! that must not be interrupted (`cluster.blocking_pod_selectors`, kured's idea), or a
//! PodDisruptionBudget that allows no eviction of one of the node's pods and will not by
//! itself (every pod it covers is healthy and still none may go: only a person can change
//! that, e.g. a single-replica database's primary). A budget at zero because some of its
//! pods are not healthy yet may recover: the drain goes ahead and waits for it.

pub use crate::domain::pods::{
    BudgetFacts, Operator, PodFacts, Requirement, Selector, eviction_may_go,
};

/// Why the drain of a node must wait, one line each; empty: it may go ahead.
pub fn holds(pods: &[PodFacts], budgets: &[BudgetFacts], blocking: &[Requirement]) -> Vec<String> {
    let mut out = Vec::new();
    for pod in pods.iter().filter(|p| p.running) {
        if let Some(r) = blocking.iter().find(|r| r.matches(&pod.labels)) {
            out.push(format!(
                "pod {}/{} matches the blocking selector {r}",
                pod.namespace, pod.name
            ));
        }
    }
    for budget in budgets {
        let stuck =
            budget.disruptions_allowed <= 0 && budget.current_healthy >= budget.expected_pods;
        if !stuck {
            continue;
        }
        let covered: Vec<&str> = pods
            .iter()
            .filter(|p| p.evictable && p.namespace == budget.namespace)
            .filter(|p| budget.selector.matches(&p.labels))
            .map(|p| p.name.as_str())
            .collect();
        if !covered.is_empty() {
            out.push(format!(
                "PodDisruptionBudget {}/{} allows no eviction of {} and will not by itself ({} of {} pods healthy, none may go)",
                budget.namespace,
                budget.name,
                covered.join(", "),
                budget.current_healthy,
                budget.expected_pods
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod(name: &str, app: &str, running: bool, evictable: bool) -> PodFacts {
        PodFacts {
            namespace: "db".into(),
            name: name.into(),
            labels: labels(&[("app", app)]),
            running,
            evictable,
        }
    }

    fn budget(app: &str, allowed: i32, healthy: i32, expected: i32) -> BudgetFacts {
        BudgetFacts {
            namespace: "db".into(),
            name: format!("{app}-pdb"),
            selector: Selector {
                requirements: vec![Requirement::parse(&format!("app={app}")).unwrap()],
            },
            disruptions_allowed: allowed,
            desired_healthy: healthy - allowed,
            generation: 1,
            observed_generation: 1,
            resource_version: "1".into(),
            current_healthy: healthy,
            expected_pods: expected,
        }
    }

    #[test]
    fn selectors_parse_and_match() {
        let pg = labels(&[("app", "pg"), ("role", "primary")]);
        let cases = [
            ("app=pg", Some(true)),
            ("app=web", Some(false)),
            ("app!=web", Some(true)),
            ("role", Some(true)),
            ("!role", Some(false)),
            ("backup", Some(false)),
            ("app=pg;reboot", None),
            ("", None),
        ];
        for (raw, want) in cases {
            let got = Requirement::parse(raw).ok().map(|r| r.matches(&pg));
            assert_eq!(got, want, "{raw}");
        }
    }

    /// Case, pods, budgets, blocking selectors, what the held lines mention.
    type Case = (
        &'static str,
        Vec<PodFacts>,
        Vec<BudgetFacts>,
        Vec<Requirement>,
        Vec<&'static str>,
    );

    #[test]
    fn what_holds_a_drain() {
        let velero = Requirement::parse("app=velero").unwrap();
        let cases: Vec<Case> = vec![
            (
                "nothing",
                vec![pod("web-1", "web", true, true)],
                vec![],
                vec![],
                vec![],
            ),
            (
                "a single-replica primary: all healthy, none may go",
                vec![pod("pg-0", "pg", true, true)],
                vec![budget("pg", 0, 1, 1)],
                vec![],
                vec!["PodDisruptionBudget db/pg-pdb allows no eviction of pg-0"],
            ),
            (
                "a budget at zero while a pod elsewhere recovers: the drain waits it out",
                vec![pod("web-1", "web", true, true)],
                vec![budget("web", 0, 2, 3)],
                vec![],
                vec![],
            ),
            (
                "a budget with room",
                vec![pod("web-1", "web", true, true)],
                vec![budget("web", 1, 3, 3)],
                vec![],
                vec![],
            ),
            (
                "a stuck budget of pods elsewhere",
                vec![pod("web-1", "web", true, true)],
                vec![budget("pg", 0, 1, 1)],
                vec![],
                vec![],
            ),
            (
                "a DaemonSet pod is not evicted, so its budget does not hold",
                vec![pod("agent-1", "agent", true, false)],
                vec![budget("agent", 0, 3, 3)],
                vec![],
                vec![],
            ),
            (
                "a running blocking pod",
                vec![pod("velero-1", "velero", true, true)],
                vec![],
                vec![velero.clone()],
                vec!["pod db/velero-1 matches the blocking selector app in (velero)"],
            ),
            (
                "a finished blocking pod does not hold",
                vec![pod("velero-1", "velero", false, true)],
                vec![],
                vec![velero.clone()],
                vec![],
            ),
        ];
        for (name, pods, budgets, blocking, want) in cases {
            let got = holds(&pods, &budgets, &blocking);
            assert_eq!(got.len(), want.len(), "{name}: {got:?}");
            for (line, part) in got.iter().zip(want) {
                assert!(line.contains(part), "{name}: {line}");
            }
        }
    }

    #[test]
    fn an_eviction_goes_only_under_a_current_budget_that_allows_it() {
        let at = |allowed, healthy, rv: &str, observed| BudgetFacts {
            resource_version: rv.into(),
            observed_generation: observed,
            ..budget("web", allowed, healthy, 4)
        };
        type Case<'a> = (
            &'a str,
            BudgetFacts,
            bool,
            Option<&'a str>,
            Result<(), &'a str>,
        );
        let cases: Vec<Case> = vec![
            ("allows one", at(1, 4, "7", 1), true, None, Ok(())),
            (
                "allows none",
                at(0, 3, "7", 1),
                true,
                None,
                Err(
                    "PodDisruptionBudget db/web-pdb allows no disruption now (3 of 3 desired pods healthy)",
                ),
            ),
            (
                "allows one, but its status predates rollgate's last eviction",
                at(1, 4, "7", 1),
                true,
                Some("7"),
                Err(
                    "PodDisruptionBudget db/web-pdb: its status does not yet count rollgate's last eviction under it",
                ),
            ),
            (
                "written since the last eviction",
                at(1, 4, "8", 1),
                true,
                Some("7"),
                Ok(()),
            ),
            (
                "status for an older spec",
                BudgetFacts {
                    generation: 2,
                    ..at(1, 4, "7", 1)
                },
                true,
                None,
                Err("PodDisruptionBudget db/web-pdb: its status is not yet computed for its spec"),
            ),
            (
                "an unready pod of a met budget goes",
                at(0, 3, "7", 1),
                false,
                None,
                Ok(()),
            ),
            (
                "an unready pod of a budget below its floor waits",
                BudgetFacts {
                    desired_healthy: 4,
                    ..at(0, 3, "7", 1)
                },
                false,
                None,
                Err(
                    "PodDisruptionBudget db/web-pdb allows no disruption now (3 of 4 desired pods healthy)",
                ),
            ),
        ];
        for (what, budget, ready, evicted_at, want) in cases {
            assert_eq!(
                eviction_may_go(&budget, ready, evicted_at),
                want.map_err(str::to_owned),
                "{what}"
            );
        }
    }
}
