//! Scale-out: one sweep run by several workers, with one stop decision.
//!
//! Worker 0 leads ([`leader`]): it divides the scenario ([`share`]), hands
//! each worker its share and seed over the coordination protocol
//! ([`protocol`]), announces each stage's start, merges the workers'
//! statistics of each measured stage into fleet statistics for the
//! congestion check, broadcasts the decision, and at the end merges
//! everyone's records ([`merge`]). Every other worker ([`worker`]) runs its
//! share with the runner hook that follows the leader.
//!
//! The seam with the stage runner is its [`StageHook`](nyann_load::StageHook):
//! `before_stage` waits for the leader's start, `after_stage` exchanges
//! statistics and the decision. Alone, a process needs none of this.

pub mod coordinator;
pub mod leader;
pub mod merge;
pub mod protocol;
pub mod share;
pub mod worker;

pub use coordinator::{Coordinator, CoordinatorError};
pub use leader::{Leader, LeaderConfig, LeaderGate, OnWorkerLoss};
pub use worker::{WorkerConfig, WorkerGate, join};

/// Where the leader stores a worker's uploaded records, in that worker's
/// directory under the leader's results: a name no worker writes, so that
/// a results directory shared by every worker loses nothing.
pub const UPLOADED_RECORDS: &str = "requests.uploaded.jsonl";

/// Worker `index`'s own directory under the results directory `dir`.
pub fn worker_dir(dir: &std::path::Path, index: usize) -> std::path::PathBuf {
    dir.join(format!("worker-{index}"))
}

/// Why the fleet could not run (or a worker lost its leader).
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error(
        "cannot reach the coordinator {coordinator} within {timeout:?}; the last try: {reason}"
    )]
    Unreachable {
        coordinator: String,
        timeout: std::time::Duration,
        /// Why the last try failed.
        reason: String,
    },
    #[error("the leader refused this worker: {0}")]
    Refused(String),
    #[error("the link to the leader failed: {0}")]
    Link(String),
    #[error("leader lost: {0}")]
    LeaderLost(String),
    #[error("the records upload failed {attempts} time(s); the last time: {reason}")]
    Upload { attempts: u32, reason: String },
    #[error("cannot listen on {addr}: {error}")]
    Listen {
        addr: std::net::SocketAddr,
        error: std::io::Error,
    },
    #[error(
        "{missing} of {expected} worker(s) did not join within {timeout:?} (missing: {list}); check that their pods run and reach the coordinator"
    )]
    JoinTimeout {
        missing: usize,
        expected: usize,
        timeout: std::time::Duration,
        list: String,
    },
    #[error("interrupted while waiting for the workers to join")]
    Interrupted,
    #[error(transparent)]
    Share(#[from] share::ShareError),
}

impl FleetError {
    fn link(err: impl std::fmt::Display) -> Self {
        FleetError::Link(err.to_string())
    }
}

/// Locks `m`, ignoring poisoning (the data stays usable).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
