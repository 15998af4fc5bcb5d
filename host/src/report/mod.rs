//! Human-readable reports of a run: the per-stage table printed on stderr at
//! the end of `generate` (the JSON summary on stdout is `RunResult` itself).

use std::fmt::Write;

use nyann_load::{RunOutcome, RunResult, StageResult, StageStatus};

/// Milliseconds with a precision that suits the magnitude.
fn ms(seconds: f64) -> String {
    let ms = seconds * 1000.0;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

fn level(stage: &StageResult) -> String {
    match (stage.concurrency, stage.rate) {
        (_, Some(rate)) => format!("{rate}/s"),
        (Some(c), None) => format!("c={c}"),
        (None, None) => "-".into(),
    }
}

fn status(stage: &StageResult) -> &'static str {
    match stage.status {
        StageStatus::Measured => "measured",
        StageStatus::Warmup => "warm-up",
        StageStatus::Skipped => "skipped",
        StageStatus::Barrier => "barrier",
        StageStatus::Interrupted => "interrupted",
    }
}

const HEADER: [&str; 15] = [
    "stage",
    "status",
    "level",
    "ok",
    "errors",
    "dropped",
    "req/s",
    "tok/s",
    "TTFT mean",
    "p50",
    "p90",
    "p99",
    "ITL p50",
    "p99",
    "E2E p50/p99",
];

/// The per-stage table (times in milliseconds), then a line on how the run ended.
pub fn stage_table(result: &RunResult) -> String {
    let mut rows: Vec<Vec<String>> = vec![HEADER.iter().map(|s| s.to_string()).collect()];
    for stage in &result.stages {
        let mut row = vec![stage.label.clone(), status(stage).to_string(), level(stage)];
        match (&stage.client, &stage.detail) {
            (Some(c), Some(d)) => row.extend([
                c.requests_ok.to_string(),
                c.requests_failed.to_string(),
                d.dropped.to_string(),
                format!("{:.1}", c.requests_per_second),
                format!("{:.0}", c.output_tokens_per_second),
                ms(d.ttft_mean_seconds),
                ms(c.ttft_p50_seconds),
                ms(d.ttft_p90_seconds),
                ms(c.ttft_p99_seconds),
                ms(c.itl_p50_seconds),
                ms(c.itl_p99_seconds),
                format!("{}/{}", ms(c.e2e_p50_seconds), ms(c.e2e_p99_seconds)),
            ]),
            _ => row.extend(std::iter::repeat_n("-".to_string(), HEADER.len() - 3)),
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..HEADER.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i < 3 {
                    format!("{cell:<w$}", w = widths[i])
                } else {
                    format!("{cell:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    for stage in &result.stages {
        if let Some(reason) = &stage.skip_reason {
            let _ = writeln!(out, "{}: skipped: {reason}", stage.label);
            break;
        }
    }
    let _ = writeln!(
        out,
        "{}",
        match &result.outcome {
            RunOutcome::Completed => "run completed".to_string(),
            RunOutcome::Stopped { reason, .. } => format!("sweep stopped: {reason}"),
            RunOutcome::Aborted { reason } => format!("run ABORTED: {reason}"),
            RunOutcome::Interrupted => "run interrupted".to_string(),
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_load::StageDetail;
    use nyann_model::{ClientStats, Mode};

    #[test]
    fn table_has_a_row_per_step_and_the_outcome() {
        let measured = StageResult {
            index: 0,
            label: "#0 c=64".into(),
            name: None,
            status: StageStatus::Measured,
            mode: Some(Mode::Concurrent),
            concurrency: Some(64),
            rate: None,
            duration_s: 60.0,
            drain: None,
            start_unix: Some(1.0),
            end_unix: Some(61.0),
            client: Some(ClientStats {
                requests_ok: 1200,
                ttft_p50_seconds: 0.0421,
                ..ClientStats::default()
            }),
            detail: Some(StageDetail::default()),
            annotation: None,
            skip_reason: None,
        };
        let skipped = StageResult {
            index: 1,
            label: "#1 c=128".into(),
            status: StageStatus::Skipped,
            concurrency: Some(128),
            client: None,
            detail: None,
            skip_reason: Some("stopped after stage #0 c=64: congested".into()),
            ..measured.clone()
        };
        let result = RunResult {
            outcome: RunOutcome::Stopped {
                stage: 0,
                reason: "congested".into(),
            },
            start_unix: 0.0,
            end_unix: 1.0,
            seed: 1,
            models: vec![],
            targets: vec![],
            totals: ClientStats::default(),
            totals_detail: StageDetail::default(),
            requests_recorded: 0,
            stages: vec![measured, skipped],
        };
        let table = stage_table(&result);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("stage") && lines[0].contains("TTFT mean"));
        assert!(
            lines[1].contains("#0 c=64") && lines[1].contains("1200") && lines[1].contains("42.1")
        );
        assert!(lines[2].contains("skipped") && lines[2].contains('-'));
        assert!(table.contains("sweep stopped: congested"));
    }
}
