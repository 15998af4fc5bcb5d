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
//! Loading, in order, each step refusing with a message that says what is
//! wrong: the size (before reading it all), the binary's own sections
//! (component or not, interface version, imports, number of memories:
//! `inspect`), compiling (bounded in time; the compiled code is cached on
//! disk, the cache bounded in size: `cache`; the built-in's code ships
//! precompiled for x86-64 Linux: `precompiled`), the exports against the
//! version's WIT (`shape`), linking, then `describe()`.
//!
//! Calling: a fresh store and instance per call, on a worker thread of the
//! host's, awaited by an async caller's task (`bounded`), with a fuel budget (the primary, deterministic bound), an
//! epoch deadline and a host-side wall-clock backstop, one cap over all the
//! instance's memories and tables, an empty WASI context with virtual
//! clocks and seeded randomness, and bounded results, reasons and logs
//! (`sandbox`). Interface versions live side by side, one adapter each
//! (`versions`).

mod bounded;
mod cache;
mod digest;
pub mod error;
mod inspect;
pub mod params;
pub mod precompiled;
mod sandbox;
mod shape;
mod versions;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nyann_model::observation::{FiredRule, PolicyInfo, StageObservation, Verdict};
use nyann_model::scenario::{Param, StopCondition};
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, Store};

pub use cache::{default_cache_dir, default_key_file};
pub use digest::ComponentDigest;
pub use error::{CallFailure, PolicyError, printable};
pub use inspect::CodeLimits;
pub use versions::{Interface, supported_versions};

use bounded::Unfinished;
use error::{human_bytes, truncate};
pub use sandbox::CallOutput;
use sandbox::{Budget, CallStore, CallWorld, HostState, Limits};
use versions::Pre;

/// The built-in policy component: `policies/builtin` compiled for
/// wasm32-wasip2 and committed, so that building the host needs no wasm
/// toolchain (`cargo xtask builtin` regenerates it; a test checks that it
/// matches its source).
pub const BUILTIN_WASM: &[u8] = include_bytes!("../../../policies/builtin/builtin.wasm");

/// The name `load_builtin` policies report as their origin.
pub const BUILTIN: &str = "builtin";

/// Limits and settings of the host. `Default` gives the documented defaults.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Fuel of one `judge` call: roughly the WebAssembly instructions it may
    /// run (the primary budget: it counts work, not time, so it never trips
    /// because the machine is busy). Default 500 million.
    pub judge_fuel: u64,
    /// Wall-clock backstop of one `judge` call (`--policy-timeout`): above
    /// what its budgets take, so that they, which count work and not time,
    /// stop a runaway call. Measured on 2 busy cores (`cargo bench -p
    /// nyann-policy-host --bench policy -- budgets`): 500 million fuel take
    /// 0.1 s looping on the guest's own code, 0.5-0.7 s looping on the
    /// clock; a loop of `log` calls stops at 10,000 calls (3 ms). Default
    /// 3 s.
    pub call_timeout: Duration,
    /// `describe` and `validate`, which run once at load, get this many
    /// times the judge's fuel and wall-clock budgets. Default 10.
    pub load_call_factor: u32,
    /// Cap on all the linear memories and tables of one instance together.
    /// Default 64 MiB.
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
    /// Largest component accepted, checked before reading it
    /// (`--policy-max-size`). Default 64 MiB (componentize-py output is
    /// 18-40 MB).
    pub max_component_bytes: u64,
    /// Most functions and bytes of code a component may ask to compile,
    /// counted before compiling. Default 30,000 functions, 16 MiB of code
    /// and 1 MiB per function (compiling one function costs more than in
    /// proportion to its size). The built-in has 311 functions and 85 KB
    /// of code; a componentize-py policy, with CPython inside, 13,357 and
    /// 6.3 MiB (its largest function 417 KiB), and takes about 19 s of CPU
    /// and 400 MB to compile (wasmtime compiles on every core).
    pub code_limits: CodeLimits,
    /// Longest compile of a component before its load is refused (a
    /// backstop: the code limits bound what compiling costs). Default 2 min.
    pub compile_timeout: Duration,
    /// Where compiled code is cached; `None` compiles on every load.
    /// Default: [`default_cache_dir`]. It must be the user's own and
    /// writable by nobody else, or the cache is not used.
    pub cache_dir: Option<PathBuf>,
    /// The secret that keys the MAC of every cache entry: created on first
    /// use (mode 0600), outside the cache directory. Default:
    /// [`default_key_file`]; `None` leaves the cache unused.
    pub cache_key_file: Option<PathBuf>,
    /// Total size of the cache's entries; the oldest go first. Default 512 MiB.
    pub cache_max_bytes: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            judge_fuel: 500_000_000,
            call_timeout: Duration::from_secs(3),
            load_call_factor: 10,
            memory_limit_bytes: 64 << 20,
            max_reasons: 32,
            max_reason_bytes: 1024,
            max_log_bytes: 64 << 10,
            max_stderr_bytes: 64 << 10,
            max_component_bytes: 64 << 20,
            code_limits: CodeLimits {
                max_functions: 30_000,
                max_code_bytes: 16 << 20,
                max_function_bytes: 1 << 20,
            },
            compile_timeout: Duration::from_secs(120),
            cache_dir: default_cache_dir(),
            cache_key_file: default_key_file(),
            cache_max_bytes: 512 << 20,
        }
    }
}

/// How much longer than its wall-clock limit the host waits for a call
/// before abandoning it: the epoch deadline stops guest code at the limit,
/// so only a call stuck outside the guest's code gets this far.
const ABANDON_GRACE: Duration = Duration::from_secs(1);

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
    /// Opened at the first load that needs it; `None` when there is none
    /// or it cannot be trusted (said once).
    disk_cache: OnceLock<Option<cache::DiskCache>>,
}

impl PolicyHost {
    /// Set up the engine, its epoch ticker thread and the linker. Loads nothing.
    pub fn new(config: HostConfig) -> Result<Self, PolicyError> {
        if config.call_timeout.is_zero() || config.judge_fuel == 0 || config.load_call_factor == 0 {
            return Err(PolicyError::Host(
                "the policy call budgets (fuel, time limit, load factor) must be > 0".into(),
            ));
        }
        let mut engine_config = engine_config();
        engine_config.allocation_strategy(InstanceAllocationStrategy::Pooling(
            sandbox::instance_pool(config.memory_limit_bytes),
        ));
        let engine = Engine::new(&engine_config)
            .map_err(|e| PolicyError::Host(format!("cannot create the engine: {e:#}")))?;
        let linker = sandbox::linker(&engine)
            .map_err(|e| PolicyError::Host(format!("cannot link WASI: {e:#}")))?;
        // A tenth of the limit, between 1 and 10 ms: deadlines land within
        // ~10% of the limit without waking the ticker needlessly often.
        let epoch_tick =
            (config.call_timeout / 10).clamp(Duration::from_millis(1), Duration::from_millis(10));
        spawn_ticker(&engine, epoch_tick)?;
        let limits = Limits {
            epoch_tick,
            memory_bytes: config.memory_limit_bytes,
            stderr_bytes: config.max_stderr_bytes,
            log_bytes: config.max_log_bytes,
            slots: sandbox::CallSlots::new(),
        };
        Ok(PolicyHost {
            inner: Arc::new(HostInner {
                engine,
                linker,
                config,
                limits,
                disk_cache: OnceLock::new(),
            }),
        })
    }

    /// The configuration the host runs with.
    pub fn config(&self) -> &HostConfig {
        &self.inner.config
    }

    /// Load the embedded built-in policy: from its precompiled code where
    /// the binary ships it and the engine accepts it, else compiled (or
    /// from the code cache) like any component.
    pub fn load_builtin(&self) -> Result<Policy, PolicyError> {
        self.load_with_artifact(BUILTIN, BUILTIN_WASM, precompiled::BUILTIN_PRECOMPILED)
    }

    /// Load a policy component from a `.wasm` file.
    pub fn load_file(&self, path: &Path) -> Result<Policy, PolicyError> {
        let origin = path.display().to_string();
        let read_err = |e: std::io::Error| PolicyError::Load {
            origin: origin.clone(),
            message: format!("cannot read it: {e}"),
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let size = file.metadata().map_err(read_err)?.len();
        let limit = self.inner.config.max_component_bytes;
        if size > limit {
            return Err(PolicyError::TooLarge {
                origin,
                size,
                limit,
            });
        }
        // Read at most one byte past the limit, in case the file grew.
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        file.take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        self.load_bytes(&origin, &bytes)
    }

    /// Load a policy component from bytes; `origin` names it in messages
    /// until `describe` gives its name.
    pub fn load_bytes(&self, origin: &str, bytes: &[u8]) -> Result<Policy, PolicyError> {
        self.load_with_artifact(origin, bytes, None)
    }

    /// [`PolicyHost::load_bytes`], taking the code from `artifact` (a
    /// precompiled artifact of `bytes` and its digest line, embedded in
    /// this binary) when it is usable. Every other step of a load, the
    /// checks of the binary included, runs the same.
    fn load_with_artifact(
        &self,
        origin: &str,
        bytes: &[u8],
        artifact: Option<(&[u8], &str)>,
    ) -> Result<Policy, PolicyError> {
        let load_err = |message: String| PolicyError::Load {
            origin: origin.to_string(),
            message,
        };
        let inner = &self.inner;
        let config = &inner.config;
        let size = bytes.len() as u64;
        if size > config.max_component_bytes {
            return Err(PolicyError::TooLarge {
                origin: origin.to_string(),
                size,
                limit: config.max_component_bytes,
            });
        }
        let inspected = inspect::inspect(bytes, config.code_limits, config.memory_limit_bytes)
            .map_err(load_err)?;
        let interface = inspected.interface;
        let digest = ComponentDigest::of(bytes);
        let precompiled = artifact.and_then(|artifact| {
            precompiled::load(&inner.engine, artifact, bytes)
                .inspect_err(|e| {
                    tracing::debug!("not using the precompiled code of {origin}: {e}; compiling it")
                })
                .ok()
        });
        let (component, code_source) = match precompiled {
            Some(component) => (component, CodeSource::Precompiled),
            None => cache::load_or_compile(
                &inner.engine,
                inner.disk_cache(),
                config.compile_timeout,
                bytes,
                &digest,
                inspected.code_bytes,
            )
            .map_err(load_err)?,
        };
        shape::check(&inner.engine, &component, interface).map_err(load_err)?;
        // The runtimes' unused network clients (and only those: the
        // inspection refused any other unknown import) become functions
        // that trap, on a copy of the linker of this component's own.
        let trapping;
        let linker = if inspected.traps {
            let mut linker = inner.linker.clone();
            sandbox::link_trapped_imports(&mut linker, &inner.engine, &component)
                .map_err(|e| load_err(format!("cannot link its imports: {e:#}")))?;
            trapping = linker;
            &trapping
        } else {
            &inner.linker
        };
        let instance_pre = linker
            .instantiate_pre(&component)
            .map_err(|e| load_err(link_error(&inspected.built_for, &e)))?;
        let pre = Pre::new(interface, instance_pre).map_err(|e| {
            load_err(format!(
                "does not implement {interface} as this host knows it: {e:#}"
            ))
        })?;
        let judge = Budget {
            fuel: config.judge_fuel,
            wall: config.call_timeout,
        };
        let load = Budget {
            fuel: judge
                .fuel
                .saturating_mul(u64::from(config.load_call_factor)),
            wall: judge.wall.saturating_mul(config.load_call_factor),
        };
        let policy = Arc::new(PolicyInner {
            engine: inner.engine.clone(),
            pre,
            origin: origin.to_string(),
            limits: inner.limits.clone(),
            judge,
            load,
            max_reasons: config.max_reasons,
            max_reason_bytes: config.max_reason_bytes,
        });
        let provisional: Arc<str> = Arc::from(origin);
        let (info, load_output) = policy.call(
            &provisional,
            "describe",
            None,
            load,
            CallWorld::at_load(0),
            |s, p| p.describe(s),
        );
        let info = info.map_err(|e| {
            load_err(format!(
                "describe() failed: {}",
                e.failure().map(ToString::to_string).unwrap_or_default()
            ))
        })?;
        check_info(&info, config.max_reason_bytes)
            .map_err(|m| load_err(format!("describe() returned {m}")))?;
        let info = printable_info(info);
        Ok(Policy {
            name: Arc::from(info.name.as_str()),
            info: Arc::new(info),
            inner: policy,
            code_source,
            digest,
            load_output: Arc::new(load_output),
        })
    }
}

impl HostInner {
    /// The disk cache, opened on first use; a cache that cannot be trusted
    /// is said once and not used.
    fn disk_cache(&self) -> Option<&cache::DiskCache> {
        self.disk_cache
            .get_or_init(|| {
                let dir = self.config.cache_dir.as_deref()?;
                let key_file = self.config.cache_key_file.as_deref();
                cache::DiskCache::open(dir, key_file, self.config.cache_max_bytes)
                    .inspect_err(|why| {
                        tracing::warn!(
                            "not using the policy code cache {}: {why}; each load compiles \
                             the policy instead",
                            dir.display()
                        )
                    })
                    .ok()
            })
            .as_ref()
    }
}

/// A loaded policy. Cheap to clone; calls may run concurrently.
#[derive(Clone)]
pub struct Policy {
    inner: Arc<PolicyInner>,
    info: Arc<PolicyInfo>,
    /// `info.name`, shared with every call's log sink.
    name: Arc<str>,
    code_source: CodeSource,
    digest: ComponentDigest,
    /// What `describe` wrote at load.
    load_output: Arc<CallOutput>,
}

/// Where a loaded policy's machine code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeSource {
    /// The artifact shipped in the binary (the built-in only).
    Precompiled,
    /// The code cache on disk.
    Cached,
    /// Compiled by this load.
    Compiled,
}

struct PolicyInner {
    engine: Engine,
    pre: Pre,
    origin: String,
    limits: Limits,
    judge: Budget,
    load: Budget,
    max_reasons: usize,
    max_reason_bytes: usize,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.info.name)
            .field("origin", &self.inner.origin)
            .finish()
    }
}

impl Policy {
    /// What `describe()` returned at load.
    pub fn info(&self) -> &PolicyInfo {
        &self.info
    }

    /// The policy's name (from `describe()`), used in every message.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// `builtin` or the file it was loaded from.
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// The interface line the component implements.
    pub fn interface(&self) -> Interface {
        self.inner.pre.interface()
    }

    /// Where its machine code came from.
    pub fn code_source(&self) -> CodeSource {
        self.code_source
    }

    /// The SHA-256 of the component's bytes: what judged, whatever its
    /// name, version or file.
    pub fn digest(&self) -> ComponentDigest {
        self.digest
    }

    /// Check one `until_congested(...)` call's parameters: against
    /// `describe()` (unknown name, duplicate, missing required, wrong kind;
    /// defaults filled, durations converted to seconds), then the policy's
    /// own `validate()`. Errors point at the offending keyword when they
    /// name one, else at the call. Returns the parameters to pass to
    /// [`Policy::judge`].
    pub fn check_params(&self, stop: &StopCondition) -> Result<Vec<Param>, PolicyError> {
        self.check_params_with_output(stop).0
    }

    /// [`Policy::check_params`], and what `validate` wrote (nothing when
    /// the parameters were refused before it was called).
    pub fn check_params_with_output(
        &self,
        stop: &StopCondition,
    ) -> (Result<Vec<Param>, PolicyError>, CallOutput) {
        let params_err = |message: String| PolicyError::Params {
            policy: self.name().to_string(),
            location: params::offending(&stop.params, &message)
                .and_then(|name| stop.location_of(name))
                .or(stop.location.as_ref())
                .cloned(),
            message,
        };
        let params = match params::check(&self.info, &stop.params) {
            Ok(params) => params,
            Err(message) => return (Err(params_err(message)), CallOutput::default()),
        };
        let checked = params.clone();
        let world = CallWorld::at_load(1);
        let (result, output) = self.inner.call(
            &self.name,
            "validate",
            None,
            self.inner.load,
            world,
            move |s, p| p.validate(s, &checked),
        );
        let result = match result {
            Ok(Ok(())) => Ok(params),
            Ok(Err(msg)) => Err(params_err(truncate(
                &printable(&msg),
                self.inner.max_reason_bytes,
            ))),
            Err(err) => Err(params_err(format!(
                "the policy's validate() {}",
                err.failure().map(ToString::to_string).unwrap_or_default()
            ))),
        };
        (result, output)
    }

    /// Judge a finished stage: `params` from [`Policy::check_params`],
    /// `history` the earlier measured stages of the sweep, oldest first.
    /// Runs off the async runtime (a fresh instance on a worker thread of
    /// the host's, bounded in fuel, time and memory; the task awaits it,
    /// which needs Tokio's time driver). Errors read
    /// `policy <name>: <what happened> at stage <n>`.
    pub async fn judge(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, PolicyError> {
        self.judge_with_output(params, stage, history).await.0
    }

    /// [`Policy::judge`], and what the call wrote (stdout, stderr, log
    /// lines): `policy check` shows it.
    pub async fn judge_with_output(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> (Result<Verdict, PolicyError>, CallOutput) {
        let args = self.inner.pre.judge_args(params, stage, history);
        let (index, world) = (stage.index, CallWorld::of_stage(stage));
        let (result, output) = self
            .inner
            .call_async(
                &self.name,
                "judge",
                Some(index),
                self.inner.judge,
                world,
                move |s, p| p.judge(s, &args),
            )
            .await;
        (self.judged(index, result), output)
    }

    /// [`Policy::judge`] for synchronous callers (it blocks the calling
    /// thread until the verdict is in, at most the wall-clock backstop).
    pub fn judge_blocking(
        &self,
        params: &[Param],
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, PolicyError> {
        let args = self.inner.pre.judge_args(params, stage, history);
        let (index, world) = (stage.index, CallWorld::of_stage(stage));
        let (result, _) = self.inner.call(
            &self.name,
            "judge",
            Some(index),
            self.inner.judge,
            world,
            move |s, p| p.judge(s, &args),
        );
        self.judged(index, result)
    }

    /// What `describe` wrote when the policy was loaded.
    pub fn load_output(&self) -> &CallOutput {
        &self.load_output
    }

    /// The verdict of a finished `judge` call, checked and made printable.
    fn judged(
        &self,
        index: u32,
        result: Result<Result<Verdict, String>, PolicyError>,
    ) -> Result<Verdict, PolicyError> {
        let verdict = result?.map_err(|msg| {
            self.call_error(
                index,
                CallFailure::Rejected(truncate(&msg, self.inner.max_reason_bytes)),
            )
        })?;
        self.check_verdict(&verdict)
            .map_err(|what| self.call_error(index, CallFailure::OversizedOutput(what)))?;
        // Reasons reach the stage table, the log and the stop line; rule
        // names the report.
        let text = |t: String| printable(&t).into_owned();
        Ok(Verdict {
            reasons: verdict.reasons.into_iter().map(text).collect(),
            fired: verdict
                .fired
                .into_iter()
                .map(|f| FiredRule {
                    rule: text(f.rule),
                    role: f.role.map(text),
                    signals: f.signals.into_iter().map(text).collect(),
                })
                .collect(),
            ..verdict
        })
    }

    /// Refuse a verdict larger than the limits: as many fired rules as
    /// reasons, as many signals per rule, every text within the reason size.
    fn check_verdict(&self, verdict: &Verdict) -> Result<(), String> {
        let (max_items, max_bytes) = (self.inner.max_reasons, self.inner.max_reason_bytes);
        let count = |what: &str, n: usize| {
            if n > max_items {
                Err(format!("{n} {what}; the limit is {max_items}"))
            } else {
                Ok(())
            }
        };
        let size = |what: String, text: &str| {
            if text.len() > max_bytes {
                Err(format!(
                    "{what} is {} bytes; the limit is {}",
                    text.len(),
                    human_bytes(max_bytes)
                ))
            } else {
                Ok(())
            }
        };
        count("reasons", verdict.reasons.len())?;
        for (i, reason) in verdict.reasons.iter().enumerate() {
            size(format!("reason {}", i + 1), reason)?;
        }
        count("fired rules", verdict.fired.len())?;
        for (i, fired) in verdict.fired.iter().enumerate() {
            let what = format!("fired rule {}", i + 1);
            count(&format!("signals in {what}"), fired.signals.len())?;
            for text in [&fired.rule]
                .into_iter()
                .chain(&fired.role)
                .chain(&fired.signals)
            {
                size(format!("a name in {what}"), text)?;
            }
        }
        Ok(())
    }

    fn call_error(&self, stage: u32, failure: CallFailure) -> PolicyError {
        PolicyError::Call {
            policy: self.name.to_string(),
            function: "judge",
            stage: Some(stage),
            failure,
        }
    }
}

impl CallWorld {
    /// What `describe` and `validate` see: the Unix epoch, a clock at zero,
    /// a fixed seed per function.
    fn at_load(function: u64) -> CallWorld {
        CallWorld {
            wall_unix_seconds: 0.0,
            monotonic_ns: 0,
            seed: sandbox::mix(function),
        }
    }

    /// What `judge` sees: the stage's own timeline, and a seed drawn from
    /// the stage's identity (the same stage always gets the same numbers).
    fn of_stage(stage: &StageObservation) -> CallWorld {
        let length = (stage.end_unix_seconds - stage.start_unix_seconds).max(0.0);
        CallWorld {
            wall_unix_seconds: stage.end_unix_seconds.max(0.0),
            monotonic_ns: (length * 1e9) as u64,
            seed: sandbox::mix(
                u64::from(stage.index)
                    ^ stage.end_unix_seconds.to_bits().rotate_left(17)
                    ^ u64::from(stage.sweep.index).rotate_left(41),
            ),
        }
    }
}

impl PolicyInner {
    /// Run one export in a fresh store and instance on a worker thread,
    /// bounded by `budget`; classify failures. Returns what the call wrote
    /// too (nothing when it was abandoned).
    fn call<R: Send + 'static>(
        self: &Arc<Self>,
        name: &Arc<str>,
        function: &'static str,
        stage: Option<u32>,
        budget: Budget,
        world: CallWorld,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R> + Send + 'static,
    ) -> (Result<R, PolicyError>, CallOutput) {
        let started = Instant::now();
        let (inner, policy) = (self.clone(), name.clone());
        let limit = budget.wall.saturating_add(ABANDON_GRACE);
        let outcome = bounded::run(limit, move || {
            inner.call_here(policy, function, budget, world, f)
        });
        call_outcome(outcome, name, function, stage, budget, started)
    }

    /// [`PolicyInner::call`] for an async caller: the task awaits the
    /// worker (no thread of the runtime's blocks, none is handed the call
    /// in between).
    async fn call_async<R: Send + 'static>(
        self: &Arc<Self>,
        name: &Arc<str>,
        function: &'static str,
        stage: Option<u32>,
        budget: Budget,
        world: CallWorld,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R> + Send + 'static,
    ) -> (Result<R, PolicyError>, CallOutput) {
        let started = Instant::now();
        let (inner, policy) = (self.clone(), name.clone());
        let limit = budget.wall.saturating_add(ABANDON_GRACE);
        let outcome = bounded::run_async(limit, move || {
            inner.call_here(policy, function, budget, world, f)
        })
        .await;
        call_outcome(outcome, name, function, stage, budget, started)
    }

    /// The body of [`PolicyInner::call`], on a worker thread. Returns the
    /// store too, for the worker to drop once the caller has the result.
    fn call_here<R>(
        &self,
        policy: Arc<str>,
        function: &str,
        budget: Budget,
        world: CallWorld,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R>,
    ) -> ((Result<R, CallFailure>, CallOutput), Option<CallStore>) {
        match CallStore::new(&self.engine, policy.clone(), &self.limits, budget, world) {
            Ok(mut cs) => {
                let result = self.call_in(&mut cs, &policy, function, budget, f);
                let output = cs.take_output();
                ((result, output), Some(cs))
            }
            Err(e) => (
                (
                    Err(CallFailure::Internal(format!(
                        "cannot create the store: {e:#}"
                    ))),
                    CallOutput::default(),
                ),
                None,
            ),
        }
    }

    /// Call `f` in the fresh store `cs`; log what the call left (dropped
    /// log lines, stdout and stderr, fuel used) and classify a failure.
    fn call_in<R>(
        &self,
        cs: &mut CallStore,
        policy: &str,
        function: &str,
        budget: Budget,
        f: impl FnOnce(&mut Store<HostState>, &Pre) -> wasmtime::Result<R>,
    ) -> Result<R, CallFailure> {
        let started = Instant::now();
        let result = f(&mut cs.store, &self.pre);
        let elapsed = started.elapsed();
        let dropped = cs.dropped_log_lines();
        if dropped > 0 {
            tracing::warn!(
                policy,
                "dropped {dropped} log line(s) over the {} per-call limit",
                human_bytes(self.limits.log_bytes)
            );
        }
        match result {
            Ok(value) => {
                for (name, text) in [("stdout", cs.stdout()), ("stderr", cs.stderr())] {
                    if !text.trim().is_empty() {
                        tracing::debug!(
                            policy,
                            "{function} wrote to {name}: {}",
                            truncate(&printable(text.trim()), 4096)
                        );
                    }
                }
                tracing::trace!(
                    policy,
                    "{function} used {} fuel in {elapsed:?}",
                    cs.fuel_used(budget)
                );
                Ok(value)
            }
            Err(err) => Err(cs.failure(&err, &self.limits, budget, elapsed)),
        }
    }
}

/// The engine's settings. Those the compiled code depends on (fuel
/// counting, epoch checks) are also those of the built-in's precompiled
/// artifact (`precompiled::precompile`), which wasmtime refuses when they
/// differ.
fn engine_config() -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        .wasm_backtrace_max_frames(std::num::NonZeroUsize::new(sandbox::BACKTRACE_FRAMES));
    config
}

/// A call's result, or its failure classified, and what it wrote: a call
/// abandoned past its wall-clock limit (plus grace) missed its deadline.
fn call_outcome<R>(
    outcome: Result<(Result<R, CallFailure>, CallOutput), Unfinished>,
    name: &Arc<str>,
    function: &'static str,
    stage: Option<u32>,
    budget: Budget,
    started: Instant,
) -> (Result<R, PolicyError>, CallOutput) {
    let fail = |failure| PolicyError::Call {
        policy: name.to_string(),
        function,
        stage,
        failure,
    };
    match outcome {
        Ok((result, output)) => (result.map_err(fail), output),
        Err(Unfinished::Abandoned { .. }) => (
            Err(fail(CallFailure::Deadline {
                limit: budget.wall,
                elapsed: started.elapsed(),
            })),
            CallOutput::default(),
        ),
        Err(Unfinished::Failed(e)) => (Err(fail(CallFailure::Internal(e))), CallOutput::default()),
    }
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

/// Why a component that passed the checks cannot be linked: it imports a
/// host function its interface line does not have here. Said the same way
/// for every line, naming the function and what to do: a newer
/// nyann-bench when the component is built for a newer version of the
/// line, else a rebuild against the released WIT (the function is in no
/// release this host knows).
fn link_error(built_for: &str, err: &wasmtime::Error) -> String {
    let line = versions::Interface::of_version(built_for).unwrap_or(Interface::NEWEST);
    let ours = format!("{}.0", line.line());
    let package = versions::PACKAGE;
    // wasmtime's chain: "component imports instance `X`, but ...", then
    // "instance export `F` has the wrong type", then the type mismatch.
    let quoted = |prefix: &str| {
        err.chain().find_map(|cause| {
            let text = cause.to_string();
            let rest = &text[text.find(prefix)? + prefix.len()..];
            Some(rest[..rest.find('`')?].to_string())
        })
    };
    let what = match (quoted("imports instance `"), quoted("instance export `")) {
        (Some(instance), Some(function)) => format!("imports `{function}` from `{instance}`"),
        (Some(instance), None) => format!("imports `{instance}`"),
        _ => format!("imports what this host does not have ({err:#})"),
    };
    let fix = if inspect::semver(built_for) > inspect::semver(&ours) {
        format!(
            "it is built for {package}@{built_for}, a newer version of the line: a newer \
             nyann-bench is needed"
        )
    } else {
        format!(
            "{package}@{ours} has no such function: rebuild the policy against the released \
             WIT (the one `nyann-bench policy wit` prints), or use the nyann-bench it was built for"
        )
    };
    format!("{what}, which this host's {package}@{ours} does not have; {fix}")
}

/// The description with its prose (version, summary, parameter docs) made
/// [`printable`]: `policy describe` and the logs print it. Names are
/// identifiers already; default values are data, escaped where printed.
fn printable_info(info: PolicyInfo) -> PolicyInfo {
    let text = |t: String| printable(&t).into_owned();
    PolicyInfo {
        version: text(info.version),
        summary: text(info.summary),
        params: info
            .params
            .into_iter()
            .map(|p| nyann_model::observation::ParamSpec {
                doc: text(p.doc),
                ..p
            })
            .collect(),
        ..info
    }
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
