//! What the HTTP clients of both sources share: the CA certificates trusted
//! besides the system's and, for Prometheus, a client certificate and its
//! key (mutual TLS). Files are read when the source is built, so an
//! unreadable one is refused before load.

use std::path::{Path, PathBuf};

use crate::{SignalError, SignalOptions};

/// Which file of a client certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCertFile {
    Certificate,
    Key,
}

impl ClientCertFile {
    fn name(self) -> &'static str {
        match self {
            ClientCertFile::Certificate => "client certificate",
            ClientCertFile::Key => "client key",
        }
    }
}

/// Why a client certificate cannot be presented.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientCertError {
    #[error("a client certificate needs its private key, and a key its certificate")]
    Unpaired,
    #[error("{} {}: cannot read it: {why}", file.name(), path.display())]
    Unreadable {
        file: ClientCertFile,
        path: PathBuf,
        why: String,
    },
    #[error(
        "client certificate {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
        .0.display()
    )]
    NoCertificate(PathBuf),
    #[error(
        "client key {}: no PEM private key in it (expected -----BEGIN ... PRIVATE KEY-----)",
        .0.display()
    )]
    NoKey(PathBuf),
    #[error("client certificate {} with key {}: {why}", cert.display(), key.display())]
    Unusable {
        cert: PathBuf,
        key: PathBuf,
        why: String,
    },
}

/// TLS settings of the signal sources.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    roots: Vec<reqwest::Certificate>,
    /// Presented to Prometheus only.
    identity: Option<reqwest::Identity>,
}

impl Tls {
    pub(crate) fn from_options(args: &SignalOptions) -> Result<Tls, SignalError> {
        let roots = args
            .ca_certs
            .iter()
            .map(|der| {
                reqwest::Certificate::from_der(der).map_err(|e| SignalError::CaCert(chain(&e)))
            })
            .collect::<Result<_, _>>()?;
        let identity = match (&args.prometheus_client_cert, &args.prometheus_client_key) {
            (Some(cert), Some(key)) => Some(read_identity(cert, key)?),
            (None, None) => None,
            _ => {
                return Err(SignalError::ClientCert(ClientCertError::Unpaired));
            }
        };
        Ok(Tls { roots, identity })
    }

    /// A client builder that trusts the extra roots.
    pub(crate) fn builder(&self) -> reqwest::ClientBuilder {
        install_crypto_provider();
        reqwest::Client::builder().tls_certs_merge(self.roots.iter().cloned())
    }

    /// [`Tls::builder`] that also presents the client certificate.
    pub(crate) fn prometheus_builder(&self) -> reqwest::ClientBuilder {
        match &self.identity {
            Some(identity) => self.builder().identity(identity.clone()),
            None => self.builder(),
        }
    }
}

/// Makes ring the process's TLS crypto provider, if none is yet: the
/// workspace builds reqwest without its default one (aws-lc), whose C build
/// costs minutes, and the load path uses ring already.
fn install_crypto_provider() {
    // An error only means a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Reads a PEM certificate chain and its PEM private key.
fn read_identity(cert: &Path, key: &Path) -> Result<reqwest::Identity, SignalError> {
    let read = |file: ClientCertFile, path: &Path| {
        std::fs::read(path).map_err(|e| {
            SignalError::ClientCert(ClientCertError::Unreadable {
                file,
                path: path.to_owned(),
                why: e.to_string(),
            })
        })
    };
    let mut pem = read(ClientCertFile::Certificate, cert)?;
    let key_pem = read(ClientCertFile::Key, key)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if !text(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(SignalError::ClientCert(ClientCertError::NoCertificate(
            cert.to_owned(),
        )));
    }
    if !text(&key_pem).contains("PRIVATE KEY-----") {
        return Err(SignalError::ClientCert(ClientCertError::NoKey(
            key.to_owned(),
        )));
    }
    pem.push(b'\n');
    pem.extend_from_slice(&key_pem);
    reqwest::Identity::from_pem(&pem).map_err(|e| {
        SignalError::ClientCert(ClientCertError::Unusable {
            cert: cert.to_owned(),
            key: key.to_owned(),
            why: chain(&e),
        })
    })
}

/// A reqwest error with its causes, on one line.
fn chain(e: &reqwest::Error) -> String {
    crate::scrape::describe_reqwest_error(e, std::time::Duration::ZERO)
}
