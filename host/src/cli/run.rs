//! The steps every run takes, shared by `generate`, `demo` and the fleet's
//! leader and workers: check what can fail before load is sent
//! ([`prepare`]), then end the run ([`Ending::finish`]): the conclusion, the
//! HTML report, the table on stderr, the summary on stdout, the exit code.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use nyann_check::conclusion::{self, Conclusion};
use nyann_check::{CongestionCheck, CongestionRecord, RunResult};
use nyann_load::RunOptions;
use nyann_model::Scenario;
use nyann_signals::SignalOptions;

use super::Ui;
use super::generate::Args;
use super::interrupt::{Signals, cancel_on_signals};

/// What a run needs before load is sent.
pub struct Prepared {
    pub options: RunOptions,
    /// The congestion check (`None` when no stage has a stop condition).
    pub check: Option<CongestionCheck>,
    /// Where the server signals come from (for [`save_metrics_texts`]).
    pub signals: SignalOptions,
    /// Ctrl-C and SIGTERM, handled from the start of the preparation on
    /// (they cancel `options.interrupt`).
    pub interrupts: Signals,
}

/// Checks everything that can fail before load is sent: that `dir` (if
/// any) holds no earlier run, the client's flags, the signal source and the
/// policy; raises the open-files limit for the streams. Ctrl-C and SIGTERM
/// are handled from here on; one during the preparation ends it
/// ([`Interrupted`]).
pub async fn prepare(
    args: &Args,
    scenario: &Scenario,
    dir: Option<&Path>,
) -> anyhow::Result<Prepared> {
    if let Some(dir) = dir {
        refuse_a_previous_run(dir, args.overwrite)?;
    }
    let options = args.client.to_options()?;
    let interrupts = cancel_on_signals(options.interrupt.clone(), options.interrupt_now.clone());
    let signals = signal_options(args, &options);
    let check = tokio::select! {
        check = super::check::prepare(scenario, &signals, &args.policy) => check?,
        () = options.interrupt.cancelled() => return Err(Interrupted.into()),
    };
    if let Some(limit) = nyann_load::raise_fd_limit() {
        tracing::debug!("open-files limit: {limit}");
    }
    Ok(Prepared {
        options,
        check,
        signals,
        interrupts,
    })
}

/// A run interrupted before it sent any load: `main` says so and exits
/// with 130.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted before any load was sent")
    }
}

impl std::error::Error for Interrupted {}

/// Saves each `--scrape` URL's `/metrics` text in the run directory
/// (`metrics/ROLE-I-MOMENT.txt`): the server's configuration (vLLM's
/// `vllm:cache_config_info`) as `sim fit` reads it, at the start and the
/// end of the run. The results do not depend on it: a failure is a warning.
pub async fn save_metrics_texts(signals: &SignalOptions, dir: Option<&Path>, moment: &str) {
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

/// The exit code of a run interrupted before it sent anything, said once.
pub fn interrupted_before_load() -> ExitCode {
    eprintln!("interrupted before any load was sent");
    ExitCode::from(130)
}

/// Where the JSON summary goes besides the run directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    /// Printed on stdout when it is not a terminal, or always with `json`.
    Stdout { json: bool },
    /// Not printed (the demo: the table says it all).
    Quiet,
}

/// How a run ends.
pub struct Ending<'a> {
    pub scenario: &'a Scenario,
    /// The Starlark text it was compiled from, if any (saved with the results).
    pub source: Option<&'a str>,
    /// The run directory, if any.
    pub dir: Option<&'a Path>,
    pub summary: Summary,
    /// Processes that ran it (their share of the load each).
    pub workers: usize,
}

impl Ending<'_> {
    /// Ends the run of `result`, whose summary is `summary` (the result
    /// itself, or a fleet's with its workers): adds the conclusion to
    /// `summary.json` and writes the report in the run directory, shows the
    /// ending on stderr and the summary on stdout; returns the exit code.
    pub async fn finish<R: serde::Serialize>(
        &self,
        result: &RunResult,
        summary: &R,
        signals: &Signals,
        ui: Ui,
    ) -> anyhow::Result<ExitCode> {
        let conclusion = Conclusion::of(result, self.workers);
        let mut interrupted = false;
        if let Some(dir) = self.dir {
            write_conclusion(dir, summary, &conclusion);
            interrupted = !save_report(dir, result, self.scenario, self.source, signals).await;
        }
        show_ending(result, &conclusion, self.dir, ui);
        if let Summary::Stdout { json } = self.summary {
            print_summary(summary, &conclusion, json)?;
        }
        // Ctrl-C during the report: the results are saved, but the run
        // did not end as it would have.
        Ok(ExitCode::from(match exit_code(result) {
            0 if interrupted => 130,
            code => code,
        }))
    }
}

/// Refuses an output directory that holds a run already (its results would
/// be overwritten), unless asked to overwrite it.
pub fn refuse_a_previous_run(dir: &Path, overwrite: bool) -> anyhow::Result<()> {
    match nyann_results::RunDir::at(dir).held_result() {
        Some((file, path)) if !overwrite => {
            let when = std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .map(|t| format!(", written {}", humantime::format_rfc3339_seconds(t)))
                .unwrap_or_default();
            anyhow::bail!(
                "--output-dir {} already holds a run ({file}{when}): give a new directory \
                 (e.g. {}/$(date +%Y%m%d-%H%M%S)), or --overwrite to replace it",
                dir.display(),
                dir.display()
            )
        }
        _ => Ok(()),
    }
}

/// Adds the conclusion to the `summary.json` in `dir` (a warning when it
/// cannot: the results are written already).
fn write_conclusion<R: serde::Serialize>(dir: &Path, result: &R, conclusion: &Conclusion) {
    if let Err(err) = conclusion::write_summary(dir, result, conclusion) {
        tracing::warn!("summary.json was not rewritten with the conclusion: {err}");
    }
}

/// The summary (as `summary.json` holds it) on stdout, for scripts: when
/// stdout is a pipe or a file, or with `--json`.
pub fn print_summary<R: serde::Serialize>(
    result: &R,
    conclusion: &Conclusion,
    json: bool,
) -> anyhow::Result<()> {
    if json || !std::io::stdout().is_terminal() {
        let text = conclusion::summary_json(result, conclusion).context("encoding the summary")?;
        println!("{text}");
    }
    Ok(())
}

/// The end of a run on stderr: the stage table, how the run ended, the
/// knee and the load not sent, and where the results are (`-q`: only how
/// it ended).
pub fn show_ending(result: &RunResult, conclusion: &Conclusion, dir: Option<&Path>, ui: Ui) {
    if ui.quiet {
        eprintln!("{}", nyann_report::outcome_line(result));
        return;
    }
    eprint!("{}", nyann_report::stage_table(result));
    eprintln!("{}", nyann_report::outcome_line(result));
    eprint!("{}", conclusion.lines());
    if let Some(dir) = dir {
        // Only what is there: a report given up on, or a file a full disk
        // refused, is not named.
        let written: Vec<&str> = [
            nyann_results::SUMMARY,
            nyann_results::STAGES,
            nyann_results::REQUESTS,
            nyann_results::REPORT,
        ]
        .into_iter()
        .filter(|name| {
            dir.join(name)
                .metadata()
                .is_ok_and(|m| m.is_file() && m.len() > 0)
        })
        .collect();
        eprintln!("results: {} ({})", dir.display(), written.join(", "));
    }
}

/// Longest the HTML report may take to build after a run: charts are drawn
/// in bounded time whatever the values, so this is a backstop.
const REPORT_TIME_LIMIT: Duration = Duration::from_secs(60);

/// Saves the scenario beside the run's results and writes `report.html`.
/// The results are already on disk: a failure here is a warning, and so is
/// a report that takes longer than [`REPORT_TIME_LIMIT`] or is interrupted
/// (Ctrl-C or SIGTERM): it never keeps the run from ending. The report is
/// built on a thread of its own, left behind if it does not finish. False
/// when a signal interrupted it.
async fn save_report(
    dir: &Path,
    result: &RunResult,
    scenario: &Scenario,
    source: Option<&str>,
    signals: &Signals,
) -> bool {
    let interrupted = signals.next();
    tracing::debug!("building the HTML report in {}", dir.display());
    let (done, finished) = tokio::sync::oneshot::channel();
    let work = {
        let (dir, result, scenario) = (dir.to_owned(), result.clone(), scenario.clone());
        let source = source.map(str::to_owned);
        move || {
            let _ = done.send(write_report(&dir, &result, &scenario, source.as_deref()));
        }
    };
    let saved = match std::thread::Builder::new()
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
            () = interrupted => Err(anyhow::Error::new(Interrupted)),
        },
    };
    match saved {
        Ok(()) => true,
        Err(err) => {
            let interrupted = err.is::<Interrupted>();
            let why = if interrupted {
                "interrupted; the results are saved".to_string()
            } else {
                format!("{err:#}")
            };
            tracing::warn!(
                "the HTML report was not written: {why} (`nyann-bench report {}` builds it)",
                dir.display()
            );
            !interrupted
        }
    }
}

/// Writes the scenario files and `report.html` of a run into `dir`.
fn write_report(
    dir: &Path,
    result: &RunResult,
    scenario: &Scenario,
    source: Option<&str>,
) -> anyhow::Result<()> {
    {
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
}

/// The server-signal options of `args`: `--ca-cert` is trusted for
/// Prometheus and `--scrape` URLs as for the target.
fn signal_options(args: &Args, load: &nyann_load::RunOptions) -> SignalOptions {
    let ca_certs = load.client.ca_certs.iter();
    args.signals
        .to_options(ca_certs.map(|c| c.as_ref().to_vec()).collect())
}

/// 0 when the run completed or stopped on congestion (the feature working);
/// 1 when it was aborted or a failed policy call stopped a sweep
/// (`--on-policy-error stop`; with several sweeps, any of them); 130 when
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
