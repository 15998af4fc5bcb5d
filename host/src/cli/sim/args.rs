//! The flags of `nyann-bench sim`, resolved into the simulator's
//! [`SimConfig`]; the simulator's and the fit's errors and notes given back
//! with the flags that set what they name.

use std::path::PathBuf;
use std::time::Duration;

use nyann_sim::fit::{FitError, FitInputError, Missing, Note, RecordingError, Setting};
use nyann_sim::{ConfigError, Profile, SimConfig, SimError};

/// Flags of `nyann-bench sim`: one per field of [`SimConfig`], named after it.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Address of the OpenAI endpoint.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port of the OpenAI endpoint (0 = ephemeral).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Model name served (`model_name` label, `/v1/models`); requests naming another model get a 404.
    #[arg(long, default_value = "nyann-sim")]
    pub model: String,

    /// Built-in server profile (limits and time model); the flags below
    /// override its values.
    #[arg(long, value_enum, default_value_t = Profile::Default, help_heading = "Server profile")]
    pub profile: Profile,

    /// Read the server profile from this TOML file instead (written by
    /// `nyann-bench sim fit`, or `--print-profile`).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "profile",
        help_heading = "Server profile"
    )]
    pub profile_file: Option<PathBuf>,

    /// Print the resolved profile as a TOML file and exit.
    #[arg(long, help_heading = "Server profile")]
    pub print_profile: bool,

    /// Most sequences running at once [default profile: 16; fast: unlimited].
    #[arg(long, help_heading = "Limits")]
    pub max_num_seqs: Option<usize>,

    /// Token budget of one engine step, the chunked-prefill budget (decodes
    /// count 1, prefill chunks their length) [default profile: 2048].
    #[arg(long, help_heading = "Limits")]
    pub max_num_batched_tokens: Option<u32>,

    /// Usable KV cache blocks [default profile: 224; fast: unlimited].
    #[arg(long, help_heading = "Limits")]
    pub kv_blocks: Option<u32>,

    /// Tokens per KV block [default profile: 16].
    #[arg(long, help_heading = "Limits")]
    pub block_size: Option<u32>,

    /// Longest prompt + output accepted [default: what the KV cache holds].
    #[arg(long, help_heading = "Limits")]
    pub max_model_len: Option<u32>,

    /// Turn the prefix cache off (vLLM's flag; on by default, as in vLLM V1):
    /// finished requests' KV blocks are then freed, not kept for later
    /// prompts that start the same way.
    #[arg(long, help_heading = "Limits")]
    pub no_enable_prefix_caching: bool,

    /// Fixed cost of every engine step, in microseconds.
    #[arg(long, value_name = "US", help_heading = "Time model")]
    pub step_overhead_us: Option<f64>,

    /// Cost per prompt token computed in a step (prefill and
    /// recompute after preemption), in microseconds.
    #[arg(long, value_name = "US", help_heading = "Time model")]
    pub prefill_per_token_us: Option<f64>,

    /// Cost per sequence decoding one token in a step, in microseconds.
    #[arg(long, value_name = "US", help_heading = "Time model")]
    pub decode_per_seq_us: Option<f64>,

    /// Cost per KV token read by the decoding sequences of a
    /// step (their context), in microseconds.
    #[arg(long, value_name = "US", help_heading = "Time model")]
    pub decode_per_context_token_us: Option<f64>,

    /// Latency of each request before it reaches the queue (the
    /// API server's work), in microseconds; counts in TTFT.
    #[arg(long, value_name = "US", help_heading = "Time model")]
    pub request_overhead_us: Option<f64>,

    /// Relative jitter of each step (0.1 = ±10%).
    #[arg(long, help_heading = "Time model")]
    pub jitter: Option<f64>,

    /// Slow drift of the step speed, the standard deviation of
    /// the log of its factor (0.35: most steps within -30%..+40% of the
    /// model, in runs of --drift-time-ms); 0 for none.
    #[arg(long, help_heading = "Time model")]
    pub drift: Option<f64>,

    /// How long the drift takes to change, in milliseconds.
    #[arg(long, value_name = "MS", help_heading = "Time model")]
    pub drift_time_ms: Option<f64>,

    /// With --disaggregated: fixed latency of a prompt's KV transfer from
    /// the prefill engine to the decode engine, in microseconds; counts in
    /// TTFT [default: 1000].
    #[arg(long, value_name = "US", help_heading = "Time model")]
    pub kv_transfer_us: Option<f64>,

    /// With --disaggregated: KV transfer time per prompt token, in
    /// microseconds [default: 2].
    #[arg(long, value_name = "US", help_heading = "Time model")]
    pub kv_transfer_per_token_us: Option<f64>,

    /// Tokens the chat template adds to every chat prompt (counted in usage
    /// and in the KV cache) [default profile: 0; vllm-cpu-ref: 16].
    #[arg(long, help_heading = "Server profile")]
    pub chat_template_tokens: Option<u32>,

    /// Requests waiting beyond this number get HTTP 429 [default: no limit].
    #[arg(long)]
    pub max_waiting: Option<usize>,

    /// Report in each response's usage how many prompt tokens the prefix
    /// cache served, as `prompt_tokens_details.cached_tokens` (vLLM's flag;
    /// off by default, as in vLLM: `prompt_tokens_details` is then null).
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,

    /// Send usage at the end of every stream, asked for or not, as vLLM's
    /// `--enable-force-include-usage` does.
    #[arg(long)]
    pub enable_force_include_usage: bool,

    /// Output tokens when a request gives no max_tokens [default and
    /// vllm-cpu-ref profiles: 256; fast: 32].
    #[arg(long, help_heading = "Server profile")]
    pub default_max_tokens: Option<u32>,

    /// Seed of every random choice (step jitter, output text, faults).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Multiplies every simulated duration (2 = twice as slow).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,

    /// Run a prefill engine and a decode engine behind the one endpoint, each with its own /metrics
    /// (on without the flag when the profile file says `disaggregated = true`, as `sim fit` writes
    /// for a prefill/decode recording).
    #[arg(long)]
    pub disaggregated: bool,

    /// Port of the prefill engine's /metrics in disaggregated mode (0 = ephemeral).
    #[arg(long, default_value_t = 0)]
    pub prefill_metrics_port: u16,

    /// Port of the decode engine's /metrics in disaggregated mode (0 = ephemeral).
    #[arg(long, default_value_t = 0)]
    pub decode_metrics_port: u16,

    /// Fraction of requests answered with HTTP 500 (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub fault_error_rate: f64,

    /// Fraction of streams cut (connection closed, no `[DONE]`) after --fault-cut-after chunks (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub fault_cut_rate: f64,

    /// Chunks sent before a cut stream is closed.
    #[arg(long, default_value_t = 5)]
    pub fault_cut_after: u32,

    /// Fraction of requests that stall for --fault-stall before they are queued (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub fault_stall_rate: f64,

    /// How long a stalled request waits before its first token can be produced.
    #[arg(long, default_value = "2s", value_parser = nyann_model::parse_duration)]
    pub fault_stall: Duration,

    /// Fraction of requests whose connection is closed without a response (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub fault_reset_rate: f64,

    /// Answer the questions of this GSM8K file (its JSONL) when a prompt
    /// asks one (`#### N`), right with probability --eval-accuracy.
    #[arg(long, value_name = "FILE", conflicts_with = "eval_gpqa")]
    pub eval_gsm8k: Option<PathBuf>,

    /// Answer the questions of this GPQA file (CSV or JSONL) when a prompt
    /// asks one (`Answer: X`), right with probability --eval-accuracy.
    #[arg(long, value_name = "FILE")]
    pub eval_gpqa: Option<PathBuf>,

    /// Probability (0..1) that an eval question is answered right (a
    /// seeded roll per request).
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub eval_accuracy: f64,

    /// Probability (0..1) that an eval question is answered right when
    /// more than --eval-busy-above requests are in flight at its arrival
    /// (itself counted): a server that answers worse under load.
    #[arg(long, value_name = "P", requires = "eval_busy_above")]
    pub eval_busy_accuracy: Option<f64>,

    /// Requests in flight above which --eval-busy-accuracy applies.
    #[arg(long, value_name = "N", requires = "eval_busy_accuracy")]
    pub eval_busy_above: Option<u64>,

    /// Requests kept in the per-request timing record (GET /sim/requests).
    #[arg(long, default_value_t = 200_000)]
    pub record_capacity: usize,
}

impl SimArgs {
    /// The simulator's configuration.
    pub fn config(self) -> SimConfig {
        SimConfig {
            host: self.host,
            port: self.port,
            model: self.model,
            profile: self.profile,
            profile_file: self.profile_file,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            kv_blocks: self.kv_blocks,
            block_size: self.block_size,
            max_model_len: self.max_model_len,
            no_enable_prefix_caching: self.no_enable_prefix_caching,
            step_overhead_us: self.step_overhead_us,
            prefill_per_token_us: self.prefill_per_token_us,
            decode_per_seq_us: self.decode_per_seq_us,
            decode_per_context_token_us: self.decode_per_context_token_us,
            request_overhead_us: self.request_overhead_us,
            jitter: self.jitter,
            drift: self.drift,
            drift_time_ms: self.drift_time_ms,
            kv_transfer_us: self.kv_transfer_us,
            kv_transfer_per_token_us: self.kv_transfer_per_token_us,
            chat_template_tokens: self.chat_template_tokens,
            max_waiting: self.max_waiting,
            enable_prompt_tokens_details: self.enable_prompt_tokens_details,
            enable_force_include_usage: self.enable_force_include_usage,
            default_max_tokens: self.default_max_tokens,
            seed: self.seed,
            time_scale: self.time_scale,
            disaggregated: self.disaggregated,
            prefill_metrics_port: self.prefill_metrics_port,
            decode_metrics_port: self.decode_metrics_port,
            fault_error_rate: self.fault_error_rate,
            fault_cut_rate: self.fault_cut_rate,
            fault_cut_after: self.fault_cut_after,
            fault_stall_rate: self.fault_stall_rate,
            fault_stall: self.fault_stall,
            fault_reset_rate: self.fault_reset_rate,
            eval_gsm8k: self.eval_gsm8k.clone(),
            eval_gpqa: self.eval_gpqa.clone(),
            eval_accuracy: self.eval_accuracy,
            eval_busy_accuracy: self.eval_busy_accuracy,
            eval_busy_above: self.eval_busy_above.unwrap_or_default(),
            record_capacity: self.record_capacity,
        }
    }
}

/// `err` in the command line's terms: a value out of range names its flag.
pub fn flag_error(err: SimError) -> anyhow::Error {
    match err {
        SimError::Config(e) => config_error(e),
        err => anyhow::Error::new(err).context("starting the simulator"),
    }
}

/// A positive finite number (clap's value parser).
pub fn positive_number(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("must be a positive number, got {text}")),
    }
}

/// A finite number of microseconds >= 0 (clap's value parser).
pub fn microseconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("must be a number of microseconds >= 0, got {text}")),
    }
}

/// A value out of range, named by its flag: the flag of a [`SimConfig`]
/// field (and of `sim fit`'s noise flags) is the field's name in kebab case.
pub fn config_error(e: ConfigError) -> anyhow::Error {
    let flag = e.field.replace('_', "-");
    anyhow::anyhow!("--{flag} must be {}, got {}", e.rule, e.value)
}

/// A note with the flag that sets what it says was held or inferred.
pub fn note_with_flag(note: &Note) -> String {
    match note.set_by {
        None => note.text.clone(),
        Some(Setting::MaxNumSeqs) => format!("{}; --max-num-seqs sets it", note.text),
        Some(Setting::KvTransfer) => format!(
            "{}: --kv-transfer-us and --kv-transfer-per-token-us",
            note.text
        ),
    }
}

/// A fit that cannot run, with the flags that get past it.
pub fn fit_error(err: FitInputError) -> anyhow::Error {
    use crate::cli::report;
    let hint = match &err {
        FitInputError::Missing(missing) => {
            let items: Vec<String> = missing
                .iter()
                .map(|m| format!("\n  - {}", missing_with_flags(m)))
                .collect();
            return anyhow::anyhow!(
                "the fit needs what the run(s) did not record (a run recorded by this version \
                 with --scrape saves it):{}",
                items.concat()
            );
        }
        FitInputError::Recording(RecordingError::NoRecords { .. }) => {
            "a sweep run with --output-dir writes it"
        }
        FitInputError::NoCacheConfig(_) | FitInputError::CacheConfigLabel { .. } => {
            "give --kv-blocks and --block-size instead"
        }
        FitInputError::NoMaxModelLen(_) => "give --max-model-len instead",
        FitInputError::EmptyKvCache => "--kv-blocks and --block-size must be at least 1",
        FitInputError::Fit(FitError::DoesNotFit { .. }) => {
            "give the server's --kv-blocks / --block-size, or its --metrics-file"
        }
        FitInputError::Recording(RecordingError::Read(read)) if report::holds_no_run(read) => {
            report::WRITES_A_RUN
        }
        _ => return err.into(),
    };
    anyhow::anyhow!("{err} ({hint})")
}

/// What is missing, and how to give it.
fn missing_with_flags(missing: &Missing) -> String {
    match missing {
        Missing::PromptTokens { .. } => format!(
            "{missing}: record with --stream-usage, or give --chars-per-token K (the `ISL \
             calibration` line of the run's log)"
        ),
        Missing::ChatTemplateTokens => format!(
            "{missing}: give --chat-template-tokens N (the server's /tokenize of a one-message \
             chat less that of its text), or record two prompt lengths with --stream-usage"
        ),
        Missing::KvCache { role: Some(role) } => format!(
            "{missing}: record with --scrape {role}=URL (the run saves its /metrics text), or \
             give --metrics-file FILE (a saved `curl http://HOST:8000/metrics`), or --kv-blocks N \
             and --block-size N"
        ),
        Missing::KvCache { role: None } => format!(
            "{missing}: give --metrics-file FILE (a saved `curl http://HOST:8000/metrics`), or \
             --kv-blocks N and --block-size N"
        ),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Sim {
        #[command(flatten)]
        sim: SimArgs,
    }

    /// What `nyann-bench sim ARGS` says of a value out of range.
    fn refusal(args: &[&str]) -> String {
        let argv = std::iter::once("sim").chain(args.iter().copied());
        let config = Sim::try_parse_from(argv).unwrap().sim.config();
        config_error(config.validate().unwrap_err()).to_string()
    }

    #[test]
    fn every_value_out_of_range_names_its_flag() {
        for (flag, bad) in [
            ("--fault-error-rate", "2"),
            ("--fault-cut-rate", "-1"),
            ("--fault-stall-rate", "1.5"),
            ("--fault-reset-rate", "9"),
            ("--time-scale", "0"),
            ("--block-size", "0"),
            ("--kv-blocks", "0"),
            ("--max-num-seqs", "0"),
            ("--max-num-batched-tokens", "0"),
            ("--default-max-tokens", "0"),
            ("--max-model-len", "0"),
            ("--step-overhead-us", "-1"),
            ("--prefill-per-token-us", "-1"),
            ("--decode-per-seq-us", "-1"),
            ("--decode-per-context-token-us", "-1"),
            ("--request-overhead-us", "-1"),
            ("--jitter", "1"),
            ("--drift", "3"),
            ("--drift-time-ms", "0"),
        ] {
            let said = refusal(&[&format!("{flag}={bad}")]);
            assert!(said.starts_with(&format!("{flag} must be ")), "{said}");
        }
        assert_eq!(
            refusal(&["--fault-cut-rate", "2"]),
            "--fault-cut-rate must be between 0 and 1, got 2"
        );
        assert_eq!(
            refusal(&["--profile", "fast", "--disaggregated"]),
            "--disaggregated must be off with the fast profile, which has no engine to split, got on"
        );
    }
}
