//! A run's own sections of the page: its timeline of requests with the
//! stages shaded, the errors by reason, the stage table and the scenario.

use std::fmt::Write;

use nyann_check::CongestionRecord;
use nyann_load::StageStatus;
use nyann_model::Value;

use super::{esc, figure};
use crate::ReportError;
use crate::charts::{
    Band, CONGESTED, Line, RUN_SHADES, Span, SpanKind, TimelineFigure, Unit, timeline_chart,
};
use crate::saved::SavedRun;
use crate::table::StageTable;

/// A run's own sections: timeline, errors, stage table, scenario.
pub(super) fn run_details(
    out: &mut String,
    run: &SavedRun,
    index: usize,
) -> Result<(), ReportError> {
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
        // The verdict (the terminal's last column) right after the status:
        // a wide table scrolls, and the answer must not be off-screen.
        let mut cells: Vec<(usize, &String)> = row.iter().enumerate().collect();
        if let Some(judged) = cells.pop() {
            cells.insert(2.min(cells.len()), judged);
        }
        for (c, cell) in cells {
            let tag = if r == 0 { "th" } else { "td" };
            let num = if r > 0 && c >= StageTable::LEFT_ALIGNED && c + 1 < row.len() {
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
