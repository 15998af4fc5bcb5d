//! The congestion check: after each measured stage that carries an
//! `until_congested(...)` stop condition, read the server signals of the
//! stage, ask the policy for a verdict, and stop the sweep when it says
//! "congested". Each `until_congested(...)` call is a sweep of its own: the
//! policy's history holds that sweep's stages only, and its stop skips the
//! rest of that sweep only.
//!
//! It plugs into the stage runner as its [`StageHook`], so it runs after the
//! stage's requests completed and before the next stage starts, while the
//! load holds the finished stage's level. Everything it can check up front
//! (a signal source is configured, the policy loads, every stop condition's
//! parameters pass the policy's `describe`/`validate`, the signal source
//! answers and every role finds its server's series) is checked by
//! [`CongestionCheck::prepare`] before any request is sent.
//!
//! Failures never stop a sweep by themselves unless asked to: a failed
//! signal query reads as zero and is recorded with the stage (fail-open); a failed policy call is recorded and, by default, the
//! sweep goes on (`--on-policy-error stop` changes that). A signal without
//! series also reads zero, but the record says "no data" for it, and a stage
//! judged with a whole role missing is a warning naming the role.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use nyann_load::{FinishedStage, HookDecision, HookOutcome, StageHook};
use nyann_model::{
    Param, RoleCoverage, RoleSignals, Scenario, StageObservation, Step, StopCondition, SweepRef,
    Verdict,
};
use nyann_policy_host::{HostConfig, Policy, PolicyError, PolicyHost};
use nyann_signals::{ClientEvidence, SignalOptions, SignalSource, StageSignals};
use serde::{Deserialize, Serialize};

/// How the verdicts are used.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    /// A congested verdict stops the sweep.
    Enforce,
    /// Record every verdict, never stop.
    Monitor,
}

/// What a failed policy call (trap, deadline, memory cap, error result) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnPolicyError {
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
    #[arg(long, value_enum, default_value_t = PolicyMode::Enforce)]
    pub policy_mode: PolicyMode,

    /// What a failed policy call does (it is always recorded).
    #[arg(long, value_enum, default_value_t = OnPolicyError::Continue)]
    pub on_policy_error: OnPolicyError,

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

    /// Wall-clock limit of one policy `judge` call: a backstop well above
    /// what the fuel takes even on a busy machine, so that the fuel is what
    /// stops a runaway policy (ten times as much for `describe`/`validate`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = nyann_model::parse_duration)]
    pub policy_timeout: Duration,

    /// Largest policy component accepted (e.g. `64MiB`, `100MB`), checked
    /// before it is read or compiled.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    pub policy_max_size: u64,
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

/// What the check recorded for one judged stage: stored with the stage's
/// result (`stages.json`, the summary) as its [`Judged`] annotation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CongestionRecord {
    pub policy: PolicyRef,
    pub mode: PolicyMode,
    /// The sweep the stage belongs to.
    #[serde(default)]
    pub sweep: SweepRef,
    /// The `until_congested(...)` parameters as written (before the
    /// policy's defaults), so that `policy replay` can judge the stage again.
    #[serde(default)]
    pub params: Vec<Param>,
    /// Every parameter the policy judged with: those written, and its
    /// defaults for the others (durations in seconds). Absent from records
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub judged_params: Vec<Param>,
    /// The server signals per role the policy was shown.
    pub roles: Vec<RoleSignals>,
    /// Per role and signal: whether series were found (a missing signal
    /// reads 0 in `roles`), the metric read, and lower bounds.
    #[serde(default)]
    pub coverage: Vec<RoleCoverage>,
    /// Signal queries that failed (those signals read as zero).
    pub signal_errors: Vec<String>,
    /// The policy's answer; `None` when the call failed.
    pub verdict: Option<Verdict>,
    /// Why the policy call failed, if it did.
    pub policy_error: Option<String>,
    /// Whether this stage's decision stopped its sweep (a congested
    /// verdict in enforce mode, or a failed call with `--on-policy-error stop`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// Time taken by the whole check: signals (including the settle wait) and judge.
    pub check_seconds: f64,
}

/// Which policy judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PolicyRef {
    pub name: String,
    pub version: String,
    /// `builtin` or the component file.
    pub origin: String,
}

/// What the congestion check stores with a judged stage: its annotation
/// in `stages.json` and the summary (`{"congestion": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Judged {
    pub congestion: CongestionRecord,
}

/// A step's result in a run the congestion check judged.
pub type StageResult = nyann_load::StageResult<Judged>;
/// A run the congestion check judged (`summary.json`).
pub type RunResult = nyann_load::RunResult<Judged>;

impl CongestionRecord {
    /// The record stored with a stage result, if the stage was judged.
    pub fn of(stage: &StageResult) -> Option<&CongestionRecord> {
        stage.annotation.as_ref().map(|judged| &judged.congestion)
    }

    /// True when the policy said "congested".
    pub fn congested(&self) -> bool {
        self.verdict.as_ref().is_some_and(|v| v.congested)
    }

    /// The value the policy judged parameter `name` with, and whether it was
    /// the policy's default (not written in the scenario).
    pub fn param(&self, name: &str) -> Option<(&nyann_model::Value, bool)> {
        let written = self.params.iter().find(|p| p.name == name);
        match self.judged_params.iter().find(|p| p.name == name) {
            Some(judged) => Some((&judged.value, written.is_none())),
            None => written.map(|p| (&p.value, false)),
        }
    }
}

/// The stage hook that judges congestion.
pub struct CongestionCheck {
    /// `None` when the policy judges client figures only and no source was
    /// given.
    source: Option<SignalSource>,
    policy: Policy,
    mode: PolicyMode,
    on_error: OnPolicyError,
    /// For each step that carries a stop condition, by step index: its
    /// condition, checked parameters (defaults filled, durations in
    /// seconds) and sweep.
    stops: BTreeMap<usize, Stop>,
    /// Per sweep (`until_congested(...)` call), the stages judged so far,
    /// oldest first: the policy's `history` (a sweep never sees another's).
    history: BTreeMap<u32, Vec<StageObservation>>,
}

impl CongestionCheck {
    /// Everything that can fail before load is sent: `Ok(None)` when no stage
    /// carries a stop condition; otherwise the policy must load, a signal
    /// source must be configured unless the policy reads no server signals,
    /// and every `until_congested(...)` call's parameters must pass the
    /// policy's checks (all errors reported at once).
    pub async fn prepare(
        scenario: &Scenario,
        signal_options: &SignalOptions,
        policy_args: &PolicyArgs,
    ) -> anyhow::Result<Option<CongestionCheck>> {
        let stops: Vec<_> = scenario
            .steps
            .iter()
            .enumerate()
            .filter_map(|(index, step)| match step {
                Step::Stage(stage) => stage.stop.as_ref().map(|stop| (index, stage, stop)),
                Step::Barrier { .. } => None,
            })
            .collect();
        let Some(&(_, _, first)) = stops.first() else {
            if signal_options.prometheus_url.is_some() || !signal_options.scrape.is_empty() {
                tracing::warn!(
                    "no stage of the scenario is judged (no until_congested(...)): the server \
                     signals of --scrape/--prometheus-url are not read; wrap the stages in \
                     until_congested(...) to judge them (with --policy-mode monitor to record \
                     the verdicts without stopping)"
                );
            }
            return Ok(None);
        };
        // Its errors name the policy already ("cannot load policy X: ...").
        let policy = policy_args.load()?;
        let source = SignalSource::from_options(signal_options)
            .await
            .map_err(crate::cli::signals::explain)?;
        if source.is_none() && policy.info().server_signals {
            let at = first
                .location
                .as_ref()
                .map(|l| format!(" (until_congested at {l})"))
                .unwrap_or_default();
            bail!(
                "the scenario stops on congestion{at} but no server signals are configured: \
                 give --prometheus-url URL with --deploy-name NAME (or --selector ROLE='{{...}}'), \
                 or --scrape [ROLE=]URL to sample the servers' /metrics directly \
                 (a policy that judges client figures only says so and needs neither)"
            );
        }
        let checked = check_stop_conditions(scenario, &policy)
            .map_err(|errors| anyhow::anyhow!("{}", errors.join("\n")))?;
        let stops = stops
            .into_iter()
            .zip(checked)
            .map(|((index, stage, stop), params)| {
                let stop = Stop {
                    condition: stop.clone(),
                    params,
                    sweep: sweep_of(stage.sweep, stop),
                };
                (index, stop)
            })
            .collect();
        if let Some(source) = &source {
            let warnings = source
                .preflight()
                .await
                .map_err(crate::cli::signals::explain)?;
            for warning in &warnings {
                tracing::warn!("{}", crate::cli::signals::warning(warning));
            }
        }
        let info = policy.info();
        tracing::info!(
            "congestion policy {} {} ({}, mode {}); server signals: {}",
            info.name,
            info.version,
            policy.origin(),
            format!("{:?}", policy_args.policy_mode).to_lowercase(),
            match &source {
                Some(source) => source.to_string(),
                None => "none (the policy judges client figures only)".to_string(),
            }
        );
        Ok(Some(CongestionCheck {
            source,
            policy,
            mode: policy_args.policy_mode,
            on_error: policy_args.on_policy_error,
            stops,
            history: BTreeMap::new(),
        }))
    }

    /// Starts sampling the servers' `/metrics` (for `--scrape`; a no-op for
    /// Prometheus). Call it before the first stage.
    pub fn start(&self) {
        if let Some(source) = &self.source {
            source.start();
        }
    }

    async fn judge(
        &mut self,
        done: &FinishedStage<'_, Judged>,
        stop: &Stop,
    ) -> HookOutcome<Judged> {
        let started = Instant::now();
        let signals = match &self.source {
            Some(source) => {
                let client = ClientEvidence {
                    longest_first_token_wait_seconds: done.stats.longest_first_token_wait(),
                };
                source
                    .stage_signals(done.start_unix, done.end_unix, client)
                    .await
            }
            None => StageSignals::default(),
        };
        let observation = StageObservation {
            index: u32::try_from(done.index).unwrap_or(u32::MAX),
            name: done.label.to_string(),
            sweep: stop.sweep.clone(),
            concurrency: done.stage.concurrency,
            rate: done.stage.rate,
            start_unix_seconds: done.start_unix,
            end_unix_seconds: done.end_unix,
            roles: signals.roles,
            client: done.client.clone(),
            signal_errors: signals.errors,
        };
        for error in &observation.signal_errors {
            tracing::warn!("stage {}: {error} (reads as 0)", done.label);
        }
        for (role, coverage) in observation.roles.iter().zip(&signals.coverage) {
            if coverage.nothing_found()
                && let Some(source) = &self.source
            {
                tracing::warn!(
                    "stage {}: role {} has no series of any signal ({}): every signal of the role reads 0 for this verdict",
                    done.label,
                    role.role,
                    source.place(&role.role)
                );
            }
            tracing::info!("stage {}: {}", done.label, describe_role(role, coverage));
        }
        let history = self.history.entry(stop.sweep.index).or_default();
        let judged = self.policy.judge(&stop.params, &observation, history).await;
        let info = self.policy.info();
        let mut record = CongestionRecord {
            policy: PolicyRef {
                name: info.name.clone(),
                version: info.version.clone(),
                origin: self.policy.origin().to_string(),
            },
            mode: self.mode,
            sweep: stop.sweep.clone(),
            params: stop.condition.params.clone(),
            judged_params: stop.params.clone(),
            roles: observation.roles.clone(),
            coverage: signals.coverage,
            signal_errors: observation.signal_errors.clone(),
            verdict: None,
            policy_error: None,
            stopped: false,
            check_seconds: 0.0,
        };
        history.push(observation);

        let outcome = match judged {
            Ok(verdict) => {
                log_verdict(done.label, &verdict);
                let stop = verdict.congested && self.mode == PolicyMode::Enforce;
                let reason = format!("congested: {}", verdict.reasons.join("; "));
                record.verdict = Some(verdict);
                if stop {
                    HookOutcome::stop(reason)
                } else {
                    HookOutcome::proceed()
                }
            }
            Err(err) => {
                let message = err.to_string();
                record.policy_error = Some(message.clone());
                match self.on_error {
                    OnPolicyError::Continue => {
                        tracing::warn!("{message}; going on (--on-policy-error continue)");
                        HookOutcome::proceed()
                    }
                    OnPolicyError::Stop => {
                        tracing::error!("{message}; stopping (--on-policy-error stop)");
                        HookOutcome::stop(format!(
                            "policy error at stage {}: {message}",
                            done.label
                        ))
                    }
                }
            }
        };
        record.stopped = matches!(outcome.decision, HookDecision::Stop { .. });
        record.check_seconds = started.elapsed().as_secs_f64();
        outcome.with_annotation(Judged { congestion: record })
    }
}

impl StageHook for CongestionCheck {
    type Annotation = Judged;

    async fn after_stage(&mut self, done: &FinishedStage<'_, Judged>) -> HookOutcome<Judged> {
        match self.stops.get(&done.index).cloned() {
            Some(stop) => self.judge(done, &stop).await,
            None => HookOutcome::proceed(),
        }
    }
}

/// One step's stop condition, ready to judge.
#[derive(Debug, Clone)]
struct Stop {
    condition: StopCondition,
    params: Vec<Param>,
    sweep: SweepRef,
}

/// Check every `until_congested(...)` call of `scenario` against `policy`
/// (each distinct call once: one call gives every stage of its list the
/// same condition): the checked parameters of each stage that carries a
/// condition, in step order, or every error at once.
pub fn check_stop_conditions(
    scenario: &Scenario,
    policy: &Policy,
) -> Result<Vec<Vec<Param>>, Vec<String>> {
    let mut checked: Vec<(&StopCondition, Result<Vec<Param>, String>)> = Vec::new();
    let mut positions = Vec::new();
    for step in &scenario.steps {
        let Step::Stage(stage) = step else { continue };
        let Some(stop) = &stage.stop else { continue };
        let known = checked.iter().position(|(seen, _)| *seen == stop);
        positions.push(known.unwrap_or_else(|| {
            checked.push((stop, policy.check_params(stop).map_err(|e| e.to_string())));
            checked.len() - 1
        }));
    }
    let errors: Vec<String> = checked
        .iter()
        .filter_map(|(_, r)| r.as_ref().err().cloned())
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(positions
        .into_iter()
        .map(|p| checked[p].1.clone().unwrap_or_default())
        .collect())
}

/// The sweep a judged stage belongs to: its `until_congested(...)` call
/// (each call is a sweep of its own), named after where it was called.
fn sweep_of(index: u32, stop: &StopCondition) -> SweepRef {
    SweepRef {
        index,
        name: stop
            .location
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_else(|| format!("sweep {index}")),
    }
}

/// `[decode] waiting_p50=40 ttft_p99=2.500s kv_usage_max=98.0% preemptions=3`,
/// with `no data` for a signal without series and `>=` before a lower bound.
fn describe_role(role: &RoleSignals, coverage: &RoleCoverage) -> String {
    let show = |signal: &str, text: String| match coverage.get(signal) {
        Some(c) if c.status.no_data() => "no data".to_string(),
        Some(c) if c.lower_bound => format!(">={text}"),
        _ => text,
    };
    format!(
        "[{}] waiting_p50={} ttft_p99={} kv_usage_max={} preemptions={}",
        role.role,
        show(
            "waiting_requests_p50",
            role.waiting_requests_p50.to_string()
        ),
        show("ttft_p99_seconds", format!("{:.3}s", role.ttft_p99_seconds)),
        show(
            "kv_cache_usage_max",
            format!("{:.1}%", role.kv_cache_usage_max * 100.0)
        ),
        show("preemptions", format!("{:.0}", role.preemptions))
    )
}

fn log_verdict(label: &str, verdict: &Verdict) {
    if verdict.congested {
        tracing::warn!("stage {label}: CONGESTED: {}", verdict.reasons.join("; "));
    } else if verdict.reasons.is_empty() {
        tracing::info!("stage {label}: not congested");
    } else {
        tracing::info!(
            "stage {label}: not congested ({})",
            verdict.reasons.join("; ")
        );
    }
}
