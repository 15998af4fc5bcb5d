//! What the check keeps with each judged stage (its annotation in
//! `stages.json` and `summary.json`), and how verdicts are used.

use nyann_model::{Param, RoleCoverage, RoleSignals, SweepRef, Verdict};
use serde::{Deserialize, Serialize};

/// How the verdicts are used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyMode {
    /// A congested verdict stops the sweep.
    Enforce,
    /// Record every verdict, never stop.
    Monitor,
}

/// What a failed policy call (trap, deadline, memory cap, error result) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPolicyError {
    /// Record the error and go on with the sweep (fail-open).
    Continue,
    /// Record the error and stop the sweep.
    Stop,
}

/// What the check recorded for one judged stage: stored with the stage's
/// result (`stages.json`, the summary) as its [`Judged`] annotation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CongestionRecord {
    pub policy: PolicyRef,
    pub mode: PolicyMode,
    /// The sweep the stage belongs to.
    #[serde(default)]
    pub sweep: SweepRef,
    /// The `until_congested(...)` parameters as written (before the
    /// policy's defaults), so that `policy replay` can judge the stage again.
    #[serde(default)]
    pub params: Vec<Param>,
    /// Every parameter the policy judged with: those written, and its
    /// defaults for the others (durations in seconds). Absent from records
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub judged_params: Vec<Param>,
    /// The server signals per role the policy was shown.
    pub roles: Vec<RoleSignals>,
    /// Per role and signal: whether series were found (a missing signal
    /// reads 0 in `roles`), the metric read, and lower bounds.
    #[serde(default)]
    pub coverage: Vec<RoleCoverage>,
    /// Signal queries that failed (those signals read as zero).
    pub signal_errors: Vec<String>,
    /// The policy's answer; `None` when the call failed.
    pub verdict: Option<Verdict>,
    /// Why the policy call failed, if it did.
    pub policy_error: Option<String>,
    /// Whether this stage's decision stopped its sweep (a congested
    /// verdict in enforce mode, or a failed call with `--on-policy-error stop`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// Time taken by the whole check: signals (including the settle wait) and judge.
    pub check_seconds: f64,
}

/// Which policy judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PolicyRef {
    pub name: String,
    pub version: String,
    /// `builtin` or the component file.
    pub origin: String,
}

/// What the congestion check stores with a judged stage: its annotation
/// in `stages.json` and the summary (`{"congestion": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Judged {
    pub congestion: CongestionRecord,
}

/// A step's result in a run the congestion check judged.
pub type StageResult = nyann_load::StageResult<Judged>;
/// A run the congestion check judged (`summary.json`).
pub type RunResult = nyann_load::RunResult<Judged>;

impl CongestionRecord {
    /// The record stored with a stage result, if the stage was judged.
    pub fn of(stage: &StageResult) -> Option<&CongestionRecord> {
        stage.annotation.as_ref().map(|judged| &judged.congestion)
    }

    /// True when the policy said "congested".
    pub fn congested(&self) -> bool {
        self.verdict.as_ref().is_some_and(|v| v.congested)
    }

    /// The value the policy judged parameter `name` with, and whether it was
    /// the policy's default (not written in the scenario).
    pub fn param(&self, name: &str) -> Option<(&nyann_model::Value, bool)> {
        let written = self.params.iter().find(|p| p.name == name);
        match self.judged_params.iter().find(|p| p.name == name) {
            Some(judged) => Some((&judged.value, written.is_none())),
            None => written.map(|p| (&p.value, false)),
        }
    }
}
