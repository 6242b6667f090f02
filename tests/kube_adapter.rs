//! rollgate's kube adapter against the fake API server over HTTPS, where the fake behaves
//! as the API server does and the real kubectl has examined it (tests/fake_apiserver.rs):
//! a concurrent writer between rollgate's read and its cordon, and drains under budgets
//! given as percentages and with `matchExpressions`, judged by the fake's own count.

mod support;

use rollgate::adapters::kube::Kube;
use rollgate::ports::{Cordon, DrainOptions, NodeDrain};
use rollgate::workflows::node_cycle::holds as drain_holds;
use serde_json::{Value, json};
use std::time::Duration;
use support::kube::{Change, FakeKube};

struct Fixture {
    fake: FakeKube,
    kube: Kube,
    _dir: tempfile::TempDir,
}

/// Three workers and rollgate's adapter, over the fake's HTTPS listener.
async fn fixture() -> Fixture {
    let fake = FakeKube::start().await;
    fake.add_namespace("default");
    fake.add_namespace("kube-system");
    for w in ["w1", "w2", "w3"] {
        fake.add_node(w, false, "1.34.2", "1.7.24");
        fake.add_node_agents(w);
    }
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("kubeconfig");
    fake.write_tls_kubeconfig(&path);
    let kube = support::rollgate_kube(&path).await;
    Fixture {
        fake,
        kube,
        _dir: dir,
    }
}

fn options() -> DrainOptions {
    DrainOptions {
        timeout: Duration::from_secs(60),
        retry_every: Duration::from_millis(100),
        grace_period: None,
        own_pod: None,
    }
}

fn names_on(fake: &FakeKube, node: &str) -> Vec<String> {
    let mut names: Vec<String> = fake
        .pods_on(node)
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_write_between_rollgates_read_and_its_cordon_is_retried_and_kept() {
    let f = fixture().await;
    let mut n = 0;
    f.fake
        .write_after_reads_of_node("w1", 2, move |node: &mut Value| {
            n += 1;
            node["metadata"]["labels"]["example.com/other-writer"] = json!(n.to_string());
        });
    let before = f.fake.calls();
    let outcome = f.kube.cordon("w1", "run-1").await.expect("cordon");
    assert_eq!(outcome, Cordon::Ours);

    let calls = f.fake.calls();
    let refused = calls.get("patch node 409").copied().unwrap_or(0)
        - before.get("patch node 409").copied().unwrap_or(0);
    assert_eq!(refused, 2, "both stale patches were refused: {calls:?}");
    let node = f.fake.node("w1");
    assert_eq!(node["spec"]["unschedulable"], true);
    assert_eq!(
        node["metadata"]["annotations"]["rollgate.io/cordoned-by"],
        "run-1"
    );
    assert_eq!(
        node["metadata"]["labels"]["example.com/other-writer"], "2",
        "the other writer's change is kept: {node}"
    );
    let cordons = f
        .fake
        .changes()
        .into_iter()
        .filter(|c| *c == Change::Cordon("w1".into()))
        .count();
    assert_eq!(cordons, 1, "cordoned once");
    // Asked again, rollgate finds its own cordon and writes nothing.
    assert_eq!(f.kube.cordon("w1", "run-1").await.unwrap(), Cordon::Ours);
    assert_eq!(
        f.fake.calls().get("patch node").copied(),
        calls.get("patch node").copied()
    );
}

/// Drains `w1` and checks, from the fake's own records, that the budget was never
/// overrun and every evictable pod went.
async fn drain_within(f: &Fixture, budget: &str, pods: usize) {
    let facts = f.kube.drain_facts("w1").await.expect("facts");
    let holds = drain_holds::holds(&facts.pods, &facts.budgets, &[]);
    assert!(
        holds.is_empty(),
        "the budget lets the drain start: {holds:?}"
    );
    assert_eq!(f.kube.cordon("w1", "run-1").await.unwrap(), Cordon::Ours);
    let report = f.kube.drain("w1", &options()).await.expect("drain");
    assert_eq!(report.evicted, pods);
    let low = f.fake.budget_low(budget).expect("counted");
    assert!(
        low >= 0,
        "the fake's own count went {low} past budget {budget}"
    );
    assert!(
        report.refusals >= 1,
        "the budget made some wait: {report:?}"
    );
    assert_eq!(names_on(&f.fake, "w1"), ["agent-w1", "static-w1"]);
}

#[tokio::test]
async fn a_drain_under_a_max_unavailable_50_percent_budget_never_overruns_it() {
    let f = fixture().await;
    f.fake.add_pods("w1", "web", 4, false);
    f.fake.add_pdb(
        "web",
        json!({"maxUnavailable": "50%", "selector": {"matchLabels": {"app": "web"}}}),
    );
    // The controller brings the status up to date 200 ms after a change: evictions in
    // that time are held by the decrement each one makes.
    f.fake.set_pdb_lag(Duration::from_millis(200));
    f.fake.lock().ready_after = Duration::from_millis(300);
    drain_within(&f, "web", 4).await;
    let evicted: Vec<Change> = f
        .fake
        .changes()
        .into_iter()
        .filter(|c| matches!(c, Change::Evicted { .. }))
        .collect();
    assert_eq!(evicted.len(), 4);
}

/// A server that admits every eviction (never a 429, no budget's status written by the
/// eviction): only rollgate's own reads of the budget keep it. The disruption controller's
/// recount lags 300 ms behind each change, and replacements take 400 ms to be Ready; by
/// the fake's own count the budget is never overrun, and every wait was rollgate's.
#[tokio::test]
async fn a_drain_keeps_the_budget_itself_when_the_server_admits_every_eviction() {
    let f = fixture().await;
    f.fake.add_pods("w1", "web", 4, false);
    f.fake.add_pdb(
        "web",
        json!({"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}),
    );
    f.fake.set_pdb_lag(Duration::from_millis(300));
    {
        let mut s = f.fake.lock();
        s.ready_after = Duration::from_millis(400);
        s.admit_every_eviction = true;
    }
    drain_within(&f, "web", 4).await;
    let refused = f
        .fake
        .changes()
        .into_iter()
        .filter(|c| matches!(c, Change::Refused { .. }))
        .count();
    assert_eq!(
        refused, 0,
        "the server refused nothing: rollgate held every eviction"
    );
}

#[tokio::test]
async fn a_drain_under_a_budget_selecting_with_match_expressions_never_overruns_it() {
    let f = fixture().await;
    f.fake.add_pods("w1", "db", 2, false);
    f.fake.add_pods("w1", "cache", 2, false);
    f.fake.add_pods("w2", "db", 1, false);
    f.fake.add_pods("w1", "other", 1, false);
    f.fake.add_pdb(
        "stores",
        json!({"minAvailable": 4, "selector": {"matchExpressions": [
            {"key": "app", "operator": "In", "values": ["db", "cache"]},
            {"key": "tier", "operator": "DoesNotExist"},
        ]}}),
    );
    f.fake.set_pdb_lag(Duration::from_millis(100));
    f.fake.lock().ready_after = Duration::from_millis(200);
    drain_within(&f, "stores", 5).await;
}

#[tokio::test]
async fn a_large_cluster_is_listed_a_page_at_a_time_and_an_expired_page_lists_again() {
    use rollgate::ports::ClusterRead;
    let f = fixture().await;
    for w in ["w1", "w2", "w3"] {
        f.fake.add_pods(w, "web", 400, false);
    }
    for n in 0..1100 {
        f.fake
            .add_node(&format!("n{n:04}"), false, "1.34.2", "1.7.24");
    }
    let pods = 3 * 400 + 3 * 2;
    let calls = |key: &str| f.fake.calls().get(key).copied().unwrap_or(0);

    let before = calls("list pods");
    let (ready, total) = f.kube.pod_readiness().await.expect("readiness");
    assert_eq!((ready, total), (pods, pods));
    assert_eq!(calls("list pods") - before, 3, "pages of 500");
    let facts = f.kube.facts().await.expect("facts");
    assert_eq!(facts.nodes.len(), 1103);

    // A step about one node reads that node alone: a batch of a hundred does not list
    // the cluster a hundred times.
    let (lists, gets) = (calls("list nodes"), calls("get node"));
    let one = f.kube.node("n0042").await.expect("one node");
    assert_eq!(one.as_ref(), facts.node("n0042"));
    assert_eq!(f.kube.node("gone").await.expect("absent"), None);
    assert_eq!(calls("list nodes"), lists, "{:?}", f.fake.calls());
    assert_eq!(calls("get node") - gets, 2);

    // The continue token expires after the first page: the list starts again and counts
    // nothing twice.
    f.fake.expire_list_after("pods", 1);
    let before = calls("list pods");
    let (ready, total) = f.kube.pod_readiness().await.expect("readiness");
    assert_eq!((ready, total), (pods, pods));
    assert_eq!(calls("list pods 410"), 1, "{:?}", f.fake.calls());
    assert_eq!(
        calls("list pods") - before,
        1 + 1 + 3,
        "a page, the 410, then all again"
    );
}
