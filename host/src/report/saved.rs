//! A run as the report sees it: what `generate --output-dir DIR` saved
//! (`summary.json`, `scenario.json`, the scenario's source, and
//! `requests.jsonl` binned into a timeline), read back from DIR.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::Context;
use nyann_model::{Scenario, Step};

use super::timeline::{ErrorCount, ErrorTally, RecordLine, Timeline, TimelineBuilder};
use crate::sweep::{CongestionRecord, RunResult};

/// The compiled scenario, saved beside the results.
pub const SCENARIO_FILE: &str = "scenario.json";
/// The scenario as written (Starlark), when the run was given one.
pub const SOURCE_FILE: &str = "scenario.star";
/// The report itself.
pub const REPORT_FILE: &str = "report.html";

/// One run, ready to be drawn.
pub struct SavedRun {
    /// How the report names the run (`--label`, else the directory's name).
    pub label: String,
    pub result: RunResult,
    /// The congestion record of each step (`None` for steps not judged).
    pub records: Vec<Option<CongestionRecord>>,
    pub scenario: Option<Scenario>,
    pub source: Option<String>,
    pub timeline: Timeline,
    pub errors: Vec<ErrorCount>,
    /// Lines of `requests.jsonl` that could not be read (counted, skipped).
    pub unreadable_lines: u64,
}

impl SavedRun {
    /// Reads the run saved in `dir`.
    pub fn load(dir: &Path, label: Option<String>) -> anyhow::Result<SavedRun> {
        let summary = dir.join("summary.json");
        let text = std::fs::read_to_string(&summary).with_context(|| {
            format!(
                "cannot read {}: is {} the --output-dir of a nyann-bench run?",
                summary.display(),
                dir.display()
            )
        })?;
        let result: RunResult = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a nyann-bench summary", summary.display()))?;
        let scenario = match std::fs::read_to_string(dir.join(SCENARIO_FILE)) {
            Ok(text) => Some(
                serde_json::from_str(&text)
                    .with_context(|| format!("{} is not a scenario", SCENARIO_FILE))?,
            ),
            Err(_) => None,
        };
        let source = std::fs::read_to_string(dir.join(SOURCE_FILE)).ok();
        let label = label.unwrap_or_else(|| dir_label(dir));
        let mut run = SavedRun::new(label, result, scenario, source);
        run.read_requests(&dir.join("requests.jsonl"))?;
        Ok(run)
    }

    /// A run whose requests are added with [`SavedRun::read_requests`].
    pub fn new(
        label: String,
        result: RunResult,
        scenario: Option<Scenario>,
        source: Option<String>,
    ) -> SavedRun {
        let records = result
            .stages
            .iter()
            .map(|s| CongestionRecord::of(s).cloned())
            .collect();
        let timeline = TimelineBuilder::new(result.start_unix, result.end_unix).finish();
        SavedRun {
            label,
            result,
            records,
            scenario,
            source,
            timeline,
            errors: Vec::new(),
            unreadable_lines: 0,
        }
    }

    /// Bins the records of `requests.jsonl` (streamed: memory does not grow
    /// with the file); a missing file leaves the timeline empty.
    pub fn read_requests(&mut self, path: &Path) -> anyhow::Result<()> {
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let mut timeline = TimelineBuilder::new(self.result.start_unix, self.result.end_unix);
        let mut errors = ErrorTally::default();
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut line = String::new();
        loop {
            line.clear();
            let read = reader
                .read_line(&mut line)
                .with_context(|| format!("cannot read {}", path.display()))?;
            if read == 0 {
                break;
            }
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<RecordLine>(&line) {
                Ok(record) => {
                    timeline.add(&record);
                    errors.add(&record);
                }
                // A line cut short by a crash, or not a record: skip it.
                Err(_) => self.unreadable_lines += 1,
            }
        }
        self.timeline = timeline.finish();
        self.errors = errors.finish();
        Ok(())
    }

    /// The `until_congested` parameters of step `index`, as written.
    pub fn stop_params(&self, index: usize) -> Option<&[nyann_model::Param]> {
        match self.scenario.as_ref()?.steps.get(index)? {
            Step::Stage(stage) => stage.stop.as_ref().map(|s| s.params.as_slice()),
            Step::Barrier { .. } => None,
        }
    }

    /// The last measured stage the policy did not call congested: the knee.
    pub fn knee(&self) -> Option<usize> {
        self.result
            .stages
            .iter()
            .zip(&self.records)
            .enumerate()
            .filter(|(_, (stage, record))| {
                stage.client.is_some()
                    && stage.status == nyann_load::StageStatus::Measured
                    && !record.as_ref().is_some_and(CongestionRecord::congested)
            })
            .map(|(i, _)| i)
            .take_while(|&i| {
                // Only stages before the first congested one count.
                !self.records[..i]
                    .iter()
                    .flatten()
                    .any(CongestionRecord::congested)
            })
            .last()
    }
}

/// The directory's own name (`results/run-1` -> `run-1`).
fn dir_label(dir: &Path) -> String {
    let canonical: PathBuf = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}
