//! A run as the report sees it: what `generate --output-dir DIR` saved
//! (`summary.json`, `scenario.json`, the scenario's source, and
//! `requests.jsonl` binned into a timeline), read back from DIR.

use std::path::{Path, PathBuf};

use nyann_model::{Scenario, Step};
use nyann_results::{RecordError, RunDir};

use crate::ReportError;
use crate::timeline::{ErrorCount, ErrorTally, RecordLine, Timeline, TimelineBuilder};
use nyann_check::{CongestionRecord, RunResult};

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
    pub fn load(dir: &Path, label: Option<String>) -> Result<SavedRun, ReportError> {
        let run_dir = RunDir::open(dir)?;
        let result: RunResult = run_dir.summary()?;
        let scenario = run_dir.scenario()?;
        let source = run_dir.scenario_source();
        let label = label.unwrap_or_else(|| dir_label(dir));
        let mut run = SavedRun::new(label, result, scenario, source);
        run.read_requests(&run_dir)?;
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

    /// Bins the request records of `dir` (streamed: memory does not grow
    /// with the file); without records the timeline stays empty.
    pub fn read_requests(&mut self, dir: &RunDir) -> Result<(), ReportError> {
        let Some(records) = dir.records::<RecordLine>()? else {
            return Ok(());
        };
        let mut timeline = TimelineBuilder::new(self.result.start_unix, self.result.end_unix);
        let mut errors = ErrorTally::default();
        for record in records {
            match record {
                Ok(record) => {
                    timeline.add(&record);
                    errors.add(&record);
                }
                // A line cut short by a crash, or not a record: skip it.
                Err(RecordError::Line { .. }) => self.unreadable_lines += 1,
                Err(err) => return Err(ReportError::Records(err)),
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

    /// The stages (by index) that are a sweep's knee: the run's answer,
    /// as its conclusion gives it.
    pub fn knees(&self) -> Vec<usize> {
        nyann_check::Conclusion::of(&self.result, 1)
            .sweeps
            .iter()
            .filter_map(|sweep| sweep.knee.as_ref().map(|knee| knee.stage.stage))
            .collect()
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
