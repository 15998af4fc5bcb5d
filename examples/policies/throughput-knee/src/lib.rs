//! Example policy: stop at the throughput knee.
//!
//! A stage is congested when, compared with the measured stage of the
//! nearest lower level (the previous one in a sweep; for a capacity-search
//! stage, the nearest level below it, whenever that ran),
//! the client's output tokens/s grew by less than `min_throughput_gain_pct`
//! percent while the client's TTFT p99 grew by more than
//! `max_ttft_growth_pct` percent: more load no longer buys throughput, only
//! latency. Uses `history` and client statistics, which the built-in does not.

use nyann_policy::{Params, Policy, PolicyInfo, StageObservation, Verdict, spec};

pub struct ThroughputKnee;

impl Policy for ThroughputKnee {
    fn describe() -> PolicyInfo {
        PolicyInfo::new(
            "throughput-knee",
            env!("CARGO_PKG_VERSION"),
            "Congested when output tokens/s stops growing while client TTFT p99 keeps growing, stage over stage.",
        )
        // Client figures only: runs without a signal source.
        .client_only()
        .param(spec::number("min_throughput_gain_pct", "least output tokens/s growth (percent) that still counts as growth").default_number(5.0))
        .param(spec::number("max_ttft_growth_pct", "client TTFT p99 growth (percent) that signals queueing").default_number(50.0))
    }

    fn validate(params: &Params) -> Result<(), String> {
        params.number("min_throughput_gain_pct")?;
        let ttft = params.number("max_ttft_growth_pct")?;
        if ttft < 0.0 {
            return Err(format!("max_ttft_growth_pct must be >= 0 (got {ttft})"));
        }
        Ok(())
    }

    fn judge(
        params: &Params,
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, String> {
        let min_gain = params.number("min_throughput_gain_pct")?;
        let max_ttft = params.number("max_ttft_growth_pct")?;
        Ok(knee(min_gain, max_ttft, stage, history))
    }
}

/// The rule, natively testable.
pub fn knee(
    min_gain_pct: f64,
    max_ttft_growth_pct: f64,
    stage: &StageObservation,
    history: &[StageObservation],
) -> Verdict {
    let Some(prev) = stage.below(history).last().copied() else {
        return Verdict::ok();
    };
    let (prev_tps, tps) = (
        prev.client.output_tokens_per_second,
        stage.client.output_tokens_per_second,
    );
    let (prev_ttft, ttft) = (prev.client.ttft_p99_seconds, stage.client.ttft_p99_seconds);
    if prev_tps <= 0.0 || prev_ttft <= 0.0 {
        return Verdict::ok();
    }
    let gain = (tps - prev_tps) / prev_tps * 100.0;
    let ttft_growth = (ttft - prev_ttft) / prev_ttft * 100.0;
    Verdict::when(
        gain < min_gain_pct && ttft_growth > max_ttft_growth_pct,
        || {
            format!(
                "throughput knee: output {tps:.0} tok/s is {gain:+.1}% over {} (min {min_gain_pct}%), client TTFT p99 {ttft:.3}s is {ttft_growth:+.1}% (max {max_ttft_growth_pct}%)",
                prev.name
            )
        },
    )
}

nyann_policy::export_policy!(ThroughputKnee);

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_policy::ClientStats;

    fn stage(name: &str, tps: f64, ttft: f64) -> StageObservation {
        let concurrency = name.trim_start_matches("c=").parse().ok();
        StageObservation {
            name: name.into(),
            concurrency,
            client: ClientStats {
                output_tokens_per_second: tps,
                ttft_p99_seconds: ttft,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn first_stage_is_never_a_knee() {
        assert!(!knee(5.0, 50.0, &stage("c=8", 100.0, 1.0), &[]).congested);
    }

    #[test]
    fn flat_throughput_with_growing_ttft_is_a_knee() {
        let v = knee(
            5.0,
            50.0,
            &stage("c=16", 102.0, 2.0),
            &[stage("c=8", 100.0, 1.0)],
        );
        assert!(v.congested);
        assert!(
            v.reasons[0].starts_with("throughput knee: output 102 tok/s is +2.0% over c=8"),
            "{:?}",
            v.reasons
        );
    }

    /// A search stage at c=12, run after the sweep 8, 16 (the knee):
    /// compared with c=8, the level below it, not with c=16, which ran last.
    #[test]
    fn a_search_stage_is_compared_with_the_level_below_it() {
        let history = [stage("c=8", 100.0, 1.0), stage("c=16", 102.0, 3.0)];
        let searched = StageObservation {
            refines: Some(1),
            ..stage("c=12", 150.0, 1.2)
        };
        assert!(!knee(5.0, 50.0, &searched, &history).congested);
        let flat = StageObservation {
            refines: Some(1),
            ..stage("c=12", 101.0, 2.0)
        };
        let v = knee(5.0, 50.0, &flat, &history);
        assert!(v.congested && v.reasons[0].contains("over c=8"), "{v:?}");
    }

    #[test]
    fn growing_throughput_is_not_a_knee() {
        assert!(
            !knee(
                5.0,
                50.0,
                &stage("c=16", 190.0, 2.0),
                &[stage("c=8", 100.0, 1.0)]
            )
            .congested
        );
        assert!(
            !knee(
                5.0,
                50.0,
                &stage("c=16", 100.0, 1.2),
                &[stage("c=8", 100.0, 1.0)]
            )
            .congested
        );
    }
}
