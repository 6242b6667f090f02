//! `rollgate detect`, what the weekly CronJob runs: read the running versions from the
//! Kubernetes API, the patches the control plane's apt repository offers over SSH, and
//! (when no patch comes first) whether the next minor's repository carries a release;
//! decide (`domain::detect::decide`); push the result to a Pushgateway; ask rollgate for
//! the upgrade over HTTP or AMQP unless it is a dry run.

use chrono::Utc;
use serde::Serialize;
use std::sync::Arc;

use crate::domain::detect::{
    self, Decision, Findings, NextMinor, RunningError, madison_releases, minor_of, next_minor,
};
use crate::domain::event::{DetectionRequest, StageSelection};
use crate::domain::k8s_upgrade::Role;
use crate::ports::{
    ClusterError, ClusterRead, Failure, MetricsPush, NodeExec, NodeTarget, PackageRepository,
    RepoError, Submitted, Submitter,
};
use crate::workflows::k8s_upgrade::NODE_SCRIPT;

/// Where detection reads from.
pub struct Sources {
    /// Nodes and their versions.
    pub cluster: Arc<dyn ClusterRead>,
    /// SSH to the control plane.
    pub exec: Arc<dyn NodeExec>,
    /// The package repository.
    pub repo: Arc<dyn PackageRepository>,
}

/// Why detection stopped. Each kind has its exit code (see [`DetectError::exit_code`]).
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    /// The Kubernetes API could not be read.
    #[error("cannot read the cluster")]
    Cluster(#[from] ClusterError),
    /// The running version cannot be told.
    #[error(transparent)]
    Running(#[from] RunningError),
    /// The control plane's package list could not be read.
    #[error("cannot list kubeadm packages on {node}")]
    Ssh {
        /// The control-plane node.
        node: String,
        /// What went wrong.
        #[source]
        error: Failure,
    },
    /// The package repository could not be read.
    #[error(transparent)]
    Repo(#[from] RepoError),
    /// rollgate did not take the request.
    #[error("the upgrade request was not taken")]
    Submit(#[source] Failure),
    /// The metrics were not pushed (what else there was to do is done).
    #[error("the metrics were not pushed")]
    Push(#[source] Failure),
}

impl DetectError {
    /// 3: the facts could not be read, nothing was pushed or asked for; 4: rollgate did
    /// not take the request; 5: the metrics were not pushed.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Cluster(_) | Self::Running(_) | Self::Ssh { .. } | Self::Repo(_) => 3,
            Self::Submit(_) => 4,
            Self::Push(_) => 5,
        }
    }
}

/// What one detection found, decided and did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What was found.
    pub findings: Findings,
    /// What was decided.
    pub decision: Decision,
    /// Whether the metrics were pushed.
    pub pushed: bool,
    /// What came of the request; `None` when nothing was asked for (nothing to do, or a
    /// dry run).
    pub submitted: Option<Submitted>,
}

/// Reads the facts.
pub async fn findings(sources: &Sources) -> Result<Findings, DetectError> {
    let facts = sources.cluster.facts().await?;
    let api_server = sources.cluster.api_server_version().await?;
    let (running, behind) = detect::running(&facts, api_server)?;
    let plane = facts
        .nodes
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .ok_or(RunningError::NoControlPlane)?;
    let target = NodeTarget::from(plane);
    let ssh_error = |error: Failure| DetectError::Ssh {
        node: plane.name.clone(),
        error,
    };
    let out = sources
        .exec
        .run_script(&target, NODE_SCRIPT, &["--available".to_owned()])
        .await
        .map_err(|e| ssh_error(Failure::caused("the node script did not run", e)))?;
    if out.status != Some(0) {
        return Err(ssh_error(Failure::new(format!(
            "the node script exited with {:?}: {}",
            out.status,
            out.stderr.trim()
        ))));
    }
    let latest_patch = madison_releases(&out.stdout, minor_of(running))
        .last()
        .copied();
    // A patch (or a part-done rollout) comes first: the next minor need not be read.
    let patch_first = latest_patch.is_some_and(|l| l > running) || !behind.is_empty();
    let next_minor = if patch_first {
        NextMinor::NotChecked
    } else {
        let next = next_minor(running);
        if sources.repo.published(next).await? {
            match sources.repo.releases(next).await?.last() {
                Some(latest) => NextMinor::Released(*latest),
                None => NextMinor::NoRelease,
            }
        } else {
            NextMinor::NotPublished
        }
    };
    Ok(Findings {
        running,
        behind,
        latest_patch,
        next_minor,
    })
}

/// Finds, decides, pushes the metrics (when a Pushgateway is given) and asks for the
/// upgrade (when a submitter is given: not in a dry run). The report comes back whenever
/// the facts could be read, also when a later part failed.
pub async fn detect(
    sources: &Sources,
    stages: &StageSelection,
    push: Option<&dyn MetricsPush>,
    submit: Option<&dyn Submitter>,
) -> (Option<Report>, Option<DetectError>) {
    let findings = match findings(sources).await {
        Ok(f) => f,
        Err(e) => return (None, Some(e)),
    };
    let decision = detect::decide(&findings);
    let mut error = None;
    let pushed = match push {
        None => false,
        Some(push) => {
            let text = detect::pushgateway_text(&decision, Utc::now().timestamp());
            match push.push(text).await {
                Ok(()) => true,
                Err(e) => {
                    error = Some(DetectError::Push(e));
                    false
                }
            }
        }
    };
    let mut submitted = None;
    if let (Decision::Upgrade { kind, target, .. }, Some(submit)) = (&decision, submit) {
        let request = DetectionRequest {
            target_version: *target,
            kind: *kind,
            dry_run: false,
            stages: stages.clone(),
        };
        match submit.submit(&request).await {
            Ok(s) => submitted = Some(s),
            // Not taken is worse than not pushed: it is the error to report.
            Err(e) => error = Some(DetectError::Submit(e)),
        }
    }
    let report = Report {
        findings,
        decision,
        pushed,
        submitted,
    };
    (Some(report), error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_tell_what_went_wrong() {
        let cases = [
            (DetectError::Cluster(ClusterError::new("x")), 3),
            (DetectError::Running(RunningError::NoControlPlane), 3),
            (
                DetectError::Ssh {
                    node: "cp".into(),
                    error: Failure::new("x"),
                },
                3,
            ),
            (
                DetectError::Repo(crate::ports::RepoError {
                    url: "u".into(),
                    failure: Failure::new("x"),
                }),
                3,
            ),
            (DetectError::Submit(Failure::new("x")), 4),
            (DetectError::Push(Failure::new("x")), 5),
        ];
        for (error, code) in cases {
            assert_eq!(error.exit_code(), code, "{error}");
        }
    }
}
