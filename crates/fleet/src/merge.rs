//! The fleet's results, written by the leader once every worker uploaded
//! (or was lost): one `requests.jsonl` with a `worker` field on each
//! record, `stages.json`/`summary.json` whose statistics are recomputed
//! from all the records (so fleet counts are the sum of the records by
//! construction) with the fleet's part of each stage under
//! `annotation.fleet` (the workers judged, the per-worker figures, workers
//! lost or gone in that stage), and `fleet.json` (lost and departed
//! workers, missing records, how long each worker waited for each decision).
//! The records are streamed (one line in memory): each copied as the
//! worker wrote it with its `worker` field added, and parsed once for the
//! statistics.
//!
//! A stage that not every worker ran whole records the level that ran (the
//! sum of the shares of the workers that did) with the configured one
//! beside it, and a run with such stages, or with records missing, ends
//! `degraded`: never `completed` with load it did not send.

use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use nyann_load::stats::StageAccumulator;
use nyann_load::{
    DegradedStage, Phase, RequestRecord, RunOutcome, RunResult, StageResult, StageStatus,
};
use nyann_model::{Scenario, Step};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::share::level_of;

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

/// The fleet's result, as [`write()`] made it.
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
        let file = match std::fs::File::open(&records.path) {
            Ok(file) => file,
            Err(err) => {
                missing.push(MissingRecords {
                    worker,
                    reason: format!("{} cannot be read: {err}", records.path.display()),
                });
                continue;
            }
        };
        let mut copy = Copy {
            worker,
            out: &mut out,
            accs: &mut accs,
            lines: 0,
            skipped: 0,
            first_skipped: None,
            line: 0,
        };
        let read = copy.records(file.take(records.bytes));
        let (copied, skipped, first_skipped) = (copy.lines, copy.skipped, copy.first_skipped);
        lines += copied;
        match read {
            Ok(()) => {}
            // The records before it are merged; what follows cannot be read.
            Err(CopyError::Read(err)) => {
                tracing::warn!("cannot read {}: {err}", records.path.display());
            }
            Err(CopyError::Write(err)) => return Err(err),
        }
        if let Some(first) = first_skipped {
            tracing::warn!(
                "{}: skipped {skipped} line(s) that are no record (cut short by a crash, or not \
                 nyann-bench's), the first at line {first}; {copied} record(s) merged",
                records.path.display()
            );
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

/// A records file could not be read, or the merged one not written.
enum CopyError {
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Copies one worker's records into the merged file, line by line.
///
/// A line as nyann-bench writes it (a JSON object, no `worker` field) is
/// copied as bytes with `,"worker":I` before its closing brace: the
/// fields keep the worker's order, the `worker` field last (as
/// `docs/schema/request.schema.json` lists it). It is parsed once, as a
/// [`RequestRecord`], for the stage statistics. Any other object (one
/// that already holds a `worker` field, or no record at all) goes the
/// general way: parsed as JSON, `worker` set, written again. A line that
/// is no JSON object (cut short by a crash, not UTF-8) is skipped and
/// counted; the next one is read as usual. Memory holds one line.
struct Copy<'a, W> {
    worker: usize,
    out: &'a mut W,
    accs: &'a mut [Option<StageAccumulator>],
    /// Records written.
    lines: u64,
    /// Lines skipped (blank ones aside), and the number of the first.
    skipped: u64,
    first_skipped: Option<u64>,
    /// The number of the line read last.
    line: u64,
}

impl<W: Write> Copy<'_, W> {
    fn records(&mut self, file: impl std::io::Read) -> Result<(), CopyError> {
        let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
        let mut line = Vec::new();
        // `"worker"` as bytes, or a `\u` escape that could spell it: a line
        // with neither holds no `worker` field, and needs no closer look.
        let worker_key = memchr::memmem::Finder::new(b"\"worker\"");
        let escape = memchr::memmem::Finder::new(b"\\u");
        let tag = format!(",\"worker\":{}}}\n", self.worker);
        loop {
            line.clear();
            if reader
                .read_until(b'\n', &mut line)
                .map_err(CopyError::Read)?
                == 0
            {
                return Ok(());
            }
            self.line += 1;
            let body = trim_json_whitespace(&line);
            if body.is_empty() {
                continue;
            }
            let object = body.first() == Some(&b'{') && body.last() == Some(&b'}');
            if object
                && let Ok(record) = serde_json::from_slice::<RequestRecord>(body)
                && ((worker_key.find(body).is_none() && escape.find(body).is_none())
                    || !names_a_worker(body))
            {
                self.count(&record);
                let (head, _brace) = body.split_at(body.len() - 1);
                self.out.write_all(head).map_err(CopyError::Write)?;
                self.out
                    .write_all(tag.as_bytes())
                    .map_err(CopyError::Write)?;
                self.lines += 1;
                continue;
            }
            self.general(body)?;
        }
    }

    /// A line that may already name a worker, or be no record: parsed,
    /// tagged and written again (the object's fields in name order).
    fn general(&mut self, body: &[u8]) -> Result<(), CopyError> {
        let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
            self.skipped += 1;
            self.first_skipped.get_or_insert(self.line);
            return Ok(());
        };
        fields.insert("worker".into(), json!(self.worker));
        let record = Value::Object(fields);
        if let Ok(r) = RequestRecord::deserialize(&record) {
            self.count(&r);
        }
        serde_json::to_writer(&mut *self.out, &record)
            .map_err(|err| CopyError::Write(err.into()))?;
        self.out.write_all(b"\n").map_err(CopyError::Write)?;
        self.lines += 1;
        Ok(())
    }

    /// Adds a record to its stage's statistics (held load counts nowhere).
    fn count(&mut self, record: &RequestRecord) {
        if record.phase != Phase::Hold
            && let Some(acc) = self.accs.get_mut(record.stage)
        {
            acc.get_or_insert_with(StageAccumulator::new).add(record);
        }
    }
}

/// The JSON object `line` has a `worker` field (however it is escaped),
/// or more than one.
fn names_a_worker(line: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Tagged {
        worker: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Tagged>(line).map_or(true, |t| t.worker.is_some())
}

/// `line` without the JSON whitespace (space, tab, CR, LF) around it.
fn trim_json_whitespace(line: &[u8]) -> &[u8] {
    let blank = |b: &u8| matches!(b, b' ' | b'\t' | b'\r' | b'\n');
    let start = line.iter().position(|b| !blank(b)).unwrap_or(line.len());
    let end = line
        .iter()
        .rposition(|b| !blank(b))
        .map_or(start, |i| i + 1);
    &line[start..end]
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
        // A stage is degraded when the workers that ran it ran less than
        // the fleet's level: not when the absent ones had no share of it
        // (a capacity search's stage set up after a worker left).
        if let Some(present) = fleet.presence.get(&stage.index)
            && present.len() < fleet.workers
            && level_of(&fleet.shares, present, stage.index) != (stage.concurrency, stage.rate)
        {
            degrade(stage, present, fleet);
        }
        let duration = match (stage.start_unix, stage.end_unix) {
            (Some(s), Some(e)) => e - s,
            _ => 0.0,
        };
        let mut acc = accs[stage.index].take().unwrap_or_default();
        // The goals the records were judged by: the stage's, or for a
        // capacity-search stage those of the stage it is shaped like.
        let step = stage.search.as_ref().map_or(stage.index, |s| s.refines);
        if let Some(Step::Stage(s)) = fleet.scenario.steps.get(step)
            && let Some(goals) = s.slo
        {
            acc.judged_by(goals);
        }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use nyann_load::Status;

    /// A run of one measured stage, as a worker uploads it.
    fn result() -> RunResult {
        serde_json::from_value(json!({
            "outcome": {"kind": "completed"},
            "start_unix": 0.0, "end_unix": 10.0, "seed": 1, "models": [], "targets": [],
            "totals": nyann_model::ClientStats::default(),
            "totals_detail": nyann_load::StageDetail::default(),
            "requests_recorded": 0,
            "stages": [{
                "index": 0, "label": "#0 c=2", "name": null, "status": "measured",
                "mode": "concurrent", "concurrency": 2, "rate": null, "duration_s": 10.0,
                "start_unix": 0.0, "end_unix": 10.0, "client": null, "detail": null,
                "annotation": null, "skip_reason": null,
            }],
        }))
        .unwrap()
    }

    /// A record line as a worker writes it (the fields in the order of
    /// `RequestRecord`).
    fn record(id: u64, status: Status) -> String {
        let ok = status == Status::Ok;
        let record = RequestRecord {
            id,
            conversation: id,
            turn: 1,
            stage: 0,
            phase: Phase::Measured,
            status,
            scheduled_at: None,
            sent_at: Some(1.0 + id as f64 / 8.0),
            first_token_at: ok.then_some(1.25 + id as f64 / 8.0),
            end_at: Some(2.0 + id as f64 / 8.0),
            ttft_s: ok.then_some(0.25),
            e2e_s: ok.then_some(1.0),
            itl_s: if ok { vec![0.0, 0.001_234_567] } else { vec![] },
            chunk_tokens: vec![],
            prompt_tokens: None,
            cached_tokens: None,
            output_tokens: ok.then_some(3),
            output_tokens_source: None,
            prompt_chars: 12,
            finish_reason: ok.then(|| "length".into()),
            response_id: ok.then(|| format!("chatcmpl-{id} é \"quoted\"")),
            http_status: Some(if ok { 200 } else { 500 }),
            error: (!ok).then(|| "HTTP 500: {\"error\": \"worker\\u0000\"}".into()),
            client_lag_s: None,
            resent: false,
            client_error: false,
            eval_expected: None,
            eval_extracted: None,
            eval_correct: None,
            tpot_s: None,
            slo_met: None,
            slo_missed: Vec::new(),
        };
        serde_json::to_string(&record).unwrap()
    }

    /// `contents[i]`: worker i's records file (`None`: its upload failed).
    fn fleet(dir: &Path, contents: &[Option<&[u8]>]) -> FleetRun<Value> {
        let scenario = Scenario {
            target: None,
            model: None,
            workload: nyann_model::Workload::default(),
            steps: vec![Step::Stage(nyann_model::Stage {
                concurrency: Some(2),
                ..nyann_model::Stage::new(10.0, nyann_model::Mode::Concurrent)
            })],
        };
        let mut paths = Vec::new();
        for (worker, content) in contents.iter().enumerate() {
            let path = dir.join(format!("worker-{worker}.jsonl"));
            if let Some(content) = content {
                std::fs::write(&path, content).unwrap();
            }
            paths.push(path);
        }
        let runs = (1..contents.len())
            .map(|worker| WorkerRun {
                worker,
                result: result(),
                records: contents[worker].map(|c| RecordsFile {
                    path: paths[worker].clone(),
                    bytes: c.len() as u64,
                }),
                records_error: contents[worker]
                    .is_none()
                    .then(|| "the connection closed".into()),
                decision_waits: vec![],
            })
            .collect();
        FleetRun {
            workers: contents.len(),
            seed: 1,
            leader: result(),
            leader_records: Some(paths[0].clone()),
            runs,
            judgements: BTreeMap::new(),
            departed: vec![],
            missing: vec![],
            aborted: None,
            presence: BTreeMap::new(),
            shares: vec![scenario.clone(); contents.len()],
            scenario,
        }
    }

    /// The merged records, as (worker, id), and the run's count of them.
    fn merged(dir: &Path, merged: &Merged<Value>) -> (Vec<(u64, u64)>, u64) {
        let text = std::fs::read_to_string(dir.join(nyann_results::REQUESTS)).unwrap();
        let records = text
            .lines()
            .map(|line| {
                let record: Value = serde_json::from_str(line).unwrap();
                (
                    record["worker"].as_u64().unwrap(),
                    record["id"].as_u64().unwrap(),
                )
            })
            .collect();
        (records, merged.result.requests_recorded)
    }

    fn lines(records: &[String]) -> Vec<u8> {
        records
            .iter()
            .flat_map(|r| format!("{r}\n").into_bytes())
            .collect()
    }

    fn requests_ok(merged: &Merged<Value>) -> u64 {
        merged.result.stages[0].client.as_ref().unwrap().requests_ok
    }

    /// With one worker of three absent from a stage, the stage is degraded
    /// only when the others ran less than the fleet's level: a search stage
    /// set up after the loss gives the absent worker no share.
    #[test]
    fn a_stage_whose_level_the_present_workers_ran_whole_is_not_degraded() {
        let dir = tempfile::tempdir().unwrap();
        let ok = lines(&[record(0, Status::Ok)]);
        let share = |c: u32| Scenario {
            steps: vec![Step::Stage(nyann_model::Stage {
                concurrency: Some(c),
                ..nyann_model::Stage::new(10.0, nyann_model::Mode::Concurrent)
            })],
            ..fleet(dir.path(), &[Some(&ok)]).scenario
        };
        for (absent_share, degraded) in [(0, false), (1, true)] {
            let mut run = fleet(dir.path(), &[Some(&ok), Some(&ok), Some(&ok)]);
            run.scenario = share(2 + absent_share);
            run.shares = vec![share(1), share(1), share(absent_share)];
            run.presence.insert(0, vec![0, 1]);
            let out = write(&run, dir.path()).unwrap();
            let stage = &out.result.stages[0];
            assert_eq!(stage.degraded.is_some(), degraded, "{stage:?}");
            assert_eq!(stage.concurrency, Some(2));
        }
    }

    #[test]
    fn every_record_of_every_worker_is_merged_once_in_worker_order() {
        let dir = tempfile::tempdir().unwrap();
        let w0 = lines(&[record(0, Status::Ok), record(1, Status::Failed)]);
        let w1 = lines(&[record(10, Status::Ok)]);
        let w2 = lines(&[record(20, Status::Ok), record(21, Status::Ok)]);
        let run = fleet(dir.path(), &[Some(&w0), Some(&w1), Some(&w2)]);
        let out = write(&run, dir.path()).unwrap();
        let (records, count) = merged(dir.path(), &out);
        assert_eq!(records, [(0, 0), (0, 1), (1, 10), (2, 20), (2, 21)]);
        assert_eq!(count, 5);
        assert_eq!(requests_ok(&out), 4);
        assert_eq!(
            out.result.stages[0]
                .client
                .as_ref()
                .unwrap()
                .requests_failed,
            1
        );
        assert!(matches!(out.result.outcome, RunOutcome::Completed));
    }

    #[test]
    fn a_merged_record_is_the_workers_with_its_worker_field() {
        let dir = tempfile::tempdir().unwrap();
        let written = [record(0, Status::Ok), record(1, Status::Failed)];
        let run = fleet(
            dir.path(),
            &[Some(&lines(&written[..1])), Some(&lines(&written[1..]))],
        );
        write(&run, dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(nyann_results::REQUESTS)).unwrap();
        let out: Vec<&str> = text.lines().collect();
        assert_eq!(out.len(), 2);
        for (worker, (line, written)) in out.iter().zip(&written).enumerate() {
            let mut expected: Value = serde_json::from_str(written).unwrap();
            expected["worker"] = json!(worker);
            assert_eq!(serde_json::from_str::<Value>(line).unwrap(), expected);
        }
    }

    /// What a worker wrote is copied as it is, its `worker` field added
    /// last (as the schema lists it), escapes in strings included.
    #[test]
    fn a_record_keeps_the_workers_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let written = [record(0, Status::Ok), record(1, Status::Failed)];
        assert!(written[1].contains("\\\\u0000"), "{}", written[1]);
        let run = fleet(dir.path(), &[Some(b""), Some(&lines(&written))]);
        write(&run, dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(nyann_results::REQUESTS)).unwrap();
        let expected: String = written
            .iter()
            .map(|r| format!("{},\"worker\":1}}\n", &r[..r.len() - 1]))
            .collect();
        assert_eq!(text, expected);
    }

    #[test]
    fn an_empty_records_file_adds_nothing_and_is_not_missing() {
        let dir = tempfile::tempdir().unwrap();
        let w1 = lines(&[record(10, Status::Ok)]);
        let run = fleet(dir.path(), &[Some(b""), Some(&w1), Some(b"\n\n")]);
        let out = write(&run, dir.path()).unwrap();
        assert_eq!(merged(dir.path(), &out), (vec![(1, 10)], 1));
        assert!(matches!(out.result.outcome, RunOutcome::Completed));
    }

    /// A worker that crashed mid-write leaves its last line cut: the cut
    /// line is skipped, every complete record before it is kept, and so is
    /// a last record whose newline never came.
    #[test]
    fn a_line_cut_by_a_crash_loses_no_complete_record() {
        let dir = tempfile::tempdir().unwrap();
        let whole = record(1, Status::Ok);
        let mut w0 = lines(&[record(0, Status::Ok), record(1, Status::Ok)]);
        w0.extend_from_slice(&whole.as_bytes()[..whole.len() / 2]);
        let mut w1 = lines(&[record(10, Status::Ok)]);
        w1.extend_from_slice(record(11, Status::Ok).as_bytes());
        let run = fleet(dir.path(), &[Some(&w0), Some(&w1)]);
        let out = write(&run, dir.path()).unwrap();
        assert_eq!(
            merged(dir.path(), &out),
            (vec![(0, 0), (0, 1), (1, 10), (1, 11)], 4)
        );
        assert_eq!(requests_ok(&out), 4);
    }

    /// A line that is no record (here: not UTF-8) is skipped; the records
    /// after it are still merged.
    #[test]
    fn an_unreadable_line_skips_that_line_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut w0 = lines(&[record(0, Status::Ok)]);
        w0.extend_from_slice(b"{\"id\": \"\xff\xfe\"}\n[1, 2]\nnot json\n");
        w0.extend_from_slice(&lines(&[record(1, Status::Ok)]));
        let run = fleet(dir.path(), &[Some(&w0)]);
        let out = write(&run, dir.path()).unwrap();
        assert_eq!(merged(dir.path(), &out), (vec![(0, 0), (0, 1)], 2));
    }

    /// Only the bytes the worker declared are merged: a file that grew
    /// after its upload adds nothing.
    #[test]
    fn only_the_declared_bytes_are_merged() {
        let dir = tempfile::tempdir().unwrap();
        let w1 = lines(&[record(10, Status::Ok)]);
        let mut run = fleet(dir.path(), &[Some(b""), Some(&w1)]);
        let grown = [w1.clone(), lines(&[record(11, Status::Ok)])].concat();
        std::fs::write(dir.path().join("worker-1.jsonl"), grown).unwrap();
        assert_eq!(run.runs[0].records.as_ref().unwrap().bytes, w1.len() as u64);
        run.leader_records = None;
        let out = write(&run, dir.path()).unwrap();
        assert_eq!(merged(dir.path(), &out), (vec![(1, 10)], 1));
    }

    /// An object that is no request record is kept (statistics skip it);
    /// a `worker` field already there is replaced, never doubled.
    #[test]
    fn other_objects_are_kept_with_their_worker_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let mut tagged: Value = serde_json::from_str(&record(1, Status::Ok)).unwrap();
        tagged["worker"] = json!(7);
        // The same, its `worker` field spelled with an escape.
        let escaped = record(2, Status::Ok).replace("\"id\"", "\"w\\u006frker\":7,\"id\"");
        let w1 = format!("{{\"id\": 5, \"note\": \"x\"}}\n{tagged}\n{escaped}\n");
        let run = fleet(dir.path(), &[Some(b""), Some(w1.as_bytes())]);
        let out = write(&run, dir.path()).unwrap();
        assert_eq!(merged(dir.path(), &out), (vec![(1, 5), (1, 1), (1, 2)], 3));
        let text = std::fs::read_to_string(dir.path().join(nyann_results::REQUESTS)).unwrap();
        assert_eq!(text.matches("\"worker\"").count(), 3, "{text}");
        assert!(!text.contains("u006f"), "{text}");
        assert_eq!(requests_ok(&out), 2);
    }

    #[test]
    fn a_worker_whose_records_are_missing_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let w0 = lines(&[record(0, Status::Ok)]);
        let mut run = fleet(dir.path(), &[Some(&w0), None, Some(b"")]);
        run.runs[1].records.as_mut().unwrap().path = dir.path().join("nowhere.jsonl");
        run.missing = vec![3];
        run.workers = 4;
        let out = write(&run, dir.path()).unwrap();
        assert_eq!(merged(dir.path(), &out), (vec![(0, 0)], 1));
        let RunOutcome::Degraded {
            missing_records,
            reasons,
            ..
        } = &out.result.outcome
        else {
            panic!("{:?}", out.result.outcome);
        };
        assert_eq!(missing_records, &[1, 2, 3]);
        assert!(
            reasons[0].contains("its upload failed: the connection closed"),
            "{reasons:?}"
        );
        assert!(
            reasons[1].contains("nowhere.jsonl cannot be read"),
            "{reasons:?}"
        );
        assert!(
            reasons[2].contains("nothing arrived from it"),
            "{reasons:?}"
        );
        let file: FleetFile =
            serde_json::from_slice(&std::fs::read(dir.path().join("fleet.json")).unwrap()).unwrap();
        assert_eq!(file.uploaded, [0]);
        assert_eq!(file.missing_records, [1, 2, 3]);
    }
}
