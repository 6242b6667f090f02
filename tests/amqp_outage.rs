//! RabbitMQ stopped and started under rollgate. Alone in its test binary because it stops
//! the broker every other AMQP test uses; its tests take turns.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::postgres::Postgres;
use support::rabbit::{self, Names};
use support::replicas::{all_on_the_board_once, intake_load, post_alert as try_post, the_active};
use support::{Rollgate, board, eventually, webhook};

/// Held by a test while it may stop the broker.
static BROKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn post_alert(rg: &Rollgate, fp: &str) -> u16 {
    match rg
        .http
        .post(format!("{}/v1/alerts", rg.base()))
        .bearer_auth(&rg.token)
        .json(&webhook(fp))
        .send()
        .await
    {
        Ok(r) => {
            let status = r.status().as_u16();
            if status != 202 && status != 503 {
                eprintln!("{fp}: {status} {}", r.text().await.unwrap_or_default());
            }
            status
        }
        Err(e) => {
            eprintln!("{fp}: request failed: {e:?}");
            0
        }
    }
}

#[tokio::test]
async fn a_broker_outage_gives_503_never_2xx_and_consumption_resumes_without_a_restart() {
    let _turn = BROKER.lock().await;
    let names = Names::unique();
    let env = names.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let rg = Rollgate::start(&env).await;
    let mut accepted = HashSet::new();
    for i in 0..5 {
        let fp = format!("a{i:03}");
        assert_eq!(post_alert(&rg, &fp).await, 202);
        accepted.insert(fp);
    }

    // A wake due while the broker is down must survive the broker's restart.
    let wake_queue =
        rollgate::queue::amqp::AmqpQueue::connect(names.settings(), rollgate::workflows::DOORS)
            .await
            .expect("connect");
    let wake = rollgate::domain::event::CloudEvent::new(
        &rollgate::domain::event::EventData::Wake(rollgate::domain::event::WakeRequest {
            run_id: "no-such-run".into(),
            epoch: 1,
        }),
        "test",
        chrono::Utc::now(),
    );
    let due = chrono::Utc::now() + chrono::Duration::seconds(2);
    rollgate::queue::Queue::publish(
        &wake_queue,
        rollgate::queue::Outgoing {
            id: wake.id.clone(),
            routing_key: "wake".into(),
            body: wake.to_bytes(),
            not_before: Some(due),
        },
    )
    .await
    .expect("publish wake");
    drop(wake_queue);

    rabbit::rabbitmqctl(&["stop_app"]);
    let refused = rg
        .http
        .post(format!("{}/v1/alerts", rg.base()))
        .bearer_auth(&rg.token)
        .json(&webhook("r000"))
        .send()
        .await
        .expect("answer");
    assert_eq!(refused.status().as_u16(), 503);
    let retry_after = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok());
    assert!(
        retry_after.is_some_and(|s| s > 0),
        "503 without Retry-After"
    );
    let outage = async {
        let mut during = Vec::new();
        for i in 0..10 {
            let fp = format!("b{i:03}");
            during.push((fp.clone(), post_alert(&rg, &fp).await));
        }
        during
    };
    let during = outage.await;
    let (status, ready) = rg.get("/readyz").await;
    rabbit::rabbitmqctl(&["start_app"]);
    rabbit::rabbitmqctl(&["await_startup"]);

    for (fp, status) in &during {
        assert_eq!(*status, 503, "{fp} posted during the outage got {status}");
    }
    assert_eq!(status, 503, "readyz during the outage: {ready}");

    // After recovery: accepted again, and the same process consumes again.
    let recovered = Instant::now();
    let mut after = 0;
    while after < 5 {
        let fp = format!("c{after:03}");
        match post_alert(&rg, &fp).await {
            202 => {
                accepted.insert(fp);
                after += 1;
            }
            503 => assert!(
                recovered.elapsed() < Duration::from_secs(60),
                "no 202 within 60 s of recovery"
            ),
            other => panic!("unexpected status {other}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = eventually(
        "every 2xx'd alert processed after recovery",
        Duration::from_secs(60),
        || async {
            let seen = board(&rg).await;
            accepted
                .iter()
                .all(|fp| seen.contains_key(fp))
                .then_some(seen)
        },
    )
    .await;
    for fp in &accepted {
        assert_eq!(seen[fp], 1, "{fp} processed {} times", seen[fp]);
    }
    for (fp, _) in &during {
        assert!(
            !seen.contains_key(fp),
            "{fp} was refused with 503 but processed"
        );
    }
    let (status, _) = rg.get("/readyz").await;
    assert_eq!(status, 200);
    eventually(
        "the wake queued before the broker restart is processed",
        Duration::from_secs(30),
        || async {
            (rg.metric("rollgate_events_processed_total{type=\"wake\"}")
                .await
                >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert!(chrono::Utc::now() >= due);
    drop(rg);
    rabbit::cleanup(&names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_restarted_under_intake_load_on_two_replicas_loses_no_accepted_alert() {
    let _turn = BROKER.lock().await;
    let pg = Postgres::start();
    let url = pg.database().await;
    let names = Names::unique();
    let mut env = names.env();
    env.extend(Postgres::env(&url));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let replicas = vec![Rollgate::start(&env).await, Rollgate::start(&env).await];
    the_active(&replicas).await;

    let stop = Arc::new(AtomicBool::new(false));
    let loads = [
        intake_load(&replicas[0], "a", stop.clone()),
        intake_load(&replicas[1], "b", stop.clone()),
    ];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rabbit::rabbitmqctl(&["stop_app"]);
    // While the broker is down every replica refuses with 503 (the loads check Retry-After).
    for rg in &replicas {
        eventually(
            "a 503 while RabbitMQ is down",
            Duration::from_secs(10),
            || async { (try_post(rg, "down").await == Some(503)).then_some(()) },
        )
        .await;
        let (ready, _) = rg.get("/readyz").await;
        assert_eq!(ready, 503, "ready without its broker");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    rabbit::rabbitmqctl(&["start_app"]);
    rabbit::rabbitmqctl(&["await_startup"]);
    for (i, rg) in replicas.iter().enumerate() {
        let fp = format!("back{i}");
        eventually(
            "a 202 after RabbitMQ is back",
            Duration::from_secs(60),
            || async { (try_post(rg, &fp).await == Some(202)).then_some(()) },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut accepted = vec!["back0".to_owned(), "back1".to_owned()];
    let mut refused = 0;
    for l in loads {
        let mut posted = l.await.expect("load");
        eprintln!(
            "accepted {}, refused {}",
            posted.accepted.len(),
            posted.refused.len()
        );
        refused += posted.refused.len();
        accepted.append(&mut posted.accepted);
    }
    assert!(refused > 0, "the loads never saw the outage");
    assert!(accepted.len() > 50, "too little load: {}", accepted.len());
    all_on_the_board_once(&replicas[1], &accepted, Duration::from_secs(90)).await;
    eprintln!(
        "{} alerts accepted across the broker restart, {refused} refused, none lost",
        accepted.len()
    );
    drop(replicas);
    rabbit::cleanup(&names).await;
}

/// The broker closes rollgate's connection while the worker acks (as a restart does): no
/// ack holds the worker past its bound, and every message comes again until acked on a
/// live consumer; 3 closes, each in the middle of 200 acks.
#[tokio::test]
async fn a_connection_closed_under_acks_holds_nothing_and_every_message_comes_again() {
    use rollgate::queue::{Outgoing, Queue, amqp::AmqpQueue};
    let _turn = BROKER.lock().await;
    let names = Names::unique();
    let queue = AmqpQueue::connect(names.settings(), rollgate::workflows::DOORS)
        .await
        .expect("connect");
    for round in 0..3 {
        let ids: HashSet<String> = (0..200).map(|i| format!("r{round}m{i}")).collect();
        for id in &ids {
            let message = Outgoing {
                id: id.clone(),
                routing_key: "alerts".into(),
                body: id.clone().into_bytes(),
                not_before: None,
            };
            // The first publish after a close may find the old link still unmarked: 503.
            eventually("a publish", Duration::from_secs(10), || async {
                queue.publish(message.clone()).await.ok()
            })
            .await;
        }
        let closer = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            rabbit::rabbitmqctl(&["close_all_connections", "test: closed under acks"]);
        });
        let mut settled = HashSet::new();
        let started = Instant::now();
        while settled.len() < ids.len() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "round {round}: {} of {} settled in 60 s",
                settled.len(),
                ids.len()
            );
            let taken = tokio::time::timeout(Duration::from_secs(30), queue.next())
                .await
                .expect("a delivery within 30 s")
                .expect("delivery");
            let asked = Instant::now();
            let acked = queue.ack(&taken).await;
            assert!(
                asked.elapsed() < Duration::from_secs(7),
                "an ack held the worker {:?}",
                asked.elapsed()
            );
            // An ack the client sent just before a close may never reach the broker: that
            // message comes again later, possibly in a later round (at least once; the
            // worker's dedup absorbs it). Only this round's messages count here.
            let body = String::from_utf8_lossy(&taken.body).into_owned();
            if acked.is_ok() && ids.contains(&body) {
                settled.insert(body);
            }
            // Slow enough that the close lands among the acks.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        closer.join().expect("closer");
        assert_eq!(settled, ids, "round {round}");
    }
    drop(queue);
    rabbit::cleanup(&names).await;
}
