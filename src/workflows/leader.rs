//! One active worker among replicas. Every replica campaigns for the store's worker lease
//! (a row with an expiry in the database's clock). The holder renews it every third of
//! its TTL and steps down once it has not renewed for two thirds of it, before any other
//! replica could take it; the others ask every tenth. A replica killed with kill -9 stops
//! renewing, and another takes over within about one TTL; one stopped gracefully gives
//! the lease up at once. With SQLite (one process) the lease is always held.

use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::store::{Store, WORKER_LEASE};

/// Shortest pause between two asks.
const MIN_PAUSE: Duration = Duration::from_millis(100);
/// Longest pause between two asks of a replica that does not hold the lease: a lease whose
/// holder died is taken about this long after (see [`crate::store::Store::take_lease`]).
const MAX_ASK: Duration = Duration::from_millis(500);

/// Campaigns for the worker lease until `stop`; the receiver is true while this replica
/// holds it. Stopping gives the lease up.
pub fn campaign(
    store: Store,
    ttl: Duration,
    metrics: Metrics,
    mut stop: watch::Receiver<bool>,
) -> watch::Receiver<bool> {
    let (leading, rx) = watch::channel(false);
    tokio::spawn(async move {
        let renew = (ttl / 3).max(MIN_PAUSE);
        let ask = (ttl / 10).clamp(MIN_PAUSE, MAX_ASK);
        let mut renewed: Option<Instant> = None;
        loop {
            let asked = Instant::now();
            let held = match store.take_lease(WORKER_LEASE, ttl).await {
                Ok(true) => {
                    renewed = Some(asked);
                    true
                }
                Ok(false) => {
                    renewed = None;
                    false
                }
                Err(error) => {
                    warn!(error = %crate::error_chain(&error), "cannot renew or take the worker lease");
                    // Still held until two thirds of the TTL after the last renewal began.
                    renewed = renewed.filter(|at| at.elapsed() < ttl * 2 / 3);
                    renewed.is_some()
                }
            };
            if held != *leading.borrow() {
                if held {
                    info!(
                        replica = store.replica(),
                        "this replica's worker is now the active one"
                    );
                } else {
                    warn!(
                        replica = store.replica(),
                        "this replica's worker is no longer the active one"
                    );
                }
                metrics.worker_active.set(i64::from(held));
                leading.send_replace(held);
            }
            let pause = if renewed == Some(asked) { renew } else { ask };
            tokio::select! {
                changed = stop.changed() => if changed.is_err() || *stop.borrow() { break },
                () = tokio::time::sleep(pause) => {}
            }
        }
        if leading.send_replace(false) {
            metrics.worker_active.set(0);
            if let Err(error) = store.drop_lease(WORKER_LEASE).await {
                warn!(error = %crate::error_chain(&error), "cannot give the worker lease up; another replica takes it when it expires");
            }
        }
    });
    rx
}

/// Waits until `leading` is true; false if it never will be (its campaign ended).
pub async fn until_leading(leading: &mut watch::Receiver<bool>) -> bool {
    leading.wait_for(|held| *held).await.is_ok()
}

/// Waits until `leading` turns false (or its campaign ends).
pub async fn until_deposed(leading: &mut watch::Receiver<bool>) {
    let _ = leading.wait_for(|held| !*held).await;
}
