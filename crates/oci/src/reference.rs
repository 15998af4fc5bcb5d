//! `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`: how a policy in a
//! registry is named on a command line and in a run's records.

use std::fmt;

use oci_client::Reference;

use crate::error::OciError;

/// The scheme that tells a registry reference from a file path.
pub const SCHEME: &str = "oci://";

/// A policy component in a registry: always with its registry (never a
/// default one), a tag, a digest, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciReference {
    inner: Reference,
}

impl OciReference {
    /// Whether `text` names a registry reference (`oci://...`) rather than a file.
    pub fn is_reference(text: &str) -> bool {
        text.starts_with(SCHEME)
    }

    /// Parses `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
    pub fn parse(text: &str) -> Result<OciReference, OciError> {
        let bad = |why: &str| OciError::BadReference {
            reference: text.to_string(),
            why: why.to_string(),
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it does not start with oci://"))?;
        // Docker's rule for telling a registry from a first path component:
        // a dot, a port or `localhost`. Nothing defaults to a public registry.
        let host = rest.split('/').next().unwrap_or_default();
        let names_registry =
            rest.contains('/') && (host.contains('.') || host.contains(':') || host == "localhost");
        if !names_registry {
            return Err(bad(
                "it names no registry: write oci://REGISTRY/REPOSITORY:TAG, e.g. \
                 oci://ghcr.io/team/policy:1.0 or oci://127.0.0.1:5000/policy:1.0",
            ));
        }
        // The client library would default to `:latest`: a run names its
        // tag or its digest.
        let last = rest.rsplit('/').next().unwrap_or_default();
        if !last.contains(':') && !last.contains('@') {
            return Err(bad(
                "it names no tag and no digest: add :TAG or @sha256:DIGEST",
            ));
        }
        if let Some((_, digest)) = rest.split_once('@')
            && !is_sha256(digest)
        {
            return Err(bad(
                "its digest is not `sha256:` followed by 64 lowercase hex digits",
            ));
        }
        let inner: Reference = rest.parse().map_err(|e| bad(&format!("{e}")))?;
        Ok(OciReference { inner })
    }

    /// The registry's host, with its port if any.
    pub fn registry(&self) -> &str {
        self.inner.registry()
    }

    pub fn repository(&self) -> &str {
        self.inner.repository()
    }

    pub fn tag(&self) -> Option<&str> {
        self.inner.tag()
    }

    /// The manifest's digest (`sha256:<hex>`), if the reference is pinned.
    pub fn digest(&self) -> Option<&str> {
        self.inner.digest()
    }

    /// The same reference pinned to the manifest `digest` (its tag kept, to
    /// be read by people; the digest is what registries resolve).
    pub fn pinned(&self, digest: &str) -> OciReference {
        let inner = match self.inner.tag() {
            Some(tag) => Reference::with_tag_and_digest(
                self.registry().to_string(),
                self.repository().to_string(),
                tag.to_string(),
                digest.to_string(),
            ),
            None => Reference::with_digest(
                self.registry().to_string(),
                self.repository().to_string(),
                digest.to_string(),
            ),
        };
        OciReference { inner }
    }

    /// `REGISTRY/REPOSITORY@sha256:...` without the scheme or the tag: what
    /// a Kubernetes image volume or `oras pull` takes. `None` when unpinned.
    pub fn by_digest(&self) -> Option<String> {
        Some(format!(
            "{}/{}@{}",
            self.registry(),
            self.repository(),
            self.digest()?
        ))
    }

    /// The client library's reference.
    pub(crate) fn client_reference(&self) -> &Reference {
        &self.inner
    }
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry(), self.repository())?;
        if let Some(tag) = self.tag() {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = self.digest() {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for OciReference {
    type Err = OciError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        OciReference::parse(text)
    }
}

/// `sha256:` and 64 lowercase hex digits.
pub fn is_sha256(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn references_parse_and_print_back() {
        for text in [
            "oci://127.0.0.1:5000/policies/slo:1.0".to_string(),
            format!("oci://ghcr.io/team/slo@{DIGEST}"),
            format!("oci://localhost/slo:v2@{DIGEST}"),
        ] {
            let reference = OciReference::parse(&text).unwrap();
            assert_eq!(reference.to_string(), text);
        }
        let r = OciReference::parse("oci://127.0.0.1:5000/policies/slo:1.0").unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5000", "policies/slo", Some("1.0"))
        );
        let pinned = r.pinned(DIGEST);
        assert_eq!(
            pinned.to_string(),
            format!("oci://127.0.0.1:5000/policies/slo:1.0@{DIGEST}")
        );
        assert_eq!(
            pinned.by_digest().unwrap(),
            format!("127.0.0.1:5000/policies/slo@{DIGEST}")
        );
    }

    #[test]
    fn bad_references_say_what_to_write() {
        for (text, says) in [
            ("policy.wasm", "oci://"),
            ("oci://team/slo:1", "names no registry"),
            ("oci://slo:1", "names no registry"),
            ("oci://ghcr.io/team/slo", "no tag and no digest"),
            ("oci://ghcr.io/team/slo@sha256:abc", "digest"),
            ("oci://ghcr.io/Team/slo:1", "oci://ghcr.io/Team/slo:1"),
        ] {
            let err = OciReference::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
