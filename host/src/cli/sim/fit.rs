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

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use nyann_sim::ServerProfile;
use nyann_sim::engine::{DEFAULT_KV_TRANSFER, DEFAULT_KV_TRANSFER_PER_TOKEN, TimeModel};
use nyann_sim::fit::{self, Fit, FitSettings};
use nyann_sim::profile::{EngineSpec, Limits};

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
    #[arg(long, value_name = "RUN_DIR")]
    pub check: Vec<PathBuf>,

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
    #[arg(long, help_heading = "The server")]
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
        default_value_t = DEFAULT_KV_TRANSFER * 1e6,
        help_heading = "Disaggregated server (held, not fitted)"
    )]
    pub kv_transfer_us: f64,

    /// A disaggregated server's KV transfer time per prompt token, in microseconds.
    #[arg(
        long,
        value_name = "US",
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
    if args
        .chars_per_token
        .is_some_and(|k| !(k.is_finite() && k > 0.0))
    {
        bail!("--chars-per-token must be a positive number");
    }
    for (flag, us) in [
        ("--kv-transfer-us", args.kv_transfer_us),
        ("--kv-transfer-per-token-us", args.kv_transfer_per_token_us),
    ] {
        if !(us.is_finite() && us >= 0.0) {
            bail!("{flag} must be a number of microseconds >= 0, got {us}");
        }
    }
    // What the runs saved about their server (runs recorded by this
    // version save all a fit needs besides the flags' defaults).
    let mut recorded = Vec::new();
    for dir in &args.runs {
        let dir = dir.clone();
        recorded.push(tokio::task::spawn_blocking(move || fit::read_server(&dir)).await??);
    }
    let known_template = args
        .chat_template_tokens
        .or_else(|| recorded.iter().find_map(|r| r.chat_template_tokens));
    let count = fit::PromptCount {
        chars_per_token: args
            .chars_per_token
            .or_else(|| recorded.iter().find_map(|r| r.chars_per_token)),
        chat_template_tokens: known_template.unwrap_or(0),
    };
    let mut missing = Vec::new();
    let mut runs = Vec::new();
    let mut sizes = Vec::new();
    for dir in &args.runs {
        let dir = dir.clone();
        let recording =
            match tokio::task::spawn_blocking(move || fit::read_recording(&dir, count)).await? {
                Err(fit::RecordingError::NoPromptTokens { file, .. }) => {
                    missing.push(format!(
                        "the prompts' tokens ({} has no `usage`, and the run saved no \
                         /tokenize measure): record with --stream-usage, or give \
                         --chars-per-token K (the `ISL calibration` line of the run's log)",
                        file.display()
                    ));
                    continue;
                }
                other => other.map_err(with_flags)?,
            };
        for skipped in &recording.skipped {
            tracing::warn!("left out: {skipped}");
        }
        sizes.extend(recording.prompt_sizes);
        runs.push(recording.run);
    }
    let template =
        known_template.or_else(|| fit::chat_template_tokens(&sizes).map(|t| t.round() as u32));
    if template.is_none() {
        missing.push(
            "the tokens the chat template adds: give --chat-template-tokens N (the server's \
             /tokenize of a one-message chat less that of its text), or record two prompt \
             lengths with --stream-usage"
                .to_string(),
        );
    }
    // A disaggregated recording (prefill and decode roles' signals) fits a
    // prefill engine and a decode engine, each with its own limits.
    let disaggregated = runs.iter().any(fit::RecordedRun::is_disaggregated);
    if disaggregated && !runs.iter().all(fit::RecordedRun::is_disaggregated) {
        bail!(
            "the runs mix a disaggregated server (prefill and decode roles' signals) and a \
             single engine: fit each kind on its own"
        );
    }
    let server_role = disaggregated.then_some("decode");
    let (limits, limits_note) =
        server_limits(&args, &recorded, &runs, server_role, &mut missing).await?;
    let mut limits_notes: Vec<String> = limits_note.into_iter().collect();
    let prefill_limits = if disaggregated {
        let (prefill, note) =
            server_limits(&args, &recorded, &runs, Some("prefill"), &mut missing).await?;
        limits_notes.extend(note);
        prefill
    } else {
        None
    };
    if !missing.is_empty() {
        bail!(
            "the fit needs what the run(s) did not record (a run recorded by this version \
             with --scrape saves it):\n  - {}",
            missing.join("\n  - ")
        );
    }
    let (Some(limits), Some(template)) = (limits, template) else {
        bail!("the fit's inputs are incomplete");
    };
    let settings = FitSettings {
        limits,
        prefill: prefill_limits,
        noise: TimeModel {
            step_overhead: 0.0,
            prefill_per_token: 0.0,
            decode_per_seq: 0.0,
            decode_per_context_token: 0.0,
            request_overhead: 0.0,
            jitter: args.jitter,
            drift: args.drift,
            drift_time: args.drift_time_ms / 1e3,
            // Given: a recording cannot tell it from the request overhead
            // (and an aggregate one has none).
            kv_transfer: args.kv_transfer_us / 1e6,
            kv_transfer_per_token: args.kv_transfer_per_token_us / 1e6,
        },
        seed: args.seed,
        max_evaluations: args.max_evaluations,
    };
    let stages: usize = runs.iter().map(|r| r.stages.len()).sum();
    tracing::info!(
        "fitting the time model to {stages} stages of {} run(s) (at most {} simulated sweeps)",
        runs.len(),
        args.max_evaluations
    );
    let fitted = tokio::task::spawn_blocking(move || fit::fit(&runs, &settings)).await??;
    let engine = EngineSpec {
        limits,
        time: fitted.time,
    };

    let profile = ServerProfile {
        name: args.name.clone(),
        description: format!(
            "fitted by nyann-bench sim fit from {}",
            args.runs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        chat_template_tokens: template,
        default_max_tokens: 256,
        engine,
        // Disaggregated, the decode engine is the base the prefill engine's
        // section differs from.
        prefill: prefill_limits
            .zip(fitted.prefill)
            .map(|(limits, time)| EngineSpec { limits, time }),
        decode: disaggregated.then_some(engine),
        disaggregated,
    };
    let mut notes = fitted.notes.clone();
    notes.extend(limits_notes);
    print!("{}", report(&fitted, &profile, &notes));
    let comment = format!(
        "nyann-bench simulator profile (sim --profile-file FILE)\nrms log-ratio of the fit: {:.3}\n{}",
        fitted.rms,
        notes.join("\n")
    );
    std::fs::write(&args.output, profile.to_toml(&comment))
        .with_context(|| format!("writing {}", args.output.display()))?;
    println!(
        "\nwrote {}: nyann-bench sim --profile-file {}",
        args.output.display(),
        args.output.display()
    );
    let serving = fit::Serving::of(&profile);
    for dir in &args.check {
        let (dir, seed) = (dir.clone(), args.seed);
        let held_out = fit::read_server(&dir)?;
        let count = fit::PromptCount {
            chars_per_token: args
                .chars_per_token
                .or(held_out.chars_per_token)
                .or(count.chars_per_token),
            chat_template_tokens: args
                .chat_template_tokens
                .or(held_out.chat_template_tokens)
                .unwrap_or(template),
        };
        let text = tokio::task::spawn_blocking(move || {
            super::predict::check_run(&dir, count, &serving, seed)
        })
        .await??;
        print!("{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The limits of one engine (`role`: a disaggregated server's `prefill` or
/// `decode` engine; `None`, the single one): flags first (for every
/// engine), then the saved server answers (the role's own `/metrics` text;
/// for a single engine, the run's), then what the run directories recorded; with a note
/// when `max_num_seqs` was inferred. `None` (and `missing` told why) when
/// the KV cache is not known.
async fn server_limits(
    args: &Args,
    recorded: &[fit::RecordedServer],
    runs: &[fit::RecordedRun],
    role: Option<&str>,
    missing: &mut Vec<String>,
) -> anyhow::Result<(Option<Limits>, Option<String>)> {
    let role_text = |r: &fit::RecordedServer| {
        let (_, path) = r
            .role_metrics_texts
            .iter()
            .find(|(name, _)| Some(name.as_str()) == role)?;
        Some(path.clone())
    };
    let metrics_file = args
        .metrics_file
        .clone()
        .or_else(|| recorded.iter().find_map(role_text))
        // An engine of a disaggregated server is never sized from another
        // engine's text: the run's is the first role's.
        .or_else(|| {
            role.is_none()
                .then(|| recorded.iter().find_map(|r| r.metrics_text.clone()))
                .flatten()
        });
    let cache = match &metrics_file {
        Some(path) => Some(cache_config(path).await?),
        None => None,
    };
    // The server's prefix caching as its metrics say (vLLM V1's default, on, without them).
    let enable_prefix_caching = cache.is_none_or(|c| c.prefix_caching);
    let (kv_blocks, block_size) = match (args.kv_blocks, args.block_size, cache) {
        (Some(k), Some(b), _) => (k, b),
        (k, b, Some(c)) => (k.unwrap_or(c.kv_blocks), b.unwrap_or(c.block_size)),
        _ => {
            let whose = match role {
                Some(role) => format!(
                    "the {role} engine's KV cache: record with --scrape {role}=URL (the run \
                     saves its /metrics text), or give"
                ),
                None => "the server's KV cache: give".to_string(),
            };
            missing.push(format!(
                "{whose} --metrics-file FILE (a saved `curl http://HOST:8000/metrics`), or \
                 --kv-blocks N and --block-size N"
            ));
            return Ok((None, None));
        }
    };
    if kv_blocks == 0 || block_size == 0 {
        bail!("--kv-blocks and --block-size must be at least 1");
    }
    let max_model_len = match (args.max_model_len, &args.models_file) {
        (Some(len), _) => Some(len),
        (None, Some(path)) => Some(model_len(path).await?),
        (None, None) => recorded.iter().find_map(|r| r.max_model_len),
    };
    let (max_num_seqs, note) = match args.max_num_seqs {
        Some(n) => (n, None),
        None => {
            let (n, why) = if role == Some("prefill") {
                fit::prefill_max_num_seqs(runs, args.max_num_batched_tokens)
            } else {
                fit::max_num_seqs(runs)
            };
            let whose = role.map_or(String::new(), |r| format!("{r} engine's "));
            (
                n,
                Some(format!(
                    "{whose}max_num_seqs {n} ({why}; --max-num-seqs sets it)"
                )),
            )
        }
    };
    let limits = Limits {
        max_num_seqs: max_num_seqs.max(1),
        max_num_batched_tokens: args.max_num_batched_tokens.max(1),
        kv_blocks,
        block_size,
        max_model_len,
        enable_prefix_caching,
    };
    Ok((Some(limits), note))
}

/// What a saved `/metrics` text says about the server's KV cache.
#[derive(Clone, Copy)]
struct CacheConfig {
    kv_blocks: u32,
    block_size: u32,
    prefix_caching: bool,
}

/// The KV cache from `vllm:cache_config_info` in a saved `/metrics` text.
/// vLLM counts one null block in `num_gpu_blocks`.
async fn cache_config(path: &Path) -> anyhow::Result<CacheConfig> {
    let text = tokio::fs::read_to_string(path)
        .await
        .with_context(|| format!("cannot read the /metrics text {}", path.display()))?;
    let parsed = nyann_signals::exposition::parse(&text);
    let info = parsed
        .samples
        .iter()
        .find(|s| s.name == "vllm:cache_config_info" || s.name == "vllm_cache_config_info")
        .with_context(|| {
            format!(
                "{} has no vllm:cache_config_info: is it a vLLM /metrics text? \
                 Give --kv-blocks and --block-size instead",
                path.display()
            )
        })?;
    let number = |label: &str| -> anyhow::Result<u32> {
        info.label(label)
            .and_then(|v| v.parse().ok())
            .with_context(|| {
                format!(
                    "{}: vllm:cache_config_info has no numeric `{label}` label; give \
                     --kv-blocks and --block-size instead",
                    path.display()
                )
            })
    };
    let blocks = number("num_gpu_blocks")?;
    Ok(CacheConfig {
        kv_blocks: blocks.saturating_sub(1).max(1),
        block_size: number("block_size")?,
        prefix_caching: info.label("enable_prefix_caching") != Some("False"),
    })
}

/// `max_model_len` of the first model in a saved `/v1/models` answer.
async fn model_len(path: &Path) -> anyhow::Result<u32> {
    let text = tokio::fs::read_to_string(path)
        .await
        .with_context(|| format!("cannot read --models-file {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON (a saved /v1/models answer)", path.display()))?;
    json["data"][0]["max_model_len"]
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .with_context(|| {
            format!(
                "{} has no data[0].max_model_len: give --max-model-len instead",
                path.display()
            )
        })
}

/// The parameters, the residual of every stage and the notes.
fn report(fitted: &Fit, profile: &ServerProfile, notes: &[String]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "time model fitted over {} simulated sweeps (rms log-ratio {:.3}):",
        fitted.evaluations, fitted.rms
    );
    // A disaggregated server's engines side by side.
    let engines: Vec<(&str, TimeModel)> = match profile.prefill.filter(|_| profile.disaggregated) {
        Some(prefill) => vec![("prefill", prefill.time), ("decode", profile.engine.time)],
        None => vec![("", profile.engine.time)],
    };
    if engines.len() > 1 {
        let _ = write!(out, "  {:<28}", "");
        for (role, _) in &engines {
            let _ = write!(out, " {role:>10}");
        }
        let _ = writeln!(out);
    }
    let costs = |t: &TimeModel| {
        [
            t.step_overhead,
            t.prefill_per_token,
            t.decode_per_seq,
            t.decode_per_context_token,
            t.request_overhead,
        ]
    };
    for (i, name) in [
        "step_overhead_us",
        "prefill_per_token_us",
        "decode_per_seq_us",
        "decode_per_context_token_us",
        "request_overhead_us",
    ]
    .into_iter()
    .enumerate()
    {
        let _ = write!(out, "  {name:<28}");
        for (_, t) in &engines {
            let _ = write!(out, " {:>10.3}", costs(t)[i] * 1e6);
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "  chat_template_tokens         {:>10}",
        profile.chat_template_tokens
    );
    let _ = writeln!(
        out,
        "\nresidual per stage (simulated, and its error against the recording):"
    );
    for stage in &fitted.residuals {
        let _ = writeln!(out, "  {} {}: {stage}", stage.run, stage.label);
    }
    for note in notes {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

/// A recording the fit cannot read, with the flags that get past it.
fn with_flags(err: fit::RecordingError) -> anyhow::Error {
    let hint = match &err {
        fit::RecordingError::NoRecords { .. } => "a sweep run with --output-dir writes it",
        _ => return err.into(),
    };
    anyhow::anyhow!("{err} ({hint})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// A disaggregated run that saved only the decode engine's `/metrics`:
    /// the prefill engine's KV cache is missing, and said so, not taken from
    /// the decode engine's text.
    #[tokio::test]
    async fn an_engine_is_not_sized_from_another_engines_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let decode = dir.path().join("decode-0-end.txt");
        std::fs::write(
            &decode,
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1024\"} 1\n",
        )
        .unwrap();
        let recorded = [fit::RecordedServer {
            metrics_text: Some(decode.clone()),
            role_metrics_texts: vec![("decode".to_string(), decode)],
            ..fit::RecordedServer::default()
        }];
        let args = Cli::parse_from(["fit", "RUN"]).args;
        let mut missing = Vec::new();
        let (decode_limits, _) = server_limits(&args, &recorded, &[], Some("decode"), &mut missing)
            .await
            .unwrap();
        assert_eq!(decode_limits.map(|l| l.kv_blocks), Some(1023));
        let (prefill_limits, _) =
            server_limits(&args, &recorded, &[], Some("prefill"), &mut missing)
                .await
                .unwrap();
        assert_eq!(prefill_limits, None);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].contains("the prefill engine's KV cache: record with --scrape prefill="),
            "{missing:?}"
        );
    }
}
