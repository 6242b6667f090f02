//! The status page in real headless Chromium (Debian's chromium and chromium-driver)
//! against `rollgate serve` with a run in the fake cluster: login, the runs list, a run
//! followed live without a reload, the gate closing and opening, the halt and resume
//! buttons, phone width. Screenshots go to `target/tmp/status-page/`.

mod support;

use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;
use support::ground::Ground;
use support::webdriver::Browser;
use support::webhook;

const LIVE: Duration = Duration::from_secs(30);
const RUN: Duration = Duration::from_secs(180);

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page")
}

#[tokio::test]
async fn the_status_page_follows_a_run_live_and_controls_it() {
    let ground = Ground::start("1.34.2", 2).await;
    // Workers go w2, then w1. w2's drain waits until its database replica may leave: the
    // other replica (on w1) is not Ready until the test says so.
    ground.api.add_pods("w2", "db", 1, false);
    ground.api.add_pods("w1", "db", 1, false);
    let replica = ground.pod_named("w1", "db");
    ground.api.set_pod_ready(&replica, false);
    ground.api.set_pdb("db-pdb", "db", 1);
    let rg = ground
        .rollgate(&[
            ("ROLLGATE__CLUSTER__DRAIN_TIMEOUT", "120s".into()),
            ("ROLLGATE__CLUSTER__SOAK", "8s".into()),
        ])
        .await;
    let browser = Browser::start(1280, 900).await;

    // `/` leads to the page, which asks for the token; a wrong one is refused, named.
    browser.goto(&rg.base()).await;
    assert!(
        browser.url().await.ends_with("/ui"),
        "{}",
        browser.url().await
    );
    wait_for_login(&browser).await;
    browser.type_into("#token", "not-the-token").await;
    browser.click("#login").await;
    let refused = browser
        .wait_text("#login-reason", "the refusal", LIVE, |t| !t.is_empty())
        .await;
    assert!(refused.contains("refused (401"), "{refused}");
    browser.type_into("#token", &rg.token).await;
    browser.click("#login").await;
    browser
        .wait_text("main h1", "the runs list", LIVE, |t| t == "Runs")
        .await;
    assert_eq!(
        browser
            .script("return sessionStorage.getItem('rollgate-token')")
            .await,
        json!(rg.token),
        "kept for the tab"
    );
    assert_eq!(
        browser.script("return document.cookie").await,
        json!(""),
        "never a cookie"
    );

    // A run appears in the list by itself.
    let id = rg.detect("1.34.5", "patch").await;
    let row = format!("tr[data-run-id='{id}']");
    browser
        .wait_text(
            &format!("{row} .status"),
            "the run listed live",
            LIVE,
            |t| !t.is_empty(),
        )
        .await;
    browser.screenshot(&screenshots().join("runs.png")).await;

    // Its page: w2 goes from draining to done without a reload.
    browser.click(&format!("{row} a")).await;
    browser
        .wait_text("#run-id", "the run's page", LIVE, |t| t == id)
        .await;
    browser
        .script("window.rollgateMark = 'not reloaded'; return true")
        .await;
    let w2 = ".node[data-node='w2'] .state";
    browser
        .wait_text(w2, "w2 draining", RUN, |t| t == "draining")
        .await;
    ground.api.set_pod_ready(&replica, true);
    browser
        .wait_text(w2, "w2 soaking", RUN, |t| t == "soaking")
        .await;
    // An alert fires while w2 soaks: the page names it; w2 goes on to done (a node in hand
    // finishes), and the gate holds w1.
    let (status, _) = rg.post("/v1/alerts", &webhook("uiincident1")).await;
    assert_eq!(status, 202);
    browser
        .wait_text("#gate-verdict", "the gate closed", LIVE, |t| t == "closed")
        .await;
    let blockers = browser
        .wait_text("#blockers", "the blocker named", LIVE, |t| {
            t.contains("NodeNotReady")
        })
        .await;
    assert!(blockers.contains("alertmanager"), "{blockers}");
    // The page tells the same evaluation as the API: the same verdict, the same blockers.
    let (_, told) = rg.get("/v1/gates?cached=true").await;
    assert_eq!(told["verdict"]["verdict"], "closed", "{told}");
    let named: Vec<&str> = told["verdict"]["blockers"]
        .as_array()
        .map(|b| b.iter().filter_map(|b| b["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(!named.is_empty(), "{told}");
    for name in &named {
        assert!(
            blockers.contains(name),
            "the API names {name}, the page: {blockers}"
        );
    }
    assert_eq!(
        blockers.matches("alertname=").count(),
        named.len(),
        "one line per blocker: {blockers}"
    );
    browser.wait_text(w2, "w2 done", RUN, |t| t == "done").await;
    browser
        .wait_text(".node[data-node='w1'] .state", "w1 held", LIVE, |t| {
            t == "gated"
        })
        .await;
    browser.screenshot(&screenshots().join("run.png")).await;

    // Halt and resume with the buttons.
    browser.click("#halt").await;
    browser
        .wait_text("#run-status", "halted", LIVE, |t| t == "halted")
        .await;
    let run = rg.run(&id).await;
    assert_eq!(run["status"], "halted");
    assert!(
        run["reason"]
            .as_str()
            .is_some_and(|r| r.contains("from the status page")),
        "{run}"
    );
    browser.click("#resume").await;
    browser
        .wait_text("#run-status", "resumed", LIVE, |t| t != "halted")
        .await;

    // The alert resolves: the gate opens and the run finishes, still the same page.
    let mut resolved: Value = webhook("uiincident1");
    resolved["status"] = json!("resolved");
    resolved["alerts"][0]["status"] = json!("resolved");
    resolved["alerts"][0]["endsAt"] = json!(chrono::Utc::now().to_rfc3339());
    assert_eq!(rg.post("/v1/alerts", &resolved).await.0, 202);
    browser
        .wait_text("#gate-verdict", "the gate open", LIVE, |t| t == "open")
        .await;
    browser
        .wait_text("#run-status", "succeeded", RUN, |t| t == "succeeded")
        .await;
    browser
        .wait_text(".node[data-node='w1'] .state", "w1 done", LIVE, |t| {
            t == "done"
        })
        .await;
    assert_eq!(
        browser.script("return window.rollgateMark").await,
        json!("not reloaded")
    );

    // At phone width nothing runs off the side.
    browser.resize(390, 844).await;
    let fits = browser
        .script("return document.documentElement.scrollWidth <= window.innerWidth")
        .await;
    assert_eq!(fits, json!(true), "the run page scrolls sideways at 390 px");
    browser
        .screenshot(&screenshots().join("run-phone.png"))
        .await;

    // Logging out forgets the token.
    browser.click("#logout").await;
    browser
        .wait_text("#login-reason", "the login again", LIVE, |t| {
            t.contains("logged out")
        })
        .await;
    assert_eq!(
        browser
            .script("return sessionStorage.getItem('rollgate-token')")
            .await,
        Value::Null
    );
}

#[tokio::test]
async fn the_page_is_inside_the_binary_under_a_strict_policy() {
    let rg = support::Rollgate::start(&[]).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let root = http.get(rg.base()).send().await.unwrap();
    assert_eq!(root.status().as_u16(), 302);
    assert_eq!(root.headers()["location"], "/ui");
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let resp = http
            .get(format!("{}{path}", rg.base()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        let headers = resp.headers().clone();
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
            "{csp}"
        );
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("http"),
            "{csp}"
        );
        assert!(headers["content-type"].to_str().unwrap().starts_with(kind));
        let body = resp.text().await.unwrap();
        // Nothing from elsewhere: no absolute URL to load. SVG's namespace name is an
        // identifier (createElementNS), never fetched.
        let body = body.replace("'http://www.w3.org/2000/svg'", "SVG_NS");
        assert!(
            !body.contains("http://") && !body.contains("https://") && !body.contains("//cdn"),
            "{path} loads from elsewhere"
        );
    }
    let html = http
        .get(format!("{}/ui", rg.base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "nothing inline"
    );
}

#[tokio::test]
async fn a_read_token_sees_the_run_and_who_asked_for_it_but_cannot_control_it() {
    use support::clients::{clients_dir, token_of};
    let cluster = support::cluster::IntakeCluster::start().await;
    let (_dir, env) = clients_dir();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut rg = cluster.rollgate(&env).await;
    rg.token = token_of("detector").to_owned();
    let id = rg.detect("1.34.6", "patch").await;
    rg.token = token_of("viewer").to_owned();
    rg.wait_run(&id, "held at its gate", support::held_at_preflight_gate)
        .await;
    let browser = Browser::start(1280, 900).await;
    browser.goto(&format!("{}/ui", rg.base())).await;

    // A token that may not read is refused at the login, naming the scope.
    wait_for_login(&browser).await;
    browser.type_into("#token", token_of("alertmanager")).await;
    browser.click("#login").await;
    let refused = browser
        .wait_text("#login-reason", "the refusal", LIVE, |t| !t.is_empty())
        .await;
    assert!(
        refused.contains("alertmanager lacks scope read"),
        "{refused}"
    );

    // A read token: the run, its history crediting the detector, the controls off.
    browser.type_into("#token", token_of("viewer")).await;
    browser.click("#login").await;
    let who = browser
        .wait_text("#who", "who is logged in", LIVE, |t| !t.is_empty())
        .await;
    assert_eq!(who, "viewer (read only)");
    let row = format!("tr[data-run-id='{id}']");
    browser
        .wait_text(&format!("{row} .status"), "the run listed", LIVE, |t| {
            !t.is_empty()
        })
        .await;
    browser.click(&format!("{row} a")).await;
    browser
        .wait_text("#run-id", "the run's page", LIVE, |t| t == id)
        .await;
    let denied = browser
        .wait_text("#control-error", "why the controls are off", LIVE, |t| {
            !t.is_empty()
        })
        .await;
    assert!(
        denied.contains("viewer lacks scope runs:control"),
        "{denied}"
    );
    for button in ["#halt", "#resume", "#abort"] {
        let disabled = browser
            .script(&format!(
                "return document.querySelector('{button}').disabled"
            ))
            .await;
        assert_eq!(disabled, json!(true), "{button} usable with a read token");
    }
    let by = browser
        .wait_text("#history", "the history", LIVE, |t| t.contains("detector"))
        .await;
    assert!(by.contains("queued"), "{by}");
    browser
        .wait_text("#gate-verdict", "the gate's verdict", LIVE, |t| {
            t == "unknown"
        })
        .await;
    let page = browser.text("main").await.unwrap_or_default();
    assert!(
        !page.contains("null"),
        "an absent part shown as null:\n{page}"
    );
    browser
        .screenshot(&screenshots().join("read-only.png"))
        .await;
    assert_eq!(rg.run(&id).await["status"], "waiting");
}

/// A planned upgrade of 1 control plane + `workers` workers in batches of 4, driven by the
/// engine until the third batch's node scripts are in hand, then halted after them.
fn thousand_node_run(workers: usize) -> rollgate::domain::run::Run {
    use rollgate::domain::engine::{Input, Next, StepOutcome, advance};
    use rollgate::domain::event::{ControlAction, DetectionRequest, StageSelection, UpgradeKind};
    use rollgate::domain::run::{FailurePolicy, Run};
    use rollgate::domain::version::Version;
    use rollgate::workflows::k8s_upgrade::plan::{
        self as k8s_upgrade, ClusterFacts, MaxUnavailable, NodeFacts, PlanSettings, Role,
    };
    let v = |s: &str| Version::parse(s).unwrap();
    let node = |name: String, role| NodeFacts {
        name,
        role,
        kubelet: v("1.34.2"),
        distribution: Default::default(),
        package_manager: None,
        containerd: None,
        ready: true,
        address: None,
    };
    let mut nodes = vec![node("cp".into(), Role::ControlPlane)];
    nodes.extend((1..=workers).map(|i| node(format!("w{i:04}"), Role::Worker)));
    let request = DetectionRequest {
        target_version: v("1.34.5"),
        kind: UpgradeKind::Patch,
        dry_run: false,
        stages: StageSelection::all(),
        build: None,
    };
    let settings = PlanSettings {
        max_unavailable: MaxUnavailable::Count(4),
        ..PlanSettings::default()
    };
    let plan = k8s_upgrade::plan(&request, &ClusterFacts { nodes }, None, &settings).unwrap();
    let mut run = rollgate::workflows::k8s_upgrade::plan::new_run(
        uuid::Uuid::now_v7().to_string(),
        &request,
        false,
        FailurePolicy::Halt,
        chrono::Utc::now(),
    );
    run.steps.extend(plan.steps);
    let ctx = support::engine_context(chrono::Utc::now());
    let mut pending = advance(&mut run, Input::Start, &ctx).unwrap().into_each();
    // Workers go by name: the third batch is w0009 to w0012.
    let third_batch_scripts = |run: &Run| {
        let mut in_hand = run.summary().in_hand;
        in_hand.sort();
        in_hand
            == (9..=12)
                .map(|i| format!("workers/upgrade@w{i:04}"))
                .collect::<Vec<_>>()
    };
    while !third_batch_scripts(&run) {
        let next = pending.remove(0);
        let input = match next {
            Next::RunStep { epoch, .. } => Input::StepFinished {
                epoch,
                outcome: StepOutcome::done("ok"),
            },
            Next::WakeAt { epoch, .. } => Input::Wake { epoch },
            other => panic!("the run stopped: {other:?}: {}", run.reason),
        };
        pending.extend(advance(&mut run, input, &ctx).unwrap().into_each());
    }
    let halt = Input::Control {
        action: ControlAction::Halt,
        reason: "a look at the page".into(),
        by: Some("admin".into()),
    };
    advance(&mut run, halt, &ctx).unwrap();
    for next in pending {
        if let Next::RunStep { epoch, .. } = next {
            let done = Input::StepFinished {
                epoch,
                outcome: StepOutcome::done("ok"),
            };
            advance(&mut run, done, &ctx).unwrap();
        }
    }
    assert_eq!(
        run.status,
        rollgate::domain::run::RunStatus::Halted,
        "{}",
        run.reason
    );
    run
}

#[tokio::test]
async fn a_1000_node_run_renders_grouped_by_batch_and_follows_live() {
    let mut rg = support::Rollgate::start(&[]).await;
    rg.terminate();
    let run = thousand_node_run(1000);
    let id = run.id.clone();
    {
        rollgate::workflows::register();
        let store = rollgate::store::Store::open(&rg.data_dir().join("store.db")).unwrap();
        assert!(store.insert_run_if_absent(&run).await.unwrap());
    }
    rg.restart().await;
    let browser = Browser::start(1280, 900).await;
    browser.goto(&format!("{}/ui", rg.base())).await;
    wait_for_login(&browser).await;
    browser.type_into("#token", &rg.token).await;
    browser.click("#login").await;
    browser
        .wait_text("main h1", "the runs list", LIVE, |t| t == "Runs")
        .await;
    browser.goto(&format!("{}/ui#/runs/{id}", rg.base())).await;
    browser
        .wait_text("#run-id", "the run's page", LIVE, |t| t == id)
        .await;
    browser
        .script("window.rollgateMark = 'not reloaded'; return true")
        .await;
    let count = |selector: &str| format!("return document.querySelectorAll(\"{selector}\").length");
    assert_eq!(
        browser.script(&count("details.batch")).await,
        json!(250),
        "1,000 workers in batches of 4"
    );
    // The 1,000 workers and the control plane (its pre-flight kubeadm-plan).
    assert_eq!(browser.script(&count(".node")).await, json!(1001));
    // The batch in hand is open, naming its four nodes; the others are closed.
    let open = browser
        .script("return [...document.querySelectorAll('details.batch[open]')].map((d) => d.dataset.batch)")
        .await;
    assert_eq!(open, json!(["3"]), "only the batch in hand is open");
    let third = browser
        .wait_text(
            "details.batch[data-batch='3'] summary",
            "the third batch",
            LIVE,
            |t| !t.is_empty(),
        )
        .await;
    assert_eq!(third, "batch 3 (4 nodes): 0 done, 4 in hand, 0 waiting");
    let first = browser
        .wait_text(
            "details.batch[data-batch='1'] summary",
            "the first batch",
            LIVE,
            |t| !t.is_empty(),
        )
        .await;
    assert_eq!(first, "batch 1 (4 nodes): 4 done, 0 in hand, 0 waiting");
    browser
        .screenshot(&screenshots().join("thousand-nodes.png"))
        .await;
    // Live: an abort from the API reaches the page without a reload, naming the nodes it
    // leaves as they are.
    assert_eq!(rg.control(&id, "abort", "seen enough").await, 202);
    browser
        .wait_text("#run-status", "the abort shown live", LIVE, |t| {
            t == "aborted"
        })
        .await;
    let reason = browser
        .wait_text("#run-reason", "the reason", LIVE, |t| !t.is_empty())
        .await;
    assert!(
        reason.contains("possibly cordoned: w0009, w0010, w0011, w0012"),
        "{reason}"
    );
    assert_eq!(
        browser.script("return window.rollgateMark").await,
        json!("not reloaded")
    );
}

/// Waits until the page asks for a token.
async fn wait_for_login(browser: &Browser) {
    browser
        .wait_text("#login-form h1", "the login", LIVE, |t| {
            t.contains("Log in")
        })
        .await;
}

/// Issue 40: with no run open, the home page says what closes the gate and for how long:
/// a gate panel naming each blocker with its age, and the header's verdict naming them.
#[tokio::test]
async fn the_home_page_names_what_closes_the_gate_and_since_when() {
    let rg = support::Rollgate::start(&[]).await;
    let mut alert = support::webhook("a1b2c3d4e5f60718");
    alert["alerts"][0]["labels"]["alertname"] = serde_json::json!("EtcdNoLeader");
    alert["alerts"][0]["startsAt"] =
        serde_json::json!((chrono::Utc::now() - chrono::Duration::minutes(12)).to_rfc3339());
    let (status, body) = rg.post("/v1/alerts", &alert).await;
    assert_eq!(status, 202, "{body}");

    let browser = Browser::start(1280, 900).await;
    browser.goto(&rg.base()).await;
    wait_for_login(&browser).await;
    browser.type_into("#token", &rg.token).await;
    browser.click("#login").await;
    browser
        .wait_text("main h1", "the runs list", LIVE, |t| t == "Runs")
        .await;
    browser
        .wait_text("#gate-verdict", "the gate closed", LIVE, |t| t == "closed")
        .await;
    let blockers = browser
        .wait_text("#blockers", "the blocker named", LIVE, |t| {
            t.contains("EtcdNoLeader")
        })
        .await;
    assert!(blockers.contains("12m ago"), "{blockers}");
    let summary = browser
        .wait_text("#gate-summary", "the header's verdict", LIVE, |t| {
            t.contains("closed")
        })
        .await;
    assert_eq!(summary, "gate closed: EtcdNoLeader (12m)");
}
