//! The worker: consume → decode → skip if processed → apply through the engine → persist
//! (run, processed id, outbox) → publish the outbox → ack. Then, if the engine asked for
//! a step, execute it and persist its outcome the same way.

use chrono::{DateTime, Utc};
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};

use crate::domain::alert::AlertBatch;
use crate::domain::backoff::Backoff;
use crate::domain::engine::{self, Context, Input, Next, StepOutcome};
use crate::domain::event::{
    CloudEvent, ControlRequest, EventData, EventType, ROLLGATE_SOURCE, WakeRequest,
};
use crate::domain::run::{FailurePolicy, Run, RunKind, RunStatus, Step};
use crate::domain::run_request::{RunAsked, RunDoor, RunPolicy};
use crate::domain::schedule::Windows;
use crate::metrics::Metrics;
use crate::ports::{Executors, ForeignLock, Notice, Notifier};
use crate::queue::{Delivery, Outgoing, Queue, QueueError};
use crate::store::{AlertEvent, Commit, Committed, Events, Store, StoreError};
use crate::workflows::k8s_upgrade::plan::FailureBudget;

/// The worker.
pub struct Worker {
    /// Where events come from.
    pub queue: Arc<dyn Queue>,
    /// Where runs live.
    pub store: Store,
    /// Where it counts what it does.
    pub metrics: Metrics,
    /// Step executors by step name.
    pub executors: Executors,
    /// Retry and gate limits.
    pub policy: WorkerPolicy,
    /// Where transitions are told.
    pub notifier: Arc<dyn Notifier>,
    /// Set when the outbox may hold messages not yet published.
    pub outbox_pending: AtomicBool,
    /// Events that failed in a row for a transient reason; sets the back-off.
    pub consecutive_failures: AtomicU32,
    /// Where it tells whether its writes to the store go through.
    writes: Arc<WriteHealth>,
    /// The kinds of run that new requests (from AMQP) cannot make here, and why: they are
    /// dead-lettered with this reason, as the API refuses them with a 422.
    pub refused: Vec<(RunKind, String)>,
    /// The maintenance windows outside which steps that start work on a node wait.
    pub windows: Windows,
    /// True while this replica's worker is the active one; `None`: always (one replica).
    pub leading: Option<watch::Receiver<bool>>,
    /// The gate, told when a commit changed the alert board.
    pub gate: Option<Arc<crate::workflows::gate::Gate>>,
    /// kured's reboot lock, honoured before a run takes the cluster and held while one
    /// has it; how often a run waiting for it asks again.
    foreign_lock: Option<(Arc<dyn ForeignLock>, Duration)>,
    /// One lock per run: whatever reads, advances and commits a run (an event, a step's
    /// outcome) holds it, so that the steps of a run driven beside the queue never lose
    /// an update.
    run_locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The runs this worker has in hand, each as it last wrote or read it, so that a step's
    /// outcome, a wake or a control starts from here rather than from a read of the whole
    /// run. Nothing else writes a run once it is made (the intake only makes new ones;
    /// another replica only after this one lost the lease), so the store is read again only
    /// when a run is not here: after a restart or a change of leader (this is emptied
    /// whenever leading starts or ends), or after a write that failed. A run is taken out
    /// under its lock and put back once its change is committed.
    held_runs: std::sync::Mutex<HashMap<String, Arc<Run>>>,
    /// The tasks driving steps, waited for when the worker stops.
    drives: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The reason a run waiting for the cluster's lock gives, up to the holder it names.
pub const WAITS_FOR_CLUSTER: &str = "waits for run ";

/// The reason a run waiting for kured's reboot lock gives, up to kured's holders.
pub const WAITS_FOR_KURED: &str = "waits for kured: ";

/// Whether `run` is queued behind the cluster's lock (or kured's), or queued to take it
/// (it waited outside the cluster until now).
fn waits_for_cluster(run: &Run) -> bool {
    run.status == RunStatus::Queued
        && (run.reason.starts_with(WAITS_FOR_CLUSTER)
            || run.reason.starts_with(WAITS_FOR_KURED)
            || run
                .reason
                .starts_with(crate::domain::engine::TAKES_THE_CLUSTER))
}

/// Whether one of `runs` held the cluster and has ended, releasing it.
fn releases_cluster(runs: &[Run]) -> bool {
    runs.iter()
        .any(|r| r.status.is_terminal() && r.holds_cluster())
}

/// Limits the engine applies to every run.
#[derive(Debug, Clone, Copy)]
pub struct WorkerPolicy {
    /// Starts of one step before it gives up.
    pub max_attempts: u32,
    /// How long a closed gate may hold a step before the run halts.
    pub halt_after: Duration,
    /// What a run does when a step gives up.
    pub on_failure: FailurePolicy,
    /// How many workers may be left behind while an upgrade goes on.
    pub failure_budget: FailureBudget,
    /// Whether upgrades wait for the fleet's upstream clusters first (`fleet.upstreams`).
    pub asks_upstreams: bool,
}

impl WorkerPolicy {
    /// The pause before a failed step is tried again: 2 s, doubling, at most 5 minutes.
    pub const STEP_RETRY: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(300));
}

/// The pause before an event that failed for a transient reason is released for
/// redelivery, by failures in a row.
const EVENT_RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(60));
/// How often messages left in the outbox (broker down) are tried again.
const OUTBOX_RETRY: Duration = Duration::from_secs(5);
/// Most alert notifications committed together.
const ALERT_BATCH: usize = 64;

/// Whether `delivery` may be committed with the alert notifications beside it: one on
/// time and delivered for the first time (a redelivery is asked about alone).
fn alerts_batchable(delivery: &Delivery) -> bool {
    delivery.routing_key == EventType::Alerts.routing_key()
        && !delivery.redelivered
        && delivery.not_before.is_none()
}

/// Whether the worker can write the store now: since when it cannot, and why (for
/// `/readyz`, so that a full disk or a store that refuses writes is seen while runs hold).
#[derive(Debug, Default)]
pub struct WriteHealth(std::sync::Mutex<Option<(DateTime<Utc>, String)>>);

impl WriteHealth {
    fn failed(&self, why: String) {
        let mut trouble = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let since = trouble.as_ref().map_or_else(Utc::now, |(since, _)| *since);
        *trouble = Some((since, why));
    }

    fn ok(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Since when writes fail and the last reason, if they do.
    pub fn trouble(&self) -> Option<(DateTime<Utc>, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Why an event could not be processed now; the delivery is released and retried.
#[derive(Debug, thiserror::Error)]
enum Transient {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl Worker {
    /// A worker over `queue` and `store`.
    pub fn new(
        queue: Arc<dyn Queue>,
        store: Store,
        metrics: Metrics,
        executors: Executors,
        policy: WorkerPolicy,
        notifier: Arc<dyn Notifier>,
    ) -> Self {
        Self {
            queue,
            store,
            metrics,
            executors,
            policy,
            notifier,
            // A crash may have left messages in the outbox.
            outbox_pending: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            writes: Arc::default(),
            refused: Vec::new(),
            windows: Windows::default(),
            leading: None,
            gate: None,
            foreign_lock: None,
            run_locks: Default::default(),
            held_runs: Default::default(),
            drives: Default::default(),
        }
    }

    /// The run that holds the cluster against `run`, if any: another run that works on
    /// the cluster's nodes or its etcd and has started and not ended, or that has waited
    /// for the cluster since before `run` was made. Runs take the cluster one at a time,
    /// in the order they were asked for.
    async fn cluster_holder(&self, run: &Run) -> Result<Option<Run>, StoreError> {
        if !run.holds_cluster() {
            return Ok(None);
        }
        let others = self.store.not_ended().await?;
        Ok(others.into_iter().find(|other| {
            other.id != run.id
                && other.holds_cluster()
                && (other.status != RunStatus::Queued
                    || (waits_for_cluster(other) && other.created_at < run.created_at))
        }))
    }

    /// Starts queued `run` unless another run holds the cluster; then it stays queued and
    /// says what it waits for.
    async fn start_or_wait(
        &self,
        run: &mut Run,
        commit: &mut Commit,
        notices: &mut Vec<Notice>,
    ) -> Result<Vec<(usize, u64)>, Transient> {
        if let Some(holder) = self.cluster_holder(run).await? {
            let reason = format!(
                "{WAITS_FOR_CLUSTER}{} ({}) to release the cluster",
                holder.id,
                holder.kind.name()
            );
            info!(run_id = %run.id, holder = %holder.id, "waiting for the cluster");
            let told = run.history_len();
            run.transition(RunStatus::Queued, reason, Utc::now());
            notices.extend(notices_since(run, told));
            return Ok(Vec::new());
        }
        if run.holds_cluster()
            && let Some((lock, recheck)) = &self.foreign_lock
        {
            let holder = match lock.take().await {
                Ok(holder) => holder,
                // Fail closed: a lock that cannot be read may be held.
                Err(e) => Some(format!(
                    "its lock cannot be read, so it counts as held: {}",
                    crate::error_chain(&e)
                )),
            };
            if let Some(holder) = holder {
                let reason = format!("{WAITS_FOR_KURED}{holder}");
                if run.reason != reason {
                    info!(run_id = %run.id, %holder, "waiting for kured's reboot lock");
                    let told = run.history_len();
                    run.transition(RunStatus::Queued, reason, Utc::now());
                    notices.extend(notices_since(run, told));
                }
                let again = Utc::now()
                    + chrono::Duration::from_std(*recheck).unwrap_or(chrono::Duration::seconds(30));
                commit
                    .outbox
                    .push(wake_message(run, run.epoch, Some(again)));
                return Ok(Vec::new());
            }
        }
        Ok(self.apply(run, Input::Start, commit, notices).0)
    }

    /// Lets go of kured's lock unless a run has the cluster (one started and not ended; a
    /// halted run keeps it). Called when a run that had the cluster ends, and at start (a
    /// crash between the two may have left the lock held).
    async fn release_foreign_lock_if_idle(&self) {
        let Some((lock, _)) = &self.foreign_lock else {
            return;
        };
        let busy = match self.store.not_ended().await {
            Ok(runs) => runs
                .iter()
                .any(|r| r.holds_cluster() && r.status != RunStatus::Queued),
            Err(e) => {
                warn!(error = %crate::error_chain(&e), "cannot tell whether a run has the cluster; kured's lock stays held");
                return;
            }
        };
        if busy {
            return;
        }
        match lock.release().await {
            Ok(()) => info!("kured's reboot lock released (no run has the cluster)"),
            Err(e) => {
                warn!(error = %crate::error_chain(&e), "cannot release kured's reboot lock; trying again when the next run ends or rollgate starts");
            }
        }
    }

    /// The same worker, honouring and holding `lock` (kured's), asking again every
    /// `recheck` while it is held.
    pub fn honouring(mut self, lock: Arc<dyn ForeignLock>, recheck: Duration) -> Self {
        self.foreign_lock = Some((lock, recheck));
        self
    }

    /// A wake for the oldest run waiting for the cluster, when `ended` releases it.
    async fn wake_next_holder(&self, ended: &[Run]) -> Result<Option<Outgoing>, StoreError> {
        if !releases_cluster(ended) {
            return Ok(None);
        }
        let waiting = self.store.not_ended().await?;
        Ok(waiting
            .iter()
            .find(|r| waits_for_cluster(r) && !ended.iter().any(|e| e.id == r.id))
            .map(|next| wake_message(next, next.epoch, None)))
    }

    /// The same worker, telling `gate` whenever the alert board changes.
    pub fn telling(mut self, gate: Arc<crate::workflows::gate::Gate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The same worker, active only while `leading` is true (several replicas).
    pub fn led_by(mut self, leading: watch::Receiver<bool>) -> Self {
        self.leading = Some(leading);
        self
    }

    /// Waits until this worker may be the active one; false on `shutdown`.
    async fn until_leading(&self, shutdown: &mut watch::Receiver<bool>) -> bool {
        let Some(mut leading) = self.leading.clone() else {
            return true;
        };
        tokio::select! {
            _ = shutdown.changed() => false,
            led = crate::workflows::leader::until_leading(&mut leading) => led,
        }
    }

    /// Returns when this worker stops being the active one (never with one replica).
    async fn deposed(&self) {
        match self.leading.clone() {
            Some(mut leading) => crate::workflows::leader::until_deposed(&mut leading).await,
            None => std::future::pending().await,
        }
    }

    /// The same worker, telling `writes` whether its writes to the store go through.
    pub fn reporting_writes_to(mut self, writes: Arc<WriteHealth>) -> Self {
        self.writes = writes;
        self
    }

    /// The same worker, starting work on nodes only inside `windows`.
    pub fn within(mut self, windows: Windows) -> Self {
        self.windows = windows;
        self
    }

    /// The wait `run`'s step `index` owes the maintenance windows now, if any.
    fn window_wait(&self, run: &Run, index: usize) -> Option<StepOutcome> {
        // A run that only plans (its request's `dry_run`) works on no node.
        let dry_run = || run.request["dry_run"].as_bool() == Some(true);
        let (until, reason) = self
            .windows
            .hold(&run.steps[index].kind, dry_run, Utc::now())?;
        Some(StepOutcome::Wait { until, reason })
    }

    /// The same worker, dead-lettering new requests for runs of `kind` for `why` (the
    /// workflow is not configured here).
    pub fn refusing(mut self, kind: RunKind, why: Option<String>) -> Self {
        self.refused.retain(|(k, _)| *k != kind);
        self.refused.extend(why.map(|why| (kind, why)));
        self
    }

    /// Moves `delivery` to the dead letters for `reason`, counted under `label`; releases
    /// it for a later try if even that fails.
    async fn dead_letter(&self, delivery: &Delivery, label: &str, reason: &str) {
        match self.queue.dead_letter(delivery, reason).await {
            Ok(()) => self
                .metrics
                .events_dead_lettered
                .with_label_values(&[label])
                .inc(),
            Err(qe) => {
                self.metrics
                    .queue_errors
                    .with_label_values(&["dead_letter"])
                    .inc();
                warn!(error = %qe, "cannot dead-letter; releasing for a later try");
                let _ = self.queue.release(delivery).await;
            }
        }
    }

    /// Runs until `shutdown` turns true. The message in hand is finished first. With
    /// several replicas it consumes only while it is the active worker: it stops consuming
    /// when deposed (the broker gives what it had to the next) and recovers when elected.
    pub async fn run(self, shutdown: watch::Receiver<bool>) {
        Arc::new(self).serve(shutdown).await;
    }

    async fn serve(self: &Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        'elected: while self.until_leading(&mut shutdown).await {
            self.forget_runs();
            if let Err(e) = self.recover().await {
                warn!(error = %crate::error_chain(&e), "recovery after start failed; unfinished runs resume on their next event");
            }
            self.release_foreign_lock_if_idle().await;
            loop {
                let delivery = tokio::select! {
                    _ = shutdown.changed() => break 'elected,
                    () = self.deposed() => {
                        self.forget_runs();
                        self.queue.stop_consuming().await;
                        crate::workflows::k8s_upgrade::clear_gauges(&self.metrics);
                        continue 'elected;
                    }
                    d = self.queue.next() => d,
                    () = tokio::time::sleep(OUTBOX_RETRY) => {
                        // Other replicas' intake may have left messages in a shared outbox.
                        self.outbox_pending.store(true, Ordering::Release);
                        self.flush_or_keep().await;
                        continue;
                    }
                };
                if !self.receive(delivery).await || *shutdown.borrow() {
                    break 'elected;
                }
            }
        }
        // The steps in hand finish first, as the message in hand does.
        let drives = std::mem::take(&mut *lock(&self.drives));
        for drive in drives {
            let _ = drive.await;
        }
        info!("worker stopped");
    }

    /// Drives `steps` of `run` in a task of its own, beside the queue: controls and wakes
    /// for the run (a halt, a worker's retry) are applied while its steps are in hand.
    fn spawn_drive(self: &Arc<Self>, run: Arc<Run>, steps: Vec<(usize, u64)>) {
        let me = self.clone();
        let task = tokio::spawn(
            async move { me.drive(run, steps).await }.instrument(tracing::Span::current()),
        );
        let mut drives = lock(&self.drives);
        drives.retain(|d| !d.is_finished());
        drives.push(task);
    }

    /// The lock of run `id`.
    fn run_lock(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.run_locks)
            .entry(id.to_owned())
            .or_default()
            .clone()
    }

    /// Run `id`, taken out of those in hand (a copy only while one of its steps still runs
    /// on the snapshot it was given), else read from the store. Under the run's lock.
    async fn take_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        if let Some(run) = lock(&self.held_runs).remove(id) {
            return Ok(Some(Arc::unwrap_or_clone(run)));
        }
        self.store.get_run(id).await
    }

    /// Puts back `run`, as committed (or unchanged since it was taken): the snapshot its
    /// steps are executed with. A run that has ended is not kept.
    fn keep_run(&self, mut run: Run) -> Arc<Run> {
        run.forget_logged_history();
        let run = Arc::new(run);
        let mut held = lock(&self.held_runs);
        if run.status.is_terminal() {
            held.remove(&run.id);
        } else {
            held.insert(run.id.clone(), run.clone());
        }
        run
    }

    /// Forgets every run in hand: leading starts or ends, and the store is the truth.
    fn forget_runs(&self) {
        lock(&self.held_runs).clear();
    }

    /// Forgets the lock of a run that has ended.
    fn forget_lock(&self, run: &Run) {
        if run.status.is_terminal() {
            lock(&self.run_locks).remove(&run.id);
        }
    }

    /// Handles what the queue gave, with the alert notifications in hand behind it;
    /// false when the queue is closed.
    async fn receive(self: &Arc<Self>, delivery: Result<Delivery, QueueError>) -> bool {
        {
            match delivery {
                Ok(d) if alerts_batchable(&d) => {
                    let more = self.queue.ready(ALERT_BATCH - 1).await;
                    if more.is_empty() {
                        self.handle(d).await;
                    } else {
                        self.handle_in_order(d, more).await;
                    }
                }
                Ok(d) => self.handle(d).await,
                Err(QueueError::Closed) => return false,
                Err(e) => {
                    self.metrics
                        .queue_errors
                        .with_label_values(&["receive"])
                        .inc();
                    warn!(error = %crate::error_chain(&e), "cannot receive from the queue; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        true
    }

    /// Publishes what a crash left in the outbox, and re-drives runs whose step was in hand:
    /// a wake with the run's current epoch makes the engine run that step again.
    async fn recover(&self) -> Result<(), Transient> {
        self.flush_outbox().await?;
        let mut commit = Commit::default();
        let mut notices = Vec::new();
        let now = Utc::now();
        if let Ok(runs) = self.store.in_progress().await {
            crate::workflows::k8s_upgrade::restore_gauges(&self.metrics, &runs);
        }
        for mut run in self.store.unfinished().await? {
            run.adopt_single_step_in_hand();
            let step = run.current().map(Step::label).unwrap_or_default();
            match run.status {
                RunStatus::Running => {
                    let redo = run.running_in_hand();
                    let steps: Vec<String> =
                        redo.iter().map(|&(i, _)| run.steps[i].label()).collect();
                    let steps = if steps.is_empty() {
                        step
                    } else {
                        steps.join(", ")
                    };
                    info!(run_id = %run.id, %steps, "resuming the steps in hand after a restart");
                    run.note(
                        format!(
                            "rollgate restarted (worker {}): resuming step {steps}, which was in hand",
                            self.store.replica()
                        ),
                        now,
                    );
                    for (_, epoch) in redo {
                        commit.outbox.push(wake_message(&run, epoch, None));
                    }
                }
                RunStatus::Waiting => run.note(
                    format!("rollgate restarted: step {step} waits on (its wake is kept)"),
                    now,
                ),
                _ => continue,
            }
            notices.extend(notices_since(&run, run.history_len() - 1));
            commit.runs.push(run);
        }
        if !commit.runs.is_empty() {
            self.commit(&mut commit).await?;
            self.tell(notices);
            self.flush_outbox().await?;
        }
        Ok(())
    }

    async fn flush_outbox(&self) -> Result<(), Transient> {
        if !self.outbox_pending.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let result = async {
            for (seq, msg) in self.store.outbox().await? {
                self.queue.publish(msg).await?;
                self.store.outbox_sent(seq).await?;
            }
            Ok(())
        }
        .await;
        if result.is_err() {
            self.outbox_pending.store(true, Ordering::Release);
        }
        result
    }

    /// Publishes the outbox; on failure leaves it for the next try (every
    /// `OUTBOX_RETRY`, or the next event).
    async fn flush_or_keep(&self) {
        if let Err(e) = self.flush_outbox().await {
            self.metrics
                .queue_errors
                .with_label_values(&["outbox"])
                .inc();
            warn!(error = %crate::error_chain(&e), "cannot publish the outbox now; retrying later");
        }
    }

    /// Commits, fenced by the worker lease, remembering that the outbox has messages to
    /// publish.
    /// The runs stay in `commit`, as written (see [`Store::commit_keeping`]); the lock of a
    /// run that has ended is forgotten.
    async fn commit(&self, commit: &mut Commit) -> Result<Committed, StoreError> {
        commit.fenced = true;
        let upgrade_ended = commit.runs.iter().any(|r| {
            r.kind == crate::domain::upgrade_step::K8S_UPGRADE
                && r.status.is_terminal()
                && crate::workflows::k8s_upgrade::marked_in_flight(r)
        });
        let board_changed = !commit.alerts.is_empty() || !commit.alert_events.is_empty();
        let cluster_released = releases_cluster(&commit.runs);
        if let Some(wake) = self.wake_next_holder(&commit.runs).await? {
            commit.outbox.push(wake);
        }
        let has_outbox = !commit.outbox.is_empty();
        let committed = match self.store.commit_keeping(commit).await {
            Ok(committed) => {
                self.writes.ok();
                committed
            }
            Err(e) => {
                self.writes.failed(crate::error_chain(&e));
                return Err(e);
            }
        };
        for run in &commit.runs {
            self.forget_lock(run);
            lock(&self.held_runs).remove(&run.id);
        }
        if upgrade_ended {
            // However the run in flight ended (succeeded, failed, aborted), it no longer is;
            // a halted run has not ended and stays so. Only one upgrade marks the cluster.
            // Cleared before anything else is awaited: the end is in the store already.
            crate::workflows::k8s_upgrade::clear_gauges(&self.metrics);
        }
        if board_changed && let Some(gate) = &self.gate {
            gate.board_changed();
        }
        if has_outbox {
            self.outbox_pending.store(true, Ordering::Release);
        }
        if cluster_released {
            self.release_foreign_lock_if_idle().await;
        }
        Ok(committed)
    }

    /// Handles `first` and `more` in their order, each run of alert notifications in one
    /// commit (a board update is the same whichever of them it comes from; what else is in
    /// hand keeps its place).
    async fn handle_in_order(self: &Arc<Self>, first: Delivery, more: Vec<Delivery>) {
        let mut alerts: Vec<(Delivery, CloudEvent, AlertBatch)> = Vec::new();
        for delivery in std::iter::once(first).chain(more) {
            if alerts_batchable(&delivery)
                && let Ok((event, EventData::Alerts(batch))) =
                    CloudEvent::decode(&delivery.body, crate::workflows::DOORS)
            {
                alerts.push((delivery, event, batch));
                continue;
            }
            self.handle_alerts(std::mem::take(&mut alerts)).await;
            self.handle(delivery).await;
        }
        self.handle_alerts(alerts).await;
    }

    /// Several alert notifications in one commit: each marked processed (one seen before
    /// is skipped alone), every alert on the board, then each acked.
    async fn handle_alerts(self: &Arc<Self>, mut alerts: Vec<(Delivery, CloudEvent, AlertBatch)>) {
        if alerts.len() <= 1 {
            if let Some((delivery, ..)) = alerts.pop() {
                self.handle(delivery).await;
            }
            return;
        }
        let span = info_span!("events", events = alerts.len(), event_type = "alerts");
        async {
            let result = async {
                let mut commit = Commit::default();
                let mut may_open = false;
                for (_, event, batch) in &alerts {
                    info!(event_id = %event.id, source = %event.source, alerts = batch.alerts.len(), receiver = %batch.receiver, "alerts received");
                    may_open |= crate::workflows::gate::may_open(&batch.alerts);
                    commit.alert_events.push(AlertEvent {
                        id: event.id.clone(),
                        alerts: batch.alerts.clone(),
                    });
                }
                if may_open {
                    commit.outbox.extend(self.gate_rechecks().await?);
                }
                Ok::<_, Transient>(match self.commit(&mut commit).await? {
                    Committed::Done { skipped } => skipped,
                    Committed::AlreadyProcessed => 0,
                })
            }
            .await;
            match result {
                Ok(skipped) => {
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                    let label = [EventType::Alerts.label()];
                    self.metrics
                        .events_processed
                        .with_label_values(&label)
                        .inc_by((alerts.len() - skipped) as u64);
                    self.metrics
                        .events_duplicate
                        .with_label_values(&label)
                        .inc_by(skipped as u64);
                    info!(events = alerts.len(), skipped, "alert notifications committed together");
                    self.flush_or_keep().await;
                    let deliveries: Vec<&Delivery> = alerts.iter().map(|(d, ..)| d).collect();
                    if let Err(e) = self.queue.ack_all(&deliveries).await {
                        warn!(error = %crate::error_chain(&e), "ack failed; the events will be redelivered and skipped");
                    }
                }
                Err(e) => {
                    let deliveries: Vec<&Delivery> = alerts.iter().map(|(d, ..)| d).collect();
                    self.release_later(&deliveries, &e).await;
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// Gives `deliveries` back for redelivery after a pause that grows with each failure in
    /// a row, so that a passing store or broker fault does not use up the delivery limit of
    /// a valid event.
    async fn release_later(&self, deliveries: &[&Delivery], e: &Transient) {
        self.metrics
            .queue_errors
            .with_label_values(&["process"])
            .inc();
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed);
        let pause = crate::jitter::pause(&EVENT_RETRY, failures.saturating_add(1));
        warn!(error = %crate::error_chain(e), retry_in = ?pause, "cannot process now; releasing for redelivery");
        tokio::time::sleep(pause).await;
        for delivery in deliveries {
            let _ = self.queue.release(delivery).await;
        }
    }

    /// Wakes for the runs a closed gate holds, so that they ask again at once rather than
    /// at their next poll (an alert may have resolved).
    async fn gate_rechecks(&self) -> Result<Vec<Outgoing>, Transient> {
        Ok(self
            .store
            .unfinished()
            .await?
            .iter()
            .filter(|run| run.status == RunStatus::Waiting && run.blocked_since.is_some())
            .flat_map(|run| {
                run.steps_in_hand()
                    .filter(|s| s.is_held(crate::domain::run::Held::Gate))
                    .map(|s| wake_message(run, s.epoch, None))
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    async fn handle(self: &Arc<Self>, delivery: Delivery) {
        let (event, data) = match CloudEvent::decode(&delivery.body, crate::workflows::DOORS) {
            Ok(decoded) => decoded,
            Err(e) => {
                let label = delivery.routing_key.clone();
                warn!(routing_key = %label, error = %crate::error_chain(&e), "undecodable message; dead-lettering");
                self.dead_letter(&delivery, "unknown", &e.to_string()).await;
                return;
            }
        };
        let kind = data.event_type();
        let refused = match &data {
            EventData::Run(asked) if asked.run_id.is_none() => self
                .refused
                .iter()
                .find(|(kind, _)| *kind == asked.door.kind())
                .map(|(_, why)| why),
            _ => None,
        };
        if let Some(why) = refused {
            warn!(event_id = %event.id, %why, "a request for a run that cannot be carried out here; dead-lettering");
            self.dead_letter(&delivery, kind.label(), why).await;
            return;
        }
        let span = info_span!("event", event_id = %event.id, event_type = kind.label(), run_id = tracing::field::Empty);
        if let Some(run_id) = &event.runid {
            span.record("run_id", run_id.as_str());
        }
        async {
            match self.process(&delivery, &event, data).await {
                Ok(next) => {
                    self.consecutive_failures.store(0, Ordering::Relaxed);
                    if let Err(e) = self.queue.ack(&delivery).await {
                        // Redelivery is harmless: the event is recorded as processed.
                        warn!(error = %crate::error_chain(&e), "ack failed; the event will be redelivered and skipped");
                    }
                    if let Some((run, steps)) = next {
                        self.spawn_drive(run, steps);
                    }
                }
                Err(e) => self.release_later(&[&delivery], &e).await,
            }
        }
        .instrument(span)
        .await;
    }

    /// Applies one event and persists the result. Returns a step to execute, if any.
    async fn process(
        &self,
        delivery: &Delivery,
        event: &CloudEvent,
        data: EventData,
    ) -> Result<Option<(Arc<Run>, Vec<(usize, u64)>)>, Transient> {
        let kind = data.event_type();
        if let Some(not_before) = delivery.not_before
            && not_before > Utc::now()
        {
            // Delivered early (broker TTL granularity): send it back to wait the rest.
            self.queue
                .publish(Outgoing {
                    id: event.id.clone(),
                    routing_key: delivery.routing_key.clone(),
                    body: delivery.body.clone(),
                    not_before: Some(not_before),
                })
                .await?;
            return Ok(None);
        }
        // Only a redelivery is likely a duplicate; any other is caught by the commit, which
        // writes nothing for an event processed before.
        if delivery.redelivered && self.store.is_processed(&event.id).await? {
            self.metrics
                .events_duplicate
                .with_label_values(&[kind.label()])
                .inc();
            info!("already processed; skipping");
            return Ok(None);
        }
        let run_lock = match &data {
            EventData::Control(c) => Some(c.run_id.as_str()),
            EventData::Wake(w) => Some(w.run_id.as_str()),
            EventData::Run(asked) => asked.run_id.as_deref(),
            EventData::Alerts(_) => None,
        }
        .map(|id| self.run_lock(id));
        let _held = match &run_lock {
            Some(run_lock) => Some(run_lock.lock().await),
            None => None,
        };
        let mut commit = Commit {
            event: Some((event.id.clone(), kind.type_name())),
            ..Commit::default()
        };
        let mut step = Vec::new();
        let mut notices = Vec::new();
        match data {
            EventData::Alerts(batch) => {
                info!(source = %event.source, alerts = batch.alerts.len(), receiver = %batch.receiver, "alerts received");
                if crate::workflows::gate::may_open(&batch.alerts) {
                    commit.outbox.extend(self.gate_rechecks().await?);
                }
                commit.alerts = batch.alerts;
            }
            EventData::Run(asked) => {
                step = self
                    .take_request(asked, &event.source, &mut commit, &mut notices)
                    .await?;
            }
            EventData::Control(ControlRequest {
                run_id,
                action,
                reason,
                by,
            }) => match self.take_run(&run_id).await? {
                None => warn!(%run_id, "control for an unknown run; ignored"),
                Some(mut run) => {
                    let by = by.unwrap_or_else(|| event.source.clone());
                    info!(%run_id, %action, %by, "control");
                    let changed;
                    (step, changed) = self.apply(
                        &mut run,
                        Input::Control {
                            action,
                            reason,
                            by: Some(by),
                        },
                        &mut commit,
                        &mut notices,
                    );
                    if changed {
                        commit.runs.push(run);
                    } else {
                        self.keep_run(run);
                    }
                }
            },
            EventData::Wake(WakeRequest { run_id, epoch }) => {
                match self.take_run(&run_id).await? {
                    None => warn!(%run_id, "wake for an unknown run; ignored"),
                    Some(mut run) if waits_for_cluster(&run) => {
                        // The cluster was released: start, or wait on for the next holder.
                        step = self
                            .start_or_wait(&mut run, &mut commit, &mut notices)
                            .await?;
                        commit.runs.push(run);
                    }
                    Some(mut run) => {
                        let changed;
                        (step, changed) =
                            self.apply(&mut run, Input::Wake { epoch }, &mut commit, &mut notices);
                        // A stale wake (of a run aborted, or of a step started again since)
                        // changes nothing, and nothing of the run is written.
                        if changed {
                            commit.runs.push(run);
                        } else {
                            self.keep_run(run);
                        }
                    }
                }
            }
        }
        if self.commit(&mut commit).await? == Committed::AlreadyProcessed {
            // Nothing was written: what was applied in memory is dropped with it.
            self.metrics
                .events_duplicate
                .with_label_values(&[kind.label()])
                .inc();
            return Ok(None);
        }
        let written: Vec<Arc<Run>> = commit.runs.drain(..).map(|r| self.keep_run(r)).collect();
        self.metrics
            .events_processed
            .with_label_values(&[kind.label()])
            .inc();
        self.tell(notices);
        // The event is processed either way: what cannot be published now stays in the
        // outbox and is retried, and the step it started must still be driven.
        self.flush_or_keep().await;
        if step.is_empty() {
            return Ok(None);
        }
        Ok(written.last().cloned().map(|run| (run, step)))
    }

    /// Takes a request for a run: the run the intake named, or a new one. A request that
    /// names no run, through a door whose requests merge, joins the run of its kind that
    /// waits for the cluster instead of making a second run.
    async fn take_request(
        &self,
        asked: RunAsked,
        source: &str,
        commit: &mut Commit,
        notices: &mut Vec<Notice>,
    ) -> Result<Vec<(usize, u64)>, Transient> {
        let door = asked.door;
        if let (None, Some(merge)) = (&asked.run_id, door.merge) {
            let waiting = door.waiting_run(self.store.not_ended().await?);
            if let Some(mut run) = waiting {
                let run_lock = self.run_lock(&run.id);
                let _held = run_lock.lock().await;
                if let Some(latest) = self.take_run(&run.id).await? {
                    run = latest;
                }
                let told = run.history_len();
                if let Some(nodes) = merge(&mut run, &*asked.request, source, Utc::now()) {
                    notices.extend(notices_since(&run, told));
                    info!(run_id = %run.id, %nodes, "request merged into the waiting run");
                    commit.runs.push(run);
                    return Ok(Vec::new());
                }
                self.keep_run(run);
            }
        }
        let policy = RunPolicy {
            on_failure: self.policy.on_failure,
            asks_upstreams: self.policy.asks_upstreams,
        };
        let id = asked
            .run_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let Some(new) = (door.new_run)(id, &*asked.request, &policy, Utc::now()) else {
            warn!(
                kind = door.kind().name(),
                "a request of another workflow's type; ignored"
            );
            return Ok(Vec::new());
        };
        self.create_run(door, asked.run_id, new.credited(source), commit, notices)
            .await
    }

    /// Creates and starts `new`, the run a request asks for, unless a run of its kind for
    /// its target is in flight (then nothing: the request is a duplicate; a run without a
    /// target has no duplicates). A door that takes one run at a time fails a new run
    /// while another of its kind is active, naming the holder. Another run holding the
    /// cluster makes it wait, queued.
    async fn create_run(
        &self,
        door: &'static RunDoor,
        run_id: Option<String>,
        new: Run,
        commit: &mut Commit,
        notices: &mut Vec<Notice>,
    ) -> Result<Vec<(usize, u64)>, Transient> {
        let kind = door.kind();
        let mut existing = match &run_id {
            Some(id) => self.take_run(id).await?,
            None => None,
        };
        if existing.is_none()
            && let Some(target) = &new.target
        {
            // The intake may write this very run between the two reads.
            match self.store.in_flight(kind, target).await? {
                Some(run) if run_id.as_ref() == Some(&run.id) => existing = Some(run),
                Some(other) => {
                    info!(run_id = %other.id, %target, "a run for this target is in flight; no second run");
                    return Ok(Vec::new());
                }
                None => {}
            }
        }
        // Born here, from a message published straight to the exchange, unless the
        // intake wrote it (credited) first. Its whole history is news, creation included
        // (the intake tells nothing), so a run read without its past is read again with
        // it: at birth, a transition or two.
        let mut run = match existing {
            Some(run) if run.status == RunStatus::Queued && run.history_before > 0 => self
                .store
                .view_run(&run.id, Events::All)
                .await?
                .unwrap_or(run),
            Some(run) => run,
            None => new,
        };
        let holder = match (door.one_at_a_time, run.status) {
            (true, RunStatus::Queued) => self.store.active(kind, &run.id).await?,
            _ => None,
        };
        let step = if let Some(holder) = holder {
            let reason = format!(
                "another {} run holds the cluster: {} (target {}, {}); one at a time",
                kind.name(),
                holder.id,
                holder.target.as_deref().unwrap_or("-"),
                holder.status
            );
            warn!(run_id = %run.id, %reason, "refusing to start");
            run.transition(RunStatus::Failed, reason, Utc::now());
            Vec::new()
        } else if run.status == RunStatus::Queued {
            self.start_or_wait(&mut run, commit, notices).await?
        } else {
            Vec::new()
        };
        *notices = notices_since(&run, 0);
        commit.runs.push(run);
        Ok(step)
    }

    /// Feeds `input` to the engine; puts its wakes in the outbox and returns the steps to
    /// run, and whether the run changed. The transitions it adds go to `notices`, told
    /// once committed.
    fn apply(
        &self,
        run: &mut Run,
        input: Input,
        commit: &mut Commit,
        notices: &mut Vec<Notice>,
    ) -> (Vec<(usize, u64)>, bool) {
        let before = (run.epoch, run.history_len(), run.touched.steps.len());
        let can_execute = |step: &Step| self.executors.get(step).is_some();
        let ctx = Context {
            now: Utc::now(),
            can_execute: &can_execute,
            max_attempts: self.policy.max_attempts,
            halt_after: chrono::Duration::from_std(self.policy.halt_after)
                .unwrap_or(chrono::Duration::MAX),
            retry: WorkerPolicy::STEP_RETRY,
            jitter: crate::jitter::unit(),
            failure_budget: self.policy.failure_budget,
        };
        let from = run.status;
        let told = run.history_len();
        let result = engine::advance(run, input, &ctx);
        notices.extend(notices_since(run, told));
        match result {
            Err(refused) => {
                warn!(run_id = %run.id, error = %refused, "control refused");
                (Vec::new(), false)
            }
            Ok(next) => {
                if run.status != from {
                    info!(run_id = %run.id, from = %from, to = %run.status, reason = %run.reason, "run transition");
                }
                let mut steps = Vec::new();
                for next in next.into_each() {
                    match next {
                        Next::WakeAt { at, epoch } => {
                            commit.outbox.push(wake_message(run, epoch, Some(at)));
                        }
                        Next::RunStep { index, epoch } => steps.push((index, epoch)),
                        Next::Nothing | Next::All(_) => {}
                    }
                }
                let after = (run.epoch, run.history_len(), run.touched.steps.len());
                (steps, after != before || run.touched.all)
            }
        }
    }

    /// Executes steps while the engine asks for them, several at once when it hands out a
    /// batch's workers, committing each outcome (under the run's lock) as it comes.
    async fn drive(&self, run: Arc<Run>, steps: Vec<(usize, u64)>) {
        let id = run.id.clone();
        let mut running = FuturesUnordered::new();
        for (index, epoch) in steps {
            running.push(self.execute(run.clone(), index, epoch));
        }
        // The run in hand is the one to go on from, not this snapshot.
        drop(run);
        while let Some(driven) = running.next().await {
            let Driven::Finished {
                epoch,
                outcome,
                took,
                labels,
            } = driven
            else {
                return;
            };
            self.metrics
                .step_duration
                .with_label_values(&[labels.0, labels.1])
                .observe(took.as_secs_f64());
            let mut failures = 0u32;
            let written = loop {
                match self.persist_outcome(&id, epoch, outcome.clone()).await {
                    Persisted::Written { next, notices, run } => break Some((next, notices, run)),
                    Persisted::Late => break None,
                    Persisted::Failed(e) => {
                        // The outcome is kept and written again (the store may be full or
                        // down for a while); the run holds where it is meanwhile.
                        failures = failures.saturating_add(1);
                        let pause = crate::jitter::pause(&EVENT_RETRY, failures);
                        warn!(run_id = %id, error = %crate::error_chain(&e), retry_in = ?pause, "cannot persist a step outcome; the run holds until it is written");
                        tokio::select! {
                            () = tokio::time::sleep(pause) => {}
                            () = self.deposed() => return,
                        }
                    }
                }
            };
            let Some((next, notices, run)) = written else {
                continue;
            };
            if failures > 0 {
                info!(run_id = %id, failures, "the step outcome is written; the run goes on");
            }
            self.tell(notices);
            self.flush_or_keep().await;
            for (index, epoch) in next {
                running.push(self.execute(run.clone(), index, epoch));
            }
        }
    }

    /// Applies a step's `outcome` to run `id` as this worker has it in hand (a control or
    /// a wake may have been applied while the step ran), under the run's lock, and commits
    /// it.
    async fn persist_outcome(&self, id: &str, epoch: u64, outcome: StepOutcome) -> Persisted {
        let run_lock = self.run_lock(id);
        let _held = run_lock.lock().await;
        let mut run = match self.take_run(id).await {
            Ok(Some(run)) => run,
            Ok(None) => return Persisted::Late,
            Err(e) => return Persisted::Failed(e),
        };
        let mut commit = Commit::default();
        let mut notices = Vec::new();
        let (next, changed) = self.apply(
            &mut run,
            Input::StepFinished { epoch, outcome },
            &mut commit,
            &mut notices,
        );
        if !changed {
            // A late outcome (the run was aborted, or the step started again since):
            // nothing to write.
            self.keep_run(run);
            return Persisted::Late;
        }
        commit.runs.push(run);
        match self.commit(&mut commit).await {
            Ok(_) => match commit.runs.pop() {
                Some(run) => Persisted::Written {
                    next,
                    notices,
                    run: self.keep_run(run),
                },
                None => Persisted::Late,
            },
            Err(e) => Persisted::Failed(e),
        }
    }

    /// Executes step `index` of `run` (or the wait a maintenance window owes).
    async fn execute(&self, run: Arc<Run>, index: usize, epoch: u64) -> Driven {
        let Some(executor) = self.executors.get(&run.steps[index]) else {
            return Driven::Deposed;
        };
        let label = run.steps[index].label();
        let node = run.steps[index].kind.node().unwrap_or_default().to_owned();
        let span = info_span!("step", run_id = %run.id, step = %label, %node);
        let started = Instant::now();
        let outcome = match self.window_wait(&run, index) {
            Some(wait) => wait,
            None => tokio::select! {
                outcome = executor.execute(&run, index).instrument(span) => outcome,
                () = self.deposed() => {
                    warn!(run_id = %run.id, step = %label, "no longer the active worker: the step is left to the replica that is");
                    return Driven::Deposed;
                }
            },
        };
        Driven::Finished {
            epoch,
            outcome,
            took: started.elapsed(),
            labels: (run.kind.name(), run.steps[index].kind.name()),
        }
    }
}

/// What became of a step's outcome in [`Worker::persist_outcome`].
enum Persisted {
    /// Committed: the steps to start next and what to tell.
    Written {
        next: Vec<(usize, u64)>,
        notices: Vec<Notice>,
        /// The run as written: the snapshot the next steps are executed with.
        run: Arc<Run>,
    },
    /// The run moved on without it: nothing to write.
    Late,
    /// The store did not take it.
    Failed(StoreError),
}

/// What happened to something [`Worker::drive`] has in hand.
enum Driven {
    /// A step ended.
    Finished {
        epoch: u64,
        outcome: StepOutcome,
        took: Duration,
        /// The run's kind and the step's name, for the step's duration.
        labels: (&'static str, &'static str),
    },
    /// This worker is no longer the active one (or nothing executes the step): the run is
    /// left as stored.
    Deposed,
}

impl Worker {
    fn tell(&self, notices: Vec<Notice>) {
        for notice in notices {
            self.notifier.notify(notice);
        }
    }
}

/// `mutex`'s guard; a holder that panicked left nothing half-done in these maps.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A notice for each transition of `run` from history index `from` on.
fn notices_since(run: &Run, from: usize) -> Vec<Notice> {
    let last = run.history_len().saturating_sub(1);
    run.history_since(from)
        .map(|(i, h)| Notice {
            run_id: run.id.clone(),
            kind: run.kind.name().into(),
            target: run.target.clone(),
            from: h.from,
            to: h.to,
            step: h.step.clone(),
            reason: h.reason.clone(),
            blockers: if i == last {
                run.blockers.clone()
            } else {
                Vec::new()
            },
            at: h.at,
        })
        .collect()
}

/// A wake for the step of `run` in hand under `epoch`.
fn wake_message(run: &Run, epoch: u64, at: Option<chrono::DateTime<Utc>>) -> Outgoing {
    let data = EventData::Wake(WakeRequest {
        run_id: run.id.clone(),
        epoch,
    });
    let event = CloudEvent::new(&data, ROLLGATE_SOURCE, Utc::now());
    Outgoing {
        not_before: at,
        ..Outgoing::event(&event, EventType::Wake)
    }
}
