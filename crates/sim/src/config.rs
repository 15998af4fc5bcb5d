//! The simulator's command-line flags ([`SimArgs`]) and the engine settings
//! they resolve to for each profile.

use std::time::Duration;

use crate::engine::{EngineConfig, StepCost};

/// Timing and capacity presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// A small GPU deployment scaled to run fast: 16 running sequences, 224 KV
    /// blocks of 16 tokens, steps of ~1-4 ms. With the default workload (isl
    /// 128, osl 256) the KV cache saturates around concurrency 12-16 (for isl
    /// 64, osl 128, --kv-blocks 112 gives the same curve).
    Default,
    /// A server that is never the bottleneck: 1 ms to the first token, 0.5 ms
    /// per token, 32 tokens by default, no queue, no KV limit.
    Fast,
}

/// Flags of `nyann-bench sim` (and of the in-process simulator).
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

    /// Timing and capacity preset; the flags below override its values.
    #[arg(long, value_enum, default_value_t = Profile::Default)]
    pub profile: Profile,

    /// Most sequences running at once [default profile: 16; fast: unlimited].
    #[arg(long)]
    pub max_num_seqs: Option<usize>,

    /// Token budget of one engine step (decodes count 1, prefill chunks their length) [default: 2048].
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,

    /// KV cache blocks [default profile: 224; fast: unlimited].
    #[arg(long)]
    pub kv_blocks: Option<u32>,

    /// Tokens per KV block [default: 16].
    #[arg(long)]
    pub block_size: Option<u32>,

    /// Requests waiting beyond this number get HTTP 429 [default: no limit].
    #[arg(long)]
    pub max_waiting: Option<usize>,

    /// Output tokens when a request gives no max_tokens [default profile: 256; fast: 32].
    #[arg(long)]
    pub default_max_tokens: Option<u32>,

    /// Seed of every random choice (step jitter, output text, faults).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Multiplies every simulated duration (2 = twice as slow).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,

    /// Run a prefill engine and a decode engine behind the one endpoint, each with its own /metrics.
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

    /// Fraction of streams cut (connection closed, no [DONE]) after --fault-cut-after chunks (0..1).
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

    /// Requests kept in the per-request timing record (GET /sim/requests).
    #[arg(long, default_value_t = 200_000)]
    pub record_capacity: usize,
}

impl SimArgs {
    /// Settings for tests and in-process use: 127.0.0.1, ephemeral ports,
    /// default profile, seed 0, no faults.
    pub fn for_tests() -> SimArgs {
        SimArgs {
            host: "127.0.0.1".into(),
            port: 0,
            model: "nyann-sim".into(),
            profile: Profile::Default,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            kv_blocks: None,
            block_size: None,
            max_waiting: None,
            default_max_tokens: None,
            seed: 0,
            time_scale: 1.0,
            disaggregated: false,
            prefill_metrics_port: 0,
            decode_metrics_port: 0,
            fault_error_rate: 0.0,
            fault_cut_rate: 0.0,
            fault_cut_after: 5,
            fault_stall_rate: 0.0,
            fault_stall: Duration::from_secs(2),
            fault_reset_rate: 0.0,
            record_capacity: 200_000,
        }
    }

    /// The same with the fast profile.
    pub fn fast_for_tests() -> SimArgs {
        SimArgs {
            profile: Profile::Fast,
            ..SimArgs::for_tests()
        }
    }

    /// Check ranges; the message names the flag.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("--fault-error-rate", self.fault_error_rate),
            ("--fault-cut-rate", self.fault_cut_rate),
            ("--fault-stall-rate", self.fault_stall_rate),
            ("--fault-reset-rate", self.fault_reset_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be between 0 and 1, got {v}"));
            }
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(format!(
                "--time-scale must be a positive number, got {}",
                self.time_scale
            ));
        }
        if self.block_size == Some(0) {
            return Err("--block-size must be at least 1".into());
        }
        if self.kv_blocks == Some(0) {
            return Err("--kv-blocks must be at least 1".into());
        }
        if self.max_num_seqs == Some(0) {
            return Err("--max-num-seqs must be at least 1".into());
        }
        if self.max_num_batched_tokens == Some(0) {
            return Err("--max-num-batched-tokens must be at least 1".into());
        }
        if self.default_max_tokens == Some(0) {
            return Err("--default-max-tokens must be at least 1".into());
        }
        if self.profile == Profile::Fast && self.disaggregated {
            return Err(
                "--disaggregated needs the default profile (the fast profile has no engine)".into(),
            );
        }
        Ok(())
    }

    /// Output tokens of a request without max_tokens.
    pub fn resolved_default_max_tokens(&self) -> u32 {
        self.default_max_tokens.unwrap_or(match self.profile {
            Profile::Default => 256,
            Profile::Fast => 32,
        })
    }

    /// Engine settings of the default profile with the overrides applied.
    /// `role_seed` separates the prefill and decode engines' jitter.
    pub fn engine_config(&self, role_seed: u64) -> EngineConfig {
        let s = self.time_scale;
        EngineConfig {
            max_num_seqs: self.max_num_seqs.unwrap_or(16),
            max_num_batched_tokens: self.max_num_batched_tokens.unwrap_or(2048),
            kv_blocks: self.kv_blocks.unwrap_or(224),
            block_size: self.block_size.unwrap_or(16),
            cost: StepCost {
                base: 0.0012 * s,
                per_decode_seq: 0.00012 * s,
                per_prefill_token: 0.00002 * s,
                jitter: 0.1,
            },
            seed: self.seed.wrapping_mul(0x9e37_79b9).wrapping_add(role_seed),
        }
    }

    /// Fast profile timings: (time to first token, time per further token).
    pub fn fast_timings(&self) -> (Duration, Duration) {
        (
            Duration::from_secs_f64(0.001 * self.time_scale),
            Duration::from_secs_f64(0.0005 * self.time_scale),
        )
    }
}
