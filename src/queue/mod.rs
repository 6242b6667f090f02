//! The event queue: one trait, two backends. A publish returns only once the message is
//! durable; a delivery stays owned by the consumer until it is acked, released or
//! dead-lettered.

pub mod amqp;
pub mod embedded;
pub mod settings;

use chrono::{DateTime, Utc};

use crate::domain::event::{CloudEvent, EventType};

/// A message to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// The CloudEvent id, also the AMQP message id.
    pub id: String,
    /// Routing key: `alerts`, `detections`, `control`, `wake`, …
    pub routing_key: String,
    /// The CloudEvent, JSON.
    pub body: Vec<u8>,
    /// Deliver no earlier than this.
    pub not_before: Option<DateTime<Utc>>,
}

impl Outgoing {
    /// `event`, of type `kind`, to deliver at once.
    pub fn event(event: &CloudEvent, kind: EventType) -> Self {
        Self {
            id: event.id.clone(),
            routing_key: kind.routing_key().into(),
            body: event.to_bytes(),
            not_before: None,
        }
    }
}

/// A received message, owned until acked, released or dead-lettered.
#[derive(Debug)]
pub struct Delivery {
    /// Routing key it was published with.
    pub routing_key: String,
    /// The body as published.
    pub body: Vec<u8>,
    /// Delivered before (after a crash, a release or a broker restart).
    pub redelivered: bool,
    /// The earliest time it was meant to be delivered.
    pub not_before: Option<DateTime<Utc>>,
    pub(crate) handle: Handle,
}

#[derive(Debug)]
pub(crate) enum Handle {
    Embedded { seq: i64 },
    Amqp { acker: lapin::Acker },
}

/// Why the queue could not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueueError {
    /// The queue cannot take or give messages now (broker down, disk error); retry later.
    #[error("queue unavailable: {0}")]
    Unavailable(String),
    /// The queue was shut down.
    #[error("queue closed")]
    Closed,
}

/// The queue behind the intake and the worker.
#[async_trait::async_trait]
pub trait Queue: Send + Sync {
    /// Stores `msg` durably; returns once it would survive a crash of rollgate (and of the
    /// broker, for AMQP).
    async fn publish(&self, msg: Outgoing) -> Result<(), QueueError>;
    /// Waits for the next due message. Cancel-safe: the worker races it against its
    /// timers, and a dropped `next` must lose no message and leave nothing holding one.
    async fn next(&self) -> Result<Delivery, QueueError>;
    /// Up to `max` messages already delivered and in hand, without waiting (none when the
    /// backend hands out one at a time): the worker commits alert notifications that
    /// arrived together in one transaction.
    async fn ready(&self, _max: usize) -> Vec<Delivery> {
        Vec::new()
    }
    /// Done with it: it will not be delivered again.
    async fn ack(&self, delivery: &Delivery) -> Result<(), QueueError>;
    /// Done with all of `deliveries`, taken in this order with none delivered before them
    /// still outstanding (the worker's batch).
    async fn ack_all(&self, deliveries: &[&Delivery]) -> Result<(), QueueError> {
        for delivery in deliveries {
            self.ack(delivery).await?;
        }
        Ok(())
    }
    /// Not processed: deliver it again later.
    async fn release(&self, delivery: &Delivery) -> Result<(), QueueError>;
    /// Cannot be processed: move it to the dead-letter queue with `reason`.
    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), QueueError>;
    /// Messages waiting (due or not).
    async fn depth(&self) -> Result<u64, QueueError>;
    /// Messages in the dead-letter queue.
    async fn dead_depth(&self) -> Result<u64, QueueError>;
    /// `embedded` or `amqp`.
    fn backend(&self) -> &'static str;
    /// Stops taking deliveries until the next [`Queue::next`]: what was delivered and not
    /// acked goes back to the queue, for another consumer (another replica's worker).
    async fn stop_consuming(&self) {}
}
