//! Human-readable reports of a run: the per-stage table printed on stderr at
//! the end of `generate` (the JSON summary on stdout is `RunResult` itself).

use std::fmt::Write;

use nyann_load::{RunOutcome, RunResult, StageResult, StageStatus};
use nyann_model::RoleSignals;

use crate::sweep::CongestionRecord;

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

fn status(stage: &StageResult, record: Option<&CongestionRecord>) -> &'static str {
    if record.is_some_and(CongestionRecord::congested) {
        return "CONGESTED";
    }
    match stage.status {
        StageStatus::Measured => "measured",
        StageStatus::Warmup => "warm-up",
        StageStatus::Skipped => "skipped",
        StageStatus::Barrier => "barrier",
        StageStatus::Interrupted => "interrupted",
    }
}

const HEADER: [&str; 20] = [
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
    "SRV TTFT p50/p99",
    "wait p50",
    "KV max",
    "preempt",
    "judged",
];

/// The server columns of a judged stage: the largest value across roles,
/// since the rules compare the worst role with each threshold.
fn server_cells(record: Option<&CongestionRecord>) -> [String; 5] {
    let Some(record) = record else {
        return std::array::from_fn(|_| "-".to_string());
    };
    let max = |f: &dyn Fn(&RoleSignals) -> f64| record.roles.iter().map(f).fold(0.0, f64::max);
    let ttft_p50 = max(&|r| r.extra("ttft_p50_seconds").unwrap_or(0.0));
    let judged = match (&record.verdict, &record.policy_error) {
        (Some(v), _) if v.congested => "congested",
        (Some(_), _) => "ok",
        (None, _) => "policy error",
    };
    let errors = if record.signal_errors.is_empty() {
        ""
    } else {
        "*"
    };
    [
        format!("{}/{}", ms(ttft_p50), ms(max(&|r| r.ttft_p99_seconds))),
        format!("{}", max(&|r| r.waiting_requests_p50)),
        format!("{:.1}%", 100.0 * max(&|r| r.kv_cache_usage_max)),
        format!("{}", max(&|r| r.preemptions)),
        format!("{judged}{errors}"),
    ]
}

/// The per-stage table (times in milliseconds) and its footnotes.
pub fn stage_table(result: &RunResult) -> String {
    // Each judged stage's record, read back from its annotation once.
    let records: Vec<Option<CongestionRecord>> = result
        .stages
        .iter()
        .map(|s| CongestionRecord::of(s.annotation.as_ref()))
        .collect();
    let mut rows: Vec<Vec<String>> = vec![HEADER.iter().map(|s| s.to_string()).collect()];
    for (stage, record) in result.stages.iter().zip(&records) {
        let mut row = vec![
            stage.label.clone(),
            status(stage, record.as_ref()).to_string(),
            level(stage),
        ];
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
            _ => row.extend(std::iter::repeat_n("-".to_string(), HEADER.len() - 8)),
        }
        row.extend(server_cells(record.as_ref()));
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
    let judged = || records.iter().flatten();
    if judged().any(|r| r.roles.len() > 1) {
        let _ = writeln!(
            out,
            "server columns (SRV ... preempt): the largest value across roles"
        );
    }
    if judged().any(|r| !r.signal_errors.is_empty()) {
        let _ = writeln!(
            out,
            "*: some server signals could not be read (they count as 0); see signal_errors in stages.json"
        );
    }
    for (stage, record) in result.stages.iter().zip(&records) {
        if let Some(error) = record.as_ref().and_then(|r| r.policy_error.as_ref()) {
            let _ = writeln!(out, "{}: {error}", stage.label);
        }
    }
    out
}

/// How the run ended, in one line (all `-q` leaves on stderr).
pub fn outcome_line(result: &RunResult) -> String {
    match &result.outcome {
        RunOutcome::Completed => "run completed".to_string(),
        RunOutcome::Stopped { reason, .. } => format!("sweep {reason}"),
        RunOutcome::Aborted { reason } => format!("run ABORTED: {reason}"),
        RunOutcome::Interrupted => "run interrupted".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::{ANNOTATION_KEY, CongestionRecord, PolicyMode, PolicyRef};
    use nyann_load::StageDetail;
    use nyann_model::{ClientStats, Mode, Verdict};

    fn measured(label: &str, client: ClientStats) -> StageResult {
        StageResult {
            index: 0,
            label: label.into(),
            name: None,
            status: StageStatus::Measured,
            mode: Some(Mode::Concurrent),
            concurrency: Some(64),
            rate: None,
            duration_s: 60.0,
            drain: None,
            start_unix: Some(1.0),
            end_unix: Some(61.0),
            client: Some(client),
            detail: Some(StageDetail::default()),
            annotation: None,
            skip_reason: None,
        }
    }

    fn run(outcome: RunOutcome, stages: Vec<StageResult>) -> RunResult {
        RunResult {
            outcome,
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
    fn table_has_a_row_per_step_and_the_outcome() {
        let client = ClientStats {
            requests_ok: 1200,
            ttft_p50_seconds: 0.0421,
            ..ClientStats::default()
        };
        let skipped = StageResult {
            index: 1,
            label: "#1 c=128".into(),
            status: StageStatus::Skipped,
            concurrency: Some(128),
            client: None,
            detail: None,
            skip_reason: Some("stopped after stage #0 c=64: congested".into()),
            ..measured("#0 c=64", ClientStats::default())
        };
        let outcome = RunOutcome::Stopped {
            stage: 0,
            reason: "stopped after stage #0 c=64: congested: KV cache".into(),
        };
        let run = run(outcome, vec![measured("#0 c=64", client), skipped]);
        let table = stage_table(&run);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("stage") && lines[0].contains("TTFT mean"));
        assert!(
            lines[1].contains("#0 c=64") && lines[1].contains("1200") && lines[1].contains("42.1")
        );
        assert!(lines[2].contains("skipped") && lines[2].contains('-'));
        assert_eq!(
            outcome_line(&run),
            "sweep stopped after stage #0 c=64: congested: KV cache"
        );
    }

    #[test]
    fn judged_stage_shows_server_columns_and_the_congested_mark() {
        let role = |name: &str, waiting: f64, kv: f64| RoleSignals {
            role: name.into(),
            waiting_requests_p50: waiting,
            ttft_p99_seconds: 2.5,
            kv_cache_usage_max: kv,
            preemptions: 3.0,
            extra: vec![("ttft_p50_seconds".into(), 0.25)],
        };
        let record = CongestionRecord {
            policy: PolicyRef {
                name: "builtin".into(),
                version: "0.1.0".into(),
                origin: "builtin".into(),
            },
            mode: PolicyMode::Enforce,
            sweep: Default::default(),
            params: Vec::new(),
            roles: vec![role("prefill", 40.0, 0.5), role("decode", 2.0, 0.98)],
            signal_errors: vec!["decode: preemptions: timeout".into()],
            verdict: Some(Verdict {
                congested: true,
                reasons: vec!["queueing".into()],
            }),
            policy_error: None,
            check_seconds: 0.01,
        };
        let stage = StageResult {
            annotation: Some(serde_json::json!({ ANNOTATION_KEY: record })),
            ..measured("#0 c=64", ClientStats::default())
        };
        let table = stage_table(&run(RunOutcome::Completed, vec![stage]));
        let row = table.lines().nth(1).unwrap();
        assert!(row.contains("CONGESTED"), "{row}");
        // Largest value across roles: waiting from prefill, KV from decode.
        assert!(
            row.contains("250/2500") && row.contains("  40  ") && row.contains("98.0%"),
            "{row}"
        );
        assert!(row.contains("congested*"), "{row}");
        assert!(table.contains("largest value across roles"));
    }
}
