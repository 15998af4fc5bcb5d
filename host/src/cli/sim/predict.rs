//! `sim fit --held-out RUN_DIR`: how well a fitted twin predicts a run it was
//! not fitted to. Each held-out stage is replayed on the virtual clock and
//! printed beside the recording (output tok/s, client TTFT p99, waiting
//! p50, KV usage, preemptions), then the stage where each standard rule
//! (queueing; KV-cache pressure) would stop the sweep, predicted and
//! recorded, with the thresholds the held-out run was judged by. A
//! disaggregated twin's stages show each engine's server figures (the
//! decode engine's on the stage's line, the prefill engine's below), and a
//! rule stops at the first stage where it fires on either, as the built-in
//! policy judges every role.

use std::fmt::Write as _;
use std::path::Path;

use nyann_model::RoleSignals;
use nyann_sim::fit::{self, FittedProfile, GivenServer, Prediction, PromptCount, Serving};

/// The standard rules' thresholds, as the held-out run was judged (the
/// built-in's defaults for the KV rule when the run did not write them).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Thresholds {
    /// Waiting p50 and server TTFT p99 of the queueing rule, when written.
    queueing: Option<(f64, f64)>,
    /// KV usage max and preemptions of the KV-cache rule.
    kv: (f64, f64),
}

/// The built-in policy's KV-rule defaults.
const KV_DEFAULTS: (f64, f64) = (0.95, 1.0);

impl Thresholds {
    /// From the `until_congested(...)` parameters of the run's first judged
    /// stage (`annotation.congestion.params`).
    fn of_run(dir: &Path) -> anyhow::Result<Thresholds> {
        let params = fit::judged_params(dir)?;
        let value = |name: &str| {
            let (_, value) = params.iter().find(|(n, _)| n == name)?;
            match value {
                serde_json::Value::String(text) => nyann_model::parse_duration(text)
                    .ok()
                    .map(|d| d.as_secs_f64()),
                other => other.as_f64(),
            }
        };
        Ok(Thresholds {
            queueing: value("waiting_requests_p50").zip(value("ttft_p99")),
            kv: (
                value("kv_cache_usage").unwrap_or(KV_DEFAULTS.0),
                value("preemptions").unwrap_or(KV_DEFAULTS.1),
            ),
        })
    }
}

/// `sim fit --held-out DIR`: the held-out run in `dir` predicted with the
/// fitted profile, as text. Its prompts are counted as `given`, else as the
/// run saved, else as the fit counted its runs'.
pub async fn check_held_out(
    dir: &Path,
    fitted: &FittedProfile,
    given: &GivenServer,
    seed: u64,
) -> anyhow::Result<String> {
    let held_out = fit::read_server(dir)?;
    let count = PromptCount {
        chars_per_token: given
            .chars_per_token
            .or(held_out.chars_per_token)
            .or(fitted.count.chars_per_token),
        chat_template_tokens: given
            .chat_template_tokens
            .or(held_out.chat_template_tokens)
            .unwrap_or(fitted.count.chat_template_tokens),
    };
    let serving = Serving::of(&fitted.profile);
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || check_run(&dir, count, &serving, seed)).await?
}

/// The held-out run in `dir` predicted with `serving`, as text.
fn check_run(
    dir: &Path,
    count: PromptCount,
    serving: &Serving,
    seed: u64,
) -> anyhow::Result<String> {
    let recording = fit::read_recording(dir, count)?;
    let thresholds = Thresholds::of_run(dir)?;
    let predictions = fit::predict(&recording.run, serving, seed);
    Ok(table(&dir.display().to_string(), &predictions, &thresholds))
}

fn table(name: &str, predictions: &[Prediction], thresholds: &Thresholds) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nprediction of {name} (held out; predicted / recorded, and the error):"
    );
    let _ = writeln!(
        out,
        "  {:<10} {:>26} {:>26} {:>14} {:>14} {:>16}",
        "stage", "output tok/s", "TTFT p99 s", "waiting p50", "KV max", "preemptions"
    );
    let pair = |predicted: f64, recorded: Option<f64>, digits: usize| match recorded {
        None => format!("{predicted:.digits$} / -"),
        Some(r) if r > 0.0 => format!(
            "{predicted:.digits$} / {r:.digits$} ({:+.0}%)",
            100.0 * (predicted / r - 1.0)
        ),
        Some(r) => format!("{predicted:.digits$} / {r:.digits$}"),
    };
    // The server's columns of one role, predicted and recorded.
    let server = |pred: &RoleSignals, rec: Option<&RoleSignals>| {
        format!(
            "{:>14} {:>14} {:>16}",
            pair(
                pred.waiting_requests_p50,
                rec.map(|s| s.waiting_requests_p50),
                1
            ),
            pair(
                pred.kv_cache_usage_max,
                rec.map(|s| s.kv_cache_usage_max),
                2
            ),
            pair(pred.preemptions, rec.map(|s| s.preemptions), 0),
        )
    };
    for p in predictions {
        let (pred, rec) = (&p.predicted, &p.recorded);
        let _ = writeln!(
            out,
            "  {:<10} {:>26} {:>26} {}",
            rec.label,
            pair(
                pred.client.output_tokens_per_second,
                Some(rec.client.output_tokens_per_second),
                0
            ),
            pair(
                pred.client.ttft_p99_seconds,
                Some(rec.client.ttft_p99_seconds),
                3
            ),
            server(&pred.server, rec.server.as_ref()),
        );
        if let Some(prefill) = &pred.prefill {
            let _ = writeln!(
                out,
                "  {:<10} {:>53} {}",
                "",
                "prefill engine:",
                server(prefill, rec.prefill.as_ref())
            );
        }
    }
    // The first stage whose signals (predicted or recorded) fire a rule.
    let stop = |fires: &dyn Fn(&RoleSignals) -> bool, predicted: bool| {
        predictions
            .iter()
            .find(|p| {
                let roles = if predicted {
                    [Some(&p.predicted.server), p.predicted.prefill.as_ref()]
                } else {
                    [p.recorded.server.as_ref(), p.recorded.prefill.as_ref()]
                };
                roles.into_iter().flatten().any(fires)
            })
            .map_or("none".to_string(), |p| p.recorded.label.clone())
    };
    if let Some((waiting, ttft)) = thresholds.queueing {
        let fires =
            |s: &RoleSignals| s.waiting_requests_p50 >= waiting && s.ttft_p99_seconds >= ttft;
        let _ = writeln!(
            out,
            "  stop by queueing (waiting p50 >= {waiting}, server TTFT p99 >= {ttft}s): \
             predicted {}, recorded {}",
            stop(&fires, true),
            stop(&fires, false)
        );
    }
    let (usage, preemptions) = thresholds.kv;
    let fires = |s: &RoleSignals| s.kv_cache_usage_max >= usage && s.preemptions >= preemptions;
    let _ = writeln!(
        out,
        "  stop by KV cache (usage >= {usage}, preemptions >= {preemptions}): predicted {}, \
         recorded {}",
        stop(&fires, true),
        stop(&fires, false)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_the_held_out_runs_with_the_kv_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("stages.json"),
            r##"{"schema_version": 1, "stages": [
                {"index": 0, "label": "#0 c=1", "status": "measured", "duration_s": 1.0},
                {"index": 1, "label": "#1 c=2", "status": "measured", "duration_s": 1.0,
                 "annotation": {"congestion": {"roles": [], "params": [
                    {"name": "waiting_requests_p50", "value": 8.0},
                    {"name": "ttft_p99", "value": "1s"},
                    {"name": "preemptions", "value": 3}]}}}]}"##,
        )
        .unwrap();
        assert_eq!(
            Thresholds::of_run(dir.path()).unwrap(),
            Thresholds {
                queueing: Some((8.0, 1.0)),
                kv: (0.95, 3.0),
            }
        );
    }
}
