//! The embedded queue: SQLite in WAL mode with `synchronous=FULL`, so a committed publish
//! is on disk. One writer thread owns the connection and commits whatever is pending in
//! one transaction (group commit): concurrent publishers share an fsync.

use chrono::{DateTime, TimeZone, Utc};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use tokio::sync::{Notify, oneshot};

use super::{Delivery, Handle, Outgoing, Queue, QueueError};
use crate::sqlite::{self, Migration, MigrationError};

/// Commands more than this are left for the next transaction.
const MAX_BATCH: usize = 512;
/// The consumer re-checks at least this often even without a publish.
const MAX_IDLE_WAIT: Duration = Duration::from_secs(1);

enum Cmd {
    Publish(Outgoing, oneshot::Sender<Result<(), QueueError>>),
    Lease(oneshot::Sender<Result<Leased, QueueError>>),
    Ack(i64, oneshot::Sender<Result<(), QueueError>>),
    Release(i64, oneshot::Sender<Result<(), QueueError>>),
    Dead(i64, String, oneshot::Sender<Result<(), QueueError>>),
    Depth(oneshot::Sender<Result<(u64, u64), QueueError>>),
    /// Gives back a lease whose receiver went away, as if it had never been taken.
    Unlease(i64),
}

/// Undoes a lease the consumer never saw.
const UNLEASE: &str =
    "UPDATE messages SET lease_until = NULL, attempts = MAX(attempts - 1, 0) WHERE seq = ?1";

enum Leased {
    Message(Delivery),
    /// Nothing due; the next message is due at this time (ms since the epoch), if any.
    Idle(Option<i64>),
}

/// The on-disk queue.
pub struct EmbeddedQueue {
    tx: mpsc::Sender<Cmd>,
    published: std::sync::Arc<Notify>,
}

/// The queue's schema, one migration per version (see [`crate::sqlite`]).
const MIGRATIONS: &[Migration] = &[messages_and_dead];

/// Version 1: the messages and the dead letters.
fn messages_and_dead(tx: &rusqlite::Transaction<'_>) -> Result<(), MigrationError> {
    // IF NOT EXISTS: files from before versioning have these tables at version 0.
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS messages (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL,
            routing_key TEXT NOT NULL,
            body BLOB NOT NULL,
            not_before INTEGER NOT NULL,
            lease_until INTEGER,
            attempts INTEGER NOT NULL DEFAULT 0,
            enqueued_at INTEGER NOT NULL
        );
        CREATE INDEX IF NOT EXISTS messages_due ON messages (not_before, seq);
        CREATE TABLE IF NOT EXISTS dead (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL,
            routing_key TEXT NOT NULL,
            body BLOB NOT NULL,
            reason TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            dead_at INTEGER NOT NULL
        );",
    )?;
    Ok(())
}

impl EmbeddedQueue {
    /// Opens the queue at `path`. The caller holds the data-dir lock, so any lease found is
    /// from a process that died: those messages are due again at once.
    pub fn open(path: &Path, lease: Duration, delivery_limit: u32) -> Result<Self, QueueError> {
        let conn = sqlite::open(path, MIGRATIONS)
            .map_err(|e| QueueError::Unavailable(crate::error_chain(&e)))?;
        conn.execute(
            "UPDATE messages SET lease_until = NULL WHERE lease_until IS NOT NULL",
            [],
        )
        .map_err(unavailable)?;
        let (tx, rx) = mpsc::channel();
        let published = std::sync::Arc::new(Notify::new());
        let notify = published.clone();
        let writer = Writer {
            conn,
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX),
            delivery_limit: i64::from(delivery_limit),
            wall: crate::clock::WallSteps::default(),
        };
        std::thread::Builder::new()
            .name("rollgate-queue".into())
            .spawn(move || writer.run(rx, &notify))
            .map_err(|e| QueueError::Unavailable(e.to_string()))?;
        Ok(Self { tx, published })
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Cmd) -> Result<T, QueueError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).map_err(|_| QueueError::Closed)?;
        rx.await.map_err(|_| QueueError::Closed)
    }
}

struct LeaseGuard<'a> {
    rx: Option<oneshot::Receiver<Result<Leased, QueueError>>>,
    tx: &'a mpsc::Sender<Cmd>,
}

impl Drop for LeaseGuard<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        // After close() the writer can no longer deliver; it gives back what it leased.
        rx.close();
        if let Ok(Ok(Leased::Message(d))) = rx.try_recv()
            && let Handle::Embedded { seq } = d.handle
        {
            let _ = self.tx.send(Cmd::Unlease(seq));
        }
    }
}

fn unavailable(e: rusqlite::Error) -> QueueError {
    QueueError::Unavailable(format!("embedded queue: {e}"))
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn from_ms(ms: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms).single()
}

#[async_trait::async_trait]
impl Queue for EmbeddedQueue {
    async fn publish(&self, msg: Outgoing) -> Result<(), QueueError> {
        self.call(|r| Cmd::Publish(msg, r)).await?
    }

    async fn next(&self) -> Result<Delivery, QueueError> {
        loop {
            // Cancel-safe: if this future is dropped while the lease is in flight, the
            // guard hands a leased message straight back.
            let (reply, rx) = oneshot::channel();
            self.tx
                .send(Cmd::Lease(reply))
                .map_err(|_| QueueError::Closed)?;
            let mut guard = LeaseGuard {
                rx: Some(rx),
                tx: &self.tx,
            };
            let leased = guard.rx.as_mut().ok_or(QueueError::Closed)?.await;
            guard.rx = None;
            match leased.map_err(|_| QueueError::Closed)?? {
                Leased::Message(d) => return Ok(d),
                Leased::Idle(next_due) => {
                    let wait = next_due
                        .map(|due| Duration::from_millis((due - ms(Utc::now())).max(1) as u64))
                        .unwrap_or(MAX_IDLE_WAIT)
                        .min(MAX_IDLE_WAIT);
                    let _ = tokio::time::timeout(wait, self.published.notified()).await;
                }
            }
        }
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), QueueError> {
        let seq = embedded_seq(delivery)?;
        self.call(|r| Cmd::Ack(seq, r)).await?
    }

    async fn release(&self, delivery: &Delivery) -> Result<(), QueueError> {
        let seq = embedded_seq(delivery)?;
        self.call(|r| Cmd::Release(seq, r)).await?
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), QueueError> {
        let seq = embedded_seq(delivery)?;
        let reason = reason.to_owned();
        self.call(|r| Cmd::Dead(seq, reason, r)).await?
    }

    async fn depth(&self) -> Result<u64, QueueError> {
        Ok(self.call(Cmd::Depth).await??.0)
    }

    async fn dead_depth(&self) -> Result<u64, QueueError> {
        Ok(self.call(Cmd::Depth).await??.1)
    }

    fn backend(&self) -> &'static str {
        "embedded"
    }
}

fn embedded_seq(delivery: &Delivery) -> Result<i64, QueueError> {
    match delivery.handle {
        Handle::Embedded { seq } => Ok(seq),
        Handle::Amqp { .. } => Err(QueueError::Unavailable(
            "a delivery from another backend".into(),
        )),
    }
}

struct Writer {
    conn: Connection,
    lease_ms: i64,
    delivery_limit: i64,
    /// The wall clock against the monotonic one: due times and leases are wall-clock ms.
    wall: crate::clock::WallSteps,
}

/// After the wall clock was stepped back by `back_ms`, what waits keeps its delay: its due
/// time and its lease move back as far (a clock stepped forward needs nothing: what comes
/// due early is checked again by the step that waits, on the monotonic clock).
const KEEP_DELAYS: &str = "UPDATE messages SET
     not_before = CASE WHEN not_before > ?2 THEN MAX(not_before - ?1, ?2) ELSE not_before END,
     lease_until = CASE WHEN lease_until > ?2 THEN MAX(lease_until - ?1, ?2) ELSE lease_until END";

enum Reply {
    Unit(
        oneshot::Sender<Result<(), QueueError>>,
        Result<(), QueueError>,
    ),
    Lease(
        oneshot::Sender<Result<Leased, QueueError>>,
        Result<Leased, QueueError>,
    ),
    Depth(
        oneshot::Sender<Result<(u64, u64), QueueError>>,
        Result<(u64, u64), QueueError>,
    ),
    Nothing,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Cmd>, published: &Notify) {
        while let Ok(first) = rx.recv() {
            if let Some(back_ms) = self.wall.stepped_back() {
                let now = ms(Utc::now());
                match self.conn.execute(KEEP_DELAYS, params![back_ms, now]) {
                    Ok(n) => tracing::warn!(
                        back_ms,
                        messages = n,
                        "the wall clock was stepped back: what waits in the queue keeps its delay"
                    ),
                    Err(e) => {
                        tracing::warn!(back_ms, error = %e, "the wall clock was stepped back and the waiting messages could not be moved")
                    }
                }
            }
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            let mut any_published = false;
            let mut replies = Vec::with_capacity(batch.len());
            let tx = match self.conn.transaction() {
                Ok(tx) => tx,
                Err(e) => {
                    fail_all(batch, &unavailable(e));
                    continue;
                }
            };
            for cmd in batch {
                replies.push(match cmd {
                    Cmd::Publish(msg, r) => {
                        any_published = true;
                        Reply::Unit(r, publish(&tx, &msg))
                    }
                    Cmd::Lease(r) => {
                        Reply::Lease(r, lease(&tx, self.lease_ms, self.delivery_limit))
                    }
                    Cmd::Ack(seq, r) => {
                        Reply::Unit(r, exec(&tx, "DELETE FROM messages WHERE seq = ?1", seq))
                    }
                    Cmd::Release(seq, r) => Reply::Unit(
                        r,
                        exec(
                            &tx,
                            "UPDATE messages SET lease_until = NULL WHERE seq = ?1",
                            seq,
                        ),
                    ),
                    Cmd::Dead(seq, reason, r) => Reply::Unit(r, bury(&tx, seq, &reason)),
                    Cmd::Depth(r) => Reply::Depth(r, depth(&tx)),
                    Cmd::Unlease(seq) => {
                        any_published |= exec(&tx, UNLEASE, seq).is_ok();
                        Reply::Nothing
                    }
                });
            }
            let committed = tx.commit().map_err(unavailable);
            let mut orphaned = Vec::new();
            for reply in replies {
                // A failed commit undoes every command of the batch, so each one fails.
                match (reply, &committed) {
                    (Reply::Unit(r, res), Ok(())) => drop(r.send(res)),
                    (Reply::Lease(r, res), Ok(())) => {
                        // The consumer stopped waiting (its `next()` was cancelled): give
                        // the message back at once instead of leaving it leased.
                        if let Err(Ok(Leased::Message(d))) = r.send(res)
                            && let Handle::Embedded { seq } = d.handle
                        {
                            orphaned.push(seq);
                        }
                    }
                    (Reply::Depth(r, res), Ok(())) => drop(r.send(res)),
                    (Reply::Unit(r, _), Err(e)) => drop(r.send(Err(e.clone()))),
                    (Reply::Lease(r, _), Err(e)) => drop(r.send(Err(e.clone()))),
                    (Reply::Depth(r, _), Err(e)) => drop(r.send(Err(e.clone()))),
                    (Reply::Nothing, _) => {}
                }
            }
            for seq in &orphaned {
                let _ = self.conn.execute(UNLEASE, params![seq]);
            }
            if (any_published || !orphaned.is_empty()) && committed.is_ok() {
                published.notify_one();
            }
        }
    }
}

fn fail_all(batch: Vec<Cmd>, e: &QueueError) {
    for cmd in batch {
        match cmd {
            Cmd::Publish(_, r) | Cmd::Ack(_, r) | Cmd::Release(_, r) | Cmd::Dead(_, _, r) => {
                drop(r.send(Err(e.clone())))
            }
            Cmd::Lease(r) => drop(r.send(Err(e.clone()))),
            Cmd::Depth(r) => drop(r.send(Err(e.clone()))),
            Cmd::Unlease(_) => {}
        }
    }
}

fn exec(tx: &rusqlite::Transaction<'_>, sql: &str, seq: i64) -> Result<(), QueueError> {
    tx.execute(sql, params![seq]).map(drop).map_err(unavailable)
}

fn publish(tx: &rusqlite::Transaction<'_>, msg: &Outgoing) -> Result<(), QueueError> {
    let now = ms(Utc::now());
    let not_before = msg.not_before.map_or(now, ms);
    tx.prepare_cached(
        "INSERT INTO messages (id, routing_key, body, not_before, enqueued_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut st| st.execute(params![msg.id, msg.routing_key, msg.body, not_before, now]))
    .map(drop)
    .map_err(unavailable)
}

type Row = (i64, String, Vec<u8>, i64, i64);

fn lease(tx: &rusqlite::Transaction<'_>, lease_ms: i64, limit: i64) -> Result<Leased, QueueError> {
    let now = ms(Utc::now());
    loop {
        let row: Option<Row> = tx
            .prepare_cached(
                "SELECT seq, routing_key, body, not_before, attempts FROM messages
                 WHERE not_before <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
                 ORDER BY not_before, seq LIMIT 1",
            )
            .and_then(|mut st| {
                st.query_row(params![now], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })
                .optional()
            })
            .map_err(unavailable)?;
        let Some((seq, routing_key, body, not_before, attempts)) = row else {
            let next_due: Option<i64> = tx
                .query_row(
                    "SELECT MIN(COALESCE(lease_until, not_before)) FROM messages",
                    [],
                    |r| r.get(0),
                )
                .map_err(unavailable)?;
            return Ok(Leased::Idle(next_due));
        };
        if attempts >= limit {
            bury(tx, seq, &format!("delivery limit of {limit} reached"))?;
            continue;
        }
        tx.execute(
            "UPDATE messages SET lease_until = ?1, attempts = attempts + 1 WHERE seq = ?2",
            params![now.saturating_add(lease_ms), seq],
        )
        .map_err(unavailable)?;
        return Ok(Leased::Message(Delivery {
            routing_key,
            body,
            redelivered: attempts > 0,
            not_before: from_ms(not_before),
            handle: Handle::Embedded { seq },
        }));
    }
}

fn bury(tx: &rusqlite::Transaction<'_>, seq: i64, reason: &str) -> Result<(), QueueError> {
    tx.execute(
        "INSERT INTO dead (id, routing_key, body, reason, attempts, dead_at)
         SELECT id, routing_key, body, ?2, attempts, ?3 FROM messages WHERE seq = ?1",
        params![seq, reason, ms(Utc::now())],
    )
    .and_then(|_| tx.execute("DELETE FROM messages WHERE seq = ?1", params![seq]))
    .map(drop)
    .map_err(unavailable)
}

fn depth(tx: &rusqlite::Transaction<'_>) -> Result<(u64, u64), QueueError> {
    let count = |sql| {
        tx.query_row(sql, [], |r| r.get::<_, i64>(0))
            .map_err(unavailable)
    };
    Ok((
        count("SELECT COUNT(*) FROM messages")? as u64,
        count("SELECT COUNT(*) FROM dead")? as u64,
    ))
}

/// The reasons recorded for dead-lettered messages, oldest first (for tests and tooling).
pub fn dead_reasons(path: &Path) -> rusqlite::Result<Vec<(String, String)>> {
    let conn = Connection::open(path)?;
    let mut st = conn.prepare("SELECT id, reason FROM dead ORDER BY seq")?;
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
}
