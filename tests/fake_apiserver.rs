//! The real `kubectl` examines the fake API server of tests/support/kube: for everything
//! rollgate relies on (lists with selectors and pages, cordon, the three patch types,
//! `/status`, drains under budgets with grace periods, budget status, a StatefulSet
//! rollout, watches across a compaction, Status bodies), what kubectl does against the
//! fake must go as against a real API server.

mod support;

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};
use support::eventually;
use support::kube::{Change, FakeKube};

/// kubectl pointed at the fake's HTTPS listener, with its own discovery cache.
struct Kubectl {
    _dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Kubectl {
    fn new(fake: &FakeKube) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let kubeconfig = dir.path().join("kubeconfig");
        fake.write_tls_kubeconfig(&kubeconfig);
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        Self {
            _dir: dir,
            kubeconfig,
            home,
        }
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", &self.home)
            .env_remove("KUBECONFIG")
            .kill_on_drop(true);
        command
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().await.expect("run kubectl")
    }

    /// Runs kubectl and returns its standard output; panics with its error when it fails.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn json(&self, args: &[&str]) -> Value {
        let text = self.ok(args).await;
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {text}"))
    }

    /// Fails, and returns what kubectl said on standard error.
    async fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            !out.status.success(),
            "kubectl {args:?} should fail: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_owned())
        .collect();
    names.sort();
    names
}

/// The name of a pod of app `app` on `node`.
fn pod_of(fake: &FakeKube, node: &str, app: &str) -> String {
    fake.pods_on(node)
        .into_iter()
        .find(|p| p["metadata"]["labels"]["app"] == app)
        .and_then(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no {app} pod on {node}"))
}

/// One control plane and three workers, each worker with `pods` app=web pods.
async fn cluster(pods: usize) -> FakeKube {
    let fake = FakeKube::start().await;
    fake.add_namespace("default");
    fake.add_namespace("kube-system");
    fake.add_node("cp1", true, "1.34.2", "1.7.24");
    for w in ["w1", "w2", "w3"] {
        fake.add_node(w, false, "1.34.2", "1.7.24");
        fake.add_node_agents(w);
        fake.add_pods(w, "web", pods, false);
    }
    fake
}

#[tokio::test]
async fn kubectl_lists_by_label_and_field_selectors_a_page_at_a_time() {
    let fake = cluster(4).await;
    fake.add_pods("w1", "db", 2, false);
    let kubectl = Kubectl::new(&fake);

    let cps = kubectl
        .json(&[
            "get",
            "nodes",
            "-o",
            "json",
            "-l",
            "node-role.kubernetes.io/control-plane",
        ])
        .await;
    assert_eq!(names(&cps), ["cp1"]);
    let workers = kubectl
        .json(&[
            "get",
            "nodes",
            "-o",
            "json",
            "-l",
            "!node-role.kubernetes.io/control-plane",
        ])
        .await;
    assert_eq!(names(&workers), ["w1", "w2", "w3"]);

    let on_w1 = kubectl
        .json(&[
            "get",
            "pods",
            "-A",
            "-o",
            "json",
            "--field-selector",
            "spec.nodeName=w1",
        ])
        .await;
    assert_eq!(
        on_w1["items"].as_array().unwrap().len(),
        4 + 2 + 2,
        "{on_w1}"
    );
    assert!(
        on_w1["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["spec"]["nodeName"] == "w1")
    );
    // A node's pods come from the fake's index by node: paged, they are the same pods,
    // and with the pods on every other node (a scan) they are all the pods.
    let on_w1_paged = kubectl
        .json(&[
            "get",
            "pods",
            "-A",
            "-o",
            "json",
            "--field-selector",
            "spec.nodeName=w1",
            "--chunk-size",
            "3",
        ])
        .await;
    assert_eq!(names(&on_w1_paged), names(&on_w1));
    let elsewhere = kubectl
        .json(&[
            "get",
            "pods",
            "-A",
            "-o",
            "json",
            "--field-selector",
            "spec.nodeName!=w1",
        ])
        .await;
    let every = kubectl.json(&["get", "pods", "-A", "-o", "json"]).await;
    let mut both = [names(&on_w1), names(&elsewhere)].concat();
    both.sort();
    assert_eq!(both, names(&every));
    let db = kubectl
        .json(&["get", "pods", "-o", "json", "-l", "app in (db)"])
        .await;
    assert_eq!(db["items"].as_array().unwrap().len(), 2);
    let not_web = kubectl
        .json(&[
            "get",
            "pods",
            "-o",
            "json",
            "-l",
            "app!=web,app notin (agent)",
        ])
        .await;
    assert_eq!(names(&not_web).len(), 2, "{not_web}");

    // --chunk-size pages the list: 12 web pods in pages of 5 are 3 requests.
    let before = fake.calls().get("list pods").copied().unwrap_or(0);
    let web = kubectl
        .json(&[
            "get",
            "pods",
            "-o",
            "json",
            "-l",
            "app=web",
            "--chunk-size",
            "5",
        ])
        .await;
    assert_eq!(names(&web).len(), 12);
    let after = fake.calls().get("list pods").copied().unwrap_or(0);
    assert_eq!(after - before, 3, "one request per page of 5");

    // A field the API server does not index is refused, as kubectl expects.
    let refused = kubectl
        .fails(&["get", "pods", "--field-selector", "spec.hostname=w1"])
        .await;
    assert!(
        refused.contains("field label not supported: spec.hostname"),
        "{refused}"
    );
    let missing = kubectl.fails(&["get", "node", "nope"]).await;
    assert!(
        missing.contains("Error from server (NotFound): nodes \"nope\" not found"),
        "{missing}"
    );
}

#[tokio::test]
async fn kubectl_cordons_patches_three_ways_and_keeps_status_apart() {
    let fake = cluster(1).await;
    let kubectl = Kubectl::new(&fake);

    assert!(
        kubectl
            .ok(&["cordon", "w1"])
            .await
            .contains("node/w1 cordoned")
    );
    assert_eq!(fake.node("w1")["spec"]["unschedulable"], true);
    assert!(
        kubectl
            .ok(&["cordon", "w1"])
            .await
            .contains("already cordoned")
    );
    // kubectl asks for a server-side Table and prints its columns.
    let out = kubectl.run(&["get", "nodes", "-v=6"]).await;
    let (table, log) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        !log.contains("Unable to decode server response into a Table"),
        "{log}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("w1") && l.contains("Ready,SchedulingDisabled")),
        "{table}"
    );
    assert!(table.contains("control-plane"), "{table}");
    assert!(
        kubectl
            .ok(&["uncordon", "w1"])
            .await
            .contains("node/w1 uncordoned")
    );
    assert!(fake.node("w1")["spec"]["unschedulable"].is_null());
    let cordons: Vec<Change> = fake
        .changes()
        .into_iter()
        .filter(|c| matches!(c, Change::Cordon(n) | Change::Uncordon(n) if n == "w1"))
        .collect();
    assert_eq!(
        cordons,
        [Change::Cordon("w1".into()), Change::Uncordon("w1".into())]
    );

    // Strategic merge patch merges a list by its key; merge patch replaces it.
    let pod = kubectl
        .json(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector",
            "spec.nodeName=w1",
            "-o",
            "json",
        ])
        .await["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let patch = |kind: &'static str, body: &'static str| {
        let pod = pod.clone();
        let kubectl = &kubectl;
        async move {
            kubectl
                .ok(&["patch", "pod", &pod, "--type", kind, "-p", body])
                .await
        }
    };
    patch(
        "merge",
        r#"{"spec":{"containers":[{"name":"c","image":"x"},{"name":"sidecar","image":"s:1"}]}}"#,
    )
    .await;
    patch(
        "strategic",
        r#"{"spec":{"containers":[{"name":"sidecar","image":"s:2"}]}}"#,
    )
    .await;
    assert_eq!(
        fake.pod(&pod)["spec"]["containers"],
        json!([{"name": "c", "image": "x"}, {"name": "sidecar", "image": "s:2"}]),
        "strategic: merged by name"
    );
    patch(
        "merge",
        r#"{"spec":{"containers":[{"name":"sidecar","image":"s:3"}]}}"#,
    )
    .await;
    assert_eq!(
        fake.pod(&pod)["spec"]["containers"],
        json!([{"name": "sidecar", "image": "s:3"}]),
        "merge: the list replaced"
    );
    kubectl
        .ok(&[
            "patch",
            "node",
            "w2",
            "--type",
            "json",
            "-p",
            r#"[{"op":"add","path":"/metadata/labels/zone","value":"a"}]"#,
        ])
        .await;
    assert_eq!(fake.node("w2")["metadata"]["labels"]["zone"], "a");

    // The main resource ignores status; /status changes nothing else.
    let rv = fake.node("w2")["metadata"]["resourceVersion"].clone();
    kubectl
        .ok(&[
            "patch",
            "node",
            "w2",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"nodeInfo":{"kubeletVersion":"v9.9.9"}}}"#,
        ])
        .await;
    assert_eq!(
        fake.node("w2")["status"]["nodeInfo"]["kubeletVersion"],
        "v1.34.2"
    );
    kubectl
        .ok(&[
            "patch",
            "node",
            "w2",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"unschedulable":true},"status":{"nodeInfo":{"kubeletVersion":"v1.34.5"}}}"#,
        ])
        .await;
    let node = fake.node("w2");
    assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.34.5");
    assert!(node["spec"]["unschedulable"].is_null(), "{node}");
    assert_ne!(node["metadata"]["resourceVersion"], rv);

    // A write based on a stale resourceVersion is refused with 409.
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("w3.json");
    std::fs::write(
        &stale,
        kubectl.ok(&["get", "node", "w3", "-o", "json"]).await,
    )
    .unwrap();
    kubectl.ok(&["label", "node", "w3", "touched=yes"]).await;
    let conflict = kubectl
        .fails(&["replace", "--validate=false", "-f", stale.to_str().unwrap()])
        .await;
    assert!(
        conflict.contains("Error from server (Conflict)")
            && conflict.contains("the object has been modified"),
        "{conflict}"
    );
    assert_eq!(fake.node("w3")["metadata"]["labels"]["touched"], "yes");
}

#[tokio::test]
async fn kubectl_drains_under_a_percentage_budget_waiting_out_429s_and_grace_periods() {
    let fake = FakeKube::start().await;
    fake.add_namespace("default");
    fake.add_namespace("kube-system");
    for w in ["w1", "w2", "w3"] {
        fake.add_node(w, false, "1.34.2", "1.7.24");
        fake.add_node_agents(w);
    }
    fake.add_pods("w1", "web", 4, true);
    fake.add_pdb(
        "web",
        json!({"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "web"}}}),
    );
    fake.add_job_pod("w1", "slow");
    let slow = pod_of(&fake, "w1", "slow");
    fake.ignore_sigterm("default", &slow, 2);
    let kubectl = Kubectl::new(&fake);

    let pdb = kubectl.json(&["get", "pdb", "web", "-o", "json"]).await;
    assert_eq!(pdb["status"]["expectedPods"], 4);
    assert_eq!(pdb["status"]["desiredHealthy"], 2);
    assert_eq!(pdb["status"]["disruptionsAllowed"], 2);

    // Without --ignore-daemonsets, kubectl refuses, as against a real server.
    let refused = kubectl
        .fails(&["drain", "w1", "--delete-emptydir-data"])
        .await;
    assert!(refused.contains("DaemonSet-managed Pods"), "{refused}");

    let started = Instant::now();
    let out = kubectl
        .run(&[
            "drain",
            "w1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=60s",
        ])
        .await;
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("node/w1 drained"), "{stdout}");
    assert!(
        stderr.contains("Cannot evict pod as it would violate the pod's disruption budget"),
        "two of four pods wait for the budget: {stderr}"
    );
    // The slow pod's grace period was waited out, by the API server's own log: kubectl
    // went on asking for the pod for at least its 2 s grace after the eviction was taken
    // (kubectl's 5 s pause after a 429 says nothing of that: it is another pod's).
    let log = fake.requests();
    let pod_path = format!("/api/v1/namespaces/default/pods/{slow}");
    let evicted = log
        .iter()
        .find(|r| r.method == "POST" && r.path == format!("{pod_path}/eviction"))
        .expect("the slow pod's eviction")
        .at;
    let last_look = log
        .iter()
        .filter(|r| r.method == "GET" && r.path.split('?').next() == Some(pod_path.as_str()))
        .map(|r| r.at)
        .max()
        .expect("kubectl waits for the pod to go");
    assert!(
        last_look.duration_since(evicted) >= Duration::from_secs(2),
        "kubectl stopped asking {:?} after the eviction: the grace period was not waited out (drain took {took:?})",
        last_look.duration_since(evicted)
    );
    let left: Vec<String> = fake
        .pods_on("w1")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        left,
        ["agent-w1", "static-w1"],
        "only the DaemonSet and mirror pods stay"
    );
    assert!(fake.calls().get("evict pod 429").copied().unwrap_or(0) >= 1);
    let low = fake.budget_low("web").expect("the budget was counted");
    assert!(low >= 0, "the fake's own count went {low} past the budget");
}

#[tokio::test]
async fn kubectl_reads_budget_status_as_the_disruption_controller_computes_it() {
    let fake = FakeKube::start().await;
    fake.add_namespace("default");
    for w in ["w1", "w2"] {
        fake.add_node(w, false, "1.34.2", "1.7.24");
    }
    fake.add_pods("w1", "web", 3, false);
    fake.add_pods("w2", "web", 3, false);
    fake.add_pods("w2", "db", 2, false);
    let web: Vec<String> = fake
        .pods_on("w1")
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    fake.set_pod_ready(&web[0], false);
    fake.set_pod_phase(&web[1], "Pending");
    fake.add_pdb(
        "web-min",
        json!({"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}}),
    );
    fake.add_pdb(
        "db-max",
        json!({"maxUnavailable": 1, "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "cache"]}]}}),
    );
    fake.set_pdb_lag(Duration::from_millis(300));
    let kubectl = Kubectl::new(&fake);
    let list = kubectl.json(&["get", "pdb", "-o", "json"]).await;
    let by_name = |name: &str| {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .unwrap()["status"]
            .clone()
    };
    let web = by_name("web-min");
    assert_eq!(web["expectedPods"], 6, "{web}");
    assert_eq!(
        web["currentHealthy"], 4,
        "a pod not Ready and a Pending one are not healthy"
    );
    assert_eq!(web["desiredHealthy"], 3);
    assert_eq!(web["disruptionsAllowed"], 1);
    let db = by_name("db-max");
    assert_eq!(db["expectedPods"], 2, "{db}");
    assert_eq!(db["desiredHealthy"], 1);
    assert_eq!(db["disruptionsAllowed"], 1);

    // The status follows a change only after the controller's lag.
    let db_pod = pod_of(&fake, "w2", "db");
    fake.set_pod_ready(&db_pod, false);
    let changed_at = Instant::now();
    eventually(
        "the budget's status to follow",
        Duration::from_secs(5),
        || async {
            let db = kubectl.json(&["get", "pdb", "db-max", "-o", "json"]).await;
            (db["status"]["disruptionsAllowed"] == 0).then_some(())
        },
    )
    .await;
    assert!(changed_at.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn kubectl_waits_for_a_statefulset_rollout_to_complete() {
    let fake = FakeKube::start().await;
    fake.add_namespace("default");
    fake.add_node("w1", false, "1.34.2", "1.7.24");
    fake.add_statefulset("etcd", 3, 0, "rev-1", "rev-1");
    let kubectl = Kubectl::new(&fake);
    let done = kubectl
        .ok(&["rollout", "status", "statefulset/etcd", "--timeout=10s"])
        .await;
    assert!(
        done.contains("partitioned roll out complete: 3 new pods have been updated"),
        "{done}"
    );

    let restarted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = restarted.clone();
    fake.run_statefulset_controller(move |pod| {
        std::thread::sleep(Duration::from_millis(500));
        log.lock().unwrap().push(pod.to_owned());
    });
    fake.change_template("etcd", "rev-2");
    let done = kubectl
        .ok(&["rollout", "status", "statefulset/etcd", "--timeout=30s"])
        .await;
    assert!(
        done.contains("Waiting for partitioned roll out to finish: ")
            && done.contains("partitioned roll out complete: 3 new pods have been updated"),
        "{done}"
    );
    assert_eq!(*restarted.lock().unwrap(), ["etcd-2", "etcd-1", "etcd-0"]);
}

/// Reads kubectl's watch output until `want` has been printed.
async fn printed(lines: &std::sync::Arc<std::sync::Mutex<String>>, want: &str) {
    eventually(
        &format!("kubectl to print {want:?}"),
        Duration::from_secs(10),
        || async { lines.lock().unwrap().contains(want).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn kubectl_watches_go_on_across_a_compaction_and_old_versions_get_410() {
    let fake = cluster(0).await;
    let kubectl = Kubectl::new(&fake);
    let old_rv = fake.node("w1")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    let mut watch = kubectl
        .command(&[
            "get",
            "nodes",
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl get --watch");
    let output = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = output.clone();
    let mut stdout = watch.stdout.take().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf).await {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    printed(&output, "\"type\":\"ADDED\"").await;
    fake.compact();
    fake.edit_node("w2", |n| {
        n["metadata"]["labels"]["after-compaction"] = json!("yes")
    });
    printed(&output, "after-compaction").await;
    assert!(output.lock().unwrap().contains("\"type\":\"MODIFIED\""));
    assert!(watch.try_wait().unwrap().is_none(), "the watch goes on");
    let _ = watch.kill().await;

    // A watch from before the compaction is answered 410 Gone, as a reflector expects.
    let gone = kubectl
        .ok(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes?watch=1&resourceVersion={old_rv}"),
        ])
        .await;
    let event: Value = serde_json::from_str(gone.lines().next().unwrap()).unwrap();
    assert_eq!(event["type"], "ERROR", "{gone}");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");

    // Bookmarks when asked for.
    fake.set_bookmark_every(Duration::from_millis(200));
    let rv = fake.node("w2")["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let marks = kubectl
        .ok(&["get", "--raw", &format!(
            "/api/v1/nodes?watch=1&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=1"
        )])
        .await;
    assert!(marks.contains("\"BOOKMARK\""), "{marks}");
}

#[tokio::test]
async fn the_fake_answers_errors_with_status_bodies_as_the_api_server_does() {
    let fake = cluster(1).await;
    let kubectl = Kubectl::new(&fake);
    let missing = kubectl.ok(&["get", "--raw", "/api/v1/nodes"]).await;
    assert!(missing.contains("\"kind\":\"NodeList\""));
    let out = kubectl.fails(&["get", "statefulset", "nope"]).await;
    assert!(
        out.contains("Error from server (NotFound): statefulsets.apps \"nope\" not found"),
        "{out}"
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("event.json");
    std::fs::write(
        &bad,
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
               "metadata": {"name": "e1", "namespace": "default"},
               "eventTime": "2026-12-01T00:00:00.000000Z", "reportingController": "x",
               "reportingInstance": "x", "action": "A", "reason": "R", "type": "Sideways",
               "regarding": {"kind": "Node", "name": "w1"}})
        .to_string(),
    )
    .unwrap();
    let invalid = kubectl
        .fails(&["create", "--validate=false", "-f", bad.to_str().unwrap()])
        .await;
    assert!(
        invalid.contains("is invalid") && invalid.contains("type"),
        "{invalid}"
    );
}

/// The fake as a program (`cargo run --example fake-apiserver`), built beside this test.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target profile dir");
    profile.join("examples").join("fake-apiserver")
}

#[tokio::test]
async fn the_fake_as_a_program_prints_a_kubeconfig_that_kubectl_uses() {
    let binary = example_binary();
    assert!(
        binary.exists(),
        "{} (cargo test builds examples)",
        binary.display()
    );
    let mut child = tokio::process::Command::new(&binary)
        .args([
            "--nodes",
            "2",
            "--pods-per-node",
            "3",
            "--pdb",
            "maxUnavailable=50%",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("fake-apiserver");
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a first line within 20 s")
        .expect("read")
        .expect("a line");
    let kubeconfig = PathBuf::from(first.trim());
    assert!(kubeconfig.is_file(), "{first}");
    let home = tempfile::tempdir().unwrap();
    let kubectl = |args: &[&str]| {
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .env("HOME", home.path())
            .output()
            .expect("kubectl")
    };
    let nodes: Value =
        serde_json::from_slice(&kubectl(&["get", "nodes", "-o", "json"]).stdout).unwrap();
    assert_eq!(names(&nodes), ["node-1", "node-2"]);
    let pods: Value = serde_json::from_slice(
        &kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector",
            "spec.nodeName=node-2",
            "-o",
            "json",
        ])
        .stdout,
    )
    .unwrap();
    assert_eq!(pods["items"].as_array().unwrap().len(), 3);
    assert!(
        pods["items"][0]["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet",
        "{pods}"
    );
    let pdb: Value =
        serde_json::from_slice(&kubectl(&["get", "pdb", "web", "-o", "json"]).stdout).unwrap();
    assert_eq!(pdb["spec"]["maxUnavailable"], "50%");
    assert_eq!(pdb["status"]["disruptionsAllowed"], 3);
    let drained = kubectl(&["drain", "node-1", "--ignore-daemonsets", "--timeout=60s"]);
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    let _ = child.kill().await;

    // A budget it cannot read is refused, naming it.
    let bad = std::process::Command::new(&binary)
        .args(["--pdb", "maxUnavailable=150%"])
        .output()
        .expect("fake-apiserver");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("0% to 100%"));
}

/// k3s's nodes as the fake keeps them (tests/support/k3s.rs): kubectl reads their roles
/// from the labels, their release as their version, selects the servers by the etcd role,
/// and reads the etcd member each server's annotation names; a merge patch of the kubelet
/// version (what the stub service does on restart) shows in its next read.
#[tokio::test]
async fn kubectl_reads_k3s_nodes_roles_release_and_etcd_member_annotations() {
    use support::k3s::{Distro, label_node};
    let fake = FakeKube::start().await;
    fake.add_node("server-1", true, "1.34.2+k3s1", "1.7.24");
    fake.add_node("agent-1", false, "1.34.2+k3s1", "1.7.24");
    fake.edit_node("server-1", |n| {
        label_node(n, Distro::K3s, true, "server-1-3f2a9c1d")
    });
    fake.edit_node("agent-1", |n| label_node(n, Distro::K3s, false, ""));
    let kubectl = Kubectl::new(&fake);

    let wide = kubectl.ok(&["get", "nodes", "-o", "wide"]).await;
    let row = |name: &str| {
        wide.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {wide}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("server-1")[2], "control-plane,etcd,master", "{wide}");
    assert_eq!(row("server-1")[4], "v1.34.2+k3s1", "{wide}");
    assert_eq!(row("agent-1")[2], "<none>", "{wide}");

    let servers = kubectl
        .ok(&[
            "get",
            "nodes",
            "-l",
            "node-role.kubernetes.io/etcd=true",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(servers.trim(), "node/server-1");
    let member = kubectl
        .ok(&[
            "get",
            "node",
            "server-1",
            "-o",
            r"jsonpath={.metadata.annotations.etcd\.k3s\.cattle\.io/node-name}",
        ])
        .await;
    assert_eq!(member, "server-1-3f2a9c1d");
    let args = kubectl
        .ok(&[
            "get",
            "node",
            "agent-1",
            "-o",
            r"jsonpath={.metadata.annotations.k3s\.io/node-args}",
        ])
        .await;
    assert_eq!(args, r#"["agent"]"#);

    kubectl
        .ok(&[
            "patch",
            "node",
            "agent-1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"nodeInfo":{"kubeletVersion":"v1.34.5+k3s1"}}}"#,
        ])
        .await;
    let version = kubectl
        .ok(&[
            "get",
            "node",
            "agent-1",
            "-o",
            "jsonpath={.status.nodeInfo.kubeletVersion}",
        ])
        .await;
    assert_eq!(version, "v1.34.5+k3s1");
}
