//! The handbook (docs/, an mdBook) and the README: the generated reference pages are what
//! the code generates now, the book lists every page, no internal link or anchor is
//! broken, every shipped alert has a runbook page its rule links to, and every example
//! configuration passes `rollgate check-config` and validates against the JSON Schema.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn book() -> PathBuf {
    root().join("docs/src")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir` whose name ends with `suffix`, sorted.
fn files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path, suffix));
        } else if path.to_string_lossy().ends_with(suffix) {
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn the_reference_pages_are_what_the_code_generates() {
    for (name, generated) in
        rollgate::reference::pages(<rollgate::cli::Cli as clap::CommandFactory>::command())
    {
        let path = book().join("reference").join(name);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != generated {
            let line = committed
                .lines()
                .zip(generated.lines())
                .position(|(a, b)| a != b)
                .map_or(
                    committed.lines().count().min(generated.lines().count()),
                    |i| i,
                )
                + 1;
            panic!(
                "{} differs from what the code generates (first at line {line}): run \
                 `cargo run -- docs docs/src/reference` and commit the result",
                path.display()
            );
        }
    }
}

/// The Markdown text outside fenced code blocks and inline code.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") && !line.trim_start().starts_with(['-', '*', '|']) {
            continue;
        }
        let mut code = false;
        for c in line.chars() {
            if c == '`' {
                code = !code;
            } else if !code {
                out.push(c);
            }
        }
        out.push('\n');
    }
    out
}

/// The anchors the headings of a Markdown page get (GitHub's and mdBook's rule; a
/// repeated heading gets `-1`, `-2`, …).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = rollgate::reference::anchor(&heading.replace('`', ""));
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The targets of the inline links `[text](target)` of a page's prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_owned());
        }
    }
    out
}

/// `base/relative` with `..` and `.` folded.
fn join(base: &Path, relative: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for part in base.join(relative).components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn the_book_lists_every_page_and_no_internal_link_or_anchor_is_broken() {
    let book_toml = read(&root().join("docs/book.toml"));
    assert!(book_toml.contains("[book]"), "docs/book.toml: {book_toml}");
    let summary_path = book().join("SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links(&read(&summary_path))
        .iter()
        .map(|l| join(&book(), l))
        .collect();
    let pages: BTreeSet<PathBuf> = files(&book(), ".md")
        .into_iter()
        .filter(|p| *p != summary_path)
        .collect();
    let unlisted: Vec<_> = pages.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "pages SUMMARY.md does not list: {unlisted:?}"
    );
    let missing: Vec<_> = listed.difference(&pages).collect();
    assert!(
        missing.is_empty(),
        "SUMMARY.md lists pages that do not exist: {missing:?}"
    );

    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages.iter().chain([&root().join("README.md")]) {
        let text = read(page);
        let dir = page.parent().unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = match link.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                page.clone()
            } else {
                join(dir, path)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            if let Some(fragment) = fragment {
                let is_page = target.extension().is_some_and(|e| e == "md");
                if !is_page || !anchors(&read(&target)).contains(fragment) {
                    broken.push(format!("{}: {link}: no such heading", page.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 100,
        "only {checked} internal links: is the parser right?"
    );
}

#[test]
fn the_readme_is_short_and_reaches_the_pages_an_operator_needs_first() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; the handbook takes the rest"
    );
    for command in ["scripts/serve.sh", "scripts/test.sh"] {
        assert!(
            readme.contains(command),
            "the README's set-up command {command}"
        );
    }
    // One click from the README, each with the page's own heading.
    let readme_links = links(&readme);
    for wanted in [
        "docs/src/getting-started/alertmanager.md",
        "docs/src/runbooks/rollgate-run-halted.md",
        "docs/src/reference/configuration.md#gate",
    ] {
        assert!(
            readme_links.iter().any(|l| l == wanted),
            "the README links {wanted}: {readme_links:?}"
        );
    }
}

#[test]
fn every_shipped_alert_has_a_runbook_page_its_rule_links_to() {
    let rules: Value = serde_norway::from_str(&read(&root().join("rules/upgrade-gates.yml")))
        .expect("rules/upgrade-gates.yml");
    let prefix = "https://github.com/rollgate/rollgate/blob/main/";
    let mut alerts = 0;
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let Some(alert) = rule["alert"].as_str() else {
                continue;
            };
            alerts += 1;
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert} has no runbook_url"));
            let relative = url
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("{alert}: {url} is not in this repository"));
            let (path, fragment) = relative
                .split_once('#')
                .unwrap_or_else(|| panic!("{alert}: {url} names no heading"));
            assert!(
                path.starts_with("docs/src/runbooks/"),
                "{alert}: {url} is not a runbook page of the book"
            );
            let page = read(&root().join(path));
            assert!(
                anchors(&page).contains(fragment),
                "{alert}: {url} points at no heading of {path}"
            );
            assert!(
                page.starts_with(&format!("# {alert}\n")),
                "{path} is {alert}'s own page"
            );
        }
    }
    assert_eq!(alerts, 14, "the shipped alerts");
    // The PrometheusRule deploy/ ships carries the same links (tests/deploy.rs checks it
    // carries rules/ exactly).
}

/// Every example configuration: the TOML files under docs/ and the `rollgate.toml` of
/// every ConfigMap under deploy/.
fn example_configs() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = files(&root().join("docs"), ".toml")
        .into_iter()
        .filter(|p| !p.ends_with("book.toml"))
        .map(|p| (p.display().to_string(), read(&p)))
        .collect();
    for path in files(&root().join("deploy"), ".yaml") {
        let text = read(&path);
        for document in text.split("\n---") {
            let Ok(value) = serde_norway::from_str::<Value>(document) else {
                continue;
            };
            if let Some(toml) = value["data"]["rollgate.toml"].as_str() {
                out.push((path.display().to_string(), toml.to_owned()));
            }
        }
    }
    out
}

#[test]
fn every_example_configuration_passes_check_config_and_the_json_schema() {
    let schema: Value =
        serde_json::from_str(&read(&book().join("reference/configuration.schema.json")))
            .expect("the committed schema is JSON");
    let validator = jsonschema::draft7::new(&schema).expect("the schema is a draft 7 schema");
    let examples = example_configs();
    assert!(
        examples
            .iter()
            .filter(|(p, _)| p.contains("/docs/"))
            .count()
            >= 3
            && examples
                .iter()
                .filter(|(p, _)| p.contains("/deploy/"))
                .count()
                >= 3,
        "{:?}",
        examples.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("api-token");
    std::fs::write(&token, "0123456789abcdef0123\n").unwrap();
    for (i, (origin, toml)) in examples.iter().enumerate() {
        let instance: Value = toml::from_str(toml).unwrap_or_else(|e| panic!("{origin}: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{origin} against the schema: {errors:?}");
        let file = dir.path().join(format!("{i}.toml"));
        std::fs::write(&file, toml).unwrap();
        if origin.contains("/deploy/") {
            // As an operator checks a site's configuration away from the pod: the real
            // binary, with the pod's files (tokens, TLS) absent and named as such; with
            // --strict, as in the pod, their absence is an error naming them.
            let check = |strict: bool| {
                let mut command = Command::new(env!("CARGO_BIN_EXE_rollgate"));
                command.arg("check-config");
                if strict {
                    command.arg("--strict");
                }
                command
                    .env_clear()
                    .env("ROLLGATE_CONFIG", &file)
                    .output()
                    .expect("rollgate runs")
            };
            let out = check(false);
            let said = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                out.status.success(),
                "{origin}: check-config: {said}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let s = rollgate::config::Settings::load(Some(&file)).unwrap();
            if let Some(mounted) = s
                .server
                .tokens_dir
                .as_ref()
                .or(s.server.tls_cert_file.as_ref())
            {
                assert!(
                    said.contains("not checked here: ")
                        && said.contains(&mounted.display().to_string()),
                    "{origin}: {said}"
                );
                let strict = check(true);
                assert_eq!(strict.status.code(), Some(2), "{origin}: --strict");
            }
            continue;
        }
        // The token file is a mounted Secret where the example runs; here, one of ours.
        let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
            .arg("check-config")
            .arg("--config")
            .arg(&file)
            .env_clear()
            .env("ROLLGATE__SERVER__TOKEN_FILE", &token)
            .output()
            .expect("rollgate runs");
        assert!(
            out.status.success(),
            "{origin}: check-config: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_schema_refuses_what_check_config_refuses() {
    let schema: Value = serde_json::from_str(&rollgate::reference::schema_json()).unwrap();
    let validator = jsonschema::draft7::new(&schema).unwrap();
    // (what, the file, the key check-config must name)
    let cases = [
        ("unknown section", r#"[sever]"#, "sever:"),
        (
            "unknown key",
            "[gate]\npoll_intervall = \"5s\"",
            "gate.poll_intervall:",
        ),
        (
            "a duration without a unit",
            "[gate]\npoll_interval = 10",
            "gate.poll_interval:",
        ),
        (
            "a count out of bounds",
            "[store]\nmax_connections = 0",
            "store.max_connections:",
        ),
        (
            "an unknown scope",
            "[server.scopes]\nam = [\"alerts:read\"]",
            "server.scopes: client am: unknown scope \"alerts:read\"",
        ),
        (
            "a backend that is not one",
            "[queue]\nbackend = \"kafka\"",
            "queue.backend: \"kafka\"",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (what, toml, names) in cases {
        let instance: Value = toml::from_str(toml).unwrap();
        assert!(!validator.is_valid(&instance), "the schema takes {what}");
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, toml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
            .args(["check-config", "--config"])
            .arg(&file)
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "check-config takes {what}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(names), "{what}: {said}");
    }
    let defaults: Value = toml::from_str("").unwrap();
    assert!(
        validator.is_valid(&defaults),
        "an empty file is the embedded defaults"
    );
}

/// Issue 40, releases: `rollgate --version` names the version and the commit it was built
/// from (the checkout's own, by git), and `CHANGELOG.md` is in Keep a Changelog's form
/// with an Unreleased part above the crate's version.
#[test]
fn the_version_names_its_commit_and_the_changelog_its_releases() {
    let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("--version")
        .env_clear()
        .output()
        .expect("rollgate runs");
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root())
        .output()
        .expect("git");
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert_eq!(head.len(), 12, "no git checkout here: {head:?}");
    assert_eq!(
        said,
        format!("rollgate {} (commit {head})", env!("CARGO_PKG_VERSION"))
    );

    let changelog = read(&root().join("CHANGELOG.md"));
    let releases: Vec<&str> = changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## ["))
        .map(|l| l.split(']').next().unwrap_or_default())
        .collect();
    assert_eq!(releases.first(), Some(&"Unreleased"), "{releases:?}");
    assert!(
        releases.contains(&env!("CARGO_PKG_VERSION")),
        "the crate's version {} has no entry: {releases:?}",
        env!("CARGO_PKG_VERSION")
    );
    for release in &releases {
        assert!(
            changelog.contains(&format!("[{release}]: ")),
            "{release} has no link line"
        );
    }
}
