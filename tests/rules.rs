//! rules/: promtool accepts the rules, their unit tests pass, and every rule has a unit
//! test in which it fires.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
        .output()
        .expect("promtool runs (Debian package prometheus)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).expect("readable")
}

#[test]
fn promtool_checks_the_rules_and_runs_their_unit_tests() {
    promtool(&["check", "rules", "rules/upgrade-gates.yml"]);
    promtool(&["test", "rules", "rules/tests/upgrade-gates.test.yml"]);
}

/// `rules/upgrade-gates.yml`, parsed.
fn rule_groups() -> Vec<serde_json::Value> {
    let doc: serde_json::Value =
        serde_norway::from_str(&read("rules/upgrade-gates.yml")).expect("the rules parse as YAML");
    doc["groups"].as_array().expect("a groups list").clone()
}

/// The group called `name`; a renamed or missing group fails here, never matches nothing.
fn group<'a>(groups: &'a [serde_json::Value], name: &str) -> &'a [serde_json::Value] {
    groups
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("no rule group named {name:?}"))["rules"]
        .as_array()
        .unwrap_or_else(|| panic!("group {name:?} has no rules"))
}

#[test]
fn every_rule_fires_in_some_unit_test_and_gate_rules_carry_the_gate_label() {
    let groups = rule_groups();
    assert_eq!(groups.len(), 2, "Upgrade Gates and Rollgate");
    let names: BTreeSet<String> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str())
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 12, "{names:?}");

    let tests: serde_json::Value =
        serde_norway::from_str(&read("rules/tests/upgrade-gates.test.yml"))
            .expect("the rule tests parse as YAML");
    let fired: BTreeSet<String> = tests["tests"]
        .as_array()
        .expect("a tests list")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|case| case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|case| case["alertname"].as_str())
        .map(str::to_owned)
        .collect();
    let untested: Vec<_> = names.difference(&fired).collect();
    assert!(
        untested.is_empty(),
        "rules without a firing unit test: {untested:?}"
    );

    let gates = group(&groups, "Upgrade Gates");
    assert!(!gates.is_empty());
    for rule in gates {
        assert_eq!(
            rule["labels"]["upgrade_gate"], "true",
            "every Upgrade Gates rule is labelled: {rule}"
        );
    }
    for rule in group(&groups, "Rollgate") {
        assert!(
            rule["labels"].get("upgrade_gate").is_none(),
            "rollgate's own alerts must not close its gate: {rule}"
        );
    }
}

/// A promtool series that is absent (`_`) before minute `from`, 1 from `from` to `to`
/// (exclusive), absent after, over `total` minutes.
fn series_values(from: usize, to: usize, total: usize) -> String {
    let mut parts = Vec::new();
    if from > 0 {
        parts.push(format!("_x{}", from - 1));
    }
    if to > from {
        parts.push(format!("1x{}", to - from - 1));
    }
    if total > to {
        parts.push(format!("_x{}", total - to - 1));
    }
    parts.join(" ")
}

/// The timeline of an upgrade of a control plane and `workers` workers at the default
/// timings (each node about 12 minutes: drain, script, verify, the 10-minute soak): every
/// node's kubelet (and the control plane's apiserver) moves from v1.34.2 to v1.34.5 one
/// after the other while `k8s_upgrade_in_flight` is 1; `left_behind` workers never move,
/// as when a run is aborted. Returns the promtool test, and the minute the run ended.
fn upgrade_timeline(
    workers: usize,
    left_behind: usize,
    total: usize,
) -> (serde_json::Value, usize) {
    let nodes = 1 + workers;
    let switch = |i: usize| 10 + 12 * i;
    let ended = switch(nodes) + 5;
    let mut series = vec![serde_json::json!({
        "series": "k8s_upgrade_in_flight{job=\"rollgate\"}",
        "values": format!("1x{} 0x{}", ended - 1, total - ended),
    })];
    for i in 0..nodes {
        let node = if i == 0 {
            "cp1".to_owned()
        } else {
            format!("w{i}")
        };
        let jobs: &[&str] = if i == 0 {
            &["apiserver", "kubelet"]
        } else {
            &["kubelet"]
        };
        let moves = i < nodes - left_behind;
        let at = if moves { switch(i) } else { total };
        for job in jobs {
            series.push(serde_json::json!({
                "series": format!("kubernetes_build_info{{job=\"{job}\",git_version=\"v1.34.2\",instance=\"{node}\"}}"),
                "values": series_values(0, at, total),
            }));
            if moves {
                series.push(serde_json::json!({
                    "series": format!("kubernetes_build_info{{job=\"{job}\",git_version=\"v1.34.5\",instance=\"{node}\"}}"),
                    "values": series_values(at, total, total),
                }));
            }
        }
    }
    let test = serde_json::json!({"interval": "1m", "input_series": series, "alert_rule_test": []});
    (test, ended)
}

fn quiet_at(minute: usize) -> serde_json::Value {
    serde_json::json!({"eval_time": format!("{minute}m"), "alertname": "K8sVersionSkew", "exp_alerts": []})
}

#[test]
fn the_skew_is_quiet_through_a_healthy_upgrade_of_any_size_and_fires_when_left_behind() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/upgrade-gates.yml");
    let mut tests = Vec::new();
    // Healthy upgrades of 6 and 24 workers (5 hours of skew): quiet at every minute, during
    // and after.
    for workers in [6, 24] {
        let total = 12 * workers + 120;
        let (mut test, _) = upgrade_timeline(workers, 0, total);
        test["name"] = format!("a healthy upgrade of {workers} workers").into();
        test["alert_rule_test"] = (0..total).map(quiet_at).collect();
        tests.push(test);
    }
    // A run aborted with one worker behind: quiet while in flight and for the rule's 30
    // minutes after, then it fires.
    let total = 12 * 6 + 160;
    let (mut test, ended) = upgrade_timeline(6, 1, total);
    test["name"] = "a run that ended with a worker left behind".into();
    let mut cases: Vec<serde_json::Value> = (0..ended + 30).map(quiet_at).collect();
    cases.push(serde_json::json!({
        "eval_time": format!("{}m", ended + 32),
        "alertname": "K8sVersionSkew",
        "exp_alerts": [{
            "exp_labels": {"severity": "warning", "upgrade_gate": "true", "remedy": "k8s-upgrade"},
            "exp_annotations": {
                "summary": "Kubernetes components run 2 different versions",
                "description": "kubelet and apiserver have reported more than one gitVersion for 30 minutes with no upgrade in flight. An upgrade was left half done: etcd rolls hold until an upgrade run (the daily detection starts one) brings every node to one version.",
                "runbook_url": "https://github.com/rollgate/rollgate/blob/main/docs/src/runbooks/k8s-version-skew.md#k8sversionskew",
            },
        }],
    }));
    test["alert_rule_test"] = cases.into();
    tests.push(test);

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("timeline.test.yml");
    let doc = serde_json::json!({
        "rule_files": [rules.display().to_string()],
        "evaluation_interval": "1m",
        "tests": tests,
    });
    std::fs::write(&file, doc.to_string()).expect("test file");
    let out = promtool(&["test", "rules", &file.display().to_string()]);
    assert!(out.contains("SUCCESS"), "{out}");
}
