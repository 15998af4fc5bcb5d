//! The per-stage table printed on stderr at the end of `generate` (and shown
//! again in the HTML report), and the line saying how the run ended.

use std::fmt::Write;

use nyann_load::{RunOutcome, StageStatus};
use nyann_model::{ClientStats, RoleSignals};

use nyann_check::{CongestionRecord, RunResult, StageResult};

/// Milliseconds with a precision that suits the magnitude.
fn ms(seconds: f64) -> String {
    let ms = seconds * 1000.0;
    if ms >= 1e12 {
        format!("{ms:.1e}")
    } else if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

pub fn level(stage: &StageResult) -> String {
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
    if stage.degraded.is_some() && stage.status == StageStatus::Measured {
        return "degraded";
    }
    match stage.status {
        StageStatus::Measured => "measured",
        StageStatus::Warmup => "warm-up",
        StageStatus::Skipped => "skipped",
        StageStatus::Barrier => "barrier",
        StageStatus::Interrupted => "interrupted",
    }
}

const HEADER: [&str; 22] = [
    "stage",
    "status",
    "level",
    "ok",
    "errors",
    "rejected",
    "late",
    "dropped",
    "req/s",
    "tok/s",
    "TTFT ms mean",
    "p50",
    "p90",
    "p99",
    "ITL ms p50",
    "p99",
    "E2E ms p50/p99",
    "SRV TTFT ms p50/p99",
    "wait p50",
    "KV max",
    "preempt",
    "judged",
];

/// The column shown after the client columns when some stage knows its
/// share of prompt tokens served from the server's prefix cache.
const CACHED: &str = "cached";

/// The column shown after the client columns when some stage asked eval
/// questions (GSM8K, GPQA).
const ACCURACY: &str = "accuracy";

/// What a server cell says for a signal no role had series of.
const NO_DATA: &str = "no data";

/// The server columns of a judged stage: the largest value across the roles
/// that had series for the signal, since the rules compare the worst role
/// with each threshold; `no data` when none had, `>=` before a lower bound.
fn server_cells(stage: &StageResult, record: Option<&CongestionRecord>) -> [String; 5] {
    let Some(record) = record else {
        let mut cells: [String; 5] = std::array::from_fn(|_| "-".to_string());
        if stage.check_interrupted {
            cells[4] = "interrupted".into();
        }
        return cells;
    };
    // (value, is a lower bound) of the largest reading of `signal`.
    let largest = |signal: &str, value: &dyn Fn(&RoleSignals) -> f64| -> Option<(f64, bool)> {
        record
            .roles
            .iter()
            .filter_map(|role| {
                let coverage = record.coverage.iter().find(|c| c.role == role.role);
                let entry = coverage.and_then(|c| c.get(signal));
                match entry {
                    Some(e) if e.status.no_data() => None,
                    _ => Some((value(role), entry.is_some_and(|e| e.lower_bound))),
                }
            })
            .reduce(|a, b| if b.0 > a.0 { b } else { a })
    };
    let show = |reading: Option<(f64, bool)>, format: &dyn Fn(f64) -> String| match reading {
        None => NO_DATA.to_string(),
        Some((v, true)) => format!(">={}", format(v)),
        Some((v, false)) => format(v),
    };
    let ttft_p99 = largest("ttft_p99_seconds", &|r| r.ttft_p99_seconds);
    let ttft = match ttft_p99 {
        None => NO_DATA.to_string(),
        Some(_) => {
            let p50 = largest("ttft_p50_seconds", &|r| {
                r.extra("ttft_p50_seconds").unwrap_or(0.0)
            });
            format!("{}/{}", show(p50, &ms), show(ttft_p99, &ms))
        }
    };
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
        ttft,
        show(
            largest("waiting_requests_p50", &|r| r.waiting_requests_p50),
            &|v| format!("{v}"),
        ),
        show(
            largest("kv_cache_usage_max", &|r| r.kv_cache_usage_max),
            &|v| format!("{:.1}%", 100.0 * v),
        ),
        // increase() extrapolates to the window edges, so the count is rarely
        // whole: rounded here, kept as computed in the record.
        show(largest("preemptions", &|r| r.preemptions), &|v| {
            format!("{v:.0}")
        }),
        format!("{judged}{errors}"),
    ]
}

/// Rejected requests (the server shedding load) and their rate.
fn rejected(client: &ClientStats) -> String {
    match client.requests_rejected {
        0 => "0".into(),
        n => format!("{n} ({:.1}/s)", client.rejected_per_second),
    }
}

/// The per-stage table as cells: the header row, then one row per step,
/// then the footnotes (times in milliseconds).
pub struct StageTable {
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl StageTable {
    pub fn of(result: &RunResult) -> StageTable {
        // Each judged stage's record, read back from its annotation once.
        let records: Vec<Option<CongestionRecord>> = result
            .stages
            .iter()
            .map(|s| CongestionRecord::of(s).cloned())
            .collect();
        let mut header: Vec<String> = HEADER.iter().map(|s| s.to_string()).collect();
        // The 5 server columns close each row.
        let server_columns_at = HEADER.len() - 5;
        let show_cached = result.stages.iter().any(|s| {
            s.detail
                .as_ref()
                .is_some_and(|d| d.cached_prompt_share.is_some())
        });
        let show_accuracy = result
            .stages
            .iter()
            .any(|s| s.client.as_ref().is_some_and(|c| c.eval.is_some()));
        if show_accuracy {
            header.insert(server_columns_at, ACCURACY.into());
        }
        if show_cached {
            header.insert(server_columns_at, CACHED.into());
        }
        let slos = crate::goodput::slos(result);
        if !slos.is_empty() {
            header.insert(server_columns_at, crate::goodput::HEADER.into());
        }
        let mut rows = vec![header];
        for (stage, record) in result.stages.iter().zip(&records) {
            // A capacity-search stage is told apart from the sweep's grid.
            let label = match stage.search {
                Some(_) => format!("{} (search)", stage.label),
                None => stage.label.clone(),
            };
            let mut row = vec![
                label,
                status(stage, record.as_ref()).to_string(),
                level(stage),
            ];
            match (&stage.client, &stage.detail) {
                (Some(c), Some(d)) => row.extend([
                    c.requests_ok.to_string(),
                    c.requests_failed.to_string(),
                    rejected(c),
                    c.requests_late.to_string(),
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
                _ => row.extend(std::iter::repeat_n(
                    "-".to_string(),
                    server_columns_at - StageTable::LEFT_ALIGNED,
                )),
            }
            if !slos.is_empty() {
                row.push(crate::goodput::cell(stage));
            }
            if show_cached {
                let share = stage.detail.as_ref().and_then(|d| d.cached_prompt_share);
                row.push(share.map_or("-".into(), |s| format!("{:.0}%", 100.0 * s)));
            }
            if show_accuracy {
                let eval = stage.client.as_ref().and_then(|c| c.eval);
                row.push(eval.map_or("-".into(), |e| {
                    format!(
                        "{:.1}% ({:.0}-{:.0})",
                        100.0 * e.accuracy,
                        100.0 * e.accuracy_low,
                        100.0 * e.accuracy_high
                    )
                }));
            }
            row.extend(server_cells(stage, record.as_ref()));
            rows.push(row);
        }
        let mut notes = Vec::new();
        let judged = || records.iter().flatten();
        if judged().any(|r| r.roles.len() > 1) {
            notes.push("server columns (SRV ... preempt): the largest value across roles".into());
        }
        let server_cells = || rows.iter().skip(1).flat_map(|r| &r[r.len() - 5..]);
        if server_cells().any(|c| c.contains(NO_DATA)) {
            notes.push(
                "no data: no series of that signal on any role, or a latency histogram with no observation while the server was idle (the policy saw 0); see coverage in stages.json"
                    .into(),
            );
        }
        if server_cells().any(|c| c.contains(">=")) {
            notes.push(
                ">=: a lower bound: the quantile lies beyond the histogram's largest bucket bound, \
                 or no first token came in the window while requests waited (a stall)"
                    .into(),
            );
        }
        if let Some(note) = crate::goodput::note(&slos) {
            notes.push(note);
        }
        if show_accuracy {
            notes.push(
                "accuracy: eval answers right, of those scored (95% Wilson interval); eval_* in requests.jsonl"
                    .into(),
            );
        }
        if show_cached {
            notes.push(
                "cached: share of prompt tokens the server's prefix cache served, over the requests whose usage said (cached_tokens)"
                    .into(),
            );
        }
        if judged().any(|r| !r.signal_errors.is_empty()) {
            notes.push(
                "*: some server signals could not be read (they count as 0); see signal_errors in stages.json"
                    .into(),
            );
        }
        for (stage, record) in result.stages.iter().zip(&records) {
            if let Some(degraded) = &stage.degraded {
                let configured = StageResult {
                    concurrency: degraded.configured_concurrency,
                    rate: degraded.configured_rate,
                    ..stage.clone()
                };
                notes.push(format!(
                    "{}: degraded: ran at {} of the {} configured: {}",
                    stage.label,
                    level(stage),
                    level(&configured),
                    degraded.reason
                ));
            }
            if let Some(error) = record.as_ref().and_then(|r| r.policy_error.as_ref()) {
                notes.push(format!("{}: {error}", stage.label));
            }
            if let (Some(client), Some(detail)) = (&stage.client, &stage.detail)
                && let Some(warning) =
                    nyann_load::stats::client_warning(client, detail, stage.concurrency)
            {
                notes.push(format!("{}: {warning}", stage.label));
            }
        }
        StageTable { rows, notes }
    }

    /// Columns left-aligned up to here (stage, status, level), the rest right-aligned.
    pub const LEFT_ALIGNED: usize = 3;
}

/// The per-stage table as text, columns aligned, then its footnotes.
pub fn stage_table(result: &RunResult) -> String {
    let table = StageTable::of(result);
    let widths: Vec<usize> = (0..table.rows[0].len())
        .map(|i| {
            table
                .rows
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &table.rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i < StageTable::LEFT_ALIGNED {
                    format!("{cell:<w$}", w = widths[i])
                } else {
                    format!("{cell:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    for note in &table.notes {
        let _ = writeln!(out, "{note}");
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
        RunOutcome::Degraded {
            reasons, reason, ..
        } => {
            let stopped = reason
                .as_ref()
                .map(|r| format!("sweep {r}; "))
                .unwrap_or_default();
            format!("{stopped}run DEGRADED: {}", reasons.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nyann_check::{CongestionRecord, Judged, PolicyMode, PolicyRef};
    use nyann_load::StageDetail;
    use nyann_model::{Mode, RoleCoverage, SignalCoverage, Verdict};

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
            sweep: None,
            start_unix: Some(1.0),
            end_unix: Some(61.0),
            client: Some(client),
            detail: Some(StageDetail::default()),
            annotation: None,
            skip_reason: None,
            check_interrupted: false,
            degraded: None,
            search: None,
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
        assert!(lines[0].starts_with("stage") && lines[0].contains("TTFT ms mean"));
        assert!(
            lines[1].contains("#0 c=64") && lines[1].contains("1200") && lines[1].contains("42.1")
        );
        assert!(lines[2].contains("skipped") && lines[2].contains('-'));
        assert_eq!(
            outcome_line(&run),
            "sweep stopped after stage #0 c=64: congested: KV cache"
        );
    }

    /// The cached column appears when a stage knows its share, after the
    /// client columns; a stage without one shows `-`; no stage, no column.
    #[test]
    fn cached_share_gets_a_column_only_when_a_stage_has_one() {
        let plain = stage_table(&run(
            RunOutcome::Completed,
            vec![measured("#0 c=64", ClientStats::default())],
        ));
        assert!(!plain.contains(CACHED), "{plain}");
        let pool = StageResult {
            detail: Some(StageDetail {
                cached_prompt_share: Some(0.607),
                ..StageDetail::default()
            }),
            ..measured("#0 c=4", ClientStats::default())
        };
        let mut record = judged(vec![role("aggregate", 1.0, 0.5)], vec![]);
        record.verdict = None;
        let unreported = StageResult {
            annotation: Some(Judged { congestion: record }),
            ..measured("#1 c=8", ClientStats::default())
        };
        let table = stage_table(&run(RunOutcome::Completed, vec![pool, unreported]));
        let lines: Vec<&str> = table.lines().collect();
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        let at = header.iter().position(|h| *h == CACHED).unwrap();
        assert_eq!(header[at - 1], "p50/p99", "after E2E p50/p99: {table}");
        assert_eq!(header[at + 1], "SRV", "{table}");
        assert!(lines[1].contains(" 61% "), "{table}");
        assert!(lines[2].contains(" - "), "{table}");
        assert!(
            lines[2].trim_end().ends_with("policy error"),
            "server cells: {table}"
        );
        assert!(table.contains("cached: share of prompt tokens"), "{table}");
    }

    fn role(name: &str, waiting: f64, kv: f64) -> RoleSignals {
        RoleSignals {
            role: name.into(),
            waiting_requests_p50: waiting,
            ttft_p99_seconds: 2.5,
            kv_cache_usage_max: kv,
            preemptions: 27.931965517241377,
            extra: vec![("ttft_p50_seconds".into(), 0.25)],
        }
    }

    fn judged(roles: Vec<RoleSignals>, coverage: Vec<RoleCoverage>) -> CongestionRecord {
        CongestionRecord {
            policy: PolicyRef {
                name: "builtin".into(),
                version: "0.1.0".into(),
                origin: "builtin".into(),
                digest: String::new(),
                interface: String::new(),
            },
            mode: PolicyMode::Enforce,
            sweep: Default::default(),
            params: Vec::new(),
            judged_params: Vec::new(),
            roles,
            coverage,
            signal_errors: vec![],
            verdict: Some(Verdict {
                congested: true,
                reasons: vec!["queueing".into()],
                fired: Vec::new(),
            }),
            policy_error: None,
            stopped: false,
            refine: None,
            check_seconds: 0.01,
        }
    }

    /// The table of one stage judged with `record`: (first row, whole table).
    fn judged_table(record: CongestionRecord) -> (String, String) {
        let stage = StageResult {
            annotation: Some(Judged { congestion: record }),
            ..measured("#0 c=64", ClientStats::default())
        };
        let table = stage_table(&run(RunOutcome::Completed, vec![stage]));
        (table.lines().nth(1).unwrap().to_string(), table)
    }

    #[test]
    fn rejected_late_and_the_clients_own_trouble_are_shown() {
        let client = ClientStats {
            requests_ok: 90,
            requests_failed: 8,
            requests_rejected: 12,
            rejected_per_second: 0.2,
            requests_late: 1,
            ..ClientStats::default()
        };
        let busy = StageResult {
            detail: Some(StageDetail {
                client_errors: 6,
                ..StageDetail::default()
            }),
            check_interrupted: true,
            ..measured("#0 c=64", client)
        };
        let lagging = StageResult {
            detail: Some(StageDetail {
                client_lag_p99_seconds: 0.025,
                ..StageDetail::default()
            }),
            ..measured(
                "#1 c=4096",
                ClientStats {
                    e2e_p50_seconds: 0.1,
                    ..ClientStats::default()
                },
            )
        };
        let table = stage_table(&run(RunOutcome::Interrupted, vec![busy, lagging]));
        let lines: Vec<&str> = table.lines().collect();
        let header: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(
            header[3..7],
            ["ok", "errors", "rejected", "late"],
            "{table}"
        );
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        // The label "#0 c=64" is two words.
        assert_eq!(row[4..9], ["90", "8", "12", "(0.2/s)", "1"], "{table}");
        assert!(lines[1].ends_with("interrupted"), "{table}");
        assert!(
            table.contains("#0 c=64: 6 of its 8 errors were the client's own")
                && table.contains("the client is the cause"),
            "{table}"
        );
        assert!(
            table.contains(
                "#1 c=4096: the client is falling behind: it read responses up to 25 ms after \
                 they arrived (p99), 25% of a request's E2E p50 (100 ms)"
            ) && table.contains("use more workers or cores"),
            "{table}"
        );
    }

    #[test]
    fn search_stages_are_named_as_such() {
        let search = StageResult {
            index: 3,
            label: "#3 c=18".into(),
            search: Some(nyann_load::SearchStage { refines: 1 }),
            ..measured("#3 c=18", ClientStats::default())
        };
        let table = stage_table(&run(
            RunOutcome::Completed,
            vec![measured("#0 c=4", ClientStats::default()), search],
        ));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("#0 c=4 "), "{table}");
        assert!(lines[2].starts_with("#3 c=18 (search)"), "{table}");
    }

    #[test]
    fn judged_stage_shows_server_columns_and_the_congested_mark() {
        let mut record = judged(
            vec![role("prefill", 40.0, 0.5), role("decode", 2.0, 0.98)],
            vec![],
        );
        record.signal_errors = vec!["decode: preemptions: timeout".into()];
        let (row, table) = judged_table(record);
        assert!(row.contains("CONGESTED"), "{row}");
        // Largest value across roles: waiting from prefill, KV from decode;
        // preemptions rounded (Prometheus' increase() extrapolates).
        assert!(
            row.contains("250/2500") && row.contains("  40  ") && row.contains("98.0%"),
            "{row}"
        );
        assert!(row.contains("  28  ") && !row.contains("27.9"), "{row}");
        assert!(row.contains("congested*"), "{row}");
        assert!(table.contains("largest value across roles"));
        assert!(!table.contains("no data"), "{table}");
    }

    #[test]
    fn signals_without_series_read_no_data_not_zero() {
        let entry = |signal: &str, status: SeriesStatus, lower_bound: bool| SignalCoverage {
            signal: signal.into(),
            status,
            metric: None,
            lower_bound,
        };
        use nyann_model::SeriesStatus::{self, Found, Missing};
        let coverage = vec![
            RoleCoverage {
                role: "prefill".into(),
                signals: vec![
                    entry("waiting_requests_p50", Missing, false),
                    entry("ttft_p99_seconds", Missing, false),
                    entry("kv_cache_usage_max", Missing, false),
                    entry("preemptions", Missing, false),
                ],
            },
            RoleCoverage {
                role: "decode".into(),
                signals: vec![
                    entry("waiting_requests_p50", Found, false),
                    entry("ttft_p99_seconds", Found, true),
                    entry("kv_cache_usage_max", Found, false),
                    entry("preemptions", Missing, false),
                ],
            },
        ];
        let mut roles = vec![role("prefill", 0.0, 0.0), role("decode", 2.0, 0.5)];
        roles[0].ttft_p99_seconds = 0.0;
        let (row, table) = judged_table(judged(roles, coverage));
        // Prefill's zeros are not shown as measured; decode's values are.
        assert!(
            row.contains("250/>=2500") && row.contains("  2  ") && row.contains("50.0%"),
            "{row}"
        );
        assert!(row.trim_end().ends_with("no data  congested"), "{row}");
        assert!(
            table.contains("no data: no series of that signal on any role"),
            "{table}"
        );
        assert!(
            table.contains(">=: a lower bound: the quantile lies beyond"),
            "{table}"
        );
    }
}
