//! Where the log goes, and what happens when it cannot: a log line that cannot be written
//! (stderr on a full disk, a closed pipe) is dropped and counted, never fatal, and a
//! warning repeated many times a second is written once per interval with a count.

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Log lines that could not be written since the process started.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// How many log lines could not be written (`rollgate_log_lines_dropped_total`).
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// stderr for the tracing subscriber: a write that fails is dropped and counted. The
/// subscriber's own report of a failed write (`eprintln!`) would panic on the same full
/// stderr and take the service down with it.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if std::io::stderr().write_all(buf).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LossyStderr {
    type Writer = LossyStderr;

    fn make_writer(&'a self) -> Self::Writer {
        LossyStderr
    }
}

/// One log line per `interval` for a warning that may repeat thousands of times a second
/// (a refusal under load): [`Throttle::admit`] says whether to write it now, and how many
/// were held back since the last one written.
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    /// A throttle writing at most one line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(n)`: write the line now, `n` like it were held back since the last one;
    /// `None`: hold it back (counted).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (last, held) = &mut *state;
        if last.is_some_and(|t| now.duration_since(t) < self.interval) {
            *held += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_writes_once_per_interval_and_counts_what_it_held_back() {
        let throttle = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let cases = [
            (0, Some(0)),
            (1, None),
            (5_000, None),
            (9_999, None),
            (10_000, Some(3)),
            (10_001, None),
            (30_000, Some(1)),
            (30_001, None),
        ];
        for (ms, want) in cases {
            assert_eq!(throttle.admit(at(ms)), want, "at {ms} ms");
        }
    }
}
