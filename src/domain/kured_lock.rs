//! kured's reboot lock, as kured keeps it in an annotation of its DaemonSet
//! (`weave.works/kured-node-lock` on `kube-system/kured` as shipped): one holder,
//! `{"nodeID", "metadata", "created", "TTL"}`, or with kured's `--concurrency` above 1
//! several, `{"maxOwners", "locks": [...]}`. `TTL` is Go's `time.Duration` (nanoseconds);
//! a lock with a `TTL` above zero is expired once `created + TTL` has passed (kured's
//! `ttlExpired`). rollgate reads the lock to wait for kured and writes it as kured does,
//! so that a kured still running waits for rollgate: the two never take nodes down at once.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `nodeID` rollgate holds kured's lock as; with several owners, `rollgate/2`,
/// `rollgate/3`… fill the other places.
pub const HOLDER: &str = "rollgate";

/// One holder of kured's lock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The node (kured) or tool (rollgate) that holds it.
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// What kured remembers across the reboot (whether the node was cordoned already).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub metadata: Value,
    /// When the lock was taken.
    pub created: DateTime<Utc>,
    /// How long the lock lasts, in nanoseconds; 0 for ever.
    #[serde(rename = "TTL", default)]
    pub ttl_ns: i64,
}

impl Entry {
    fn rollgate(node_id: String, now: DateTime<Utc>) -> Self {
        Self {
            node_id,
            metadata: serde_json::json!({"unschedulable": false}),
            created: now,
            ttl_ns: 0,
        }
    }

    /// Whether the lock has run out at `now` (kured's `ttlExpired`).
    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.ttl_ns > 0
            && now.signed_duration_since(self.created) >= chrono::Duration::nanoseconds(self.ttl_ns)
    }

    /// Whether rollgate holds this place.
    pub fn ours(&self) -> bool {
        self.node_id == HOLDER
            || self
                .node_id
                .strip_prefix(HOLDER)
                .is_some_and(|rest| rest.starts_with('/'))
    }
}

/// kured's lock with several owners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Multi {
    /// How many may hold it at once (kured's `--concurrency`).
    #[serde(rename = "maxOwners")]
    pub max_owners: usize,
    /// The holders.
    #[serde(default)]
    pub locks: Vec<Entry>,
}

/// The annotation's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Lock {
    /// One holder (kured's default).
    Single(Entry),
    /// Several owners.
    Multi(Multi),
}

/// The annotation holds something kured would not have written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("kured's lock annotation is not kured's format ({0})")]
pub struct LockFormatError(String);

impl Lock {
    /// Reads the annotation's value.
    pub fn parse(text: &str) -> Result<Self, LockFormatError> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| LockFormatError(e.to_string()))?;
        let parsed = if value.get("maxOwners").is_some() {
            serde_json::from_value(value).map(Self::Multi)
        } else {
            serde_json::from_value(value).map(Self::Single)
        };
        parsed.map_err(|e| LockFormatError(e.to_string()))
    }

    fn text(&self) -> String {
        match self {
            Self::Single(e) => serde_json::to_string(e),
            Self::Multi(m) => serde_json::to_string(m),
        }
        .unwrap_or_default()
    }
}

/// What taking kured's lock comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Take {
    /// rollgate holds it already: nothing to write.
    Held,
    /// Write this value, and rollgate holds it.
    Write(String),
    /// Others hold it: these nodes, each with when it took the lock.
    Theirs(Vec<(String, DateTime<Utc>)>),
}

/// Taking kured's lock for rollgate at `now`, given the annotation's value (`None`:
/// absent). With several owners rollgate takes every place, so that no kured node can
/// take one while rollgate works.
pub fn take(value: Option<&str>, now: DateTime<Utc>) -> Result<Take, LockFormatError> {
    let lock = value.map(Lock::parse).transpose()?;
    let live = |e: &Entry| !e.expired(now);
    match lock {
        None => Ok(Take::Write(
            Lock::Single(Entry::rollgate(HOLDER.into(), now)).text(),
        )),
        Some(Lock::Single(e)) if e.ours() => Ok(Take::Held),
        Some(Lock::Single(e)) if live(&e) => Ok(Take::Theirs(vec![(e.node_id, e.created)])),
        Some(Lock::Single(_)) => Ok(Take::Write(
            Lock::Single(Entry::rollgate(HOLDER.into(), now)).text(),
        )),
        Some(Lock::Multi(m)) => {
            let theirs: Vec<(String, DateTime<Utc>)> = m
                .locks
                .iter()
                .filter(|e| !e.ours() && live(e))
                .map(|e| (e.node_id.clone(), e.created))
                .collect();
            if !theirs.is_empty() {
                return Ok(Take::Theirs(theirs));
            }
            let places = m.max_owners.max(1);
            let ours = m.locks.iter().filter(|e| e.ours()).count();
            if ours >= places {
                return Ok(Take::Held);
            }
            let locks = (1..=places)
                .map(|i| match i {
                    1 => HOLDER.to_owned(),
                    i => format!("{HOLDER}/{i}"),
                })
                .map(|id| Entry::rollgate(id, now))
                .collect();
            Ok(Take::Write(
                Lock::Multi(Multi {
                    max_owners: m.max_owners,
                    locks,
                })
                .text(),
            ))
        }
    }
}

/// What letting go of kured's lock comes to.
#[derive(Debug, Clone, PartialEq)]
pub enum Release {
    /// rollgate holds no part of it.
    Nothing,
    /// Remove the annotation (kured's single-owner release).
    Remove,
    /// Write this value: the others' places, without rollgate's.
    Write(String),
}

/// Letting go of rollgate's part of kured's lock, given the annotation's value.
pub fn release(value: Option<&str>) -> Result<Release, LockFormatError> {
    match value.map(Lock::parse).transpose()? {
        None => Ok(Release::Nothing),
        Some(Lock::Single(e)) if e.ours() => Ok(Release::Remove),
        Some(Lock::Single(_)) => Ok(Release::Nothing),
        Some(Lock::Multi(mut m)) => {
            let before = m.locks.len();
            m.locks.retain(|e| !e.ours());
            if m.locks.len() == before {
                Ok(Release::Nothing)
            } else {
                Ok(Release::Write(Lock::Multi(m).text()))
            }
        }
    }
}

/// The holders, in words: `kured holds its reboot lock for w2 (since …)`.
pub fn describe(holders: &[(String, DateTime<Utc>)]) -> String {
    let each: Vec<String> = holders
        .iter()
        .map(|(node, since)| format!("{node} (since {})", since.format("%Y-%m-%dT%H:%M:%SZ")))
        .collect();
    format!("kured holds its reboot lock for {}", each.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("a time")
    }

    const NOW: &str = "2026-12-03T12:00:00Z";

    #[test]
    fn taking_the_lock() {
        let now = at(NOW);
        let mine = r#"{"nodeID":"rollgate","metadata":{"unschedulable":false},"created":"2026-12-03T12:00:00Z","TTL":0}"#;
        let cases: Vec<(&str, Option<&str>, Take)> = vec![
            ("absent", None, Take::Write(mine.into())),
            (
                "kured's, for ever",
                Some(r#"{"nodeID":"w2","metadata":{"unschedulable":false},"created":"2026-12-03T11:00:00.123456789Z","TTL":0}"#),
                Take::Theirs(vec![("w2".into(), at("2026-12-03T11:00:00.123456789Z"))]),
            ),
            (
                "kured's, TTL not run out",
                Some(r#"{"nodeID":"w2","created":"2026-12-03T11:30:00Z","TTL":3600000000000}"#),
                Take::Theirs(vec![("w2".into(), at("2026-12-03T11:30:00Z"))]),
            ),
            (
                "kured's, TTL run out exactly",
                Some(r#"{"nodeID":"w2","created":"2026-12-03T11:00:00Z","TTL":3600000000000}"#),
                Take::Write(mine.into()),
            ),
            ("rollgate's", Some(mine), Take::Held),
            (
                "several owners, one kured node",
                Some(r#"{"maxOwners":2,"locks":[{"nodeID":"w3","created":"2026-12-03T11:59:00Z","TTL":0}]}"#),
                Take::Theirs(vec![("w3".into(), at("2026-12-03T11:59:00Z"))]),
            ),
            (
                "several owners, only an expired one",
                Some(r#"{"maxOwners":2,"locks":[{"nodeID":"w3","created":"2026-12-03T10:00:00Z","TTL":60000000000}]}"#),
                Take::Write(r#"{"maxOwners":2,"locks":[{"nodeID":"rollgate","metadata":{"unschedulable":false},"created":"2026-12-03T12:00:00Z","TTL":0},{"nodeID":"rollgate/2","metadata":{"unschedulable":false},"created":"2026-12-03T12:00:00Z","TTL":0}]}"#.into()),
            ),
            (
                "several owners, all rollgate's",
                Some(r#"{"maxOwners":2,"locks":[{"nodeID":"rollgate","created":"2026-12-03T11:00:00Z","TTL":0},{"nodeID":"rollgate/2","created":"2026-12-03T11:00:00Z","TTL":0}]}"#),
                Take::Held,
            ),
            (
                "a node named like rollgate is not rollgate",
                Some(r#"{"nodeID":"rollgate-worker","created":"2026-12-03T11:00:00Z","TTL":0}"#),
                Take::Theirs(vec![("rollgate-worker".into(), at("2026-12-03T11:00:00Z"))]),
            ),
        ];
        for (what, value, want) in cases {
            assert_eq!(take(value, now), Ok(want), "{what}");
        }
        assert!(take(Some("not json"), now).is_err());
        assert!(take(Some(r#"{"created":"x"}"#), now).is_err());
    }

    #[test]
    fn letting_go_of_the_lock() {
        let cases: Vec<(&str, Option<&str>, Release)> = vec![
            ("absent", None, Release::Nothing),
            (
                "rollgate's",
                Some(r#"{"nodeID":"rollgate","created":"2026-12-03T11:00:00Z","TTL":0}"#),
                Release::Remove,
            ),
            (
                "kured's stays",
                Some(r#"{"nodeID":"w2","created":"2026-12-03T11:00:00Z","TTL":0}"#),
                Release::Nothing,
            ),
            (
                "several owners: rollgate's places go, the rest stays",
                Some(r#"{"maxOwners":3,"locks":[{"nodeID":"rollgate","created":"2026-12-03T11:00:00Z","TTL":0},{"nodeID":"w4","created":"2026-12-03T11:00:00Z","TTL":0},{"nodeID":"rollgate/3","created":"2026-12-03T11:00:00Z","TTL":0}]}"#),
                Release::Write(r#"{"maxOwners":3,"locks":[{"nodeID":"w4","created":"2026-12-03T11:00:00Z","TTL":0}]}"#.into()),
            ),
        ];
        for (what, value, want) in cases {
            assert_eq!(release(value), Ok(want), "{what}");
        }
    }
}
