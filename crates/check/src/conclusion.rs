//! What a judged run concluded, in the words its users ask for: per sweep,
//! one answer, the knee: the highest level judged not congested below the
//! lowest judged congested, capacity-search stages included, with its
//! throughput and latencies (or that the very first stage was congested
//! and where to start instead); the bounds a capacity search reached; and
//! the load the skipped stages did not send. Written into `summary.json`
//! (`conclusion`), shown as the last lines on the terminal, and headlined by
//! the report: the three say the same because they all read this.

use nyann_load::StageStatus;
use serde::{Deserialize, Serialize};

pub use crate::goodput::{MostGoodput, UnderSlo};
use crate::record::{CongestionRecord, Refine, RunResult, StageResult};

mod words;

/// The run's conclusion (`summary.json`: `conclusion`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Conclusion {
    /// One entry per `until_congested(...)` sweep that ran, in order.
    pub sweeps: Vec<SweepConclusion>,
    /// What the stages skipped after a stop did not send.
    pub load_not_sent: LoadNotSent,
}

/// What one sweep found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SweepConclusion {
    /// The sweep's number (from 0) and where its `until_congested` is written.
    pub sweep: u32,
    pub name: String,
    /// The first stage judged congested; absent when none was.
    pub congested: Option<StageRef>,
    /// The answer: the highest level judged not congested below the lowest
    /// judged congested, a capacity search's stages included (then it is
    /// `capacity.clean`); absent when no such level was measured.
    pub knee: Option<Knee>,
    /// When the sweep's first stage was congested: a level to start from
    /// instead (a quarter of that stage's); absent when that stage ran at
    /// one stream, below which there is nothing.
    pub suggested_start: Option<Level>,
    /// What the capacity search after the stop found (`refine=`); absent
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
    /// When a verdict the answer rests on was a close call: the scenario
    /// line that judges those levels again with longer stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejudge: Option<String>,
    /// When the sweep's stages have an SLO: the measured level at which
    /// the most requests per second met it (not always the knee, nor the
    /// level of the highest throughput).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub most_goodput: Option<MostGoodput>,
}

/// The capacity a search found between a sweep's levels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Capacity {
    /// The highest level judged not congested (a search stage's, or the
    /// sweep's knee); absent when every level tried was congested.
    pub clean: Option<StageRef>,
    /// The lowest level judged congested.
    pub congested: StageRef,
    /// How far apart the two levels are (streams, or requests/s): the
    /// resolution the search reached.
    pub gap: Option<f64>,
    /// The gap at which the search ends (`resolution=`, else one stream or
    /// 5% of the congested rate); absent from summaries written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<f64>,
    /// The search's stages, in the order they ran.
    pub stages: Vec<SearchedLevel>,
    /// Seconds of load the search sent.
    pub seconds: f64,
    /// When the search ended with its bounds further apart than the
    /// resolution (its `refine=` stages were spent): how many more
    /// bisection stages would bring them within it. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stages_to_close: Option<u32>,
    /// The levels judged more than once because a verdict was a close
    /// call (`confirm=`), and how their verdicts settled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirmed: Vec<Confirmed>,
    /// When the verdicts at its bounds rest on the stages' SLO (the policy
    /// fired a rule on `slo.attainment`, as `goodput-floor` does): that SLO,
    /// and the share of the clean level's requests that met it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub under_slo: Option<UnderSlo>,
}

/// A level of a capacity search judged again (`confirm=`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Confirmed {
    #[serde(flatten)]
    pub level: Level,
    /// Stages that judged it.
    pub verdicts: u32,
    /// Of those, the ones that said congested.
    pub congested_verdicts: u32,
    /// How it settled: the majority, on a tie the verdict farthest from
    /// its threshold.
    pub congested: bool,
}

/// One stage of a capacity search and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchedLevel {
    #[serde(flatten)]
    pub stage: StageRef,
    pub congested: bool,
}

/// A stage of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StageRef {
    /// Position in the scenario's steps (as in `stages.json`).
    pub stage: usize,
    pub label: String,
    #[serde(flatten)]
    pub level: Level,
    /// How far its verdict was from flipping by the standard rules: the
    /// relative amount the rule nearest to firing was over (positive) or
    /// under (negative) its thresholds (`CongestionRecord::margin`); absent
    /// when the policy does not judge by them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub margin: Option<f64>,
}

/// Verdicts this near a threshold (relative) are said to be close calls:
/// the level could be judged the other way on another run.
pub const CLOSE_CALL: f64 = 0.10;

/// A stage's load level: its concurrency or its arrival rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Level {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Requests per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
}

/// The knee: the most load the server took before congestion, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Knee {
    #[serde(flatten)]
    pub stage: StageRef,
    pub requests_per_second: f64,
    pub output_tokens_per_second: f64,
    pub ttft_p50_seconds: f64,
    pub ttft_p99_seconds: f64,
    pub itl_p50_seconds: f64,
    pub itl_p99_seconds: f64,
}

/// Load not sent because a sweep stopped.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LoadNotSent {
    /// Stages skipped.
    pub stages: usize,
    /// Their configured durations, summed.
    pub seconds: f64,
    /// The same, times the processes that would have sent the load (one,
    /// or the workers of a fleet).
    pub worker_seconds: f64,
}

impl Level {
    fn of(stage: &StageResult) -> Level {
        Level {
            concurrency: stage.concurrency,
            rate: stage.rate,
        }
    }

    /// A quarter of this level (at least one stream): where to start a
    /// sweep whose first stage was already congested; `None` at one
    /// stream, which has nothing below it.
    fn quarter(self) -> Option<Level> {
        if self.rate.is_none() && self.concurrency == Some(1) {
            return None;
        }
        Some(Level {
            concurrency: self.concurrency.map(|c| (c / 4).max(1)),
            rate: self.rate.map(|r| r / 4.0),
        })
    }
}

impl Level {
    /// The concurrency, else the rate, as a number.
    fn value(&self) -> f64 {
        self.concurrency.map(f64::from).or(self.rate).unwrap_or(0.0)
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.concurrency, self.rate) {
            (_, Some(rate)) => write!(f, "rate={rate}"),
            (Some(c), None) => write!(f, "concurrency={c}"),
            (None, None) => write!(f, "-"),
        }
    }
}

impl StageRef {
    fn of(stage: &StageResult, record: &CongestionRecord) -> StageRef {
        StageRef {
            stage: stage.index,
            label: stage.label.clone(),
            level: Level::of(stage),
            margin: record.margin(),
        }
    }

    /// Its verdict was within [`CLOSE_CALL`] of flipping: what to say.
    fn close_call(&self, congested: bool) -> Option<String> {
        let margin = self.margin.filter(|m| m.abs() < CLOSE_CALL)?;
        let percent = (margin.abs() * 100.0).round();
        let by = if percent == 0.0 {
            "at a threshold".to_string()
        } else {
            format!(
                "{percent}% {} a threshold",
                if congested { "over" } else { "under" }
            )
        };
        let verdict = if congested {
            "congested"
        } else {
            "not congested"
        };
        Some(format!("{} was judged {verdict} {by}", self.level))
    }
}

impl Capacity {
    /// The bounds a sweep's own stages set, before any search stage: the
    /// knee (if any) and the first congested stage, the search asked for
    /// with `refine`.
    fn of_sweep(clean: Option<StageRef>, congested: StageRef, refine: Refine) -> Capacity {
        let streams = congested.level.rate.is_none();
        let bounds = nyann_load::Bounds::new(
            clean.as_ref().map(|c| c.level.value()),
            congested.level.value(),
            streams,
            refine.resolution,
        );
        let mut capacity = Capacity {
            clean,
            congested,
            gap: None,
            resolution: Some(bounds.resolution),
            stages: Vec::new(),
            seconds: 0.0,
            stages_to_close: None,
            confirmed: Vec::new(),
            under_slo: None,
        };
        capacity.measure_gap();
        capacity
    }

    fn measure_gap(&mut self) {
        self.gap = self
            .clean
            .as_ref()
            .map(|clean| self.congested.level.value() - clean.level.value());
        let streams = self.congested.level.rate.is_none();
        self.stages_to_close = self
            .gap
            .zip(self.resolution)
            .map(|(gap, resolution)| stages_to_close(gap, resolution, streams))
            .filter(|&stages| stages > 0);
    }

    /// What the search found, in words: "concurrency=22 not congested
    /// (#7 c=22: 16.6 req/s, ...), concurrency=23 congested (5 search
    /// stages, 10s of load)", with `knee`'s figures when it is the clean
    /// bound.
    pub fn answer(&self, knee: Option<&Knee>) -> String {
        let searched = if self.stages.is_empty() {
            // No stage was needed, or none could run.
            let within = self
                .gap
                .zip(self.resolution)
                .is_some_and(|(gap, resolution)| gap <= resolution);
            if within {
                "no search stage needed: the sweep's levels are within the resolution".to_string()
            } else if self.clean.is_none() && self.congested.level.concurrency == Some(1) {
                "no search stage: nothing below one stream to try".to_string()
            } else {
                "no search stage ran".to_string()
            }
        } else {
            format!(
                "{} search stage{}, {} of load",
                self.stages.len(),
                if self.stages.len() == 1 { "" } else { "s" },
                humantime::format_duration(std::time::Duration::from_secs_f64(
                    self.seconds.max(0.0).round()
                ))
            )
        };
        let confirmed: String = self
            .confirmed
            .iter()
            .map(|c| {
                format!(
                    "; {} judged {} times ({} congested): {}",
                    c.level,
                    c.verdicts,
                    c.congested_verdicts,
                    if c.congested {
                        "congested"
                    } else {
                        "not congested"
                    }
                )
            })
            .collect();
        let searched = searched + &confirmed;
        let open = match self.stages_to_close {
            Some(more) if !self.stages.is_empty() => format!(
                "; the levels are {} apart, {} more search stage{} would bring them within {} \
                 (raise refine= by {more})",
                number(self.gap.unwrap_or_default()),
                more,
                if more == 1 { "" } else { "s" },
                number(self.resolution.unwrap_or_default()),
            ),
            _ => String::new(),
        };
        match &self.clean {
            Some(clean) => {
                let figures = knee
                    .filter(|k| k.stage.stage == clean.stage)
                    .map(|k| format!(" ({}: {})", clean.label, k.figures()))
                    .unwrap_or_default();
                format!(
                    "{}{figures} not congested, {} congested ({searched}{open})",
                    clean.level, self.congested.level
                )
            }
            None => format!(
                "not found: congested down to {} ({searched})",
                self.congested.level
            ),
        }
    }
}

impl Knee {
    /// `stage` as the answer, if its verdict was given and its client
    /// figures measured.
    fn of(stage: &StageResult, record: &CongestionRecord) -> Option<Knee> {
        let client = stage.client.as_ref().filter(|_| record.verdict.is_some())?;
        Some(Knee {
            stage: StageRef::of(stage, record),
            requests_per_second: client.requests_per_second,
            output_tokens_per_second: client.output_tokens_per_second,
            ttft_p50_seconds: client.ttft_p50_seconds,
            ttft_p99_seconds: client.ttft_p99_seconds,
            itl_p50_seconds: client.itl_p50_seconds,
            itl_p99_seconds: client.itl_p99_seconds,
        })
    }

    /// Its figures, for the closing lines.
    pub fn figures(&self) -> String {
        format!(
            "{:.1} req/s, {:.0} output tok/s, TTFT p50/p99 {}/{} ms, ITL p50/p99 {}/{} ms",
            self.requests_per_second,
            self.output_tokens_per_second,
            millis(self.ttft_p50_seconds),
            millis(self.ttft_p99_seconds),
            millis(self.itl_p50_seconds),
            millis(self.itl_p99_seconds),
        )
    }
}

/// Bisection stages that bring levels `gap` apart within `resolution`
/// (each halves the gap; a whole number of streams rounds up).
fn stages_to_close(mut gap: f64, resolution: f64, streams: bool) -> u32 {
    let mut stages = 0;
    while gap > resolution && resolution > 0.0 && stages < 64 {
        gap = if streams {
            (gap / 2.0).ceil()
        } else {
            gap / 2.0
        };
        stages += 1;
    }
    stages
}

/// A level or a gap as a person writes it: `2`, `2.5`.
fn number(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

impl SweepConclusion {
    /// Adds a level of the capacity search (after the sweep's stages, which
    /// set its first bounds): its measured stages, more than one when a
    /// close call was judged again (`confirm=`), settled as the search
    /// settled them.
    fn searched(&mut self, level: &[(&StageResult, &CongestionRecord)]) {
        let (Some(first), knee) = (&self.congested, &self.knee) else {
            return;
        };
        let Some(&(last, _)) = level.last() else {
            return;
        };
        // A record from before `refine` was kept: the default resolution.
        let capacity = self.capacity.get_or_insert_with(|| {
            let clean = knee.as_ref().map(|k| k.stage.clone());
            let refine = Refine {
                stages: 0,
                resolution: None,
                confirm: 0,
            };
            Capacity::of_sweep(clean, first.clone(), refine)
        });
        let votes: Vec<nyann_load::Vote> = level
            .iter()
            .map(|(_, record)| nyann_load::Vote {
                congested: record.congested(),
                margin: record.margin(),
            })
            .collect();
        let congested = nyann_load::settle(&votes);
        // The stage the level stands for: the clearest of its verdicts
        // that agrees with the settled one.
        let (stage, record) = level
            .iter()
            .filter(|(_, record)| record.congested() == congested)
            .max_by(|a, b| {
                let far = |r: &CongestionRecord| r.margin().map_or(0.0, f64::abs);
                far(a.1).total_cmp(&far(b.1))
            })
            .copied()
            .unwrap_or(level[level.len() - 1]);
        let at = StageRef::of(stage, record);
        let value = at.level.value();
        if congested && value < capacity.congested.level.value() {
            capacity.congested = at.clone();
        } else if !congested
            && capacity
                .clean
                .as_ref()
                .is_none_or(|clean| value > clean.level.value())
        {
            capacity.clean = Some(at.clone());
            // The answer is the best clean level measured: this one.
            if let Some(knee) = Knee::of(stage, record) {
                self.knee = Some(knee);
            }
        }
        capacity.measure_gap();
        for &(stage, record) in level {
            if let (Some(start), Some(end)) = (stage.start_unix, stage.end_unix) {
                capacity.seconds += end - start;
            }
            capacity.stages.push(SearchedLevel {
                stage: StageRef::of(stage, record),
                congested: record.congested(),
            });
        }
        if level.len() > 1 {
            capacity.confirmed.push(Confirmed {
                level: Level::of(last),
                verdicts: level.len() as u32,
                congested_verdicts: votes.iter().filter(|v| v.congested).count() as u32,
                congested,
            });
        }
    }

    /// The bounds the answer rests on (the search's, else the knee and the
    /// first congested stage) whose verdict was within [`CLOSE_CALL`] of
    /// flipping and not confirmed by more verdicts, each with its verdict.
    fn close_bounds(&self) -> Vec<(&StageRef, bool)> {
        let (clean, congested) = match &self.capacity {
            Some(capacity) => (capacity.clean.as_ref(), Some(&capacity.congested)),
            None => (
                self.knee.as_ref().map(|k| &k.stage),
                self.congested.as_ref(),
            ),
        };
        let confirmed = |at: &StageRef| {
            self.capacity
                .as_ref()
                .is_some_and(|c| c.confirmed.iter().any(|l| l.level == at.level))
        };
        [(clean, false), (congested, true)]
            .into_iter()
            .filter_map(|(at, verdict)| Some((at?, verdict)))
            .filter(|(at, verdict)| at.close_call(*verdict).is_some() && !confirmed(at))
            .collect()
    }

    /// The close calls among the bounds the answer rests on, in words.
    pub fn close_call(&self) -> Option<String> {
        let close: Vec<String> = self
            .close_bounds()
            .into_iter()
            .filter_map(|(at, congested)| at.close_call(congested))
            .collect();
        (!close.is_empty()).then(|| close.join(", "))
    }
}

impl Conclusion {
    /// The conclusion of `result`, a run of `workers` processes.
    pub fn of(result: &RunResult, workers: usize) -> Conclusion {
        let mut sweeps: Vec<SweepConclusion> = Vec::new();
        // The search stages of one level, as they come.
        let mut level: Vec<(usize, &StageResult, &CongestionRecord)> = Vec::new();
        /// Adds the level gathered so far to its sweep.
        fn searched(
            sweeps: &mut [SweepConclusion],
            level: &mut Vec<(usize, &StageResult, &CongestionRecord)>,
        ) {
            if let Some(&(position, _, _)) = level.first() {
                let stages: Vec<_> = level.iter().map(|&(_, s, r)| (s, r)).collect();
                sweeps[position].searched(&stages);
            }
            level.clear();
        }
        for stage in &result.stages {
            let Some(record) = CongestionRecord::of(stage) else {
                continue;
            };
            let index = record.sweep.index;
            let position = match sweeps.iter().position(|s| s.sweep == index) {
                Some(position) => position,
                None => {
                    sweeps.push(SweepConclusion {
                        sweep: index,
                        name: record.sweep.name.clone(),
                        congested: None,
                        knee: None,
                        suggested_start: None,
                        capacity: None,
                        rejudge: None,
                        most_goodput: None,
                    });
                    sweeps.len() - 1
                }
            };
            if stage.search.is_some() {
                if stage.status == StageStatus::Measured {
                    // Consecutive stages at one level are one level's
                    // verdicts (a close call confirmed).
                    let same = level.last().is_some_and(|&(at, s, _)| {
                        at == position && Level::of(s) == Level::of(stage)
                    });
                    if !same {
                        searched(&mut sweeps, &mut level);
                    }
                    level.push((position, stage, record));
                }
                continue;
            }
            searched(&mut sweeps, &mut level);
            let sweep = &mut sweeps[position];
            if sweep.congested.is_some() || stage.status != StageStatus::Measured {
                continue;
            }
            if record.congested() {
                let congested = StageRef::of(stage, record);
                if sweep.knee.is_none() {
                    sweep.suggested_start = Level::of(stage).quarter();
                }
                // Its bounds are known before any search stage runs, and
                // stand when none needs to (the levels are close enough).
                if let Some(refine) = record.refine.filter(|_| record.stopped) {
                    sweep.capacity = Some(Capacity::of_sweep(
                        sweep.knee.as_ref().map(|k| k.stage.clone()),
                        congested.clone(),
                        refine,
                    ));
                }
                sweep.congested = Some(congested);
            } else if let Some(knee) = Knee::of(stage, record) {
                sweep.knee = Some(knee);
            }
        }
        searched(&mut sweeps, &mut level);
        for sweep in &mut sweeps {
            let close: Vec<&StageRef> =
                sweep.close_bounds().into_iter().map(|(at, _)| at).collect();
            sweep.rejudge = (!close.is_empty())
                .then(|| words::rejudge_line(&close, &result.stages))
                .flatten();
            if let Some(capacity) = &mut sweep.capacity {
                let clean = capacity.clean.as_ref().map(|c| c.stage);
                capacity.under_slo =
                    crate::goodput::under_slo(&result.stages, clean, capacity.congested.stage);
            }
            sweep.most_goodput = crate::goodput::most_goodput(&result.stages, sweep.sweep);
        }
        let skipped = result
            .stages
            .iter()
            .filter(|s| s.status == StageStatus::Skipped);
        let (stages, seconds) =
            skipped.fold((0, 0.0), |(n, s), stage| (n + 1, s + stage.duration_s));
        Conclusion {
            sweeps,
            load_not_sent: LoadNotSent {
                stages,
                seconds,
                worker_seconds: seconds * workers.max(1) as f64,
            },
        }
    }
}

/// `summary.json`: the run (`R`: one process's, or a fleet's merged
/// result), with its conclusion.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Summary<'a, R> {
    #[serde(flatten)]
    result: &'a R,
    conclusion: &'a Conclusion,
}

/// The summary as printed on stdout and written to `summary.json`.
pub fn summary_json<R: Serialize>(
    result: &R,
    conclusion: &Conclusion,
) -> serde_json::Result<String> {
    nyann_results::summary_json(&Summary { result, conclusion })
}

/// Writes `summary.json` into `dir` again, with the conclusion (the runner
/// or the fleet's merge wrote it without, as the run ended).
pub fn write_summary<R: Serialize>(
    dir: &std::path::Path,
    result: &R,
    conclusion: &Conclusion,
) -> std::io::Result<()> {
    nyann_results::RunDir::at(dir).write_summary(&Summary { result, conclusion })
}

/// Milliseconds for the closing lines.
fn millis(seconds: f64) -> String {
    let ms = seconds * 1000.0;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms:.1}")
    }
}

#[cfg(test)]
mod tests;
