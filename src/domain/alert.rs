//! Alertmanager webhook payloads (version 4), validated field by field.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

use super::event::{FieldErrors, Fields};

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

impl AlertBatch {
    /// Validates an Alertmanager webhook body (payload `version` "4"), reporting every
    /// bad field with its path.
    pub fn from_json(body: &Value) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let Some(obj) = body.as_object() else {
            errors.push(
                "",
                "the body must be a JSON object (an Alertmanager webhook payload)",
            );
            return Err(errors);
        };
        let f = Fields::new(obj, "");
        match f.str("version", &mut errors) {
            Some("4") | None => {}
            Some(other) => errors.push(
                "version",
                format!("payload version {other:?} is not supported; only Alertmanager webhook version \"4\" is"),
            ),
        }
        let receiver = f
            .str("receiver", &mut errors)
            .unwrap_or_default()
            .to_owned();
        let group_key = f
            .str("groupKey", &mut errors)
            .unwrap_or_default()
            .to_owned();
        if let Some(s) = f.str("status", &mut errors) {
            parse_status(s, "status", &mut errors);
        }
        let mut alerts = Vec::new();
        match obj.get("alerts") {
            Some(Value::Array(items)) if items.is_empty() => {
                errors.push("alerts", "must hold at least one alert")
            }
            Some(Value::Array(items)) if items.len() > MAX_ALERTS => errors.push(
                "alerts",
                format!(
                    "holds {} alerts; at most {MAX_ALERTS} per request",
                    items.len()
                ),
            ),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if let Some(alert) = parse_alert(item, &format!("alerts[{i}]"), &mut errors) {
                        alerts.push(alert);
                    }
                }
            }
            Some(_) => errors.push("alerts", "must be an array"),
            None => errors.push("alerts", "is required"),
        }
        errors.into_result(Self {
            receiver,
            group_key,
            alerts,
        })
    }
}

fn parse_status(s: &str, path: &str, errors: &mut FieldErrors) -> Option<AlertStatus> {
    match s {
        "firing" => Some(AlertStatus::Firing),
        "resolved" => Some(AlertStatus::Resolved),
        other => {
            errors.push(
                path,
                format!("{other:?} is neither \"firing\" nor \"resolved\""),
            );
            None
        }
    }
}

fn parse_alert(item: &Value, path: &str, errors: &mut FieldErrors) -> Option<Alert> {
    let Some(obj) = item.as_object() else {
        errors.push(path, "must be an object");
        return None;
    };
    let before = errors.len();
    let f = Fields::new(obj, path);
    let status = f
        .str("status", errors)
        .and_then(|s| parse_status(s, &format!("{path}.status"), errors));
    let labels = string_map(obj.get("labels"), &format!("{path}.labels"), true, errors);
    if let Some(labels) = &labels {
        match labels.get("alertname") {
            Some(name) if !name.is_empty() => {}
            _ => errors.push(&format!("{path}.labels"), "must have a non-empty alertname"),
        }
    }
    let annotations = match obj.get("annotations") {
        None | Some(Value::Null) => Some(BTreeMap::new()),
        some => string_map(some, &format!("{path}.annotations"), false, errors),
    };
    let starts_at = f
        .str("startsAt", errors)
        .and_then(|s| time(s, &format!("{path}.startsAt"), errors));
    let ends_at = match obj.get("endsAt") {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) => {
            time(s, &format!("{path}.endsAt"), errors).map(|t| (t.timestamp() > 0).then_some(t))
        }
        Some(_) => {
            errors.push(&format!("{path}.endsAt"), "must be an RFC 3339 time string");
            None
        }
    };
    let fingerprint = f.str("fingerprint", errors).map(str::to_owned);
    if let Some(fp) = &fingerprint
        && (fp.is_empty() || fp.len() > 64 || !fp.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        errors.push(
            &format!("{path}.fingerprint"),
            "must be 1-64 letters or digits, as Alertmanager sends it",
        );
    }
    if errors.len() > before {
        return None;
    }
    Some(Alert {
        fingerprint: fingerprint?,
        status: status?,
        labels: labels?,
        annotations: annotations?,
        starts_at: starts_at?,
        ends_at: ends_at?,
    })
}

fn string_map(
    value: Option<&Value>,
    path: &str,
    required: bool,
    errors: &mut FieldErrors,
) -> Option<BTreeMap<String, String>> {
    let obj: &Map<String, Value> = match value {
        Some(Value::Object(obj)) => obj,
        None if !required => return Some(BTreeMap::new()),
        None => {
            errors.push(path, "is required");
            return None;
        }
        Some(_) => {
            errors.push(path, "must be an object of string values");
            return None;
        }
    };
    if obj.len() > MAX_LABELS {
        errors.push(
            path,
            format!("has {} entries; at most {MAX_LABELS}", obj.len()),
        );
        return None;
    }
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        match v {
            Value::String(s) if s.len() <= MAX_TEXT => {
                out.insert(k.clone(), s.clone());
            }
            Value::String(_) => errors.push(&format!("{path}.{k}"), "is longer than 16 KiB"),
            _ => errors.push(&format!("{path}.{k}"), "must be a string"),
        }
    }
    Some(out)
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
    fn not_an_object_is_refused() {
        assert!(AlertBatch::from_json(&json!([1, 2])).is_err());
    }
}
