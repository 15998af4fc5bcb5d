//! Registry credentials: a token given by the caller, else the user's
//! `docker login` entries (the Docker config file, or the file
//! `REGISTRY_AUTH_FILE` names, as podman and skopeo read it), else none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use crate::error::OciError;

/// Where credentials come from.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// A bearer token sent to every registry as it is.
    pub token: Option<String>,
    /// Docker config files to look in, first match wins.
    pub auth_files: Vec<PathBuf>,
}

impl Credentials {
    /// No token; the usual credential files of this user:
    /// `$REGISTRY_AUTH_FILE`, `$DOCKER_CONFIG/config.json`,
    /// `~/.docker/config.json`.
    pub fn from_environment() -> Credentials {
        let mut auth_files = Vec::new();
        if let Some(file) = std::env::var_os("REGISTRY_AUTH_FILE") {
            auth_files.push(PathBuf::from(file));
        }
        if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
            auth_files.push(Path::new(&dir).join("config.json"));
        } else if let Some(home) = std::env::var_os("HOME") {
            auth_files.push(Path::new(&home).join(".docker").join("config.json"));
        }
        Credentials {
            token: None,
            auth_files,
        }
    }

    /// What to present to `registry` (`host[:port]`).
    pub fn for_registry(&self, registry: &str) -> Result<RegistryAuth, OciError> {
        if let Some(token) = &self.token {
            return Ok(RegistryAuth::Bearer(token.clone()));
        }
        for path in &self.auth_files {
            if let Some(auth) = from_docker_config(path, registry)? {
                return Ok(auth);
            }
        }
        Ok(RegistryAuth::Anonymous)
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// The entry for `registry` in a Docker config file, if the file exists
/// and has one. Credential helpers (`credsStore`) are not run.
fn from_docker_config(path: &Path, registry: &str) -> Result<Option<RegistryAuth>, OciError> {
    let bad = |why: String| OciError::Credentials {
        path: path.to_path_buf(),
        why,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(bad(e.to_string())),
    };
    let config: DockerConfig =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a Docker config file: {e}")))?;
    let Some(entry) = config
        .auths
        .iter()
        .find(|(key, _)| host_of(key) == registry)
        .map(|(_, entry)| entry)
    else {
        return Ok(None);
    };
    if let Some(token) = &entry.identitytoken {
        return Ok(Some(RegistryAuth::Bearer(token.clone())));
    }
    let Some(auth) = &entry.auth else {
        return Ok(None);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| {
            bad(format!(
                "the `auth` of {registry} is not base64 of USER:PASSWORD"
            ))
        })?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| bad(format!("the `auth` of {registry} is not USER:PASSWORD")))?;
    Ok(Some(RegistryAuth::Basic(
        user.to_string(),
        password.to_string(),
    )))
}

/// `https://host:port/v1/` → `host:port`: the forms `docker login` writes.
fn host_of(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_login_entries_are_found_by_host() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("team:s3cret");
        std::fs::write(
            &path,
            format!(r#"{{"auths": {{"https://127.0.0.1:5000/v1/": {{"auth": "{auth}"}}}}}}"#),
        )
        .unwrap();
        let credentials = Credentials {
            token: None,
            auth_files: vec![dir.path().join("absent.json"), path.clone()],
        };
        match credentials.for_registry("127.0.0.1:5000").unwrap() {
            RegistryAuth::Basic(user, password) => {
                assert_eq!((&*user, &*password), ("team", "s3cret"))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            credentials.for_registry("ghcr.io").unwrap(),
            RegistryAuth::Anonymous
        ));
        std::fs::write(&path, "{").unwrap();
        let err = credentials.for_registry("ghcr.io").unwrap_err().to_string();
        assert!(err.contains("not a Docker config file"), "{err}");
    }
}
