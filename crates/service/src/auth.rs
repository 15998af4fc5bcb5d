//! Bearer tokens: each named, with a scope and optionally the targets it
//! may submit to. The file holds SHA-256 digests only (`printf %s TOKEN |
//! sha256sum`), so reading it gives no token away; a presented token is
//! hashed and compared with every digest in constant time.

use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do; each scope includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Plan, list, get, artifacts and reports.
    Read,
    /// Also submit runs, and cancel one's own.
    Submit,
    /// Also cancel anyone's runs.
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Submit => "submit",
            Scope::Admin => "admin",
        }
    }
}

/// A client, once its token is recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub scope: Scope,
    /// The targets it may submit to; `None`: all.
    pub targets: Option<Vec<String>>,
}

impl Caller {
    pub fn may_use(&self, target: &str) -> bool {
        self.targets
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|t| t == target))
    }

    /// Refused unless this caller has `scope` (what `action` needs).
    pub fn require(&self, scope: Scope, action: &str) -> Result<(), Denied> {
        if self.scope >= scope {
            return Ok(());
        }
        Err(Denied(format!(
            "token {:?} has scope {}: {action} needs scope {} (ask the operator for such a token)",
            self.name,
            self.scope.as_str(),
            scope.as_str()
        )))
    }

    /// Refused unless this caller may submit runs to `target`.
    pub fn require_target(&self, target: &str) -> Result<(), Denied> {
        if self.may_use(target) {
            return Ok(());
        }
        Err(Denied(format!(
            "token {:?} may not submit to target {target:?}: it may submit to {}",
            self.name,
            self.targets.as_deref().unwrap_or_default().join(", ")
        )))
    }
}

/// What a caller asked is beyond its token; the message says what would
/// allow it. Every interface (the JSON API, MCP) refuses with it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tokens: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    /// The token's SHA-256, 64 hexadecimal digits.
    sha256: String,
    scope: Scope,
    #[serde(default)]
    targets: Option<Vec<String>>,
}

/// The tokens file could not be used; each message names the token at fault.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct TokensError(pub Vec<String>);

/// The known tokens' digests.
#[derive(Debug, Clone)]
pub struct Tokens(Vec<([u8; 32], Caller)>);

impl Tokens {
    /// Reads `path` (TOML, or JSON when it ends in `.json`).
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| TokensError(vec![format!("{shown}: cannot read the tokens file: {e}")]))?;
        Tokens::parse(&shown, &text, path.extension().is_some_and(|e| e == "json"))
    }

    pub fn parse(file: &str, text: &str, json: bool) -> Result<Tokens, TokensError> {
        let parsed: Result<File, String> = if json {
            serde_json::from_str(text).map_err(|e| e.to_string())
        } else {
            toml::from_str(text).map_err(|e| e.to_string())
        };
        let parsed = parsed.map_err(|e| TokensError(vec![format!("{file}: {e}")]))?;
        let mut errors = Vec::new();
        if parsed.tokens.is_empty() {
            errors.push(format!(
                "{file}: no token: add a [[tokens]] entry with name, sha256 and scope"
            ));
        }
        let mut tokens = Vec::new();
        for entry in parsed.tokens {
            match digest_from_hex(&entry.sha256) {
                Some(digest) => tokens.push((
                    digest,
                    Caller {
                        name: entry.name,
                        scope: entry.scope,
                        targets: entry.targets,
                    },
                )),
                None => errors.push(format!(
                    "{file}: token {:?}: sha256 must be 64 hexadecimal digits, the token's digest (printf %s TOKEN | sha256sum), never the token itself",
                    entry.name
                )),
            }
        }
        if errors.is_empty() {
            Ok(Tokens(tokens))
        } else {
            Err(TokensError(errors))
        }
    }

    /// The caller whose token this is. Every digest is compared, each in
    /// constant time, so the time taken says nothing of which matched.
    pub fn caller(&self, token: &str) -> Option<&Caller> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (known, caller) in &self.0 {
            if bool::from(known.ct_eq(&digest)) {
                found = Some(caller);
            }
        }
        found
    }
}

fn digest_from_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The digest to put in the tokens file for `token`, as hexadecimal.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_are_recognised_by_their_digest() {
        let text = format!(
            "[[tokens]]\nname = \"ci\"\nsha256 = \"{}\"\nscope = \"submit\"\ntargets = [\"sim\"]\n\
             [[tokens]]\nname = \"viewer\"\nsha256 = \"{}\"\nscope = \"read\"\n",
            hash_token("secret-ci"),
            hash_token("secret-view")
        );
        let tokens = Tokens::parse("t.toml", &text, false).unwrap();
        let ci = tokens.caller("secret-ci").unwrap();
        assert_eq!((ci.name.as_str(), ci.scope), ("ci", Scope::Submit));
        assert!(ci.may_use("sim") && !ci.may_use("prod"));
        assert_eq!(tokens.caller("secret-view").unwrap().scope, Scope::Read);
        assert!(tokens.caller("secret").is_none());
        assert!(tokens.caller("").is_none());
        assert!(Scope::Read < Scope::Submit && Scope::Submit < Scope::Admin);
    }

    #[test]
    fn a_plain_token_in_the_file_is_refused() {
        let text = "[[tokens]]\nname = \"ci\"\nsha256 = \"hunter2\"\nscope = \"admin\"\n";
        let err = Tokens::parse("t.toml", text, false).unwrap_err();
        assert!(
            err.to_string().contains("token \"ci\": sha256 must be 64"),
            "{err}"
        );
        let err = Tokens::parse(
            "t.toml",
            "[[tokens]]\nname = \"x\"\nsha256 = \"\"\nscope = \"root\"\n",
            false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("root"), "{err}");
    }
}
