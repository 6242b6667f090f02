//! The embedded queue and the worker over it, in-process: delayed wakes across a reopen,
//! poison messages, leases after a crash.

mod support;

use chrono::Utc;
use rollgate::adapters::notify::LogNotifier;
use rollgate::domain::event::{CloudEvent, EventData};
use rollgate::metrics::Metrics;
use rollgate::ports::Executors;
use rollgate::queue::embedded::{EmbeddedQueue, dead_reasons};
use rollgate::queue::{Outgoing, Queue};
use rollgate::store::Store;
use rollgate::worker::{Worker, WorkerPolicy};
use std::sync::Arc;
use std::time::Duration;
use support::{eventually, receive_on_time, wake_message, webhook};

const LEASE: Duration = Duration::from_secs(600);

/// A worker over `queue` and `store` in this process; stop it with [`stop_worker`].
fn spawn_worker(
    queue: Arc<dyn Queue>,
    store: Store,
    metrics: Metrics,
    executors: Executors,
) -> (
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let policy = WorkerPolicy {
        on_failure: rollgate::domain::run::FailurePolicy::Halt,
        max_attempts: 3,
        halt_after: Duration::from_secs(60),
        failure_budget: Default::default(),
        asks_upstreams: false,
    };
    let worker = Worker::new(
        queue,
        store,
        metrics,
        executors,
        policy,
        Arc::new(LogNotifier),
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    (stop, tokio::spawn(worker.run(stopped)))
}

async fn stop_worker(
    (stop, task): (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ),
) {
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_wake_2s_ahead_fires_no_earlier_than_2s_also_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let queue = EmbeddedQueue::open(&path, LEASE, 10).unwrap();
    let msg = wake_message("a", 2);
    queue.publish(msg.clone()).await.unwrap();
    receive_on_time(&queue, &msg).await;

    let msg = wake_message("b", 2);
    queue.publish(msg.clone()).await.unwrap();
    drop(queue);
    let queue = EmbeddedQueue::open(&path, LEASE, 10).unwrap();
    receive_on_time(&queue, &msg).await;
}

#[tokio::test]
async fn a_delivery_leased_by_a_dead_process_comes_back_at_once_and_is_marked_redelivered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let queue = EmbeddedQueue::open(&path, LEASE, 10).unwrap();
    let msg = wake_message("c", 0);
    queue.publish(msg.clone()).await.unwrap();
    let first = queue.next().await.unwrap();
    assert!(!first.redelivered);
    drop(queue); // never acked: the process "died" holding the lease
    let queue = EmbeddedQueue::open(&path, LEASE, 10).unwrap();
    let again = tokio::time::timeout(Duration::from_secs(5), queue.next())
        .await
        .unwrap()
        .unwrap();
    assert!(again.redelivered);
    assert_eq!(again.body, msg.body);
    queue.ack(&again).await.unwrap();
    assert_eq!(queue.depth().await.unwrap(), 0);
}

#[tokio::test]
async fn a_message_past_its_delivery_limit_is_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let queue = EmbeddedQueue::open(&path, LEASE, 2).unwrap();
    queue.publish(wake_message("d", 0)).await.unwrap();
    for _ in 0..2 {
        let d = queue.next().await.unwrap();
        queue.release(&d).await.unwrap();
    }
    let next = tokio::time::timeout(Duration::from_millis(1500), queue.next()).await;
    assert!(
        next.is_err(),
        "a message over its limit was delivered again"
    );
    assert_eq!(queue.dead_depth().await.unwrap(), 1);
    let reasons = dead_reasons(&path).unwrap();
    assert!(reasons[0].1.contains("delivery limit of 2"), "{reasons:?}");
}

#[tokio::test]
async fn poison_goes_to_the_dead_table_with_its_reason_and_the_worker_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let queue: Arc<dyn Queue> = Arc::new(EmbeddedQueue::open(&path, LEASE, 10).unwrap());
    rollgate::workflows::register();
    let store = Store::open(&dir.path().join("store.db")).unwrap();
    let metrics = Metrics::new();
    let worker = spawn_worker(
        queue.clone(),
        store.clone(),
        metrics.clone(),
        Executors::default(),
    );
    let raw = |id: &str, body: Vec<u8>| Outgoing {
        id: id.into(),
        routing_key: "alerts".into(),
        body,
        not_before: None,
    };
    queue.publish(raw("p1", b"{{{".to_vec())).await.unwrap();
    let good = CloudEvent::new(
        &EventData::Alerts(
            rollgate::domain::alert::AlertBatch::from_json(&webhook("cc01")).unwrap(),
        ),
        "test",
        Utc::now(),
    );
    queue.publish(raw(&good.id, good.to_bytes())).await.unwrap();
    eventually(
        "the good alert on the board",
        Duration::from_secs(10),
        || async {
            let board = store.board(Utc::now()).await.unwrap();
            board
                .iter()
                .any(|e| e.alert.fingerprint == "cc01")
                .then_some(())
        },
    )
    .await;
    assert_eq!(queue.dead_depth().await.unwrap(), 1);
    assert_eq!(queue.depth().await.unwrap(), 0);
    let reasons = dead_reasons(&path).unwrap();
    assert_eq!(reasons[0].0, "p1");
    assert!(reasons[0].1.contains("not a CloudEvents"), "{reasons:?}");
    assert!(
        metrics
            .render()
            .contains("rollgate_events_dead_lettered_total{type=\"unknown\"} 1")
    );
    stop_worker(worker).await;
}

#[tokio::test]
async fn concurrent_publishes_are_all_durable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queue.db");
    let queue = Arc::new(EmbeddedQueue::open(&path, LEASE, 10).unwrap());
    let mut tasks = Vec::new();
    for i in 0..200 {
        let q = queue.clone();
        tasks.push(tokio::spawn(async move {
            q.publish(wake_message(&format!("r{i}"), 0)).await
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    drop(queue);
    // A fresh handle sees every one: each publish returned only after its commit.
    let queue = EmbeddedQueue::open(&path, LEASE, 10).unwrap();
    assert_eq!(queue.depth().await.unwrap(), 200);
}

/// Counts executions and finishes every step.
struct Recording(std::sync::atomic::AtomicUsize);

#[async_trait::async_trait]
impl rollgate::ports::StepExecutor for Recording {
    async fn execute(
        &self,
        _run: &rollgate::domain::run::Run,
        _index: usize,
    ) -> rollgate::domain::engine::StepOutcome {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        rollgate::domain::engine::StepOutcome::done("done")
    }
}

#[tokio::test]
async fn a_step_in_hand_at_a_crash_is_run_again_at_start() {
    use rollgate::domain::engine::{Context, Input, advance};
    use rollgate::domain::event::Stage;
    use rollgate::domain::run::{Run, RunStatus, Step};
    use rollgate::domain::upgrade_step::UpgradeStep;
    use rollgate::workflows::k8s_upgrade::UpgradeExecutors;
    let dir = tempfile::tempdir().unwrap();
    let queue: Arc<dyn Queue> =
        Arc::new(EmbeddedQueue::open(&dir.path().join("queue.db"), LEASE, 10).unwrap());
    rollgate::workflows::register();
    let store = Store::open(&dir.path().join("store.db")).unwrap();
    // What a crash leaves: the step persisted as in hand, its message already acked.
    let mut run = Run::new(
        "crashed".into(),
        rollgate::domain::upgrade_step::K8S_UPGRADE,
        serde_json::json!({}),
        Some("1.34.5".into()),
        vec![Step::new(UpgradeStep::Drain {
            stage: Stage::Workers,
            node: "w1".into(),
        })],
        Utc::now(),
        "accepted",
    );
    let any = |_: &Step| true;
    let ctx = Context {
        now: Utc::now(),
        can_execute: &any,
        max_attempts: 3,
        halt_after: chrono::Duration::minutes(30),
        retry: WorkerPolicy::STEP_RETRY,
        jitter: 0.5,
        failure_budget: Default::default(),
    };
    advance(&mut run, Input::Start, &ctx).unwrap();
    assert_eq!(run.status, RunStatus::Running);
    store.insert_run_if_absent(&run).await.unwrap();

    let recording = Arc::new(Recording(std::sync::atomic::AtomicUsize::new(0)));
    // The upgrade's own steps only, as `serve` hands them (the quiet period and the
    // upstreams' wait have no executor here).
    let executors = Executors::default().with(
        rollgate::domain::upgrade_step::K8S_UPGRADE,
        Arc::new(UpgradeExecutors {
            steps: Some(recording.clone() as Arc<dyn rollgate::ports::StepExecutor>),
            ..UpgradeExecutors::default()
        }),
    );
    let worker = spawn_worker(queue, store.clone(), Metrics::new(), executors);
    let run = eventually(
        "the step run again and the run done",
        Duration::from_secs(10),
        || async {
            let run = store.get_run("crashed").await.unwrap()?;
            (run.status == RunStatus::Succeeded).then_some(run)
        },
    )
    .await;
    assert_eq!(recording.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(
        run.steps[0].attempts, 2,
        "the attempt before the crash and the one after"
    );
    stop_worker(worker).await;
}

#[tokio::test]
async fn a_cancelled_receive_does_not_strand_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let queue = EmbeddedQueue::open(&dir.path().join("queue.db"), LEASE, 10).unwrap();
    let msg = wake_message("e", 0);
    queue.publish(msg.clone()).await.unwrap();
    // Poll a receive once (its lease request goes out), then drop it: before the reply
    // (the writer finds nobody to hand it to) and after (the reply sits unread).
    for settle in [Duration::ZERO, Duration::from_millis(100)] {
        let mut receive = Box::pin(queue.next());
        tokio::select! {
            biased;
            _ = &mut receive => panic!("a lease cannot complete within one poll"),
            () = std::future::ready(()) => {}
        }
        tokio::time::sleep(settle).await;
        drop(receive);
    }
    let got = tokio::time::timeout(Duration::from_secs(5), queue.next())
        .await
        .expect("the message is deliverable at once, not after the 10 min lease")
        .unwrap();
    assert_eq!(got.body, msg.body);
    assert!(
        !got.redelivered,
        "the cancelled leases were undone, attempts included"
    );
}
