//! After the load: the conclusion, `summary.json` with it, the scenario
//! beside the results and the HTML report, and the run's exit code. The
//! results are on disk by then: nothing here fails the run (a report that
//! cannot be built is said in [`Report`]), and the report gives way to the
//! next stop request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use nyann_check::conclusion::{self, Conclusion};
use nyann_check::{CongestionRecord, RunResult};
use nyann_model::Scenario;
use nyann_signals::SignalOptions;

use crate::execute::{Executed, FleetEnding};
use crate::stop::Stop;

/// A run ended: what its summary and report say.
pub struct Finished {
    /// The stages with their verdicts (a fleet's merged).
    pub result: RunResult,
    /// The knee, the capacity found, the load the stop saved.
    pub conclusion: Conclusion,
    /// The run directory, if the results were kept.
    pub dir: Option<PathBuf>,
    pub report: Report,
    fleet: Option<Box<FleetEnding>>,
}

/// What became of the HTML report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// No run directory: no report.
    NotAsked,
    Written,
    /// Building it failed or took too long; the results are saved.
    NotWritten {
        why: String,
    },
    /// A stop request came while it was built; the results are saved.
    Interrupted,
}

/// Longest the HTML report may take to build after a run: charts are drawn
/// in bounded time whatever the values, so this is a backstop.
const REPORT_TIME_LIMIT: Duration = Duration::from_secs(60);

impl Executed {
    /// Adds the conclusion to `summary.json` and writes the scenario and
    /// the report into the run directory (if any).
    pub async fn finish(self) -> Finished {
        let conclusion = Conclusion::of(&self.result, self.workers);
        let mut report = Report::NotAsked;
        if let Some(dir) = &self.dir {
            let written = match &self.fleet {
                Some(fleet) => conclusion::write_summary(dir, &fleet.summary, &conclusion),
                None => conclusion::write_summary(dir, &self.result, &conclusion),
            };
            if let Err(err) = written {
                tracing::warn!("summary.json was not rewritten with the conclusion: {err}");
            }
            report = save_report(
                dir,
                &self.result,
                &self.scenario,
                self.source.as_deref(),
                &self.stop,
            )
            .await;
        }
        Finished {
            result: self.result,
            conclusion,
            dir: self.dir,
            report,
            fleet: self.fleet,
        }
    }
}

impl Finished {
    /// The summary as `summary.json` holds it, with the conclusion (for
    /// stdout).
    pub fn summary_json(&self) -> serde_json::Result<String> {
        match &self.fleet {
            Some(fleet) => conclusion::summary_json(&fleet.summary, &self.conclusion),
            None => conclusion::summary_json(&self.result, &self.conclusion),
        }
    }

    /// [`exit_code`] of the result; 130 when a stop request interrupted
    /// the report of a run that ended well (the results are saved, but it
    /// did not end as it would have).
    pub fn exit_code(&self) -> u8 {
        match exit_code(&self.result) {
            0 if self.report == Report::Interrupted => 130,
            code => code,
        }
    }
}

/// 0 when the run completed or stopped on congestion (the feature
/// working); 1 when it was aborted or a failed policy call stopped a sweep
/// (with several sweeps, any of them); 3 when degraded; 130 when
/// interrupted.
pub fn exit_code(result: &RunResult) -> u8 {
    let stopped_by_error = result
        .stages
        .iter()
        .filter_map(CongestionRecord::of)
        .any(|r| r.stopped && r.policy_error.is_some());
    match result.exit_code() {
        0 | nyann_load::EXIT_DEGRADED if stopped_by_error => 1,
        code => code,
    }
}

/// Saves each scrape URL's `/metrics` text in the run directory
/// (`metrics/ROLE-I-MOMENT.txt`): the server's configuration (vLLM's
/// `vllm:cache_config_info`) as `sim fit` reads it, at the start and the
/// end of the run. The results do not depend on it: a failure is a warning.
pub(crate) async fn save_metrics_texts(signals: &SignalOptions, dir: Option<&Path>, moment: &str) {
    let Some(dir) = dir else { return };
    let texts = match nyann_signals::metrics_texts(signals).await {
        Ok(texts) => texts,
        Err(err) => return tracing::warn!("the servers' /metrics texts were not saved: {err}"),
    };
    let run_dir = nyann_results::RunDir::at(dir);
    for saved in texts {
        let written = match &saved.text {
            Ok(text) => run_dir
                .write_metrics(&saved.role, saved.index, moment, text)
                .map_err(|e| e.to_string()),
            Err(why) => Err(why.clone()),
        };
        if let Err(why) = written {
            tracing::warn!(
                "the /metrics text of {} ({moment}) was not saved: {why}",
                saved.url
            );
        }
    }
}

/// Saves the scenario beside the run's results and writes `report.html`,
/// on a thread of its own, left behind if it takes longer than
/// [`REPORT_TIME_LIMIT`] or a stop request comes first.
async fn save_report(
    dir: &Path,
    result: &RunResult,
    scenario: &Scenario,
    source: Option<&str>,
    stop: &Stop,
) -> Report {
    let interrupted = stop.next();
    tracing::debug!("building the HTML report in {}", dir.display());
    let (done, finished) = tokio::sync::oneshot::channel();
    let work = {
        let (dir, result, scenario) = (dir.to_owned(), result.clone(), scenario.clone());
        let source = source.map(str::to_owned);
        move || {
            let _ = done.send(write_report(&dir, &result, &scenario, source.as_deref()));
        }
    };
    let built = match std::thread::Builder::new()
        .name("report".into())
        .spawn(work)
    {
        Err(err) => Err(anyhow::anyhow!("cannot start its thread: {err}")),
        Ok(_) => tokio::select! {
            written = finished => written.unwrap_or_else(|_| {
                Err(anyhow::anyhow!("building it failed (its thread panicked)"))
            }),
            () = tokio::time::sleep(REPORT_TIME_LIMIT) => Err(anyhow::anyhow!(
                "building it took longer than {}; the results are saved",
                humantime::format_duration(REPORT_TIME_LIMIT)
            )),
            () = interrupted => return Report::Interrupted,
        },
    };
    match built {
        Ok(()) => Report::Written,
        Err(err) => Report::NotWritten {
            why: format!("{err:#}"),
        },
    }
}

/// Writes the scenario files and `report.html` of a run into `dir`.
fn write_report(
    dir: &Path,
    result: &RunResult,
    scenario: &Scenario,
    source: Option<&str>,
) -> anyhow::Result<()> {
    let run_dir = nyann_results::RunDir::at(dir);
    run_dir
        .write_scenario(scenario, source)
        .with_context(|| format!("cannot write the scenario into {}", dir.display()))?;
    let label = dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut run = nyann_report::SavedRun::new(
        label,
        result.clone(),
        Some(scenario.clone()),
        source.map(str::to_owned),
    );
    run.read_requests(&run_dir)?;
    nyann_report::write_html(
        std::slice::from_ref(&run),
        &run_dir.file(nyann_results::REPORT),
    )?;
    Ok(())
}
