//! The README's first command and its tour, as a newcomer runs them: `scripts/serve.sh`
//! brings up the sandbox and rollgate, then the tour's block runs as it is in the README.
//! What it did is read from independent witnesses: the fake API server through the real
//! kubectl, each node's own log of its upgrades and reboots, and the etcd StatefulSet.

mod support;

use serde_json::Value;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::webdriver::Browser;

/// How long the pictures' moments may take to come.
const WAIT: Duration = Duration::from_secs(60);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README's tour: its first `sh` block after the tour's heading.
fn tour() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let after = readme
        .split_once("## A five-minute tour")
        .expect("the tour's heading")
        .1;
    let block = after.split_once("```sh\n").expect("the tour's block").1;
    block
        .split_once("```")
        .expect("the block's end")
        .0
        .to_owned()
}

/// `scripts/serve.sh`, running, its output going to a file.
struct Serve {
    child: Child,
    out: PathBuf,
}

impl Serve {
    fn start(dir: &Path, port: u16) -> Self {
        let out = dir.join("serve.out");
        let file = std::fs::File::create(&out).expect("serve.out");
        let bin_dir = support::rollgate_bin()
            .parent()
            .expect("the binaries' dir")
            .to_owned();
        // `cargo test` builds the examples beside the binaries; `--test sandbox` alone
        // does not.
        assert!(
            bin_dir.join("examples/sandbox").exists(),
            "no {}: cargo build --example sandbox",
            bin_dir.join("examples/sandbox").display()
        );
        let child = Command::new("bash")
            .arg(root().join("scripts/serve.sh"))
            .env("ROLLGATE_SANDBOX_DIR", dir.join("sandbox"))
            .env("ROLLGATE_SANDBOX_PORT", port.to_string())
            // The binaries this test was built with: cargo holds the build lock meanwhile.
            .env("ROLLGATE_BIN_DIR", bin_dir)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("out"))
            .stderr(file)
            .spawn()
            .expect("scripts/serve.sh");
        Self { child, out }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Waits until serve.sh printed its banner; the output so far.
    fn wait_banner(&mut self) -> String {
        let start = Instant::now();
        loop {
            let out = self.output();
            if out.contains("Ctrl-C stops everything") {
                return out;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("scripts/serve.sh ended ({status}) before it was up:\n{out}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "scripts/serve.sh not up after 180 s:\n{out}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, as a terminal's Ctrl-C stops it; its exit.
    fn stop(&mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "scripts/serve.sh did not stop:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.stop();
        }
        if std::thread::panicking() {
            eprintln!("--- scripts/serve.sh ---\n{}", self.output());
        }
    }
}

/// `kubectl ARGS -o json` against the sandbox's cluster.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> Value {
    let out = Command::new("kubectl")
        .args(args)
        .args(["-o", "json"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("kubectl's JSON")
}

/// The sandbox's nodes and each one's own directory, as it wrote them.
fn node_dirs(sandbox: &Path) -> Vec<(String, PathBuf)> {
    std::fs::read_to_string(sandbox.join("nodes"))
        .expect("the sandbox's nodes")
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(n, d)| (n.to_owned(), PathBuf::from(d)))
        .collect()
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The value of `name=` in the sandbox's env file.
fn env_value(sandbox: &Path, name: &str) -> String {
    std::fs::read_to_string(sandbox.join("env"))
        .expect("env")
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("export {name}="))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| panic!("no {name} in the env file"))
}

fn refuses(address: &str) -> bool {
    std::net::TcpStream::connect(address).is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_command_brings_up_the_sandbox_and_the_tour_upgrades_reboots_and_rolls_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = support::free_port();
    let started = Instant::now();
    let mut serve = Serve::start(dir.path(), port);
    let out = serve.wait_banner();
    let up_in = started.elapsed();
    let sandbox = dir.path().join("sandbox");

    // It says loudly what it is, and how to reach it.
    let first = out.lines().next().unwrap_or_default();
    assert!(first.contains("LOCAL SANDBOX"), "first line: {first:?}");
    let ui = format!("http://127.0.0.1:{port}/ui");
    assert!(out.contains(&format!("Status page:  {ui}")), "{out}");
    let token = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Token:"))
        .map(|t| t.trim().to_owned())
        .expect("a token in the banner");
    let sandbox_up = out
        .lines()
        .find(|l| l.starts_with("sandbox: up in"))
        .expect("the sandbox's start time")
        .to_owned();
    let http = reqwest::Client::new();
    let page = http.get(&ui).send().await.expect("the status page");
    assert_eq!(page.status(), 200);
    let me: Value = http
        .get(format!("http://127.0.0.1:{port}/v1/whoami"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("whoami")
        .json()
        .await
        .expect("json");
    assert!(
        me["banner"]
            .as_str()
            .is_some_and(|b| b.contains("LOCAL SANDBOX")),
        "{me}"
    );

    // The tour, as it is in the README, every command checked (-e).
    let tour_started = Instant::now();
    let mut tour_run = Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", &tour()])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash");
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let deadline = Duration::from_secs(300);
    loop {
        if tour_run.try_wait().expect("the tour").is_some() {
            break;
        }
        if tour_started.elapsed() > deadline {
            let _ = tour_run.kill();
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = tour_run.wait().expect("the tour");
    tour_run
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("stdout");
    tour_run
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr");
    let tour_took = tour_started.elapsed();
    let rollgate_log = std::fs::read_to_string(sandbox.join("rollgate.log")).unwrap_or_default();
    assert!(
        status.success(),
        "the tour failed ({status}) after {tour_took:?}:\n{stdout}\n--- stderr ---\n{stderr}\n--- rollgate ---\n{rollgate_log}"
    );
    assert!(
        stdout.contains("held:") && stdout.contains("EtcdNoLeader"),
        "the upgrade was not held by the alert:\n{stdout}"
    );
    assert!(
        stdout.contains("watch exit 3"),
        "the halt was not seen:\n{stdout}"
    );

    // The API server's own view, through the real kubectl: every node at the target,
    // none left cordoned.
    let kubeconfig = sandbox.join("kubeconfig");
    let nodes = kubectl(&kubeconfig, &["get", "nodes"]);
    let nodes = nodes["items"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 7, "1 control plane + 6 workers");
    for node in nodes {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(
            node["status"]["nodeInfo"]["kubeletVersion"], "v1.34.3",
            "{name}"
        );
        assert!(node["spec"]["unschedulable"].is_null(), "{name} cordoned");
    }
    // Each node's own log: one upgrade each; reboots of w1 and w2 only, once each.
    for (name, node_dir) in node_dirs(&sandbox) {
        let spans = lines_of(&node_dir.join("state/upgrade-spans"));
        let starts = spans.iter().filter(|l| l.starts_with("start ")).count();
        assert_eq!(starts, 1, "{name}'s upgrades: {spans:?}");
        let reboots = lines_of(&node_dir.join("state/reboots")).len();
        let wanted = usize::from(name == "w1" || name == "w2");
        assert_eq!(reboots, wanted, "{name}'s reboots");
    }
    // The etcd StatefulSet rolled: every pod at the update revision.
    let sts = kubectl(&kubeconfig, &["get", "statefulset", "etcd"]);
    let update = sts["status"]["updateRevision"].clone();
    for i in 0..3 {
        let pod = kubectl(&kubeconfig, &["get", "pod", &format!("etcd-{i}")]);
        assert_eq!(
            pod["metadata"]["labels"]["controller-revision-hash"], update,
            "etcd-{i}"
        );
    }

    pictures(&sandbox, port, &token).await;

    // Ctrl-C (SIGTERM) stops rollgate, the sandbox and everything it started.
    let alertmanager = env_value(&sandbox, "ALERTMANAGER");
    let api =
        kubectl(&kubeconfig, &["config", "view", "--minify"])["clusters"][0]["cluster"]["server"]
            .as_str()
            .expect("the API server's address")
            .to_owned();
    let status = serve.stop();
    let out = serve.output();
    assert!(
        out.contains("stopped: rollgate and the sandbox"),
        "{status}: {out}"
    );
    for address in [
        format!("127.0.0.1:{port}"),
        alertmanager.trim_start_matches("http://").to_owned(),
        api.trim_start_matches("https://").to_owned(),
    ] {
        assert!(refuses(&address), "{address} still answers after the stop");
    }
    eprintln!(
        "scripts/serve.sh up in {:.1} s ({sandbox_up}); the tour took {:.1} s",
        up_in.as_secs_f64(),
        tour_took.as_secs_f64()
    );
}

/// Where the README's and the handbook's pictures of the sandbox are.
fn images() -> PathBuf {
    root().join("docs/src/images")
}

/// What a picture of the status page shows, in words: the banner, the run's heading, the
/// page's sections and stages, each node's state, and what holds the run. A picture whose
/// words differ from the page's now is stale.
async fn facts(browser: &Browser) -> String {
    let seen = browser
        .script(
            r#"const all = (css) => [...document.querySelectorAll(css)];
            const text = (id) => (document.getElementById(id) || {}).textContent || '';
            return {
              banner: text('banner'),
              heading: (document.querySelector('main h1') || {}).textContent || '',
              sections: all('main h2').map((h) => h.textContent),
              stages: all('.stage h3').map((h) => h.firstChild.textContent.trim()),
              nodes: all('.node').map((n) => [n.dataset.node, n.querySelector('.state').textContent]),
              held: text('run-blockers'),
            };"#,
        )
        .await;
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let nodes: Vec<String> = seen["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    format!(
                        "{} {}",
                        n[0].as_str().unwrap_or_default(),
                        n[1].as_str().unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "banner: {}\nheading: {}\nsections: {}\nstages: {}\nnodes: {}\nheld: {}\n",
        seen["banner"].as_str().unwrap_or_default(),
        seen["heading"].as_str().unwrap_or_default(),
        list(&seen["sections"]).join(" | "),
        list(&seen["stages"]).join(" | "),
        nodes.join(", "),
        seen["held"].as_str().unwrap_or_default(),
    )
}

/// Takes the picture `name` of the page as it is now, and checks that its words are the
/// ones the committed picture was taken with. `ROLLGATE_PICTURES=write` replaces the
/// committed picture and its words instead.
async fn picture(browser: &Browser, name: &str) {
    let words = facts(browser).await;
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.png"));
    browser.screenshot(&shot).await;
    let committed = images().join(format!("{name}.txt"));
    if std::env::var("ROLLGATE_PICTURES").as_deref() == Ok("write") {
        std::fs::create_dir_all(images()).expect("images");
        std::fs::copy(&shot, images().join(format!("{name}.png"))).expect("the picture");
        std::fs::write(&committed, &words).expect("its words");
        return;
    }
    let before = std::fs::read_to_string(&committed).unwrap_or_default();
    assert_eq!(
        words,
        before,
        "the status page no longer shows what docs/src/images/{name}.png shows (this run's \
         picture: {}); if the change is meant, ROLLGATE_PICTURES=write cargo test --test \
         sandbox replaces it",
        shot.display()
    );
}

/// Posts `alertname` to the sandbox's Alertmanager, firing or (with `resolved`) ended.
async fn alert(alertmanager: &str, alertname: &str, resolved: bool) {
    let now = chrono::Utc::now();
    let ends = if resolved {
        now
    } else {
        now + chrono::Duration::hours(1)
    };
    let body = serde_json::json!([{
        "labels": {"alertname": alertname, "upgrade_gate": "true", "severity": "critical"},
        "startsAt": (now - chrono::Duration::seconds(1)).to_rfc3339(),
        "endsAt": ends.to_rfc3339(),
    }]);
    let r = reqwest::Client::new()
        .post(format!("{alertmanager}/api/v2/alerts"))
        .json(&body)
        .send()
        .await
        .expect("alertmanager");
    assert!(r.status().is_success(), "alertmanager: {}", r.status());
}

/// The pictures of the README and the handbook, taken in Chromium while the sandbox
/// reboots w3..w6: the run held by an alert, a batch in hand, the run finished.
async fn pictures(sandbox: &Path, port: u16, token: &str) {
    let base = format!("http://127.0.0.1:{port}");
    // Chromium starts and logs in before the run is asked for: the run halts
    // gate.halt_after (15 s in the sandbox) after its gate closed, and a loaded machine can
    // take that long to start a browser.
    let browser = Browser::start(1280, 900).await;
    browser.goto(&format!("{base}/ui")).await;
    browser
        .wait_text("#login-form h1", "the login", WAIT, |t| !t.is_empty())
        .await;
    browser.type_into("#token", token).await;
    browser.click("#login").await;
    browser
        .wait_text("main h1", "the runs list", WAIT, |t| t == "Runs")
        .await;

    let nodes = node_dirs(sandbox);
    for (name, dir) in &nodes {
        if ["w3", "w4", "w5", "w6"].contains(&name.as_str()) {
            std::fs::write(dir.join("state/reboot-required"), "").expect("sentinel");
        }
        // The second batch takes 4 s to come back, long enough to be seen in hand.
        if ["w5", "w6"].contains(&name.as_str()) {
            std::fs::write(dir.join("state/reboot-delay"), "4").expect("delay");
        }
    }
    let alertmanager = env_value(sandbox, "ALERTMANAGER");
    alert(&alertmanager, "EtcdNoLeader", false).await;
    let http = reqwest::Client::new();
    // The alert reaches rollgate and closes its gate before the run is asked for.
    support::eventually(
        "the gate closed by the alert",
        Duration::from_secs(30),
        || async {
            let gate: Value = http
                .get(format!("{base}/v1/gates"))
                .bearer_auth(token)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (gate["verdict"]["verdict"] == "closed").then_some(())
        },
    )
    .await;
    let asked_at = Instant::now();
    let asked: Value = http
        .post(format!("{base}/v1/reboots"))
        .bearer_auth(token)
        .json(&serde_json::json!({"reason": "the handbook's pictures"}))
        .send()
        .await
        .expect("reboots")
        .json()
        .await
        .expect("json");
    let id = asked["run_id"].as_str().expect("a run").to_owned();
    let id_json = serde_json::to_string(&id).expect("an id");
    browser
        .script(&format!(
            "location.hash = '#/runs/' + encodeURIComponent({id_json}); return null;"
        ))
        .await;
    support::eventually("the run held by the alert", WAIT, || async {
        let words = facts(&browser).await;
        assert!(
            !words.contains("— halted"),
            "the run halted {:.1} s after it was asked for, before its picture: {words}",
            asked_at.elapsed().as_secs_f64()
        );
        (words.contains("heading: node-reboot — waiting") && words.contains("EtcdNoLeader"))
            .then_some(())
    })
    .await;
    picture(&browser, "sandbox-held").await;

    alert(&alertmanager, "EtcdNoLeader", true).await;
    browser
        .wait_text(".node[data-node='w4'] .state", "w4 done", WAIT, |t| {
            t == "done"
        })
        .await;
    // The second batch in hand: both sent their reboot, and the run waits for their new
    // boots (a moment's "running" between its steps is not the picture).
    support::eventually("the second batch rebooting", WAIT, || async {
        let words = facts(&browser).await;
        (words.contains("heading: node-reboot — waiting")
            && words.contains("w5 rebooting, w6 rebooting"))
        .then_some(())
    })
    .await;
    picture(&browser, "sandbox-batch").await;

    browser
        .wait_text("#run-status", "the run finished", WAIT, |t| {
            t == "succeeded"
        })
        .await;
    picture(&browser, "sandbox-finished").await;
}
