//! Planning a node-reboot run, as plain functions over plain data: which nodes a request
//! may name, and the node cycle of the workers whose sentinel is set, in batches.
//! Imports nothing but the domain.

use std::collections::BTreeMap;

use super::step::{ControlPlanePart, RebootStep};
use crate::domain::run::Step;
use crate::domain::run::{FailurePolicy, Run};
use crate::workflows::control_plane_cycle::plan::NextControlPlane;
use crate::workflows::k8s_upgrade::plan::{self as k8s_upgrade, ClusterFacts, PlanSettings, Role};
use crate::workflows::node_cycle::plan::{self as node_cycle, CycleSteps, Part};
use crate::workflows::node_reboot::RebootRequest;
use chrono::{DateTime, Utc};

/// How reboots are planned.
#[derive(Debug, Clone)]
pub struct RebootPlanSettings {
    /// Worker order, batch size and failure budget, shared with upgrades.
    pub workers: PlanSettings,
    /// Whether control-plane nodes may be rebooted.
    pub control_planes: bool,
}

/// A request the cluster cannot take as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RebootPlanError {
    /// A named node is not in the cluster.
    #[error("node {0} is not in the cluster")]
    UnknownNode(String),
    /// A named node is a control plane and `reboot.control_planes` is false.
    #[error(
        "node {0} is a control plane, and reboot.control_planes is false: rollgate reboots workers only here"
    )]
    ControlPlane(String),
    /// The worker order or the failure budget does not fit the cluster.
    #[error(transparent)]
    Workers(#[from] k8s_upgrade::PlanError),
}

/// Checks what `request` names against the cluster: every node exists, and none is a
/// control plane unless those may be rebooted. The API answers 422 with this.
pub fn check_request(
    request: &RebootRequest,
    facts: &ClusterFacts,
    settings: &RebootPlanSettings,
) -> Result<(), RebootPlanError> {
    for name in &request.nodes {
        match facts.node(name) {
            None => return Err(RebootPlanError::UnknownNode(name.clone())),
            Some(n) if n.role == Role::ControlPlane && !settings.control_planes => {
                return Err(RebootPlanError::ControlPlane(name.clone()));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The nodes whose sentinel a plan reads: those named, or every node the run may reboot.
pub fn candidates(
    request: &RebootRequest,
    facts: &ClusterFacts,
    settings: &RebootPlanSettings,
) -> Vec<String> {
    facts
        .nodes
        .iter()
        .filter(|n| request.nodes.is_empty() || request.nodes.contains(&n.name))
        .filter(|n| n.role == Role::Worker || settings.control_planes)
        .map(|n| n.name.clone())
        .collect()
}

/// The control planes a run still has to reboot: asked (named, or every one), allowed,
/// their sentinel set (`needs`), and not already rebooted by this run (`marked`: the nodes
/// carrying this run's reboot mark).
pub fn control_planes_pending(
    request: &RebootRequest,
    facts: &ClusterFacts,
    needs: &BTreeMap<String, bool>,
    marked: &[String],
    settings: &RebootPlanSettings,
) -> Vec<String> {
    candidates(request, facts, settings)
        .into_iter()
        .filter(|n| facts.node(n).is_some_and(|n| n.role == Role::ControlPlane))
        .filter(|n| needs.get(n).copied().unwrap_or(false) && !marked.contains(n))
        .collect()
}

/// The steps of the next control-plane action, ending with the `next` that decides the
/// one after: a reboot goes between two health checks, its gate, drain, reboot, back,
/// uncordon and soak.
pub fn control_plane_steps(action: &NextControlPlane) -> Vec<Step> {
    let steps = match action {
        NextControlPlane::Done => Vec::new(),
        NextControlPlane::MoveLeader { to, .. } => vec![
            RebootStep::MoveLeader { node: to.clone() },
            RebootStep::ControlPlaneNext,
        ],
        NextControlPlane::Touch(node) => ControlPlanePart::ALL
            .into_iter()
            .map(|part| RebootStep::ControlPlane {
                node: node.clone(),
                part,
            })
            .chain([RebootStep::ControlPlaneNext])
            .collect(),
    };
    steps.into_iter().map(Step::new).collect()
}

/// What a reboot plan holds.
#[derive(Debug, Clone, PartialEq)]
pub struct RebootPlan {
    /// The control planes to reboot, one at a time, in the order `next` decides.
    pub control_planes: Vec<String>,
    /// The workers to reboot, in order.
    pub workers: Vec<String>,
    /// How many go together.
    pub batch_size: usize,
    /// Nodes left out, each with why.
    pub left_out: Vec<String>,
    /// The steps after `plan-reboots`.
    pub steps: Vec<Step>,
}

/// The plan for `request` over the cluster, given which nodes' sentinels are set
/// (`needs`, by node).
pub fn plan(
    request: &RebootRequest,
    facts: &ClusterFacts,
    needs: &BTreeMap<String, bool>,
    settings: &RebootPlanSettings,
) -> Result<RebootPlan, RebootPlanError> {
    check_request(request, facts, settings)?;
    let asked = |name: &str| request.nodes.is_empty() || request.nodes.iter().any(|n| n == name);
    let mut left_out = Vec::new();
    for node in facts.nodes.iter().filter(|n| asked(&n.name)) {
        if node.role == Role::ControlPlane && !settings.control_planes {
            if needs.get(&node.name).copied().unwrap_or(false) || !request.nodes.is_empty() {
                left_out.push(format!(
                    "{} (a control plane; reboot.control_planes is false)",
                    node.name
                ));
            }
            continue;
        }
        if !needs.get(&node.name).copied().unwrap_or(false) && !request.nodes.is_empty() {
            left_out.push(format!("{} (its sentinel is not set)", node.name));
        }
    }
    let order = k8s_upgrade::worker_order(facts, &settings.workers)?;
    let workers: Vec<String> = order
        .into_iter()
        .filter(|w| asked(w) && needs.get(w).copied().unwrap_or(false))
        .collect();
    settings
        .workers
        .failure_budget
        .check(workers.len())
        .map_err(|e| RebootPlanError::Workers(k8s_upgrade::PlanError::FailureBudget(e)))?;
    let batch_size = settings.workers.max_unavailable.of(workers.len());
    let control_planes = control_planes_pending(request, facts, needs, &[], settings);
    let first = if control_planes.is_empty() {
        Vec::new()
    } else {
        vec![RebootStep::EtcdHealthy, RebootStep::ControlPlaneNext]
    };
    let steps = first
        .into_iter()
        .chain(node_cycle::worker_batches::<RebootCycle>(
            &workers,
            batch_size,
            settings.workers.judge_batches,
        ))
        .map(Step::new)
        .collect();
    Ok(RebootPlan {
        control_planes,
        workers,
        batch_size,
        left_out,
        steps,
    })
}

/// The workers' node cycle with a reboot as its action, the sentinel checked again first.
struct RebootCycle;

impl CycleSteps for RebootCycle {
    type Step = RebootStep;
    const PARTS: &'static [Part] = &[
        Part::Check,
        Part::Drain,
        Part::Action,
        Part::Verify,
        Part::Uncordon,
    ];

    fn gate(node: &str) -> RebootStep {
        RebootStep::Gate {
            node: node.to_owned(),
        }
    }

    fn part(part: Part, node: &str) -> RebootStep {
        let node = node.to_owned();
        match part {
            Part::Check => RebootStep::Required { node },
            // A reboot fetches nothing (not in PARTS): its drain begins it.
            Part::Fetch | Part::Drain => RebootStep::Drain { node },
            // A reboot's own action is a reboot: no second one after it (not in PARTS).
            Part::Action | Part::RebootIfRequired => RebootStep::Reboot { node },
            Part::Verify => RebootStep::Back { node },
            Part::Uncordon => RebootStep::Uncordon { node },
        }
    }

    fn soak(node: &str) -> RebootStep {
        RebootStep::Soak {
            node: node.to_owned(),
        }
    }

    fn analysis(node: &str) -> RebootStep {
        RebootStep::Analysis {
            node: node.to_owned(),
        }
    }
}

/// A new node-reboot run: `plan-reboots`, which reads the sentinels and appends the rest.
pub fn new_run(
    id: String,
    request: &RebootRequest,
    on_failure: FailurePolicy,
    now: DateTime<Utc>,
) -> Run {
    let reason = match &request.reason {
        Some(why) => format!("accepted: {why}"),
        None => "accepted".to_owned(),
    };
    Run::new(
        id,
        crate::workflows::node_reboot::step::NODE_REBOOT,
        request.to_json(),
        None,
        vec![Step::new(RebootStep::Plan)],
        now,
        reason,
    )
    .failing(on_failure)
}

/// Merges `request` (from `source`) into `run`, a reboot run that waits for the cluster
/// and has not planned yet: its nodes join (none named: every node that needs it), the
/// history says so. The nodes taken in, in words; `None` when `run` cannot take it (no
/// longer queued, or not a reboot run's request).
pub fn merge(
    run: &mut Run,
    request: &RebootRequest,
    source: &str,
    now: DateTime<Utc>,
) -> Option<String> {
    if run.kind != crate::workflows::node_reboot::step::NODE_REBOOT
        || run.status != crate::domain::run::RunStatus::Queued
    {
        return None;
    }
    let asked = run.request_as::<RebootRequest>().ok()?;
    let nodes = if request.nodes.is_empty() {
        "every node that needs it".to_owned()
    } else {
        request.nodes.join(", ")
    };
    run.set_request(asked.merged(request).to_json());
    run.note(
        format!("a request from {source} for {nodes} is merged into this run"),
        now,
    );
    Some(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::version::Version;
    use crate::workflows::k8s_upgrade::plan::{FailureBudget, MaxUnavailable, NodeFacts};

    fn facts(cps: &[&str], workers: &[&str]) -> ClusterFacts {
        let node = |name: &&str, role| NodeFacts {
            name: (*name).to_owned(),
            role,
            kubelet: Version::parse("1.34.2").unwrap(),
            distribution: Default::default(),
            package_manager: None,
            containerd: None,
            ready: true,
            address: None,
        };
        ClusterFacts {
            nodes: cps
                .iter()
                .map(|n| node(n, Role::ControlPlane))
                .chain(workers.iter().map(|n| node(n, Role::Worker)))
                .collect(),
        }
    }

    fn settings(max_unavailable: u32) -> RebootPlanSettings {
        RebootPlanSettings {
            workers: PlanSettings {
                worker_order: Vec::new(),
                max_unavailable: MaxUnavailable::Count(max_unavailable),
                failure_budget: FailureBudget::None,
                etcd_max_lag: 1000,
                reboot_after_upgrade: false,
                distribution: Default::default(),
                judge_batches: false,
            },
            control_planes: false,
        }
    }

    fn request(nodes: &[&str]) -> RebootRequest {
        RebootRequest {
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            reason: None,
            dry_run: false,
        }
    }

    fn labels(plan: &RebootPlan) -> Vec<String> {
        plan.steps.iter().map(Step::label).collect()
    }

    #[test]
    fn only_the_workers_whose_sentinel_is_set_are_rebooted_in_batches() {
        let cluster = facts(&["cp"], &["w1", "w2", "w3", "w4", "w5", "w6"]);
        let needs: BTreeMap<String, bool> = ["w1", "w2", "w4", "w6", "cp"]
            .iter()
            .map(|n| ((*n).to_owned(), true))
            .collect();
        let plan = plan(&request(&[]), &cluster, &needs, &settings(2)).unwrap();
        assert_eq!(plan.workers, ["w1", "w2", "w4", "w6"]);
        assert_eq!(
            plan.left_out,
            ["cp (a control plane; reboot.control_planes is false)"]
        );
        let cycle = |n: &str| {
            ["required", "drain", "reboot", "back", "uncordon"].map(|s| match s {
                "reboot" => format!("reboot@{n}"),
                s => format!("reboot/{s}@{n}"),
            })
        };
        let mut want = vec!["reboot/gate@w1".to_owned()];
        want.extend(cycle("w1"));
        want.extend(cycle("w2"));
        want.push("reboot/soak@w2".into());
        want.push("reboot/gate@w4".into());
        want.extend(cycle("w4"));
        want.extend(cycle("w6"));
        want.push("reboot/soak@w6".into());
        assert_eq!(labels(&plan), want);
    }

    #[test]
    fn named_nodes_are_checked_against_the_cluster() {
        let cluster = facts(&["cp"], &["w1", "w2"]);
        let cases: [(&[&str], Option<&str>); 4] = [
            (&["w1"], None),
            (&["w9"], Some("node w9 is not in the cluster")),
            (&["w1", "cp"], Some("node cp is a control plane")),
            (&[], None),
        ];
        for (nodes, want) in cases {
            let got = check_request(&request(nodes), &cluster, &settings(1)).err();
            match (got, want) {
                (None, None) => {}
                (Some(e), Some(want)) => assert!(e.to_string().contains(want), "{nodes:?}: {e}"),
                (got, want) => panic!("{nodes:?}: {got:?}, wanted {want:?}"),
            }
        }
    }

    #[test]
    fn a_named_node_whose_sentinel_is_not_set_is_left_out_and_named() {
        let cluster = facts(&["cp"], &["w1", "w2"]);
        let needs: BTreeMap<String, bool> =
            [("w1".to_owned(), true), ("w2".to_owned(), false)].into();
        let plan = plan(&request(&["w1", "w2"]), &cluster, &needs, &settings(1)).unwrap();
        assert_eq!(plan.workers, ["w1"]);
        assert_eq!(plan.left_out, ["w2 (its sentinel is not set)"]);
        let none = super::plan(&request(&[]), &cluster, &BTreeMap::new(), &settings(1)).unwrap();
        assert!(none.steps.is_empty() && none.left_out.is_empty());
    }

    #[test]
    fn control_planes_go_first_one_at_a_time_decided_by_next() {
        let cluster = facts(&["cp-1", "cp-2", "cp-3"], &["w1", "w2"]);
        let needs: BTreeMap<String, bool> = ["cp-1", "cp-3", "w2"]
            .iter()
            .map(|n| ((*n).to_owned(), true))
            .collect();
        let allowed = RebootPlanSettings {
            control_planes: true,
            ..settings(1)
        };
        let plan = plan(&request(&[]), &cluster, &needs, &allowed).unwrap();
        assert_eq!(plan.control_planes, ["cp-1", "cp-3"]);
        assert_eq!(plan.workers, ["w2"]);
        assert!(plan.left_out.is_empty(), "{:?}", plan.left_out);
        assert_eq!(
            labels(&plan)[..3],
            [
                "reboot-control-plane/etcd-healthy",
                "reboot-control-plane/next",
                "reboot/gate@w2"
            ]
        );
        let marked = ["cp-1".to_owned()];
        assert_eq!(
            control_planes_pending(&request(&[]), &cluster, &needs, &marked, &allowed),
            ["cp-3"]
        );
        assert_eq!(
            control_planes_pending(&request(&["w2"]), &cluster, &needs, &[], &allowed),
            Vec::<String>::new()
        );
        let touch: Vec<String> = control_plane_steps(&NextControlPlane::Touch("cp-3".into()))
            .iter()
            .map(Step::label)
            .collect();
        assert_eq!(
            touch,
            [
                "healthy-before",
                "gate",
                "drain",
                "reboot",
                "back",
                "uncordon",
                "healthy-after",
                "soak"
            ]
            .map(|p| format!("reboot-control-plane/{p}@cp-3"))
            .into_iter()
            .chain(["reboot-control-plane/next".to_owned()])
            .collect::<Vec<_>>()
        );
        let moved: Vec<String> = control_plane_steps(&NextControlPlane::MoveLeader {
            from: "cp-1".into(),
            to: "cp-3".into(),
        })
        .iter()
        .map(Step::label)
        .collect();
        assert_eq!(
            moved,
            [
                "reboot-control-plane/move-leader@cp-3",
                "reboot-control-plane/next"
            ]
        );
        assert!(control_plane_steps(&NextControlPlane::Done).is_empty());
    }

    #[test]
    fn a_request_merges_into_a_queued_reboot_run_only() {
        let now = chrono::Utc::now();
        let mut waiting = new_run("r1".into(), &request(&["w1"]), FailurePolicy::Halt, now);
        let merged = merge(&mut waiting, &request(&["w3"]), "api", now);
        assert_eq!(merged.as_deref(), Some("w3"));
        assert_eq!(
            RebootRequest::from_json(&waiting.request).unwrap().nodes,
            ["w1", "w3"]
        );
        assert!(
            waiting
                .history
                .iter()
                .any(|h| h.reason.contains("a request from api for w3 is merged")),
            "{:?}",
            waiting.history
        );
        assert_eq!(
            merge(&mut waiting, &request(&[]), "detect", now).as_deref(),
            Some("every node that needs it")
        );
        assert!(
            RebootRequest::from_json(&waiting.request)
                .unwrap()
                .nodes
                .is_empty()
        );
        waiting.status = crate::domain::run::RunStatus::Running;
        assert_eq!(merge(&mut waiting, &request(&["w9"]), "api", now), None);
    }
}
