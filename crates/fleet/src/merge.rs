//! The fleet's results, written by the leader once every worker uploaded
//! (or was lost): one `requests.jsonl` with a `worker` field on each
//! record, `stages.json`/`summary.json` whose statistics are recomputed
//! from all the records (so fleet counts are the sum of the records by
//! construction) with the fleet's part of each stage under
//! `annotation.fleet` (the workers judged, the per-worker figures, workers
//! lost in that stage), and `fleet.json` (lost workers, missing uploads,
//! how long each worker waited for each decision).

use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};

use nyann_load::stats::StageAccumulator;
use nyann_load::{Phase, RequestRecord, RunOutcome, RunResult, StageResult, StageStatus};
use nyann_model::{Scenario, Step};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// One of workers 1..N's finished run, as the leader has it (workers
/// judge nothing: their results carry no annotation).
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

/// How much of the fleet a stage's decision saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// The workers whose statistics were merged (0 is the leader).
    pub judged_workers: Vec<usize>,
    pub requests_judged: u64,
}

/// One worker's part of a stage, in the fleet's `stages.json`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerStage {
    pub worker: usize,
    pub status: StageStatus,
    pub client: Option<nyann_model::ClientStats>,
    pub detail: Option<nyann_load::StageDetail>,
}

impl WorkerStage {
    fn of<A>(worker: usize, stage: &StageResult<A>) -> Self {
        WorkerStage {
            worker,
            status: stage.status,
            client: stage.client.clone(),
            detail: stage.detail.clone(),
        }
    }
}

/// The fleet's part of a stage (`annotation.fleet` in `stages.json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageFleet {
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub judgement: Option<Judgement>,
    pub workers: Vec<WorkerStage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<LostWorker>,
}

/// A stage's annotation in the fleet's files: the check's own record,
/// shaped as a single process writes it, with `fleet` beside it.
#[derive(Debug, Serialize)]
pub struct FleetAnnotation<A> {
    #[serde(flatten)]
    check: Option<A>,
    fleet: StageFleet,
}

/// Everything the leader gathered (`A`: what the check recorded).
#[derive(Debug, Clone)]
pub struct FleetRun<A> {
    pub workers: usize,
    /// The leader's seed (each worker's is derived from it).
    pub seed: u64,
    /// The leader's own run (worker 0) and its records.
    pub leader: RunResult<A>,
    pub leader_records: Option<PathBuf>,
    /// Every other worker that uploaded, by index.
    pub runs: Vec<WorkerRun>,
    /// What each judged step's decision saw.
    pub judgements: std::collections::BTreeMap<usize, Judgement>,
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

/// The fleet's result, as [`write`] made it.
#[derive(Debug)]
pub struct Merged<A> {
    /// With the check's records as the leader made them: what the stage
    /// table and the exit code read.
    pub result: RunResult<A>,
    /// As written to `summary.json`: each stage's annotation adds `fleet`.
    pub summary: RunResult<FleetAnnotation<A>>,
}

/// Merges `fleet` into `dir` and returns the fleet's result.
pub fn write<A: Serialize + Clone>(
    fleet: &FleetRun<A>,
    scenario: &Scenario,
    dir: &Path,
) -> std::io::Result<Merged<A>> {
    let mut result = fleet.leader.clone();
    let mut accs: Vec<Option<StageAccumulator>> = vec![None; result.stages.len()];
    let mut out = BufWriter::new(std::fs::File::create(dir.join("requests.jsonl"))?);
    let mut lines = 0u64;
    let record_files = std::iter::once((0, &fleet.leader_records))
        .chain(fleet.runs.iter().map(|run| (run.worker, &run.records)));
    for (worker, records) in record_files {
        let Some(path) = records else { continue };
        let file = std::io::BufReader::new(std::fs::File::open(path)?);
        for line in file.lines() {
            let line = line?;
            let Ok(Value::Object(mut fields)) = serde_json::from_str::<Value>(&line) else {
                tracing::warn!("{}: skipping an unreadable record", path.display());
                continue;
            };
            fields.insert("worker".into(), json!(worker));
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
    let mut fleet_stages = vec![StageFleet::default(); result.stages.len()];
    for stage in &mut result.stages {
        // The fleet's level, not worker 0's share.
        if let Some(Step::Stage(s)) = scenario.steps.get(stage.index) {
            stage.label = s.label(stage.index);
            stage.name = s.name.clone();
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
        let leader = fleet.leader.stages.get(stage.index);
        let others = fleet.runs.iter().filter_map(|run| {
            let theirs = run.result.stages.get(stage.index)?;
            Some(WorkerStage::of(run.worker, theirs))
        });
        fleet_stages[stage.index] = StageFleet {
            judgement: fleet.judgements.get(&stage.index).cloned(),
            workers: leader
                .map(|own| WorkerStage::of(0, own))
                .into_iter()
                .chain(others)
                .collect(),
            lost: fleet
                .lost
                .iter()
                .filter(|l| l.step == stage.index)
                .cloned()
                .collect(),
        };
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
    let summary = result.clone().map_annotations(|index, check| {
        let fleet = fleet_stages.get_mut(index).map(std::mem::take);
        Some(FleetAnnotation {
            check,
            fleet: fleet.unwrap_or_default(),
        })
    });
    summary.write_files(dir)?;

    let uploaded = std::iter::once(0).chain(fleet.runs.iter().map(|r| r.worker));
    let file = FleetFile {
        workers: fleet.workers,
        seed: fleet.seed,
        uploaded: uploaded.collect(),
        lost: fleet.lost.clone(),
        missing_records: (0..fleet.workers)
            .filter(|&w| {
                let records = match w {
                    0 => fleet.leader_records.is_some(),
                    _ => fleet
                        .runs
                        .iter()
                        .any(|r| r.worker == w && r.records.is_some()),
                };
                !records
            })
            .collect(),
        aborted: fleet.aborted.clone(),
        decision_waits: fleet
            .runs
            .iter()
            .map(|r| (r.worker, r.decision_waits.clone()))
            .collect(),
    };
    let json = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("fleet.json"), json)?;
    Ok(Merged { result, summary })
}
