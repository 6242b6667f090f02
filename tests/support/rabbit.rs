//! The real RabbitMQ on 127.0.0.1:5672, with exchange and queue names unique to a test.

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::time::Duration;

pub const URL: &str = "amqp://127.0.0.1:5672/%2f";

/// Names for one test.
#[derive(Clone)]
pub struct Names {
    pub exchange: String,
    pub queue: String,
    pub dead: String,
}

impl Names {
    pub fn unique() -> Self {
        let tag = uuid::Uuid::now_v7().simple().to_string();
        Self {
            exchange: format!("rg-test-{tag}"),
            queue: format!("rg-test-{tag}.events"),
            dead: format!("rg-test-{tag}.dead"),
        }
    }

    /// The rollgate environment that selects the amqp backend with these names.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("ROLLGATE__QUEUE__BACKEND", "amqp".into()),
            ("ROLLGATE__QUEUE__AMQP_URL", URL.into()),
            ("ROLLGATE__QUEUE__EXCHANGE", self.exchange.clone()),
            ("ROLLGATE__QUEUE__QUEUE", self.queue.clone()),
            ("ROLLGATE__QUEUE__DEAD_QUEUE", self.dead.clone()),
        ]
    }

    pub fn settings(&self) -> rollgate::config::QueueSettings {
        let env = self
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        rollgate::config::Settings::load_from(None, Some(env))
            .expect("settings")
            .queue
    }
}

pub async fn connect() -> Connection {
    tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(URL, ConnectionProperties::default()),
    )
    .await
    .expect("RabbitMQ answers within 10 s (is rabbitmq-server running?)")
    .expect("RabbitMQ connect")
}

/// Publishes `body` as an external system would, with confirms.
pub async fn publish(exchange: &str, routing_key: &str, body: &[u8], message_id: &str) {
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let confirm = ch
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(message_id.into()),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(confirm.is_ack(), "broker did not ack");
    let _ = conn.close(200, "done".into()).await;
}

/// Takes every message from `queue`: (body, reason header).
pub async fn drain(queue: &str) -> Vec<(Vec<u8>, Option<String>)> {
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let mut out = Vec::new();
    while let Some(msg) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic_get")
    {
        let reason = msg
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| {
                h.inner()
                    .get(&ShortString::from(rollgate::queue::amqp::REASON_HEADER))
                    .cloned()
            })
            .and_then(|v| match v {
                AMQPValue::LongString(s) => Some(s.to_string()),
                _ => None,
            });
        out.push((msg.delivery.data, reason));
    }
    let _ = conn.close(200, "done".into()).await;
    out
}

/// Removes what a test declared.
pub async fn cleanup(names: &Names) {
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    for q in [&names.queue, &names.dead] {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let ch = conn.create_channel().await.expect("channel");
    for x in [names.exchange.clone(), format!("{}.dlx", names.exchange)] {
        let _ = ch
            .exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ = FieldTable::default();
    let _ = conn.close(200, "done".into()).await;
}

/// `rabbitmqctl <args>`, asserting success.
pub fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
