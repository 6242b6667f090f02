//! The pre-upgrade etcd snapshot: streamed from a member through a temp file, fsynced,
//! checked against the sha256 trailer etcd appends, renamed into place, hashed.

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

use super::etcd::Etcd;
use crate::ports::{Failure, SnapshotError, SnapshotInfo, Snapshots};

/// Length of the sha256 trailer etcd appends to a snapshot stream.
const TRAILER: u64 = 32;
/// A bolt database is a whole number of pages: 512 bytes is the smallest unit etcdctl checks.
const PAGE_UNIT: u64 = 512;

/// Snapshots from an etcd cluster.
pub struct EtcdSnapshots {
    etcd: Arc<Etcd>,
    /// Longest wait for the next chunk of the stream.
    pub chunk_timeout: Duration,
}

impl EtcdSnapshots {
    /// Snapshots from `etcd`'s members (the first that answers).
    pub fn new(etcd: Arc<Etcd>) -> Self {
        let chunk_timeout = etcd.timeout().max(Duration::from_secs(10));
        Self {
            etcd,
            chunk_timeout,
        }
    }

    async fn stream_to(&self, endpoint: &str, tmp: &Path) -> Result<u64, SnapshotError> {
        let fail = |what: &str, e: Box<dyn std::error::Error + Send + Sync>| {
            SnapshotError(Failure {
                what: format!("{what} ({endpoint})"),
                source: Some(e.into()),
            })
        };
        let mut client = self
            .etcd
            .streaming_client(endpoint)
            .await
            .map_err(|e| SnapshotError(Failure::caused("cannot connect", e)))?;
        let mut stream = client
            .snapshot()
            .await
            .map_err(|e| fail("cannot start the snapshot", e.into()))?;
        let mut file = std::fs::File::create(tmp)
            .map_err(|e| fail(&format!("cannot create {}", tmp.display()), e.into()))?;
        let mut written = 0u64;
        loop {
            let next = tokio::time::timeout(self.chunk_timeout, stream.message())
                .await
                .map_err(|_| {
                    fail(
                        "snapshot stream stalled",
                        format!("no data for {:?}", self.chunk_timeout).into(),
                    )
                })?
                .map_err(|e| fail("snapshot stream broke", e.into()))?;
            let Some(chunk) = next else { break };
            file.write_all(chunk.blob())
                .map_err(|e| fail("cannot write the snapshot", e.into()))?;
            written += chunk.blob().len() as u64;
        }
        file.sync_all()
            .map_err(|e| fail("cannot fsync the snapshot", e.into()))?;
        Ok(written)
    }
}

/// Checks the sha256 trailer of a snapshot file and returns the sha256 of the whole file.
pub fn verify_file(path: &Path) -> Result<String, SnapshotError> {
    let fail = |e: std::io::Error| {
        SnapshotError(Failure::caused(
            format!("cannot read {}", path.display()),
            e,
        ))
    };
    let mut file = std::fs::File::open(path).map_err(fail)?;
    let size = file.metadata().map_err(fail)?.len();
    if size <= TRAILER || size % PAGE_UNIT != TRAILER {
        return Err(SnapshotError(Failure::new(format!(
            "{} is {size} bytes: not a database followed by its sha256 (empty or truncated)",
            path.display()
        ))));
    }
    let mut body = Sha256::new();
    let mut whole = Sha256::new();
    let mut left = size - TRAILER;
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        file.read_exact(&mut buf[..want]).map_err(fail)?;
        body.update(&buf[..want]);
        whole.update(&buf[..want]);
        left -= want as u64;
    }
    let mut trailer = [0u8; TRAILER as usize];
    file.read_exact(&mut trailer).map_err(fail)?;
    whole.update(trailer);
    if body.finalize().as_slice() != trailer {
        return Err(SnapshotError(Failure::new(format!(
            "{}: the database does not match its sha256 trailer (corrupt)",
            path.display()
        ))));
    }
    Ok(hex::encode(whole.finalize()))
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[async_trait::async_trait]
impl Snapshots for EtcdSnapshots {
    async fn save(&self, path: &Path) -> Result<SnapshotInfo, SnapshotError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| {
            SnapshotError(Failure::caused(
                format!("cannot create {}", dir.display()),
                e,
            ))
        })?;
        let name = path
            .file_name()
            .map_or_else(|| "snapshot".into(), |n| n.to_string_lossy().into_owned());
        let tmp: PathBuf = dir.join(format!(".{name}.part"));
        let mut last = SnapshotError(Failure::new("no etcd endpoint configured"));
        for endpoint in self.etcd.endpoints() {
            match self.stream_to(endpoint, &tmp).await {
                Ok(bytes) => {
                    let verified = verify_file(&tmp);
                    let sha256 = match verified {
                        Ok(sha) => sha,
                        Err(e) => {
                            let _ = std::fs::remove_file(&tmp);
                            return Err(e);
                        }
                    };
                    std::fs::rename(&tmp, path).map_err(|e| {
                        SnapshotError(Failure::caused(
                            format!("cannot rename into {}", path.display()),
                            e,
                        ))
                    })?;
                    fsync_dir(dir).map_err(|e| {
                        SnapshotError(Failure::caused(
                            format!("cannot fsync {}", dir.display()),
                            e,
                        ))
                    })?;
                    info!(path = %path.display(), bytes, %sha256, endpoint = %endpoint, "etcd snapshot saved");
                    return Ok(SnapshotInfo {
                        path: path.display().to_string(),
                        bytes,
                        sha256,
                    });
                }
                Err(e) => {
                    warn!(error = %crate::error_chain(&e), "snapshot from this member failed; trying the next");
                    let _ = std::fs::remove_file(&tmp);
                    last = e;
                }
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn a_snapshot_is_checked_against_its_trailer() {
        let db = vec![7u8; 1024];
        let mut good = db.clone();
        good.extend_from_slice(&Sha256::digest(&db));
        assert!(verify_file(write(&good).path()).is_ok());

        let mut corrupt = good.clone();
        corrupt[10] = 8;
        let err = verify_file(write(&corrupt).path()).unwrap_err();
        assert!(err.to_string().contains("corrupt"), "{err}");

        let err = verify_file(write(&good[..1000]).path()).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        let err = verify_file(write(b"").path()).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
