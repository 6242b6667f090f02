//! The Kubernetes package repository, laid out like pkgs.k8s.io: one repository per minor
//! in two layouts. apt's, `<base>/v1.NN/deb/`, has a `Release` file once the minor is
//! published and a `Packages` index of every package version. dnf's and zypper's,
//! `<base>/v1.NN/rpm/`, has `repodata/repomd.xml`, which names the primary metadata
//! (`…-primary.xml.gz`) that lists every package version.

use std::time::Duration;

use crate::domain::facts::Minor;
use crate::domain::version::{Version, debian_release};
use crate::ports::{Failure, PackageRepository, RepoError, RepoFormat};

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

    fn url(&self, minor: Minor, format: RepoFormat, file: &str) -> String {
        let layout = match format {
            RepoFormat::Deb => "deb",
            RepoFormat::Rpm => "rpm",
        };
        format!("{}/{minor}/{layout}/{file}", self.base)
    }

    /// The body at `url`, at most [`MAX_INDEX_BYTES`].
    async fn fetch(&self, url: &str) -> Result<Vec<u8>, RepoError> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| repo_error(url, e))?;
        if !response.status().is_success() {
            return Err(repo_refused(url, format!("HTTP {}", response.status())));
        }
        if response
            .content_length()
            .is_some_and(|n| n > MAX_INDEX_BYTES as u64)
        {
            return Err(repo_refused(url, "the index is larger than 32 MiB"));
        }
        let body = response.bytes().await.map_err(|e| repo_error(url, e))?;
        if body.len() > MAX_INDEX_BYTES {
            return Err(repo_refused(url, "the index is larger than 32 MiB"));
        }
        Ok(body.to_vec())
    }

    /// The kubeadm releases of `minor`'s rpm repository: its `repomd.xml` names the primary
    /// metadata, read plain or gzip-compressed.
    async fn rpm_releases(&self, minor: Minor) -> Result<Vec<Version>, RepoError> {
        let repomd_url = self.url(minor, RepoFormat::Rpm, "repodata/repomd.xml");
        let repomd = self.fetch(&repomd_url).await?;
        let href = primary_location(&String::from_utf8_lossy(&repomd))
            .ok_or_else(|| repo_refused(&repomd_url, "it names no primary metadata"))?;
        let url = self.url(minor, RepoFormat::Rpm, &href);
        let raw = self.fetch(&url).await?;
        let xml = if href.ends_with(".gz") {
            gunzip(&raw).map_err(|e| repo_refused(&url, format!("not gzip: {e}")))?
        } else if href.ends_with(".xml") {
            raw
        } else {
            return Err(repo_refused(
                &url,
                "the primary metadata is compressed in a way rollgate does not read (it reads .xml and .xml.gz): have the mirror publish gzip (createrepo_c --compress-type gz)",
            ));
        };
        Ok(primary_releases(&String::from_utf8_lossy(&xml)))
    }
}

/// `bytes` gunzipped, at most [`MAX_INDEX_BYTES`] of them.
fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_INDEX_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    if out.len() > MAX_INDEX_BYTES {
        return Err("larger than 32 MiB".into());
    }
    Ok(out)
}

/// The `href` of the primary metadata in a `repomd.xml`, relative to the repository:
/// `<data type="primary"> … <location href="repodata/…-primary.xml.gz"/>`. Only a path
/// inside the repository is taken.
pub fn primary_location(repomd: &str) -> Option<String> {
    let data = repomd
        .split("<data ")
        .skip(1)
        .find(|d| d.starts_with("type=\"primary\""))?;
    let location = data.split("<location ").nth(1)?;
    let href = attribute(location, "href")?;
    let inside = href.starts_with("repodata/")
        && !href.contains("..")
        && href
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b));
    inside.then(|| href.to_owned())
}

/// The value of `name="…"` in a tag's text.
fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let tag = tag.split('>').next()?;
    let start = tag.find(&format!("{name}=\""))? + name.len() + 2;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// The kubeadm releases in rpm primary metadata: each `<package>` named `kubeadm`, its
/// `<version ver="1.35.1" …/>`; pre-releases (`1.35.0~rc.1`) and anything else left out.
pub fn primary_releases(primary: &str) -> Vec<Version> {
    let mut out: Vec<Version> = primary
        .split("<package ")
        .skip(1)
        .filter(|p| p.contains("<name>kubeadm</name>"))
        .filter_map(|p| p.split("<version ").nth(1))
        .filter_map(|tag| attribute(tag, "ver"))
        .filter_map(|ver| Version::parse(ver).ok())
        .collect();
    out.sort();
    out.dedup();
    out
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
    async fn published(&self, minor: Minor, format: RepoFormat) -> Result<bool, RepoError> {
        let file = match format {
            RepoFormat::Deb => "Release",
            RepoFormat::Rpm => "repodata/repomd.xml",
        };
        let url = self.url(minor, format, file);
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

    async fn releases(&self, minor: Minor, format: RepoFormat) -> Result<Vec<Version>, RepoError> {
        match format {
            RepoFormat::Deb => {
                let body = self.fetch(&self.url(minor, format, "Packages")).await?;
                Ok(packages_releases(&String::from_utf8_lossy(&body)))
            }
            RepoFormat::Rpm => self.rpm_releases(minor).await,
        }
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

    /// As createrepo_c writes them (trimmed): repomd.xml names the primary metadata, whose
    /// packages give their versions as attributes.
    #[test]
    fn rpm_metadata_gives_kubeadm_releases_without_pre_releases() {
        let repomd = r#"<?xml version="1.0" encoding="UTF-8"?>
<repomd xmlns="http://linux.duke.edu/metadata/repo" xmlns:rpm="http://linux.duke.edu/metadata/rpm">
  <revision>1733300000</revision>
  <data type="filelists"><location href="repodata/aa-filelists.xml.gz"/></data>
  <data type="primary">
    <checksum type="sha256">0b1e</checksum>
    <location href="repodata/0b1e-primary.xml.gz"/>
    <size>1024</size>
  </data>
</repomd>"#;
        assert_eq!(
            primary_location(repomd).as_deref(),
            Some("repodata/0b1e-primary.xml.gz")
        );
        for bad in [
            r#"<data type="primary"><location href="../../etc/passwd"/></data>"#,
            r#"<data type="primary"><location href="https://elsewhere/primary.xml.gz"/></data>"#,
            r#"<data type="other"><location href="repodata/x.xml.gz"/></data>"#,
        ] {
            assert_eq!(primary_location(bad), None, "{bad}");
        }
        let primary = r#"<metadata xmlns="http://linux.duke.edu/metadata/common" packages="4">
<package type="rpm"><name>kubeadm</name><arch>x86_64</arch><version epoch="0" ver="1.35.1" rel="150500.1.1"/></package>
<package type="rpm"><name>kubectl</name><arch>x86_64</arch><version epoch="0" ver="1.35.2" rel="150500.1.1"/></package>
<package type="rpm"><name>kubeadm</name><arch>aarch64</arch><version epoch="0" ver="1.35.0" rel="150500.1.1"/></package>
<package type="rpm"><name>kubeadm</name><arch>x86_64</arch><version epoch="0" ver="1.35.0~rc.1" rel="150500.1.1"/></package>
</metadata>"#;
        let v = |s: &str| Version::parse(s).expect("a version");
        assert_eq!(primary_releases(primary), vec![v("1.35.0"), v("1.35.1")]);
    }
}
