//! The steps of an etcd roll, as data.

use crate::domain::run_kind::RunKind;
use crate::domain::step::{StepError, StepRole, WorkflowStep};
use crate::domain::step_kind::StepType;

/// The kind of an etcd roll's runs.
pub const ETCD_ROLL: RunKind = RunKind::new("etcd-roll");

/// The stage name of every step of an etcd roll.
pub const ETCD_ROLL_STAGE: &str = "etcd-roll";

/// The etcd roll's step type, for `workflows::register`.
pub const STEPS: StepType = StepType {
    run_kind: ETCD_ROLL,
    parse: |stage, name, member| {
        EtcdRollStep::from_wire(stage, name, member).map(|r| r.map(Into::into))
    },
};

/// A step of an etcd roll. The roll is planned one action at a time: `Next` reads the
/// cluster and appends the steps of the next action, ending with another `Next`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EtcdRollStep {
    /// Partition lock and the first look: refuses a cluster that is not safe to touch.
    Begin,
    /// Reads the cluster and plans the next action.
    Next,
    /// Waits for the gate to open before `member` is restarted.
    Gate {
        /// The member about to be restarted.
        member: String,
    },
    /// Starts moving `member` onto the target.
    Restart { member: String },
    /// Waits until `member` is healthy, at the target and caught up.
    Ready { member: String },
    /// Pause after `member` before the next action.
    Cooldown {
        /// The member restarted last.
        member: String,
    },
    /// Moves leadership to `member`.
    Transfer {
        /// The member that receives leadership.
        member: String,
    },
    /// Restores the partition lock and reports.
    Finish,
}

impl EtcdRollStep {
    /// The step's name on the wire, e.g. `etcd-restart`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Begin => "etcd-begin",
            Self::Next => "etcd-next",
            Self::Gate { .. } => "gate",
            Self::Restart { .. } => "etcd-restart",
            Self::Ready { .. } => "etcd-ready",
            Self::Cooldown { .. } => "etcd-cooldown",
            Self::Transfer { .. } => "etcd-transfer",
            Self::Finish => "etcd-finish",
        }
    }

    /// The member the step acts on, if any.
    pub fn member(&self) -> Option<&str> {
        match self {
            Self::Gate { member }
            | Self::Restart { member }
            | Self::Ready { member }
            | Self::Cooldown { member }
            | Self::Transfer { member } => Some(member),
            Self::Begin | Self::Next | Self::Finish => None,
        }
    }

    /// The step `name`/`member` describe.
    pub fn parse(name: &str, member: Option<String>) -> Result<Self, StepError> {
        let has_member = member.is_some();
        let wrong = |why: &str| StepError::new(ETCD_ROLL_STAGE, name, why);
        let member_of =
            |member: Option<String>| member.ok_or_else(|| wrong("this step needs a member"));
        let on_member: Option<fn(String) -> Self> = match name {
            "gate" => Some(|member| Self::Gate { member }),
            "etcd-restart" => Some(|member| Self::Restart { member }),
            "etcd-ready" => Some(|member| Self::Ready { member }),
            "etcd-cooldown" => Some(|member| Self::Cooldown { member }),
            "etcd-transfer" => Some(|member| Self::Transfer { member }),
            _ => None,
        };
        let step = match (name, on_member) {
            (_, Some(make)) => make(member_of(member)?),
            ("etcd-begin", _) => Self::Begin,
            ("etcd-next", _) => Self::Next,
            ("etcd-finish", _) => Self::Finish,
            _ => return Err(wrong("no etcd roll step has this name")),
        };
        if step.member().is_none() && has_member {
            return Err(wrong("this step takes no member"));
        }
        Ok(step)
    }
}

impl EtcdRollStep {
    /// The step a stored `stage`/`name`/`member` describes; `None` for another stage.
    pub fn from_wire(
        stage: &str,
        name: &str,
        member: Option<String>,
    ) -> Option<Result<Self, StepError>> {
        (stage == ETCD_ROLL_STAGE).then(|| Self::parse(name, member))
    }
}

impl WorkflowStep for EtcdRollStep {
    fn name(&self) -> &'static str {
        EtcdRollStep::name(self)
    }

    fn stage_name(&self) -> &'static str {
        ETCD_ROLL_STAGE
    }

    fn node(&self) -> Option<&str> {
        self.member()
    }

    fn run_kind(&self) -> RunKind {
        ETCD_ROLL
    }

    fn role(&self) -> StepRole {
        match self {
            Self::Gate { .. } => StepRole::Gate,
            _ => StepRole::Work,
        }
    }

    fn waits_for_window(&self) -> bool {
        matches!(self, Self::Gate { .. } | Self::Transfer { .. })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::step_kind::{StepKind, StepWire, register};

    /// Every step an etcd roll can have.
    pub(crate) fn every_step() -> Vec<StepKind> {
        let member = || "etcd-0".to_owned();
        vec![
            EtcdRollStep::Begin.into(),
            EtcdRollStep::Next.into(),
            EtcdRollStep::Gate { member: member() }.into(),
            EtcdRollStep::Restart { member: member() }.into(),
            EtcdRollStep::Ready { member: member() }.into(),
            EtcdRollStep::Cooldown { member: member() }.into(),
            EtcdRollStep::Transfer { member: member() }.into(),
            EtcdRollStep::Finish.into(),
        ]
    }

    #[test]
    fn the_wire_form_is_the_flat_shape_and_a_wrong_one_is_refused_with_the_reason() {
        register(&[STEPS]);
        let restart: StepKind = EtcdRollStep::Restart {
            member: "etcd-2".into(),
        }
        .into();
        assert_eq!(
            serde_json::to_value(&restart).unwrap(),
            serde_json::json!({"stage": "etcd-roll", "name": "etcd-restart", "node": "etcd-2"})
        );
        assert_eq!(
            StepKind::from(EtcdRollStep::Finish).label(),
            "etcd-roll/etcd-finish"
        );
        let cases = [
            ("etcd-restart", None, "needs a member"),
            ("etcd-begin", Some("m"), "takes no member"),
            ("drain", Some("m"), "no etcd roll step"),
        ];
        for (name, member, why) in cases {
            let wire = StepWire {
                stage: ETCD_ROLL_STAGE.into(),
                name: name.into(),
                node: member.map(str::to_owned),
            };
            let err = StepKind::try_from(wire).unwrap_err().to_string();
            assert!(err.contains(why), "{name}: {err}");
        }
    }

    #[test]
    fn the_gate_and_the_leadership_move_wait_for_a_window_and_the_rest_does_not() {
        let cases = [
            (EtcdRollStep::Gate { member: "m".into() }, true),
            (EtcdRollStep::Transfer { member: "m".into() }, true),
            (EtcdRollStep::Ready { member: "m".into() }, false),
            (EtcdRollStep::Restart { member: "m".into() }, false),
        ];
        for (step, want) in cases {
            assert_eq!(step.waits_for_window(), want, "{step:?}");
        }
    }
}
