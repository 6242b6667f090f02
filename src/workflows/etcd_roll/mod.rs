//! Rolling an etcd cluster. Two drivers: `command` (members restarted by an operator's
//! command — VMs, systemd — "at target" decided by a probe command) and `statefulset`
//! (the partition of a StatefulSet's rolling update lowered one ordinal at a time, "at
//! target" = the pod runs the update revision and is Ready). Each step re-reads the
//! cluster and asks the pure planner (`domain::etcd_order`) for the next safe action, so a
//! crashed roll resumes by itself; a sampler records every leadership change meanwhile.

pub mod config;
pub mod intake;
pub mod metrics;
pub mod plan;
pub mod request;
pub mod roll_watch;
pub mod step;
pub mod steps;
pub mod watch;

use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

use crate::domain::etcd_order::{Action, ClusterView, Member, Order, Refusal, next_action};
use crate::domain::facts::agreed_leader;
use crate::ports::StatefulSets;
use crate::ports::{EtcdError, EtcdMembers, Failure, MemberCommand, MemberInfo, MemberStatus};
use crate::workflows::gate::Gate;

/// How members are restarted, and how a member is known to run the target.
#[async_trait::async_trait]
pub trait Driver: Send + Sync {
    /// The restart order the driver imposes.
    fn order(&self) -> Order;
    /// The member's StatefulSet ordinal, when the driver has ordinals.
    fn ordinal(&self, _name: &str) -> Option<u32> {
        None
    }
    /// Before the first step.
    async fn begin(&self) -> Result<(), RollError> {
        Ok(())
    }
    /// Whether member `name` (at `endpoint`) runs the target.
    async fn at_target(&self, name: &str, endpoint: &str) -> Result<bool, RollError>;
    /// Starts moving member `name` onto the target.
    async fn restart(&self, name: &str, endpoint: &str) -> Result<(), RollError>;
    /// After the last step, and after a failure.
    async fn finish(&self) -> Result<(), RollError> {
        Ok(())
    }
}

/// Members restarted by an operator's command, probed by another.
pub struct CommandDriver {
    /// Restarts one member; `ROLLGATE_MEMBER` and `ROLLGATE_ENDPOINT` are set, and
    /// `{name}` / `{endpoint}` are replaced (both validated first).
    pub restart_command: String,
    /// Exits 0 when a member already runs the target revision; same variables.
    pub probe_command: String,
    /// Runs the commands.
    pub runner: Arc<dyn MemberCommand>,
}

impl CommandDriver {
    async fn run(&self, template: &str, name: &str, endpoint: &str) -> Result<bool, RollError> {
        let (name, endpoint) = (safe(name)?, safe(endpoint)?);
        self.runner
            .run(template, name, endpoint)
            .await
            .map_err(RollError::Command)
    }
}

#[async_trait::async_trait]
impl Driver for CommandDriver {
    fn order(&self) -> Order {
        Order::Free
    }

    async fn at_target(&self, name: &str, endpoint: &str) -> Result<bool, RollError> {
        self.run(&self.probe_command, name, endpoint).await
    }

    async fn restart(&self, name: &str, endpoint: &str) -> Result<(), RollError> {
        if self.run(&self.restart_command, name, endpoint).await? {
            Ok(())
        } else {
            Err(RollError::Command(Failure::new(format!(
                "the restart command failed for {name}"
            ))))
        }
    }
}

/// Members that are the pods of a StatefulSet (member name = pod name): the controller
/// restarts the pods at or above the partition, highest ordinal first; rollgate lowers
/// the partition one ordinal at a time.
pub struct StatefulSetDriver {
    /// The Kubernetes API.
    pub api: Arc<dyn StatefulSets>,
    /// The StatefulSet's namespace.
    pub namespace: String,
    pub name: String,
}

impl StatefulSetDriver {
    async fn lock(&self) -> Result<u32, RollError> {
        let sts = self.api.statefulset(&self.namespace, &self.name).await?;
        if sts.partition < sts.replicas {
            self.api
                .set_partition(&self.namespace, &self.name, sts.replicas)
                .await?;
        }
        Ok(sts.replicas)
    }
}

#[async_trait::async_trait]
impl Driver for StatefulSetDriver {
    fn order(&self) -> Order {
        Order::StatefulSet
    }

    fn ordinal(&self, name: &str) -> Option<u32> {
        name.strip_prefix(&self.name)?
            .strip_prefix('-')?
            .parse()
            .ok()
    }

    /// Partition lock: nothing moves until rollgate lowers the partition.
    async fn begin(&self) -> Result<(), RollError> {
        self.lock().await.map(drop)
    }

    async fn at_target(&self, name: &str, _endpoint: &str) -> Result<bool, RollError> {
        let sts = self.api.statefulset(&self.namespace, &self.name).await?;
        let pod = self.api.pod_state(&self.namespace, name).await?;
        Ok(pod.is_some_and(|p| p.ready && p.revision == sts.update_revision))
    }

    async fn restart(&self, name: &str, _endpoint: &str) -> Result<(), RollError> {
        let ordinal = self.ordinal(name).ok_or_else(|| {
            RollError::Refused(Refusal::MissingOrdinal(name.to_owned()).to_string())
        })?;
        self.api
            .set_partition(&self.namespace, &self.name, ordinal)
            .await?;
        Ok(())
    }

    /// Back to partition = replicas, so the lock stays for the next roll.
    async fn finish(&self) -> Result<(), RollError> {
        self.lock().await.map(drop)
    }
}

/// How to roll.
#[derive(Debug, Clone)]
pub struct RollSettings {
    /// How long a restarted member may take to be healthy, at target and caught up.
    pub ready_timeout: Duration,
    /// Pause after a member is back, before the next action.
    pub cooldown: Duration,
    /// How far behind the leader's raft index a member may be.
    pub max_lag: u64,
    /// How long a leadership transfer may take to be confirmed by a majority.
    pub transfer_timeout: Duration,
}

/// What a roll did to leadership, and what it cost.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct RollReport {
    /// Members restarted.
    pub restarted: Vec<String>,
    /// Leadership transfers rollgate made.
    pub transfers: u64,
    /// Leadership changes observed: the raft term's rise across the members.
    pub leadership_changes: u64,
    /// Changes rollgate did not make (elections).
    pub uncontrolled_changes: u64,
    /// The longest time, in milliseconds, no majority agreed on a leader.
    pub longest_leaderless_ms: u64,
}

impl RollReport {
    /// The report of a roll that restarted `restarted` and made `transfers`, while the
    /// highest raft term went from `first_term` to `last_term`: every rise not made by a
    /// transfer was an election.
    pub fn new(
        restarted: Vec<String>,
        transfers: u64,
        first_term: u64,
        last_term: u64,
        longest_leaderless: Duration,
    ) -> Self {
        let leadership_changes = last_term.saturating_sub(first_term);
        Self {
            restarted,
            transfers,
            leadership_changes,
            uncontrolled_changes: leadership_changes.saturating_sub(transfers),
            longest_leaderless_ms: u64::try_from(longest_leaderless.as_millis())
                .unwrap_or(u64::MAX),
        }
    }
}

/// Why a roll stopped.
#[derive(Debug, thiserror::Error)]
pub enum RollError {
    /// The planner refused: the cluster is not safe to touch now.
    #[error("refusing to go on: {0}")]
    Refused(String),
    /// etcd could not be asked.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// A command failed.
    #[error("{0}")]
    Command(#[source] Failure),
    /// A restarted member did not come back in time; nothing else was restarted.
    #[error(
        "member {name} is not healthy, at target and caught up within {within:?}; the roll stops here"
    )]
    NotReady {
        name: String,
        /// The bound.
        within: Duration,
    },
    /// The gate stayed closed (or unknown) too long before a restart.
    #[error(
        "the gate stayed closed for {secs}s before restarting {member}: {blockers}; nothing more was restarted"
    )]
    GateClosed {
        /// The member that was next.
        member: String,
        /// How long the roll waited.
        secs: u64,
        /// What held it.
        blockers: String,
    },
    /// The Kubernetes API failed.
    #[error(transparent)]
    Cluster(#[from] crate::ports::ClusterError),
    /// A member name or endpoint that must not reach a shell.
    #[error("member {0:?} has characters that cannot be passed to a command")]
    Unsafe(String),
}

impl From<Refusal> for RollError {
    fn from(r: Refusal) -> Self {
        RollError::Refused(r.to_string())
    }
}

fn safe(s: &str) -> Result<&str, RollError> {
    let ok = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
    if ok {
        Ok(s)
    } else {
        Err(RollError::Unsafe(s.to_owned()))
    }
}

/// The leader each answering member follows.
fn followed(statuses: &[MemberStatus]) -> impl Iterator<Item = u64> + '_ {
    statuses.iter().map(|s| s.leader)
}

/// The endpoint of `member` among the configured ones.
fn endpoint_of<'a>(member: &MemberInfo, endpoints: &'a [String]) -> Option<&'a String> {
    endpoints.iter().find(|e| {
        member
            .client_urls
            .iter()
            .any(|u| u.trim_end_matches('/') == e.trim_end_matches('/'))
    })
}

/// Each member's client endpoint, by member id.
pub(crate) type Endpoints = HashMap<u64, String>;

/// Reads the cluster into the planner's view, with each member's endpoint.
pub(crate) async fn view(
    etcd: &dyn EtcdMembers,
    driver: &dyn Driver,
) -> Result<(ClusterView, Endpoints), RollError> {
    let members = etcd.members().await?;
    let statuses = etcd.answering().await;
    let mut out = Vec::new();
    let mut endpoints = Endpoints::new();
    for m in &members {
        let endpoint = endpoint_of(m, etcd.endpoints())
            .cloned()
            .unwrap_or_default();
        let status = statuses.iter().find(|s| s.id == m.id);
        let at_target = if endpoint.is_empty() {
            false
        } else {
            driver.at_target(&m.name, &endpoint).await?
        };
        out.push(Member {
            id: m.id,
            name: m.name.clone(),
            ordinal: driver.ordinal(&m.name),
            at_target,
            healthy: status.is_some(),
            raft_index: status.map_or(0, |s| s.raft_index),
        });
        endpoints.insert(m.id, endpoint);
    }
    let leader = agreed_leader(followed(&statuses), members.len());
    Ok((
        ClusterView {
            members: out,
            leader,
        },
        endpoints,
    ))
}

/// What the sampler saw: raft terms and stretches without an agreed leader.
#[derive(Default)]
pub(crate) struct Watch {
    pub(crate) first_term: Option<u64>,
    pub(crate) last_term: u64,
    leaderless_since: Option<Instant>,
    pub(crate) longest_leaderless: Duration,
}

/// Samples the cluster every 50 ms: the highest raft term seen and leaderless stretches.
pub(crate) async fn sample(
    etcd: Arc<dyn EtcdMembers>,
    watch: Arc<Mutex<Watch>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let statuses = etcd.answering().await;
        {
            let mut w = watch.lock().await;
            if let Some(term) = statuses.iter().map(|s| s.raft_term).max() {
                w.first_term.get_or_insert(term);
                w.last_term = w.last_term.max(term);
            }
            match (
                agreed_leader(followed(&statuses), etcd.endpoints().len()),
                w.leaderless_since,
            ) {
                (None, None) => w.leaderless_since = Some(Instant::now()),
                (Some(_), Some(since)) => {
                    w.longest_leaderless = w.longest_leaderless.max(since.elapsed());
                    w.leaderless_since = None;
                }
                _ => {}
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

/// The gate a roll asks before every restart, and how long it may hold the roll.
pub struct RestartGate {
    /// The gate.
    pub gate: Arc<Gate>,
    /// A gate closed this long stops the roll.
    pub halt_after: Duration,
}

impl RestartGate {
    /// Waits until the gate is open; fails closed after `halt_after`.
    async fn wait_open(
        &self,
        member: &str,
        progress: &mut impl FnMut(&str),
    ) -> Result<(), RollError> {
        let started = Instant::now();
        let mut last = Vec::new();
        loop {
            let verdict = self
                .gate
                .evaluate()
                .await
                .verdict_for(crate::workflows::etcd_roll::step::ETCD_ROLL);
            tracing::debug!(?verdict, "gate before a restart");
            if verdict.is_open() {
                return Ok(());
            }
            let reasons = verdict.reasons();
            if reasons != last {
                progress(&format!(
                    "gate closed before restarting {member}: {}",
                    reasons.join("; ")
                ));
                last = reasons;
            }
            if started.elapsed() >= self.halt_after {
                return Err(RollError::GateClosed {
                    member: member.to_owned(),
                    secs: started.elapsed().as_secs(),
                    blockers: last.join("; "),
                });
            }
            tokio::time::sleep(self.gate.poll_interval()).await;
        }
    }
}

/// Rolls every member not at the target, asking `gate` (when given) before every restart.
/// `progress` gets one line per step.
pub async fn roll(
    etcd: Arc<dyn EtcdMembers>,
    driver: &dyn Driver,
    settings: &RollSettings,
    gate: Option<&RestartGate>,
    mut progress: impl FnMut(&str),
) -> Result<RollReport, RollError> {
    let watch = Arc::new(Mutex::new(Watch::default()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(sample(etcd.clone(), watch.clone(), stopped));
    let mut report = RollReport::default();
    let mut result = driver.begin().await;
    if result.is_ok() {
        result = steps(&*etcd, driver, settings, gate, &mut report, &mut progress).await;
    }
    let finished = driver.finish().await;
    let result = result.and(finished);
    let _ = stop.send(true);
    let _ = sampler.await;
    let w = watch.lock().await;
    let report = RollReport::new(
        report.restarted,
        report.transfers,
        w.first_term.unwrap_or(w.last_term),
        w.last_term,
        w.longest_leaderless,
    );
    result.map(|()| report)
}

/// Refuses a roll whose endpoints are not the members' advertised client URLs: a member
/// not asked at its own URL could never be seen at the target.
pub async fn check_endpoints(etcd: &dyn EtcdMembers) -> Result<(), RollError> {
    let members: Vec<(String, Vec<String>)> = etcd
        .members()
        .await?
        .into_iter()
        .map(|m| (m.name, m.client_urls))
        .collect();
    match crate::domain::etcd_order::endpoint_mismatch(etcd.endpoints(), &members) {
        None => Ok(()),
        Some(why) => Err(RollError::Refused(why)),
    }
}

async fn steps(
    etcd: &dyn EtcdMembers,
    driver: &dyn Driver,
    settings: &RollSettings,
    gate: Option<&RestartGate>,
    report: &mut RollReport,
    progress: &mut impl FnMut(&str),
) -> Result<(), RollError> {
    check_endpoints(etcd).await?;
    let mut unsafe_since: Option<(Instant, String)> = None;
    loop {
        let (current, endpoints) = view(etcd, driver).await?;
        let action = match next_action(&current, driver.order(), settings.max_lag) {
            Ok(action) => {
                unsafe_since = None;
                action
            }
            // A member down, no leader, a member behind: possibly passing (a restart in
            // flight when a previous roll died). Wait, touching nothing, then give up.
            Err(refusal) if refusal.may_pass() => {
                let reason = refusal.to_string();
                let since = match &unsafe_since {
                    Some((since, last)) if *last == reason => *since,
                    _ => {
                        progress(&format!("waiting: {reason}"));
                        unsafe_since = Some((Instant::now(), reason.clone()));
                        Instant::now()
                    }
                };
                if since.elapsed() > settings.ready_timeout {
                    return Err(refusal.into());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(refusal) => return Err(refusal.into()),
        };
        match action {
            Action::Done => {
                progress("every member is at the target");
                return Ok(());
            }
            Action::MoveLeader { to, name } => {
                // As in the served roll: the member is asked again right before the move;
                // the next look decides (and waits, or gives up) when it is not fit.
                if let Err(why) = caught_up(etcd, to, settings.max_lag).await {
                    progress(&format!(
                        "not moving leadership: {name} is {why} right before the move"
                    ));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                progress(&format!("moving leadership to {name}"));
                etcd.move_leader(to, settings.transfer_timeout).await?;
                report.transfers += 1;
            }
            Action::Restart { id, name } => {
                let endpoint = endpoints.get(&id).cloned().unwrap_or_default();
                if let Some(gate) = gate {
                    gate.wait_open(&name, progress).await?;
                    // The cluster may have changed while the gate held the roll.
                    if !matches!(
                        next_action(&view(etcd, driver).await?.0, driver.order(), settings.max_lag),
                        Ok(Action::Restart { id: again, .. }) if again == id
                    ) {
                        continue;
                    }
                }
                progress(&format!("restarting {name} ({endpoint})"));
                driver.restart(&name, &endpoint).await?;
                report.restarted.push(name.clone());
                wait_ready(etcd, driver, settings, id, &name).await?;
                if settings.cooldown.is_zero() {
                    progress(&format!("{name} is back, at the target and caught up"));
                } else {
                    progress(&format!(
                        "{name} is back, at the target and caught up; cooling down {:?}",
                        settings.cooldown
                    ));
                    tokio::time::sleep(settings.cooldown).await;
                }
            }
        }
    }
}

/// Waits until the restarted member answers, is caught up with an agreed leader, and
/// its probe says it is at the target. Only that member is probed: the probe may be an
/// ssh round trip, and this loop ticks every 100 ms.
async fn wait_ready(
    etcd: &dyn EtcdMembers,
    driver: &dyn Driver,
    settings: &RollSettings,
    id: u64,
    name: &str,
) -> Result<(), RollError> {
    let started = Instant::now();
    loop {
        if not_ready(etcd, driver, id, name, settings.max_lag)
            .await
            .is_none()
        {
            return Ok(());
        }
        if started.elapsed() > settings.ready_timeout {
            return Err(RollError::NotReady {
                name: name.to_owned(),
                within: settings.ready_timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Why member `id` (`name`) is not yet answering, following the agreed leader, within
/// `max_lag` of its raft index and at the target; `None` when it is: the condition a roll
/// waits on after each restart, instead of a timer. Only that member is probed: the probe may be an ssh
/// round trip.
pub(crate) async fn not_ready(
    etcd: &dyn EtcdMembers,
    driver: &dyn Driver,
    id: u64,
    name: &str,
    max_lag: u64,
) -> Option<String> {
    let status = match caught_up(etcd, id, max_lag).await {
        Ok(status) => status,
        Err(why) => return Some(why),
    };
    match driver.at_target(name, &status.endpoint).await {
        Ok(true) => None,
        Ok(false) => Some("not yet at the target".into()),
        Err(e) => Some(format!("cannot tell whether it is at the target: {e}")),
    }
}

/// Member `id`'s status when it answers now, follows the agreed leader and trails it by at
/// most `max_lag` entries; else why not.
pub(crate) async fn caught_up(
    etcd: &dyn EtcdMembers,
    id: u64,
    max_lag: u64,
) -> Result<MemberStatus, String> {
    let statuses = etcd.answering().await;
    let Some(status) = statuses.iter().find(|s| s.id == id) else {
        return Err("not answering".into());
    };
    let Some(leader) = agreed_leader(followed(&statuses), etcd.endpoints().len())
        .and_then(|l| statuses.iter().find(|s| s.id == l))
    else {
        return Err("no agreed leader".into());
    };
    if status.leader != leader.id {
        return Err(format!(
            "follows {:x}, not the agreed leader {:x}",
            status.leader, leader.id
        ));
    }
    if status.raft_index + max_lag < leader.raft_index {
        return Err(format!(
            "raft index {} behind the leader's {}",
            status.raft_index, leader.raft_index
        ));
    }
    Ok(status.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_reach_a_shell() {
        for ok in ["etcd-0", "m1", "http://127.0.0.1:2379", "node_a.example"] {
            assert!(safe(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "a b", "x;reboot", "$(id)", "`id`", "a|b", "a&b", "a'b", "a\nb",
        ] {
            assert!(safe(bad).is_err(), "{bad:?}");
        }
    }
}
