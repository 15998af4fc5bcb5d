//! The conclusion in words: the closing lines on the terminal, and the
//! `until_congested` line that judges close calls again.

use std::fmt::Write;

use super::{Conclusion, StageRef, number};
use crate::record::{CongestionRecord, StageResult};

impl Conclusion {
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
            // With a capacity search its bounds are the answer, the
            // knee's figures said with the clean one.
            if let Some(capacity) = &sweep.capacity {
                let answer = capacity.answer(sweep.knee.as_ref());
                let under = match &capacity.under_slo {
                    Some(slo) => format!(" {}", slo.words()),
                    None => String::new(),
                };
                let _ = writeln!(out, "{prefix}capacity{under}: {answer}");
            } else {
                match (&sweep.knee, &sweep.congested, &sweep.suggested_start) {
                    (Some(knee), congested, _) => {
                        let what = match congested {
                            Some(c) => format!("knee (congested from {})", c.label),
                            None => "no stage was congested; the highest level".to_string(),
                        };
                        let _ = writeln!(
                            out,
                            "{prefix}{what}: {} ({}): {}",
                            knee.stage.label,
                            knee.stage.level,
                            knee.figures()
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
            }
            if let Some(most) = &sweep.most_goodput {
                let _ = writeln!(out, "{prefix}most goodput: {}", most.words());
            }
            if let Some(close) = sweep.close_call() {
                let _ = write!(
                    out,
                    "{prefix}close call: {close}; a level this near can be judged the other way on another run"
                );
                if let Some(line) = &sweep.rejudge {
                    let _ = write!(out, ": judge it again with longer stages, {line}");
                }
                let confirming = sweep
                    .capacity
                    .as_ref()
                    .and_then(|c| c.confirmed.first())
                    .is_some();
                if sweep.capacity.is_some() && !confirming {
                    let _ = write!(
                        out,
                        "; or add confirm=1 to the sweep's until_congested(...) to judge a search's close calls again as it runs"
                    );
                }
                out.push('\n');
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

/// The scenario line that judges `levels` again, each with a stage twice
/// as long as the one that judged it (`stages` by index) and the same
/// `until_congested` parameters.
pub(super) fn rejudge_line(levels: &[&StageRef], stages: &[StageResult]) -> Option<String> {
    let mut written = Vec::new();
    let mut params = None;
    for at in levels {
        let stage = stages.get(at.stage)?;
        params = params.or_else(|| CongestionRecord::of(stage).map(|r| r.params.clone()));
        let longer = std::time::Duration::from_secs_f64((2.0 * stage.duration_s).max(1.0).round());
        let duration = humantime::format_duration(longer)
            .to_string()
            .replace(' ', "");
        let level = match (at.level.concurrency, at.level.rate) {
            (_, Some(rate)) => format!("rate={rate}, mode=\"{}\"", mode_name(stage)),
            (Some(c), None) => format!("concurrency={c}"),
            (None, None) => return None,
        };
        written.push(format!("stage(\"{duration}\", {level})"));
    }
    let params: Vec<String> = params?
        .iter()
        .map(|p| format!("{}={}", p.name, starlark_value(&p.value)))
        .collect();
    let mut args = vec![format!("[{}]", written.join(", "))];
    args.extend(params);
    Some(format!("until_congested({})", args.join(", ")))
}

/// The load mode of an open-loop stage, as the scenario writes it.
fn mode_name(stage: &StageResult) -> &'static str {
    match stage.mode {
        Some(nyann_model::Mode::Poisson) => "poisson",
        _ => "constant",
    }
}

/// A parameter's value as Starlark writes it.
fn starlark_value(value: &nyann_model::Value) -> String {
    match value {
        nyann_model::Value::Number(n) => number(*n),
        nyann_model::Value::Integer(i) => i.to_string(),
        nyann_model::Value::Text(t) => format!("{t:?}"),
        nyann_model::Value::Flag(true) => "True".into(),
        nyann_model::Value::Flag(false) => "False".into(),
    }
}
