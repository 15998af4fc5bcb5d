//! `nyann-bench scenario FILE`: compile a scenario (`.star`, or an IR `.json`
//! to check it) and print its IR as pretty JSON on stdout. Errors go to
//! stderr, one `file:line:col: message` per line, and the exit code is 1.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The scenario: a Starlark file (.star) or a scenario IR file (.json).
    pub file: PathBuf,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let scenario = match nyann_scenario::load_file(&args.file) {
        Ok(scenario) => scenario,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let json =
        serde_json::to_string_pretty(&scenario).context("cannot encode the scenario IR as JSON")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{json}").context("cannot write to stdout")?;
    Ok(ExitCode::SUCCESS)
}
