//! `nyann-bench sim fit RUN_DIR...`: fit the simulator's time model to the
//! results directories of real sweeps, print the parameters with the
//! residual of every stage, and write the profile file that `sim
//! --profile-file` loads: a twin of the recorded deployment.
//!
//! The server's limits are not fitted: the KV cache comes from a saved
//! `/metrics` text (`vllm:cache_config_info`) or the flags, `max_model_len`
//! from a saved `/v1/models` answer or the flag, the rest from the flags
//! (vLLM's defaults otherwise). A disaggregated recording (its judged stages
//! carry signals of roles `prefill` and `decode`) fits a twin of a prefill
//! engine and a decode engine, each engine's KV cache from its role's saved
//! `/metrics` text; the profile it writes says `disaggregated = true`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use nyann_sim::engine::{DEFAULT_KV_TRANSFER, DEFAULT_KV_TRANSFER_PER_TOKEN};
use nyann_sim::fit::{self, FitRequest, GivenServer};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Results directories of sweeps of the server (`generate --output-dir`):
    /// their stages.json and requests.jsonl. Sweeps with different prompt or
    /// output lengths let the fit tell every cost apart.
    #[arg(value_name = "RUN_DIR", required = true)]
    pub runs: Vec<PathBuf>,

    /// A run the fit does not use, predicted with the fitted profile: per
    /// stage the predicted and recorded figures, and the stage where each
    /// standard rule would stop (repeatable).
    /// (`--check` is its former name.)
    #[arg(long, value_name = "RUN_DIR", alias = "check")]
    pub held_out: Vec<PathBuf>,

    /// Where to write the profile (refused if it exists, unless --force).
    #[arg(
        short,
        long,
        value_name = "FILE",
        default_value = "fitted-profile.toml"
    )]
    pub output: PathBuf,

    /// Overwrite --output if it exists.
    #[arg(long)]
    pub force: bool,

    /// Name of the profile.
    #[arg(long, default_value = "fitted")]
    pub name: String,

    /// A saved /metrics text of the server (`curl http://HOST:8000/metrics`):
    /// its KV cache size and block size (vllm:cache_config_info).
    #[arg(long, value_name = "FILE", help_heading = "The server")]
    pub metrics_file: Option<PathBuf>,

    /// A saved /v1/models answer of the server (`curl
    /// http://HOST:8000/v1/models`): its max_model_len.
    #[arg(long, value_name = "FILE", help_heading = "The server")]
    pub models_file: Option<PathBuf>,

    /// The server's usable KV blocks (vLLM's num_gpu_blocks minus its null
    /// block) [default: from --metrics-file].
    #[arg(long, help_heading = "The server")]
    pub kv_blocks: Option<u32>,

    /// The server's KV block size [default: from --metrics-file].
    #[arg(long, help_heading = "The server")]
    pub block_size: Option<u32>,

    /// The server's --max-num-seqs [default: inferred from the runs: the
    /// running requests of a stage that queued with KV cache to spare, else
    /// the highest level (a limit above it changes nothing in the replay)].
    #[arg(long, help_heading = "The server")]
    pub max_num_seqs: Option<u32>,

    /// The server's --max-num-batched-tokens.
    #[arg(long, default_value_t = 2048, help_heading = "The server")]
    pub max_num_batched_tokens: u32,

    /// The server's --max-model-len [default: from --models-file, else the KV capacity].
    #[arg(long, help_heading = "The server")]
    pub max_model_len: Option<u32>,

    /// Tokens the server's chat template adds to a prompt [default: from
    /// the records when the sweeps used two prompt lengths, else 0].
    #[arg(long, help_heading = "The server")]
    pub chat_template_tokens: Option<u32>,

    /// Characters per token of the server's tokenizer (the `ISL calibration`
    /// line of the sweep's log), to count prompt tokens of a sweep recorded
    /// without --stream-usage [default: such a sweep is refused].
    #[arg(long, value_parser = super::args::positive_number, help_heading = "The server")]
    pub chars_per_token: Option<f64>,

    /// Step jitter of the fitted model (not fitted).
    #[arg(long, default_value_t = 0.1, help_heading = "Noise (held, not fitted)")]
    pub jitter: f64,

    /// Slow drift of the step speed (see `sim --help`); set it for a machine
    /// shared with other work, where TTFT spreads in queueing stages.
    #[arg(long, default_value_t = 0.0, help_heading = "Noise (held, not fitted)")]
    pub drift: f64,

    /// How long the drift takes to change, in milliseconds.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 500.0,
        help_heading = "Noise (held, not fitted)"
    )]
    pub drift_time_ms: f64,

    /// A disaggregated server's fixed latency of a prompt's KV transfer
    /// from the prefill engine to the decode engine, in microseconds (it adds
    /// to TTFT as the request overhead does, so it is given, not fitted).
    #[arg(
        long,
        value_name = "US",
        value_parser = super::args::microseconds,
        default_value_t = DEFAULT_KV_TRANSFER * 1e6,
        help_heading = "Disaggregated server (held, not fitted)"
    )]
    pub kv_transfer_us: f64,

    /// A disaggregated server's KV transfer time per prompt token, in microseconds.
    #[arg(
        long,
        value_name = "US",
        value_parser = super::args::microseconds,
        default_value_t = DEFAULT_KV_TRANSFER_PER_TOKEN * 1e6,
        help_heading = "Disaggregated server (held, not fitted)"
    )]
    pub kv_transfer_per_token_us: f64,

    /// Most simulated sweeps the search may run (each takes milliseconds
    /// to a tenth of a second).
    #[arg(long, default_value_t = 400)]
    pub max_evaluations: usize,

    /// Seed of the simulated sweeps.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.output.exists() && !args.force {
        bail!(
            "{} exists: give another --output, or --force to overwrite it",
            args.output.display()
        );
    }
    nyann_sim::config::check_noise(
        Some(args.jitter),
        Some(args.drift),
        Some(args.drift_time_ms),
    )
    .map_err(super::args::config_error)?;
    let request = FitRequest {
        runs: args.runs.clone(),
        server: GivenServer {
            metrics_file: args.metrics_file.clone(),
            models_file: args.models_file.clone(),
            kv_blocks: args.kv_blocks,
            block_size: args.block_size,
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_model_len: args.max_model_len,
            chat_template_tokens: args.chat_template_tokens,
            chars_per_token: args.chars_per_token,
        },
        held: fit::Held {
            jitter: args.jitter,
            drift: args.drift,
            drift_time: args.drift_time_ms / 1e3,
            kv_transfer: args.kv_transfer_us / 1e6,
            kv_transfer_per_token: args.kv_transfer_per_token_us / 1e6,
        },
        name: args.name.clone(),
        seed: args.seed,
        max_evaluations: args.max_evaluations,
    };
    let given = request.server.clone();
    let fitted = tokio::task::spawn_blocking(move || fit::fit_profile(&request))
        .await?
        .map_err(super::args::fit_error)?;
    let notes: Vec<String> = fitted
        .notes
        .iter()
        .map(super::args::note_with_flag)
        .collect();
    print!("{}", fitted.summary());
    for note in &notes {
        println!("note: {note}");
    }
    let comment = format!(
        "nyann-bench simulator profile (sim --profile-file FILE)\nrms log-ratio of the fit: {:.3}\n{}",
        fitted.fit.rms,
        notes.join("\n")
    );
    std::fs::write(&args.output, fitted.profile.to_toml(&comment))
        .with_context(|| format!("writing {}", args.output.display()))?;
    println!(
        "\nwrote {}: nyann-bench sim --profile-file {}",
        args.output.display(),
        args.output.display()
    );
    for dir in &args.held_out {
        print!(
            "{}",
            super::predict::check_held_out(dir, &fitted, &given, args.seed).await?
        );
    }
    Ok(ExitCode::SUCCESS)
}
