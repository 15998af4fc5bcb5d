//! Service-level objectives (SLOs) and goodput: the latency goals a request
//! must meet, whether one request met them, and what a stage's requests add
//! up to.
//!
//! The definitions are those of vLLM's `vllm bench serve --goodput` (after
//! DistServe), so that the figures compare:
//! - TTFT, TPOT and E2E are the client's own times of a request; TPOT is
//!   time per output token after the first,
//!   `(E2E - TTFT) / (output_tokens - 1)`, undefined with fewer than two
//!   output tokens (nothing to judge: the goal is met, as vLLM counts such
//!   a TPOT as 0);
//! - a goal is met when the figure is at most the goal (inclusive);
//! - goodput is the requests per second that met every goal; attainment the
//!   share of the stage's requests that did. Unlike vLLM (which counts only
//!   completed requests), a request that failed, was rejected, was dropped
//!   by an open loop's cap or was still unanswered when its stage's drain
//!   ran out counts as a request that missed every goal: a server that sheds
//!   load does not look better for it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::duration::parse_seconds;

/// The latency goals of a stage's requests, in seconds; at least one is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    /// Time to first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_s: Option<f64>,
    /// Time per output token after the first (vLLM's TPOT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_s: Option<f64>,
    /// The whole request, from sending it to its last byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_s: Option<f64>,
}

/// One of the goals of an [`Slo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    Ttft,
    Tpot,
    E2e,
}

impl Objective {
    pub const ALL: [Objective; 3] = [Objective::Ttft, Objective::Tpot, Objective::E2e];

    /// The name in scenarios, flags and files.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Ttft => "ttft",
            Objective::Tpot => "tpot",
            Objective::E2e => "e2e",
        }
    }

    /// Its position in [`Objective::ALL`] (counts per goal are kept in that order).
    pub fn index(self) -> usize {
        match self {
            Objective::Ttft => 0,
            Objective::Tpot => 1,
            Objective::E2e => 2,
        }
    }
}

/// What `--slo` looks like, for error messages.
pub const SLO_HELP: &str =
    "GOAL=DURATION pairs separated by commas, GOAL one of ttft, tpot, e2e: ttft=500ms,tpot=50ms";

/// The times of a request that was answered, as the client measured them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answered {
    /// `None` when no token came (an empty reply).
    pub ttft_s: Option<f64>,
    pub e2e_s: f64,
    pub output_tokens: Option<u64>,
}

/// TPOT as vLLM defines it: `(e2e - ttft) / (output_tokens - 1)`; `None`
/// with fewer than two output tokens or without a first token.
pub fn tpot_seconds(ttft_s: Option<f64>, e2e_s: f64, output_tokens: Option<u64>) -> Option<f64> {
    let ttft = ttft_s?;
    let tokens = output_tokens.filter(|&n| n >= 2)?;
    Some(((e2e_s - ttft) / (tokens - 1) as f64).max(0.0))
}

impl Slo {
    /// The goals set, in the order ttft, tpot, e2e.
    pub fn goals(&self) -> impl Iterator<Item = (Objective, f64)> + '_ {
        Objective::ALL
            .into_iter()
            .filter_map(|o| self.goal(o).map(|g| (o, g)))
    }

    pub fn goal(&self, objective: Objective) -> Option<f64> {
        match objective {
            Objective::Ttft => self.ttft_s,
            Objective::Tpot => self.tpot_s,
            Objective::E2e => self.e2e_s,
        }
    }

    fn goal_mut(&mut self, objective: Objective) -> &mut Option<f64> {
        match objective {
            Objective::Ttft => &mut self.ttft_s,
            Objective::Tpot => &mut self.tpot_s,
            Objective::E2e => &mut self.e2e_s,
        }
    }

    /// What is wrong with these goals (none set, or one not a finite number > 0).
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .goals()
            .filter(|(_, g)| !(g.is_finite() && *g > 0.0))
            .map(|(o, g)| format!("{} must be a duration > 0, got {g}s", o.name()))
            .collect();
        if self.goals().next().is_none() {
            problems.push("give at least one goal: ttft=, tpot= or e2e=".into());
        }
        problems
    }

    /// Reads `ttft=500ms,tpot=50ms` (the `--slo` flag).
    pub fn parse(text: &str) -> Result<Slo, String> {
        let mut slo = Slo::default();
        for pair in text.split(',').map(str::trim) {
            let Some((name, value)) = pair.split_once('=') else {
                return Err(format!(
                    "{pair:?} is not GOAL=DURATION: expected {SLO_HELP}"
                ));
            };
            let name = name.trim();
            let Some(objective) = Objective::ALL.into_iter().find(|o| o.name() == name) else {
                return Err(format!(
                    "unknown goal {name:?}: the goals are ttft, tpot and e2e ({SLO_HELP})"
                ));
            };
            let seconds = parse_seconds(value.trim()).map_err(|e| format!("{name}: {e}"))?;
            let goal = slo.goal_mut(objective);
            if goal.is_some() {
                return Err(format!("{name} is given twice"));
            }
            *goal = Some(seconds);
        }
        match slo.problems().first() {
            Some(problem) => Err(problem.clone()),
            None => Ok(slo),
        }
    }

    /// The goals `answered` missed (`None`: it was not answered, and missed
    /// them all). A reply with no token is judged on TTFT by the whole time
    /// it took: it waited that long and got nothing.
    pub fn missed(&self, answered: Option<&Answered>) -> Vec<Objective> {
        let Some(a) = answered else {
            return self.goals().map(|(o, _)| o).collect();
        };
        let tpot = tpot_seconds(a.ttft_s, a.e2e_s, a.output_tokens);
        self.goals()
            .filter(|&(objective, goal)| {
                let figure = match objective {
                    Objective::Ttft => Some(a.ttft_s.unwrap_or(a.e2e_s)),
                    Objective::Tpot => tpot,
                    Objective::E2e => Some(a.e2e_s),
                };
                figure.is_some_and(|f| f > goal)
            })
            .map(|(o, _)| o)
            .collect()
    }
}

/// `ttft≤500ms, tpot≤50ms`.
impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (objective, goal) in self.goals() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{}≤{}", objective.name(), show_seconds(goal))?;
        }
        Ok(())
    }
}

/// `0.05` as `50ms`, `2.5` as `2.5s`: short, and read back by the duration grammar.
pub fn show_seconds(seconds: f64) -> String {
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

/// A stage's requests against its SLO.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SloStats {
    /// The goals.
    pub slo: Slo,
    /// Requests judged: every request of the stage but those cancelled by
    /// an interrupt (failed, rejected, dropped and late ones missed).
    pub requests: u64,
    /// Of those, the ones that met every goal.
    pub met: u64,
    /// `met / requests` (0 without requests).
    pub attainment: f64,
    /// The attainment's 95% Wilson interval.
    pub attainment_low: f64,
    pub attainment_high: f64,
    /// Requests per second that met every goal (over the stage's duration,
    /// as `requests_per_second`).
    pub goodput_per_second: f64,
    /// Per goal, in the order ttft, tpot, e2e: the requests that missed it.
    pub goals: Vec<GoalStats>,
}

/// One goal of a stage's SLO.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GoalStats {
    pub objective: Objective,
    pub goal_seconds: f64,
    /// Requests that missed this goal.
    pub missed: u64,
    /// `missed / requests`.
    pub missed_share: f64,
}

impl SloStats {
    /// The figures of `met` requests out of `requests` over `duration_s`
    /// seconds, `missed[i]` of them missing goal `Objective::ALL[i]`.
    pub fn of(slo: Slo, requests: u64, met: u64, missed: [u64; 3], duration_s: f64) -> SloStats {
        let share = |n: u64| {
            if requests == 0 {
                0.0
            } else {
                n as f64 / requests as f64
            }
        };
        let (low, high) = crate::observation::wilson(met, requests);
        SloStats {
            slo,
            requests,
            met,
            attainment: share(met),
            attainment_low: low,
            attainment_high: high,
            goodput_per_second: if duration_s > 0.0 {
                met as f64 / duration_s
            } else {
                0.0
            },
            goals: slo
                .goals()
                .map(|(objective, goal)| GoalStats {
                    objective,
                    goal_seconds: goal,
                    missed: missed[objective.index()],
                    missed_share: share(missed[objective.index()]),
                })
                .collect(),
        }
    }

    /// The share of requests that met `objective` (1 when it is not a goal).
    pub fn attainment_of(&self, objective: Objective) -> f64 {
        self.goals
            .iter()
            .find(|g| g.objective == objective)
            .map_or(1.0, |g| 1.0 - g.missed_share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slo(ttft: f64, tpot: f64) -> Slo {
        Slo {
            ttft_s: Some(ttft),
            tpot_s: Some(tpot),
            e2e_s: None,
        }
    }

    fn answered(ttft: f64, e2e: f64, tokens: u64) -> Answered {
        Answered {
            ttft_s: Some(ttft),
            e2e_s: e2e,
            output_tokens: Some(tokens),
        }
    }

    #[test]
    fn tpot_is_the_time_after_the_first_token_over_the_tokens_after_it() {
        // 11 tokens: the first at 0.5 s, the other 10 over the next 1.0 s.
        let tpot = tpot_seconds(Some(0.5), 1.5, Some(11)).unwrap();
        assert!((tpot - 0.1).abs() < 1e-12, "{tpot}");
        // One token (or none, or no first token): no TPOT to judge.
        assert_eq!(tpot_seconds(Some(0.5), 1.5, Some(1)), None);
        assert_eq!(tpot_seconds(Some(0.5), 1.5, Some(0)), None);
        assert_eq!(tpot_seconds(None, 1.5, Some(11)), None);
    }

    #[test]
    fn goals_are_inclusive_and_judged_one_by_one() {
        let goals = slo(0.5, 0.1);
        assert!(goals.missed(Some(&answered(0.5, 1.5, 11))).is_empty());
        assert_eq!(
            goals.missed(Some(&answered(0.6, 1.5, 11))),
            vec![Objective::Ttft]
        );
        assert_eq!(
            goals.missed(Some(&answered(0.2, 1.5, 11))),
            vec![Objective::Tpot]
        );
        // One output token: TPOT is not judged, TTFT still is.
        assert!(goals.missed(Some(&answered(0.5, 9.0, 1))).is_empty());
        assert_eq!(
            goals.missed(Some(&answered(0.7, 9.0, 1))),
            vec![Objective::Ttft]
        );
    }

    #[test]
    fn an_unanswered_request_misses_every_goal_and_an_empty_reply_waited_its_whole_time() {
        let goals = Slo {
            e2e_s: Some(2.0),
            ..slo(0.5, 0.1)
        };
        assert_eq!(goals.missed(None), Objective::ALL.to_vec());
        let empty = Answered {
            ttft_s: None,
            e2e_s: 0.8,
            output_tokens: Some(0),
        };
        assert_eq!(goals.missed(Some(&empty)), vec![Objective::Ttft]);
    }

    #[test]
    fn the_flag_reads_back_what_display_writes_and_refuses_the_malformed() {
        let goals = Slo::parse("ttft=500ms, tpot=50ms").unwrap();
        assert_eq!(goals, slo(0.5, 0.05));
        assert_eq!(goals.to_string(), "ttft≤500ms, tpot≤50ms");
        assert_eq!(Slo::parse("e2e=20s").unwrap().to_string(), "e2e≤20s");
        for (bad, says) in [
            ("ttft", "is not GOAL=DURATION"),
            ("itl=5ms", "unknown goal \"itl\""),
            ("ttft=fast", "ttft: invalid duration"),
            ("ttft=1s,ttft=2s", "ttft is given twice"),
            ("ttft=0s", "ttft must be a duration > 0"),
            ("", "is not GOAL=DURATION"),
        ] {
            let err = Slo::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn stats_count_goodput_attainment_and_each_goal() {
        let stats = SloStats::of(slo(0.5, 0.05), 10, 7, [2, 1, 0], 2.0);
        assert_eq!(stats.goodput_per_second, 3.5);
        assert_eq!(stats.attainment, 0.7);
        assert!(stats.attainment_low < 0.7 && 0.7 < stats.attainment_high);
        assert_eq!(stats.goals.len(), 2);
        assert_eq!(stats.goals[0].missed_share, 0.2);
        assert!((stats.attainment_of(Objective::Tpot) - 0.9).abs() < 1e-12);
        assert_eq!(stats.attainment_of(Objective::E2e), 1.0);
        let none = SloStats::of(slo(0.5, 0.05), 0, 0, [0; 3], 0.0);
        assert_eq!((none.attainment, none.goodput_per_second), (0.0, 0.0));
    }
}
