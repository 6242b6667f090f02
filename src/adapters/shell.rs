//! Operators' commands for etcd members, run by `sh -c` on this machine with a bound.

use std::time::Duration;
use tokio::process::Command;

use crate::ports::{Failure, MemberCommand};

/// Runs member commands, each ended after `timeout`.
pub struct Shell {
    /// Bound on one command; it is killed after this.
    pub timeout: Duration,
}

#[async_trait::async_trait]
impl MemberCommand for Shell {
    async fn run(&self, template: &str, name: &str, endpoint: &str) -> Result<bool, Failure> {
        let script = template
            .replace("{name}", name)
            .replace("{endpoint}", endpoint);
        let mut child = Command::new("sh");
        child
            .arg("-c")
            .arg(&script)
            .env("ROLLGATE_MEMBER", name)
            .env("ROLLGATE_ENDPOINT", endpoint)
            .kill_on_drop(true);
        match tokio::time::timeout(self.timeout, child.status()).await {
            Ok(Ok(status)) => Ok(status.success()),
            Ok(Err(e)) => Err(Failure::caused(format!("cannot run {script:?}"), e)),
            Err(_) => Err(Failure::new(format!(
                "{script:?} did not finish within {:?}",
                self.timeout
            ))),
        }
    }
}
