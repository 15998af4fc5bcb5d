//! What can go wrong between a reference and a verified component, each
//! worded to say what happened; the caller adds the flag that fixes it
//! (this crate names none).

use std::path::PathBuf;

/// Why a policy could not be pulled, pushed or read from the store.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("`{reference}` is not a policy reference: {why}")]
    BadReference { reference: String, why: String },
    #[error(
        "cannot reach the registry of {reference}: {why}; check the address and that the \
         registry runs"
    )]
    Unreachable { reference: String, why: String },
    #[error(
        "the TLS certificate of the registry of {reference} is not trusted ({why}): trust its CA"
    )]
    Untrusted { reference: String, why: String },
    #[error(
        "the registry refused {reference} (HTTP 401/403: {why}): log in (`docker login`, or a \
         REGISTRY_AUTH_FILE), or give a token"
    )]
    Unauthorized { reference: String, why: String },
    #[error("{reference} does not exist in its registry ({why}): check the repository and the tag")]
    NotFound { reference: String, why: String },
    #[error("the registry failed on {reference}: {why}")]
    Registry { reference: String, why: String },
    #[error("{reference} is not a WebAssembly component artifact: {why}")]
    NotAComponent { reference: String, why: String },
    #[error("{reference}: its {what} is {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        reference: String,
        what: &'static str,
        size: u64,
        limit: u64,
    },
    #[error(
        "{reference}: the {what} received has digest {actual}, not the {expected} it was \
         announced with: it was altered in the registry or on the way; nothing of it was used"
    )]
    DigestMismatch {
        reference: String,
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error(
        "{reference} is not in the local policy store ({}) and the registry cannot be reached: {why}",
        store.display()
    )]
    Offline {
        reference: String,
        store: PathBuf,
        why: String,
    },
    #[error("the policy store {}: {error}", path.display())]
    Store {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot read the registry credentials {}: {why}", path.display())]
    Credentials { path: PathBuf, why: String },
    #[error("cannot read the CA certificate {}: {why}", path.display())]
    CaCert { path: PathBuf, why: String },
}
