//! The per-call sandbox: the bindgen glue, the store state (an empty WASI
//! context, the memory limiter, the bounded log), and the translation of a
//! failed call into a [`CallFailure`].
//!
//! Every call gets a fresh `Store` and instance: a trapped instance can never
//! be entered again, and a fresh one keeps calls independent (policies are
//! pure functions of their arguments).

use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, ResourceLimiter, Store};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::error::{CallFailure, human_bytes, truncate};

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "congestion-policy",
});

pub(crate) use nyann::policy::types as wit;

/// The bounds every call runs under (from [`crate::HostConfig`]).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub timeout: Duration,
    pub epoch_tick: Duration,
    pub memory_bytes: usize,
    pub stderr_bytes: usize,
    pub log_bytes: usize,
}

/// What a store carries for one call.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    memory_cap: usize,
    memory_cap_hit: bool,
    log: LogSink,
}

/// The guest's `log` import: forwarded to `tracing`, bounded per call.
struct LogSink {
    policy: Arc<str>,
    budget: usize,
    dropped: usize,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            // Trap rather than let the guest see a failed grow: a guest
            // allocator would abort anyway, and the flag names the cause.
            self.memory_cap_hit = true;
            wasmtime::bail!(
                "policy memory cap of {} reached (growing to {desired} bytes)",
                human_bytes(self.memory_cap)
            );
        }
        Ok(maximum.is_none_or(|max| desired <= max))
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        const MAX_TABLE_ELEMENTS: usize = 1 << 20;
        if desired > MAX_TABLE_ELEMENTS {
            self.memory_cap_hit = true;
            wasmtime::bail!("policy table cap of {MAX_TABLE_ELEMENTS} elements reached");
        }
        Ok(maximum.is_none_or(|max| desired <= max))
    }
}

impl nyann::policy::types::Host for HostState {}

impl nyann::policy::host::Host for HostState {
    fn log(&mut self, level: nyann::policy::host::Level, msg: String) {
        use nyann::policy::host::Level;
        const MAX_LINE: usize = 4096;
        let sink = &mut self.log;
        if msg.len() > sink.budget {
            sink.dropped += 1;
            sink.budget = 0;
            return;
        }
        sink.budget -= msg.len();
        let msg = truncate(&msg, MAX_LINE);
        let policy = &*sink.policy;
        match level {
            Level::Debug => tracing::debug!(policy, "{msg}"),
            Level::Info => tracing::info!(policy, "{msg}"),
            Level::Warn => tracing::warn!(policy, "{msg}"),
        }
    }
}

/// The linker every policy is instantiated with: the WASI 0.2 shims (over
/// an empty context) and the `host` interface. Which imports a component may
/// use at all is checked separately, before linking (see `inspect`).
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
    CongestionPolicy::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
    Ok(linker)
}

/// One call's store plus the handle on its captured stderr.
pub(crate) struct CallStore {
    pub store: Store<HostState>,
    stderr: MemoryOutputPipe,
}

impl CallStore {
    /// A fresh store: no capabilities, stderr captured, memory capped,
    /// deadline armed.
    pub fn new(engine: &Engine, policy: Arc<str>, limits: &Limits) -> Self {
        let stderr = MemoryOutputPipe::new(limits.stderr_bytes);
        // Built from scratch: no inherit_*, no preopens, env or args;
        // stdin closed, stdout discarded, sockets denied by default.
        let wasi = WasiCtx::builder().stderr(stderr.clone()).build();
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            memory_cap: limits.memory_bytes,
            memory_cap_hit: false,
            log: LogSink {
                policy,
                budget: limits.log_bytes,
                dropped: 0,
            },
        };
        let mut store = Store::new(engine, state);
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(deadline_ticks(limits));
        CallStore { store, stderr }
    }

    /// What the guest wrote to stderr.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents()).into_owned()
    }

    /// Log lines dropped for exceeding the per-call volume.
    pub fn dropped_log_lines(&self) -> usize {
        self.store.data().log.dropped
    }

    /// Classify a failed call.
    pub fn failure(&self, err: &wasmtime::Error, limits: &Limits) -> CallFailure {
        if self.store.data().memory_cap_hit {
            return CallFailure::MemoryCap(limits.memory_bytes);
        }
        let trap = err.downcast_ref::<wasmtime::Trap>();
        // A full stderr pipe makes the guest's next write fail (Rust's
        // `eprintln!` then panics, unable to print why): the flood is the cause.
        if trap != Some(&wasmtime::Trap::Interrupt)
            && self.stderr.contents().len() >= limits.stderr_bytes
        {
            return CallFailure::OversizedOutput(format!(
                "wrote more than {} to stderr",
                human_bytes(limits.stderr_bytes)
            ));
        }
        match trap {
            Some(wasmtime::Trap::Interrupt) => CallFailure::Deadline(limits.timeout),
            Some(trap) => CallFailure::Crashed {
                trap: trap.to_string(),
                stderr: self.stderr(),
            },
            None => {
                let text = format!("{err:#}");
                CallFailure::Crashed {
                    trap: truncate(&text, 1000),
                    stderr: self.stderr(),
                }
            }
        }
    }
}

/// Epoch ticks for the call's time limit: the deadline fires between
/// `ticks - 1` and `ticks` ticker periods after it is armed, so one tick
/// is added to never stop a call before its limit.
fn deadline_ticks(limits: &Limits) -> u64 {
    let tick = limits.epoch_tick.as_nanos().max(1);
    let ticks = limits.timeout.as_nanos().div_ceil(tick);
    u64::try_from(ticks)
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}
