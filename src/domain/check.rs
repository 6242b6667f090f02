//! Checks with thresholds (`[[gate.checks]]`), asked at the gate before each node or
//! batch is taken: any PromQL, its value held against a success and a failure condition,
//! `count` measurements `interval` apart, and a three-way verdict as Argo Rollouts'
//! analysis gives one.
//!
//! - **A measurement** is a success when every series the query returned meets the
//!   success condition, a failure when any meets the failure condition (or, with only a
//!   success condition, when one does not meet it), and inconclusive when the query failed,
//!   returned nothing, returned a value that is not a number, or (with both conditions)
//!   met neither. No data is never a success.
//! - **The verdict**: failed once more measurements failed than `failure_limit`;
//!   inconclusive once more were inconclusive than `inconclusive_limit`; passed once
//!   `count` were taken within both limits; measuring until then.

use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// How a value is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Op {
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

impl Op {
    const ALL: [(&'static str, Op); 6] = [
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<", Op::Lt),
        (">", Op::Gt),
    ];

    fn text(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, op)| *op == self)
            .map_or("?", |(t, _)| *t)
    }
}

/// A condition on a measured value: `< 0.05`, or as Argo writes it, `result < 0.05`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Condition {
    /// The comparison.
    pub op: Op,
    /// What the value is compared with.
    pub threshold: f64,
}

impl Condition {
    /// Reads `value OP NUMBER` (`value`, `result` or `result[0]` may be left out).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{text:?} is not a condition like \"< 0.05\" or \"result >= 100\" (one of <, <=, >, >=, ==, != and a number)"
            )
        };
        let rest = text.trim();
        let rest = ["result[0]", "result", "value"]
            .iter()
            .find_map(|word| rest.strip_prefix(word))
            .unwrap_or(rest)
            .trim_start();
        let (op, number) = Op::ALL
            .iter()
            .find_map(|(t, op)| rest.strip_prefix(t).map(|n| (*op, n)))
            .ok_or_else(bad)?;
        let threshold: f64 = number.trim().parse().map_err(|_| bad())?;
        if !threshold.is_finite() {
            return Err(bad());
        }
        Ok(Self { op, threshold })
    }

    /// Whether `value` meets it (a NaN meets none).
    pub fn holds(&self, value: f64) -> bool {
        let t = self.threshold;
        match self.op {
            Op::Lt => value < t,
            Op::Le => value <= t,
            Op::Gt => value > t,
            Op::Ge => value >= t,
            Op::Eq => value == t,
            Op::Ne => !value.is_nan() && value != t,
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op.text(), self.threshold)
    }
}

/// One check as the gate asks it (`[[gate.checks]]`).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRule {
    /// Its name.
    pub name: String,
    /// PromQL; every series it returns is measured.
    pub query: String,
    /// What a successful measurement meets.
    pub success: Option<Condition>,
    /// What a failed measurement meets.
    pub failure: Option<Condition>,
    /// How many measurements make a verdict.
    pub count: u32,
    /// The time between two measurements.
    pub interval: Duration,
    /// The most failed measurements that still pass.
    pub failure_limit: u32,
    /// The most inconclusive measurements that still pass.
    pub inconclusive_limit: u32,
}

/// One measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Measurement {
    /// Every value met the success condition.
    Success {
        /// The values measured.
        values: Vec<f64>,
    },
    /// A value met the failure condition, or missed the only (success) one.
    Failure {
        /// The values measured.
        values: Vec<f64>,
    },
    /// No judgement, and why.
    Inconclusive {
        /// Why.
        why: String,
    },
}

/// Measures what the query returned (the value of each series, or why there is none).
pub fn measure(rule: &CheckRule, reading: Result<Vec<f64>, String>) -> Measurement {
    let values = match reading {
        Err(e) => return Measurement::Inconclusive { why: e },
        Ok(v) if v.is_empty() => {
            return Measurement::Inconclusive {
                why: "no data".into(),
            };
        }
        Ok(v) if v.iter().any(|x| !x.is_finite()) => {
            return Measurement::Inconclusive {
                why: format!("a value is not a number: {}", numbers(&v)),
            };
        }
        Ok(v) => v,
    };
    let failed = rule
        .failure
        .is_some_and(|c| values.iter().any(|&v| c.holds(v)));
    let succeeded = rule
        .success
        .is_some_and(|c| values.iter().all(|&v| c.holds(v)));
    match (failed, succeeded, rule.success, rule.failure) {
        (true, _, _, _) => Measurement::Failure { values },
        (false, true, _, _) => Measurement::Success { values },
        // Only a success condition, missed: a failure.
        (false, false, Some(_), None) => Measurement::Failure { values },
        // Only a failure condition, not met: a success.
        (false, false, None, _) => Measurement::Success { values },
        (false, false, Some(success), Some(failure)) => Measurement::Inconclusive {
            why: format!(
                "{} meets neither the success condition ({success}) nor the failure condition ({failure})",
                numbers(&values)
            ),
        },
    }
}

/// Where a check stands after its measurements so far.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckVerdict {
    /// Fewer than `count` measurements, within both limits: measure again after `interval`.
    Measuring,
    /// `count` measurements within both limits.
    Pass,
    /// More failures than `failure_limit`.
    Fail,
    /// More inconclusive measurements than `inconclusive_limit`.
    Inconclusive,
}

/// The verdict of `measurements` (in the order taken) by `rule`.
pub fn tally(rule: &CheckRule, measurements: &[Measurement]) -> CheckVerdict {
    let failures = measurements
        .iter()
        .filter(|m| matches!(m, Measurement::Failure { .. }))
        .count();
    let inconclusive = measurements
        .iter()
        .filter(|m| matches!(m, Measurement::Inconclusive { .. }))
        .count();
    if failures > rule.failure_limit as usize {
        CheckVerdict::Fail
    } else if inconclusive > rule.inconclusive_limit as usize {
        CheckVerdict::Inconclusive
    } else if measurements.len() >= rule.count.max(1) as usize {
        CheckVerdict::Pass
    } else {
        CheckVerdict::Measuring
    }
}

/// `name VERDICT: the measurements`, one line, for the history and the holds.
pub fn describe(rule: &CheckRule, verdict: &CheckVerdict, measurements: &[Measurement]) -> String {
    let verdict = match verdict {
        CheckVerdict::Measuring => "measuring",
        CheckVerdict::Pass => "pass",
        CheckVerdict::Fail => "fail",
        CheckVerdict::Inconclusive => "inconclusive",
    };
    let failures = measurements
        .iter()
        .filter(|m| matches!(m, Measurement::Failure { .. }))
        .count();
    let taken: Vec<String> = measurements
        .iter()
        .map(|m| match m {
            Measurement::Success { values } => format!("{} ok", numbers(values)),
            Measurement::Failure { values } => format!("{} failed", numbers(values)),
            Measurement::Inconclusive { why } => format!("inconclusive ({why})"),
        })
        .collect();
    let conditions: Vec<String> = [
        rule.success.map(|c| format!("success {c}")),
        rule.failure.map(|c| format!("failure {c}")),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!(
        "check {} {verdict}: {} of {} measurement(s) ({}; {} failed, failure_limit {}): {}",
        rule.name,
        measurements.len(),
        rule.count,
        conditions.join(", "),
        failures,
        rule.failure_limit,
        taken.join("; ")
    )
}

fn numbers(values: &[f64]) -> String {
    let shown: Vec<String> = values.iter().take(5).map(|v| format!("{v:.4}")).collect();
    match values.len() {
        0..=5 => shown.join(", "),
        n => format!("{} … ({n} series)", shown.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(success: Option<&str>, failure: Option<&str>) -> CheckRule {
        CheckRule {
            name: "error-rate".into(),
            query: "q".into(),
            success: success.map(|c| Condition::parse(c).expect("condition")),
            failure: failure.map(|c| Condition::parse(c).expect("condition")),
            count: 3,
            interval: Duration::from_secs(30),
            failure_limit: 1,
            inconclusive_limit: 0,
        }
    }

    #[test]
    fn conditions_read_as_argo_writes_them_or_bare() {
        let cases = [
            ("< 0.05", Some((Op::Lt, 0.05))),
            ("result < 0.05", Some((Op::Lt, 0.05))),
            ("result[0] >= 100", Some((Op::Ge, 100.0))),
            ("value!=0", Some((Op::Ne, 0.0))),
            ("<= -1e3", Some((Op::Le, -1000.0))),
            ("== 1", Some((Op::Eq, 1.0))),
            ("> x", None),
            ("0.05", None),
            ("< NaN", None),
            ("< inf", None),
            ("=< 1", None),
            ("", None),
        ];
        for (text, want) in cases {
            let got = Condition::parse(text).ok().map(|c| (c.op, c.threshold));
            assert_eq!(got, want, "{text:?}");
        }
        let c = Condition::parse("<= 0.5").unwrap();
        assert!(c.holds(0.5) && !c.holds(0.6) && !c.holds(f64::NAN));
        assert!(!Condition::parse("!= 1").unwrap().holds(f64::NAN));
        assert_eq!(c.to_string(), "<= 0.5");
    }

    #[test]
    fn a_measurement_is_three_way_and_no_data_is_never_a_success() {
        let both = rule(Some("< 0.05"), Some(">= 0.1"));
        let success_only = rule(Some("< 0.05"), None);
        let failure_only = rule(None, Some(">= 0.1"));
        let ok = |v: &[f64]| Ok(v.to_vec());
        // (rule, reading, outcome)
        type Case<'a> = (&'a CheckRule, Result<Vec<f64>, String>, &'a str);
        let cases: Vec<Case> = vec![
            (&both, ok(&[0.01, 0.02]), "success"),
            (&both, ok(&[0.01, 0.2]), "failure"),
            (&both, ok(&[0.07]), "inconclusive"),
            (&both, ok(&[]), "inconclusive"),
            (&both, Err("bad_data".into()), "inconclusive"),
            (&both, ok(&[f64::NAN]), "inconclusive"),
            (&success_only, ok(&[0.07]), "failure"),
            (&success_only, ok(&[0.01]), "success"),
            (&success_only, ok(&[]), "inconclusive"),
            (&failure_only, ok(&[0.07]), "success"),
            (&failure_only, ok(&[0.7]), "failure"),
            (&failure_only, ok(&[]), "inconclusive"),
        ];
        for (r, reading, want) in cases {
            let got = measure(r, reading.clone());
            let name = match got {
                Measurement::Success { .. } => "success",
                Measurement::Failure { .. } => "failure",
                Measurement::Inconclusive { .. } => "inconclusive",
            };
            assert_eq!(name, want, "{:?} {:?} {reading:?}", r.success, r.failure);
        }
    }

    #[test]
    fn the_verdict_follows_the_limits_and_the_count() {
        let r = rule(Some("< 0.05"), None);
        let s = || Measurement::Success { values: vec![0.01] };
        let f = || Measurement::Failure { values: vec![0.2] };
        let i = || Measurement::Inconclusive {
            why: "no data".into(),
        };
        let cases = [
            (vec![], CheckVerdict::Measuring),
            (vec![s()], CheckVerdict::Measuring),
            (vec![f()], CheckVerdict::Measuring),
            (vec![s(), f(), s()], CheckVerdict::Pass),
            (vec![f(), f()], CheckVerdict::Fail),
            (vec![i()], CheckVerdict::Inconclusive),
            (vec![s(), s(), s()], CheckVerdict::Pass),
        ];
        for (measurements, want) in cases {
            assert_eq!(tally(&r, &measurements), want, "{measurements:?}");
        }
        let line = describe(&r, &CheckVerdict::Fail, &[f(), f()]);
        assert_eq!(
            line,
            "check error-rate fail: 2 of 3 measurement(s) (success < 0.05; 2 failed, failure_limit 1): 0.2000 failed; 0.2000 failed"
        );
    }
}
