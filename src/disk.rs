//! The disk under `data_dir`: intake keeps a reserve of free space there, so that a disk
//! filling up stops new work before the store cannot record the progress of the runs in
//! hand.

use std::path::{Path, PathBuf};

/// Free space below the reserve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the disk under {dir} has {} free, below queue.min_free_bytes ({}); free some space there",
    human(*free),
    human(*reserve)
)]
pub struct LowDisk {
    /// The directory whose filesystem is short.
    pub dir: PathBuf,
    /// Bytes free for an unprivileged writer.
    pub free: u64,
    /// The reserve asked for.
    pub reserve: u64,
}

/// The reserve of free space intake keeps under a directory.
#[derive(Debug, Clone)]
pub struct Reserve {
    dir: PathBuf,
    bytes: u64,
}

impl Reserve {
    /// `bytes` to keep free under `dir`; 0 keeps none.
    pub fn new(dir: impl Into<PathBuf>, bytes: u64) -> Self {
        Self {
            dir: dir.into(),
            bytes,
        }
    }

    /// Whether the reserve is there. A filesystem that cannot be asked counts as short
    /// (fail closed): intake refuses rather than risk a half-written store.
    pub fn check(&self) -> Result<(), LowDisk> {
        if self.bytes == 0 {
            return Ok(());
        }
        let free = free_bytes(&self.dir).unwrap_or(0);
        verdict(&self.dir, free, self.bytes)
    }
}

/// Whether `free` bytes under `dir` keep the `reserve`.
fn verdict(dir: &Path, free: u64, reserve: u64) -> Result<(), LowDisk> {
    if free >= reserve {
        Ok(())
    } else {
        Err(LowDisk {
            dir: dir.to_owned(),
            free,
            reserve,
        })
    }
}

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// `bytes` for a person: `512 B`, `3.1 MiB`, `2.0 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_holds_at_or_above_it_and_names_both_below() {
        let dir = Path::new("/data");
        let cases = [
            (64, 64, true),
            (65, 64, true),
            (63, 64, false),
            (0, 1, false),
            (0, 0, true),
        ];
        for (free, reserve, ok) in cases {
            assert_eq!(
                verdict(dir, free, reserve).is_ok(),
                ok,
                "{free} free, {reserve}"
            );
        }
        let low = verdict(dir, 3 * 1024 * 1024 + 100_000, 64 * 1024 * 1024).unwrap_err();
        assert_eq!(
            low.to_string(),
            "the disk under /data has 3.1 MiB free, below queue.min_free_bytes (64.0 MiB); free some space there"
        );
    }

    #[test]
    fn sizes_read_in_the_largest_unit_below_them() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (64 << 20, "64.0 MiB"),
            (5 << 30, "5.0 GiB"),
            (u64::MAX, "16777216.0 TiB"),
        ];
        for (bytes, want) in cases {
            assert_eq!(human(bytes), want);
        }
    }

    #[test]
    fn a_real_directory_has_free_space_and_a_missing_one_fails_closed() {
        let dir = std::env::temp_dir();
        assert!(free_bytes(&dir).is_ok_and(|b| b > 0));
        assert!(Reserve::new(&dir, 1).check().is_ok());
        let missing = dir.join("rollgate-no-such-dir/x");
        assert!(Reserve::new(&missing, 1).check().is_err());
        assert!(Reserve::new(&missing, 0).check().is_ok());
    }
}
