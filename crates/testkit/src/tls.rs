//! A private certificate authority for tests of TLS endpoints: a CA, a
//! server certificate for 127.0.0.1 and a client certificate, all signed by
//! it and written as PEM files into a temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use crate::TestkitError;

/// A private CA and the certificates it signed, as PEM files.
#[derive(Debug)]
pub struct PrivateCa {
    /// Holds the files; removed when dropped.
    _dir: tempfile::TempDir,
    /// The CA certificate (what `--ca-cert` trusts), as PEM and as DER.
    pub ca_pem: PathBuf,
    pub ca_der: Vec<u8>,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl PrivateCa {
    pub fn new() -> Result<Self, TestkitError> {
        let dir = tempfile::Builder::new()
            .prefix("nyann-ca-")
            .tempdir()
            .map_err(|error| TestkitError::Io {
                what: "creating a temporary directory".into(),
                error,
            })?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(DnType::CommonName, "nyann-bench test CA");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let leaf = |name: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf("127.0.0.1", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = leaf("nyann-bench", ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, pem: &str| -> Result<PathBuf, TestkitError> {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).map_err(|error| TestkitError::Io {
                what: format!("writing {name}"),
                error,
            })?;
            Ok(path)
        };
        Ok(PrivateCa {
            ca_pem: write("ca.pem", &ca.pem())?,
            ca_der: ca.der().to_vec(),
            server_cert: write("server.pem", &server_cert)?,
            server_key: write("server-key.pem", &server_key)?,
            client_cert: write("client.pem", &client_cert)?,
            client_key: write("client-key.pem", &client_key)?,
            _dir: dir,
        })
    }

    /// Prometheus' `--web.config.file` serving this CA's server certificate.
    pub(crate) fn web_config(&self, require_client_cert: bool) -> String {
        let q = |p: &Path| serde_json::Value::String(p.display().to_string()).to_string();
        let mut y = format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            q(&self.server_cert),
            q(&self.server_key)
        );
        if require_client_cert {
            y.push_str(&format!(
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
                q(&self.ca_pem)
            ));
        }
        y
    }

    /// A client builder trusting the CA and presenting the client certificate.
    pub fn trusting_client(
        &self,
        builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, TestkitError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|error| TestkitError::Io {
                what: format!("reading {}", p.display()),
                error,
            })
        };
        let ca = reqwest::Certificate::from_pem(&read(&self.ca_pem)?).map_err(other)?;
        let mut identity = read(&self.client_cert)?;
        identity.extend(read(&self.client_key)?);
        let identity = reqwest::Identity::from_pem(&identity).map_err(other)?;
        Ok(builder.tls_certs_merge([ca]).identity(identity))
    }
}

fn other(e: reqwest::Error) -> TestkitError {
    TestkitError::Io {
        what: "loading the test certificates".into(),
        error: std::io::Error::other(e),
    }
}
