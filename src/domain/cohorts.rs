//! Which nodes a batch analysis compares, read off the run's plan: the batch just soaked
//! (the canary) and the comparison nodes (the baseline), with the instants that bound the
//! two windows each analysis reads.
//!
//! - **The canary** is the batch's workers whose cycle ran and ended (drained and
//!   uncordoned): a worker left behind, still cordoned, or skipped as not needed carries
//!   no change to judge. A batch with fewer such workers than the analyses need
//!   (`min_samples`) is judged together with the batches just before it; while all the
//!   batches so far are too few, there is nothing to judge yet.
//! - **The baseline** is the workers whose version was the same over both windows: those
//!   not yet touched (so the first batch is compared with every worker not in it) and,
//!   when they are too few (the last batches), those done before the canary's first batch
//!   was taken.
//! - **The windows.** "Before" ends when the canary's first batch was taken (its gate
//!   passed); "after" ends now, and begins no earlier than the batch came back (its soak
//!   began): figures from while the nodes were drained say nothing about the new version.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::run::{Step, StepStatus, Steps};

/// What the batch is compared with: how many of each kind of comparison node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Baseline {
    /// Workers not yet touched.
    pub untouched: usize,
    /// Workers done before the canary's first batch was taken.
    pub done_before: usize,
}

/// The two groups of an analysis and the instants that bound its windows.
#[derive(Debug, Clone, PartialEq)]
pub struct Cohorts {
    /// The workers judged: the batch's, and those of the batches pooled with it, in plan
    /// order.
    pub canary: Vec<String>,
    /// How many batches the canary spans (1: the batch alone).
    pub batches: usize,
    /// The comparison nodes: the untouched first, then those done before, in plan order.
    pub baseline: Vec<String>,
    /// Which nodes the baseline is.
    pub baseline_is: Baseline,
    /// When the canary's first batch was taken: its gate passed. The "before" window ends
    /// here.
    pub taken_at: DateTime<Utc>,
    /// When the batch was back: its soak began (or its last step ended). The "after"
    /// window begins no earlier.
    pub back_at: DateTime<Utc>,
}

/// Why the cohorts of an analysis step cannot be read from its plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CohortsError {
    /// No gate before it: the plan does not have it after a batch.
    #[error("the analysis step at {0} follows no batch of workers")]
    NoBatch(usize),
    /// The batch's gate has no end time.
    #[error("the batch's gate has not passed")]
    NotTaken,
    /// Every batch so far together has fewer workers than the analyses need.
    #[error(
        "not judged yet: {have} worker(s) done of the {need} min_samples needs; judged with the batches that follow"
    )]
    TooFewYet {
        /// Workers done so far.
        have: usize,
        /// The analyses' `min_samples`.
        need: usize,
    },
}

/// The cohorts of the analysis step at `index` of `steps`, each group with at least
/// `need` workers where the plan has them.
pub fn cohorts(steps: &Steps, index: usize, need: usize) -> Result<Cohorts, CohortsError> {
    let gates: Vec<usize> = steps
        .range(..index)
        .enumerate()
        .filter(|(_, s)| s.kind.is_gate() && s.kind.among_workers())
        .map(|(i, _)| i)
        .collect();
    let last_gate = *gates.last().ok_or(CohortsError::NoBatch(index))?;
    if steps[last_gate].ended_at.is_none() {
        return Err(CohortsError::NotTaken);
    }
    let batch = steps.range(last_gate + 1..index);
    let back_at = batch
        .clone()
        .filter(|s| s.kind.is_soak())
        .filter_map(|s| s.started_at)
        .max()
        .or_else(|| batch.filter_map(|s| s.ended_at).max());
    // Pool batches backwards until the canary has enough workers.
    let mut first_gate = last_gate;
    let mut canary = ended_cycles(steps.range(first_gate + 1..index));
    let mut batches = 1;
    for &gate in gates.iter().rev().skip(1) {
        if canary.len() >= need {
            break;
        }
        first_gate = gate;
        canary = ended_cycles(steps.range(first_gate + 1..index));
        batches += 1;
    }
    if canary.len() < need {
        return Err(CohortsError::TooFewYet {
            have: canary.len(),
            need,
        });
    }
    let taken_at = steps[first_gate].ended_at.ok_or(CohortsError::NotTaken)?;
    let mut untouched: Vec<String> = Vec::new();
    let mut touched: Vec<&str> = Vec::new();
    for step in steps.range(index + 1..) {
        let Some(lane) = step.kind.lane() else {
            continue;
        };
        if step.status != StepStatus::Pending {
            touched.push(lane);
        } else if !untouched.iter().any(|n| n == lane) && !canary.iter().any(|n| n == lane) {
            untouched.push(lane.to_owned());
        }
    }
    untouched.retain(|n| !touched.contains(&n.as_str()));
    let mut baseline = untouched;
    let untouched = baseline.len();
    if untouched < need {
        baseline.extend(
            ended_cycles(steps.range(..first_gate))
                .into_iter()
                .filter(|n| !canary.contains(n)),
        );
    }
    Ok(Cohorts {
        canary,
        batches,
        baseline_is: Baseline {
            untouched,
            done_before: baseline.len() - untouched,
        },
        baseline,
        taken_at,
        back_at: back_at.unwrap_or(taken_at),
    })
}

/// The workers of `steps` whose cycle ran and ended: drained (a cycle skipped as not
/// needed never started its drain) and uncordoned, in plan order.
fn ended_cycles<'a>(steps: impl Iterator<Item = &'a Step> + Clone) -> Vec<String> {
    let drained: Vec<&str> = steps
        .clone()
        .filter(|s| s.kind.is_drain() && s.started_at.is_some())
        .filter_map(|s| s.kind.lane())
        .collect();
    let mut out: Vec<String> = Vec::new();
    for step in steps {
        if let Some(lane) = step.kind.lane()
            && step.kind.is_uncordon()
            && step.status == StepStatus::Done
            && drained.contains(&lane)
            && !out.iter().any(|n| n == lane)
        {
            out.push(lane.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::upgrade_step::{Stage, UpgradeStep};
    use chrono::TimeZone;

    fn t(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + secs, 0).single().unwrap()
    }

    /// The steps of batches of workers, each `(nodes, how far it got)`, an analysis after
    /// each batch's soak; returns the steps and each analysis's index.
    fn plan(batches: &[(&[&str], Progress)]) -> (Steps, Vec<usize>) {
        let mut steps = Vec::new();
        let mut analyses = Vec::new();
        for (b, (nodes, progress)) in batches.iter().enumerate() {
            let base = 100 * b as i64;
            let mut gate = Step::new(UpgradeStep::Gate {
                stage: Stage::Workers,
                node: Some(nodes[0].to_owned()),
            });
            if *progress != Progress::Pending {
                gate.status = StepStatus::Done;
                gate.ended_at = Some(t(base + 10));
            }
            steps.push(gate);
            for node in *nodes {
                let node = node.to_string();
                let mut drain = Step::new(UpgradeStep::Drain {
                    stage: Stage::Workers,
                    node: node.clone(),
                });
                let mut uncordon = Step::new(UpgradeStep::Uncordon {
                    stage: Stage::Workers,
                    node: node.clone(),
                });
                match progress {
                    Progress::Pending => {}
                    Progress::Working => drain.status = StepStatus::Running,
                    Progress::Skipped => {
                        drain.status = StepStatus::Done;
                        uncordon.status = StepStatus::Done;
                    }
                    Progress::Soaked | Progress::LeftBehind(_) => {
                        drain.status = StepStatus::Done;
                        drain.started_at = Some(t(base + 20));
                        let failed = matches!(progress, Progress::LeftBehind(n) if *n == node);
                        uncordon.status = if failed {
                            StepStatus::Pending
                        } else {
                            StepStatus::Done
                        };
                        uncordon.ended_at = Some(t(base + 40));
                    }
                }
                steps.push(drain);
                steps.push(uncordon);
            }
            let mut soak = Step::new(UpgradeStep::Soak {
                stage: Stage::Workers,
                node: nodes[nodes.len() - 1].to_owned(),
            });
            if matches!(
                progress,
                Progress::Soaked | Progress::LeftBehind(_) | Progress::Skipped
            ) {
                soak.status = StepStatus::Done;
                soak.started_at = Some(t(base + 50));
            }
            steps.push(soak);
            analyses.push(steps.len());
            steps.push(Step::new(UpgradeStep::Analysis {
                node: nodes[nodes.len() - 1].to_owned(),
            }));
        }
        (steps.into(), analyses)
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Progress {
        Pending,
        Working,
        Soaked,
        LeftBehind(&'static str),
        /// Every cycle skipped as not needed (a reboot whose sentinel cleared).
        Skipped,
    }

    fn names(nodes: &[&str]) -> Vec<String> {
        nodes.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn the_batch_is_compared_with_the_untouched_and_the_last_with_those_done_before() {
        use Progress::*;
        let (a, b, c): (&[&str], &[&str], &[&str]) = (&["w1", "w2"], &["w3", "w4"], &["w5"]);
        let base = |untouched, done_before| Baseline {
            untouched,
            done_before,
        };
        // (progress of the three batches, which analysis, min_samples, canary, batches
        // pooled, baseline, its kinds, taken, back)
        let cases = [
            (
                [Soaked, Pending, Pending],
                0,
                2,
                names(a),
                1,
                names(&["w3", "w4", "w5"]),
                base(3, 0),
                10,
                50,
            ),
            (
                [Soaked, Soaked, Pending],
                1,
                1,
                names(b),
                1,
                names(c),
                base(1, 0),
                110,
                150,
            ),
            // Too few untouched: those done before the batch join them.
            (
                [Soaked, Soaked, Pending],
                1,
                2,
                names(b),
                1,
                names(&["w5", "w1", "w2"]),
                base(1, 2),
                110,
                150,
            ),
            (
                [Soaked, Soaked, Soaked],
                2,
                1,
                names(c),
                1,
                names(&["w1", "w2", "w3", "w4"]),
                base(0, 4),
                210,
                250,
            ),
            // A batch smaller than min_samples is pooled with the one before it: the
            // before window ends when that one was taken.
            (
                [Soaked, Soaked, Soaked],
                2,
                2,
                names(&["w3", "w4", "w5"]),
                2,
                names(&["w1", "w2"]),
                base(0, 2),
                110,
                250,
            ),
            (
                [LeftBehind("w2"), Pending, Pending],
                0,
                1,
                names(&["w1"]),
                1,
                names(&["w3", "w4", "w5"]),
                base(3, 0),
                10,
                50,
            ),
            (
                [Soaked, Skipped, Soaked],
                2,
                1,
                names(c),
                1,
                names(&["w1", "w2"]),
                base(0, 2),
                210,
                250,
            ),
            (
                [Soaked, LeftBehind("w3"), Soaked],
                2,
                1,
                names(c),
                1,
                names(&["w1", "w2", "w4"]),
                base(0, 3),
                210,
                250,
            ),
        ];
        for (progress, which, need, canary, batches, baseline, baseline_is, taken, back) in cases {
            let (steps, analyses) = plan(&[(a, progress[0]), (b, progress[1]), (c, progress[2])]);
            let got = cohorts(&steps, analyses[which], need).expect("cohorts");
            assert_eq!(
                got,
                Cohorts {
                    canary,
                    batches,
                    baseline,
                    baseline_is,
                    taken_at: t(taken),
                    back_at: t(back),
                },
                "{progress:?} analysis {which}, min_samples {need}"
            );
        }
    }

    #[test]
    fn while_every_batch_so_far_is_too_few_there_is_nothing_to_judge_yet() {
        use Progress::*;
        let (steps, analyses) = plan(&[(&["w1"], Soaked), (&["w2"], Soaked), (&["w3"], Pending)]);
        assert_eq!(
            cohorts(&steps, analyses[0], 2),
            Err(CohortsError::TooFewYet { have: 1, need: 2 })
        );
        let got = cohorts(&steps, analyses[1], 2).expect("two batches pooled");
        assert_eq!((got.canary, got.batches), (names(&["w1", "w2"]), 2));
        assert_eq!(got.taken_at, t(10));
    }

    #[test]
    fn a_node_of_a_later_batch_already_in_hand_is_not_untouched() {
        use Progress::*;
        let (steps, analyses) = plan(&[(&["w1"], Soaked), (&["w2", "w3"], Working)]);
        let got = cohorts(&steps, analyses[0], 1).expect("cohorts");
        assert_eq!(got.baseline, Vec::<String>::new());
        assert_eq!(
            got.baseline_is,
            Baseline {
                untouched: 0,
                done_before: 0
            }
        );
    }

    #[test]
    fn an_analysis_without_a_passed_batch_gate_cannot_be_read() {
        let (steps, analyses) = plan(&[(&["w1"], Progress::Pending)]);
        assert_eq!(cohorts(&steps, analyses[0], 1), Err(CohortsError::NotTaken));
        let lone: Steps = [Step::new(UpgradeStep::Analysis { node: "w1".into() })]
            .into_iter()
            .collect();
        assert_eq!(cohorts(&lone, 0, 1), Err(CohortsError::NoBatch(0)));
    }
}
