//! The control planes' cycle, acted for every workflow that touches them one at a time (an
//! upgrade, a reboot): etcd's health before the first, the `next` step that decides the
//! next control plane (or the one leadership move) from the cluster as it is, the health
//! checks between control planes, the leadership move itself, and the report of what the
//! stage did to etcd leadership. What "touching" a control plane means is the workflow's.

pub mod plan;

use chrono::Utc;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use crate::domain::distribution::Distribution;
use crate::domain::engine::StepOutcome;
use crate::domain::etcd_order::Refusal;
use crate::domain::facts::agreed_leader;
use crate::domain::run::{Learned, Run, Step};
use crate::domain::version::Version;
use crate::error_chain;
use crate::metrics::Metrics;
use crate::ports::{ClusterRead, EtcdError, EtcdMembers};
use crate::workflows::control_plane_cycle::plan::{
    self as cps, EtcdFacts, EtcdLayout, EtcdMemberFacts, NextControlPlane, Unhealthy,
};
use crate::workflows::etcd_roll::caught_up;
use crate::workflows::etcd_roll::metrics::EtcdRollMetrics;
use crate::workflows::k8s_upgrade::plan::{ClusterFacts, NodeFacts};

/// The label the control-plane stages carry in the `etcd_roll_*` metrics.
pub const METRICS_TARGET: &str = "control-plane";

/// How long the control planes may take, from the configuration.
#[derive(Debug, Clone)]
pub struct ControlPlaneSettings {
    /// How long the control planes may stay unhealthy before the run halts.
    pub health_timeout: Duration,
    /// How long an etcd leadership move may take to be confirmed by a majority.
    pub transfer_timeout: Duration,
    /// How far a member may trail the leader's raft index before anything is touched.
    pub etcd_max_lag: u64,
    /// The distribution: how its etcd members are named, whether its control plane runs
    /// as static pods.
    pub distribution: Distribution,
}

/// The ports the control planes' cycle reads and moves.
#[derive(Clone)]
pub struct ControlPlaneCycle {
    /// Reads nodes and static pods.
    pub cluster: Arc<dyn ClusterRead>,
    /// The cluster's etcd: health, leadership; `None` when no endpoint is configured.
    pub etcd: Option<Arc<dyn EtcdMembers>>,
    /// Timeouts and bounds.
    pub settings: ControlPlaneSettings,
    /// Where it counts leadership changes.
    pub metrics: Metrics,
}

/// The cluster and etcd as they are now.
pub struct Now {
    /// The nodes.
    pub facts: ClusterFacts,
    /// etcd, when configured.
    pub etcd: Option<EtcdFacts>,
    /// How etcd sits beside the control planes.
    pub layout: EtcdLayout,
}

impl Now {
    /// The next control plane to touch, `pending` saying which still need it.
    pub fn next(
        &self,
        pending: &dyn Fn(&NodeFacts) -> bool,
        max_lag: u64,
    ) -> Result<NextControlPlane, Refusal> {
        let cps = cps::control_planes(&self.facts.nodes);
        cps::next_in_order(&cps, self.layout, self.etcd.as_ref(), pending, max_lag)
    }
}

/// What etcd says about itself: the member list, each member's own status, the leader a
/// majority follows, and the alarms. Each member is named after its node, as
/// `distribution` names them (k3s's `server-1-3f2a9c1d` is `server-1`'s).
pub async fn read_etcd(
    etcd: &dyn EtcdMembers,
    distribution: Distribution,
) -> Result<EtcdFacts, EtcdError> {
    let members = etcd.members().await?;
    let statuses = etcd.answering().await;
    let alarms = etcd.alarms().await?;
    let leader = agreed_leader(statuses.iter().map(|s| s.leader), members.len());
    let members = members
        .into_iter()
        .map(|m| {
            let status = statuses.iter().find(|s| s.id == m.id);
            EtcdMemberFacts {
                id: m.id,
                name: distribution.member_node(&m.name).to_owned(),
                answering: status.is_some(),
                raft_index: status.map_or(0, |s| s.raft_index),
                raft_term: status.map_or(0, |s| s.raft_term),
            }
        })
        .collect();
    Ok(EtcdFacts {
        members,
        leader,
        alarms,
    })
}

fn lines(problems: &[Unhealthy]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Replans the rest of the control-plane stage from `next_step`.
fn replan(note: String, next_step: Step) -> StepOutcome {
    StepOutcome::Replanned {
        note,
        steps: vec![next_step],
    }
}

impl ControlPlaneCycle {
    /// etcd as it is now, `None` when no endpoint is configured.
    pub async fn etcd_facts(&self) -> Result<Option<EtcdFacts>, String> {
        match &self.etcd {
            None => Ok(None),
            Some(etcd) => read_etcd(&**etcd, self.settings.distribution)
                .await
                .map(Some)
                .map_err(|e| error_chain(&e)),
        }
    }

    /// The nodes and etcd, re-read before every control-plane action.
    pub async fn now(&self) -> Result<Now, StepOutcome> {
        let facts = self
            .cluster
            .facts()
            .await
            .map_err(|e| StepOutcome::retry(error_chain(&e)))?;
        let etcd = self.etcd_facts().await.map_err(StepOutcome::retry)?;
        let layout = cps::layout(&cps::control_planes(&facts.nodes), etcd.as_ref())
            .map_err(StepOutcome::failed)?;
        Ok(Now {
            facts,
            etcd,
            layout,
        })
    }

    fn poll(&self) -> chrono::Duration {
        let poll = (self.settings.health_timeout / 30)
            .clamp(Duration::from_millis(200), Duration::from_secs(10));
        chrono::Duration::from_std(poll).unwrap_or_default()
    }

    /// Waits on `problems` that may pass, up to the health timeout; then, or at once for
    /// those that will not pass, fails with `what` and the problems.
    fn unhealthy(&self, step: &Step, problems: &[Unhealthy], what: &str) -> StepOutcome {
        let timeout = self.settings.health_timeout;
        if problems.iter().all(Unhealthy::may_pass) && !crate::clock::over(step, timeout) {
            return StepOutcome::Wait {
                until: Utc::now() + self.poll(),
                reason: format!("waiting: {}", lines(problems)),
            };
        }
        let waited = if problems.iter().all(Unhealthy::may_pass) {
            format!(" for {}s", timeout.as_secs())
        } else {
            String::new()
        };
        StepOutcome::failed(format!("{}{waited}; {what}", lines(problems)))
    }

    /// Before any control plane: etcd healthy, no alarm; records the raft term the run
    /// starts from.
    pub async fn etcd_healthy(&self, step: &Step) -> StepOutcome {
        let etcd = match self.etcd_facts().await {
            Ok(Some(etcd)) => etcd,
            Ok(None) => return StepOutcome::done("etcd.endpoints is not set: not checked"),
            Err(e) => return StepOutcome::retry(e),
        };
        let problems = cps::etcd_problems(&etcd, self.settings.etcd_max_lag);
        if !problems.is_empty() {
            return self.unhealthy(step, &problems, "refusing to start: no node was touched");
        }
        let term = etcd.term();
        StepOutcome::learned(
            format!(
                "etcd healthy: {} members, leader {}, raft term {term}, no alarm",
                etcd.members.len(),
                etcd.leader_name().unwrap_or_default()
            ),
            Learned::EtcdStartTerm(term),
        )
    }

    /// The `next` step's outcome from what was decided on `now`: the decided action's
    /// steps in place of the stage's rest, the stage's report once none is pending
    /// (`touched`: the control planes the run `verb`, e.g. upgraded), a wait while a
    /// refusal may pass.
    pub fn decided<A: fmt::Display>(
        &self,
        run: &Run,
        step: &Step,
        now: &Now,
        decided: Result<Option<(A, Vec<Step>)>, Refusal>,
        (verb, touched): (&str, &[String]),
    ) -> StepOutcome {
        match decided {
            Ok(None) => StepOutcome::Replanned {
                note: self.report(run, now.layout, now.etcd.as_ref(), verb, touched),
                steps: Vec::new(),
            },
            Ok(Some((action, steps))) => {
                info!(run_id = %run.id, %action, "next control-plane action");
                StepOutcome::Replanned {
                    note: action.to_string(),
                    steps,
                }
            }
            Err(refusal)
                if refusal.may_pass()
                    && !crate::clock::over(step, self.settings.health_timeout) =>
            {
                StepOutcome::Wait {
                    until: Utc::now() + self.poll(),
                    reason: format!("waiting: {refusal}"),
                }
            }
            Err(refusal) => {
                StepOutcome::failed(format!("{refusal}; no further control plane was touched"))
            }
        }
    }

    /// What the control-plane stage did to etcd leadership; counted into the metrics.
    fn report(
        &self,
        run: &Run,
        layout: EtcdLayout,
        etcd: Option<&EtcdFacts>,
        verb: &str,
        touched: &[String],
    ) -> String {
        let order = format!("control planes {verb}: [{}]", touched.join(", "));
        let (Some(etcd), Some(start)) = (etcd, run.memory.etcd_start_term) else {
            return format!("{order}; etcd {layout}: leadership not tracked");
        };
        let moves = &run.memory.leader_moves;
        let changes = etcd.term().saturating_sub(start);
        let uncontrolled = changes.saturating_sub(moves.len() as u64);
        if layout == EtcdLayout::Stacked {
            let m = self.metrics.set::<EtcdRollMetrics>();
            m.rolls.with_label_values(&[METRICS_TARGET]).inc();
            m.restarts
                .with_label_values(&[METRICS_TARGET])
                .inc_by(touched.len() as u64);
            m.leadership_changes
                .with_label_values(&[METRICS_TARGET])
                .inc_by(changes);
            m.transfers
                .with_label_values(&[METRICS_TARGET])
                .inc_by(moves.len() as u64);
            m.uncontrolled_changes
                .with_label_values(&[METRICS_TARGET])
                .inc_by(uncontrolled);
        }
        if uncontrolled > 0 {
            warn!(run_id = %run.id, uncontrolled, "etcd leadership changed without a transfer during the control-plane stage");
        }
        format!(
            "{order}; etcd {layout}: raft term {start} -> {}: {changes} leadership change(s), transfers {} [{}], uncontrolled {uncontrolled}",
            etcd.term(),
            moves.len(),
            moves.join("; ")
        )
    }

    /// The control planes are healthy before (`after: false`) or after `node` is touched;
    /// with a `target`, a touched node's static pods run it. Before: a node whose member
    /// leads now is decided again (`next_step`) rather than touched.
    pub async fn healthy(
        &self,
        step: &Step,
        node: &str,
        after: bool,
        target: Option<Version>,
        next_step: Step,
    ) -> StepOutcome {
        let now = match self.now().await {
            Ok(now) => now,
            Err(outcome) => return outcome,
        };
        let cps = cps::control_planes(&now.facts.nodes);
        let stacked_leader = match (&now.etcd, now.layout) {
            (Some(etcd), EtcdLayout::Stacked) if etcd.members.len() > 1 => etcd.leader_name(),
            _ => None,
        };
        if !after && stacked_leader.as_deref() == Some(node) {
            return replan(
                format!("{node}'s etcd member leads now: deciding again before it is touched"),
                next_step,
            );
        }
        let mut pods = Vec::new();
        for cp in &cps {
            match self.cluster.static_pods(&cp.name).await {
                Ok(found) => pods.extend(found),
                Err(e) => return StepOutcome::retry(error_chain(&e)),
            }
        }
        let max_lag = self.settings.etcd_max_lag;
        let static_pods = self.settings.distribution.has_static_pods();
        let problems = cps::problems(
            &cps,
            static_pods.then_some(pods.as_slice()),
            now.layout,
            now.etcd.as_ref(),
            target,
            max_lag,
        );
        if problems.is_empty() {
            return StepOutcome::done(format!(
                "{} control plane(s) Ready with their static pods; etcd {}{}",
                cps.len(),
                now.layout,
                now.etcd.as_ref().map_or(String::new(), |e| format!(
                    ": {} members answer, leader {}, no alarm, none lagging",
                    e.members.len(),
                    e.leader_name().unwrap_or_default()
                ))
            ));
        }
        let what = if after {
            format!("after {node}: no further control plane was touched")
        } else {
            format!("before {node}: it was not touched")
        };
        self.unhealthy(step, &problems, &what)
    }

    /// Moves etcd leadership to `node`'s member, unless the cluster as it is `now` no
    /// longer needs it (`pending`: the control planes still to touch); otherwise decides
    /// again from `next_step`.
    pub async fn move_leader(
        &self,
        now: &Now,
        node: &str,
        pending: &(dyn Fn(&NodeFacts) -> bool + Sync),
        next_step: Step,
    ) -> StepOutcome {
        let (Some(etcd), Some(client)) = (&now.etcd, &self.etcd) else {
            return replan("etcd is not configured: nothing to move".into(), next_step);
        };
        let Some(member) = etcd.members.iter().find(|m| m.name == node) else {
            return replan(format!("{node} has no etcd member any more"), next_step);
        };
        let from = etcd.leader_name().unwrap_or_default();
        if etcd.leader == Some(member.id) {
            // Moved before a restart of rollgate could record it.
            return StepOutcome::learned(
                format!("{node} leads"),
                Learned::LeaderMoved(format!("-> {node} (found done after a restart)")),
            );
        }
        match now.next(pending, self.settings.etcd_max_lag) {
            Ok(NextControlPlane::MoveLeader { to, .. }) if to == node => {
                // `now` was read before the cluster's nodes: the member is asked again
                // right before the move (see the etcd roll's transfer for why).
                if let Err(why) =
                    caught_up(client.as_ref(), member.id, self.settings.etcd_max_lag).await
                {
                    return replan(
                        format!(
                            "not moving leadership: {node}'s member is {why} right before the move"
                        ),
                        next_step,
                    );
                }
                match client
                    .move_leader(member.id, self.settings.transfer_timeout)
                    .await
                {
                    Ok(()) => {
                        info!(%from, to = %node, "etcd leadership moved");
                        StepOutcome::learned(
                            format!("etcd leadership moved {from} -> {node}"),
                            Learned::LeaderMoved(format!("{from} -> {node}")),
                        )
                    }
                    Err(e) => StepOutcome::retry(error_chain(&e)),
                }
            }
            Ok(other) => replan(format!("not moving leadership; now: {other}"), next_step),
            Err(refusal) => replan(format!("not moving leadership: {refusal}"), next_step),
        }
    }
}
