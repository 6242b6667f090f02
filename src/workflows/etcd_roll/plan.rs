//! An etcd roll run's steps: each action of the restart order (`domain::etcd_order`)
//! becomes short steps, ending with the `next` that plans the one after.

use super::request::EtcdRollRequest;
use super::step::EtcdRollStep;
use crate::domain::etcd_order::Action;
use crate::domain::run::{FailurePolicy, Run};
use crate::domain::run::{Step, StepStatus};
use chrono::{DateTime, Utc};

/// The steps a new roll run starts with. The run is planned one action at a time: `next`
/// reads the cluster and appends the steps of the next action, ending with another `next`,
/// so each step is short and a restarted rollgate picks up from the cluster as it is.
pub fn initial_steps() -> Vec<Step> {
    vec![
        Step::new(EtcdRollStep::Begin),
        Step::new(EtcdRollStep::Next),
    ]
}

/// The steps that carry out `action`, ending with the `next` that plans the one after.
/// Every restart is preceded by a gate.
pub fn steps_for(action: &Action) -> Vec<Step> {
    let steps = match action {
        Action::Done => vec![EtcdRollStep::Finish],
        Action::MoveLeader { name, .. } => vec![
            EtcdRollStep::Transfer {
                member: name.clone(),
            },
            EtcdRollStep::Next,
        ],
        Action::Restart { name, .. } => {
            let member = || name.clone();
            vec![
                EtcdRollStep::Gate { member: member() },
                EtcdRollStep::Restart { member: member() },
                EtcdRollStep::Ready { member: member() },
                EtcdRollStep::Cooldown { member: member() },
                EtcdRollStep::Next,
            ]
        }
    };
    steps.into_iter().map(Step::new).collect()
}

/// What a roll run did, counted from its steps (so it survives restarts of rollgate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Members restarted, in order.
    pub restarted: Vec<String>,
    /// Leadership transfers made.
    pub transfers: u64,
}

/// Counts the restarts and transfers that are done in `done_steps`.
pub fn tally<'a>(done_steps: impl IntoIterator<Item = &'a Step>) -> Tally {
    let mut tally = Tally::default();
    for s in done_steps {
        if s.status != StepStatus::Done {
            continue;
        }
        match s.kind.get::<EtcdRollStep>() {
            Some(EtcdRollStep::Restart { member }) => tally.restarted.push(member.clone()),
            Some(EtcdRollStep::Transfer { .. }) => tally.transfers += 1,
            _ => {}
        }
    }
    tally
}

/// A new etcd roll run: `begin`, then `next`, which plans one action at a time.
pub fn new_run(
    id: String,
    request: &EtcdRollRequest,
    on_failure: FailurePolicy,
    now: DateTime<Utc>,
) -> Run {
    Run::new(
        id,
        crate::workflows::etcd_roll::step::ETCD_ROLL,
        request.to_json(),
        Some(request.target()),
        initial_steps(),
        now,
        "accepted",
    )
    .failing(on_failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_action_becomes_short_steps_and_a_gate_precedes_every_restart() {
        let names = |steps: Vec<Step>| steps.iter().map(Step::label).collect::<Vec<_>>();
        assert_eq!(
            names(initial_steps()),
            ["etcd-roll/etcd-begin", "etcd-roll/etcd-next"]
        );
        let restart = Action::Restart {
            id: 1,
            name: "etcd-2".into(),
        };
        assert_eq!(
            names(steps_for(&restart)),
            [
                "etcd-roll/gate@etcd-2",
                "etcd-roll/etcd-restart@etcd-2",
                "etcd-roll/etcd-ready@etcd-2",
                "etcd-roll/etcd-cooldown@etcd-2",
                "etcd-roll/etcd-next"
            ]
        );
        let transfer = Action::MoveLeader {
            to: 1,
            name: "etcd-0".into(),
        };
        assert_eq!(
            names(steps_for(&transfer)),
            ["etcd-roll/etcd-transfer@etcd-0", "etcd-roll/etcd-next"]
        );
        assert_eq!(names(steps_for(&Action::Done)), ["etcd-roll/etcd-finish"]);
    }

    #[test]
    fn the_tally_counts_only_done_restarts_and_transfers() {
        let mut all: Vec<Step> = steps_for(&Action::Restart {
            id: 1,
            name: "etcd-2".into(),
        });
        all.extend(steps_for(&Action::MoveLeader {
            to: 1,
            name: "etcd-2".into(),
        }));
        all.extend(steps_for(&Action::Restart {
            id: 2,
            name: "etcd-1".into(),
        }));
        for s in &mut all[..6] {
            s.status = StepStatus::Done;
        }
        // The second restart is in hand, not done.
        all[7].status = StepStatus::Running;
        assert_eq!(
            tally(&all),
            Tally {
                restarted: vec!["etcd-2".into()],
                transfers: 1
            }
        );
    }
}
