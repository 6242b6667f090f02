//! Events as rollgate accepts them: the CloudEvents envelope, and the validated `data` of
//! each event type. Parsing is separate from applying (the worker applies).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;

use super::alert::AlertBatch;
use super::run::ReadRequest;
use super::run_request::{Doors, RunAsked, RunDoor, RunRequest};
use super::version::Version;

pub use super::input::{FieldError, FieldErrors, read_body};
pub use super::upgrade_step::Stage;

/// Patch (same minor, higher patch) or minor (next minor) upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum UpgradeKind {
    /// Same minor, higher patch.
    Patch,
    /// Exactly one minor up.
    Minor,
}

impl UpgradeKind {
    /// `patch` or `minor`, as in requests and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Patch => "patch",
            Self::Minor => "minor",
        }
    }
}

/// Which stages a run covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StageSelection(pub BTreeSet<Stage>);

impl StageSelection {
    /// Every stage.
    pub fn all() -> Self {
        Self(Stage::ALL.into_iter().collect())
    }
    /// Parses `all` or a comma list of stage names.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let raw = raw.trim();
        if raw == "all" {
            return Ok(Self::all());
        }
        let mut set = BTreeSet::new();
        for item in raw.split(',').map(str::trim) {
            match Stage::from_name(item) {
                Some(stage) => {
                    set.insert(stage);
                }
                None => {
                    let known: Vec<_> = Stage::ALL.iter().map(|s| s.name()).collect();
                    return Err(format!(
                        "{item:?} is not a stage; use \"all\" or a comma list of: {}",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(Self(set))
    }
    /// The selected stages in execution order.
    pub fn stages(&self) -> impl Iterator<Item = Stage> + '_ {
        self.0.iter().copied()
    }
    /// The canonical text form: `all` or the names in order.
    pub fn to_text(&self) -> String {
        if self.0.len() == Stage::ALL.len() {
            "all".into()
        } else {
            self.stages().map(Stage::name).collect::<Vec<_>>().join(",")
        }
    }
}

/// A validated request for a Kubernetes version upgrade (`POST /v1/detections`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DetectionRequest {
    /// The version to reach, `MAJOR.MINOR.PATCH`.
    #[schema(value_type = String, example = "1.34.5")]
    pub target_version: Version,
    /// Patch or minor.
    pub kind: UpgradeKind,
    /// Plan and check only; change nothing.
    pub dry_run: bool,
    /// The stages to run.
    #[schema(value_type = String, example = "all")]
    pub stages: StageSelection,
}

/// The body of `POST /v1/detections` (and the `data` of a `rollgate.detection.v1`
/// event), as it is read and documented; [`DetectionRequest::from_json`] validates it.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"target_version": "1.34.5", "kind": "patch", "dry_run": false, "stages": "all"}))]
pub struct DetectionBody {
    /// The version to reach, `MAJOR.MINOR.PATCH` and nothing else.
    #[schema(required = true, value_type = String, example = "1.34.5")]
    pub target_version: Option<String>,
    /// `patch` (same minor, newer patch) or `minor` (exactly the next minor).
    #[schema(required = true, value_type = UpgradeKind)]
    pub kind: Option<UpgradeKind>,
    /// Plan and check only; change nothing.
    #[schema(required = false, value_type = bool, default = false)]
    pub dry_run: Option<bool>,
    /// `all` (default) or a comma list of stages: preflight, snapshot, containerd,
    /// apt-repo, control-plane, workers, postflight.
    #[schema(required = false, value_type = String, default = "all", example = "preflight,snapshot")]
    pub stages: Option<String>,
}

impl DetectionRequest {
    /// Reads and validates the JSON body of a detection, reporting every bad field.
    pub fn from_json(body: &Value) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let read: DetectionBody = read_body(body, &mut errors);
        let reported = errors.clone();
        let required = |field: &str, errors: &mut FieldErrors, present: bool| {
            if !present && !reported.iter().any(|e| e.field == field) && !reported.is_empty_body() {
                errors.push(field, "is required");
            }
        };
        required("target_version", &mut errors, read.target_version.is_some());
        required("kind", &mut errors, read.kind.is_some());
        let target_version = read.target_version.as_deref().and_then(|s| {
            Version::parse(s)
                .map_err(|e| errors.push("target_version", e.to_string()))
                .ok()
        });
        let stages = match read.stages.as_deref() {
            None => Some(StageSelection::all()),
            Some(raw) => StageSelection::parse(raw)
                .map_err(|e| errors.push("stages", e))
                .ok(),
        };
        match (target_version, read.kind, stages) {
            (Some(target_version), Some(kind), Some(stages)) if errors.is_empty() => Ok(Self {
                target_version,
                kind,
                dry_run: read.dry_run.unwrap_or(false),
                stages,
            }),
            _ => Err(errors),
        }
    }

    /// The JSON body this request came from, as the HTTP endpoint takes it.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "target_version": self.target_version.to_string(),
            "kind": self.kind,
            "dry_run": self.dry_run,
            "stages": self.stages.to_text(),
        })
    }
}

/// A validated request to roll the etcd cluster that is a StatefulSet's pods
/// (`POST /v1/etcd-rolls`). The TLS files come from the configuration (`etcd_roll.*`),
/// never from the request; restart commands exist only in the CLI (`rollgate etcd-roll
/// --driver command`), so nothing that reaches a shell comes over the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EtcdRollRequest {
    /// The StatefulSet whose pods are the members (member name = pod name).
    #[schema(example = "etcd")]
    pub statefulset: String,
    /// Its namespace.
    #[schema(example = "etcd")]
    pub namespace: String,
    /// Client URL of every member, `http(s)://host:port`.
    #[schema(example = json!(["https://etcd-0.etcd.etcd.svc:2379"]))]
    pub endpoints: Vec<String>,
    /// How long a restarted member may take to be healthy, at target and caught up
    /// (1–3600, default 300).
    pub ready_timeout_secs: u64,
    /// A fixed pause after each member is back, on top of the wait until it is caught up
    /// (0–600, default 0: go on as soon as it is).
    pub cooldown_secs: u64,
    /// How far behind the leader's raft index another member may be (1–10000000, default
    /// 1000).
    pub max_lag: u64,
}

/// The body of `POST /v1/etcd-rolls` (and the `data` of a `rollgate.etcd-roll.v1`
/// event), as it is read and documented; [`EtcdRollRequest::from_json`] validates it.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"statefulset": "etcd", "namespace": "etcd", "endpoints": ["https://etcd-0.etcd.etcd.svc:2379", "https://etcd-1.etcd.etcd.svc:2379", "https://etcd-2.etcd.etcd.svc:2379"]}))]
pub struct EtcdRollBody {
    /// The StatefulSet whose pods are the members (member name = pod name).
    #[schema(required = true, value_type = String, example = "etcd")]
    pub statefulset: Option<String>,
    /// Its namespace.
    #[schema(required = true, value_type = String, example = "etcd")]
    pub namespace: Option<String>,
    /// Client URL of every member, `http(s)://host:port`, 1 to 15 of them.
    #[schema(required = true, value_type = Vec<String>)]
    pub endpoints: Option<Vec<String>>,
    /// How long a restarted member may take to be healthy, at target and caught up
    /// (1–3600, default 300).
    #[schema(required = false, value_type = u64, minimum = 1, maximum = 3600, default = 300)]
    pub ready_timeout_secs: Option<u64>,
    /// A fixed pause after each member is back, on top of the wait until it is caught up
    /// (0–600, default 0: go on as soon as it is).
    #[schema(required = false, value_type = u64, minimum = 0, maximum = 600, default = 0)]
    pub cooldown_secs: Option<u64>,
    /// How far behind the leader's raft index another member may be (1–10000000,
    /// default 1000).
    #[schema(required = false, value_type = u64, minimum = 1, maximum = 10000000, default = 1000)]
    pub max_lag: Option<u64>,
}

impl EtcdRollRequest {
    /// Most members a request may name.
    pub const MAX_MEMBERS: usize = 15;

    /// Reads and validates the JSON body of an etcd roll request, reporting every bad
    /// field.
    pub fn from_json(body: &Value) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::default();
        let read: EtcdRollBody = read_body(body, &mut errors);
        let reported = errors.clone();
        let name = |key: &str, value: Option<&String>, errors: &mut FieldErrors| {
            let Some(value) = value else {
                if !reported.iter().any(|e| e.field == key) && !reported.is_empty_body() {
                    errors.push(key, "is required");
                }
                return None;
            };
            match dns_label_problem(value) {
                Some(problem) => {
                    errors.push(key, problem);
                    None
                }
                None => Some(value.clone()),
            }
        };
        let statefulset = name("statefulset", read.statefulset.as_ref(), &mut errors);
        let namespace = name("namespace", read.namespace.as_ref(), &mut errors);
        let endpoints = match &read.endpoints {
            Some(list) => endpoint_list(list, &mut errors),
            None if reported.iter().any(|e| e.field.starts_with("endpoints"))
                || reported.is_empty_body() =>
            {
                None
            }
            None => {
                errors.push("endpoints", "is required");
                None
            }
        };
        let mut within = |key: &str, value: Option<u64>, range: std::ops::RangeInclusive<u64>| {
            if let Some(v) = value.filter(|v| !range.contains(v)) {
                errors.push(
                    key,
                    format!(
                        "{v} must be a whole number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                );
            }
        };
        within("ready_timeout_secs", read.ready_timeout_secs, 1..=3600);
        within("cooldown_secs", read.cooldown_secs, 0..=600);
        within("max_lag", read.max_lag, 1..=10_000_000);
        match (statefulset, namespace, endpoints) {
            (Some(statefulset), Some(namespace), Some(endpoints)) if errors.is_empty() => {
                Ok(Self {
                    statefulset,
                    namespace,
                    endpoints,
                    ready_timeout_secs: read.ready_timeout_secs.unwrap_or(300),
                    cooldown_secs: read.cooldown_secs.unwrap_or(0),
                    max_lag: read.max_lag.unwrap_or(1000),
                })
            }
            _ => Err(errors),
        }
    }

    /// The JSON body this request came from, defaults filled in.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "statefulset": self.statefulset,
            "namespace": self.namespace,
            "endpoints": self.endpoints,
            "ready_timeout_secs": self.ready_timeout_secs,
            "cooldown_secs": self.cooldown_secs,
            "max_lag": self.max_lag,
        })
    }

    /// What the roll acts on, `namespace/statefulset`: one roll at a time per target.
    pub fn target(&self) -> String {
        format!("{}/{}", self.namespace, self.statefulset)
    }

    /// Whether any endpoint uses TLS.
    pub fn uses_tls(&self) -> bool {
        self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

/// Why `value` is not a Kubernetes object name (an RFC 1123 label), if it is not.
fn dns_label_problem(value: &str) -> Option<String> {
    let ok = (1..=63).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    (!ok).then(|| {
        format!(
            "{value:?} is not a Kubernetes name (1-63 lowercase letters, digits or '-', starting and ending with a letter or digit)"
        )
    })
}

/// A list of 1..=MAX_MEMBERS distinct `http(s)://host:port` URLs.
fn endpoint_list(items: &[String], errors: &mut FieldErrors) -> Option<Vec<String>> {
    if items.is_empty() || items.len() > EtcdRollRequest::MAX_MEMBERS {
        errors.push(
            "endpoints",
            format!(
                "must name 1 to {} members, got {}",
                EtcdRollRequest::MAX_MEMBERS,
                items.len()
            ),
        );
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let field = format!("endpoints[{i}]");
        let url = item.trim_end_matches('/');
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"));
        let plain = rest.is_some_and(|r| {
            !r.is_empty()
                && r.len() <= 253
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        });
        if !plain {
            errors.push(
                &field,
                format!("{url:?} is not http(s)://host:port (no path, no user, no query)"),
            );
        } else if out.iter().any(|e| e == url) {
            errors.push(&field, format!("{url:?} is listed twice"));
        } else {
            out.push(url.to_owned());
        }
    }
    Some(out)
}

impl ReadRequest for DetectionRequest {
    fn read(json: &Value) -> Result<Self, FieldErrors> {
        Self::from_json(json)
    }
}

impl ReadRequest for EtcdRollRequest {
    fn read(json: &Value) -> Result<Self, FieldErrors> {
        Self::from_json(json)
    }
}

impl RunRequest for DetectionRequest {
    fn to_json(&self) -> Value {
        DetectionRequest::to_json(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl RunRequest for EtcdRollRequest {
    fn to_json(&self) -> Value {
        EtcdRollRequest::to_json(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// What an operator asks of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ControlAction {
    /// Finish the current step, then hold.
    Halt,
    /// Continue a halted run from the held step.
    Resume,
    /// Stop for good, changing nothing more.
    Abort,
    /// Let a run that waits for an operator's approval (a fleet wave with
    /// `fleet.require_approval`) go on; the approver is credited.
    Approve,
}

impl ControlAction {
    /// Parses `halt`, `resume` or `abort`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "halt" => Some(Self::Halt),
            "resume" => Some(Self::Resume),
            "abort" => Some(Self::Abort),
            "approve" => Some(Self::Approve),
            _ => None,
        }
    }
}

impl fmt::Display for ControlAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Halt => "halt",
            Self::Resume => "resume",
            Self::Abort => "abort",
            Self::Approve => "approve",
        })
    }
}

/// An operator's control of one run (`POST /v1/runs/{id}/halt|resume|abort`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlRequest {
    /// The run's id.
    pub run_id: String,
    /// What to do.
    pub action: ControlAction,
    /// Why, for the history.
    pub reason: String,
    /// Who asks: the API client's name (set by the HTTP intake). When absent (a message
    /// published straight to the exchange), the envelope's `source` is credited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// A persisted timer firing for one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WakeRequest {
    /// The run to wake.
    pub run_id: String,
    /// The run's epoch when the wake was scheduled; a wake from an older epoch is stale.
    pub epoch: u64,
}

/// The event types rollgate knows, with their routing keys: its own, and one per door of
/// the workflows that make runs.
#[derive(Debug, Clone, Copy)]
pub enum EventType {
    /// Alertmanager notifications.
    Alerts,
    /// A request for a run, through a workflow's door.
    Run(&'static RunDoor),
    /// Operator controls.
    Control,
    /// Timers.
    Wake,
}

impl PartialEq for EventType {
    fn eq(&self, other: &Self) -> bool {
        self.type_name() == other.type_name()
    }
}

impl Eq for EventType {}

impl std::hash::Hash for EventType {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.type_name().hash(state);
    }
}

impl EventType {
    /// The types that are rollgate's own, whatever workflows it has.
    pub const OWN: [EventType; 3] = [Self::Alerts, Self::Control, Self::Wake];

    /// Every type: rollgate's own and one per door.
    pub fn all(doors: Doors) -> impl Iterator<Item = EventType> {
        Self::OWN.into_iter().chain(doors.iter().map(Self::Run))
    }

    /// The CloudEvents `type`.
    pub fn type_name(self) -> &'static str {
        match self {
            Self::Alerts => "rollgate.alerts.v1",
            Self::Run(door) => door.event_type,
            Self::Control => "rollgate.control.v1",
            Self::Wake => "rollgate.wake.v1",
        }
    }
    /// The AMQP routing key.
    pub fn routing_key(self) -> &'static str {
        match self {
            Self::Alerts => "alerts",
            Self::Run(door) => door.routing_key,
            Self::Control => "control",
            Self::Wake => "wake",
        }
    }
    /// A short label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Alerts => "alerts",
            Self::Run(door) => door.label,
            Self::Control => "control",
            Self::Wake => "wake",
        }
    }
    /// The type with this CloudEvents `type`.
    pub fn from_type_name(name: &str, doors: Doors) -> Option<Self> {
        Self::all(doors).find(|t| t.type_name() == name)
    }
}

/// The validated payload of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum EventData {
    /// An Alertmanager notification.
    Alerts(AlertBatch),
    /// A request for a run of any workflow.
    Run(RunAsked),
    /// An operator control.
    Control(ControlRequest),
    /// A timer.
    Wake(WakeRequest),
}

impl EventData {
    /// The type of this payload.
    pub fn event_type(&self) -> EventType {
        match self {
            Self::Alerts(_) => EventType::Alerts,
            Self::Run(asked) => EventType::Run(asked.door),
            Self::Control(_) => EventType::Control,
            Self::Wake(_) => EventType::Wake,
        }
    }
}

/// The `source` of the events rollgate produces itself (its intake and its wakes).
pub const ROLLGATE_SOURCE: &str = "rollgate";

/// A CloudEvents 1.0 event in structured JSON mode, as it travels on the queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloudEvent {
    /// Always `1.0`.
    pub specversion: String,
    /// Unique per event; the deduplication key.
    pub id: String,
    /// Who produced it.
    pub source: String,
    /// The event type, e.g. `rollgate.detection.v1`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// When it was produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<DateTime<Utc>>,
    /// Extension attribute: the run this event belongs to, when known at intake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runid: Option<String>,
    /// The payload.
    #[serde(default)]
    pub data: Value,
}

/// Why a queued message cannot be processed: it goes to the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or not a CloudEvents envelope.
    #[error("not a CloudEvents 1.0 JSON envelope: {0}")]
    Envelope(String),
    /// An envelope attribute is wrong.
    #[error("bad CloudEvents attribute {0}")]
    Attribute(String),
    /// The `data` breaks the rules of its type.
    #[error("invalid {event_type} data: {errors}")]
    Data {
        /// The event type.
        event_type: &'static str,
        /// Every problem.
        errors: FieldErrors,
    },
}

const MAX_ID_LEN: usize = 256;
const MAX_SOURCE_LEN: usize = 256;

impl CloudEvent {
    /// A new event of `data`'s type with a fresh id.
    pub fn new(data: &EventData, source: &str, now: DateTime<Utc>) -> Self {
        let (runid, payload) = match data {
            EventData::Alerts(batch) => (None, alerts_to_json(batch)),
            EventData::Run(asked) => (asked.run_id.clone(), asked.request.to_json()),
            EventData::Control(c) => (Some(c.run_id.clone()), serde_json::json!(c)),
            EventData::Wake(w) => (Some(w.run_id.clone()), serde_json::json!(w)),
        };
        Self {
            specversion: "1.0".into(),
            id: uuid::Uuid::now_v7().to_string(),
            source: source.into(),
            event_type: data.event_type().type_name().into(),
            time: Some(now),
            runid,
            data: payload,
        }
    }

    /// The envelope as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses and validates an envelope and its data; a run request is read by its door.
    pub fn decode(bytes: &[u8], doors: Doors) -> Result<(Self, EventData), DecodeError> {
        let event: CloudEvent =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::Envelope(e.to_string()))?;
        if event.specversion != "1.0" {
            return Err(DecodeError::Attribute(format!(
                "specversion {:?}: only \"1.0\" is supported",
                event.specversion
            )));
        }
        if event.id.is_empty() || event.id.len() > MAX_ID_LEN {
            return Err(DecodeError::Attribute(format!(
                "id: must be 1-{MAX_ID_LEN} characters"
            )));
        }
        // The source is credited in runs' histories and logs: a name, not a document.
        if event.source.is_empty()
            || event.source.chars().count() > MAX_SOURCE_LEN
            || event.source.chars().any(char::is_control)
        {
            return Err(DecodeError::Attribute(format!(
                "source: must be 1-{MAX_SOURCE_LEN} characters, none of them control characters"
            )));
        }
        let Some(event_type) = EventType::from_type_name(&event.event_type, doors) else {
            return Err(DecodeError::Attribute(format!(
                "type {:?}: not one of {}",
                event.event_type,
                EventType::all(doors)
                    .map(EventType::type_name)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let data_error = |errors| DecodeError::Data {
            event_type: event_type.type_name(),
            errors,
        };
        let data = match event_type {
            EventType::Alerts => {
                EventData::Alerts(AlertBatch::from_json(&event.data).map_err(data_error)?)
            }
            EventType::Run(door) => EventData::Run(RunAsked {
                door,
                run_id: event.runid.clone(),
                request: (door.read_published)(&event.data).map_err(data_error)?,
            }),
            EventType::Control => EventData::Control(
                serde_json::from_value(event.data.clone())
                    .map_err(|e| single(data_error, e.to_string()))?,
            ),
            EventType::Wake => EventData::Wake(
                serde_json::from_value(event.data.clone())
                    .map_err(|e| single(data_error, e.to_string()))?,
            ),
        };
        Ok((event, data))
    }
}

fn single(make: impl FnOnce(FieldErrors) -> DecodeError, problem: String) -> DecodeError {
    let mut errors = FieldErrors::default();
    errors.push("data", problem);
    make(errors)
}

/// Re-encodes a validated batch in Alertmanager's own field names, so that the queued
/// `data` is exactly what `POST /v1/alerts` takes.
fn alerts_to_json(batch: &AlertBatch) -> Value {
    let alerts: Vec<Value> = batch
        .alerts
        .iter()
        .map(|a| {
            serde_json::json!({
                "status": a.status,
                "labels": a.labels,
                "annotations": a.annotations,
                "startsAt": a.starts_at.to_rfc3339(),
                "endsAt": a.ends_at.map_or_else(|| "0001-01-01T00:00:00Z".to_owned(), |t| t.to_rfc3339()),
                "fingerprint": a.fingerprint,
            })
        })
        .collect();
    let firing = batch
        .alerts
        .iter()
        .any(|a| a.status == super::alert::AlertStatus::Firing);
    serde_json::json!({
        "version": "4",
        "groupKey": batch.group_key,
        "status": if firing { "firing" } else { "resolved" },
        "receiver": batch.receiver,
        "alerts": alerts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn etcd_roll_request_takes_the_documented_body_and_fills_defaults() {
        let req = EtcdRollRequest::from_json(&json!({
            "statefulset": "etcd", "namespace": "etcd",
            "endpoints": ["https://etcd-0.etcd.etcd.svc:2379/", "https://10.0.0.2:2379"],
        }))
        .unwrap();
        assert_eq!(req.target(), "etcd/etcd");
        assert_eq!(req.endpoints[0], "https://etcd-0.etcd.etcd.svc:2379");
        assert_eq!(
            (req.ready_timeout_secs, req.cooldown_secs, req.max_lag),
            (300, 0, 1000)
        );
        assert!(req.uses_tls());
        assert_eq!(EtcdRollRequest::from_json(&req.to_json()).unwrap(), req);
    }

    #[test]
    fn etcd_roll_request_rejects_each_broken_rule() {
        let good = json!({"statefulset": "etcd", "namespace": "db", "endpoints": ["http://127.0.0.1:2379"]});
        let with = |key: &str, value: Value| {
            let mut body = good.clone();
            body[key] = value;
            body
        };
        let cases = [
            (with("statefulset", json!("Etcd")), "statefulset"),
            (with("statefulset", json!("etcd;reboot")), "statefulset"),
            (with("namespace", json!("-db")), "namespace"),
            (with("namespace", json!(7)), "namespace: must be a string"),
            (with("endpoints", json!([])), "endpoints: must name 1 to 15"),
            (
                with("endpoints", json!("http://a:1")),
                "endpoints: must be a list",
            ),
            (with("endpoints", json!(["ftp://a:1"])), "endpoints[0]"),
            (with("endpoints", json!(["http://a:1/x"])), "endpoints[0]"),
            (with("endpoints", json!(["http://u@a:1"])), "endpoints[0]"),
            (with("endpoints", json!(["http://$(id):1"])), "endpoints[0]"),
            (
                with("endpoints", json!(["http://a:1", "http://a:1/"])),
                "listed twice",
            ),
            (with("ready_timeout_secs", json!(0)), "ready_timeout_secs"),
            (with("cooldown_secs", json!(-1)), "cooldown_secs"),
            (with("max_lag", json!("1")), "max_lag"),
            (
                with("driver", json!("command")),
                "driver: is not a known field",
            ),
            (
                json!({"endpoints": ["http://a:1"]}),
                "statefulset: is required",
            ),
        ];
        for (body, expected) in cases {
            let errors = EtcdRollRequest::from_json(&body).expect_err(&body.to_string());
            assert!(
                errors.to_string().contains(expected),
                "{body}: {errors} lacks {expected:?}"
            );
        }
    }

    #[test]
    fn detection_accepts_the_documented_body() {
        let req = DetectionRequest::from_json(&json!({
            "target_version": "1.34.5", "kind": "patch", "dry_run": true,
            "stages": "preflight,snapshot"
        }))
        .unwrap();
        assert_eq!(req.target_version.to_string(), "1.34.5");
        assert!(req.dry_run);
        assert_eq!(req.stages.to_text(), "preflight,snapshot");
        let defaults =
            DetectionRequest::from_json(&json!({"target_version": "1.35.0", "kind": "minor"}))
                .unwrap();
        assert_eq!(defaults.stages, StageSelection::all());
        assert!(!defaults.dry_run);
    }

    #[test]
    fn detection_rejects_each_broken_rule() {
        let cases = [
            (
                json!({"target_version": "1.34", "kind": "patch"}),
                "target_version",
            ),
            (
                json!({"target_version": "1.34.5;reboot", "kind": "patch"}),
                "target_version",
            ),
            (
                json!({"target_version": 1.34, "kind": "patch"}),
                "target_version",
            ),
            (json!({"kind": "patch"}), "target_version"),
            (json!({"target_version": "1.34.5", "kind": "major"}), "kind"),
            (
                json!({"target_version": "1.34.5", "kind": "patch", "stages": "preflight,reboot"}),
                "stages",
            ),
            (
                json!({"target_version": "1.34.5", "kind": "patch", "stages": ""}),
                "stages",
            ),
            (
                json!({"target_version": "1.34.5", "kind": "patch", "dry_run": "yes"}),
                "dry_run",
            ),
            (
                json!({"target_version": "1.34.5", "kind": "patch", "extra": 1}),
                "extra",
            ),
            (json!("1.34.5"), ""),
        ];
        for (body, field) in cases {
            let errors = DetectionRequest::from_json(&body).expect_err(&body.to_string());
            assert!(
                errors.iter().any(|e| e.field == field),
                "{body}: expected {field:?}, got {errors}"
            );
        }
    }

    #[test]
    fn every_refused_field_is_named_at_once_in_the_words_of_the_api() {
        let errors = DetectionRequest::from_json(&json!({
            "target_version": 5, "kind": "major", "dry_run": "yes", "extra": 1
        }))
        .unwrap_err();
        let got: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.problem))
            .collect();
        for want in [
            "target_version: must be a string",
            "kind: \"major\" is not `patch` or `minor`",
            "dry_run: must be true or false",
            "extra: is not a known field (known: target_version, kind, dry_run, stages)",
        ] {
            assert!(got.iter().any(|g| g == want), "{want:?} not in {got:?}");
        }
        assert_eq!(got.len(), 4, "{got:?}");
        let missing =
            EtcdRollRequest::from_json(&json!({"namespace": "db", "max_lag": 0})).unwrap_err();
        let got: Vec<String> = missing
            .iter()
            .map(|e| format!("{}: {}", e.field, e.problem))
            .collect();
        assert_eq!(
            got,
            [
                "statefulset: is required",
                "endpoints: is required",
                "max_lag: 0 must be a whole number from 1 to 10000000"
            ]
        );
    }

    #[test]
    fn several_problems_are_reported_together() {
        let errors =
            DetectionRequest::from_json(&json!({"target_version": "x", "kind": "y"})).unwrap_err();
        assert_eq!(errors.len(), 2, "{errors}");
    }

    #[test]
    fn a_refused_key_that_is_empty_or_dotted_is_named_quoted() {
        for (body, field) in [
            (
                json!({"": 1, "target_version": "1.34.5", "kind": "patch"}),
                "\"\"",
            ),
            (
                json!({"a.b": 1, "target_version": "1.34.5", "kind": "patch"}),
                "\"a.b\"",
            ),
        ] {
            let errors = DetectionRequest::from_json(&body).expect_err("refused");
            let named: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(named, [field], "{body}: only the unknown key is refused");
        }
    }
}
