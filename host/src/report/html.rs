//! The HTML report: one self-contained page (inline CSS and SVG charts, no
//! script, nothing fetched) for one run, or several runs overlaid for
//! comparison.
//!
//! What the page shows, top-down: per run a headline (outcome, stop reason,
//! policy, knee, what the skipped stages saved); throughput and client
//! latencies against the stage level; the server signals the policy judged,
//! with the thresholds; per run a timeline of the requests with the stages
//! shaded; the errors by reason; the stage table; the scenario.

use std::fmt::Write;

use nyann_load::StageStatus;
use nyann_model::{ClientStats, RoleSignals, SeriesStatus, Value};

use super::charts::{
    Band, CONGESTED, LevelAxis, LevelFigure, Line, Mark, MarkKind, RUN_SHADES, Span, SpanKind,
    TimelineFigure, Unit, level_chart, timeline_chart,
};
use super::saved::SavedRun;
use super::table::{StageTable, outcome_line};
use nyann_check::{CongestionRecord, StageResult};

/// The page for `runs` (at least one).
pub fn page(runs: &[SavedRun]) -> anyhow::Result<String> {
    let mut out = String::with_capacity(256 * 1024);
    let title = match runs {
        [one] => format!("nyann-bench report: {}", one.label),
        _ => format!("nyann-bench report: {} runs compared", runs.len()),
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    for (i, run) in runs.iter().enumerate() {
        headline(&mut out, run, i);
    }

    let axis = level_axis(runs);
    section(&mut out, "Throughput against the stage level");
    figure(
        &mut out,
        level_chart(&throughput(runs, &axis, Throughput::Requests))?,
    );
    figure(
        &mut out,
        level_chart(&throughput(runs, &axis, Throughput::Tokens))?,
    );
    out.push_str("</div>\n");

    section(&mut out, "Client latency against the stage level");
    for latency in [Latency::Ttft, Latency::Itl, Latency::E2e] {
        figure(
            &mut out,
            level_chart(&client_latency(runs, &axis, latency))?,
        );
    }
    out.push_str("</div>\n");

    if runs.iter().any(|r| r.records.iter().any(Option::is_some)) {
        section(&mut out, "Server signals the policy judged");
        for signal in SIGNALS {
            figure(&mut out, level_chart(&server_signal(runs, &axis, signal))?);
        }
        out.push_str(
            "<p class=\"note\">Per role; the dashed line is the stop condition's threshold \
             (built-in policy parameters). Grey circles on the axis: no data for that signal (no series found, or the query failed; the policy saw 0).</p>\n</div>\n",
        );
    }

    if runs.len() > 1 {
        comparison(&mut out, runs, axis.1);
    }
    for (i, run) in runs.iter().enumerate() {
        run_details(&mut out, run, i)?;
    }
    out.push_str("</body></html>\n");
    Ok(out)
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1240px}\
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}\
h3{font-size:15px}.grid{display:flex;flex-wrap:wrap;gap:12px}\
figure{margin:0;border:1px solid #eee}figure svg{display:block;max-width:100%;height:auto}\
.headline{border-left:6px solid #1f77b4;padding:8px 14px;margin:12px 0;background:#f7f9fc}\
.headline.stopped{border-color:#d62728}.headline .verdict{font-size:17px;font-weight:600}\
table{border-collapse:collapse;font-size:12px;margin:8px 0}\
td,th{border:1px solid #ddd;padding:3px 6px;white-space:nowrap}td.num{text-align:right}\
tr.congested td{background:#fde8e8}tr.skipped td{color:#999}\
pre{background:#f6f6f6;padding:10px;overflow:auto;font-size:12px}.note{color:#666;font-size:12px}\
.scroll{overflow-x:auto;max-width:100%}td.better{color:#2ca02c}td.worse{color:#d62728}";

fn section(out: &mut String, title: &str) {
    let _ = write!(out, "<h2>{}</h2>\n<div class=\"grid\">\n", esc(title));
}

fn figure(out: &mut String, svg: String) {
    let _ = writeln!(out, "<figure>{svg}</figure>");
}

/// Minimal HTML escaping for text and attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn seconds(s: f64) -> String {
    humantime::format_duration(std::time::Duration::from_secs_f64(s.max(0.0).round())).to_string()
}

fn ms(s: f64) -> String {
    format!("{:.0} ms", s * 1000.0)
}

/// The run's verdict in words, its policy, its knee and what stopping saved.
fn headline(out: &mut String, run: &SavedRun, index: usize) {
    let result = &run.result;
    let stopped = result.outcome.stop_stage().is_some();
    let _ = write!(
        out,
        "<div class=\"headline{}\" id=\"run-{index}\"><div class=\"verdict\">{}: {}</div>",
        if stopped { " stopped" } else { "" },
        esc(&run.label),
        esc(&outcome_line(result))
    );
    if let Some(record) = run.records.iter().flatten().next() {
        let _ = write!(
            out,
            "<div>policy {} {} ({}), mode {}</div>",
            esc(&record.policy.name),
            esc(&record.policy.version),
            esc(&record.policy.origin),
            match record.mode {
                nyann_check::PolicyMode::Enforce => "enforce",
                nyann_check::PolicyMode::Monitor => "monitor",
            }
        );
    }
    match run.knee().map(|i| &result.stages[i]) {
        Some(stage) => {
            if let Some(c) = &stage.client {
                let _ = write!(
                    out,
                    "<div>knee (the last stage before congestion): <b>{}</b>: {:.1} req/s, {:.0} output tok/s, \
                     TTFT p50 {} / p99 {}, E2E p50 {} / p99 {}</div>",
                    esc(&stage.label),
                    c.requests_per_second,
                    c.output_tokens_per_second,
                    ms(c.ttft_p50_seconds),
                    ms(c.ttft_p99_seconds),
                    ms(c.e2e_p50_seconds),
                    ms(c.e2e_p99_seconds),
                );
            }
        }
        None => out.push_str("<div>knee: none (no stage ran before congestion)</div>"),
    }
    let skipped: Vec<&StageResult> = result
        .stages
        .iter()
        .filter(|s| s.status == StageStatus::Skipped)
        .collect();
    if !skipped.is_empty() {
        let _ = write!(
            out,
            "<div>{} stage{} skipped: {} of load not sent</div>",
            skipped.len(),
            if skipped.len() == 1 { "" } else { "s" },
            seconds(skipped.iter().map(|s| s.duration_s).sum())
        );
    }
    let _ = writeln!(
        out,
        "<div class=\"note\">{} requests recorded, seed {}, {} on {}</div></div>",
        result.requests_recorded,
        result.seed,
        esc(&result.models.join(", ")),
        esc(&result.targets.join(", "))
    );
}

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
fn level_axis(runs: &[SavedRun]) -> (LevelAxis, bool) {
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
    run.result
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.status == StageStatus::Measured)
        .filter_map(|(i, s)| Some((i, stage_level(s, by_rate)?, s.client.as_ref()?)))
        .collect()
}

/// The marks every level chart shows: the congested stage (on `value`'s
/// curve) and the skipped stages.
fn stage_marks(
    run: &SavedRun,
    by_rate: bool,
    value: impl Fn(&StageResult) -> Option<f64>,
) -> Vec<Mark> {
    let mut marks = Vec::new();
    for (stage, record) in run.result.stages.iter().zip(&run.records) {
        let Some(x) = stage_level(stage, by_rate) else {
            continue;
        };
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
enum Throughput {
    Requests,
    Tokens,
}

fn throughput(
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
        marks: Vec::new(),
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
    }
    figure
}

#[derive(Clone, Copy)]
enum Latency {
    Ttft,
    Itl,
    E2e,
}

fn client_latency(
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
        marks: Vec::new(),
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

/// A server signal the built-in policy judges, and the parameter that is
/// its threshold.
#[derive(Clone, Copy)]
struct Signal {
    title: &'static str,
    unit: Unit,
    param: &'static str,
    /// Its name in the record's coverage.
    field: &'static str,
    value: fn(&RoleSignals) -> f64,
}

const SIGNALS: [Signal; 4] = [
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

fn server_signal(
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
        marks: Vec::new(),
    };
    for (i, run) in runs.iter().enumerate() {
        let shades = RUN_SHADES[i % RUN_SHADES.len()];
        let judged: Vec<(f64, &CongestionRecord, usize)> = run
            .result
            .stages
            .iter()
            .zip(&run.records)
            .enumerate()
            .filter_map(|(index, (stage, record))| {
                Some((stage_level(stage, *by_rate)?, record.as_ref()?, index))
            })
            .collect();
        let mut roles: Vec<&str> = judged
            .iter()
            .flat_map(|(_, r, _)| r.roles.iter().map(|s| s.role.as_str()))
            .collect();
        roles.dedup();
        roles.sort_unstable();
        roles.dedup();
        for (r, role) in roles.iter().enumerate() {
            let mut points = Vec::new();
            for (x, record, _) in &judged {
                match record.roles.iter().find(|s| s.role == *role) {
                    Some(signals) if has_data(record, role, signal.field) => {
                        points.push((*x, (signal.value)(signals)))
                    }
                    _ => figure.marks.push(Mark {
                        kind: MarkKind::NoData,
                        x: *x,
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
        let threshold: Vec<(f64, f64)> = run
            .result
            .stages
            .iter()
            .enumerate()
            .filter_map(|(index, stage)| {
                Some((stage_level(stage, *by_rate)?, thresholds.at(run, index)?.0))
            })
            .collect();
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
struct Thresholds {
    /// Per sweep, what its judged stages were judged with.
    by_sweep: Vec<(u32, f64)>,
    /// The policy's default filled it in (the scenario did not write it).
    defaulted: bool,
    param: &'static str,
}

impl Thresholds {
    fn of(run: &SavedRun, param: &'static str) -> Thresholds {
        let mut by_sweep = Vec::new();
        let mut defaulted = false;
        for record in run.records.iter().flatten() {
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
        }
    }

    /// The threshold of step `index` (judged or skipped), and whether it
    /// was the policy's default.
    fn at(&self, run: &SavedRun, index: usize) -> Option<(f64, bool)> {
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
fn comparison(out: &mut String, runs: &[SavedRun], by_rate: bool) {
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

/// A run's own sections: timeline, errors, stage table, scenario.
fn run_details(out: &mut String, run: &SavedRun, index: usize) -> anyhow::Result<()> {
    let _ = write!(
        out,
        "<h2>Run {}: timeline</h2>\n<div class=\"grid\">\n",
        esc(&run.label)
    );
    let spans = spans(run);
    let timeline = &run.timeline;
    let end_s = timeline.bins.len() as f64 * timeline.bin_s;
    let at = |i: usize| timeline.bin_start(i) + timeline.bin_s / 2.0;
    let shades = RUN_SHADES[index % RUN_SHADES.len()];
    let per_second = |n: u32| n as f64 / timeline.bin_s;
    figure(
        out,
        timeline_chart(&TimelineFigure {
            title: "Requests sent per second and requests in flight".into(),
            y_label: "requests".into(),
            unit: Unit::Count,
            end_s,
            spans: spans.clone(),
            band: None,
            lines: vec![
                Line {
                    name: "sent per second".into(),
                    color: shades[0],
                    points: timeline
                        .bins
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (at(i), per_second(b.sent)))
                        .collect(),
                    dashed: false,
                },
                Line {
                    name: "in flight (mean)".into(),
                    color: RUN_SHADES[(index + 1) % RUN_SHADES.len()][0],
                    points: timeline
                        .bins
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (at(i), b.in_flight))
                        .collect(),
                    dashed: false,
                },
            ],
        })?,
    );
    let ttft: Vec<(f64, [f64; 3])> = timeline
        .bins
        .iter()
        .enumerate()
        .filter_map(|(i, b)| Some((at(i), b.ttft?)))
        .collect();
    figure(
        out,
        timeline_chart(&TimelineFigure {
            title: "Client time to first token".into(),
            y_label: "ms".into(),
            unit: Unit::Millis,
            end_s,
            spans: spans.clone(),
            band: Some(Band {
                name: "p50 to p99".into(),
                color: shades[2],
                points: ttft.iter().map(|(x, q)| (*x, q[0], q[2])).collect(),
            }),
            lines: vec![Line {
                name: "p50".into(),
                color: shades[0],
                points: ttft.iter().map(|(x, q)| (*x, q[0])).collect(),
                dashed: false,
            }],
        })?,
    );
    // No error, no chart: an empty chart reads as a measurement of nothing.
    let any_error = timeline.bins.iter().any(|b| b.errors > 0);
    if any_error {
        figure(
            out,
            timeline_chart(&TimelineFigure {
                title: "Errors per second".into(),
                y_label: "errors/s".into(),
                unit: Unit::Count,
                end_s,
                spans,
                band: None,
                lines: vec![Line {
                    name: "errors per second".into(),
                    color: CONGESTED,
                    points: timeline
                        .bins
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (at(i), per_second(b.errors)))
                        .collect(),
                    dashed: false,
                }],
            })?,
        );
    }
    let _ = writeln!(
        out,
        "</div><p class=\"note\">Binned in {:.0} s steps ({} bins; requests by the time they were sent, \
         TTFT by the time the first token arrived). Shaded: the stages (red: congested, grey: warm-up); \
         the gaps between them are the checks, when the load held the finished stage's level.</p>",
        timeline.bin_s,
        timeline.bins.len()
    );

    let _ = writeln!(out, "<h3>Errors by reason</h3>");
    if run.errors.is_empty() {
        out.push_str("<p>No request failed.</p>\n");
    } else {
        out.push_str("<table><tr><th>requests</th><th>reason</th><th>stages</th></tr>\n");
        for error in &run.errors {
            let stages: Vec<String> = error
                .stages
                .iter()
                .map(|&i| {
                    run.result
                        .stages
                        .get(i)
                        .map_or_else(|| format!("#{i}"), |s| s.label.clone())
                })
                .collect();
            let _ = writeln!(
                out,
                "<tr><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                error.count,
                esc(&error.reason),
                esc(&stages.join(", "))
            );
        }
        out.push_str("</table>\n");
    }
    if run.unreadable_lines > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} lines of requests.jsonl could not be read and were skipped.</p>",
            run.unreadable_lines
        );
    }

    let _ = writeln!(out, "<h3>Stages</h3>");
    stage_table(out, run);
    scenario(out, run);
    Ok(())
}

/// The stages on the timeline.
fn spans(run: &SavedRun) -> Vec<Span> {
    let start = run.result.start_unix;
    run.result
        .stages
        .iter()
        .zip(&run.records)
        .filter_map(|(stage, record)| {
            let (from, to) = (stage.start_unix?, stage.end_unix?);
            let kind = if record.as_ref().is_some_and(CongestionRecord::congested) {
                SpanKind::Congested
            } else if stage.status == StageStatus::Warmup {
                SpanKind::Warmup
            } else {
                SpanKind::Measured
            };
            Some(Span {
                kind,
                from: from - start,
                to: to - start,
                label: stage.label.clone(),
            })
        })
        .collect()
}

fn stage_table(out: &mut String, run: &SavedRun) {
    let table = StageTable::of(&run.result);
    out.push_str("<div class=\"scroll\"><table>\n");
    for (r, row) in table.rows.iter().enumerate() {
        let class = match row.get(1).map(String::as_str) {
            Some("CONGESTED") => " class=\"congested\"",
            Some("skipped") => " class=\"skipped\"",
            _ => "",
        };
        let _ = write!(out, "<tr{class}>");
        for (c, cell) in row.iter().enumerate() {
            let tag = if r == 0 { "th" } else { "td" };
            let num = if r > 0 && c >= StageTable::LEFT_ALIGNED {
                " class=\"num\""
            } else {
                ""
            };
            let _ = write!(out, "<{tag}{num}>{}</{tag}>", esc(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table></div>\n");
    for note in &table.notes {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(note));
    }
    for stage in &run.result.stages {
        if let Some(reason) = &stage.skip_reason {
            let _ = writeln!(
                out,
                "<p class=\"note\">{} skipped: {}</p>",
                esc(&stage.label),
                esc(reason)
            );
            break;
        }
    }
}

/// The stop conditions as compiled, then the scenario's source.
fn scenario(out: &mut String, run: &SavedRun) {
    let Some(scenario) = &run.scenario else {
        out.push_str("<p class=\"note\">No scenario.json was saved with this run.</p>\n");
        return;
    };
    let _ = writeln!(out, "<h3>Stop conditions (compiled)</h3>");
    let mut seen: Vec<&nyann_model::StopCondition> = Vec::new();
    out.push_str(
        "<table><tr><th>until_congested</th><th>parameters the policy judged with</th>\
         <th>stages</th></tr>\n",
    );
    for step in &scenario.steps {
        let nyann_model::Step::Stage(stage) = step else {
            continue;
        };
        let Some(stop) = &stage.stop else { continue };
        if seen.contains(&stop) {
            continue;
        }
        seen.push(stop);
        let stages = run
            .result
            .stages
            .iter()
            .zip(&scenario.steps)
            .filter(|(_, step)| {
                matches!(step, nyann_model::Step::Stage(s) if s.stop.as_ref() == Some(stop))
            })
            .map(|(s, _)| s.label.clone())
            .collect::<Vec<_>>();
        // What the policy judged with, its defaults marked; else as written.
        let judged = run
            .result
            .stages
            .iter()
            .zip(&run.records)
            .zip(&scenario.steps)
            .filter(|(_, step)| {
                matches!(step, nyann_model::Step::Stage(s) if s.stop.as_ref() == Some(stop))
            })
            .find_map(|((_, record), _)| record.as_ref().filter(|r| !r.judged_params.is_empty()));
        let params: Vec<String> = match judged {
            Some(record) => record
                .judged_params
                .iter()
                .map(|p| {
                    let default = if stop.params.iter().any(|w| w.name == p.name) {
                        ""
                    } else {
                        " (policy default)"
                    };
                    format!("{}={}{default}", p.name, param_text(&p.value))
                })
                .collect(),
            None => stop
                .params
                .iter()
                .map(|p| format!("{}={}", p.name, param_text(&p.value)))
                .collect(),
        };
        let location = stop
            .location
            .as_ref()
            .map_or_else(String::new, |l| format!("{}:{}", l.file, l.line));
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&location),
            esc(&params.join(", ")),
            esc(&stages.join(", "))
        );
    }
    out.push_str("</table>\n");
    if let Some(source) = &run.source {
        let _ = writeln!(out, "<h3>Scenario source</h3><pre>{}</pre>", esc(source));
    }
}

fn param_text(value: &Value) -> String {
    match value {
        Value::Number(n) => format!("{n}"),
        Value::Integer(n) => format!("{n}"),
        Value::Text(t) => format!("{t:?}"),
        Value::Flag(f) => format!("{f}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use nyann_check::{Judged, PolicyMode, PolicyRef, RunResult};
    use nyann_load::{RunOutcome, StageDetail};
    use nyann_model::{
        FiredRule, Mode, Param, Scenario, Stage, Step, StopCondition, Verdict, Workload,
    };

    fn stage(index: usize, c: u32, status: StageStatus, rps: f64) -> StageResult {
        let ran = status == StageStatus::Measured;
        StageResult {
            index,
            label: format!("#{index} c={c}"),
            name: None,
            status,
            mode: Some(Mode::Concurrent),
            concurrency: Some(c),
            rate: None,
            duration_s: 60.0,
            drain: None,
            start_unix: ran.then_some(100.0 + 70.0 * index as f64),
            end_unix: ran.then_some(160.0 + 70.0 * index as f64),
            client: ran.then(|| ClientStats {
                requests_ok: 100,
                requests_per_second: rps,
                ttft_p50_seconds: 0.0123,
                ttft_p99_seconds: 0.0456,
                ..ClientStats::default()
            }),
            detail: ran.then(StageDetail::default),
            sweep: Some(0),
            annotation: None,
            skip_reason: (!ran).then(|| "stopped after stage #1 c=128: congested".into()),
            check_interrupted: false,
            degraded: None,
        }
    }

    fn judged(mut stage: StageResult, congested: bool, roles: Vec<RoleSignals>) -> StageResult {
        let record = CongestionRecord {
            policy: PolicyRef {
                name: "builtin".into(),
                version: "0.1.0".into(),
                origin: "builtin".into(),
            },
            mode: PolicyMode::Enforce,
            sweep: Default::default(),
            params: Vec::new(),
            judged_params: Vec::new(),
            roles,
            signal_errors: vec![],
            verdict: Some(Verdict {
                congested,
                reasons: vec![],
                fired: Vec::new(),
            }),
            policy_error: None,
            stopped: false,
            check_seconds: 0.1,
            coverage: vec![],
        };
        stage.annotation = Some(Judged { congestion: record });
        stage
    }

    fn role(waiting: f64) -> RoleSignals {
        RoleSignals {
            role: "aggregate".into(),
            waiting_requests_p50: waiting,
            ttft_p99_seconds: 1.0,
            kv_cache_usage_max: 0.5,
            preemptions: 0.0,
            extra: vec![],
        }
    }

    /// A sweep at c=64, 128, 256 that stopped at 128, with its scenario.
    fn sweep() -> SavedRun {
        let stages = vec![
            judged(
                stage(0, 64, StageStatus::Measured, 10.0),
                false,
                vec![role(1.0)],
            ),
            judged(
                stage(1, 128, StageStatus::Measured, 15.0),
                true,
                vec![RoleSignals {
                    ttft_p99_seconds: 2.5,
                    ..role(40.0)
                }],
            ),
            stage(2, 256, StageStatus::Skipped, 0.0),
        ];
        let stop = StopCondition {
            params: vec![
                Param {
                    name: "waiting_requests_p50".into(),
                    value: Value::Number(32.0),
                },
                Param {
                    name: "ttft_p99".into(),
                    value: Value::Text("2s".into()),
                },
            ],
            location: None,
            param_locations: Vec::new(),
        };
        let scenario = Scenario {
            target: None,
            model: None,
            workload: Workload::default(),
            steps: [64, 128, 256]
                .map(|c| {
                    Step::Stage(Stage {
                        concurrency: Some(c),
                        stop: Some(stop.clone()),
                        ..Stage::new(60.0, Mode::Concurrent)
                    })
                })
                .to_vec(),
        };
        let result = RunResult {
            outcome: RunOutcome::Stopped {
                stage: 1,
                reason: "stopped after stage #1 c=128: congested: queueing".into(),
            },
            start_unix: 100.0,
            end_unix: 240.0,
            seed: 7,
            models: vec!["m".into()],
            targets: vec!["http://127.0.0.1:1/v1".into()],
            totals: ClientStats::default(),
            totals_detail: StageDetail::default(),
            requests_recorded: 200,
            stages,
        };
        SavedRun::new(
            "run-a".into(),
            result,
            Some(scenario),
            Some("# source".into()),
        )
    }

    #[test]
    fn the_knee_is_the_last_stage_before_the_congested_one() {
        let run = sweep();
        assert_eq!(run.knee(), Some(0));
        let page = page(std::slice::from_ref(&run)).unwrap();
        // The headline's figures are the stage's own statistics.
        assert!(
            page.contains("<b>#0 c=64</b>: 10.0 req/s, 0 output tok/s, TTFT p50 12 ms / p99 46 ms"),
            "{page}"
        );
        assert!(page.contains("run-a: sweep stopped after stage #1 c=128: congested: queueing"));
        assert!(page.contains("1 stage skipped: 1m of load not sent"));
        assert!(page.contains("policy builtin 0.1.0 (builtin), mode enforce"));
    }

    #[test]
    fn thresholds_are_drawn_from_the_stop_condition_at_every_stage_that_carries_it() {
        let run = sweep();
        let axis = level_axis(std::slice::from_ref(&run));
        let waiting = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
        let threshold = waiting.lines.iter().find(|l| l.dashed).unwrap();
        assert_eq!(
            threshold.points,
            vec![(64.0, 32.0), (128.0, 32.0), (256.0, 32.0)]
        );
        let ttft = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[1]);
        let threshold = ttft.lines.iter().find(|l| l.dashed).unwrap();
        assert_eq!(threshold.points[0], (64.0, 2.0), "\"2s\" is 2 seconds");
        let measured = waiting.lines.iter().find(|l| !l.dashed).unwrap();
        assert_eq!(measured.points, vec![(64.0, 1.0), (128.0, 40.0)]);
        assert!(
            waiting
                .marks
                .iter()
                .any(|m| m.kind == MarkKind::Congested && m.x == 128.0 && m.y == Some(40.0))
        );
    }

    /// Parameters the scenario did not write were judged with the policy's
    /// defaults: drawn and named as such. A congested stage is circled only
    /// on the charts of the rule that fired (here queueing: not the KV
    /// chart, although KV usage reached 95%, since the preemptions threshold
    /// of 1,000,000 switched that rule off).
    #[test]
    fn defaults_are_drawn_and_only_the_rule_that_fired_is_marked() {
        let mut run = sweep();
        let param = |name: &str, value: f64| Param {
            name: name.into(),
            value: Value::Number(value),
        };
        for (i, stage) in run.result.stages.iter_mut().enumerate().take(2) {
            let record = &mut stage.annotation.as_mut().unwrap().congestion;
            // As written in the scenario: kv_cache_usage is left out.
            record.params = vec![
                param("waiting_requests_p50", 32.0),
                Param {
                    name: "ttft_p99".into(),
                    value: Value::Text("2s".into()),
                },
                param("preemptions", 1_000_000.0),
            ];
            record.judged_params = vec![
                param("waiting_requests_p50", 32.0),
                param("ttft_p99", 2.0),
                param("kv_cache_usage", 0.95),
                param("preemptions", 1_000_000.0),
            ];
            record.roles[0].kv_cache_usage_max = if i == 1 { 1.0 } else { 0.5 };
            record.roles[0].preemptions = 52.0;
            run.records[i] = Some(record.clone());
        }
        let axis = level_axis(std::slice::from_ref(&run));
        let kv = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[2]);
        let threshold = kv.lines.iter().find(|l| l.dashed).unwrap();
        assert_eq!(threshold.name, "threshold kv_cache_usage (policy default)");
        assert_eq!(
            threshold.points,
            vec![(64.0, 0.95), (128.0, 0.95), (256.0, 0.95)]
        );
        assert!(
            !kv.marks.iter().any(|m| m.kind == MarkKind::Congested),
            "{:?}",
            kv.marks
        );
        let waiting = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
        assert_eq!(
            waiting.lines.iter().find(|l| l.dashed).unwrap().name,
            "threshold waiting_requests_p50"
        );
        assert!(
            waiting
                .marks
                .iter()
                .any(|m| m.kind == MarkKind::Congested && m.x == 128.0 && m.y == Some(40.0))
        );
        let page = page(std::slice::from_ref(&run)).unwrap();
        assert!(
            page.contains("kv_cache_usage=0.95 (policy default)"),
            "listed"
        );
        assert!(
            page.contains("threshold preemptions 1000000 ↑"),
            "off the axis"
        );
    }

    /// A verdict that names its rules (interface 0.3) is taken at its word,
    /// whatever the parameters: here a custom policy with no thresholds
    /// fired on the decode role's KV figures only.
    #[test]
    fn the_rules_a_verdict_names_are_the_ones_marked() {
        let mut run = sweep();
        let record = &mut run.result.stages[1].annotation.as_mut().unwrap().congestion;
        let mut decode = record.roles[0].clone();
        decode.role = "decode".into();
        decode.kv_cache_usage_max = 0.9;
        record.roles[0].kv_cache_usage_max = 0.99;
        record.roles.push(decode);
        record.verdict.as_mut().unwrap().fired = vec![FiredRule {
            rule: "kv-cache".into(),
            role: Some("decode".into()),
            signals: vec!["kv_cache_usage_max".into()],
        }];
        run.records[1] = Some(record.clone());
        let axis = level_axis(std::slice::from_ref(&run));
        let marks = |signal: Signal| -> Vec<(f64, Option<f64>)> {
            server_signal(std::slice::from_ref(&run), &axis, signal)
                .marks
                .iter()
                .filter(|m| m.kind == MarkKind::Congested)
                .map(|m| (m.x, m.y))
                .collect()
        };
        assert_eq!(marks(SIGNALS[2]), [(128.0, Some(0.9))], "decode's KV only");
        assert_eq!(marks(SIGNALS[0]), [], "no waiting mark");
        assert_eq!(marks(SIGNALS[3]), [], "no preemptions mark");
    }

    /// Two runs: a table of their figures at the levels both measured.
    #[test]
    fn overlaid_runs_are_compared_at_equal_levels() {
        let (a, mut b) = (sweep(), sweep());
        b.label = "run-b".into();
        b.result.stages[0]
            .client
            .as_mut()
            .unwrap()
            .requests_per_second = 12.0;
        let page = page(&[a, b]).unwrap();
        assert!(page.contains("<h2>Compared at equal levels</h2>"), "{page}");
        assert!(
            page.contains("<td class=\"num\">10.0</td><td class=\"num\">12.0</td><td class=\"num better\">+20.0%</td>"),
            "{page}"
        );
    }

    #[test]
    fn a_judged_stage_without_signals_is_marked_no_data() {
        let mut run = sweep();
        run.result.stages[0] = judged(stage(0, 64, StageStatus::Measured, 10.0), false, vec![]);
        run.records[0] = CongestionRecord::of(&run.result.stages[0]).cloned();
        let axis = level_axis(std::slice::from_ref(&run));
        let figure = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
        assert!(
            figure
                .marks
                .iter()
                .any(|m| m.kind == MarkKind::NoData && m.x == 64.0 && m.y.is_none()),
            "{:?}",
            figure.marks
        );
    }

    /// A signal whose series were missing reads 0 for the policy, but the
    /// report shows "no data", never a measured 0.
    #[test]
    fn a_signal_without_series_is_no_data_not_zero() {
        let mut run = sweep();
        let judged = run.result.stages[0].annotation.as_mut().unwrap();
        judged.congestion.coverage = serde_json::from_value(serde_json::json!([{
            "role": "aggregate",
            "signals": [
                {"signal": "waiting_requests_p50", "status": "missing"},
                {"signal": "kv_cache_usage_max", "status": "found", "metric": "vllm:kv_cache_usage_perc"}
            ]
        }]))
        .unwrap();
        run.records[0] = CongestionRecord::of(&run.result.stages[0]).cloned();
        let axis = level_axis(std::slice::from_ref(&run));
        let waiting = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[0]);
        let measured = waiting.lines.iter().find(|l| !l.dashed).unwrap();
        assert_eq!(measured.points, vec![(128.0, 40.0)], "no point at c=64");
        assert!(
            waiting
                .marks
                .iter()
                .any(|m| m.kind == MarkKind::NoData && m.x == 64.0)
        );
        let kv = server_signal(std::slice::from_ref(&run), &axis, SIGNALS[2]);
        let measured = kv.lines.iter().find(|l| !l.dashed).unwrap();
        assert_eq!(measured.points.len(), 2, "found signals are drawn");
    }

    #[test]
    fn overlaid_runs_are_named_in_every_series() {
        let (a, mut b) = (sweep(), sweep());
        b.label = "run-b".into();
        let runs = [a, b];
        let axis = level_axis(&runs);
        let figure = throughput(&runs, &axis, Throughput::Requests);
        let names: Vec<&str> = figure.lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, vec!["run-a: req/s", "run-b: req/s"]);
        assert_ne!(figure.lines[0].color, figure.lines[1].color);
        let page = page(&runs).unwrap();
        assert!(page.contains("2 runs compared"));
    }

    /// A run whose readings are as extreme as a float gets (a TTFT of
    /// `f64::MAX`: a `+Inf` quantile whose bucket bounds could not be read)
    /// gives a page, in bounded time, that marks them off the axis.
    /// (Scaling the axis to them made the chart code spin forever.)
    #[test]
    fn extreme_readings_give_a_page() {
        for extreme in [f64::MAX, 1e300, f64::INFINITY] {
            let mut run = sweep();
            let judged = run.result.stages[1].annotation.as_mut().unwrap();
            judged.congestion.roles[0].ttft_p99_seconds = extreme;
            judged.congestion.roles[0].waiting_requests_p50 = extreme;
            let client = run.result.stages[1].client.as_mut().unwrap();
            client.ttft_p99_seconds = extreme;
            client.requests_per_second = extreme;
            run.records[1] = CongestionRecord::of(&run.result.stages[1]).cloned();
            let page = page(std::slice::from_ref(&run)).unwrap();
            assert!(page.contains("above the axis (value shown)"), "{extreme}");
            assert!(!page.contains("NaN"), "{extreme}");
        }
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
