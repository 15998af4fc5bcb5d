//! Operators' allow lists: the digests of the only components a host may
//! load. Checked on the bytes before anything of them is compiled or run,
//! whatever the component's origin (a file, a registry, the built-in).

use crate::digest::ComponentDigest;
use crate::error::PolicyError;

/// Parses `sha256:<64 lowercase hex>`, as `sha256sum`, registries and
/// run records write a component's digest.
pub fn parse_digest(text: &str) -> Result<ComponentDigest, String> {
    let hex = text
        .strip_prefix("sha256:")
        .filter(|hex| hex.len() == 64)
        .ok_or_else(|| format!("`{text}` is not a digest: write sha256: and 64 hex digits"))?;
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("`{text}` is not a digest: write sha256: and 64 hex digits"))?;
    }
    Ok(ComponentDigest::from_bytes(bytes))
}

/// Refuses `digest` unless `allowed` is empty (no list) or holds it.
pub(crate) fn check(
    allowed: &[ComponentDigest],
    origin: &str,
    digest: &ComponentDigest,
) -> Result<(), PolicyError> {
    if allowed.is_empty() || allowed.contains(digest) {
        return Ok(());
    }
    Err(PolicyError::NotAllowed {
        origin: origin.to_string(),
        digest: digest.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_back_and_others_are_refused() {
        let digest = ComponentDigest::of(b"abc");
        assert_eq!(parse_digest(&digest.to_string()).unwrap(), digest);
        for bad in ["abc", "sha256:xyz", &format!("sha512:{}", digest.hex())] {
            assert!(parse_digest(bad).unwrap_err().contains("sha256:"), "{bad}");
        }
        assert!(check(&[], "p.wasm", &digest).is_ok());
        assert!(check(&[digest], "p.wasm", &digest).is_ok());
        let other = ComponentDigest::of(b"other");
        let err = check(&[other], "p.wasm", &digest).unwrap_err().to_string();
        assert!(
            err.contains(&digest.to_string()) && err.contains("allow list"),
            "{err}"
        );
    }
}
