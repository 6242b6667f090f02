//! The reqwest client the HTTP sources share (the gate's Prometheus and Alertmanager, and
//! rollgate's own API for detect and the CLI): connect and request timeouts, and the
//! optional bearer token, basic auth, CA and client certificate, each read from a file
//! (never a value).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How to reach one HTTP source; `section` prefixes the keys named in errors
/// (`gate.` or `gate.alertmanager_`).
pub struct HttpSource<'a> {
    /// The key prefix of these settings, for messages.
    pub section: &'a str,
    /// Connect and request timeout.
    pub timeout: Duration,
    /// File with a bearer token.
    pub bearer_token_file: Option<&'a PathBuf>,
    /// Basic-auth user.
    pub basic_auth_user: Option<&'a String>,
    /// File with the basic-auth password.
    pub basic_auth_password_file: Option<&'a PathBuf>,
    /// PEM CA bundle to trust over HTTPS.
    pub ca_file: Option<&'a PathBuf>,
    /// PEM client certificate and its key, for mutual TLS.
    pub identity: Option<(&'a PathBuf, &'a PathBuf)>,
}

/// Why a client could not be built; names the key, never a secret.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(pub String);

fn read_secret(path: &Path, key: &str) -> Result<String, BuildError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| BuildError(format!("cannot read {key} {}: {e}", path.display())))
}

fn sensitive(value: String, what: &str) -> Result<reqwest::header::HeaderValue, BuildError> {
    let mut value = reqwest::header::HeaderValue::from_str(&value)
        .map_err(|_| BuildError(format!("the {what} has characters a header cannot carry")))?;
    value.set_sensitive(true);
    Ok(value)
}

impl HttpSource<'_> {
    /// The client: every request bounded by `timeout`.
    pub fn client(&self) -> Result<reqwest::Client, BuildError> {
        self.builder()?
            .timeout(self.timeout)
            .build()
            .map_err(|e| BuildError(e.to_string()))
    }

    /// The client's builder with everything but the bound on whole requests (a stream
    /// stays open): connecting is bounded by `timeout`.
    pub fn builder(&self) -> Result<reqwest::ClientBuilder, BuildError> {
        let key = |name: &str| format!("{}{name}", self.section);
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(path) = self.bearer_token_file {
            let token = read_secret(path, &key("bearer_token_file"))?;
            headers.insert(
                reqwest::header::AUTHORIZATION,
                sensitive(format!("Bearer {token}"), "bearer token")?,
            );
        }
        if let (Some(user), Some(path)) = (self.basic_auth_user, self.basic_auth_password_file) {
            let password = read_secret(path, &key("basic_auth_password_file"))?;
            headers.insert(
                reqwest::header::AUTHORIZATION,
                sensitive(
                    format!("Basic {}", base64_auth::encode(user, &password)),
                    "basic-auth credentials",
                )?,
            );
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(self.timeout)
            .default_headers(headers);
        let read = |path: &PathBuf, name: &str| {
            std::fs::read(path).map_err(|e| {
                BuildError(format!("cannot read {} {}: {e}", key(name), path.display()))
            })
        };
        if let Some(path) = self.ca_file {
            let cert = reqwest::Certificate::from_pem(&read(path, "ca_file")?)
                .map_err(|e| BuildError(format!("{}: {e}", key("ca_file"))))?;
            builder = builder.add_root_certificate(cert);
        }
        if let Some((cert_file, key_file)) = self.identity {
            let mut pem = read(cert_file, "cert_file")?;
            pem.push(b'\n');
            pem.extend(read(key_file, "key_file")?);
            let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                BuildError(format!("{} and {}: {e}", key("cert_file"), key("key_file")))
            })?;
            builder = builder.identity(identity);
        }
        Ok(builder)
    }
}

/// RFC 7617 basic credentials, without pulling a base64 crate for one header.
mod base64_auth {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(user: &str, password: &str) -> String {
        let input = format!("{user}:{password}");
        let bytes = input.as_bytes();
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn encodes_like_rfc_7617() {
            assert_eq!(
                super::encode("Aladdin", "open sesame"),
                "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
            );
            assert_eq!(super::encode("a", "b"), "YTpi");
            assert_eq!(super::encode("ab", "c"), "YWI6Yw==");
        }
    }
}
