//! The batch analysis step: after a batch's soak, before the next batch's gate, each
//! `gate.analysis` is read from Prometheus over two windows for the batch and for the
//! workers beside it (`domain::cohorts`), and judged (`domain::analysis`).
//!
//! - **pass** (every analysis): the run goes on; the figures go into its history.
//! - **fail** (any): the run halts naming the analysis, both groups' median changes, the
//!   effect, the p-value and the nodes; with `on_fail = "cordon"` the batch is cordoned
//!   first. Nothing is downgraded. A resume judges the batch again.
//! - **inconclusive** (any, none failing): no data, too few nodes, a query error. It holds
//!   like a closed gate and, past `gate.halt_after`, halts. No data never passes.

use chrono::{DateTime, Utc};
use prometheus::{GaugeVec, IntGaugeVec, Opts};
use std::sync::Arc;
use std::time::Duration;

use crate::domain::analysis::{self, AnalysisRule, Finding, Judgement, OnFail, VerdictName};
use crate::domain::cohorts::{self, Baseline, Cohorts, CohortsError};
use crate::domain::engine::StepOutcome;
use crate::domain::run::Run;
use crate::error_chain;
use crate::metrics::{Families, MetricSet, MetricSetType, Metrics};
use crate::ports::{Cordon, MetricsSource, NodeDrain, StepExecutor};

/// Points read per window: enough for a median, few enough for a cheap query.
const POINTS_PER_WINDOW: u32 = 60;

/// The last verdict and figures of each analysis.
pub struct AnalysisMetrics {
    /// Per analysis, 1 for its last verdict (`pass`, `fail`, `inconclusive`), 0 for the others.
    pub verdict: IntGaugeVec,
    /// Per analysis, its last effect: the batch's change over the baseline's.
    pub effect: GaugeVec,
    /// Per analysis, its last one-sided p-value.
    pub p_value: GaugeVec,
}

/// The set's type, for the workflows' registry.
pub const METRICS: MetricSetType = MetricSetType::of::<AnalysisMetrics>();

impl MetricSet for AnalysisMetrics {
    fn new(families: &Families) -> Self {
        let per_analysis = |name: &str, help: &str| {
            families.add(GaugeVec::new(Opts::new(name, help), &["analysis"]).expect("valid metric"))
        };
        Self {
            verdict: families.add(
                IntGaugeVec::new(
                    Opts::new(
                        "rollgate_analysis_verdict",
                        "1 for the last verdict of each batch analysis (pass, fail, inconclusive), 0 for the others.",
                    ),
                    &["analysis", "verdict"],
                )
                .expect("valid metric"),
            ),
            effect: per_analysis(
                "rollgate_analysis_effect",
                "The last effect of each batch analysis: the batch's change over the comparison nodes' (Hodges-Lehmann ratio).",
            ),
            p_value: per_analysis(
                "rollgate_analysis_p_value",
                "The last one-sided p-value of each batch analysis.",
            ),
        }
    }
}

/// The `analysis` step of every workflow that works nodes in batches.
pub struct AnalysisStep {
    prometheus: Option<Arc<dyn MetricsSource>>,
    rules: Vec<AnalysisRule>,
    nodes: Option<Arc<dyn NodeDrain>>,
    poll_interval: Duration,
    metrics: Arc<AnalysisMetrics>,
}

/// One analysis's judgement of a batch, or why its figures could not be read.
struct Judged<'a> {
    rule: &'a AnalysisRule,
    result: Result<Judgement, String>,
}

impl Judged<'_> {
    fn verdict(&self) -> VerdictName {
        match &self.result {
            Ok(judgement) => judgement.verdict.name(),
            Err(_) => VerdictName::Inconclusive,
        }
    }

    fn failed(&self) -> bool {
        self.verdict() == VerdictName::Fail
    }

    /// The verdict with its figures, as the step keeps it.
    fn finding(&self) -> Finding {
        let (name, criteria) = (&self.rule.name, &self.rule.criteria);
        match &self.result {
            Ok(judgement) => Finding::of(name, criteria, judgement),
            Err(why) => Finding::unread(name, criteria, why),
        }
    }

    /// `analysis NAME VERDICT: figures`, one line.
    fn line(&self) -> String {
        let name = &self.rule.name;
        match &self.result {
            Ok(judgement) => format!(
                "analysis {name} {judgement} (tolerance {})",
                self.rule.criteria.tolerance
            ),
            Err(e) => format!("analysis {name} inconclusive: {e}"),
        }
    }
}

impl AnalysisStep {
    /// The step judging by `rules` from `prometheus` (none: every analysis is
    /// inconclusive), cordoning a failed batch through `nodes` where a rule says so.
    pub fn new(
        prometheus: Option<Arc<dyn MetricsSource>>,
        rules: Vec<AnalysisRule>,
        nodes: Option<Arc<dyn NodeDrain>>,
        poll_interval: Duration,
        metrics: &Metrics,
    ) -> Self {
        Self {
            prometheus,
            rules,
            nodes,
            poll_interval,
            metrics: metrics.set::<AnalysisMetrics>(),
        }
    }

    /// Each node's figure over `from..to`.
    async fn figures(
        &self,
        rule: &AnalysisRule,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<std::collections::BTreeMap<String, f64>, String> {
        let Some(prometheus) = &self.prometheus else {
            return Err("no Prometheus configured (gate.prometheus_url)".into());
        };
        let step = (rule.window / POINTS_PER_WINDOW).max(Duration::from_millis(1));
        let series = prometheus
            .query_range(&rule.query, from, to, step)
            .await
            .map_err(|e| format!("the query failed: {e}"))?;
        // A node seen over less than half the window is not seen over it.
        let points = (rule.window.as_secs_f64() / step.as_secs_f64()) as usize + 1;
        Ok(analysis::figures(&series, points.div_ceil(2)))
    }

    async fn judge<'a>(
        &self,
        rule: &'a AnalysisRule,
        c: &Cohorts,
        now: DateTime<Utc>,
    ) -> Judged<'a> {
        let window = chrono::Duration::from_std(rule.window).unwrap_or(chrono::Duration::MAX);
        let (before, after) = tokio::join!(
            self.figures(rule, c.taken_at - window, c.taken_at),
            self.figures(rule, now - window, now)
        );
        let result = before.and_then(|before| {
            let after = after?;
            Ok(analysis::judge(
                &analysis::readings(&c.canary, &before, &after),
                &analysis::readings(&c.baseline, &before, &after),
                &rule.criteria,
            ))
        });
        Judged { rule, result }
    }

    fn record(&self, judged: &Judged) {
        let name = judged.rule.name.as_str();
        for verdict in VerdictName::ALL {
            self.metrics
                .verdict
                .with_label_values(&[name, verdict.as_str()])
                .set(i64::from(verdict == judged.verdict()));
        }
        if let Ok(j) = &judged.result {
            self.metrics.effect.with_label_values(&[name]).set(j.effect);
            self.metrics
                .p_value
                .with_label_values(&[name])
                .set(j.p_value);
        }
    }

    /// Cordons `nodes` for run `owner`; what was done, in words.
    async fn cordon(&self, nodes: &[String], owner: &str) -> String {
        let Some(drain) = &self.nodes else {
            return "the batch cannot be cordoned: no cluster configured".into();
        };
        let mut cordoned = Vec::new();
        let mut problems = Vec::new();
        for node in nodes {
            match drain.cordon(node, owner).await {
                Ok(_) => cordoned.push(node.as_str()),
                Err(e) => problems.push(format!("{node}: {}", error_chain(&e))),
            }
        }
        let mut said = format!("cordoned {} (on_fail = \"cordon\")", cordoned.join(", "));
        if !problems.is_empty() {
            said.push_str(&format!("; could not cordon {}", problems.join("; ")));
        }
        said
    }

    /// Uncordons the nodes of `nodes` this run cordoned (a batch judged again after a
    /// fail that cordoned it); anyone else's cordon stays.
    async fn uncordon_ours(&self, nodes: &[String], owner: &str) -> Result<Vec<String>, String> {
        let Some(drain) = &self.nodes else {
            return Ok(Vec::new());
        };
        let mut given_back = Vec::new();
        for node in nodes {
            let holder = drain
                .cordon_holder(node, owner)
                .await
                .map_err(|e| error_chain(&e))?;
            if holder == Cordon::Ours {
                drain
                    .uncordon(node, owner)
                    .await
                    .map_err(|e| error_chain(&e))?;
                given_back.push(node.clone());
            }
        }
        Ok(given_back)
    }

    /// How the step ends, from the analyses' judgements of the batch `c`.
    async fn outcome(
        &self,
        run: &Run,
        c: &Cohorts,
        judged: &[Judged<'_>],
        now: DateTime<Utc>,
    ) -> StepOutcome {
        let lines: Vec<String> = judged.iter().map(Judged::line).collect();
        let batch = groups_words(c);
        if judged.iter().any(Judged::failed) {
            let failed: Vec<String> = judged
                .iter()
                .filter(|j| j.failed())
                .map(Judged::line)
                .collect();
            let mut reason = format!("{batch}: {}", failed.join("; "));
            if judged
                .iter()
                .any(|j| j.failed() && j.rule.on_fail == OnFail::Cordon)
            {
                reason.push_str(&format!("; {}", self.cordon(&c.canary, &run.id).await));
            } else {
                reason.push_str("; the batch is left uncordoned");
            }
            return StepOutcome::Halt { reason };
        }
        if judged
            .iter()
            .any(|j| j.verdict() == VerdictName::Inconclusive)
        {
            return StepOutcome::Blocked {
                reasons: judged
                    .iter()
                    .filter(|j| j.verdict() == VerdictName::Inconclusive)
                    .map(|j| format!("{batch}: {}", j.line()))
                    .collect(),
                retry_at: now + chrono::Duration::from_std(self.poll_interval).unwrap_or_default(),
            };
        }
        let mut note = format!("{batch}: {}", lines.join("; "));
        if self.rules.iter().any(|r| r.on_fail == OnFail::Cordon) {
            match self.uncordon_ours(&c.canary, &run.id).await {
                Ok(back) if !back.is_empty() => {
                    note.push_str(&format!("; uncordoned {}", back.join(", ")));
                }
                Ok(_) => {}
                Err(e) => return StepOutcome::retry(e),
            }
        }
        StepOutcome::Announced { note }
    }
}

/// What is judged against what, in words: `batch w1, w2 against 3 worker(s) not yet
/// touched and 2 done before it`.
fn groups_words(c: &Cohorts) -> String {
    let Baseline {
        untouched,
        done_before,
    } = c.baseline_is;
    let baseline = match (untouched, done_before) {
        (u, 0) => format!("{u} worker(s) not yet touched"),
        (0, d) => format!("{d} worker(s) done before it"),
        (u, d) => format!("{u} worker(s) not yet touched and {d} done before it"),
    };
    let pooled = if c.batches > 1 {
        format!(" (with the {} batch(es) before it)", c.batches - 1)
    } else {
        String::new()
    };
    format!("batch {}{pooled} against {baseline}", c.canary.join(", "))
}

#[async_trait::async_trait]
impl StepExecutor for AnalysisStep {
    async fn execute(&self, run: &Run, index: usize) -> StepOutcome {
        let need = self
            .rules
            .iter()
            .map(|r| r.criteria.min_samples)
            .max()
            .unwrap_or(1);
        let c = match cohorts::cohorts(&run.steps, index, need) {
            Ok(c) => c,
            Err(e @ CohortsError::TooFewYet { .. }) => return StepOutcome::done(e.to_string()),
            Err(e) => return StepOutcome::failed(e),
        };
        let now = Utc::now();
        let longest = self
            .rules
            .iter()
            .map(|r| r.window)
            .max()
            .unwrap_or_default();
        let judge_at = c.back_at + chrono::Duration::from_std(longest).unwrap_or_default();
        if now < judge_at {
            return StepOutcome::Wait {
                until: judge_at,
                reason: format!(
                    "the batch {} is judged at {}, once it has run {} since its soak began",
                    c.canary.join(", "),
                    judge_at.format("%H:%M:%S"),
                    humantime::format_duration(longest)
                ),
            };
        }
        if self.rules.is_empty() {
            return StepOutcome::done("no gate.analysis configured: the batch is not judged");
        }
        let judged =
            futures_util::future::join_all(self.rules.iter().map(|rule| self.judge(rule, &c, now)))
                .await;
        for j in &judged {
            self.record(j);
        }
        let findings: Vec<Finding> = judged.iter().map(Judged::finding).collect();
        let outcome = self.outcome(run, &c, &judged, now).await;
        StepOutcome::judged(findings, outcome)
    }
}
