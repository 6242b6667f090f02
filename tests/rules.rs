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
