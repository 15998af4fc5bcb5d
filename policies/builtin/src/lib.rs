//! The built-in congestion policy, compiled to a WebAssembly component and
//! embedded in nyann-bench: the standard congestion rules, exactly as stated below.
//!
//! A stage is congested when either rule holds (all comparisons inclusive):
//! - sustained queueing: the largest per-role waiting p50 reaches
//!   `waiting_requests_p50` AND the largest per-role server TTFT p99 reaches
//!   `ttft_p99` (the two may come from different roles: together they stand
//!   for end-to-end latency in a disaggregated deployment);
//! - KV-cache pressure: on one and the same role, the KV-cache usage max
//!   reaches `kv_cache_usage` AND the preemptions reach `preemptions`.
//!
//! The verdict names each rule that fired (`queueing`, `kv-cache`) with its
//! roles and figures.
//!
//! The rules live in [`rules`], plain Rust tested natively.

pub mod rules;

use nyann_policy::{Params, Policy, PolicyInfo, StageObservation, Verdict, spec};

/// The exported policy.
pub struct Builtin;

impl Policy for Builtin {
    fn describe() -> PolicyInfo {
        PolicyInfo::new(
            "builtin",
            env!("CARGO_PKG_VERSION"),
            "Congested on sustained queueing with high TTFT (any roles), or on KV-cache pressure with preemptions (same role).",
        )
        .param(
            spec::number(
                "waiting_requests_p50",
                "waiting requests (p50 over the steady window, summed across a role's pods) that signal queueing; > 0",
            )
            .required(),
        )
        .param(spec::duration("ttft_p99", "server TTFT p99 that signals queueing; > 0").required())
        .param(
            spec::fraction("kv_cache_usage", "KV-cache usage max that signals pressure; in (0, 1]")
                .default_number(rules::DEFAULT_KV_CACHE_USAGE),
        )
        .param(
            spec::number("preemptions", "preemptions per stage that, with KV pressure, signal congestion; > 0")
                .default_number(rules::DEFAULT_PREEMPTIONS),
        )
    }

    fn validate(params: &Params) -> Result<(), String> {
        rules::Thresholds::from_params(params).map(|_| ())
    }

    fn judge(
        params: &Params,
        stage: &StageObservation,
        _history: &[StageObservation],
    ) -> Result<Verdict, String> {
        let thresholds = rules::Thresholds::from_params(params)?;
        Ok(rules::verdict(&thresholds, stage))
    }
}

nyann_policy::export_policy!(Builtin);
