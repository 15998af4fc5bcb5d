//! A run's report in brief, for clients that read data rather than the
//! HTML report: each stage's verdict, where the run stopped and why, and
//! the capacity each sweep found. Read from the run directory's
//! `summary.json` (once the run ends), else its `stages.json`, as `get`
//! reads them.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::store::{RunRow, Status};

/// A run's report in brief.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunReport {
    pub id: String,
    pub status: Status,
    pub target: String,
    pub label: Option<String>,
    /// Why it failed or was interrupted.
    pub message: Option<String>,
    /// How the run ended, from its summary (`completed`, `stopped`,
    /// `aborted`, `interrupted`, `degraded`); absent until it ends.
    pub outcome: Option<String>,
    /// Where a sweep stopped the run, and why; absent when none did.
    pub stopped: Option<Stop>,
    /// Every stage, in order, with its verdict when it was judged.
    pub stages: Vec<StageVerdict>,
    /// Per `until_congested(...)` sweep: the first congested level, the
    /// knee (the capacity) and what a capacity search found.
    pub sweeps: Vec<SweepCapacity>,
    /// The HTML report's path on this service, once written.
    pub report_html: Option<String>,
}

/// What a run found, in a line of a list: kept with the run when it ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Brief {
    pub stages_run: usize,
    pub stages_skipped: usize,
    /// The label of the stage where a sweep stopped the run.
    pub stopped_at: Option<String>,
    /// Per sweep, the capacity: what a search found clean, else the knee.
    pub capacity: Vec<String>,
    /// The HTML report's path on this service, when the run wrote one.
    pub report_html: Option<String>,
}

impl RunReport {
    pub fn brief(&self) -> Brief {
        let skipped = self.stages.iter().filter(|s| s.status == "skipped").count();
        let stopped_at = self.stopped.as_ref().map(|stop| {
            self.stages
                .iter()
                .find(|s| s.index == stop.stage)
                .map_or_else(|| format!("stage {}", stop.stage), |s| s.label.clone())
        });
        let capacity = self
            .sweeps
            .iter()
            .filter_map(|sweep| {
                let clean = sweep
                    .capacity
                    .as_ref()
                    .and_then(|c| c["clean"]["label"].as_str());
                clean
                    .map(str::to_owned)
                    .or_else(|| sweep.knee.as_ref().map(|k| k.label.clone()))
            })
            .collect();
        Brief {
            stages_run: self.stages.len() - skipped,
            stages_skipped: skipped,
            stopped_at,
            capacity,
            report_html: self.report_html.clone(),
        }
    }
}

/// Where a sweep stopped the run.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Stop {
    /// The stage's index (as in `stages`).
    pub stage: usize,
    pub reason: String,
}

/// One stage and its verdict.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct StageVerdict {
    pub index: usize,
    #[serde(default)]
    pub label: String,
    /// `measured`, `warmup`, `skipped`, `barrier` or `interrupted`.
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub concurrency: Option<u32>,
    /// Requests per second (open loop).
    #[serde(default)]
    pub rate: Option<f64>,
    /// The sweep it belongs to; absent outside any sweep.
    #[serde(default)]
    pub sweep: Option<u32>,
    /// The congestion verdict; absent when the stage was not judged.
    #[serde(default, skip_deserializing)]
    pub congested: Option<bool>,
    /// The verdict's reasons, or the policy's error.
    #[serde(default, skip_deserializing)]
    pub reasons: Vec<String>,
    /// Why a skipped stage did not run.
    #[serde(default)]
    pub skip_reason: Option<String>,
    /// Requests that succeeded, and their rate (client side).
    #[serde(default, skip_deserializing)]
    pub requests_ok: Option<u64>,
    #[serde(default, skip_deserializing)]
    pub requests_per_second: Option<f64>,
}

/// What one sweep found.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SweepCapacity {
    /// The sweep's number, from 0.
    pub sweep: u32,
    #[serde(default)]
    pub name: String,
    /// The first stage judged congested; absent when none was.
    #[serde(default)]
    pub congested: Option<Level>,
    /// The capacity: the highest level judged not congested below the
    /// congested one, with its throughput and latencies.
    #[serde(default)]
    pub knee: Option<Knee>,
    /// When the first stage was already congested: a level to start from.
    #[serde(default)]
    pub suggested_start: Option<Value>,
    /// What a capacity search (`refine=`) found: `clean` and `congested`
    /// levels and their `gap`.
    #[serde(default)]
    pub capacity: Option<Value>,
}

/// A stage by its level.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Level {
    pub stage: usize,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub rate: Option<f64>,
}

/// The knee: a level and what it sustained.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Knee {
    pub stage: usize,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub concurrency: Option<u32>,
    #[serde(default)]
    pub rate: Option<f64>,
    #[serde(default)]
    pub requests_per_second: f64,
    #[serde(default)]
    pub output_tokens_per_second: f64,
    #[serde(default)]
    pub ttft_p99_seconds: f64,
    #[serde(default)]
    pub itl_p99_seconds: f64,
}

/// The report of `row`, from what its run directory holds now.
pub fn report(row: &RunRow) -> RunReport {
    let dir = Path::new(&row.dir);
    let summary = read_json(&dir.join(nyann_results::SUMMARY));
    let stages_file = match &summary {
        Some(_) => None,
        None => read_json(&dir.join(nyann_results::STAGES)),
    };
    let stages_json = summary
        .as_ref()
        .or(stages_file.as_ref())
        .and_then(|v| v["stages"].as_array());
    let stages = stages_json
        .map(|stages| stages.iter().filter_map(stage_verdict).collect())
        .unwrap_or_default();
    let outcome = summary.as_ref().map(|s| &s["outcome"]);
    let stopped = outcome.and_then(|o| {
        Some(Stop {
            stage: usize::try_from(o["stage"].as_u64()?).ok()?,
            reason: o["reason"].as_str().unwrap_or_default().to_string(),
        })
    });
    let sweeps = summary
        .as_ref()
        .and_then(|s| s["conclusion"]["sweeps"].as_array())
        .map(|sweeps| {
            sweeps
                .iter()
                .filter_map(|s| serde_json::from_value(s.clone()).ok())
                .collect()
        })
        .unwrap_or_default();
    let report_html = dir
        .join(nyann_results::REPORT)
        .is_file()
        .then(|| format!("/api/v1/runs/{}/report.html", row.id));
    RunReport {
        id: row.id.clone(),
        status: row.status,
        target: row.target.clone(),
        label: row.label.clone(),
        message: row.message.clone(),
        outcome: outcome.and_then(|o| o["kind"].as_str().map(str::to_owned)),
        stopped,
        stages,
        sweeps,
        report_html,
    }
}

fn read_json(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// A stage of `stages.json` or `summary.json`, with its verdict.
fn stage_verdict(stage: &Value) -> Option<StageVerdict> {
    let mut verdict: StageVerdict = serde_json::from_value(stage.clone()).ok()?;
    let congestion = &stage["annotation"]["congestion"];
    if let Some(judged) = congestion["verdict"].as_object() {
        verdict.congested = judged.get("congested").and_then(Value::as_bool);
        verdict.reasons = judged
            .get("reasons")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|r| r.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
    } else if let Some(error) = congestion["policy_error"].as_str() {
        verdict.reasons = vec![format!("the policy failed: {error}")];
    }
    let client = &stage["client"];
    verdict.requests_ok = client["requests_ok"].as_u64();
    verdict.requests_per_second = client["requests_per_second"].as_f64();
    Some(verdict)
}
