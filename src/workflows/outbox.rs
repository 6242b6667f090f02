//! Notifications from the store's log of transitions: each sink (Slack) is told every
//! transition in order, at least once. The log is written in the same transaction as the
//! run, and the sink's progress is kept in the store after each delivery, so a kill -9
//! between a commit and its message delays the message to the next start; it does not
//! lose it, and what was delivered is not told again.

use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

use crate::domain::backoff::Backoff;
use crate::domain::run::RunEvent;
use crate::ports::{Delivery, Notice, TransitionSink};
use crate::store::Store;

/// How many transitions one read takes.
const PAGE: usize = 100;
/// How often the log is read without a commit to wake the sender (another replica's).
const POLL: Duration = Duration::from_secs(1);
/// The pause before a transition the sink could not take is tried again.
const AGAIN: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// The notice a logged transition makes.
pub fn notice_of(event: &RunEvent) -> Notice {
    Notice {
        run_id: event.run_id.clone(),
        kind: event.kind.name().into(),
        target: event.target.clone(),
        from: event.transition.from,
        to: event.transition.to,
        step: event.transition.step.clone(),
        reason: event.transition.reason.clone(),
        blockers: event.blockers.clone(),
        at: event.transition.at,
    }
}

/// Whether `changed` (of `stop`) means stopping: set, or its sender gone.
fn stopping(
    changed: Result<(), tokio::sync::watch::error::RecvError>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> bool {
    changed.is_err() || *stop.borrow()
}

/// Waits `pause`, or less if `stop` turns true; whether to go on.
async fn pause_unless_stopped(
    pause: Duration,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        changed = stop.changed() => !stopping(changed, stop),
        () = tokio::time::sleep(pause) => true,
    }
}

/// Runs [`deliver`] while this replica's worker is the active one (`leading`), until
/// `stop`: with several replicas one sender tells each sink.
pub async fn deliver_while_leading(
    store: Store,
    sink: Arc<dyn TransitionSink>,
    mut leading: tokio::sync::watch::Receiver<bool>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use crate::workflows::leader::{until_deposed, until_leading};
    loop {
        tokio::select! {
            led = until_leading(&mut leading) => if !led { return },
            changed = stop.changed() => if stopping(changed, &stop) { return },
        }
        let (halt, halted) = tokio::sync::watch::channel(false);
        let mut session = tokio::spawn(deliver(store.clone(), sink.clone(), halted));
        let stopped = tokio::select! {
            _ = &mut session => return,
            () = until_deposed(&mut leading) => false,
            changed = stop.changed() => stopping(changed, &stop),
        };
        let _ = halt.send(true);
        let _ = session.await;
        if stopped {
            return;
        }
    }
}

/// Tells `sink` every transition logged after the ones it has had, until `stop`.
pub async fn deliver(
    store: Store,
    sink: Arc<dyn TransitionSink>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut logged = store.transitions_logged();
    let mut after = loop {
        match store.delivered(sink.name()).await {
            Ok(seq) => break seq,
            Err(error) => {
                warn!(sink = sink.name(), error = %crate::error_chain(&error), "cannot read how far notifications went");
                if !pause_unless_stopped(POLL, &mut stop).await {
                    return;
                }
            }
        }
    };
    loop {
        let events = match store.events_after(after, None, PAGE).await {
            Ok(events) => events,
            Err(error) => {
                warn!(sink = sink.name(), error = %crate::error_chain(&error), "cannot read the log of transitions");
                Vec::new()
            }
        };
        if events.is_empty() {
            tokio::select! {
                changed = stop.changed() => if stopping(changed, &stop) { return },
                _ = logged.changed() => {}
                () = tokio::time::sleep(POLL) => {}
            }
            continue;
        }
        for event in events {
            let notice = notice_of(&event);
            let mut tries = 0;
            while sink.deliver(&notice).await == Delivery::Later {
                tries += 1;
                let pause = crate::jitter::pause(&AGAIN, tries);
                if !pause_unless_stopped(pause, &mut stop).await {
                    return;
                }
            }
            after = event.seq;
            if let Err(error) = store.set_delivered(sink.name(), after).await {
                // Told again after a restart: at least once.
                warn!(sink = sink.name(), error = %crate::error_chain(&error), "cannot record a delivered notification");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::run::{Run, RunStatus};
    use crate::store::Commit;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// A sink that answers from a script (then `Sent`) and records what it was told.
    #[derive(Default)]
    struct Scripted {
        answers: Mutex<VecDeque<Delivery>>,
        told: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl TransitionSink for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        async fn deliver(&self, notice: &Notice) -> Delivery {
            self.told.lock().unwrap().push(notice.reason.clone());
            self.answers
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Delivery::Sent)
        }
    }

    #[tokio::test]
    async fn every_transition_is_told_in_order_again_when_later_and_skipped_when_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store.db")).unwrap();
        let sink = Arc::new(Scripted::default());
        // The sink exists before the run: it is told everything from here on.
        assert_eq!(store.delivered(sink.name()).await.unwrap(), 0);
        sink.answers
            .lock()
            .unwrap()
            .extend([Delivery::Later, Delivery::Sent, Delivery::Refused]);
        let mut run = Run::new(
            "r1".into(),
            crate::domain::upgrade_step::K8S_UPGRADE,
            serde_json::Value::Null,
            None,
            Vec::new(),
            chrono::Utc::now(),
            "accepted",
        );
        store.insert_run_if_absent(&run).await.unwrap();
        run.transition(RunStatus::Running, "second", chrono::Utc::now());
        run.transition(RunStatus::Halted, "third", chrono::Utc::now());
        store
            .commit(Commit {
                runs: vec![run],
                ..Commit::default()
            })
            .await
            .unwrap();
        let last = store.last_event_seq().await.unwrap();

        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(deliver(store.clone(), sink.clone(), stopped));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while store.delivered(sink.name()).await.unwrap() < last {
            assert!(std::time::Instant::now() < deadline, "not delivered");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.send(true).unwrap();
        task.await.unwrap();
        assert_eq!(
            *sink.told.lock().unwrap(),
            ["accepted", "accepted", "second", "third"],
            "the first again after Later; the refused second not again"
        );
        // A sink met for the first time starts at the end of the log.
        assert_eq!(store.delivered("newcomer").await.unwrap(), last);
    }
}
