//! What a congestion policy sees after a stage, and what it answers.
//!
//! These mirror the records of `wit/0.5/policy.wit` (the current interface
//! line); the policy host converts between them and the bindgen types.
//! [`ClientStats`] carries a few counts the interface does not have yet
//! (rejected and late requests): they reach `stages.json` and the stage table,
//! not the policy. Every time is in seconds.

use serde::{Deserialize, Serialize};

use crate::scenario::Value;

/// Server-side signals of one role (`aggregate`, `prefill` or `decode`) over one stage.
/// Missing series evaluate as zero (and so do fields missing from a record);
/// [`RoleCoverage`](crate::RoleCoverage) says which signals had series.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct RoleSignals {
    pub role: String,
    /// p50 over the steady window of the per-sample sum of waiting requests across pods.
    pub waiting_requests_p50: f64,
    /// Server TTFT p99 (histogram quantile) over the steady window.
    pub ttft_p99_seconds: f64,
    /// Max KV-cache usage (fraction 0..1) across pods and the steady window.
    pub kv_cache_usage_max: f64,
    /// Increase of the preemption counter over the whole stage.
    pub preemptions: f64,
    /// More named figures (e.g. `ttft_p50_seconds`, `itl_p99_seconds`,
    /// `generation_tokens_per_second`, `kv_cache_usage_min`, `running_requests_p50`).
    pub extra: Vec<(String, f64)>,
}

impl RoleSignals {
    /// The value of a named extra figure, if present.
    pub fn extra(&self, name: &str) -> Option<f64> {
        self.extra.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// Client-side statistics of one stage (measured by nyann-bench itself).
/// Read tolerantly (`#[serde(default)]`): results written by older versions
/// lack the newer counts, which then read as zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct ClientStats {
    pub requests_ok: u64,
    pub requests_failed: u64,
    pub requests_per_second: f64,
    pub output_tokens_per_second: f64,
    pub ttft_p50_seconds: f64,
    pub ttft_p99_seconds: f64,
    pub itl_p50_seconds: f64,
    pub itl_p99_seconds: f64,
    pub e2e_p50_seconds: f64,
    pub e2e_p99_seconds: f64,
    /// Requests the server shed (HTTP 429, or 503 with `Retry-After`): a
    /// busy server, not a broken one. Not in `requests_failed`.
    pub requests_rejected: u64,
    pub rejected_per_second: f64,
    /// Requests still in flight when the stage's drain time ran out
    /// (abandoned; in no latency figure).
    pub requests_late: u64,
    /// Open-loop arrivals not sent because `max_inflight` requests were in flight.
    pub dropped: u64,
    /// The scored answers of an eval workload's requests (GSM8K, GPQA);
    /// absent from other stages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalStats>,
    /// The requests against the stage's SLO (goodput, attainment); absent
    /// from stages without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<crate::slo::SloStats>,
}

/// A stage's eval answers: how many replies were scored and how many were
/// right, with the accuracy's 95% Wilson interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EvalStats {
    /// Requests that got a reply, scored (unanswerable ones included).
    pub answered: u64,
    pub correct: u64,
    /// Replies in which no answer was found (scored wrong).
    pub unanswerable: u64,
    /// `correct / answered`.
    pub accuracy: f64,
    /// The accuracy's 95% Wilson score interval.
    pub accuracy_low: f64,
    pub accuracy_high: f64,
}

impl EvalStats {
    /// The figures of `correct` right answers out of `answered`.
    pub fn of(answered: u64, correct: u64, unanswerable: u64) -> EvalStats {
        let (low, high) = wilson(correct, answered);
        EvalStats {
            answered,
            correct,
            unanswerable,
            accuracy: if answered == 0 {
                0.0
            } else {
                correct as f64 / answered as f64
            },
            accuracy_low: low,
            accuracy_high: high,
        }
    }
}

/// The 95% Wilson score interval of `successes` out of `trials` (`(0, 1)`
/// for none): unlike the normal approximation it stays within [0, 1] and
/// is honest at small counts and at 0% or 100%.
pub fn wilson(successes: u64, trials: u64) -> (f64, f64) {
    if trials == 0 {
        return (0.0, 1.0);
    }
    const Z: f64 = 1.959_963_984_540_054;
    let n = trials as f64;
    let p = successes as f64 / n;
    let z2 = Z * Z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// Which sweep a stage belongs to: one `until_congested(...)` list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SweepRef {
    /// Position among the scenario's sweeps (0-based).
    pub index: u32,
    /// Where the `until_congested(...)` call is written (`file:line:col`),
    /// else `sweep <index>`.
    pub name: String,
}

/// Everything known about one finished stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageObservation {
    /// Position of the stage in the scenario (0-based, barriers counted).
    pub index: u32,
    pub name: String,
    /// The sweep of the stage; `history` holds the earlier stages of the same sweep.
    #[serde(default)]
    pub sweep: SweepRef,
    pub concurrency: Option<u32>,
    pub rate: Option<f64>,
    pub start_unix_seconds: f64,
    pub end_unix_seconds: f64,
    pub roles: Vec<RoleSignals>,
    pub client: ClientStats,
    /// Signal queries that failed (their signals read as zero: fail-open).
    pub signal_errors: Vec<String>,
    /// A capacity-search stage: the index of the congested sweep stage it
    /// refines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refines: Option<u32>,
}

/// A policy's answer for one stage.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Verdict {
    pub congested: bool,
    pub reasons: Vec<String>,
    /// The rules that fired (interface 0.3 on; empty from older policies,
    /// which do not say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fired: Vec<FiredRule>,
}

/// One rule that found a stage congested: which figures, on which role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FiredRule {
    /// The rule's name as its policy documents it (`queueing`, `kv-cache`).
    pub rule: String,
    /// The server role it fired on; `None` for a rule over client figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The figures it compared, by their names in the results
    /// (`waiting_requests_p50`, `kv_cache_usage_max`, ...).
    pub signals: Vec<String>,
}

impl FiredRule {
    /// Whether this rule compared `signal` on `role`.
    pub fn covers(&self, role: &str, signal: &str) -> bool {
        self.role.as_deref() == Some(role) && self.signals.iter().any(|s| s == signal)
    }
}

/// How a parameter is written in `until_congested(...)` and passed to `judge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// Any finite number.
    Number,
    /// A whole number; passed as `Value::Integer`.
    Integer,
    /// A number in 0..=1.
    Fraction,
    /// `"750ms"`, `"2s"`, `"1m30s"` or integer seconds; passed as seconds.
    Duration,
    Text,
    Flag,
}

/// One parameter a policy accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamSpec {
    pub name: String,
    pub kind: ParamKind,
    pub required: bool,
    pub default: Option<Value>,
    pub doc: String,
}

/// What `describe()` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub name: String,
    pub version: String,
    pub summary: String,
    pub params: Vec<ParamSpec>,
    /// Whether the policy reads server signals (policies built before
    /// interface 0.3 all may): without them it runs with no signal source.
    pub server_signals: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_intervals_match_the_textbook() {
        // 81 of 263 (Wilson 1927's worked figures, to 4 places): 0.2553..0.3662.
        let (low, high) = wilson(81, 263);
        assert!(
            (low - 0.2553).abs() < 5e-4 && (high - 0.3662).abs() < 5e-4,
            "{low} {high}"
        );
        let (low, high) = wilson(10, 10);
        assert!(
            (high - 1.0).abs() < 1e-9 && (low - 0.7225).abs() < 5e-4,
            "{low}"
        );
        assert_eq!(wilson(0, 0), (0.0, 1.0));
        let stats = EvalStats::of(4, 3, 1);
        assert_eq!(stats.accuracy, 0.75);
    }
}
