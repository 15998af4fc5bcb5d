//! The HTML report: one self-contained page (inline CSS and SVG charts, no
//! script, nothing fetched) for one run, or several runs overlaid for
//! comparison.
//!
//! What the page shows, top-down: per run a headline (outcome, stop reason,
//! policy, knee, capacity, what the skipped stages saved); throughput and client
//! latencies against the stage level, and the eval accuracy when stages
//! scored eval answers; the server signals the policy judged,
//! with the thresholds; per run a timeline of the requests with the stages
//! shaded; the errors by reason; the stage table; the scenario.

mod details;
mod levels;
#[cfg(test)]
mod tests;

use std::fmt::Write;

use nyann_check::StageResult;
use nyann_load::StageStatus;

use crate::ReportError;
use crate::charts::level_chart;
use crate::saved::SavedRun;
use crate::table::outcome_line;
use details::run_details;
use levels::{
    Latency, SIGNALS, Throughput, accuracy, client_latency, comparison, judged_by_builtin,
    level_axis, server_signal, throughput,
};

/// The page for `runs` (at least one).
pub fn page(runs: &[SavedRun]) -> Result<String, ReportError> {
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

    // Only when some stage scored eval answers: an empty chart reads as a
    // measurement of nothing.
    if let Some(accuracy) = accuracy(runs, &axis) {
        section(&mut out, "Eval accuracy against the stage level");
        figure(&mut out, level_chart(&accuracy)?);
        out.push_str(
            "<p class=\"note\">Eval answers right, of those scored, per stage (stages that scored \
             none left out); the whiskers are the 95% Wilson interval. The stage table gives the \
             same figures.</p>\n</div>\n",
        );
    }

    // Only when some judged stage had server signals (a policy that judges
    // client figures alone, with no signal source, has none to draw).
    let records = || runs.iter().flat_map(|r| r.records.iter().flatten());
    if records().any(|record| !record.roles.is_empty()) {
        section(&mut out, "Server signals the policy judged");
        for signal in SIGNALS {
            figure(&mut out, level_chart(&server_signal(runs, &axis, signal))?);
        }
        let thresholds = if records().any(judged_by_builtin) {
            "the dashed line is the built-in policy's threshold for the signal. "
        } else {
            ""
        };
        let _ = write!(
            out,
            "<p class=\"note\">Per role; {thresholds}Grey circles on the axis: no data for that \
             signal (no series found, or the query failed; the policy saw 0).</p>\n</div>\n",
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

/// `, accuracy 87.0% (95% interval 84.1-89.6%) of 1319 answered` for a
/// stage that scored eval answers, else nothing.
fn accuracy_of(stage: Option<&StageResult>) -> String {
    match stage.and_then(|s| s.client.as_ref()?.eval) {
        Some(eval) if eval.answered > 0 => format!(
            ", accuracy {:.1}% (95% interval {:.1}-{:.1}%) of {} answered",
            eval.accuracy * 100.0,
            eval.accuracy_low * 100.0,
            eval.accuracy_high * 100.0,
            eval.answered
        ),
        _ => String::new(),
    }
}

fn seconds(s: f64) -> String {
    humantime::format_duration(std::time::Duration::from_secs_f64(s.max(0.0).round())).to_string()
}

/// The run's verdict in words, its policy, its knee, the capacity a
/// search found (and its close calls) and what stopping saved.
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
            "<div>policy {} {} ({}{}), mode {}</div>",
            esc(&record.policy.name),
            esc(&record.policy.version),
            esc(&record.policy.origin),
            // What judged, whatever its name and origin say (a tag moves).
            if record.policy.digest.is_empty() {
                String::new()
            } else {
                format!(", component {}", esc(&record.policy.digest))
            },
            match record.mode {
                nyann_check::PolicyMode::Enforce => "enforce",
                nyann_check::PolicyMode::Monitor => "monitor",
            }
        );
    }
    // One answer per sweep, the conclusion's (as the terminal and
    // summary.json say it): the capacity a search found with the knee's
    // figures, else the knee.
    let conclusion = nyann_check::Conclusion::of(result, 1);
    for sweep in &conclusion.sweeps {
        match (&sweep.capacity, &sweep.knee) {
            (Some(capacity), knee) => {
                let under = match &capacity.under_slo {
                    Some(slo) => format!(" {}", slo.words()),
                    None => String::new(),
                };
                let _ = write!(
                    out,
                    "<div class=\"verdict\">capacity{}: {}</div>",
                    esc(&under),
                    esc(&capacity.answer(knee.as_ref()))
                );
            }
            (None, Some(knee)) => {
                let _ = write!(
                    out,
                    "<div>knee (the highest level not congested): <b>{}</b>: {}{}</div>",
                    esc(&knee.stage.label),
                    esc(&knee.figures()),
                    esc(&accuracy_of(result.stages.get(knee.stage.stage)))
                );
            }
            (None, None) => out.push_str("<div>knee: none (no stage ran before congestion)</div>"),
        }
        if let Some(most) = &sweep.most_goodput {
            let _ = write!(out, "<div>most goodput: {}</div>", esc(&most.words()));
        }
        if let Some(close) = sweep.close_call() {
            let _ = write!(
                out,
                "<div class=\"worse\">close call: {}: a level this near can be judged the other way on another run</div>",
                esc(&close)
            );
        }
    }
    // A run no sweep judged (an eval, plain stages): no knee to name, but
    // what each eval stage scored.
    if conclusion.sweeps.is_empty() {
        for stage in result
            .stages
            .iter()
            .filter(|s| s.status == StageStatus::Measured)
        {
            let accuracy = accuracy_of(Some(stage));
            if !accuracy.is_empty() {
                let _ = write!(
                    out,
                    "<div>eval at <b>{}</b>{}</div>",
                    esc(&stage.label),
                    esc(&accuracy)
                );
            }
        }
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
