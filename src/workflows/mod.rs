//! The acting halves of the workflows. Each pairs with its pure half in `domain` (same
//! name) and reaches the world only through `ports`: what to do is decided in `domain`,
//! done here, and talked to other systems by `adapters`, wired by `app`.

pub mod analysis;
pub mod control_plane_cycle;
pub mod detect;
pub mod etcd_roll;
pub mod events;
pub mod fleet;
pub mod gate;
pub mod intake;
pub mod k8s_upgrade;
pub mod leader;
pub mod node_cycle;
pub mod node_reboot;
pub mod outbox;
pub mod view;

use crate::domain::run_request::Doors;
use crate::domain::scope::Scope;
use crate::domain::step_kind::{self, StepType};
use crate::metrics::MetricSetType;
use crate::setting;

/// The doors of the workflows that make runs: registering one is its line here.
pub static DOORS: Doors = Doors(&[
    &k8s_upgrade::intake::DOOR,
    &etcd_roll::intake::DOOR,
    &node_reboot::intake::DOOR,
]);

/// Makes every workflow's step kinds and run kind known, so that runs stored or shown by
/// the API read back: the first thing `main` does, and what a test that reads runs in its
/// own process does first. Registering again changes nothing.
pub fn register() {
    let types: Vec<StepType> = DOORS.iter().map(|door| door.steps).collect();
    step_kind::register(&types);
    crate::metrics::register_sets(METRIC_SETS);
}

/// Every scope a token may carry, each once, by name: rollgate's own and each door's.
pub fn scopes() -> Vec<Scope> {
    let mut all: std::collections::BTreeSet<Scope> = Scope::OWN.into_iter().collect();
    all.extend(DOORS.iter().map(|door| door.scope));
    all.into_iter().collect()
}

/// The read-only views the workflows offer on the API: registering one is its line here.
pub static VIEWS: &[&view::ViewDoor] = &[&fleet::VIEW];

/// The workflows' own metric families: registering a set is its line here.
pub static METRIC_SETS: &[MetricSetType] = &[
    node_reboot::metrics::METRICS,
    etcd_roll::metrics::METRICS,
    analysis::METRICS,
];

/// Declares the workflows' sections of the settings, one line each: the struct `config`
/// flattens into `Settings`, how each is read, its keys, and its check.
macro_rules! workflow_sections {
    ($($(#[doc = $doc:literal])* $name:ident: $section:ty,)*) => {
        /// The workflows' own sections of the settings; a workflow's section is its line
        /// here, its type in its folder.
        #[derive(Debug, Clone, Default, schemars::JsonSchema)]
        pub struct WorkflowSettings {
            $($(#[doc = $doc])* pub $name: $section,)*
        }

        impl WorkflowSettings {
            /// Each section by name, with the keys serde reads for it.
            pub fn keys() -> Vec<(&'static str, &'static [&'static str])> {
                vec![$((stringify!($name), setting::fields::<$section>()),)*]
            }

            /// Every section, read from `source`.
            pub fn read(source: &mut impl setting::SectionSource) -> Self {
                Self { $($name: source.take(stringify!($name)),)* }
            }

            /// Every section's lines in `rollgate check-config`'s summary.
            pub fn summary(&self, around: &setting::Around) -> Vec<(&'static str, String)> {
                let mut lines = Vec::new();
                $(lines.extend(setting::Section::summary(&self.$name, around));)*
                lines
            }

            /// Checks every section, handing each section's findings to `each`.
            pub fn check(&self, each: &mut dyn FnMut(setting::Problems)) {
                $({
                    let mut p = setting::Problems::new(stringify!($name));
                    setting::Section::check(&self.$name, &mut p);
                    each(p);
                })*
            }
        }
    };
}

workflow_sections! {
    /// etcd clusters rolled by `serve`.
    etcd_roll: etcd_roll::config::EtcdRollConfig,
    /// Node reboots.
    reboot: node_reboot::config::RebootConfig,
    /// Fleet waves: the clusters upstream of this one.
    fleet: fleet::config::FleetConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::alert::AlertBatch;
    use crate::domain::event::{
        CloudEvent, ControlAction, ControlRequest, DetectionRequest, EventData, EventType,
        WakeRequest,
    };
    use crate::domain::run_request::RunAsked;
    use crate::domain::scope::{Scope, required};
    use chrono::Utc;
    use serde_json::json;

    /// Every workflow's steps read back from the wire once registered, each stage is one
    /// workflow's alone, and no two steps share a label.
    #[test]
    fn every_registered_step_reads_back_and_each_stage_is_one_workflows() {
        use crate::domain::step_kind::{StepKind, StepWire};
        use crate::domain::upgrade_step::{Stage, UpgradeStep};
        register();
        let mut steps = etcd_roll::step::tests::every_step();
        steps.extend(node_reboot::step::tests::every_step());
        steps.extend([
            UpgradeStep::Plan.into(),
            UpgradeStep::MarkInFlight.into(),
            UpgradeStep::Gate {
                stage: Stage::Workers,
                node: Some("n1".into()),
            }
            .into(),
            UpgradeStep::Drain {
                stage: Stage::Workers,
                node: "n1".into(),
            }
            .into(),
            UpgradeStep::ClearInFlight.into(),
        ]);
        for step in &steps {
            let wire = StepWire::from(step.clone());
            let claimed: Vec<_> = DOORS
                .iter()
                .filter(|d| (d.steps.parse)(&wire.stage, &wire.name, wire.node.clone()).is_some())
                .map(|d| d.kind())
                .collect();
            assert_eq!(claimed, [step.run_kind()], "{wire:?}");
            let json = serde_json::to_value(step).unwrap();
            let back: StepKind = serde_json::from_value(json.clone()).unwrap();
            assert_eq!(&back, step, "{json}");
        }
        let labels: std::collections::HashSet<String> = steps.iter().map(StepKind::label).collect();
        assert_eq!(labels.len(), steps.len(), "two steps share a label");
    }

    /// Each door is its own: no two share a kind, a route, a type or a routing key, and
    /// none takes one of rollgate's own.
    #[test]
    fn doors_are_distinct() {
        let types: Vec<EventType> = EventType::all(DOORS).collect();
        for (i, a) in types.iter().enumerate() {
            for b in &types[i + 1..] {
                assert_ne!(a.type_name(), b.type_name());
                assert_ne!(a.routing_key(), b.routing_key());
                assert_ne!(a.label(), b.label());
            }
        }
        let doors: Vec<_> = DOORS.iter().collect();
        for (i, a) in doors.iter().enumerate() {
            for b in &doors[i + 1..] {
                assert_ne!(a.kind(), b.kind());
                assert_ne!(a.path, b.path);
                assert_ne!(a.scope, b.scope);
            }
        }
    }

    #[test]
    fn envelope_round_trips_every_type() {
        let now = Utc::now();
        let detection = EventData::Run(RunAsked {
            door: &k8s_upgrade::intake::DOOR,
            run_id: Some("r1".into()),
            request: std::sync::Arc::new(
                DetectionRequest::from_json(&json!({"target_version": "1.34.5", "kind": "patch"}))
                    .unwrap(),
            ),
        });
        let alerts = EventData::Alerts(
            AlertBatch::from_json(&crate::domain::alert::tests_support::webhook()).unwrap(),
        );
        let control = EventData::Control(ControlRequest {
            run_id: "r1".into(),
            action: ControlAction::Halt,
            reason: "maintenance".into(),
            by: Some("alice".into()),
        });
        let wake = EventData::Wake(WakeRequest {
            run_id: "r1".into(),
            epoch: 3,
        });
        for data in [detection, alerts, control, wake] {
            let event = CloudEvent::new(&data, "test", now);
            let (decoded, decoded_data) = CloudEvent::decode(&event.to_bytes(), DOORS).unwrap();
            assert_eq!(decoded.id, event.id);
            assert_eq!(decoded_data, data);
        }
    }

    #[test]
    fn decode_rejects_bad_envelopes() {
        for body in [
            &b"not json"[..],
            br#"{"specversion":"0.3","id":"1","source":"s","type":"rollgate.wake.v1","data":{}}"#,
            br#"{"specversion":"1.0","id":"","source":"s","type":"rollgate.wake.v1","data":{}}"#,
            br#"{"specversion":"1.0","id":"1","source":"s","type":"other","data":{}}"#,
            br#"{"specversion":"1.0","id":"1","source":"s","type":"rollgate.detection.v1","data":{"target_version":"1.2","kind":"patch"}}"#,
            br#"{"specversion":"1.0","id":"1","source":"s","type":"rollgate.wake.v1","data":{"run_id":5}}"#,
            br#"{"specversion":"1.0","id":"1","source":"","type":"rollgate.wake.v1","data":{"run_id":"r","epoch":1}}"#,
            br#"{"specversion":"1.0","id":"1","source":"ops\nforged line","type":"rollgate.wake.v1","data":{"run_id":"r","epoch":1}}"#,
        ] {
            assert!(CloudEvent::decode(body, DOORS).is_err(), "{}", String::from_utf8_lossy(body));
        }
        let long = format!(
            r#"{{"specversion":"1.0","id":"1","source":"{}","type":"rollgate.wake.v1","data":{{"run_id":"r","epoch":1}}}}"#,
            "s".repeat(257)
        );
        let refused = CloudEvent::decode(long.as_bytes(), DOORS).expect_err("refused");
        assert!(refused.to_string().contains("source"), "{refused}");
        // A published reboot request has nobody to answer a dry run: refused, not run.
        let dry = br#"{"specversion":"1.0","id":"1","source":"s","type":"rollgate.reboot.v1","data":{"nodes":["w1"],"dry_run":true}}"#;
        let refused = CloudEvent::decode(dry, DOORS).expect_err("refused");
        assert!(
            refused.to_string().contains("POST /v1/reboots"),
            "{refused}"
        );
        let real = br#"{"specversion":"1.0","id":"1","source":"s","type":"rollgate.reboot.v1","data":{"nodes":["w1"],"dry_run":false}}"#;
        assert!(CloudEvent::decode(real, DOORS).is_ok());
    }

    /// Every scope a token may carry is listed once, in the order clients show them:
    /// rollgate's own and each door's.
    #[test]
    fn every_scope_is_listed_once() {
        let names: Vec<&str> = scopes().iter().map(|s| s.name()).collect();
        let want = [
            "alerts:write",
            "detections:write",
            "etcd-rolls:write",
            "reboots:write",
            "runs:control",
            "runs:approve",
            "read",
        ];
        assert_eq!(names, want);
    }

    /// Every route, the doors' among rollgate's own, needs its scope.
    #[test]
    fn every_route_of_the_api_needs_its_scope() {
        let cases = [
            ("POST", "/v1/alerts", Scope::ALERTS_WRITE),
            ("GET", "/v1/alerts", Scope::READ),
            ("POST", "/v1/detections", Scope::DETECTIONS_WRITE),
            ("POST", "/v1/etcd-rolls", etcd_roll::intake::DOOR.scope),
            ("POST", "/v1/reboots", node_reboot::intake::DOOR.scope),
            ("GET", "/v1/gates", Scope::READ),
            ("GET", "/v1/events", Scope::READ),
            ("GET", "/v1/runs", Scope::READ),
            ("GET", "/v1/runs/r-1", Scope::READ),
            ("HEAD", "/v1/runs/r-1", Scope::READ),
            ("POST", "/v1/runs/r-1/halt", Scope::RUNS_CONTROL),
            ("POST", "/v1/runs/r-1/resume", Scope::RUNS_CONTROL),
            ("POST", "/v1/runs/r-1/abort", Scope::RUNS_CONTROL),
            ("POST", "/v1/runs/r-1/approve", Scope::RUNS_APPROVE),
            ("GET", "/v1/fleet", Scope::READ),
            ("POST", "/v1/alerts/", Scope::ALERTS_WRITE),
            ("POST", "/v1/nothing-here", Scope::RUNS_CONTROL),
            ("DELETE", "/v1/alerts", Scope::ALERTS_WRITE),
            ("PUT", "/v1/runs", Scope::RUNS_CONTROL),
            ("POST", "/v1/whoami", Scope::RUNS_CONTROL),
        ];
        for (method, path, scope) in cases {
            assert_eq!(
                required(method, path, |p| DOORS.scope_at(p)),
                Some(scope),
                "{method} {path}"
            );
        }
        assert_eq!(required("GET", "/v1/whoami", |p| DOORS.scope_at(p)), None);
    }
}
