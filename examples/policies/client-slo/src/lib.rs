//! Example policy: stop when the client-side SLO is broken.
//!
//! A stage violates the SLO when the client's TTFT p99 exceeds `ttft_p99` or
//! its error rate exceeds `max_error_rate`. The sweep stops when the last
//! `consecutive` measured stages (this one and those of the levels just
//! below it, from `history`) all violate it, so one noisy stage need not end a sweep. Uses client
//! statistics and history, which the built-in does not.

use nyann_policy::{Params, Policy, PolicyInfo, StageObservation, Verdict, spec};

pub struct ClientSlo;

/// The SLO limits of one `until_congested(...)` call.
#[derive(Debug, Clone, Copy)]
pub struct Slo {
    pub ttft_p99_seconds: f64,
    pub max_error_rate: f64,
    pub consecutive: usize,
}

impl Slo {
    fn from_params(params: &Params) -> Result<Self, String> {
        // An integer parameter: the host has refused fractions already.
        let consecutive = params.integer("consecutive")?;
        if !(1..=100).contains(&consecutive) {
            return Err(format!(
                "consecutive must be from 1 to 100 (got {consecutive})"
            ));
        }
        Ok(Slo {
            ttft_p99_seconds: params.require_positive("ttft_p99")?,
            max_error_rate: params.fraction("max_error_rate")?,
            consecutive: consecutive as usize,
        })
    }

    /// Why `stage` violates the SLO, if it does.
    pub fn violation(&self, stage: &StageObservation) -> Option<String> {
        let c = &stage.client;
        let mut why = Vec::new();
        if c.ttft_p99_seconds > self.ttft_p99_seconds {
            why.push(format!(
                "client TTFT p99 {:.3}s > {}s",
                c.ttft_p99_seconds, self.ttft_p99_seconds
            ));
        }
        if c.error_rate() > self.max_error_rate {
            why.push(format!(
                "error rate {:.1}% ({} of {}) > {:.1}%",
                c.error_rate() * 100.0,
                c.requests_failed,
                c.requests_ok + c.requests_failed,
                self.max_error_rate * 100.0
            ));
        }
        (!why.is_empty()).then(|| why.join(", "))
    }

    /// The verdict for `stage` given the earlier stages.
    pub fn judge(&self, stage: &StageObservation, history: &[StageObservation]) -> Verdict {
        let Some(now) = self.violation(stage) else {
            return Verdict::ok();
        };
        // The stages of the levels below, nearest first (for a
        // capacity-search stage too, which runs after the whole sweep).
        let below = stage.below(history);
        let earlier = below.into_iter().rev().take(self.consecutive - 1);
        let streak = 1 + earlier.take_while(|s| self.violation(s).is_some()).count();
        Verdict::when(streak >= self.consecutive, || {
            if self.consecutive == 1 {
                format!("client SLO: {now}")
            } else {
                format!("client SLO broken {streak} stages in a row: {now}")
            }
        })
    }
}

impl Policy for ClientSlo {
    fn describe() -> PolicyInfo {
        PolicyInfo::new(
            "client-slo",
            env!("CARGO_PKG_VERSION"),
            "Congested when the client's TTFT p99 or error rate break the SLO for `consecutive` stages in a row.",
        )
        // Client figures only: runs without a signal source.
        .client_only()
        .param(spec::duration("ttft_p99", "client TTFT p99 limit").required())
        .param(spec::fraction("max_error_rate", "largest acceptable share of failed requests").default_number(0.01))
        .param(spec::integer("consecutive", "stages in a row that must break the SLO").default_integer(1))
    }

    fn validate(params: &Params) -> Result<(), String> {
        Slo::from_params(params).map(|_| ())
    }

    fn judge(
        params: &Params,
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, String> {
        let slo = Slo::from_params(params)?;
        nyann_policy::log::debug(&format!("judging {} against {slo:?}", stage.name));
        Ok(slo.judge(stage, history))
    }
}

nyann_policy::export_policy!(ClientSlo);

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_policy::ClientStats;

    fn stage(ttft: f64, ok: u64, failed: u64) -> StageObservation {
        StageObservation {
            client: ClientStats {
                ttft_p99_seconds: ttft,
                requests_ok: ok,
                requests_failed: failed,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    const SLO: Slo = Slo {
        ttft_p99_seconds: 1.0,
        max_error_rate: 0.01,
        consecutive: 1,
    };

    #[test]
    fn within_slo_is_fine() {
        assert!(!SLO.judge(&stage(0.9, 100, 1), &[]).congested);
    }

    #[test]
    fn ttft_or_errors_break_it() {
        assert_eq!(
            SLO.judge(&stage(1.5, 100, 0), &[]).reasons,
            vec!["client SLO: client TTFT p99 1.500s > 1s"]
        );
        assert_eq!(
            SLO.judge(&stage(0.5, 90, 10), &[]).reasons,
            vec!["client SLO: error rate 10.0% (10 of 100) > 1.0%"]
        );
    }

    #[test]
    fn consecutive_needs_a_streak_from_history() {
        let slo = Slo {
            consecutive: 2,
            ..SLO
        };
        assert!(
            !slo.judge(&stage(1.5, 100, 0), &[stage(0.5, 100, 0)])
                .congested
        );
        let v = slo.judge(
            &stage(1.5, 100, 0),
            &[stage(0.5, 100, 0), stage(2.0, 100, 0)],
        );
        assert_eq!(
            v.reasons,
            vec!["client SLO broken 2 stages in a row: client TTFT p99 1.500s > 1s"]
        );
    }
}
