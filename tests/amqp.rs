//! The AMQP backend against the real RabbitMQ: external publishers, deduplication,
//! poison messages, delayed wakes that survive a restart.

mod support;

use chrono::Utc;
use rollgate::queue::Queue;
use rollgate::queue::amqp::AmqpQueue;
use serde_json::json;
use std::time::Duration;
use support::cluster::IntakeCluster;
use support::rabbit::{self, Names};
use support::{Rollgate, board, eventually, receive_on_time, wake_message, webhook};

fn envelope(id: &str, event_type: &str, data: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "specversion": "1.0", "id": id, "source": "test/publisher", "type": event_type,
        "time": Utc::now().to_rfc3339(), "data": data
    }))
    .unwrap()
}

async fn start(names: &Names) -> Rollgate {
    let env = names.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Rollgate::start(&env).await
}

/// `serve` on RabbitMQ with a cluster to upgrade.
async fn start_with_cluster(names: &Names, cluster: &IntakeCluster) -> Rollgate {
    let env = names.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cluster.rollgate(&env).await
}

#[tokio::test]
async fn external_publishers_are_handled_like_http_and_ids_deduplicate() {
    let names = Names::unique();
    let cluster = IntakeCluster::start().await;
    let rg = start_with_cluster(&names, &cluster).await;

    let detection = envelope(
        "ext-det-1",
        "rollgate.detection.v1",
        json!({"target_version": "1.34.5", "kind": "patch", "stages": "all"}),
    );
    rabbit::publish(&names.exchange, "detections", &detection, "ext-det-1").await;
    let run = eventually(
        "the published detection makes a run",
        Duration::from_secs(20),
        || async {
            let (_, runs) = rg.get("/v1/runs").await;
            runs.as_array()?
                .iter()
                .find(|r| r["target"] == "1.34.5")
                .cloned()
        },
    )
    .await;
    let run = rg
        .wait_run(run["id"].as_str().unwrap(), "held at its gate", |r| {
            support::held_at_preflight_gate(r)
        })
        .await;
    // With no Prometheus the gate is unknown: the run holds before `plan`.
    let names_of: Vec<&str> = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names_of, ["gate", "quiet-period", "plan"]);
    // The HTTP intake sees it as in flight.
    let (status, body) = rg
        .post("/v1/detections", &support::detection("1.34.5"))
        .await;
    assert_eq!((status, &body["run_id"]), (200, &run["id"]));

    let alert = envelope("ext-alert-1", "rollgate.alerts.v1", webhook("ee01"));
    for _ in 0..3 {
        rabbit::publish(&names.exchange, "alerts", &alert, "ext-alert-1").await;
    }
    let marker = envelope("ext-alert-2", "rollgate.alerts.v1", webhook("ee02"));
    rabbit::publish(&names.exchange, "alerts", &marker, "ext-alert-2").await;
    let seen = eventually(
        "the alerts on the board",
        Duration::from_secs(20),
        || async {
            let seen = board(&rg).await;
            seen.contains_key("ee02").then_some(seen)
        },
    )
    .await;
    assert_eq!(seen["ee01"], 1, "a re-published id is processed once");
    assert_eq!(
        rg.metric("rollgate_events_duplicate_total{type=\"alerts\"}")
            .await,
        2.0
    );
    drop(rg);
    rabbit::cleanup(&names).await;
}

#[tokio::test]
async fn poison_messages_go_to_the_dead_queue_with_a_reason_and_the_consumer_goes_on() {
    let names = Names::unique();
    let rg = start(&names).await;
    rabbit::publish(
        &names.exchange,
        "detections",
        b"\x00not json at all",
        "poison-1",
    )
    .await;
    let bad_version = envelope(
        "poison-2",
        "rollgate.detection.v1",
        json!({"target_version": "1.2.3;reboot", "kind": "patch"}),
    );
    rabbit::publish(&names.exchange, "detections", &bad_version, "poison-2").await;
    let unknown_type = envelope("poison-3", "com.example.other", json!({}));
    rabbit::publish(&names.exchange, "alerts", &unknown_type, "poison-3").await;
    // Well formed, but this rollgate has no cluster to upgrade.
    let no_cluster = envelope(
        "poison-4",
        "rollgate.detection.v1",
        json!({"target_version": "1.34.5", "kind": "patch"}),
    );
    rabbit::publish(&names.exchange, "detections", &no_cluster, "poison-4").await;
    let good = envelope("good-1", "rollgate.alerts.v1", webhook("ff01"));
    rabbit::publish(&names.exchange, "alerts", &good, "good-1").await;

    eventually(
        "the good message processed after the poison",
        Duration::from_secs(20),
        || async { board(&rg).await.contains_key("ff01").then_some(()) },
    )
    .await;
    eventually("four dead letters", Duration::from_secs(20), || async {
        let unknown = rg
            .metric("rollgate_events_dead_lettered_total{type=\"unknown\"}")
            .await;
        let detection = rg
            .metric("rollgate_events_dead_lettered_total{type=\"detection\"}")
            .await;
        (unknown >= 3.0 && detection >= 1.0).then_some(())
    })
    .await;
    let dead = rabbit::drain(&names.dead).await;
    assert_eq!(dead.len(), 4, "dead letters: {dead:?}");
    let reasons: Vec<String> = dead
        .iter()
        .map(|(_, r)| r.clone().unwrap_or_default())
        .collect();
    assert!(reasons[0].contains("not a CloudEvents"), "{reasons:?}");
    assert!(reasons[1].contains("target_version"), "{reasons:?}");
    assert!(reasons[2].contains("com.example.other"), "{reasons:?}");
    assert!(
        reasons[3].contains("Kubernetes upgrades need cluster.kubeconfig"),
        "{reasons:?}"
    );
    let (_, runs) = rg.get("/v1/runs").await;
    assert_eq!(runs, json!([]), "no run without a cluster");
    assert_eq!(
        dead[0].0, b"\x00not json at all",
        "the body is kept as published"
    );
    drop(rg);
    rabbit::cleanup(&names).await;
}

#[tokio::test]
async fn a_wake_2s_ahead_fires_no_earlier_than_2s_also_across_a_restart() {
    let names = Names::unique();
    let queue = AmqpQueue::connect(names.settings(), rollgate::workflows::DOORS)
        .await
        .expect("connect");
    let msg = wake_message("run-a", 2);
    queue.publish(msg.clone()).await.expect("publish");
    receive_on_time(&queue, &msg).await;

    // Published, then rollgate's connection goes away before the wake is due.
    let msg = wake_message("run-b", 2);
    queue.publish(msg.clone()).await.expect("publish");
    drop(queue);
    let queue = AmqpQueue::connect(names.settings(), rollgate::workflows::DOORS)
        .await
        .expect("reconnect");
    receive_on_time(&queue, &msg).await;
    drop(queue);
    rabbit::cleanup(&names).await;
}

#[tokio::test]
async fn a_missing_broker_is_an_error_within_seconds() {
    let mut settings = Names::unique().settings();
    settings.amqp_url = format!("amqp://127.0.0.1:{}/%2f", support::free_port());
    let started = std::time::Instant::now();
    let result = AmqpQueue::connect(settings, rollgate::workflows::DOORS).await;
    assert!(result.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn alert_notifications_waiting_together_are_committed_together_each_once() {
    let names = Names::unique();
    let mut rg = start(&names).await;
    // Queued while no worker consumes: the broker then hands them over a prefetch at a time.
    assert!(rg.terminate().success());
    let conn = rabbit::connect().await;
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(lapin::options::ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut expected = Vec::new();
    for i in 0..300 {
        // Every tenth notification is published twice, as a retrying publisher does.
        let id = format!("burst-{i}");
        let fingerprint = format!("bb{i:04}");
        let body = envelope(&id, "rollgate.alerts.v1", webhook(&fingerprint));
        for _ in 0..if i % 10 == 0 { 2 } else { 1 } {
            let confirm = ch
                .basic_publish(
                    names.exchange.as_str().into(),
                    "alerts".into(),
                    lapin::options::BasicPublishOptions::default(),
                    &body,
                    lapin::BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_message_id(id.as_str().into()),
                )
                .await
                .expect("publish")
                .await
                .expect("confirm");
            assert!(confirm.is_ack());
        }
        expected.push(fingerprint);
    }
    let _ = conn.close(200, "done".into()).await;

    rg.restart().await;
    let seen = eventually(
        "every notification on the board",
        Duration::from_secs(60),
        || async {
            let seen = board(&rg).await;
            expected
                .iter()
                .all(|f| seen.contains_key(f))
                .then_some(seen)
        },
    )
    .await;
    for fingerprint in &expected {
        assert_eq!(seen[fingerprint], 1, "{fingerprint} counted twice");
    }
    eventually(
        "the 30 repeats counted as duplicates",
        Duration::from_secs(20),
        || async {
            let duplicates = rg
                .metric("rollgate_events_duplicate_total{type=\"alerts\"}")
                .await;
            (duplicates == 30.0).then_some(())
        },
    )
    .await;
    assert_eq!(
        rg.metric("rollgate_events_processed_total{type=\"alerts\"}")
            .await,
        300.0
    );
    assert!(
        rg.logs().contains("alert notifications committed together"),
        "no batch was committed:\n{}",
        rg.logs()
    );
    drop(rg);
    rabbit::cleanup(&names).await;
}

/// The worker races `next` against its timers (the outbox retry, being deposed), so a
/// `next` may be dropped at any await, also between asking the broker to consume and
/// hearing back. A consumer registered for a dropped `next` must not be left holding the
/// queue: with a single active consumer the broker delivers to it, nobody reads it, and
/// the worker waits for good (CI: consumption never resumed after a broker restart, when
/// `basic.consume` answers slowly while quorum queues recover).
#[tokio::test]
async fn a_next_dropped_at_any_moment_leaves_no_consumer_holding_the_queue() {
    let names = Names::unique();
    let queue = AmqpQueue::connect(names.settings(), rollgate::workflows::DOORS)
        .await
        .expect("connect");
    // Dropped after 0 µs, 50 µs, …: somewhere in there falls the wait for consume-ok. The
    // queue is empty meanwhile, so no round takes the message (each release would count
    // against the delivery limit).
    for round in 0..160u64 {
        let patience = Duration::from_micros(round * 50);
        let dropped = tokio::time::timeout(patience, queue.next()).await;
        assert!(
            dropped.is_err(),
            "round {round}: a delivery from an empty queue"
        );
        queue.stop_consuming().await;
    }
    queue
        .publish(wake_message("no-such-run", 0))
        .await
        .expect("publish");
    let delivery = tokio::time::timeout(Duration::from_secs(15), queue.next())
        .await
        .expect("the message comes within 15 s: no orphaned consumer holds the queue")
        .expect("delivery");
    queue.ack(&delivery).await.expect("ack");
    rabbit::cleanup(&names).await;
}
