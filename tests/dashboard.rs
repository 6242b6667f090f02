//! The Grafana dashboard in deploy/: every panel query runs without error against a real
//! Prometheus scraping a real rollgate after a run in the fake cluster, and names only
//! metrics rollgate exports.

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;
use support::eventually;
use support::ground::Ground;
use support::services::Prometheus;

fn dashboard() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/base/dashboards/rollgate.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard")).expect("JSON")
}

/// Every panel's title with each of its queries, Grafana's range variables filled in.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().expect("an expr");
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$__range", "1h");
            out.push((title.clone(), expr));
        }
    }
    out
}

/// The metric names a query reads: its identifiers that are not functions, keywords,
/// label names (in `{…}`, `by (…)`, `without (…)`) or durations.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut text = String::new();
    let mut depth = 0;
    for c in expr.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ if depth > 0 => {}
            c => text.push(c),
        }
    }
    for grouping in ["by", "without", "on", "ignoring"] {
        while let Some(at) = text.find(&format!("{grouping} (")) {
            let end = text[at..].find(')').map_or(text.len(), |e| at + e + 1);
            text.replace_range(at..end, " ");
        }
    }
    let keywords = ["and", "or", "unless", "bool", "offset"];
    let mut names = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_alphabetic() || chars[i] == '_' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let rest = chars[i..].iter().find(|c| !c.is_whitespace());
            let preceded_by_digit = start > 0 && chars[start - 1].is_ascii_digit();
            if rest != Some(&'(') && !keywords.contains(&word.as_str()) && !preceded_by_digit {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn metric_names_are_found_in_queries() {
    let cases = [
        ("sum by (status) (rollgate_runs)", vec!["rollgate_runs"]),
        (
            "histogram_quantile(0.9, sum by (le, step) (rate(rollgate_step_duration_seconds_bucket[1m])))",
            vec!["rollgate_step_duration_seconds_bucket"],
        ),
        (
            "max(a) * 1000 + sum by (sink) (increase(b{outcome=\"failed\"}[1h])) == 1",
            vec!["a", "b"],
        ),
    ];
    for (expr, want) in cases {
        let want: BTreeSet<String> = want.into_iter().map(String::from).collect();
        assert_eq!(metric_names(expr), want, "{expr}");
    }
}

/// What rollgate exports: every family, and a histogram's series suffixes.
fn exported() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    rollgate::workflows::register();
    for name in rollgate::metrics::Metrics::new().family_names() {
        for suffix in ["", "_bucket", "_sum", "_count"] {
            out.insert(format!("{name}{suffix}"));
        }
    }
    out
}

#[tokio::test]
async fn every_panel_query_runs_against_rollgate_scraped_by_prometheus_after_a_run() {
    let ground = Ground::start("1.34.2", 1).await;
    let rg = ground.rollgate(&[]).await;
    let id = rg.detect("1.34.5", "patch").await;
    rg.wait_status(&id, "succeeded", Duration::from_secs(180))
        .await;
    let prom = Prometheus::start(&format!("127.0.0.1:{}", rg.port)).await;
    let http = reqwest::Client::new();
    let query = |expr: String| {
        let http = http.clone();
        let url = format!("{}/api/v1/query", prom.url());
        async move {
            let answer: Value = http
                .get(url)
                .query(&[("query", expr.as_str())])
                .send()
                .await
                .expect("prometheus answers")
                .json()
                .await
                .expect("JSON");
            answer
        }
    };
    // Scraped twice at least, so that rates have two points.
    eventually("rollgate scraped", Duration::from_secs(30), || async {
        let answer = query("count_over_time(rollgate_runs{status=\"succeeded\"}[1m])".into()).await;
        let n = answer["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        (n >= 2.0).then_some(())
    })
    .await;

    let exported = exported();
    let mut answered = Vec::new();
    for (title, expr) in queries(&dashboard()) {
        let unknown: Vec<String> = metric_names(&expr)
            .into_iter()
            .filter(|n| !exported.contains(n))
            .collect();
        assert!(
            unknown.is_empty(),
            "{title}: {expr} reads {unknown:?}, which rollgate does not export"
        );
        let answer = query(expr.clone()).await;
        assert_eq!(answer["status"], "success", "{title}: {expr}: {answer}");
        if answer["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
        {
            answered.push(title);
        }
    }
    // After a run, the panels about runs, the gate and steps show data.
    for title in [
        "Runs by status",
        "Upgrade in flight",
        "Gate verdict",
        "Step durations (p90)",
        "Slowest nodes by step",
        "Queue depth",
        "Maintenance window",
    ] {
        assert!(
            answered.iter().any(|t| t == title),
            "{title} shows nothing: {answered:?}"
        );
    }
}
