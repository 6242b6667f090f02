//! A continuous etcd write load for the benches, and what it saw: every write retried only
//! while etcd says it was not applied; failed writes, connection drops at a restarting
//! member, and the longest stall (from a write's first attempt to its success).

use rollgate::adapters::etcd::Etcd;
use rollgate::domain::facts::agreed_leader;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Load {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
    /// Failed writes that were connection drops at a restarting member.
    pub dropped: AtomicU64,
    pub retried: AtomicU64,
    pub longest_stall_ms: AtomicU64,
    /// Writes that took a second or more from their first attempt (an election, or a
    /// proposal forwarded to a leader that dropped it while handing leadership over, which
    /// etcd answers only at its request timeout).
    pub long_stalls: AtomicU64,
    pub stop: AtomicBool,
    /// Errors by kind: what made writes fail or stall.
    pub errors: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Load {
    pub fn record(&self, e: &etcd_client::Error, retried: bool) {
        let mut kind = match e {
            etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
            other => other.to_string(),
        };
        let mut source = match e {
            etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
            other => std::error::Error::source(other),
        };
        while let Some(cause) = source {
            kind.push_str(&format!(" <- {cause}"));
            source = cause.source();
        }
        let kind = format!("{} {}", if retried { "retried" } else { "failed" }, kind);
        if let Ok(mut errors) = self.errors.lock() {
            *errors.entry(kind).or_default() += 1;
        }
    }
}

fn retryable(e: &etcd_client::Error) -> bool {
    if never_sent(e) {
        return true;
    }
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            let msg = status.message();
            // tonic's Code is not re-exported; its Debug name is stable.
            format!("{:?}", status.code()) == "Unavailable"
                || msg.contains("leader changed")
                || msg.contains("no leader")
                || msg.contains("raft proposal dropped")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether the transport handed the request back without sending it: hyper's canceled
/// error is only made for a request still in its dispatch queue when the connection ended.
fn never_sent(e: &etcd_client::Error) -> bool {
    let mut source = match e {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        other => std::error::Error::source(other),
    };
    while let Some(cause) = source {
        if cause
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Whether `e` is the connection to a member going away under a request in flight.
fn connection_drop(e: &etcd_client::Error) -> bool {
    let mut source = match e {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        other => std::error::Error::source(other),
    };
    while let Some(cause) = source {
        let text = cause.to_string();
        if ["connection reset", "broken pipe", "connection closed"]
            .iter()
            .any(|t| text.contains(t))
        {
            return true;
        }
        source = cause.source();
    }
    false
}

/// Puts one key after another until stopped; each write retried while etcd says it was
/// not applied.
pub async fn write_load(endpoints: Vec<String>, load: Arc<Load>) {
    let options = etcd_client::ConnectOptions::new()
        .with_timeout(Duration::from_secs(10))
        .with_connect_timeout(Duration::from_secs(2));
    let mut client = etcd_client::Client::connect(endpoints, Some(options))
        .await
        .expect("writer connects");
    let mut n = 0u64;
    while !load.stop.load(Ordering::Relaxed) {
        n += 1;
        let first = Instant::now();
        loop {
            match client.put("bench/key", n.to_string(), None).await {
                Ok(_) => {
                    load.ok.fetch_add(1, Ordering::Relaxed);
                    let stall = first.elapsed().as_millis() as u64;
                    load.longest_stall_ms.fetch_max(stall, Ordering::Relaxed);
                    if stall >= 1000 {
                        load.long_stalls.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
                Err(e) if retryable(&e) && first.elapsed() < Duration::from_secs(30) => {
                    load.record(&e, true);
                    load.retried.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    load.record(&e, false);
                    load.failed.fetch_add(1, Ordering::Relaxed);
                    if connection_drop(&e) {
                        load.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
            }
        }
    }
}

pub async fn max_term(etcd: &Etcd) -> u64 {
    etcd.answering()
        .await
        .iter()
        .map(|s| s.raft_term)
        .max()
        .unwrap_or(0)
}

/// Until every member answers, a leader is agreed and all are within 1000 of its index.
pub async fn wait_healthy(etcd: &Etcd) {
    let started = Instant::now();
    loop {
        let statuses = etcd.answering().await;
        if statuses.len() == etcd.endpoints().len()
            && let Some(leader) = agreed_leader(statuses.iter().map(|s| s.leader), statuses.len())
            && let Some(l) = statuses.iter().find(|s| s.id == leader)
            && statuses.iter().all(|s| s.raft_index + 1000 >= l.raft_index)
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "cluster not healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
