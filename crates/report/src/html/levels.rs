//! The figures against the stage level: throughput, client latencies, eval
//! accuracy, the server signals the policy judged (with the thresholds and
//! the rules that fired), and the table comparing overlaid runs.

use std::fmt::Write;

use nyann_check::{CongestionRecord, StageResult};
use nyann_load::StageStatus;
use nyann_model::{ClientStats, EvalStats, RoleSignals, SeriesStatus, Step, Value};

use super::esc;
use crate::charts::{
    CONGESTED, ErrorBars, LevelAxis, LevelFigure, Line, Mark, MarkKind, RUN_SHADES, Unit,
};
use crate::saved::SavedRun;

/// Concurrency or rate of a stage, whichever the axis plots.
fn stage_level(stage: &StageResult, by_rate: bool) -> Option<f64> {
    if by_rate {
        stage.rate
    } else {
        stage.concurrency.map(f64::from)
    }
}

/// What the level axis plots: concurrency, unless every stage with a level
/// is a rate stage.
pub(super) fn level_axis(runs: &[SavedRun]) -> (LevelAxis, bool) {
    let stages = || runs.iter().flat_map(|r| r.result.stages.iter());
    let by_rate = stages().any(|s| s.rate.is_some()) && stages().all(|s| s.concurrency.is_none());
    let levels: Vec<f64> = stages().filter_map(|s| stage_level(s, by_rate)).collect();
    let label = if by_rate {
        "rate (requests/s)"
    } else {
        "concurrency"
    };
    (LevelAxis::new(label, &levels), by_rate)
}

/// The measured stages of a run with their level (warm-up, skipped and
/// barrier steps left out).
fn measured(run: &SavedRun, by_rate: bool) -> Vec<(usize, f64, &ClientStats)> {
    let mut measured: Vec<_> = run
        .result
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.status == StageStatus::Measured)
        .filter_map(|(i, s)| Some((i, stage_level(s, by_rate)?, s.client.as_ref()?)))
        .collect();
    // By level, so that a curve runs left to right: a capacity search's
    // stages come after the sweep's, between its levels.
    measured.sort_by(|a, b| a.1.total_cmp(&b.1));
    measured
}

/// The marks every level chart shows: the congested stages, the capacity
/// search's and the knee (on `value`'s curve), and the skipped stages.
fn stage_marks(
    run: &SavedRun,
    by_rate: bool,
    value: impl Fn(&StageResult) -> Option<f64>,
) -> Vec<Mark> {
    stage_marks_of(run, by_rate, value, |_| true)
}

/// [`stage_marks`] of the stages (by index) that `shown` keeps.
fn stage_marks_of(
    run: &SavedRun,
    by_rate: bool,
    value: impl Fn(&StageResult) -> Option<f64>,
    shown: impl Fn(usize) -> bool,
) -> Vec<Mark> {
    let mut marks = Vec::new();
    let knees = run.knees();
    for (index, (stage, record)) in run.result.stages.iter().zip(&run.records).enumerate() {
        if !shown(index) {
            continue;
        }
        let Some(x) = stage_level(stage, by_rate) else {
            continue;
        };
        if knees.contains(&index) {
            marks.push(Mark {
                kind: MarkKind::Knee,
                x,
                y: value(stage),
            });
        }
        if stage.search.is_some() && stage.status == StageStatus::Measured {
            marks.push(Mark {
                kind: MarkKind::Searched,
                x,
                y: value(stage),
            });
        }
        if record.as_ref().is_some_and(CongestionRecord::congested) {
            marks.push(Mark {
                kind: MarkKind::Congested,
                x,
                y: value(stage),
            });
        } else if stage.status == StageStatus::Skipped {
            marks.push(Mark {
                kind: MarkKind::Skipped,
                x,
                y: None,
            });
        }
    }
    marks
}

fn series_name(runs: &[SavedRun], run: &SavedRun, what: &str) -> String {
    if runs.len() > 1 {
        format!("{}: {what}", run.label)
    } else {
        what.to_owned()
    }
}

#[derive(Clone, Copy)]
pub(super) enum Throughput {
    Requests,
    Tokens,
}

pub(super) fn throughput(
    runs: &[SavedRun],
    (axis, by_rate): &(LevelAxis, bool),
    which: Throughput,
) -> LevelFigure {
    let (title, y_label, get): (&str, &str, fn(&ClientStats) -> f64) = match which {
        Throughput::Requests => ("Requests per second", "req/s", |c| c.requests_per_second),
        Throughput::Tokens => ("Output tokens per second", "tok/s", |c| {
            c.output_tokens_per_second
        }),
    };
    let mut figure = LevelFigure {
        title: title.into(),
        x: axis.clone(),
        y_label: y_label.into(),
        unit: Unit::Count,
        lines: Vec::new(),
        error_bars: Vec::new(),
        marks: Vec::new(),
        y_max: None,
    };
    for (i, run) in runs.iter().enumerate() {
        figure.lines.push(Line {
            name: series_name(runs, run, y_label),
            color: RUN_SHADES[i % RUN_SHADES.len()][0],
            points: measured(run, *by_rate)
                .into_iter()
                .map(|(_, x, c)| (x, get(c)))
                .collect(),
            dashed: false,
        });
        figure
            .marks
            .extend(stage_marks(run, *by_rate, |s| s.client.as_ref().map(get)));
        // Under an SLO, the goodput beside the throughput: where the two
        // part, requests were served too late to count.
        let goodput: Vec<(f64, f64)> = measured(run, *by_rate)
            .into_iter()
            .filter_map(|(_, x, c)| Some((x, c.slo.as_ref()?.goodput_per_second)))
            .collect();
        if matches!(which, Throughput::Requests) && !goodput.is_empty() {
            figure.lines.push(Line {
                name: series_name(runs, run, "goodput (met the SLO)"),
                color: RUN_SHADES[i % RUN_SHADES.len()][1],
                points: goodput,
                dashed: true,
            });
        }
    }
    figure
}

#[derive(Clone, Copy)]
pub(super) enum Latency {
    Ttft,
    Itl,
    E2e,
}

pub(super) fn client_latency(
    runs: &[SavedRun],
    (axis, by_rate): &(LevelAxis, bool),
    which: Latency,
) -> LevelFigure {
    let (title, name) = match which {
        Latency::Ttft => ("Client time to first token", "TTFT"),
        Latency::Itl => ("Client inter-token latency", "ITL"),
        Latency::E2e => ("Client end-to-end latency", "E2E"),
    };
    // p50, p90, p99 of a stage (p90 from the stage detail).
    let quantiles = |stage: &StageResult| -> Option<[f64; 3]> {
        let (c, d) = (stage.client.as_ref()?, stage.detail.as_ref()?);
        Some(match which {
            Latency::Ttft => [c.ttft_p50_seconds, d.ttft_p90_seconds, c.ttft_p99_seconds],
            Latency::Itl => [c.itl_p50_seconds, d.itl_p90_seconds, c.itl_p99_seconds],
            Latency::E2e => [c.e2e_p50_seconds, d.e2e_p90_seconds, c.e2e_p99_seconds],
        })
    };
    let mut figure = LevelFigure {
        title: title.into(),
        x: axis.clone(),
        y_label: "ms".into(),
        unit: Unit::Millis,
        lines: Vec::new(),
        error_bars: Vec::new(),
        marks: Vec::new(),
        y_max: None,
    };
    for (i, run) in runs.iter().enumerate() {
        let shades = RUN_SHADES[i % RUN_SHADES.len()];
        for (q, label) in ["p50", "p90", "p99"].iter().enumerate() {
            let points = measured(run, *by_rate)
                .into_iter()
                .filter_map(|(index, x, _)| Some((x, quantiles(&run.result.stages[index])?[q])))
                .collect();
            figure.lines.push(Line {
                name: series_name(runs, run, &format!("{name} {label}")),
                color: shades[q],
                points,
                dashed: false,
            });
        }
        figure
            .marks
            .extend(stage_marks(run, *by_rate, |s| quantiles(s).map(|q| q[2])));
    }
    figure
}

/// A stage's eval figures, when it scored some answers.
fn scored(client: &ClientStats) -> Option<EvalStats> {
    client.eval.filter(|e| e.answered > 0)
}

/// Whether step `index` of `run` asked eval questions: it scored some
/// answers; or (a stage that did not run, or got no reply) the scenario
/// gave it an eval workload; or, without the scenario, its sweep's other
/// stages scored some.
fn asks_eval(run: &SavedRun, index: usize) -> bool {
    let stages = &run.result.stages;
    let has_scores = |s: &StageResult| s.client.as_ref().and_then(scored).is_some();
    let Some(stage) = stages.get(index) else {
        return false;
    };
    if has_scores(stage) {
        return true;
    }
    if let Some(scenario) = &run.scenario {
        return match scenario.steps.get(index) {
            Some(Step::Stage(step)) => step
                .workload
                .as_ref()
                .unwrap_or(&scenario.workload)
                .kind
                .is_eval(),
            _ => false,
        };
    }
    stage.sweep.is_some_and(|sweep| {
        stages
            .iter()
            .any(|s| s.sweep == Some(sweep) && has_scores(s))
    })
}

/// The share of eval answers right against the level: per run whose
/// stages scored some, its accuracy per stage (the stages that scored none
/// left out) with the 95% Wilson interval as error bars, on an axis from
/// 0 to 100%, marked as the other level charts (congested, search and
/// skipped eval stages); `None` when no run scored any answer (no empty
/// chart).
pub(super) fn accuracy(
    runs: &[SavedRun],
    (axis, by_rate): &(LevelAxis, bool),
) -> Option<LevelFigure> {
    let mut figure = LevelFigure {
        title: "Eval accuracy".into(),
        x: axis.clone(),
        y_label: "answers right".into(),
        unit: Unit::Percent,
        lines: Vec::new(),
        error_bars: Vec::new(),
        marks: Vec::new(),
        y_max: Some(1.0),
    };
    for (i, run) in runs.iter().enumerate() {
        let evals: Vec<(f64, EvalStats)> = measured(run, *by_rate)
            .into_iter()
            .filter_map(|(_, x, c)| Some((x, scored(c)?)))
            .collect();
        if evals.is_empty() {
            continue;
        }
        let color = RUN_SHADES[i % RUN_SHADES.len()][0];
        figure.lines.push(Line {
            name: series_name(runs, run, "accuracy"),
            color,
            points: evals.iter().map(|(x, e)| (*x, e.accuracy)).collect(),
            dashed: false,
        });
        figure.error_bars.push(ErrorBars {
            name: series_name(runs, run, "95% interval"),
            color,
            points: evals
                .iter()
                .map(|(x, e)| (*x, e.accuracy_low, e.accuracy_high))
                .collect(),
        });
        let value = |s: &StageResult| Some(scored(s.client.as_ref()?)?.accuracy);
        figure.marks.extend(
            stage_marks_of(run, *by_rate, value, |index| asks_eval(run, index))
                .into_iter()
                // A congested stage that scored nothing has no accuracy:
                // at the bottom its circle would read as 0%.
                .filter(|m| m.y.is_some() || m.kind == MarkKind::Skipped),
        );
    }
    (!figure.lines.is_empty()).then_some(figure)
}

/// A server signal the built-in policy judges, and the parameter that is
/// its threshold.
#[derive(Clone, Copy)]
pub(super) struct Signal {
    title: &'static str,
    unit: Unit,
    param: &'static str,
    /// Its name in the record's coverage.
    field: &'static str,
    value: fn(&RoleSignals) -> f64,
}

pub(super) const SIGNALS: [Signal; 4] = [
    Signal {
        title: "Server waiting requests (p50)",
        unit: Unit::Count,
        param: "waiting_requests_p50",
        field: "waiting_requests_p50",
        value: |r| r.waiting_requests_p50,
    },
    Signal {
        title: "Server time to first token (p99)",
        unit: Unit::Millis,
        param: "ttft_p99",
        field: "ttft_p99_seconds",
        value: |r| r.ttft_p99_seconds,
    },
    Signal {
        title: "Server KV-cache usage (max)",
        unit: Unit::Percent,
        param: "kv_cache_usage",
        field: "kv_cache_usage_max",
        value: |r| r.kv_cache_usage_max,
    },
    Signal {
        title: "Server preemptions (per stage)",
        unit: Unit::Count,
        param: "preemptions",
        field: "preemptions",
        value: |r| r.preemptions,
    },
];

/// Whether the record has a measured value of `field` for `role` (not a 0
/// standing for missing series or a failed query).
fn has_data(record: &CongestionRecord, role: &str, field: &str) -> bool {
    record
        .coverage
        .iter()
        .find(|c| c.role == role)
        .is_none_or(|c| c.status(field) == SeriesStatus::Found)
}

/// A parameter value as a number: numbers as they are, durations in seconds.
fn param_value(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => Some(*n),
        Value::Integer(n) => Some(*n as f64),
        Value::Text(text) => nyann_model::parse_seconds(text).ok(),
        Value::Flag(_) => None,
    }
}

pub(super) fn server_signal(
    runs: &[SavedRun],
    (axis, by_rate): &(LevelAxis, bool),
    signal: Signal,
) -> LevelFigure {
    let mut figure = LevelFigure {
        title: signal.title.into(),
        x: axis.clone(),
        y_label: match signal.unit {
            Unit::Millis => "ms".into(),
            Unit::Percent => "% of the KV cache".into(),
            Unit::Count if signal.param == "preemptions" => "preemptions per stage".into(),
            Unit::Count => "requests".into(),
        },
        unit: signal.unit,
        lines: Vec::new(),
        error_bars: Vec::new(),
        marks: Vec::new(),
        y_max: None,
    };
    for (i, run) in runs.iter().enumerate() {
        let shades = RUN_SHADES[i % RUN_SHADES.len()];
        let mut judged: Vec<(f64, &CongestionRecord, usize)> = run
            .result
            .stages
            .iter()
            .zip(&run.records)
            .enumerate()
            .filter_map(|(index, (stage, record))| {
                Some((stage_level(stage, *by_rate)?, record.as_ref()?, index))
            })
            .collect();
        // By level, as the client's curves (a search's stages come last).
        judged.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut roles: Vec<&str> = judged
            .iter()
            .flat_map(|(_, r, _)| r.roles.iter().map(|s| s.role.as_str()))
            .collect();
        roles.dedup();
        roles.sort_unstable();
        roles.dedup();
        for (r, role) in roles.iter().enumerate() {
            let mut points = Vec::new();
            for &(x, record, index) in &judged {
                match record.roles.iter().find(|s| s.role == *role) {
                    Some(signals) if has_data(record, role, signal.field) => {
                        let y = (signal.value)(signals);
                        points.push((x, y));
                        if run.result.stages[index].search.is_some() {
                            figure.marks.push(Mark {
                                kind: MarkKind::Searched,
                                x,
                                y: Some(y),
                            });
                        }
                    }
                    _ => figure.marks.push(Mark {
                        kind: MarkKind::NoData,
                        x,
                        y: None,
                    }),
                }
            }
            figure.lines.push(Line {
                name: series_name(runs, run, role),
                color: shades[r % 3],
                points,
                dashed: false,
            });
        }
        if roles.is_empty() {
            figure.marks.extend(judged.iter().map(|(x, _, _)| Mark {
                kind: MarkKind::NoData,
                x: *x,
                y: None,
            }));
        }
        // The threshold at every stage that carries it, judged or skipped:
        // the value the policy judged with (its default when the scenario
        // did not write it), else the value written.
        let thresholds = Thresholds::of(run, signal.param);
        let mut threshold: Vec<(f64, f64)> = run
            .result
            .stages
            .iter()
            .enumerate()
            .filter_map(|(index, stage)| {
                Some((stage_level(stage, *by_rate)?, thresholds.at(run, index)?.0))
            })
            .collect();
        threshold.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !threshold.is_empty() {
            let default = if thresholds.defaulted {
                " (policy default)"
            } else {
                ""
            };
            figure.lines.push(Line {
                name: series_name(runs, run, &format!("threshold {}{default}", signal.param)),
                color: CONGESTED,
                points: threshold,
                dashed: true,
            });
        }
        // A congested stage is marked on a signal's chart only on the
        // roles of a rule that fired: the KV chart of a stage the queueing
        // rule stopped stays clean.
        for (x, record, _) in judged.iter().filter(|(_, r, _)| r.congested()) {
            let fired = said_fired_roles(record, signal).or_else(|| fired_roles(record, signal));
            let reached = record
                .roles
                .iter()
                .filter(|r| has_data(record, &r.role, signal.field))
                .filter(|r| fired.as_ref().is_none_or(|roles| roles.contains(&r.role)))
                .map(signal.value)
                .reduce(f64::max);
            if let Some(y) = reached {
                figure.marks.push(Mark {
                    kind: MarkKind::Congested,
                    x: *x,
                    y: Some(y),
                });
            }
        }
    }
    figure
}

/// The roles on which the verdict says a rule compared `signal` (policies
/// on interface 0.3 say); `None` when it does not say.
fn said_fired_roles(record: &CongestionRecord, signal: Signal) -> Option<Vec<String>> {
    let fired = &record.verdict.as_ref()?.fired;
    if fired.is_empty() {
        return None;
    }
    Some(
        record
            .roles
            .iter()
            .filter(|r| fired.iter().any(|f| f.covers(&r.role, signal.field)))
            .map(|r| r.role.clone())
            .collect(),
    )
}

/// For records whose verdict does not say which rule fired (policies before
/// interface 0.3): the roles on which `signal`'s rule of the built-in policy fired in a
/// congested stage (none when it did not fire); `None` when the record
/// does not say the thresholds (another policy's parameters): then every
/// role is marked. Sustained queueing fires on the largest waiting p50 and
/// the largest TTFT p99, whatever their roles; KV pressure on a role whose
/// KV usage and preemptions both reach their thresholds.
fn fired_roles(record: &CongestionRecord, signal: Signal) -> Option<Vec<String>> {
    let threshold = |param: &str| record.param(param).and_then(|(v, _)| param_value(v));
    let value_of = |field: &str| SIGNALS.iter().find(|s| s.param == field).map(|s| s.value);
    let reaches = |role: &RoleSignals, param: &str| -> Option<bool> {
        Some((value_of(param)?)(role) >= threshold(param)?)
    };
    let roles = record.roles.iter();
    match signal.param {
        "waiting_requests_p50" | "ttft_p99" => {
            let (waiting, ttft) = (threshold("waiting_requests_p50")?, threshold("ttft_p99")?);
            let fired = roles.clone().any(|r| r.waiting_requests_p50 >= waiting)
                && roles.clone().any(|r| r.ttft_p99_seconds >= ttft);
            Some(if fired {
                roles
                    .filter(|r| reaches(r, signal.param) == Some(true))
                    .map(|r| r.role.clone())
                    .collect()
            } else {
                Vec::new()
            })
        }
        "kv_cache_usage" | "preemptions" => {
            threshold("kv_cache_usage")?;
            threshold("preemptions")?;
            Some(
                roles
                    .filter(|r| {
                        reaches(r, "kv_cache_usage") == Some(true)
                            && reaches(r, "preemptions") == Some(true)
                    })
                    .map(|r| r.role.clone())
                    .collect(),
            )
        }
        _ => None,
    }
}

/// The values one parameter of the stop conditions took in a run.
/// Whether the built-in policy judged with `record`'s parameters.
pub(super) fn judged_by_builtin(record: &CongestionRecord) -> bool {
    record.policy.is_builtin()
}

struct Thresholds {
    /// Per sweep, what its judged stages were judged with.
    by_sweep: Vec<(u32, f64)>,
    /// The policy's default filled it in (the scenario did not write it).
    defaulted: bool,
    param: &'static str,
    /// A policy other than the built-in judged: its parameters are its own.
    custom: bool,
}

impl Thresholds {
    fn of(run: &SavedRun, param: &'static str) -> Thresholds {
        let mut by_sweep = Vec::new();
        let mut defaulted = false;
        // Only the built-in's parameters are thresholds of these server
        // signals: a custom policy's `ttft_p99` may be a client figure.
        for record in run
            .records
            .iter()
            .flatten()
            .filter(|r| judged_by_builtin(r))
        {
            if let Some((value, default)) = record.param(param)
                && let Some(v) = param_value(value)
                && !by_sweep.iter().any(|(s, _)| *s == record.sweep.index)
            {
                by_sweep.push((record.sweep.index, v));
                defaulted |= default;
            }
        }
        Thresholds {
            by_sweep,
            defaulted,
            param,
            custom: run.records.iter().flatten().any(|r| !judged_by_builtin(r)),
        }
    }

    /// The threshold of step `index` (judged or skipped), and whether it
    /// was the policy's default.
    fn at(&self, run: &SavedRun, index: usize) -> Option<(f64, bool)> {
        if self.custom {
            return None;
        }
        let stage = run.result.stages.get(index)?;
        if let Some(record) = run.records.get(index).and_then(Option::as_ref)
            && let Some((value, default)) = record.param(self.param)
        {
            return Some((param_value(value)?, default));
        }
        if let Some(sweep) = stage.sweep
            && let Some((_, v)) = self.by_sweep.iter().find(|(s, _)| *s == sweep)
        {
            return Some((*v, self.defaulted));
        }
        let written = run
            .stop_params(index)?
            .iter()
            .find(|p| p.name == self.param)?;
        Some((param_value(&written.value)?, false))
    }
}

/// A figure the comparison shows: its name, how to read it from a stage's
/// client statistics, and whether higher is better.
type Compared = (&'static str, fn(&ClientStats) -> f64, bool);

/// The runs side by side at the levels each pair measured: every later run
/// against the first, the differences in percent.
pub(super) fn comparison(out: &mut String, runs: &[SavedRun], by_rate: bool) {
    let _ = writeln!(out, "<h2>Compared at equal levels</h2>");
    let base = &runs[0];
    let figures: [Compared; 5] = [
        ("req/s", |c| c.requests_per_second, true),
        ("output tok/s", |c| c.output_tokens_per_second, true),
        ("TTFT p99 ms", |c| c.ttft_p99_seconds * 1000.0, false),
        ("ITL p99 ms", |c| c.itl_p99_seconds * 1000.0, false),
        ("E2E p99 ms", |c| c.e2e_p99_seconds * 1000.0, false),
    ];
    for other in &runs[1..] {
        let theirs = measured(other, by_rate);
        let pairs: Vec<_> = measured(base, by_rate)
            .into_iter()
            .filter_map(|(i, level, ours)| {
                let (j, _, theirs) = theirs.iter().find(|(_, l, _)| *l == level)?;
                Some((level, (i, ours), (*j, *theirs)))
            })
            .collect();
        if pairs.is_empty() {
            let _ = writeln!(
                out,
                "<p class=\"note\">{} and {} measured no level in common.</p>",
                esc(&base.label),
                esc(&other.label)
            );
            continue;
        }
        let _ = write!(out, "<div class=\"scroll\"><table><tr><th>level</th>");
        for (name, _, _) in &figures {
            let _ = write!(
                out,
                "<th>{name}: {}</th><th>{}</th><th>change</th>",
                esc(&base.label),
                esc(&other.label)
            );
        }
        let _ = writeln!(out, "<th>judged</th></tr>");
        for (level, (i, ours), (j, theirs)) in pairs {
            let _ = write!(out, "<tr><td>{}</td>", esc(&Unit::Count.format(level)));
            for (_, value, higher_is_better) in &figures {
                let (a, b) = (value(ours), value(theirs));
                let change = (a > 0.0).then(|| 100.0 * (b - a) / a);
                let class = match change {
                    Some(c) if c.abs() >= 5.0 && (c > 0.0) == *higher_is_better => {
                        " class=\"num better\""
                    }
                    Some(c) if c.abs() >= 5.0 => " class=\"num worse\"",
                    _ => " class=\"num\"",
                };
                let _ = write!(
                    out,
                    "<td class=\"num\">{a:.1}</td><td class=\"num\">{b:.1}</td><td{class}>{}</td>",
                    change.map_or_else(|| "-".into(), |c| format!("{c:+.1}%"))
                );
            }
            let verdict =
                |run: &SavedRun, k: usize| match run.records.get(k).and_then(Option::as_ref) {
                    Some(r) if r.congested() => "congested",
                    Some(_) => "ok",
                    None => "-",
                };
            let _ = writeln!(
                out,
                "<td>{} / {}</td></tr>",
                verdict(base, i),
                verdict(other, j)
            );
        }
        out.push_str("</table></div>\n");
    }
    let _ = writeln!(
        out,
        "<p class=\"note\">Each later run against the first, at the levels both measured; \
         green: better by 5% or more, red: worse.</p>"
    );
}
