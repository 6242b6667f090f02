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
use crate::domain::event::{CloudEvent, DetectionRequest, EventData, StageSelection};
use crate::domain::plan::Role;
use crate::ports::{ClusterRead, MetricsPush, NodeExec, NodeTarget, PackageRepository, RepoError};
use crate::queue::{Outgoing, Queue};
use crate::upgrade::NODE_SCRIPT;

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
    #[error("cannot read the cluster: {0}")]
    Cluster(String),
    /// The running version cannot be told.
    #[error(transparent)]
    Running(#[from] RunningError),
    /// The control plane's package list could not be read.
    #[error("cannot list kubeadm packages on {node}: {error}")]
    Ssh {
        /// The control-plane node.
        node: String,
        /// What went wrong.
        error: String,
    },
    /// The package repository could not be read.
    #[error(transparent)]
    Repo(#[from] RepoError),
    /// rollgate did not take the request.
    #[error("the upgrade request was not taken: {0}")]
    Submit(String),
    /// The metrics were not pushed (what else there was to do is done).
    #[error("the metrics were not pushed: {0}")]
    Push(String),
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

/// What came of asking for the upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Submitted {
    /// A new run.
    Created {
        /// Its id.
        run_id: String,
    },
    /// A run for this target was in flight already.
    InFlight {
        /// Its id.
        run_id: String,
    },
    /// Another upgrade holds the cluster; next week's detection asks again.
    Held {
        /// rollgate's words.
        message: String,
    },
    /// Published on the AMQP exchange (publisher-confirmed).
    Published {
        /// The CloudEvent id.
        event_id: String,
    },
}

/// Asks rollgate for an upgrade.
#[async_trait::async_trait]
pub trait Submitter: Send + Sync {
    /// Hands `request` over.
    async fn submit(&self, request: &DetectionRequest) -> Result<Submitted, String>;
}

/// `POST /v1/detections`.
pub struct HttpSubmitter {
    /// rollgate's base URL.
    pub url: String,
    /// The API token (read from a file; never logged).
    pub token: String,
    /// The client, with its timeout.
    pub http: reqwest::Client,
}

#[async_trait::async_trait]
impl Submitter for HttpSubmitter {
    async fn submit(&self, request: &DetectionRequest) -> Result<Submitted, String> {
        let url = format!("{}/v1/detections", self.url);
        let response = self
            .http
            .post(&url)
            .bearer_auth(&self.token)
            .json(&request.to_json())
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        let status = response.status().as_u16();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        let field = |name: &str| body[name].as_str().unwrap_or_default().to_owned();
        match status {
            202 => Ok(Submitted::Created {
                run_id: field("run_id"),
            }),
            200 => Ok(Submitted::InFlight {
                run_id: field("run_id"),
            }),
            409 => Ok(Submitted::Held {
                message: field("message"),
            }),
            other => Err(format!("{url}: HTTP {other}: {}", field("message"))),
        }
    }
}

/// A `rollgate.detection.v1` CloudEvent on the exchange.
pub struct AmqpSubmitter(pub Arc<dyn Queue>);

#[async_trait::async_trait]
impl Submitter for AmqpSubmitter {
    async fn submit(&self, request: &DetectionRequest) -> Result<Submitted, String> {
        let data = EventData::Detection {
            run_id: None,
            request: request.clone(),
        };
        let event = CloudEvent::new(&data, "rollgate-detect", Utc::now());
        self.0
            .publish(Outgoing::event(&event, data.event_type()))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Submitted::Published { event_id: event.id })
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
    let facts = sources
        .cluster
        .facts()
        .await
        .map_err(|e| DetectError::Cluster(e.to_string()))?;
    let api_server = sources
        .cluster
        .api_server_version()
        .await
        .map_err(|e| DetectError::Cluster(e.to_string()))?;
    let (running, behind) = detect::running(&facts, api_server)?;
    let plane = facts
        .nodes
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .ok_or(RunningError::NoControlPlane)?;
    let target = NodeTarget {
        name: plane.name.clone(),
        address: plane.address.clone(),
    };
    let ssh_error = |error: String| DetectError::Ssh {
        node: plane.name.clone(),
        error,
    };
    let out = sources
        .exec
        .run_script(&target, NODE_SCRIPT, &["--available".to_owned()])
        .await
        .map_err(|e| ssh_error(e.to_string()))?;
    if out.status != Some(0) {
        return Err(ssh_error(format!(
            "the node script exited with {:?}: {}",
            out.status,
            out.stderr.trim()
        )));
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
            (DetectError::Cluster("x".into()), 3),
            (DetectError::Running(RunningError::NoControlPlane), 3),
            (
                DetectError::Ssh {
                    node: "cp".into(),
                    error: "x".into(),
                },
                3,
            ),
            (
                DetectError::Repo(RepoError {
                    url: "u".into(),
                    error: "x".into(),
                }),
                3,
            ),
            (DetectError::Submit("x".into()), 4),
            (DetectError::Push("x".into()), 5),
        ];
        for (error, code) in cases {
            assert_eq!(error.exit_code(), code, "{error}");
        }
    }
}
