//! `rollgate detect`, what the daily CronJob runs: read the running versions from the
//! Kubernetes API, the patches the control plane's package repository offers over SSH, and
//! (when no patch comes first) whether the next minor's repository carries a release;
//! decide (`workflows::detect::plan::decide`); with reboots asked for, read every node's reboot
//! sentinel over SSH; push the result to a Pushgateway; ask rollgate for the upgrade and
//! the reboots over HTTP or AMQP unless it is a dry run.

pub mod plan;

use chrono::Utc;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::domain::distribution::Distribution;
use crate::domain::event::{DetectionRequest, StageSelection};
use crate::error_chain;
use crate::ports::{
    ClusterError, ClusterRead, Failure, MetricsPush, NodeExec, NodeTarget, PackageRepository,
    ReleaseChannels, RepoError, Submitted, Submitter,
};
use crate::workflows::k8s_upgrade::NODE_SCRIPT;
use crate::workflows::k8s_upgrade::plan::{ClusterFacts, Role};
use crate::workflows::node_cycle::driver::NodeDriver;
use crate::workflows::node_reboot::RebootRequest;
use crate::workflows::node_reboot::sentinel;
use plan::{Decision, Findings, NextMinor, RunningError, madison_releases, minor_of, next_minor};

/// Where detection reads from.
pub struct Sources {
    /// Nodes and their versions.
    pub cluster: Arc<dyn ClusterRead>,
    /// SSH to the control plane.
    pub exec: Arc<dyn NodeExec>,
    /// The package repository (kubeadm).
    pub repo: Arc<dyn PackageRepository>,
    /// On k3s and RKE2: the distribution and its channel server, read in place of the
    /// control plane's packages and the repository.
    pub channels: Option<(Distribution, Arc<dyn ReleaseChannels>)>,
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
    /// The control plane runs an OS the node script does not serve.
    #[error("{node} {says}")]
    UnsupportedOs {
        /// The control-plane node.
        node: String,
        /// What the node script said of it: its OS, its package manager, what it serves.
        says: String,
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
    /// Some nodes' reboot sentinels could not be read (the others' were acted on).
    #[error("the reboot sentinel could not be read on {}", .0.iter().map(|(n, why)| format!("{n} ({why})")).collect::<Vec<_>>().join(", "))]
    Sentinels(BTreeMap<String, String>),
}

impl DetectError {
    /// 3: the facts could not be read, nothing was pushed or asked for; 4: rollgate did
    /// not take the request; 5: the metrics were not pushed.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Cluster(_)
            | Self::Running(_)
            | Self::Ssh { .. }
            | Self::UnsupportedOs { .. }
            | Self::Repo(_)
            | Self::Sentinels(_) => 3,
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

/// How reboot detection reads a node's sentinel.
#[derive(Debug, Clone)]
pub struct RebootCheck {
    /// The script that tells whether a node needs a reboot: exit 0 yes, 1 no.
    pub sentinel_script: String,
    /// Whether control planes are read too (`reboot.control_planes`).
    pub control_planes: bool,
}

/// What reboot detection found and did.
#[derive(Debug, Clone, Serialize)]
pub struct RebootReport {
    /// The nodes whose sentinel is set.
    pub required: Vec<String>,
    /// The nodes whose sentinel is not set.
    pub clear: Vec<String>,
    /// The nodes whose sentinel could not be read, with why.
    pub unreadable: BTreeMap<String, String>,
    /// What came of the reboot request; `None` when nothing was asked for.
    pub submitted: Option<Submitted>,
}

/// Reads the sentinel of every node `facts` list (control planes too when allowed), side
/// by side: whether each is set, and why each that could not be read was not.
async fn reboot_findings(
    sources: &Sources,
    facts: &ClusterFacts,
    check: &RebootCheck,
) -> (BTreeMap<String, bool>, BTreeMap<String, String>) {
    let reads = facts
        .nodes
        .iter()
        .filter(|n| n.role == Role::Worker || check.control_planes)
        .map(|n| {
            let target = NodeTarget::from(n);
            async move {
                let set = sentinel(&*sources.exec, &target, &check.sentinel_script).await;
                (target.name, set)
            }
        });
    let mut required = BTreeMap::new();
    let mut unreadable = BTreeMap::new();
    for (node, set) in futures_util::future::join_all(reads).await {
        match set {
            Ok(set) => {
                required.insert(node, set);
            }
            Err(e) => {
                unreadable.insert(node, error_chain(&e));
            }
        }
    }
    (required, unreadable)
}

/// Reads the versions of the cluster `facts` show.
pub async fn findings(sources: &Sources, facts: &ClusterFacts) -> Result<Findings, DetectError> {
    let api_server = sources.cluster.api_server_version().await?;
    let (running, behind) = plan::running(facts, api_server)?;
    if let Some((distribution, channels)) = &sources.channels {
        return channel_findings(&**channels, *distribution, running, behind).await;
    }
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
    let args = NodeDriver::kubeadm().on_node(plane, vec!["--available".to_owned()]);
    let out = sources
        .exec
        .run_script(&target, NODE_SCRIPT, &args)
        .await
        .map_err(|e| ssh_error(Failure::caused("the node script did not run", e)))?;
    if out.status == Some(crate::workflows::k8s_upgrade::UNSUPPORTED_OS) {
        let said = out.stderr.lines().last().unwrap_or_default();
        return Err(DetectError::UnsupportedOs {
            node: plane.name.clone(),
            says: said.trim_start_matches("node-upgrade: ").to_owned(),
        });
    }
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
    let format = plan::repo_format(&out.stdout);
    // A patch (or a part-done rollout) comes first: the next minor need not be read.
    let patch_first = latest_patch.is_some_and(|l| l > running) || !behind.is_empty();
    let next_minor = if patch_first {
        NextMinor::NotChecked
    } else {
        let next = next_minor(running);
        if sources.repo.published(next, format).await? {
            match sources.repo.releases(next, format).await?.last() {
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
        builds: Default::default(),
    })
}

/// What a k3s or RKE2 channel server offers a cluster at `running`: the latest release of
/// its minor's channel (`v1.34`), and the next minor's channel when no patch comes first.
async fn channel_findings(
    channels: &dyn ReleaseChannels,
    distribution: Distribution,
    running: crate::domain::version::Version,
    behind: Vec<String>,
) -> Result<Findings, DetectError> {
    let listed = channels.channels().await?;
    let refused = |why: String| {
        DetectError::Repo(RepoError {
            what: "channel server",
            url: format!("of {distribution}"),
            failure: Failure::new(why),
        })
    };
    let mut builds = BTreeMap::new();
    let patch = plan::channel_latest(&listed, distribution, minor_of(running)).map_err(refused)?;
    builds.extend(patch.map(|r| (r.version.to_string(), r.build)));
    let latest_patch = patch.map(|r| r.version);
    let patch_first = latest_patch.is_some_and(|l| l > running) || !behind.is_empty();
    let next_minor = if patch_first {
        NextMinor::NotChecked
    } else {
        match plan::channel_latest(&listed, distribution, next_minor(running)).map_err(refused)? {
            Some(release) => {
                builds.insert(release.version.to_string(), release.build);
                NextMinor::Released(release.version)
            }
            None => NextMinor::NotPublished,
        }
    };
    Ok(Findings {
        running,
        behind,
        latest_patch,
        next_minor,
        builds,
    })
}

/// What one detection found and did: the upgrade part when its facts could be read, the
/// reboot part when it was asked for.
#[derive(Debug, Clone, Serialize)]
pub struct Detected {
    /// Versions, decision, push and upgrade request.
    #[serde(flatten)]
    pub upgrade: Option<Report>,
    /// Why the upgrade check did not run today, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade_skipped: Option<String>,
    /// Sentinels and reboot request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reboots: Option<RebootReport>,
}

/// Finds, decides, reads the reboot sentinels (with `reboots`), pushes the metrics (when
/// a Pushgateway is given and the upgrade part could be read: a failed check pushes
/// nothing, so its last-run timestamp ages) and asks for the upgrade and the reboots
/// (when a submitter is given: not in a dry run). What was found comes back also when a
/// later part failed; the error is the worst: not taken (4), not read (3), not pushed (5).
pub async fn detect(
    sources: &Sources,
    stages: &StageSelection,
    upgrades: Upgrades,
    reboots: Option<&RebootCheck>,
    push: Option<&dyn MetricsPush>,
    submit: Option<&dyn Submitter>,
) -> (Option<Detected>, Option<DetectError>) {
    let facts = match sources.cluster.facts().await {
        Ok(f) => f,
        Err(e) => return (None, Some(DetectError::Cluster(e))),
    };
    let mut read_error = None;
    let mut reboot_part = None;
    if let Some(check) = reboots {
        let (required, unreadable) = reboot_findings(sources, &facts, check).await;
        if !unreadable.is_empty() {
            read_error = Some(DetectError::Sentinels(unreadable.clone()));
        }
        reboot_part = Some((required, unreadable));
    }
    let upgrade_part = match &upgrades {
        Upgrades::NotToday(_) => None,
        Upgrades::Check => match findings(sources, &facts).await {
            Ok(f) => {
                let decision = plan::decide(&f);
                Some((f, decision))
            }
            Err(e) => {
                read_error = Some(e);
                None
            }
        },
    };
    if upgrade_part.is_none() && reboot_part.is_none() {
        return (None, read_error);
    }
    // Each part replaces its own group, so that a day that checks only the sentinels
    // leaves the upgrade check's metrics (and its last-run time) as they were.
    let mut push_error = None;
    let mut pushed = false;
    if let Some(push) = push {
        let mut parts = Vec::new();
        if let Some((_, decision)) = &upgrade_part {
            let text = plan::pushgateway_text(decision, Utc::now().timestamp());
            parts.push((UPGRADE_GROUP, text, true));
        }
        if let Some((required, _)) = &reboot_part {
            parts.push((REBOOT_GROUP, plan::reboot_text(required), false));
        }
        for (group, text, upgrade) in parts {
            match push.push(group, text).await {
                Ok(()) => pushed |= upgrade,
                Err(e) => push_error = Some(DetectError::Push(e)),
            }
        }
    }
    let mut submit_error = None;
    let mut submitted = None;
    if let (Some((found, Decision::Upgrade { kind, target, .. })), Some(submit)) =
        (&upgrade_part, submit)
    {
        let request = DetectionRequest {
            target_version: *target,
            kind: *kind,
            dry_run: false,
            stages: stages.clone(),
            build: found.builds.get(&target.to_string()).copied(),
        };
        match submit
            .submit(&super::k8s_upgrade::intake::DOOR, Arc::new(request))
            .await
        {
            Ok(s) => submitted = Some(s),
            Err(e) => submit_error = Some(DetectError::Submit(e)),
        }
    }
    let reboots = match reboot_part {
        None => None,
        Some((required, unreadable)) => {
            let (needing, clear): (Vec<_>, Vec<_>) = required.iter().partition(|(_, set)| **set);
            let needing: Vec<String> = needing.into_iter().map(|(n, _)| n.clone()).collect();
            let mut reboot_submitted = None;
            if let (false, Some(submit)) = (needing.is_empty(), submit) {
                let request = RebootRequest {
                    nodes: needing.clone(),
                    reason: Some("rollgate detect: the reboot sentinel is set".into()),
                    dry_run: false,
                };
                match submit
                    .submit(&super::node_reboot::intake::DOOR, Arc::new(request))
                    .await
                {
                    Ok(s) => reboot_submitted = Some(s),
                    Err(e) => submit_error = Some(DetectError::Submit(e)),
                }
            }
            Some(RebootReport {
                required: needing,
                clear: clear.into_iter().map(|(n, _)| n.clone()).collect(),
                unreadable,
                submitted: reboot_submitted,
            })
        }
    };
    let upgrade = upgrade_part.map(|(findings, decision)| Report {
        findings,
        decision,
        pushed,
        submitted,
    });
    let upgrade_skipped = match upgrades {
        Upgrades::NotToday(why) => Some(why),
        Upgrades::Check => None,
    };
    // Not taken is worse than not read, which is worse than not pushed.
    let error = submit_error.or(read_error).or(push_error);
    (
        Some(Detected {
            upgrade,
            upgrade_skipped,
            reboots,
        }),
        error,
    )
}

/// The Pushgateway group of the upgrade check: the job's own.
const UPGRADE_GROUP: &[(&str, &str)] = &[];
/// The Pushgateway group of the sentinels: `…/job/<job>/check/reboots`.
const REBOOT_GROUP: &[(&str, &str)] = &[("check", "reboots")];

/// Whether this detection checks for an upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrades {
    /// It does.
    Check,
    /// Not today (the upgrade check runs on other days): why, for the report.
    NotToday(String),
}

impl Upgrades {
    /// With `days` (none: every day), whether `now` is a day to check for upgrades.
    pub fn on(days: &[chrono::Weekday], now: chrono::DateTime<Utc>) -> Self {
        use chrono::Datelike;
        let today = now.weekday();
        if days.is_empty() || days.contains(&today) {
            return Self::Check;
        }
        let days: Vec<String> = days.iter().map(|d| d.to_string().to_lowercase()).collect();
        Self::NotToday(format!(
            "upgrades are checked on {} (--upgrades-on); today is {} (UTC)",
            days.join(", "),
            today.to_string().to_lowercase()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrades_are_checked_on_the_days_given_every_day_without() {
        use chrono::{TimeZone, Weekday};
        // 2026-12-06 is a Sunday.
        let sunday = Utc.with_ymd_and_hms(2026, 12, 6, 6, 0, 0).unwrap();
        let wednesday = Utc.with_ymd_and_hms(2026, 12, 9, 6, 0, 0).unwrap();
        let cases = [
            (vec![], wednesday, true),
            (vec![Weekday::Sun], sunday, true),
            (vec![Weekday::Sun], wednesday, false),
            (vec![Weekday::Mon, Weekday::Wed], wednesday, true),
        ];
        for (days, now, check) in cases {
            assert_eq!(
                Upgrades::on(&days, now) == Upgrades::Check,
                check,
                "{days:?} {now}"
            );
        }
        assert_eq!(
            Upgrades::on(&[Weekday::Sun], wednesday),
            Upgrades::NotToday(
                "upgrades are checked on sun (--upgrades-on); today is wed (UTC)".into()
            )
        );
    }

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
                    what: "package repository",
                    url: "u".into(),
                    failure: Failure::new("x"),
                }),
                3,
            ),
            (DetectError::Submit(Failure::new("x")), 4),
            (DetectError::Push(Failure::new("x")), 5),
            (
                DetectError::Sentinels([("w1".to_owned(), "x".to_owned())].into()),
                3,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(error.exit_code(), code, "{error}");
        }
    }
}
