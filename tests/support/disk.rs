//! A small filesystem of its own for a test (a size-limited tmpfs, mounted as root, as
//! CI runs), to fill up and free again; unmounted when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct SmallDisk {
    /// Where it is mounted.
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a tmpfs of `mib` MiB.
    pub fn mount(mib: u64) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("mount");
        assert!(
            status.success(),
            "cannot mount a {mib} MiB tmpfs at {}",
            path.display()
        );
        Self { path, _dir: dir }
    }

    /// Fills every free byte with a file named `filler`; returns the bytes it took.
    pub fn fill(&self) -> u64 {
        let mut file = std::fs::File::create(self.filler()).expect("filler");
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        for size in [chunk.len(), 4096, 1] {
            while file.write_all(&chunk[..size]).is_ok() {
                written += size as u64;
            }
        }
        assert!(
            self.free() < 4096,
            "{} bytes still free after filling",
            self.free()
        );
        written
    }

    /// Removes what [`SmallDisk::fill`] wrote.
    pub fn unfill(&self) {
        std::fs::remove_file(self.filler()).expect("remove the filler");
    }

    /// Bytes free now.
    pub fn free(&self) -> u64 {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.path)
            .output()
            .expect("df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df's answer")
    }

    fn filler(&self) -> PathBuf {
        self.path.join("filler")
    }

    /// `name` under the mount.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
