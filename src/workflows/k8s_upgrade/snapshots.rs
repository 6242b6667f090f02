//! The pre-upgrade etcd snapshots rollgate keeps in `etcd.snapshot_dir`: its own files
//! (`k8s-upgrade-pre-<version>-<unix time>.db`), the newest `etcd.snapshot_keep` of them,
//! pruned once a new one is verified; and room for the next, asked before it is taken.
//! Files it did not write are never touched.

use std::path::Path;

/// The name of a snapshot taken before the upgrade to `target` at `unix` seconds.
pub fn name(target: impl std::fmt::Display, unix: i64) -> String {
    format!("{PREFIX}{target}-{unix}.db")
}

const PREFIX: &str = "k8s-upgrade-pre-";

/// When the snapshot named `name` was taken, if rollgate named it.
fn taken_at(name: &str) -> Option<i64> {
    let rest = name.strip_prefix(PREFIX)?.strip_suffix(".db")?;
    let (version, unix) = rest.rsplit_once('-')?;
    (!version.is_empty()).then_some(())?;
    unix.parse().ok()
}

/// rollgate's snapshots among `names`, newest first.
pub fn newest_first(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut ours: Vec<(i64, String)> = names
        .into_iter()
        .filter_map(|n| Some((taken_at(&n)?, n)))
        .collect();
    ours.sort_by(|a, b| b.cmp(a));
    ours.into_iter().map(|(_, n)| n).collect()
}

/// The snapshots to remove so that the newest `keep` remain.
pub fn beyond(names: impl IntoIterator<Item = String>, keep: usize) -> Vec<String> {
    newest_first(names).into_iter().skip(keep).collect()
}

/// Whether `free` bytes leave room for the next snapshot, which will be about the size of
/// the `last` one: twice that, for a database that grew since and for what else writes
/// there. `Err` carries the bytes asked for. With no snapshot yet there is nothing to
/// judge by, and writing it is the test.
pub fn room(free: u64, last: Option<u64>) -> Result<(), u64> {
    match last {
        Some(last) if free < last.saturating_mul(2) => Err(last.saturating_mul(2)),
        _ => Ok(()),
    }
}

/// The file names in `dir` (none when it does not exist yet).
pub fn names_in(dir: &Path) -> std::io::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_rollgates_own_snapshots_are_counted_newest_first() {
        let dir = names(&[
            "k8s-upgrade-pre-1.34.5-1700000300.db",
            "k8s-upgrade-pre-1.34.3-1700000100.db",
            "k8s-upgrade-pre-1.35.0-1700000200.db",
            // Not ours, or not finished: never touched.
            ".k8s-upgrade-pre-1.35.1-1700000400.db.part",
            "k8s-upgrade-pre-1.35.1-1700000400.db.bak",
            "k8s-upgrade-pre--1700000500.db",
            "k8s-upgrade-pre-1.35.1-soon.db",
            "etcd-manual-backup.db",
            "lost+found",
        ]);
        assert_eq!(
            newest_first(dir.clone()),
            [
                "k8s-upgrade-pre-1.34.5-1700000300.db",
                "k8s-upgrade-pre-1.35.0-1700000200.db",
                "k8s-upgrade-pre-1.34.3-1700000100.db",
            ]
        );
        let cases: [(usize, &[&str]); 4] = [
            (5, &[]),
            (3, &[]),
            (2, &["k8s-upgrade-pre-1.34.3-1700000100.db"]),
            (
                1,
                &[
                    "k8s-upgrade-pre-1.35.0-1700000200.db",
                    "k8s-upgrade-pre-1.34.3-1700000100.db",
                ],
            ),
        ];
        for (keep, want) in cases {
            assert_eq!(beyond(dir.clone(), keep), want, "keep {keep}");
        }
        assert_eq!(
            name("1.34.5", 1700000300),
            "k8s-upgrade-pre-1.34.5-1700000300.db"
        );
    }

    #[test]
    fn the_next_snapshot_needs_about_twice_the_last_ones_size() {
        let cases = [
            (0, None, Ok(())),
            (100, Some(50), Ok(())),
            (99, Some(50), Err(100)),
            (0, Some(1), Err(2)),
            (u64::MAX, Some(u64::MAX), Ok(())),
            (u64::MAX - 1, Some(u64::MAX), Err(u64::MAX)),
        ];
        for (free, last, want) in cases {
            assert_eq!(room(free, last), want, "{free} free, last {last:?}");
        }
    }
}
