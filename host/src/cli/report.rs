//! `nyann-bench report`: (re)build the HTML report from the files runs
//! saved with `--output-dir`; several directories are overlaid in one page
//! for comparison (before/after a server change).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use nyann_report::SavedRun;
use nyann_results::ReadError;

use super::Ui;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Results directories (`generate --output-dir`); with several, the runs
    /// are overlaid in one report.
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,

    /// Name of a run in the report, in the order of the directories
    /// (repeatable) [default: the directory's name].
    #[arg(long = "label", value_name = "NAME")]
    pub labels: Vec<String>,

    /// Where to write the report [default: DIR/report.html with one
    /// directory, ./report.html with several].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

pub async fn run(args: Args, ui: Ui) -> anyhow::Result<ExitCode> {
    if args.labels.len() > args.dirs.len() {
        anyhow::bail!(
            "{} --label values for {} directories: give at most one label per directory, in the same order",
            args.labels.len(),
            args.dirs.len()
        );
    }
    let started = Instant::now();
    let mut labels = args.labels.into_iter();
    let mut runs = Vec::with_capacity(args.dirs.len());
    for dir in &args.dirs {
        // Its errors name the directory or the file already.
        let run = SavedRun::load(dir, labels.next()).map_err(|e| not_a_run_hint(e.into()))?;
        runs.push(run);
    }
    let output = match (&args.output, args.dirs.as_slice()) {
        (Some(path), _) => path.clone(),
        (None, [one]) => one.join(nyann_results::REPORT),
        (None, _) => PathBuf::from(nyann_results::REPORT),
    };
    let size = nyann_report::write_html(&runs, &output)?;
    if !ui.quiet {
        eprintln!(
            "wrote {} ({} KB, {} run{}) in {:.2} s",
            output.display(),
            size.div_ceil(1024),
            runs.len(),
            if runs.len() == 1 { "" } else { "s" },
            started.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A directory that holds no run, with the command that writes one.
pub fn not_a_run_hint(err: anyhow::Error) -> anyhow::Error {
    use nyann_report::ReportError;
    // `ReportError::Read` is transparent: the chain skips the inner error.
    let not_a_run = err.chain().any(|e| match e.downcast_ref::<ReportError>() {
        Some(ReportError::Read(read)) => holds_no_run(read),
        _ => e.downcast_ref::<ReadError>().is_some_and(holds_no_run),
    });
    match not_a_run {
        true => anyhow::anyhow!("{err} ({WRITES_A_RUN})"),
        false => err,
    }
}

/// What writes a run directory: the hint of an error that found none.
pub const WRITES_A_RUN: &str = "`nyann-bench generate --output-dir DIR` writes one";

/// The directory holds no run (rather than an unreadable one).
pub fn holds_no_run(e: &ReadError) -> bool {
    matches!(e, ReadError::NotADirectory(_) | ReadError::Missing { .. })
}
