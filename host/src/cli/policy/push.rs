//! `nyann-bench policy push FILE.wasm oci://REGISTRY/REPO:TAG`: load the
//! component as a run would (size, binary checks, compile, `describe`,
//! `validate` of its defaults), then push it in the Wasm OCI artifact
//! layout with its name, version, interface line and source as the
//! manifest's annotations, and print the reference pinned to its digest.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use nyann_model::scenario::{Param, StopCondition};
use nyann_oci::{Artifact, OciReference};
use nyann_policy_host::PolicyHost;

use crate::cli::check::{SandboxArgs, explain_policy};
use crate::cli::registry::{RegistryTlsArgs, explain};

/// The annotation keys of the manifest (the OCI image spec's, and ours for
/// the interface line).
pub const INTERFACE_ANNOTATION: &str = "dev.nyann-bench.policy.interface";

pub async fn push(
    file: &Path,
    reference: &str,
    source: Option<&str>,
    sandbox: &SandboxArgs,
    tls: &RegistryTlsArgs,
) -> anyhow::Result<ExitCode> {
    let reference = OciReference::parse(reference)?;
    let host = sandbox.host_config();
    let size = std::fs::metadata(file)
        .with_context(|| format!("cannot read {}", file.display()))?
        .len();
    if size > host.max_component_bytes {
        anyhow::bail!(
            "{} is {size} bytes, over the {}-byte limit for policy components; raise it with \
             --policy-max-size if you trust it",
            file.display(),
            host.max_component_bytes
        );
    }
    let component =
        std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let origin = file.display().to_string();
    let policy = PolicyHost::new(host)
        .and_then(|host| host.load_bytes(&origin, &component))
        .map_err(explain_policy)?;
    // validate() of its defaults, as `policy check` starts: a component
    // that refuses its own defaults is not pushed.
    let defaults: Vec<Param> = Vec::new();
    let required: Vec<&str> = policy
        .info()
        .params
        .iter()
        .filter(|p| p.required)
        .map(|p| p.name.as_str())
        .collect();
    if required.is_empty() {
        policy
            .check_params(&StopCondition {
                params: defaults,
                location: None,
                param_locations: Vec::new(),
                search: None,
            })
            .map_err(|e| anyhow::anyhow!("not pushed: {e}"))?;
    }
    let info = policy.info();
    let mut annotations = BTreeMap::from([
        (
            "org.opencontainers.image.title".to_string(),
            info.name.clone(),
        ),
        (
            "org.opencontainers.image.version".to_string(),
            info.version.clone(),
        ),
        (
            "org.opencontainers.image.description".to_string(),
            info.summary.clone(),
        ),
        (
            INTERFACE_ANNOTATION.to_string(),
            policy.interface().to_string(),
        ),
    ]);
    if let Some(source) = source {
        annotations.insert(
            "org.opencontainers.image.source".to_string(),
            source.to_string(),
        );
    }
    let artifact = Artifact {
        component: &component,
        // One name whatever the file's: the name `oras pull` writes and a
        // Kubernetes image volume shows (`kube render` points there).
        file_name: nyann_kube::POLICY_FILE.to_string(),
        annotations,
    };
    let options = sandbox.registry.options(&tls.ca_cert);
    let pushed = nyann_oci::push(&artifact, &reference, &options)
        .await
        .map_err(|e| explain(&e))?;
    eprintln!(
        "pushed {} {} ({}), component {}",
        info.name,
        info.version,
        policy.interface(),
        pushed.component_digest
    );
    println!("{}", pushed.reference);
    Ok(ExitCode::SUCCESS)
}
