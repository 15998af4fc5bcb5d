//! `nyann-bench sim`: serve the simulated vLLM engine until Ctrl-C/SIGTERM,
//! printing every listening address on stdout first so scripts can read them.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;

/// Flags of `nyann-bench sim` (those of the simulator crate).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub sim: nyann_sim::SimArgs,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let sim = nyann_sim::start(args.sim)
        .await
        .context("starting the simulator")?;
    {
        // One address per line: `endpoint URL`, then `metrics ROLE URL` per /metrics.
        let mut out = std::io::stdout().lock();
        writeln!(out, "endpoint {}", sim.base_url())?;
        for (role, addr) in sim.metrics_endpoints() {
            writeln!(out, "metrics {role} http://{addr}/metrics")?;
        }
        out.flush()?;
    }
    wait_for_signal().await?;
    tracing::info!("stopping the simulator");
    sim.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(())
}
