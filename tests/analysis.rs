//! Gates that judge (issue 44), against a real Prometheus that scrapes one small exporter
//! per node. Batch analysis (part 1): after each batch's soak, the batch's nodes are
//! compared with the workers beside it; 1 control plane + 12 workers, batches of 4.
//! Checks with thresholds (part 2): any PromQL asked at the gate before a node is taken.
//! Witnesses: the API server's own log of cordons, and the exporters' own level, which the
//! verdict's figures must match.

mod support;

use std::time::Duration;
use support::ground::Ground;
use support::node_metrics::{METRIC, NodeExporters, Upgraded};
use support::{Rollgate, find_step, history_has};

const RUN_DEADLINE: Duration = Duration::from_secs(240);
const TARGET: &str = "1.34.5";
/// Each analysis window; the exporters are scraped every second.
const WINDOW: &str = "6s";

/// One batch analysis of the exporters' latency, a failed batch cordoned.
fn analysis() -> String {
    format!(
        "[[gate.analysis]]\nname = \"latency-p99\"\nquery = \"max by (node) ({METRIC})\"\n\
         window = \"{WINDOW}\"\ntolerance = 1.2\nmin_samples = 3\non_fail = \"cordon\"\n"
    )
}

/// A ground of 1 control plane and 12 workers whose exporters say `upgraded` once a node
/// runs the target; and rollgate on it, batches of 4, judging by one analysis.
async fn judged_ground(
    upgraded: Upgraded,
    extra: &[(&str, &str)],
) -> (Ground, NodeExporters, Rollgate) {
    ground_judging(12, upgraded, &analysis(), extra).await
}

/// A ground of 1 control plane and `workers` workers whose exporters say `upgraded` once
/// a node runs the target, scraped by the ground's Prometheus with `WINDOW` of data for
/// every node already; and rollgate on it, batches of 4, configured by `config` (TOML).
async fn ground_judging(
    workers: usize,
    upgraded: Upgraded,
    config: &str,
    extra: &[(&str, &str)],
) -> (Ground, NodeExporters, Rollgate) {
    let mut ground = Ground::start("1.34.2", workers).await;
    let nodes: Vec<String> = ground.nodes.iter().map(|n| n.name.clone()).collect();
    let exporters = NodeExporters::start(&ground.api, &nodes, TARGET, upgraded).await;
    ground.prom.scrape_nodes(&exporters.targets).await;
    // The first batch's "before" window must hold data for every node: wait until it does.
    let enough = format!(
        "min(count_over_time({METRIC}[{WINDOW}])) >= 5 and count(count_over_time({METRIC}[{WINDOW}])) == {}",
        nodes.len()
    );
    support::eventually(
        "a window of every node's figures",
        Duration::from_secs(30),
        || async {
            let answer = support::rehearsal::query(ground.prom.port, &enough).await;
            (!answer.is_empty()).then_some(())
        },
    )
    .await;
    let file = ground.dir.path().join("rollgate.toml");
    std::fs::write(&file, config).expect("config");
    let config = file;
    let mut env: Vec<(&str, String)> = vec![
        ("ROLLGATE_CONFIG", config.display().to_string()),
        ("ROLLGATE__CLUSTER__MAX_UNAVAILABLE", "4".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let rg = ground.rollgate(&env).await;
    (ground, exporters, rg)
}

/// The effect a verdict names: the number after "effect ".
fn effect_in(text: &str) -> f64 {
    let (_, rest) = text
        .split_once("effect ")
        .unwrap_or_else(|| panic!("no effect in {text}"));
    rest.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after effect in {text}"))
}

/// The nodes the API server's own log shows cordoned, in order.
fn cordoned(ground: &Ground) -> Vec<String> {
    ground.cordon_order()
}

#[tokio::test]
async fn a_batch_that_regressed_halts_the_run_naming_the_analysis_the_effect_and_its_nodes() {
    let (ground, _exporters, rg) = judged_ground(Upgraded::Slower(1.3), &[]).await;
    let id = rg.detect(TARGET, "patch").await;
    let halted = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let plan = support::worker_batches(&halted);
    assert_eq!(plan.len(), 3, "{plan:?}");
    let reason = halted["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("analysis latency-p99 fail"), "{reason}");
    for node in &plan[0] {
        assert!(reason.contains(node.as_str()), "{node} not named: {reason}");
    }
    // The exporters make upgraded nodes 1.3 times slower, ±5 % noise on each point.
    let effect = effect_in(reason);
    assert!((1.2..1.4).contains(&effect), "effect {effect}: {reason}");
    assert!(reason.contains("p = "), "{reason}");
    assert!(reason.contains("8 worker(s) not yet touched"), "{reason}");
    let last = plan[0].last().expect("a node");
    assert_eq!(
        find_step(&halted, &format!("workers/analysis@{last}")).map(|s| s["status"].clone()),
        Some("failed".into()),
        "{halted}"
    );
    // The API server's own log: the first batch cordoned twice (its drain, then
    // on_fail = "cordon"), the second batch never.
    let log = cordoned(&ground);
    for node in &plan[0] {
        assert_eq!(
            log.iter().filter(|n| *n == node).count(),
            2,
            "{node}: {log:?}"
        );
        assert_eq!(
            ground.api.node(node)["spec"]["unschedulable"],
            true,
            "{node}"
        );
    }
    for node in &plan[1] {
        assert!(
            !log.contains(node),
            "{node} of the second batch was cordoned: {log:?}"
        );
    }
    // The verdict's figures, kept on the analysis step.
    let step = find_step(&halted, &format!("workers/analysis@{last}")).expect("the step");
    let finding = &step["findings"][0];
    assert_eq!(
        (&finding["analysis"], &finding["verdict"]),
        (&"latency-p99".into(), &"fail".into()),
        "{step}"
    );
    assert_eq!(sorted(&finding["canary"]["nodes"]), sorted_names(&plan[0]));
    assert_eq!(
        finding["baseline"]["nodes"].as_array().map(Vec::len),
        Some(8)
    );
    let kept = finding["effect"].as_f64().unwrap_or_default();
    assert!((kept - effect).abs() <= 0.005, "{kept} against {effect}");
    // `rollgate runs show` prints them.
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["runs", "show", &id])
        .env("ROLLGATE__SERVER__LISTEN", format!("127.0.0.1:{}", rg.port))
        .env("ROLLGATE__DATA_DIR", rg.data_dir())
        .output()
        .expect("rollgate runs show");
    let words = String::from_utf8_lossy(&shown.stdout);
    for want in [
        format!("batch 1  workers/analysis@{last}  latency-p99  fail: effect {effect:.2}"),
        "  comparison  8 node(s), median change ".to_owned(),
        "  batch       4 node(s), median change ".to_owned(),
    ] {
        assert!(words.contains(&want), "{want:?} not in\n{words}");
    }
    the_page_pictures_the_failed_batch(&rg, &id, &plan[0], effect).await;
}

fn sorted(names: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = names
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn sorted_names(names: &[String]) -> Vec<String> {
    let mut names = names.to_vec();
    names.sort();
    names
}

/// The status page, in Chromium, pictures the failed batch: its four nodes beside the
/// eight comparison nodes, one dot each, the batch's median above the comparison's, and
/// the verdict with its effect.
async fn the_page_pictures_the_failed_batch(
    rg: &Rollgate,
    id: &str,
    batch: &[String],
    effect: f64,
) {
    let browser = support::webdriver::Browser::start(1280, 900).await;
    browser.goto(&format!("{}/ui#/runs/{id}", rg.base())).await;
    let shown = Duration::from_secs(20);
    browser
        .wait_text("#login-form h1", "the login", shown, |t| {
            t.contains("Log in")
        })
        .await;
    browser.type_into("#token", &rg.token).await;
    browser.click("#login").await;
    browser
        .wait_text(
            "#analyses figure[data-verdict]",
            "the analysis picture",
            shown,
            |t| !t.is_empty(),
        )
        .await;
    let picture = browser
        .script(
            "return [...document.querySelectorAll('#analyses figure.analysis')].map((f) => ({
               analysis: f.dataset.analysis, verdict: f.dataset.verdict, batch: f.dataset.batch,
               width: f.querySelector('svg').getBoundingClientRect().width,
               words: f.querySelector('.finding-words').innerText,
               groups: [...f.querySelectorAll('g.group')].map((g) => ({
                 group: g.dataset.group, nodes: Number(g.dataset.nodes),
                 dots: [...g.querySelectorAll('circle.dot title')].map((t) => t.textContent.split(':')[0]),
                 median: Number(g.querySelector('line.median').getAttribute('y1')) })) }))",
        )
        .await;
    let figures = picture.as_array().expect("figures");
    assert_eq!(figures.len(), 1, "{picture}");
    let f = &figures[0];
    assert_eq!(
        (&f["analysis"], &f["verdict"], &f["batch"]),
        (&"latency-p99".into(), &"fail".into(), &"1".into()),
        "{f}"
    );
    assert!(
        f["width"].as_f64().unwrap_or_default() > 100.0,
        "drawn: {f}"
    );
    let words = f["words"].as_str().unwrap_or_default();
    assert!(
        words.contains("fail") && words.contains(&format!("effect {effect:.2}")),
        "{words}"
    );
    let (canary, baseline) = (&f["groups"][0], &f["groups"][1]);
    assert_eq!(canary["group"], "canary", "{f}");
    assert_eq!(sorted(&canary["dots"]), sorted_names(batch), "{f}");
    assert_eq!(baseline["group"], "baseline", "{f}");
    assert_eq!(baseline["dots"].as_array().map(Vec::len), Some(8), "{f}");
    assert_eq!(
        (canary["nodes"].clone(), baseline["nodes"].clone()),
        (4.into(), 8.into())
    );
    // SVG's y grows downwards: the batch's worse median is drawn higher.
    assert!(
        canary["median"].as_f64() < baseline["median"].as_f64(),
        "{f}"
    );
    // What the picture looks like, for a person to look at.
    browser
        .script("document.getElementById('analyses').scrollIntoView()")
        .await;
    let shot = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("analysis-picture.png");
    browser.screenshot(&shot).await;
}

#[tokio::test]
async fn with_the_same_noise_everywhere_every_batch_passes_and_the_run_completes() {
    let (ground, _exporters, rg) = judged_ground(Upgraded::Same, &[]).await;
    let id = rg.detect(TARGET, "patch").await;
    let done = rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    let passes: Vec<&str> = done["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["reason"].as_str())
        .filter(|r| r.contains("analysis latency-p99 pass"))
        .collect();
    assert_eq!(passes.len(), 3, "one pass per batch: {passes:?}");
    for pass in &passes {
        let effect = effect_in(pass);
        assert!((0.9..1.1).contains(&effect), "effect {effect}: {pass}");
    }
    assert!(
        passes[2].contains("8 worker(s) done before it"),
        "{}",
        passes[2]
    );
    for node in &ground.nodes {
        assert_eq!(
            ground.api.node(&node.name)["status"]["nodeInfo"]["kubeletVersion"],
            format!("v{TARGET}"),
            "{}",
            node.name
        );
    }
    let metrics = rg.metrics_text().await;
    assert!(
        metrics.contains(r#"rollgate_analysis_verdict{analysis="latency-p99",verdict="pass"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn no_data_for_the_batch_holds_inconclusive_never_passes_and_halts_after_halt_after() {
    let (ground, _exporters, rg) =
        judged_ground(Upgraded::Silent, &[("ROLLGATE__GATE__HALT_AFTER", "5s")]).await;
    let id = rg.detect(TARGET, "patch").await;
    let held = rg
        .wait_run_until(&id, "the analysis held", RUN_DEADLINE, |r| {
            r["status"] == "waiting"
                && r["reason"]
                    .as_str()
                    .is_some_and(|reason| reason.contains("inconclusive"))
        })
        .await;
    let reason = held["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no data for the batch"), "{reason}");
    let halted = rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    let reason = halted["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("halt_after 5s"), "{reason}");
    assert!(reason.contains("no data for the batch"), "{reason}");
    assert!(
        !history_has(&halted, "analysis latency-p99 pass"),
        "no data never passes: {halted}"
    );
    let plan = support::worker_batches(&halted);
    let log = cordoned(&ground);
    for node in &plan[1] {
        assert!(
            !log.contains(node),
            "{node} of the second batch was cordoned: {log:?}"
        );
    }
    for node in &plan[0] {
        assert_ne!(
            ground.api.node(node)["spec"]["unschedulable"],
            true,
            "{node} is not cordoned for an inconclusive verdict"
        );
    }
}

/// A check with a success condition, `count` measurements a second apart.
fn check(name: &str, query: &str, success: &str, count: u32, failure_limit: u32) -> String {
    format!(
        "[[gate.checks]]\nname = \"{name}\"\nquery = '{query}'\nsuccess_condition = \"{success}\"\n\
         count = {count}\ninterval = \"1s\"\nfailure_limit = {failure_limit}\n"
    )
}

/// The run halted, and the API server's own log shows no node cordoned.
async fn halted_before_any_node(ground: &Ground, rg: &Rollgate, id: &str) -> String {
    let halted = rg.wait_status(id, "halted", RUN_DEADLINE).await;
    assert_eq!(cordoned(ground), Vec::<String>::new(), "{halted}");
    halted["reason"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_check_that_keeps_failing_halts_the_run_past_its_failure_limit_before_any_node() {
    // Every node's p99 latency is 0.1 s or more: "< 0.05" fails each measurement.
    let config = check("latency-ceiling", &format!("max({METRIC})"), "< 0.05", 3, 1);
    let (ground, _exporters, rg) = ground_judging(4, Upgraded::Same, &config, &[]).await;
    let id = rg.detect(TARGET, "patch").await;
    let reason = halted_before_any_node(&ground, &rg, &id).await;
    assert!(
        reason.contains("check latency-ceiling fail: 2 of 3 measurement(s) (success < 0.05; 2 failed, failure_limit 1)"),
        "{reason}"
    );
    // The values are the exporters' own: the largest level, ±5 %.
    let value: f64 = reason
        .rsplit(": ")
        .next()
        .and_then(|m| m.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no value in {reason}"));
    assert!((0.13..0.16).contains(&value), "{value}: {reason}");
    assert!(reason.contains("control-plane/gate@cp"), "{reason}");
}

#[tokio::test]
async fn a_check_whose_query_fails_holds_inconclusive_and_halts_after_halt_after() {
    // rate() of an instant vector: Prometheus refuses it (bad_data) at every measurement.
    let config = check("bad-query", &format!("rate({METRIC})"), "< 1", 1, 0);
    let (ground, _exporters, rg) = ground_judging(
        4,
        Upgraded::Same,
        &config,
        &[("ROLLGATE__GATE__HALT_AFTER", "4s")],
    )
    .await;
    let id = rg.detect(TARGET, "patch").await;
    let held = rg
        .wait_run_until(&id, "the check held", RUN_DEADLINE, |r| {
            r["status"] == "waiting"
                && r["reason"]
                    .as_str()
                    .is_some_and(|reason| reason.contains("check bad-query inconclusive"))
        })
        .await;
    let said = held["reason"].as_str().unwrap_or_default();
    assert!(said.contains("bad_data"), "{said}");
    let reason = halted_before_any_node(&ground, &rg, &id).await;
    assert!(reason.contains("halt_after 4s"), "{reason}");
    assert!(reason.contains("check bad-query inconclusive"), "{reason}");
}
