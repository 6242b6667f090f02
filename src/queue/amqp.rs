//! RabbitMQ backend (lapin).
//!
//! Topology, declared on every (re)connect: topic exchange `<exchange>`; quorum queue
//! `<queue>` (single active consumer, delivery limit, dead-lettering to `<exchange>.dlx`)
//! bound for every routing key; fanout `<exchange>.dlx` → `<dead_queue>`. Delayed messages
//! wait in `<exchange>.wait.<key>.<ms>` queues whose one TTL dead-letters them back into
//! `<exchange>`: every message in such a queue has the same TTL, so none waits behind a
//! later one, and both the wait and the message survive restarts of rollgate and the broker
//! (quorum queues with at-least-once dead-lettering: nothing is dropped if the events queue
//! is not ready when a message expires).
//!
//! Reconnecting is done here rather than by lapin's auto-recovery, so that every attempt is
//! bounded by `connect_timeout` and a publish during an outage fails fast (→ 503).
//!
//! Publishing goes through one task per connection (see [`publisher`]): requests hand it
//! their message and wait for their own confirm, which the broker acknowledges many at a
//! time; the task, not each request, is what lapin wakes.

use chrono::{DateTime, TimeZone, Utc};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::Confirmation;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, mpsc, oneshot};

use super::settings::QueueSettings;
use super::{Delivery, Handle, Outgoing, Queue, QueueError};
use crate::domain::backoff::Backoff;
use crate::domain::event::EventType;
use crate::domain::run_request::Doors;

/// Added to every delay before it becomes a queue's TTL: RabbitMQ may expire a message a
/// few milliseconds before its TTL, and a wake must never come early.
const TTL_SLACK: Duration = Duration::from_millis(50);
/// The pause between attempts to reach the broker again.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

/// The routing keys bound to the events queue: one per event type (rollgate's own and one
/// per door of `doors`), read off the types themselves, so a new type cannot be published
/// with a key nothing is bound to.
pub fn routing_keys(doors: Doors) -> impl Iterator<Item = &'static str> {
    EventType::all(doors).map(EventType::routing_key)
}
/// Header carrying the reason a message was dead-lettered.
pub const REASON_HEADER: &str = "x-rollgate-reason";
/// Header carrying the earliest delivery time (ms since the epoch) of a delayed message.
pub const NOT_BEFORE_HEADER: &str = "x-not-before";
/// After a failed connect, publishes fail at once for this long instead of each waiting
/// for its own connect attempt.
const FAIL_FAST_FOR: Duration = Duration::from_millis(500);
/// Bound on a publish waiting for its confirm.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// Delay queues outlive their last use by this much before the broker removes them.
const DELAY_QUEUE_SPARE: Duration = Duration::from_secs(600);
/// Messages waiting for the publisher task; a full inbox holds callers back.
const PUBLISHER_INBOX: usize = 4096;
/// Messages the publisher task takes from its inbox at once.
const PUBLISHER_BATCH: usize = 256;
/// Bound on an ack or nack. lapin can leave one unanswered for good when the connection
/// dies under it (seen in CI: RabbitMQ restarted just as the worker acked a batch), which
/// would hold the worker until the process restarts.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiting consumer checks that its channel is still open: its stream, like an
/// ack, may stay pending after the connection is gone.
const CONSUMER_WATCH: Duration = Duration::from_secs(1);

struct Link {
    connection: Connection,
    /// The confirm-mode channel: publishes (through `publisher`), declares, counts.
    publish: Channel,
    /// The inbox of this connection's publisher task, which ends with the link.
    publisher: mpsc::Sender<Publication>,
    generation: u64,
    delay_queues: std::sync::Mutex<HashSet<String>>,
}

/// The worker's consumer, through its life.
enum Consuming {
    /// None: the next `next` starts one.
    Idle,
    /// Being started in a task of its own. The worker races `next` against its timers, so
    /// a `next` may be dropped while the broker has yet to answer `basic.consume`; the
    /// consumer it asked for must neither be lost nor left registered with nobody reading
    /// it (with a single active consumer, the broker would deliver to that one alone). The
    /// task keeps it; the next `next`, or `stop_consuming`, takes it over.
    Starting {
        /// The link it starts on.
        generation: u64,
        task: tokio::task::JoinHandle<Result<OpenConsumer, QueueError>>,
    },
    /// Consuming.
    Open(Box<OpenConsumer>),
}

/// A consumer on its own channel of the link of `generation`.
struct OpenConsumer {
    generation: u64,
    channel: Channel,
    stream: Consumer,
}

/// One message for the publisher task, and where its outcome goes.
struct Publication {
    exchange: String,
    routing_key: String,
    body: Vec<u8>,
    properties: BasicProperties,
    confirmed: oneshot::Sender<Result<(), QueueError>>,
}

/// The RabbitMQ queue.
pub struct AmqpQueue {
    settings: QueueSettings,
    /// The workflows' doors, whose routing keys are bound beside rollgate's own.
    doors: Doors,
    credentials: Option<(String, String)>,
    /// Serialises connecting; `current` is the lock-free read of its result.
    link: Mutex<Option<Arc<Link>>>,
    current: std::sync::RwLock<Option<Arc<Link>>>,
    last_failure: std::sync::Mutex<Option<Instant>>,
    consumer: Mutex<Consuming>,
    generation: std::sync::atomic::AtomicU64,
    /// The runtime `connect` ran on, where publisher tasks live (a reconnect may be
    /// started from an HTTP worker's thread).
    runtime: tokio::runtime::Handle,
}

/// The broker credentials in a credentials file: `user:password`, or the `default_user =`
/// and `default_pass =` lines of the `default_user.conf` key the RabbitMQ cluster operator
/// puts in its `<cluster>-default-user` Secret.
pub fn parse_credentials(raw: &str) -> Option<(String, String)> {
    let conf = |key: &str| {
        raw.lines().find_map(|line| {
            let (k, v) = line.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    };
    match (conf("default_user"), conf("default_pass")) {
        (Some(user), Some(pass)) if !user.is_empty() => Some((user, pass)),
        _ => {
            let (user, pass) = raw.trim().split_once(':')?;
            (!user.is_empty()).then(|| (user.to_owned(), pass.to_owned()))
        }
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> QueueError {
    QueueError::Unavailable(format!("RabbitMQ {what}: {e}"))
}

impl AmqpQueue {
    /// Connects and declares the topology; fails within `connect_timeout` when the broker
    /// cannot be reached.
    pub async fn connect(settings: QueueSettings, doors: Doors) -> Result<Self, QueueError> {
        let credentials = match &settings.amqp_credentials_file {
            None => None,
            Some(path) => {
                let raw = std::fs::read_to_string(path).map_err(|e| {
                    QueueError::Unavailable(format!(
                        "cannot read queue.amqp_credentials_file {}: {e}",
                        path.display()
                    ))
                })?;
                let (user, pass) = parse_credentials(&raw).ok_or_else(|| {
                    QueueError::Unavailable(format!(
                        "queue.amqp_credentials_file {} must hold user:password, or default_user and default_pass lines (the RabbitMQ cluster operator's default_user.conf)",
                        path.display()
                    ))
                })?;
                Some((user, pass))
            }
        };
        let queue = Self {
            settings,
            doors,
            credentials,
            link: Mutex::new(None),
            current: std::sync::RwLock::new(None),
            last_failure: std::sync::Mutex::new(None),
            consumer: Mutex::new(Consuming::Idle),
            generation: std::sync::atomic::AtomicU64::new(0),
            runtime: tokio::runtime::Handle::current(),
        };
        queue.link(false).await?;
        Ok(queue)
    }

    fn dlx(&self) -> String {
        format!("{}.dlx", self.settings.exchange)
    }

    async fn open(&self) -> Result<Link, QueueError> {
        let mut uri: lapin::uri::AMQPUri = self
            .settings
            .amqp_url
            .parse()
            .map_err(|e| unavailable("URL", e))?;
        if let Some((user, pass)) = &self.credentials {
            uri.authority.userinfo.username = user.clone();
            uri.authority.userinfo.password = pass.clone();
        }
        let props = ConnectionProperties::default().with_connection_name("rollgate".into());
        let connection = tokio::time::timeout(
            self.settings.connect_timeout,
            Connection::connect_uri(uri, props),
        )
        .await
        .map_err(|_| {
            unavailable(
                "connect",
                format!("no answer within {:?}", self.settings.connect_timeout),
            )
        })?
        .map_err(|e| unavailable("connect", e))?;
        let publish = connection
            .create_channel()
            .await
            .map_err(|e| unavailable("channel", e))?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| unavailable("confirm_select", e))?;
        self.declare(&publish).await?;
        let (publisher, inbox) = mpsc::channel(PUBLISHER_INBOX);
        self.runtime.spawn(publisher_task(publish.clone(), inbox));
        Ok(Link {
            connection,
            publish,
            publisher,
            generation: self
                .generation
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1,
            delay_queues: std::sync::Mutex::new(HashSet::new()),
        })
    }

    async fn declare(&self, ch: &Channel) -> Result<(), QueueError> {
        let s = &self.settings;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let err = |e| unavailable("declare", e);
        ch.exchange_declare(
            s.exchange.as_str().into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .map_err(err)?;
        ch.exchange_declare(
            self.dlx().as_str().into(),
            ExchangeKind::Fanout,
            durable,
            FieldTable::default(),
        )
        .await
        .map_err(err)?;
        let durable_queue = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let mut dead_args = FieldTable::default();
        dead_args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        ch.queue_declare(s.dead_queue.as_str().into(), durable_queue, dead_args)
            .await
            .map_err(err)?;
        ch.queue_bind(
            s.dead_queue.as_str().into(),
            self.dlx().as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(err)?;
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.dlx().into()),
        );
        args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(i64::from(s.delivery_limit)),
        );
        ch.queue_declare(s.queue.as_str().into(), durable_queue, args)
            .await
            .map_err(err)?;
        for key in routing_keys(self.doors) {
            ch.queue_bind(
                s.queue.as_str().into(),
                s.exchange.as_str().into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(err)?;
        }
        Ok(())
    }

    /// The live link, connecting if needed. `wait` = the consumer, which may take its time;
    /// publishers fail fast for a moment after a failed attempt.
    async fn link(&self, wait: bool) -> Result<Arc<Link>, QueueError> {
        if let Ok(current) = self.current.read()
            && let Some(link) = current.as_ref()
            && link.connection.status().connected()
        {
            return Ok(link.clone());
        }
        let mut guard = self.link.lock().await;
        if let Some(link) = guard.as_ref() {
            if link.connection.status().connected() {
                return Ok(link.clone());
            }
            *guard = None;
            if let Ok(mut current) = self.current.write() {
                *current = None;
            }
        }
        if !wait
            && let Ok(last) = self.last_failure.lock()
            && last.is_some_and(|t| t.elapsed() < FAIL_FAST_FOR)
        {
            return Err(QueueError::Unavailable(
                "RabbitMQ is unreachable (last connect failed moments ago)".into(),
            ));
        }
        match self.open().await {
            Ok(link) => {
                let link = Arc::new(link);
                *guard = Some(link.clone());
                if let Ok(mut current) = self.current.write() {
                    *current = Some(link.clone());
                }
                tracing::info!(generation = link.generation, "connected to RabbitMQ");
                Ok(link)
            }
            Err(e) => {
                if let Ok(mut last) = self.last_failure.lock() {
                    *last = Some(Instant::now());
                }
                Err(e)
            }
        }
    }

    async fn forget(&self, generation: u64) {
        let mut guard = self.link.lock().await;
        if guard.as_ref().is_some_and(|l| l.generation == generation) {
            *guard = None;
            if let Ok(mut current) = self.current.write() {
                *current = None;
            }
        }
    }

    /// Publishes through the link's publisher task and waits for the broker's confirm;
    /// any failure drops the link, so that the next publish reconnects.
    async fn confirm(
        &self,
        link: &Link,
        exchange: &str,
        routing_key: &str,
        body: Vec<u8>,
        properties: BasicProperties,
    ) -> Result<(), QueueError> {
        let (confirmed, outcome) = oneshot::channel();
        let publication = Publication {
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
            body,
            properties,
            confirmed,
        };
        let publish = async {
            link.publisher
                .send(publication)
                .await
                .map_err(|_| unavailable("publish", "the publisher task has stopped"))?;
            outcome
                .await
                .map_err(|_| unavailable("confirm", "the publisher task has stopped"))?
        };
        let result = tokio::time::timeout(CONFIRM_TIMEOUT, publish)
            .await
            .unwrap_or_else(|_| {
                Err(QueueError::Unavailable(format!(
                    "no publisher confirm within {CONFIRM_TIMEOUT:?}"
                )))
            });
        if result.is_err() {
            self.forget(link.generation).await;
        }
        result
    }

    /// The delay queue for `key` and `delay`, declared once per connection.
    async fn delay_queue(
        &self,
        link: &Link,
        key: &str,
        delay: Duration,
    ) -> Result<String, QueueError> {
        // Coarser steps for long delays bound the number of queues; rounding up, with the
        // broker's own slack on top, keeps "no earlier than" (RabbitMQ has been seen to
        // expire a message ~10 ms before its TTL).
        let step = if delay < Duration::from_secs(10) {
            100
        } else {
            1000
        };
        let ms = ((delay + TTL_SLACK).as_millis() as u64).div_ceil(step) * step;
        let name = format!("{}.wait.{key}.{ms}", self.settings.exchange);
        if link
            .delay_queues
            .lock()
            .map(|set| set.contains(&name))
            .unwrap_or(false)
        {
            return Ok(name);
        }
        let mut args = FieldTable::default();
        // Quorum with at-least-once dead-lettering: a message that expires while the
        // events queue is unavailable (a broker restart) stays here until it can move.
        // Classic queues dead-letter at most once and would drop it.
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        args.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-least-once".into()),
        );
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms as i64));
        args.insert(
            "x-expires".into(),
            AMQPValue::LongLongInt((ms + DELAY_QUEUE_SPARE.as_millis() as u64) as i64),
        );
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.settings.exchange.as_str().into()),
        );
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(key.into()),
        );
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        link.publish
            .queue_declare(name.as_str().into(), durable, args)
            .await
            .map_err(|e| unavailable("declare delay queue", e))?;
        if let Ok(mut set) = link.delay_queues.lock() {
            set.insert(name.clone());
        }
        Ok(name)
    }

    /// Waits for an ack or nack, at most [`SETTLE_TIMEOUT`]. When it fails because the
    /// consumer's channel is broken (closed, or no answer), that consumer is dropped (its
    /// unsettled deliveries go back to the queue with it) and the next `next` consumes on a
    /// new one.
    async fn settled(
        &self,
        what: &str,
        settle: impl std::future::Future<Output = lapin::Result<bool>>,
    ) -> Result<(), QueueError> {
        let (failure, timed_out) = match tokio::time::timeout(SETTLE_TIMEOUT, settle).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => (unavailable(what, e), false),
            Err(_) => (
                unavailable(what, format!("no answer within {SETTLE_TIMEOUT:?}")),
                true,
            ),
        };
        let mut consumer = self.consumer.lock().await;
        // A delivery of an earlier consumer fails on its closed channel without a word
        // about the current one, which is kept while it is open.
        if let Consuming::Open(open) = &*consumer
            && (timed_out || !open.channel.status().connected())
        {
            let generation = open.generation;
            *consumer = Consuming::Idle;
            drop(consumer);
            self.forget(generation).await;
        }
        Err(failure)
    }

    async fn count(&self, queue: &str) -> Result<u64, QueueError> {
        let link = self.link(false).await?;
        let q = link
            .publish
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| unavailable("queue status", e))?;
        Ok(u64::from(q.message_count()))
    }
}

fn properties(id: &str, headers: FieldTable) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(id.into())
        .with_content_type("application/cloudevents+json".into())
        .with_delivery_mode(2)
        .with_timestamp(Utc::now().timestamp().max(0) as u64)
        .with_headers(headers)
}

fn header<'a>(props: &'a BasicProperties, name: &str) -> Option<&'a AMQPValue> {
    props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(&ShortString::from(name)))
}

fn not_before(props: &BasicProperties) -> Option<DateTime<Utc>> {
    let ms = match header(props, NOT_BEFORE_HEADER)? {
        AMQPValue::LongLongInt(v) => *v,
        AMQPValue::LongInt(v) => i64::from(*v),
        _ => return None,
    };
    Utc.timestamp_millis_opt(ms).single()
}

#[async_trait::async_trait]
impl Queue for AmqpQueue {
    async fn publish(&self, msg: Outgoing) -> Result<(), QueueError> {
        let link = self.link(false).await?;
        let mut headers = FieldTable::default();
        let delay = msg
            .not_before
            .and_then(|t| (t - Utc::now()).to_std().ok())
            .filter(|d| !d.is_zero());
        if let Some(t) = msg.not_before {
            headers.insert(
                NOT_BEFORE_HEADER.into(),
                AMQPValue::LongLongInt(t.timestamp_millis()),
            );
        }
        let props = properties(&msg.id, headers);
        match delay {
            None => {
                self.confirm(
                    &link,
                    &self.settings.exchange,
                    &msg.routing_key,
                    msg.body,
                    props,
                )
                .await
            }
            Some(delay) => {
                let queue = self.delay_queue(&link, &msg.routing_key, delay).await?;
                self.confirm(&link, "", &queue, msg.body, props).await
            }
        }
    }

    async fn next(&self) -> Result<Delivery, QueueError> {
        let mut failures = 0u32;
        loop {
            let mut consumer = self.consumer.lock().await;
            if matches!(*consumer, Consuming::Idle) {
                match self.link(true).await {
                    Ok(link) => {
                        let generation = link.generation;
                        let start = start_consumer(link, self.settings.clone());
                        let task = self.runtime.spawn(start);
                        *consumer = Consuming::Starting { generation, task };
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error_chain(&e), failures, "RabbitMQ unreachable; retrying")
                    }
                }
            }
            if let Consuming::Starting { generation, task } = &mut *consumer {
                let generation = *generation;
                // Awaiting the handle, not the start, is what a dropped `next` may cut short.
                let started = task.await.unwrap_or_else(|e| {
                    Err(unavailable(
                        "consume",
                        format!("the start task failed: {e}"),
                    ))
                });
                match started {
                    Ok(open) => {
                        failures = 0;
                        tracing::info!(generation = open.generation, queue = %self.settings.queue, "consuming from RabbitMQ");
                        *consumer = Consuming::Open(Box::new(open));
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error_chain(&e), "cannot start the RabbitMQ consumer; retrying");
                        *consumer = Consuming::Idle;
                        self.forget(generation).await;
                    }
                }
            }
            let Consuming::Open(open) = &mut *consumer else {
                drop(consumer);
                failures = failures.saturating_add(1);
                tokio::time::sleep(crate::jitter::pause(&RECONNECT, failures)).await;
                continue;
            };
            tokio::select! {
                next = open.stream.next() => match next {
                    Some(Ok(d)) => return Ok(delivery(d)),
                    Some(Err(e)) => {
                        tracing::warn!(error = %crate::error_chain(&e), "RabbitMQ consumer failed; reconnecting")
                    }
                    None => tracing::warn!("RabbitMQ consumer ended; reconnecting"),
                },
                () = closed(&open.channel) => {
                    tracing::warn!("the RabbitMQ consumer's channel is no longer open; reconnecting")
                }
            }
            let generation = open.generation;
            *consumer = Consuming::Idle;
            drop(consumer);
            self.forget(generation).await;
        }
    }

    async fn ready(&self, max: usize) -> Vec<Delivery> {
        use futures_util::FutureExt;
        let mut consumer = self.consumer.lock().await;
        let Consuming::Open(open) = &mut *consumer else {
            return Vec::new();
        };
        let stream = &mut open.stream;
        let mut ready = Vec::new();
        // What the broker pushed already (at most the prefetch); a failure is left for the
        // next `next`, which reconnects.
        while ready.len() < max {
            match stream.next().now_or_never() {
                Some(Some(Ok(d))) => ready.push(delivery(d)),
                _ => break,
            }
        }
        ready
    }

    async fn ack(&self, delivery: &Delivery) -> Result<(), QueueError> {
        let acker = acker_of(delivery)?;
        self.settled("ack", acker.ack(BasicAckOptions::default()))
            .await
    }

    async fn ack_all(&self, deliveries: &[&Delivery]) -> Result<(), QueueError> {
        // One frame for the lot: the last delivery's tag with `multiple` settles every
        // earlier one on its channel, and the worker has settled all before them.
        let Some(last) = deliveries.last() else {
            return Ok(());
        };
        let acker = acker_of(last)?;
        self.settled("ack", acker.ack(BasicAckOptions { multiple: true }))
            .await
    }

    async fn release(&self, delivery: &Delivery) -> Result<(), QueueError> {
        let acker = acker_of(delivery)?;
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        self.settled("nack", acker.nack(requeue)).await
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), QueueError> {
        let link = self.link(false).await?;
        let mut headers = FieldTable::default();
        headers.insert(REASON_HEADER.into(), AMQPValue::LongString(reason.into()));
        headers.insert(
            "x-rollgate-routing-key".into(),
            AMQPValue::LongString(delivery.routing_key.as_str().into()),
        );
        let id = uuid::Uuid::now_v7().to_string();
        self.confirm(
            &link,
            &self.dlx(),
            &delivery.routing_key,
            delivery.body.clone(),
            properties(&id, headers),
        )
        .await?;
        self.ack(delivery).await
    }

    async fn depth(&self) -> Result<u64, QueueError> {
        self.count(&self.settings.queue).await
    }

    async fn dead_depth(&self) -> Result<u64, QueueError> {
        self.count(&self.settings.dead_queue).await
    }

    fn backend(&self) -> &'static str {
        "amqp"
    }

    async fn stop_consuming(&self) {
        let mut consumer = self.consumer.lock().await;
        let open = match std::mem::replace(&mut *consumer, Consuming::Idle) {
            Consuming::Idle => return,
            // A start in flight is bounded; its consumer is closed like any other.
            Consuming::Starting { task, .. } => match task.await {
                Ok(Ok(open)) => Box::new(open),
                _ => return,
            },
            Consuming::Open(open) => open,
        };
        drop(consumer);
        // Closing the channel hands its unacked deliveries back to the queue.
        if let Err(e) = open
            .channel
            .close(200, "rollgate worker stepping down".into())
            .await
        {
            tracing::warn!(error = %crate::error_chain(&e), "cannot close the consumer's channel; the broker requeues its deliveries when the connection goes");
        }
    }
}

/// Publishes every message sent to `inbox` on `channel` (in confirm mode), each one's
/// publish and confirm running side by side in this one task, and hands each caller its
/// outcome. Ends when the link, which holds the inbox's sender, is gone.
async fn publisher_task(channel: Channel, mut inbox: mpsc::Receiver<Publication>) {
    let mut in_flight = FuturesUnordered::new();
    let mut batch = Vec::with_capacity(PUBLISHER_BATCH);
    loop {
        tokio::select! {
            taken = inbox.recv_many(&mut batch, PUBLISHER_BATCH) => {
                if taken == 0 {
                    break;
                }
                for publication in batch.drain(..) {
                    in_flight.push(publish_one(&channel, publication));
                }
            }
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
    }
    while in_flight.next().await.is_some() {}
}

/// One message published and confirmed; the outcome goes to whoever is waiting for it.
async fn publish_one(channel: &Channel, publication: Publication) {
    let Publication {
        exchange,
        routing_key,
        body,
        properties,
        confirmed,
    } = publication;
    let outcome = async {
        let confirm = channel
            .basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &body,
                properties,
            )
            .await
            .map_err(|e| unavailable("publish", e))?;
        match confirm.await.map_err(|e| unavailable("confirm", e))? {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(QueueError::Unavailable(format!(
                "RabbitMQ could not route the message ({exchange}/{routing_key}): is the queue bound?"
            ))),
            Confirmation::Nack(_) => Err(QueueError::Unavailable(
                "RabbitMQ refused the message (nack)".into(),
            )),
            Confirmation::NotRequested => {
                Err(QueueError::Unavailable("publisher confirms are off".into()))
            }
        }
    }
    .await;
    // The caller may have given up (its timeout); the outcome then has no one to tell.
    let _ = confirmed.send(outcome);
}

/// The acker of a delivery from this backend.
fn acker_of(delivery: &Delivery) -> Result<&lapin::Acker, QueueError> {
    match &delivery.handle {
        Handle::Amqp { acker } => Ok(acker),
        Handle::Embedded { .. } => Err(QueueError::Unavailable(
            "a delivery from another backend".into(),
        )),
    }
}

/// Resolves once `channel` is no longer open.
async fn closed(channel: &Channel) {
    let mut watch = tokio::time::interval(CONSUMER_WATCH);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        watch.tick().await;
        if !channel.status().connected() {
            return;
        }
    }
}

/// A broker delivery as the worker takes it.
fn delivery(d: lapin::message::Delivery) -> Delivery {
    Delivery {
        routing_key: d.routing_key.to_string(),
        not_before: not_before(&d.properties),
        redelivered: d.redelivered,
        body: d.data,
        handle: Handle::Amqp { acker: d.acker },
    }
}

/// Opens a channel on `link` and consumes the events queue on it, each step bounded by
/// `connect_timeout`. On failure the channel is closed: a `basic.consume` answered after
/// its deadline would otherwise leave a consumer that nobody reads.
async fn start_consumer(link: Arc<Link>, s: QueueSettings) -> Result<OpenConsumer, QueueError> {
    let bound = s.connect_timeout;
    let late = |what: &str| unavailable(what, format!("no answer within {bound:?}"));
    let channel = tokio::time::timeout(bound, link.connection.create_channel())
        .await
        .map_err(|_| late("channel"))?
        .map_err(|e| unavailable("channel", e))?;
    let consume = async {
        channel
            .basic_qos(s.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| unavailable("qos", e))?;
        channel
            .basic_consume(
                s.queue.as_str().into(),
                "rollgate-worker".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| unavailable("consume", e))
    };
    let failure = match tokio::time::timeout(bound, consume).await {
        Ok(Ok(stream)) => {
            return Ok(OpenConsumer {
                generation: link.generation,
                channel,
                stream,
            });
        }
        Ok(Err(e)) => e,
        Err(_) => late("consume"),
    };
    let close = channel.close(200, "rollgate consumer not started".into());
    let _ = tokio::time::timeout(bound, close).await;
    Err(failure)
}

#[cfg(test)]
mod tests {
    use super::parse_credentials;

    #[test]
    fn credentials_come_as_user_password_or_as_the_operators_default_user_conf() {
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("rollgate:s3cret\n", Some(("rollgate", "s3cret"))),
            ("rollgate:pa:ss", Some(("rollgate", "pa:ss"))),
            (
                "default_user = default_user_x1\ndefault_pass = Zq9-=\n",
                Some(("default_user_x1", "Zq9-=")),
            ),
            ("default_pass = only\n", None),
            (":nouser", None),
            ("no separator", None),
        ];
        for (raw, want) in cases {
            let got = parse_credentials(raw);
            let want = want.map(|(u, p)| (u.to_owned(), p.to_owned()));
            assert_eq!(got, want, "{raw:?}");
        }
    }
}
