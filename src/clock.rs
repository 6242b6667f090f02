//! Time as rollgate measures durations, apart from the wall clock it shows and plans
//! windows by: NTP may step the wall clock (an hour, after a bad RTC or a VM resume), and a
//! soak or a timeout measured on it would end early or late by as much.
//!
//! How long ago a step started is read off the monotonic clock from the first time this
//! process saw that start (before that, and after a restart of rollgate, the wall clock is
//! all there is); the embedded queue asks [`WallSteps`] whether the wall clock was stepped
//! back, to keep the delays of what it holds.

use chrono::{DateTime, Utc};

use crate::domain::run::Step;
use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Anchors older than this are forgotten (no step waits that long).
const FORGET_AFTER: Duration = Duration::from_secs(14 * 24 * 3600);

/// Per wall-clock start (ns since the epoch), the monotonic instant it corresponds to.
static ANCHORS: LazyLock<Mutex<BTreeMap<i64, Instant>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// How long ago `started` (a wall-clock time this process or an earlier one recorded)
/// was: by the wall clock the first time it is asked, by the monotonic clock from then on.
pub fn since(started: DateTime<Utc>) -> Duration {
    let mono = Instant::now();
    let key = started.timestamp_nanos_opt().unwrap_or(i64::MAX);
    let mut anchors = ANCHORS.lock().unwrap_or_else(|e| e.into_inner());
    let anchor = *anchors.entry(key).or_insert_with(|| {
        let wall = (Utc::now() - started).to_std().unwrap_or(Duration::ZERO);
        mono.checked_sub(wall).unwrap_or(mono)
    });
    if anchors.len() > 1024 {
        anchors.retain(|_, a| mono.duration_since(*a) < FORGET_AFTER);
    }
    mono.duration_since(anchor)
}

/// Whether `step` has been going on for longer than `limit`, counted by [`since`] from its
/// first start (persisted, so a restart of rollgate does not reset it); not started, no.
pub fn over(step: &Step, limit: Duration) -> bool {
    step.started_at
        .is_some_and(|started| since(started) > limit)
}

/// Watches the wall clock against the monotonic one.
#[derive(Debug)]
pub struct WallSteps {
    origin: Instant,
    /// Wall minus monotonic time at the last look, in ms.
    offset_ms: i64,
}

impl Default for WallSteps {
    fn default() -> Self {
        let origin = Instant::now();
        Self {
            origin,
            offset_ms: Utc::now().timestamp_millis(),
        }
    }
}

impl WallSteps {
    /// By how many ms the wall clock was stepped back since the last look, if it was.
    pub fn stepped_back(&mut self) -> Option<i64> {
        let mono_ms = i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX);
        let offset = Utc::now().timestamp_millis() - mono_ms;
        let back = stepped_back(self.offset_ms, offset);
        self.offset_ms = offset;
        back
    }
}

/// A step back of the wall clock between two looks, each the wall clock minus the
/// monotonic clock: more than a second back is a step (NTP slews smaller errors).
fn stepped_back(before_ms: i64, now_ms: i64) -> Option<i64> {
    let back = before_ms.saturating_sub(now_ms);
    (back > 1000).then_some(back)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_step_back_of_more_than_a_second_counts() {
        let cases = [
            (10_000, 10_000, None),
            (10_000, 9_500, None),
            (10_000, 9_000, None),
            (10_000, 8_999, Some(1001)),
            (10_000, 10_000 - 3_600_000, Some(3_600_000)),
            (10_000, 10_000 + 3_600_000, None),
            (i64::MIN, 0, None),
        ];
        for (before, now, want) in cases {
            assert_eq!(stepped_back(before, now), want, "{before} -> {now}");
        }
    }

    #[test]
    fn a_step_is_over_its_limit_from_its_first_start() {
        let mut step = Step::new(crate::domain::upgrade_step::UpgradeStep::Apply {
            node: "cp-1".into(),
        });
        assert!(!over(&step, Duration::from_secs(1)));
        step.started_at = Some(Utc::now() - chrono::Duration::seconds(5));
        assert!(over(&step, Duration::from_secs(1)));
        assert!(!over(&step, Duration::from_secs(10)));
    }

    #[test]
    fn a_start_is_measured_from_its_first_sight_on() {
        let started = Utc::now() - chrono::Duration::seconds(30);
        let first = since(started);
        assert!(first >= Duration::from_secs(30) && first < Duration::from_secs(31));
        let again = since(started);
        assert!(again >= first && again < first + Duration::from_secs(1));
        let future = since(Utc::now() + chrono::Duration::seconds(60));
        assert!(future < Duration::from_secs(1), "{future:?}");
    }
}
