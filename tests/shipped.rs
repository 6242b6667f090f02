//! What ships is what runs: every overlay of deploy/, rendered by `kubectl kustomize`,
//! runs on the test ground (real sshd nodes, etcd over TLS, Prometheus, Alertmanager with
//! the shipped receiver, the Pushgateway; RabbitMQ and PostgreSQL for ha), and the
//! handbook's journeys run as the pages give them: each page's `sh` blocks are read out of
//! the page and run in order, so a page's command and this test cannot drift apart. A
//! command with no counterpart on the ground fails the test, naming it.
//!
//! How the site's configuration is carried onto the ground: [`support::shipped`].

mod support;

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Output;
use std::time::Duration;
use support::shipped::{RUN_DEADLINE, Site};

/// A page of the handbook: its runnable commands, in order. Each `sh` block's lines with
/// `\` continuations joined and trailing comments (after two spaces) dropped.
fn page_commands(page: &str) -> Vec<String> {
    let path = support::manifests::root().join("docs/src").join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block && line.trim() == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        let line = match line.find("  #") {
            Some(at) => &line[..at],
            None => line,
        };
        let line = line.trim();
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head.trim_end());
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        if !pending.trim().is_empty() {
            out.push(pending.trim().to_owned());
        }
        pending.clear();
    }
    assert!(!out.is_empty(), "{page} has no sh block");
    out
}

/// One command as it ran: what the page said, and what came of it.
struct Ran {
    command: String,
    out: Output,
}

impl Ran {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout())
            .unwrap_or_else(|e| panic!("{}: not JSON ({e}): {}", self.command, self.report()))
    }

    fn report(&self) -> String {
        format!(
            "{}\nexit {:?}\nstdout: {}\nstderr: {}",
            self.command,
            self.out.status.code(),
            self.stdout(),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }

    fn assert_exit(&self, code: i32) -> &Self {
        assert_eq!(self.out.status.code(), Some(code), "{}", self.report());
        self
    }
}

/// The on-call engineer's desk: runs a page's commands against the site, as given.
struct Desk<'a> {
    site: &'a Site,
    /// `RUN_ID`: the run the last command that made or named one gave.
    run_id: Option<String>,
    /// The flags of `rollgate runs` as the first page command gave them (`…` elsewhere).
    runs_flags: Option<String>,
    /// The CronJob's clock, when a journey picks its day.
    cron_at: Option<chrono::DateTime<chrono::Utc>>,
    /// What the last CronJob's container printed (its report), for `kubectl logs`.
    cron_output: Option<Vec<u8>>,
    /// A directory whose `rollgate` is the binary under test.
    bin: tempfile::TempDir,
}

impl<'a> Desk<'a> {
    fn new(site: &'a Site) -> Self {
        let bin = tempfile::tempdir().expect("bin");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_rollgate"), bin.path().join("rollgate"))
            .expect("rollgate on PATH");
        Self {
            site,
            run_id: None,
            runs_flags: None,
            cron_at: None,
            cron_output: None,
            bin,
        }
    }

    /// Runs `command` as the page gives it; panics when it has no counterpart here.
    async fn run(&mut self, command: &str) -> Ran {
        let site = self.site;
        let out = if let Some(args) =
            command.strip_prefix("kubectl -n rollgate exec rollgate-0 -- rollgate ")
        {
            let args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
            blocking(|| site.exec(&args))
        } else if command
            .starts_with("kubectl -n rollgate create job --from=cronjob/rollgate-detect ")
        {
            let at = self.cron_at;
            let out = blocking(|| site.run_cronjob(at));
            self.cron_output = Some(out.stdout.clone());
            out
        } else if command.starts_with("kubectl -n rollgate logs job/") {
            Output {
                status: std::os::unix::process::ExitStatusExt::from_raw(0),
                stdout: self
                    .cron_output
                    .clone()
                    .unwrap_or_else(|| panic!("{command}: no job ran before it")),
                stderr: Vec::new(),
            }
        } else {
            let line = self.translate(command);
            let program = line.split_whitespace().next().unwrap_or_default();
            assert!(
                ["curl", "rollgate", "ssh"].contains(&program),
                "a page's command has no counterpart on the test ground: {command}"
            );
            let (desk, path) = (site.desk.clone(), self.path());
            let port = site.rg.port;
            blocking(|| {
                std::process::Command::new("bash")
                    .args(["-c", &line])
                    .current_dir(&desk)
                    .env("PATH", path)
                    .env("ROLLGATE", format!("https://127.0.0.1:{port}"))
                    .env_remove("ROLLGATE_CONFIG")
                    .output()
                    .expect("bash")
            })
        };
        let ran = Ran {
            command: command.to_owned(),
            out,
        };
        if let Ok(v) = serde_json::from_str::<Value>(&ran.stdout())
            && let Some(id) = run_id_in(&v)
        {
            self.run_id = Some(id);
        }
        ran
    }

    fn path(&self) -> String {
        format!(
            "{}:{}",
            self.bin.path().display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// The page's command with the site's names for this ground: its URL, the run id,
    /// the flags `…` stands for, a node's SSH address.
    fn translate(&mut self, command: &str) -> String {
        let site = self.site;
        let mut line = command.replace(
            "https://rollgate.rollgate.svc:8080",
            &format!("https://localhost:{}", site.rg.port),
        );
        if let Some(rest) = line.strip_prefix("rollgate runs --url ") {
            let flags = rest
                .split_whitespace()
                .take_while(|w| !SUBCOMMANDS.contains(w))
                .collect::<Vec<_>>()
                .join(" ");
            self.runs_flags.get_or_insert(format!("--url {flags}"));
        }
        if line.starts_with("rollgate runs ") && !line.contains("--url") {
            let flags = self
                .runs_flags
                .clone()
                .expect("a page ran `rollgate runs --url …` before `rollgate runs …`");
            let rest = line["rollgate runs ".len()..]
                .trim_start_matches("… ")
                .to_owned();
            line = format!("rollgate runs {flags} {rest}");
        }
        if line.contains("RUN_ID") {
            let id = self
                .run_id
                .clone()
                .unwrap_or_else(|| panic!("{command}: no run made before it"));
            line = line.replace("RUN_ID", &id);
        }
        if line.contains("rollgate@NODE") {
            let node = site.ground.node(site.names[0].1.as_str());
            let client = &site.ground.client;
            line = line.replace(
                "ssh rollgate@NODE",
                &format!(
                    "ssh -i {} -o UserKnownHostsFile={} -o StrictHostKeyChecking=yes -o BatchMode=yes -p {} {}@127.0.0.1",
                    client.key.display(),
                    client.known_hosts.display(),
                    node.port,
                    std::env::var("USER").unwrap_or_else(|_| "root".into())
                ),
            );
        }
        // The pages' sample workers (`worker-3`) are the ground's (`w3`).
        line.replace("\"worker-", "\"w")
    }
}

const SUBCOMMANDS: [&str; 7] = [
    "list", "show", "watch", "halt", "resume", "abort", "approve",
];

/// A run id in a command's JSON answer: `id` of a run, or `run_id` of what detection
/// submitted.
fn run_id_in(v: &Value) -> Option<String> {
    if let Some(id) = v["id"].as_str().or(v["run_id"].as_str()) {
        return Some(id.to_owned());
    }
    match v {
        Value::Object(map) => map.values().find_map(run_id_in),
        Value::Array(items) => items.iter().find_map(run_id_in),
        _ => None,
    }
}

/// Runs `f` on this worker thread, the runtime's other threads serving the ground.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The next `weekday` at 06:00 UTC after now (the CronJob's hour).
fn next(weekday: chrono::Weekday) -> chrono::DateTime<chrono::Utc> {
    use chrono::Datelike;
    let mut day = chrono::Utc::now().date_naive() + chrono::Duration::days(1);
    while day.weekday() != weekday {
        day += chrono::Duration::days(1);
    }
    day.and_hms_opt(6, 0, 0).expect("06:00").and_utc()
}

/// The day the rendered CronJob looks for upgrades (`--upgrades-on DAY`), and a day it
/// does not.
fn cron_days(site: &Site) -> (chrono::Weekday, chrono::Weekday) {
    let args = site.rendered.cronjob_args();
    let at = args
        .iter()
        .position(|a| a == "--upgrades-on")
        .expect("the CronJob looks for upgrades on its day");
    let day: chrono::Weekday = args[at + 1].parse().expect("a weekday");
    (day, day.succ())
}

/// Runs the CronJob at `at` (its clock); the run it asked for.
async fn cronjob_run(desk: &mut Desk<'_>, at: chrono::DateTime<chrono::Utc>) -> String {
    desk.cron_at = Some(at);
    desk.run_id = None;
    let ran = desk
        .run("kubectl -n rollgate create job --from=cronjob/rollgate-detect detect-now")
        .await;
    ran.assert_exit(0);
    desk.run_id
        .clone()
        .unwrap_or_else(|| panic!("the CronJob asked for nothing: {}", ran.report()))
}

/// The reboots each node took, by its own log.
fn reboots(site: &Site) -> BTreeMap<String, usize> {
    site.ground
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.reboots()))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The example overlay, as the handbook has an adopter take it: the first-run page
/// (check-config, the gate, `plan`, a dry run, then the CronJob's real run on its upgrade
/// day), the first-reboot page, the CronJob's reboots on another day, and the on-call
/// engineer's halt, resume and abort (the halted-run runbook) while an alert, sent by
/// Alertmanager's shipped receiver over HTTPS, closes the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_example_overlay_runs_the_first_run_the_first_reboot_and_the_on_call_pages() {
    let site = Site::start("example", "1.34.3").await;
    let ground = &site.ground;
    let (upgrade_day, other_day) = cron_days(&site);
    let mut desk = Desk::new(&site);
    desk.cron_at = Some(next(upgrade_day));

    // The first run, as its page gives it.
    let mut seen = Vec::new();
    let mut watched = 0;
    for command in page_commands("getting-started/first-run.md") {
        let ran = desk.run(&command).await;
        let step = if command.contains("check-config") {
            ran.assert_exit(0);
            for client in site.rendered.clients() {
                assert!(ran.stdout().contains(&client), "{}", ran.report());
            }
            "check-config"
        } else if command.contains("/v1/gates") {
            ran.assert_exit(0);
            let answer = ran.json();
            assert_eq!(answer["verdict"]["verdict"], "open", "{}", ran.report());
            for source in ["prometheus", "alertmanager"] {
                assert_eq!(answer[source]["state"], "ok", "{}", ran.report());
            }
            "gate"
        } else if command.starts_with("rollgate runs") && command.ends_with(" list") {
            ran.assert_exit(0);
            "runs list"
        } else if command.contains("rollgate plan") {
            ran.assert_exit(0);
            for node in &ground.nodes {
                assert!(ran.stdout().contains(&node.name), "{}", ran.report());
            }
            assert!(ran.stdout().contains("1.34.5"), "{}", ran.report());
            "plan"
        } else if command.contains("\"dry_run\": true") {
            ran.assert_exit(0);
            assert!(ran.json()["run_id"].is_string(), "{}", ran.report());
            "dry run"
        } else if command.contains("create job --from=cronjob/rollgate-detect") {
            ran.assert_exit(0);
            "cronjob"
        } else if command.contains("kubectl -n rollgate logs job/") {
            let report = ran.json();
            assert_eq!(report["decision"]["target"], "1.34.5", "{report}");
            assert!(report["submitted"]["run_id"].is_string(), "{report}");
            "cronjob report"
        } else if command.contains(" watch ") {
            ran.assert_exit(0);
            watched += 1;
            if watched == 1 {
                ground.assert_nothing_drained();
                ground.assert_nothing_installed();
                "dry run watched"
            } else {
                ground.assert_all_at("1.34.5");
                ground.assert_drained_once();
                "run watched"
            }
        } else {
            panic!("this journey has no expectation for the page's command: {command}");
        };
        seen.push(step);
    }
    assert_eq!(
        seen,
        [
            "check-config",
            "runs list",
            "gate",
            "plan",
            "dry run",
            "dry run watched",
            "cronjob",
            "cronjob report",
            "run watched"
        ],
        "the first-run page's journey"
    );
    // The CronJob pushed its findings to the site's Pushgateway.
    assert!(
        !site
            .pushgateway
            .samples("push_time_seconds")
            .await
            .is_empty(),
        "nothing pushed"
    );

    // The first reboot, as its page gives it: one named worker.
    ground.node("w3").need_reboot();
    let mut seen = Vec::new();
    for command in page_commands("getting-started/first-reboot.md") {
        let ran = desk.run(&command).await;
        let step = if command.starts_with("ssh ") {
            ran.assert_exit(0);
            "node check"
        } else if command.contains("\"dry_run\": true") {
            ran.assert_exit(0);
            let answer = ran.json();
            assert_eq!(answer["holds"], json!([]), "{answer}");
            assert_eq!(answer["batches"], json!([["w3"]]), "{answer}");
            assert!(reboots(&site).is_empty(), "a dry run rebooted");
            "dry run"
        } else if command.contains("/v1/reboots") {
            ran.assert_exit(0);
            assert!(ran.json()["run_id"].is_string(), "{}", ran.report());
            "reboot"
        } else if command.contains(" watch ") {
            ran.assert_exit(0);
            assert_eq!(reboots(&site), BTreeMap::from([("w3".into(), 1)]));
            "watched"
        } else {
            panic!("this journey has no expectation for the page's command: {command}");
        };
        seen.push(step);
    }
    assert_eq!(seen, ["node check", "dry run", "reboot", "watched"]);

    // The CronJob on a day without upgrades asks for the reboots whose sentinel is set.
    ground.node("w1").need_reboot();
    let id = cronjob_run(&mut desk, next(other_day)).await;
    let run = site.rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_eq!(run["kind"], "node-reboot", "{run}");
    assert_eq!(
        reboots(&site),
        BTreeMap::from([("w1".into(), 1), ("w3".into(), 1)])
    );

    on_call_journey(&site, &mut desk).await;
}

/// An alert through Alertmanager's shipped receiver closes the gate; the on-call engineer
/// halts the reboot it holds, resumes it once the alert resolves (the runbook's commands),
/// and aborts a run halted by a node whose sudo refuses.
async fn on_call_journey(site: &Site, desk: &mut Desk<'_>) {
    let ground = &site.ground;
    site.alertmanager
        .post_alert("NodeFilesystemAlmostFull", false)
        .await;
    support::eventually(
        "the alert, through Alertmanager's receiver, closes the gate",
        Duration::from_secs(30),
        || async {
            let (_, gate) = site.rg.get("/v1/gates").await;
            (gate["verdict"]["verdict"] == "closed").then_some(())
        },
    )
    .await;
    // Alertmanager's own count: its webhook to rollgate's HTTPS listener delivered, none
    // failed; and rollgate's board holds what the webhook carried.
    support::eventually(
        "Alertmanager's receiver delivers the alert to rollgate",
        Duration::from_secs(30),
        || async {
            let sent = alertmanager_metric(site, "alertmanager_notifications_total").await;
            let board = support::board(&site.rg).await;
            (sent > 0.0 && board.values().any(|n| *n > 0)).then_some(())
        },
    )
    .await;
    let failed = alertmanager_metric(site, "alertmanager_notifications_failed_total").await;
    assert_eq!(failed, 0.0, "a webhook notification failed");

    ground.node("w4").need_reboot();
    let (status, body) = site
        .rg
        .post("/v1/reboots", &json!({"nodes": ["w4"], "reason": "kernel"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["run_id"].as_str().expect("run_id").to_owned();
    site.rg
        .wait_run(&id, "held at the gate", |run| {
            run["blockers"].as_array().is_some_and(|b| !b.is_empty())
                || run["held"].as_str().is_some()
        })
        .await;
    desk.run_id = Some(id.clone());
    // `rollgate runs halt ID [--reason TEXT]`, as the CLI page gives it.
    desk.run("rollgate runs … halt RUN_ID --reason \"alert under investigation\"")
        .await
        .assert_exit(0);
    site.rg.wait_status(&id, "halted", RUN_DEADLINE).await;
    assert!(
        !reboots(site).contains_key("w4"),
        "w4 rebooted under a halt"
    );

    site.alertmanager
        .post_alert("NodeFilesystemAlmostFull", true)
        .await;
    support::eventually("the gate opens", Duration::from_secs(30), || async {
        let (_, gate) = site.rg.get("/v1/gates").await;
        (gate["verdict"]["verdict"] == "open").then_some(())
    })
    .await;

    let runbook = page_commands("runbooks/rollgate-run-halted.md");
    let mut ran_commands = BTreeSet::new();
    for command in runbook.iter().filter(|c| !c.contains(" abort ")) {
        desk.run_id = Some(id.clone());
        let ran = desk.run(command).await;
        ran.assert_exit(0);
        if command.contains(" list") {
            assert!(ran.stdout().contains(&id[..8]), "{}", ran.report());
        }
        ran_commands.insert(command.clone());
    }
    site.rg
        .wait_status_leaving(&id, "halted", "succeeded", RUN_DEADLINE)
        .await;
    assert_eq!(reboots(site).get("w4"), Some(&1));

    ground.node("w2").need_reboot();
    ground.node("w2").sudo_refuses();
    let (status, body) = site
        .rg
        .post("/v1/reboots", &json!({"nodes": ["w2"], "reason": "kernel"}))
        .await;
    assert_eq!(status, 202, "{body}");
    let refused = body["run_id"].as_str().expect("run_id").to_owned();
    site.rg.wait_status(&refused, "halted", RUN_DEADLINE).await;
    for command in runbook.iter().filter(|c| !c.contains(" resume ")) {
        desk.run_id = Some(refused.clone());
        let ran = desk.run(command).await;
        ran.assert_exit(0);
        if command.contains(" show ") {
            assert!(ran.stdout().contains("refused"), "{}", ran.report());
        }
        ran_commands.insert(command.clone());
    }
    site.rg
        .wait_status_leaving(&refused, "halted", "aborted", RUN_DEADLINE)
        .await;
    assert!(!reboots(site).contains_key("w2"));
    // Abort undoes nothing (the runbook): w2 stays cordoned for the on-call to uncordon.
    assert_eq!(
        ground.api.node("w2")["spec"]["unschedulable"],
        true,
        "{}",
        ground.api.node("w2")
    );
    assert_eq!(
        ran_commands,
        runbook.iter().cloned().collect(),
        "every command of the runbook ran"
    );
}

/// The sum of a counter's samples on Alertmanager's own /metrics.
async fn alertmanager_metric(site: &Site, name: &str) -> f64 {
    let text = reqwest::get(format!(
        "http://127.0.0.1:{}/metrics",
        site.alertmanager.port
    ))
    .await
    .expect("alertmanager answers")
    .text()
    .await
    .expect("text");
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("integration=\"webhook\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The first-run page's check of the configuration in the pod, run on `desk`'s site.
async fn check_config_in_the_pod(desk: &mut Desk<'_>) {
    let command = page_commands("getting-started/first-run.md")
        .into_iter()
        .find(|c| c.contains("check-config"))
        .expect("the first-run page checks the configuration");
    desk.run(&command).await.assert_exit(0);
}

/// The ha overlay on RabbitMQ and PostgreSQL: the configuration checks in the pod, and
/// the CronJob's reboot travels through the broker to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ha_overlay_reboots_a_node_the_cronjob_found_through_rabbitmq() {
    let site = Site::start("ha", "1.34.3").await;
    let mut desk = Desk::new(&site);
    check_config_in_the_pod(&mut desk).await;
    let (_, other_day) = cron_days(&site);
    site.ground.node("w2").need_reboot();
    let id = cronjob_run(&mut desk, next(other_day)).await;
    site.rg.wait_status(&id, "succeeded", RUN_DEADLINE).await;
    assert_eq!(reboots(&site), BTreeMap::from([("w2".into(), 1)]));
    site.ground.assert_drained_once();
    // The broker holds the site's queue: the run's events went through it.
    let names = site.amqp.as_ref().expect("the ha site runs on RabbitMQ");
    let queues = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_queues", "name"])
        .output()
        .expect("rabbitmqctl");
    assert!(
        String::from_utf8_lossy(&queues.stdout).contains(&names.queue),
        "no queue {} on the broker",
        names.queue
    );
    site.cleanup().await;
}

/// The fleet-downstream overlay: its configuration checks in the pod, and the upgrade the
/// CronJob finds waits for staging (no upstream answers here) while nothing is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_fleet_downstream_overlay_waits_for_staging() {
    let site = Site::start("fleet-downstream", "1.34.3").await;
    let mut desk = Desk::new(&site);
    check_config_in_the_pod(&mut desk).await;
    let (upgrade_day, _) = cron_days(&site);
    let id = cronjob_run(&mut desk, next(upgrade_day)).await;
    let run = site
        .rg
        .wait_run(&id, "waiting for staging", |run| run["status"] == "waiting")
        .await;
    let step = support::find_step(&run, "preflight/upstreams").expect("the upstreams step");
    assert!(
        step["outcome"]
            .as_str()
            .is_some_and(|o| o.contains("staging")),
        "{run}"
    );
    site.ground.assert_nothing_drained();
    site.ground.assert_nothing_installed();
}

#[test]
fn the_pages_commands_are_read_whole() {
    let commands = page_commands("getting-started/first-run.md");
    assert!(
        commands.iter().any(|c| c.starts_with("curl -s")
            && c.contains("/v1/detections")
            && c.contains("dry_run")),
        "{commands:#?}"
    );
    assert!(
        commands
            .iter()
            .all(|c| !c.contains('\\') && !c.contains("  #"))
    );
}
