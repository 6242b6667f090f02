//! The run store's contract, on both backends: SQLite in a temp dir and a real PostgreSQL
//! started on loopback. Two `Store`s on one PostgreSQL database are two replicas.

mod support;

use chrono::Utc;
use rollgate::domain::run::{Run, RunStatus};
use rollgate::queue::Outgoing;
use rollgate::store::postgres::{MIGRATIONS, PgSettings};
use rollgate::store::{Claim, Commit, Committed, Events, Store, StoreError, WORKER_LEASE};
use std::sync::OnceLock;
use std::time::Duration;
use support::postgres::Postgres;

/// One server for the whole binary; each test has its own database.
fn server() -> &'static Postgres {
    static SERVER: OnceLock<Postgres> = OnceLock::new();
    SERVER.get_or_init(Postgres::start)
}

fn settings(url: &str) -> PgSettings {
    PgSettings {
        url: url.into(),
        password: None,
        max_connections: 4,
        timeout: Duration::from_secs(5),
    }
}

/// The SQLite store at `path`, with every workflow's runs known to it, as `serve` opens it.
fn open(path: &std::path::Path) -> Result<Store, StoreError> {
    rollgate::workflows::register();
    Store::open(path)
}

/// The PostgreSQL store `settings` name, with every workflow's runs known to it.
async fn connect(settings: &PgSettings) -> Result<Store, StoreError> {
    rollgate::workflows::register();
    Store::connect(settings).await
}

async fn replica(url: &str) -> Store {
    connect(&settings(url)).await.expect("connect")
}

/// A SQLite store and a PostgreSQL one, to run the same checks on.
async fn both() -> Vec<(Store, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = open(&dir.path().join("store.db")).unwrap();
    let pg = replica(&server().database().await).await;
    vec![(sqlite, dir), (pg, tempfile::tempdir().unwrap())]
}

fn upgrade(id: &str, target: &str) -> Run {
    Run::new(
        id.into(),
        rollgate::domain::upgrade_step::K8S_UPGRADE,
        serde_json::json!({}),
        Some(target.into()),
        Vec::new(),
        Utc::now(),
        "accepted",
    )
}

fn start(id: &str) -> Outgoing {
    Outgoing {
        id: format!("start-{id}"),
        routing_key: "detections".into(),
        body: b"{}".to_vec(),
        not_before: None,
    }
}

#[tokio::test]
async fn claims_dedup_and_the_log_behave_the_same_on_both_backends() {
    for (store, _dir) in both().await {
        let name = store.backend();
        let a = upgrade("a", "1.35.0");
        let Claim::New(seq) = store.claim_run(&a, &start("a")).await.unwrap() else {
            panic!("{name}: first claim refused");
        };
        let outbox = store.outbox().await.unwrap();
        assert_eq!(
            outbox,
            vec![(seq, start("a"))],
            "{name}: start in the outbox"
        );
        assert!(
            matches!(store.claim_run(&upgrade("a2", "1.35.0"), &start("a2")).await.unwrap(),
                Claim::InFlight(r) if r.id == "a"),
            "{name}: same target is in flight"
        );
        assert!(
            matches!(store.claim_run(&upgrade("b", "1.34.9"), &start("b")).await.unwrap(),
                Claim::Held(r) if r.id == "a"),
            "{name}: a queued upgrade holds the cluster"
        );
        assert_eq!(
            store.outbox().await.unwrap().len(),
            1,
            "{name}: nothing queued on a refusal"
        );
        store.outbox_sent(seq).await.unwrap();

        // An event is processed once; a replayed one writes nothing.
        let mut running = store.get_run("a").await.unwrap().unwrap();
        running.transition(RunStatus::Running, "started", Utc::now());
        let commit = |run: &Run| Commit {
            event: Some(("e1".into(), "detection")),
            runs: vec![run.clone()],
            ..Commit::default()
        };
        assert_eq!(
            store.commit(commit(&running)).await.unwrap(),
            Committed::Done { skipped: 0 }
        );
        let mut later = running.clone();
        later.transition(RunStatus::Failed, "should not land", Utc::now());
        assert_eq!(
            store.commit(commit(&later)).await.unwrap(),
            Committed::AlreadyProcessed,
            "{name}"
        );
        assert_eq!(
            store.get_run("a").await.unwrap().unwrap().status,
            RunStatus::Running
        );
        let log: Vec<RunStatus> = store
            .events_after(0, Some("a".into()), 100)
            .await
            .unwrap()
            .iter()
            .map(|e| e.transition.to)
            .collect();
        assert_eq!(log, [RunStatus::Queued, RunStatus::Running], "{name}");
        assert_eq!(store.in_progress().await.unwrap().len(), 1, "{name}");

        // The database refuses a second upgrade started beside the first.
        let mut second = upgrade("c", "1.36.0");
        second.transition(RunStatus::Running, "started", Utc::now());
        let refused = store
            .commit(Commit {
                runs: vec![second],
                ..Commit::default()
            })
            .await;
        assert!(refused.is_err(), "{name}: two upgrades started");
        assert!(
            store.get_run("c").await.unwrap().is_none(),
            "{name}: nothing half-written"
        );
    }
}

#[tokio::test]
async fn concurrent_claims_from_two_replicas_make_one_run() {
    let url = server().database().await;
    let (one, two) = (replica(&url).await, replica(&url).await);
    for round in 0..20 {
        let target = format!("1.{}.0", 40 + round);
        let mut tasks = Vec::new();
        for i in 0..10 {
            let store = if i % 2 == 0 { one.clone() } else { two.clone() };
            let id = format!("r{round}-{i}");
            let target = target.clone();
            tasks.push(tokio::spawn(async move {
                store
                    .claim_run(&upgrade(&id, &target), &start(&id))
                    .await
                    .unwrap()
            }));
        }
        let mut new = 0;
        for t in tasks {
            match t.await.unwrap() {
                Claim::New(_) => new += 1,
                Claim::InFlight(_) => {}
                Claim::Held(r) => panic!("round {round}: held by {}", r.id),
            }
        }
        assert_eq!(new, 1, "round {round}: one run per target");
        // Finish it, so that the next round's target may start.
        let mut run = one
            .in_flight(rollgate::domain::upgrade_step::K8S_UPGRADE, &target)
            .await
            .unwrap()
            .unwrap();
        run.transition(RunStatus::Aborted, "next round", Utc::now());
        one.commit(Commit {
            runs: vec![run],
            ..Commit::default()
        })
        .await
        .unwrap();
    }
    // The log is numbered in commit order across both replicas.
    let log = two.events_after(0, None, 1000).await.unwrap();
    assert_eq!(log.len(), 40);
    assert!(log.windows(2).all(|w| w[0].seq < w[1].seq));
}

#[tokio::test]
async fn one_replica_holds_the_worker_lease_and_a_deposed_one_cannot_commit() {
    let url = server().database().await;
    let (one, two) = (replica(&url).await, replica(&url).await);
    let ttl = Duration::from_secs(2);
    assert!(one.take_lease(WORKER_LEASE, ttl).await.unwrap());
    assert!(
        !two.take_lease(WORKER_LEASE, ttl).await.unwrap(),
        "held by the other"
    );
    assert!(one.take_lease(WORKER_LEASE, ttl).await.unwrap(), "renewed");
    let fenced = |id: &str| Commit {
        runs: vec![upgrade(id, id)],
        fenced: true,
        ..Commit::default()
    };
    one.commit(fenced("x")).await.unwrap();
    let Err(StoreError::Fenced { .. }) = two.commit(fenced("y")).await else {
        panic!("a replica without the lease committed");
    };
    assert!(two.get_run("y").await.unwrap().is_none());
    // Expired: the other takes it, and the first is fenced out.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert!(
        two.take_lease(WORKER_LEASE, ttl).await.unwrap(),
        "taken after expiry"
    );
    assert!(!one.take_lease(WORKER_LEASE, ttl).await.unwrap());
    assert!(matches!(
        one.commit(fenced("z")).await,
        Err(StoreError::Fenced { .. })
    ));
    // Given up: taken at once.
    two.drop_lease(WORKER_LEASE).await.unwrap();
    assert!(one.take_lease(WORKER_LEASE, ttl).await.unwrap());
}

#[tokio::test]
async fn postgres_migrates_from_empty_and_from_the_previous_version() {
    let pg = server();
    // Empty: every version, once; two replicas starting together migrate once.
    let url = pg.database().await;
    let pg_settings = settings(&url);
    let (a, b) = tokio::join!(connect(&pg_settings), connect(&pg_settings));
    let (a, _b) = (a.unwrap(), b.unwrap());
    let client = Postgres::client_of(&url).await;
    let version: i32 = client
        .query_one("SELECT version FROM rollgate_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version as usize, MIGRATIONS.len());
    assert!(
        a.take_lease(WORKER_LEASE, Duration::from_secs(1))
            .await
            .unwrap()
    );

    // The previous version, with a run in flight written by it.
    let url = pg.database().await;
    let client = Postgres::client_of(&url).await;
    client
        .batch_execute("CREATE TABLE rollgate_schema (version INTEGER NOT NULL); INSERT INTO rollgate_schema VALUES (1);")
        .await
        .unwrap();
    for sql in MIGRATIONS[0] {
        client.batch_execute(sql).await.unwrap();
    }
    let run = upgrade("old", "1.35.0");
    client
        .execute(
            "INSERT INTO runs (id, kind, status, target, created_at, doc, summary) VALUES ($1, 'k8s-upgrade', 'queued', '1.35.0', 0, $2, $3)",
            &[&run.id, &serde_json::to_string(&run).unwrap(), &serde_json::to_string(&run.summary()).unwrap()],
        )
        .await
        .unwrap();
    log_as_before(&client, &run).await;
    let store = replica(&url).await;
    assert_eq!(
        store.view_run("old", Events::All).await.unwrap().unwrap(),
        run
    );
    assert!(matches!(
        store.claim_run(&upgrade("new", "1.35.0"), &start("new")).await.unwrap(),
        Claim::InFlight(r) if r.id == "old"
    ));
    let version: i32 = client
        .query_one("SELECT version FROM rollgate_schema", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version as usize, MIGRATIONS.len());

    // A database from a newer rollgate is refused, naming what to do.
    client
        .execute("UPDATE rollgate_schema SET version = 99", &[])
        .await
        .unwrap();
    let Err(err) = connect(&settings(&url)).await else {
        panic!("a newer schema was opened");
    };
    let err = rollgate::error_chain(&err);
    let known = format!("schema version 99, newer than the {} ", MIGRATIONS.len());
    assert!(err.contains(&known), "{err}");
}

#[tokio::test]
async fn an_unreachable_postgres_is_a_prompt_error_not_a_hang() {
    let mut pg = Postgres::start();
    let url = pg.database().await;
    let store = connect(&PgSettings {
        timeout: Duration::from_millis(500),
        ..settings(&url)
    })
    .await
    .unwrap();
    store.ping().await.unwrap();
    pg.stop();
    let asked = std::time::Instant::now();
    assert!(store.ping().await.is_err());
    assert!(store.get_run("x").await.is_err());
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    pg.start_again();
    support::eventually(
        "the store answers again",
        Duration::from_secs(20),
        || async { store.ping().await.ok() },
    )
    .await;
}

#[tokio::test]
async fn the_lease_of_a_replica_whose_session_is_gone_is_taken_at_once() {
    let url = server().database().await;
    let ttl = Duration::from_secs(30);
    let (one, two) = (replica(&url).await, replica(&url).await);
    assert!(one.take_lease(WORKER_LEASE, ttl).await.unwrap());
    assert!(!two.take_lease(WORKER_LEASE, ttl).await.unwrap());
    // The holder dies: its connections close (as a kill -9 closes them).
    drop(one);
    support::eventually(
        "the lease taken long before it expires",
        Duration::from_secs(5),
        || async {
            two.take_lease(WORKER_LEASE, ttl)
                .await
                .unwrap()
                .then_some(())
        },
    )
    .await;
    // And the new holder keeps it against a third replica.
    let three = replica(&url).await;
    assert!(!three.take_lease(WORKER_LEASE, ttl).await.unwrap());
    assert!(two.take_lease(WORKER_LEASE, ttl).await.unwrap());
}

#[tokio::test]
async fn alert_notifications_committed_together_each_count_once_and_a_seen_one_is_skipped_alone() {
    use rollgate::domain::alert::AlertBatch;
    use rollgate::store::AlertEvent;
    let notification = |id: &str, fingerprint: &str| AlertEvent {
        id: id.into(),
        alerts: AlertBatch::from_json(&support::webhook(fingerprint))
            .expect("a webhook")
            .alerts,
    };
    for (store, _dir) in both().await {
        let name = store.backend();
        let one = Commit {
            alert_events: vec![notification("n1", "aa01")],
            ..Commit::default()
        };
        assert_eq!(
            store.commit(one).await.unwrap(),
            Committed::Done { skipped: 0 }
        );
        // n1 again (a publisher sent it twice), n2 and n3 new, n3 twice in the batch.
        let batch = Commit {
            alert_events: vec![
                notification("n1", "aa01"),
                notification("n2", "aa02"),
                notification("n3", "aa03"),
                notification("n3", "aa03"),
            ],
            ..Commit::default()
        };
        assert_eq!(
            store.commit(batch).await.unwrap(),
            Committed::Done { skipped: 2 },
            "{name}"
        );
        let board: std::collections::HashMap<String, u64> = store
            .board(Utc::now())
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.alert.fingerprint.clone(), e.received))
            .collect();
        for fingerprint in ["aa01", "aa02", "aa03"] {
            assert_eq!(board.get(fingerprint), Some(&1), "{name}: {fingerprint}");
        }
        for id in ["n1", "n2", "n3"] {
            assert!(store.is_processed(id).await.unwrap(), "{name}: {id}");
        }
    }
}

/// A resolved alert leaves the board a day after its last notification; a firing one
/// stays however old (the board must not forget a blocker). Both backends.
#[tokio::test]
async fn resolved_alerts_leave_the_board_after_a_day_and_firing_ones_stay() {
    use rollgate::domain::alert::AlertBatch;
    use rollgate::store::AlertEvent;
    let notification = |id: &str, fingerprint: &str, status: &str| {
        let mut body = support::webhook(fingerprint);
        body["status"] = status.into();
        body["alerts"][0]["status"] = status.into();
        AlertEvent {
            id: id.into(),
            alerts: AlertBatch::from_json(&body).expect("a webhook").alerts,
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let url = server().database().await;
    let day_and_an_hour_ago = Utc::now().timestamp_millis() - 25 * 3_600_000;
    for backend in ["sqlite", "postgres"] {
        let open = || async {
            match backend {
                "sqlite" => open(&path).unwrap(),
                _ => replica(&url).await,
            }
        };
        let store = open().await;
        let alerts = Commit {
            alert_events: vec![
                notification("r-old", "aa0ld0res", "resolved"),
                notification("f-old", "aa0ld0fir", "firing"),
                notification("r-new", "aa0new0res", "resolved"),
            ],
            ..Commit::default()
        };
        store.commit(alerts).await.unwrap();
        drop(store);
        // Their last notifications came 25 hours ago.
        let backdate =
            "UPDATE alerts SET updated_at = $1 WHERE fingerprint IN ('aa0ld0res', 'aa0ld0fir')";
        match backend {
            "sqlite" => {
                let c = rusqlite::Connection::open(&path).unwrap();
                let changed = c
                    .execute(&backdate.replace("$1", "?1"), [day_and_an_hour_ago])
                    .unwrap();
                assert_eq!(changed, 2);
            }
            _ => {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                let changed = client
                    .execute(backdate, &[&day_and_an_hour_ago])
                    .await
                    .unwrap();
                assert_eq!(changed, 2);
            }
        }
        // A store that has not purged yet commits the next notification.
        let store = open().await;
        store
            .commit(Commit {
                alert_events: vec![notification("later", "aa1ater0fir", "firing")],
                ..Commit::default()
            })
            .await
            .unwrap();
        let mut board: Vec<String> = store
            .board(Utc::now())
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.alert.fingerprint)
            .collect();
        board.sort();
        assert_eq!(
            board,
            ["aa0ld0fir", "aa0new0res", "aa1ater0fir"],
            "{backend}"
        );
    }
}

/// Notifications out of order and resent: the board keeps the newest by the alert's own
/// times, not the last to arrive, and counts each one received. Both backends.
#[tokio::test]
async fn the_board_keeps_the_newest_notification_by_the_alerts_own_times() {
    use rollgate::domain::alert::{AlertBatch, AlertStatus};
    use rollgate::store::AlertEvent;
    let notification = |id: &str, status: &str, starts: &str, ends: &str| {
        let mut body = support::webhook("ff0rder");
        body["status"] = status.into();
        body["alerts"][0]["status"] = status.into();
        body["alerts"][0]["startsAt"] = starts.into();
        body["alerts"][0]["endsAt"] = ends.into();
        AlertEvent {
            id: id.into(),
            alerts: AlertBatch::from_json(&body).expect("a webhook").alerts,
        }
    };
    const ZERO: &str = "0001-01-01T00:00:00Z";
    let dir = tempfile::tempdir().unwrap();
    let url = server().database().await;
    for backend in ["sqlite", "postgres"] {
        let store = match backend {
            "sqlite" => open(&dir.path().join("store.db")).unwrap(),
            _ => replica(&url).await,
        };
        let board = || async {
            let entries = store.board(Utc::now()).await.unwrap();
            assert_eq!(entries.len(), 1, "{backend}");
            (
                entries[0].alert.status,
                entries[0].alert.starts_at.to_rfc3339(),
                entries[0].received,
            )
        };
        // (notification, one per commit, and the board after it)
        let steps = [
            // The resolution arrives before the firing it resolves.
            (
                notification(
                    "n1",
                    "resolved",
                    "2026-12-01T10:00:00Z",
                    "2026-12-01T10:05:00Z",
                ),
                AlertStatus::Resolved,
                "2026-12-01T10:00:00+00:00",
            ),
            (
                notification("n2", "firing", "2026-12-01T10:00:00Z", ZERO),
                AlertStatus::Resolved,
                "2026-12-01T10:00:00+00:00",
            ),
            // The same group resent.
            (
                notification(
                    "n3",
                    "resolved",
                    "2026-12-01T10:00:00Z",
                    "2026-12-01T10:05:00Z",
                ),
                AlertStatus::Resolved,
                "2026-12-01T10:00:00+00:00",
            ),
            // It fires again: a new start.
            (
                notification("n4", "firing", "2026-12-01T11:00:00Z", ZERO),
                AlertStatus::Firing,
                "2026-12-01T11:00:00+00:00",
            ),
            // A late copy of the first resolution.
            (
                notification(
                    "n5",
                    "resolved",
                    "2026-12-01T10:00:00Z",
                    "2026-12-01T10:05:00Z",
                ),
                AlertStatus::Firing,
                "2026-12-01T11:00:00+00:00",
            ),
        ];
        for (received, (event, status, starts)) in steps.into_iter().enumerate() {
            store
                .commit(Commit {
                    alert_events: vec![event],
                    ..Commit::default()
                })
                .await
                .unwrap();
            assert_eq!(
                board().await,
                (status, starts.to_owned(), received as u64 + 1),
                "{backend}, notification {}",
                received + 1
            );
        }
    }
}

/// A planned upgrade of 1 control plane + `workers` workers, one worker per batch.
fn planned(id: &str, workers: usize) -> Run {
    use rollgate::domain::event::Stage;
    use rollgate::domain::run::Step;
    use rollgate::domain::upgrade_step::UpgradeStep;
    let mut steps = vec![
        Step::new(UpgradeStep::Plan),
        Step::new(UpgradeStep::NodesReady),
    ];
    for n in std::iter::once("cp".to_owned()).chain((1..=workers).map(|i| format!("w{i}"))) {
        let stage = if n == "cp" {
            Stage::ControlPlane
        } else {
            Stage::Workers
        };
        let node = || n.clone();
        steps.extend([
            Step::new(UpgradeStep::Gate {
                stage,
                node: Some(node()),
            }),
            Step::new(UpgradeStep::Drain {
                stage,
                node: node(),
            }),
            Step::new(UpgradeStep::Upgrade {
                stage,
                node: node(),
            }),
            Step::new(UpgradeStep::Verify {
                stage,
                node: node(),
            }),
            Step::new(UpgradeStep::Uncordon {
                stage,
                node: node(),
            }),
            Step::new(UpgradeStep::Soak {
                stage,
                node: node(),
            }),
        ]);
    }
    let mut run = upgrade(id, "1.34.5");
    run.steps = steps.into();
    run
}

/// What the bytes a store wrote are read from.
enum Meter<'a> {
    /// SQLite: the size of the WAL file, checkpointed and emptied before a count, and
    /// kept from being rewound during it by a reader's open transaction (a checkpoint
    /// then cannot start the log over, so every frame written lengthens the file).
    Wal(&'a std::path::Path),
    /// PostgreSQL: the server's WAL position.
    Lsn(&'a tokio_postgres::Client),
}

impl Meter<'_> {
    async fn written(&self) -> u64 {
        match self {
            Self::Wal(path) => std::fs::metadata(path).map_or(0, |m| m.len()),
            Self::Lsn(client) => client
                .query_one(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::BIGINT",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0) as u64,
        }
    }
}

/// Bytes the store wrote for each of `n` transitions of a run of 1 + `workers` workers,
/// after as many to warm up.
async fn bytes_per_transition(store: &Store, workers: usize, meter: &Meter<'_>) -> f64 {
    use rollgate::domain::engine::{Input, Next, StepOutcome, advance};
    let ctx = support::engine_context(chrono::Utc::now());
    let mut run = planned(&format!("bytes-{workers}"), workers);
    let mut next = advance(&mut run, Input::Start, &ctx).unwrap();
    let mut commit = Commit {
        runs: vec![run],
        ..Commit::default()
    };
    store.commit_keeping(&mut commit).await.unwrap();
    let n = 20;
    let mut before = 0;
    for i in 0..2 * n {
        if i == n {
            before = meter.written().await;
        }
        let input = match next {
            Next::RunStep { epoch, .. } => Input::StepFinished {
                epoch,
                outcome: StepOutcome::done("ok"),
            },
            Next::WakeAt { epoch, .. } => Input::Wake { epoch },
            other => panic!("the run stopped: {other:?}"),
        };
        next = advance(&mut commit.runs[0], input, &ctx).unwrap();
        store.commit_keeping(&mut commit).await.unwrap();
    }
    let after = meter.written().await;
    assert!(after >= before, "the meter went back: {before} -> {after}");
    (after - before) as f64 / n as f64
}

#[tokio::test]
async fn a_transition_writes_as_many_bytes_for_500_workers_as_for_10_on_both_backends() {
    // SQLite: the bytes the WAL grows by (checkpointed and emptied before the count); a
    // store of its own for each size (one upgrade at a time per store).
    let dir = tempfile::tempdir().unwrap();
    let mut sqlite_bytes = Vec::new();
    for workers in [10, 500] {
        let path = dir.path().join(format!("store-{workers}.db"));
        let sqlite = open(&path).unwrap();
        let wal = path.with_extension("db-wal");
        let checkpoint = rusqlite::Connection::open(&path).unwrap();
        checkpoint
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let reader = rusqlite::Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        sqlite_bytes.push(bytes_per_transition(&sqlite, workers, &Meter::Wal(&wal)).await);
        drop(reader);
    }
    // PostgreSQL: the WAL bytes of a server of its own (no other test writes to it), a
    // database for each size.
    let server = Postgres::start();
    let mut pg_bytes = Vec::new();
    for workers in [10, 500] {
        let url = server.database().await;
        let pg = replica(&url).await;
        let client = Postgres::client_of(&url).await;
        pg_bytes.push(bytes_per_transition(&pg, workers, &Meter::Lsn(&client)).await);
    }
    for (name, bytes) in [("sqlite", &sqlite_bytes), ("postgres", &pg_bytes)] {
        println!(
            "{name}: bytes per transition, 10 workers {:.0}, 500 workers {:.0}",
            bytes[0], bytes[1]
        );
        assert!(
            bytes[0] > 0.0 && bytes[1] > 0.0,
            "{name}: nothing measured: {bytes:?}"
        );
        assert!(
            bytes[1] <= bytes[0] * 1.5,
            "{name}: a transition of a 500-worker run writes {:.0} bytes, of a 10-worker run {:.0}",
            bytes[1],
            bytes[0]
        );
    }
}

#[tokio::test]
async fn a_version_2_database_has_its_run_in_flight_split_into_steps_and_log() {
    let url = server().database().await;
    let client = Postgres::client_of(&url).await;
    client
        .batch_execute(
            "CREATE TABLE rollgate_schema (version INTEGER NOT NULL);
             INSERT INTO rollgate_schema (version) VALUES (2);",
        )
        .await
        .unwrap();
    for statements in &MIGRATIONS[..2] {
        for sql in *statements {
            client.batch_execute(sql).await.unwrap();
        }
    }
    let mut run = planned("old", 3);
    run.transition(RunStatus::Running, "step plan (attempt 1)", Utc::now());
    client
        .execute(
            "INSERT INTO runs (id, kind, status, target, created_at, doc, summary)
             VALUES ($1, 'k8s-upgrade', 'running', '1.34.5', 0, $2, '{}')",
            &[&run.id, &serde_json::to_string(&run).unwrap()],
        )
        .await
        .unwrap();
    log_as_before(&client, &run).await;
    let store = replica(&url).await;
    let back = store.view_run("old", Events::All).await.unwrap().unwrap();
    assert_eq!(back, run, "the same run, read from its parts");
    let head: String = client
        .query_one("SELECT doc FROM runs WHERE id = 'old'", &[])
        .await
        .unwrap()
        .get(0);
    let head: serde_json::Value = serde_json::from_str(&head).unwrap();
    assert_eq!(head["steps"], serde_json::json!([]), "{head}");
    let steps: i64 = client
        .query_one("SELECT COUNT(*) FROM run_steps WHERE run_id = 'old'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(steps as usize, run.steps.len());
    // It carries on: a change writes its step and transition, and reads back whole.
    let mut next = back;
    next.step_mut(1).status = rollgate::domain::run::StepStatus::Running;
    next.transition(RunStatus::Waiting, "waits", Utc::now());
    store
        .commit(Commit {
            runs: vec![next.clone()],
            ..Commit::default()
        })
        .await
        .unwrap();
    assert_eq!(
        store.view_run("old", Events::All).await.unwrap().unwrap(),
        next
    );
}

/// Logs `run`'s transitions as every version before 3 did with each write of a run.
async fn log_as_before(client: &tokio_postgres::Client, run: &Run) {
    for transition in &run.history {
        let event = rollgate::domain::run::RunEvent {
            seq: 0,
            run_id: run.id.clone(),
            kind: run.kind,
            target: run.target.clone(),
            transition: transition.clone(),
            blockers: Vec::new(),
        };
        client
            .execute(
                "INSERT INTO run_events (run_id, doc) VALUES ($1, $2)",
                &[&run.id, &serde_json::to_string(&event).unwrap()],
            )
            .await
            .unwrap();
    }
}

/// The gate's quiet time on both backends: the first open sighting starts it, later ones
/// keep it (every replica records), a blocking alert clears it, the next open starts it
/// again; and a second store on the same data (a restart, another replica) reads it back.
#[tokio::test]
async fn quiet_since_starts_at_the_first_open_gate_and_a_blocking_alert_restarts_it() {
    let at = |secs: i64| chrono::DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap();
    for (store, _dir) in both().await {
        let name = store.backend();
        assert_eq!(store.quiet_since().await.unwrap(), None, "{name}");
        store.record_gate(false, at(10)).await.unwrap();
        store.record_gate(false, at(20)).await.unwrap();
        assert_eq!(store.quiet_since().await.unwrap(), Some(at(10)), "{name}");
        store.record_gate(true, at(30)).await.unwrap();
        assert_eq!(store.quiet_since().await.unwrap(), None, "{name}");
        store.record_gate(true, at(35)).await.unwrap();
        store.record_gate(false, at(40)).await.unwrap();
        store.record_gate(false, at(50)).await.unwrap();
        assert_eq!(store.quiet_since().await.unwrap(), Some(at(40)), "{name}");
    }
    // Read back by another store on the same files: kept across restarts.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    open(&path)
        .unwrap()
        .record_gate(false, at(60))
        .await
        .unwrap();
    assert_eq!(
        open(&path).unwrap().quiet_since().await.unwrap(),
        Some(at(60))
    );
    let url = server().database().await;
    replica(&url)
        .await
        .record_gate(false, at(70))
        .await
        .unwrap();
    assert_eq!(
        replica(&url).await.quiet_since().await.unwrap(),
        Some(at(70))
    );
}

#[tokio::test]
async fn a_version_4_database_keeps_its_runs_held_by_a_gate_or_an_approval_held() {
    use rollgate::domain::engine::{self, AWAITS_APPROVAL};
    use rollgate::domain::event::ControlAction;
    use rollgate::domain::run::{Held, StepStatus};
    let url = server().database().await;
    let waiting = |id: &str, outcome: &str| {
        let mut run = planned(id, 3);
        run.target = Some(format!("1.34.{}", id.len()));
        run.transition(RunStatus::Running, "step (attempt 1)", Utc::now());
        run.transition(RunStatus::Waiting, outcome, Utc::now());
        run.in_hand = vec![1];
        let step = run.step_mut(1);
        step.status = StepStatus::Waiting;
        step.attempts = 1;
        step.outcome = Some(outcome.to_owned());
        run
    };
    // One Kubernetes upgrade may have started: the gated run is a reboot.
    let mut gated = waiting("gated", "gate closed: NodeDown on w1");
    gated.kind = rollgate::workflows::node_reboot::step::NODE_REBOOT;
    let approval = waiting(
        "approval",
        &format!("{AWAITS_APPROVAL}: upstreams ready (staging)"),
    );
    // Written as version 4 wrote them: no `held` in any step.
    {
        let store = replica(&url).await;
        store
            .commit(Commit {
                runs: vec![gated.clone(), approval.clone()],
                ..Commit::default()
            })
            .await
            .unwrap();
    }
    let client = Postgres::client_of(&url).await;
    let holds: i64 = client
        .query_one(
            "SELECT COUNT(*) FROM run_steps WHERE doc::JSONB ? 'held'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(holds, 0, "the runs were built without a hold");
    client
        .execute("UPDATE rollgate_schema SET version = 4", &[])
        .await
        .unwrap();
    let store = replica(&url).await;
    let gated = store.get_run("gated").await.unwrap().unwrap();
    assert!(gated.steps[1].is_held(Held::Gate), "{:?}", gated.steps[1]);
    assert!(engine::check_control(&gated, ControlAction::Approve).is_err());
    let approval = store.get_run("approval").await.unwrap().unwrap();
    assert!(
        approval.steps[1].is_held(Held::Approval),
        "{:?}",
        approval.steps[1]
    );
    assert!(engine::check_control(&approval, ControlAction::Approve).is_ok());
}

/// A run read for work carries its steps and the count of its transitions, not the
/// transitions themselves; what it adds is logged after them, in order; a view reads the
/// whole history or a window of it from the log, on both backends.
#[tokio::test]
async fn a_run_read_for_work_carries_no_past_and_a_view_reads_a_window_of_it() {
    for (store, _dir) in both().await {
        let name = store.backend();
        let mut run = upgrade("h", "1.35.0");
        for n in 1..=4 {
            run.note(format!("note {n}"), Utc::now());
        }
        assert!(store.insert_run_if_absent(&run).await.unwrap(), "{name}");
        let reasons =
            |run: &Run| -> Vec<String> { run.history.iter().map(|t| t.reason.clone()).collect() };

        let mut work = store.get_run("h").await.unwrap().unwrap();
        assert!(work.history.is_empty(), "{name}: {:?}", work.history);
        assert_eq!(
            (work.history_before, work.history_len(), work.touched.logged),
            (5, 5, 5),
            "{name}"
        );
        work.transition(RunStatus::Running, "started", Utc::now());
        let committed = store
            .commit(Commit {
                runs: vec![work],
                ..Commit::default()
            })
            .await
            .unwrap();
        assert_eq!(committed, Committed::Done { skipped: 0 }, "{name}");

        let whole = store.view_run("h", Events::All).await.unwrap().unwrap();
        assert_eq!(
            reasons(&whole),
            [
                "accepted", "note 1", "note 2", "note 3", "note 4", "started"
            ],
            "{name}: the transition added on the run read for work follows the others"
        );
        assert_eq!(whole.history_before, 0, "{name}");
        let logged: Vec<String> = store
            .events_after(0, Some("h".into()), 100)
            .await
            .unwrap()
            .iter()
            .map(|e| e.transition.reason.clone())
            .collect();
        assert_eq!(logged, reasons(&whole), "{name}: the log, read apart");

        let page = store
            .view_run(
                "h",
                Events::Page {
                    from: 1,
                    limit: Some(2),
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(reasons(&page), ["note 1", "note 2"], "{name}");
        assert_eq!(
            (page.history_before, page.touched.logged),
            (1, 6),
            "{name}: where the window starts, and how many the log holds"
        );
        let last = store.view_run("h", Events::Last(2)).await.unwrap().unwrap();
        assert_eq!(reasons(&last), ["note 4", "started"], "{name}");
        assert_eq!(last.history_before, 4, "{name}");
        let beyond = store
            .view_run(
                "h",
                Events::Page {
                    from: 9,
                    limit: None,
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert!(beyond.history.is_empty(), "{name}");
        assert_eq!(beyond.history_before, 6, "{name}");
    }
}

/// The API sends a run as stored, composed from its documents (only the head decoded):
/// what it sends is, field for field, the run decoded whole and encoded again, whole and
/// paged, on both backends.
#[tokio::test]
async fn a_run_sent_as_stored_is_the_run_decoded_and_encoded_again() {
    use rollgate::domain::run::StepStatus;
    for (store, _dir) in both().await {
        let name = store.backend();
        let mut run = planned("v", 3);
        run.steps[0].status = StepStatus::Done;
        run.steps[0].outcome = Some("planned \"1 + 3\" nodes".into());
        run.steps[1].started_at = Some(Utc::now());
        run.note("a note", Utc::now());
        run.transition(RunStatus::Running, "started", Utc::now());
        let run = run.credited("alice");
        assert!(store.insert_run_if_absent(&run).await.unwrap(), "{name}");
        let mut work = store.get_run("v").await.unwrap().unwrap();
        work.note("a second note", Utc::now());
        store
            .commit(Commit {
                runs: vec![work],
                ..Commit::default()
            })
            .await
            .unwrap();

        let windows = [
            Events::All,
            Events::Last(2),
            Events::Page {
                from: 1,
                limit: Some(2),
            },
        ];
        let pages = [(0, None), (2, Some(3)), (99, None)];
        for events in windows {
            let decoded = store.view_run("v", events).await.unwrap().unwrap();
            assert!(
                decoded.history.iter().any(|t| t.by.is_some()) || events != Events::All,
                "{name}: the test's run credits a transition"
            );
            for (from, limit) in pages {
                let mut view = store.view_run_json("v", events).await.unwrap().unwrap();
                view.keep_steps(from, limit);
                let page = serde_json::json!({ "kept": [from, limit] });
                let sent: serde_json::Value =
                    serde_json::from_slice(&view.to_json(&[("page", page.clone())]).unwrap())
                        .unwrap();
                let mut expected = decoded.clone();
                let end = limit.map_or(expected.steps.len(), |l| {
                    (from.min(expected.steps.len()) + l).min(expected.steps.len())
                });
                expected.steps.truncate(end);
                let start = from.min(expected.steps.len());
                expected.steps.splice(..start, []);
                let mut expected = serde_json::to_value(&expected).unwrap();
                expected["page"] = page;
                assert_eq!(sent, expected, "{name}: {events:?}, steps {from} {limit:?}");
                assert_eq!(
                    (view.history_from, view.history_total, view.steps_total),
                    (decoded.history_before, 4, decoded.steps.len()),
                    "{name}: {events:?}"
                );
            }
        }
        assert!(
            store
                .view_run_json("none", Events::All)
                .await
                .unwrap()
                .is_none()
        );
    }
}
