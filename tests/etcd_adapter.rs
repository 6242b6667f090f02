//! The etcd adapter against real 3-member raft clusters on loopback.

mod support;

use rollgate::adapters::etcd::{Etcd, EtcdSettings, MemberStatus};
use std::time::{Duration, Instant};
use support::etcd::Cluster;

fn ok(
    statuses: Vec<Result<MemberStatus, rollgate::adapters::etcd::EtcdError>>,
) -> Vec<MemberStatus> {
    statuses
        .into_iter()
        .map(|s| s.expect("every member answers"))
        .collect()
}

#[tokio::test]
async fn each_member_answers_for_itself_and_all_agree_on_one_leader() {
    let cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    let statuses = ok(etcd.statuses().await);
    let ids: std::collections::BTreeSet<u64> = statuses.iter().map(|s| s.id).collect();
    assert_eq!(
        ids.len(),
        3,
        "one client per member: three different member ids"
    );
    let leader = etcd.leader().await.unwrap();
    assert!(statuses.iter().all(|s| s.leader == leader.id));
    assert!(
        statuses.iter().all(|s| s.version.starts_with("3.")),
        "{statuses:?}"
    );
    let members = etcd.members().await.unwrap();
    let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(members.iter().all(|m| ids.contains(&m.id)));
}

#[tokio::test]
async fn leadership_moves_to_each_follower_with_exactly_one_term_each() {
    let cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    for _ in 0..2 {
        let before = etcd.leader().await.unwrap();
        let follower = ok(etcd.statuses().await)
            .into_iter()
            .find(|s| s.id != before.id)
            .unwrap();
        etcd.move_leader(follower.id, Duration::from_secs(10))
            .await
            .unwrap();
        let after = ok(etcd.statuses().await);
        assert!(after.iter().all(|s| s.leader == follower.id), "{after:?}");
        let term = after.iter().map(|s| s.raft_term).max().unwrap();
        assert_eq!(
            term,
            before.raft_term + 1,
            "one transfer is one term: {after:?}"
        );
    }
    // Moving to the current leader changes nothing.
    let leader = etcd.leader().await.unwrap();
    etcd.move_leader(leader.id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(etcd.leader().await.unwrap().raft_term, leader.raft_term);
}

#[tokio::test]
async fn a_stopped_member_fails_fast_and_the_rest_still_agree() {
    let mut cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    let leader = etcd.leader().await.unwrap();
    let statuses = ok(etcd.statuses().await);
    let follower = statuses.iter().position(|s| s.id != leader.id).unwrap();
    cluster.members[follower].process.stop();
    let started = Instant::now();
    let after = etcd.statuses().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(after[follower].is_err(), "{:?}", after[follower]);
    let err = after[follower].as_ref().unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "127.0.0.1:{}",
            cluster.members[follower].client_port
        )),
        "names the member: {err}"
    );
    assert_eq!(
        etcd.leader().await.unwrap().id,
        leader.id,
        "two of three still agree"
    );

    cluster.members[follower].process.start();
    let back = support::eventually(
        "every member answering again",
        Duration::from_secs(30),
        || async {
            let statuses = etcd.statuses().await;
            statuses.iter().all(Result::is_ok).then(|| ok(statuses))
        },
    )
    .await;
    assert!(
        back.iter().all(|s| s.leader == leader.id),
        "a follower restart changes no leader: {back:?}"
    );
}

#[tokio::test]
async fn a_transfer_to_a_stranger_is_refused() {
    let cluster = Cluster::start(3).await;
    let etcd = cluster.client();
    let err = etcd
        .move_leader(0xdead_beef, Duration::from_secs(3))
        .await
        .unwrap_err();
    assert!(!err.to_string().is_empty());
}

#[tokio::test]
async fn nobody_listening_is_an_error_within_the_timeout() {
    let etcd = Etcd::new(EtcdSettings {
        endpoints: vec![format!("http://127.0.0.1:{}", support::free_port())],
        timeout: Duration::from_millis(500),
        tls: None,
    })
    .unwrap();
    let started = Instant::now();
    assert!(etcd.statuses().await[0].is_err());
    assert!(etcd.leader().await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_tls_cluster_with_client_certificates_answers_and_moves_leadership() {
    let cluster = Cluster::start_tls(3).await;
    let etcd = cluster.client();
    let statuses = ok(etcd.statuses().await);
    let leader = etcd.leader().await.unwrap();
    let follower = statuses.iter().find(|s| s.id != leader.id).unwrap().id;
    etcd.move_leader(follower, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(etcd.leader().await.unwrap().id, follower);

    // Without the client certificate the members refuse; without the CA we refuse them.
    let certs = cluster.tls.clone().unwrap();
    for tls in [
        rollgate::adapters::etcd::EtcdTls {
            ca_file: certs.ca.clone(),
            cert_file: None,
            key_file: None,
            domain: None,
        },
        rollgate::adapters::etcd::EtcdTls {
            ca_file: certs.client_cert.clone(),
            cert_file: Some(certs.client_cert.clone()),
            key_file: Some(certs.client_key.clone()),
            domain: None,
        },
    ] {
        let stranger = Etcd::new(EtcdSettings {
            endpoints: cluster.endpoints(),
            timeout: Duration::from_secs(2),
            tls: Some(tls),
        })
        .unwrap();
        assert!(stranger.statuses().await.iter().all(Result::is_err));
    }
    let missing = rollgate::adapters::etcd::EtcdTls {
        ca_file: "/nonexistent/ca.crt".into(),
        cert_file: None,
        key_file: None,
        domain: None,
    };
    let err = Etcd::new(EtcdSettings {
        endpoints: cluster.endpoints(),
        timeout: Duration::from_secs(2),
        tls: Some(missing),
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("/nonexistent/ca.crt"), "{err}");
}

#[tokio::test]
async fn a_snapshot_over_tls_is_streamed_verified_and_passes_etcdctl() {
    use rollgate::adapters::snapshot::EtcdSnapshots;
    use rollgate::ports::Snapshots;
    let cluster = Cluster::start_tls(3).await;
    let etcd = std::sync::Arc::new(cluster.client());
    // Something to snapshot besides etcd's own keys.
    let mut kv = etcd_client::Client::connect(
        [cluster.endpoints()[0].clone()],
        Some(etcd_client::ConnectOptions::new().with_tls(tls(&cluster))),
    )
    .await
    .expect("client");
    for i in 0..100 {
        kv.put(format!("/registry/k{i}"), vec![b'x'; 512], None)
            .await
            .expect("put");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snaps").join("k8s-upgrade-pre-1.34.5-1.db");
    let info = EtcdSnapshots::new(etcd)
        .save(&path)
        .await
        .expect("snapshot");
    assert_eq!(info.path, path.display().to_string());
    assert!(info.bytes > 50_000, "{info:?}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), info.bytes);
    assert_eq!(info.sha256.len(), 64);
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temp file left: {leftovers:?}");
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&path)
        .output()
        .expect("etcdctl (etcd-client)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(status["totalKey"].as_u64() >= Some(100), "{status}");
}

fn tls(cluster: &Cluster) -> etcd_client::TlsOptions {
    let certs = cluster.tls.as_ref().expect("TLS cluster");
    let read = |p: &std::path::Path| std::fs::read(p).expect("pem");
    etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(&certs.ca)))
        .identity(etcd_client::Identity::from_pem(
            read(&certs.client_cert),
            read(&certs.client_key),
        ))
}
