//! Helpers of the transport's unit tests: scripted connections and small
//! servers on 127.0.0.1.

use std::time::Duration;

use http::header::HeaderMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::connection::{Connection, Unanswered};
use super::scripted::Scripted;
use super::{HttpError, Proxies, Target, TargetError};

pub(super) fn target(base: &str) -> Result<Target, TargetError> {
    Target::new(base, Duration::from_secs(1), &[], &Proxies::default())
}

pub(super) fn scripted(reads: Vec<Vec<u8>>) -> Connection {
    // Every read after the first returns at a later instant.
    Scripted::connection(reads, Duration::from_micros(50))
}

/// Reads a whole response from `reads`: status, body, reusable.
pub(super) async fn read(reads: Vec<Vec<u8>>) -> Result<(u16, Vec<u8>, bool), HttpError> {
    let mut response = scripted(reads)
        .read_response()
        .await
        .map_err(Unanswered::into_error)?;
    let (body, total) = response.collect(usize::MAX).await?;
    assert_eq!(body.len(), total);
    Ok((response.status, body, response.reusable()))
}

pub(super) fn one(text: &str) -> Vec<Vec<u8>> {
    vec![text.as_bytes().to_vec()]
}

/// `text` split into pieces of `size` bytes.
pub(super) fn split(text: &str, size: usize) -> Vec<Vec<u8>> {
    text.as_bytes().chunks(size).map(<[u8]>::to_vec).collect()
}

/// Reads one request head (no body in these tests) and answers it with
/// a keep-alive `ok`; `Ok(false)` when the client closed first.
pub(super) async fn answer_ok(
    io: &mut (impl AsyncRead + AsyncWrite + Unpin),
) -> std::io::Result<bool> {
    let mut request = Vec::new();
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut piece = [0u8; 1024];
        match io.read(&mut piece).await? {
            0 => return Ok(false),
            n => request.extend_from_slice(&piece[..n]),
        }
    }
    io.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        .await?;
    Ok(true)
}

pub(super) async fn get(t: &Target) -> Result<Vec<u8>, HttpError> {
    let request = t
        .template("GET", "models", &HeaderMap::new())
        .with_body(b"");
    let mut response = t.send(&request).await?;
    let (body, _) = response.collect(1024).await?;
    response.finish(t);
    Ok(body)
}

/// A private CA and a certificate for `name` it signed.
pub(super) fn private_ca(
    name: &str,
) -> (
    rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    rcgen::Certificate,
    rcgen::KeyPair,
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "nyann-bench test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let mut leaf = CertificateParams::new(vec![name.to_string()]).unwrap();
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf.signed_by(&leaf_key, &ca).unwrap();
    (ca, leaf, leaf_key)
}

pub(super) async fn read_head(io: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let mut request = Vec::new();
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut piece = [0u8; 1024];
        match io.read(&mut piece).await? {
            0 => break,
            n => request.extend_from_slice(&piece[..n]),
        }
    }
    Ok(request)
}
