//! Alertmanager webhook payloads (version 4), validated field by field.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

use super::input::{FieldErrors, read_body};

/// Whether an alert is firing or resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AlertStatus {
    /// The alert condition holds.
    Firing,
    /// The alert condition no longer holds.
    Resolved,
}

/// One alert of a webhook notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Alert {
    /// Alertmanager's fingerprint of the label set; the key of the alert board.
    pub fingerprint: String,
    /// Firing or resolved.
    pub status: AlertStatus,
    /// The alert's labels; always has `alertname`.
    pub labels: BTreeMap<String, String>,
    /// The alert's annotations.
    pub annotations: BTreeMap<String, String>,
    /// When the alert started firing.
    pub starts_at: DateTime<Utc>,
    /// When Alertmanager considers the alert over; `None` when it sent the zero time.
    pub ends_at: Option<DateTime<Utc>>,
}

impl Alert {
    /// The alert's name (`alertname` label).
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }

    /// Whether this notification of an alert is newer than `stored`, the board's one of
    /// the same fingerprint, by the alert's own times as Alertmanager keeps them, rather
    /// than by arrival (a retried or replicated notification may come late):
    /// - a resolution ends the stored firing unless it surely ended before that firing
    ///   began (then it is an older episode's, late). Alertmanager sets a resolution's
    ///   start to its end when the client gave none, and a client's whole-second end
    ///   (amtool, scripts) may lie up to a second before the firing's start that
    ///   Alertmanager stamped on receipt: such a resolution ends it;
    /// - a firing that began after the stored resolution's end is a new episode; one that
    ///   began no later is the episode that resolution ended, resent;
    /// - two firings: the later start (or a resend); two resolutions: the later end.
    pub fn supersedes(&self, stored: &Alert) -> bool {
        use AlertStatus::{Firing, Resolved};
        match (stored.status, self.status) {
            (Firing, Firing) => self.starts_at >= stored.starts_at,
            (Firing, Resolved) => self.latest_end() > stored.starts_at,
            (Resolved, Firing) => self.starts_at > stored.ended(),
            (Resolved, Resolved) => {
                (self.ended(), self.starts_at) >= (stored.ended(), stored.starts_at)
            }
        }
    }

    /// When the alert ended, as sent (its start when no end was sent).
    fn ended(&self) -> DateTime<Utc> {
        self.ends_at.unwrap_or(self.starts_at)
    }

    /// The latest instant the sent end may stand for: a whole-second end was cut down to
    /// the second by its client, so the true end may lie up to a second later.
    fn latest_end(&self) -> DateTime<Utc> {
        let end = self.ended();
        if end.timestamp_subsec_nanos() == 0 {
            end + chrono::Duration::seconds(1) - chrono::Duration::nanoseconds(1)
        } else {
            end
        }
    }
}

/// The newest notification of each fingerprint in `alerts`, by [`Alert::supersedes`], in
/// the order their fingerprints first appear.
pub fn newest_by_fingerprint<'a>(alerts: impl IntoIterator<Item = &'a Alert>) -> Vec<&'a Alert> {
    let mut out: Vec<&Alert> = Vec::new();
    for alert in alerts {
        match out.iter_mut().find(|a| a.fingerprint == alert.fingerprint) {
            Some(kept) if alert.supersedes(kept) => *kept = alert,
            Some(_) => {}
            None => out.push(alert),
        }
    }
    out
}

/// A validated Alertmanager webhook notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AlertBatch {
    /// The Alertmanager receiver that sent it.
    pub receiver: String,
    /// Alertmanager's group key.
    pub group_key: String,
    /// The alerts, at least one.
    pub alerts: Vec<Alert>,
}

/// More alerts than this in one notification is refused: Alertmanager's own default
/// `max_alerts` is unlimited, but a gate does not need thousands per request.
pub const MAX_ALERTS: usize = 1000;
const MAX_LABELS: usize = 128;
const MAX_TEXT: usize = 16 * 1024;

/// An Alertmanager webhook notification (payload version 4) as it is read and documented;
/// [`AlertBatch::from_json`] validates it. Fields Alertmanager sends that rollgate does
/// not use (`truncatedAlerts`, `groupLabels`, `externalURL`, …) are accepted and ignored,
/// so a newer Alertmanager is not refused.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(example = json!({
    "version": "4", "groupKey": "{}:{alertname=\"NodeNotReady\"}", "status": "firing",
    "receiver": "rollgate", "alerts": [{
        "status": "firing",
        "labels": {"alertname": "NodeNotReady", "upgrade_gate": "true", "node": "w1"},
        "annotations": {"summary": "w1 not ready"},
        "startsAt": "2026-11-30T06:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": "c0ffee1234567890"
    }]
}))]
pub struct WebhookBody {
    /// The payload version; only `"4"` is taken.
    #[schema(required = true, value_type = String, example = "4")]
    pub version: Option<String>,
    /// The Alertmanager receiver that sent it.
    #[schema(required = true, value_type = String)]
    pub receiver: Option<String>,
    /// Alertmanager's group key.
    #[schema(required = true, value_type = String)]
    pub group_key: Option<String>,
    /// `firing` while any alert of the group fires.
    #[schema(required = true, value_type = AlertStatus)]
    pub status: Option<AlertStatus>,
    /// The alerts, 1 to 1000.
    #[schema(required = true, value_type = Vec<WebhookAlert>)]
    pub alerts: Option<Vec<WebhookAlert>>,
}

/// One alert of a webhook notification, as Alertmanager sends it.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAlert {
    /// `firing` or `resolved`.
    #[schema(required = true, value_type = AlertStatus)]
    pub status: Option<AlertStatus>,
    /// Labels (at most 128, values up to 16 KiB); must have `alertname`.
    #[schema(required = true, value_type = BTreeMap<String, String>)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations (same bounds).
    #[schema(required = false, value_type = BTreeMap<String, String>)]
    pub annotations: Option<BTreeMap<String, String>>,
    /// RFC 3339 time the alert started firing.
    #[schema(required = true, value_type = String, example = "2026-11-30T06:00:00Z")]
    pub starts_at: Option<String>,
    /// RFC 3339 time Alertmanager considers it over; `0001-01-01T00:00:00Z`: not known.
    #[schema(required = false, value_type = String)]
    pub ends_at: Option<String>,
    /// Alertmanager's fingerprint of the label set, 1-64 letters or digits.
    #[schema(required = true, value_type = String, example = "c0ffee1234567890")]
    pub fingerprint: Option<String>,
}

impl AlertBatch {
    /// Reads and validates an Alertmanager webhook body (payload `version` "4"), reporting
    /// every bad field with its path.
    pub fn from_json(body: &Value) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let read: WebhookBody = read_body(body, &mut errors);
        let refused = errors.clone();
        let need = |field: &str, present: bool, errors: &mut FieldErrors| {
            let reported = refused
                .iter()
                .any(|e| e.field.is_empty() || e.field.starts_with(field));
            if !present && !reported {
                errors.push(field, "is required");
            }
        };
        need("version", read.version.is_some(), &mut errors);
        need("receiver", read.receiver.is_some(), &mut errors);
        need("groupKey", read.group_key.is_some(), &mut errors);
        need("status", read.status.is_some(), &mut errors);
        need("alerts", read.alerts.is_some(), &mut errors);
        if let Some(other) = read.version.as_deref().filter(|v| *v != "4") {
            errors.push(
                "version",
                format!("payload version {other:?} is not supported; only Alertmanager webhook version \"4\" is"),
            );
        }
        let items = read.alerts.unwrap_or_default();
        if items.len() > MAX_ALERTS {
            errors.push(
                "alerts",
                format!(
                    "holds {} alerts; at most {MAX_ALERTS} per request",
                    items.len()
                ),
            );
        } else if items.is_empty()
            && !refused.iter().any(|e| e.field.starts_with("alerts"))
            && !errors.iter().any(|e| e.field == "alerts")
        {
            errors.push("alerts", "must hold at least one alert");
        }
        let mut alerts = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("alerts[{i}]");
            if refused.iter().any(|e| e.field.starts_with(&path)) {
                continue;
            }
            if let Some(alert) = check_alert(item, &path, &mut errors) {
                alerts.push(alert);
            }
        }
        errors.into_result(Self {
            receiver: read.receiver.unwrap_or_default(),
            group_key: read.group_key.unwrap_or_default(),
            alerts,
        })
    }
}

fn check_alert(item: WebhookAlert, path: &str, errors: &mut FieldErrors) -> Option<Alert> {
    let before = errors.len();
    let at = |field: &str| format!("{path}.{field}");
    for (field, present) in [
        ("status", item.status.is_some()),
        ("labels", item.labels.is_some()),
        ("startsAt", item.starts_at.is_some()),
        ("fingerprint", item.fingerprint.is_some()),
    ] {
        if !present {
            errors.push(&at(field), "is required");
        }
    }
    if let Some(labels) = &item.labels {
        check_map(labels, &at("labels"), errors);
        if labels.get("alertname").is_none_or(String::is_empty) {
            errors.push(&at("labels"), "must have a non-empty alertname");
        }
    }
    let annotations = item.annotations.unwrap_or_default();
    check_map(&annotations, &at("annotations"), errors);
    let starts_at = item
        .starts_at
        .and_then(|s| time(&s, &at("startsAt"), errors));
    let ends_at = match item.ends_at {
        None => Some(None),
        Some(s) => time(&s, &at("endsAt"), errors).map(|t| (t.timestamp() > 0).then_some(t)),
    };
    if let Some(fp) = &item.fingerprint
        && (fp.is_empty() || fp.len() > 64 || !fp.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        errors.push(
            &at("fingerprint"),
            "must be 1-64 letters or digits, as Alertmanager sends it",
        );
    }
    if errors.len() > before {
        return None;
    }
    Some(Alert {
        fingerprint: item.fingerprint?,
        status: item.status?,
        labels: item.labels?,
        annotations,
        starts_at: starts_at?,
        ends_at: ends_at?,
    })
}

/// Labels and annotations stay within bounds.
fn check_map(map: &BTreeMap<String, String>, path: &str, errors: &mut FieldErrors) {
    if map.len() > MAX_LABELS {
        errors.push(
            path,
            format!("has {} entries; at most {MAX_LABELS}", map.len()),
        );
    }
    for (k, v) in map {
        if v.len() > MAX_TEXT {
            errors.push(&format!("{path}.{k}"), "is longer than 16 KiB");
        }
    }
}

fn time(s: &str, path: &str, errors: &mut FieldErrors) -> Option<DateTime<Utc>> {
    match DateTime::parse_from_rfc3339(s) {
        Ok(t) => Some(t.with_timezone(&Utc)),
        Err(_) => {
            errors.push(path, format!("{s:?} is not an RFC 3339 time"));
            None
        }
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    pub(crate) use super::tests::webhook;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn webhook() -> Value {
        json!({
            "version": "4",
            "groupKey": "{}:{alertname=\"NodeNotReady\"}",
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "rollgate",
            "groupLabels": {"alertname": "NodeNotReady"},
            "commonLabels": {"alertname": "NodeNotReady", "upgrade_gate": "true"},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "alerts": [{
                "status": "firing",
                "labels": {"alertname": "NodeNotReady", "upgrade_gate": "true", "node": "w1"},
                "annotations": {"summary": "w1 not ready"},
                "startsAt": "2026-11-30T06:00:00.123Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": "c0ffee1234567890"
            }]
        })
    }

    #[test]
    fn accepts_a_real_webhook() {
        let batch = AlertBatch::from_json(&webhook()).unwrap();
        assert_eq!(batch.alerts.len(), 1);
        let alert = &batch.alerts[0];
        assert_eq!(alert.name(), "NodeNotReady");
        assert_eq!(alert.status, AlertStatus::Firing);
        assert_eq!(alert.ends_at, None, "zero time means no end");
    }

    #[test]
    fn reports_each_bad_field_with_its_path() {
        type Mutate = fn(&mut Value);
        let cases: &[(Mutate, &str)] = &[
            (|v| v["version"] = json!("3"), "version"),
            (|v| v["status"] = json!("burning"), "status"),
            (|v| v["alerts"] = json!([]), "alerts"),
            (|v| v["alerts"] = json!("x"), "alerts"),
            (
                |v| v["alerts"][0]["status"] = json!("on"),
                "alerts[0].status",
            ),
            (
                |v| v["alerts"][0]["startsAt"] = json!("yesterday"),
                "alerts[0].startsAt",
            ),
            (|v| v["alerts"][0]["endsAt"] = json!(5), "alerts[0].endsAt"),
            (
                |v| v["alerts"][0]["labels"] = json!({"a": "b"}),
                "alerts[0].labels",
            ),
            (
                |v| v["alerts"][0]["labels"]["x"] = json!(1),
                "alerts[0].labels.x",
            ),
            (
                |v| v["alerts"][0]["fingerprint"] = json!("$(id)"),
                "alerts[0].fingerprint",
            ),
            (
                |v| {
                    v["alerts"][0]
                        .as_object_mut()
                        .unwrap()
                        .remove("fingerprint");
                },
                "alerts[0].fingerprint",
            ),
            (
                |v| {
                    v.as_object_mut().unwrap().remove("receiver");
                },
                "receiver",
            ),
        ];
        for (mutate, path) in cases {
            let mut body = webhook();
            mutate(&mut body);
            let err = AlertBatch::from_json(&body).expect_err(path);
            assert!(
                err.iter().any(|e| e.field == *path),
                "expected an error at {path}, got {err}"
            );
        }
    }

    #[test]
    fn several_bad_alerts_are_each_named() {
        let mut body = webhook();
        let alert = body["alerts"][0].clone();
        body["alerts"] = json!([alert.clone(), alert.clone(), alert]);
        body["alerts"][0]["startsAt"] = json!("yesterday");
        body["alerts"][1]["labels"]["x"] = json!(1);
        body["alerts"][2]["status"] = json!("on");
        body["receiver"] = json!(7);
        let err = AlertBatch::from_json(&body).unwrap_err();
        let fields: Vec<&str> = err.iter().map(|e| e.field.as_str()).collect();
        for want in [
            "alerts[0].startsAt",
            "alerts[1].labels.x",
            "alerts[2].status",
            "receiver",
        ] {
            assert!(fields.contains(&want), "{want} not in {err}");
        }
        assert_eq!(fields.len(), 4, "{err}");
    }

    #[test]
    fn not_an_object_is_refused() {
        assert!(AlertBatch::from_json(&json!([1, 2])).is_err());
    }

    #[test]
    fn the_newest_notification_wins_by_the_alerts_own_times_not_by_arrival() {
        let at = |m: u32| {
            DateTime::parse_from_rfc3339(&format!("2026-12-02T10:{m:02}:00Z"))
                .unwrap()
                .with_timezone(&Utc)
        };
        let alert = |status, start: u32, end: Option<u32>| Alert {
            fingerprint: "f1".into(),
            status,
            labels: BTreeMap::from([("alertname".into(), "KubeNodeNotReady".into())]),
            annotations: BTreeMap::new(),
            starts_at: at(start),
            ends_at: end.map(at),
        };
        use AlertStatus::{Firing, Resolved};
        // (stored, incoming, incoming wins)
        let cases = [
            // A resolution arrives before the firing it resolves: the firing is stale.
            (alert(Resolved, 0, Some(5)), alert(Firing, 0, None), false),
            (alert(Firing, 0, None), alert(Resolved, 0, Some(5)), true),
            // The same group resent.
            (alert(Firing, 0, None), alert(Firing, 0, None), true),
            (
                alert(Resolved, 0, Some(5)),
                alert(Resolved, 0, Some(5)),
                true,
            ),
            (
                alert(Resolved, 0, Some(7)),
                alert(Resolved, 0, Some(5)),
                false,
            ),
            // It fires again later: a new start.
            (alert(Resolved, 0, Some(5)), alert(Firing, 9, None), true),
            // An old firing of an earlier instance, late.
            (alert(Firing, 9, None), alert(Resolved, 0, Some(5)), false),
            // Alertmanager's merge kept the earliest start: the same episode resolved.
            (alert(Firing, 3, None), alert(Resolved, 1, Some(5)), true),
        ];
        for (stored, incoming, wins) in cases {
            assert_eq!(
                incoming.supersedes(&stored),
                wins,
                "{:?}@{} after {:?}@{}",
                incoming.status,
                incoming.starts_at,
                stored.status,
                stored.starts_at
            );
        }
        let (resolved, firing) = (alert(Resolved, 0, Some(5)), alert(Firing, 0, None));
        let kept = newest_by_fingerprint([&resolved, &firing]);
        assert_eq!(kept, [&resolved]);
    }

    /// amtool and scripts resolve with a whole-second `endsAt` and no `startsAt`;
    /// Alertmanager then starts the resolution at its end, which can lie before the
    /// sub-second start it stamped on the firing.
    #[test]
    fn a_whole_second_resolution_within_the_second_before_the_firing_ends_it() {
        let at = |s: &str| {
            DateTime::parse_from_rfc3339(&format!("2026-12-02T10:00:{s}Z"))
                .unwrap()
                .with_timezone(&Utc)
        };
        let alert = |status, start: &str, end: Option<&str>| Alert {
            fingerprint: "f1".into(),
            status,
            labels: BTreeMap::from([("alertname".into(), "EtcdNoLeader".into())]),
            annotations: BTreeMap::new(),
            starts_at: at(start),
            ends_at: end.map(at),
        };
        use AlertStatus::{Firing, Resolved};
        // (stored, incoming, incoming wins)
        let cases = [
            // The firing stamped at .7 s, resolved "at 10:00:00" (really later).
            (
                alert(Firing, "00.700", None),
                alert(Resolved, "00", Some("00")),
                true,
            ),
            // An end with sub-seconds is exact: it ended before this firing began.
            (
                alert(Firing, "00.700", None),
                alert(Resolved, "00.300", Some("00.300")),
                false,
            ),
            // A whole-second end a second or more before the start: an older episode's.
            (
                alert(Firing, "01.000", None),
                alert(Resolved, "00", Some("00")),
                false,
            ),
            (
                alert(Firing, "01.500", None),
                alert(Resolved, "00", Some("00")),
                false,
            ),
            // After the resolution, the firing of the same episode resent: stale.
            (
                alert(Resolved, "00", Some("05")),
                alert(Firing, "00.700", None),
                false,
            ),
            // A firing that began after the stated end: a new episode (fail closed).
            (
                alert(Resolved, "00", Some("00")),
                alert(Firing, "00.700", None),
                true,
            ),
        ];
        for (stored, incoming, wins) in cases {
            assert_eq!(
                incoming.supersedes(&stored),
                wins,
                "{incoming:?} after {stored:?}"
            );
        }
    }
}
