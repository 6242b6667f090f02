//! The run store: runs with their history, the alert board, the ids of processed events,
//! the outbox of messages to publish, the numbered log of transitions and the leases
//! that elect one worker among replicas. Two backends behind one [`Store`]: SQLite (one
//! file, the embedded default, [`sqlite`]) and PostgreSQL (several replicas,
//! [`postgres`]).
//!
//! A worker's [`Commit`] writes a run's new state, the processed event id and the messages
//! the change must send in one transaction: a redelivered event is seen as processed, and
//! a crash between commit and publish leaves the messages in the outbox for the next start.
//! What must hold across replicas is enforced by the database, never by one process's
//! memory: processed ids and run ids are keys, at most one run of a kind and target is in
//! flight (a unique index), a new run is claimed in a transaction that sees every other
//! claim, and a worker's commits are fenced by its lease.

pub mod postgres;
pub mod sqlite;
pub mod view;

use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

use crate::domain::alert::{Alert, AlertStatus};
use crate::domain::run::{Run, RunEvent, RunKind, RunStatus, RunSummary, Touched};
use crate::queue::Outgoing;
use crate::sqlite::MigrationError;

/// Processed event ids are kept this long for deduplication.
const DEDUP_DAYS: i64 = 14;
/// A resolved alert stays on the board this long after its last notification, for people
/// to see; then it is removed. Firing alerts are never removed: the board must not forget
/// a blocker, and every gate evaluation reads the whole board, which would otherwise grow
/// by every fingerprint ever resolved.
const RESOLVED_ALERT_HOURS: i64 = 24;

/// The unique indexes behind "one run of a kind and target in flight" and "one
/// Kubernetes upgrade started at a time" (the same SQL on both backends).
const IN_FLIGHT_INDEXES: &str = "
    CREATE UNIQUE INDEX runs_one_in_flight ON runs (kind, target)
        WHERE status NOT IN ('failed', 'succeeded', 'aborted');
    CREATE UNIQUE INDEX runs_one_upgrade_started ON runs (kind)
        WHERE kind = 'k8s-upgrade' AND status IN ('running', 'waiting', 'halted');";

/// The lease the active worker holds.
pub const WORKER_LEASE: &str = "worker";

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("run store: {0}")]
    Sql(#[from] rusqlite::Error),
    /// PostgreSQL failed or could not be reached.
    #[error("run store: PostgreSQL: {0}")]
    Postgres(String),
    /// The database could not be brought to the schema this build knows.
    #[error("run store: {0}")]
    Schema(#[from] MigrationError),
    /// A stored document does not decode.
    #[error("run store: corrupt record {id}: {error}")]
    Corrupt {
        /// The id of the record that does not decode.
        id: String,
        /// Decoder error.
        error: String,
    },
    /// The blocking task was lost.
    #[error("run store: {0}")]
    Task(String),
    /// A fenced commit from a replica that no longer holds the worker lease: another
    /// replica's worker is active; nothing was written.
    #[error("run store: this replica ({holder}) no longer holds the worker lease; nothing written")]
    Fenced {
        /// This replica.
        holder: String,
    },
}

/// What one processed event changes, written atomically.
#[derive(Debug, Default)]
pub struct Commit {
    /// The event, marked processed; `None` for changes not caused by an event.
    pub event: Option<(String, &'static str)>,
    /// Runs to write.
    pub runs: Vec<Run>,
    /// Alerts to put on the board.
    pub alerts: Vec<Alert>,
    /// Alert notifications committed together besides `event` (the worker takes those
    /// that arrived at once in one transaction): each marked processed and its alerts put
    /// on the board, unless it was processed before (then it alone is skipped).
    pub alert_events: Vec<AlertEvent>,
    /// Messages to publish once committed.
    pub outbox: Vec<Outgoing>,
    /// Written only while this replica holds the worker lease (the worker's commits):
    /// a deposed worker that has not noticed yet changes nothing.
    pub fenced: bool,
}

/// One alert notification of a batch: its event id and its alerts.
#[derive(Debug, Clone)]
pub struct AlertEvent {
    /// The event's id.
    pub id: String,
    /// Its alerts.
    pub alerts: Vec<Alert>,
}

/// What became of a commit.
#[derive(Debug, PartialEq, Eq)]
pub enum Committed {
    /// Written; `skipped` of the commit's `alert_events` had been processed before and
    /// were left out.
    Done {
        /// Alert notifications left out as processed before.
        skipped: usize,
    },
    /// The event was processed before; nothing written.
    AlreadyProcessed,
}

/// What became of a claim for a new run.
#[derive(Debug, PartialEq)]
pub enum Claim<R = Run> {
    /// Written with its start message in the outbox, at this outbox number.
    New(i64),
    /// A run of the same kind and target is in flight; nothing written.
    InFlight(R),
    /// Another Kubernetes upgrade (queued or started) holds the cluster; nothing written.
    Held(R),
}

/// An alert as the board holds it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct BoardEntry {
    /// The alert as last received.
    pub alert: Alert,
    /// How many notifications carried it.
    pub received: u64,
    /// Last received.
    pub updated_at: DateTime<Utc>,
}

/// An alert row: fingerprint, document, times received, last update (ms).
type AlertRow = (String, String, i64, i64);
/// A run row: id and one column (the document or the summary).
type RunRow = (String, String);

/// Which stored column a list reads.
#[derive(Debug, Clone, Copy)]
enum Column {
    Doc,
    Summary,
}

/// Sets of runs the worker and the API ask for.
#[derive(Debug, Clone)]
enum Which {
    /// The oldest run of `kind` for `target` that has not ended.
    InFlight { kind: RunKind, target: String },
    /// The oldest run of `kind` that started and has not ended, other than `except`.
    Active { kind: RunKind, except: String },
    /// Runs that started and have not ended: running, waiting or halted.
    InProgress,
    /// Runs in hand or waiting: running or waiting.
    Unfinished,
    /// Every run that has not ended, oldest first.
    NotEnded,
}

/// Which of a run's transitions to read with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Events {
    /// None: a run read for work carries what it adds, not its past.
    None,
    /// Every one.
    All,
    /// From number `from` on (counted from the first), at most `limit` of them.
    Page {
        /// The number of the first to read.
        from: usize,
        /// How many at most; all that follow when none.
        limit: Option<usize>,
    },
    /// The newest `n`.
    Last(usize),
}

impl Events {
    /// The first transition to read and how many at most, of a log holding `logged`.
    fn window(self, logged: usize) -> (usize, usize) {
        match self {
            Self::None => (logged, 0),
            Self::All => (0, logged),
            Self::Page { from, limit } => {
                let from = from.min(logged);
                (from, limit.unwrap_or(logged).min(logged - from))
            }
            Self::Last(n) => (logged.saturating_sub(n), n.min(logged)),
        }
    }
}

/// A run's steps and the transitions read with them, as stored.
struct RunParts {
    steps: Vec<String>,
    /// The documents of the transitions read, in order.
    events: Vec<String>,
    /// The number of the first of them.
    events_from: usize,
    /// How many transitions the log holds for the run.
    logged: usize,
}

/// What a backend stores and reads, as rows; the [`Store`] decodes them and tells the
/// event stream.
#[async_trait::async_trait]
trait Backend: Send + Sync {
    async fn ping(&self) -> Result<(), StoreError>;
    async fn run_doc(&self, id: &str) -> Result<Option<String>, StoreError>;
    /// Run `id`'s steps in order, the documents of the transitions `events` asks for in
    /// order, and how many the log holds.
    async fn run_parts(&self, id: &str, events: Events) -> Result<RunParts, StoreError>;
    async fn newest(
        &self,
        column: Column,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<RunRow>, StoreError>;
    async fn runs(&self, which: Which) -> Result<Vec<RunRow>, StoreError>;
    async fn insert_run_if_absent(&self, run: &RunWrite) -> Result<bool, StoreError>;
    async fn claim(&self, run: &RunWrite, start: &Outgoing) -> Result<Claim<RunRow>, StoreError>;
    async fn is_processed(&self, id: &str) -> Result<bool, StoreError>;
    async fn commit(
        &self,
        commit: &Commit,
        runs: Vec<RunWrite>,
        holder: &str,
    ) -> Result<Committed, StoreError>;
    async fn outbox(&self) -> Result<Vec<(i64, Outgoing)>, StoreError>;
    async fn outbox_sent(&self, seq: i64) -> Result<(), StoreError>;
    async fn count_by_status(&self) -> Result<Vec<(String, i64)>, StoreError>;
    async fn alerts(&self) -> Result<Vec<AlertRow>, StoreError>;
    async fn delivered(&self, sink: &str) -> Result<i64, StoreError>;
    async fn set_delivered(&self, sink: &str, seq: i64) -> Result<(), StoreError>;
    async fn last_event_seq(&self) -> Result<i64, StoreError>;
    /// The time (ms since the epoch) of mark `name`; none when unset or set to nothing.
    async fn mark(&self, name: &str) -> Result<Option<i64>, StoreError>;
    /// Sets mark `name` to `at`; with `keep`, a mark already holding a time keeps it.
    async fn set_mark(&self, name: &str, at: Option<i64>, keep: bool) -> Result<(), StoreError>;
    async fn events_after(
        &self,
        after: i64,
        run: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError>;
    async fn take_lease(&self, name: &str, holder: &str, ttl: Duration)
    -> Result<bool, StoreError>;
    async fn drop_lease(&self, name: &str, holder: &str) -> Result<(), StoreError>;
}

/// The run store.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    name: &'static str,
    /// This process among the replicas: the holder of its leases.
    replica: Arc<str>,
    /// Counts the commits that logged transitions, for the event stream to wait on.
    logged: Arc<tokio::sync::watch::Sender<u64>>,
}

/// The mark that keeps the gate's quiet time.
const QUIET_SINCE: &str = "quiet_since";

impl Store {
    /// Opens (creates) the SQLite store at `path`, migrating it to the schema this build
    /// knows.
    pub fn open(path: &std::path::Path) -> Result<Self, StoreError> {
        Ok(Self::over(
            Arc::new(sqlite::SqliteStore::open(path)?),
            "sqlite",
        ))
    }

    /// Connects to the PostgreSQL store `settings` name, migrating its schema (one replica
    /// at a time) to the one this build knows.
    pub async fn connect(settings: &postgres::PgSettings) -> Result<Self, StoreError> {
        Ok(Self::over(
            Arc::new(postgres::PgStore::connect(settings).await?),
            "postgres",
        ))
    }

    fn over(backend: Arc<dyn Backend>, name: &'static str) -> Self {
        Self {
            backend,
            name,
            replica: replica_id().into(),
            logged: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.name
    }

    /// This process's name among the replicas (pod name or host, and a number unique to
    /// this start).
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// A receiver that changes after every commit of this process that may have logged a
    /// transition (other replicas' commits are seen by polling).
    pub fn transitions_logged(&self) -> tokio::sync::watch::Receiver<u64> {
        self.logged.subscribe()
    }

    fn told_logged(&self) {
        self.logged.send_modify(|n| *n += 1);
    }

    /// Answers when the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.backend.ping().await
    }

    /// One run, to work on: its steps, not its past (`history_before` counts the
    /// transitions the log holds).
    pub async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        self.view_run(id, Events::None).await
    }

    /// One run, to show: its steps and the transitions `events` asks for.
    pub async fn view_run(&self, id: &str, events: Events) -> Result<Option<Run>, StoreError> {
        match self.backend.run_doc(id).await? {
            Some(head) => Ok(Some(self.assemble((id.to_owned(), head), events).await?)),
            None => Ok(None),
        }
    }

    /// One run, to send as JSON: its head decoded, its steps and the transitions `events`
    /// asks for as stored.
    pub async fn view_run_json(
        &self,
        id: &str,
        events: Events,
    ) -> Result<Option<view::RunView>, StoreError> {
        let Some(head) = self.backend.run_doc(id).await? else {
            return Ok(None);
        };
        let parts = self.backend.run_parts(id, events).await?;
        let head: Run = serde_json::from_str(&head).map_err(|e| StoreError::Corrupt {
            id: id.to_owned(),
            error: e.to_string(),
        })?;
        Ok(Some(view::RunView::new(
            head,
            parts.steps,
            parts.events,
            parts.events_from,
            parts.logged,
        )))
    }

    /// The run whose row is `row`, with its steps and the transitions `events` asks for.
    async fn assemble(&self, (id, head): RunRow, events: Events) -> Result<Run, StoreError> {
        let parts = self.backend.run_parts(&id, events).await?;
        let corrupt = |e: serde_json::Error| StoreError::Corrupt {
            id: id.clone(),
            error: e.to_string(),
        };
        let mut run: Run = serde_json::from_str(&head).map_err(corrupt)?;
        run.steps = parts
            .steps
            .iter()
            .map(|doc| serde_json::from_str(doc))
            .collect::<Result<_, _>>()
            .map_err(corrupt)?;
        run.history = parts
            .events
            .iter()
            .map(|doc| serde_json::from_str::<RunEvent>(doc).map(|e| e.transition))
            .collect::<Result<_, _>>()
            .map_err(corrupt)?;
        run.history_before = parts.events_from;
        run.touched = Touched::nothing(parts.logged.max(run.history_len()));
        Ok(run)
    }

    async fn assemble_all(
        &self,
        rows: Vec<RunRow>,
        events: Events,
    ) -> Result<Vec<Run>, StoreError> {
        let mut runs = Vec::with_capacity(rows.len());
        for row in rows {
            runs.push(self.assemble(row, events).await?);
        }
        Ok(runs)
    }

    /// Runs, newest first, optionally of one status.
    pub async fn list_runs(
        &self,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        let rows = self.backend.newest(Column::Doc, status, limit).await?;
        self.assemble_all(rows, Events::All).await
    }

    /// Runs in a line each, newest first; only those in `status` when given.
    pub async fn list_summaries(
        &self,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, StoreError> {
        let rows = self.backend.newest(Column::Summary, status, limit).await?;
        rows.into_iter()
            .map(|(id, summary)| {
                serde_json::from_str(&summary).map_err(|e| StoreError::Corrupt {
                    id,
                    error: e.to_string(),
                })
            })
            .collect()
    }

    async fn first(&self, which: Which) -> Result<Option<Run>, StoreError> {
        let rows = self.backend.runs(which).await?;
        match rows.into_iter().next() {
            Some(row) => Ok(Some(self.assemble(row, Events::None).await?)),
            None => Ok(None),
        }
    }

    async fn all(&self, which: Which) -> Result<Vec<Run>, StoreError> {
        let rows = self.backend.runs(which).await?;
        self.assemble_all(rows, Events::None).await
    }

    /// A run of `kind` for `target` that has not ended, if any.
    pub async fn in_flight(&self, kind: RunKind, target: &str) -> Result<Option<Run>, StoreError> {
        self.first(Which::InFlight {
            kind,
            target: target.to_owned(),
        })
        .await
    }

    /// The oldest run of `kind` that has started and not ended (running, waiting or
    /// halted), other than `except`: it holds the cluster.
    pub async fn active(&self, kind: RunKind, except: &str) -> Result<Option<Run>, StoreError> {
        self.first(Which::Active {
            kind,
            except: except.to_owned(),
        })
        .await
    }

    /// Runs that started and have not ended: running, waiting or halted.
    pub async fn in_progress(&self) -> Result<Vec<Run>, StoreError> {
        self.all(Which::InProgress).await
    }

    /// Every run that has not ended (queued ones too), oldest first.
    pub async fn not_ended(&self) -> Result<Vec<Run>, StoreError> {
        self.all(Which::NotEnded).await
    }

    /// Runs that were in hand or waiting when the process stopped.
    pub async fn unfinished(&self) -> Result<Vec<Run>, StoreError> {
        self.all(Which::Unfinished).await
    }

    /// Writes `run` unless a run with its id exists. Returns whether it was written.
    pub async fn insert_run_if_absent(&self, run: &Run) -> Result<bool, StoreError> {
        let inserted = self
            .backend
            .insert_run_if_absent(&RunWrite::of(&mut run.clone()))
            .await?;
        if inserted {
            self.told_logged();
        }
        Ok(inserted)
    }

    /// Claims a new run: in one transaction that sees every other claim (any replica's),
    /// writes `run` and its `start` message to the outbox, unless a run of its kind and
    /// target is in flight, or (a Kubernetes upgrade) another upgrade, queued or started,
    /// holds the cluster.
    pub async fn claim_run(&self, run: &Run, start: &Outgoing) -> Result<Claim, StoreError> {
        let claim = match self
            .backend
            .claim(&RunWrite::of(&mut run.clone()), start)
            .await?
        {
            Claim::New(seq) => Claim::New(seq),
            Claim::InFlight(row) => Claim::InFlight(self.assemble(row, Events::None).await?),
            Claim::Held(row) => Claim::Held(self.assemble(row, Events::None).await?),
        };
        if matches!(claim, Claim::New(_)) {
            self.told_logged();
        }
        Ok(claim)
    }

    /// Whether the event was processed.
    pub async fn is_processed(&self, event_id: &str) -> Result<bool, StoreError> {
        self.backend.is_processed(event_id).await
    }

    /// Writes a commit atomically; a fenced one only while this replica holds the worker
    /// lease ([`StoreError::Fenced`] otherwise). Of each run it writes what changed since
    /// it was read: its row, the steps it touched, its new transitions.
    pub async fn commit(&self, mut commit: Commit) -> Result<Committed, StoreError> {
        self.commit_keeping(&mut commit).await
    }

    /// [`Store::commit`], leaving the runs in `commit`, as written: a caller that goes on
    /// with them writes only what it changes next.
    pub async fn commit_keeping(&self, commit: &mut Commit) -> Result<Committed, StoreError> {
        let writes = commit.runs.iter_mut().map(RunWrite::of).collect();
        let done = match self.backend.commit(commit, writes, &self.replica).await {
            Ok(done) => done,
            Err(e) => {
                // Nothing was written: the next commit of these runs writes them whole.
                for run in &mut commit.runs {
                    run.touched = Touched::default();
                }
                return Err(e);
            }
        };
        if matches!(done, Committed::Done { .. }) {
            self.told_logged();
        }
        Ok(done)
    }

    /// Messages committed but not yet published, oldest first.
    pub async fn outbox(&self) -> Result<Vec<(i64, Outgoing)>, StoreError> {
        self.backend.outbox().await
    }

    /// Removes a published outbox message.
    pub async fn outbox_sent(&self, seq: i64) -> Result<(), StoreError> {
        self.backend.outbox_sent(seq).await
    }

    /// How many runs are in each status.
    pub async fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        let rows = self.backend.count_by_status().await?;
        Ok(rows
            .into_iter()
            .filter_map(|(status, n)| Some((RunStatus::from_name(&status)?, n as u64)))
            .collect())
    }

    /// The alert board: every alert received and not expired, firing first.
    pub async fn board(&self, now: DateTime<Utc>) -> Result<Vec<BoardEntry>, StoreError> {
        let mut out = Vec::new();
        for (fingerprint, doc, received, updated) in self.backend.alerts().await? {
            let alert: Alert = serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
                id: fingerprint,
                error: e.to_string(),
            })?;
            if alert.status == AlertStatus::Firing && alert.ends_at.is_some_and(|end| end <= now) {
                continue;
            }
            out.push(BoardEntry {
                alert,
                received: received as u64,
                updated_at: millis(updated).unwrap_or(now),
            });
        }
        out.sort_by(|a, b| {
            (a.alert.status != AlertStatus::Firing, &a.alert.fingerprint)
                .cmp(&(b.alert.status != AlertStatus::Firing, &b.alert.fingerprint))
        });
        Ok(out)
    }

    /// The number of the last transition `sink` delivered. A sink met for the first time
    /// starts from the end of the log: it is not told what happened before it existed.
    pub async fn delivered(&self, sink: &str) -> Result<i64, StoreError> {
        self.backend.delivered(sink).await
    }

    /// Records that `sink` delivered every transition up to number `seq`.
    pub async fn set_delivered(&self, sink: &str, seq: i64) -> Result<(), StoreError> {
        self.backend.set_delivered(sink, seq).await
    }

    /// Since when no blocking alert has fired, as the gate was last seen; none while one
    /// fires (or before the gate was first seen open).
    pub async fn quiet_since(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self
            .backend
            .mark(QUIET_SINCE)
            .await?
            .and_then(DateTime::from_timestamp_millis))
    }

    /// Records the gate seen at `now`: closed by a blocking alert ends the quiet time;
    /// open starts it, unless it has already begun (every replica may record it).
    pub async fn record_gate(&self, closed: bool, now: DateTime<Utc>) -> Result<(), StoreError> {
        if closed {
            self.backend.set_mark(QUIET_SINCE, None, false).await
        } else {
            self.backend
                .set_mark(QUIET_SINCE, Some(now.timestamp_millis()), true)
                .await
        }
    }

    /// The number of the newest logged transition (0 when none is).
    pub async fn last_event_seq(&self) -> Result<i64, StoreError> {
        self.backend.last_event_seq().await
    }

    /// Logged transitions numbered above `after`, oldest first, at most `limit`; of run
    /// `run` alone when given.
    pub async fn events_after(
        &self,
        after: i64,
        run: Option<String>,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let rows = self
            .backend
            .events_after(after, run.as_deref(), limit)
            .await?;
        rows.into_iter()
            .map(|(seq, doc)| {
                let mut event: RunEvent =
                    serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
                        id: format!("run event {seq}"),
                        error: e.to_string(),
                    })?;
                event.seq = seq;
                Ok(event)
            })
            .collect()
    }

    /// Takes or renews lease `name` for this replica for `ttl`; whether it holds it. A
    /// lease another replica holds is taken once it has expired, or at once when that
    /// replica's database session is gone (it died). With SQLite (one process per file)
    /// every lease is held.
    pub async fn take_lease(&self, name: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.backend.take_lease(name, &self.replica, ttl).await
    }

    /// Gives lease `name` up, if this replica holds it, so that another takes it at once.
    pub async fn drop_lease(&self, name: &str) -> Result<(), StoreError> {
        self.backend.drop_lease(name, &self.replica).await
    }
}

/// This process's replica name: `POD_NAME` or the host name, and a number unique to
/// this start (a restarted pod is another holder).
fn replica_id() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "rollgate".into());
    let start = uuid::Uuid::now_v7().simple().to_string();
    format!("{host}/{}", &start[start.len() - 8..])
}

fn millis(ms: i64) -> Option<DateTime<Utc>> {
    chrono::TimeZone::timestamp_millis_opt(&Utc, ms).single()
}

/// What a commit writes of one run: its row (the run without its steps and history, and
/// its summary), the steps that changed, and the transitions the log does not hold yet.
/// Its size follows what changed, not the size of the run.
#[derive(Debug, Clone)]
pub struct RunWrite {
    id: String,
    kind: &'static str,
    status: &'static str,
    target: Option<String>,
    created_at: i64,
    /// The run without its steps and history.
    head: String,
    summary: String,
    /// Every step, replacing those stored (`all`), or the ones that changed, by index.
    steps: Vec<(i64, String)>,
    all: bool,
    /// How many transitions the store held when the run was read.
    events_from: i64,
    /// The documents of the transitions after those.
    events: Vec<String>,
}

impl RunWrite {
    /// What `run` changed since it was read; `run` then counts as written.
    fn of(run: &mut Run) -> Self {
        let summary = encode_summary(run);
        let all = run.touched.all;
        let steps = if all {
            run.steps.iter().enumerate().collect::<Vec<_>>()
        } else {
            run.touched
                .steps
                .iter()
                .filter_map(|&i| run.steps.get(i).map(|s| (i, s)))
                .collect()
        }
        .into_iter()
        .map(|(i, step)| (i as i64, serde_json::to_string(step).unwrap_or_default()))
        .collect();
        let events = unlogged_events(run, run.touched.logged);
        let events_from = run.touched.logged as i64;
        let history = std::mem::take(&mut run.history);
        let kept_steps = std::mem::take(&mut run.steps);
        let head = encode(run);
        run.history = history;
        run.steps = kept_steps;
        run.touched = Touched::nothing(run.history_len());
        Self {
            id: run.id.clone(),
            kind: run.kind.name(),
            status: run.status.name(),
            target: run.target.clone(),
            created_at: run.created_at.timestamp_millis(),
            head,
            summary,
            steps,
            all,
            events_from,
            events,
        }
    }

    /// How many transitions the log holds once this is written over `stored` (what the
    /// row said), and the documents to append.
    fn events_after(&self, stored: i64) -> (i64, &[String]) {
        let skip = (stored - self.events_from).clamp(0, self.events.len() as i64) as usize;
        let logged = self.events_from + self.events.len() as i64;
        (logged.max(stored), &self.events[skip..])
    }
}

fn encode_summary(run: &Run) -> String {
    serde_json::to_string(&run.summary()).unwrap_or_default()
}

fn encode(run: &Run) -> String {
    serde_json::to_string(run).unwrap_or_default()
}

/// The documents of `run`'s transitions the log does not hold yet, given that it holds
/// the first `logged`; the newest carries the run's blockers.
fn unlogged_events(run: &Run, logged: usize) -> Vec<String> {
    let last = run.history_len().saturating_sub(1);
    run.history_since(logged)
        .map(|(i, transition)| {
            let event = RunEvent {
                seq: 0,
                run_id: run.id.clone(),
                kind: run.kind,
                target: run.target.clone(),
                transition: transition.clone(),
                blockers: if i == last {
                    run.blockers.clone()
                } else {
                    Vec::new()
                },
            };
            serde_json::to_string(&event).unwrap_or_default()
        })
        .collect()
}

/// The oldest deduplication time to keep, in ms.
fn dedup_horizon(now_ms: i64) -> i64 {
    now_ms - DEDUP_DAYS * 86_400_000
}

/// Resolved alerts last updated before this are removed from the board.
fn resolved_alert_horizon(now_ms: i64) -> i64 {
    now_ms - RESOLVED_ALERT_HOURS * 3_600_000
}

/// When processed ids older than [`DEDUP_DAYS`] and resolved alerts older than
/// [`RESOLVED_ALERT_HOURS`] were last removed: a commit removes them at most once a minute,
/// not at every event.
#[derive(Debug, Default)]
struct Purge(std::sync::atomic::AtomicI64);

impl Purge {
    /// Whether a commit at `now_ms` should remove the old processed ids (and note that it
    /// does).
    fn due(&self, now_ms: i64) -> bool {
        use std::sync::atomic::Ordering;
        let last = self.0.load(Ordering::Relaxed);
        now_ms - last >= 60_000
            && self
                .0
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}
