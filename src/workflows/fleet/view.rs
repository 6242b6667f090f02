//! What one rollgate tells about its cluster (`GET /v1/fleet`), and whether an upstream's
//! answer lets a version go on downstream: plain data and a pure function.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::domain::version::Version;

/// A rollgate's view of its own cluster and of its upstreams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FleetView {
    /// This cluster's `fleet.name`.
    pub name: String,
    /// This rollgate's clock when it answered: soaks are measured on it, so that clocks
    /// that disagree between clusters do not shorten one.
    pub now: DateTime<Utc>,
    /// The versions the cluster runs, counted.
    pub versions: Versions,
    /// The last run of each kind (`k8s-upgrade`, `node-reboot`, `etcd-roll`).
    pub last_runs: BTreeMap<String, LastRun>,
    /// The gate now, and since when it has been quiet.
    pub gate: GateQuiet,
    /// How this rollgate sees its own upstreams (empty without `fleet.upstreams`).
    #[serde(default)]
    pub upstreams: Vec<UpstreamView>,
}

/// Versions the cluster runs: how many API servers and kubelets run each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Versions {
    /// `kube-apiserver` of each control plane, by version (`1.31.2`).
    pub api_server: BTreeMap<String, u32>,
    /// Each node's kubelet, by version.
    pub kubelet: BTreeMap<String, u32>,
    /// Why the versions could not be read, when they could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One run, as the fleet sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LastRun {
    /// The run's id.
    pub id: String,
    /// `succeeded`, `running`, `halted`…
    pub status: String,
    /// Its target version, if it has one.
    pub target: Option<String>,
    /// When it ended; none while it has not.
    pub ended_at: Option<DateTime<Utc>>,
}

/// The gate's verdict now, and the time since which no blocking alert has fired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GateQuiet {
    /// `open`, `closed` or `unknown`.
    pub verdict: String,
    /// Why it is not open, one line each.
    pub reasons: Vec<String>,
    /// The blocking alerts, each with since when it fires.
    pub blockers: Vec<FiringBlocker>,
    /// Since when no blocking alert has fired (kept in the store); none while one fires.
    pub quiet_since: Option<DateTime<Utc>>,
}

/// A blocking alert, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FiringBlocker {
    /// The alert's name.
    pub name: String,
    /// Since when it fires, when its source says.
    pub since: Option<DateTime<Utc>>,
}

/// How a rollgate sees one of its upstreams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UpstreamView {
    /// The upstream's name (`fleet.upstreams[].name`).
    pub name: String,
    /// Its rollgate's URL.
    pub url: String,
    /// The version last asked about: the target of the upgrade waiting on it, else the
    /// version this cluster runs.
    pub version: Option<String>,
    /// Whether that version may go on from it now.
    pub ready: bool,
    /// What holds it, one line each (`staging: soaking until …`).
    pub blockers: Vec<String>,
    /// When the soak ends, by the upstream's clock.
    pub soak_until: Option<DateTime<Utc>>,
    /// Seconds of soak left, by the upstream's clock.
    pub soak_remaining_secs: Option<u64>,
    /// When it was last asked.
    pub asked_at: DateTime<Utc>,
    /// Its answer, with its own upstreams; none when it could not be asked.
    #[schema(value_type = Option<Object>)]
    pub view: Option<Box<FleetView>>,
}

/// Whether a version may go on from one upstream, and what holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Every condition holds.
    pub ready: bool,
    /// What holds it, one line each, starting with the upstream's name.
    pub blockers: Vec<String>,
    /// When the soak ends, by the upstream's clock, once it has begun.
    pub soak_until: Option<DateTime<Utc>>,
    /// How much of it is left then.
    pub soak_remaining: Option<Duration>,
}

/// Whether `target` may go on from the upstream `name`, given its `answer` (or why it could
/// not be asked) and the `soak` it must have stayed quiet for. Ready when the upstream:
/// runs `target` or a later patch of its minor on every API server and kubelet; ended an
/// upgrade to such a version as succeeded; has had its gate open and quiet since then for
/// `soak` (the later of the two starts the soak); and answered. Measured on the upstream's
/// clock.
pub fn readiness(
    name: &str,
    target: Version,
    soak: Duration,
    answer: Result<&FleetView, &str>,
) -> Readiness {
    let view = match answer {
        Ok(view) => view,
        Err(why) => {
            return Readiness {
                ready: false,
                blockers: vec![format!("{name}: unreachable ({why})")],
                soak_until: None,
                soak_remaining: None,
            };
        }
    };
    let reaches = |v: &Version| v.major == target.major && v.minor == target.minor && *v >= target;
    let mut blockers = Vec::new();

    let versions: Vec<&String> = view
        .versions
        .api_server
        .keys()
        .chain(view.versions.kubelet.keys())
        .collect();
    let behind: Vec<String> = versions
        .iter()
        .filter(|v| !Version::parse(v.trim_start_matches('v')).is_ok_and(|v| reaches(&v)))
        .map(|v| v.to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if let Some(error) = &view.versions.error {
        blockers.push(format!("{name}: its versions cannot be read ({error})"));
    } else if versions.is_empty() {
        blockers.push(format!("{name}: tells no versions (no cluster configured)"));
    } else if !behind.is_empty() {
        blockers.push(format!("{name}: runs {}, not {target}", behind.join(", ")));
    }

    let upgrade = view.last_runs.get("k8s-upgrade");
    let ended = upgrade.and_then(|run| {
        let to = run.target.as_deref().and_then(|t| Version::parse(t).ok());
        (run.status == "succeeded" && to.is_some_and(|v| reaches(&v)))
            .then_some(run.ended_at)
            .flatten()
    });
    if ended.is_none() {
        blockers.push(match upgrade {
            Some(run) if run.ended_at.is_none() => format!(
                "{name}: its upgrade to {} is {}",
                run.target.as_deref().unwrap_or("?"),
                run.status
            ),
            Some(run) => format!(
                "{name}: its last upgrade (to {}) ended {}, not succeeded to {target}",
                run.target.as_deref().unwrap_or("?"),
                run.status
            ),
            None => format!("{name}: no upgrade to {target} on record"),
        });
    }

    match view.gate.verdict.as_str() {
        "open" => {}
        "closed" => {
            let by: Vec<String> = view
                .gate
                .blockers
                .iter()
                .map(|b| match b.since {
                    Some(since) => {
                        format!("{} since {}", b.name, since.format("%Y-%m-%dT%H:%M:%SZ"))
                    }
                    None => b.name.clone(),
                })
                .collect();
            blockers.push(format!(
                "{name}: gate closed by {}; the soak restarts when it clears",
                if by.is_empty() {
                    "a blocking alert".into()
                } else {
                    by.join(", ")
                }
            ));
        }
        _ => blockers.push(format!(
            "{name}: gate unknown ({})",
            view.gate.reasons.join("; ")
        )),
    }

    let (mut soak_until, mut soak_remaining) = (None, None);
    match (ended, view.gate.quiet_since) {
        (Some(ended), Some(quiet)) => {
            let until = ended.max(quiet)
                + chrono::Duration::from_std(soak).unwrap_or(chrono::Duration::MAX);
            soak_until = Some(until);
            let left = (until - view.now).to_std().unwrap_or(Duration::ZERO);
            soak_remaining = Some(left);
            if view.now < until && view.gate.verdict == "open" {
                blockers.push(format!(
                    "{name}: soaking until {}",
                    until.format("%Y-%m-%dT%H:%M:%SZ")
                ));
            }
        }
        (Some(_), None) if view.gate.verdict == "open" => {
            blockers.push(format!("{name}: its gate has no quiet time on record yet"));
        }
        _ => {}
    }
    Readiness {
        ready: blockers.is_empty(),
        blockers,
        soak_until,
        soak_remaining,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn view(now: i64, versions: &[&str], run: Option<(&str, &str, Option<i64>)>) -> FleetView {
        let count = |vs: &[&str]| {
            let mut m = BTreeMap::new();
            for v in vs {
                *m.entry((*v).to_owned()).or_insert(0) += 1;
            }
            m
        };
        FleetView {
            name: "staging".into(),
            now: at(now),
            versions: Versions {
                api_server: count(&versions[..1]),
                kubelet: count(versions),
                error: None,
            },
            last_runs: run
                .map(|(status, target, ended)| {
                    BTreeMap::from([(
                        "k8s-upgrade".to_owned(),
                        LastRun {
                            id: "r-1".into(),
                            status: status.into(),
                            target: Some(target.into()),
                            ended_at: ended.map(at),
                        },
                    )])
                })
                .unwrap_or_default(),
            gate: GateQuiet {
                verdict: "open".into(),
                reasons: Vec::new(),
                blockers: Vec::new(),
                quiet_since: Some(at(0)),
            },
            upstreams: Vec::new(),
        }
    }

    fn closed(mut v: FleetView, since: i64) -> FleetView {
        v.gate.verdict = "closed".into();
        v.gate.quiet_since = None;
        v.gate.blockers = vec![FiringBlocker {
            name: "KubePodCrashLooping".into(),
            since: Some(at(since)),
        }];
        v
    }

    fn quiet_since(mut v: FleetView, since: i64) -> FleetView {
        v.gate.quiet_since = Some(at(since));
        v
    }

    #[test]
    fn an_upstream_is_ready_once_it_ran_the_version_and_stayed_quiet_for_the_soak() {
        let target = Version::parse("1.31.2").unwrap();
        let soak = Duration::from_secs(100);
        let done = Some(("succeeded", "1.31.2", Some(50)));
        let cases: Vec<(FleetView, Result<(), &str>)> = vec![
            (view(150, &["1.31.2", "1.31.2"], done), Ok(())),
            // A later patch of the same minor counts.
            (
                view(200, &["1.31.4"], Some(("succeeded", "1.31.4", Some(60)))),
                Ok(()),
            ),
            (
                view(149, &["1.31.2"], done),
                Err("staging: soaking until 2027-01-15T08:02:30Z"),
            ),
            (
                view(400, &["1.30.4", "1.31.2"], done),
                Err("staging: runs 1.30.4, not 1.31.2"),
            ),
            (
                view(400, &["1.32.0"], Some(("succeeded", "1.32.0", Some(50)))),
                Err("staging: runs 1.32.0, not 1.31.2"),
            ),
            (
                view(400, &["1.31.2"], Some(("running", "1.31.2", None))),
                Err("staging: its upgrade to 1.31.2 is running"),
            ),
            (
                view(400, &["1.31.2"], Some(("halted", "1.31.2", Some(50)))),
                Err("staging: its last upgrade (to 1.31.2) ended halted, not succeeded to 1.31.2"),
            ),
            (
                view(400, &["1.31.2"], None),
                Err("staging: no upgrade to 1.31.2 on record"),
            ),
            (
                closed(view(400, &["1.31.2"], done), 300),
                Err(
                    "staging: gate closed by KubePodCrashLooping since 2027-01-15T08:05:00Z; the soak restarts when it clears",
                ),
            ),
            // A blocking alert that resolved at 250 restarts the soak from then.
            (
                quiet_since(view(300, &["1.31.2"], done), 250),
                Err("staging: soaking until 2027-01-15T08:05:50Z"),
            ),
            (quiet_since(view(350, &["1.31.2"], done), 250), Ok(())),
        ];
        for (i, (v, want)) in cases.into_iter().enumerate() {
            let got = readiness("staging", target, soak, Ok(&v));
            match want {
                Ok(()) => assert!(got.ready, "case {i}: {:?}", got.blockers),
                Err(blocker) => {
                    assert!(!got.ready, "case {i}");
                    assert!(
                        got.blockers.iter().any(|b| b == blocker),
                        "case {i}: want {blocker:?} in {:?}",
                        got.blockers
                    );
                }
            }
        }
    }

    #[test]
    fn an_upstream_that_cannot_be_asked_holds_the_version() {
        let target = Version::parse("1.31.2").unwrap();
        let got = readiness(
            "dev",
            target,
            Duration::from_secs(1),
            Err("connection refused"),
        );
        assert!(!got.ready);
        assert_eq!(got.blockers, ["dev: unreachable (connection refused)"]);
    }

    #[test]
    fn the_soak_is_measured_on_the_upstreams_clock() {
        let target = Version::parse("1.31.2").unwrap();
        let v = view(120, &["1.31.2"], Some(("succeeded", "1.31.2", Some(50))));
        let got = readiness("staging", target, Duration::from_secs(100), Ok(&v));
        assert_eq!(got.soak_until, Some(at(150)));
        assert_eq!(got.soak_remaining, Some(Duration::from_secs(30)));
    }
}
