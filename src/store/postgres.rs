//! The PostgreSQL backend, for several replicas on one database: a pool of connections
//! (deadpool over tokio-postgres), every operation bounded by `store.timeout` so that a
//! database that is down is a prompt error (a 503 at the API), never a hang.
//!
//! Transactions that write runs take one transaction-scoped advisory lock first: the log of
//! transitions is then numbered in commit order (a reader never sees number 11 before
//! number 10 commits), and a claim for a new run sees every other replica's claim. The
//! worker lease is a row with an expiry in the database's own clock; a fenced commit
//! holds that row (`FOR SHARE`) so a lease cannot change hands under it.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use std::fmt;
use std::future::Future;
use std::time::Duration;
use tokio_postgres::{NoTls, Transaction};

use super::{
    AlertRow, Backend, Claim, Column, Commit, Committed, Events, IN_FLIGHT_INDEXES, Purge,
    RunParts, RunRow, RunWrite, StoreError, Which, dedup_horizon, resolved_alert_horizon,
};
use crate::domain::run::RunStatus;
use crate::queue::Outgoing;
use crate::sqlite::MigrationError;

/// Advisory lock taken by every transaction that writes runs (see the module docs).
const LOG_LOCK: i64 = 0x726f_6c6c_6761_7465;
/// Advisory lock that lets one replica at a time migrate the schema.
const MIGRATE_LOCK: i64 = 0x726f_6c6c_6d69_6772;

/// Version 1: runs (with their summaries), the numbered log of transitions, processed
/// event ids, the outbox, the alert board and how far each notification sink got.
const TABLES: &str = "
    CREATE TABLE runs (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        target TEXT,
        created_at BIGINT NOT NULL,
        doc TEXT NOT NULL,
        summary TEXT NOT NULL
    );
    CREATE INDEX runs_status ON runs (status);
    CREATE INDEX runs_newest ON runs (created_at DESC, id DESC);
    CREATE TABLE run_events (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id TEXT NOT NULL,
        doc TEXT NOT NULL
    );
    CREATE INDEX run_events_by_run ON run_events (run_id, seq);
    CREATE TABLE processed_events (
        id TEXT PRIMARY KEY,
        type TEXT NOT NULL,
        processed_at BIGINT NOT NULL
    );
    CREATE INDEX processed_events_at ON processed_events (processed_at);
    CREATE TABLE outbox (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL,
        routing_key TEXT NOT NULL,
        body BYTEA NOT NULL,
        not_before BIGINT
    );
    CREATE TABLE alerts (
        fingerprint TEXT PRIMARY KEY,
        doc TEXT NOT NULL,
        received BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
    );
    CREATE TABLE deliveries (sink TEXT PRIMARY KEY, seq BIGINT NOT NULL);";

/// Version 2: the leases replicas elect their worker with.
const LEASES: &str = "
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );";

/// Version 3: a run's steps in rows of their own and its history in the log alone, so that
/// a commit writes the steps that changed and the new transitions, not the whole run. Runs
/// in flight are split as they stand; their transitions are all in the log already.
const STEPS_APART: &str = r#"
    CREATE TABLE run_steps (
        run_id TEXT NOT NULL,
        idx BIGINT NOT NULL,
        doc TEXT NOT NULL,
        PRIMARY KEY (run_id, idx)
    );
    ALTER TABLE runs ADD COLUMN events_logged BIGINT NOT NULL DEFAULT 0;
    INSERT INTO run_steps (run_id, idx, doc)
        SELECT r.id, s.ord - 1, s.step::TEXT
        FROM runs r, jsonb_array_elements(r.doc::JSONB -> 'steps') WITH ORDINALITY AS s(step, ord);
    UPDATE runs SET
        events_logged = (SELECT COUNT(*) FROM run_events e WHERE e.run_id = runs.id),
        doc = (doc::JSONB || '{"steps": [], "history": []}'::JSONB)::TEXT;"#;

/// The schema, one list of statements per version.
pub const MIGRATIONS: &[&[&str]] = &[
    &[TABLES],
    &[LEASES, IN_FLIGHT_INDEXES],
    &[STEPS_APART],
    &[MARKS],
    &[HELD_STEPS],
];

/// Version 5: what holds a waiting step is a field (`held`: `gate` or `approval`), no
/// longer read from the first words of its outcome; the steps stored waiting get it from
/// those words, once, here.
const HELD_STEPS: &str = r#"
    UPDATE run_steps SET doc = (doc::JSONB || '{"held": "gate"}'::JSONB)::TEXT
        WHERE doc::JSONB ->> 'status' = 'waiting'
        AND starts_with(doc::JSONB ->> 'outcome', 'gate closed: ');
    UPDATE run_steps SET doc = (doc::JSONB || '{"held": "approval"}'::JSONB)::TEXT
        WHERE doc::JSONB ->> 'status' = 'waiting'
        AND starts_with(doc::JSONB ->> 'outcome', 'waits for approval');"#;

/// Version 4: named times kept across restarts and failovers (the gate's `quiet_since`);
/// a NULL time is a mark set to nothing (the gate is closed).
const MARKS: &str = "CREATE TABLE marks (name TEXT PRIMARY KEY, at BIGINT);";

/// How to reach the database.
#[derive(Clone)]
pub struct PgSettings {
    /// `postgres://user@host:port/database`, without a password.
    pub url: String,
    /// The password, read from `store.password_file`.
    pub password: Option<String>,
    /// Connections in the pool.
    pub max_connections: usize,
    /// Bound on one operation, connecting included.
    pub timeout: Duration,
}

impl fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSettings")
            .field("url", &self.url)
            .field(
                "password",
                &self.password.as_ref().map(|_| "(from its file)"),
            )
            .field("max_connections", &self.max_connections)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The PostgreSQL store.
pub struct PgStore {
    pool: Pool,
    timeout: Duration,
    /// What the lease session connects with.
    config: tokio_postgres::Config,
    /// The lease session: one connection of this replica's own, and whether it holds the
    /// session advisory lock of the worker lease (see [`PgStore::take_lease`]).
    session: tokio::sync::Mutex<Option<(tokio_postgres::Client, bool)>>,
    purge: Purge,
}

fn pg(e: impl fmt::Display) -> StoreError {
    StoreError::Postgres(e.to_string())
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.as_db_error() {
            Some(db) => StoreError::Postgres(format!("{}: {}", db.code().code(), db.message())),
            None => pg(e),
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => pg(other),
        }
    }
}

impl PgStore {
    /// Connects and migrates the schema to the one this build knows.
    pub async fn connect(settings: &PgSettings) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = settings
            .url
            .parse()
            .map_err(|e| pg(format!("store.url is not a PostgreSQL URL: {e}")))?;
        if let Some(password) = &settings.password {
            config.password(password.as_bytes());
        }
        config.connect_timeout(settings.timeout);
        config.application_name("rollgate");
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.max_connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(settings.timeout))
            .create_timeout(Some(settings.timeout))
            .recycle_timeout(Some(settings.timeout))
            .build()
            .map_err(pg)?;
        let store = Self {
            pool,
            timeout: settings.timeout,
            config,
            session: tokio::sync::Mutex::new(None),
            purge: Purge::default(),
        };
        store.timed(store.migrate()).await?;
        Ok(store)
    }

    /// Applies the migrations the database has not had, all in one transaction under the
    /// migration lock: replicas starting together migrate once.
    async fn migrate(&self) -> Result<u32, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
            .await?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS rollgate_schema (version INTEGER NOT NULL)")
            .await?;
        let found = match tx
            .query_opt("SELECT version FROM rollgate_schema", &[])
            .await?
        {
            Some(row) => row.get::<_, i32>(0),
            None => {
                tx.execute("INSERT INTO rollgate_schema (version) VALUES (0)", &[])
                    .await?;
                0
            }
        };
        let known = MIGRATIONS.len() as i32;
        let database = "the PostgreSQL database (store.url)".to_owned();
        if found > known {
            return Err(MigrationError::Newer {
                file: database,
                found: found as u32,
                known: known as u32,
            }
            .into());
        }
        for statements in &MIGRATIONS[found as usize..] {
            for sql in *statements {
                tx.batch_execute(sql).await?;
            }
        }
        tx.execute("UPDATE rollgate_schema SET version = $1", &[&known])
            .await?;
        tx.commit().await?;
        Ok(known as u32)
    }

    /// The schema version the database is at.
    pub async fn version(&self) -> Result<u32, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one("SELECT version FROM rollgate_schema", &[])
            .await?;
        Ok(row.get::<_, i32>(0) as u32)
    }

    /// Takes or renews lease `name` through this replica's lease session. The session
    /// first tries the lease's advisory lock, which PostgreSQL releases the moment the
    /// session of a replica that died (kill -9) closes: a replica that gets it takes the
    /// lease at once, expired or not. Otherwise a lease is taken only once it has expired
    /// (its holder's session hangs), and a replica that finds another holding the lease
    /// gives the lock up to it. Renewal goes through the same session, so a holder whose
    /// session is gone can neither renew nor keep the lock.
    async fn lease_session(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let mut session = self.session.lock().await;
        if session
            .as_ref()
            .is_none_or(|(client, _)| client.is_closed())
        {
            let (client, connection) = self.config.connect(NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "the lease session ended");
                }
            });
            *session = Some((client, false));
        }
        let Some((client, locked)) = session.as_mut() else {
            return Err(pg("no lease session"));
        };
        let outcome: Result<bool, StoreError> = async {
            // Newly locked: whoever held the lock before is gone, and so is its claim.
            let fresh = !*locked
                && client
                    .query_one("SELECT pg_try_advisory_lock($1)", &[&lease_key(name)])
                    .await?
                    .get::<_, bool>(0);
            *locked |= fresh;
            let condition = if fresh {
                ""
            } else {
                "WHERE leases.holder = excluded.holder OR leases.expires_at <= now()"
            };
            let row = client
                .query_opt(
                    &format!(
                        "INSERT INTO leases (name, holder, expires_at)
                         VALUES ($1, $2, now() + make_interval(secs => $3))
                         ON CONFLICT (name) DO UPDATE
                         SET holder = excluded.holder, expires_at = excluded.expires_at
                         {condition} RETURNING holder"
                    ),
                    &[&name, &holder, &ttl.as_secs_f64()],
                )
                .await?;
            if row.is_none() && *locked {
                // Another replica took the lease on expiry while this one stalled: it
                // leads now, and gets the lock.
                client
                    .execute("SELECT pg_advisory_unlock($1)", &[&lease_key(name)])
                    .await?;
                *locked = false;
            }
            Ok(row.is_some())
        }
        .await;
        if outcome.is_err() {
            *session = None;
        }
        outcome
    }

    async fn timed<T>(
        &self,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, op)
            .await
            .unwrap_or_else(|_| {
                Err(pg(format!(
                    "no answer within {:?} (store.timeout)",
                    self.timeout
                )))
            })
    }

    async fn rows(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<RunRow>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client.query(sql, params).await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

/// The session advisory lock key of lease `name` (FNV-1a of the name).
fn lease_key(name: &str) -> i64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash as i64
}

const TERMINAL: &str = "('failed', 'succeeded', 'aborted')";
const STARTED: &str = "('running', 'waiting', 'halted')";

/// Writes `run`'s row, the steps it changed and its new transitions (under [`LOG_LOCK`]),
/// replacing a stored row when `replace`; returns whether it wrote.
async fn write_run(
    tx: &deadpool_postgres::Transaction<'_>,
    run: &RunWrite,
    replace: bool,
) -> Result<bool, StoreError> {
    let stored = tx
        .prepare_cached("SELECT events_logged FROM runs WHERE id = $1")
        .await?;
    let stored: Option<i64> = tx.query_opt(&stored, &[&run.id]).await?.map(|r| r.get(0));
    if stored.is_some() && !replace {
        return Ok(false);
    }
    let (logged, events) = run.events_after(stored.unwrap_or(0));
    let upsert = tx
        .prepare_cached(
            "INSERT INTO runs (id, kind, status, target, created_at, doc, summary, events_logged)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, doc = excluded.doc,
             summary = excluded.summary, events_logged = excluded.events_logged",
        )
        .await?;
    tx.execute(
        &upsert,
        &[
            &run.id,
            &run.kind,
            &run.status,
            &run.target,
            &run.created_at,
            &run.head,
            &run.summary,
            &logged,
        ],
    )
    .await?;
    if run.all {
        tx.execute("DELETE FROM run_steps WHERE run_id = $1", &[&run.id])
            .await?;
    }
    if !run.steps.is_empty() {
        let (idx, docs): (Vec<i64>, Vec<&str>) =
            run.steps.iter().map(|(i, d)| (*i, d.as_str())).unzip();
        let steps = tx
            .prepare_cached(
                "INSERT INTO run_steps (run_id, idx, doc)
                 SELECT $1, * FROM UNNEST($2::BIGINT[], $3::TEXT[])
                 ON CONFLICT (run_id, idx) DO UPDATE SET doc = excluded.doc",
            )
            .await?;
        tx.execute(&steps, &[&run.id, &idx, &docs]).await?;
    }
    if !events.is_empty() {
        let log = tx
            .prepare_cached(
                "INSERT INTO run_events (run_id, doc) SELECT $1, e.doc FROM UNNEST($2::TEXT[])
                 WITH ORDINALITY AS e(doc, n) ORDER BY e.n",
            )
            .await?;
        tx.execute(&log, &[&run.id, &events]).await?;
    }
    Ok(true)
}

async fn insert_outgoing(tx: &Transaction<'_>, msg: &Outgoing) -> Result<i64, StoreError> {
    let row = tx
        .query_one(
            "INSERT INTO outbox (id, routing_key, body, not_before) VALUES ($1, $2, $3, $4)
             RETURNING seq",
            &[
                &msg.id,
                &msg.routing_key,
                &msg.body,
                &msg.not_before.map(|t| t.timestamp_millis()),
            ],
        )
        .await?;
    Ok(row.get(0))
}

async fn lock_log(tx: &Transaction<'_>) -> Result<(), StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOG_LOCK])
        .await?;
    Ok(())
}

#[async_trait::async_trait]
impl Backend for PgStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.timed(async {
            self.pool.get().await?.query_one("SELECT 1", &[]).await?;
            Ok(())
        })
        .await
    }

    async fn run_doc(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let row = client
                .query_opt("SELECT doc FROM runs WHERE id = $1", &[&id])
                .await?;
            Ok(row.map(|r| r.get(0)))
        })
        .await
    }

    async fn run_parts(&self, id: &str, events: Events) -> Result<RunParts, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let logged = client
                .prepare_cached("SELECT events_logged FROM runs WHERE id = $1")
                .await?;
            let steps = client
                .prepare_cached("SELECT doc FROM run_steps WHERE run_id = $1 ORDER BY idx")
                .await?;
            let (logged, steps) = futures_util::future::try_join(
                client.query_opt(&logged, &[&id]),
                client.query(&steps, &[&id]),
            )
            .await?;
            let logged = logged
                .map(|r| usize::try_from(r.get::<_, i64>(0)).unwrap_or(0))
                .unwrap_or(0);
            let (from, limit) = events.window(logged);
            let events = if limit == 0 {
                Vec::new()
            } else {
                let page = client
                    .prepare_cached(
                        "SELECT doc FROM run_events WHERE run_id = $1 ORDER BY seq LIMIT $2 OFFSET $3",
                    )
                    .await?;
                client
                    .query(&page, &[&id, &(limit as i64), &(from as i64)])
                    .await?
            };
            let docs = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get(0)).collect();
            Ok(RunParts {
                steps: docs(steps),
                events: docs(events),
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
        let status = status.map(RunStatus::name);
        let limit = limit as i64;
        self.timed(self.rows(
            &format!(
                "SELECT id, {column} FROM runs WHERE ($1::TEXT IS NULL OR status = $1)
                 ORDER BY created_at DESC, id DESC LIMIT $2"
            ),
            &[&status, &limit],
        ))
        .await
    }

    async fn runs(&self, which: Which) -> Result<Vec<RunRow>, StoreError> {
        self.timed(async {
            match &which {
                Which::InFlight { kind, target } => {
                    self.rows(
                        &format!(
                            "SELECT id, doc FROM runs WHERE kind = $1 AND target = $2
                             AND status NOT IN {TERMINAL} ORDER BY created_at LIMIT 1"
                        ),
                        &[&kind.name(), target],
                    )
                    .await
                }
                Which::Active { kind, except } => {
                    self.rows(
                        &format!(
                            "SELECT id, doc FROM runs WHERE kind = $1 AND id != $2
                             AND status IN {STARTED} ORDER BY created_at LIMIT 1"
                        ),
                        &[&kind.name(), except],
                    )
                    .await
                }
                Which::InProgress => {
                    self.rows(
                        &format!("SELECT id, doc FROM runs WHERE status IN {STARTED}"),
                        &[],
                    )
                    .await
                }
                Which::Unfinished => {
                    self.rows(
                        "SELECT id, doc FROM runs WHERE status IN ('running', 'waiting')",
                        &[],
                    )
                    .await
                }
                Which::NotEnded => {
                    self.rows(
                        &format!(
                            "SELECT id, doc FROM runs WHERE status NOT IN {TERMINAL} ORDER BY created_at"
                        ),
                        &[],
                    )
                    .await
                }
            }
        })
        .await
    }

    async fn insert_run_if_absent(&self, run: &RunWrite) -> Result<bool, StoreError> {
        self.timed(async {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await?;
            lock_log(&tx).await?;
            let inserted = write_run(&tx, run, false).await?;
            tx.commit().await?;
            Ok(inserted)
        })
        .await
    }

    async fn claim(&self, run: &RunWrite, start: &Outgoing) -> Result<Claim<RunRow>, StoreError> {
        self.timed(async {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await?;
            lock_log(&tx).await?;
            let same = tx
                .query_opt(
                    &format!(
                        "SELECT id, doc FROM runs WHERE kind = $1 AND target = $2
                         AND status NOT IN {TERMINAL} ORDER BY created_at LIMIT 1"
                    ),
                    &[&run.kind, &run.target],
                )
                .await?;
            if let Some(row) = same {
                return Ok(Claim::InFlight((row.get(0), row.get(1))));
            }
            if run.kind == crate::domain::upgrade_step::K8S_UPGRADE.name() {
                let holder = tx
                    .query_opt(
                        &format!(
                            "SELECT id, doc FROM runs WHERE kind = $1 AND id != $2
                             AND status NOT IN {TERMINAL} ORDER BY created_at LIMIT 1"
                        ),
                        &[&run.kind, &run.id],
                    )
                    .await?;
                if let Some(row) = holder {
                    return Ok(Claim::Held((row.get(0), row.get(1))));
                }
            }
            write_run(&tx, run, false).await?;
            let seq = insert_outgoing(&tx, start).await?;
            tx.commit().await?;
            Ok(Claim::New(seq))
        })
        .await
    }

    async fn is_processed(&self, id: &str) -> Result<bool, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let seen = client
                .prepare_cached("SELECT 1 FROM processed_events WHERE id = $1")
                .await?;
            let row = client.query_opt(&seen, &[&id]).await?;
            Ok(row.is_some())
        })
        .await
    }

    async fn commit(
        &self,
        commit: &Commit,
        runs: Vec<RunWrite>,
        holder: &str,
    ) -> Result<Committed, StoreError> {
        self.timed(async {
            let mut client = self.pool.get().await?;
            let tx = client.transaction().await?;
            let now = chrono::Utc::now().timestamp_millis();
            if commit.fenced {
                let held = tx
                    .prepare_cached(
                        "SELECT 1 FROM leases WHERE name = $1 AND holder = $2
                         AND expires_at > now() FOR SHARE",
                    )
                    .await?;
                let held = tx
                    .query_opt(&held, &[&super::WORKER_LEASE, &holder])
                    .await?;
                if held.is_none() {
                    return Err(StoreError::Fenced {
                        holder: holder.to_owned(),
                    });
                }
            }
            if let Some((id, event_type)) = &commit.event {
                let insert = tx
                    .prepare_cached(
                        "INSERT INTO processed_events (id, type, processed_at) VALUES ($1, $2, $3)
                         ON CONFLICT (id) DO NOTHING",
                    )
                    .await?;
                let fresh = tx.execute(&insert, &[id, event_type, &now]).await?;
                if fresh == 0 {
                    return Ok(Committed::AlreadyProcessed);
                }
            }
            if !runs.is_empty() {
                lock_log(&tx).await?;
            }
            for run in &runs {
                write_run(&tx, run, true).await?;
            }
            let mut board: Vec<&crate::domain::alert::Alert> = commit.alerts.iter().collect();
            let mut skipped = 0;
            if !commit.alert_events.is_empty() {
                let insert = tx
                    .prepare_cached(
                        "INSERT INTO processed_events (id, type, processed_at) VALUES ($1, 'alerts', $2)
                         ON CONFLICT (id) DO NOTHING",
                    )
                    .await?;
                // Sent together (tokio-postgres pipelines what is polled at once), in order.
                let (tx, insert) = (&tx, &insert);
                let fresh = futures_util::future::try_join_all(commit.alert_events.iter().map(
                    |batch| async move { tx.execute(insert, &[&batch.id, &now]).await },
                ))
                .await?;
                for (batch, fresh) in commit.alert_events.iter().zip(fresh) {
                    if fresh == 1 {
                        board.extend(&batch.alerts);
                    } else {
                        skipped += 1;
                    }
                }
            }
            let board = crate::domain::alert::newest_by_fingerprint(board);
            let mut stale: Vec<String> = Vec::new();
            let board: Vec<&crate::domain::alert::Alert> = if board.is_empty() {
                board
            } else {
                // The board keeps the newest notification by the alert's own times: the
                // stored ones, locked against another replica's commit, decide.
                let fingerprints: Vec<&str> =
                    board.iter().map(|a| a.fingerprint.as_str()).collect();
                let rows = tx
                    .query(
                        "SELECT fingerprint, doc FROM alerts WHERE fingerprint = ANY($1) FOR UPDATE",
                        &[&fingerprints],
                    )
                    .await?;
                let stored: std::collections::HashMap<String, crate::domain::alert::Alert> = rows
                    .iter()
                    .filter_map(|r| {
                        let doc: String = r.get(1);
                        serde_json::from_str(&doc).ok().map(|a| (r.get(0), a))
                    })
                    .collect();
                board
                    .into_iter()
                    .filter(|alert| match stored.get(&alert.fingerprint) {
                        Some(kept) if !alert.supersedes(kept) => {
                            stale.push(alert.fingerprint.clone());
                            false
                        }
                        _ => true,
                    })
                    .collect()
            };
            if !stale.is_empty() {
                tx.execute(
                    "UPDATE alerts SET received = received + 1 WHERE fingerprint = ANY($1)",
                    &[&stale],
                )
                .await?;
            }
            if !board.is_empty() {
                let upsert = tx
                    .prepare_cached(
                        "INSERT INTO alerts (fingerprint, doc, received, updated_at) VALUES ($1, $2, 1, $3)
                         ON CONFLICT (fingerprint) DO UPDATE
                         SET doc = excluded.doc, received = alerts.received + 1, updated_at = excluded.updated_at",
                    )
                    .await?;
                let docs: Vec<String> = board
                    .iter()
                    .map(|alert| serde_json::to_string(alert).unwrap_or_default())
                    .collect();
                let (tx, upsert) = (&tx, &upsert);
                futures_util::future::try_join_all(board.iter().zip(&docs).map(
                    |(alert, doc)| async move {
                        tx.execute(upsert, &[&alert.fingerprint, doc, &now]).await
                    },
                ))
                .await?;
            }
            for msg in &commit.outbox {
                insert_outgoing(&tx, msg).await?;
            }
            if self.purge.due(now) {
                tx.execute(
                    "DELETE FROM processed_events WHERE processed_at < $1",
                    &[&dedup_horizon(now)],
                )
                .await?;
                tx.execute(
                    "DELETE FROM alerts WHERE updated_at < $1 AND doc::jsonb ->> 'status' = 'resolved'",
                    &[&resolved_alert_horizon(now)],
                )
                .await?;
            }
            tx.commit().await?;
            Ok(Committed::Done { skipped })
        })
        .await
    }

    async fn outbox(&self) -> Result<Vec<(i64, Outgoing)>, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let rows = client
                .query(
                    "SELECT seq, id, routing_key, body, not_before FROM outbox ORDER BY seq",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| {
                    let not_before: Option<i64> = r.get(4);
                    (
                        r.get(0),
                        Outgoing {
                            id: r.get(1),
                            routing_key: r.get(2),
                            body: r.get(3),
                            not_before: not_before.and_then(super::millis),
                        },
                    )
                })
                .collect())
        })
        .await
    }

    async fn outbox_sent(&self, seq: i64) -> Result<(), StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            client
                .execute("DELETE FROM outbox WHERE seq = $1", &[&seq])
                .await?;
            Ok(())
        })
        .await
    }

    async fn count_by_status(&self) -> Result<Vec<(String, i64)>, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let rows = client
                .query("SELECT status, COUNT(*) FROM runs GROUP BY status", &[])
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
        .await
    }

    async fn alerts(&self) -> Result<Vec<AlertRow>, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let rows = client
                .query(
                    "SELECT fingerprint, doc, received, updated_at FROM alerts",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                .collect())
        })
        .await
    }

    async fn delivered(&self, sink: &str) -> Result<i64, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            client
                .execute(
                    "INSERT INTO deliveries (sink, seq)
                     SELECT $1, COALESCE(MAX(seq), 0) FROM run_events
                     ON CONFLICT (sink) DO NOTHING",
                    &[&sink],
                )
                .await?;
            let row = client
                .query_one("SELECT seq FROM deliveries WHERE sink = $1", &[&sink])
                .await?;
            Ok(row.get(0))
        })
        .await
    }

    async fn set_delivered(&self, sink: &str, seq: i64) -> Result<(), StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            client
                .execute(
                    "UPDATE deliveries SET seq = GREATEST(seq, $2) WHERE sink = $1",
                    &[&sink, &seq],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn mark(&self, name: &str) -> Result<Option<i64>, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let row = client
                .query_opt("SELECT at FROM marks WHERE name = $1", &[&name])
                .await?;
            Ok(row.and_then(|r| r.get::<_, Option<i64>>(0)))
        })
        .await
    }

    async fn set_mark(&self, name: &str, at: Option<i64>, keep: bool) -> Result<(), StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let sql = if keep {
                "INSERT INTO marks (name, at) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET at = COALESCE(marks.at, excluded.at)"
            } else {
                "INSERT INTO marks (name, at) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET at = excluded.at"
            };
            client.execute(sql, &[&name, &at]).await?;
            Ok(())
        })
        .await
    }

    async fn last_event_seq(&self) -> Result<i64, StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            let row = client
                .query_one("SELECT COALESCE(MAX(seq), 0)::BIGINT FROM run_events", &[])
                .await?;
            Ok(row.get(0))
        })
        .await
    }

    async fn events_after(
        &self,
        after: i64,
        run: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let limit = limit as i64;
        self.timed(async {
            let client = self.pool.get().await?;
            let rows = client
                .query(
                    "SELECT seq, doc FROM run_events
                     WHERE seq > $1 AND ($2::TEXT IS NULL OR run_id = $2)
                     ORDER BY seq LIMIT $3",
                    &[&after, &run, &limit],
                )
                .await?;
            Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
        })
        .await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.timed(self.lease_session(name, holder, ttl)).await
    }

    async fn drop_lease(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        self.timed(async {
            let client = self.pool.get().await?;
            client
                .execute(
                    "DELETE FROM leases WHERE name = $1 AND holder = $2",
                    &[&name, &holder],
                )
                .await?;
            // Closing the session releases its advisory lock.
            self.session.lock().await.take();
            Ok(())
        })
        .await
    }
}
