//! The policy registry's flags (`--policy-registry-token`,
//! `--policy-insecure-registry`, and `--ca-cert` for the commands without
//! a client's flags), resolved into `nyann_oci`'s options, and the
//! registry's errors worded for the command line: the library says what
//! happened, this module adds the flag that fixes it.

use std::path::PathBuf;

use nyann_oci::{Credentials, OciError, RegistryOptions};

/// How a policy named `oci://...` is fetched.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Policy registry")]
pub struct RegistryArgs {
    /// A bearer token for the policy's registry. Without it, the
    /// credentials `docker login` saved ($REGISTRY_AUTH_FILE,
    /// $DOCKER_CONFIG/config.json or ~/.docker/config.json), else none.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "NYANN_BENCH_POLICY_REGISTRY_TOKEN",
        hide_env_values = true
    )]
    pub policy_registry_token: Option<String>,

    /// Speak plain HTTP to this registry (`HOST[:PORT]`, repeatable). A
    /// loopback registry that answers no TLS gets plain HTTP without it.
    #[arg(long, value_name = "HOST")]
    pub policy_insecure_registry: Vec<String>,
}

impl RegistryArgs {
    /// The registry options, trusting the CAs of `ca_certs` (`--ca-cert`).
    pub fn options(&self, ca_certs: &[PathBuf]) -> RegistryOptions {
        let mut credentials = Credentials::from_environment();
        credentials.token = self.policy_registry_token.clone();
        RegistryOptions {
            credentials,
            ca_certs: ca_certs.to_vec(),
            insecure: self.policy_insecure_registry.clone(),
            ..RegistryOptions::default()
        }
    }
}

/// `--ca-cert` for the commands that load a policy without a client's
/// flags (`policy describe|check|replay`, `scenario check`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Policy registry")]
pub struct RegistryTlsArgs {
    /// A PEM file of CA certificates the policy's registry is trusted
    /// with, besides the system's (repeatable).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
}

/// A registry's error, with the flag or command that fixes it.
pub fn explain(err: &OciError) -> anyhow::Error {
    let hint = match err {
        OciError::Unreachable { .. } => {
            " (a registry with a private CA: --ca-cert FILE; one on plain HTTP: \
             --policy-insecure-registry HOST)"
                .to_string()
        }
        OciError::Untrusted { .. } => " with --ca-cert FILE".to_string(),
        OciError::Unauthorized { .. } => " with --policy-registry-token".to_string(),
        OciError::NotAComponent { reference, .. } => {
            format!("; push the component with `nyann-bench policy push FILE.wasm {reference}`")
        }
        OciError::TooLarge { .. } => {
            "; raise the limit with --policy-max-size if you trust this policy".to_string()
        }
        _ => String::new(),
    };
    anyhow::anyhow!("{err}{hint}")
}
