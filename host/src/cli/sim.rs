//! `nyann-bench sim`: serve the simulated vLLM engine until Ctrl-C/SIGTERM,
//! printing every listening address on stdout first so scripts can read them;
//! `--print-profile` prints the server profile instead. `nyann-bench sim fit`
//! fits a profile to recorded sweeps (`fit.rs`).

mod args;
mod fit;
mod predict;

pub use args::{SimArgs, flag_error};

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::{Context as _, bail};

/// How the simulator spends time, for `sim --help`.
const TIME_MODEL_HELP: &str = "\
The time model: an engine step (vLLM's continuous batching: running sequences first, then \
admissions within --max-num-batched-tokens) lasts
    step_overhead + prefill_per_token x prompt tokens computed
  + decode_per_seq x decoding sequences + decode_per_context_token x KV tokens they read
times (1 + jitter x u), u uniform in [-1, 1], and the drift's slowly varying factor (mean 1). \
A request reaches the queue request_overhead (half to 1.5 times it) after it arrives; TTFT \
counts that. Preempted sequences recompute prompt and output as prefill. With --disaggregated \
the prefill engine computes the prompt (one token, not the client's), its KV reaches the \
decode engine's queue kv_transfer + kv_transfer_per_token x prompt tokens later, and the \
decode engine's first step produces the client's first token.

Prefix cache (vLLM's automatic prefix caching, on unless --no-enable-prefix-caching): a finished request's full KV blocks stay cached, keyed by a hash of their tokens and all before them, and are evicted least recently used first when blocks run out. A prompt that starts with cached blocks (a later turn of a conversation: earlier prompts and replies) computes only the rest: prompt tokens computed excludes the cached ones. /metrics counts vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total in tokens.

Profiles: --profile default|fast|vllm-cpu-ref, or --profile-file FILE (TOML, times in \
microseconds; --print-profile writes the resolved one). `nyann-bench sim fit RUN_DIR...` fits \
the time model to recorded sweeps of a real server and writes such a file.";

/// `nyann-bench sim` and its subcommand.
#[derive(Debug, clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_long_help = TIME_MODEL_HELP
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub sim: SimArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Fit a server profile (the time model) to recorded sweeps of a real
    /// server, and write it as a file for `sim --profile-file`.
    Fit(fit::Args),
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(Command::Fit(fit)) = args.command {
        return fit::run(fit).await;
    }
    let print_profile = args.sim.print_profile;
    let config = args.sim.config();
    if print_profile {
        config.validate().map_err(args::config_error)?;
        let Some(profile) = config.server_profile().await? else {
            bail!("the fast profile has no engine, so no profile to print: pick another --profile");
        };
        print!(
            "{}",
            profile.to_toml("a nyann-bench simulator profile (sim --profile-file FILE)")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let sim = nyann_sim::start(config).await.map_err(flag_error)?;
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
