//! Kill -9 of `rollgate serve` between accepting and processing, and in the middle of
//! processing: every event that got a 2xx is processed exactly once. Both backends. The
//! run-making requests are etcd rolls of many StatefulSets (one roll per StatefulSet may
//! be in flight, so each gets its own run), checked against a real etcd member.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;
use support::cluster::IntakeCluster;
use support::rabbit::{self, Names};
use support::{Rollgate, board, eventually, webhook};

const PAUSED: &str = "ROLLGATE__WORKER__PAUSED";

#[derive(Default)]
struct Accepted {
    fingerprints: HashSet<String>,
    runs: HashMap<String, String>,
}

struct Poster {
    base: String,
    token: String,
    http: reqwest::Client,
    endpoints: Vec<String>,
}

impl Poster {
    fn of(rg: &Rollgate, cluster: &IntakeCluster) -> Self {
        Self {
            base: rg.base(),
            token: rg.token.clone(),
            http: reqwest::Client::new(),
            endpoints: cluster.etcd.endpoints(),
        }
    }

    /// Posts alert `i` and the etcd roll of StatefulSet `i`, recording what got a 2xx
    /// into `shared`. Returns false once the server is gone: a request cut off by a kill
    /// is not a 2xx.
    async fn post_pair(&self, tag: &str, i: usize, shared: &tokio::sync::Mutex<Accepted>) -> bool {
        let fp = format!("{tag}{i:05}");
        let Ok(r) = self
            .http
            .post(format!("{}/v1/alerts", self.base))
            .bearer_auth(&self.token)
            .json(&webhook(&fp))
            .send()
            .await
        else {
            return false;
        };
        if r.status().is_success() {
            shared.lock().await.fingerprints.insert(fp);
        }
        let statefulset = format!("sts-{tag}{i:05}");
        let version = format!("default/{statefulset}");
        let roll = serde_json::json!({
            "statefulset": statefulset, "namespace": "default", "endpoints": self.endpoints,
        });
        let Ok(r) = self
            .http
            .post(format!("{}/v1/etcd-rolls", self.base))
            .bearer_auth(&self.token)
            .json(&roll)
            .send()
            .await
        else {
            return false;
        };
        if r.status().is_success() {
            let Ok(body) = r.json::<serde_json::Value>().await else {
                return false;
            };
            shared.lock().await.runs.insert(
                body["run_id"].as_str().unwrap_or_default().to_owned(),
                version,
            );
        }
        true
    }
}

async fn assert_processed_exactly_once(rg: &Rollgate, accepted: &Accepted) {
    let seen = eventually(
        "every accepted alert on the board",
        Duration::from_secs(60),
        || async {
            let seen = board(rg).await;
            accepted
                .fingerprints
                .iter()
                .all(|fp| seen.contains_key(fp))
                .then_some(seen)
        },
    )
    .await;
    for fp in &accepted.fingerprints {
        assert_eq!(seen[fp], 1, "alert {fp} was processed {} times", seen[fp]);
    }
    // Processed: the worker has the run (a StatefulSet the fake API server does not hold
    // fails the roll's first step, which is fine here; the halted roll keeps the cluster's
    // lock, so the rolls after it wait for it, which the worker says in their reason).
    let pending = |runs: Vec<serde_json::Value>| -> Vec<serde_json::Value> {
        runs.into_iter()
            .filter(|r| {
                let waits_for_the_cluster = r["reason"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("waits for run "));
                r["status"].is_null() || (r["status"] == "queued" && !waits_for_the_cluster)
            })
            .collect()
    };
    let start = std::time::Instant::now();
    loop {
        let mut runs = Vec::new();
        for id in accepted.runs.keys() {
            let (status, run) = rg.get(&format!("/v1/runs/{id}")).await;
            runs.push(if status == 200 {
                run
            } else {
                serde_json::json!({"id": id, "missing": status})
            });
        }
        let left = pending(runs);
        if left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} accepted rolls not processed: {:#?}",
            left.len(),
            left.iter().take(3).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (id, version) in &accepted.runs {
        assert_eq!(rg.run(id).await["target"], version.as_str());
    }
    let (_, runs) = rg.get("/v1/runs?limit=1000").await;
    let mut per_target: HashMap<String, usize> = HashMap::new();
    for run in runs.as_array().unwrap() {
        *per_target
            .entry(run["target"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    for version in accepted.runs.values() {
        assert_eq!(
            per_target[version], 1,
            "target {version} has {} runs",
            per_target[version]
        );
    }
}

async fn scenario(env: Vec<(&'static str, String)>) {
    let cluster = IntakeCluster::start().await;
    let env_ref: Vec<(&str, &str)> = env
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain([(PAUSED, "true")])
        .collect();
    let mut rg = cluster.rollgate(&env_ref).await;

    // Accepted, not processed: the worker is paused, then the process dies.
    let shared = tokio::sync::Mutex::new(Accepted::default());
    let poster = Poster::of(&rg, &cluster);
    for i in 0..15 {
        assert!(poster.post_pair("a", i, &shared).await);
    }
    let accepted = shared.into_inner();
    assert_eq!(accepted.fingerprints.len(), 15);
    assert_eq!(accepted.runs.len(), 15);
    assert_eq!(board(&rg).await.len(), 0, "nothing processed while paused");
    rg.kill9();
    rg.remove_env(PAUSED);
    rg.restart().await;
    assert_processed_exactly_once(&rg, &accepted).await;

    // Killed at moments spread over the posting and processing, with requests in flight.
    let mut accepted_b = Accepted::default();
    for round in 0..4u64 {
        let shared = std::sync::Arc::new(tokio::sync::Mutex::new(Accepted::default()));
        let poster = {
            let shared = shared.clone();
            let poster = Poster::of(&rg, &cluster);
            tokio::spawn(async move {
                for i in 0..400 {
                    if !poster
                        .post_pair("b", round as usize * 1000 + i, &shared)
                        .await
                    {
                        break;
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(80 + round * 97)).await;
        rg.kill9();
        poster.await.unwrap();
        let acc = std::mem::take(&mut *shared.lock().await);
        accepted_b.fingerprints.extend(acc.fingerprints);
        accepted_b.runs.extend(acc.runs);
        rg.restart().await;
    }
    assert!(
        accepted_b.fingerprints.len() >= 8 && accepted_b.runs.len() >= 8,
        "the kills must come while events are accepted ({} alerts, {} rolls accepted)",
        accepted_b.fingerprints.len(),
        accepted_b.runs.len()
    );
    assert_processed_exactly_once(&rg, &accepted).await;
    assert_processed_exactly_once(&rg, &accepted_b).await;
}

#[tokio::test]
async fn kill_9_loses_nothing_and_repeats_nothing_embedded() {
    scenario(Vec::new()).await;
}

#[tokio::test]
async fn kill_9_loses_nothing_and_repeats_nothing_amqp() {
    let names = Names::unique();
    scenario(names.env()).await;
    rabbit::cleanup(&names).await;
}
