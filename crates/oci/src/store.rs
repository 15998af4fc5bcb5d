//! The local store of pulled policies, content-addressed: every blob (a
//! component, a manifest) under its SHA-256, checked again when read, and
//! the digest each tag last resolved to. What makes a pulled policy usable
//! offline, and a pinned reference never ask the network twice.

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::OciError;
use crate::reference::{OciReference, is_sha256};

/// A directory of blobs by digest and of tags' last digests.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

impl Store {
    /// The store in `dir` (created on first write).
    pub fn at(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    /// `$NYANN_BENCH_CACHE_DIR/oci`, else `$XDG_CACHE_HOME/nyann-bench/oci`,
    /// else `~/.cache/nyann-bench/oci`: beside the compiled-code cache.
    /// Blobs are checked against their digest when read, so a store shared
    /// or altered can withhold a policy but not substitute one.
    pub fn default_dir() -> Option<PathBuf> {
        let env = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(dir) = env("NYANN_BENCH_CACHE_DIR") {
            return Some(dir.join("oci"));
        }
        if let Some(dir) = env("XDG_CACHE_HOME") {
            return Some(dir.join("nyann-bench").join("oci"));
        }
        env("HOME").map(|home| home.join(".cache").join("nyann-bench").join("oci"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The blob with `digest`, if stored and intact. A blob whose bytes no
    /// longer match its name is removed and reads as absent (pulled again).
    pub fn blob(&self, digest: &str) -> Result<Option<Vec<u8>>, OciError> {
        let Some(path) = self.blob_path(digest) else {
            return Ok(None);
        };
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(OciError::Store { path, error }),
        };
        if sha256(&bytes) != digest {
            tracing::warn!(
                "the stored policy blob {} does not match its digest: removed, pulled again",
                path.display()
            );
            let _ = std::fs::remove_file(&path);
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    /// Stores `bytes` under their digest, which is returned.
    pub fn put_blob(&self, bytes: &[u8]) -> Result<String, OciError> {
        let digest = sha256(bytes);
        if let Some(path) = self.blob_path(&digest) {
            write_atomically(&path, bytes)?;
        }
        Ok(digest)
    }

    /// The manifest digest `reference`'s tag last resolved to here.
    pub fn tag(&self, reference: &OciReference) -> Result<Option<String>, OciError> {
        let Some(path) = self.tag_path(reference) else {
            return Ok(None);
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim().to_string()).filter(|d| is_sha256(d))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(OciError::Store { path, error }),
        }
    }

    /// Records that `reference`'s tag resolved to `digest`.
    pub fn set_tag(&self, reference: &OciReference, digest: &str) -> Result<(), OciError> {
        match self.tag_path(reference) {
            Some(path) => write_atomically(&path, format!("{digest}\n").as_bytes()),
            None => Ok(()),
        }
    }

    fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest
            .strip_prefix("sha256:")
            .filter(|_| is_sha256(digest))?;
        Some(self.dir.join("blobs").join("sha256").join(hex))
    }

    /// `tags/REGISTRY/REPOSITORY/TAG`: the parts are checked by the
    /// reference's grammar (no `..`, no `/` in a tag), the port's `:` kept.
    fn tag_path(&self, reference: &OciReference) -> Option<PathBuf> {
        let tag = reference.tag()?;
        Some(
            self.dir
                .join("tags")
                .join(reference.registry())
                .join(reference.repository())
                .join(tag),
        )
    }
}

/// Writes `bytes` to a temporary file beside `path`, then renames it: a
/// reader sees the whole file or none.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), OciError> {
    let store_err = |error| OciError::Store {
        path: path.to_path_buf(),
        error,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(store_err)?;
    let temporary = dir.join(format!(".tmp-{}", std::process::id()));
    let mut file = std::fs::File::create(&temporary).map_err(store_err)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(store_err)?;
    std::fs::rename(&temporary, path).map_err(store_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_come_back_by_digest_and_altered_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path());
        let digest = store.put_blob(b"component").unwrap();
        assert_eq!(digest, sha256(b"component"));
        assert_eq!(store.blob(&digest).unwrap().unwrap(), b"component");
        let path = store.blob_path(&digest).unwrap();
        std::fs::write(&path, b"altered").unwrap();
        assert_eq!(store.blob(&digest).unwrap(), None);
        assert!(!path.exists());
        assert_eq!(store.blob("sha256:../../etc").unwrap(), None);
    }

    #[test]
    fn tags_remember_their_last_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::at(dir.path());
        let r = OciReference::parse("oci://127.0.0.1:5000/team/slo:1.0").unwrap();
        assert_eq!(store.tag(&r).unwrap(), None);
        let digest = sha256(b"manifest");
        store.set_tag(&r, &digest).unwrap();
        assert_eq!(store.tag(&r).unwrap(), Some(digest));
    }
}
