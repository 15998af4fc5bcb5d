//! Policy components as OCI artifacts: `oci://` references, pulling a
//! component from a registry (verified against its digest, kept in a
//! content-addressed local store, reused offline) and pushing one in the
//! Wasm OCI artifact layout. No command-line flag is named here: callers
//! give [`RegistryOptions`].

mod auth;
mod error;
mod reference;
mod registry;
mod store;

pub use auth::Credentials;
pub use error::OciError;
pub use reference::{OciReference, SCHEME, is_sha256};
pub use registry::{
    Artifact, MAX_MANIFEST_BYTES, Pulled, Pushed, RegistryOptions, WASM_CONFIG_MEDIA_TYPE,
    WASM_LAYER_MEDIA_TYPE, pull, push,
};
pub use store::{Store, sha256};
