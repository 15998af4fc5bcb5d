//! The congestion policy's flags (`--policy`, its mode and its sandbox)
//! and the check they set up before load: the policy loaded, the signal
//! source built and its preflight passed, errors and warnings worded for
//! the command line (the check itself is `nyann_check`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use nyann_check::{CheckError, CheckSettings, CongestionCheck, OnPolicyError, PolicyMode};
use nyann_model::Scenario;
use nyann_policy_host::{HostConfig, Policy, PolicyError, PolicyHost};
use nyann_signals::{SignalOptions, SignalSource};

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

/// Flags of the congestion policy.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Congestion policy")]
pub struct PolicyArgs {
    /// The policy judging `until_congested` stages: `builtin`, or a
    /// WebAssembly component file implementing nyann:policy
    /// (see `nyann-bench policy wit`).
    #[arg(long, value_name = "FILE|builtin", default_value = "builtin")]
    pub policy: String,

    /// `enforce` stops the sweep at the first congested stage; `monitor`
    /// records every verdict and never stops.
    #[arg(long, value_enum, default_value_t = ModeArg::Enforce)]
    pub policy_mode: ModeArg,

    /// What a failed policy call does (it is always recorded).
    #[arg(long, value_enum, default_value_t = OnErrorArg::Continue)]
    pub on_policy_error: OnErrorArg,

    /// Before each stage of a capacity search (`refine=`), the longest
    /// wait for the server to drain what the stage before left: every
    /// role's waiting requests back to 0 (read from the server signals).
    /// 0s starts each search stage as soon as this client's requests ended.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = nyann_model::parse_duration)]
    pub server_drain_wait: Duration,

    #[command(flatten)]
    pub sandbox: SandboxArgs,
}

impl PolicyArgs {
    /// Load the policy these flags name.
    pub fn load(&self) -> anyhow::Result<Policy> {
        self.sandbox.load(&self.policy)
    }
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
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = nyann_model::parse_duration)]
    pub policy_timeout: Duration,

    /// Largest policy component accepted (e.g. `64MiB`, `100MB`), checked
    /// before it is read or compiled.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub policy_max_size: u64,

    /// `off` compiles the policy at every load instead of keeping its
    /// compiled code on disk (in $NYANN_BENCH_CACHE_DIR, else
    /// ~/.cache/nyann-bench; each entry checked against a key of yours in
    /// ~/.local/state/nyann-bench before its code is run).
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = CacheArg::On, env = "NYANN_BENCH_POLICY_CACHE")]
    pub policy_cache: CacheArg,
}

/// `--policy-cache`: whether compiled policy code is kept on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheArg {
    On,
    Off,
}

impl SandboxArgs {
    /// Load `policy` (`builtin` or a component file) under these budgets.
    pub fn load(&self, policy: &str) -> anyhow::Result<Policy> {
        let config = HostConfig {
            judge_fuel: self.policy_fuel,
            call_timeout: self.policy_timeout,
            max_component_bytes: self.policy_max_size,
            ..HostConfig::default()
        };
        let config = match self.policy_cache {
            CacheArg::On => config,
            CacheArg::Off => HostConfig {
                cache_dir: None,
                ..config
            },
        };
        let host = PolicyHost::new(config)?;
        let loaded = if policy == nyann_policy_host::BUILTIN {
            host.load_builtin()
        } else {
            host.load_file(&PathBuf::from(policy))
        };
        loaded.map_err(|e| match e {
            PolicyError::TooLarge { .. } => {
                anyhow::anyhow!("{e}; raise the limit with --policy-max-size if you trust it")
            }
            e => e.into(),
        })
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
    /// How the check uses its verdicts.
    pub fn settings(&self) -> CheckSettings {
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

/// Everything that can fail before load is sent: `Ok(None)` when no stage
/// carries a stop condition; otherwise the policy must load, a signal
/// source must be configured unless the policy reads no server signals,
/// every `until_congested(...)` call's parameters must pass the policy's
/// checks, and the source's preflight must find every role's server.
pub async fn prepare(
    scenario: &Scenario,
    signal_options: &SignalOptions,
    policy_args: &PolicyArgs,
) -> anyhow::Result<Option<CongestionCheck>> {
    if !nyann_check::judges_any_stage(scenario) {
        if signal_options.prometheus_url.is_some() || !signal_options.scrape.is_empty() {
            tracing::warn!(
                "no stage of the scenario is judged (no until_congested(...)): the server \
                 signals of --scrape/--prometheus-url are not read; wrap the stages in \
                 until_congested(...) to judge them (with --policy-mode monitor to record \
                 the verdicts without stopping)"
            );
        }
        return Ok(None);
    }
    if policy_args.policy_mode == ModeArg::Monitor && scenario.searches_capacity() {
        tracing::warn!(
            "refine= has no effect with --policy-mode monitor: no sweep stops, so no capacity \
             is searched (every stage is run and judged instead)"
        );
    }
    // Its errors name the policy already ("cannot load policy X: ...").
    let policy = policy_args.load()?;
    let source = SignalSource::from_options(signal_options)
        .await
        .map_err(super::signals::explain)?;
    let check = match CongestionCheck::new(scenario, policy, source, policy_args.settings()) {
        Ok(check) => check,
        Err(err @ CheckError::NoSignalSource { .. }) => bail!(
            "{err}: give --prometheus-url URL with --deploy-name NAME (or --selector \
             ROLE='{{...}}'), or --scrape [ROLE=]URL to sample the servers' /metrics directly"
        ),
        Err(err) => return Err(err.into()),
    };
    if let Some(source) = check.source() {
        let warnings = source.preflight().await.map_err(super::signals::explain)?;
        for warning in &warnings {
            tracing::warn!("{}", super::signals::warning(warning));
        }
    }
    let policy = check.policy();
    let info = policy.info();
    tracing::info!(
        "congestion policy {} {} ({}, mode {}); server signals: {}",
        info.name,
        info.version,
        policy.origin(),
        format!("{:?}", policy_args.policy_mode).to_lowercase(),
        match check.source() {
            Some(source) => source.to_string(),
            None => "none (the policy judges client figures only)".to_string(),
        }
    );
    Ok(Some(check))
}
