//! A reboot, as every workflow asks one: the node's sentinel read over SSH; the reboot
//! command sent once (the node's boot id is marked on it first, and a step redone after a
//! crash finds the mark and does not send it again); the node back with another boot id
//! and Ready within `reboot.timeout`. A node-reboot run acts its parts as separate steps;
//! an upgrade with `reboot.after_upgrade = "if-required"` acts them as one step inside
//! the node's drain.

use chrono::Utc;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::engine::StepOutcome;
use crate::domain::run::{Run, Step};
use crate::error_chain;
use crate::metrics::Metrics;

use super::metrics::RebootMetrics;
use crate::ports::{ClusterRead, ExecError, NodeBoot, NodeBoots, NodeExec, NodeTarget, RebootMark};
use crate::workflows::node_cycle::NodeCycle;

/// What a reboot runs on nodes, and how long a node may take to come back.
#[derive(Debug, Clone)]
pub struct RebootAction {
    /// The script that tells whether a node needs a reboot: exit 0 yes, 1 no.
    pub sentinel_script: String,
    /// The reboot command.
    pub command: String,
    /// From the command to Ready with another boot id.
    pub timeout: Duration,
    /// Labels set before the reboot.
    pub labels_before: Vec<(String, Option<String>)>,
    /// Labels set once the node is back.
    pub labels_after: Vec<(String, Option<String>)>,
}

/// The ports a reboot goes through.
#[derive(Clone)]
pub struct NodeReboots {
    /// Reads nodes.
    pub cluster: Arc<dyn ClusterRead>,
    /// Boot ids, the reboot mark, labels.
    pub boots: Arc<dyn NodeBoots>,
    /// Commands over SSH.
    pub exec: Arc<dyn NodeExec>,
    /// Where it tells the node's Events.
    pub cycle: NodeCycle,
    /// Commands and limits.
    pub settings: RebootAction,
    /// Where it keeps what it last read of each node's sentinel.
    pub metrics: Metrics,
}

/// Why a node's sentinel could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SentinelError {
    /// The check ran and answered neither 0 nor 1.
    #[error("the sentinel check on {node} exited with {status:?}: {tail}")]
    Exit {
        /// The node.
        node: String,
        /// Its exit status (`None`: a signal).
        status: Option<i32>,
        /// The end of its output.
        tail: String,
    },
    /// The check did not run.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl SentinelError {
    /// The step's outcome: a changed host key never gets better by retrying.
    fn outcome(self) -> StepOutcome {
        match self {
            Self::Exec(e @ ExecError::HostKey { .. }) => StepOutcome::failed(error_chain(&e)),
            other => StepOutcome::retry(error_chain(&other)),
        }
    }
}

/// Whether a node's sentinel is set: `script` exits 0 (set) or 1 (not set).
pub async fn sentinel(
    exec: &dyn NodeExec,
    target: &NodeTarget,
    script: &str,
) -> Result<bool, SentinelError> {
    let out = exec.run_script(target, script, &[]).await?;
    match out.status {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        status => Err(SentinelError::Exit {
            node: target.name.clone(),
            status,
            tail: out.tail(4),
        }),
    }
}

impl NodeReboots {
    pub async fn target(&self, name: &str) -> Result<NodeTarget, StepOutcome> {
        let node = self
            .cluster
            .node(name)
            .await
            .map_err(|e| StepOutcome::retry(error_chain(&e)))?
            .ok_or_else(|| {
                StepOutcome::failed(format!("node {name} is no longer in the cluster"))
            })?;
        Ok(NodeTarget::from(&node))
    }

    /// Whether `target`'s sentinel is set now; kept in `rollgate_node_reboot_required`.
    pub async fn read_sentinel(&self, target: &NodeTarget) -> Result<bool, StepOutcome> {
        let set = sentinel(&*self.exec, target, &self.settings.sentinel_script)
            .await
            .map_err(SentinelError::outcome)?;
        self.metrics
            .set::<RebootMetrics>()
            .required
            .with_label_values(&[&target.name])
            .set(i64::from(set));
        Ok(set)
    }

    /// Whether `node`'s sentinel is set now.
    pub async fn required(&self, node: &str) -> Result<bool, StepOutcome> {
        let target = self.target(node).await?;
        self.read_sentinel(&target).await
    }

    /// Marks the node's boot id, then sends the reboot command; once only.
    pub async fn reboot(&self, run: &Run, step: &Step, node: &str) -> StepOutcome {
        match self.boot(node).await {
            Ok(boot) => self.reboot_from(run, step, node, &boot).await,
            Err(outcome) => outcome,
        }
    }

    /// [`Self::reboot`] of a node whose boot (and mark) was just read as `boot`.
    async fn reboot_from(
        &self,
        run: &Run,
        step: &Step,
        node: &str,
        boot: &NodeBoot,
    ) -> StepOutcome {
        if let Some(mark) = boot.mark.as_ref().filter(|m| m.run_id == run.id) {
            if mark.boot_id != boot.boot_id {
                return StepOutcome::done(format!(
                    "{node} has rebooted already (boot id {} -> {}): not rebooted again",
                    mark.boot_id, boot.boot_id
                ));
            }
            if !step.outcome.as_deref().is_some_and(may_send_again) {
                return StepOutcome::done(format!(
                    "the reboot command was sent to {node} at {} (before a restart): not sent again; waiting for it to come back",
                    mark.at.format("%H:%M:%S")
                ));
            }
        }
        let target = match self.target(node).await {
            Ok(t) => t,
            Err(outcome) => return outcome,
        };
        if let Err(e) = self.boots.label(node, &self.settings.labels_before).await {
            return StepOutcome::retry(error_chain(&e));
        }
        let mark = RebootMark {
            run_id: run.id.clone(),
            boot_id: boot.boot_id.clone(),
            at: Utc::now(),
        };
        if let Err(e) = self.boots.mark_reboot(node, &mark).await {
            return StepOutcome::retry(format!("{NOT_SENT}{}", error_chain(&e)));
        }
        self.metrics
            .set::<RebootMetrics>()
            .sent
            .with_label_values(&[node])
            .set(mark.at.timestamp_millis() as f64 / 1000.0);
        let result = self
            .exec
            .run_script(&target, &format!("{}\n", self.settings.command), &[])
            .await;
        self.exec.forget(&target.name);
        let sent = match result {
            // ssh's own 255 is a session cut short, which a node going down causes.
            Ok(out) if matches!(out.status, Some(code) if code != 0 && code != 255) => {
                match self.boots.boot(node).await {
                    Ok(now) if now.boot_id != boot.boot_id => format!(
                        "exited with {:?}, and the node has another boot id already",
                        out.status
                    ),
                    // It said no, and the node kept its boot (or cannot be asked now:
                    // its own exit status decides): nothing was rebooted, and the redo
                    // (the one retry policy) sends the command again.
                    _ => {
                        return StepOutcome::retry(refused(
                            node,
                            &out.tail(2),
                            out.status.unwrap_or_default(),
                        ));
                    }
                }
            }
            Ok(out) => format!("exited with {:?}", out.status),
            Err(e @ ExecError::HostKey { .. }) => return StepOutcome::failed(error_chain(&e)),
            // No session: nothing was sent.
            Err(e @ ExecError::Connect { .. }) => {
                return StepOutcome::retry(format!("{NOT_SENT}{}", error_chain(&e)));
            }
            // The node going down takes the session with it: expected.
            Err(e) => format!("the session ended ({})", error_chain(&e)),
        };
        self.cycle.tell(
            node,
            "Rebooting",
            "Reboot",
            format!("run {} reboots the node (boot id {})", run.id, boot.boot_id),
        );
        StepOutcome::done(format!(
            "reboot command sent to {node} (boot id {}): {sent}",
            boot.boot_id
        ))
    }

    pub async fn boot(&self, node: &str) -> Result<NodeBoot, StepOutcome> {
        self.boots
            .boot(node)
            .await
            .map_err(|e| StepOutcome::retry(error_chain(&e)))
    }

    /// The node is back: another boot id than the one marked, and Ready, within the
    /// timeout counted from the reboot command.
    pub async fn back(&self, run: &Run, node: &str) -> StepOutcome {
        match self.boot(node).await {
            Ok(boot) => self.back_from(run, node, &boot).await,
            Err(outcome) => outcome,
        }
    }

    /// [`Self::back`] of a node whose boot (and mark) was just read as `boot`.
    async fn back_from(&self, run: &Run, node: &str, boot: &NodeBoot) -> StepOutcome {
        let Some(mark) = boot.mark.as_ref().filter(|m| m.run_id == run.id) else {
            return StepOutcome::failed(format!(
                "{node} carries no reboot mark of this run: the reboot was not asked"
            ));
        };
        let now = Utc::now();
        let waited = (now - mark.at).to_std().unwrap_or_default();
        let rebooted = boot.boot_id != mark.boot_id;
        if rebooted && boot.ready {
            if let Err(e) = self.boots.label(node, &self.settings.labels_after).await {
                return StepOutcome::retry(error_chain(&e));
            }
            self.metrics
                .set::<RebootMetrics>()
                .required
                .with_label_values(&[node])
                .set(0);
            // The mark's time as well: after a restart of rollgate this is how it knows.
            self.metrics
                .set::<RebootMetrics>()
                .sent
                .with_label_values(&[node])
                .set(mark.at.timestamp_millis() as f64 / 1000.0);
            self.metrics
                .set::<RebootMetrics>()
                .back
                .with_label_values(&[node])
                .set(now.timestamp_millis() as f64 / 1000.0);
            self.cycle.tell(
                node,
                "Rebooted",
                "Reboot",
                format!("back with boot id {}, Ready", boot.boot_id),
            );
            return StepOutcome::done(format!(
                "{node} is back: boot id {} -> {}, Ready {}s after the reboot command",
                mark.boot_id,
                boot.boot_id,
                waited.as_secs()
            ));
        }
        let state = match (rebooted, boot.ready) {
            (false, true) => "has not rebooted yet (same boot id, Ready)",
            (false, false) => "is down (same boot id, not Ready)",
            (true, _) => "has rebooted and is not Ready yet",
        };
        if waited >= self.settings.timeout {
            return StepOutcome::failed(format!(
                "{node} did not come back within reboot.timeout ({}s): it {state}; it stays cordoned",
                self.settings.timeout.as_secs()
            ));
        }
        let poll =
            (self.settings.timeout / 60).clamp(Duration::from_millis(250), Duration::from_secs(10));
        StepOutcome::Wait {
            until: now + chrono::Duration::from_std(poll).unwrap_or_default(),
            reason: format!("waiting for {node}: it {state}"),
        }
    }

    /// The reboot inside another workflow's drain, as one step: the sentinel read after
    /// the node's script; when set, the reboot sent once and waited for until the node
    /// is back. A node that needs none is done at once.
    pub async fn if_required(&self, run: &Run, step: &Step, node: &str) -> StepOutcome {
        let boot = match self.boot(node).await {
            Ok(b) => b,
            Err(outcome) => return outcome,
        };
        if boot.mark.as_ref().is_some_and(|m| m.run_id == run.id) {
            // Sent already (this poll, or before a restart): one read serves both.
            return match self.reboot_from(run, step, node, &boot).await {
                StepOutcome::Done { .. } => self.back_from(run, node, &boot).await,
                other => other,
            };
        }
        match self.required(node).await {
            Ok(true) => {}
            Ok(false) => {
                return StepOutcome::done(format!(
                    "{node} needs no reboot: its sentinel is not set"
                ));
            }
            Err(outcome) => return outcome,
        }
        match self.reboot_from(run, step, node, &boot).await {
            // The mark is on the node now: read it back with the node's state.
            StepOutcome::Done { .. } => self.back(run, node).await,
            other => other,
        }
    }
}

/// How a reboot step's outcome starts when the command surely was not sent: the redo may
/// send it.
const NOT_SENT: &str = "reboot command not sent: ";

/// The outcome of a reboot command the node refused (a non-zero exit, the boot id kept),
/// e.g. `reboot of w3 refused: sudo: a password is required (exit 1)`.
fn refused(node: &str, said: &str, code: i32) -> String {
    let said = if said.trim().is_empty() {
        "no output"
    } else {
        said.trim()
    };
    format!("reboot of {node} refused: {said} (exit {code})")
}

/// Whether a reboot step whose last outcome was `outcome` surely rebooted nothing, so
/// that its redo may send the command: nothing was sent, or the node refused it.
fn may_send_again(outcome: &str) -> bool {
    outcome.starts_with(NOT_SENT)
        || (outcome.starts_with("reboot of ") && outcome.contains(" refused: "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_command_not_sent_or_refused_is_sent_again() {
        let cases = [
            (format!("{NOT_SENT}ssh to w1: cannot connect"), true),
            (refused("w3", "sudo: a password is required", 1), true),
            (refused("w3", "", 1), true),
            (
                "reboot command sent to w3 (boot id b1): exited with Some(0)".into(),
                false,
            ),
            (
                "reboot command sent to w3 (boot id b1): the session ended (eof)".into(),
                false,
            ),
            (
                "waiting for w3: it is down (same boot id, not Ready)".into(),
                false,
            ),
        ];
        for (outcome, want) in cases {
            assert_eq!(may_send_again(&outcome), want, "{outcome}");
        }
        assert_eq!(
            refused("w3", "Interactive authentication required.", 1),
            "reboot of w3 refused: Interactive authentication required. (exit 1)"
        );
        assert_eq!(
            refused("w3", " ", 4),
            "reboot of w3 refused: no output (exit 4)"
        );
    }
}
