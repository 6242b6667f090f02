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

#[test]
fn every_rule_fires_in_some_unit_test_and_gate_rules_carry_the_gate_label() {
    let rules = read("rules/upgrade-gates.yml");
    let names: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 12, "{names:?}");

    let tests = read("rules/tests/upgrade-gates.test.yml");
    let mut fired = BTreeSet::new();
    let mut current = None;
    for line in tests.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("alertname: ") {
            current = Some(name.to_owned());
        } else if line.starts_with("- exp_labels:") {
            fired.extend(current.clone());
        }
    }
    let untested: Vec<_> = names.difference(&fired).collect();
    assert!(
        untested.is_empty(),
        "rules without a firing unit test: {untested:?}"
    );

    let gate_group = rules.split("- name: Rollgate").next().unwrap_or_default();
    let gate_rules = gate_group.matches("- alert: ").count();
    let labelled = gate_group
        .lines()
        .filter(|l| l.trim() == "upgrade_gate: \"true\"")
        .count();
    assert_eq!(labelled, gate_rules, "every Upgrade Gates rule is labelled");
    let own_group = rules.split("- name: Rollgate").nth(1).unwrap_or_default();
    assert!(
        !own_group.contains("upgrade_gate"),
        "rollgate's own alerts must not close its gate"
    );
}
