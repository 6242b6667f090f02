//! Maintenance windows: when rollgate may start work on a node.
//!
//! A window is a time of day on some days of the week in one time zone, e.g.
//! `sat,sun 22:00-06:00 Europe/Berlin`; an end at or before the start runs into the next
//! day, and the days name the day a window opens. Several windows are a union; none at all
//! means always open. Which steps wait for a window is decided here too, so that the
//! worker, the API and the tests agree: the steps that would start work on a node (a
//! gate in front of a drain or an etcd member restart, a leadership move) and the
//! pre-flight and snapshot of a run; never a step of a node already in hand.

use chrono::{DateTime, Datelike, Duration, NaiveDate, NaiveTime, TimeZone, Utc, Weekday};
use chrono_tz::Tz;
use std::fmt;

use super::step_kind::StepKind;

/// Why a window cannot be read. Each message says what a good one looks like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("window {text:?}: {why}")]
pub struct WindowError {
    text: String,
    why: String,
}

/// One maintenance window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The days it opens on, Monday first.
    days: [bool; 7],
    /// Opens at, local time.
    start: NaiveTime,
    /// Closes at, local time; at or before `start`, on the next day.
    end: NaiveTime,
    /// The time zone of `start` and `end`.
    zone: Tz,
    /// As written, for messages.
    text: String,
}

const DAY_NAMES: [(&str, &str, Weekday); 7] = [
    ("mon", "monday", Weekday::Mon),
    ("tue", "tuesday", Weekday::Tue),
    ("wed", "wednesday", Weekday::Wed),
    ("thu", "thursday", Weekday::Thu),
    ("fri", "friday", Weekday::Fri),
    ("sat", "saturday", Weekday::Sat),
    ("sun", "sunday", Weekday::Sun),
];

/// `mon` or `monday`, any case.
fn weekday(name: &str) -> Option<Weekday> {
    let name = name.trim().to_ascii_lowercase();
    DAY_NAMES
        .iter()
        .find(|(short, long, _)| name == *short || name == *long)
        .map(|(_, _, day)| *day)
}

/// `mon-fri`, `sat,sun`, `daily` or `*`.
fn parse_days(spec: &str) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    let spec = spec.trim();
    if spec.is_empty() || spec == "*" || spec.eq_ignore_ascii_case("daily") {
        return Ok([true; 7]);
    }
    for part in spec.split(',').map(str::trim) {
        let bad = || {
            format!(
                "{part:?} is not a day or range of days (mon, tue, … sun; e.g. mon-fri or sat,sun)"
            )
        };
        match part.split_once('-') {
            Some((from, to)) => {
                let from = weekday(from).ok_or_else(bad)?;
                let to = weekday(to).ok_or_else(bad)?;
                let mut day = from;
                loop {
                    days[day.num_days_from_monday() as usize] = true;
                    if day == to {
                        break;
                    }
                    day = day.succ();
                }
            }
            None => days[weekday(part).ok_or_else(bad)?.num_days_from_monday() as usize] = true,
        }
    }
    Ok(days)
}

fn parse_time(what: &str, text: &str) -> Result<NaiveTime, String> {
    let text = text.trim();
    NaiveTime::parse_from_str(text, "%H:%M:%S")
        .or_else(|_| NaiveTime::parse_from_str(text, "%H:%M"))
        .map_err(|_| format!("{what} {text:?} is not a time of day (HH:MM or HH:MM:SS, 24-hour)"))
}

fn parse_zone(text: &str) -> Result<Tz, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Tz::UTC);
    }
    text.parse::<Tz>().map_err(|_| {
        format!("time zone {text:?} is not a known IANA zone (e.g. UTC, Europe/Berlin)")
    })
}

impl Window {
    /// A window from its parts: `days` as `mon-fri`, `sat,sun` or empty for every day;
    /// `start` and `end` as `HH:MM` or `HH:MM:SS`; `zone` an IANA name, empty for UTC.
    pub fn from_parts(days: &str, start: &str, end: &str, zone: &str) -> Result<Self, WindowError> {
        let text = format!(
            "{} {start}-{end} {}",
            if days.is_empty() { "daily" } else { days },
            if zone.is_empty() { "UTC" } else { zone }
        );
        let fail = |why: String| WindowError {
            text: text.clone(),
            why,
        };
        let days = parse_days(days).map_err(fail)?;
        let start = parse_time("start", start).map_err(fail)?;
        let end = parse_time("end", end).map_err(fail)?;
        let zone = parse_zone(zone).map_err(fail)?;
        if start == end {
            return Err(fail(
                "start and end are the same time: for no limit at all, configure no window".into(),
            ));
        }
        Ok(Self {
            days,
            start,
            end,
            zone,
            text: text.clone(),
        })
    }

    /// A window written as one line: `[days] HH:MM-HH:MM [zone]`, e.g.
    /// `mon-fri 22:00-06:00 Europe/Berlin` or `02:00-04:00` (every day, UTC).
    pub fn parse(text: &str) -> Result<Self, WindowError> {
        let fail = |why: &str| WindowError {
            text: text.trim().to_owned(),
            why: why.to_owned(),
        };
        let words: Vec<&str> = text.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| w.contains(':'))
            .ok_or_else(|| fail("no time range: write [days] HH:MM-HH:MM [zone], e.g. mon-fri 22:00-06:00 Europe/Berlin"))?;
        let (days, rest) = words.split_at(at);
        let (range, zone) = rest.split_first().unwrap_or((&"", &[]));
        let Some((start, end)) = range.split_once('-') else {
            return Err(fail("the time range is HH:MM-HH:MM, e.g. 22:00-06:00"));
        };
        if days.len() > 1 || zone.len() > 1 {
            return Err(fail(
                "write [days] HH:MM-HH:MM [zone] with no spaces inside the days (mon-fri or sat,sun)",
            ));
        }
        let mut window = Self::from_parts(
            days.first().copied().unwrap_or_default(),
            start,
            end,
            zone.first().copied().unwrap_or_default(),
        )
        .map_err(|e| fail(&e.why))?;
        window.text = text.trim().to_owned();
        Ok(window)
    }

    fn opens_on(&self, day: Weekday) -> bool {
        self.days[day.num_days_from_monday() as usize]
    }

    /// `date`'s `time` in the window's zone, as UTC. A time a DST change skips counts
    /// from just after the skip; a time it repeats, the first time.
    fn instant(&self, date: NaiveDate, time: NaiveTime) -> Option<DateTime<Utc>> {
        let local = date.and_time(time);
        self.zone
            .from_local_datetime(&local)
            .earliest()
            .or_else(|| {
                self.zone
                    .from_local_datetime(&(local + Duration::hours(1)))
                    .earliest()
            })
            .map(|t| t.with_timezone(&Utc))
    }

    /// The openings around `now`: each `(opens, closes)` from the day before `now` to a
    /// week after, in order.
    fn openings(
        &self,
        now: DateTime<Utc>,
    ) -> impl Iterator<Item = (DateTime<Utc>, DateTime<Utc>)> + '_ {
        let today = now.with_timezone(&self.zone).date_naive();
        (-1..=8)
            .filter_map(move |offset| {
                let day = today + Duration::days(offset);
                if !self.opens_on(day.weekday()) {
                    return None;
                }
                let end_day = if self.end <= self.start {
                    day + Duration::days(1)
                } else {
                    day
                };
                Some((
                    self.instant(day, self.start)?,
                    self.instant(end_day, self.end)?,
                ))
            })
            // A night a DST change skips the whole window of opens nothing.
            .filter(|(opens, closes)| opens < closes)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whether work may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Now {
    /// No window is configured.
    Always,
    /// A window is open: since when, and when the last open one closes.
    Open {
        /// When the open window opened.
        since: DateTime<Utc>,
        /// When it closes.
        closes: DateTime<Utc>,
    },
    /// No window is open; the next opens at `opens`.
    Closed {
        /// The next opening.
        opens: DateTime<Utc>,
    },
}

impl Now {
    /// Whether work may start.
    pub fn is_open(self) -> bool {
        !matches!(self, Self::Closed { .. })
    }

    /// The start of the window open now or of the next one; `None` with no window.
    pub fn opening(self) -> Option<DateTime<Utc>> {
        match self {
            Self::Always => None,
            Self::Open { since, .. } => Some(since),
            Self::Closed { opens } => Some(opens),
        }
    }
}

/// The configured windows (a union; none means always open).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Windows(pub Vec<Window>);

impl Windows {
    /// Whether a window is open at `now`, or when the next opens.
    pub fn at(&self, now: DateTime<Utc>) -> Now {
        if self.0.is_empty() {
            return Now::Always;
        }
        let mut open: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
        let mut next: Option<DateTime<Utc>> = None;
        for (opens, closes) in self.0.iter().flat_map(|w| w.openings(now)) {
            if opens <= now && now < closes {
                open = Some(match open {
                    Some((since, until)) => (since.min(opens), until.max(closes)),
                    None => (opens, closes),
                });
            } else if opens > now {
                next = Some(next.map_or(opens, |n| n.min(opens)));
            }
        }
        match (open, next) {
            (Some((since, closes)), _) => Now::Open { since, closes },
            (None, Some(opens)) => Now::Closed { opens },
            // Every window opens on at least one day, so one opens within a week.
            (None, None) => Now::Closed {
                opens: now + Duration::days(7),
            },
        }
    }

    /// The configured windows, in words.
    pub fn describe(&self) -> String {
        self.0
            .iter()
            .map(Window::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Why `step` must wait at `now`, and until when; `None` when it may go ahead.
    /// `dry_run` (a dry run is never held) is asked only of a step that could wait.
    pub fn hold(
        &self,
        step: &StepKind,
        dry_run: impl FnOnce() -> bool,
        now: DateTime<Utc>,
    ) -> Option<(DateTime<Utc>, String)> {
        if self.0.is_empty() || !step.waits_for_window() || dry_run() {
            return None;
        }
        match self.at(now) {
            Now::Closed { opens } => Some((
                opens,
                format!(
                    "outside the maintenance windows ({}); the next opens at {}",
                    self.describe(),
                    opens.format("%Y-%m-%d %H:%M:%S UTC")
                ),
            )),
            Now::Always | Now::Open { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Stage;
    use crate::domain::upgrade_step::UpgradeStep;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .expect("a test time")
            .with_timezone(&Utc)
    }

    fn windows(lines: &[&str]) -> Windows {
        Windows(
            lines
                .iter()
                .map(|l| Window::parse(l).expect("a good window"))
                .collect(),
        )
    }

    #[test]
    fn windows_open_and_close_by_day_time_and_zone() {
        // 2026-12-05 is a Saturday.
        let cases: [(&[&str], &str, Now); 9] = [
            (&[], "2026-12-05T12:00:00Z", Now::Always),
            (
                &["02:00-04:00"],
                "2026-12-05T03:00:00Z",
                Now::Open {
                    since: at("2026-12-05T02:00:00Z"),
                    closes: at("2026-12-05T04:00:00Z"),
                },
            ),
            (
                &["02:00-04:00"],
                "2026-12-05T04:00:00Z",
                Now::Closed {
                    opens: at("2026-12-06T02:00:00Z"),
                },
            ),
            // Overnight, opening Saturday and Sunday: Sunday 05:00 is in Saturday's.
            (
                &["sat,sun 22:00-06:00"],
                "2026-12-06T05:00:00Z",
                Now::Open {
                    since: at("2026-12-05T22:00:00Z"),
                    closes: at("2026-12-06T06:00:00Z"),
                },
            ),
            // Monday 05:00 is in Sunday's; Tuesday 05:00 in nobody's.
            (
                &["sat,sun 22:00-06:00"],
                "2026-12-08T05:00:00Z",
                Now::Closed {
                    opens: at("2026-12-12T22:00:00Z"),
                },
            ),
            // Berlin is UTC+1 in December.
            (
                &["mon-fri 22:00-23:00 Europe/Berlin"],
                "2026-12-07T21:30:00Z",
                Now::Open {
                    since: at("2026-12-07T21:00:00Z"),
                    closes: at("2026-12-07T22:00:00Z"),
                },
            ),
            (
                &["mon-fri 22:00-23:00 Europe/Berlin"],
                "2026-12-05T21:30:00Z",
                Now::Closed {
                    opens: at("2026-12-07T21:00:00Z"),
                },
            ),
            // A union: the earlier of two next openings.
            (
                &["sun 01:00-02:00", "sat 13:00:30-13:05"],
                "2026-12-05T12:00:00Z",
                Now::Closed {
                    opens: at("2026-12-05T13:00:30Z"),
                },
            ),
            // Two that overlap are open together until the later closes.
            (
                &["10:00-12:00", "11:00-13:00"],
                "2026-12-05T11:30:00Z",
                Now::Open {
                    since: at("2026-12-05T10:00:00Z"),
                    closes: at("2026-12-05T13:00:00Z"),
                },
            ),
        ];
        for (lines, now, want) in cases {
            assert_eq!(windows(lines).at(at(now)), want, "{lines:?} at {now}");
        }
    }

    #[test]
    fn daylight_saving_changes_move_the_window_with_the_clock() {
        let berlin = windows(&["02:30-03:30 Europe/Berlin"]);
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that night,
        // so the window opens at 03:30 CEST = 01:30 UTC and closes then too (empty);
        // the next night opens at 02:30 CEST = 00:30 UTC.
        assert!(!berlin.at(at("2026-03-29T01:00:00Z")).is_open());
        assert_eq!(
            berlin.at(at("2026-03-30T00:45:00Z")),
            Now::Open {
                since: at("2026-03-30T00:30:00Z"),
                closes: at("2026-03-30T01:30:00Z"),
            }
        );
        // Winter: 02:30 CET = 01:30 UTC.
        assert_eq!(
            berlin.at(at("2026-12-05T01:00:00Z")),
            Now::Closed {
                opens: at("2026-12-05T01:30:00Z"),
            }
        );
    }

    #[test]
    fn bad_windows_say_what_is_wrong() {
        let cases = [
            ("", "no time range"),
            ("mon-fri", "no time range"),
            (
                "mon-fri 25:00-04:00",
                "start \"25:00\" is not a time of day",
            ),
            ("mon-fri 22:00-4", "end \"4\" is not a time of day"),
            ("mon-fri 22:00", "the time range is HH:MM-HH:MM"),
            ("funday 22:00-04:00", "\"funday\" is not a day"),
            ("monkey 22:00-04:00", "\"monkey\" is not a day"),
            (
                "22:00-04:00 Mars/Olympus",
                "\"Mars/Olympus\" is not a known IANA zone",
            ),
            ("22:00-22:00", "start and end are the same"),
            ("mon - fri 22:00-04:00", "no spaces inside the days"),
        ];
        for (text, want) in cases {
            let err = Window::parse(text).expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
        for good in [
            "02:00-04:00",
            "daily 02:00-04:00 UTC",
            "Mon-Friday 22:00:30-06:00 Europe/Berlin",
            "sat,sun 00:00-23:59:59 America/New_York",
            "fri-mon 22:00-06:00",
        ] {
            assert!(Window::parse(good).is_ok(), "{good}");
        }
        let wrap = Window::parse("fri-mon 22:00-06:00").expect("wraps the week");
        assert!(wrap.opens_on(Weekday::Sun) && !wrap.opens_on(Weekday::Wed));
    }

    #[test]
    fn only_steps_that_start_work_on_a_node_wait() {
        let node = || "w1".to_owned();
        let waits = |step: StepKind| step.waits_for_window();
        let gate = |stage, node| StepKind::from(UpgradeStep::Gate { stage, node });
        let cases: [(StepKind, bool); 9] = [
            (gate(Stage::Preflight, None), true),
            (gate(Stage::Workers, Some(node())), true),
            (gate(Stage::ControlPlane, Some(node())), true),
            (gate(Stage::Postflight, None), false),
            (UpgradeStep::EtcdSnapshot.into(), true),
            (UpgradeStep::MoveLeader { node: node() }.into(), true),
            (
                UpgradeStep::Drain {
                    stage: Stage::Workers,
                    node: node(),
                }
                .into(),
                false,
            ),
            (
                UpgradeStep::Soak {
                    stage: Stage::Workers,
                    node: node(),
                }
                .into(),
                false,
            ),
            (UpgradeStep::NodesAtTarget.into(), false),
        ];
        for (step, want) in cases {
            assert_eq!(waits(step.clone()), want, "{step:?}");
        }
        let closed = windows(&["02:00-03:00"]);
        let noon = at("2026-12-05T12:00:00Z");
        let preflight = gate(Stage::Preflight, None);
        let (until, why) = closed.hold(&preflight, || false, noon).expect("held");
        assert_eq!(until, at("2026-12-06T02:00:00Z"));
        assert!(
            why.contains("02:00-03:00") && why.contains("2026-12-06 02:00:00 UTC"),
            "{why}"
        );
        assert_eq!(
            closed.hold(&preflight, || true, noon),
            None,
            "a dry run is not held"
        );
        assert_eq!(Windows::default().hold(&preflight, || false, noon), None);
    }
}
