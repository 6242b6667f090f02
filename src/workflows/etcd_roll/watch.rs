//! Automatic etcd rolls (`etcd_roll.watch`): `serve` watches each StatefulSet and, when its
//! template moves on to a revision that has no run yet, starts that roll through the same
//! gated, queued intake as `POST /v1/etcd-rolls`. One run per revision (its id comes from
//! the revision, so a restart starts none twice); none while another roll of the same
//! StatefulSet is in flight (the intake's rule): the watch looks again at the next change.

use std::sync::Arc;
use std::time::Duration;
use tracing::{Instrument, debug, info, warn};

use crate::ports::StatefulSets;
use crate::workflows::etcd_roll::roll_watch::{WatchTarget, WatchedRoll, revision_to_roll};

/// How long one watch request waits for a change before the StatefulSet is read again.
const WATCH_SPAN: Duration = Duration::from_secs(300);

/// Starts a roll for a watched StatefulSet (the API's intake, in `serve`).
#[async_trait::async_trait]
pub trait RollStarter: Send + Sync {
    /// Starts the roll of `target` to `revision`, its members reached at `seed`; the
    /// error says why it could not be started now.
    async fn start(
        &self,
        target: &WatchTarget,
        revision: &str,
        seed: &str,
    ) -> Result<WatchedRoll, String>;
}

/// The watch over the configured StatefulSets.
pub struct RollWatch {
    /// Reads and watches the StatefulSets.
    pub statefulsets: Arc<dyn StatefulSets>,
    /// Starts rolls.
    pub starter: Arc<dyn RollStarter>,
    /// Whether members are reached over TLS (`etcd_roll.ca_file` set).
    pub tls: bool,
    /// Pause after a failure before trying again.
    pub retry: Duration,
}

impl RollWatch {
    /// Watches `target` until `stop` turns true.
    pub async fn run(
        self: Arc<Self>,
        target: WatchTarget,
        stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let span = tracing::info_span!("roll_watch", statefulset = %target);
        self.watch(target, stop).instrument(span).await;
    }

    async fn watch(&self, target: WatchTarget, mut stop: tokio::sync::watch::Receiver<bool>) {
        info!("watching for new revisions");
        loop {
            let next = match self.look(&target).await {
                Ok(resource_version) => {
                    let watch = self.statefulsets.wait_for_change(
                        &target.namespace,
                        &target.name,
                        &resource_version,
                        WATCH_SPAN,
                    );
                    tokio::select! {
                        _ = stop.changed() => return,
                        r = watch => r.map_err(|e| crate::error_chain(&e)),
                    }
                }
                Err(why) => Err(why),
            };
            if let Err(why) = next {
                warn!(%why, retry_in = ?self.retry, "cannot watch or roll now");
                tokio::select! {
                    _ = stop.changed() => return,
                    () = tokio::time::sleep(self.retry) => {}
                }
            }
        }
    }

    /// Reads the StatefulSet and starts the roll its revision needs, if any; returns the
    /// resourceVersion to watch from.
    async fn look(&self, target: &WatchTarget) -> Result<String, String> {
        let sts = self
            .statefulsets
            .statefulset(&target.namespace, &target.name)
            .await
            .map_err(|e| crate::error_chain(&e))?;
        if let Some(revision) = revision_to_roll(&sts.current_revision, &sts.update_revision) {
            let seed = target.seed_url(&sts.service_name, self.tls);
            match self.starter.start(target, revision, &seed).await? {
                WatchedRoll::Started(run_id) => {
                    info!(%run_id, %revision, "new revision: roll started")
                }
                WatchedRoll::AlreadyRolled(run_id) => {
                    debug!(%run_id, %revision, "this revision has its run")
                }
                WatchedRoll::Waiting(run_id) => {
                    info!(in_flight = %run_id, %revision, "new revision waits for the roll in flight")
                }
            }
        }
        Ok(sts.resource_version)
    }
}
