//! Gate verdicts: may a risky step (a drain, an etcd restart) go ahead now?
//!
//! Two sources: a Prometheus query for firing gate alerts, and the alert board fed by
//! Alertmanager webhooks. Closed when either shows a blocking alert; unknown when
//! Prometheus cannot answer. Unknown is treated as closed: fail closed, always.

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::alert::{Alert, AlertStatus};

/// Where a blocking alert was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The Prometheus query.
    Prometheus,
    /// The board of Alertmanager notifications.
    Alertmanager,
}

impl Source {
    /// Its name in reports and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Prometheus => "prometheus",
            Self::Alertmanager => "alertmanager",
        }
    }
}

/// An alert that keeps the gate closed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
pub struct Blocker {
    /// The alert name.
    pub name: String,
    /// The alert's labels.
    pub labels: BTreeMap<String, String>,
    /// Where it was seen.
    pub source: Source,
    /// Since when it fires, when the source says.
    pub since: Option<DateTime<Utc>>,
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = self.source.name();
        let detail: Vec<String> = self
            .labels
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "alertname" | "alertstate" | "upgrade_gate" | "__name__"
                )
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if detail.is_empty() {
            write!(f, "{} ({source})", self.name)
        } else {
            write!(f, "{} {{{}}} ({source})", self.name, detail.join(", "))
        }
    }
}

/// The gate's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Verdict {
    /// No blocking alert, and every source answered.
    Open,
    /// At least one blocking alert.
    Closed {
        /// The blocking alerts.
        blockers: Vec<Blocker>,
    },
    /// A source could not answer and nothing else closes the gate: treated as closed.
    Unknown {
        /// Why, in words; recorded in the run's history.
        reason: String,
    },
}

impl Verdict {
    /// `open`, `closed` or `unknown`, as the API and the metrics name it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed { .. } => "closed",
            Self::Unknown { .. } => "unknown",
        }
    }

    /// Only an open gate lets a risky step go ahead.
    pub fn is_open(&self) -> bool {
        matches!(self, Self::Open)
    }
    /// The reasons the gate is not open, one per line of a notification.
    pub fn reasons(&self) -> Vec<String> {
        match self {
            Self::Open => Vec::new(),
            Self::Closed { blockers } => blockers.iter().map(ToString::to_string).collect(),
            Self::Unknown { reason } => vec![format!("gate unknown: {reason}")],
        }
    }
}

/// The label name and value of matcher `raw` split at its operator: the name checked,
/// the value unquoted.
pub(crate) fn label_and_value(
    raw: &str,
    name: &str,
    value: &str,
) -> Result<(String, String), String> {
    let name = name.trim();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(format!("{raw:?}: {name:?} is not a label name"));
    }
    Ok((name.to_owned(), value.trim().trim_matches('"').to_owned()))
}

/// A label matcher for the board: `name=value` or `name!=value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    name: String,
    value: String,
    equal: bool,
}

impl Matcher {
    /// Parses `name=value` or `name!=value`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (name, value, equal) = match raw.split_once("!=") {
            Some((n, v)) => (n, v, false),
            None => match raw.split_once('=') {
                Some((n, v)) => (n, v, true),
                None => {
                    return Err(format!(
                        "{raw:?} is not a matcher like upgrade_gate=true or severity!=info"
                    ));
                }
            },
        };
        let (name, value) = label_and_value(raw, name, value)?;
        Ok(Self { name, value, equal })
    }
    /// The matcher in Alertmanager's filter syntax: `name="value"` or `name!="value"`.
    pub fn to_alertmanager(&self) -> String {
        let op = if self.equal { "=" } else { "!=" };
        format!("{}{op}{:?}", self.name, self.value)
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.name).map_or("", String::as_str);
        (value == self.value) == self.equal
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.equal { "=" } else { "!=" };
        write!(f, "{}{op}{}", self.name, self.value)
    }
}

/// What counts as blocking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Board alerts count only when they match every matcher.
    pub board_matchers: Vec<Matcher>,
    /// Alert names that never block (alerts rollgate's own drains cause).
    pub exclude_alerts: BTreeSet<String>,
    /// Whether Prometheus alerts in state `pending` block too.
    pub count_pending: bool,
    /// The kind of run asking (`k8s-upgrade`, `etcd-roll`), if a run asks. An alert whose
    /// `remedy` label names that kind is what such a run exists to clear (a version skew
    /// left behind is cleared by an upgrade), so it does not hold it.
    pub asked_by: Option<String>,
}

/// The label that names the kind of run an alert is cleared by.
pub const REMEDY_LABEL: &str = "remedy";

impl Policy {
    /// The same policy, asked by a run of kind `kind`.
    pub fn asked_by(&self, kind: &str) -> Self {
        Self {
            asked_by: Some(kind.to_owned()),
            ..self.clone()
        }
    }

    /// Whether an alert called `name` with `labels` may block at all: not excluded by
    /// name, and not one the asking run is the remedy for.
    fn may_block(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let remedied = self
            .asked_by
            .as_deref()
            .is_some_and(|kind| remedied_by(labels, kind));
        !self.exclude_alerts.contains(name) && !remedied
    }
}

/// Whether an alert with `labels` names runs of `kind` as its remedy: it does not hold them.
fn remedied_by(labels: &BTreeMap<String, String>, kind: &str) -> bool {
    labels.get(REMEDY_LABEL).is_some_and(|r| r == kind)
}

/// One series the Prometheus query returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromSeries {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
}

/// What Prometheus answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromReading {
    /// The series returned; empty means no blocking alert ("no data" = open).
    Series(Vec<PromSeries>),
    /// No usable answer: error, timeout, a non-vector result, or no Prometheus configured.
    Failed(String),
}

/// What the Alertmanager side says.
#[derive(Debug, Clone, PartialEq)]
pub enum AmReading {
    /// The board of webhooks alone (no Alertmanager to ask).
    Board(Vec<Alert>),
    /// Alertmanager's own list of active, unsilenced, uninhibited alerts. It supersedes
    /// the board: a board alert it no longer lists (resolved, silenced, inhibited; its
    /// webhook lost) does not block, one the webhooks missed does.
    Pulled(Vec<Alert>),
    /// Alertmanager could not be asked: the board's alerts still block, and with none the
    /// verdict is unknown.
    Failed {
        /// The board of webhooks.
        board: Vec<Alert>,
        /// Why Alertmanager could not be asked.
        error: String,
    },
}

/// The verdict from both sources at `now`.
pub fn evaluate(
    prom: &PromReading,
    am: &AmReading,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Verdict {
    let mut blockers: BTreeSet<Blocker> = BTreeSet::new();
    if let PromReading::Series(series) = prom {
        blockers.extend(prom_blockers(series, policy));
    }
    let alerts = match am {
        AmReading::Board(alerts) | AmReading::Pulled(alerts) => alerts,
        AmReading::Failed { board, .. } => board,
    };
    for alert in alerts {
        let live = alert.status == AlertStatus::Firing && alert.ends_at.is_none_or(|end| end > now);
        if live
            && policy.may_block(alert.name(), &alert.labels)
            && policy
                .board_matchers
                .iter()
                .all(|m| m.matches(&alert.labels))
        {
            blockers.insert(Blocker {
                name: alert.name().to_owned(),
                labels: alert.labels.clone(),
                source: Source::Alertmanager,
                since: Some(alert.starts_at),
            });
        }
    }
    if !blockers.is_empty() {
        return Verdict::Closed {
            blockers: blockers.into_iter().collect(),
        };
    }
    match unreadable(prom, am) {
        None => Verdict::Open,
        Some(reason) => Verdict::Unknown { reason },
    }
}

/// What the gate's one verdict means for a run of `kind`: a blocker that names `kind` as
/// its remedy does not hold it; with no other blocker, the sources that could not be read
/// (`unreadable`) make it unknown, as they made the verdict before its blockers did.
pub fn verdict_for(verdict: &Verdict, kind: &str, unreadable: Option<&str>) -> Verdict {
    let Verdict::Closed { blockers } = verdict else {
        return verdict.clone();
    };
    let holding: Vec<Blocker> = blockers
        .iter()
        .filter(|b| !remedied_by(&b.labels, kind))
        .cloned()
        .collect();
    match (holding.is_empty(), unreadable) {
        (false, _) => Verdict::Closed { blockers: holding },
        (true, Some(reason)) => Verdict::Unknown {
            reason: reason.to_owned(),
        },
        (true, None) => Verdict::Open,
    }
}

/// Why the sources could not be read, if any could not: the reason of an unknown verdict.
pub fn unreadable(prom: &PromReading, am: &AmReading) -> Option<String> {
    let failures: Vec<&str> = [
        match prom {
            PromReading::Failed(reason) => Some(reason.as_str()),
            PromReading::Series(_) => None,
        },
        match am {
            AmReading::Failed { error, .. } => Some(error.as_str()),
            _ => None,
        },
    ]
    .into_iter()
    .flatten()
    .collect();
    (!failures.is_empty()).then(|| failures.join("; "))
}

/// The verdict of a quiet-period query: any series means a gate alert fired within the
/// period; no Prometheus answer is unknown.
pub fn quiet_period(prom: &PromReading, policy: &Policy) -> Verdict {
    match prom {
        PromReading::Failed(reason) => Verdict::Unknown {
            reason: reason.clone(),
        },
        PromReading::Series(series) => {
            let relaxed = Policy {
                count_pending: true,
                ..policy.clone()
            };
            let blockers: Vec<Blocker> = prom_blockers(series, &relaxed).collect();
            if blockers.is_empty() {
                Verdict::Open
            } else {
                Verdict::Closed { blockers }
            }
        }
    }
}

fn prom_blockers<'a>(
    series: &'a [PromSeries],
    policy: &'a Policy,
) -> impl Iterator<Item = Blocker> + 'a {
    series.iter().filter_map(move |s| {
        let name = s.labels.get("alertname").cloned().unwrap_or_else(|| {
            s.labels
                .get("__name__")
                .cloned()
                .unwrap_or_else(|| "unnamed series".into())
        });
        let pending = s.labels.get("alertstate").is_some_and(|st| st == "pending");
        if !policy.may_block(&name, &s.labels) || (pending && !policy.count_pending) {
            return None;
        }
        Some(Blocker {
            name,
            labels: s.labels.clone(),
            source: Source::Prometheus,
            since: None,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).single().unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn series(name: &str, state: &str) -> PromSeries {
        PromSeries {
            labels: labels(&[
                ("alertname", name),
                ("alertstate", state),
                ("upgrade_gate", "true"),
            ]),
        }
    }

    fn board_alert(name: &str, status: AlertStatus, ends: Option<i64>, gate: &str) -> Alert {
        Alert {
            fingerprint: format!("fp{name}"),
            status,
            labels: labels(&[("alertname", name), ("upgrade_gate", gate)]),
            annotations: BTreeMap::new(),
            starts_at: t(-60),
            ends_at: ends.map(t),
        }
    }

    fn policy() -> Policy {
        Policy {
            board_matchers: vec![Matcher::parse("upgrade_gate=true").unwrap()],
            exclude_alerts: ["KubePodNotReadyDuringDrain".to_owned()].into(),
            count_pending: false,
            asked_by: None,
        }
    }

    fn names(v: &Verdict) -> Vec<(String, Source)> {
        match v {
            Verdict::Closed { blockers } => blockers
                .iter()
                .map(|b| (b.name.clone(), b.source))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// name, Prometheus reading, board, expected verdict, expected blockers.
    type Case = (
        &'static str,
        PromReading,
        Vec<Alert>,
        &'static str,
        Vec<(&'static str, Source)>,
    );

    #[test]
    fn verdict_table() {
        use AlertStatus::{Firing, Resolved};
        use Source::{Alertmanager as Am, Prometheus as Prom};
        let ok = |s: Vec<PromSeries>| PromReading::Series(s);
        let failed = PromReading::Failed("connection refused".into());
        let cases: Vec<Case> = vec![
            ("nothing anywhere", ok(vec![]), vec![], "open", vec![]),
            (
                "prometheus firing",
                ok(vec![series("NodeNotReady", "firing")]),
                vec![],
                "closed",
                vec![("NodeNotReady", Prom)],
            ),
            (
                "pending ignored by default",
                ok(vec![series("NodeNotReady", "pending")]),
                vec![],
                "open",
                vec![],
            ),
            (
                "excluded name",
                ok(vec![series("KubePodNotReadyDuringDrain", "firing")]),
                vec![],
                "open",
                vec![],
            ),
            (
                "board firing",
                ok(vec![]),
                vec![board_alert("EtcdNoLeader", Firing, None, "true")],
                "closed",
                vec![("EtcdNoLeader", Am)],
            ),
            (
                "board resolved",
                ok(vec![]),
                vec![board_alert("EtcdNoLeader", Resolved, Some(-1), "true")],
                "open",
                vec![],
            ),
            (
                "board expired at endsAt",
                ok(vec![]),
                vec![board_alert("EtcdNoLeader", Firing, Some(-1), "true")],
                "open",
                vec![],
            ),
            (
                "board endsAt ahead",
                ok(vec![]),
                vec![board_alert("EtcdNoLeader", Firing, Some(60), "true")],
                "closed",
                vec![("EtcdNoLeader", Am)],
            ),
            (
                "board not matching",
                ok(vec![]),
                vec![board_alert("Watchdog", Firing, None, "false")],
                "open",
                vec![],
            ),
            (
                "prometheus down, board quiet",
                failed.clone(),
                vec![],
                "unknown",
                vec![],
            ),
            (
                "prometheus down, board firing",
                failed.clone(),
                vec![board_alert("EtcdNoLeader", Firing, None, "true")],
                "closed",
                vec![("EtcdNoLeader", Am)],
            ),
            (
                "both sources",
                ok(vec![series("K8sVersionSkew", "firing")]),
                vec![board_alert("EtcdNoLeader", Firing, None, "true")],
                "closed",
                vec![("EtcdNoLeader", Am), ("K8sVersionSkew", Prom)],
            ),
        ];
        for (name, prom, board, want, blockers) in cases {
            let v = evaluate(&prom, &AmReading::Board(board), t(0), &policy());
            let got = match &v {
                Verdict::Open => "open",
                Verdict::Closed { .. } => "closed",
                Verdict::Unknown { .. } => "unknown",
            };
            assert_eq!(got, want, "{name}: {v:?}");
            let want: Vec<(String, Source)> = blockers
                .into_iter()
                .map(|(n, s)| (n.to_owned(), s))
                .collect();
            assert_eq!(names(&v), want, "{name}");
            assert_eq!(v.is_open(), want.is_empty() && got == "open", "{name}");
        }
    }

    #[test]
    fn alertmanager_pulled_supersedes_the_board_and_its_failure_is_unknown() {
        use AlertStatus::Firing;
        let firing = |name: &str| board_alert(name, Firing, None, "true");
        let quiet = PromReading::Series(vec![]);
        let down = PromReading::Failed("prometheus down".into());
        // (case, Prometheus, Alertmanager side, verdict, blockers)
        let cases: Vec<(&str, &PromReading, AmReading, &str, Vec<&str>)> = vec![
            (
                "a board alert Alertmanager no longer lists (silenced, resolved, webhook lost)",
                &quiet,
                AmReading::Pulled(vec![]),
                "open",
                vec![],
            ),
            (
                "an active alert the webhooks missed",
                &quiet,
                AmReading::Pulled(vec![firing("EtcdNoLeader")]),
                "closed",
                vec!["EtcdNoLeader"],
            ),
            (
                "pulled alerts meet the matchers too",
                &quiet,
                AmReading::Pulled(vec![board_alert("Watchdog", Firing, None, "false")]),
                "open",
                vec![],
            ),
            (
                "Alertmanager down, board quiet",
                &quiet,
                AmReading::Failed {
                    board: vec![],
                    error: "Alertmanager at http://am: connection refused".into(),
                },
                "unknown",
                vec![],
            ),
            (
                "Alertmanager down, the board still blocks",
                &quiet,
                AmReading::Failed {
                    board: vec![firing("EtcdNoLeader")],
                    error: "refused".into(),
                },
                "closed",
                vec!["EtcdNoLeader"],
            ),
            (
                "both down: both reasons",
                &down,
                AmReading::Failed {
                    board: vec![],
                    error: "am down".into(),
                },
                "unknown",
                vec![],
            ),
        ];
        for (name, prom, am, want, blockers) in cases {
            let v = evaluate(prom, &am, t(0), &policy());
            let got = match &v {
                Verdict::Open => "open",
                Verdict::Closed { .. } => "closed",
                Verdict::Unknown { .. } => "unknown",
            };
            assert_eq!(got, want, "{name}: {v:?}");
            let names: Vec<String> = names(&v).into_iter().map(|(n, _)| n).collect();
            assert_eq!(names, blockers, "{name}");
            if let Verdict::Unknown { reason } = &v
                && name.starts_with("both")
            {
                assert_eq!(reason, "prometheus down; am down");
            }
        }
    }

    #[test]
    fn matchers_read_as_alertmanager_filters() {
        assert_eq!(
            Matcher::parse("upgrade_gate=true")
                .unwrap()
                .to_alertmanager(),
            r#"upgrade_gate="true""#
        );
        assert_eq!(
            Matcher::parse("severity!=info").unwrap().to_alertmanager(),
            r#"severity!="info""#
        );
    }

    #[test]
    fn pending_counts_when_asked() {
        let policy = Policy {
            count_pending: true,
            ..policy()
        };
        let v = evaluate(
            &PromReading::Series(vec![series("NodeNotReady", "pending")]),
            &AmReading::Board(Vec::new()),
            t(0),
            &policy,
        );
        assert!(!v.is_open());
    }

    #[test]
    fn a_runs_answer_comes_from_the_one_verdict() {
        let blocker = |name: &str, remedy: Option<&str>| {
            let mut labels = BTreeMap::from([("alertname".to_owned(), name.to_owned())]);
            if let Some(r) = remedy {
                labels.insert(REMEDY_LABEL.into(), r.into());
            }
            Blocker {
                name: name.into(),
                labels,
                source: Source::Alertmanager,
                since: None,
            }
        };
        let closed = |b: Vec<Blocker>| Verdict::Closed { blockers: b };
        let skew = || blocker("K8sVersionSkew", Some("k8s-upgrade"));
        let down = || blocker("KubeNodeNotReady", None);
        // (the gate's verdict, asked by, unreadable sources, the run's answer)
        let cases = [
            (Verdict::Open, "k8s-upgrade", None, Verdict::Open),
            (
                closed(vec![down()]),
                "k8s-upgrade",
                None,
                closed(vec![down()]),
            ),
            (closed(vec![skew()]), "k8s-upgrade", None, Verdict::Open),
            (
                closed(vec![skew()]),
                "etcd-roll",
                None,
                closed(vec![skew()]),
            ),
            (
                closed(vec![skew(), down()]),
                "k8s-upgrade",
                None,
                closed(vec![down()]),
            ),
            (
                closed(vec![skew()]),
                "k8s-upgrade",
                Some("Prometheus: down"),
                Verdict::Unknown {
                    reason: "Prometheus: down".into(),
                },
            ),
            (
                Verdict::Unknown { reason: "x".into() },
                "k8s-upgrade",
                Some("x"),
                Verdict::Unknown { reason: "x".into() },
            ),
        ];
        for (verdict, kind, unreadable, want) in cases {
            assert_eq!(
                verdict_for(&verdict, kind, unreadable),
                want,
                "{verdict:?} for {kind}"
            );
        }
    }

    #[test]
    fn an_alert_does_not_hold_the_run_that_is_its_remedy() {
        let skew = || {
            let mut s = series("K8sVersionSkew", "firing");
            s.labels.insert(REMEDY_LABEL.into(), "k8s-upgrade".into());
            s
        };
        let mut board_skew = board_alert("K8sVersionSkew", AlertStatus::Firing, None, "true");
        board_skew
            .labels
            .insert(REMEDY_LABEL.into(), "k8s-upgrade".into());
        // (asked by, Prometheus series, board, blocks)
        let cases = [
            (None, vec![skew()], vec![], true),
            (Some("k8s-upgrade"), vec![skew()], vec![], false),
            (Some("etcd-roll"), vec![skew()], vec![], true),
            (Some("k8s-upgrade"), vec![], vec![board_skew.clone()], false),
            (Some("etcd-roll"), vec![], vec![board_skew.clone()], true),
            (
                Some("k8s-upgrade"),
                vec![skew(), series("EtcdNoLeader", "firing")],
                vec![],
                true,
            ),
        ];
        for (asked, prom, board, blocks) in cases {
            let policy = match asked {
                Some(kind) => policy().asked_by(kind),
                None => policy(),
            };
            let prom = PromReading::Series(prom);
            let v = evaluate(&prom, &AmReading::Board(board.clone()), t(0), &policy);
            assert_eq!(!v.is_open(), blocks, "{asked:?}: {v:?}");
            assert_eq!(
                !quiet_period(&prom, &policy).is_open(),
                blocks && board.is_empty(),
                "quiet period, {asked:?}"
            );
        }
    }

    #[test]
    fn quiet_period_table() {
        assert_eq!(
            quiet_period(&PromReading::Series(vec![]), &policy()),
            Verdict::Open
        );
        let fired = quiet_period(
            &PromReading::Series(vec![PromSeries {
                labels: labels(&[("alertname", "NodeNotReady")]),
            }]),
            &policy(),
        );
        assert_eq!(
            names(&fired),
            vec![("NodeNotReady".to_owned(), Source::Prometheus)]
        );
        assert!(matches!(
            quiet_period(&PromReading::Failed("x".into()), &policy()),
            Verdict::Unknown { .. }
        ));
    }

    #[test]
    fn matchers_parse_and_match() {
        let eq = Matcher::parse("upgrade_gate=true").unwrap();
        let ne = Matcher::parse("severity!=info").unwrap();
        assert!(eq.matches(&labels(&[("upgrade_gate", "true")])));
        assert!(!eq.matches(&labels(&[])));
        assert!(ne.matches(&labels(&[("severity", "critical")])));
        assert!(ne.matches(&labels(&[])));
        assert!(!ne.matches(&labels(&[("severity", "info")])));
        for bad in ["nothing", "=x", "a b=c"] {
            assert!(Matcher::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn blockers_read_well() {
        let b = Blocker {
            name: "NodeNotReady".into(),
            labels: labels(&[
                ("alertname", "NodeNotReady"),
                ("node", "w2"),
                ("upgrade_gate", "true"),
            ]),
            source: Source::Prometheus,
            since: None,
        };
        assert_eq!(b.to_string(), "NodeNotReady {node=w2} (prometheus)");
    }
}
