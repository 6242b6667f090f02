//! RabbitMQ stopped and started under rollgate. Alone in its test binary because it stops
//! the broker every other AMQP test uses.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};
use support::rabbit::{self, Names};
use support::{Rollgate, board, eventually, webhook};

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
    let wake_queue = rollgate::queue::amqp::AmqpQueue::connect(names.settings())
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
