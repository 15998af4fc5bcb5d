//! Example policy: stop when the server answers worse under load.
//!
//! For sweeps of eval stages (GSM8K, GPQA questions scored under load): a
//! stage is congested when its accuracy is below the baseline's, the
//! sweep's first stage that scored enough replies (the lowest level), by
//! more than `max_drop`, with 95% confidence. The confidence comes from the
//! counts: the drop's interval is Newcombe's for the difference of two
//! proportions, built from their Wilson intervals, and the stage is
//! congested when its lower bound exceeds `max_drop`. So a small stage
//! whose accuracy dipped by chance does not stop the sweep, and a real
//! fall does. Stages with fewer than `min_answers` scored replies (or
//! none: a plain workload) are never congested by it.
//!
//! Uses the eval counts of interface 0.4 and the stage history.

use nyann_policy::{EvalCounts, Params, Policy, PolicyInfo, StageObservation, Verdict, spec};

pub struct AccuracyDrop;

/// The limits of one `until_congested(...)` call.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The accuracy (a fraction) a stage may lose against the baseline.
    pub max_drop: f64,
    /// Scored replies a stage needs to count (as a baseline, or judged).
    pub min_answers: u64,
}

impl Limits {
    fn from_params(params: &Params) -> Result<Self, String> {
        let max_drop = params.fraction("max_drop")?;
        if max_drop >= 1.0 {
            return Err(format!(
                "max_drop must be below 1 (got {max_drop}): no stage could lose more"
            ));
        }
        let min_answers = params.integer("min_answers")?;
        let min_answers = u64::try_from(min_answers)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("min_answers must be at least 1 (got {min_answers})"))?;
        Ok(Limits {
            max_drop,
            min_answers,
        })
    }

    /// The stage's eval counts, if it scored enough replies.
    fn scored<'a>(&self, stage: &'a StageObservation) -> Option<&'a EvalCounts> {
        stage
            .client
            .eval
            .as_ref()
            .filter(|eval| eval.answered >= self.min_answers)
    }

    /// The verdict for `stage` given the earlier stages of its sweep.
    pub fn judge(&self, stage: &StageObservation, history: &[StageObservation]) -> Verdict {
        let Some(now) = self.scored(stage) else {
            return Verdict::ok();
        };
        // The lowest level that scored enough: for a capacity-search stage
        // too (its history holds stages of higher levels as well).
        let Some((base_stage, base)) = stage
            .below(history)
            .into_iter()
            .find_map(|s| self.scored(s).map(|eval| (s, eval)))
        else {
            return Verdict::ok();
        };
        let (Some(p_base), Some(p_now)) = (base.accuracy(), now.accuracy()) else {
            return Verdict::ok();
        };
        let (base_low, _) = base.interval95();
        let (_, now_high) = now.interval95();
        let drop = p_base - p_now;
        let drop_low = drop - ((p_base - base_low).powi(2) + (now_high - p_now).powi(2)).sqrt();
        if drop_low <= self.max_drop {
            return Verdict::ok();
        }
        let (now_low, _) = now.interval95();
        Verdict::from_reasons(vec![format!(
            "accuracy {:.1}% (95%: {:.1}-{:.1}%, {} of {}) is {:.1} points below {}'s {:.1}%: \
                 the drop is at least {:.1} points with 95% confidence (max_drop {:.1})",
            p_now * 100.0,
            now_low * 100.0,
            now_high * 100.0,
            now.correct,
            now.answered,
            drop * 100.0,
            base_stage.name,
            p_base * 100.0,
            drop_low * 100.0,
            self.max_drop * 100.0,
        )])
        .fired("accuracy-drop", None, &["accuracy"])
    }
}

impl Policy for AccuracyDrop {
    fn describe() -> PolicyInfo {
        PolicyInfo::new(
            "accuracy-drop",
            env!("CARGO_PKG_VERSION"),
            "Congested when a stage's eval accuracy is below the sweep's first scored stage by more than max_drop, with 95% confidence.",
        )
        // Client figures only: runs without a signal source.
        .client_only()
        .param(
            spec::fraction(
                "max_drop",
                "accuracy (a fraction: 0.05 = 5 points) a stage may lose against the sweep's first scored stage",
            )
            .default_number(0.05),
        )
        .param(
            spec::integer(
                "min_answers",
                "scored replies a stage needs to be judged or to serve as the baseline",
            )
            .default_integer(30),
        )
    }

    fn validate(params: &Params) -> Result<(), String> {
        Limits::from_params(params).map(|_| ())
    }

    fn judge(
        params: &Params,
        stage: &StageObservation,
        history: &[StageObservation],
    ) -> Result<Verdict, String> {
        Ok(Limits::from_params(params)?.judge(stage, history))
    }
}

nyann_policy::export_policy!(AccuracyDrop);

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_policy::ClientStats;

    const LIMITS: Limits = Limits {
        max_drop: 0.05,
        min_answers: 30,
    };

    fn stage(concurrency: u32, correct: u64, answered: u64) -> StageObservation {
        StageObservation {
            name: format!("c={concurrency}"),
            concurrency: Some(concurrency),
            client: ClientStats {
                eval: Some(EvalCounts {
                    answered,
                    correct,
                    unanswerable: 0,
                }),
                ..ClientStats::default()
            },
            ..StageObservation::default()
        }
    }

    #[test]
    fn the_first_scored_stage_is_the_baseline_and_never_congested() {
        assert!(!LIMITS.judge(&stage(2, 10, 100), &[]).congested);
    }

    #[test]
    fn a_clear_fall_is_congested_and_says_by_how_much() {
        let v = LIMITS.judge(&stage(16, 30, 100), &[stage(2, 90, 100), stage(8, 88, 100)]);
        assert!(v.congested);
        assert!(
            v.reasons[0].starts_with(
                "accuracy 30.0% (95%: 21.9-39.6%, 30 of 100) is 60.0 points below c=2's 90.0%"
            ),
            "{:?}",
            v.reasons
        );
        assert_eq!(v.fired[0].rule, "accuracy-drop");
    }

    /// 85% against 90% on 100 questions each: 5 points, within chance,
    /// even with no margin. On 20,000 questions each the same 5 points are
    /// sure: more than a margin of 0 or 4 points, not more than 5.
    #[test]
    fn a_drop_within_chance_is_not_congested() {
        let base = [stage(2, 90, 100)];
        assert!(!LIMITS.judge(&stage(8, 85, 100), &base).congested);
        let zero_margin = Limits {
            max_drop: 0.0,
            ..LIMITS
        };
        assert!(!zero_margin.judge(&stage(8, 85, 100), &base).congested);
        let big = [stage(2, 18_000, 20_000)];
        assert!(zero_margin.judge(&stage(8, 17_000, 20_000), &big).congested);
        let four_points = Limits {
            max_drop: 0.04,
            ..LIMITS
        };
        assert!(four_points.judge(&stage(8, 17_000, 20_000), &big).congested);
        assert!(!LIMITS.judge(&stage(8, 17_000, 20_000), &big).congested);
    }

    #[test]
    fn stages_with_too_few_answers_are_neither_judged_nor_a_baseline() {
        // The baseline is the first stage with enough answers.
        let history = [stage(1, 0, 10), stage(2, 90, 100)];
        let v = LIMITS.judge(&stage(8, 30, 100), &history);
        assert!(v.reasons[0].contains("below c=2's"), "{v:?}");
        assert!(!LIMITS.judge(&stage(8, 0, 20), &history).congested);
        assert!(LIMITS.judge(&stage(8, 89, 100), &history).fired.is_empty());
        let plain = StageObservation::default();
        assert!(!LIMITS.judge(&plain, &history).congested);
    }

    /// A capacity-search stage runs after the sweep, but is compared with
    /// the lowest level all the same.
    #[test]
    fn a_search_stage_is_compared_with_the_lowest_level() {
        let history = [stage(2, 90, 100), stage(8, 89, 100), stage(16, 20, 100)];
        let searched = StageObservation {
            refines: Some(2),
            ..stage(12, 88, 100)
        };
        assert!(!LIMITS.judge(&searched, &history).congested);
    }
}
