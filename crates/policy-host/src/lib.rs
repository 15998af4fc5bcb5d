//! The wasmtime host for congestion policies: loads a policy component (the
//! embedded built-in, or a user's `.wasm`), checks `until_congested(...)`
//! parameters against its `describe()` and `validate()`, and calls `judge`
//! after each measured stage, in a sandbox.
//!
//! ```no_run
//! # async fn demo(stop: &nyann_model::scenario::StopCondition,
//! #               stage: &nyann_model::observation::StageObservation)
//! #               -> Result<(), nyann_policy_host::PolicyError> {
//! use nyann_policy_host::{HostConfig, PolicyHost};
//!
//! let host = PolicyHost::new(HostConfig::default())?;   // once per process
//! let policy = host.load_builtin()?;                     // or host.load_file(path)?
//! let params = policy.check_params(stop)?;               // at scenario load
//! let verdict = policy.judge(&params, stage, &[]).await?; // after each stage
//! # let _ = verdict; Ok(()) }
//! ```
//!
//! Sandbox (DESIGN.md "Policy host and sandbox"): one `Engine` with epoch
//! interruption and a ticker thread; each component compiled once (and its
//! compiled code cached on disk); the bindgen `Pre` built once, which
//! type-checks the exports at load; a fresh `Store` and instance per call
//! with a memory cap and a deadline; an empty WASI context with stderr
//! captured; results, reasons and log volume bounded; sync calls kept off
//! the async runtime's worker threads.

mod cache;
mod convert;
pub mod error;
mod inspect;
pub mod params;
mod sandbox;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nyann_model::observation::{PolicyInfo, StageObservation, Verdict};
use nyann_model::scenario::{Param, StopCondition};
use wasmtime::component::Linker;
use wasmtime::{Config, Engine};

pub use cache::default_cache_dir;
pub use error::{CallFailure, PolicyError};
pub use inspect::{SUPPORTED_VERSIONS, supported_versions};

use error::{human_bytes, truncate};
use sandbox::{CallStore, CongestionPolicyPre, HostState, Limits};

/// The built-in policy component: `policies/builtin` compiled for
/// wasm32-wasip2 and committed, so that building the host needs no wasm
/// toolchain (`cargo xtask builtin` regenerates it; a test checks that it
/// matches its source).
pub const BUILTIN_WASM: &[u8] = include_bytes!("../../../policies/builtin/builtin.wasm");

/// The WIT contract policies implement (`wit/policy.wit`), for
/// `nyann-bench policy wit`.
pub const WIT: &str = include_str!("../../../wit/policy.wit");

/// The name `load_builtin` policies report as their origin.
pub const BUILTIN: &str = "builtin";

/// Limits and settings of the host. `Default` gives the documented defaults.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Wall-clock limit of one call (`--policy-timeout`). Default 100 ms.
    pub call_timeout: Duration,
    /// Linear-memory cap of one instance. Default 64 MiB.
    pub memory_limit_bytes: usize,
    /// Most reasons a verdict may carry. Default 32.
    pub max_reasons: usize,
    /// Longest reason, and longest error message kept. Default 1024 bytes.
    pub max_reason_bytes: usize,
    /// Log volume a call may write through the `log` import (the excess is
    /// dropped with a warning). Default 64 KiB.
    pub max_log_bytes: usize,
    /// Bytes of stderr captured per call (writing more traps). Default 64 KiB.
    pub max_stderr_bytes: usize,
    /// Where compiled code is cached; `None` compiles on every load.
    /// Default: [`default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            call_timeout: Duration::from_millis(100),
            memory_limit_bytes: 64 << 20,
            max_reasons: 32,
            max_reason_bytes: 1024,
            max_log_bytes: 64 << 10,
            max_stderr_bytes: 64 << 10,
            cache_dir: default_cache_dir(),
        }
    }
}

/// The policy host: one per process. Cheap to clone.
#[derive(Clone)]
pub struct PolicyHost {
    inner: Arc<HostInner>,
}

struct HostInner {
    engine: Engine,
    linker: Linker<HostState>,
    config: HostConfig,
    limits: Limits,
}

/// Largest policy file accepted (componentize-py output reaches ~40 MB).
const MAX_COMPONENT_BYTES: u64 = 128 << 20;

impl PolicyHost {
    /// Set up the engine, its epoch ticker thread and the linker. Loads nothing.
    pub fn new(config: HostConfig) -> Result<Self, PolicyError> {
        if config.call_timeout.is_zero() {
            return Err(PolicyError::Host(
                "the policy call timeout must be > 0".into(),
            ));
        }
        let mut wasm_config = Config::new();
        wasm_config
            .wasm_component_model(true)
            .epoch_interruption(true);
        let engine = Engine::new(&wasm_config)
            .map_err(|e| PolicyError::Host(format!("cannot create the engine: {e:#}")))?;
        let linker = sandbox::linker(&engine)
            .map_err(|e| PolicyError::Host(format!("cannot link WASI: {e:#}")))?;
        // A tenth of the timeout, between 1 and 10 ms: deadlines land within
        // ~10% of the limit without waking the ticker needlessly often.
        let epoch_tick =
            (config.call_timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(10));
        spawn_ticker(&engine, epoch_tick)?;
        let limits = Limits {
            timeout: config.call_timeout,
            epoch_tick,
            memory_bytes: config.memory_limit_bytes,
            stderr_bytes: config.max_stderr_bytes,
            log_bytes: config.max_log_bytes,
        };
        Ok(PolicyHost {
            inner: Arc::new(HostInner {
                engine,
                linker,
                config,
                limits,
            }),
        })
    }

    /// The configuration the host runs with.
    pub fn config(&self) -> &HostConfig {
        &self.inner.config
    }

    /// Load the embedded built-in policy.
    pub fn load_builtin(&self) -> Result<Policy, PolicyError> {
        self.load_bytes(BUILTIN, BUILTIN_WASM)
    }

    /// Load a policy component from a `.wasm` file.
    pub fn load_file(&self, path: &Path) -> Result<Policy, PolicyError> {
        let origin = path.display().to_string();
        let load_err = |message: String| PolicyError::Load {
            origin: origin.clone(),
            message,
        };
        let meta = std::fs::metadata(path).map_err(|e| load_err(format!("cannot read it: {e}")))?;
        if meta.len() > MAX_COMPONENT_BYTES {
            return Err(load_err(format!(
                "is {} bytes; policies are limited to {}",
                meta.len(),
                human_bytes(MAX_COMPONENT_BYTES as usize)
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| load_err(format!("cannot read it: {e}")))?;
        self.load_bytes(&origin, &bytes)
    }

    /// Load a policy component from bytes; `origin` names it in messages
    /// until `describe` gives its name.
    pub fn load_bytes(&self, origin: &str, bytes: &[u8]) -> Result<Policy, PolicyError> {
        let load_err = |message: String| PolicyError::Load {
            origin: origin.to_string(),
            message,
        };
        let inner = &self.inner;
        inspect::check_bytes(bytes).map_err(load_err)?;
        let component =
            cache::load_or_compile(&inner.engine, inner.config.cache_dir.as_deref(), bytes)
                .map_err(|e| load_err(format!("is not a valid component: {e:#}")))?;
        inspect::check_component(&inner.engine, &component).map_err(load_err)?;
        let instance_pre = inner
            .linker
            .instantiate_pre(&component)
            .map_err(|e| load_err(format!("cannot be linked: {e:#}")))?;
        let pre = CongestionPolicyPre::new(instance_pre).map_err(|e| {
            load_err(format!(
                "does not implement {} as this host knows it: {e:#}",
                inspect::supported_versions()
            ))
        })?;
        let mut policy = PolicyInner {
            engine: inner.engine.clone(),
            pre,
            info: PolicyInfo {
                name: origin.to_string(),
                version: String::new(),
                summary: String::new(),
                params: Vec::new(),
            },
            name: Arc::from(origin),
            origin: origin.to_string(),
            limits: inner.limits.clone(),
            max_reasons: inner.config.max_reasons,
            max_reason_bytes: inner.config.max_reason_bytes,
        };
        let info = off_runtime(|| {
            policy.call("describe", None, |store, p| {
                p.nyann_policy_policy().call_describe(store)
            })
        })
        .map_err(|e| {
            load_err(format!(
                "describe() failed: {}",
                e.failure().map(ToString::to_string).unwrap_or_default()
            ))
        })?;
        let info = convert::info_from_wit(info);
        check_info(&info, inner.config.max_reason_bytes)
            .map_err(|m| load_err(format!("describe() returned {m}")))?;
        policy.name = Arc::from(info.name.as_str());
        policy.info = info;
        Ok(Policy {
            inner: Arc::new(policy),
        })
    }
}

/// A loaded policy. Cheap to clone; calls may run concurrently.
#[derive(Clone)]
pub struct Policy {
    inner: Arc<PolicyInner>,
}

struct PolicyInner {
    engine: Engine,
    pre: CongestionPolicyPre<HostState>,
    info: PolicyInfo,
    name: Arc<str>,
    origin: String,
    limits: Limits,
    max_reasons: usize,
    max_reason_bytes: usize,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.inner.info.name)
            .field("origin", &self.inner.origin)
            .finish()
    }
}

impl Policy {
    /// What `describe()` returned at load.
    pub fn info(&self) -> &PolicyInfo {
        &self.inner.info
    }

    /// The policy's name (from `describe()`), used in every message.
    pub fn name(&self) -> &str {
        &self.inner.info.name
    }

    /// `builtin` or the file it was loaded from.
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// Check one `until_congested(...)` call's parameters: against
    /// `describe()` (unknown name, duplicate, missing required, wrong kind;
    /// defaults filled, durations converted to seconds), then the policy's
    /// own `validate()`. Errors name the call's scenario location. Returns
    /// the parameters to pass to [`Policy::judge`].
    pub fn check_params(&self, stop: &StopCondition) -> Result<Vec<Param>, PolicyError> {
        let params_err = |message: String| PolicyError::Params {
            policy: self.name().to_string(),
            location: stop.location.clone(),
            message,
        };
        let params = params::check(&self.inner.info, &stop.params).map_err(params_err)?;
        let wit_params = convert::params_to_wit(&params);
        let result = off_runtime(|| {
            self.inner.call("validate", None, |store, p| {
                p.nyann_policy_policy().call_validate(store, &wit_params)
            })
        });
        match result {
            Ok(Ok(())) => Ok(params),
            Ok(Err(msg)) => Err(params_err(truncate(&msg, self.inner.max_reason_bytes))),
            Err(err) => Err(params_err(format!(
                "the policy's validate() {}",
                err.failure().map(ToString::to_string).unwrap_or_default()
            ))),
        }
    }

    /// Judge a finished stage: `params` from [`Policy::check_params`],
    /// `history` the earlier measured stages of the sweep, oldest first.
    /// Runs on tokio's blocking pool (a fresh instance, bounded in time and
    /// memory). Errors read `policy <name>: <what happened> at stage <n>`.
    pub async fn judge(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, PolicyError> {
        let call = JudgeCall::new(params, stage, history);
        let policy = self.inner.clone();
        let index = stage.index;
        tokio::task::spawn_blocking(move || policy.judge(&call))
            .await
            .unwrap_or_else(|e| Err(policy_panic(&self.inner, index, e)))
    }

    /// [`Policy::judge`] for callers without an async runtime (or inside
    /// one, from synchronous code: the call then runs on a scoped thread).
    pub fn judge_blocking(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, PolicyError> {
        let call = JudgeCall::new(params, stage, history);
        off_runtime(|| self.inner.judge(&call))
    }
}

fn policy_panic(policy: &PolicyInner, stage: u32, err: tokio::task::JoinError) -> PolicyError {
    PolicyError::Call {
        policy: policy.name.to_string(),
        function: "judge",
        stage: Some(stage),
        failure: CallFailure::Internal(format!("the host's judge task failed: {err}")),
    }
}

/// The arguments of one `judge`, converted to the guest's types up front.
struct JudgeCall {
    index: u32,
    params: Vec<sandbox::wit::Param>,
    stage: sandbox::wit::StageObservation,
    history: Vec<sandbox::wit::StageObservation>,
}

impl JudgeCall {
    fn new(params: &[Param], stage: &StageObservation, history: &[StageObservation]) -> Self {
        JudgeCall {
            index: stage.index,
            params: convert::params_to_wit(params),
            stage: convert::stage_to_wit(stage),
            history: history.iter().map(convert::stage_to_wit).collect(),
        }
    }
}

impl PolicyInner {
    fn judge(&self, call: &JudgeCall) -> Result<Verdict, PolicyError> {
        let fail = |failure| PolicyError::Call {
            policy: self.name.to_string(),
            function: "judge",
            stage: Some(call.index),
            failure,
        };
        let result = self.call("judge", Some(call.index), |store, p| {
            p.nyann_policy_policy()
                .call_judge(store, &call.params, &call.stage, &call.history)
        })?;
        let verdict = result
            .map_err(|msg| fail(CallFailure::Rejected(truncate(&msg, self.max_reason_bytes))))?;
        if verdict.reasons.len() > self.max_reasons {
            return Err(fail(CallFailure::OversizedOutput(format!(
                "{} reasons; the limit is {}",
                verdict.reasons.len(),
                self.max_reasons
            ))));
        }
        if let Some((i, r)) = verdict
            .reasons
            .iter()
            .enumerate()
            .find(|(_, r)| r.len() > self.max_reason_bytes)
        {
            return Err(fail(CallFailure::OversizedOutput(format!(
                "reason {} is {} bytes; the limit is {}",
                i + 1,
                r.len(),
                human_bytes(self.max_reason_bytes)
            ))));
        }
        Ok(convert::verdict_from_wit(verdict))
    }

    /// Run one export in a fresh store and instance; classify failures.
    fn call<R>(
        &self,
        function: &'static str,
        stage: Option<u32>,
        f: impl FnOnce(
            &mut wasmtime::Store<HostState>,
            &sandbox::CongestionPolicy,
        ) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyError> {
        let mut cs = CallStore::new(&self.engine, self.name.clone(), &self.limits);
        let result = self
            .pre
            .instantiate(&mut cs.store)
            .and_then(|instance| f(&mut cs.store, &instance));
        let dropped = cs.dropped_log_lines();
        if dropped > 0 {
            tracing::warn!(
                policy = &*self.name,
                "dropped {dropped} log line(s) over the {} per-call limit",
                human_bytes(self.limits.log_bytes)
            );
        }
        match result {
            Ok(value) => {
                let stderr = cs.stderr();
                if !stderr.trim().is_empty() {
                    tracing::debug!(
                        policy = &*self.name,
                        "{function} wrote to stderr: {}",
                        truncate(stderr.trim(), 4096)
                    );
                }
                Ok(value)
            }
            Err(err) => Err(PolicyError::Call {
                policy: self.name.to_string(),
                function,
                stage,
                failure: cs.failure(&err, &self.limits),
            }),
        }
    }
}

/// Run a synchronous guest call where wasmtime-wasi's sync shims may block:
/// on this thread when it is not inside a tokio runtime, else on a scoped
/// thread (blocking a worker thread would panic in the shims).
fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| match s.spawn(f).join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Bump the engine's epoch every `tick` until the engine is gone.
fn spawn_ticker(engine: &Engine, tick: Duration) -> Result<(), PolicyError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("nyann-policy-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(tick);
            }
        })
        .map(|_| ())
        .map_err(|e| PolicyError::Host(format!("cannot start the epoch ticker thread: {e}")))
}

/// Refuse a `describe()` result the host cannot use or print.
fn check_info(info: &PolicyInfo, max_text: usize) -> Result<(), String> {
    const MAX_PARAMS: usize = 64;
    let ident = |s: &str| {
        !s.is_empty()
            && s.len() <= 64
            && s.starts_with(|c: char| c.is_ascii_lowercase())
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    };
    if !ident(&info.name) {
        return Err(format!(
            "an invalid name {:?} (lowercase letters, digits, `-`, `_`; at most 64)",
            truncate(&info.name, 80)
        ));
    }
    if info.version.len() > 64 || info.summary.len() > max_text {
        return Err(format!(
            "a version or summary over the limits (64 and {max_text} bytes)"
        ));
    }
    if info.params.len() > MAX_PARAMS {
        return Err(format!(
            "{} parameters; the limit is {MAX_PARAMS}",
            info.params.len()
        ));
    }
    for (i, spec) in info.params.iter().enumerate() {
        if !ident(&spec.name) || spec.name.contains('-') {
            return Err(format!(
                "an invalid parameter name {:?} (snake_case, at most 64)",
                truncate(&spec.name, 80)
            ));
        }
        if info.params[..i].iter().any(|s| s.name == spec.name) {
            return Err(format!("parameter `{}` twice", spec.name));
        }
        if spec.doc.len() > max_text {
            return Err(format!(
                "a doc of parameter `{}` over {max_text} bytes",
                spec.name
            ));
        }
        if spec.required && spec.default.is_some() {
            return Err(format!(
                "parameter `{}` both required and with a default",
                spec.name
            ));
        }
        if let Some(default) = &spec.default {
            params::convert(spec, default).map_err(|e| format!("an invalid default: {e}"))?;
        }
    }
    Ok(())
}
