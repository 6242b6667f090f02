//! Kubernetes Events for what rollgate does, so that `kubectl describe node` and
//! `kubectl get events` tell the story: on a node, its cordon, drain, upgrade, uncordon
//! and the gate holding it; on the upgrade namespace, a run's milestones.
//!
//! Events are written in order by one background task. Writing one never blocks or fails
//! a step: a refusal is logged and counted (`rollgate_notifications_total{sink="kube-events"}`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tracing::warn;

use crate::domain::run::RunStatus;
use crate::metrics::Metrics;
use crate::ports::{ClusterEvent, EventRecorder, Notice, Notifier, Regarding};

/// Where events go: a queue drained in order by one task.
#[derive(Clone)]
pub struct EventSink {
    queue: mpsc::UnboundedSender<ClusterEvent>,
}

impl EventSink {
    /// Starts the task that writes events through `recorder`.
    pub fn start(recorder: Arc<dyn EventRecorder>, metrics: Metrics) -> Self {
        let (queue, mut pending) = mpsc::unbounded_channel::<ClusterEvent>();
        tokio::spawn(async move {
            while let Some(event) = pending.recv().await {
                let outcome = match recorder.record(&event).await {
                    Ok(()) => "sent",
                    Err(error) => {
                        warn!(reason = %event.reason, %error, "cannot write a Kubernetes Event");
                        "failed"
                    }
                };
                metrics
                    .notifications
                    .with_label_values(&["kube-events", outcome])
                    .inc();
            }
        });
        Self { queue }
    }

    /// Queues `event`.
    pub fn emit(&self, event: ClusterEvent) {
        // Closed only when the runtime shuts down: nothing left to tell.
        let _ = self.queue.send(event);
    }

    /// Queues a Normal event on `node`.
    pub fn node(&self, node: &str, reason: &str, action: &str, note: String) {
        self.emit(node_event(node, reason, action, note, false));
    }

    /// Queues a Warning event on `node`.
    pub fn node_warning(&self, node: &str, reason: &str, action: &str, note: String) {
        self.emit(node_event(node, reason, action, note, true));
    }
}

fn node_event(node: &str, reason: &str, action: &str, note: String, warning: bool) -> ClusterEvent {
    ClusterEvent {
        regarding: Regarding::Node(node.to_owned()),
        reason: reason.to_owned(),
        action: action.to_owned(),
        note,
        warning,
    }
}

/// The run-level event a transition makes on `namespace`, if it is a milestone (created,
/// started or resumed, halted, ended); steps coming and going are not.
pub fn run_event(notice: &Notice, namespace: &str) -> Option<ClusterEvent> {
    use RunStatus as S;
    let (reason, warning) = match (notice.from, notice.to) {
        (None, _) => ("RunAccepted", false),
        (Some(S::Queued | S::Halted), S::Running) => ("RunStarted", false),
        (Some(from), S::Halted) if from != S::Halted => ("RunHalted", true),
        (_, S::Failed) => ("RunFailed", true),
        (_, S::Aborted) => ("RunAborted", true),
        (_, S::Succeeded) => ("RunSucceeded", false),
        _ => return None,
    };
    let target = notice
        .target
        .as_deref()
        .map(|t| format!(" to {t}"))
        .unwrap_or_default();
    Some(ClusterEvent {
        regarding: Regarding::Namespace(namespace.to_owned()),
        reason: reason.to_owned(),
        action: "Run".to_owned(),
        note: format!(
            "{} {}{target}: {}",
            notice.kind, notice.run_id, notice.reason
        ),
        warning,
    })
}

/// The node a held step is about, with what holds it: a step on a node waiting with
/// blockers (its gate, or a drain held by a pod or a budget).
pub fn held_node(notice: &Notice) -> Option<(&str, &[String])> {
    if notice.to != RunStatus::Waiting || notice.blockers.is_empty() {
        return None;
    }
    let node = notice.step.as_deref()?.split_once('@')?.1;
    Some((node, &notice.blockers))
}

/// Tells transitions as Events: run milestones on the upgrade namespace, and a gate's hold
/// on the node it holds (once per run, step and set of blockers: a held step is asked
/// again every poll).
pub struct EventNotifier {
    sink: EventSink,
    namespace: String,
    last_hold: Mutex<HashMap<String, (String, Vec<String>)>>,
}

impl EventNotifier {
    /// Run events on `namespace`, through `sink`.
    pub fn new(sink: EventSink, namespace: String) -> Self {
        Self {
            sink,
            namespace,
            last_hold: Mutex::new(HashMap::new()),
        }
    }

    /// Whether this hold differs from the last one told for its run.
    fn is_new_hold(&self, notice: &Notice, blockers: &[String]) -> bool {
        let step = notice.step.clone().unwrap_or_default();
        let Ok(mut last) = self.last_hold.lock() else {
            return true;
        };
        let this = (step, blockers.to_vec());
        if last.get(&notice.run_id) == Some(&this) {
            return false;
        }
        last.insert(notice.run_id.clone(), this);
        true
    }
}

impl Notifier for EventNotifier {
    fn notify(&self, notice: Notice) {
        if let Some((node, blockers)) = held_node(&notice)
            && self.is_new_hold(&notice, blockers)
        {
            self.sink.node_warning(
                node,
                "HeldByGate",
                "Gate",
                format!(
                    "run {} holds {node}: {}",
                    notice.run_id,
                    blockers.join("; ")
                ),
            );
        }
        if notice.to.is_terminal()
            && let Ok(mut last) = self.last_hold.lock()
        {
            last.remove(&notice.run_id);
        }
        if let Some(event) = run_event(&notice, &self.namespace) {
            self.sink.emit(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(from: Option<RunStatus>, to: RunStatus, step: &str, blockers: &[&str]) -> Notice {
        Notice {
            run_id: "r1".into(),
            kind: "k8s-upgrade".into(),
            target: Some("1.34.5".into()),
            from,
            to,
            step: (!step.is_empty()).then(|| step.to_owned()),
            reason: "why".into(),
            blockers: blockers.iter().map(|b| (*b).to_owned()).collect(),
            at: chrono::Utc::now(),
        }
    }

    #[test]
    fn milestones_become_run_events_and_step_churn_does_not() {
        use RunStatus::*;
        let cases = [
            (None, Queued, Some(("RunAccepted", false))),
            (Some(Queued), Running, Some(("RunStarted", false))),
            (Some(Halted), Running, Some(("RunStarted", false))),
            (Some(Running), Waiting, None),
            (Some(Waiting), Running, None),
            (Some(Running), Running, None),
            (Some(Waiting), Halted, Some(("RunHalted", true))),
            (Some(Running), Failed, Some(("RunFailed", true))),
            (Some(Halted), Aborted, Some(("RunAborted", true))),
            (Some(Running), Succeeded, Some(("RunSucceeded", false))),
        ];
        for (from, to, want) in cases {
            let got = run_event(&notice(from, to, "", &[]), "k8s-upgrade");
            assert_eq!(
                got.as_ref().map(|e| (e.reason.as_str(), e.warning)),
                want,
                "{from:?} -> {to:?}"
            );
            if let Some(event) = got {
                assert_eq!(event.regarding, Regarding::Namespace("k8s-upgrade".into()));
                assert_eq!(event.note, "k8s-upgrade r1 to 1.34.5: why");
            }
        }
    }

    #[test]
    fn a_hold_is_told_on_the_node_it_holds() {
        use RunStatus::*;
        let held = notice(Some(Running), Waiting, "workers/gate@w2", &["NodeNotReady"]);
        assert_eq!(
            held_node(&held),
            Some(("w2", &["NodeNotReady".to_owned()][..]))
        );
        let cases = [
            notice(Some(Running), Waiting, "workers/soak@w2", &[]),
            notice(Some(Running), Waiting, "preflight/gate", &["NodeNotReady"]),
            notice(Some(Running), Halted, "workers/gate@w2", &["NodeNotReady"]),
        ];
        for n in cases {
            assert_eq!(held_node(&n), None, "{n:?}");
        }
    }
}
