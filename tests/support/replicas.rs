//! Several `rollgate serve` replicas: which one is the active worker, and a steady intake
//! load spread over them that counts what was accepted.

use super::{Rollgate, eventually, webhook};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A GET that tolerates a replica that is down.
pub async fn try_get(rg: &Rollgate, path: &str) -> Option<(u16, Value)> {
    let r = rg
        .http
        .get(format!("{}{path}", rg.base()))
        .bearer_auth(&rg.token)
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

/// Which replicas say their worker is the active one.
pub async fn active(replicas: &[Rollgate]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, rg) in replicas.iter().enumerate() {
        let text = match rg
            .http
            .get(format!("{}/metrics", rg.base()))
            .timeout(Duration::from_secs(3))
            .send()
            .await
        {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(_) => continue,
        };
        if text.lines().any(|l| l == "rollgate_worker_active 1") {
            out.push(i);
        }
    }
    out
}

/// The one active replica, once there is exactly one.
pub async fn the_active(replicas: &[Rollgate]) -> usize {
    eventually(
        "exactly one active worker",
        Duration::from_secs(30),
        || async {
            let now = active(replicas).await;
            (now.len() == 1).then(|| now[0])
        },
    )
    .await
}

/// One alert notification posted to `rg`: its status, or `None` when no answer came.
pub async fn post_alert(rg: &Rollgate, fp: &str) -> Option<u16> {
    let r = rg
        .http
        .post(format!("{}/v1/alerts", rg.base()))
        .bearer_auth(&rg.token)
        .json(&webhook(fp))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    Some(r.status().as_u16())
}

/// What one posting loop saw: the fingerprints answered 2xx, and the 503s (each of which
/// carried a Retry-After).
#[derive(Debug, Default)]
pub struct Posted {
    pub accepted: Vec<String>,
    pub refused: Vec<String>,
}

/// Posts alerts to `rg` one after another until `stop`, fingerprints `{tag}{n}`. Anything
/// but a 2xx or a 503 with Retry-After fails the test.
pub fn intake_load(
    rg: &Rollgate,
    tag: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Posted> {
    let (base, token, http) = (rg.base(), rg.token.clone(), rg.http.clone());
    tokio::spawn(async move {
        let mut posted = Posted::default();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            let fp = format!("{tag}{i:05}");
            i += 1;
            let answer = http
                .post(format!("{base}/v1/alerts"))
                .bearer_auth(&token)
                .json(&webhook(&fp))
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            match answer {
                Ok(r) if r.status().is_success() => posted.accepted.push(fp),
                Ok(r) if r.status().as_u16() == 503 => {
                    assert!(
                        r.headers().get("retry-after").is_some(),
                        "{fp}: 503 without Retry-After"
                    );
                    posted.refused.push(fp);
                    // A client told to retry later does not hammer.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => panic!("{fp}: {other:?}"),
            }
        }
        posted
    })
}

/// Waits until every fingerprint in `accepted` is on the alert board as `rg` sees it,
/// each received exactly once; returns the board's fingerprints.
pub async fn all_on_the_board_once(
    rg: &Rollgate,
    accepted: &[String],
    deadline: Duration,
) -> std::collections::HashMap<String, u64> {
    let board = eventually("every 2xx'd alert on the board", deadline, || async {
        let (status, board) = try_get(rg, "/v1/alerts").await?;
        if status != 200 {
            return None;
        }
        let seen: std::collections::HashMap<String, u64> = board
            .as_array()?
            .iter()
            .filter_map(|e| {
                Some((
                    e["alert"]["fingerprint"].as_str()?.to_owned(),
                    e["received"].as_u64().unwrap_or_default(),
                ))
            })
            .collect();
        accepted
            .iter()
            .all(|fp| seen.contains_key(fp))
            .then_some(seen)
    })
    .await;
    for fp in accepted {
        assert_eq!(board[fp], 1, "{fp} received {} times", board[fp]);
    }
    board
}
