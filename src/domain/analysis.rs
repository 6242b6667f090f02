//! Batch analysis: did the nodes a batch just worked get worse than the nodes beside them?
//!
//! Each node gives one figure per window (say, the median of its series over the window),
//! read over the window before the batch was taken and over the window after its soak. A
//! node's change is the ratio of the two. The batch's changes (the canary) are compared
//! with the changes of the comparison nodes over the same two windows (the baseline: the
//! nodes not yet touched, or, for the last batch, the nodes done before it).
//!
//! - **Changes, not levels.** Nodes differ from each other by more than a regression worth
//!   catching (other pods, other hardware), and the whole cluster's load moves through the
//!   day. A node's ratio to itself cancels the first; comparing with other nodes over the
//!   same windows cancels the second.
//! - **Mann–Whitney U**, one-sided in the bad direction, as Kayenta's judge uses it.
//!   Latencies and counts are skewed and heavy-tailed and a batch is a handful of nodes: a
//!   rank test assumes no distribution, and its exact null distribution gives a true
//!   p-value even at 4 nodes against 8 (the normal approximation, with the correction for
//!   ties, past [`EXACT_LIMIT`] pairs or with ties).
//! - **Each node counts once.** The points of one node's series are not independent of
//!   each other: counted as samples, they make every node's quirk look significant.
//! - **Both a p-value and an effect.** A batch fails only when the difference is both
//!   unlikely by chance (`p ≤ significance`) and larger than the tolerance: a significant
//!   2 % is not a regression worth a halt.
//! - **The effect is the Hodges–Lehmann estimate** that goes with Mann–Whitney: the median,
//!   over every pair of a batch node and a comparison node, of the one's change over the
//!   other's. It estimates the very shift the test tests for, and it is steadier than the
//!   ratio of the two groups' medians: at 4 nodes against 8, the median of 4 changes moves
//!   half as much again as the pairwise estimate does, and a batch 20 % worse would fall
//!   under a tolerance of 1.1 one time in twenty (`cargo bench --bench analysis`).
//! - **No data never passes.** A group with fewer nodes than `min_samples` (a node
//!   counts when both its figures are finite) makes the verdict inconclusive.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// The most pairs (canary nodes × baseline nodes) for which the exact distribution of U
/// is computed; past it, the normal approximation is within a fraction of a percent.
pub const EXACT_LIMIT: usize = 2_500;

/// Which change of the figure is bad.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// A rise is bad (latency, restarts, memory).
    Increase,
    /// A fall is bad (throughput, free memory, ready pods).
    Decrease,
}

/// What a batch is judged by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Criteria {
    /// Which change is bad.
    pub direction: Direction,
    /// The largest effect tolerated, as a ratio above 1: 1.2 lets the batch's change be
    /// 20 % worse than the baseline's (higher for `increase`, lower by 1/1.2 for
    /// `decrease`).
    pub tolerance: f64,
    /// The fewest nodes with data each group must have.
    pub min_samples: usize,
    /// The largest one-sided p-value that counts as a difference.
    pub significance: f64,
}

/// What a failed batch analysis does to the batch besides halting the run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnFail {
    /// The batch stays as it is, uncordoned (default).
    Halt,
    /// The batch's nodes are cordoned, so that new workloads keep off the regressed nodes.
    /// rollgate never downgrades a node; a resume that judges the batch again and passes
    /// uncordons them.
    Cordon,
}

/// One analysis as the analysis step judges by it (`[[gate.analysis]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct AnalysisRule {
    /// Its name.
    pub name: String,
    /// PromQL returning one series per node, labelled `node`.
    pub query: String,
    /// What the batch is judged by.
    pub criteria: Criteria,
    /// How long each window is.
    pub window: std::time::Duration,
    /// What a fail does to the batch besides halting.
    pub on_fail: OnFail,
}

/// One node's figure over the window before the batch and over the window after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    /// The node.
    pub node: String,
    /// Its figure before the batch was taken; `None` when the query gave it none.
    pub before: Option<f64>,
    /// Its figure after the batch's soak.
    pub after: Option<f64>,
}

/// One series of a range query: its labels, and its values in time order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RangeSeries {
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its values, in time order.
    pub values: Vec<f64>,
}

/// The label that names a series' node.
pub const NODE_LABEL: &str = "node";

/// Each node's figure over a window: the median of every finite value of the series
/// whose `node` label names it (a node with several series has their values pooled; a
/// series without the label is not any node's). A node with fewer than `min_points`
/// values has none: a series that stopped or began inside the window (a node that no
/// longer reports) has not been seen over it, and a point or two from its edge must not
/// pass for data.
pub fn figures(series: &[RangeSeries], min_points: usize) -> BTreeMap<String, f64> {
    let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for s in series {
        if let Some(node) = s.labels.get(NODE_LABEL) {
            values
                .entry(node)
                .or_default()
                .extend(s.values.iter().copied().filter(|v| v.is_finite()));
        }
    }
    values
        .into_iter()
        .filter(|(_, v)| !v.is_empty() && v.len() >= min_points)
        .map(|(node, v)| (node.to_owned(), median(&v)))
        .collect()
}

/// The readings of `nodes` from their figures before and after.
pub fn readings(
    nodes: &[String],
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<Reading> {
    nodes
        .iter()
        .map(|node| Reading {
            node: node.clone(),
            before: before.get(node).copied(),
            after: after.get(node).copied(),
        })
        .collect()
}

/// Which group a reason names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    /// The batch's nodes.
    Canary,
    /// The nodes they are compared with.
    Baseline,
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Canary => "the batch",
            Self::Baseline => "the comparison nodes",
        })
    }
}

/// Why a judgement could not be made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Unjudged {
    /// Too few of a group's nodes had both figures.
    TooFewSamples {
        /// The group.
        group: Group,
        /// Its nodes with both figures.
        have: usize,
        /// `min_samples`.
        need: usize,
    },
    /// A figure was negative: a ratio of it means nothing.
    Negative {
        /// The node.
        node: String,
    },
}

impl fmt::Display for Unjudged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooFewSamples { group, have: 0, .. } => write!(f, "no data for {group}"),
            Self::TooFewSamples { group, have, need } => {
                write!(f, "{have} of {group} with data, {need} needed")
            }
            Self::Negative { node } => {
                write!(
                    f,
                    "{node} has a negative figure; the analysis needs figures ≥ 0"
                )
            }
        }
    }
}

/// A group's nodes and their changes (after / before).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Changes {
    /// The nodes with both figures, in the order read.
    pub nodes: Vec<String>,
    /// Each node's change, in the same order.
    pub changes: Vec<f64>,
    /// The median change.
    pub median: f64,
}

/// The three-way verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No regression shown: the next batch may go.
    Pass,
    /// A regression beyond the tolerance, unlikely by chance: the run halts.
    Fail,
    /// No judgement (no data, too few nodes), and why: holds like a closed gate.
    Inconclusive(Unjudged),
}

/// A batch judged, with the figures behind the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    /// The verdict.
    pub verdict: Verdict,
    /// The batch's changes.
    pub canary: Changes,
    /// The comparison nodes' changes.
    pub baseline: Changes,
    /// How much the batch changed beside the baseline, as a ratio (the Hodges–Lehmann
    /// estimate: the median of every batch change over every baseline change): 1.3 is 30 %
    /// worse for `increase`.
    pub effect: f64,
    /// The one-sided p-value of a difference in the bad direction (1 when not judged).
    pub p_value: f64,
}

impl fmt::Display for Judgement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match &self.verdict {
            Verdict::Inconclusive(why) => return write!(f, "inconclusive: {why}"),
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
        };
        write!(
            f,
            "{verdict}: effect {:.2} (median change {:.3} on {} against {:.3} on {} comparison \
             nodes), p = {:.4}",
            self.effect,
            self.canary.median,
            self.canary.nodes.join(", "),
            self.baseline.median,
            self.baseline.nodes.len(),
            self.p_value
        )
    }
}

/// A verdict in a word, as a finding keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum VerdictName {
    /// No regression shown.
    Pass,
    /// A regression shown: the run halted.
    Fail,
    /// No judgement: the run held.
    Inconclusive,
}

impl VerdictName {
    /// Every verdict, as the metric lists them.
    pub const ALL: [Self; 3] = [Self::Pass, Self::Fail, Self::Inconclusive];

    /// Its word: `pass`, `fail` or `inconclusive`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "fail",
            Self::Inconclusive => "inconclusive",
        }
    }
}

impl Verdict {
    /// The verdict in a word.
    pub fn name(&self) -> VerdictName {
        match self {
            Self::Pass => VerdictName::Pass,
            Self::Fail => VerdictName::Fail,
            Self::Inconclusive(_) => VerdictName::Inconclusive,
        }
    }
}

/// A group's figures as a finding keeps them: JSON has no infinity, so an infinite change
/// (a figure that rose from 0) is `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GroupFigures {
    /// The nodes with both figures, in the order read.
    pub nodes: Vec<String>,
    /// Each node's change (after / before), in the same order; `null` when infinite.
    pub changes: Vec<Option<f64>>,
    /// The median change; `null` when there is none, or it is infinite.
    pub median: Option<f64>,
}

impl GroupFigures {
    fn of(changes: &Changes) -> Self {
        Self {
            nodes: changes.nodes.clone(),
            changes: changes.changes.iter().map(|&c| finite(c)).collect(),
            median: finite(changes.median),
        }
    }
}

fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

/// One analysis's verdict on one batch with the figures behind it, as the run keeps it on
/// the batch's analysis step: for the status page's picture, `rollgate runs show` and the
/// API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Finding {
    /// The analysis's name.
    pub analysis: String,
    /// Its verdict.
    pub verdict: VerdictName,
    /// Why there was no judgement, when inconclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// Which change is bad.
    pub direction: Direction,
    /// The largest effect tolerated.
    pub tolerance: f64,
    /// The batch's nodes and their changes.
    pub canary: GroupFigures,
    /// The comparison nodes and their changes.
    pub baseline: GroupFigures,
    /// The effect (`null` when not judged, or infinite).
    pub effect: Option<f64>,
    /// The one-sided p-value (`null` when not judged).
    pub p_value: Option<f64>,
}

impl Finding {
    /// What `judgement` found for the analysis `name`, judged by `criteria`.
    pub fn of(name: &str, criteria: &Criteria, judgement: &Judgement) -> Self {
        let judged = !matches!(judgement.verdict, Verdict::Inconclusive(_));
        Self {
            analysis: name.to_owned(),
            verdict: judgement.verdict.name(),
            why: match &judgement.verdict {
                Verdict::Inconclusive(why) => Some(why.to_string()),
                _ => None,
            },
            direction: criteria.direction,
            tolerance: criteria.tolerance,
            canary: GroupFigures::of(&judgement.canary),
            baseline: GroupFigures::of(&judgement.baseline),
            effect: finite(judgement.effect).filter(|_| judged),
            p_value: Some(judgement.p_value).filter(|_| judged),
        }
    }

    /// An analysis `name` whose figures could not be read, and why: inconclusive.
    pub fn unread(name: &str, criteria: &Criteria, why: &str) -> Self {
        Self {
            analysis: name.to_owned(),
            verdict: VerdictName::Inconclusive,
            why: Some(why.to_owned()),
            direction: criteria.direction,
            tolerance: criteria.tolerance,
            canary: GroupFigures::default(),
            baseline: GroupFigures::default(),
            effect: None,
            p_value: None,
        }
    }
}

/// Judges a batch (`canary`) against the comparison nodes (`baseline`).
pub fn judge(canary: &[Reading], baseline: &[Reading], criteria: &Criteria) -> Judgement {
    let unjudged = |why, canary, baseline| Judgement {
        verdict: Verdict::Inconclusive(why),
        canary,
        baseline,
        effect: 1.0,
        p_value: 1.0,
    };
    let (c, b) = match (changes(canary), changes(baseline)) {
        (Ok(c), Ok(b)) => (c, b),
        (Err(why), _) | (_, Err(why)) => {
            return unjudged(why, empty(), empty());
        }
    };
    let need = criteria.min_samples.max(1);
    let counts = [
        (Group::Canary, c.changes.len()),
        (Group::Baseline, b.changes.len()),
    ];
    if let Some(&(group, have)) = counts.iter().find(|(_, have)| *have < need) {
        return unjudged(Unjudged::TooFewSamples { group, have, need }, c, b);
    }
    let effect = hodges_lehmann_ratio(&c.changes, &b.changes);
    let (p_value, beyond) = match criteria.direction {
        Direction::Increase => (
            mann_whitney_greater(&c.changes, &b.changes),
            effect > criteria.tolerance,
        ),
        Direction::Decrease => (
            mann_whitney_greater(&b.changes, &c.changes),
            effect < 1.0 / criteria.tolerance,
        ),
    };
    let verdict = if beyond && p_value <= criteria.significance {
        Verdict::Fail
    } else {
        Verdict::Pass
    };
    Judgement {
        verdict,
        canary: c,
        baseline: b,
        effect,
        p_value,
    }
}

fn empty() -> Changes {
    Changes {
        nodes: Vec::new(),
        changes: Vec::new(),
        median: f64::NAN,
    }
}

/// The nodes with both figures finite, and their changes.
fn changes(readings: &[Reading]) -> Result<Changes, Unjudged> {
    let mut nodes = Vec::new();
    let mut changes = Vec::new();
    for r in readings {
        let (Some(before), Some(after)) = (r.before, r.after) else {
            continue;
        };
        if !before.is_finite() || !after.is_finite() {
            continue;
        }
        if before < 0.0 || after < 0.0 {
            return Err(Unjudged::Negative {
                node: r.node.clone(),
            });
        }
        nodes.push(r.node.clone());
        changes.push(ratio(after, before));
    }
    let median = median(&changes);
    Ok(Changes {
        nodes,
        changes,
        median,
    })
}

/// `a / b`, with equal values 1 (0 / 0 included) and anything over 0 infinite.
fn ratio(a: f64, b: f64) -> f64 {
    if a == b { 1.0 } else { a / b }
}

/// The Hodges–Lehmann estimate of how much larger `xs` are than `ys`, as a ratio: the
/// median of `x / y` over every pair (equal values 1, so that 0 against 0 and ∞ against ∞
/// are no change). NaN when either is empty.
pub fn hodges_lehmann_ratio(xs: &[f64], ys: &[f64]) -> f64 {
    let pairs: Vec<f64> = xs
        .iter()
        .flat_map(|&x| ys.iter().map(move |&y| ratio(x, y)))
        .collect();
    median(&pairs)
}

/// The median (NaN for none).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => {
            let (lo, hi) = (sorted[n / 2 - 1], sorted[n / 2]);
            if lo == hi { lo } else { lo / 2.0 + hi / 2.0 }
        }
    }
}

/// The one-sided p-value of Mann–Whitney's U that `xs` tend to be larger than `ys`:
/// the chance, with no difference, of a U (pairs with x > y, ties counting half) at least
/// the one seen. Exact without ties up to [`EXACT_LIMIT`] pairs; else the normal
/// approximation with the tie and continuity corrections.
pub fn mann_whitney_greater(xs: &[f64], ys: &[f64]) -> f64 {
    let (n1, n2) = (xs.len(), ys.len());
    if n1 == 0 || n2 == 0 {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = xs
        .iter()
        .map(|&x| (x, true))
        .chain(ys.iter().map(|&y| (y, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = all.len();
    let mut rank_sum_x = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let midrank = (i + j) as f64 / 2.0 + 1.0;
        let xs_here = all[i..=j].iter().filter(|(_, x)| *x).count();
        rank_sum_x += midrank * xs_here as f64;
        let t = (j - i + 1) as f64;
        tie_term += t * t * t - t;
        i = j + 1;
    }
    let u = rank_sum_x - (n1 * (n1 + 1)) as f64 / 2.0;
    if tie_term == 0.0 && n1 * n2 <= EXACT_LIMIT {
        return exact_tail(n1, n2, u);
    }
    let (n1f, n2f, nf) = (n1 as f64, n2 as f64, n as f64);
    let variance = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)));
    if variance <= 0.0 {
        return 1.0;
    }
    let z = (u - n1f * n2f / 2.0 - 0.5) / variance.sqrt();
    upper_normal_tail(z)
}

/// P(U ≥ u) with no difference and no ties: the count of the arrangements of `n1` and `n2`
/// values with at least `u` pairs in order, over all of them. The counts are the
/// coefficients of the Gaussian binomial [n1 + n2 choose n1] in q, built as the product of
/// (1 − q^(n2+i)) / (1 − q^i) for i = 1..=n1.
fn exact_tail(n1: usize, n2: usize, u: f64) -> f64 {
    let (k, other) = (n1.min(n2), n1.max(n2));
    let mut counts = vec![0.0_f64; k * other + 1];
    counts[0] = 1.0;
    for i in 1..=k {
        let up = other + i;
        for d in (up..counts.len()).rev() {
            counts[d] -= counts[d - up];
        }
        for d in i..counts.len() {
            counts[d] += counts[d - i];
        }
    }
    let total: f64 = counts.iter().sum();
    let from = u.ceil().max(0.0) as usize;
    let tail: f64 = counts.iter().skip(from).sum();
    (tail / total).clamp(0.0, 1.0)
}

/// P(Z ≥ z) for a standard normal Z.
fn upper_normal_tail(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// The complementary error function, to a relative error under 1.2e-7 (Numerical
/// Recipes' Chebyshev fit), ample for a p-value.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 { r } else { 2.0 - r }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readings(prefix: &str, pairs: &[(f64, f64)]) -> Vec<Reading> {
        pairs
            .iter()
            .enumerate()
            .map(|(i, &(before, after))| Reading {
                node: format!("{prefix}-{i}"),
                before: Some(before),
                after: Some(after),
            })
            .collect()
    }

    fn criteria(direction: Direction) -> Criteria {
        Criteria {
            direction,
            tolerance: 1.2,
            min_samples: 3,
            significance: 0.05,
        }
    }

    /// Exact p-values: counted by hand, and as SciPy's
    /// `mannwhitneyu(x, y, alternative="greater", method="exact")` gives them.
    #[test]
    fn exact_p_values_match_the_tables() {
        let cases: &[(&[f64], &[f64], f64)] = &[
            // The batch above every comparison node: 1 arrangement of C(12,4) = 495.
            (
                &[5.0, 6.0, 7.0, 8.0],
                &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
                1.0 / 495.0,
            ),
            // All but one pair in order: U = 31 of 32, 2 arrangements.
            (
                &[1.65, 6.0, 7.0, 8.0],
                &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
                2.0 / 495.0,
            ),
            // The batch below every comparison node: every arrangement has U ≥ 0.
            (
                &[0.1, 0.2, 0.3, 0.4],
                &[1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],
                1.0,
            ),
            // 3 against 3, x = {4,5,6}, y = {1,2,3}: 1 of C(6,3) = 20.
            (&[4.0, 5.0, 6.0], &[1.0, 2.0, 3.0], 0.05),
            // U = 8 of 9 with 3 against 3: 2 of 20.
            (&[2.5, 5.0, 6.0], &[1.0, 2.0, 3.0], 0.1),
            // 1 against 1.
            (&[2.0], &[1.0], 0.5),
        ];
        for (xs, ys, want) in cases {
            let p = mann_whitney_greater(xs, ys);
            assert!(
                (p - want).abs() < 1e-12,
                "{xs:?} > {ys:?}: {p}, want {want}"
            );
        }
    }

    /// With ties, the normal approximation with the tie and continuity corrections, as
    /// SciPy's `mannwhitneyu(x, y, alternative="greater", method="asymptotic")` gives it.
    #[test]
    fn with_ties_the_normal_approximation_is_used() {
        let cases: &[(&[f64], &[f64], f64)] = &[
            // U = 21.
            (
                &[1.0, 2.0, 2.0, 3.0, 3.0, 3.0],
                &[0.0, 1.0, 1.0, 2.0],
                0.029_922_649_478_320_584,
            ),
            (&[3.0; 4], &[1.0; 8], 0.000_656_826_576_829_439),
        ];
        for (xs, ys, want) in cases {
            let p = mann_whitney_greater(xs, ys);
            assert!((p - want).abs() < 1e-6, "{xs:?} > {ys:?}: {p}, want {want}");
        }
        // Every value equal: no evidence either way.
        assert_eq!(mann_whitney_greater(&[1.0, 1.0], &[1.0, 1.0, 1.0]), 1.0);
    }

    /// At the exact limit (50 × 50 pairs) the counts are still exact, as SciPy's are.
    #[test]
    fn the_exact_tail_holds_at_its_limit() {
        let xs: Vec<f64> = (0..50).map(|i| f64::from(i) * 2.0 + 1.3).collect();
        let ys: Vec<f64> = (0..50).map(|i| f64::from(i) * 2.0).collect();
        let p = mann_whitney_greater(&xs, &ys);
        assert!((p - 0.433_235_876_199_201_1).abs() < 1e-9, "{p}");
    }

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122_186_953_5),
            (1.0, 0.157_299_207_050_285_13),
            (2.0, 0.004_677_734_981_047_266),
            (-1.0, 1.842_700_792_949_715),
        ] {
            let got = erfc(x);
            assert!(
                (got - want).abs() <= 1.2e-7 * want.max(1e-300) + 1e-15,
                "erfc({x}) = {got}"
            );
        }
    }

    #[test]
    fn a_node_figure_is_the_median_of_its_finite_values_pooled_across_its_series() {
        let series = |labels: &[(&str, &str)], values: &[f64]| RangeSeries {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            values: values.to_vec(),
        };
        let read = [
            series(&[("node", "w1")], &[1.0, 3.0, 2.0]),
            series(&[("node", "w2"), ("pod", "a")], &[10.0, f64::NAN]),
            series(
                &[("node", "w2"), ("pod", "b")],
                &[20.0, f64::INFINITY, 30.0],
            ),
            series(&[("instance", "x")], &[99.0]),
            series(&[("node", "w3")], &[f64::NAN]),
            series(&[("node", "w4")], &[5.0, 6.0]),
        ];
        let want: BTreeMap<String, f64> =
            [("w1".to_string(), 2.0), ("w2".to_string(), 20.0)].into();
        assert_eq!(figures(&read, 3), want, "w4's two points are too few");
        assert_eq!(figures(&read, 1).get("w4"), Some(&5.5));
        let r = super::readings(
            &["w1".to_string(), "w3".to_string()],
            &want,
            &BTreeMap::from([("w1".to_string(), 4.0)]),
        );
        assert_eq!(r[0].before, Some(2.0));
        assert_eq!(r[0].after, Some(4.0));
        assert_eq!((r[1].before, r[1].after), (None, None));
    }

    #[test]
    fn the_effect_is_the_median_of_the_pairwise_ratios() {
        let cases: &[(&[f64], &[f64], f64)] = &[
            // Pairs 2, 1, 4, 2: median 2.
            (&[2.0, 4.0], &[1.0, 2.0], 2.0),
            // One wild baseline node moves the estimate less than it moves a mean.
            (&[1.3, 1.3, 1.3], &[1.0, 1.0, 1.0, 10.0], 1.3),
            // 0 against 0 and ∞ against ∞ are no change; ∞ against a finite one is ∞.
            (&[0.0], &[0.0], 1.0),
            (&[f64::INFINITY], &[f64::INFINITY], 1.0),
            (&[f64::INFINITY, f64::INFINITY], &[1.0], f64::INFINITY),
        ];
        for (xs, ys, want) in cases {
            assert_eq!(hodges_lehmann_ratio(xs, ys), *want, "{xs:?} over {ys:?}");
        }
        assert!(hodges_lehmann_ratio(&[], &[1.0]).is_nan());
    }

    /// A finding keeps what JSON can carry: an infinite change is null, and an
    /// inconclusive verdict has no effect or p-value.
    #[test]
    fn a_finding_keeps_the_figures_json_can_carry() {
        let c = criteria(Direction::Increase);
        let baseline = readings("w", &[(0.0, 0.0); 8]);
        let canary = readings("b", &[(0.0, 3.0), (1.0, 2.0), (0.0, 3.0), (0.0, 3.0)]);
        let found = Finding::of("restarts", &c, &judge(&canary, &baseline, &c));
        assert_eq!(found.verdict, VerdictName::Fail);
        assert_eq!(found.canary.changes, [None, Some(2.0), None, None]);
        assert_eq!(found.canary.median, None);
        assert_eq!(found.baseline.median, Some(1.0));
        assert_eq!(found.effect, None, "an infinite effect");
        assert!(found.p_value.is_some_and(|p| p < 0.05));
        let json = serde_json::to_value(&found).expect("JSON");
        assert_eq!(json["verdict"], "fail");
        assert_eq!(
            serde_json::from_value::<Finding>(json).expect("read back"),
            found
        );

        let none = Finding::of("restarts", &c, &judge(&[], &baseline, &c));
        assert_eq!(none.verdict, VerdictName::Inconclusive);
        assert_eq!(none.why.as_deref(), Some("no data for the batch"));
        assert_eq!((none.effect, none.p_value), (None, None));
        let unread = Finding::unread("restarts", &c, "the query failed: 422");
        assert_eq!(unread.why.as_deref(), Some("the query failed: 422"));
    }

    #[test]
    fn medians() {
        let cases: &[(&[f64], f64)] = &[
            (&[3.0, 1.0, 2.0], 2.0),
            (&[4.0, 1.0, 2.0, 3.0], 2.5),
            (&[1.0, f64::INFINITY, f64::INFINITY, 2.0], f64::INFINITY),
            (&[5.0], 5.0),
        ];
        for (values, want) in cases {
            assert_eq!(median(values), *want, "{values:?}");
        }
        assert!(median(&[]).is_nan());
    }

    /// The three verdicts, in both directions, from tables of readings.
    #[test]
    fn verdicts() {
        let flat = |v: f64| (v, v);
        let up = |v: f64, by: f64| (v, v * by);
        let baseline = readings(
            "w",
            &[
                flat(100.0),
                up(120.0, 1.02),
                up(80.0, 0.99),
                up(95.0, 1.01),
                up(130.0, 0.98),
                up(110.0, 1.03),
                up(90.0, 0.97),
                up(105.0, 1.005),
            ],
        );
        let batch = |by: f64| {
            readings(
                "b",
                &[
                    up(100.0, by),
                    up(140.0, by * 1.01),
                    up(70.0, by * 0.99),
                    up(90.0, by * 1.005),
                ],
            )
        };
        let cases: &[(&str, Direction, Vec<Reading>, Verdict)] = &[
            ("30 % worse", Direction::Increase, batch(1.3), Verdict::Fail),
            (
                "10 % worse, under the tolerance",
                Direction::Increase,
                batch(1.1),
                Verdict::Pass,
            ),
            ("unchanged", Direction::Increase, batch(1.0), Verdict::Pass),
            (
                "30 % better",
                Direction::Increase,
                batch(0.7),
                Verdict::Pass,
            ),
            (
                "30 % lower where lower is bad",
                Direction::Decrease,
                batch(0.7),
                Verdict::Fail,
            ),
            (
                "30 % higher where lower is bad",
                Direction::Decrease,
                batch(1.3),
                Verdict::Pass,
            ),
        ];
        for (what, direction, canary, want) in cases {
            let j = judge(canary, &baseline, &criteria(*direction));
            assert_eq!(j.verdict, *want, "{what}: {j}");
        }
        let j = judge(&batch(1.3), &baseline, &criteria(Direction::Increase));
        assert!((j.effect - 1.3).abs() < 0.02, "{j}");
        assert_eq!(j.p_value, 1.0 / 495.0);
        assert_eq!(j.canary.nodes, ["b-0", "b-1", "b-2", "b-3"]);
        assert!(j.to_string().starts_with("fail: effect 1.30"), "{j}");
    }

    /// A big effect on too few nodes to tell from chance is not a regression shown.
    #[test]
    fn an_effect_without_significance_passes() {
        let baseline = readings("w", &[(100.0, 100.0), (100.0, 150.0)]);
        let canary = readings("b", &[(100.0, 160.0), (100.0, 100.0)]);
        let c = Criteria {
            min_samples: 1,
            ..criteria(Direction::Increase)
        };
        let j = judge(&canary, &baseline, &c);
        assert_eq!(j.verdict, Verdict::Pass, "{j}");
    }

    /// No data, missing figures, NaN and negative figures never pass.
    #[test]
    fn without_enough_data_the_verdict_is_inconclusive() {
        let baseline = readings("w", &[(1.0, 1.0); 8]);
        let worse = readings("b", &[(1.0, 2.0); 4]);
        let missing = |r: &[Reading], keep: usize| -> Vec<Reading> {
            r.iter()
                .enumerate()
                .map(|(i, r)| Reading {
                    after: if i < keep { r.after } else { None },
                    ..r.clone()
                })
                .collect()
        };
        let nan_after: Vec<Reading> = worse
            .iter()
            .map(|r| Reading {
                after: Some(f64::NAN),
                ..r.clone()
            })
            .collect();
        let negative = readings("b", &[(1.0, 2.0), (1.0, -2.0), (1.0, 2.0), (1.0, 2.0)]);
        let too_few = |group, have| Unjudged::TooFewSamples {
            group,
            have,
            need: 3,
        };
        let cases: Vec<(&str, Vec<Reading>, Vec<Reading>, Unjudged)> = vec![
            (
                "no canary data",
                Vec::new(),
                baseline.clone(),
                too_few(Group::Canary, 0),
            ),
            (
                "no baseline data",
                worse.clone(),
                Vec::new(),
                too_few(Group::Baseline, 0),
            ),
            (
                "after missing on two",
                missing(&worse, 2),
                baseline.clone(),
                too_few(Group::Canary, 2),
            ),
            (
                "NaN after",
                nan_after,
                baseline.clone(),
                too_few(Group::Canary, 0),
            ),
            (
                "a negative figure",
                negative,
                baseline.clone(),
                Unjudged::Negative { node: "b-1".into() },
            ),
        ];
        for (what, canary, base, want) in cases {
            let j = judge(&canary, &base, &criteria(Direction::Increase));
            assert_eq!(j.verdict, Verdict::Inconclusive(want), "{what}: {j}");
        }
        let j = judge(&[], &baseline, &criteria(Direction::Increase));
        assert_eq!(j.to_string(), "inconclusive: no data for the batch");
    }

    /// Zeros (a count of restarts) are figures: 0 → 0 is no change, 0 → 3 an infinite one.
    #[test]
    fn zero_figures_are_changes_too() {
        let baseline = readings("w", &[(0.0, 0.0); 8]);
        let canary = readings("b", &[(0.0, 3.0); 4]);
        let j = judge(&canary, &baseline, &criteria(Direction::Increase));
        assert_eq!(j.effect, f64::INFINITY);
        assert_eq!(j.baseline.median, 1.0);
        // Every comparison node ties at 1: the approximation still finds the difference.
        assert_eq!(j.verdict, Verdict::Fail, "{j}");
    }
}
