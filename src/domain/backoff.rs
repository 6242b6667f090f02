//! The one retry policy: exponential back-off with a cap and jitter. Every place that
//! tries again — a failed step, a failing event, a lost broker connection, Slack — asks
//! it for the pause, so none of them retries in lock-step with another replica or run.

use std::time::Duration;

/// Exponential back-off: the pause after `n` failures in a row is `first · 2^(n−1)`, at
/// most `cap`, of which the upper half is jittered ("equal jitter": never less than half
/// the step, so a retry storm cannot form, and never more than the step, so a deadline
/// that holds without jitter holds with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The pause after the first failure, before jitter.
    pub first: Duration,
    /// The longest pause, before jitter.
    pub cap: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling per failure, never over `cap`.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Self { first, cap }
    }

    /// The pause after `failures` failures in a row, without jitter (0 failures: none).
    pub fn ceiling(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doublings = (failures - 1).min(31);
        self.first
            .saturating_mul(1u32 << doublings)
            .min(self.cap.max(self.first))
    }

    /// The pause after `failures` failures in a row; `unit` is a uniform sample from
    /// `[0, 1)` that sets where in the upper half of the ceiling it falls.
    pub fn pause(&self, failures: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(failures);
        let half = ceiling / 2;
        half + (ceiling - half).mul_f64(unit.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_ceiling_doubles_from_first_up_to_the_cap() {
        let b = Backoff::new(S(2), S(60));
        let cases = [
            (0, S(0)),
            (1, S(2)),
            (2, S(4)),
            (3, S(8)),
            (5, S(32)),
            (6, S(60)),
            (7, S(60)),
            (40, S(60)),
            (u32::MAX, S(60)),
        ];
        for (failures, want) in cases {
            assert_eq!(b.ceiling(failures), want, "after {failures} failure(s)");
        }
    }

    #[test]
    fn a_cap_below_first_does_not_shrink_the_first_pause() {
        assert_eq!(Backoff::new(S(5), S(1)).ceiling(3), S(5));
    }

    #[test]
    fn jitter_stays_in_the_upper_half_of_the_ceiling() {
        let b = Backoff::new(Duration::from_millis(500), S(60));
        let cases = [
            (1, 0.0, Duration::from_millis(250)),
            (1, 0.5, Duration::from_millis(375)),
            (1, 0.999_999, Duration::from_millis(500)),
            (3, 0.0, S(1)),
            (20, 0.0, S(30)),
            (20, 1.0, S(60)),
            (20, -3.0, S(30)),
            (20, 7.0, S(60)),
        ];
        for (failures, unit, want) in cases {
            let got = b.pause(failures, unit);
            let diff = got.abs_diff(want);
            assert!(
                diff <= Duration::from_millis(1),
                "{failures} failure(s), unit {unit}: {got:?}, want {want:?}"
            );
        }
    }

    #[test]
    fn every_pause_lies_between_half_the_ceiling_and_the_ceiling() {
        let b = Backoff::new(S(2), S(300));
        for failures in 0..12 {
            for i in 0..=20 {
                let unit = f64::from(i) / 20.0;
                let pause = b.pause(failures, unit);
                let ceiling = b.ceiling(failures);
                assert!(
                    pause >= ceiling / 2 && pause <= ceiling,
                    "{failures}, {unit}"
                );
            }
        }
    }
}
