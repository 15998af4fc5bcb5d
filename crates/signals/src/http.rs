//! What the HTTP clients of both sources share: the CA certificates trusted
//! besides the system's (`--ca-cert`) and, for Prometheus, a client
//! certificate (`--prometheus-client-cert/-key`, mutual TLS). Files are read
//! when the source is built, so an unreadable one is refused before load.

use std::path::Path;

use crate::{SignalError, SignalOptions};

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
                return Err(SignalError::ClientCert(
                    "give both --prometheus-client-cert and --prometheus-client-key".into(),
                ));
            }
        };
        Ok(Tls { roots, identity })
    }

    /// A client builder that trusts the extra roots.
    pub(crate) fn builder(&self) -> reqwest::ClientBuilder {
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

/// Reads a PEM certificate chain and its PEM private key.
fn read_identity(cert: &Path, key: &Path) -> Result<reqwest::Identity, SignalError> {
    let read = |flag: &str, path: &Path| {
        std::fs::read(path).map_err(|e| {
            SignalError::ClientCert(format!("--{flag} {}: cannot read it: {e}", path.display()))
        })
    };
    let mut pem = read("prometheus-client-cert", cert)?;
    let key_pem = read("prometheus-client-key", key)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if !text(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(SignalError::ClientCert(format!(
            "--prometheus-client-cert {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            cert.display()
        )));
    }
    if !text(&key_pem).contains("PRIVATE KEY-----") {
        return Err(SignalError::ClientCert(format!(
            "--prometheus-client-key {}: no PEM private key in it (expected -----BEGIN ... PRIVATE KEY-----)",
            key.display()
        )));
    }
    pem.push(b'\n');
    pem.extend_from_slice(&key_pem);
    reqwest::Identity::from_pem(&pem).map_err(|e| {
        SignalError::ClientCert(format!(
            "--prometheus-client-cert {} with --prometheus-client-key {}: {}",
            cert.display(),
            key.display(),
            chain(&e)
        ))
    })
}

/// A reqwest error with its causes, on one line.
fn chain(e: &reqwest::Error) -> String {
    crate::scrape::describe_reqwest_error(e, std::time::Duration::ZERO)
}
