//! Steps as data: each workflow's step type is its own (an enum of its steps, with their
//! parameters as fields, in its folder), known to the engine through [`WorkflowStep`] and
//! to the store through the [`StepType`] it registers (`workflows::register`).
//!
//! A [`StepKind`] holds any workflow's step; the workflow's executor takes its own back
//! with [`StepKind::get`] and picks what to do with an exhaustive `match`. On the wire (the
//! API, the run store) a step keeps the flat shape readers already use — `stage`, `name`,
//! `node` — and a stored step whose name, stage or node does not make a known step is
//! refused when it is read, with the reason.

use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::run_kind::{self, RunKind};
use super::step::{StepError, StepRole, WorkflowStep};

/// A workflow's step type as the store and the engine know it: what a step of it is,
/// on the wire and in memory.
pub trait StepData: WorkflowStep + fmt::Debug + Send + Sync + 'static {
    /// The step, to be taken back as its own type.
    fn as_any(&self) -> &dyn Any;
    /// Whether `other` is the same step.
    fn same(&self, other: &dyn StepData) -> bool;
    /// Feeds the step to `state`.
    fn hash_into(&self, state: &mut dyn Hasher);
}

impl<T> StepData for T
where
    T: WorkflowStep + fmt::Debug + PartialEq + Hash + Send + Sync + 'static,
{
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn same(&self, other: &dyn StepData) -> bool {
        other.as_any().downcast_ref::<T>() == Some(self)
    }

    fn hash_into(&self, mut state: &mut dyn Hasher) {
        std::any::TypeId::of::<T>().hash(&mut state);
        self.hash(&mut state);
    }
}

/// What a step does, whichever workflow it belongs to.
#[derive(Clone, Serialize, Deserialize)]
#[serde(try_from = "StepWire", into = "StepWire")]
pub struct StepKind(Arc<dyn StepData>);

impl<T: StepData> From<T> for StepKind {
    fn from(step: T) -> Self {
        Self(Arc::new(step))
    }
}

impl fmt::Debug for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl PartialEq for StepKind {
    fn eq(&self, other: &Self) -> bool {
        self.0.same(other.0.as_ref())
    }
}

impl Eq for StepKind {}

impl Hash for StepKind {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash_into(state);
    }
}

/// A workflow's wire parser: `None` for a stage that is not its own.
pub type WireParser = fn(&str, &str, Option<String>) -> Option<Result<StepKind, StepError>>;

/// A workflow's step type, registered so that stored and posted steps of it can be read.
#[derive(Debug, Clone, Copy)]
pub struct StepType {
    /// The kind of run its steps belong to.
    pub run_kind: RunKind,
    /// Reads a step of its stages from the wire.
    pub parse: WireParser,
}

/// The step types registered, in the order they were.
static REGISTERED: RwLock<Vec<StepType>> = RwLock::new(Vec::new());

/// Makes `types` known (their run kinds too): stored and posted steps of theirs can be
/// read. A run kind has one step type; registering it again changes nothing.
pub fn register(types: &[StepType]) {
    run_kind::register(types.iter().map(|t| t.run_kind));
    let mut registered = REGISTERED
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for t in types {
        if !registered.iter().any(|r| r.run_kind == t.run_kind) {
            registered.push(*t);
        }
    }
}

impl StepKind {
    /// The step, as the engine sees every workflow's.
    pub fn step(&self) -> &dyn WorkflowStep {
        self.0.as_ref()
    }

    /// The step as its workflow's type `T`, if it is one.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref()
    }

    /// The kind of run the step belongs to: whose executor carries it out.
    pub fn run_kind(&self) -> RunKind {
        self.step().run_kind()
    }

    /// The step's name, e.g. `drain` or `etcd-restart`.
    pub fn name(&self) -> &'static str {
        self.step().name()
    }

    /// The stage's name, e.g. `workers` or `etcd-roll`.
    pub fn stage_name(&self) -> &'static str {
        self.step().stage_name()
    }

    /// The node or etcd member the step acts on, if any.
    pub fn node(&self) -> Option<&str> {
        self.step().node()
    }

    /// The worker whose cycle the step belongs to, if it runs beside others of its batch.
    pub fn lane(&self) -> Option<&str> {
        self.step().lane()
    }

    /// A step of the workers' batches (a gate, a worker's cycle, a soak): a worker left
    /// behind does not stop the batches that follow.
    pub fn among_workers(&self) -> bool {
        self.step().among_workers()
    }

    /// Whether it starts work a maintenance window must allow (each workflow says which
    /// of its steps do); work in progress is never interrupted by a window closing.
    pub fn waits_for_window(&self) -> bool {
        self.step().waits_for_window()
    }

    /// Whether it waits outside the cluster, before the run takes the cluster's lock.
    pub fn outside_the_cluster(&self) -> bool {
        self.step().outside_the_cluster()
    }

    /// A soak: the wait after a node or a batch is back.
    pub fn is_soak(&self) -> bool {
        self.step().role() == StepRole::Soak
    }

    /// A drain: a node's cycle begins with it.
    pub fn is_drain(&self) -> bool {
        self.step().role() == StepRole::Drain
    }

    /// An uncordon: a node's cycle ends with it.
    pub fn is_uncordon(&self) -> bool {
        self.step().role() == StepRole::Uncordon
    }

    /// A batch analysis: judges the batch before it (`gate.analysis`).
    pub fn is_analysis(&self) -> bool {
        self.step().role() == StepRole::Analysis
    }

    /// A gate step: the engine starts it only from the queue.
    pub fn is_gate(&self) -> bool {
        self.step().role() == StepRole::Gate
    }

    /// `stage/name@node`, leaving out what is empty or repeated.
    pub fn label(&self) -> String {
        let (stage, name) = (self.stage_name(), self.name());
        let mut label = if stage == name {
            name.to_owned()
        } else {
            format!("{stage}/{name}")
        };
        if let Some(node) = self.node() {
            label.push('@');
            label.push_str(node);
        }
        label
    }
}

/// A step as the API shows it and the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StepWire {
    /// The stage it belongs to, e.g. `preflight`, `workers` or `etcd-roll`.
    pub stage: String,
    /// What the step is, e.g. `gate` or `drain`.
    pub name: String,
    /// The node (or etcd member) it acts on, if any.
    pub node: Option<String>,
}

impl TryFrom<StepWire> for StepKind {
    type Error = StepError;

    fn try_from(wire: StepWire) -> Result<Self, StepError> {
        let registered = REGISTERED
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        registered
            .iter()
            .find_map(|t| (t.parse)(&wire.stage, &wire.name, wire.node.clone()))
            .unwrap_or_else(|| {
                Err(StepError::new(
                    &wire.stage,
                    &wire.name,
                    if registered.is_empty() {
                        "unknown stage: no workflow is registered"
                    } else {
                        "unknown stage: no workflow has it"
                    },
                ))
            })
    }
}

impl From<StepKind> for StepWire {
    fn from(kind: StepKind) -> Self {
        Self {
            stage: kind.stage_name().to_owned(),
            name: kind.name().to_owned(),
            node: kind.node().map(str::to_owned),
        }
    }
}

impl utoipa::PartialSchema for StepKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        StepWire::schema()
    }
}

impl utoipa::ToSchema for StepKind {
    fn name() -> std::borrow::Cow<'static, str> {
        "StepWire".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Stage;
    use crate::domain::upgrade_step::{STEPS, UpgradeStep};

    fn every_kind() -> Vec<StepKind> {
        let node = || "n1".to_owned();
        let mut kinds: Vec<StepKind> = vec![
            UpgradeStep::Plan.into(),
            UpgradeStep::MarkInFlight.into(),
            UpgradeStep::NodesReady.into(),
            UpgradeStep::SshReachable.into(),
            UpgradeStep::KubeadmPlan { node: node() }.into(),
            UpgradeStep::QuietPeriod.into(),
            UpgradeStep::EtcdSnapshot.into(),
            UpgradeStep::Containerd { node: node() }.into(),
            UpgradeStep::AptRepo { node: node() }.into(),
            UpgradeStep::EtcdHealthy.into(),
            UpgradeStep::ControlPlaneNext.into(),
            UpgradeStep::ControlPlaneHealthy {
                node: node(),
                after: false,
            }
            .into(),
            UpgradeStep::ControlPlaneHealthy {
                node: node(),
                after: true,
            }
            .into(),
            UpgradeStep::MoveLeader { node: node() }.into(),
            UpgradeStep::Apply { node: node() }.into(),
            UpgradeStep::NodesAtTarget.into(),
            UpgradeStep::PodReady.into(),
            UpgradeStep::ClearInFlight.into(),
        ];
        for stage in Stage::ALL {
            kinds.push(UpgradeStep::Gate { stage, node: None }.into());
            kinds.push(
                UpgradeStep::Gate {
                    stage,
                    node: Some(node()),
                }
                .into(),
            );
        }
        for stage in [Stage::ControlPlane, Stage::Workers] {
            for make in [
                |stage, node| UpgradeStep::Drain { stage, node },
                |stage, node| UpgradeStep::Upgrade { stage, node },
                |stage, node| UpgradeStep::Reboot { stage, node },
                |stage, node| UpgradeStep::Verify { stage, node },
                |stage, node| UpgradeStep::Uncordon { stage, node },
                |stage, node| UpgradeStep::Soak { stage, node },
            ] {
                kinds.push(make(stage, node()).into());
            }
        }
        kinds
    }

    /// A step type of a workflow of the test's own.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Probe(Option<String>);

    const PROBE: RunKind = RunKind::new("probe");

    impl WorkflowStep for Probe {
        fn name(&self) -> &'static str {
            "probe"
        }
        fn stage_name(&self) -> &'static str {
            "probing"
        }
        fn node(&self) -> Option<&str> {
            self.0.as_deref()
        }
        fn run_kind(&self) -> RunKind {
            PROBE
        }
    }

    const PROBES: StepType = StepType {
        run_kind: PROBE,
        parse: |stage, _, node| (stage == "probing").then(|| Ok(Probe(node).into())),
    };

    #[test]
    fn a_registered_step_type_reads_back_as_itself_and_is_taken_back_by_its_type() {
        let wire = || serde_json::json!({"stage": "probing", "name": "probe", "node": "n1"});
        let probe: StepKind = Probe(Some("n1".into())).into();
        assert_eq!(probe.get::<Probe>(), Some(&Probe(Some("n1".into()))));
        assert_eq!(probe.get::<UpgradeStep>(), None);
        assert_ne!(probe, StepKind::from(Probe(None)));
        assert_ne!(probe, StepKind::from(UpgradeStep::Plan));
        register(&[PROBES, PROBES]);
        assert_eq!(RunKind::known("probe"), Some(PROBE));
        let back: StepKind = serde_json::from_value(wire()).unwrap();
        assert_eq!(back, probe);
        assert_eq!(back.run_kind(), PROBE);
        assert_eq!(serde_json::to_value(&back).unwrap(), wire());
        let unknown = serde_json::json!({"stage": "probed", "name": "probe", "node": null});
        let err = serde_json::from_value::<StepKind>(unknown).unwrap_err();
        assert!(err.to_string().contains("unknown stage"), "{err}");
    }

    #[test]
    fn every_step_kind_round_trips_through_its_wire_form() {
        register(&[STEPS]);
        let kinds = every_kind();
        for kind in &kinds {
            let json = serde_json::to_value(kind).unwrap();
            let back: StepKind = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(&back, kind, "{json}");
        }
        let labels: std::collections::HashSet<String> = kinds.iter().map(StepKind::label).collect();
        assert_eq!(labels.len(), kinds.len(), "two kinds share a label");
    }

    #[test]
    fn the_wire_form_is_the_flat_shape_readers_use() {
        let cases: [(StepKind, serde_json::Value); 3] = [
            (
                UpgradeStep::Drain {
                    stage: Stage::Workers,
                    node: "w1".into(),
                }
                .into(),
                serde_json::json!({"stage": "workers", "name": "drain", "node": "w1"}),
            ),
            (
                UpgradeStep::MarkInFlight.into(),
                serde_json::json!({"stage": "accept", "name": "mark-in-flight", "node": null}),
            ),
            (
                UpgradeStep::Plan.into(),
                serde_json::json!({"stage": "plan", "name": "plan", "node": null}),
            ),
        ];
        for (kind, wire) in cases {
            assert_eq!(serde_json::to_value(&kind).unwrap(), wire);
        }
    }

    #[test]
    fn a_wire_step_that_is_no_known_step_is_refused_with_the_reason() {
        register(&[STEPS]);
        let cases = [
            (
                "workers",
                "dran",
                Some("w1"),
                "no upgrade step has this name",
            ),
            ("workers", "drain", None, "this step needs a node"),
            ("preflight", "drain", Some("w1"), "control-plane or workers"),
            (
                "workers",
                "etcd-snapshot",
                None,
                "belongs to stage snapshot",
            ),
            ("preflight", "nodes-ready", Some("w1"), "takes no node"),
            ("bogus", "gate", None, "unknown stage"),
            ("", "plan", None, "unknown stage"),
        ];
        for (stage, name, node, why) in cases {
            let wire = StepWire {
                stage: stage.into(),
                name: name.into(),
                node: node.map(str::to_owned),
            };
            let err = StepKind::try_from(wire).unwrap_err().to_string();
            assert!(err.contains(why), "{stage}/{name}: {err}");
        }
    }

    #[test]
    fn labels_leave_out_what_is_repeated() {
        let cases: [(StepKind, &str); 3] = [
            (UpgradeStep::Plan.into(), "plan"),
            (
                UpgradeStep::Containerd { node: "cp".into() }.into(),
                "containerd@cp",
            ),
            (
                UpgradeStep::Gate {
                    stage: Stage::Preflight,
                    node: None,
                }
                .into(),
                "preflight/gate",
            ),
        ];
        for (kind, label) in cases {
            assert_eq!(kind.label(), label);
        }
    }
}
