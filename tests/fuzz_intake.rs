//! Property tests of every parser that takes outside input — Alertmanager payloads,
//! CloudEvents envelopes, detection and etcd-roll requests, control bodies, config files —
//! and of the HTTP intake in front of them: never a panic, never a 5xx, and every refusal a
//! 4xx that names the field. Inputs are valid documents mutated (a field removed, replaced by
//! any JSON, an unknown one added, nested deeper) and arbitrary JSON and bytes. Bounded:
//! `FUZZ_CASES` (default 2000) cases per property; the whole binary runs in well under a
//! minute (about 12 s on 2 cores).

mod support;

use proptest::prelude::*;
use proptest::test_runner::{
    Config, FileFailurePersistence, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
};
use rollgate::domain::alert::{Alert, AlertBatch};
use rollgate::domain::event::{
    CloudEvent, DecodeError, DetectionRequest, FieldErrors, StageSelection,
};
use rollgate::workflows::etcd_roll::request::EtcdRollRequest;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::{Rollgate, webhook};

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000)
}

fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
        ..Config::default()
    }
}

/// Where a failing case's seed is kept: commit it, and every later run tries it first.
const REGRESSIONS: &str = "tests/fuzz_intake.proptest-regressions";

/// This run's seed: `FUZZ_SEED` (hex, 32 bytes) replays a run; otherwise a fresh one.
fn seed() -> [u8; 32] {
    static SEED: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        let mut seed = [0u8; 32];
        match std::env::var("FUZZ_SEED")
            .ok()
            .and_then(|h| hex::decode(h.trim()).ok())
        {
            Some(bytes) if bytes.len() == 32 => seed.copy_from_slice(&bytes),
            _ => getrandom::fill(&mut seed).expect("random seed"),
        }
        seed
    })
}

/// A runner for property `name`, seeded from this run's seed and the name, so that each
/// property has its own cases and `FUZZ_SEED` replays all of them; the seed is printed,
/// and named again when the property fails.
fn runner(name: &str, config: Config) -> TestRunner {
    let mut seed = seed();
    for (i, b) in name.bytes().enumerate() {
        seed[i % 32] ^= b;
    }
    eprintln!(
        "{name}: FUZZ_SEED={} replays this run",
        hex::encode(self::seed())
    );
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed))
}

/// A property's result, which panics on failure naming the seed that replays it.
trait Replay {
    fn replay(self, name: &str);
}

impl<T: std::fmt::Debug> Replay for Result<(), TestError<T>> {
    fn replay(self, name: &str) {
        if let Err(e) = self {
            panic!(
                "{name}: {e}\nreplay with FUZZ_SEED={} (the failing case is also saved in {REGRESSIONS}: commit it)",
                hex::encode(seed())
            );
        }
    }
}

/// Strings that parsers have reasons to fear: shell, paths, huge, control characters,
/// versions that are almost right, non-ASCII.
fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("1.34.5".to_owned()),
        Just("1.34.5; rm -rf /".to_owned()),
        Just("$(reboot)".to_owned()),
        Just("v1.34.5".to_owned()),
        Just("1.34".to_owned()),
        Just("01.034.005".to_owned()),
        Just("99999999999999999999.1.1".to_owned()),
        Just("patch".to_owned()),
        Just("minor".to_owned()),
        Just("all".to_owned()),
        Just("preflight,,workers".to_owned()),
        Just("../../etc/passwd".to_owned()),
        Just("http://127.0.0.1:1".to_owned()),
        Just("https://[::1]:2379".to_owned()),
        Just("0001-01-01T00:00:00Z".to_owned()),
        Just("2026-13-45T99:99:99Z".to_owned()),
        Just("line\nbreak\0nul".to_owned()),
        Just("ß∂ƒ©˙∆˚¬ 漢字 🚀".to_owned()),
        Just("x".repeat(70_000)),
        "[ -~]{0,40}",
        any::<String>(),
    ]
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        nasty_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z_]{0,12}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One change to a document, at the `at`-th of its places (taken modulo their number).
#[derive(Debug, Clone)]
enum Mutation {
    Remove {
        at: usize,
    },
    Replace {
        at: usize,
        with: Value,
    },
    AddField {
        at: usize,
        name: String,
        value: Value,
    },
    Wrap {
        at: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(|at| Mutation::Remove { at }),
        (any::<usize>(), any_json()).prop_map(|(at, with)| Mutation::Replace { at, with }),
        (any::<usize>(), "[a-zA-Z_]{1,12}", any_json())
            .prop_map(|(at, name, value)| Mutation::AddField { at, name, value }),
        any::<usize>().prop_map(|at| Mutation::Wrap { at }),
    ]
}

/// Every place in `doc`: the paths of its values, by object key or array index.
fn places(doc: &Value, here: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    out.push(here.clone());
    match doc {
        Value::Object(map) => {
            for (k, v) in map {
                here.push(PathStep::Key(k.clone()));
                places(v, here, out);
                here.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                here.push(PathStep::Index(i));
                places(v, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn at_path<'a>(doc: &'a mut Value, path: &[PathStep]) -> Option<&'a mut Value> {
    let mut cur = doc;
    for step in path {
        cur = match (step, cur) {
            (PathStep::Key(k), Value::Object(map)) => map.get_mut(k)?,
            (PathStep::Index(i), Value::Array(items)) => items.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn mutate(mut doc: Value, mutations: &[Mutation]) -> Value {
    for m in mutations {
        let mut all = Vec::new();
        places(&doc, &mut Vec::new(), &mut all);
        let pick = |at: usize| all[at % all.len()].clone();
        match m {
            Mutation::Remove { at } => {
                let path = pick(*at);
                if let Some((last, parent)) = path.split_last()
                    && let Some(parent) = at_path(&mut doc, parent)
                {
                    match (last, parent) {
                        (PathStep::Key(k), Value::Object(map)) => {
                            map.remove(k);
                        }
                        (PathStep::Index(i), Value::Array(items)) if *i < items.len() => {
                            items.remove(*i);
                        }
                        _ => {}
                    }
                }
            }
            Mutation::Replace { at, with } => {
                if let Some(slot) = at_path(&mut doc, &pick(*at)) {
                    *slot = with.clone();
                }
            }
            Mutation::AddField { at, name, value } => {
                if let Some(Value::Object(map)) = at_path(&mut doc, &pick(*at)) {
                    map.insert(name.clone(), value.clone());
                }
            }
            Mutation::Wrap { at } => {
                if let Some(slot) = at_path(&mut doc, &pick(*at)) {
                    *slot = json!([slot.take()]);
                }
            }
        }
    }
    doc
}

/// A valid document with one to four mutations, or now and then none at all.
fn mutated(valid: Value) -> impl Strategy<Value = Value> {
    prop::collection::vec(mutation(), 0..4).prop_map(move |ms| mutate(valid.clone(), &ms))
}

/// Valid documents of every kind of request.
fn valid_detection() -> Value {
    json!({"target_version": "1.34.5", "kind": "patch", "dry_run": false, "stages": "all"})
}

fn valid_etcd_roll() -> Value {
    json!({"statefulset": "etcd", "namespace": "etcd",
           "endpoints": ["https://etcd-0.etcd.etcd.svc:2379", "https://etcd-1.etcd.etcd.svc:2379"],
           "ready_timeout_secs": 300, "cooldown_secs": 10, "max_lag": 1000})
}

fn envelope(event_type: &str, data: Value) -> Value {
    json!({"specversion": "1.0", "id": "0190a1b2-c3d4", "source": "fuzz", "type": event_type,
           "time": "2026-12-01T10:00:00Z", "data": data})
}

/// The key the first segment of a field path names: `alerts[0].labels` → `alerts`,
/// `"a.b".c` → `a.b`.
fn top(field: &str) -> String {
    if field.starts_with('"') {
        let first = serde_json::Deserializer::from_str(field)
            .into_iter::<String>()
            .next();
        return first.and_then(Result::ok).unwrap_or_default();
    }
    field
        .split(['.', '['])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A refusal names a field: each problem has words, and a field unless the body as a
/// whole was refused, and that field is one the request type knows or the body carried.
fn names_fields(errors: &FieldErrors, body: &Value, known: &[&str]) -> Result<(), TestCaseError> {
    prop_assert!(!errors.is_empty(), "a refusal with no problem");
    for e in errors.iter() {
        prop_assert!(
            !e.problem.is_empty(),
            "a problem without words at {:?}",
            e.field
        );
        if !body.is_object() {
            continue;
        }
        let top = top(&e.field);
        let carried = body.as_object().is_some_and(|m| m.contains_key(&top));
        prop_assert!(
            !e.field.is_empty() && (carried || known.contains(&top.as_str())),
            "refusal names no field of the request: {:?} ({})",
            e.field,
            e.problem
        );
    }
    Ok(())
}

fn keys_of(doc: &Value) -> Vec<&str> {
    doc.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// What an accepted Alertmanager body says, read independently of the parser: each
/// alert's fingerprint, status, labels, annotations (none when absent) and times (no end
/// for the zero time or one before 1970).
fn said_alerts(body: &Value) -> Option<Vec<Alert>> {
    let time = |v: &Value| {
        v.as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
    };
    let strings = |v: &Value| -> Option<std::collections::BTreeMap<String, String>> {
        v.as_object()?
            .iter()
            .map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect()
    };
    body["alerts"]
        .as_array()?
        .iter()
        .map(|a| {
            Some(Alert {
                fingerprint: a["fingerprint"].as_str()?.to_owned(),
                status: serde_json::from_value(a["status"].clone()).ok()?,
                labels: strings(&a["labels"])?,
                annotations: if a["annotations"].is_null() {
                    Default::default()
                } else {
                    strings(&a["annotations"])?
                },
                starts_at: time(&a["startsAt"])?,
                ends_at: if a["endsAt"].is_null() {
                    None
                } else {
                    time(&a["endsAt"]).filter(|t| t.timestamp() > 0)
                },
            })
        })
        .collect()
}

/// An accepted detection is exactly what the body said, defaults filled in.
fn said_detection(body: &Value, request: &DetectionRequest) -> Result<(), TestCaseError> {
    let taken = request.to_json();
    prop_assert_eq!(
        &taken["target_version"],
        &body["target_version"],
        "the version as sent"
    );
    prop_assert_eq!(&taken["kind"], &body["kind"]);
    let dry_run = if body["dry_run"].is_null() {
        json!(false)
    } else {
        body["dry_run"].clone()
    };
    prop_assert_eq!(&taken["dry_run"], &dry_run);
    let stages = match body["stages"].as_str() {
        None => StageSelection::all(),
        Some(text) => StageSelection::parse(text).map_err(TestCaseError::fail)?,
    };
    prop_assert_eq!(request.stages.to_text(), stages.to_text());
    Ok(())
}

/// An accepted etcd roll is exactly what the body said, defaults filled in.
fn said_etcd_roll(body: &Value, request: &EtcdRollRequest) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        Some(request.statefulset.as_str()),
        body["statefulset"].as_str()
    );
    prop_assert_eq!(Some(request.namespace.as_str()), body["namespace"].as_str());
    // As documented, a trailing slash is dropped.
    let endpoints: Vec<&str> = body["endpoints"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(|e| e.strip_suffix('/').unwrap_or(e))
                .collect()
        })
        .unwrap_or_default();
    prop_assert_eq!(&request.endpoints, &endpoints);
    let or = |key: &str, default: u64| body[key].as_u64().unwrap_or(default);
    prop_assert_eq!(request.ready_timeout_secs, or("ready_timeout_secs", 300));
    prop_assert_eq!(request.cooldown_secs, or("cooldown_secs", 0));
    prop_assert_eq!(request.max_lag, or("max_lag", 1000));
    Ok(())
}

/// Property `name` of a parser of outside input: mutations of `valid` and any JSON are
/// either accepted and then exactly what they said (`said`), or refused naming a field;
/// enough cases are accepted (one in 20) for the first check to have run.
fn taken_as_said_or_refused<T>(
    name: &str,
    valid: Value,
    parse: impl Fn(&Value) -> Result<T, FieldErrors>,
    said: impl Fn(&Value, &T) -> Result<(), TestCaseError>,
) {
    let known = keys_of(&valid);
    let taken = AtomicUsize::new(0);
    runner(name, config())
        .run(
            &prop_oneof![mutated(valid.clone()), any_json()],
            |body| match parse(&body) {
                Ok(parsed) => {
                    taken.fetch_add(1, Ordering::Relaxed);
                    said(&body, &parsed)
                }
                Err(errors) => names_fields(&errors, &body, &known),
            },
        )
        .replay(name);
    let n = taken.load(Ordering::Relaxed);
    eprintln!("{name}: {n} of {} cases accepted", cases());
    assert!(
        n * 20 >= cases() as usize,
        "{name}: {n} cases accepted: the checks of what is taken hardly ran"
    );
}

#[test]
fn alertmanager_payloads_are_taken_as_they_say_or_refused_by_field() {
    taken_as_said_or_refused(
        "alert payloads",
        webhook("c0ffee01"),
        AlertBatch::from_json,
        |body, batch| {
            let said = said_alerts(body);
            prop_assert_eq!(
                Some(&batch.alerts),
                said.as_ref(),
                "the alerts as sent: {}",
                body
            );
            prop_assert_eq!(Some(batch.receiver.as_str()), body["receiver"].as_str());
            prop_assert_eq!(Some(batch.group_key.as_str()), body["groupKey"].as_str());
            Ok(())
        },
    );
}

#[test]
fn detection_requests_are_taken_as_they_say_or_refused_by_field_and_only_clean_versions_pass() {
    taken_as_said_or_refused(
        "detection requests",
        valid_detection(),
        DetectionRequest::from_json,
        |body, request| {
            said_detection(body, request)?;
            // Whatever passes is exactly MAJOR.MINOR.PATCH, digits only: it may reach a
            // node's shell.
            let version = request.target_version.to_string();
            let parts: Vec<&str> = version.split('.').collect();
            prop_assert_eq!(parts.len(), 3, "{}", version);
            prop_assert!(
                parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
                "{}",
                version
            );
            Ok(())
        },
    );
}

#[test]
fn etcd_roll_requests_are_taken_as_they_say_or_refused_by_field() {
    taken_as_said_or_refused(
        "etcd roll requests",
        valid_etcd_roll(),
        EtcdRollRequest::from_json,
        said_etcd_roll,
    );
}

#[test]
fn cloudevents_envelopes_are_decoded_or_refused_naming_the_attribute_or_field() {
    let envelopes = prop_oneof![
        mutated(envelope("rollgate.alerts.v1", webhook("c0ffee02"))),
        mutated(envelope("rollgate.detection.v1", valid_detection())),
        mutated(envelope("rollgate.etcd-roll.v1", valid_etcd_roll())),
        mutated(envelope(
            "rollgate.control.v1",
            json!({"run_id": "r1", "action": "halt", "reason": "why"})
        )),
        mutated(envelope(
            "rollgate.wake.v1",
            json!({"run_id": "r1", "epoch": 3})
        )),
    ];
    let attributes = [
        "specversion",
        "id",
        "source",
        "type",
        "time",
        "data",
        "runid",
    ];
    runner("envelopes", config())
        .run(&envelopes, |doc| {
            let bytes = serde_json::to_vec(&doc).expect("bytes");
            match CloudEvent::decode(&bytes, rollgate::workflows::DOORS) {
                Ok(_) => {}
                Err(DecodeError::Envelope(e)) => prop_assert!(!e.is_empty()),
                Err(DecodeError::Attribute(e)) => prop_assert!(
                    attributes.iter().any(|a| e.starts_with(a)),
                    "an attribute refusal that names none: {e}"
                ),
                Err(DecodeError::Data { errors, .. }) => {
                    prop_assert!(errors.iter().all(|e| !e.problem.is_empty()));
                }
            }
            Ok(())
        })
        .replay("envelopes");
    // And bytes that are not JSON at all.
    runner("bytes", config())
        .run(&prop::collection::vec(any::<u8>(), 0..512), |bytes| {
            prop_assert!(
                CloudEvent::decode(&bytes, rollgate::workflows::DOORS).is_err()
                    || serde_json::from_slice::<Value>(&bytes).is_ok()
            );
            Ok(())
        })
        .replay("bytes");
}

/// A TOML value of any shape, for any key.
fn toml_value() -> impl Strategy<Value = String> {
    prop_oneof![
        nasty_string().prop_map(|s| toml_string(&s)),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        Just("1.5".to_owned()),
        Just("[]".to_owned()),
        Just("[\"a\", \"b\"]".to_owned()),
        Just("[1, \"mixed\"]".to_owned()),
        Just("{ x = 1 }".to_owned()),
        Just("\"10m\"".to_owned()),
        Just("\"0s\"".to_owned()),
        Just("\"127.0.0.1:0\"".to_owned()),
        Just("\"mon-fri 25:00-06:00 Mars/Olympus\"".to_owned()),
        Just("[\"alerts:write\", \"root\"]".to_owned()),
    ]
}

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars().take(300) {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[test]
fn config_files_load_or_every_problem_names_its_key() {
    let keys = rollgate::config::keys();
    let key = prop_oneof![
        prop::sample::select(keys.clone()),
        "[a-z_]{1,10}\\.[a-z_]{1,12}",
        prop::sample::select(vec![
            "server.scopes.alertmanager".to_owned(),
            "server.scopes.admin".to_owned(),
            "server.scopes..hidden".to_owned(),
        ]),
    ];
    let files = prop::collection::vec((key, toml_value()), 0..8);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rollgate.toml");
    runner("config files", config())
        .run(&files, |entries| {
            // One table per section, each key once, so that the file is TOML.
            let mut sections: std::collections::BTreeMap<
                String,
                std::collections::BTreeMap<String, String>,
            > = Default::default();
            for (key, value) in entries {
                let (section, name) = key.split_once('.').unwrap_or(("", key.as_str()));
                sections
                    .entry(section.to_owned())
                    .or_default()
                    .insert(name.to_owned(), value);
            }
            let mut text = String::new();
            for (name, value) in sections.remove("").unwrap_or_default() {
                text.push_str(&format!("{name} = {value}\n"));
            }
            for (section, entries) in &sections {
                text.push_str(&format!("[{section}]\n"));
                for (name, value) in entries {
                    let name = if name.contains('.') {
                        let (a, b) = name.split_once('.').unwrap_or_default();
                        format!("{a}.{}", toml_string(b))
                    } else {
                        name.clone()
                    };
                    text.push_str(&format!("{name} = {value}\n"));
                }
            }
            std::fs::write(&path, &text).expect("write config");
            let env = Some(Default::default());
            if let Err(e) = rollgate::config::Settings::load_from(Some(&path), env) {
                prop_assert!(!e.0.is_empty(), "a refusal with no problem:\n{text}");
                for p in &e.0 {
                    prop_assert!(
                        !p.key.is_empty() && !p.message.is_empty(),
                        "a problem without a key or words: {p:?}\n{text}"
                    );
                }
            }
            Ok(())
        })
        .replay("config files");
}

/// What the intake answered one request.
struct Answer {
    status: u16,
    body: Value,
}

/// Posts to one `rollgate serve` from the synchronous property runner.
struct Intake {
    rt: tokio::runtime::Runtime,
    rg: Rollgate,
}

impl Intake {
    /// rollgate without a cluster: detections end at the 422 naming the cluster keys,
    /// after their own validation.
    fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let rg = rt.block_on(Rollgate::start(&[]));
        Self { rt, rg }
    }

    fn post(&self, path: &str, content_type: &str, body: Vec<u8>) -> Answer {
        let rg = &self.rg;
        self.rt.block_on(async {
            let r = rg
                .http
                .post(format!("{}{path}", rg.base()))
                .bearer_auth(&rg.token)
                .header("content-type", content_type)
                .body(body)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .expect("rollgate answers");
            let status = r.status().as_u16();
            Answer {
                status,
                body: r.json().await.unwrap_or(Value::Null),
            }
        })
    }

    /// What a request may change: the alert board and the runs.
    fn state(&self) -> (Value, Value) {
        self.rt.block_on(async {
            let (_, board) = self.rg.get("/v1/alerts").await;
            let (_, runs) = self.rg.get("/v1/runs").await;
            (board, runs)
        })
    }

    /// Alert notifications the worker has committed so far (processed or found to be
    /// duplicates): counted after each commit.
    fn alert_events_handled(&self) -> f64 {
        self.rt.block_on(async {
            let text = self.rg.metrics_text().await;
            text.lines()
                .filter(|l| {
                    (l.starts_with("rollgate_events_processed_total{")
                        || l.starts_with("rollgate_events_duplicate_total{"))
                        && l.contains("type=\"alerts\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        })
    }

    /// Waits until the worker has committed the accepted notification (`handled` counted
    /// before it was sent), then checks that each fingerprint it said is on the board as
    /// the test's own model of the board says: of what was accepted before (`model`) and
    /// what this body said, the newest by the alerts' own times (the board's rule,
    /// `Alert::supersedes`, tested by its tables), not merely the last in the body; a
    /// firing alert whose end has passed is hidden. The model takes this body's alerts.
    fn on_the_board(
        &self,
        body: &Value,
        handled: f64,
        model: &mut std::collections::BTreeMap<String, Alert>,
    ) -> Result<(), TestCaseError> {
        let said =
            said_alerts(body).ok_or_else(|| TestCaseError::fail("accepted, but says no alerts"))?;
        let mut last: std::collections::BTreeMap<String, Alert> = Default::default();
        for alert in said {
            let kept = last
                .get(&alert.fingerprint)
                .or_else(|| model.get(&alert.fingerprint));
            if kept.is_none_or(|kept| alert.supersedes(kept)) {
                last.insert(alert.fingerprint.clone(), alert);
            } else if let Some(kept) = kept.cloned() {
                last.insert(alert.fingerprint.clone(), kept);
            }
        }
        model.extend(last.clone());
        let now = chrono::Utc::now();
        let started = std::time::Instant::now();
        loop {
            if self.alert_events_handled() <= handled {
                if started.elapsed() > Duration::from_secs(10) {
                    return Err(TestCaseError::fail(
                        "an accepted notification was not committed within 10 s",
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let (board, _) = self.state();
            let on_board = |fp: &str| {
                board.as_array().and_then(|b| {
                    b.iter()
                        .find(|e| e["alert"]["fingerprint"] == fp)
                        .map(|e| e["alert"].clone())
                })
            };
            let landed = last.values().all(|alert| {
                let hidden = alert.status == rollgate::domain::alert::AlertStatus::Firing
                    && alert.ends_at.is_some_and(|end| end <= now);
                match on_board(&alert.fingerprint) {
                    Some(shown) => {
                        !hidden && shown == serde_json::to_value(alert).unwrap_or_default()
                    }
                    None => hidden,
                }
            });
            if landed {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err(TestCaseError::fail(format!(
                    "accepted alerts not on the board as sent within 10 s: said {last:?}, board {board}"
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn json(&self, path: &str, body: &Value) -> Answer {
        self.post(
            path,
            "application/json",
            serde_json::to_vec(body).expect("bytes"),
        )
    }
}

/// Never a 5xx; a refusal is a 4xx with a code and a message, and a 422 names a field of
/// the body (or, for a detection, the cluster keys to set).
fn sound(answer: &Answer, body: &Value, known: &[&str]) -> Result<(), TestCaseError> {
    prop_assert!(
        answer.status < 500,
        "a {} for {body}: {}",
        answer.status,
        answer.body
    );
    if answer.status >= 400 {
        let message = answer.body["message"].as_str().unwrap_or_default();
        prop_assert!(
            answer.body["error"].is_string() && !message.is_empty(),
            "a {} without code or message: {}",
            answer.status,
            answer.body
        );
        if answer.status == 422 && body.is_object() {
            let named = known
                .iter()
                .chain(keys_of(body).iter())
                .any(|field| message.contains(field))
                || message.contains("cluster.kubeconfig");
            prop_assert!(named, "a 422 naming no field: {message}");
        }
    }
    Ok(())
}

#[test]
fn the_http_intake_answers_every_input_with_a_2xx_or_a_4xx_that_names_the_field() {
    let intake = Intake::start();
    let routes = [
        ("/v1/alerts", webhook("c0ffee03")),
        ("/v1/detections", valid_detection()),
        ("/v1/etcd-rolls", valid_etcd_roll()),
        ("/v1/runs/no-such-run/halt", json!({"reason": "fuzz"})),
    ];
    let model = std::sync::Mutex::new(std::collections::BTreeMap::new());
    for (path, valid) in routes {
        let known = keys_of(&valid);
        let accepted = std::sync::atomic::AtomicU32::new(0);
        runner(
            path,
            Config {
                cases: cases() / 2,
                ..config()
            },
        )
        .run(&prop_oneof![mutated(valid.clone()), any_json()], |body| {
            let before = intake.state();
            let handled = intake.alert_events_handled();
            let answer = intake.json(path, &body);
            sound(&answer, &body, &known)?;
            if answer.status >= 400 {
                prop_assert_eq!(
                    intake.state(),
                    before,
                    "a refusal changed something: {}",
                    body
                );
            } else {
                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if path == "/v1/alerts" {
                    let mut model = model.lock().unwrap_or_else(|e| e.into_inner());
                    intake.on_the_board(&body, handled, &mut model)?;
                }
            }
            Ok(())
        })
        .replay(path);
        let accepted = accepted.into_inner();
        eprintln!("{path}: {accepted} of {} cases accepted", cases() / 2);
        // Alerts are taken without a cluster: enough of them (one in 20) for the board's
        // check to have run. Without a cluster the others end at their 422 (the cluster
        // keys), and a control of a run that does not exist at its 404.
        if path == "/v1/alerts" {
            assert!(
                accepted >= (cases() / 2 / 20).max(1),
                "{path}: {accepted} cases accepted: the board's check hardly ran"
            );
        } else {
            assert_eq!(accepted, 0, "{path}: accepted without a cluster or a run");
        }
    }

    // Bytes that are not JSON, and other content types.
    let bodies = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..1024),
        nasty_string().prop_map(String::into_bytes),
    ];
    let content_types = prop::sample::select(vec![
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        "application/x-www-form-urlencoded",
        "",
    ]);
    let paths = prop::sample::select(vec!["/v1/alerts", "/v1/detections", "/v1/etcd-rolls"]);
    runner("bytes over HTTP", config())
        .run(
            &(paths, content_types, bodies),
            |(path, content_type, bytes)| {
                let answer = intake.post(path, content_type, bytes);
                prop_assert!(
                    (200..300).contains(&answer.status) || (400..500).contains(&answer.status),
                    "{} for {path} ({content_type}): {}",
                    answer.status,
                    answer.body
                );
                if answer.status >= 400 {
                    prop_assert!(
                        answer.body["message"]
                            .as_str()
                            .is_some_and(|m| !m.is_empty())
                    );
                }
                Ok(())
            },
        )
        .replay("bytes over HTTP");

    // A body over the limit is a 413, and the next one is taken.
    let mut alerts = webhook("c0ffee04");
    alerts["commonAnnotations"]["padding"] = json!("x".repeat(2 << 20));
    let answer = intake.json("/v1/alerts", &alerts);
    assert_eq!(answer.status, 413, "{}", answer.body);
    let after = intake.json("/v1/alerts", &webhook("c0ffee05"));
    assert_eq!(after.status, 202, "{}", after.body);
    // Nothing the fuzzing sent broke the service.
    let (ready, _) = intake.rt.block_on(intake.rg.get("/readyz"));
    assert_eq!(ready, 200);
}
