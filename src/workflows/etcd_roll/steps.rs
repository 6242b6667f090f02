//! The steps of an etcd roll run inside `serve` (`POST /v1/etcd-rolls`, AMQP
//! `etcd-rolls`). The roll is planned one action at a time (`workflows::etcd_roll::plan::steps_for`)
//! and each step is short: a restart lowers the partition and returns, the wait for the
//! member is a step that polls and yields to the queue, so the worker keeps taking alerts
//! while a member comes back. Every step reads the cluster again before it acts, so a
//! step run twice after a crash does no harm: a member already at the target is not
//! restarted again, and nothing is restarted while any member is down.

use chrono::Utc;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

use super::request::EtcdRollRequest;
use super::step::EtcdRollStep;
use crate::domain::engine::StepOutcome;
use crate::domain::etcd_order::{Action, ClusterView, Member, Refusal, next_action};
use crate::domain::run::{Learned, Run, Step};
use crate::metrics::Metrics;
use crate::ports::{EtcdConnect, EtcdError, EtcdMembers, StatefulSets, StepExecutor};
use crate::workflows::etcd_roll::plan::{steps_for, tally};
use crate::workflows::etcd_roll::{
    Driver, Endpoints, RollError, RollReport, StatefulSetDriver, Watch, caught_up, check_endpoints,
    not_ready, sample, view,
};

/// How long a `ready` step polls before it yields to the queue.
const READY_POLL: Duration = Duration::from_secs(3);
/// When a `ready` or `next` step that yielded runs again.
const RECHECK: Duration = Duration::from_millis(500);
/// A sampler with no step of its run executed for this long stops (a halted run).
const SAMPLER_IDLE: Duration = Duration::from_secs(600);

struct Sampler {
    watch: Arc<tokio::sync::Mutex<Watch>>,
    stop: tokio::sync::watch::Sender<bool>,
    touched: Instant,
}

/// Executes the steps of etcd roll runs.
pub struct EtcdRollSteps {
    /// StatefulSets and their pods.
    pub api: Arc<dyn StatefulSets>,
    /// Opens a client of the members a roll names.
    pub connect: Arc<dyn EtcdConnect>,
    /// How long a leadership transfer may take to be confirmed by a majority.
    pub transfer_timeout: Duration,
    /// Where it counts what it does.
    pub metrics: Metrics,
    clients: Mutex<HashMap<String, Arc<dyn EtcdMembers>>>,
    samplers: Mutex<HashMap<String, Sampler>>,
}

fn retry(error: impl std::error::Error + 'static) -> StepOutcome {
    StepOutcome::retry(crate::error_chain(&error))
}

fn wait(reason: String) -> StepOutcome {
    StepOutcome::Wait {
        until: Utc::now() + chrono::Duration::from_std(RECHECK).unwrap_or_default(),
        reason,
    }
}

impl EtcdRollSteps {
    /// Steps over `api`, reaching members through `connect`.
    pub fn new(
        api: Arc<dyn StatefulSets>,
        connect: Arc<dyn EtcdConnect>,
        transfer_timeout: Duration,
        metrics: Metrics,
    ) -> Self {
        Self {
            api,
            connect,
            transfer_timeout,
            metrics,
            clients: Mutex::new(HashMap::new()),
            samplers: Mutex::new(HashMap::new()),
        }
    }

    fn etcd(
        &self,
        run: &Run,
        request: &EtcdRollRequest,
    ) -> Result<Arc<dyn EtcdMembers>, EtcdError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(etcd) = clients.get(&run.id) {
            return Ok(etcd.clone());
        }
        let etcd = self.connect.connect(&request.endpoints)?;
        clients.insert(run.id.clone(), etcd.clone());
        Ok(etcd)
    }

    /// Keeps a sampler of leadership running for `run` while its steps run.
    fn watch(&self, run: &Run, etcd: &Arc<dyn EtcdMembers>) -> Arc<tokio::sync::Mutex<Watch>> {
        let mut samplers = self.samplers.lock().unwrap_or_else(|e| e.into_inner());
        samplers.retain(|_, s| {
            let alive = s.touched.elapsed() < SAMPLER_IDLE && !s.stop.is_closed();
            if !alive {
                let _ = s.stop.send(true);
            }
            alive
        });
        let sampler = samplers.entry(run.id.clone()).or_insert_with(|| {
            let watch = Arc::new(tokio::sync::Mutex::new(Watch::default()));
            let (stop, stopped) = tokio::sync::watch::channel(false);
            tokio::spawn(sample(etcd.clone(), watch.clone(), stopped));
            Sampler {
                watch,
                stop,
                touched: Instant::now(),
            }
        });
        sampler.touched = Instant::now();
        sampler.watch.clone()
    }

    fn forget(&self, run: &Run) {
        if let Some(s) = self
            .samplers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&run.id)
        {
            let _ = s.stop.send(true);
        }
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&run.id);
    }

    async fn begin(
        &self,
        etcd: &dyn EtcdMembers,
        driver: &StatefulSetDriver,
        max_lag: u64,
    ) -> StepOutcome {
        match check_endpoints(etcd).await {
            Err(RollError::Refused(why)) => {
                return StepOutcome::failed(format!(
                    "refusing to start the roll: {why}; nothing was restarted"
                ));
            }
            Err(e) => return retry(e),
            Ok(()) => {}
        }
        if let Err(e) = driver.begin().await {
            return retry(e);
        }
        let (current, _) = match view(etcd, driver).await {
            Ok(v) => v,
            Err(e) => return retry(e),
        };
        // Before anything restarts, every precondition must hold now: no waiting here.
        let action = match next_action(&current, driver.order(), max_lag) {
            Ok(action) => action,
            Err(refusal) => {
                return StepOutcome::failed(format!(
                    "refusing to start the roll: {refusal}; nothing was restarted"
                ));
            }
        };
        let term = highest_term(etcd).await;
        let pending = current.members.iter().filter(|m| !m.at_target).count();
        let leader = current
            .members
            .iter()
            .find(|m| Some(m.id) == current.leader)
            .map_or("-", |m| m.name.as_str());
        StepOutcome::learned(
            format!(
                "raft term {term} at the start; leader {leader}; {} members, {pending} to roll; partition locked; first: {}",
                current.members.len(),
                describe(&action)
            ),
            Learned::EtcdStartTerm(term),
        )
    }

    async fn next(
        &self,
        etcd: &dyn EtcdMembers,
        driver: &StatefulSetDriver,
        step: &Step,
        request: &EtcdRollRequest,
    ) -> StepOutcome {
        let (current, _) = match view(etcd, driver).await {
            Ok(v) => v,
            Err(e) => return retry(e),
        };
        match next_action(&current, driver.order(), request.max_lag) {
            Ok(action) => StepOutcome::Planned {
                note: describe(&action),
                steps: steps_for(&action),
            },
            Err(refusal)
                if refusal.may_pass()
                    && !crate::clock::over(
                        step,
                        Duration::from_secs(request.ready_timeout_secs),
                    ) =>
            {
                wait(format!("waiting: {refusal}"))
            }
            Err(refusal) => StepOutcome::failed(format!(
                "{refusal}; nothing more was restarted (for {}s)",
                request.ready_timeout_secs
            )),
        }
    }

    async fn restart(
        &self,
        etcd: &dyn EtcdMembers,
        driver: &StatefulSetDriver,
        request: &EtcdRollRequest,
        member: &str,
    ) -> StepOutcome {
        let (current, endpoints, m) = match look_at(etcd, driver, member).await {
            Ok(v) => v,
            Err(outcome) => return outcome,
        };
        if m.at_target && m.healthy {
            return StepOutcome::done(format!("{member} already runs the target"));
        }
        match next_action(&current, driver.order(), request.max_lag) {
            Ok(Action::Restart { id, .. }) if id == m.id => {
                let endpoint = endpoints.get(&id).map_or("", String::as_str);
                match driver.restart(member, endpoint).await {
                    Ok(()) => {
                        info!(%member, "restarting");
                        StepOutcome::done(format!(
                            "partition lowered to {member}: the controller restarts it"
                        ))
                    }
                    Err(e) => retry(e),
                }
            }
            // Restarted before rollgate itself restarted: it is the one down.
            Err(Refusal::Unhealthy(down)) if down == [member] => {
                StepOutcome::done(format!("{member} is already restarting"))
            }
            Ok(other) => replan(format!(
                "the cluster changed while the gate held the roll; now: {}",
                describe(&other)
            )),
            Err(refusal) => replan(format!("not restarting {member}: {refusal}")),
        }
    }

    async fn ready(
        &self,
        etcd: &dyn EtcdMembers,
        driver: &StatefulSetDriver,
        step: &Step,
        request: &EtcdRollRequest,
        member: &str,
    ) -> StepOutcome {
        let id = etcd
            .members()
            .await
            .map(|all| all.iter().find(|m| m.name == member).map(|m| m.id));
        let polled = Instant::now();
        let mut state;
        loop {
            state = match &id {
                Ok(Some(id)) => not_ready(etcd, driver, *id, member, request.max_lag).await,
                Ok(None) => Some("not in the member list".into()),
                Err(e) => Some(format!("member list unavailable: {e}")),
            };
            if state.is_none() {
                let took = step
                    .started_at
                    .map_or(0, |s| (Utc::now() - s).num_milliseconds());
                return StepOutcome::done(format!(
                    "{member} is healthy, at the target and caught up ({took} ms)"
                ));
            }
            if polled.elapsed() >= READY_POLL {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let state = state.unwrap_or_default();
        let limit = Duration::from_secs(request.ready_timeout_secs);
        if crate::clock::over(step, limit) {
            return StepOutcome::failed(format!(
                "{}: {state}",
                RollError::NotReady {
                    name: member.to_owned(),
                    within: limit,
                }
            ));
        }
        wait(format!("waiting for {member}: {state}"))
    }

    async fn transfer(
        &self,
        etcd: &dyn EtcdMembers,
        driver: &StatefulSetDriver,
        request: &EtcdRollRequest,
        member: &str,
    ) -> StepOutcome {
        let (current, _, m) = match look_at(etcd, driver, member).await {
            Ok(v) => v,
            Err(outcome) => return outcome,
        };
        if current.leader == Some(m.id) {
            return StepOutcome::done(format!("{member} leads"));
        }
        match next_action(&current, driver.order(), request.max_lag) {
            Ok(Action::MoveLeader { to, .. }) if to == m.id => {
                // The look above may be seconds old (it reads every pod): the member is
                // asked again right before the move. One that stopped answering in
                // between would get the move's TimeoutNow on waking, its log perhaps
                // behind, and start elections that fail.
                if let Err(why) = caught_up(etcd, to, request.max_lag).await {
                    return replan(format!(
                        "not moving leadership: {member} is {why} right before the move"
                    ));
                }
                // A transfer drops proposals in flight ("raft proposal dropped"); clients
                // retry those, and so does this step when the move is not confirmed.
                match etcd.move_leader(to, self.transfer_timeout).await {
                    Ok(()) => StepOutcome::done(format!("leadership moved to {member}")),
                    Err(e) => retry(e),
                }
            }
            Ok(other) => replan(format!("now: {}", describe(&other))),
            Err(refusal) => replan(format!("not moving leadership: {refusal}")),
        }
    }

    async fn finish(
        &self,
        run: &Run,
        etcd: &dyn EtcdMembers,
        driver: &StatefulSetDriver,
        watch: &tokio::sync::Mutex<Watch>,
        request: &EtcdRollRequest,
    ) -> StepOutcome {
        if let Err(e) = driver.finish().await {
            return retry(e);
        }
        let tally = tally(&run.steps);
        let now_term = highest_term(etcd).await;
        let (last_term, leaderless) = {
            let w = watch.lock().await;
            (w.last_term.max(now_term), w.longest_leaderless)
        };
        let Some(start_term) = run.memory.etcd_start_term else {
            return StepOutcome::failed(
                "the run has no starting raft term: its begin step never finished",
            );
        };
        let r = RollReport::new(
            tally.restarted,
            tally.transfers,
            start_term,
            last_term,
            leaderless,
        );
        let target = request.target();
        let m = self.metrics.set::<super::metrics::EtcdRollMetrics>();
        m.rolls.with_label_values(&[&target]).inc();
        m.restarts
            .with_label_values(&[&target])
            .inc_by(r.restarted.len() as u64);
        m.leadership_changes
            .with_label_values(&[&target])
            .inc_by(r.leadership_changes);
        m.transfers
            .with_label_values(&[&target])
            .inc_by(r.transfers);
        m.uncontrolled_changes
            .with_label_values(&[&target])
            .inc_by(r.uncontrolled_changes);
        m.longest_leaderless
            .with_label_values(&[&target])
            .set(leaderless.as_secs_f64());
        if r.uncontrolled_changes > 0 {
            warn!(%target, uncontrolled = r.uncontrolled_changes, "leadership changed without a transfer during the roll");
        }
        StepOutcome::done(format!(
            "rolled {target}: restarted [{}]; transfers {}; leadership changes {}; uncontrolled {}; longest leaderless {} ms (while this rollgate watched); partition lock restored",
            r.restarted.join(", "),
            r.transfers,
            r.leadership_changes,
            r.uncontrolled_changes,
            r.longest_leaderless_ms
        ))
    }
}

/// The cluster, each member's endpoint, and `member` in it; the outcome to return when the
/// cluster cannot be read or `member` is gone.
async fn look_at(
    etcd: &dyn EtcdMembers,
    driver: &StatefulSetDriver,
    member: &str,
) -> Result<(ClusterView, Endpoints, Member), StepOutcome> {
    let (current, endpoints) = view(etcd, driver).await.map_err(retry)?;
    let m = current
        .members
        .iter()
        .find(|m| m.name == member)
        .cloned()
        .ok_or_else(|| replan(format!("{member} is no longer a member")))?;
    Ok((current, endpoints, m))
}

/// The highest raft term any member reports (0 when none answers).
async fn highest_term(etcd: &dyn EtcdMembers) -> u64 {
    etcd.answering()
        .await
        .iter()
        .map(|s| s.raft_term)
        .max()
        .unwrap_or_default()
}

/// The next action in words.
fn describe(action: &Action) -> String {
    match action {
        Action::Done => "every member is at the target".into(),
        Action::MoveLeader { name, .. } => format!("move leadership to {name}"),
        Action::Restart { name, .. } => format!("restart {name}"),
    }
}

/// Drops the steps planned after this one and plans again from the cluster as it is.
fn replan(note: String) -> StepOutcome {
    StepOutcome::Planned {
        note,
        steps: vec![Step::new(EtcdRollStep::Next)],
    }
}

#[async_trait::async_trait]
impl StepExecutor for EtcdRollSteps {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let step = &run.steps[index];
        let Some(kind) = step.kind.get::<EtcdRollStep>() else {
            return StepOutcome::failed(format!("{} is not a step of an etcd roll", step.label()));
        };
        let request = match run.request_as::<EtcdRollRequest>() {
            Ok(r) => r,
            Err(e) => {
                return StepOutcome::failed(format!("the run's request no longer validates: {e}"));
            }
        };
        let etcd = match self.etcd(run, &request) {
            Ok(etcd) => etcd,
            Err(e) => return StepOutcome::failed(e),
        };
        let watch = self.watch(run, &etcd);
        let driver = StatefulSetDriver {
            api: self.api.clone(),
            namespace: request.namespace.clone(),
            name: request.statefulset.clone(),
        };
        let outcome = match kind {
            EtcdRollStep::Begin => self.begin(&*etcd, &driver, request.max_lag).await,
            EtcdRollStep::Next => self.next(&*etcd, &driver, step, &request).await,
            EtcdRollStep::Restart { member } => {
                self.restart(&*etcd, &driver, &request, member).await
            }
            EtcdRollStep::Ready { member } => {
                self.ready(&*etcd, &driver, step, &request, member).await
            }
            EtcdRollStep::Cooldown { .. } if request.cooldown_secs == 0 => {
                StepOutcome::done("no cooldown set: the member is caught up")
            }
            EtcdRollStep::Cooldown { member } => {
                let until = step.started_at.unwrap_or_else(Utc::now)
                    + chrono::Duration::seconds(request.cooldown_secs as i64);
                if Utc::now() >= until {
                    StepOutcome::done(format!("cooled down {}s", request.cooldown_secs))
                } else {
                    StepOutcome::Wait {
                        until,
                        reason: format!("cooling down after {member}"),
                    }
                }
            }
            EtcdRollStep::Transfer { member } => {
                self.transfer(&*etcd, &driver, &request, member).await
            }
            EtcdRollStep::Finish => {
                let outcome = self.finish(run, &*etcd, &driver, &watch, &request).await;
                if matches!(outcome, StepOutcome::Done { .. }) {
                    self.forget(run);
                }
                outcome
            }
            EtcdRollStep::Gate { .. } => {
                StepOutcome::failed(format!("{} is the gate's step", step.label()))
            }
        };
        if let StepOutcome::Retry { error, .. } | StepOutcome::Failed { error } = &outcome {
            warn!(run_id = %run.id, step = %step.label(), %error, "etcd roll step did not succeed");
        }
        outcome
    }
}
