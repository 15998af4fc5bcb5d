//! The per-call sandbox: what a store carries (an empty WASI context, a
//! virtual clock, seeded randomness, the memory account, the bounded log),
//! the linker that decides what a policy can call at all, and the
//! translation of a failed call into a [`CallFailure`].
//!
//! Every call gets a fresh `Store` and instance: a trapped instance can never
//! be entered again, and a fresh one keeps calls independent (policies are
//! pure functions of their arguments).
//!
//! Nothing a policy can import blocks. The clocks are virtual (the wall
//! clock reads the judged stage's end, the monotonic clock the stage's
//! length, both fixed for the call), and subscribing to a clock instant in
//! the future traps instead of sleeping: a blocked host call is out of reach
//! of fuel and of the epoch deadline, which only interrupt guest code.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime::{Enabled, Engine, PoolingAllocationConfig, ResourceLimiter, Store};
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, DynPollable, Pollable};
use wasmtime_wasi::{HostWallClock, WasiCtx, WasiCtxView, WasiView};

use crate::error::{CallFailure, human_bytes, truncate};

/// Most linear memories a policy may define. Components built by Rust,
/// JavaScript and Python toolchains use one; the component model's shim
/// modules share it.
pub(crate) const MAX_MEMORIES: usize = 4;

/// Most tables and core instances a store may create.
const MAX_TABLES: usize = 64;
const MAX_INSTANCES: usize = 64;

/// What a table element is charged against the memory cap (a pointer).
pub(crate) const TABLE_ELEMENT_BYTES: u64 = 8;

/// Calls that hold a slot of the instance pool at once; more wait for one
/// ([`CallSlots`]). Calls come one at a time in a run (one judgment per
/// stage); the room is for calls abandoned past their deadline and still
/// winding down, and for tests that judge in parallel.
const CONCURRENT_CALLS: u32 = 16;

/// Memory of a slot of the pool kept resident between calls, reset in
/// place (only its pages the call touched, where the kernel can tell:
/// `PAGEMAP_SCAN`, Linux 6.7) instead of unmapped. The built-in touches
/// about 1 MiB.
const KEEP_RESIDENT_BYTES: usize = 4 << 20;

/// Where every call's instance lives: a pool of slots reused call after
/// call. A fresh instance per call would otherwise map its memory anew and
/// fault in every page it touches, then unmap it (shooting down the TLB of
/// the other cores, the load generator's included): a quarter to a third
/// of a judgment.
///
/// The pool refuses nothing the limiter allows: the limiter's cap on
/// memories and tables together is what stops a policy, with the error
/// that names it; the pool's own per-memory and per-table bounds lie
/// beyond it.
pub(crate) fn instance_pool(memory_cap: usize) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(CONCURRENT_CALLS)
        // Stacks for async calls (none here; a thousand by default, each
        // mapped with a guard page when the engine starts).
        .total_stacks(CONCURRENT_CALLS)
        .total_core_instances(CONCURRENT_CALLS * MAX_INSTANCES as u32)
        .total_memories(CONCURRENT_CALLS * MAX_MEMORIES as u32)
        .total_tables(CONCURRENT_CALLS * MAX_TABLES as u32)
        .max_memories_per_module(MAX_MEMORIES as u32)
        .max_tables_per_module(MAX_TABLES as u32)
        .table_elements(memory_cap / TABLE_ELEMENT_BYTES as usize + 1)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(KEEP_RESIDENT_BYTES)
        .pagemap_scan(Enabled::Auto);
    pool
}

/// The bounds one call runs under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Instructions (wasmtime fuel units): the primary, deterministic bound.
    pub fuel: u64,
    /// Wall time: the backstop (the epoch deadline interrupts guest code at
    /// this limit; the host abandons the call a little later).
    pub wall: Duration,
}

/// The bounds every call shares (from [`crate::HostConfig`]).
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub epoch_tick: Duration,
    pub memory_bytes: usize,
    pub stderr_bytes: usize,
    pub log_bytes: usize,
    pub slots: Arc<CallSlots>,
}

/// The pool's slots, counted: a call takes one before it creates its store
/// and gives it back once the store is gone, so that a call never finds the
/// pool full (a failure of the host, not of the policy); it waits instead,
/// within its caller's wall-clock limit.
#[derive(Debug)]
pub(crate) struct CallSlots {
    free: Mutex<u32>,
    freed: Condvar,
}

/// A slot of the pool, held for as long as a store lives.
pub(crate) struct SlotPermit(Arc<CallSlots>);

impl CallSlots {
    pub fn new() -> Arc<CallSlots> {
        Arc::new(CallSlots {
            free: Mutex::new(CONCURRENT_CALLS),
            freed: Condvar::new(),
        })
    }

    fn acquire(self: &Arc<Self>) -> SlotPermit {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        SlotPermit(self.clone())
    }
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.freed.notify_one();
    }
}

/// What the virtual clocks and the random generator show one call: fixed,
/// so that the same inputs give the same behaviour.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallWorld {
    /// `wasi:clocks/wall-clock` (Unix time): the judged stage's end.
    pub wall_unix_seconds: f64,
    /// `wasi:clocks/monotonic-clock` (ns): the judged stage's length.
    pub monotonic_ns: u64,
    /// Seeds `wasi:random` (both the secure and the insecure generator).
    pub seed: u64,
}

/// Levels of the `log` import, shared by every interface version.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LogLevel {
    Debug,
    Info,
    Warn,
}

/// What a store carries for one call.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    memory: MemoryAccount,
    clock: VirtualClock,
    log: LogSink,
}

/// All memories and tables of the instance against one cap.
struct MemoryAccount {
    cap: usize,
    used: usize,
    cap_hit: bool,
}

/// The monotonic clock a policy reads; `waited` records a refused wait.
struct VirtualClock {
    now_ns: u64,
    waited: Option<Duration>,
}

/// The guest's `log` import: forwarded to `tracing` and kept for the
/// call's [`CallOutput`], bounded per call.
struct LogSink {
    policy: Arc<str>,
    budget: usize,
    dropped: usize,
    lines: Vec<String>,
    calls: usize,
}

/// Most `log` calls in one policy call: a host call costs the guest almost
/// no fuel, so without a count a loop of them would run for seconds (17 s
/// on 500 million fuel) before the fuel stopped it.
pub(crate) const MAX_LOG_CALLS: usize = 10_000;

impl HostState {
    /// The `log` import of every interface version: fails (the call traps)
    /// past [`MAX_LOG_CALLS`].
    pub fn log(&mut self, level: LogLevel, msg: &str) -> wasmtime::Result<()> {
        const MAX_LINE: usize = 4096;
        // What a kept line costs the host beyond its text (the level word,
        // the Vec entry): an empty line is not free, or a guest logging ""
        // in a loop grows the host's memory without bound.
        const LINE_OVERHEAD: usize = 32;
        let sink = &mut self.log;
        sink.calls += 1;
        if sink.calls > MAX_LOG_CALLS {
            return Err(wasmtime::Error::msg("too many log calls"));
        }
        let cost = msg.len() + LINE_OVERHEAD;
        if cost > sink.budget {
            sink.dropped += 1;
            sink.budget = 0;
            return Ok(());
        }
        sink.budget -= cost;
        // One line of the host's log: no line breaks or escape sequences.
        let msg = truncate(&crate::error::printable(msg), MAX_LINE);
        let policy = &*sink.policy;
        let word = match level {
            LogLevel::Debug => {
                tracing::debug!(policy, "{msg}");
                "debug"
            }
            LogLevel::Info => {
                tracing::info!(policy, "{msg}");
                "info"
            }
            LogLevel::Warn => {
                tracing::warn!(policy, "{msg}");
                "warn"
            }
        };
        sink.lines.push(format!("[{word}] {msg}"));
        Ok(())
    }
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
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.memory.grow(
            desired.saturating_sub(current),
            maximum.is_some_and(|max| desired > max),
        )
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let elements = desired.saturating_sub(current);
        self.memory.grow(
            elements.saturating_mul(TABLE_ELEMENT_BYTES as usize),
            maximum.is_some_and(|max| desired > max),
        )
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }
}

impl MemoryAccount {
    /// A grow by `bytes`: a trap past the cap, else refused past the memory's
    /// or table's `maximum` (the guest sees the grow fail), else counted.
    /// Trapping at the cap rather than failing the grow: a guest allocator
    /// would abort anyway, and the flag names the cause. The cap comes
    /// first: a pool slot's maximum lies just beyond the cap, so a grow past
    /// the cap is often past the maximum too, and the cap is its cause.
    fn grow(&mut self, bytes: usize, past_maximum: bool) -> wasmtime::Result<bool> {
        let total = self.used.saturating_add(bytes);
        if total > self.cap {
            self.cap_hit = true;
            wasmtime::bail!(
                "policy memory cap of {} reached (memories and tables would total {total} bytes)",
                human_bytes(self.cap)
            );
        }
        if past_maximum {
            return Ok(false);
        }
        self.used = total;
        Ok(true)
    }
}

/// A pollable that is ready at once: a wait that is already over.
struct Ready;

#[wasmtime_wasi::async_trait]
impl Pollable for Ready {
    async fn ready(&mut self) {}
}

impl monotonic_clock::Host for VirtualClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        Ok(self.clock.now_ns)
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        Ok(1_000)
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.wait(when.saturating_sub(self.clock.now_ns))
    }

    fn subscribe_duration(
        &mut self,
        duration: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        self.wait(duration)
    }
}

/// The monotonic-clock import's view of a store: the clock and the table
/// its pollables go into.
struct VirtualClockView<'a> {
    clock: &'a mut VirtualClock,
    table: &'a mut ResourceTable,
}

struct VirtualClocks;

impl HasData for VirtualClocks {
    type Data<'a> = VirtualClockView<'a>;
}

impl VirtualClockView<'_> {
    /// A wait of `ns`: over at once when zero (a poll with no timeout), a
    /// trap otherwise (the virtual clock never advances during a call).
    fn wait(&mut self, ns: u64) -> wasmtime::Result<Resource<DynPollable>> {
        if ns > 0 {
            let wanted = Duration::from_nanos(ns);
            self.clock.waited = Some(wanted);
            wasmtime::bail!("policy tried to wait {wanted:?}; policies may not block");
        }
        let ready = self.table.push(Ready)?;
        wasmtime_wasi::p2::subscribe(self.table, ready)
    }
}

/// The linker every policy is instantiated with: exactly the imports the
/// load-time check allows (`inspect::ALLOWED_IMPORTS`): the WASI 0.2
/// interfaces a Rust `std` links, over an empty context and with the
/// virtual monotonic clock, and the `host` interface of every version.
/// Sockets, HTTP and the rest are not linked at all.
/// What a call into an import linked by [`link_trapped_imports`] fails
/// with, before the import's name (`wasi:sockets/tcp@0.2.9#...`):
/// [`forbidden_call`] reads it back.
const FORBIDDEN: &str = "forbidden import called: `";

/// Link every function of the component's imports of
/// `inspect::TRAPPED_IMPORTS` (the unused network clients of interpreter
/// runtimes) as a function that fails naming itself, and their resources
/// as host resources nothing can create. Only those: the other imports
/// (WASI's, semver-matched: a runtime built for wasi 0.2.9 links to this
/// host's 0.2.x) are linked as they are.
pub(crate) fn link_trapped_imports(
    linker: &mut Linker<HostState>,
    engine: &Engine,
    component: &wasmtime::component::Component,
) -> wasmtime::Result<()> {
    use wasmtime::component::ResourceType;
    use wasmtime::component::types::ComponentItem;

    let ty = component.component_type();
    // The resources of wasi:io the trapped interfaces use (`pollable`,
    // streams, `error`) are the ones WASI links (a resource import's type is
    // its identity): the host types wasmtime-wasi defines them with.
    let mut wasi_io: Vec<(ResourceType, ResourceType)> = Vec::new();
    for (name, import) in ty.imports(engine) {
        let ComponentItem::ComponentInstance(instance) = import.ty else {
            continue;
        };
        let interface = name.split('@').next().unwrap_or(name);
        for (export, item) in instance.exports(engine) {
            let ComponentItem::Resource(resource) = item.ty else {
                continue;
            };
            let host = match (interface, export) {
                ("wasi:io/poll", "pollable") => ResourceType::host::<DynPollable>(),
                ("wasi:io/streams", "input-stream") => ResourceType::host::<DynInputStream>(),
                ("wasi:io/streams", "output-stream") => ResourceType::host::<DynOutputStream>(),
                ("wasi:io/error", "error") => ResourceType::host::<wasmtime::Error>(),
                _ => continue,
            };
            wasi_io.push((resource, host));
        }
    }
    for (name, import) in ty.imports(engine) {
        if !crate::inspect::import_trapped(name) {
            continue;
        }
        let ComponentItem::ComponentInstance(instance) = import.ty else {
            continue;
        };
        let mut linked = linker.instance(name)?;
        for (export, item) in instance.exports(engine) {
            match item.ty {
                ComponentItem::ComponentFunc(_) => {
                    let called = format!("{FORBIDDEN}{name}#{export}`");
                    linked.func_new(export, move |_, _, _, _| {
                        Err(wasmtime::format_err!("{called}"))
                    })?;
                }
                ComponentItem::Resource(resource) => {
                    // wasi:io's as WASI links them, the interface's own as
                    // resources nothing can make (no function makes one).
                    let host = wasi_io
                        .iter()
                        .find(|(used, _)| *used == resource)
                        .map_or_else(ResourceType::host::<()>, |(_, host)| *host);
                    linked.resource(export, host, |_, _| Ok(()))?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView};
    use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
    use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, io, random, sync};
    use wasmtime_wasi::random::{WasiRandom, WasiRandomView};

    let mut linker = Linker::new(engine);
    let l = &mut linker;
    io::error::add_to_linker::<HostState, HasTable>(l, |s| &mut s.table)?;
    sync::io::poll::add_to_linker::<HostState, HasTable>(l, |s| &mut s.table)?;
    sync::io::streams::add_to_linker::<HostState, HasTable>(l, |s| &mut s.table)?;
    clocks::wall_clock::add_to_linker::<HostState, WasiClocks>(l, |s| s.clocks())?;
    clocks::monotonic_clock::add_to_linker::<HostState, VirtualClocks>(l, |s| VirtualClockView {
        clock: &mut s.clock,
        table: &mut s.table,
    })?;
    filesystem::preopens::add_to_linker::<HostState, WasiFilesystem>(l, |s| s.filesystem())?;
    sync::filesystem::types::add_to_linker::<HostState, WasiFilesystem>(l, |s| s.filesystem())?;
    random::random::add_to_linker::<HostState, WasiRandom>(l, |s| s.random())?;
    random::insecure::add_to_linker::<HostState, WasiRandom>(l, |s| s.random())?;
    random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, |s| s.random())?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, |s| s.cli())?;
    crate::versions::add_to_linker(l)?;
    Ok(linker)
}

struct HasTable;

impl HasData for HasTable {
    type Data<'a> = &'a mut ResourceTable;
}

/// A wall clock stopped at one instant.
struct FixedWallClock(Duration);

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_micros(1)
    }

    fn now(&self) -> Duration {
        self.0
    }
}

/// SplitMix64: a tiny, fixed algorithm, so that a policy's random numbers
/// stay the same across host versions (replays of old runs included).
struct SeededRandom(u64);

impl rand_core::TryRng for SeededRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        Ok(mix(self.0))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

/// SplitMix64's output function: spreads `x` over all 64 bits.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What a call wrote: to stdout, to stderr (each bounded, escaped when
/// shown) and through the `log` import (`[level] line`). `policy check`
/// shows it; a run logs stdout and stderr at debug level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallOutput {
    pub stdout: String,
    pub stderr: String,
    pub log: Vec<String>,
}

impl CallOutput {
    /// Nothing was written.
    pub fn is_empty(&self) -> bool {
        self.stdout.is_empty() && self.stderr.is_empty() && self.log.is_empty()
    }
}

/// One call's store plus the handles on its captured stdout and stderr.
pub(crate) struct CallStore {
    pub store: Store<HostState>,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    /// Given back after `store` is dropped (fields drop in order).
    _slot: SlotPermit,
}

impl CallStore {
    /// A fresh store: no capabilities, stderr captured, virtual clocks and
    /// seeded randomness, memory capped, fuel and deadline armed.
    pub fn new(
        engine: &Engine,
        policy: Arc<str>,
        limits: &Limits,
        budget: Budget,
        world: CallWorld,
    ) -> wasmtime::Result<Self> {
        let slot = limits.slots.acquire();
        let stdout = MemoryOutputPipe::new(limits.stderr_bytes);
        let stderr = MemoryOutputPipe::new(limits.stderr_bytes);
        let wall = Duration::try_from_secs_f64(world.wall_unix_seconds).unwrap_or_default();
        // Built from scratch: no inherit_*, no preopens, env or args; stdin
        // closed, stdout and stderr captured. Sockets and HTTP are linked
        // as traps at most.
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .wall_clock(FixedWallClock(wall))
            .secure_random(SeededRandom(world.seed))
            .insecure_random(SeededRandom(mix(world.seed)))
            .insecure_random_seed(u128::from(mix(world.seed ^ 1)))
            .build();
        let state = HostState {
            wasi,
            table: ResourceTable::new(),
            memory: MemoryAccount {
                cap: limits.memory_bytes,
                used: 0,
                cap_hit: false,
            },
            clock: VirtualClock {
                now_ns: world.monotonic_ns,
                waited: None,
            },
            log: LogSink {
                policy,
                budget: limits.log_bytes,
                dropped: 0,
                lines: Vec::new(),
                calls: 0,
            },
        };
        let mut store = Store::new(engine, state);
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        store.set_fuel(budget.fuel)?;
        store.epoch_deadline_trap();
        store.set_epoch_deadline(deadline_ticks(budget.wall, limits.epoch_tick));
        Ok(CallStore {
            store,
            stdout,
            stderr,
            _slot: slot,
        })
    }

    /// What the guest wrote to stderr.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents()).into_owned()
    }

    /// What the guest wrote to stdout.
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout.contents()).into_owned()
    }

    /// Everything the call wrote (taken: the log lines leave the store).
    pub fn take_output(&mut self) -> CallOutput {
        CallOutput {
            stdout: self.stdout(),
            stderr: self.stderr(),
            log: std::mem::take(&mut self.store.data_mut().log.lines),
        }
    }

    /// Log lines dropped for exceeding the per-call volume.
    pub fn dropped_log_lines(&self) -> usize {
        self.store.data().log.dropped
    }

    /// Fuel the call used.
    pub fn fuel_used(&self, budget: Budget) -> u64 {
        budget
            .fuel
            .saturating_sub(self.store.get_fuel().unwrap_or(0))
    }

    /// Classify a failed call; `elapsed` is its real duration.
    pub fn failure(
        &self,
        err: &wasmtime::Error,
        limits: &Limits,
        budget: Budget,
        elapsed: Duration,
    ) -> CallFailure {
        let state = self.store.data();
        if state.memory.cap_hit {
            return CallFailure::MemoryCap(limits.memory_bytes);
        }
        if let Some(wanted) = state.clock.waited {
            return CallFailure::Blocked(wanted);
        }
        if state.log.calls > MAX_LOG_CALLS {
            return CallFailure::OversizedOutput(format!(
                "called log more than {} times",
                crate::error::thousands(MAX_LOG_CALLS as u64)
            ));
        }
        if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
            return CallFailure::Exited(exit.0);
        }
        if let Some((interface, function)) = forbidden_call(err) {
            return CallFailure::Forbidden {
                interface,
                function,
            };
        }
        let trap = err.downcast_ref::<wasmtime::Trap>();
        match trap {
            Some(wasmtime::Trap::OutOfFuel) => return CallFailure::Fuel(budget.fuel),
            Some(wasmtime::Trap::Interrupt) => {
                return CallFailure::Deadline {
                    limit: budget.wall,
                    elapsed,
                };
            }
            _ => {}
        }
        // A full pipe makes the guest's next write fail (Rust's `eprintln!`
        // then panics, unable to print why): the flood is the cause.
        for (pipe, name) in [(&self.stderr, "stderr"), (&self.stdout, "stdout")] {
            if pipe.contents().len() >= limits.stderr_bytes {
                return CallFailure::OversizedOutput(format!(
                    "wrote more than {} to {name}",
                    human_bytes(limits.stderr_bytes)
                ));
            }
        }
        let trap = match trap {
            Some(wasmtime::Trap::StackOverflow) => STACK_OVERFLOW.to_string(),
            Some(wasmtime::Trap::MemoryOutOfBounds) if looks_recursive(err) => {
                STACK_OVERFLOW.to_string()
            }
            Some(trap) => trap.to_string(),
            None => truncate(&format!("{err:#}"), 1000),
        };
        CallFailure::Crashed {
            trap,
            stderr: self.stderr(),
        }
    }
}

const STACK_OVERFLOW: &str = "stack overflow: recursion too deep";

/// The interface (without its version) and function of a call into an
/// import linked as a trap by [`link_trapped_imports`], from its message
/// (e.g. "forbidden import called:" and
/// `wasi:sockets/tcp@0.2.9#[method]tcp-socket.start-connect`).
fn forbidden_call(err: &wasmtime::Error) -> Option<(String, String)> {
    err.chain().find_map(|cause| {
        let text = cause.to_string();
        let rest = &text[text.find(FORBIDDEN)? + FORBIDDEN.len()..];
        let name = &rest[..rest.find('`')?];
        let (interface, function) = name.split_once('#').unwrap_or((name, ""));
        let interface = interface.split('@').next().unwrap_or(interface);
        Some((truncate(interface, 200), truncate(function, 200)))
    })
}

/// Frames captured in a trap's backtrace: enough to tell deep recursion.
pub(crate) const BACKTRACE_FRAMES: usize = 32;

/// A guest whose stack lives in its linear memory (Rust, C: the shadow
/// stack below the data) overflows it as an out-of-bounds access, not as
/// wasmtime's stack-overflow trap. Such a trap with a full backtrace made
/// of at most three distinct functions is deep recursion.
fn looks_recursive(err: &wasmtime::Error) -> bool {
    let Some(trace) = err.downcast_ref::<wasmtime::WasmBacktrace>() else {
        return false;
    };
    let frames = trace.frames();
    let mut distinct: Vec<u32> = frames.iter().map(|f| f.func_index()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    frames.len() >= BACKTRACE_FRAMES && distinct.len() <= 3
}

/// Epoch ticks for a wall limit: the deadline fires between `ticks - 1` and
/// `ticks` ticker periods after it is armed, so one tick is added to never
/// stop a call before its limit.
fn deadline_ticks(wall: Duration, tick: Duration) -> u64 {
    let tick = tick.as_nanos().max(1);
    let ticks = wall.as_nanos().div_ceil(tick);
    u64::try_from(ticks)
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}
