//! Several `rollgate serve` replicas on one RabbitMQ queue and one PostgreSQL database
//! (a real server of the test's own on loopback): one active worker, taken over when its
//! replica dies; dedup and "one upgrade at a time" decided by the database.

mod support;

use serde_json::{Value, json};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use support::ground::Ground;
use support::postgres::Postgres;
use support::rabbit::Names;
use support::replicas::{
    active, all_on_the_board_once, intake_load, post_alert, the_active, try_get,
};
use support::{Rollgate, eventually};

/// One server for the tests that do not stop it; each test has its own database.
fn server() -> &'static Postgres {
    static SERVER: OnceLock<Postgres> = OnceLock::new();
    SERVER.get_or_init(Postgres::start)
}

/// Settings shared by every replica: the same queue names and the same database.
fn shared(names: &Names, url: &str) -> Vec<(&'static str, String)> {
    let mut env = names.env();
    env.extend(Postgres::env(url));
    env
}

async fn start_replicas(ground: &Ground, n: usize, env: &[(&str, String)]) -> Vec<Rollgate> {
    let mut replicas = Vec::new();
    for _ in 0..n {
        replicas.push(ground.rollgate(env).await);
    }
    replicas
}

/// The run as the first replica that answers sees it.
async fn run_via(replicas: &[Rollgate], id: &str) -> Option<Value> {
    for rg in replicas {
        if let Some((200, run)) = try_get(rg, &format!("/v1/runs/{id}")).await {
            return Some(run);
        }
    }
    None
}

fn terminal(run: &Value) -> bool {
    matches!(
        run["status"].as_str(),
        Some("succeeded" | "failed" | "aborted")
    )
}

/// The label of the step `run` has in hand, if any.
fn step_in_hand(run: &Value) -> Option<String> {
    let i = run["current_step"].as_u64()? as usize;
    support::step_label(&run["steps"][i])
}

fn random_below(n: u64) -> u64 {
    getrandom::u64().expect("randomness") % n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_finish_an_upgrade_through_ten_kill_9s_of_the_active_worker() {
    let ground = Ground::start("1.34.2", 4).await;
    let names = Names::unique();
    let url = server().database().await;
    let mut env = shared(&names, &url);
    env.push(("ROLLGATE__CLUSTER__SOAK", "10s".into()));
    let mut replicas = start_replicas(&ground, 3, &env).await;
    let first = the_active(&replicas).await;
    let id = replicas[(first + 1) % 3].detect("1.34.5", "patch").await;

    // Kill the active worker's replica at random moments (0.5 to 3.5 s into its term),
    // restarting it at once as a standby, until the run ends; at most 12 times.
    let began = Instant::now();
    let mut kills = Vec::new();
    let run = loop {
        let run = eventually("the run, from a replica", Duration::from_secs(30), || {
            run_via(&replicas, &id)
        })
        .await;
        if terminal(&run) || kills.len() == 12 {
            break run;
        }
        assert!(
            began.elapsed() < Duration::from_secs(420),
            "no end in 7 minutes after {} kills: {run}",
            kills.len()
        );
        let leader = the_active(&replicas).await;
        let term = Instant::now();
        if kills.len() % 2 == 0 {
            // A random moment: most of the run's time is soaks and waits.
            tokio::time::sleep(Duration::from_millis(500 + random_below(3000))).await;
        } else {
            // The moment a step that works on a node (gate, drain, upgrade, verify,
            // uncordon) is in hand, and a random fraction of a second into it.
            let busy = || async {
                let step = step_in_hand(&run_via(&replicas, &id).await?)?;
                (!step.contains("soak")).then_some(())
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while busy().await.is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(random_below(300))).await;
        }
        let step = run_via(&replicas, &id)
            .await
            .and_then(|r| step_in_hand(&r))
            .unwrap_or_else(|| "-".into());
        replicas[leader].kill9();
        kills.push(format!(
            "{:?} into replica {leader}'s term, at {step}",
            term.elapsed()
        ));
        replicas[leader].restart().await;
    };
    eprintln!("kills: {kills:#?}");
    let run = if terminal(&run) {
        run
    } else {
        eventually("the run ends", Duration::from_secs(300), || async {
            run_via(&replicas, &id).await.filter(terminal)
        })
        .await
    };
    assert!(
        kills.len() >= 10,
        "the run ended after only {} kills: {kills:?}",
        kills.len()
    );
    assert_eq!(run["status"], "succeeded", "{run}\n{}", replicas[0].logs());
    ground.assert_all_at("1.34.5");
    ground.assert_drained_once();

    // Every transition once: in the history, and in the log the event stream serves.
    let history = run["history"].as_array().expect("history");
    let entries: Vec<String> = history.iter().map(Value::to_string).collect();
    let distinct: HashSet<&String> = entries.iter().collect();
    assert_eq!(distinct.len(), entries.len(), "a transition twice: {run}");
    rollgate::workflows::register();
    let store = rollgate::store::Store::connect(&rollgate::store::postgres::PgSettings {
        url: url.clone(),
        password: None,
        max_connections: 1,
        timeout: Duration::from_secs(5),
    })
    .await
    .expect("store");
    let logged = store
        .events_after(0, Some(id.clone()), 10_000)
        .await
        .unwrap();
    assert_eq!(logged.len(), history.len(), "logged once each");
    let takeovers = history
        .iter()
        .filter(|h| {
            h["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("rollgate restarted"))
        })
        .count();
    assert!(takeovers >= 1, "no takeover recorded: {run}");
}

/// Posts `body` to `/v1/detections` of `rg`: status and body.
async fn post_detection(rg: &Rollgate, body: &Value) -> (u16, Value) {
    rg.post("/v1/detections", body).await
}

async fn abort_and_wait(replicas: &[Rollgate], id: &str) {
    assert_eq!(replicas[0].control(id, "abort", "next round").await, 202);
    eventually("the run aborted", Duration::from_secs(30), || async {
        run_via(replicas, id)
            .await
            .filter(|r| r["status"] == "aborted")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_detection_posted_to_two_replicas_at_once_makes_one_run_and_two_targets_one_409() {
    let ground = Ground::start("1.34.2", 1).await;
    let names = Names::unique();
    let url = server().database().await;
    let mut env = shared(&names, &url);
    // A gate that cannot be evaluated holds every run at its pre-flight gate.
    env.push((
        "ROLLGATE__GATE__PROMETHEUS_URL",
        format!("http://127.0.0.1:{}", support::free_port()),
    ));
    let replicas = start_replicas(&ground, 2, &env).await;
    let detection = json!({"target_version": "1.34.5", "kind": "patch", "stages": "all"});
    for round in 0..100 {
        let ((s1, b1), (s2, b2)) = tokio::join!(
            post_detection(&replicas[0], &detection),
            post_detection(&replicas[1], &detection)
        );
        let mut statuses = [s1, s2];
        statuses.sort();
        assert_eq!(statuses, [200, 202], "round {round}: {b1} {b2}");
        assert_eq!(b1["run_id"], b2["run_id"], "round {round}: two runs");
        let id = b1["run_id"].as_str().expect("run id").to_owned();
        abort_and_wait(&replicas, &id).await;
    }
    for round in 0..20 {
        let other = json!({"target_version": "1.34.6", "kind": "patch", "stages": "all"});
        let ((s1, b1), (s2, b2)) = tokio::join!(
            post_detection(&replicas[0], &detection),
            post_detection(&replicas[1], &other)
        );
        let mut statuses = [s1, s2];
        statuses.sort();
        assert_eq!(statuses, [202, 409], "round {round}: {b1} {b2}");
        let (taken, refused) = if s1 == 202 { (&b1, &b2) } else { (&b2, &b1) };
        let id = taken["run_id"].as_str().expect("run id").to_owned();
        assert!(
            refused["message"].as_str().is_some_and(|m| m.contains(&id)),
            "the 409 names the holder: {refused}"
        );
        abort_and_wait(&replicas, &id).await;
    }
    let (_, runs) = replicas[1].get("/v1/runs?view=summary&limit=1000").await;
    assert_eq!(
        runs.as_array().map(Vec::len),
        Some(120),
        "one run per round"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_under_intake_load_loses_no_accepted_alert() {
    let mut pg = Postgres::start();
    let url = pg.database().await;
    let names = Names::unique();
    let env = shared(&names, &url);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let replicas = vec![Rollgate::start(&env).await, Rollgate::start(&env).await];
    the_active(&replicas).await;

    let stop = Arc::new(AtomicBool::new(false));
    let loads = [
        intake_load(&replicas[0], "a", stop.clone()),
        intake_load(&replicas[1], "b", stop.clone()),
    ];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pg.stop();
    // What needs the store answers 503 with Retry-After while it is down.
    let r = replicas[1]
        .http
        .get(format!("{}/v1/runs", replicas[1].base()))
        .bearer_auth(&replicas[1].token)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status().as_u16(), 503);
    assert!(
        r.headers().get("retry-after").is_some(),
        "503 without Retry-After"
    );
    let (ready, _) = try_get(&replicas[0], "/readyz").await.expect("readyz");
    assert_eq!(ready, 503, "ready without its store");
    // Both workers step down once their lease cannot be renewed.
    eventually("no active worker", Duration::from_secs(10), || async {
        active(&replicas).await.is_empty().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.start_again();
    the_active(&replicas).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut accepted = Vec::new();
    for l in loads {
        let mut posted = l.await.expect("load");
        eprintln!(
            "accepted {}, refused {}",
            posted.accepted.len(),
            posted.refused.len()
        );
        accepted.append(&mut posted.accepted);
    }
    assert!(accepted.len() > 50, "too little load: {}", accepted.len());
    let last = post_alert(&replicas[0], "after").await;
    assert_eq!(last, Some(202));
    accepted.push("after".into());
    all_on_the_board_once(&replicas[1], &accepted, Duration::from_secs(90)).await;
    eprintln!(
        "{} alerts accepted across the restart, none lost",
        accepted.len()
    );
}

/// The Slack messages received from `from` on that contain `needle`.
fn told(slack: &support::services::MiniServer, from: usize, needle: &str) -> usize {
    slack.received()[from..]
        .iter()
        .filter(|m| m["text"].as_str().is_some_and(|t| t.contains(needle)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transition_committed_before_the_active_replica_dies_reaches_slack_once_from_another() {
    let url = server().database().await;
    let names = Names::unique();
    let slack = support::services::MiniServer::start().await;
    let secrets = tempfile::tempdir().expect("tempdir");
    let slack_file = secrets.path().join("slack-url");
    std::fs::write(&slack_file, format!("http://{}/hook", slack.address())).expect("write");
    let mut env = shared(&names, &url);
    env.push((
        "ROLLGATE__NOTIFY__SLACK_WEBHOOK_FILE",
        slack_file.display().to_string(),
    ));
    env.push(("ROLLGATE__NOTIFY__RETRIES", "0".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let cluster = support::cluster::IntakeCluster::start().await;
    let mut replicas = vec![cluster.rollgate(&env).await, cluster.rollgate(&env).await];
    let first = the_active(&replicas).await;
    let other = 1 - first;

    // A run held at its gate (no Prometheus: unknown is closed); Slack is told.
    let (status, accepted) = replicas[other]
        .post(
            "/v1/detections",
            &json!({"target_version": "1.34.12", "kind": "patch"}),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["run_id"].as_str().expect("run id").to_owned();
    replicas[other]
        .wait_run(&id, "held at its gate", support::held_at_preflight_gate)
        .await;
    eventually(
        "Slack told of the hold",
        Duration::from_secs(20),
        || async { (told(&slack, 0, "gate closed") >= 1).then_some(()) },
    )
    .await;

    // Slack is down: the halt is committed by the active worker but cannot be told, and
    // the active replica dies.
    slack.set_reply(503, "down");
    let refused_from = slack.received().len();
    assert_eq!(
        replicas[other].control(&id, "halt", "outbox check").await,
        202
    );
    replicas[other]
        .wait_run(&id, "halted", |r| r["status"] == "halted")
        .await;
    eventually(
        "the halt tried and refused",
        Duration::from_secs(20),
        || async { (told(&slack, refused_from, "outbox check") >= 1).then_some(()) },
    )
    .await;
    replicas[first].kill9();

    // Slack is back: the replica that takes over tells the halt, once, in order.
    slack.set_reply(200, "ok");
    let back_from = slack.received().len();
    eventually(
        "the other replica active",
        Duration::from_secs(30),
        || async { (active(&replicas).await == [other]).then_some(()) },
    )
    .await;
    eventually(
        "the halt told by the replica that took over",
        Duration::from_secs(30),
        || async { (told(&slack, back_from, "outbox check") >= 1).then_some(()) },
    )
    .await;
    assert_eq!(replicas[other].control(&id, "abort", "the end").await, 202);
    eventually("the abort told", Duration::from_secs(20), || async {
        (told(&slack, back_from, "the end") >= 1).then_some(())
    })
    .await;
    assert_eq!(told(&slack, back_from, "outbox check"), 1, "told once");
    assert_eq!(
        told(&slack, back_from, "gate closed"),
        0,
        "nothing told before is told again"
    );
    drop(replicas);
    support::rabbit::cleanup(&names).await;
}
