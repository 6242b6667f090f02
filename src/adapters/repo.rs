//! The Kubernetes package repository, laid out like pkgs.k8s.io: one repository per minor,
//! `<base>/v1.NN/deb/`, whose `Release` file exists once the minor is published and whose
//! `Packages` index lists every package version.

use std::time::Duration;

use crate::domain::facts::Minor;
use crate::domain::version::{Version, debian_release};
use crate::ports::{Failure, PackageRepository, RepoError};

/// Largest `Packages` index read (a minor's index is a few hundred KB).
const MAX_INDEX_BYTES: usize = 32 << 20;

/// The repository at a base URL.
pub struct PackageRepo {
    base: String,
    http: reqwest::Client,
}

impl PackageRepo {
    /// The repository under `base` (e.g. `https://pkgs.k8s.io/core:/stable:`).
    pub fn new(base: &str, timeout: Duration) -> Result<Self, RepoError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| repo_error(base, e))?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            http,
        })
    }

    fn url(&self, minor: Minor, file: &str) -> String {
        format!("{}/{minor}/deb/{file}", self.base)
    }
}

fn repo_error(url: &str, error: reqwest::Error) -> RepoError {
    RepoError {
        what: "package repository",
        url: url.to_owned(),
        failure: Failure::caused("no answer", error.without_url()),
    }
}

fn repo_refused(url: &str, what: impl Into<String>) -> RepoError {
    RepoError {
        what: "package repository",
        url: url.to_owned(),
        failure: Failure::new(what),
    }
}

#[async_trait::async_trait]
impl PackageRepository for PackageRepo {
    async fn published(&self, minor: Minor) -> Result<bool, RepoError> {
        let url = self.url(minor, "Release");
        let response = self
            .http
            .head(&url)
            .send()
            .await
            .map_err(|e| repo_error(&url, e))?;
        match response.status().as_u16() {
            200..=299 => Ok(true),
            // pkgs.k8s.io answers 403 for paths that do not exist, like S3.
            403 | 404 => Ok(false),
            other => Err(repo_refused(&url, format!("HTTP {other}"))),
        }
    }

    async fn releases(&self, minor: Minor) -> Result<Vec<Version>, RepoError> {
        let url = self.url(minor, "Packages");
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| repo_error(&url, e))?;
        if !response.status().is_success() {
            return Err(repo_refused(&url, format!("HTTP {}", response.status())));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_INDEX_BYTES as u64)
        {
            return Err(repo_refused(&url, "the index is larger than 32 MiB"));
        }
        let body = response.bytes().await.map_err(|e| repo_error(&url, e))?;
        if body.len() > MAX_INDEX_BYTES {
            return Err(repo_refused(&url, "the index is larger than 32 MiB"));
        }
        Ok(packages_releases(&String::from_utf8_lossy(&body)))
    }
}

/// The kubeadm releases in an apt `Packages` index (stanzas of `Package:` and `Version:`).
pub fn packages_releases(index: &str) -> Vec<Version> {
    let mut out = Vec::new();
    for stanza in index.split("\n\n") {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        if field("Package:") == Some("kubeadm")
            && let Some(v) = field("Version:").and_then(debian_release)
        {
            out.push(v);
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packages_index_gives_kubeadm_releases_without_pre_releases() {
        let index = "Package: kubeadm\nVersion: 1.35.0~rc.1-1.1\nArchitecture: amd64\n\n\
                     Package: kubectl\nVersion: 1.35.2-1.1\n\n\
                     Package: kubeadm\nVersion: 1.35.1-1.1\n\n\
                     Package: kubeadm\nArchitecture: arm64\nVersion: 1.35.0-1.1\n";
        let v = |s: &str| Version::parse(s).expect("a version");
        assert_eq!(packages_releases(index), vec![v("1.35.0"), v("1.35.1")]);
        assert!(packages_releases("Package: kubeadm\nVersion: 1.35.0~rc.0-1.1\n").is_empty());
    }
}
