//! `nyann-bench scenario` (scaffold: being built).

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`nyann-bench scenario` is not built yet")
}
