//! The run store: runs with their history, the alert board, the ids of processed events
//! and the outbox of messages to publish. One SQLite database (WAL, `synchronous=FULL`).
//!
//! A worker's [`Commit`] writes a run's new state, the processed event id and the messages
//! the change must send in one transaction: a redelivered event is seen as processed, and
//! a crash between commit and publish leaves the messages in the outbox for the next start.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, Transaction, params};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::domain::alert::{Alert, AlertStatus};
use crate::domain::run::{Run, RunEvent, RunKind, RunStatus, RunSummary};
use crate::queue::Outgoing;
use crate::sqlite::{self, Migration, MigrationError};

/// Processed event ids are kept this long for deduplication.
const DEDUP_DAYS: i64 = 14;

/// The store's schema, one migration per version (see [`crate::sqlite`]).
const MIGRATIONS: &[Migration] = &[
    tables,
    etcd_start_term_from_note,
    control_plane_apply,
    run_events,
    deliveries,
];

/// Version 1: runs, processed events, the outbox and the alert board.
fn tables(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    // IF NOT EXISTS: files from before versioning have these tables at version 0.
    tx.execute_batch(
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
    Ok(())
}

/// Version 2: steps became typed, and what a later step needs lives in the run's
/// `memory`. Before, an etcd roll's starting raft term was written only into the note of
/// its `etcd-begin` step ("raft term N at the start; …"): carry it into
/// `memory.etcd_start_term`. Every stored run must decode in the new shape, or the
/// migration stops naming the run, and the file stays at version 1.
fn etcd_start_term_from_note(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    rewrite_runs(tx, |value| {
        let term = value["steps"].as_array().and_then(|steps| {
            steps
                .iter()
                .find(|s| s["name"] == "etcd-begin" && s["status"] == "done")?["outcome"]
                .as_str()?
                .strip_prefix("raft term ")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        });
        if let (Some(term), Some(run)) = (term, value.as_object_mut()) {
            run.insert(
                "memory".into(),
                serde_json::json!({ "etcd_start_term": term }),
            );
        }
    })
}

/// Version 3: with several control planes, `kubeadm upgrade apply` runs on the first and
/// `kubeadm upgrade node` on the others, as `control-plane/apply` and
/// `control-plane/upgrade`. Runs stored before were planned for one control plane, whose
/// `control-plane/upgrade` ran `apply`: rename it, so a run in flight keeps doing what it
/// was planned to do.
fn control_plane_apply(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    rewrite_runs(tx, |value| {
        for step in value["steps"].as_array_mut().into_iter().flatten() {
            if step["stage"] == "control-plane" && step["name"] == "upgrade" {
                step["name"] = "apply".into();
            }
        }
    })
}

/// Version 4: every transition of every run, numbered in commit order, for the event
/// stream (the runs stored before are numbered run by run); each run's summary beside it,
/// and an index for the newest first, so that lists read no steps or history.
fn run_events(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    tx.execute_batch(
        "CREATE TABLE run_events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL,
            doc TEXT NOT NULL
        );
        CREATE INDEX run_events_by_run ON run_events (run_id, seq);
        ALTER TABLE runs ADD COLUMN summary TEXT;
        CREATE INDEX runs_newest ON runs (created_at DESC, id DESC);",
    )?;
    let docs: Vec<(String, String)> = tx
        .prepare("SELECT id, doc FROM runs ORDER BY created_at, id")?
        .query_map([], row_doc)?
        .collect::<Result<_, _>>()?;
    for (id, doc) in docs {
        let run: Run = serde_json::from_str(&doc).map_err(|e| {
            MigrationError::data(format!(
                "run {id} does not decode ({e}); remove it from the runs table to go on"
            ))
        })?;
        log_transitions(tx, &run)?;
        tx.execute(
            "UPDATE runs SET summary = ?2 WHERE id = ?1",
            params![id, encode_summary(&run)],
        )?;
    }
    Ok(())
}

/// Version 5: how far each notification sink (Slack) has delivered the log of
/// transitions. Slack starts from the end of the log as it is: the transitions it was told
/// in memory before are not told again.
fn deliveries(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    tx.execute_batch(
        "CREATE TABLE deliveries (sink TEXT PRIMARY KEY, seq INTEGER NOT NULL);
        INSERT INTO deliveries (sink, seq) SELECT 'slack', COALESCE(MAX(seq), 0) FROM run_events;",
    )?;
    Ok(())
}

/// Appends the transitions of `run` the log does not hold yet.
fn log_transitions(tx: &Transaction<'_>, run: &Run) -> rusqlite::Result<()> {
    let logged: i64 = tx.query_row(
        "SELECT COUNT(*) FROM run_events WHERE run_id = ?1",
        params![run.id],
        |r| r.get(0),
    )?;
    let last = run.history.len().saturating_sub(1);
    for (i, transition) in run.history.iter().enumerate().skip(logged as usize) {
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
        tx.execute(
            "INSERT INTO run_events (run_id, doc) VALUES (?1, ?2)",
            params![run.id, serde_json::to_string(&event).unwrap_or_default()],
        )?;
    }
    Ok(())
}

/// Rewrites every stored run's document with `change`; each must then decode as a [`Run`],
/// or the migration stops naming the run.
fn rewrite_runs(
    tx: &Transaction<'_>,
    change: impl Fn(&mut serde_json::Value),
) -> Result<(), MigrationError> {
    let docs: Vec<(String, String)> = tx
        .prepare("SELECT id, doc FROM runs")?
        .query_map([], row_doc)?
        .collect::<Result<_, _>>()?;
    for (id, doc) in docs {
        let undecodable = |e: serde_json::Error| {
            MigrationError::data(format!(
                "run {id} does not decode ({e}); remove it from the runs table to go on"
            ))
        };
        let mut value: serde_json::Value = serde_json::from_str(&doc).map_err(undecodable)?;
        change(&mut value);
        let run: Run = serde_json::from_value(value).map_err(undecodable)?;
        tx.execute(
            "UPDATE runs SET doc = ?2 WHERE id = ?1",
            params![id, encode(&run)],
        )?;
    }
    Ok(())
}

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("run store: {0}")]
    Sql(#[from] rusqlite::Error),
    /// The file could not be brought to the schema this build knows.
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
    /// Counts the commits that logged transitions, for the event stream to wait on.
    logged: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Store {
    /// Opens (creates) the store at `path`, migrating it to the schema this build knows.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = sqlite::open(path, MIGRATIONS)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            logged: Arc::new(tokio::sync::watch::Sender::new(0)),
        })
    }

    /// A receiver that changes after every commit that may have logged a transition.
    pub fn transitions_logged(&self) -> tokio::sync::watch::Receiver<u64> {
        self.logged.subscribe()
    }

    /// The number of the last transition `sink` delivered. A sink met for the first time
    /// starts from the end of the log: it is not told what happened before it existed.
    pub async fn delivered(&self, sink: &str) -> Result<i64, StoreError> {
        let sink = sink.to_owned();
        self.with(move |c| {
            c.execute(
                "INSERT OR IGNORE INTO deliveries (sink, seq)
                 SELECT ?1, COALESCE(MAX(seq), 0) FROM run_events",
                params![sink],
            )?;
            Ok(c.query_row(
                "SELECT seq FROM deliveries WHERE sink = ?1",
                params![sink],
                |r| r.get(0),
            )?)
        })
        .await
    }

    /// Records that `sink` delivered every transition up to number `seq`.
    pub async fn set_delivered(&self, sink: &str, seq: i64) -> Result<(), StoreError> {
        let sink = sink.to_owned();
        self.with(move |c| {
            c.execute(
                "UPDATE deliveries SET seq = MAX(seq, ?2) WHERE sink = ?1",
                params![sink, seq],
            )?;
            Ok(())
        })
        .await
    }

    /// The number of the newest logged transition (0 when none is).
    pub async fn last_event_seq(&self) -> Result<i64, StoreError> {
        self.with(|c| {
            Ok(
                c.query_row("SELECT COALESCE(MAX(seq), 0) FROM run_events", [], |r| {
                    r.get(0)
                })?,
            )
        })
        .await
    }

    /// Logged transitions numbered above `after`, oldest first, at most `limit`; of run
    /// `run` alone when given.
    pub async fn events_after(
        &self,
        after: i64,
        run: Option<String>,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        self.with(move |c| {
            let mut st = c.prepare(
                "SELECT seq, doc FROM run_events
                 WHERE seq > ?1 AND (?2 IS NULL OR run_id = ?2)
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = st.query_map(params![after, run, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })?;
            rows.map(|row| {
                let (seq, doc) = row?;
                let mut event: RunEvent =
                    serde_json::from_str(&doc).map_err(|e| StoreError::Corrupt {
                        id: format!("run event {seq}"),
                        error: e.to_string(),
                    })?;
                event.seq = seq;
                Ok(event)
            })
            .collect()
        })
        .await
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
        self.with(move |c| first_run(c, "SELECT id, doc FROM runs WHERE id = ?1", params![id]))
            .await
    }

    /// Runs, newest first, optionally of one status.
    pub async fn list_runs(
        &self,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<Run>, StoreError> {
        self.with(move |c| {
            newest(c, "doc", status, limit)?
                .into_iter()
                .map(decode_run)
                .collect()
        })
        .await
    }

    /// Runs in a line each, newest first; only those in `status` when given.
    pub async fn list_summaries(
        &self,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, StoreError> {
        self.with(move |c| {
            newest(c, "summary", status, limit)?
                .into_iter()
                .map(|(id, summary)| {
                    serde_json::from_str(&summary).map_err(|e| StoreError::Corrupt {
                        id,
                        error: e.to_string(),
                    })
                })
                .collect()
        })
        .await
    }

    /// A run of `kind` for `target` that has not ended, if any.
    pub async fn in_flight(&self, kind: RunKind, target: &str) -> Result<Option<Run>, StoreError> {
        let target = target.to_owned();
        self.with(move |c| {
            first_run(
                c,
                "SELECT id, doc FROM runs WHERE kind = ?1 AND target = ?2
                 AND status NOT IN ('failed', 'succeeded', 'aborted')
                 ORDER BY created_at LIMIT 1",
                params![kind.name(), target],
            )
        })
        .await
    }

    /// The oldest run of `kind` that has started and not ended (running, waiting or
    /// halted), other than `except`: it holds the cluster.
    pub async fn active(&self, kind: RunKind, except: &str) -> Result<Option<Run>, StoreError> {
        let except = except.to_owned();
        self.with(move |c| {
            first_run(
                c,
                "SELECT id, doc FROM runs WHERE kind = ?1 AND id != ?2
                 AND status IN ('running', 'waiting', 'halted')
                 ORDER BY created_at LIMIT 1",
                params![kind.name(), except],
            )
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
            let tx = c.transaction()?;
            let n = tx.execute(
                "INSERT OR IGNORE INTO runs (id, kind, status, target, created_at, doc, summary)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                run_row(&run),
            )?;
            if n == 1 {
                log_transitions(&tx, &run)?;
            }
            tx.commit()?;
            Ok(n == 1)
        })
        .await
        .inspect(|inserted| {
            if *inserted {
                self.logged.send_modify(|n| *n += 1);
            }
        })
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
                    "INSERT INTO runs (id, kind, status, target, created_at, doc, summary)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (id) DO UPDATE
                     SET status = excluded.status, doc = excluded.doc, summary = excluded.summary",
                    run_row(run),
                )?;
                log_transitions(&tx, run)?;
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
        .inspect(|done| {
            if *done == Committed::Done {
                self.logged.send_modify(|n| *n += 1);
            }
        })
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

/// The columns of `run`'s row: id, kind, status, target, created_at, doc.
fn run_row(run: &Run) -> (&str, &str, &str, Option<&str>, i64, String, String) {
    (
        &run.id,
        run.kind.name(),
        run.status.name(),
        run.target.as_deref(),
        run.created_at.timestamp_millis(),
        encode(run),
        encode_summary(run),
    )
}

fn encode_summary(run: &Run) -> String {
    serde_json::to_string(&run.summary()).unwrap_or_default()
}

/// `(id, column)` of the newest `limit` runs, only those in `status` when given; `column`
/// is `doc` or `summary`.
fn newest(
    c: &Connection,
    column: &'static str,
    status: Option<RunStatus>,
    limit: usize,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut st = c.prepare(&format!(
        "SELECT id, {column} FROM runs WHERE (?1 IS NULL OR status = ?1)
         ORDER BY created_at DESC, id DESC LIMIT ?2"
    ))?;
    let rows = st.query_map(params![status.map(RunStatus::name), limit as i64], row_doc)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The first run `sql` selects (as `id, doc`), if any.
fn first_run(
    c: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Option<Run>, StoreError> {
    c.query_row(sql, params, row_doc)
        .optional()?
        .map(decode_run)
        .transpose()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::control_planes::{ControlPlaneAction, EtcdFacts, EtcdMemberFacts, Kubeadm};
    use crate::domain::etcd_roll::{Action, initial_steps as roll_steps, steps_for};
    use crate::domain::event::{DetectionRequest, StageSelection, UpgradeKind};
    use crate::domain::k8s_upgrade::{self as plan, ClusterFacts, NodeFacts, PlanSettings, Role};
    use crate::domain::run::{Step, StepStatus};
    use crate::domain::version::Version;

    fn node(name: &str, role: Role, containerd: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            role,
            kubelet: Version::parse("1.34.2").unwrap(),
            containerd: Version::parse(containerd).ok(),
            ready: true,
            address: None,
        }
    }

    /// A minor upgrade of a cluster whose control plane's containerd is behind, with the
    /// steps of every control-plane action: every upgrade step kind appears.
    fn full_plan() -> Vec<Step> {
        let request = DetectionRequest {
            target_version: Version::parse("1.35.0").unwrap(),
            kind: UpgradeKind::Minor,
            dry_run: false,
            stages: StageSelection::all(),
        };
        let facts = ClusterFacts {
            nodes: vec![
                node("cp", Role::ControlPlane, "1.7.20"),
                node("w1", Role::Worker, "1.7.24"),
                node("w2", Role::Worker, "1.7.24"),
            ],
        };
        let etcd = EtcdFacts {
            members: vec![EtcdMemberFacts {
                id: 1,
                name: "m0".into(),
                answering: true,
                raft_index: 1,
                raft_term: 1,
            }],
            leader: Some(1),
            alarms: Vec::new(),
        };
        let mut steps = plan::initial_steps(&request);
        steps.extend(
            plan::plan(&request, &facts, Some(&etcd), &PlanSettings::default())
                .unwrap()
                .steps,
        );
        for kubeadm in [Kubeadm::Apply, Kubeadm::Node] {
            steps.extend(plan::control_plane_steps(&ControlPlaneAction::Upgrade {
                node: "cp".into(),
                kubeadm,
            }));
        }
        steps.extend(plan::control_plane_steps(&ControlPlaneAction::MoveLeader {
            from: "cp".into(),
            to: "cp".into(),
        }));
        steps
    }

    fn run_of(kind: RunKind, steps: Vec<Step>) -> Run {
        Run::new(
            uuid::Uuid::now_v7().to_string(),
            kind,
            serde_json::json!({}),
            Some("1.35.0".into()),
            steps,
            Utc::now(),
            "accepted",
        )
    }

    #[tokio::test]
    async fn every_step_kind_of_a_full_plan_round_trips_through_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        let upgrade = run_of(RunKind::K8sUpgrade, full_plan());
        let names: std::collections::BTreeSet<&str> =
            upgrade.steps.iter().map(|s| s.kind.name()).collect();
        assert_eq!(names.len(), 24, "every upgrade step kind: {names:?}");
        let mut roll_steps = roll_steps();
        for action in [
            Action::Restart {
                id: 1,
                name: "etcd-1".into(),
            },
            Action::MoveLeader {
                to: 1,
                name: "etcd-1".into(),
            },
            Action::Done,
        ] {
            roll_steps.extend(steps_for(&action));
        }
        let mut roll = run_of(RunKind::EtcdRoll, roll_steps);
        roll.memory.etcd_start_term = Some(4);
        roll.memory.leader_moves = vec!["cp-1 -> cp-2".into()];
        for run in [upgrade, roll] {
            assert!(store.insert_run_if_absent(&run).await.unwrap());
            let back = store.get_run(&run.id).await.unwrap().unwrap();
            assert_eq!(back, run);
        }
    }

    /// A version-1 file as rollgate wrote it before steps were typed.
    fn version_1_file(path: &Path, docs: &[(&str, &str, serde_json::Value)]) {
        let mut conn = Connection::open(path).unwrap();
        let tx = conn.transaction().unwrap();
        tables(&tx).unwrap();
        for (id, kind, doc) in docs {
            tx.execute(
                "INSERT INTO runs (id, kind, status, target, created_at, doc) VALUES (?1, ?2, 'running', NULL, 0, ?3)",
                params![id, kind, doc.to_string()],
            )
            .unwrap();
        }
        tx.pragma_update(None, "user_version", 1).unwrap();
        tx.commit().unwrap();
    }

    fn old_roll_doc(begin_outcome: &str, restart_name: &str) -> serde_json::Value {
        let mut run = run_of(RunKind::EtcdRoll, roll_steps());
        run.steps[0].status = StepStatus::Done;
        run.steps[0].outcome = Some(begin_outcome.into());
        let mut doc = serde_json::to_value(&run).unwrap();
        doc.as_object_mut().unwrap().remove("memory");
        doc["steps"][1]["name"] = restart_name.into();
        doc
    }

    #[tokio::test]
    async fn a_version_1_store_is_migrated_with_the_start_term_out_of_the_note() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let doc = old_roll_doc(
            "raft term 17 at the start; leader etcd-1; 3 members, 3 to roll",
            "etcd-next",
        );
        let fresh = old_roll_doc("refused", "etcd-next");
        version_1_file(
            &path,
            &[("old", "etcd-roll", doc), ("fresh", "etcd-roll", fresh)],
        );
        let store = Store::open(&path).unwrap();
        let run = store.get_run("old").await.unwrap().unwrap();
        assert_eq!(run.memory.etcd_start_term, Some(17));
        assert_eq!(
            run.steps[1].kind,
            crate::domain::step::EtcdRollStep::Next.into()
        );
        let fresh = store.get_run("fresh").await.unwrap().unwrap();
        assert_eq!(fresh.memory.etcd_start_term, None);
        // The log of transitions is filled from the stored histories, run by run.
        let logged = store.events_after(0, None, 100).await.unwrap();
        let histories = run.history.len() + fresh.history.len();
        assert_eq!(logged.len(), histories);
        assert!(logged.windows(2).all(|w| w[0].seq < w[1].seq));
        let conn = store.conn.lock().unwrap();
        assert_eq!(sqlite::version(&conn).unwrap(), MIGRATIONS.len() as u32);
    }

    #[tokio::test]
    async fn transitions_are_logged_once_in_commit_order_and_read_after_a_number() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        let mut logged = store.transitions_logged();
        let mut a = run_of(RunKind::K8sUpgrade, full_plan());
        let b = run_of(RunKind::EtcdRoll, Vec::new());
        assert!(store.insert_run_if_absent(&a).await.unwrap());
        assert!(logged.has_changed().unwrap(), "the stream is told");
        logged.mark_unchanged();
        assert!(store.insert_run_if_absent(&b).await.unwrap());
        assert!(
            !store.insert_run_if_absent(&b).await.unwrap(),
            "logged once"
        );
        let now = Utc::now();
        a.transition(RunStatus::Running, "step plan (attempt 1)", now);
        a.transition(RunStatus::Waiting, "gate closed", now);
        a.blockers = vec!["NodeNotReady".into()];
        for _ in 0..2 {
            // The same state committed twice logs nothing new the second time.
            let commit = Commit {
                runs: vec![a.clone()],
                ..Commit::default()
            };
            store.commit(commit).await.unwrap();
        }
        let all = store.events_after(0, None, 100).await.unwrap();
        let order: Vec<(&str, RunStatus)> = all
            .iter()
            .map(|e| (e.run_id.as_str(), e.transition.to))
            .collect();
        assert_eq!(
            order,
            [
                (a.id.as_str(), RunStatus::Queued),
                (b.id.as_str(), RunStatus::Queued),
                (a.id.as_str(), RunStatus::Running),
                (a.id.as_str(), RunStatus::Waiting),
            ]
        );
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(all[3].blockers, ["NodeNotReady"], "the newest carries them");
        assert!(all[2].blockers.is_empty());
        assert_eq!(store.last_event_seq().await.unwrap(), all[3].seq);
        let of_a = store
            .events_after(all[0].seq, Some(a.id.clone()), 100)
            .await
            .unwrap();
        assert_eq!(of_a.len(), 2);
        assert_eq!(
            store.events_after(0, None, 2).await.unwrap().len(),
            2,
            "a page at a time"
        );
    }

    #[test]
    fn a_stored_run_of_no_known_shape_stops_the_migration_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let doc = old_roll_doc("raft term 3 at the start", "etcd-nxet");
        version_1_file(&path, &[("typo", "etcd-roll", doc)]);
        let Err(err) = Store::open(&path) else {
            panic!("a run with an unknown step was migrated");
        };
        let err = crate::error_chain(&err);
        assert!(
            err.contains("store.db: migration to version 2: run typo does not decode")
                && err.contains("step etcd-roll/etcd-nxet: no etcd roll step has this name"),
            "{err}"
        );
        let conn = Connection::open(&path).unwrap();
        assert_eq!(sqlite::version(&conn).unwrap(), 1, "left at version 1");
    }

    #[tokio::test]
    async fn a_version_2_upgrade_keeps_running_apply_on_its_single_control_plane() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let run = run_of(RunKind::K8sUpgrade, Vec::new());
        let mut doc = serde_json::to_value(&run).unwrap();
        let old = serde_json::json!({"stage": "control-plane", "name": "upgrade", "node": "cp", "status": "pending", "attempts": 0});
        doc["steps"].as_array_mut().unwrap().push(old);
        version_1_file(&path, &[]);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute(
                "INSERT INTO runs (id, kind, status, target, created_at, doc) VALUES ('v2', 'k8s-upgrade', 'running', NULL, 0, ?1)",
                params![doc.to_string()],
            )
            .unwrap();
            conn.pragma_update(None, "user_version", 2).unwrap();
        }
        let store = Store::open(&path).unwrap();
        let back = store.get_run("v2").await.unwrap().unwrap();
        let labels: Vec<String> = back.steps.iter().map(Step::label).collect();
        assert_eq!(labels, ["control-plane/apply@cp"]);
    }

    #[test]
    fn an_empty_file_gets_the_newest_schema() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        let conn = store.conn.lock().unwrap();
        assert_eq!(sqlite::version(&conn).unwrap(), MIGRATIONS.len() as u32);
    }
}
