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
    /// The capacity search the sweep runs after it stops (`refine=`,
    /// `resolution=` of `until_congested(...)`); absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refine: Option<Refine>,
    /// Time taken by the whole check: signals (including the settle wait) and judge.
    pub check_seconds: f64,
}

/// A sweep's capacity search as `until_congested(...)` asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Refine {
    /// Most search stages (`refine=N`).
    pub stages: u32,
    /// How close the bounds must come (`resolution=`); absent: the default
    /// (one stream, or 5% of the congested rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<f64>,
    /// Most more verdicts on a level judged near a threshold (`confirm=`);
    /// absent: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub confirm: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl From<nyann_model::CapacitySearch> for Refine {
    fn from(search: nyann_model::CapacitySearch) -> Refine {
        Refine {
            stages: search.stages,
            resolution: search.resolution,
            confirm: search.confirm,
        }
    }
}

/// Which policy judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PolicyRef {
    pub name: String,
    pub version: String,
    /// `builtin`, the component file, or (schema 2) the OCI reference it
    /// was pulled from, pinned to the manifest's digest
    /// (`oci://REGISTRY/REPO:TAG@sha256:...`): what `policy replay` and
    /// `--policy` take to load the same component again.
    pub origin: String,
    /// `sha256:<hex>` of the component's bytes: what judged, whatever its
    /// name, version or file say. Absent from records written before it
    /// existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub digest: String,
    /// The interface line it implements (`nyann:policy@0.5`). Absent from
    /// records written before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub interface: String,
}

impl PolicyRef {
    /// The built-in policy judged (its parameters are the seed's thresholds).
    pub fn is_builtin(&self) -> bool {
        self.origin == nyann_policy_host::BUILTIN
    }
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

    /// How far the verdict is from flipping, by the seed's standard rules
    /// (sustained queueing: the largest waiting p50 and the largest TTFT p99
    /// both at their thresholds; KV-cache pressure: usage and preemptions
    /// both at theirs on one role): the relative amount by which the rule
    /// nearest to firing is over (positive) or under (negative) its
    /// thresholds. A rule needs all its conditions, so it flips when its
    /// least condition does: it is only as far over (or under) as that one.
    /// Each condition's distance is relative to the room it has: a value
    /// over its threshold against its threshold, except a fraction that
    /// cannot pass 1 (KV usage), whose room over the threshold is what is
    /// left up to 1 (99% against 95% is 80% of the way, not 4% over: it is
    /// no close call). `None` when the policy did not judge with the four
    /// standard thresholds, or when its verdict is not the rules' (a custom
    /// policy's own logic): no margin is claimed then.
    pub fn margin(&self) -> Option<f64> {
        let threshold = |name: &str| match self.judged_params.iter().find(|p| p.name == name)?.value
        {
            nyann_model::Value::Number(n) if n > 0.0 => Some(n),
            nyann_model::Value::Integer(i) if i > 0 => Some(i as f64),
            _ => None,
        };
        let over = |value: f64, threshold: f64| value / threshold - 1.0;
        let fraction_over = |value: f64, threshold: f64| {
            if value >= threshold && threshold < 1.0 {
                (value - threshold) / (1.0 - threshold)
            } else {
                over(value, threshold)
            }
        };
        let largest =
            |signal: fn(&RoleSignals) -> f64| self.roles.iter().map(signal).reduce(f64::max);
        let queueing = over(
            largest(|r| r.waiting_requests_p50)?,
            threshold("waiting_requests_p50")?,
        )
        .min(over(
            largest(|r| r.ttft_p99_seconds)?,
            threshold("ttft_p99")?,
        ));
        let (kv, preemptions) = (threshold("kv_cache_usage")?, threshold("preemptions")?);
        let margin = self
            .roles
            .iter()
            .map(|r| fraction_over(r.kv_cache_usage_max, kv).min(over(r.preemptions, preemptions)))
            .fold(queueing, f64::max);
        (margin.is_finite() && self.congested() == (margin >= 0.0) && self.verdict.is_some())
            .then_some(margin)
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
