//! The policy host: the engine, its epoch ticker and the WASI linker, set
//! up once per process, and loading a component into a [`Policy`], each
//! step refusing with a message that says what is wrong.

use std::io::Read;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nyann_model::observation::PolicyInfo;
use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy};

use crate::digest::ComponentDigest;
use crate::error::{PolicyError, printable, truncate};
use crate::policy::{CodeSource, Policy, PolicyInner};
use crate::sandbox::{self, Budget, CallWorld, HostState, Limits};
use crate::versions::{self, Interface, Pre};
use crate::{BUILTIN, BUILTIN_WASM, HostConfig, cache, inspect, params, precompiled, shape};

/// The policy host: one per process. Cheap to clone.
#[derive(Clone)]
pub struct PolicyHost {
    pub(crate) inner: Arc<HostInner>,
}

pub(crate) struct HostInner {
    pub(crate) engine: Engine,
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
    pub(crate) fn load_with_artifact(
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
        // An operator's allow list, before any byte of it is parsed.
        let digest = ComponentDigest::of(bytes);
        crate::allow::check(&config.allowed, origin, &digest)?;
        let inspected = inspect::inspect(bytes, config.code_limits, config.memory_limit_bytes)
            .map_err(load_err)?;
        let interface = inspected.interface;
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

/// The engine's settings. Those the compiled code depends on (fuel
/// counting, epoch checks) are also those of the built-in's precompiled
/// artifact (`precompiled::precompile`), which wasmtime refuses when they
/// differ.
pub(crate) fn engine_config() -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        .wasm_backtrace_max_frames(std::num::NonZeroUsize::new(sandbox::BACKTRACE_FRAMES));
    config
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
