//! The fleet's results, written by the leader once every worker uploaded
//! (or was lost): one `requests.jsonl` with a `worker` field on each
//! record, `stages.json`/`summary.json` whose statistics are recomputed
//! from all the records (so fleet counts are the sum of the records by
//! construction) with each stage's per-worker figures under
//! `annotation.fleet.workers`, and `fleet.json` (lost workers, missing
//! uploads, how long each worker waited for each decision).

use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use nyann_load::stats::StageAccumulator;
use nyann_load::{Phase, RequestRecord, RunOutcome, RunResult, StageStatus};
use nyann_model::{Scenario, Step};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// One worker's finished run, as the leader has it.
#[derive(Debug, Clone)]
pub struct WorkerRun {
    pub worker: usize,
    pub result: RunResult,
    /// Its `requests.jsonl` on the leader's disk (none without an output dir).
    pub records: Option<PathBuf>,
    /// `(step, seconds)`: from sending a stage's statistics to the decision.
    pub decision_waits: Vec<(usize, f64)>,
}

/// A worker that stopped answering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LostWorker {
    pub worker: usize,
    /// The step that was running (or last started) when it was lost.
    pub step: usize,
    pub reason: String,
    pub at_unix: f64,
}

/// Everything the leader gathered.
#[derive(Debug, Clone)]
pub struct FleetRun {
    pub workers: usize,
    /// The leader's seed (each worker's is derived from it).
    pub seed: u64,
    /// Worker 0 (the leader) and every worker that uploaded, by index.
    pub runs: Vec<WorkerRun>,
    pub lost: Vec<LostWorker>,
    /// Workers still connected but without an upload when the wait ended.
    pub missing: Vec<usize>,
    pub aborted: Option<String>,
}

/// `fleet.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct FleetFile {
    pub workers: usize,
    pub seed: u64,
    pub uploaded: Vec<usize>,
    pub lost: Vec<LostWorker>,
    /// Workers whose records are not here: they stay on that worker's disk
    /// (its `--output-dir`).
    pub missing_records: Vec<usize>,
    pub aborted: Option<String>,
    /// Per worker: `[step, seconds]` from its statistics sent to the decision received.
    pub decision_waits: Vec<(usize, Vec<(usize, f64)>)>,
}

/// Merges `fleet` into `dir` and returns the fleet's result.
pub fn write(fleet: &FleetRun, scenario: &Scenario, dir: &Path) -> std::io::Result<RunResult> {
    let Some(leader) = fleet.runs.iter().find(|r| r.worker == 0) else {
        return Err(std::io::Error::other("the leader's own run is missing"));
    };
    let mut result = leader.result.clone();
    let mut accs: Vec<Option<StageAccumulator>> = vec![None; result.stages.len()];
    let mut out = BufWriter::new(std::fs::File::create(dir.join("requests.jsonl"))?);
    let mut lines = 0u64;
    for run in &fleet.runs {
        let Some(path) = &run.records else { continue };
        let file = std::io::BufReader::new(std::fs::File::open(path)?);
        for line in file.lines() {
            let line = line?;
            let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(&line) else {
                tracing::warn!("{}: skipping an unreadable record", path.display());
                continue;
            };
            fields.insert("worker".into(), json!(run.worker));
            let record = Value::Object(fields);
            if let Ok(r) = serde_json::from_value::<RequestRecord>(record.clone())
                && r.phase != Phase::Hold
                && let Some(acc) = accs.get_mut(r.stage)
            {
                acc.get_or_insert_with(StageAccumulator::new).add(&r);
            }
            serde_json::to_writer(&mut out, &record)?;
            out.write_all(b"\n")?;
            lines += 1;
        }
    }
    out.flush()?;

    let mut totals = StageAccumulator::new();
    let mut measured_seconds = 0.0;
    for stage in &mut result.stages {
        // The fleet's level, not worker 0's share.
        if let Some(Step::Stage(s)) = scenario.steps.get(stage.index) {
            stage.label = s.label(stage.index);
            stage.concurrency = s.concurrency;
            stage.rate = s.rate;
        }
        let ran = matches!(
            stage.status,
            StageStatus::Measured | StageStatus::Warmup | StageStatus::Interrupted
        );
        if !ran {
            continue;
        }
        let duration = match (stage.start_unix, stage.end_unix) {
            (Some(s), Some(e)) => e - s,
            _ => 0.0,
        };
        let acc = accs[stage.index].take().unwrap_or_default();
        let (client, detail) = acc.finish(duration);
        if stage.status != StageStatus::Warmup {
            totals.merge(&acc);
            measured_seconds += duration;
        }
        stage.client = Some(client);
        stage.detail = Some(detail);
        let per_worker: Vec<Value> = fleet
            .runs
            .iter()
            .filter_map(|run| {
                let theirs = run.result.stages.get(stage.index)?;
                Some(json!({
                    "worker": run.worker,
                    "status": theirs.status,
                    "client": theirs.client,
                    "detail": theirs.detail,
                }))
            })
            .collect();
        let lost: Vec<&LostWorker> = fleet
            .lost
            .iter()
            .filter(|l| l.step == stage.index)
            .collect();
        let mut annotation = stage.annotation.take().unwrap_or_else(|| json!({}));
        if let Some(fields) = annotation.as_object_mut() {
            let entry = fields.entry("fleet").or_insert_with(|| json!({}));
            if let Some(entry) = entry.as_object_mut() {
                entry.insert("workers".into(), json!(per_worker));
                if !lost.is_empty() {
                    entry.insert("lost".into(), json!(lost));
                }
            }
        }
        stage.annotation = Some(annotation);
    }
    let (totals, totals_detail) = totals.finish(measured_seconds);
    result.totals = totals;
    result.totals_detail = totals_detail;
    result.requests_recorded = lines;
    result.seed = fleet.seed;
    for run in &fleet.runs {
        for m in &run.result.models {
            if !result.models.contains(m) {
                result.models.push(m.clone());
            }
        }
        for t in &run.result.targets {
            if !result.targets.contains(t) {
                result.targets.push(t.clone());
            }
        }
    }
    if let Some(reason) = &fleet.aborted {
        result.outcome = RunOutcome::Aborted {
            reason: reason.clone(),
        };
    }
    result.write_files(dir)?;

    let file = FleetFile {
        workers: fleet.workers,
        seed: fleet.seed,
        uploaded: fleet.runs.iter().map(|r| r.worker).collect(),
        lost: fleet.lost.clone(),
        missing_records: (0..fleet.workers)
            .filter(|w| {
                !fleet
                    .runs
                    .iter()
                    .any(|r| r.worker == *w && r.records.is_some())
            })
            .collect(),
        aborted: fleet.aborted.clone(),
        decision_waits: fleet
            .runs
            .iter()
            .filter(|r| r.worker != 0)
            .map(|r| (r.worker, r.decision_waits.clone()))
            .collect(),
    };
    let json = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("fleet.json"), json)?;
    Ok(result)
}
