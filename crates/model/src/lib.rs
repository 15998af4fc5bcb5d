//! The data shared by every stage of nyann-bench's data flow.
//!
//! `scenario` is the IR a Starlark file compiles to (and what `--config
//! FILE.json` reads back); `observation` is what a congestion policy is shown
//! after a stage and what it answers. Both are plain serde types with no
//! behaviour, so that the crates that produce them (scenario, load, signals)
//! and the ones that consume them (load, policy host, report) depend on this
//! small crate and not on each other.

pub mod observation;
pub mod scenario;

pub use observation::{
    ClientStats, ParamKind, ParamSpec, PolicyInfo, RoleSignals, StageObservation, SweepRef, Verdict,
};
pub use scenario::{
    CacheSalt, Mode, Param, Scenario, SourceLocation, Stage, Step, StopCondition, Value, Workload,
    WorkloadType,
};
