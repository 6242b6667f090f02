//! Whether the gate can see: a gate that reads nothing is open by accident.
//!
//! Two proofs that the alerting pipeline works, read at every evaluation beside the gate's
//! own query:
//! - the watchdog, an alert that always fires (kube-prometheus ships `Watchdog`), firing in
//!   Prometheus and, where the gate asks Alertmanager, listed there: Prometheus evaluates
//!   rules, and its alerts reach Alertmanager;
//! - the gate's rule group (rules/'s `Upgrade Gates`) loaded in Prometheus: the alerts
//!   the gate waits for are evaluated at all.
//!
//! Without either proof the verdict is unknown, which holds maintenance (fail closed).

use serde::Serialize;

/// What the gate must see before it may open. An empty name turns that proof off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SightRules {
    /// The always-firing alert's name (`gate.watchdog`, default `Watchdog`).
    pub watchdog: String,
    /// The rule group Prometheus must have loaded (`gate.rule_group`, default
    /// `Upgrade Gates`).
    pub rule_group: String,
}

impl SightRules {
    /// The instant query whose series are the watchdog firing in Prometheus, when on.
    pub fn watchdog_query(&self) -> Option<String> {
        (!self.watchdog.is_empty()).then(|| {
            format!(
                "ALERTS{{alertname={:?},alertstate=\"firing\"}}",
                self.watchdog
            )
        })
    }
}

/// Whether `name` may be a watchdog's alert name: Prometheus' metric-name characters, so
/// that it goes into a query and a filter unescaped.
pub fn valid_alert_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// What one evaluation read to prove the pipeline works; `None` where that proof is off
/// (or, for Alertmanager, where the gate does not ask it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SightReading {
    /// How many series the watchdog query returned, or why it failed.
    pub watchdog_in_prometheus: Option<Result<usize, String>>,
    /// Whether Alertmanager lists the watchdog as active, or why it cannot be asked.
    pub watchdog_in_alertmanager: Option<Result<bool, String>>,
    /// The names of the rule groups Prometheus has loaded, or why they cannot be read.
    pub rule_groups: Option<Result<Vec<String>, String>>,
}

/// How the gate's sight stands, as `GET /v1/gates` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Sight {
    /// The watchdog alert required, if any.
    pub watchdog: Option<String>,
    /// The rule group required, if any.
    pub rule_group: Option<String>,
    /// Why the gate cannot see, when it cannot; the verdict is then unknown unless a
    /// blocking alert closes it.
    pub blind: Option<String>,
}

/// The gate's sight from `reading` under `rules`: every missing proof named, with what to
/// do about it.
pub fn judge(rules: &SightRules, reading: &SightReading) -> Sight {
    let watchdog = &rules.watchdog;
    let mut reasons = Vec::new();
    match &reading.watchdog_in_prometheus {
        Some(Ok(0)) => reasons.push(format!(
            "the watchdog alert {watchdog} is not firing in Prometheus, so its alerting is \
             not proven to work (an always-firing alert, as kube-prometheus' Watchdog; \
             gate.watchdog = \"\" goes without)"
        )),
        Some(Err(e)) => reasons.push(format!(
            "the watchdog alert {watchdog} cannot be read from Prometheus: {e}"
        )),
        Some(Ok(_)) | None => {}
    }
    match &reading.watchdog_in_alertmanager {
        Some(Ok(false)) => reasons.push(format!(
            "Alertmanager does not list the watchdog alert {watchdog}, so Prometheus' alerts \
             are not proven to reach it"
        )),
        Some(Err(e)) => reasons.push(format!(
            "Alertmanager cannot be asked for the watchdog alert {watchdog}: {e}"
        )),
        Some(Ok(true)) | None => {}
    }
    match &reading.rule_groups {
        Some(Ok(groups)) if !groups.contains(&rules.rule_group) => {
            let loaded = if groups.is_empty() {
                "none".to_owned()
            } else {
                groups.join(", ")
            };
            reasons.push(format!(
                "Prometheus has not loaded the rule group {:?} (loaded: {loaded}), so the \
                 gate's alerts are not evaluated (gate.rule_group names it)",
                rules.rule_group
            ));
        }
        Some(Err(e)) => reasons.push(format!("Prometheus' rule groups cannot be read: {e}")),
        Some(Ok(_)) | None => {}
    }
    Sight {
        watchdog: (!watchdog.is_empty()).then(|| watchdog.clone()),
        rule_group: (!rules.rule_group.is_empty()).then(|| rules.rule_group.clone()),
        blind: (!reasons.is_empty()).then(|| reasons.join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(watchdog: &str, group: &str) -> SightRules {
        SightRules {
            watchdog: watchdog.into(),
            rule_group: group.into(),
        }
    }

    fn groups(names: &[&str]) -> Option<Result<Vec<String>, String>> {
        Some(Ok(names.iter().map(|n| n.to_string()).collect()))
    }

    #[test]
    fn the_gate_sees_only_with_every_proof_that_is_on() {
        let on = rules("Watchdog", "Upgrade Gates");
        let seen = SightReading {
            watchdog_in_prometheus: Some(Ok(1)),
            watchdog_in_alertmanager: Some(Ok(true)),
            rule_groups: groups(&["Rollgate", "Upgrade Gates"]),
        };
        // (what, reading, the words every reason must hold; none: it sees)
        let cases: Vec<(&str, SightReading, Option<&[&str]>)> = vec![
            ("every proof", seen.clone(), None),
            (
                "no Alertmanager asked",
                SightReading {
                    watchdog_in_alertmanager: None,
                    ..seen.clone()
                },
                None,
            ),
            (
                "the watchdog not firing in Prometheus",
                SightReading {
                    watchdog_in_prometheus: Some(Ok(0)),
                    ..seen.clone()
                },
                Some(&["Watchdog is not firing in Prometheus", "gate.watchdog"]),
            ),
            (
                "the watchdog query failing",
                SightReading {
                    watchdog_in_prometheus: Some(Err("HTTP 503".into())),
                    ..seen.clone()
                },
                Some(&["cannot be read from Prometheus: HTTP 503"]),
            ),
            (
                "the watchdog missing from Alertmanager",
                SightReading {
                    watchdog_in_alertmanager: Some(Ok(false)),
                    ..seen.clone()
                },
                Some(&["Alertmanager does not list the watchdog alert Watchdog"]),
            ),
            (
                "Alertmanager unreachable",
                SightReading {
                    watchdog_in_alertmanager: Some(Err("connection refused".into())),
                    ..seen.clone()
                },
                Some(&["Alertmanager cannot be asked", "connection refused"]),
            ),
            (
                "the rule group not loaded",
                SightReading {
                    rule_groups: groups(&["Rollgate"]),
                    ..seen.clone()
                },
                Some(&["\"Upgrade Gates\" (loaded: Rollgate)", "gate.rule_group"]),
            ),
            (
                "no rule group at all",
                SightReading {
                    rule_groups: groups(&[]),
                    ..seen.clone()
                },
                Some(&["(loaded: none)"]),
            ),
            (
                "the rules unreadable",
                SightReading {
                    rule_groups: Some(Err("timeout".into())),
                    ..seen.clone()
                },
                Some(&["rule groups cannot be read: timeout"]),
            ),
            (
                "two proofs missing, both named",
                SightReading {
                    watchdog_in_prometheus: Some(Ok(0)),
                    rule_groups: groups(&[]),
                    ..seen.clone()
                },
                Some(&["not firing in Prometheus", "; Prometheus has not loaded"]),
            ),
        ];
        for (what, reading, says) in cases {
            let sight = judge(&on, &reading);
            match says {
                None => assert_eq!(sight.blind, None, "{what}"),
                Some(words) => {
                    let blind = sight.blind.unwrap_or_else(|| panic!("{what}: sees"));
                    for word in words {
                        assert!(blind.contains(word), "{what}: {blind}");
                    }
                }
            }
        }
    }

    #[test]
    fn proofs_turned_off_are_neither_asked_nor_shown() {
        let off = rules("", "");
        assert_eq!(off.watchdog_query(), None);
        let sight = judge(&off, &SightReading::default());
        assert_eq!(
            sight,
            Sight {
                watchdog: None,
                rule_group: None,
                blind: None
            }
        );
        assert_eq!(
            rules("Watchdog", "").watchdog_query().as_deref(),
            Some(r#"ALERTS{alertname="Watchdog",alertstate="firing"}"#)
        );
    }

    #[test]
    fn a_watchdog_name_is_an_alert_name() {
        for good in ["Watchdog", "_dead_mans_switch", "DeadMansSwitch2"] {
            assert!(valid_alert_name(good), "{good}");
        }
        for bad in ["", "2fast", "Watch dog", "a\"}or vector(1)", "a-b"] {
            assert!(!valid_alert_name(bad), "{bad}");
        }
    }
}
