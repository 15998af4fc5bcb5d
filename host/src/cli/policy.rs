//! `nyann-bench policy ...` (scaffold: being built).

use std::process::ExitCode;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print a policy's name, version, summary and parameters.
    Describe,
}

pub async fn run(_command: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`nyann-bench policy` is not built yet")
}
