//! What a judged run concluded, in the words its users ask for: per sweep,
//! the knee (the last stage before the first one judged congested) with
//! its throughput and latencies, or that the very first stage was congested
//! and where to start instead; and the load the skipped stages did not
//! send. Written into `summary.json` (`conclusion`) and shown as the last
//! lines on the terminal.

use std::fmt::Write;

use nyann_load::StageStatus;
use serde::{Deserialize, Serialize};

use crate::record::{CongestionRecord, Refine, RunResult, StageResult};

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
    /// The last stage before it that was judged not congested; absent when
    /// the first stage was congested (or none was judged).
    pub knee: Option<Knee>,
    /// When the sweep's first stage was congested: a level to start from
    /// instead (a quarter of that stage's); absent when that stage ran at
    /// one stream, below which there is nothing.
    pub suggested_start: Option<Level>,
    /// What the capacity search after the stop found (`refine=`); absent
    /// without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Capacity>,
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
        };
        capacity.measure_gap();
        capacity
    }

    fn measure_gap(&mut self) {
        self.gap = self
            .clean
            .as_ref()
            .map(|clean| self.congested.level.value() - clean.level.value());
    }

    /// What the search found, in words: "concurrency=22 not congested,
    /// concurrency=23 congested (5 search stages, 10s of load)".
    pub fn answer(&self) -> String {
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
        match &self.clean {
            Some(clean) => format!(
                "{} not congested, {} congested ({searched})",
                clean.level, self.congested.level
            ),
            None => format!(
                "not found: congested down to {} ({searched})",
                self.congested.level
            ),
        }
    }
}

impl SweepConclusion {
    /// Adds a measured search stage (after the sweep's stages, which set
    /// its first bounds).
    fn searched(&mut self, stage: &StageResult, record: &CongestionRecord) {
        let (Some(first), knee) = (&self.congested, &self.knee) else {
            return;
        };
        let capacity = self.capacity.get_or_insert_with(|| Capacity {
            clean: knee.as_ref().map(|k| k.stage.clone()),
            congested: first.clone(),
            gap: None,
            // A record from before `refine` was kept: the default.
            resolution: None,
            stages: Vec::new(),
            seconds: 0.0,
        });
        let at = StageRef::of(stage, record);
        let congested = record.congested();
        let level = at.level.value();
        if congested && level < capacity.congested.level.value() {
            capacity.congested = at.clone();
        } else if !congested
            && capacity
                .clean
                .as_ref()
                .is_none_or(|clean| level > clean.level.value())
        {
            capacity.clean = Some(at.clone());
        }
        capacity.measure_gap();
        if let (Some(start), Some(end)) = (stage.start_unix, stage.end_unix) {
            capacity.seconds += end - start;
        }
        capacity.stages.push(SearchedLevel {
            stage: at,
            congested,
        });
    }

    /// The verdicts the answer rests on (the search's bounds, else the knee
    /// and the first congested stage) that were within [`CLOSE_CALL`] of
    /// flipping, in words.
    pub fn close_call(&self) -> Option<String> {
        let (clean, congested) = match &self.capacity {
            Some(capacity) => (capacity.clean.as_ref(), Some(&capacity.congested)),
            None => (
                self.knee.as_ref().map(|k| &k.stage),
                self.congested.as_ref(),
            ),
        };
        let close: Vec<String> = [
            clean.and_then(|c| c.close_call(false)),
            congested.and_then(|c| c.close_call(true)),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!close.is_empty()).then(|| close.join(", "))
    }
}

impl Conclusion {
    /// The conclusion of `result`, a run of `workers` processes.
    pub fn of(result: &RunResult, workers: usize) -> Conclusion {
        let mut sweeps: Vec<SweepConclusion> = Vec::new();
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
                    });
                    sweeps.len() - 1
                }
            };
            let sweep = &mut sweeps[position];
            if stage.search.is_some() {
                if stage.status == StageStatus::Measured {
                    sweep.searched(stage, record);
                }
                continue;
            }
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
            } else if record.verdict.is_some()
                && let Some(client) = &stage.client
            {
                sweep.knee = Some(Knee {
                    stage: StageRef::of(stage, record),
                    requests_per_second: client.requests_per_second,
                    output_tokens_per_second: client.output_tokens_per_second,
                    ttft_p50_seconds: client.ttft_p50_seconds,
                    ttft_p99_seconds: client.ttft_p99_seconds,
                    itl_p50_seconds: client.itl_p50_seconds,
                    itl_p99_seconds: client.itl_p99_seconds,
                });
            }
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

    /// The closing lines for a terminal: per sweep, its knee (or that its
    /// first stage was congested, and where to start), then the load not sent.
    pub fn lines(&self) -> String {
        let mut out = String::new();
        let several = self.sweeps.len() > 1;
        for sweep in &self.sweeps {
            let prefix = if several {
                format!("sweep {} ({}): ", sweep.sweep, sweep.name)
            } else {
                String::new()
            };
            match (&sweep.knee, &sweep.congested, &sweep.suggested_start) {
                (Some(knee), congested, _) => {
                    let what = match congested {
                        Some(c) => format!("knee (congested from {})", c.label),
                        None => "no stage was congested; the highest level".to_string(),
                    };
                    let _ = writeln!(
                        out,
                        "{prefix}{what}: {} ({}): {:.1} req/s, {:.0} output tok/s, TTFT p50/p99 {}/{} ms, ITL p50/p99 {}/{} ms",
                        knee.stage.label,
                        knee.stage.level,
                        knee.requests_per_second,
                        knee.output_tokens_per_second,
                        millis(knee.ttft_p50_seconds),
                        millis(knee.ttft_p99_seconds),
                        millis(knee.itl_p50_seconds),
                        millis(knee.itl_p99_seconds),
                    );
                }
                (None, Some(congested), Some(start)) => {
                    let _ = writeln!(
                        out,
                        "{prefix}the first stage ({}) was already congested: no knee in this sweep; start lower, e.g. at {start}",
                        congested.label
                    );
                }
                (None, Some(congested), None) => {
                    let _ = writeln!(
                        out,
                        "{prefix}the first stage ({}) was already congested, at one stream: no knee in this sweep and no lower level to start from; the server does not meet these thresholds even at one stream (check the thresholds, then the server)",
                        congested.label
                    );
                }
                _ => {}
            }
            if let Some(capacity) = &sweep.capacity {
                let _ = writeln!(out, "{prefix}capacity: {}", capacity.answer());
            }
            if let Some(close) = sweep.close_call() {
                let _ = writeln!(
                    out,
                    "{prefix}close call: {close}; a level this near can be judged the other way on another run: re-judge it with a longer stage"
                );
            }
        }
        let lost = &self.load_not_sent;
        if lost.stages > 0 {
            let _ = write!(
                out,
                "load not sent: {} stage{} skipped, {}",
                lost.stages,
                if lost.stages == 1 { "" } else { "s" },
                humantime::format_duration(std::time::Duration::from_secs_f64(
                    lost.seconds.max(0.0).round()
                ))
            );
            if lost.worker_seconds > lost.seconds {
                let _ = write!(
                    out,
                    " ({} of worker time)",
                    humantime::format_duration(std::time::Duration::from_secs_f64(
                        lost.worker_seconds.max(0.0).round()
                    ))
                );
            }
            out.push('\n');
        }
        out
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
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::record::{Judged, PolicyMode, PolicyRef};
    use nyann_load::{RunOutcome, StageDetail};
    use nyann_model::{ClientStats, Mode, SweepRef, Verdict};

    fn stage(index: usize, c: u32, congested: Option<bool>) -> StageResult {
        let ran = congested.is_some();
        StageResult {
            index,
            label: format!("#{index} c={c}"),
            name: None,
            status: if ran {
                StageStatus::Measured
            } else {
                StageStatus::Skipped
            },
            mode: Some(Mode::Concurrent),
            concurrency: Some(c),
            rate: None,
            duration_s: 60.0,
            drain: None,
            sweep: Some(0),
            start_unix: None,
            end_unix: None,
            client: ran.then(|| ClientStats {
                requests_per_second: f64::from(c),
                ttft_p99_seconds: 0.25,
                ..ClientStats::default()
            }),
            detail: ran.then(StageDetail::default),
            annotation: congested.map(|congested| Judged {
                congestion: CongestionRecord {
                    policy: PolicyRef {
                        name: "builtin".into(),
                        version: "0".into(),
                        origin: "builtin".into(),
                        digest: String::new(),
                        interface: String::new(),
                    },
                    mode: PolicyMode::Enforce,
                    sweep: SweepRef {
                        index: 0,
                        name: "sweep.star:3:10".into(),
                    },
                    params: vec![],
                    judged_params: Vec::new(),
                    roles: vec![],
                    coverage: vec![],
                    signal_errors: vec![],
                    verdict: Some(Verdict {
                        congested,
                        reasons: vec![],
                        fired: Vec::new(),
                    }),
                    policy_error: None,
                    stopped: congested,
                    refine: None,
                    check_seconds: 0.0,
                },
            }),
            skip_reason: None,
            check_interrupted: false,
            degraded: None,
            search: None,
        }
    }

    fn run(stages: Vec<StageResult>) -> RunResult {
        RunResult {
            outcome: RunOutcome::Completed,
            start_unix: 0.0,
            end_unix: 1.0,
            seed: 1,
            models: vec![],
            targets: vec![],
            totals: ClientStats::default(),
            totals_detail: StageDetail::default(),
            requests_recorded: 0,
            stages,
        }
    }

    #[test]
    fn the_knee_is_the_last_stage_before_the_first_congested_one() {
        let result = run(vec![
            stage(0, 8, Some(false)),
            stage(1, 16, Some(false)),
            stage(2, 32, Some(true)),
            stage(3, 64, None),
            stage(4, 128, None),
        ]);
        let conclusion = Conclusion::of(&result, 3);
        let sweep = &conclusion.sweeps[0];
        let knee = sweep.knee.as_ref().unwrap();
        assert_eq!((knee.stage.stage, knee.requests_per_second), (1, 16.0));
        assert_eq!(sweep.congested.as_ref().unwrap().label, "#2 c=32");
        assert_eq!(sweep.suggested_start, None);
        assert_eq!(
            conclusion.load_not_sent,
            LoadNotSent {
                stages: 2,
                seconds: 120.0,
                worker_seconds: 360.0
            }
        );
        assert_eq!(
            conclusion.lines(),
            "knee (congested from #2 c=32): #1 c=16 (concurrency=16): 16.0 req/s, 0 output tok/s, \
             TTFT p50/p99 0.0/250 ms, ITL p50/p99 0.0/0.0 ms\n\
             load not sent: 2 stages skipped, 2m (6m of worker time)\n"
        );
        let json = serde_json::to_value(&conclusion).unwrap();
        assert_eq!(json["sweeps"][0]["knee"]["concurrency"], 16);
        assert_eq!(json["sweeps"][0]["knee"]["label"], "#1 c=16");
        assert_eq!(json["load_not_sent"]["seconds"], 120.0);
    }

    /// `stage` judged by the built-in's thresholds (waiting p50 8, TTFT
    /// p99 1 s, KV 0.95, 1 preemption) on one role's signals.
    fn judged(
        mut stage: StageResult,
        waiting: f64,
        ttft: f64,
        kv: f64,
        preempted: f64,
    ) -> StageResult {
        let record = &mut stage.annotation.as_mut().unwrap().congestion;
        record.judged_params = [
            ("waiting_requests_p50", 8.0),
            ("ttft_p99", 1.0),
            ("kv_cache_usage", 0.95),
            ("preemptions", 1.0),
        ]
        .into_iter()
        .map(|(name, value)| nyann_model::Param {
            name: name.into(),
            value: nyann_model::Value::Number(value),
        })
        .collect();
        record.roles = vec![nyann_model::RoleSignals {
            role: "aggregate".into(),
            waiting_requests_p50: waiting,
            ttft_p99_seconds: ttft,
            kv_cache_usage_max: kv,
            preemptions: preempted,
            extra: vec![],
        }];
        stage
    }

    /// The margin is the rule nearest to firing, only as far over as its
    /// least condition; it is claimed only where the verdict is the rules'.
    #[test]
    fn a_verdicts_margin_is_the_nearest_rules_least_condition() {
        let margin = |stage: &StageResult| CongestionRecord::of(stage).unwrap().margin();
        // Queueing: waiting 12 is 50% over, TTFT 1.1 s 10% over: 10% over.
        let over = judged(stage(0, 32, Some(true)), 12.0, 1.1, 0.5, 0.0);
        assert!((margin(&over).unwrap() - 0.10).abs() < 1e-9);
        // Clean: queueing is 50% under on TTFT; KV 0.9 is 5% under with
        // 3 preemptions: the KV rule is nearer.
        let under = judged(stage(0, 16, Some(false)), 20.0, 0.5, 0.9025, 3.0);
        assert!((margin(&under).unwrap() + 0.05).abs() < 1e-9);
        // A verdict the rules do not give (a custom policy's logic), or no
        // standard thresholds: no margin.
        let custom = judged(stage(0, 16, Some(true)), 1.0, 0.1, 0.1, 0.0);
        assert_eq!(margin(&custom), None);
        assert_eq!(margin(&stage(0, 16, Some(true))), None);
    }

    /// The verdicts a capacity rests on, when near a threshold, are said.
    #[test]
    fn a_close_call_at_the_capacitys_bounds_is_said() {
        let search = |index, c, congested, waiting| {
            let mut s = judged(stage(index, c, Some(congested)), waiting, 2.0, 0.1, 0.0);
            s.search = Some(nyann_load::SearchStage { refines: 1 });
            s
        };
        let result = run(vec![
            judged(stage(0, 8, Some(false)), 0.0, 2.0, 0.1, 0.0),
            judged(stage(1, 32, Some(true)), 30.0, 2.0, 0.1, 0.0),
            search(2, 20, true, 8.4),
            search(3, 14, false, 4.0),
            search(4, 17, false, 7.6),
        ]);
        let conclusion = Conclusion::of(&result, 1);
        let capacity = conclusion.sweeps[0].capacity.as_ref().unwrap();
        assert_eq!(capacity.congested.level.concurrency, Some(20));
        assert!((capacity.congested.margin.unwrap() - 0.05).abs() < 1e-9);
        assert!(
            conclusion.lines().contains(
                "close call: concurrency=17 was judged not congested 5% under a threshold, \
                 concurrency=20 was judged congested 5% over a threshold; a level this near"
            ),
            "{}",
            conclusion.lines()
        );
        // Far from every threshold: nothing to say.
        let result = run(vec![
            judged(stage(0, 8, Some(false)), 0.0, 2.0, 0.1, 0.0),
            judged(stage(1, 32, Some(true)), 30.0, 2.0, 0.1, 0.0),
        ]);
        assert!(!Conclusion::of(&result, 1).lines().contains("close call"));
    }

    /// `stage` of a sweep that searches its capacity with `refine=4,
    /// resolution=`resolution`.
    fn refined(mut stage: StageResult, resolution: Option<f64>) -> StageResult {
        let record = &mut stage.annotation.as_mut().unwrap().congestion;
        record.refine = Some(Refine {
            stages: 4,
            resolution,
        });
        stage
    }

    /// A search that needs no stage (the sweep's clean and congested levels
    /// are within the resolution already) still has its bounds: they are
    /// the capacity, said as such.
    #[test]
    fn a_search_that_needs_no_stage_still_says_the_capacity() {
        let result = run(vec![
            refined(stage(0, 10, Some(false)), Some(10.0)),
            refined(stage(1, 20, Some(true)), Some(10.0)),
            stage(2, 40, None),
        ]);
        let conclusion = Conclusion::of(&result, 1);
        let capacity = conclusion.sweeps[0].capacity.as_ref().unwrap();
        assert_eq!(capacity.clean.as_ref().unwrap().level.concurrency, Some(10));
        assert_eq!(capacity.congested.level.concurrency, Some(20));
        assert_eq!(
            (capacity.gap, capacity.resolution),
            (Some(10.0), Some(10.0))
        );
        assert!(capacity.stages.is_empty());
        assert!(
            conclusion.lines().contains(
                "capacity: concurrency=10 not congested, concurrency=20 congested (no search \
                 stage needed: the sweep's levels are within the resolution)\n"
            ),
            "{}",
            conclusion.lines()
        );
        let json = serde_json::to_value(&conclusion).unwrap();
        assert_eq!(json["sweeps"][0]["capacity"]["clean"]["concurrency"], 10);
        // Adjacent levels at the default resolution (one stream) alike.
        let result = run(vec![
            refined(stage(0, 7, Some(false)), None),
            refined(stage(1, 8, Some(true)), None),
        ]);
        let capacity = Conclusion::of(&result, 1).sweeps[0]
            .capacity
            .clone()
            .unwrap();
        assert_eq!((capacity.gap, capacity.resolution), (Some(1.0), Some(1.0)));
        // Congested at one stream: nothing lower to search.
        let result = run(vec![refined(stage(0, 1, Some(true)), None)]);
        let lines = Conclusion::of(&result, 1).lines();
        assert!(
            lines.contains(
                "capacity: not found: congested down to concurrency=1 (no search stage: nothing \
                 below one stream to try)"
            ),
            "{lines}"
        );
        // Without `refine=` there is no capacity to say.
        let result = run(vec![stage(0, 10, Some(false)), stage(1, 20, Some(true))]);
        assert_eq!(Conclusion::of(&result, 1).sweeps[0].capacity, None);
    }

    /// A first stage congested at one stream has nothing below it to start
    /// from: the advice says so instead of "start lower, at concurrency=1".
    #[test]
    fn a_first_stage_congested_at_one_stream_suggests_no_lower_start() {
        let result = run(vec![stage(0, 1, Some(true)), stage(1, 2, None)]);
        let conclusion = Conclusion::of(&result, 1);
        assert_eq!(conclusion.sweeps[0].suggested_start, None);
        let lines = conclusion.lines();
        assert!(
            lines.starts_with(
                "the first stage (#0 c=1) was already congested, at one stream: no knee in this \
                 sweep and no lower level to start from; the server does not meet these \
                 thresholds even at one stream"
            ),
            "{lines}"
        );
        assert!(!lines.contains("start lower"), "{lines}");
        // Two streams still have one below them.
        let result = run(vec![stage(0, 2, Some(true))]);
        assert_eq!(
            Conclusion::of(&result, 1).sweeps[0].suggested_start,
            Some(Level {
                concurrency: Some(1),
                rate: None
            })
        );
    }

    /// A sweep congested from its first stage has no knee: it says so and
    /// where to start (a quarter of the first level), not "knee: none".
    #[test]
    fn a_first_stage_congested_suggests_where_to_start() {
        let result = run(vec![stage(0, 64, Some(true)), stage(1, 128, None)]);
        let conclusion = Conclusion::of(&result, 1);
        let sweep = &conclusion.sweeps[0];
        assert_eq!(sweep.knee, None);
        assert_eq!(
            sweep.suggested_start,
            Some(Level {
                concurrency: Some(16),
                rate: None
            })
        );
        assert!(
            conclusion.lines().starts_with(
                "the first stage (#0 c=64) was already congested: no knee in this sweep; start \
                 lower, e.g. at concurrency=16\n"
            ),
            "{}",
            conclusion.lines()
        );
        // Nothing congested: the highest level is said as such.
        let calm = Conclusion::of(&run(vec![stage(0, 8, Some(false))]), 1);
        assert!(
            calm.lines()
                .starts_with("no stage was congested; the highest level: #0 c=8"),
            "{}",
            calm.lines()
        );
    }
}
