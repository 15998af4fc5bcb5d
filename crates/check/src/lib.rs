//! The congestion check, free of the command line: after each judged stage
//! the runner's [`StageHook`](nyann_load::StageHook) reads the stage's
//! server signals and asks the policy for a verdict ([`CongestionCheck`]);
//! the verdict and what the policy was shown are kept with the stage
//! ([`CongestionRecord`]); a recorded run can be judged again offline
//! ([`replay`]); and a finished run is summed up as its knee and the load
//! its stop saved ([`Conclusion`]), with the level of most goodput when
//! its stages have an SLO.

pub mod conclusion;
mod goodput;
mod hook;
mod record;
pub mod replay;

pub use conclusion::Conclusion;
pub use hook::{
    CheckError, CheckSettings, CongestionCheck, check_stop_conditions, judges_any_stage,
};
pub use record::{
    CongestionRecord, Judged, OnPolicyError, PolicyMode, PolicyRef, Refine, RunResult, StageResult,
};
