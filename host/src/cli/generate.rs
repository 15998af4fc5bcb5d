//! `nyann-bench generate`: run a scenario (or a single stage described by
//! flags) against an OpenAI-compatible server, print the per-stage table and
//! the conclusion on stderr, the JSON summary on stdout when it is not a
//! terminal (or with `--json`), and write `--output-dir` files.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nyann_load::Live;
use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType, parse_duration};
use nyann_signals::SignalOptions;

use super::Ui;
use super::check::PolicyArgs;
use super::client::ClientArgs;
use super::interrupt::{Signals, cancel_on_signals};
use super::progress::Progress;
use super::signals::SignalArgs;
use nyann_check::conclusion::{self, Conclusion};
use nyann_check::{CongestionRecord, RunResult};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Scenario file: Starlark (`.star`) or the IR as JSON (`.json`). Without
    /// it, one stage is described by --mode/--concurrency/--rate/--duration.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

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

    #[command(flatten)]
    pub client: Box<ClientArgs>,

    #[command(flatten)]
    pub single: Box<SingleStageArgs>,

    #[command(flatten)]
    pub signals: Box<SignalArgs>,

    #[command(flatten)]
    pub policy: PolicyArgs,

    #[command(flatten)]
    pub fleet: Box<super::fleet::FleetArgs>,
}

/// A one-stage scenario from flags (only without --config).
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Single stage (without --config)")]
pub struct SingleStageArgs {
    /// Load mode [default: concurrent, or constant when --rate is given].
    #[arg(long, value_parser = ["concurrent", "constant", "poisson"])]
    pub mode: Option<String>,
    /// Closed-loop streams (concurrent mode) [default: 1].
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Arrivals per second (constant and poisson modes).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stage duration [default: 60s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// End the stage after this many requests [default: no limit].
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Open loop: at most this many requests in flight; later arrivals are dropped.
    #[arg(long)]
    pub max_inflight: Option<u32>,
    /// Prompt generator [default: faker].
    #[arg(long, value_parser = ["synthetic", "faker", "corpus"])]
    pub workload: Option<String>,
    /// Corpus file or directory (workload corpus).
    #[arg(long, value_name = "PATH")]
    pub corpus: Option<String>,
    /// Input length in tokens [default: 128].
    #[arg(long)]
    pub isl: Option<u32>,
    /// Output length in tokens [default: 256].
    #[arg(long)]
    pub osl: Option<u32>,
    /// Turns per conversation [default: 1].
    #[arg(long)]
    pub turns: Option<u32>,
}

impl SingleStageArgs {
    fn any(&self) -> bool {
        self.mode.is_some()
            || self.concurrency.is_some()
            || self.rate.is_some()
            || self.duration.is_some()
            || self.max_requests.is_some()
            || self.max_inflight.is_some()
            || self.workload.is_some()
            || self.corpus.is_some()
            || self.isl.is_some()
            || self.osl.is_some()
            || self.turns.is_some()
    }

    fn scenario(&self) -> anyhow::Result<Scenario> {
        // The scenario language refuses these too: a stage is a closed loop
        // of streams or an open loop at a rate, never both.
        match (self.mode.as_deref(), self.rate, self.concurrency) {
            (_, Some(rate), Some(c)) => anyhow::bail!(
                "--rate {rate} and --concurrency {c} are two kinds of load: --concurrency runs \
                 closed-loop streams, --rate an open loop of arrivals per second; give one \
                 (an open loop caps its requests in flight with --max-inflight)"
            ),
            (Some("concurrent"), Some(_), None) => anyhow::bail!(
                "--mode concurrent runs closed-loop streams: give --concurrency, or --mode \
                 constant/poisson with --rate"
            ),
            (Some(mode @ ("constant" | "poisson")), None, Some(_)) => anyhow::bail!(
                "--mode {mode} is an open loop at --rate arrivals per second: give --rate, or \
                 --mode concurrent with --concurrency"
            ),
            _ => {}
        }
        let mode = match (self.mode.as_deref(), self.rate) {
            (Some("constant"), _) | (None, Some(_)) => Mode::Constant,
            (Some("poisson"), _) => Mode::Poisson,
            _ => Mode::Concurrent,
        };
        if mode != Mode::Concurrent && self.rate.is_none() {
            anyhow::bail!("--mode constant/poisson needs --rate");
        }
        let kind = match self.workload.as_deref() {
            Some("synthetic") => WorkloadType::Synthetic,
            Some("corpus") => WorkloadType::Corpus,
            _ => WorkloadType::Faker,
        };
        let defaults = Workload::default();
        let workload = Workload {
            kind,
            isl: self.isl.unwrap_or(defaults.isl),
            osl: self.osl.unwrap_or(defaults.osl),
            turns: self.turns.unwrap_or(1),
            corpus_path: self.corpus.clone(),
            ..defaults
        };
        let duration_s = self
            .duration
            .unwrap_or(Duration::from_secs(60))
            .as_secs_f64();
        let stage = Stage {
            concurrency: (mode == Mode::Concurrent).then(|| self.concurrency.unwrap_or(1)),
            rate: if mode == Mode::Concurrent {
                None
            } else {
                self.rate
            },
            max_inflight: self.max_inflight.unwrap_or(0),
            max_requests: self.max_requests.unwrap_or(0),
            ..Stage::new(duration_s, mode)
        };
        Ok(Scenario {
            target: None,
            model: None,
            workload,
            steps: vec![Step::Stage(stage)],
        })
    }
}

pub async fn run(args: Args, ui: Ui) -> anyhow::Result<ExitCode> {
    if args.fleet.active() {
        return super::fleet::run(args, ui).await;
    }
    let (scenario, source) = load_scenario(&args)?;
    run_scenario(&scenario, source.as_deref(), &args, Summary::Stdout, ui).await
}

/// The scenario of `--config`, or of the single-stage flags; with the
/// Starlark source when it was compiled from one.
pub(super) fn load_scenario(args: &Args) -> anyhow::Result<(Scenario, Option<String>)> {
    Ok(match &args.config {
        Some(path) => {
            if args.single.any() {
                anyhow::bail!(
                    "--config describes the stages: drop the single-stage flags (--mode, --concurrency, --rate, ...)"
                );
            }
            // Its errors name the file (and line) themselves.
            let (scenario, source) = nyann_scenario::load_file_with_source(path)?;
            // The source is saved with the results when it was Starlark (a
            // JSON IR is saved as scenario.json anyway).
            let starlark = path.extension().is_some_and(|e| e == "star");
            (scenario, starlark.then_some(source))
        }
        None => (args.single.scenario()?, None),
    })
}

/// Where the JSON summary goes besides `--output-dir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Summary {
    /// Printed on stdout (for scripts).
    Stdout,
    /// Not printed (the demo: the table says it all).
    Quiet,
}

/// Run a compiled scenario with the flags of `args` (its `--config` and
/// single-stage flags are not looked at): check everything that can fail
/// before load is sent, run the stages with the congestion check, and report.
/// `source` is the Starlark text it was compiled from, if any (saved with
/// the results).
pub async fn run_scenario(
    scenario: &Scenario,
    source: Option<&str>,
    args: &Args,
    summary: Summary,
    ui: Ui,
) -> anyhow::Result<ExitCode> {
    if let Some(dir) = &args.output_dir {
        refuse_a_previous_run(dir, args.overwrite)?;
    }
    let mut options = args.client.to_options()?;
    options.output_dir = args.output_dir.clone();
    let signals = signal_options(args, &options);
    let check = super::check::prepare(scenario, &signals, &args.policy).await?;
    if let Some(limit) = nyann_load::raise_fd_limit() {
        tracing::debug!("open-files limit: {limit}");
    }
    let live = Arc::new(Live::new());
    options.live = Some(live.clone());
    if let Some(addr) = args.client.metrics {
        let bound = nyann_load::metrics::serve(addr, live.clone())
            .await
            .with_context(|| format!("serving --metrics on {addr}"))?;
        tracing::info!("client metrics: http://{bound}/metrics");
    }
    let signals = cancel_on_signals(options.interrupt.clone(), options.interrupt_now.clone());
    tracing::info!("seed {}", options.seed);
    if let Some(check) = &check {
        check.start();
    }

    let progress = (ui.terminal && !ui.quiet).then(|| Progress::start(live));
    let result = nyann_load::run(scenario, options, check).await;
    if let Some(progress) = progress {
        progress.finish().await;
    }
    let result = match result {
        Ok(result) => result,
        Err(nyann_load::RunError::Interrupted) => {
            eprintln!("interrupted before any load was sent");
            return Ok(ExitCode::from(130));
        }
        Err(err) => return Err(super::client::explain(err)),
    };

    let conclusion = Conclusion::of(&result, 1);
    if let Some(dir) = &args.output_dir {
        write_conclusion(dir, &result, &conclusion);
        save_report(dir, &result, scenario, source, &signals).await;
    }
    show_ending(&result, &conclusion, args.output_dir.as_deref(), ui);
    if summary == Summary::Stdout {
        print_summary(&result, &conclusion, args.json)?;
    }
    Ok(ExitCode::from(exit_code(&result)))
}

/// Refuses an output directory that holds a run already (its results would
/// be overwritten), unless asked to overwrite it.
pub(super) fn refuse_a_previous_run(dir: &std::path::Path, overwrite: bool) -> anyhow::Result<()> {
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
pub(super) fn write_conclusion<R: serde::Serialize>(
    dir: &std::path::Path,
    result: &R,
    conclusion: &Conclusion,
) {
    if let Err(err) = conclusion::write_summary(dir, result, conclusion) {
        tracing::warn!("summary.json was not rewritten with the conclusion: {err}");
    }
}

/// The summary (as `summary.json` holds it) on stdout, for scripts: when
/// stdout is a pipe or a file, or with `--json`.
pub(super) fn print_summary<R: serde::Serialize>(
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
pub(super) fn show_ending(
    result: &RunResult,
    conclusion: &Conclusion,
    dir: Option<&std::path::Path>,
    ui: Ui,
) {
    if ui.quiet {
        eprintln!("{}", nyann_report::outcome_line(result));
        return;
    }
    eprint!("{}", nyann_report::stage_table(result));
    eprintln!("{}", nyann_report::outcome_line(result));
    eprint!("{}", conclusion.lines());
    if let Some(dir) = dir {
        eprintln!(
            "results: {} (summary.json, stages.json, requests.jsonl, report.html)",
            dir.display()
        );
    }
}

/// Longest the HTML report may take to build after a run: charts are drawn
/// in bounded time whatever the values, so this is a backstop.
const REPORT_TIME_LIMIT: Duration = Duration::from_secs(60);

/// Saves the scenario beside the run's results and writes `report.html`.
/// The results are already on disk: a failure here is a warning, and so is
/// a report that takes longer than [`REPORT_TIME_LIMIT`] or is interrupted
/// (Ctrl-C or SIGTERM): it never keeps the run from ending. The report is
/// built on a thread of its own, left behind if it does not finish.
pub(super) async fn save_report(
    dir: &std::path::Path,
    result: &RunResult,
    scenario: &Scenario,
    source: Option<&str>,
    signals: &Signals,
) {
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
            () = signals.next() => Err(anyhow::anyhow!("interrupted; the results are saved")),
        },
    };
    if let Err(err) = saved {
        tracing::warn!(
            "the HTML report was not written: {err:#} (`nyann-bench report {}` builds it)",
            dir.display()
        );
    }
}

/// Writes the scenario files and `report.html` of a run into `dir`.
fn write_report(
    dir: &std::path::Path,
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
pub(super) fn signal_options(args: &Args, load: &nyann_load::RunOptions) -> SignalOptions {
    let ca_certs = load.client.ca_certs.iter();
    args.signals
        .to_options(ca_certs.map(|c| c.as_ref().to_vec()).collect())
}

/// 0 when the run completed or stopped on congestion (the feature working);
/// 1 when it was aborted or a failed policy call stopped a sweep
/// (`--on-policy-error stop`; with several sweeps, any of them); 130 when
/// interrupted.
pub(super) fn exit_code(result: &RunResult) -> u8 {
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
