//! The run store: runs with their history, the alert board, the ids of processed events
//! and the outbox of messages to publish. One SQLite database (WAL, `synchronous=FULL`).
//!
//! A worker's [`Commit`] writes a run's new state, the processed event id and the messages
//! the change must send in one transaction: a redelivered event is seen as processed, and
//! a crash between commit and publish leaves the messages in the outbox for the next start.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::domain::alert::{Alert, AlertStatus};
use crate::domain::run::{Run, RunKind, RunStatus};
use crate::queue::Outgoing;

/// Processed event ids are kept this long for deduplication.
const DEDUP_DAYS: i64 = 14;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("run store: {0}")]
    Sql(#[from] rusqlite::Error),
    /// A stored document does not decode.
    #[error("run store: corrupt record {id}: {error}")]
    Corrupt {
        /// Record id.
        id: String,
        /// Decoder error.
        error: String,
    },
    /// The blocking task was lost.
    #[error("run store: {0}")]
    Task(String),
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
    /// Messages to publish once committed.
    pub outbox: Vec<Outgoing>,
}

/// What became of a commit.
#[derive(Debug, PartialEq, Eq)]
pub enum Committed {
    /// Written.
    Done,
    /// The event was processed before; nothing written.
    AlreadyProcessed,
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

/// The run store.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
}

impl Store {
    /// Opens (creates) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = crate::queue::embedded::open_durable(path)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS runs (
                id TEXT PRIMARY KEY,
                kind TEXT NOT NULL,
                status TEXT NOT NULL,
                target TEXT,
                created_at INTEGER NOT NULL,
                doc TEXT NOT NULL
            );
            CREATE INDEX IF NOT EXISTS runs_status ON runs (status);
            CREATE TABLE IF NOT EXISTS processed_events (
                id TEXT PRIMARY KEY,
                type TEXT NOT NULL,
                processed_at INTEGER NOT NULL
            );
            CREATE TABLE IF NOT EXISTS outbox (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL,
                routing_key TEXT NOT NULL,
                body BLOB NOT NULL,
                not_before INTEGER
            );
            CREATE TABLE IF NOT EXISTS alerts (
                fingerprint TEXT PRIMARY KEY,
                doc TEXT NOT NULL,
                received INTEGER NOT NULL,
                updated_at INTEGER NOT NULL
            );",
        )?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| StoreError::Task("connection lock poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// Answers when the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.with(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    /// One run.
    pub async fn get_run(&self, id: &str) -> Result<Option<Run>, StoreError> {
        let id = id.to_owned();
        self.with(move |c| {
            c.query_row(
                "SELECT id, doc FROM runs WHERE id = ?1",
                params![id],
                row_doc,
            )
            .optional()?
            .map(decode_run)
            .transpose()
        })
        .await
    }

    /// Runs, newest first, optionally of one status.
    pub async fn list_runs(
        &self,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        self.with(move |c| {
            let mut st = c.prepare(
                "SELECT id, doc FROM runs WHERE (?1 IS NULL OR status = ?1)
                 ORDER BY created_at DESC, id DESC LIMIT ?2",
            )?;
            let rows = st.query_map(params![status.map(RunStatus::name), limit as i64], row_doc)?;
            rows.map(|r| decode_run(r?)).collect()
        })
        .await
    }

    /// A run of `kind` for `target` that has not ended, if any.
    pub async fn in_flight(&self, kind: RunKind, target: &str) -> Result<Option<Run>, StoreError> {
        let target = target.to_owned();
        self.with(move |c| {
            c.query_row(
                "SELECT id, doc FROM runs WHERE kind = ?1 AND target = ?2
                 AND status NOT IN ('failed', 'succeeded', 'aborted')
                 ORDER BY created_at LIMIT 1",
                params![kind.name(), target],
                row_doc,
            )
            .optional()?
            .map(decode_run)
            .transpose()
        })
        .await
    }

    /// The oldest run of `kind` that has started and not ended (running, waiting or
    /// halted), other than `except`: it holds the cluster.
    pub async fn active(&self, kind: RunKind, except: &str) -> Result<Option<Run>, StoreError> {
        let except = except.to_owned();
        self.with(move |c| {
            c.query_row(
                "SELECT id, doc FROM runs WHERE kind = ?1 AND id != ?2
                 AND status IN ('running', 'waiting', 'halted')
                 ORDER BY created_at LIMIT 1",
                params![kind.name(), except],
                row_doc,
            )
            .optional()?
            .map(decode_run)
            .transpose()
        })
        .await
    }

    /// Runs that started and have not ended: running, waiting or halted.
    pub async fn in_progress(&self) -> Result<Vec<Run>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT id, doc FROM runs WHERE status IN ('running', 'waiting', 'halted')",
            )?;
            let rows = st.query_map([], row_doc)?;
            rows.map(|r| decode_run(r?)).collect()
        })
        .await
    }

    /// Runs that were in hand or waiting when the process stopped.
    pub async fn unfinished(&self) -> Result<Vec<Run>, StoreError> {
        self.with(|c| {
            let mut st =
                c.prepare("SELECT id, doc FROM runs WHERE status IN ('running', 'waiting')")?;
            let rows = st.query_map([], row_doc)?;
            rows.map(|r| decode_run(r?)).collect()
        })
        .await
    }

    /// Writes `run` unless a run with its id exists. Returns whether it was written.
    pub async fn insert_run_if_absent(&self, run: &Run) -> Result<bool, StoreError> {
        let run = run.clone();
        self.with(move |c| {
            let n = c.execute(
                "INSERT OR IGNORE INTO runs (id, kind, status, target, created_at, doc)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    run.id,
                    run.kind.name(),
                    run.status.name(),
                    run.target,
                    run.created_at.timestamp_millis(),
                    encode(&run)
                ],
            )?;
            Ok(n == 1)
        })
        .await
    }

    /// Whether the event was processed.
    pub async fn is_processed(&self, event_id: &str) -> Result<bool, StoreError> {
        let id = event_id.to_owned();
        self.with(move |c| {
            Ok(c.query_row(
                "SELECT 1 FROM processed_events WHERE id = ?1",
                params![id],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
        })
        .await
    }

    /// Writes a commit atomically.
    pub async fn commit(&self, commit: Commit) -> Result<Committed, StoreError> {
        self.with(move |c| {
            let tx = c.transaction()?;
            let now = Utc::now().timestamp_millis();
            if let Some((id, event_type)) = &commit.event {
                let fresh = tx.execute(
                    "INSERT OR IGNORE INTO processed_events (id, type, processed_at) VALUES (?1, ?2, ?3)",
                    params![id, event_type, now],
                )?;
                if fresh == 0 {
                    return Ok(Committed::AlreadyProcessed);
                }
            }
            for run in &commit.runs {
                tx.execute(
                    "INSERT INTO runs (id, kind, status, target, created_at, doc)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (id) DO UPDATE SET status = excluded.status, doc = excluded.doc",
                    params![
                        run.id,
                        run.kind.name(),
                        run.status.name(),
                        run.target,
                        run.created_at.timestamp_millis(),
                        encode(run)
                    ],
                )?;
            }
            for alert in &commit.alerts {
                tx.execute(
                    "INSERT INTO alerts (fingerprint, doc, received, updated_at) VALUES (?1, ?2, 1, ?3)
                     ON CONFLICT (fingerprint) DO UPDATE
                     SET doc = excluded.doc, received = received + 1, updated_at = excluded.updated_at",
                    params![alert.fingerprint, serde_json::to_string(alert).unwrap_or_default(), now],
                )?;
            }
            for msg in &commit.outbox {
                tx.execute(
                    "INSERT INTO outbox (id, routing_key, body, not_before) VALUES (?1, ?2, ?3, ?4)",
                    params![msg.id, msg.routing_key, msg.body, msg.not_before.map(|t| t.timestamp_millis())],
                )?;
            }
            tx.execute(
                "DELETE FROM processed_events WHERE processed_at < ?1",
                params![now - DEDUP_DAYS * 86_400_000],
            )?;
            tx.commit()?;
            Ok(Committed::Done)
        })
        .await
    }

    /// Messages committed but not yet published, oldest first.
    pub async fn outbox(&self) -> Result<Vec<(i64, Outgoing)>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT seq, id, routing_key, body, not_before FROM outbox ORDER BY seq",
            )?;
            let rows = st.query_map([], |r| {
                let not_before: Option<i64> = r.get(4)?;
                Ok((
                    r.get(0)?,
                    Outgoing {
                        id: r.get(1)?,
                        routing_key: r.get(2)?,
                        body: r.get(3)?,
                        not_before: not_before.and_then(|ms| {
                            chrono::TimeZone::timestamp_millis_opt(&Utc, ms).single()
                        }),
                    },
                ))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    /// Removes a published outbox message.
    pub async fn outbox_sent(&self, seq: i64) -> Result<(), StoreError> {
        self.with(move |c| {
            Ok(c.execute("DELETE FROM outbox WHERE seq = ?1", params![seq])
                .map(drop)?)
        })
        .await
    }

    /// How many runs are in each status.
    pub async fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT status, COUNT(*) FROM runs GROUP BY status")?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (status, n) = row?;
                if let Some(s) = RunStatus::from_name(&status) {
                    out.push((s, n as u64));
                }
            }
            Ok(out)
        })
        .await
    }

    /// The alert board: every alert received and not expired, firing first.
    pub async fn board(&self, now: DateTime<Utc>) -> Result<Vec<BoardEntry>, StoreError> {
        self.with(move |c| {
            let mut st = c.prepare("SELECT fingerprint, doc, received, updated_at FROM alerts")?;
            let rows = st.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (fp, doc, received, updated) = row?;
                let alert: Alert = serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
                    id: fp,
                    error: e.to_string(),
                })?;
                if alert.status == AlertStatus::Firing
                    && alert.ends_at.is_some_and(|end| end <= now)
                {
                    continue;
                }
                out.push(BoardEntry {
                    alert,
                    received: received as u64,
                    updated_at: chrono::TimeZone::timestamp_millis_opt(&Utc, updated)
                        .single()
                        .unwrap_or(now),
                });
            }
            out.sort_by(|a, b| {
                (a.alert.status != AlertStatus::Firing, &a.alert.fingerprint)
                    .cmp(&(b.alert.status != AlertStatus::Firing, &b.alert.fingerprint))
            });
            Ok(out)
        })
        .await
    }
}

fn row_doc(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String)> {
    Ok((r.get(0)?, r.get(1)?))
}

fn decode_run((id, doc): (String, String)) -> Result<Run, StoreError> {
    serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
        id,
        error: e.to_string(),
    })
}

fn encode(run: &Run) -> String {
    serde_json::to_string(run).unwrap_or_default()
}
