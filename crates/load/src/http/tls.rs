//! TLS for `https` targets: the platform's certificate store plus the CA
//! files a user gives, offering only HTTP/1.1.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;

#[derive(Clone)]
pub(super) struct Tls {
    pub(super) connector: tokio_rustls::TlsConnector,
    pub(super) server_name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// TLS with the platform's certificate verifier, trusting `extra_roots` as
/// well, offering only HTTP/1.1.
pub(super) fn tls_connector(
    extra_roots: &[CertificateDer<'static>],
) -> Result<tokio_rustls::TlsConnector, String> {
    // Install ring's provider (a second call finds one installed and changes nothing).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let builder = rustls::ClientConfig::builder();
    let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
        extra_roots.iter().cloned(),
        builder.crypto_provider().clone(),
    )
    .map_err(|e| format!("cannot load the system's TLS certificates: {e}"))?;
    let verifier = GivenOrPlatform {
        given: extra_roots.to_vec(),
        platform: Arc::new(verifier),
    };
    // "dangerous" is rustls's name for any verifier but its own: this one is
    // the platform's (as `with_platform_verifier` installs it), which also
    // trusts a server certificate given outright.
    let mut config = builder
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The platform's verifier, which also accepts a server certificate that is
/// exactly one of the certificates given as extra roots, for the names it
/// is issued to. That is how people deploy a self-signed server
/// certificate (`openssl req -x509 ... -addext subjectAltName=...` makes a
/// CA certificate), which the platform's rules refuse as a server's own
/// (`CaUsedAsEndEntity`) even when it is trusted: given with `--ca-cert`,
/// exactly that certificate is trusted, and nothing it would sign.
#[derive(Debug)]
struct GivenOrPlatform {
    given: Vec<CertificateDer<'static>>,
    platform: Arc<rustls_platform_verifier::Verifier>,
}

impl rustls::client::danger::ServerCertVerifier for GivenOrPlatform {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if self.given.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
            rustls::client::verify_server_name(&parsed, server_name)?;
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        self.platform
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    // The handshake's signatures are checked alike whichever way the
    // certificate was trusted.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.platform.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.platform.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.platform.supported_verify_schemes()
    }
}

/// The CA certificates of a PEM file, checked to be usable as trust anchors.
pub fn read_ca_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            // rustls says "I/O error: " before an OS error: the OS's words
            // are enough.
            let why = match e {
                rustls::pki_types::pem::Error::Io(io) => io.to_string(),
                other => other.to_string(),
            };
            format!("cannot read {}: {why}", path.display())
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{} holds no certificate: expected PEM blocks starting with -----BEGIN CERTIFICATE-----",
            path.display()
        ));
    }
    let (_, unusable) = rustls::RootCertStore::empty().add_parsable_certificates(certs.clone());
    if unusable > 0 {
        return Err(format!(
            "{}: {unusable} of its {} certificates cannot be parsed as a CA certificate",
            path.display(),
            certs.len()
        ));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::test_support::*;
    use crate::http::{Proxies, Target};
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// A TLS server on 127.0.0.1 presenting `chain`, for one connection:
    /// it answers one request with "ok", or ends with the handshake's error.
    async fn tls_server(
        chain: Vec<CertificateDer<'static>>,
        key: &rcgen::KeyPair,
    ) -> (
        std::net::SocketAddr,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        // Builds where rustls has two crypto providers need one chosen.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let private = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(socket).await?;
            if answer_ok(&mut tls).await? {
                tls.shutdown().await?;
            }
            Ok(())
        });
        (address, server)
    }

    /// https goes through TLS and checks the server's certificate: a
    /// self-signed one is refused with the reason.
    #[tokio::test]
    async fn https_refuses_an_untrusted_certificate() {
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let (address, server) = tls_server(vec![key.cert.der().clone()], &key.signing_key).await;
        let t = target(&format!("https://{address}/v1")).unwrap();
        let err = get(&t).await.unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "cannot connect to {address}: TLS handshake failed: "
            )),
            "{err}"
        );
        assert!(err.contains("certificate"), "{err}");
        // The server saw the client give up during the handshake.
        assert!(server.await.unwrap().is_err());
    }

    /// A self-signed server certificate as `openssl req -x509 -addext
    /// subjectAltName=IP:127.0.0.1` makes it (a CA certificate, which the
    /// platform's rules refuse as a server's own: `CaUsedAsEndEntity`) is
    /// trusted when given as an extra root, for its own name only.
    #[tokio::test]
    async fn https_trusts_a_self_signed_server_certificate_given_outright() {
        let key = rcgen::KeyPair::generate().unwrap();
        let self_signed = |name: &str| {
            let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.self_signed(&key).unwrap()
        };
        let cert = self_signed("127.0.0.1");
        let given = |address: std::net::SocketAddr, cert: &rcgen::Certificate| {
            Target::new(
                &format!("https://{address}/v1"),
                Duration::from_secs(1),
                &[cert.der().clone()],
                &Proxies::default(),
            )
            .unwrap()
        };

        let (address, server) = tls_server(vec![cert.der().clone()], &key).await;
        let t = target(&format!("https://{address}/v1")).unwrap();
        let err = get(&t).await.unwrap_err().to_string();
        assert!(err.contains("certificate"), "{err}");
        assert!(server.await.unwrap().is_err());

        let (address, server) = tls_server(vec![cert.der().clone()], &key).await;
        assert_eq!(get(&given(address, &cert)).await.unwrap(), b"ok");
        server.await.unwrap().unwrap();

        // A certificate for another name is refused all the same.
        let other = self_signed("127.0.0.2");
        let (address, server) = tls_server(vec![other.der().clone()], &key).await;
        let err = get(&given(address, &other)).await.unwrap_err().to_string();
        assert!(err.contains("TLS handshake failed"), "{err}");
        assert!(server.await.unwrap().is_err());
    }

    /// A server certificate from a private CA is refused by default and
    /// accepted once the CA is given as an extra root (`--ca-cert`).
    #[tokio::test]
    async fn https_trusts_a_private_ca_given_as_extra_root() {
        let (ca, leaf, leaf_key) = private_ca("127.0.0.1");
        let chain = vec![leaf.der().clone(), ca.der().clone()];

        let (address, server) = tls_server(chain.clone(), &leaf_key).await;
        let t = target(&format!("https://{address}/v1")).unwrap();
        let err = get(&t).await.unwrap_err().to_string();
        assert!(err.contains("TLS handshake failed"), "{err}");
        assert!(server.await.unwrap().is_err());

        let (address, server) = tls_server(chain, &leaf_key).await;
        let base = format!("https://{address}/v1");
        let t = Target::new(
            &base,
            Duration::from_secs(1),
            &[ca.der().clone()],
            &Proxies::default(),
        )
        .unwrap();
        assert_eq!(get(&t).await.unwrap(), b"ok");
        server.await.unwrap().unwrap();
    }

    #[test]
    fn ca_files_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf, _) = private_ca("127.0.0.1");
        let bundle = dir.path().join("bundle.pem");
        std::fs::write(
            &bundle,
            format!("# private CAs\n{}{}", ca.pem(), leaf.pem()),
        )
        .unwrap();
        assert_eq!(
            read_ca_certs(&bundle).unwrap(),
            vec![ca.der().clone(), leaf.der().clone()]
        );

        let missing = dir.path().join("missing.pem");
        let err = read_ca_certs(&missing).unwrap_err();
        assert!(
            err.starts_with(&format!("cannot read {}: ", missing.display())),
            "{err}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = read_ca_certs(&empty).unwrap_err();
        assert!(err.contains("holds no certificate"), "{err}");

        let broken = dir.path().join("broken.pem");
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        std::fs::write(&broken, format!("{}{garbage}", ca.pem())).unwrap();
        let err = read_ca_certs(&broken).unwrap_err();
        assert!(
            err.ends_with("1 of its 2 certificates cannot be parsed as a CA certificate"),
            "{err}"
        );
    }
}
