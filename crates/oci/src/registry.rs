//! Talking to a registry: pulling a policy component by reference
//! (resolved to a digest, verified, kept in the [`Store`]) and pushing one
//! in the Wasm OCI artifact layout (a `application/vnd.wasm.config.v0+json`
//! config, one `application/wasm` layer), which `wkg`, Spin and wasmCloud
//! also read.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use oci_client::{Client, RegistryOperation};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::auth::Credentials;
use crate::error::OciError;
use crate::reference::{OciReference, is_sha256};
use crate::store::{Store, sha256};

/// The config media type of a WebAssembly component artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The media type of its one layer, the component.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The Docker media type of an image manifest, also accepted on pull.
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// The largest manifest accepted (the distribution spec's advice to
/// registries: a manifest of a component is under a kilobyte).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// How to reach registries.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub credentials: Credentials,
    /// PEM files of CAs to trust besides the system's.
    pub ca_certs: Vec<PathBuf>,
    /// Hosts (`host[:port]`) spoken to in plain HTTP. Loopback hosts also
    /// are when they do not speak TLS.
    pub insecure: Vec<String>,
    /// The largest component accepted.
    pub max_component_bytes: u64,
    /// Connecting, and any wait for the next bytes of an answer.
    pub timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            credentials: Credentials::default(),
            ca_certs: Vec::new(),
            insecure: Vec::new(),
            max_component_bytes: 64 << 20,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A component pulled (or found in the store), verified.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The reference pinned to the manifest's digest: what a run records.
    pub reference: OciReference,
    pub component: Vec<u8>,
    /// `sha256:<hex>` of the component's bytes.
    pub component_digest: String,
    /// Read from the store without asking the registry.
    pub from_store: bool,
}

/// A component pushed.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// The reference pinned to the manifest's digest.
    pub reference: OciReference,
    pub component_digest: String,
}

/// Pulls `reference`: from the store when pinned by a digest it holds,
/// else from its registry (a tag resolved once, to the digest returned).
/// When the registry cannot be reached, a tag falls back to the digest it
/// last resolved to here, with a warning.
pub async fn pull(
    reference: &OciReference,
    options: &RegistryOptions,
    store: &Store,
) -> Result<Pulled, OciError> {
    if let Some(digest) = reference.digest()
        && let Some(pulled) = from_store(reference, digest, store)?
    {
        return Ok(pulled);
    }
    let error = match with_fallback(reference, options, |client| {
        pull_from(client, reference, options, store)
    })
    .await
    {
        Ok(pulled) => return Ok(pulled),
        Err(error) => error,
    };
    if let OciError::Unreachable { why, .. } = &error
        && reference.digest().is_none()
        && let Some(digest) = store.tag(reference)?
        && let Some(pulled) = from_store(reference, &digest, store)?
    {
        tracing::warn!(
            "cannot reach the registry of {reference} ({why}): using {}, what the tag resolved \
             to when last pulled here",
            pulled.reference
        );
        return Ok(pulled);
    }
    Err(error)
}

/// What is pushed: the component, its file name (the layer's title, the
/// name `oras pull` writes it under) and the manifest's annotations.
#[derive(Debug, Clone)]
pub struct Artifact<'a> {
    pub component: &'a [u8],
    pub file_name: String,
    pub annotations: BTreeMap<String, String>,
}

/// Pushes `artifact` to `reference`. The same artifact gives the same
/// manifest, and so the same digest, every time.
pub async fn push(
    artifact: &Artifact<'_>,
    reference: &OciReference,
    options: &RegistryOptions,
) -> Result<Pushed, OciError> {
    with_fallback(reference, options, |client| {
        push_to(client, artifact, reference, options)
    })
    .await
}

/// Runs `attempt` over HTTPS, and again over plain HTTP for a loopback
/// registry that does not speak TLS (said in the log); over plain HTTP
/// only for a host listed as insecure.
async fn with_fallback<T, F, Fut>(
    reference: &OciReference,
    options: &RegistryOptions,
    attempt: F,
) -> Result<T, OciError>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Result<T, OciError>>,
{
    let host = reference.registry();
    if options.insecure.iter().any(|h| h == host) {
        return attempt(client(options, ClientProtocol::Http)?).await;
    }
    match attempt(client(options, ClientProtocol::Https)?).await {
        // Unreachable over TLS, not refused for its certificate: a
        // loopback registry may speak plain HTTP.
        Err(https @ OciError::Unreachable { .. }) if is_loopback(host) => {
            match attempt(client(options, ClientProtocol::Http)?).await {
                Ok(done) => {
                    tracing::info!("registry {host} (loopback) answers no TLS: plain HTTP used");
                    Ok(done)
                }
                // Not a plain-HTTP registry either: what TLS said is the news.
                Err(OciError::Unreachable { .. } | OciError::Registry { .. }) => Err(https),
                Err(http) => Err(http),
            }
        }
        done => done,
    }
}

fn is_loopback(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => registry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn client(options: &RegistryOptions, protocol: ClientProtocol) -> Result<Client, OciError> {
    // reqwest's rustls is built without a default provider here; the
    // workspace's is ring (a second call is a no-op).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut extra_root_certificates = Vec::new();
    for path in &options.ca_certs {
        let data = std::fs::read(path).map_err(|e| OciError::CaCert {
            path: path.clone(),
            why: e.to_string(),
        })?;
        extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    Ok(Client::new(ClientConfig {
        protocol,
        extra_root_certificates,
        // A component artifact is one manifest, never an index of
        // platforms: an index is refused, not resolved.
        platform_resolver: None,
        connect_timeout: Some(options.timeout),
        read_timeout: Some(options.timeout),
        user_agent: concat!("nyann-bench/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    }))
}

/// The manifest and component of `manifest_digest`, if the store holds both.
fn from_store(
    reference: &OciReference,
    manifest_digest: &str,
    store: &Store,
) -> Result<Option<Pulled>, OciError> {
    let Some(manifest) = store.blob(manifest_digest)? else {
        return Ok(None);
    };
    let pinned = reference.pinned(manifest_digest);
    let layer = component_layer(&pinned, &manifest)?;
    let Some(component) = store.blob(&layer.digest)? else {
        return Ok(None);
    };
    Ok(Some(Pulled {
        reference: pinned,
        component,
        component_digest: layer.digest,
        from_store: true,
    }))
}

async fn pull_from(
    client: Client,
    reference: &OciReference,
    options: &RegistryOptions,
    store: &Store,
) -> Result<Pulled, OciError> {
    let image = reference.client_reference();
    let auth = options.credentials.for_registry(reference.registry())?;
    let (manifest, digest) = client
        .pull_manifest_raw(
            image,
            &auth,
            &[OCI_IMAGE_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE],
        )
        .await
        .map_err(|e| explain(reference, "manifest", e))?;
    let size = manifest.len() as u64;
    if size > MAX_MANIFEST_BYTES {
        return Err(OciError::TooLarge {
            reference: reference.to_string(),
            what: "manifest",
            size,
            limit: MAX_MANIFEST_BYTES,
        });
    }
    // The client checked the digest against a pinned reference's and the
    // registry's header; the store names the manifest by what it hashes to.
    let digest = if is_sha256(&digest) {
        digest
    } else {
        sha256(&manifest)
    };
    let pinned = reference.pinned(&digest);
    let layer = component_layer(&pinned, &manifest)?;
    let limit = options.max_component_bytes;
    let declared = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if declared > limit {
        return Err(OciError::TooLarge {
            reference: pinned.to_string(),
            what: "component",
            size: declared,
            limit,
        });
    }
    let component = match store.blob(&layer.digest)? {
        Some(component) => component,
        None => download(&client, &pinned, &layer, limit.min(declared)).await?,
    };
    store.put_blob(&component)?;
    store.put_blob(&manifest)?;
    store.set_tag(reference, &digest)?;
    Ok(Pulled {
        reference: pinned,
        component,
        component_digest: layer.digest,
        from_store: false,
    })
}

/// The layer's bytes, at most `limit` of them, checked against its digest
/// before anything is kept.
async fn download(
    client: &Client,
    reference: &OciReference,
    layer: &OciDescriptor,
    limit: u64,
) -> Result<Vec<u8>, OciError> {
    let mut stream = client
        .pull_blob_stream(reference.client_reference(), layer)
        .await
        .map_err(|e| explain(reference, "component", e))?;
    let mut bytes = Vec::new();
    let mut hasher = Sha256::new();
    let mut altered = false;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            // The client's own check of the digest ends the stream with an
            // error: ours below says which digest came.
            Err(e) if e.to_string().to_lowercase().contains("digest") => {
                altered = true;
                break;
            }
            Err(e) => {
                return Err(OciError::Registry {
                    reference: reference.to_string(),
                    why: format!("reading the component: {e}"),
                });
            }
        };
        if bytes.len() as u64 + chunk.len() as u64 > limit {
            return Err(OciError::DigestMismatch {
                reference: reference.to_string(),
                what: "component",
                expected: layer.digest.clone(),
                actual: format!("(over its announced {limit} bytes)"),
            });
        }
        hasher.update(&chunk);
        bytes.extend_from_slice(&chunk);
    }
    let actual = format!("sha256:{}", hex(&hasher.finalize()));
    if altered || actual != layer.digest {
        return Err(OciError::DigestMismatch {
            reference: reference.to_string(),
            what: "component",
            expected: layer.digest.clone(),
            actual,
        });
    }
    Ok(bytes)
}

/// The one `application/wasm` layer of a Wasm component artifact's manifest.
fn component_layer(reference: &OciReference, manifest: &[u8]) -> Result<OciDescriptor, OciError> {
    let not_component = |why: String| OciError::NotAComponent {
        reference: reference.to_string(),
        why,
    };
    let manifest: OciImageManifest = serde_json::from_slice(manifest)
        .map_err(|e| not_component(format!("its manifest is not an image manifest ({e})")))?;
    if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
        return Err(not_component(format!(
            "its config is {} (a container image?), not {WASM_CONFIG_MEDIA_TYPE}",
            manifest.config.media_type
        )));
    }
    match manifest.layers.as_slice() {
        [layer] if layer.media_type == WASM_LAYER_MEDIA_TYPE && is_sha256(&layer.digest) => {
            Ok(layer.clone())
        }
        layers => Err(not_component(format!(
            "it has {} layer(s) of types [{}]; a component artifact has one {WASM_LAYER_MEDIA_TYPE} \
             layer with a sha256 digest",
            layers.len(),
            layers
                .iter()
                .map(|l| l.media_type.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// The config blob of the Wasm OCI artifact layout.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WasmConfig<'a> {
    architecture: &'a str,
    os: &'a str,
    layer_digests: [&'a str; 1],
}

async fn push_to(
    client: Client,
    artifact: &Artifact<'_>,
    reference: &OciReference,
    options: &RegistryOptions,
) -> Result<Pushed, OciError> {
    let component = artifact.component;
    let image = reference.client_reference();
    let auth = options.credentials.for_registry(reference.registry())?;
    client
        .store_auth_if_needed(reference.registry(), &auth)
        .await;
    // Asks for push rights first: a refusal is said before any upload.
    client
        .auth(image, &auth, RegistryOperation::Push)
        .await
        .map_err(|e| explain(reference, "push rights", e))?;
    let component_digest = sha256(component);
    let config = serde_json::to_vec(&WasmConfig {
        architecture: "wasm",
        os: "wasip2",
        layer_digests: [&component_digest],
    })
    .map_err(|e| OciError::Registry {
        reference: reference.to_string(),
        why: format!("cannot encode the config: {e}"),
    })?;
    let config_digest = sha256(&config);
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_string()),
        config: OciDescriptor {
            media_type: WASM_CONFIG_MEDIA_TYPE.to_string(),
            digest: config_digest.clone(),
            size: config.len() as i64,
            ..OciDescriptor::default()
        },
        layers: vec![OciDescriptor {
            media_type: WASM_LAYER_MEDIA_TYPE.to_string(),
            digest: component_digest.clone(),
            size: component.len() as i64,
            annotations: Some(BTreeMap::from([(
                "org.opencontainers.image.title".to_string(),
                artifact.file_name.clone(),
            )])),
            ..OciDescriptor::default()
        }],
        subject: None,
        artifact_type: None,
        annotations: Some(artifact.annotations.clone()),
    };
    let manifest = serde_json::to_vec(&manifest).map_err(|e| OciError::Registry {
        reference: reference.to_string(),
        why: format!("cannot encode the manifest: {e}"),
    })?;
    client
        .push_blob(image, component.to_vec(), &component_digest)
        .await
        .map_err(|e| explain(reference, "component upload", e))?;
    client
        .push_blob(image, config, &config_digest)
        .await
        .map_err(|e| explain(reference, "config upload", e))?;
    let content_type = OCI_IMAGE_MEDIA_TYPE
        .parse()
        .map_err(|e| OciError::Registry {
            reference: reference.to_string(),
            why: format!("{e}"),
        })?;
    client
        .push_manifest_raw(image, manifest.clone(), content_type)
        .await
        .map_err(|e| explain(reference, "manifest upload", e))?;
    Ok(Pushed {
        reference: reference.pinned(&sha256(&manifest)),
        component_digest,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The client's error, sorted by what the user does about it.
fn explain(reference: &OciReference, step: &str, error: OciDistributionError) -> OciError {
    let reference = reference.to_string();
    let why = format!("{step}: {}", chain(&error));
    match &error {
        OciDistributionError::RequestError(e) if untrusted_certificate(e) => {
            OciError::Untrusted { reference, why }
        }
        OciDistributionError::RequestError(e) if e.is_connect() || e.is_timeout() => {
            OciError::Unreachable { reference, why }
        }
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => {
            OciError::Unauthorized { reference, why }
        }
        OciDistributionError::ImageManifestNotFoundError(_) => {
            OciError::NotFound { reference, why }
        }
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes = envelope.errors.iter().map(|e| &e.code);
            if codes
                .clone()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                OciError::Unauthorized { reference, why }
            } else if codes.clone().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                )
            }) {
                OciError::NotFound { reference, why }
            } else {
                OciError::Registry { reference, why }
            }
        }
        OciDistributionError::ServerError {
            code: 401 | 403, ..
        } => OciError::Unauthorized { reference, why },
        OciDistributionError::ServerError { code: 404, .. } => {
            OciError::NotFound { reference, why }
        }
        OciDistributionError::DigestError(_) => OciError::DigestMismatch {
            reference,
            what: "manifest",
            expected: "the digest of the reference".into(),
            actual: why,
        },
        OciDistributionError::ImageIndexParsingNoPlatformResolverError
        | OciDistributionError::UnsupportedMediaTypeError(_)
        | OciDistributionError::ManifestParsingError(_)
        | OciDistributionError::VersionedParsingError(_) => {
            OciError::NotAComponent { reference, why }
        }
        _ => OciError::Registry { reference, why },
    }
}

/// Whether TLS refused the registry's certificate (as opposed to a
/// registry that speaks no TLS, or none at all).
fn untrusted_certificate(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(cause) = source {
        let tls = cause.downcast_ref::<rustls::Error>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if matches!(
            tls,
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
        ) {
            return true;
        }
        source = cause.source();
    }
    false
}

/// The error and its causes on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_from_others() {
        for host in ["127.0.0.1:5000", "localhost", "[::1]:80", "127.0.0.2"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["ghcr.io", "10.0.0.1:5000", "localhost.example.com"] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn container_images_are_not_components() {
        let reference = OciReference::parse("oci://127.0.0.1:1/p:1").unwrap();
        let image = br#"{"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":1},"layers":[]}"#;
        let err = component_layer(&reference, image).unwrap_err().to_string();
        assert!(
            err.contains("not a WebAssembly component artifact") && err.contains("container image"),
            "{err}"
        );
    }
}
