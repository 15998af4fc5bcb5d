//! The congestion policy's flags (`--policy`, its mode and its sandbox),
//! resolved into the run library's [`PolicySpec`] (the check's and the
//! policy host's `Default`s give the defaults they show), and the policy's and
//! the check's errors worded for the command line (the check itself is
//! `nyann_check`, set up before load by `nyann_run`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use nyann_check::{CheckError, CheckSettings, OnPolicyError, PolicyMode};
use nyann_oci::{OciReference, Store};
use nyann_policy_host::{ComponentDigest, HostConfig, Policy, PolicyError};
use nyann_run::{PolicySource, PolicySpec, RegistrySource};

use super::defaults::{duration, size};

/// `--policy-mode`: how the verdicts are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// A congested verdict stops the sweep.
    Enforce,
    /// Record every verdict, never stop.
    Monitor,
}

/// `--on-policy-error`: what a failed policy call (trap, deadline, memory
/// cap, error result) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnErrorArg {
    /// Record the error and go on with the sweep (fail-open).
    Continue,
    /// Record the error and stop the sweep.
    Stop,
}

impl From<PolicyMode> for ModeArg {
    fn from(mode: PolicyMode) -> ModeArg {
        match mode {
            PolicyMode::Enforce => ModeArg::Enforce,
            PolicyMode::Monitor => ModeArg::Monitor,
        }
    }
}

impl From<OnPolicyError> for OnErrorArg {
    fn from(on_error: OnPolicyError) -> OnErrorArg {
        match on_error {
            OnPolicyError::Continue => OnErrorArg::Continue,
            OnPolicyError::Stop => OnErrorArg::Stop,
        }
    }
}

/// Flags of the congestion policy.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Congestion policy")]
pub struct PolicyArgs {
    /// The policy judging `until_congested` stages: `builtin`, a
    /// WebAssembly component file implementing nyann:policy (see
    /// `nyann-bench policy wit`), or one in an OCI registry,
    /// `oci://REGISTRY/REPO:TAG` or `...@sha256:DIGEST` (pulled once, kept
    /// in the local store; the run records its digest).
    #[arg(long, value_name = "FILE|oci://REF|builtin", default_value = nyann_policy_host::BUILTIN)]
    pub policy: String,

    /// `enforce` stops the sweep at the first congested stage; `monitor`
    /// records every verdict and never stops.
    #[arg(long, value_enum, default_value_t = ModeArg::from(CheckSettings::default().mode))]
    pub policy_mode: ModeArg,

    /// What a failed policy call does (it is always recorded).
    #[arg(long, value_enum, default_value_t = OnErrorArg::from(CheckSettings::default().on_error))]
    pub on_policy_error: OnErrorArg,

    /// Before each stage of a capacity search (`refine=`), the longest
    /// wait for the server to drain what the stage before left: every
    /// role's waiting requests back to 0 (read from the server signals).
    /// 0s starts each search stage as soon as this client's requests ended.
    #[arg(long, value_name = "DURATION", default_value = shown!(duration(CheckSettings::default().server_drain_wait)), value_parser = nyann_model::parse_duration)]
    pub server_drain_wait: Duration,

    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

/// The sandbox's budgets, for every command that loads a policy.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Policy sandbox")]
pub struct SandboxArgs {
    /// Fuel of one policy `judge` call: about the WebAssembly instructions
    /// it may run (deterministic: it counts work, not time). `describe` and
    /// `validate`, once at load, get ten times as much.
    #[arg(long, value_name = "INSTRUCTIONS", default_value_t = HostConfig::default().judge_fuel)]
    pub policy_fuel: u64,

    /// Wall-clock limit of one policy `judge` call: a backstop above what
    /// the fuel takes (0.1-0.7 s), so that the fuel is what stops a runaway
    /// policy (ten times as much for `describe`/`validate`).
    #[arg(long, value_name = "DURATION", default_value = shown!(duration(HostConfig::default().call_timeout)), value_parser = nyann_model::parse_duration)]
    pub policy_timeout: Duration,

    /// Largest policy component accepted (e.g. `64MiB`, `100MB`), checked
    /// before it is read or compiled.
    #[arg(long, value_name = "SIZE", default_value = shown!(size(HostConfig::default().max_component_bytes)), value_parser = parse_size)]
    pub policy_max_size: u64,

    /// `off` compiles the policy at every load instead of keeping its
    /// compiled code on disk (in $NYANN_BENCH_CACHE_DIR, else
    /// ~/.cache/nyann-bench; each entry checked against a key of yours in
    /// ~/.local/state/nyann-bench before its code is run).
    // `on` written here: the library's default depends on whether this
    // machine has a home for the cache, which the help must not.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = CacheArg::On, env = "NYANN_BENCH_POLICY_CACHE")]
    pub policy_cache: CacheArg,

    /// Load only a component with this digest (`sha256:` and 64 hex
    /// digits, as runs record it; repeatable): any other is refused before
    /// it is compiled, whether a file, a registry's or the built-in.
    #[arg(long, value_name = "sha256:DIGEST", value_parser = nyann_policy_host::parse_digest)]
    pub policy_allow: Vec<ComponentDigest>,

    #[command(flatten)]
    pub registry: super::registry::RegistryArgs,
}

/// `--policy-cache`: whether compiled policy code is kept on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheArg {
    On,
    Off,
}

impl SandboxArgs {
    /// The sandbox these flags describe.
    pub fn host_config(&self) -> HostConfig {
        let config = HostConfig {
            judge_fuel: self.policy_fuel,
            call_timeout: self.policy_timeout,
            max_component_bytes: self.policy_max_size,
            allowed: self.policy_allow.clone(),
            ..HostConfig::default()
        };
        match self.policy_cache {
            CacheArg::On => config,
            CacheArg::Off => HostConfig {
                cache_dir: None,
                ..config
            },
        }
    }

    /// Where `policy` (`builtin`, a component file or `oci://...`) comes
    /// from; a registry trusted with the CAs of `ca_certs`.
    pub fn source(&self, policy: &str, ca_certs: &[PathBuf]) -> anyhow::Result<PolicySource> {
        if !OciReference::is_reference(policy) {
            return Ok(PolicySource::named(policy));
        }
        let reference = OciReference::parse(policy)?;
        let store = Store::default_dir()
            .context("no directory for the policy store: set NYANN_BENCH_CACHE_DIR (or HOME)")?;
        Ok(PolicySource::Registry(Box::new(RegistrySource {
            reference,
            options: self.registry.options(ca_certs),
            store: Store::at(store),
        })))
    }

    /// Load `policy` (`builtin`, a component file or `oci://...`) under
    /// these budgets.
    pub async fn load(&self, policy: &str, ca_certs: &[PathBuf]) -> anyhow::Result<Policy> {
        self.source(policy, ca_certs)?
            .load(self.host_config())
            .await
            .map_err(explain_policy)
    }
}

/// The sandbox at its defaults, for a command without its flags that
/// loads a policy (the demo): `NYANN_BENCH_POLICY_CACHE` is followed as
/// `--policy-cache` follows it.
pub fn default_host_config() -> anyhow::Result<HostConfig> {
    let cache = match std::env::var("NYANN_BENCH_POLICY_CACHE") {
        Ok(value) => <CacheArg as clap::ValueEnum>::from_str(&value, false).map_err(|_| {
            anyhow::anyhow!("NYANN_BENCH_POLICY_CACHE={value:?}: expected on or off")
        })?,
        Err(_) => CacheArg::On,
    };
    Ok(match cache {
        CacheArg::On => HostConfig::default(),
        CacheArg::Off => HostConfig {
            cache_dir: None,
            ..HostConfig::default()
        },
    })
}

/// A policy that could not be loaded, as users read it.
pub fn explain_policy(err: PolicyError) -> anyhow::Error {
    match err {
        PolicyError::TooLarge { .. } => {
            anyhow::anyhow!("{err}; raise the limit with --policy-max-size if you trust it")
        }
        PolicyError::NotAllowed { ref digest, .. } => {
            anyhow::anyhow!("{err}; an operator allows it with --policy-allow {digest}")
        }
        PolicyError::Fetch { ref error, .. } => match error.downcast_ref::<nyann_oci::OciError>() {
            Some(error) => super::registry::explain(error),
            None => err.into(),
        },
        err => err.into(),
    }
}

/// A congestion check that cannot judge the scenario, as users read it.
pub fn explain(err: CheckError) -> anyhow::Error {
    match err {
        err @ CheckError::NoSignalSource { .. } => anyhow::anyhow!(
            "{err}: give --prometheus-url URL with --deploy-name NAME (or --selector \
             ROLE='{{...}}'), or --scrape [ROLE=]URL to sample the servers' /metrics directly"
        ),
        err => err.into(),
    }
}

/// `64MiB`, `100MB`, `1GiB`, `512KiB`, or a number of bytes.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit_bytes: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => {
            return Err(format!(
                "`{text}` is not a size; write e.g. 64MiB, 100MB or 1GiB"
            ));
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_bytes))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("`{text}` is not a size > 0; write e.g. 64MiB, 100MB or 1GiB"))
}

impl PolicyArgs {
    /// The policy these flags name, its sandbox and how its verdicts are
    /// used; a registry trusted with the CAs of `ca_certs` (`--ca-cert`).
    pub fn spec(&self, ca_certs: &[PathBuf]) -> anyhow::Result<PolicySpec> {
        Ok(PolicySpec {
            source: self.sandbox.source(&self.policy, ca_certs)?,
            host: self.sandbox.host_config(),
            settings: self.settings(),
        })
    }

    /// How the check uses its verdicts.
    fn settings(&self) -> CheckSettings {
        CheckSettings {
            mode: match self.policy_mode {
                ModeArg::Enforce => PolicyMode::Enforce,
                ModeArg::Monitor => PolicyMode::Monitor,
            },
            on_error: match self.on_policy_error {
                OnErrorArg::Continue => OnPolicyError::Continue,
                OnErrorArg::Stop => OnPolicyError::Stop,
            },
            server_drain_wait: self.server_drain_wait,
        }
    }
}
