//! What a run is, as typed values: what a command line, a service's request
//! or a test resolves into before anything starts. Nothing here is read,
//! connected to or checked until [`Run::prepare`](crate::Run::prepare).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use nyann_check::CheckSettings;
use nyann_fleet::OnWorkerLoss;
use nyann_load::RunOptions;
use nyann_model::Scenario;
use nyann_oci::{OciReference, RegistryOptions, Store};
use nyann_policy_host::{HostConfig, Policy, PolicyError, PolicyHost};
use nyann_signals::SignalOptions;

/// Everything a run of one process, or a fleet's leader, needs.
#[derive(Debug)]
pub struct RunSpec {
    pub scenario: Scenario,
    /// The Starlark text the scenario was compiled from, if any: saved
    /// with the results and shown in the report.
    pub source: Option<String>,
    /// The client, the target, the seed and the run's timeouts. The run
    /// sets `output_dir` (from [`RunSpec::output`]) and `live` itself, and
    /// a fleet's leader its own share (`seed`, `first_id`,
    /// `dataset_share`). Its `interrupt` tokens are the run's [`Stop`](crate::Stop).
    pub load: RunOptions,
    /// Where the server signals come from (none: a policy that judges
    /// client figures only, or a scenario without `until_congested`).
    pub signals: SignalOptions,
    /// The policy judging the `until_congested` stages, and how.
    pub policy: PolicySpec,
    /// The run directory, if the results are kept.
    pub output: Option<Output>,
    /// Serve the client-side Prometheus metrics (`nyann_*`) here, on one
    /// process's run (a fleet's leader does not serve them).
    pub client_metrics: Option<SocketAddr>,
    /// Lead a fleet of workers (which then need an [`output`](RunSpec::output)).
    pub lead: Option<LeadSpec>,
}

impl RunSpec {
    /// `scenario` with every other setting at its default: the load's,
    /// no signal source, the built-in policy, no run directory.
    pub fn new(scenario: Scenario) -> RunSpec {
        RunSpec {
            scenario,
            source: None,
            load: RunOptions::default(),
            signals: SignalOptions::default(),
            policy: PolicySpec::default(),
            output: None,
            client_metrics: None,
            lead: None,
        }
    }
}

/// The run directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub dir: PathBuf,
    /// Replace a run the directory holds already (otherwise it is refused,
    /// so that no result is lost by mistake).
    pub overwrite: bool,
}

/// The congestion policy: which, under which budgets, and how its verdicts
/// are used.
#[derive(Debug, Clone)]
pub struct PolicySpec {
    pub source: PolicySource,
    /// The sandbox's budgets and the compiled-code cache.
    pub host: HostConfig,
    pub settings: CheckSettings,
}

impl Default for PolicySpec {
    /// The built-in policy, enforced, with the host's default budgets.
    fn default() -> Self {
        PolicySpec {
            source: PolicySource::Builtin,
            host: HostConfig::default(),
            settings: CheckSettings::default(),
        }
    }
}

/// Where the policy comes from.
#[derive(Debug, Clone)]
pub enum PolicySource {
    /// The policy built into the binary.
    Builtin,
    /// A WebAssembly component file implementing nyann:policy.
    File(PathBuf),
    /// A component in an OCI registry (`oci://...`), pulled at load (or
    /// read from the local store), verified against its digest.
    Registry(Box<RegistrySource>),
}

/// A policy named by an OCI reference, and how to reach its registry.
#[derive(Debug, Clone)]
pub struct RegistrySource {
    pub reference: OciReference,
    pub options: RegistryOptions,
    /// Where pulled components are kept, and found again offline.
    pub store: Store,
}

impl PolicySource {
    /// [`nyann_policy_host::BUILTIN`] (`builtin`), or a component file's path.
    pub fn named(name: &str) -> PolicySource {
        if name == nyann_policy_host::BUILTIN {
            PolicySource::Builtin
        } else {
            PolicySource::File(PathBuf::from(name))
        }
    }

    /// Loads the policy under `host`'s budgets; a registry's is pulled
    /// first (its tag resolved to a digest here, once), and its origin is
    /// the reference pinned to that digest.
    pub async fn load(&self, host: HostConfig) -> Result<Policy, PolicyError> {
        let max_component_bytes = host.max_component_bytes;
        let host = PolicyHost::new(host)?;
        match self {
            PolicySource::Builtin => host.load_builtin(),
            PolicySource::File(path) => host.load_file(path),
            PolicySource::Registry(source) => {
                let pulled = source.pull(max_component_bytes).await?;
                host.load_bytes(&pulled.reference.to_string(), &pulled.component)
            }
        }
    }
}

impl RegistrySource {
    /// The component, from the store or the registry, at most
    /// `max_component_bytes` long.
    pub async fn pull(&self, max_component_bytes: u64) -> Result<nyann_oci::Pulled, PolicyError> {
        let options = RegistryOptions {
            max_component_bytes,
            ..self.options.clone()
        };
        let pulled = nyann_oci::pull(&self.reference, &options, &self.store)
            .await
            .map_err(|e| PolicyError::Fetch {
                origin: self.reference.to_string(),
                error: std::sync::Arc::new(e),
            })?;
        tracing::info!(
            "policy {} is {} (component {}, {})",
            self.reference,
            pulled.reference,
            pulled.component_digest,
            if pulled.from_store {
                "from the local store"
            } else {
                "pulled"
            }
        );
        Ok(pulled)
    }
}

/// How a fleet's leader (worker 0) runs the sweep with its workers.
#[derive(Debug, Clone)]
pub struct LeadSpec {
    /// Processes running the sweep, the leader included (at least 2).
    pub workers: usize,
    /// Where the coordination endpoint listens.
    pub listen: SocketAddr,
    /// A worker that sends nothing for this long is lost.
    pub heartbeat_timeout: Duration,
    /// How long the leader waits for every worker to join.
    pub join_timeout: Duration,
    pub on_loss: OnWorkerLoss,
    /// This binary's [`build_id`](nyann_fleet::protocol::build_id): the
    /// workers' must match it.
    pub build: String,
}
