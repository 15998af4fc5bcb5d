//! A run on the terminal, for every command that sends load (`generate`,
//! `demo`, `eval`; a fleet's leader and workers in `fleet`): the library's
//! steps ([`nyann_run`]) with Ctrl-C and SIGTERM as the stop and the
//! progress display as the consumer of the live figures, and the run's
//! words: its errors with the flags that fix them, its notices as log
//! lines, and its ending (the stage table, the conclusion, where the
//! results are, the summary on stdout, the exit code).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use nyann_check::{Conclusion, RunResult};
use nyann_run::{
    ExecuteError, Executed, Notice, Output, PrepareError, PreviousRun, Report, Run, RunSpec,
};

use super::Ui;
use super::interrupt::cancel_on_signals;
use super::progress::{Plan, Progress, Show};

/// Where a run's results go: the flags `generate` and `eval` share.
#[derive(Debug, clap::Args)]
pub struct OutputArgs {
    /// Directory for requests.jsonl (streamed), stages.json and summary.json.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,

    /// Replace the run an --output-dir already holds (by default such a
    /// directory is refused, so that no result is lost by mistake).
    #[arg(long)]
    pub overwrite: bool,

    /// Print the summary (summary.json) on stdout even on a terminal; it is
    /// printed whenever stdout is a pipe or a file.
    #[arg(long)]
    pub json: bool,
}

impl OutputArgs {
    pub fn output(&self) -> Option<Output> {
        let dir = self.output_dir.clone()?;
        Some(Output {
            dir,
            overwrite: self.overwrite,
        })
    }

    pub fn summary(&self) -> Summary {
        Summary::Stdout { json: self.json }
    }
}

/// Where the JSON summary goes besides the run directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    /// Printed on stdout when it is not a terminal, or always with `json`.
    Stdout { json: bool },
    /// Not printed (the demo: the table says it all).
    Quiet,
}

/// Runs `spec` as one process: prepared, its progress shown (off a
/// terminal a line every `progress_every`), ended.
pub async fn alone(
    spec: RunSpec,
    summary: Summary,
    progress_every: Duration,
    ui: Ui,
) -> anyhow::Result<ExitCode> {
    let run = Run::new(spec);
    cancel_on_signals(run.stop());
    let prepared = run.prepare(&notice).await.map_err(explain_prepare)?;
    let show = if ui.terminal {
        Show::Bar
    } else {
        Show::Lines(progress_every)
    };
    let plan = Plan::of(prepared.scenario());
    let progress = (!ui.quiet).then(|| Progress::start(prepared.live(), plan, show));
    let executed = prepared.execute().await;
    if let Some(progress) = progress {
        progress.finish().await;
    }
    match executed {
        Ok(executed) => end(executed, summary, ui).await,
        Err(err) if err.is_interrupted() => Ok(interrupted_before_load()),
        Err(err) => Err(explain_execute(err)),
    }
}

/// Ends the run: the conclusion into `summary.json` and the report into
/// the run directory, the ending on stderr, the summary on stdout; returns
/// the exit code.
pub async fn end(executed: Executed, summary: Summary, ui: Ui) -> anyhow::Result<ExitCode> {
    let finished = executed.finish().await;
    if let Some(dir) = &finished.dir {
        let why = match &finished.report {
            Report::NotWritten { why } => Some(why.as_str()),
            Report::Interrupted => Some("interrupted; the results are saved"),
            Report::NotAsked | Report::Written => None,
        };
        if let Some(why) = why {
            tracing::warn!(
                "the HTML report was not written: {why} (`nyann-bench report {}` builds it)",
                dir.display()
            );
        }
    }
    show_ending(
        &finished.result,
        &finished.conclusion,
        finished.dir.as_deref(),
        ui,
    );
    if let Summary::Stdout { json } = summary {
        print_summary(|| finished.summary_json(), json)?;
    }
    Ok(ExitCode::from(finished.exit_code()))
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

/// The exit code of a run interrupted before it sent anything, said once.
pub fn interrupted_before_load() -> ExitCode {
    eprintln!("interrupted before any load was sent");
    ExitCode::from(130)
}

/// A notice of the preparation, as a log line naming the flags.
pub fn notice(notice: Notice) {
    match notice {
        Notice::SignalsUnread => tracing::warn!(
            "no stage of the scenario is judged (no until_congested(...)): the server \
             signals of --scrape/--prometheus-url are not read; wrap the stages in \
             until_congested(...) to judge them (with --policy-mode monitor to record \
             the verdicts without stopping)"
        ),
        Notice::SearchWithoutStop => tracing::warn!(
            "refine= has no effect with --policy-mode monitor: no sweep stops, so no capacity \
             is searched (every stage is run and judged instead)"
        ),
        Notice::Preflight(warning) => {
            tracing::warn!("{}", super::signals::warning(&warning));
        }
    }
}

/// Why a run could not start, as users read it: with the flags that fix it.
pub fn explain_prepare(err: PrepareError) -> anyhow::Error {
    match err {
        PrepareError::PreviousRun(previous) => previous_run(&previous),
        PrepareError::LeadWithoutOutput => anyhow::anyhow!(
            "--workers needs --output-dir DIR: each worker keeps its records in DIR/worker-I \
             and the leader writes the merged results in DIR"
        ),
        PrepareError::Interrupted => Interrupted.into(),
        PrepareError::Policy(err) => super::check::explain_policy(err),
        PrepareError::Signals(err) => super::signals::explain(err),
        PrepareError::Check(err) => super::check::explain(err),
        PrepareError::Share(err) => err.into(),
        PrepareError::Fleet(err) => err.into(),
    }
}

/// An output directory that holds a run already.
pub fn previous_run(previous: &PreviousRun) -> anyhow::Error {
    let dir = previous.dir.display();
    let when = previous
        .written
        .map(|t| format!(", written {}", humantime::format_rfc3339_seconds(t)))
        .unwrap_or_default();
    anyhow::anyhow!(
        "--output-dir {dir} already holds a run ({}{when}): give a new directory \
         (e.g. {dir}/$(date +%Y%m%d-%H%M%S)), or --overwrite to replace it",
        previous.file
    )
}

/// Why the load did not run, as users read it (an interrupt is not an
/// error: see [`interrupted_before_load`]).
pub fn explain_execute(err: ExecuteError) -> anyhow::Error {
    match err {
        ExecuteError::ClientMetrics { addr, source } => {
            anyhow::Error::new(source).context(format!("serving --metrics on {addr}"))
        }
        ExecuteError::Load(err) => super::client::explain(err),
        ExecuteError::Merge { dir, source } => anyhow::Error::new(source)
            .context(format!("writing the fleet's results to {}", dir.display())),
        ExecuteError::Fleet(err) => err.into(),
        ExecuteError::Workload(err) => err.into(),
    }
}

/// The summary (as `summary.json` holds it) on stdout, for scripts: when
/// stdout is a pipe or a file, or with `--json`.
pub fn print_summary(
    summary: impl FnOnce() -> serde_json::Result<String>,
    json: bool,
) -> anyhow::Result<()> {
    if json || !std::io::stdout().is_terminal() {
        let text = summary().context("encoding the summary")?;
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
