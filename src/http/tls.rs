//! HTTPS for the listener: the certificate and key (and, for mutual TLS, the client CA)
//! read from files and read again when they change, so that cert-manager's in-place
//! renewal takes effect without a restart. A file that cannot be read or does not parse
//! keeps the previous certificate in service (a renewal half-written is not an outage).

use rustls::RootCertStore;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How often the files are looked at again.
pub const RELOAD_EVERY: Duration = Duration::from_millis(500);

/// The files TLS is served from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// Certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA bundle for client certificates (mutual TLS), PEM.
    pub client_ca: Option<PathBuf>,
}

/// Why the TLS files cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {path} ({key}): {source}")]
    Read {
        /// The setting naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file does not hold what it should.
    #[error("{path} ({key}): {problem}")]
    Content {
        /// The setting naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
}

/// What was read from the files, with the bytes it came from (to notice a change).
struct Loaded {
    bytes: Vec<Vec<u8>>,
    key: Arc<CertifiedKey>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

/// The certificate in service and the client verifier, swapped when the files change.
pub struct Tls {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<Loaded>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_owned(),
        source,
    })
}

fn content(key: &'static str, path: &Path, problem: impl std::fmt::Display) -> TlsError {
    TlsError::Content {
        key,
        path: path.to_owned(),
        problem: problem.to_string(),
    }
}

impl Tls {
    /// Reads the files; an error names the file and the setting.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let loaded = load(&files, &provider)?;
        Ok(Arc::new(Self {
            files,
            provider,
            current: RwLock::new(Arc::new(loaded)),
        }))
    }

    /// The server configuration: TLS 1.2 and 1.3, HTTP/1.1, the certificate and client
    /// verifier as they are at each handshake.
    pub fn server_config(self: &Arc<Self>) -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| content("tls_cert_file", &self.files.cert, e))?;
        let builder = if self.files.client_ca.is_some() {
            builder.with_client_cert_verifier(Arc::new(CurrentVerifier(self.clone())))
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_cert_resolver(Arc::new(CurrentCert(self.clone())));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// Reads the files again; swaps in what they hold when it changed and is valid.
    /// Whether a new certificate (or CA) went into service.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let unchanged = {
            let current = self.current.read().map_err(|_| poisoned(&self.files))?;
            files_bytes(&self.files)? == current.bytes
        };
        if unchanged {
            return Ok(false);
        }
        let loaded = load(&self.files, &self.provider)?;
        if let Ok(mut current) = self.current.write() {
            *current = Arc::new(loaded);
        }
        Ok(true)
    }

    /// Re-reads the files every [`RELOAD_EVERY`] until `stop` fires.
    pub async fn watch(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let cert = self.files.cert.clone();
        super::reread_every(RELOAD_EVERY, stop, move || self.reload(), |result| match result {
            Ok(true) => tracing::info!(cert = %cert.display(), "TLS certificate reloaded"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "TLS files changed but cannot be used; the previous certificate stays in service"),
        })
        .await;
    }

    fn loaded(&self) -> Option<Arc<Loaded>> {
        self.current.read().ok().map(|c| c.clone())
    }
}

fn poisoned(files: &TlsFiles) -> TlsError {
    content("tls_cert_file", &files.cert, "internal lock poisoned")
}

fn files_bytes(files: &TlsFiles) -> Result<Vec<Vec<u8>>, TlsError> {
    let mut bytes = vec![
        read("tls_cert_file", &files.cert)?,
        read("tls_key_file", &files.key)?,
    ];
    if let Some(ca) = &files.client_ca {
        bytes.push(read("client_ca_file", ca)?);
    }
    Ok(bytes)
}

fn load(files: &TlsFiles, provider: &Arc<CryptoProvider>) -> Result<Loaded, TlsError> {
    let bytes = files_bytes(files)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes[0])
        .collect::<Result<_, _>>()
        .map_err(|e| content("tls_cert_file", &files.cert, e))?;
    if chain.is_empty() {
        return Err(content(
            "tls_cert_file",
            &files.cert,
            "no PEM certificate in it",
        ));
    }
    let private = PrivateKeyDer::from_pem_slice(&bytes[1]).map_err(|e| {
        content(
            "tls_key_file",
            &files.key,
            format!("no PEM private key: {e}"),
        )
    })?;
    let key = CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        content(
            "tls_key_file",
            &files.key,
            format!(
                "does not fit the certificate in {}: {e}",
                files.cert.display()
            ),
        )
    })?;
    let verifier = match (&files.client_ca, bytes.get(2)) {
        (Some(path), Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| content("client_ca_file", path, e))?;
                roots
                    .add(cert)
                    .map_err(|e| content("client_ca_file", path, e))?;
            }
            if roots.is_empty() {
                return Err(content("client_ca_file", path, "no PEM certificate in it"));
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| content("client_ca_file", path, e))?;
            Some(verifier)
        }
        _ => None,
    };
    Ok(Loaded {
        bytes,
        key: Arc::new(key),
        verifier,
    })
}

/// Hands each handshake the certificate in service now.
#[derive(Debug)]
struct CurrentCert(Arc<Tls>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.loaded().map(|l| l.key.clone())
    }
}

/// Verifies client certificates against the client CA in service now.
#[derive(Debug)]
struct CurrentVerifier(Arc<Tls>);

impl CurrentVerifier {
    fn inner(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.0
            .loaded()
            .and_then(|l| l.verifier.clone())
            .ok_or_else(|| rustls::Error::General("no client CA in service".into()))
    }
}

impl ClientCertVerifier for CurrentVerifier {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The CA may change under a handshake; clients send their one certificate anyway.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
