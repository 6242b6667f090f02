use super::*;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn problems(pairs: &[(&str, &str)]) -> ConfigError {
    Settings::load_from(None, env(pairs)).unwrap_err()
}

#[test]
fn embedded_defaults_need_nothing() {
    let s = Settings::load_from(None, env(&[])).unwrap();
    assert_eq!(s.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(s.server.token_file, PathBuf::from("./data/api-token"));
    assert!(s.server.token_file_is_default);
    assert_eq!(s.server.max_body_bytes, 1 << 20);
    assert_eq!(s.queue.backend, QueueBackend::Embedded);
    assert_eq!(s.queue.exchange, "rollgate");
    assert_eq!(s.queue.queue, "rollgate.events");
    assert_eq!(s.queue.lease, Duration::from_secs(600));
    assert_eq!(
        s.gate.query,
        r#"ALERTS{alertstate="firing",upgrade_gate="true"}"#
    );
    assert_eq!(s.gate.board_matchers.len(), 1);
    assert_eq!(s.gate.watchdog, "Watchdog");
    assert_eq!(s.gate.rule_group, "Upgrade Gates");
    assert_eq!(s.cluster.soak, Duration::from_secs(600));
    assert_eq!(s.etcd.timeout, Duration::from_secs(10));
    assert_eq!(s.etcd.snapshot_dir, PathBuf::from("./data/snapshots"));
    assert_eq!(s.detect.rollgate_url, "http://127.0.0.1:8080");
    assert_eq!(s.detect.token_file, PathBuf::from("./data/api-token"));
}

#[test]
fn environment_overrides_nested_keys() {
    let s = Settings::load_from(
        None,
        env(&[
            ("ROLLGATE__SERVER__LISTEN", "127.0.0.1:9999"),
            ("ROLLGATE__DATA_DIR", "/tmp/rg"),
            ("ROLLGATE__QUEUE__BACKEND", "amqp"),
            ("ROLLGATE__QUEUE__CONNECT_TIMEOUT", "500ms"),
            ("ROLLGATE__SERVER__MAX_BODY_BYTES", "4096"),
            ("ROLLGATE__GATE__COUNT_PENDING", "true"),
            ("ROLLGATE__CLUSTER__WORKER_ORDER", "w2, w1"),
            ("ROLLGATE__SSH__HOSTS", "w1=10.0.0.6:2222,cp=root@10.0.0.5"),
            ("ROLLGATE__ETCD_ROLL__TRANSFER_TIMEOUT", "1m 30s"),
            ("ROLLGATE__CLUSTER__POD_READY_RATIO", "0.75"),
        ]),
    )
    .unwrap();
    assert_eq!(s.server.listen.port(), 9999);
    assert_eq!(s.server.token_file, PathBuf::from("/tmp/rg/api-token"));
    assert_eq!(s.queue.backend, QueueBackend::Amqp);
    assert_eq!(s.queue.connect_timeout, Duration::from_millis(500));
    assert_eq!(s.server.max_body_bytes, 4096);
    assert!(s.gate.query.contains("firing|pending"), "{}", s.gate.query);
    assert_eq!(s.cluster.worker_order, ["w2", "w1"]);
    assert_eq!(s.ssh.hosts["w1"].port, Some(2222));
    assert_eq!(s.ssh.hosts["cp"].user.as_deref(), Some("root"));
    assert_eq!(
        s.workflows.etcd_roll.transfer_timeout,
        Duration::from_secs(90)
    );
    assert_eq!(s.cluster.pod_ready_ratio, 0.75);
}

#[test]
fn a_file_is_read_and_the_environment_wins_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rollgate.toml");
    std::fs::write(
        &path,
        r#"
data_dir = "/var/lib/rollgate"
[gate]
exclude_alerts = ["KubeNodeUnschedulable", "KubeDeploymentReplicasMismatch"]
halt_after = "45m"
[cluster]
soak = "15m"
grace_period = 30
"#,
    )
    .unwrap();
    let s = Settings::load_from(Some(&path), env(&[("ROLLGATE__CLUSTER__SOAK", "2m")])).unwrap();
    assert_eq!(s.data_dir, PathBuf::from("/var/lib/rollgate"));
    assert_eq!(s.gate.exclude_alerts.len(), 2);
    assert_eq!(s.gate.halt_after, Duration::from_secs(45 * 60));
    assert_eq!(s.cluster.soak, Duration::from_secs(120));
    assert_eq!(s.cluster.grace_period, Some(30));
}

#[test]
fn every_bad_value_is_reported_at_once() {
    let err = problems(&[
        ("ROLLGATE__SERVER__LISTEN", "nowhere"),
        ("ROLLGATE__SERVER__MAX_BODY_BYTES", "-1"),
        ("ROLLGATE__SERVER__WORKERS", "0"),
        ("ROLLGATE__QUEUE__BACKEND", "kafka"),
        ("ROLLGATE__QUEUE__AMQP_URL", "amqp://user:secret@host/%2f"),
        ("ROLLGATE__QUEUE__LEASE", "forever"),
        ("ROLLGATE__SERVER__LISEN", "x"),
        ("ROLLGATE__WORKER__PAUSED", "maybe"),
        ("ROLLGATE__GATE__BOARD_MATCHERS", "severity"),
        ("ROLLGATE__GATE__WATCHDOG", "Watchdog\"} or vector(1)"),
        ("ROLLGATE__SSH__HOSTS", "w3=-oProxyCommand=x"),
        ("ROLLGATE__CLUSTER__POD_READY_RATIO", "2"),
        ("ROLLGATE__CLUSTER__SOAK", "7"),
        ("ROLLGATE__DETECT__STAGES", "preflight,bogus"),
        ("ROLLGATE__SCHEDULE__WINDOWS", "x"),
        ("ROLLGATE__ETCD_ROLL__WATCH", "etcd/etcd,etcd;rm -rf /"),
    ]);
    let keys: BTreeSet<_> = err.0.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "server.listen",
        "server.max_body_bytes",
        "server.workers",
        "queue.backend",
        "queue.amqp_url",
        "queue.lease",
        "server.lisen",
        "worker.paused",
        "gate.board_matchers",
        "gate.watchdog",
        "ssh.hosts",
        "cluster.pod_ready_ratio",
        "cluster.soak",
        "detect.stages",
        "schedule.windows",
        "etcd_roll.watch",
    ] {
        assert!(keys.contains(key), "{key} not reported in {err}");
    }
    assert_eq!(keys.len(), err.0.len(), "one problem per key: {err}");
    assert!(
        !err.to_string().contains("secret"),
        "a password leaked: {err}"
    );
    let lisen = err.0.iter().find(|p| p.key == "server.lisen").unwrap();
    assert!(lisen.message.contains("`listen`"), "{}", lisen.message);
}

#[test]
fn a_good_key_beside_a_bad_one_still_counts() {
    // Both in one section: the bad one is reported, the good one is not lost to it.
    let err = problems(&[
        ("ROLLGATE__CLUSTER__SOAK", "soon"),
        ("ROLLGATE__CLUSTER__NAMESPACE", "has space"),
    ]);
    let keys: Vec<_> = err.0.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["cluster.soak", "cluster.namespace"], "{err}");
}

#[test]
fn keys_come_from_the_types() {
    let keys = keys();
    for key in [
        "data_dir",
        "server.listen",
        "gate.board_matchers",
        "etcd_roll.transfer_timeout",
        "detect.timeout",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key} missing");
    }
    assert!(
        !keys.iter().any(|k| k == "server.token_file_is_default"),
        "a derived field is no key"
    );
}

/// The schema (and so the reference page) describes exactly the keys serde reads, each
/// with a description, and every bound a check holds a key to belongs to a key.
#[test]
fn the_schema_describes_every_key_and_no_other() {
    let schema = super::schema::schema();
    let mut described = BTreeSet::new();
    for (name, section) in schema["properties"].as_object().expect("sections") {
        match section["properties"].as_object() {
            None => {
                described.insert(name.clone());
            }
            Some(keys) => {
                for (key, property) in keys {
                    let text = property["description"].as_str().unwrap_or_default();
                    assert!(!text.trim().is_empty(), "{name}.{key} has no doc comment");
                    described.insert(format!("{name}.{key}"));
                }
            }
        }
    }
    let existing: BTreeSet<String> = keys().into_iter().collect();
    assert_eq!(
        described, existing,
        "the schema and the serde types disagree"
    );
    for (key, _) in Settings::bounds() {
        assert!(existing.contains(&key), "a bound on {key}, which is no key");
    }
    let bounded: BTreeSet<String> = Settings::bounds().into_iter().map(|(k, _)| k).collect();
    for key in [
        "gate.poll_interval",
        "store.max_connections",
        "cluster.grace_period",
    ] {
        assert!(bounded.contains(key), "{key} is bounded by its check");
    }
}

/// Where a doc comment names a key's default in words (`(default `5s`)`), it is the
/// default the types give (defaults computed from other keys, `<data_dir>/…`, are
/// written as such and left out).
#[test]
fn defaults_written_in_doc_comments_are_the_defaults() {
    let schema = super::schema::schema();
    let mut compared = 0;
    for (name, section) in schema["properties"].as_object().expect("sections") {
        for (key, property) in section["properties"].as_object().into_iter().flatten() {
            let text = property["description"].as_str().unwrap_or_default();
            let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            let Some((_, rest)) = text.split_once("default `") else {
                continue;
            };
            let written = rest.split('`').next().unwrap_or_default();
            if written.contains('<') || keys().iter().any(|k| k == written) {
                continue;
            }
            let text_of = |v: &serde_json::Value| match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let actual = match &property["default"] {
                serde_json::Value::Array(items) => {
                    items.iter().map(text_of).collect::<Vec<_>>().join(", ")
                }
                other => text_of(other),
            };
            if actual.is_empty() {
                // Derived from other keys when left empty; the comment says from what.
                continue;
            }
            assert_eq!(written, actual, "{name}.{key}: the doc comment's default");
            compared += 1;
        }
    }
    assert!(compared >= 20, "only {compared} defaults compared");
}

#[test]
fn a_banner_is_one_short_line() {
    let long = "x".repeat(201);
    let cases: [(&str, Option<&str>); 5] = [
        ("LOCAL SANDBOX: nothing here is a real cluster", None),
        ("", Some("is empty")),
        ("two\nlines", Some("more than one line")),
        (&long, Some("longer than 200")),
        (&long[..200], None),
    ];
    for (banner, problem) in cases {
        let loaded = Settings::load_from(None, env(&[("ROLLGATE__SERVER__BANNER", banner)]));
        match problem {
            None => assert_eq!(
                loaded.unwrap().server.banner.as_deref(),
                Some(banner),
                "{banner:?}"
            ),
            Some(wanted) => {
                let err = loaded.unwrap_err();
                assert_eq!(err.0.len(), 1, "{err}");
                assert_eq!(err.0[0].key, "server.banner");
                assert!(err.0[0].message.contains(wanted), "{banner:?}: {err}");
            }
        }
    }
}

#[test]
fn batch_analyses_are_read_from_tables_with_their_defaults_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rollgate.toml");
    std::fs::write(
        &path,
        r#"
[gate]
prometheus_url = "http://prometheus:9090"
[[gate.analysis]]
name = "latency-p99"
query = "max by (node) (node_latency_p99_seconds)"
[[gate.analysis]]
name = "free-memory"
query = "min by (node) (node_memory_MemAvailable_bytes)"
direction = "decrease"
tolerance = 1.5
min_samples = 4
window = "5m"
significance = 0.01
on_fail = "cordon"
"#,
    )
    .unwrap();
    let s = Settings::load_from(Some(&path), env(&[])).unwrap();
    let [latency, memory] = s.gate.analysis.as_slice() else {
        panic!("{:?}", s.gate.analysis);
    };
    let rule = latency.rule();
    assert_eq!(rule.name, "latency-p99");
    assert_eq!(
        rule.criteria.direction,
        crate::domain::analysis::Direction::Increase
    );
    assert_eq!(rule.criteria.tolerance, 1.2);
    assert_eq!(rule.criteria.min_samples, 3);
    assert_eq!(rule.criteria.significance, 0.05);
    assert_eq!(rule.window, Duration::from_secs(600));
    assert_eq!(rule.on_fail, crate::domain::analysis::OnFail::Halt);
    let rule = memory.rule();
    assert_eq!(
        rule.criteria.direction,
        crate::domain::analysis::Direction::Decrease
    );
    assert_eq!(
        (rule.criteria.tolerance, rule.criteria.min_samples),
        (1.5, 4)
    );
    assert_eq!(rule.window, Duration::from_secs(300));
    assert_eq!(rule.on_fail, crate::domain::analysis::OnFail::Cordon);

    // Every bad value is named by its key; nothing is accepted half.
    std::fs::write(
        &path,
        r#"
[[gate.analysis]]
name = "has space"
query = " "
tolerance = 0.9
min_samples = 0
window = "10ms"
significance = 0.7
[[gate.analysis]]
name = "twice"
query = "up"
[[gate.analysis]]
name = "twice"
query = "up"
"#,
    )
    .unwrap();
    let err = Settings::load_from(Some(&path), env(&[])).unwrap_err();
    let keys: BTreeSet<_> = err.0.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "gate.analysis[0].name",
        "gate.analysis[0].query",
        "gate.analysis[0].tolerance",
        "gate.analysis[0].min_samples",
        "gate.analysis[0].window",
        "gate.analysis[0].significance",
        "gate.analysis[2].name",
        "gate.analysis",
    ] {
        assert!(keys.contains(key), "{key} not reported in {err}");
    }
    std::fs::write(
        &path,
        "[[gate.analysis]]\nname = \"x\"\nquery = \"up\"\nthreshold = 3\n",
    )
    .unwrap();
    let err = Settings::load_from(Some(&path), env(&[])).unwrap_err();
    assert!(err.to_string().contains("threshold"), "{err}");
}

#[test]
fn checks_are_read_from_tables_and_every_bad_value_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rollgate.toml");
    std::fs::write(
        &path,
        r#"
[[gate.checks]]
name = "error-ratio"
query = "sum(rate(errors[5m])) / sum(rate(requests[5m]))"
success_condition = "result < 0.01"
failure_condition = ">= 0.05"
count = 3
interval = "1m"
failure_limit = 1
inconclusive_limit = 1
"#,
    )
    .unwrap();
    let s = Settings::load_from(Some(&path), env(&[])).unwrap();
    let rule = s.gate.checks[0].rule();
    assert_eq!(rule.name, "error-ratio");
    assert_eq!(
        rule.success.map(|c| c.to_string()).as_deref(),
        Some("< 0.01")
    );
    assert_eq!(
        rule.failure.map(|c| c.to_string()).as_deref(),
        Some(">= 0.05")
    );
    assert_eq!((rule.count, rule.interval), (3, Duration::from_secs(60)));
    assert_eq!((rule.failure_limit, rule.inconclusive_limit), (1, 1));

    std::fs::write(
        &path,
        r#"
[gate]
halt_after = "1m"
[[gate.checks]]
name = "no-conditions"
query = "up"
[[gate.checks]]
name = "bad"
query = ""
success_condition = "below 1"
failure_condition = "> x"
count = 3
interval = "1m"
failure_limit = 3
inconclusive_limit = 5
[[gate.checks]]
name = "bad"
query = "up"
success_condition = "< 1"
"#,
    )
    .unwrap();
    let err = Settings::load_from(Some(&path), env(&[])).unwrap_err();
    let keys: BTreeSet<_> = err.0.iter().map(|p| p.key.as_str()).collect();
    for key in [
        "gate.checks[0].success_condition",
        "gate.checks[1].query",
        "gate.checks[1].success_condition",
        "gate.checks[1].failure_condition",
        "gate.checks[1].failure_limit",
        "gate.checks[1].inconclusive_limit",
        "gate.checks[1].interval",
        "gate.checks[2].name",
    ] {
        assert!(keys.contains(key), "{key} not reported in {err}");
    }
}
