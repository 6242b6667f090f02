//! The batch judge's power and false alarms (`rollgate::domain::analysis`), beside the
//! anchors' approach in the same run.
//!
//! A cluster of 12 workers and a batch of 4. Each node's figure (say its pods' p99 latency)
//! is read over a window before the batch was taken and over one after its soak:
//!
//! figure = 100 ms × the node's own level × the cluster's load in that window × noise
//!
//! - the node's own level: log-normal, σ = 0.2 (nodes run other pods: ±20 %);
//! - the cluster's load: log-normal per window, σ = 0.1, the same for every node (the
//!   day's traffic moves between the two windows);
//! - noise per node and window: log-normal, σ 0.05 or 0.10, and with a chance of 1 in 20
//!   or none a spike of × 1.5 over the whole window (a noisy neighbour);
//! - a regression multiplies the batch's figures after the soak.
//!
//! `ANALYSIS_BATCHES` (default 2,000) batches with no regression count the false halts,
//! and as many with +20 % on the batch's 4 nodes count the catches, for:
//! - **rollgate's judge**: each node's change (after / before) in the batch against the 8
//!   untouched nodes', Mann–Whitney U one-sided, fail when p ≤ 0.05 and the ratio of the
//!   median changes is above the tolerance 1.1;
//! - **a fixed threshold on the batch alone**, as an Argo Rollouts or Flagger check is
//!   written (`successCondition: result < T` over the batch's nodes' mean figure): once
//!   with T at 1.2 × the fleet's usual 100 ms, as an operator would set it, and once at
//!   its best, T at the 98th percentile of the no-regression batches' figure (2 % false
//!   halts by construction; no operator can know it), with its catches at that T.
//!
//! Each noise setting is its own table, in one run.
//!
//! Run: `cargo bench --bench analysis`.

use rollgate::domain::analysis::{Criteria, Direction, Reading, Verdict, judge};
use std::time::Instant;

const WORKERS: usize = 12;
const BATCH: usize = 4;
const REGRESSION: f64 = 1.2;

/// A seeded generator (SplitMix64): the same batches on every run for one seed.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    fn log_normal(&mut self, sigma: f64) -> f64 {
        (sigma * self.normal()).exp()
    }
}

/// The noise of a node's figure from one window to the next.
#[derive(Clone, Copy)]
struct Noise {
    /// σ of its log-normal part.
    sigma: f64,
    /// The chance of a spike of × 1.5 over a window.
    spikes: f64,
}

/// One batch's readings: the batch's nodes and the untouched ones.
struct Batch {
    canary: Vec<Reading>,
    baseline: Vec<Reading>,
}

impl Batch {
    fn draw(draws: &mut Draws, noise: Noise, regression: f64) -> Self {
        let load_before = draws.log_normal(0.1);
        let load_after = draws.log_normal(0.1);
        let window = |draws: &mut Draws, level: f64, load: f64| {
            let spike = if draws.uniform() < noise.spikes {
                1.5
            } else {
                1.0
            };
            100.0 * level * load * draws.log_normal(noise.sigma) * spike
        };
        let mut readings: Vec<Reading> = (0..WORKERS)
            .map(|i| {
                let level = draws.log_normal(0.2);
                let before = window(draws, level, load_before);
                let after = window(draws, level, load_after);
                let after = if i < BATCH { after * regression } else { after };
                Reading {
                    node: format!("worker-{i}"),
                    before: Some(before),
                    after: Some(after),
                }
            })
            .collect();
        let baseline = readings.split_off(BATCH);
        Self {
            canary: readings,
            baseline,
        }
    }

    /// What a fixed-threshold check reads: the batch's nodes' mean figure after the soak.
    fn canary_mean_after(&self) -> f64 {
        self.canary.iter().filter_map(|r| r.after).sum::<f64>() / self.canary.len() as f64
    }
}

fn share(hits: usize, of: usize) -> f64 {
    hits as f64 / of as f64 * 100.0
}

fn main() {
    let batches: usize = std::env::var("ANALYSIS_BATCHES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    let seed: u64 = std::env::var("ANALYSIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_206);
    println!(
        "analysis: {batches} batches with no regression and {batches} with +{:.0} % on {BATCH} of {WORKERS} nodes; node levels σ 0.2, cluster load σ 0.1 per window (seed {seed})",
        (REGRESSION - 1.0) * 100.0
    );
    let mut draws = Draws(seed);
    for noise in [
        Noise {
            sigma: 0.05,
            spikes: 0.05,
        },
        Noise {
            sigma: 0.05,
            spikes: 0.0,
        },
        Noise {
            sigma: 0.10,
            spikes: 0.0,
        },
    ] {
        compare(&mut draws, batches, noise);
    }
}

/// rollgate's judge and the fixed thresholds over the same batches.
fn compare(draws: &mut Draws, batches: usize, noise: Noise) {
    let criteria = Criteria {
        direction: Direction::Increase,
        tolerance: 1.1,
        min_samples: 3,
        significance: 0.05,
    };
    let healthy: Vec<Batch> = (0..batches)
        .map(|_| Batch::draw(draws, noise, 1.0))
        .collect();
    let regressed: Vec<Batch> = (0..batches)
        .map(|_| Batch::draw(draws, noise, REGRESSION))
        .collect();

    let started = Instant::now();
    let fails = |set: &[Batch]| {
        set.iter()
            .filter(|b| judge(&b.canary, &b.baseline, &criteria).verdict == Verdict::Fail)
            .count()
    };
    let (judge_false, judge_caught) = (fails(&healthy), fails(&regressed));
    let per_judgement = started.elapsed().as_secs_f64() / (2 * batches) as f64 * 1e6;

    let above = |set: &[Batch], threshold: f64| {
        set.iter()
            .filter(|b| b.canary_mean_after() >= threshold)
            .count()
    };
    let hand_set = 120.0;
    let mut healthy_figures: Vec<f64> = healthy.iter().map(Batch::canary_mean_after).collect();
    healthy_figures.sort_by(f64::total_cmp);
    let best = healthy_figures[((batches as f64 * 0.98) as usize).min(batches - 1)];

    println!(
        "\nnoise σ {}, spikes × 1.5 in {:.0} % of windows",
        noise.sigma,
        noise.spikes * 100.0
    );
    println!(
        "{:<58} {:>14} {:>10}",
        "approach", "false halts %", "caught %"
    );
    println!(
        "{:<58} {:>14.1} {:>10.1}",
        "rollgate: batch vs untouched, Mann–Whitney, tolerance 1.1",
        share(judge_false, batches),
        share(judge_caught, batches)
    );
    println!(
        "{:<58} {:>14.1} {:>10.1}",
        format!("fixed threshold on the batch, T = {hand_set:.0} ms (1.2 × usual)"),
        share(above(&healthy, hand_set), batches),
        share(above(&regressed, hand_set), batches)
    );
    println!(
        "{:<58} {:>14.1} {:>10.1}",
        format!("fixed threshold at its best, T = {best:.1} ms (2 % false)"),
        share(above(&healthy, best), batches),
        share(above(&regressed, best), batches)
    );
    println!("one judgement: {per_judgement:.1} µs");
}
