//! A test certificate authority: server certificates for 127.0.0.1 / localhost and
//! client certificates, written to PEM files the way cert-manager leaves them.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};

/// A CA that signs what the tests need.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's own certificate, PEM.
    pub pem: String,
}

/// A certificate and its key, PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    /// The certificate, DER, to compare with what a server presents.
    pub der: Vec<u8>,
}

/// The files a certificate lives in.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("ca key");
        let cert = params.self_signed(&key).expect("ca cert");
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for 127.0.0.1 and localhost, common name `name`.
    pub fn server(&self, name: &str) -> Issued {
        self.server_for(name, &[])
    }

    /// A server certificate for 127.0.0.1, localhost and `dns_names` (the names a
    /// production client checks, such as `rollgate.rollgate.svc`).
    pub fn server_for(&self, name: &str, dns_names: &[&str]) -> Issued {
        let names = std::iter::once("localhost")
            .chain(dns_names.iter().copied())
            .map(str::to_owned)
            .collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).expect("server params");
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A server certificate for exactly `dns_names` and `ips` (no loopback unless named),
    /// as a site's issuer makes one from a Certificate's `dnsNames` and `ipAddresses`.
    pub fn server_exactly(
        &self,
        name: &str,
        dns_names: &[String],
        ips: &[std::net::IpAddr],
    ) -> Issued {
        let mut params = CertificateParams::new(dns_names.to_vec()).expect("server params");
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, name: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
        }
    }

    /// Writes the CA certificate to `dir/name`; its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.pem).expect("write ca");
        path
    }

    /// A reqwest certificate of this CA, to trust.
    pub fn trust(&self) -> reqwest::Certificate {
        reqwest::Certificate::from_pem(self.pem.as_bytes()).expect("ca pem")
    }
}

impl Issued {
    /// Writes `<stem>.crt` and `<stem>.key` under `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> TlsFiles {
        let files = TlsFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        self.write_to(&files);
        files
    }

    /// Replaces the files' contents with this certificate: the key first, then the
    /// certificate, so that for a moment the two do not match (as a renewal written file
    /// by file leaves them).
    pub fn write_to(&self, files: &TlsFiles) {
        std::fs::write(&files.key, &self.key_pem).expect("write key");
        std::fs::write(&files.cert, &self.cert_pem).expect("write cert");
    }

    /// A reqwest client identity of this certificate.
    pub fn identity(&self) -> reqwest::Identity {
        reqwest::Identity::from_pem(format!("{}{}", self.cert_pem, self.key_pem).as_bytes())
            .expect("identity")
    }
}
