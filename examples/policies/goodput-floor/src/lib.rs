//! Example policy: stop where too few requests meet the SLO.
//!
//! For sweeps of stages with service-level objectives (`slo(...)` in the
//! scenario, `--slo`): a stage is congested when the share of its requests
//! that met every goal (its attainment) is below `floor`, with 95%
//! confidence. The confidence comes from the counts: the stage is
//! congested when the upper bound of the attainment's Wilson interval is
//! under the floor, so a small stage that missed a few by chance does not
//! stop the sweep, and a server that misses the goals does. With
//! `until_congested(..., refine=N)` the capacity search then finds the
//! highest level that still meets the SLO for `floor` of its requests.
//!
//! Uses the SLO counts of interface 0.5. A stage without an SLO cannot be
//! judged: the call fails saying how to give one.

use nyann_policy::{Params, Policy, PolicyInfo, SloCounts, StageObservation, Verdict, spec};

pub struct GoodputFloor;

/// The floor of one `until_congested(...)` call: the share of requests
/// (a fraction) that must meet the SLO.
#[derive(Debug, Clone, Copy)]
pub struct Floor(pub f64);

impl Floor {
    fn from_params(params: &Params) -> Result<Self, String> {
        let floor = params.fraction("floor")?;
        if floor <= 0.0 {
            return Err(format!(
                "floor must be above 0 (got {floor}): no stage could fall under it"
            ));
        }
        Ok(Floor(floor))
    }

    /// The verdict for `stage`, whose SLO counts are `slo`.
    pub fn judge(&self, slo: &SloCounts) -> Verdict {
        let Some(attainment) = slo.attainment() else {
            return Verdict::ok();
        };
        let (low, high) = slo.interval95();
        if high >= self.0 {
            return Verdict::ok();
        }
        let missed: Vec<String> = slo
            .goals
            .iter()
            .filter(|g| g.missed > 0)
            .map(|g| {
                format!(
                    "{} missed by {:.1}%",
                    g.objective.name(),
                    g.missed as f64 * 100.0 / slo.requests as f64
                )
            })
            .collect();
        Verdict::from_reasons(vec![format!(
            "SLO {} met by {:.1}% of {} requests (95%: {:.1}-{:.1}%), under the floor of {}% \
             with 95% confidence; {}; goodput {:.2} req/s",
            slo.describe(),
            attainment * 100.0,
            slo.requests,
            low * 100.0,
            high * 100.0,
            self.0 * 100.0,
            missed.join(", "),
            slo.goodput_per_second,
        )])
        .fired("goodput-floor", None, &["slo.attainment"])
    }
}

/// What to say when a stage has no SLO to judge by.
const NO_SLO: &str = "goodput-floor judges a stage by its SLO, and this stage has none: give the \
     scenario (or the stage) slo(ttft=\"500ms\", tpot=\"50ms\"), or `generate` --slo \
     ttft=500ms,tpot=50ms";

impl Policy for GoodputFloor {
    fn describe() -> PolicyInfo {
        PolicyInfo::new(
            "goodput-floor",
            env!("CARGO_PKG_VERSION"),
            "Congested when fewer than `floor` of a stage's requests meet its SLO, with 95% confidence.",
        )
        // Client figures only: runs without a signal source.
        .client_only()
        .param(
            spec::fraction(
                "floor",
                "the share of a stage's requests that must meet every goal of its SLO (0.9 = 90%)",
            )
            .default_number(0.9),
        )
    }

    fn validate(params: &Params) -> Result<(), String> {
        Floor::from_params(params).map(|_| ())
    }

    fn judge(
        params: &Params,
        stage: &StageObservation,
        _history: &[StageObservation],
    ) -> Result<Verdict, String> {
        let floor = Floor::from_params(params)?;
        let slo = stage.client.slo.as_ref().ok_or(NO_SLO)?;
        Ok(floor.judge(slo))
    }
}

nyann_policy::export_policy!(GoodputFloor);

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_policy::{ClientStats, Objective, Param, SloGoal, Value};

    fn counts(requests: u64, met: u64, missed_ttft: u64, missed_tpot: u64) -> SloCounts {
        SloCounts {
            requests,
            met,
            goodput_per_second: met as f64 / 10.0,
            goals: vec![
                SloGoal {
                    objective: Objective::Ttft,
                    goal_seconds: 0.5,
                    missed: missed_ttft,
                },
                SloGoal {
                    objective: Objective::Tpot,
                    goal_seconds: 0.05,
                    missed: missed_tpot,
                },
            ],
        }
    }

    #[test]
    fn a_stage_clearly_under_the_floor_is_congested_and_says_why() {
        let v = Floor(0.9).judge(&counts(200, 120, 70, 20));
        assert!(v.congested);
        assert_eq!(
            v.reasons,
            [
                "SLO ttft≤500ms, tpot≤50ms met by 60.0% of 200 requests (95%: 53.1-66.5%), under \
              the floor of 90% with 95% confidence; ttft missed by 35.0%, tpot missed by 10.0%; \
              goodput 12.00 req/s"
            ]
        );
        assert_eq!(v.fired[0].rule, "goodput-floor");
    }

    /// 85% on 40 requests could be 90% by chance; on 2,000 it cannot.
    #[test]
    fn a_shortfall_within_chance_is_not_congested() {
        assert!(!Floor(0.9).judge(&counts(40, 34, 6, 0)).congested);
        assert!(Floor(0.9).judge(&counts(2000, 1700, 300, 0)).congested);
        // At or above the floor: never.
        assert!(!Floor(0.9).judge(&counts(2000, 1900, 100, 0)).congested);
        // Nothing judged: nothing to say.
        assert!(!Floor(0.9).judge(&counts(0, 0, 0, 0)).congested);
        // Five requests that all missed are enough to be sure.
        assert!(Floor(0.9).judge(&counts(5, 0, 5, 5)).congested);
    }

    #[test]
    fn a_stage_without_an_slo_is_an_error_that_says_how_to_give_one() {
        let params = Params::new(vec![Param {
            name: "floor".into(),
            value: Value::Number(0.9),
        }]);
        let stage = StageObservation {
            client: ClientStats::default(),
            ..StageObservation::default()
        };
        let err = GoodputFloor::judge(&params, &stage, &[]).unwrap_err();
        assert!(err.contains("slo(ttft=\"500ms\""), "{err}");
        let zero = Params::new(vec![Param {
            name: "floor".into(),
            value: Value::Number(0.0),
        }]);
        assert!(
            GoodputFloor::validate(&zero)
                .unwrap_err()
                .contains("above 0")
        );
    }
}
