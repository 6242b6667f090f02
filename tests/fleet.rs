//! Fleet waves (issue 31): three rollgates, dev → staging → prod, each `serve` with its own
//! test ground (fake API server, sshd nodes, etcd, Prometheus), the soak scaled to seconds.
//! A version goes on downstream only after the cluster upstream ran it and its gate stayed
//! quiet for the soak, measured by each ground's own records.

mod support;

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use support::ground::Ground;
use support::kube::Change;
use support::{Rollgate, eventually};

const RUN_DEADLINE: Duration = Duration::from_secs(240);
const WAIT: Duration = Duration::from_secs(120);
/// `fleet.soak` for every site: long enough that a step of the test lands inside it.
const SOAK: Duration = Duration::from_secs(8);

/// One cluster of the fleet: its ground and its rollgate.
struct Site {
    name: String,
    ground: Ground,
    rg: Rollgate,
    _config: tempfile::TempDir,
}

/// How a site is set up beyond its name and upstreams.
#[derive(Default)]
struct Options {
    require_approval: bool,
    extra: Vec<(&'static str, String)>,
}

impl Site {
    async fn start(name: &str, upstreams: &[&Site], options: Options) -> Self {
        let ground = Ground::start("1.34.2", 1).await;
        let config = tempfile::tempdir().expect("config dir");
        let mut toml = format!(
            "[fleet]\nname = \"{name}\"\nsoak = \"{}s\"\npoll_interval = \"300ms\"\ntimeout = \"2s\"\nrequire_approval = {}\n",
            SOAK.as_secs(),
            options.require_approval
        );
        for upstream in upstreams {
            toml.push_str(&format!(
                "[[fleet.upstreams]]\nname = \"{}\"\nurl = \"{}\"\ntoken_file = \"{}\"\n",
                upstream.name,
                upstream.rg.base(),
                upstream.rg.data_dir().join("api-token").display()
            ));
        }
        let path = config.path().join("rollgate.toml");
        std::fs::write(&path, toml).expect("config");
        let mut extra = vec![("ROLLGATE_CONFIG", path.display().to_string())];
        extra.extend(options.extra);
        let rg = ground.rollgate(&extra).await;
        Self {
            name: name.to_owned(),
            ground,
            rg,
            _config: config,
        }
    }

    /// When this ground first cordoned a node, and when it last changed one.
    fn node_times(&self) -> (Option<Instant>, Option<Instant>) {
        let changes = self.ground.api.changes_timed();
        let first = changes
            .iter()
            .find(|(_, c)| matches!(c, Change::Cordon(_)))
            .map(|(at, _)| *at);
        let last = changes.last().map(|(at, _)| *at);
        (first, last)
    }

    async fn fleet(&self) -> Value {
        let (status, view) = self.rg.get("/v1/fleet").await;
        assert_eq!(status, 200, "{view}");
        view
    }

    /// Waits until run `id`'s reason holds `text`.
    async fn reason_holds(&self, id: &str, text: &str) -> Value {
        self.rg
            .wait_run_until(id, &format!("the reason to say {text:?}"), WAIT, |r| {
                r["reason"].as_str().is_some_and(|t| t.contains(text))
            })
            .await
    }

    fn cordoned_nothing(&self) -> bool {
        !self
            .ground
            .api
            .changes()
            .iter()
            .any(|c| matches!(c, Change::Cordon(_)))
    }
}

/// `later` came at least `soak` after `earlier`.
fn assert_after_soak(what: &str, earlier: Instant, later: Instant) {
    let gap = later.saturating_duration_since(earlier);
    eprintln!("{what}: {gap:.2?} (soak {SOAK:?})");
    assert!(
        later >= earlier && gap >= SOAK,
        "{what}: {gap:?} after, not the soak of {SOAK:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_goes_dev_staging_prod_each_after_the_soak_and_an_upstream_alert_or_outage_holds_it()
 {
    let mut dev = Site::start("dev", &[], Options::default()).await;
    let staging = Site::start("staging", &[&dev], Options::default()).await;
    let prod = Site::start("prod", &[&staging], Options::default()).await;

    // Detections reach all three at the same moment.
    let (dev_run, staging_run, prod_run) = tokio::join!(
        dev.rg.detect("1.34.5", "patch"),
        staging.rg.detect("1.34.5", "patch"),
        prod.rg.detect("1.34.5", "patch"),
    );
    let held = staging
        .reason_holds(&staging_run, "waits for upstreams: dev:")
        .await;
    assert_eq!(
        support::find_step(&held, "preflight/upstreams").unwrap()["status"],
        "waiting"
    );
    prod.reason_holds(&prod_run, "staging: runs 1.34.2, not 1.34.5")
        .await;

    dev.rg
        .wait_status(&dev_run, "succeeded", RUN_DEADLINE)
        .await;
    let (_, dev_end) = dev.node_times();
    let dev_end = dev_end.expect("dev changed its nodes");
    // Inside staging's soak: a blocking alert in dev holds it, naming the alert.
    let (status, _) = dev.rg.post("/v1/alerts", &support::webhook("f1ee7")).await;
    assert_eq!(status, 202);
    staging
        .reason_holds(&staging_run, "dev: gate closed by NodeNotReady")
        .await;
    assert!(
        staging.cordoned_nothing(),
        "staging started during dev's alert"
    );
    assert_eq!(
        staging
            .rg
            .metric("rollgate_fleet_upstream_ready{upstream=\"dev\"}")
            .await,
        0.0
    );

    // dev's rollgate stopped: staging holds, naming dev unreachable; back, the wave goes on.
    dev.rg.kill9();
    staging
        .reason_holds(&staging_run, "dev: unreachable (")
        .await;
    dev.rg.restart().await;
    staging
        .reason_holds(&staging_run, "dev: gate closed by NodeNotReady")
        .await;
    let resolved_at = Instant::now();
    let (status, _) = dev.rg.post("/v1/alerts", &support::resolved("f1ee7")).await;
    assert_eq!(status, 202);
    staging
        .reason_holds(&staging_run, "dev: soaking until")
        .await;

    let staged = staging
        .rg
        .wait_status(&staging_run, "succeeded", RUN_DEADLINE)
        .await;
    let (staging_start, staging_end) = staging.node_times();
    let staging_start = staging_start.expect("staging cordoned a node");
    assert_after_soak("staging after dev's end", dev_end, staging_start);
    assert_after_soak(
        "staging after dev's alert resolved",
        resolved_at,
        staging_start,
    );
    let promoted = staged["history"].as_array().unwrap().iter().any(|h| {
        h["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("wave promotes 1.34.5 to staging: dev ran it"))
    });
    assert!(promoted, "no promotion in staging's history: {staged}");
    assert!(
        staging
            .ground
            .slack_texts()
            .iter()
            .any(|t| t.contains("wave promotes 1.34.5 to staging")),
        "Slack was not told of the promotion"
    );

    prod.rg
        .wait_status(&prod_run, "succeeded", RUN_DEADLINE)
        .await;
    let (prod_start, _) = prod.node_times();
    assert_after_soak(
        "prod after staging's end",
        staging_end.expect("staging changed its nodes"),
        prod_start.expect("prod cordoned a node"),
    );
    for site in [&dev, &staging, &prod] {
        site.ground.assert_all_at("1.34.5");
    }

    // The chain as prod's rollgate tells it, and as `rollgate fleet status` prints it.
    let view = prod.fleet().await;
    assert_eq!(view["upstreams"][0]["name"], "staging");
    assert_eq!(view["upstreams"][0]["ready"], true);
    assert_eq!(view["upstreams"][0]["view"]["upstreams"][0]["name"], "dev");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .args(["fleet", "--url", &prod.rg.base(), "--token-file"])
        .arg(prod.rg.data_dir().join("api-token"))
        .arg("status")
        .output()
        .expect("rollgate fleet status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("prod: runs 1.34.5;"), "{text}");
    assert!(
        lines[1]
            .trim_start()
            .starts_with("↑ staging: runs 1.34.5; last upgrade 1.34.5 succeeded"),
        "{text}"
    );
    assert!(text.contains("↑ dev: runs 1.34.5"), "{text}");
}

async fn approve_as(site: &Site, id: &str, token: &str) -> (u16, Value) {
    let r = site
        .rg
        .http
        .post(format!("{}/v1/runs/{id}/approve", site.rg.base()))
        .bearer_auth(token)
        .json(&json!({"reason": "change board said yes"}))
        .send()
        .await
        .expect("approve");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prod_waits_for_an_approval_after_the_soak_and_kill_9_upstream_keeps_quiet_since() {
    let tokens = tempfile::tempdir().expect("tokens");
    let approver = "approver-token-0123456789";
    let operator = "operator-token-0123456789";
    std::fs::write(tokens.path().join("approver"), approver).unwrap();
    std::fs::write(tokens.path().join("operator"), operator).unwrap();
    let ops = "ops-token-0123456789abcdef";
    std::fs::write(tokens.path().join("ops"), ops).unwrap();
    let mut staging = Site::start("staging", &[], Options::default()).await;
    let mut prod = Site::start(
        "prod",
        &[&staging],
        Options {
            require_approval: true,
            extra: vec![
                (
                    "ROLLGATE__SERVER__TOKENS_DIR",
                    tokens.path().display().to_string(),
                ),
                (
                    "ROLLGATE__SERVER__SCOPES__APPROVER",
                    "runs:approve,read".into(),
                ),
                (
                    "ROLLGATE__SERVER__SCOPES__OPERATOR",
                    "runs:control,read".into(),
                ),
                (
                    "ROLLGATE__SERVER__SCOPES__OPS",
                    "detections:write,read".into(),
                ),
            ],
        },
    )
    .await;
    prod.rg.token = ops.to_owned();
    let (staging_run, prod_run) = tokio::join!(
        staging.rg.detect("1.34.5", "patch"),
        prod.rg.detect("1.34.5", "patch"),
    );
    staging
        .rg
        .wait_status(&staging_run, "succeeded", RUN_DEADLINE)
        .await;
    let soaking = prod.reason_holds(&prod_run, "staging: soaking until").await;
    let before = staging.fleet().await;
    let quiet_since = before["gate"]["quiet_since"].clone();
    assert!(quiet_since.is_string(), "{before}");
    assert!(
        prod.rg
            .metric("rollgate_fleet_soak_remaining_seconds{upstream=\"staging\"}")
            .await
            > 0.0
    );

    // kill -9 in the middle of the soak: quiet_since and the soak are as they were.
    staging.rg.kill9();
    prod.reason_holds(&prod_run, "staging: unreachable (").await;
    staging.rg.restart().await;
    let after = staging.fleet().await;
    assert_eq!(after["gate"]["quiet_since"], quiet_since);
    assert_eq!(
        after["last_runs"]["k8s-upgrade"],
        before["last_runs"]["k8s-upgrade"]
    );
    let until = |r: &Value| {
        let reason = r["reason"].as_str().unwrap_or_default();
        reason
            .split("soaking until ")
            .nth(1)
            .map(|t| t.chars().take(20).collect::<String>())
    };
    let again = prod.reason_holds(&prod_run, "staging: soaking until").await;
    assert_eq!(until(&again), until(&soaking), "the soak moved");

    // Soaked: prod waits for an approval, and only a client with runs:approve gives it.
    prod.reason_holds(&prod_run, "waits for approval: upstreams ready (staging)")
        .await;
    assert!(prod.cordoned_nothing(), "prod started before its approval");
    assert_eq!(
        prod.rg
            .metric("rollgate_fleet_upstream_ready{upstream=\"staging\"}")
            .await,
        1.0
    );
    let (status, body) = approve_as(&prod, &prod_run, operator).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.to_string().contains("runs:approve"), "{body}");
    // The approver, on the status page: the run's fleet panel shows staging ready, and
    // its Approve button lets the run go on.
    let browser = support::webdriver::Browser::start(1280, 900).await;
    browser
        .goto(&format!("{}/ui#/runs/{prod_run}", prod.rg.base()))
        .await;
    browser
        .wait_text("#login-form h1", "the login", WAIT, |t| {
            t.contains("Log in")
        })
        .await;
    browser.type_into("#token", approver).await;
    browser.click("#login").await;
    let panel = browser
        .wait_text("#fleet", "the fleet panel", WAIT, |t| {
            t.contains("staging") && t.contains("ready")
        })
        .await;
    assert!(panel.contains("This cluster: prod"), "{panel}");
    browser.click("#approve").await;
    let done = prod
        .rg
        .wait_status(&prod_run, "succeeded", RUN_DEADLINE)
        .await;
    let approved = done["history"].as_array().unwrap().iter().any(|h| {
        h["by"] == "approver"
            && h["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("approve by approver"))
    });
    assert!(approved, "the approval is not credited: {done}");
    let (_, staging_end) = staging.node_times();
    let (prod_start, _) = prod.node_times();
    assert_after_soak(
        "prod after staging's end",
        staging_end.expect("staging changed its nodes"),
        prod_start.expect("prod cordoned a node"),
    );
    // Nothing waits for an approval now.
    let (status, body) = approve_as(&prod, &prod_run, approver).await;
    assert_eq!(status, 409, "{body}");
}

/// The configuration of `prod`, downstream of a stand-in `dev` (soak 1 s), written in
/// `dir`; with `token`, the file of the token it sends.
fn downstream_of_stand_in(
    dir: &std::path::Path,
    upstream: &support::services::MiniServer,
    token: Option<&std::path::Path>,
) -> std::path::PathBuf {
    let mut toml = format!(
        "[fleet]\nname = \"prod\"\nsoak = \"1s\"\npoll_interval = \"300ms\"\n\
         [[fleet.upstreams]]\nname = \"dev\"\nurl = \"http://127.0.0.1:{}\"\n",
        upstream.port
    );
    if let Some(token) = token {
        toml.push_str(&format!("token_file = \"{}\"\n", token.display()));
    }
    let config = dir.join("prod.toml");
    std::fs::write(&config, toml).unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fleets_are_refused_and_an_upstream_answering_no_fleet_view_holds_the_upgrade() {
    // check-config and serve refuse every bad key at once, each named.
    let dir = tempfile::tempdir().expect("dir");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[fleet]\nname = \"prod\"\nsoak = \"0s\"\n\
         [[fleet.upstreams]]\nname = \"dev\"\nurl = \"ftp://dev.example.com\"\n\
         [[fleet.upstreams]]\nname = \"prod\"\nurl = \"https://prod.example.com\"\n\
         [[fleet.upstreams]]\nname = \"dev\"\nurl = \"https://dev2.example.com\"\n",
    )
    .unwrap();
    for command in ["check-config", "serve"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollgate"))
            .arg("--config")
            .arg(&bad)
            .arg(command)
            .env("ROLLGATE__DATA_DIR", dir.path().join("data"))
            .env("ROLLGATE__SERVER__LISTEN", "127.0.0.1:0")
            .output()
            .expect("rollgate");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{command} took it: {text}");
        for key in [
            "fleet.soak: 0s must be a duration",
            "fleet.upstreams[0].url: \"ftp://dev.example.com\" is not an http(s) URL",
            "fleet.upstreams[1].name: \"prod\" is this cluster itself",
            "fleet.upstreams[2].name: \"dev\" names two upstreams",
        ] {
            assert!(text.contains(key), "{command} does not say {key:?}: {text}");
        }
    }

    // An upstream whose answer is JSON but no fleet view is unreachable, named, and holds.
    let upstream = support::services::MiniServer::start().await;
    *upstream.reply.lock().unwrap() = r#"{"name": "dev", "hello": 1}"#.into();
    let token = dir.path().join("dev-token");
    std::fs::write(&token, "dev-read-token-0123456789\n").unwrap();
    let ground = Ground::start("1.34.2", 1).await;
    let config = downstream_of_stand_in(dir.path(), &upstream, Some(&token));
    let rg = ground
        .rollgate(&[("ROLLGATE_CONFIG", config.display().to_string())])
        .await;
    let id = rg.detect("1.34.5", "patch").await;
    rg.wait_run_until(&id, "held naming dev's answer", WAIT, |r| {
        r["reason"]
            .as_str()
            .is_some_and(|t| t.contains("dev: unreachable (its answer is not a fleet view: "))
    })
    .await;
    assert!(
        !ground
            .api
            .changes()
            .iter()
            .any(|c| matches!(c, Change::Cordon(_))),
        "an upgrade went ahead past an upstream it could not read"
    );
    let heads = upstream.heads.lock().unwrap().clone();
    assert!(
        heads.iter().any(|h| h.starts_with("GET /v1/fleet ")
            && h.to_ascii_lowercase()
                .contains("authorization: bearer dev-read-token-0123456789")),
        "{heads:?}"
    );
    let (_, view) = rg.get("/v1/fleet").await;
    assert_eq!(view["upstreams"][0]["ready"], false, "{view}");
    assert!(view["upstreams"][0]["view"].is_null(), "{view}");
}

/// An upstream's `GET /v1/fleet` answer, served by a stand-in: it runs `version` (its
/// upgrade to it ended and its gate quiet since an hour before `now`).
fn upstream_view(version: &str) -> String {
    let now = chrono::Utc::now();
    let hour_ago = (now - chrono::Duration::hours(1)).to_rfc3339();
    json!({
        "name": "dev",
        "now": now.to_rfc3339(),
        "versions": {"api_server": {version: 1}, "kubelet": {version: 2}},
        "last_runs": {"k8s-upgrade": {
            "id": "r-dev", "status": "succeeded", "target": version, "ended_at": hour_ago
        }},
        "gate": {"verdict": "open", "reasons": [], "blockers": [], "quiet_since": hour_ago},
        "upstreams": []
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_waiting_for_its_upstreams_holds_no_lock_and_takes_it_after_a_reboot() {
    let upstream = support::services::MiniServer::start().await;
    *upstream.reply.lock().unwrap() = upstream_view("1.34.2");
    let dir = tempfile::tempdir().expect("dir");
    let config = downstream_of_stand_in(dir.path(), &upstream, None);
    let ground = Ground::start("1.34.2", 2).await;
    ground.node("w1").need_reboot();
    ground.node("w1").reboot_delay(4.0);
    let rg = ground
        .rollgate(&[
            ("ROLLGATE_CONFIG", config.display().to_string()),
            (
                "ROLLGATE__REBOOT__SENTINEL_COMMAND",
                "test -e \"$STUB_STATE/reboot-required\"".into(),
            ),
            ("ROLLGATE__REBOOT__TIMEOUT", "60s".into()),
        ])
        .await;
    let upgrade = rg.detect("1.34.5", "patch").await;
    rg.wait_run_until(&upgrade, "the upgrade at its upstreams", WAIT, |r| {
        r["reason"]
            .as_str()
            .is_some_and(|t| t.contains("dev: runs 1.34.2, not 1.34.5"))
    })
    .await;

    // The weekly reboot goes ahead: the upgrade waiting outside holds nothing.
    let (status, body) = rg.post("/v1/reboots", &json!({})).await;
    assert_eq!(status, 202, "{body}");
    let reboot = body["run_id"].as_str().unwrap().to_owned();
    eventually("w1 cordoned by the reboot", WAIT, || async {
        ground
            .api
            .changes()
            .iter()
            .any(|c| matches!(c, Change::Cordon(n) if n == "w1"))
            .then_some(())
    })
    .await;
    // dev is ready while w1 is down: the upgrade now needs the cluster and waits for it.
    *upstream.reply.lock().unwrap() = upstream_view("1.34.5");
    rg.wait_behind(&upgrade, &reboot, "node-reboot").await;
    rg.wait_status(&reboot, "succeeded", RUN_DEADLINE).await;
    rg.wait_status(&upgrade, "succeeded", RUN_DEADLINE).await;
    ground.assert_one_node_down_at_a_time();
    ground.assert_all_at("1.34.5");
}
