//! Workloads, the OpenAI streaming client and the stage runner that turns a
//! scenario into request records and per-stage client statistics.
//!
//! Entry point: [`run`] with a [`Scenario`](nyann_model::Scenario),
//! [`RunOptions`] (plain settings: the binary turns its flags into them) and a
//! [`StageHook`] that is asked after each measured stage whether the sweep
//! goes on. See [`runner`] for the exact rules (which stage a request belongs
//! to, what the load does between stages, warm-up, barriers, aborts).

pub mod backoff;
pub mod client;
/// The checks of the fuzz targets (`fuzz/`), shared with the corpus tests.
#[doc(hidden)]
pub mod fuzz_check;
pub mod goodput;
pub mod hook;
pub mod http;
pub mod live;
pub mod metrics;
pub mod preflight;
pub mod record;
pub mod result;
pub mod runner;
pub mod schedule;
pub mod sse;
pub mod stats;
pub mod workload;

pub use client::{Api, ClientConfig};
pub use hook::{FinishedStage, HookDecision, HookOutcome, NextSearch, NoHook, StageHook};
pub use live::{Live, LiveSnapshot};
pub use record::{Phase, RequestRecord, Status, TokenSource};
pub use result::{
    DegradedStage, EXIT_DEGRADED, RunOutcome, RunResult, SearchStage, StageResult, StageStatus,
};
pub use runner::search::{Bounds, CLOSE_CALL, Search, Vote, settle};
pub use runner::{DEFAULT_TARGET, RunError, RunOptions, run};
pub use stats::StageDetail;
pub use tokio_util::sync::CancellationToken;
pub use workload::DatasetShare;

/// Locks `m`. A poisoned lock only means another task panicked while
/// holding it; the data is still usable.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Raises the open-files limit to its hard maximum (thousands of connections
/// need thousands of descriptors); returns the new soft limit.
pub fn raise_fd_limit() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok()
}
