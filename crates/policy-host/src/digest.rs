//! A component's identity: the SHA-256 of its bytes. Every run records it
//! of the policy that judged it, and it names the component's compiled code.

use sha2::{Digest, Sha256};

/// The SHA-256 of a component's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ComponentDigest([u8; 32]);

impl ComponentDigest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> ComponentDigest {
        ComponentDigest(Sha256::digest(bytes).into())
    }

    /// The digest whose bytes are `bytes`.
    pub fn from_bytes(bytes: [u8; 32]) -> ComponentDigest {
        ComponentDigest(bytes)
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex, as `sha256sum` prints it.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// `sha256:<hex>`, as OCI registries write digests.
impl std::fmt::Display for ComponentDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

#[cfg(test)]
mod tests {
    use super::ComponentDigest;

    #[test]
    fn digests_are_written_as_registries_and_sha256sum_write_them() {
        let digest = ComponentDigest::of(b"abc");
        assert_eq!(
            digest.hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(digest.to_string(), format!("sha256:{}", digest.hex()));
    }
}
