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
    /// On a k3s or RKE2 cluster, the build of the target: the 2 of `v1.34.5+k3s2`. None:
    /// the first build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<u32>,
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
    /// On a k3s or RKE2 cluster (`cluster.distribution`), the build of the target release:
    /// the 2 of `v1.34.5+k3s2`, 1 to 999; default 1. A kubeadm cluster refuses it.
    #[schema(required = false, value_type = u32, example = 1)]
    pub build: Option<u32>,
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
        if let Some(build) = read.build
            && !(1..=crate::domain::distribution::MAX_BUILD).contains(&build)
        {
            errors.push(
                "build",
                format!("{build} is not a build number from 1 to 999 (the 2 of v1.34.5+k3s2)"),
            );
        }
        match (target_version, read.kind, stages) {
            (Some(target_version), Some(kind), Some(stages)) if errors.is_empty() => Ok(Self {
                target_version,
                kind,
                dry_run: read.dry_run.unwrap_or(false),
                stages,
                build: read.build,
            }),
            _ => Err(errors),
        }
    }

    /// The JSON body this request came from, as the HTTP endpoint takes it.
    pub fn to_json(&self) -> Value {
        let mut body = serde_json::json!({
            "target_version": self.target_version.to_string(),
            "kind": self.kind,
            "dry_run": self.dry_run,
            "stages": self.stages.to_text(),
        });
        if let Some(build) = self.build {
            body["build"] = build.into();
        }
        body
    }
}

impl ReadRequest for DetectionRequest {
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
            "extra: is not a known field (known: target_version, kind, dry_run, stages, build)",
        ] {
            assert!(got.iter().any(|g| g == want), "{want:?} not in {got:?}");
        }
        assert_eq!(got.len(), 4, "{got:?}");
    }

    #[test]
    fn a_build_is_a_number_from_1_to_999_and_round_trips() {
        let body =
            |build: Value| json!({"target_version": "1.34.5", "kind": "patch", "build": build});
        let request = DetectionRequest::from_json(&body(json!(2))).expect("build 2");
        assert_eq!(request.build, Some(2));
        assert_eq!(DetectionRequest::from_json(&request.to_json()), Ok(request));
        for bad in [json!(0), json!(1000), json!("k3s1"), json!(-1)] {
            let errors = DetectionRequest::from_json(&body(bad.clone())).expect_err("refused");
            assert!(errors.iter().all(|e| e.field == "build"), "{bad}: {errors}");
        }
        let plain =
            DetectionRequest::from_json(&json!({"target_version": "1.34.5", "kind": "patch"}))
                .expect("no build");
        assert_eq!(plain.build, None);
        assert!(plain.to_json().get("build").is_none());
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
