//! The random half of the retry policy: samples for [`Backoff::pause`] from the operating
//! system, so replicas and runs that failed together do not retry together.

use std::time::Duration;

use crate::domain::backoff::Backoff;

/// A uniform sample from `[0, 1)`; 0.5 if the system has no randomness to give.
pub fn unit() -> f64 {
    let mut bytes = [0u8; 8];
    match getrandom::fill(&mut bytes) {
        Ok(()) => (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

/// The jittered pause of `backoff` after `failures` failures in a row.
pub fn pause(backoff: &Backoff, failures: u32) -> Duration {
    backoff.pause(failures, unit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_in_the_unit_interval_and_differ() {
        let samples: Vec<f64> = (0..64).map(|_| unit()).collect();
        assert!(samples.iter().all(|u| (0.0..1.0).contains(u)));
        let first = samples[0];
        assert!(samples.iter().any(|u| *u != first), "64 equal samples");
    }
}
