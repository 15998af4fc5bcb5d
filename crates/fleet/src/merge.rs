//! The fleet's results, written by the leader once every worker uploaded
//! (or was lost): one `requests.jsonl` with a `worker` field on each
//! record, `stages.json`/`summary.json` whose statistics are recomputed
//! from all the records (so fleet counts are the sum of the records by
//! construction) with the fleet's part of each stage under
//! `annotation.fleet` (the workers judged, the per-worker figures, workers
//! lost or gone in that stage), and `fleet.json` (lost and departed
//! workers, missing records, how long each worker waited for each decision).
//!
//! A stage that not every worker ran whole records the level that ran (the
//! sum of the shares of the workers that did) with the configured one
//! beside it, and a run with such stages, or with records missing, ends
//! `degraded`: never `completed` with load it did not send.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use nyann_load::stats::StageAccumulator;
use nyann_load::{
    DegradedStage, Phase, RequestRecord, RunOutcome, RunResult, StageResult, StageStatus,
};
use nyann_model::{Scenario, Step};
use nyann_results::{RecordError, Records};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::leader::level_of;

/// Records of a worker on the leader's disk: the first `bytes` of `path`.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordsFile {
    pub path: PathBuf,
    pub bytes: u64,
}

/// One of workers 1..N's finished run, as the leader has it (workers
/// judge nothing: their results carry no annotation).
#[derive(Debug, Clone)]
pub struct WorkerRun {
    pub worker: usize,
    pub result: RunResult,
    /// Its records on the leader's disk (none without an output dir, or
    /// when the upload failed: `records_error` says why).
    pub records: Option<RecordsFile>,
    pub records_error: Option<String>,
    /// `(step, seconds)`: from sending a stage's statistics to the decision.
    pub decision_waits: Vec<(usize, f64)>,
}

/// A worker that stopped answering, or (`left`) that said it leaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LostWorker {
    pub worker: usize,
    /// The step that was running (or last started) when it was lost.
    pub step: usize,
    pub reason: String,
    pub at_unix: f64,
    /// It left (its own Ctrl-C/SIGTERM) instead of going silent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub left: bool,
}

/// How much of the fleet a stage's decision saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Judgement {
    /// The workers whose statistics were merged (0 is the leader).
    pub judged_workers: Vec<usize>,
    pub requests_judged: u64,
}

/// One worker's part of a stage, in the fleet's `stages.json`.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
pub struct StageFleet {
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub judgement: Option<Judgement>,
    pub workers: Vec<WorkerStage>,
    /// Workers lost in this step.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<LostWorker>,
    /// Workers that left in this step (their own Ctrl-C/SIGTERM).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<LostWorker>,
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
    /// Every other worker whose result arrived (with or without its
    /// records), by index.
    pub runs: Vec<WorkerRun>,
    /// What each judged step's decision saw.
    pub judgements: BTreeMap<usize, Judgement>,
    /// Workers lost or gone, in order.
    pub departed: Vec<LostWorker>,
    /// Workers of which nothing arrived at the end.
    pub missing: Vec<usize>,
    pub aborted: Option<String>,
    /// Per step that started: the workers that ran it whole (0 included).
    pub presence: BTreeMap<usize, Vec<usize>>,
    /// Each worker's share of the scenario.
    pub shares: Vec<Scenario>,
    /// The fleet's scenario, its capacity-search stages (the fleet's
    /// levels) after the steps, as in `shares`.
    pub scenario: Scenario,
}

/// Why a worker's records are not in the merged results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MissingRecords {
    pub worker: usize,
    pub reason: String,
}

/// `fleet.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct FleetFile {
    pub workers: usize,
    pub seed: u64,
    /// Workers whose records are in the merged results.
    pub uploaded: Vec<usize>,
    pub lost: Vec<LostWorker>,
    /// Workers that left (their own Ctrl-C or SIGTERM, e.g. a pod eviction).
    #[serde(default)]
    pub left: Vec<LostWorker>,
    /// Workers whose records are not here: they stay on that worker's disk
    /// (`worker-I/` in its results directory).
    pub missing_records: Vec<usize>,
    /// Why each of them is missing.
    #[serde(default)]
    pub missing_records_reasons: Vec<MissingRecords>,
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

/// Merges `fleet` into `dir` and returns the fleet's result. A records
/// file that cannot be read is named as missing; it fails nothing else.
pub fn write<A: Serialize + Clone>(fleet: &FleetRun<A>, dir: &Path) -> std::io::Result<Merged<A>> {
    let mut result = fleet.leader.clone();
    let records = merge_records(fleet, result.stages.len(), dir)?;
    let mut fleet_stages = fleet_statistics(fleet, &mut result, records.stages);
    result.requests_recorded = records.lines;
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
    degrade_outcome(&mut result, fleet, &records.missing);
    let summary = result.clone().map_annotations(|index, check| {
        let fleet = fleet_stages.get_mut(index).map(std::mem::take);
        Some(FleetAnnotation {
            check,
            fleet: fleet.unwrap_or_default(),
        })
    });
    summary.write_files(dir)?;
    let json = serde_json::to_vec_pretty(&fleet_file(fleet, records.missing))
        .map_err(std::io::Error::other)?;
    std::fs::write(dir.join("fleet.json"), json)?;
    Ok(Merged { result, summary })
}

/// The fleet's records, gathered into one file.
struct MergedRecords {
    /// Per stage, the statistics of its records (`None`: no record).
    stages: Vec<Option<StageAccumulator>>,
    /// Records written.
    lines: u64,
    /// The workers whose records are not in the file, and why.
    missing: Vec<MissingRecords>,
}

/// Writes every worker's records (the leader's first) into `dir`'s
/// `requests.jsonl`, each tagged with its worker, and accumulates the
/// statistics of each of the `stages` from them.
fn merge_records<A>(
    fleet: &FleetRun<A>,
    stages: usize,
    dir: &Path,
) -> std::io::Result<MergedRecords> {
    let mut accs: Vec<Option<StageAccumulator>> = vec![None; stages];
    let mut out = BufWriter::new(std::fs::File::create(dir.join(nyann_results::REQUESTS))?);
    let mut lines = 0u64;
    let mut missing: Vec<MissingRecords> = fleet
        .missing
        .iter()
        .map(|&worker| MissingRecords {
            worker,
            reason: "nothing arrived from it at the end of the run".into(),
        })
        .collect();
    let leader_records = fleet.leader_records.as_ref().map(|path| {
        let bytes = std::fs::metadata(path).map_or(u64::MAX, |m| m.len());
        RecordsFile {
            path: path.clone(),
            bytes,
        }
    });
    let record_files =
        std::iter::once((0, leader_records.as_ref(), None)).chain(fleet.runs.iter().map(|run| {
            (
                run.worker,
                run.records.as_ref(),
                run.records_error.as_deref(),
            )
        }));
    for (worker, records, error) in record_files {
        let Some(records) = records else {
            if let Some(error) = error {
                missing.push(MissingRecords {
                    worker,
                    reason: format!("its upload failed: {error}"),
                });
            }
            continue;
        };
        // Only what the worker declared: a file still growing adds nothing.
        let read = match Records::<Value>::open(&records.path, records.bytes) {
            Ok(read) => read,
            Err(err) => {
                missing.push(MissingRecords {
                    worker,
                    reason: format!("{} cannot be read: {err}", records.path.display()),
                });
                continue;
            }
        };
        for record in read {
            let mut fields = match record {
                Ok(Value::Object(fields)) => fields,
                Err(err @ RecordError::Io { .. }) => {
                    tracing::warn!("{err}");
                    break;
                }
                Ok(_) | Err(RecordError::Line { .. }) => {
                    tracing::warn!("{}: skipping an unreadable record", records.path.display());
                    continue;
                }
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
    missing.sort_by_key(|m| m.worker);
    Ok(MergedRecords {
        stages: accs,
        lines,
        missing,
    })
}

/// Gives every stage of `result` (the leader's) the fleet's level and the
/// statistics of the fleet's records (`accs`), and the run its totals;
/// returns each stage's fleet part (its workers, judgement and
/// departures). A stage some workers missed is marked degraded.
fn fleet_statistics<A>(
    fleet: &FleetRun<A>,
    result: &mut RunResult<A>,
    mut accs: Vec<Option<StageAccumulator>>,
) -> Vec<StageFleet> {
    let mut totals = StageAccumulator::new();
    let mut measured_seconds = 0.0;
    let mut fleet_stages = vec![StageFleet::default(); result.stages.len()];
    for stage in &mut result.stages {
        // The fleet's level, not worker 0's share.
        if let Some(Step::Stage(s)) = fleet.scenario.steps.get(stage.index) {
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
        if let Some(present) = fleet.presence.get(&stage.index)
            && present.len() < fleet.workers
        {
            degrade(stage, present, fleet);
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
        let in_step = |left: bool| {
            fleet
                .departed
                .iter()
                .filter(|l| l.step == stage.index && l.left == left)
                .cloned()
                .collect()
        };
        fleet_stages[stage.index] = StageFleet {
            judgement: fleet.judgements.get(&stage.index).cloned(),
            workers: leader
                .map(|own| WorkerStage::of(0, own))
                .into_iter()
                .chain(others)
                .collect(),
            lost: in_step(false),
            left: in_step(true),
        };
    }
    let (totals, totals_detail) = totals.finish(measured_seconds);
    result.totals = totals;
    result.totals_detail = totals_detail;
    fleet_stages
}

/// A run that lost load (a stage below its level) or records ends
/// `degraded`, with every reason; an abort or an interrupt says more, and
/// stays.
fn degrade_outcome<A>(result: &mut RunResult<A>, fleet: &FleetRun<A>, missing: &[MissingRecords]) {
    let degraded_stages: Vec<String> = result
        .stages
        .iter()
        .filter(|s| s.degraded.is_some())
        .map(|s| s.label.clone())
        .collect();
    if degraded_stages.is_empty() && missing.is_empty() {
        return;
    }
    let mut reasons: Vec<String> = fleet.departed.iter().map(departure).collect();
    if !degraded_stages.is_empty() {
        reasons.push(format!(
            "{} stage(s) ran below their configured level: {}",
            degraded_stages.len(),
            degraded_stages.join(", ")
        ));
    }
    for m in missing {
        reasons.push(format!(
            "the records of worker {} are missing ({}); they stay in its results directory, worker-{}/",
            m.worker, m.reason, m.worker
        ));
    }
    let missing_records = missing.iter().map(|m| m.worker).collect();
    result.outcome = match std::mem::replace(&mut result.outcome, RunOutcome::Interrupted) {
        RunOutcome::Completed => RunOutcome::Degraded {
            reasons,
            missing_records,
            stage: None,
            reason: None,
        },
        RunOutcome::Stopped { stage, reason } => RunOutcome::Degraded {
            reasons,
            missing_records,
            stage: Some(stage),
            reason: Some(reason),
        },
        other => other,
    };
}

/// `fleet.json`: who ran, who uploaded, who was lost or left, and why.
fn fleet_file<A>(fleet: &FleetRun<A>, missing: Vec<MissingRecords>) -> FleetFile {
    let missing_workers: Vec<usize> = missing.iter().map(|m| m.worker).collect();
    FleetFile {
        workers: fleet.workers,
        seed: fleet.seed,
        uploaded: (0..fleet.workers)
            .filter(|w| !missing_workers.contains(w))
            .collect(),
        lost: fleet.departed.iter().filter(|d| !d.left).cloned().collect(),
        left: fleet.departed.iter().filter(|d| d.left).cloned().collect(),
        missing_records: missing_workers,
        missing_records_reasons: missing,
        aborted: fleet.aborted.clone(),
        decision_waits: fleet
            .runs
            .iter()
            .map(|r| (r.worker, r.decision_waits.clone()))
            .collect(),
    }
}

/// A departure in words.
fn departure(d: &LostWorker) -> String {
    format!(
        "worker {} {} in step {} ({})",
        d.worker,
        if d.left { "left" } else { "was lost" },
        d.step,
        d.reason
    )
}

/// Marks `stage` as run by `present` only: its level becomes the sum of
/// their shares, the configured one is kept beside it.
fn degrade<A, B>(stage: &mut StageResult<A>, present: &[usize], fleet: &FleetRun<B>) {
    let (concurrency, rate) = level_of(&fleet.shares, present, stage.index);
    let absent: Vec<String> = (0..fleet.workers)
        .filter(|w| !present.contains(w))
        .map(|w| {
            fleet
                .departed
                .iter()
                .find(|d| d.worker == w)
                .map_or_else(|| format!("worker {w} was gone"), departure)
        })
        .collect();
    stage.degraded = Some(DegradedStage {
        configured_concurrency: stage.concurrency,
        configured_rate: stage.rate,
        workers: present.to_vec(),
        reason: absent.join("; "),
    });
    stage.concurrency = concurrency;
    stage.rate = rate;
}
