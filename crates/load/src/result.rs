//! What a run produced: per-step results (`stages.json`) and the run summary
//! (`summary.json`, also printed on stdout).

use std::path::Path;

use nyann_model::{ClientStats, Mode};
use serde::{Deserialize, Serialize};

use crate::stats::StageDetail;

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// Ran to its end; its statistics count.
    Measured,
    /// A warm-up stage: ran, statistics shown but excluded from the totals and never judged.
    Warmup,
    /// Not run: an earlier stage stopped its sweep, or the run was interrupted/aborted.
    Skipped,
    /// A barrier step.
    Barrier,
    /// Was running when the run was interrupted or aborted (partial statistics).
    Interrupted,
}

/// One step of the scenario, as run (`A`: what the stage hook recorded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StageResult<A = serde_json::Value> {
    /// Position in the scenario's steps (0-based, barriers counted).
    pub index: usize,
    pub label: String,
    pub name: Option<String>,
    pub status: StageStatus,
    /// `None` for barriers.
    pub mode: Option<Mode>,
    pub concurrency: Option<u32>,
    pub rate: Option<f64>,
    pub duration_s: f64,
    /// For barriers: whether it waited for in-flight requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<bool>,
    /// The sweep (`until_congested(...)` call, numbered from 0) the stage
    /// belongs to; absent outside any sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<u32>,
    pub start_unix: Option<f64>,
    pub end_unix: Option<f64>,
    pub client: Option<ClientStats>,
    pub detail: Option<StageDetail>,
    /// What the stage hook stored (e.g. the congestion verdict).
    pub annotation: Option<A>,
    /// Why a skipped stage did not run.
    pub skip_reason: Option<String>,
    /// The run was interrupted while the stage hook (the congestion check)
    /// ran after this stage: no verdict was recorded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub check_interrupted: bool,
    /// Run by several workers, not all of which ran it whole: `concurrency`
    /// and `rate` above are the level that ran, this the configured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<DegradedStage>,
    /// A stage of the capacity search after its sweep stopped (`refine=`),
    /// numbered after the scenario's steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchStage>,
}

/// What a capacity-search stage refines.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchStage {
    /// The sweep's congested stage (its index): the search stage is shaped
    /// like it and judged by its stop condition.
    pub refines: usize,
}

/// A stage that ran at a lower level than configured (a worker of a fleet
/// was lost or left during it, or before it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DegradedStage {
    pub configured_concurrency: Option<u32>,
    pub configured_rate: Option<f64>,
    /// The workers that ran it from start to end.
    pub workers: Vec<usize>,
    pub reason: String,
}

impl<A> StageResult<A> {
    /// The same result with `f` applied to its annotation (e.g. to add to
    /// or drop what the hook recorded).
    pub fn map_annotation<B>(self, f: impl FnOnce(Option<A>) -> Option<B>) -> StageResult<B> {
        StageResult {
            index: self.index,
            label: self.label,
            name: self.name,
            status: self.status,
            mode: self.mode,
            concurrency: self.concurrency,
            rate: self.rate,
            duration_s: self.duration_s,
            drain: self.drain,
            sweep: self.sweep,
            start_unix: self.start_unix,
            end_unix: self.end_unix,
            client: self.client,
            detail: self.detail,
            annotation: f(self.annotation),
            skip_reason: self.skip_reason,
            check_interrupted: self.check_interrupted,
            degraded: self.degraded,
            search: self.search,
        }
    }
}

/// The exit code of a degraded run (see [`RunOutcome::Degraded`]).
pub const EXIT_DEGRADED: u8 = 3;

/// Why the run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RunOutcome {
    /// Every step ran.
    Completed,
    /// The stage hook stopped a sweep after stage `stage` (with several
    /// sweeps stopped: the last stopping stage, and every reason).
    Stopped { stage: usize, reason: String },
    /// Too many consecutive failures (or another fatal condition).
    Aborted { reason: String },
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// Several workers: the run completed (or stopped: `stage` and
    /// `reason` as in `Stopped`) but not everything configured ran or was
    /// recorded: workers were lost or left (their stages are marked
    /// `degraded`), or the records of `missing_records` are not in the results.
    Degraded {
        reasons: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        missing_records: Vec<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stage: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

impl RunOutcome {
    /// The stage after which a sweep stopped, if one did.
    pub fn stop_stage(&self) -> Option<usize> {
        match self {
            RunOutcome::Stopped { stage, .. } => Some(*stage),
            RunOutcome::Degraded { stage, .. } => *stage,
            _ => None,
        }
    }

    /// Aborted for `reason`, unless the run was aborted or interrupted
    /// already (that is the story then).
    pub fn abort_unless_halted(&mut self, reason: String) {
        if !matches!(self, RunOutcome::Aborted { .. } | RunOutcome::Interrupted) {
            *self = RunOutcome::Aborted { reason };
        }
    }
}

/// The whole run (`A`: what the stage hook recorded with each stage).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RunResult<A = serde_json::Value> {
    pub outcome: RunOutcome,
    pub start_unix: f64,
    pub end_unix: f64,
    pub seed: u64,
    /// Model(s) and target(s) actually used.
    pub models: Vec<String>,
    pub targets: Vec<String>,
    /// Over the measured stages only (warm-up and hold requests excluded);
    /// rates are per second of measured stage time.
    pub totals: ClientStats,
    pub totals_detail: StageDetail,
    pub requests_recorded: u64,
    pub stages: Vec<StageResult<A>>,
}

impl<A> RunResult<A> {
    /// The same run with `f` applied to each stage's annotation.
    pub fn map_annotations<B>(
        self,
        mut f: impl FnMut(usize, Option<A>) -> Option<B>,
    ) -> RunResult<B> {
        RunResult {
            outcome: self.outcome,
            start_unix: self.start_unix,
            end_unix: self.end_unix,
            seed: self.seed,
            models: self.models,
            targets: self.targets,
            totals: self.totals,
            totals_detail: self.totals_detail,
            requests_recorded: self.requests_recorded,
            stages: self
                .stages
                .into_iter()
                .map(|stage| {
                    let index = stage.index;
                    stage.map_annotation(|a| f(index, a))
                })
                .collect(),
        }
    }
}

impl<A: Serialize> RunResult<A> {
    /// The process exit code: 0 completed or stopped by the hook, 1
    /// aborted, 3 degraded, 130 interrupted.
    pub fn exit_code(&self) -> u8 {
        match self.outcome {
            RunOutcome::Completed | RunOutcome::Stopped { .. } => 0,
            RunOutcome::Aborted { .. } => 1,
            RunOutcome::Degraded { .. } => EXIT_DEGRADED,
            RunOutcome::Interrupted => 130,
        }
    }

    /// Writes `stages.json` and `summary.json` into `dir`.
    pub fn write_files(&self, dir: &Path) -> std::io::Result<()> {
        let dir = nyann_results::RunDir::at(dir);
        dir.write_stages(&self.stages)?;
        dir.write_summary(self)
    }
}
