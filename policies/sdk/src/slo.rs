//! Helpers over a stage's SLO counts (`client.slo`, interface 0.5): the
//! attainment, overall and per goal, with a 95% confidence interval, and
//! the goals in words.

use crate::{Objective, SloCounts, SloGoal};

impl Objective {
    /// The name in scenarios and results files: `ttft`, `tpot`, `e2e`.
    pub fn name(&self) -> &'static str {
        match self {
            Objective::Ttft => "ttft",
            Objective::Tpot => "tpot",
            Objective::E2e => "e2e",
        }
    }
}

impl SloCounts {
    /// The share of judged requests that met every goal (`None` before any
    /// was judged).
    pub fn attainment(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.met as f64 / self.requests as f64)
    }

    /// The attainment's 95% Wilson score interval, `(low, high)`; `(0, 1)`
    /// before any request was judged.
    pub fn interval95(&self) -> (f64, f64) {
        wilson95(self.met, self.requests)
    }

    /// The goal on `objective`, if the SLO sets one.
    pub fn goal(&self, objective: Objective) -> Option<&SloGoal> {
        self.goals.iter().find(|g| g.objective == objective)
    }

    /// The share of judged requests that met the goal on `objective`
    /// (`None` when it is not a goal or no request was judged).
    pub fn attainment_of(&self, objective: Objective) -> Option<f64> {
        let goal = self.goal(objective)?;
        (self.requests > 0).then(|| 1.0 - goal.missed as f64 / self.requests as f64)
    }

    /// The goal missed by the most requests, if any request missed one.
    pub fn most_missed(&self) -> Option<&SloGoal> {
        self.goals
            .iter()
            .filter(|g| g.missed > 0)
            .max_by_key(|g| g.missed)
    }

    /// The goals in words, as the scenario's `slo(...)`: `ttft≤500ms, tpot≤50ms`.
    pub fn describe(&self) -> String {
        self.goals
            .iter()
            .map(|g| format!("{}≤{}", g.objective.name(), show_seconds(g.goal_seconds)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `0.05` as `50ms`, `2.5` as `2.5s`.
fn show_seconds(seconds: f64) -> String {
    let trim = |x: f64| {
        let text = format!("{x:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    if seconds < 1.0 {
        format!("{}ms", trim(seconds * 1000.0))
    } else {
        format!("{}s", trim(seconds))
    }
}

/// The 95% Wilson score interval of `successes` out of `trials`, `(0, 1)`
/// for none: unlike the normal approximation it stays within [0, 1] and
/// is honest at small counts and at 0% or 100%.
pub(crate) fn wilson95(successes: u64, trials: u64) -> (f64, f64) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(requests: u64, met: u64, missed_ttft: u64, missed_tpot: u64) -> SloCounts {
        SloCounts {
            requests,
            met,
            goodput_per_second: 0.0,
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
    fn attainment_overall_and_per_goal() {
        let c = counts(100, 80, 15, 10);
        assert_eq!(c.attainment(), Some(0.8));
        assert_eq!(c.attainment_of(Objective::Ttft), Some(0.85));
        assert_eq!(c.attainment_of(Objective::Tpot), Some(0.9));
        assert_eq!(c.attainment_of(Objective::E2e), None);
        assert_eq!(c.most_missed().map(|g| g.objective), Some(Objective::Ttft));
        let (low, high) = c.interval95();
        assert!(low < 0.8 && 0.8 < high && high - low < 0.2, "{low} {high}");
        assert_eq!(c.describe(), "ttft≤500ms, tpot≤50ms");
        let none = counts(0, 0, 0, 0);
        assert_eq!(none.attainment(), None);
        assert_eq!(none.interval95(), (0.0, 1.0));
        assert!(none.most_missed().is_none());
    }
}
