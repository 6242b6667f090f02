//! Records the git commit the binary is built from, for `rollgate --version`:
//! `ROLLGATE_COMMIT` when the build sets it (an image built without `.git`, with
//! `--build-arg ROLLGATE_COMMIT=$(git rev-parse HEAD)`), else `git rev-parse`, else
//! "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=ROLLGATE_COMMIT");
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        println!("cargo:rerun-if-changed={path}");
    }
    let commit = std::env::var("ROLLGATE_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=ROLLGATE_COMMIT={commit}");
}
