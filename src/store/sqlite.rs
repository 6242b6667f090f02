//! The SQLite backend: one file (WAL, `synchronous=FULL`) behind one connection, the
//! embedded default. One process opens it (`serve` locks its data directory), so every
//! lease is held and transactions are serialized by the connection.

use rusqlite::{Connection, OptionalExtension, Transaction, params};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

use super::{
    AlertRow, Backend, Claim, Column, Commit, Committed, Events, IN_FLIGHT_INDEXES, Purge,
    RunParts, RunRow, RunWrite, StoreError, Which, dedup_horizon, encode, encode_summary,
    resolved_alert_horizon, unlogged_events,
};
use crate::domain::alert::{Alert, newest_by_fingerprint};
use crate::domain::run::{Run, RunStatus};
use crate::queue::Outgoing;
use crate::sqlite::{self, Migration, MigrationError};

/// The store's schema, one migration per version (see [`crate::sqlite`]).
const MIGRATIONS: &[Migration] = &[
    tables,
    etcd_start_term_from_note,
    control_plane_apply,
    run_events,
    deliveries,
    one_in_flight,
    steps_apart,
    marks,
    held_steps,
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

/// Version 8: named times kept across restarts (the gate's `quiet_since`); a NULL time is
/// a mark that is set to nothing (the gate is closed).
fn marks(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    tx.execute_batch("CREATE TABLE marks (name TEXT PRIMARY KEY, at INTEGER);")?;
    Ok(())
}

/// Version 9: what holds a waiting step is a field (`held`: `gate` or `approval`), no
/// longer read from the first words of its outcome. The steps stored waiting get it from
/// those words, once, here, so that a run held when rollgate was upgraded is still woken
/// by a board change, and still approvable.
fn held_steps(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    tx.execute_batch(HELD_STEPS)?;
    Ok(())
}

/// The statements of version 9.
const HELD_STEPS: &str = "
    UPDATE run_steps SET doc = json_set(doc, '$.held', 'gate')
        WHERE json_extract(doc, '$.status') = 'waiting'
        AND substr(json_extract(doc, '$.outcome'), 1, 13) = 'gate closed: ';
    UPDATE run_steps SET doc = json_set(doc, '$.held', 'approval')
        WHERE json_extract(doc, '$.status') = 'waiting'
        AND substr(json_extract(doc, '$.outcome'), 1, 18) = 'waits for approval';";

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

/// Version 6: what the worker and the intake check before they write a run, as unique
/// indexes: one run of a kind and target in flight, one Kubernetes upgrade started. A file
/// that breaks either stops the migration naming the runs.
fn one_in_flight(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    let twice: Option<(String, String, String)> = tx
        .query_row(
            "SELECT kind, target, group_concat(id, ', ') FROM runs
             WHERE status NOT IN ('failed', 'succeeded', 'aborted') AND target IS NOT NULL
             GROUP BY kind, target HAVING COUNT(*) > 1 LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    if let Some((kind, target, ids)) = twice {
        return Err(MigrationError::data(format!(
            "runs {ids} are all {kind} runs for {target} in flight; abort all but one (rollgate runs abort) with the rollgate that wrote this file"
        )));
    }
    tx.execute_batch(IN_FLIGHT_INDEXES)?;
    Ok(())
}

/// Version 7: a run's steps in rows of their own and its history in the log alone, so that
/// a commit writes the steps that changed and the new transitions, not the whole run. Runs
/// in flight are split as they stand; their transitions are all in the log already.
fn steps_apart(tx: &Transaction<'_>) -> Result<(), MigrationError> {
    tx.execute_batch(
        "CREATE TABLE run_steps (
            run_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            doc TEXT NOT NULL,
            PRIMARY KEY (run_id, idx)
        );
        ALTER TABLE runs ADD COLUMN events_logged INTEGER NOT NULL DEFAULT 0;",
    )?;
    let docs: Vec<(String, String)> = tx
        .prepare("SELECT id, doc FROM runs")?
        .query_map([], row_doc)?
        .collect::<Result<_, _>>()?;
    for (id, doc) in docs {
        let mut run: Run = serde_json::from_str(&doc).map_err(|e| {
            MigrationError::data(format!(
                "run {id} does not decode ({e}); remove it from the runs table to go on"
            ))
        })?;
        log_transitions(tx, &run)?;
        for (idx, step) in run.steps.iter().enumerate() {
            tx.execute(
                "INSERT INTO run_steps (run_id, idx, doc) VALUES (?1, ?2, ?3)",
                params![
                    id,
                    idx as i64,
                    serde_json::to_string(step).unwrap_or_default()
                ],
            )?;
        }
        let logged = run.history.len() as i64;
        run.steps.clear();
        run.history.clear();
        tx.execute(
            "UPDATE runs SET doc = ?2, events_logged = ?3 WHERE id = ?1",
            params![id, encode(&run), logged],
        )?;
    }
    Ok(())
}

/// Writes `run`'s row, the steps it changed and its new transitions, replacing a stored
/// row when `replace`; returns whether it wrote.
fn write_run(tx: &Transaction<'_>, run: &RunWrite, replace: bool) -> rusqlite::Result<bool> {
    let stored: Option<i64> = tx
        .prepare_cached("SELECT events_logged FROM runs WHERE id = ?1")?
        .query_row(params![run.id], |r| r.get(0))
        .optional()?;
    if stored.is_some() && !replace {
        return Ok(false);
    }
    let (logged, events) = run.events_after(stored.unwrap_or(0));
    tx.prepare_cached(
        "INSERT INTO runs (id, kind, status, target, created_at, doc, summary, events_logged)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, doc = excluded.doc,
         summary = excluded.summary, events_logged = excluded.events_logged",
    )?
    .execute(params![
        run.id,
        run.kind,
        run.status,
        run.target,
        run.created_at,
        run.head,
        run.summary,
        logged
    ])?;
    if run.all {
        tx.prepare_cached("DELETE FROM run_steps WHERE run_id = ?1")?
            .execute(params![run.id])?;
    }
    let mut step = tx.prepare_cached(
        "INSERT INTO run_steps (run_id, idx, doc) VALUES (?1, ?2, ?3)
         ON CONFLICT (run_id, idx) DO UPDATE SET doc = excluded.doc",
    )?;
    for (idx, doc) in &run.steps {
        step.execute(params![run.id, idx, doc])?;
    }
    let mut event = tx.prepare_cached("INSERT INTO run_events (run_id, doc) VALUES (?1, ?2)")?;
    for doc in events {
        event.execute(params![run.id, doc])?;
    }
    Ok(true)
}

/// Appends the transitions of `run` the log does not hold yet (migrations: counted).
fn log_transitions(tx: &Transaction<'_>, run: &Run) -> rusqlite::Result<()> {
    let logged: i64 = tx.query_row(
        "SELECT COUNT(*) FROM run_events WHERE run_id = ?1",
        params![run.id],
        |r| r.get(0),
    )?;
    for doc in unlogged_events(run, logged as usize) {
        tx.execute(
            "INSERT INTO run_events (run_id, doc) VALUES (?1, ?2)",
            params![run.id, doc],
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

/// The SQLite store.
pub struct SqliteStore {
    /// The one connection that writes: the engine's, and the reads that decide a write.
    conn: Arc<Mutex<Connection>>,
    /// A read-only connection for the views (a run, lists, the log, the counts), so that
    /// the API and the status page neither wait for the engine's writes nor hold them up;
    /// the writing one for an in-memory store.
    reader: Arc<Mutex<Connection>>,
    purge: Arc<Purge>,
}

impl SqliteStore {
    /// Opens (creates) the store at `path`, migrating it to the schema this build knows.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Arc::new(Mutex::new(sqlite::open(path, MIGRATIONS)?));
        let reader = match sqlite::open_reader(path)? {
            Some(reader) => Arc::new(Mutex::new(reader)),
            None => conn.clone(),
        };
        Ok(Self {
            conn,
            reader,
            purge: Arc::default(),
        })
    }

    /// Runs `f` on the writing connection.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        on(self.conn.clone(), f).await
    }

    /// Runs `f`, which only reads, on the reading connection.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        on(self.reader.clone(), f).await
    }
}

async fn on<T: Send + 'static>(
    conn: Arc<Mutex<Connection>>,
    f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    // Waiting for the connection here, not in a blocking thread, keeps the blocking pool
    // at one thread per connection: a thousand nodes' steps queue as tasks, not as
    // blocking threads parked on a lock.
    let mut guard = conn.lock_owned().await;
    tokio::task::spawn_blocking(move || f(&mut guard))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
}

const TERMINAL: &str = "('failed', 'succeeded', 'aborted')";
const STARTED: &str = "('running', 'waiting', 'halted')";

fn rows(
    c: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<RunRow>, StoreError> {
    let mut st = c.prepare(sql)?;
    let rows = st.query_map(params, row_doc)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

fn row_doc(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok((r.get(0)?, r.get(1)?))
}

/// The oldest run of `kind` for `target` in flight, and (an upgrade) the oldest other
/// upgrade queued or started.
fn in_flight_and_holder(
    c: &Connection,
    run: &RunWrite,
) -> Result<(Option<RunRow>, Option<RunRow>), StoreError> {
    let same = c
        .query_row(
            &format!(
                "SELECT id, doc FROM runs WHERE kind = ?1 AND target = ?2
                 AND status NOT IN {TERMINAL} ORDER BY created_at LIMIT 1"
            ),
            params![run.kind, run.target],
            row_doc,
        )
        .optional()?;
    let holder = if run.kind == crate::domain::upgrade_step::K8S_UPGRADE.name() && same.is_none() {
        c.query_row(
            &format!(
                "SELECT id, doc FROM runs WHERE kind = ?1 AND id != ?2
                 AND status NOT IN {TERMINAL} ORDER BY created_at LIMIT 1"
            ),
            params![run.kind, run.id],
            row_doc,
        )
        .optional()?
    } else {
        None
    };
    Ok((same, holder))
}

#[async_trait::async_trait]
impl Backend for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.with(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?))
            .await
    }

    async fn run_doc(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            Ok(
                c.query_row("SELECT doc FROM runs WHERE id = ?1", params![id], |r| {
                    r.get(0)
                })
                .optional()?,
            )
        })
        .await
    }

    async fn run_parts(&self, id: &str, events: Events) -> Result<RunParts, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            let c = c.transaction()?;
            let logged: i64 = c
                .prepare_cached("SELECT events_logged FROM runs WHERE id = ?1")?
                .query_row(params![id], |r| r.get(0))
                .optional()?
                .unwrap_or(0);
            let logged = usize::try_from(logged).unwrap_or(0);
            let steps = c
                .prepare_cached("SELECT doc FROM run_steps WHERE run_id = ?1 ORDER BY idx")?
                .query_map(params![id], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            let (from, limit) = events.window(logged);
            let events = if limit == 0 {
                Vec::new()
            } else {
                c.prepare_cached(
                    "SELECT doc FROM run_events WHERE run_id = ?1 ORDER BY seq LIMIT ?2 OFFSET ?3",
                )?
                .query_map(params![id, limit as i64, from as i64], |r| r.get(0))?
                .collect::<Result<_, _>>()?
            };
            Ok(RunParts {
                steps,
                events,
                events_from: from,
                logged,
            })
        })
        .await
    }

    async fn newest(
        &self,
        column: Column,
        status: Option<RunStatus>,
        limit: usize,
    ) -> Result<Vec<RunRow>, StoreError> {
        let column = match column {
            Column::Doc => "doc",
            Column::Summary => "summary",
        };
        self.read(move |c| {
            rows(
                c,
                &format!(
                    "SELECT id, {column} FROM runs WHERE (?1 IS NULL OR status = ?1)
                     ORDER BY created_at DESC, id DESC LIMIT ?2"
                ),
                params![status.map(RunStatus::name), limit as i64],
            )
        })
        .await
    }

    async fn runs(&self, which: Which) -> Result<Vec<RunRow>, StoreError> {
        self.with(move |c| match which {
            Which::InFlight { kind, target } => rows(
                c,
                &format!(
                    "SELECT id, doc FROM runs WHERE kind = ?1 AND target = ?2
                     AND status NOT IN {TERMINAL} ORDER BY created_at LIMIT 1"
                ),
                params![kind.name(), target],
            ),
            Which::Active { kind, except } => rows(
                c,
                &format!(
                    "SELECT id, doc FROM runs WHERE kind = ?1 AND id != ?2
                     AND status IN {STARTED} ORDER BY created_at LIMIT 1"
                ),
                params![kind.name(), except],
            ),
            Which::InProgress => rows(
                c,
                &format!("SELECT id, doc FROM runs WHERE status IN {STARTED}"),
                [],
            ),
            Which::Unfinished => rows(
                c,
                "SELECT id, doc FROM runs WHERE status IN ('running', 'waiting')",
                [],
            ),
            Which::NotEnded => rows(
                c,
                &format!(
                    "SELECT id, doc FROM runs WHERE status NOT IN {TERMINAL} ORDER BY created_at"
                ),
                [],
            ),
        })
        .await
    }

    async fn insert_run_if_absent(&self, run: &RunWrite) -> Result<bool, StoreError> {
        let run = run.clone();
        self.with(move |c| {
            let tx = c.transaction()?;
            let written = write_run(&tx, &run, false)?;
            tx.commit()?;
            Ok(written)
        })
        .await
    }

    async fn claim(&self, run: &RunWrite, start: &Outgoing) -> Result<Claim<RunRow>, StoreError> {
        let (run, start) = (run.clone(), start.clone());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            match in_flight_and_holder(&tx, &run)? {
                (Some(same), _) => return Ok(Claim::InFlight(same)),
                (None, Some(holder)) => return Ok(Claim::Held(holder)),
                (None, None) => {}
            }
            write_run(&tx, &run, false)?;
            let seq = insert_outgoing(&tx, &start)?;
            tx.commit()?;
            Ok(Claim::New(seq))
        })
        .await
    }

    async fn is_processed(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
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

    async fn commit(
        &self,
        commit: &Commit,
        runs: Vec<RunWrite>,
        _holder: &str,
    ) -> Result<Committed, StoreError> {
        let (event, alerts, alert_events, outbox) = (
            commit.event.clone(),
            commit.alerts.clone(),
            commit.alert_events.clone(),
            commit.outbox.clone(),
        );
        let purge = self.purge.clone();
        self.with(move |c| {
            let tx = c.transaction()?;
            let now = chrono::Utc::now().timestamp_millis();
            if let Some((id, event_type)) = &event {
                let fresh = tx.execute(
                    "INSERT OR IGNORE INTO processed_events (id, type, processed_at) VALUES (?1, ?2, ?3)",
                    params![id, event_type, now],
                )?;
                if fresh == 0 {
                    return Ok(Committed::AlreadyProcessed);
                }
            }
            for run in &runs {
                write_run(&tx, run, true)?;
            }
            let mut board = alerts.iter().collect::<Vec<_>>();
            let mut skipped = 0;
            for batch in &alert_events {
                let fresh = tx.execute(
                    "INSERT OR IGNORE INTO processed_events (id, type, processed_at) VALUES (?1, 'alerts', ?2)",
                    params![batch.id, now],
                )?;
                if fresh == 1 {
                    board.extend(&batch.alerts);
                } else {
                    skipped += 1;
                }
            }
            for alert in newest_by_fingerprint(board) {
                let stored: Option<String> = tx
                    .query_row(
                        "SELECT doc FROM alerts WHERE fingerprint = ?1",
                        params![alert.fingerprint],
                        |r| r.get(0),
                    )
                    .optional()?;
                let stale = stored
                    .and_then(|doc| serde_json::from_str::<Alert>(&doc).ok())
                    .is_some_and(|stored| !alert.supersedes(&stored));
                if stale {
                    // Counted as received; the board keeps the newer notification.
                    tx.execute(
                        "UPDATE alerts SET received = received + 1 WHERE fingerprint = ?1",
                        params![alert.fingerprint],
                    )?;
                    continue;
                }
                tx.execute(
                    "INSERT INTO alerts (fingerprint, doc, received, updated_at) VALUES (?1, ?2, 1, ?3)
                     ON CONFLICT (fingerprint) DO UPDATE
                     SET doc = excluded.doc, received = received + 1, updated_at = excluded.updated_at",
                    params![alert.fingerprint, serde_json::to_string(alert).unwrap_or_default(), now],
                )?;
            }
            for msg in &outbox {
                insert_outgoing(&tx, msg)?;
            }
            if purge.due(now) {
                tx.execute(
                    "DELETE FROM processed_events WHERE processed_at < ?1",
                    params![dedup_horizon(now)],
                )?;
                tx.execute(
                    "DELETE FROM alerts WHERE updated_at < ?1 AND json_extract(doc, '$.status') = 'resolved'",
                    params![resolved_alert_horizon(now)],
                )?;
            }
            tx.commit()?;
            Ok(Committed::Done { skipped })
        })
        .await
    }

    async fn outbox(&self) -> Result<Vec<(i64, Outgoing)>, StoreError> {
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
                        not_before: not_before.and_then(super::millis),
                    },
                ))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn outbox_sent(&self, seq: i64) -> Result<(), StoreError> {
        self.with(move |c| {
            Ok(c.execute("DELETE FROM outbox WHERE seq = ?1", params![seq])
                .map(drop)?)
        })
        .await
    }

    async fn count_by_status(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.read(|c| {
            let mut st = c.prepare("SELECT status, COUNT(*) FROM runs GROUP BY status")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn alerts(&self) -> Result<Vec<AlertRow>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT fingerprint, doc, received, updated_at FROM alerts")?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn delivered(&self, sink: &str) -> Result<i64, StoreError> {
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

    async fn set_delivered(&self, sink: &str, seq: i64) -> Result<(), StoreError> {
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

    async fn mark(&self, name: &str) -> Result<Option<i64>, StoreError> {
        let name = name.to_owned();
        self.with(move |c| {
            Ok(
                c.query_row("SELECT at FROM marks WHERE name = ?1", params![name], |r| {
                    r.get::<_, Option<i64>>(0)
                })
                .optional()?
                .flatten(),
            )
        })
        .await
    }

    async fn set_mark(&self, name: &str, at: Option<i64>, keep: bool) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.with(move |c| {
            let sql = if keep {
                "INSERT INTO marks (name, at) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET at = COALESCE(marks.at, excluded.at)"
            } else {
                "INSERT INTO marks (name, at) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET at = excluded.at"
            };
            c.execute(sql, params![name, at])?;
            Ok(())
        })
        .await
    }

    async fn last_event_seq(&self) -> Result<i64, StoreError> {
        self.read(|c| {
            Ok(
                c.query_row("SELECT COALESCE(MAX(seq), 0) FROM run_events", [], |r| {
                    r.get(0)
                })?,
            )
        })
        .await
    }

    async fn events_after(
        &self,
        after: i64,
        run: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let run = run.map(str::to_owned);
        self.read(move |c| {
            let mut st = c.prepare(
                "SELECT seq, doc FROM run_events
                 WHERE seq > ?1 AND (?2 IS NULL OR run_id = ?2)
                 ORDER BY seq LIMIT ?3",
            )?;
            let rows = st.query_map(params![after, run, limit as i64], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?;
            Ok(rows.collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn take_lease(&self, _: &str, _: &str, _: Duration) -> Result<bool, StoreError> {
        Ok(true)
    }

    async fn drop_lease(&self, _: &str, _: &str) -> Result<(), StoreError> {
        Ok(())
    }
}

fn insert_outgoing(tx: &Transaction<'_>, msg: &Outgoing) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO outbox (id, routing_key, body, not_before) VALUES (?1, ?2, ?3, ?4)",
        params![
            msg.id,
            msg.routing_key,
            msg.body,
            msg.not_before.map(|t| t.timestamp_millis())
        ],
    )?;
    Ok(tx.last_insert_rowid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::etcd_order::Action;
    use crate::domain::event::{DetectionRequest, StageSelection, UpgradeKind};
    use crate::domain::run::{Step, StepStatus};
    use crate::domain::version::Version;
    use crate::store::{Commit, Store};
    use crate::workflows::control_plane_cycle::plan::{
        ControlPlaneAction, EtcdFacts, EtcdMemberFacts, Kubeadm,
    };
    use crate::workflows::etcd_roll::plan::{initial_steps as roll_steps, steps_for};
    use crate::workflows::k8s_upgrade::plan::{
        self as plan, ClusterFacts, NodeFacts, PlanSettings, Role,
    };
    use chrono::Utc;

    /// The store at `path`, with every workflow's runs known to it, as `serve` opens it.
    fn open_store(path: &Path) -> Result<Store, StoreError> {
        crate::workflows::register();
        Store::open(path)
    }

    fn node(name: &str, role: Role, containerd: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            role,
            kubelet: Version::parse("1.34.2").unwrap(),
            distribution: Default::default(),
            package_manager: None,
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
            build: None,
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
        let mut steps = plan::initial_steps(&request, false);
        steps.extend(
            plan::plan(&request, &facts, Some(&etcd), &PlanSettings::default())
                .unwrap()
                .steps,
        );
        use crate::domain::distribution::Distribution;
        for (kubeadm, distribution) in [
            (Kubeadm::Apply, Distribution::Kubeadm),
            (Kubeadm::Node, Distribution::Kubeadm),
            (Kubeadm::Apply, Distribution::K3s),
        ] {
            steps.extend(plan::control_plane_steps(
                &ControlPlaneAction::Upgrade {
                    node: "cp".into(),
                    kubeadm,
                },
                true,
                distribution,
            ));
        }
        steps.extend(plan::control_plane_steps(
            &ControlPlaneAction::MoveLeader {
                from: "cp".into(),
                to: "cp".into(),
            },
            false,
            Distribution::Kubeadm,
        ));
        steps
    }

    fn run_of(kind: crate::domain::run::RunKind, steps: Vec<Step>) -> Run {
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
        let store = open_store(&dir.path().join("store.db")).unwrap();
        let upgrade = run_of(crate::domain::upgrade_step::K8S_UPGRADE, full_plan());
        let names: std::collections::BTreeSet<&str> =
            upgrade.steps.iter().map(|s| s.kind.name()).collect();
        assert_eq!(names.len(), 26, "every upgrade step kind: {names:?}");
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
        let mut roll = run_of(crate::workflows::etcd_roll::step::ETCD_ROLL, roll_steps);
        roll.memory.etcd_start_term = Some(4);
        roll.memory.leader_moves = vec!["cp-1 -> cp-2".into()];
        for run in [upgrade, roll] {
            assert!(store.insert_run_if_absent(&run).await.unwrap());
            let back = store.view_run(&run.id, Events::All).await.unwrap().unwrap();
            assert_eq!(back, run);
        }
    }

    /// A version-1 file as rollgate wrote it before steps were typed.
    fn version_1_file(path: &Path, docs: &[(&str, &str, serde_json::Value)]) {
        let mut conn = Connection::open(path).unwrap();
        let tx = conn.transaction().unwrap();
        tables(&tx).unwrap();
        for (id, kind, doc) in docs {
            // As rollgate wrote it: the row's id is the document's.
            let mut doc = doc.clone();
            doc["id"] = (*id).into();
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
        let mut run = run_of(crate::workflows::etcd_roll::step::ETCD_ROLL, roll_steps());
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
        let store = open_store(&path).unwrap();
        let run = store.view_run("old", Events::All).await.unwrap().unwrap();
        assert_eq!(run.memory.etcd_start_term, Some(17));
        assert_eq!(
            run.steps[1].kind,
            crate::workflows::etcd_roll::step::EtcdRollStep::Next.into()
        );
        let fresh = store.view_run("fresh", Events::All).await.unwrap().unwrap();
        assert_eq!(fresh.memory.etcd_start_term, None);
        // The log of transitions is filled from the stored histories, run by run.
        let logged = store.events_after(0, None, 100).await.unwrap();
        let histories = run.history.len() + fresh.history.len();
        assert_eq!(logged.len(), histories);
        assert!(logged.windows(2).all(|w| w[0].seq < w[1].seq));
        let conn = Connection::open(&path).unwrap();
        assert_eq!(sqlite::version(&conn).unwrap(), MIGRATIONS.len() as u32);
    }

    #[tokio::test]
    async fn transitions_are_logged_once_in_commit_order_and_read_after_a_number() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&dir.path().join("store.db")).unwrap();
        let mut logged = store.transitions_logged();
        let mut a = run_of(crate::domain::upgrade_step::K8S_UPGRADE, full_plan());
        let b = run_of(crate::workflows::etcd_roll::step::ETCD_ROLL, Vec::new());
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
        let Err(err) = open_store(&path) else {
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
        let run = run_of(crate::domain::upgrade_step::K8S_UPGRADE, Vec::new());
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
        let store = open_store(&path).unwrap();
        let back = store.get_run("v2").await.unwrap().unwrap();
        let labels: Vec<String> = back.steps.iter().map(Step::label).collect();
        assert_eq!(labels, ["control-plane/apply@cp"]);
    }

    /// A version-5 file (before the in-flight indexes) with `runs` as (id, target, status).
    fn version_5_file(path: &Path, runs: &[(&str, &str, &str)]) {
        let mut conn = Connection::open(path).unwrap();
        sqlite::migrate(&mut conn, "store.db", &MIGRATIONS[..5]).unwrap();
        for (id, target, status) in runs {
            let run = run_of(crate::domain::upgrade_step::K8S_UPGRADE, Vec::new());
            conn.execute(
                "INSERT INTO runs (id, kind, status, target, created_at, doc, summary) VALUES (?1, 'k8s-upgrade', ?2, ?3, 0, ?4, '{}')",
                params![id, status, target, serde_json::to_string(&Run { id: id.to_string(), ..run }).unwrap()],
            )
            .unwrap();
        }
    }

    #[tokio::test]
    async fn a_version_5_file_gets_the_in_flight_indexes_or_names_the_runs_that_break_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        version_5_file(
            &path,
            &[
                ("old", "1.35.0", "waiting"),
                ("done", "1.35.0", "succeeded"),
            ],
        );
        let store = open_store(&path).unwrap();
        assert_eq!(store.get_run("old").await.unwrap().unwrap().id, "old");
        assert_eq!(
            sqlite::version(&Connection::open(&path).unwrap()).unwrap(),
            MIGRATIONS.len() as u32
        );
        let path = dir.path().join("twice.db");
        version_5_file(
            &path,
            &[("one", "1.35.0", "queued"), ("two", "1.35.0", "halted")],
        );
        let Err(err) = open_store(&path) else {
            panic!("two runs in flight for one target were migrated");
        };
        let err = crate::error_chain(&err);
        assert!(
            err.contains("migration to version 6: runs one, two are all k8s-upgrade runs for 1.35.0 in flight"),
            "{err}"
        );
        assert_eq!(
            sqlite::version(&Connection::open(&path).unwrap()).unwrap(),
            5
        );
    }

    #[test]
    fn an_empty_file_gets_the_newest_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        drop(open_store(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        assert_eq!(sqlite::version(&conn).unwrap(), MIGRATIONS.len() as u32);
    }

    #[tokio::test]
    async fn a_version_6_run_in_flight_is_split_into_steps_and_log_and_carries_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let mut run = run_of(crate::domain::upgrade_step::K8S_UPGRADE, full_plan());
        run.steps[0].status = crate::domain::run::StepStatus::Done;
        run.transition(
            RunStatus::Running,
            "step plan (attempt 1)",
            chrono::Utc::now(),
        );
        run.current_step = Some(1);
        {
            let mut conn = Connection::open(&path).unwrap();
            sqlite::migrate(&mut conn, "store.db", &MIGRATIONS[..6]).unwrap();
            let tx = conn.transaction().unwrap();
            tx.execute(
                "INSERT INTO runs (id, kind, status, target, created_at, doc, summary) VALUES (?1, 'k8s-upgrade', 'running', '1.34.5', 0, ?2, ?3)",
                params![run.id, encode(&run), encode_summary(&run)],
            )
            .unwrap();
            log_transitions(&tx, &run).unwrap();
            tx.commit().unwrap();
        }
        let store = open_store(&path).unwrap();
        let back = store.view_run(&run.id, Events::All).await.unwrap().unwrap();
        assert_eq!(back, run, "the same run, read from its parts");
        assert_eq!(back.touched.logged, 2);
        let conn = Connection::open(&path).unwrap();
        let head: String = conn
            .query_row("SELECT doc FROM runs WHERE id = ?1", params![run.id], |r| {
                r.get(0)
            })
            .unwrap();
        let head: serde_json::Value = serde_json::from_str(&head).unwrap();
        assert_eq!(head["steps"], serde_json::json!([]), "{head}");
        assert_eq!(head["history"], serde_json::json!([]), "{head}");
        // It carries on: a change writes its step and transition, and reads back whole.
        let mut next = back;
        next.step_mut(1).status = crate::domain::run::StepStatus::Running;
        next.transition(RunStatus::Waiting, "waits", chrono::Utc::now());
        store
            .commit(Commit {
                runs: vec![next.clone()],
                ..Commit::default()
            })
            .await
            .unwrap();
        assert_eq!(
            store.view_run(&run.id, Events::All).await.unwrap().unwrap(),
            next
        );
        let events: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM run_events WHERE run_id = ?1",
                params![run.id],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(events, 3, "each transition logged once");
    }

    #[tokio::test]
    async fn a_version_8_run_held_by_its_gate_or_an_approval_is_still_held_after_the_upgrade() {
        use crate::domain::engine::{self, AWAITS_APPROVAL};
        use crate::domain::event::ControlAction;
        use crate::domain::run::Held;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        // One of each kind: one Kubernetes upgrade may have started.
        let waiting = |kind: crate::domain::run::RunKind, outcome: &str| {
            let mut run = run_of(kind, full_plan());
            run.steps[0].status = StepStatus::Done;
            run.transition(RunStatus::Running, "step gate", Utc::now());
            run.transition(RunStatus::Waiting, outcome, Utc::now());
            run.current_step = Some(1);
            run.in_hand = vec![1];
            let step = run.step_mut(1);
            step.status = StepStatus::Waiting;
            step.attempts = 1;
            step.outcome = Some(outcome.to_owned());
            run
        };
        let gated = waiting(
            crate::workflows::node_reboot::step::NODE_REBOOT,
            "gate closed: NodeDown on w1",
        );
        let approval = waiting(
            crate::domain::upgrade_step::K8S_UPGRADE,
            &format!("{AWAITS_APPROVAL}: upstreams ready (staging)"),
        );
        let other = waiting(
            crate::workflows::etcd_roll::step::ETCD_ROLL,
            "outside the maintenance windows",
        );
        // Written as version 8 wrote them: no `held` in any step.
        {
            let store = open_store(&path).unwrap();
            store
                .commit(Commit {
                    runs: vec![gated.clone(), approval.clone(), other.clone()],
                    ..Commit::default()
                })
                .await
                .unwrap();
        }
        {
            let conn = Connection::open(&path).unwrap();
            let held: i64 = conn
                .query_row(
                    "SELECT COUNT(*) FROM run_steps WHERE json_extract(doc, '$.held') IS NOT NULL",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(held, 0, "the runs were built without a hold");
            conn.pragma_update(None, "user_version", 8).unwrap();
        }
        let store = open_store(&path).unwrap();
        let back = |id: String| {
            let store = &store;
            async move { store.get_run(&id).await.unwrap().unwrap() }
        };
        let gated = back(gated.id).await;
        assert!(gated.steps[1].is_held(Held::Gate), "{:?}", gated.steps[1]);
        assert!(engine::check_control(&gated, ControlAction::Approve).is_err());
        let approval = back(approval.id).await;
        assert!(
            approval.steps[1].is_held(Held::Approval),
            "{:?}",
            approval.steps[1]
        );
        assert!(engine::check_control(&approval, ControlAction::Approve).is_ok());
        let other = back(other.id).await;
        assert_eq!(other.steps[1].held, None, "a window's wait holds nothing");
        assert_eq!(
            sqlite::version(&Connection::open(&path).unwrap()).unwrap(),
            MIGRATIONS.len() as u32
        );
    }

    /// The views read on their own connection: while the engine's writing connection is
    /// held (a long commit), a run, the lists, the log and the counts still answer.
    #[tokio::test]
    async fn the_api_reads_while_the_engine_holds_the_writing_connection() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let run = run_of(crate::domain::upgrade_step::K8S_UPGRADE, full_plan());
        let id = run.id.clone();
        let store = open_store(&path).unwrap();
        assert!(store.insert_run_if_absent(&run).await.unwrap());
        drop(store);

        let backend = SqliteStore::open(&path).unwrap();
        let writer = backend.conn.clone();
        let (locked_tx, locked) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _guard = writer.blocking_lock();
            locked_tx.send(()).unwrap();
            release_rx.recv().ok();
        });
        locked.recv().unwrap();
        let reads = async {
            let doc = backend.run_doc(&id).await.unwrap();
            let parts = backend.run_parts(&id, Events::All).await.unwrap();
            let newest = backend.newest(Column::Summary, None, 10).await.unwrap();
            let counts = backend.count_by_status().await.unwrap();
            let last = backend.last_event_seq().await.unwrap();
            let log = backend.events_after(0, Some(&id), 10).await.unwrap();
            (
                doc.is_some(),
                parts.steps.len(),
                newest.len(),
                counts.len(),
                last > 0,
                log.len(),
            )
        };
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), reads).await;
        release.send(()).unwrap();
        holder.join().unwrap();
        assert_eq!(
            read.expect("the views waited for the writing connection"),
            (true, run.steps.len(), 1, 1, true, 1)
        );
    }
}
