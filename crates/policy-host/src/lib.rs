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

mod allow;
mod bounded;
mod cache;
mod digest;
pub mod error;
mod host;
mod inspect;
pub mod params;
mod policy;
pub mod precompiled;
mod sandbox;
mod shape;
mod versions;

use std::path::PathBuf;
use std::time::Duration;

pub use allow::parse_digest;
pub use cache::{default_cache_dir, default_key_file};
pub use digest::ComponentDigest;
pub use error::{CallFailure, PolicyError, printable};
pub use host::PolicyHost;
pub(crate) use host::engine_config;
pub use inspect::CodeLimits;
pub use policy::{CodeSource, Policy};
pub use sandbox::CallOutput;
pub use versions::{Interface, supported_versions};

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
    /// The digests of the only components loaded (`--policy-allow`);
    /// empty: any. Default empty.
    pub allowed: Vec<ComponentDigest>,
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
            allowed: Vec::new(),
        }
    }
}
