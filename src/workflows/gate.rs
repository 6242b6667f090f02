//! The gate service: evaluates the verdict from Prometheus and the alert board, keeps the
//! last evaluation for `GET /v1/gates`, and executes the `gate` and `quiet-period` steps.

use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::domain::alert::AlertStatus;
use crate::domain::breaker;
use crate::domain::budget::UnhealthyLimit;
use crate::domain::check::{self, CheckRule, CheckVerdict, Measurement};
use crate::domain::engine::StepOutcome;
use crate::domain::gate::{self, AmReading, Policy, PromReading, PromSeries, Verdict};
use crate::domain::run::{Run, RunKind};
use crate::domain::sight::{self, Sight, SightReading, SightRules};
use crate::metrics::Metrics;
use crate::ports::{AlertSource, ClusterRead, MetricsSource, StepExecutor};
use crate::store::Store;

/// One source's part in an evaluation.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SourceReport {
    /// `ok`, `error` or `not configured`.
    pub state: String,
    /// What went wrong, when it did.
    pub error: Option<String>,
    /// Blocking alerts this source showed.
    pub blocking: usize,
    /// The query asked (Prometheus only).
    pub query: Option<String>,
}

/// A full evaluation, as `GET /v1/gates` shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct GateReport {
    /// The verdict.
    pub verdict: Verdict,
    /// The Prometheus query.
    pub prometheus: SourceReport,
    /// The Alertmanager board.
    pub alertmanager: SourceReport,
    /// Whether the gate can see: the watchdog alert and the gate's rule group.
    pub sight: Sight,
    /// The earliest time the wake may be delivered.
    pub evaluated_at: DateTime<Utc>,
    /// Why a source could not be read, if one could not (a run's answer is unknown for it
    /// when no blocker holds that run).
    #[serde(skip)]
    pub unreadable: Option<String>,
}

impl GateReport {
    /// The answer for a run of `kind`, from this one evaluation: the same verdict, but for
    /// the blockers the run is the remedy for.
    pub fn verdict_for(&self, kind: RunKind) -> Verdict {
        gate::verdict_for(&self.verdict, kind.name(), self.unreadable.as_deref())
    }
}

#[derive(Default)]
struct PromMemory {
    failures_in_a_row: u32,
    last_good: Option<Vec<PromSeries>>,
}

/// What the gate decides by: the part of the `gate` settings it reads (the configuration
/// gives it; the sources' addresses and credentials go to their adapters).
#[derive(Debug, Clone)]
pub struct GateRules {
    /// PromQL whose series are blocking alerts.
    pub query: String,
    /// Alerts still pending block too.
    pub count_pending: bool,
    /// Alert names that never block.
    pub exclude_alerts: Vec<String>,
    /// Which alerts on the webhook board block.
    pub board_matchers: Vec<crate::domain::gate::Matcher>,
    /// How often a held step re-checks the gate.
    pub poll_interval: Duration,
    /// PromQL for the pre-flight quiet period.
    pub quiet_query: String,
    /// Failed evaluations in a row before the verdict is unknown.
    pub failures_before_unknown: u32,
    /// What proves the gate can see.
    pub sight: SightRules,
}

/// The gate.
pub struct Gate {
    prometheus: Option<Arc<dyn MetricsSource>>,
    alertmanager: Option<Arc<dyn AlertSource>>,
    store: Store,
    metrics: Metrics,
    settings: GateRules,
    policy: Policy,
    memory: Mutex<PromMemory>,
    /// The last evaluation and the instant it began.
    last: Mutex<Option<(std::time::Instant, GateReport)>>,
    changes: tokio::sync::watch::Sender<Option<GateReport>>,
    board: tokio::sync::Notify,
    /// One evaluation at a time.
    evaluating: tokio::sync::Mutex<()>,
}

impl Gate {
    /// A gate over `prometheus` (if configured) and the board in `store`; with
    /// [`Gate::asking`], over Alertmanager's own list too.
    pub fn new(
        prometheus: Option<Arc<dyn MetricsSource>>,
        store: Store,
        metrics: Metrics,
        settings: GateRules,
    ) -> Self {
        let policy = Policy {
            board_matchers: settings.board_matchers.clone(),
            exclude_alerts: settings.exclude_alerts.iter().cloned().collect(),
            count_pending: settings.count_pending,
            asked_by: None,
        };
        Self {
            prometheus,
            alertmanager: None,
            store,
            metrics,
            settings,
            policy,
            memory: Mutex::new(PromMemory::default()),
            last: Mutex::new(None),
            changes: tokio::sync::watch::Sender::new(None),
            board: tokio::sync::Notify::new(),
            evaluating: tokio::sync::Mutex::new(()),
        }
    }

    /// The same gate, reading Alertmanager's active alerts at every evaluation.
    pub fn asking(mut self, alertmanager: Option<Arc<dyn AlertSource>>) -> Self {
        self.alertmanager = alertmanager;
        self
    }

    /// How often a held step re-checks.
    pub fn poll_interval(&self) -> Duration {
        self.settings.poll_interval
    }

    async fn read_prometheus(&self, query: &str, remember: bool) -> PromReading {
        let Some(source) = &self.prometheus else {
            return PromReading::Failed("no Prometheus configured (gate.prometheus_url)".into());
        };
        let reading = source.query(query).await;
        let outcome = if matches!(reading, PromReading::Failed(_)) {
            "error"
        } else {
            "ok"
        };
        self.metrics
            .gate_evaluations
            .with_label_values(&["prometheus", outcome])
            .inc();
        if !remember {
            return reading;
        }
        let Ok(mut memory) = self.memory.lock() else {
            return reading;
        };
        match reading {
            PromReading::Series(series) => {
                memory.failures_in_a_row = 0;
                memory.last_good = Some(series.clone());
                PromReading::Series(series)
            }
            PromReading::Failed(error) => {
                memory.failures_in_a_row += 1;
                match &memory.last_good {
                    // Tolerate a few failures in a row when asked to; never by default.
                    Some(series)
                        if memory.failures_in_a_row < self.settings.failures_before_unknown =>
                    {
                        tracing::warn!(%error, failures = memory.failures_in_a_row, "Prometheus failed; keeping its last answer");
                        PromReading::Series(series.clone())
                    }
                    _ => PromReading::Failed(error),
                }
            }
        }
    }

    /// Evaluates both sources, once for all who ask together: one evaluation runs at a
    /// time, and who asked before it began takes its answer (the held steps a board change
    /// wakes, a burst of views). No one gets a reading begun before they asked. Every view
    /// of the gate shows this evaluation: it is what `GET /v1/gates` answers, what the
    /// event stream (and so the status page) and the metrics are told, and what a `gate`
    /// step decides from ([`GateReport::verdict_for`]).
    pub async fn evaluate(&self) -> GateReport {
        let asked = std::time::Instant::now();
        let _one = self.evaluating.lock().await;
        if let Ok(last) = self.last.lock()
            && let Some((began, report)) = last.as_ref()
            && *began >= asked
        {
            return report.clone();
        }
        self.evaluate_now().await
    }

    /// Reads what proves the gate can see, each proof that is on, all at once.
    async fn read_sight(&self) -> SightReading {
        let rules = &self.settings.sight;
        let Some(prometheus) = &self.prometheus else {
            return SightReading::default();
        };
        let watchdog = async {
            match rules.watchdog_query() {
                None => None,
                Some(query) => Some(match prometheus.query(&query).await {
                    PromReading::Series(series) => Ok(series.len()),
                    PromReading::Failed(e) => Err(e),
                }),
            }
        };
        let listed = async {
            match (&self.alertmanager, rules.watchdog.is_empty()) {
                (Some(source), false) => Some(source.lists(&rules.watchdog).await),
                _ => None,
            }
        };
        let groups = async {
            if rules.rule_group.is_empty() {
                None
            } else {
                Some(prometheus.rule_groups().await)
            }
        };
        let (watchdog_in_prometheus, watchdog_in_alertmanager, rule_groups) =
            tokio::join!(watchdog, listed, groups);
        SightReading {
            watchdog_in_prometheus,
            watchdog_in_alertmanager,
            rule_groups,
        }
    }

    /// Reads the sources and decides, now.
    async fn evaluate_now(&self) -> GateReport {
        let began = std::time::Instant::now();
        let now = Utc::now();
        let (prom, (am, board_error), mut seen) = tokio::join!(
            self.read_prometheus(&self.settings.query, true),
            self.read_alertmanager(now),
            self.read_sight()
        );
        if let PromReading::Failed(_) = prom {
            // Prometheus cannot answer, and the verdict says so: its proofs add nothing.
            seen.watchdog_in_prometheus = None;
            seen.rule_groups = None;
        }
        let sight = sight::judge(&self.settings.sight, &seen);
        let reasons: Vec<String> = [
            gate::unreadable(&prom, &am),
            board_error
                .as_ref()
                .map(|e| format!("the alert board cannot be read: {e}")),
            sight.blind.clone(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let unreadable = (!reasons.is_empty()).then(|| reasons.join("; "));
        let mut verdict = gate::evaluate(&prom, &am, now, &self.policy);
        if let Some(reason) = &unreadable
            && verdict.is_open()
        {
            verdict = Verdict::Unknown {
                reason: reason.clone(),
            };
        }
        let blocking = |source| match &verdict {
            Verdict::Closed { blockers } => blockers.iter().filter(|b| b.source == source).count(),
            _ => 0,
        };
        let report = GateReport {
            prometheus: SourceReport {
                state: match (&self.prometheus, &prom) {
                    (None, _) => "not configured".into(),
                    (_, PromReading::Failed(_)) => "error".into(),
                    _ => "ok".into(),
                },
                error: match &prom {
                    PromReading::Failed(e) => Some(e.clone()),
                    PromReading::Series(_) => None,
                },
                blocking: blocking(gate::Source::Prometheus),
                query: Some(self.settings.query.clone()),
            },
            alertmanager: SourceReport {
                state: match (&am, &board_error) {
                    (AmReading::Failed { .. }, _) | (_, Some(_)) => "error".into(),
                    _ => "ok".into(),
                },
                error: match &am {
                    AmReading::Failed { error, .. } => Some(error.clone()),
                    _ => board_error,
                },
                blocking: blocking(gate::Source::Alertmanager),
                query: self.alertmanager.as_ref().map(|a| a.describe()),
            },
            sight,
            verdict,
            evaluated_at: now,
            unreadable,
        };
        for name in ["open", "closed", "unknown"] {
            let current = report.verdict.name();
            self.metrics
                .gate_verdict
                .with_label_values(&[name])
                .set(i64::from(name == current));
        }
        self.metrics.gate_blockers.reset();
        if let Verdict::Closed { blockers } = &report.verdict {
            for b in blockers {
                self.metrics
                    .gate_blockers
                    .with_label_values(&[&b.name, b.source.name()])
                    .inc();
            }
        }
        if let Ok(mut last) = self.last.lock() {
            *last = Some((began, report.clone()));
        }
        self.changes.send_if_modified(|told| {
            let changed = told.as_ref().map(|r| &r.verdict) != Some(&report.verdict);
            if changed {
                *told = Some(report.clone());
            }
            changed
        });
        report
    }

    /// A receiver that changes whenever an evaluation's verdict differs from the one before
    /// (blockers included), holding that evaluation.
    pub fn verdict_changes(&self) -> tokio::sync::watch::Receiver<Option<GateReport>> {
        self.changes.subscribe()
    }

    /// Tells the gate the alert board changed: the next evaluation comes now, not at the
    /// next poll, so every view follows the board at once.
    pub fn board_changed(&self) {
        self.board.notify_one();
    }

    /// Evaluates the gate at every poll interval and at once after each board change, until
    /// `stop`: so that `GET /v1/gates`, the `rollgate_gate_verdict` metric and the verdict's
    /// subscribers stay current even when no run waits at a gate.
    pub async fn keep_current(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.poll_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tick.tick() => {
                    log_verdict(&self.evaluate().await.verdict, "gate evaluated");
                }
                () = self.board.notified() => {
                    log_verdict(&self.evaluate().await.verdict, "gate evaluated after a board change");
                }
            }
        }
    }

    /// The Alertmanager side: its own list when it is configured, the board of webhooks
    /// otherwise or when it cannot be asked (the board is read only then); with why the
    /// board could not be read, if it could not.
    async fn read_alertmanager(&self, now: DateTime<Utc>) -> (AmReading, Option<String>) {
        let pulled = match &self.alertmanager {
            None => None,
            Some(source) => {
                let reading = source.active().await;
                self.metrics
                    .gate_evaluations
                    .with_label_values(&[
                        "alertmanager",
                        if reading.is_ok() { "ok" } else { "error" },
                    ])
                    .inc();
                match reading {
                    Ok(alerts) => return (AmReading::Pulled(alerts), None),
                    Err(error) => Some(error),
                }
            }
        };
        let (board, board_error) = match self.store.board(now).await {
            Ok(board) => (board.into_iter().map(|e| e.alert).collect(), None),
            Err(e) => (Vec::new(), Some(crate::error_chain(&e))),
        };
        let reading = match pulled {
            None => AmReading::Board(board),
            Some(error) => AmReading::Failed { board, error },
        };
        (reading, board_error)
    }

    /// The last evaluation, if any.
    pub fn last(&self) -> Option<GateReport> {
        self.last
            .lock()
            .ok()
            .and_then(|l| l.as_ref().map(|(_, report)| report.clone()))
    }

    /// The pre-flight quiet period of a run of `kind`: no gate alert fired within it,
    /// other than those the run is the remedy for.
    pub async fn quiet_period(&self, kind: RunKind) -> Verdict {
        let prom = self
            .read_prometheus(&self.settings.quiet_query, false)
            .await;
        gate::quiet_period(&prom, &self.policy.asked_by(kind.name()))
    }

    fn held(&self, verdict: &Verdict) -> StepOutcome {
        self.held_for(verdict.reasons())
    }

    fn held_for(&self, reasons: Vec<String>) -> StepOutcome {
        StepOutcome::Blocked {
            reasons,
            retry_at: Utc::now()
                + chrono::Duration::from_std(self.settings.poll_interval).unwrap_or_default(),
        }
    }
}

/// Whether a batch of alerts could open a gate (then held runs re-check at once).
pub fn may_open(alerts: &[crate::domain::alert::Alert]) -> bool {
    alerts.iter().any(|a| a.status == AlertStatus::Resolved)
}

/// The `gate` step: go ahead only when the gate is open and, before a node is taken,
/// the circuit breaker has not tripped and the checks (`gate.checks`) have passed.
pub struct GateStep {
    gate: Arc<Gate>,
    breaker: Option<Breaker>,
    checks: Option<Checks>,
}

/// The checks' part of a gate: what they read and ask, and their measurements so far.
struct Checks {
    prometheus: Option<Arc<dyn MetricsSource>>,
    rules: Vec<CheckRule>,
    halt_after: Duration,
    poll_interval: Duration,
    /// Per gate in hand (run, step, its first start): each check's measurements.
    taken: Mutex<HashMap<CheckKey, Measuring>>,
}

/// A gate in hand: its run, its index, and when it was first started (a resume starts
/// it again, and its checks with it).
type CheckKey = (String, usize, Option<DateTime<Utc>>);

/// What a gate's checks have measured so far.
#[derive(Default)]
struct Measuring {
    /// Per check (in `rules` order), its measurements and when the last was taken.
    taken: Vec<(Vec<Measurement>, Option<std::time::Instant>)>,
    /// Since when a check has been inconclusive, without a pass since.
    inconclusive_since: Option<std::time::Instant>,
}

/// Past this many gates measured at once, the oldest measurements are forgotten: a run
/// aborted while its gate measured leaves its entry behind.
const MEASURING_AT_MOST: usize = 256;

impl Checks {
    /// The value of every series `query` returns now, or why there is none.
    async fn read(&self, query: &str) -> Result<Vec<f64>, String> {
        let Some(prometheus) = &self.prometheus else {
            return Err("no Prometheus configured (gate.prometheus_url)".into());
        };
        let now = Utc::now();
        let series = prometheus
            .query_range(query, now, now, Duration::from_secs(1))
            .await
            .map_err(|e| format!("the query failed: {e}"))?;
        Ok(series
            .iter()
            .filter_map(|s| s.values.last().copied())
            .collect())
    }

    /// Measures what is due at gate `index` of `run` and decides: go on, measure again
    /// later, hold (inconclusive) or halt (failed, or inconclusive past `halt_after`).
    async fn ask(&self, run: &Run, index: usize) -> StepOutcome {
        let key: CheckKey = (run.id.clone(), index, run.steps[index].started_at);
        let now = std::time::Instant::now();
        let due: Vec<usize> = {
            let Ok(mut all) = self.taken.lock() else {
                return StepOutcome::retry("the checks' measurements cannot be read");
            };
            if all.len() > MEASURING_AT_MOST && !all.contains_key(&key) {
                all.clear();
            }
            let m = all.entry(key.clone()).or_default();
            m.taken.resize_with(self.rules.len(), Default::default);
            self.rules
                .iter()
                .zip(&m.taken)
                .enumerate()
                .filter(|(_, (rule, (taken, last)))| {
                    check::tally(rule, taken) == CheckVerdict::Measuring
                        && last.is_none_or(|at| now.duration_since(at) >= rule.interval)
                })
                .map(|(i, _)| i)
                .collect()
        };
        let read =
            futures_util::future::join_all(due.iter().map(|&i| self.read(&self.rules[i].query)))
                .await;
        let Ok(mut all) = self.taken.lock() else {
            return StepOutcome::retry("the checks' measurements cannot be read");
        };
        let m = all.entry(key.clone()).or_default();
        m.taken.resize_with(self.rules.len(), Default::default);
        for (&i, reading) in due.iter().zip(read) {
            let (taken, last) = &mut m.taken[i];
            taken.push(check::measure(&self.rules[i], reading));
            *last = Some(now);
        }
        let verdicts: Vec<(CheckVerdict, String)> = self
            .rules
            .iter()
            .zip(&m.taken)
            .map(|(rule, (taken, _))| {
                let verdict = check::tally(rule, taken);
                let line = check::describe(rule, &verdict, taken);
                (verdict, line)
            })
            .collect();
        let lines = |want: CheckVerdict| -> Vec<String> {
            verdicts
                .iter()
                .filter(|(v, _)| *v == want)
                .map(|(_, line)| line.clone())
                .collect()
        };
        let failed = lines(CheckVerdict::Fail);
        if !failed.is_empty() {
            all.remove(&key);
            return StepOutcome::Halt {
                reason: failed.join("; "),
            };
        }
        let inconclusive = lines(CheckVerdict::Inconclusive);
        if !inconclusive.is_empty() {
            let since = *m.inconclusive_since.get_or_insert(now);
            if now.duration_since(since) >= self.halt_after {
                all.remove(&key);
                return StepOutcome::Halt {
                    reason: format!(
                        "inconclusive for {}s (gate.halt_after {}s): {}",
                        now.duration_since(since).as_secs(),
                        self.halt_after.as_secs(),
                        inconclusive.join("; ")
                    ),
                };
            }
            // Measured again from the start at the next poll: a query that recovers lets
            // the gate go on, as a resolved alert does.
            for (rule, (taken, last)) in self.rules.iter().zip(m.taken.iter_mut()) {
                if check::tally(rule, taken) == CheckVerdict::Inconclusive {
                    taken.clear();
                    *last = None;
                }
            }
            return StepOutcome::Blocked {
                reasons: inconclusive,
                retry_at: Utc::now()
                    + chrono::Duration::from_std(self.poll_interval).unwrap_or_default(),
            };
        }
        if verdicts.iter().all(|(v, _)| *v == CheckVerdict::Pass) {
            all.remove(&key);
            let passed: Vec<String> = verdicts.iter().map(|(_, line)| line.clone()).collect();
            return StepOutcome::Announced {
                note: format!("gate open; {}", passed.join("; ")),
            };
        }
        let next = self
            .rules
            .iter()
            .zip(&m.taken)
            .filter(|(rule, (taken, _))| check::tally(rule, taken) == CheckVerdict::Measuring)
            .filter_map(|(rule, (_, last))| {
                last.map(|at| (at + rule.interval).saturating_duration_since(now))
            })
            .min()
            .unwrap_or(self.poll_interval);
        StepOutcome::Wait {
            until: Utc::now() + chrono::Duration::from_std(next).unwrap_or_default(),
            reason: lines(CheckVerdict::Measuring).join("; "),
        }
    }
}

/// The circuit breaker's part of a gate: the cluster's nodes, and how many may be NotReady.
struct Breaker {
    cluster: Arc<dyn ClusterRead>,
    limit: UnhealthyLimit,
}

impl GateStep {
    /// The gate step over `gate`, without a circuit breaker (no cluster to read).
    pub fn new(gate: Arc<Gate>) -> Self {
        Self {
            gate,
            breaker: None,
            checks: None,
        }
    }

    /// The same step, which before a node is taken also asks `rules` of `prometheus`
    /// once the gate is open, holding while one is inconclusive (and halting past
    /// `halt_after`), halting when one fails.
    pub fn with_checks(
        mut self,
        prometheus: Option<Arc<dyn MetricsSource>>,
        rules: Vec<CheckRule>,
        halt_after: Duration,
    ) -> Self {
        if !rules.is_empty() {
            self.checks = Some(Checks {
                prometheus,
                rules,
                halt_after,
                poll_interval: self.gate.poll_interval(),
                taken: Mutex::new(HashMap::new()),
            });
        }
        self
    }

    /// The same step, which before a node is taken also holds while more of `cluster`'s
    /// nodes are NotReady, not by the run's own work, than `limit` allows.
    pub fn with_breaker(mut self, cluster: Arc<dyn ClusterRead>, limit: UnhealthyLimit) -> Self {
        self.breaker = Some(Breaker { cluster, limit });
        self
    }

    /// Why the breaker holds the gate at step `index` of `run`, if it does: it tripped, or
    /// the nodes cannot be read (fail closed).
    async fn breaker_holds(&self, run: &Run, index: usize) -> Option<String> {
        let b = self.breaker.as_ref()?;
        if !breaker::guards_nodes(run, index) {
            return None;
        }
        match b.cluster.facts().await {
            Ok(facts) => {
                let nodes: Vec<(&str, bool)> = facts
                    .nodes
                    .iter()
                    .map(|n| (n.name.as_str(), n.ready))
                    .collect();
                breaker::judge(&nodes, &breaker::in_hand(run), b.limit).map(|t| t.to_string())
            }
            Err(e) => Some(format!(
                "the cluster's nodes cannot be read for cluster.unhealthy_limit: {e}"
            )),
        }
    }
}

#[async_trait::async_trait]
impl StepExecutor for GateStep {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let (report, tripped) = tokio::join!(self.gate.evaluate(), self.breaker_holds(run, index));
        match (report.verdict_for(run.kind), tripped, &self.checks) {
            (Verdict::Open, None, Some(checks)) if breaker::guards_nodes(run, index) => {
                checks.ask(run, index).await
            }
            (Verdict::Open, None, _) => StepOutcome::done("gate open"),
            (verdict, tripped, _) => {
                let mut reasons = verdict.reasons();
                reasons.extend(tripped);
                self.gate.held_for(reasons)
            }
        }
    }
}

/// The `quiet-period` step: no gate alert fired within the quiet period.
pub struct QuietPeriodStep(pub Arc<Gate>);

#[async_trait::async_trait]
impl StepExecutor for QuietPeriodStep {
    async fn execute(&self, run: &Run, _index: usize) -> StepOutcome {
        match self.0.quiet_period(run.kind).await {
            Verdict::Open => StepOutcome::done("no gate alert fired in the quiet period"),
            verdict => self.0.held(&verdict),
        }
    }
}

/// One line however many alerts block: the verdict, how many reasons, the first of them.
/// Nothing is formatted unless debug logging is on: this runs at every poll.
fn log_verdict(verdict: &Verdict, what: &str) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let reasons = verdict.reasons();
    let first = reasons.first().map(String::as_str).unwrap_or_default();
    tracing::debug!(
        verdict = verdict.name(),
        reasons = reasons.len(),
        first,
        "{what}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A Prometheus that answers "no blocking alert" and counts the questions.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    #[async_trait::async_trait]
    impl MetricsSource for Counting {
        async fn query(&self, _promql: &str) -> PromReading {
            self.0.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            PromReading::Series(Vec::new())
        }

        async fn rule_groups(&self) -> Result<Vec<String>, String> {
            Ok(Vec::new())
        }

        async fn query_range(
            &self,
            _promql: &str,
            _start: DateTime<Utc>,
            _end: DateTime<Utc>,
            _step: Duration,
        ) -> Result<Vec<crate::domain::analysis::RangeSeries>, String> {
            Ok(Vec::new())
        }
    }

    fn gate(prometheus: Arc<Counting>) -> Gate {
        let store = Store::open(std::path::Path::new(":memory:")).expect("store");
        let rules = GateRules {
            query: "ALERTS".into(),
            count_pending: false,
            exclude_alerts: Vec::new(),
            board_matchers: Vec::new(),
            poll_interval: Duration::from_secs(30),
            quiet_query: "ALERTS".into(),
            failures_before_unknown: 1,
            sight: SightRules {
                watchdog: String::new(),
                rule_group: String::new(),
            },
        };
        Gate::new(Some(prometheus), store, Metrics::new(), rules)
    }

    #[tokio::test]
    async fn who_asks_together_shares_one_evaluation_and_no_one_gets_one_begun_before_they_asked() {
        let prometheus = Arc::new(Counting::default());
        let gate = gate(prometheus.clone());
        // `a` begins at once; `b` and `c` ask while it runs (Prometheus answers in 50 ms):
        // neither takes `a`'s reading, begun before they asked; they share the next one.
        let (a, b, c) = tokio::join!(gate.evaluate(), gate.evaluate(), gate.evaluate());
        assert_eq!(prometheus.0.load(Ordering::SeqCst), 2, "{a:?}");
        assert!(a.verdict.is_open());
        assert_eq!(b.evaluated_at, c.evaluated_at, "asked together: shared");
        assert!(
            b.evaluated_at > a.evaluated_at,
            "none begun before they asked"
        );
        // Asked after the last ended: a new one.
        let d = gate.evaluate().await;
        assert_eq!(prometheus.0.load(Ordering::SeqCst), 3);
        assert!(d.evaluated_at > b.evaluated_at);
    }
}
