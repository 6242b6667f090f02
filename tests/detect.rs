//! `rollgate detect` against the fake API server, a real sshd standing in for the control
//! plane (stub `apt-cache madison` answering from its apt source's minor), a local HTTP
//! server laid out like pkgs.k8s.io, Debian's Pushgateway and a running rollgate (on an
//! `IntakeCluster` of its own, so the site's API server sees only what detect does): every
//! decision branch, the metrics it leaves, the run it asks for, its exit codes, and that
//! it uses nothing of the API its ClusterRole does not grant.

mod support;

use serde_json::{Value, json};
use std::process::Command;
use support::cluster::IntakeCluster;
use support::kube::FakeKube;
use support::manifests::{assert_granted, cluster_role};
use support::nodes::{FakeNode, Packages, SshClient};
use support::rabbit::{self, Names};
use support::services::{Pushgateway, RepoServer};
use support::{Rollgate, eventually};

/// A cluster at `running` (control plane `cp` reachable over SSH, workers `w1`, `w2`),
/// a package repository and a Pushgateway.
struct Site {
    api: FakeKube,
    cp: FakeNode,
    client: SshClient,
    cp_host: String,
    repo: RepoServer,
    push: Pushgateway,
    dir: tempfile::TempDir,
}

impl Site {
    async fn start(running: &str, workers: &[&str]) -> Self {
        Self::start_with(running, workers, Packages::Stubs).await
    }

    /// As [`Site::start`], the control plane's package tools `packages`.
    async fn start_with(running: &str, workers: &[&str], packages: Packages) -> Self {
        let api = FakeKube::start().await;
        api.add_node("cp", true, running, "1.7.20");
        for (i, kubelet) in workers.iter().enumerate() {
            api.add_node(&format!("w{}", i + 1), false, kubelet, "1.7.20");
        }
        let client = SshClient::new();
        let minor = running.rsplit_once('.').unwrap().0;
        let cp = FakeNode::start_with("cp", &api, &client, minor, packages).await;
        let cp_host = cp.host_entry();
        let dir = tempfile::tempdir().unwrap();
        api.write_kubeconfig(&dir.path().join("kubeconfig"));
        Self {
            api,
            cp,
            client,
            cp_host,
            repo: RepoServer::start().await,
            push: Pushgateway::start().await,
            dir,
        }
    }

    /// Runs `rollgate detect` with `extra` settings; (exit code, stdout JSON, stderr).
    fn detect(&self, args: &[&str], extra: &[(&str, String)]) -> (i32, Value, String) {
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
            .arg("detect")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("ROLLGATE__DATA_DIR", self.dir.path().join("data"))
            .env(
                "ROLLGATE__CLUSTER__KUBECONFIG",
                self.dir.path().join("kubeconfig"),
            )
            .env("ROLLGATE__SSH__USER", user)
            .env("ROLLGATE__SSH__KEY_FILE", &self.client.key)
            .env("ROLLGATE__SSH__KNOWN_HOSTS_FILE", &self.client.known_hosts)
            .env("ROLLGATE__SSH__HOSTS", &self.cp_host)
            .env("ROLLGATE__DETECT__REPO_URL", self.repo.url())
            .env("ROLLGATE__DETECT__PUSHGATEWAY_URL", self.push.url())
            .envs(extra.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let report = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        (out.status.code().unwrap_or(-1), report, stderr)
    }

    /// Settings that send the request to `rg` over HTTP.
    fn to(rg: &Rollgate) -> Vec<(&'static str, String)> {
        vec![
            ("ROLLGATE__DETECT__ROLLGATE_URL", rg.base()),
            (
                "ROLLGATE__DETECT__TOKEN_FILE",
                rg.data_dir().join("api-token").display().to_string(),
            ),
        ]
    }

    async fn available(&self) -> Vec<String> {
        self.push.samples("k8s_upgrade_available").await
    }

    /// The detection ClusterRole grants everything detect used.
    fn check_rbac(&self) {
        assert_granted(&cluster_role("rollgate-detect"), &self.api.access());
    }
}

async fn runs(rg: &Rollgate) -> Vec<Value> {
    let (_, runs) = rg.get("/v1/runs").await;
    runs.as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_on_patch_asks_rollgate_for_the_patch_and_pushes_the_availability() {
    let site = Site::start("1.34.2", &["1.34.2", "1.34.2"]).await;
    // The next minor is out, but the patch comes first.
    site.repo.publish("1.35", &["1.35.0-1.1", "1.35.1-1.1"]);
    let upgrades = IntakeCluster::start().await;
    let rg = upgrades.rollgate(&[]).await;
    let (code, report, stderr) = site.detect(&[], &Site::to(&rg));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["findings"]["running"], "1.34.2");
    assert_eq!(report["findings"]["latest_patch"], "1.34.5");
    assert_eq!(report["findings"]["next_minor"]["state"], "not_checked");
    assert_eq!(report["decision"]["decision"], "upgrade");
    assert_eq!(report["decision"]["kind"], "patch");
    assert_eq!(report["decision"]["target"], "1.34.5");
    assert_eq!(report["pushed"], true);
    assert_eq!(report["submitted"]["result"], "created", "{report}");
    let run_id = report["submitted"]["run_id"].as_str().unwrap();

    // The POST arrived at rollgate, which made the run.
    let run = rg.run(run_id).await;
    assert_eq!(run["target"], "1.34.5");
    assert_eq!(run["request"]["kind"], "patch");
    assert_eq!(
        site.available().await,
        [
            "k8s_upgrade_available{instance=\"\",job=\"k8s_version_check\",kind=\"patch\",running=\"1.34.2\",target=\"1.34.5\"} 1"
        ]
    );
    let stamp = site
        .push
        .samples("k8s_version_check_last_run_timestamp")
        .await;
    assert_eq!(stamp.len(), 1, "{stamp:?}");
    let at: f64 = stamp[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        (chrono::Utc::now().timestamp() as f64 - at).abs() < 120.0,
        "{stamp:?}"
    );

    // The same detection again: the run in flight is named, no second run.
    let (code, report, stderr) = site.detect(&[], &Site::to(&rg));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["submitted"]["result"], "in_flight");
    assert_eq!(report["submitted"]["run_id"], run_id);
    assert_eq!(runs(&rg).await.len(), 1);
    site.check_rbac();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_newest_patch_with_the_next_minor_released_asks_for_the_minor_over_amqp() {
    let site = Site::start("1.34.5", &["1.34.5"]).await;
    // A release candidate newer than the releases is not a release.
    site.repo
        .publish("1.35", &["1.35.0-1.1", "1.35.1-1.1", "1.35.2~rc.0-1.1"]);
    let names = Names::unique();
    let env = names.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let upgrades = IntakeCluster::start().await;
    let rg = upgrades.rollgate(&env).await;

    // A dry run decides and pushes, and asks for nothing.
    let (code, report, stderr) = site.detect(&["--dry-run"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["decision"]["kind"], "minor");
    assert_eq!(report["decision"]["target"], "1.35.1");
    assert_eq!(
        report["findings"]["next_minor"],
        json!({"state": "released", "latest": "1.35.1"})
    );
    assert!(report["submitted"].is_null());
    assert_eq!(site.available().await.len(), 1);
    assert!(runs(&rg).await.is_empty(), "a dry run asks for nothing");

    let mut amqp: Vec<(&str, String)> = names
        .env()
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
    amqp.push(("ROLLGATE__DETECT__SUBMIT", "amqp".into()));
    let (code, report, stderr) = site.detect(&[], &amqp);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["submitted"]["result"], "published", "{report}");
    let run = eventually(
        "the published detection makes a run",
        std::time::Duration::from_secs(20),
        || async {
            runs(&rg)
                .await
                .into_iter()
                .find(|r| r["target"] == "1.35.1")
        },
    )
    .await;
    assert_eq!(run["request"]["kind"], "minor");
    rabbit::cleanup(&names).await;
    site.check_rbac();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_to_do_when_the_next_minor_is_unpublished_or_holds_no_release() {
    let site = Site::start("1.34.5", &["1.34.5", "1.34.5"]).await;
    let upgrades = IntakeCluster::start().await;
    let rg = upgrades.rollgate(&[]).await;
    // An availability left from an earlier week must go.
    let (code, report, stderr) = {
        site.repo.publish("1.35", &["1.35.0-1.1"]);
        site.detect(&["--dry-run"], &[])
    };
    assert_eq!(
        (code, &report["decision"]["kind"]),
        (0, &json!("minor")),
        "{stderr}"
    );
    assert_eq!(site.available().await.len(), 1);

    std::fs::remove_dir_all(site.repo.dir.path().join("core:")).unwrap();
    let (code, report, stderr) = site.detect(&[], &Site::to(&rg));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["findings"]["next_minor"]["state"], "not_published");
    assert_eq!(report["decision"]["decision"], "nothing");
    assert!(
        report["decision"]["why"]
            .as_str()
            .unwrap()
            .contains("v1.35 is not published yet"),
        "{report}"
    );
    assert!(report["submitted"].is_null());
    assert!(
        site.available().await.is_empty(),
        "the old availability is gone"
    );
    assert_eq!(
        site.push
            .samples("k8s_version_check_last_run_timestamp")
            .await
            .len(),
        1
    );

    // Published with only a release candidate: still nothing.
    site.repo.publish("1.35", &["1.35.0~rc.1-1.1"]);
    let (code, report, stderr) = site.detect(&[], &Site::to(&rg));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["findings"]["next_minor"]["state"], "no_release");
    assert_eq!(report["decision"]["decision"], "nothing");
    assert!(runs(&rg).await.is_empty(), "nothing was asked for");
    site.check_rbac();
}

/// A control plane on dnf (Debian's own, over rpm repositories built with rpmbuild and
/// createrepo_c): its patches come from dnf's own lists, and the next minor from the rpm
/// repository's own metadata (`repodata/repomd.xml`, then the gzip primary metadata it
/// names); no apt index is published at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_dnf_control_plane_the_next_minor_is_read_from_the_rpm_repositorys_own_metadata() {
    let site = Site::start_with("1.34.5", &["1.34.5"], Packages::Dnf).await;
    let work = tempfile::tempdir().unwrap();
    // The rpm layout of every minor (`/v1.NN/rpm/`, `repodata/` as createrepo_c writes it).
    support::nodes::rpm_repository_in(site.repo.dir.path(), work.path());
    let served = site.repo.dir.path().join("core:/stable:/v1.35");
    assert!(served.join("rpm/repodata/repomd.xml").is_file());
    assert!(!served.join("deb").exists(), "no apt layout to read");
    let (code, report, stderr) = site.detect(&["--dry-run"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["findings"]["latest_patch"], "1.34.5", "{report}");
    assert_eq!(
        report["findings"]["next_minor"]["state"], "released",
        "{report}"
    );
    assert_eq!(
        report["findings"]["next_minor"]["latest"], "1.35.1",
        "{report}"
    );
    assert_eq!(report["decision"]["kind"], "minor", "{report}");
    assert_eq!(report["decision"]["target"], "1.35.1", "{report}");

    // Its next minor taken away: not published, read in the rpm layout.
    std::fs::remove_dir_all(&served).unwrap();
    let (code, report, stderr) = site.detect(&["--dry-run"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        report["findings"]["next_minor"]["state"], "not_published",
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_done_rollout_is_finished_first() {
    let site = Site::start("1.34.5", &["1.34.5", "1.34.3"]).await;
    site.repo.publish("1.35", &["1.35.0-1.1"]);
    let (code, report, stderr) = site.detect(&["--dry-run"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["findings"]["behind"], json!(["w2"]));
    assert_eq!(report["decision"]["kind"], "patch");
    assert_eq!(report["decision"]["target"], "1.34.5");

    // The API server is the running version: kubeadm upgrade apply went through, the
    // control plane's own kubelet did not follow.
    let site2 = Site::start("1.34.3", &["1.34.3"]).await;
    site2.api.set_server_version("1.34.5");
    let (code, report, stderr) = site2.detect(&["--dry-run"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(report["findings"]["running"], "1.34.5");
    assert_eq!(report["findings"]["behind"], json!(["cp", "w1"]));
    assert_eq!(report["decision"]["target"], "1.34.5");
    assert!(
        report["decision"]["why"]
            .as_str()
            .unwrap()
            .contains("finish the rollout"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_have_their_exit_codes_and_ask_for_nothing() {
    let site = Site::start("1.34.5", &["1.34.5"]).await;
    let upgrades = IntakeCluster::start().await;
    let rg = upgrades.rollgate(&[]).await;
    // The package repository is down: the facts are incomplete, nothing is pushed.
    site.repo.stop().await;
    let (code, report, stderr) = site.detect(&[], &Site::to(&rg));
    assert_eq!(code, 3, "{stderr}");
    assert!(report.is_null());
    assert!(stderr.contains("package repository"), "{stderr}");
    assert!(
        site.push
            .samples("k8s_version_check_last_run_timestamp")
            .await
            .is_empty()
    );

    // rollgate refuses the request (wrong token): exit 4, the metrics are pushed anyway.
    let site = Site::start("1.34.2", &["1.34.2"]).await;
    let bad = site.dir.path().join("bad-token");
    std::fs::write(&bad, "not-the-token-0123456789").unwrap();
    let (code, report, stderr) = site.detect(
        &[],
        &[
            ("ROLLGATE__DETECT__ROLLGATE_URL", rg.base()),
            ("ROLLGATE__DETECT__TOKEN_FILE", bad.display().to_string()),
        ],
    );
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("HTTP 401"), "{stderr}");
    assert_eq!(report["pushed"], true);
    assert!(runs(&rg).await.is_empty());

    // A control plane whose OS the node script does not serve: one line naming it and its
    // OS, nothing asked.
    site.cp.runs_os(support::nodes::FLATCAR);
    let (code, report, stderr) = site.detect(&[], &Site::to(&rg));
    assert_eq!(code, 3, "{stderr}");
    assert!(report.is_null(), "{report}");
    assert!(
        stderr.contains(
            "cp runs Flatcar Container Linux by Kinvolk 4081.2.0 (no apt, dnf or zypper): the kubeadm node script supports apt (Debian, Ubuntu), dnf (RHEL, Rocky, Alma, Fedora) and zypper (SUSE, openSUSE) nodes"
        ),
        "{stderr}"
    );
    assert!(runs(&rg).await.is_empty());

    // No cluster configured: a configuration error.
    let out = Command::new(env!("CARGO_BIN_EXE_rollgate"))
        .arg("detect")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ROLLGATE__DATA_DIR", site.dir.path().join("data2"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cluster.kubeconfig"));
}
