//! The data shared by every stage of nyann-bench's data flow.
//!
//! `scenario` is the IR a Starlark file compiles to (and what `--config
//! FILE.json` reads back); `observation` is what a congestion policy is shown
//! after a stage and what it answers; `coverage` says which server signals
//! had data, beside what the policy sees. They are plain serde types with no
//! behaviour, so that the crates that produce them (scenario, load, signals)
//! and the ones that consume them (load, policy host, report) depend on this
//! small crate and not on each other. `rules` are the checks every scenario
//! passes, whoever built it. `slo` the latency goals of requests and
//! goodput. `duration` is the one duration grammar
//! of the scenario language and of every flag; `header` the one grammar of a
//! header flag. `math` is the one definition of the signal arithmetic (the
//! steady window, quantiles, Prometheus' `histogram_quantile`), shared by the
//! signal sources and the simulator.

pub mod coverage;
pub mod duration;
pub mod header;
pub mod math;
pub mod observation;
pub mod rules;
pub mod scenario;
pub mod slo;

pub use coverage::{RoleCoverage, SeriesStatus, SignalCoverage};
pub use duration::{DURATION_HELP, parse_duration, parse_seconds};
pub use header::parse_header;

pub use observation::{
    ClientStats, EvalStats, FiredRule, ParamKind, ParamSpec, PolicyInfo, RoleSignals,
    StageObservation, SweepRef, Verdict, wilson,
};
pub use scenario::{
    CacheSalt, CapacitySearch, Mode, Param, Scenario, SourceLocation, Stage, Step, StopCondition,
    Value, Workload, WorkloadType,
};
pub use slo::{Answered, GoalStats, Objective, SLO_HELP, Slo, SloStats, tpot_seconds};
