//! How to run a simulator ([`SimConfig`]) and the server profile it
//! resolves to: a built-in profile or a profile file, with the
//! configuration's overrides applied.

use std::path::PathBuf;
use std::time::Duration;

use crate::profile::{EngineSpec, ServerProfile};

/// Built-in profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Profile {
    /// A small GPU deployment scaled to run fast: 16 running sequences, 224 KV
    /// blocks of 16 tokens, steps of ~1-4 ms. With the default workload (isl
    /// 128, osl 256) the KV cache saturates around concurrency 12-16 (for isl
    /// 64, osl 128, --kv-blocks 112 gives the same curve). With
    /// --disaggregated the prefill engine has 512 KV blocks and the decode
    /// engine 4096, so under long prompts (isl 2048, osl 32) the prefill
    /// engine queues first.
    Default,
    /// A server that is never the bottleneck: 1 ms to the first token, 0.5 ms
    /// per token, 32 tokens by default, no queue, no KV limit.
    Fast,
    /// The twin of a real vLLM 0.32 (CPU build, tiny model, 2 cores) with
    /// --max-num-seqs 16 --block-size 32 --num-gpu-blocks-override 64
    /// --max-model-len 1024, its time model fitted from a recorded sweep.
    VllmCpuRef,
}

impl Profile {
    /// The built-in server profile (`None` for `fast`, which has no engine).
    pub fn server(self) -> Option<ServerProfile> {
        match self {
            Profile::Default => Some(ServerProfile::default_profile()),
            Profile::Fast => None,
            Profile::VllmCpuRef => Some(ServerProfile::vllm_cpu_ref()),
        }
    }
}

/// How to run a simulator: where it listens, the server profile and the
/// overrides of its values, and the faults it injects. `nyann-bench sim`'s
/// flags are named after these fields; [`SimConfig::default`] is an
/// in-process simulator on 127.0.0.1 with ephemeral ports.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Address of the OpenAI endpoint.
    pub host: String,

    /// Port of the OpenAI endpoint (0 = ephemeral).
    pub port: u16,

    /// Model name served (`model_name` label, `/v1/models`); requests naming another model get a 404.
    pub model: String,

    /// Built-in server profile (limits and time model); the fields below
    /// override its values.
    pub profile: Profile,

    /// Read the server profile from this TOML file instead (written by
    /// `nyann-bench sim fit`, or printed by `sim --print-profile`).
    pub profile_file: Option<PathBuf>,

    /// Most sequences running at once [default profile: 16; fast: unlimited].
    pub max_num_seqs: Option<usize>,

    /// Token budget of one engine step, the chunked-prefill budget (decodes
    /// count 1, prefill chunks their length) [default profile: 2048].
    pub max_num_batched_tokens: Option<u32>,

    /// Usable KV cache blocks [default profile: 224; fast: unlimited].
    pub kv_blocks: Option<u32>,

    /// Tokens per KV block [default profile: 16].
    pub block_size: Option<u32>,

    /// Longest prompt + output accepted [default: what the KV cache holds].
    pub max_model_len: Option<u32>,

    /// Turn the prefix cache off (vLLM's flag; on by default, as in vLLM V1):
    /// finished requests' KV blocks are then freed, not kept for later
    /// prompts that start the same way.
    pub no_enable_prefix_caching: bool,

    /// Fixed cost of every engine step, in microseconds.
    pub step_overhead_us: Option<f64>,

    /// Cost per prompt token computed in a step (prefill and
    /// recompute after preemption), in microseconds.
    pub prefill_per_token_us: Option<f64>,

    /// Cost per sequence decoding one token in a step, in microseconds.
    pub decode_per_seq_us: Option<f64>,

    /// Cost per KV token read by the decoding sequences of a
    /// step (their context), in microseconds.
    pub decode_per_context_token_us: Option<f64>,

    /// Latency of each request before it reaches the queue (the
    /// API server's work), in microseconds; counts in TTFT.
    pub request_overhead_us: Option<f64>,

    /// Relative jitter of each step (0.1 = ±10%).
    pub jitter: Option<f64>,

    /// Slow drift of the step speed, the standard deviation of
    /// the log of its factor (0.35: most steps within -30%..+40% of the
    /// model, in runs of `drift_time_ms`); 0 for none.
    pub drift: Option<f64>,

    /// How long the drift takes to change, in milliseconds.
    pub drift_time_ms: Option<f64>,

    /// Disaggregated mode: fixed latency of a prompt's KV transfer from
    /// the prefill engine to the decode engine, in microseconds; counts in
    /// TTFT [default: 1000].
    pub kv_transfer_us: Option<f64>,

    /// Disaggregated mode: KV transfer time per prompt token, in
    /// microseconds [default: 2].
    pub kv_transfer_per_token_us: Option<f64>,

    /// Tokens the chat template adds to every chat prompt (counted in usage
    /// and in the KV cache) [default profile: 0; vllm-cpu-ref: 16].
    pub chat_template_tokens: Option<u32>,

    /// Requests waiting beyond this number get HTTP 429 [default: no limit].
    pub max_waiting: Option<usize>,

    /// Report in each response's usage how many prompt tokens the prefix
    /// cache served, as `prompt_tokens_details.cached_tokens` (vLLM's flag;
    /// off by default, as in vLLM: `prompt_tokens_details` is then null).
    pub enable_prompt_tokens_details: bool,

    /// Send usage at the end of every stream, asked for or not, as vLLM's
    /// `--enable-force-include-usage` does.
    pub enable_force_include_usage: bool,

    /// Output tokens when a request gives no max_tokens [default and
    /// vllm-cpu-ref profiles: 256; fast: 32].
    pub default_max_tokens: Option<u32>,

    /// Seed of every random choice (step jitter, output text, faults).
    pub seed: u64,

    /// Multiplies every simulated duration (2 = twice as slow).
    pub time_scale: f64,

    /// Run a prefill engine and a decode engine behind the one endpoint, each with its own /metrics
    /// (on without the flag when the profile file says `disaggregated = true`, as `sim fit` writes
    /// for a prefill/decode recording).
    pub disaggregated: bool,

    /// Port of the prefill engine's /metrics in disaggregated mode (0 = ephemeral).
    pub prefill_metrics_port: u16,

    /// Port of the decode engine's /metrics in disaggregated mode (0 = ephemeral).
    pub decode_metrics_port: u16,

    /// Fraction of requests answered with HTTP 500 (0..1).
    pub fault_error_rate: f64,

    /// Fraction of streams cut (connection closed, no `[DONE]`) after `fault_cut_after` chunks (0..1).
    pub fault_cut_rate: f64,

    /// Chunks sent before a cut stream is closed.
    pub fault_cut_after: u32,

    /// Fraction of requests that stall for `fault_stall` before they are queued (0..1).
    pub fault_stall_rate: f64,

    /// How long a stalled request waits before its first token can be produced.
    pub fault_stall: Duration,

    /// Fraction of requests whose connection is closed without a response (0..1).
    pub fault_reset_rate: f64,

    /// Requests kept in the per-request timing record (GET /sim/requests).
    pub record_capacity: usize,

    /// Answer the questions of this GSM8K file (its JSONL) when a prompt
    /// asks one: `#### N`, right with probability `eval_accuracy`.
    pub eval_gsm8k: Option<PathBuf>,

    /// Answer the questions of this GPQA file (CSV or JSONL) when a prompt
    /// asks one: `Answer: X`, right with probability `eval_accuracy`.
    pub eval_gpqa: Option<PathBuf>,

    /// Probability (0..1) that an eval question is answered right (seeded
    /// per request: the same seed answers the same way).
    pub eval_accuracy: f64,

    /// When set, the probability (0..1) that an eval question is answered
    /// right by a busy server: one that had more than `eval_busy_above`
    /// requests in flight when the question arrived (itself counted). A
    /// server that answers worse under load, for demos and tests of
    /// policies that stop on accuracy.
    pub eval_busy_accuracy: Option<f64>,

    /// Requests in flight above which the server is busy (see
    /// `eval_busy_accuracy`).
    pub eval_busy_above: u64,
}

impl Default for SimConfig {
    /// 127.0.0.1, ephemeral ports, the default profile, seed 0, no faults.
    fn default() -> SimConfig {
        SimConfig {
            host: "127.0.0.1".into(),
            port: 0,
            model: "nyann-sim".into(),
            profile: Profile::Default,
            profile_file: None,
            max_num_seqs: None,
            max_num_batched_tokens: None,
            kv_blocks: None,
            block_size: None,
            max_model_len: None,
            no_enable_prefix_caching: false,
            step_overhead_us: None,
            prefill_per_token_us: None,
            decode_per_seq_us: None,
            decode_per_context_token_us: None,
            request_overhead_us: None,
            jitter: None,
            drift: None,
            drift_time_ms: None,
            kv_transfer_us: None,
            kv_transfer_per_token_us: None,
            chat_template_tokens: None,
            max_waiting: None,
            enable_prompt_tokens_details: false,
            enable_force_include_usage: false,
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
            eval_gsm8k: None,
            eval_gpqa: None,
            eval_accuracy: 1.0,
            eval_busy_accuracy: None,
            eval_busy_above: 0,
        }
    }
}

/// A value of a [`SimConfig`] out of its range: `field` is the field's name
/// (`nyann-bench sim`'s flags are named after the fields).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field} must be {rule}, got {value}")]
pub struct ConfigError {
    pub field: &'static str,
    pub rule: &'static str,
    pub value: String,
}

impl ConfigError {
    fn new(field: &'static str, rule: &'static str, value: impl std::fmt::Display) -> ConfigError {
        ConfigError {
            field,
            rule,
            value: value.to_string(),
        }
    }
}

/// Checks the time model's noise (`jitter`, `drift`, `drift_time_ms`),
/// which the simulator and a fit both take.
pub fn check_noise(
    jitter: Option<f64>,
    drift: Option<f64>,
    drift_time_ms: Option<f64>,
) -> Result<(), ConfigError> {
    if let Some(j) = jitter
        && !(0.0..1.0).contains(&j)
    {
        return Err(ConfigError::new("jitter", "in [0, 1)", j));
    }
    if let Some(d) = drift
        && !(0.0..=2.0).contains(&d)
    {
        return Err(ConfigError::new("drift", "in [0, 2]", d));
    }
    if let Some(t) = drift_time_ms
        && !(t.is_finite() && t > 0.0)
    {
        return Err(ConfigError::new(
            "drift_time_ms",
            "a positive number of milliseconds",
            t,
        ));
    }
    Ok(())
}

impl SimConfig {
    /// The default configuration with the fast profile (no engine).
    pub fn fast() -> SimConfig {
        SimConfig {
            profile: Profile::Fast,
            ..SimConfig::default()
        }
    }

    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("fault_error_rate", self.fault_error_rate),
            ("fault_cut_rate", self.fault_cut_rate),
            ("fault_stall_rate", self.fault_stall_rate),
            ("fault_reset_rate", self.fault_reset_rate),
            ("eval_accuracy", self.eval_accuracy),
            (
                "eval_busy_accuracy",
                self.eval_busy_accuracy.unwrap_or_default(),
            ),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(ConfigError::new(field, "between 0 and 1", v));
            }
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(ConfigError::new(
                "time_scale",
                "a positive number",
                self.time_scale,
            ));
        }
        for (field, v) in [
            ("block_size", self.block_size),
            ("kv_blocks", self.kv_blocks),
            ("max_num_seqs", self.max_num_seqs.map(|v| v as u32)),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("default_max_tokens", self.default_max_tokens),
            ("max_model_len", self.max_model_len),
        ] {
            if v == Some(0) {
                return Err(ConfigError::new(field, "at least 1", 0));
            }
        }
        for (field, v) in [
            ("step_overhead_us", self.step_overhead_us),
            ("prefill_per_token_us", self.prefill_per_token_us),
            ("decode_per_seq_us", self.decode_per_seq_us),
            (
                "decode_per_context_token_us",
                self.decode_per_context_token_us,
            ),
            ("request_overhead_us", self.request_overhead_us),
            ("kv_transfer_us", self.kv_transfer_us),
            ("kv_transfer_per_token_us", self.kv_transfer_per_token_us),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v >= 0.0)
            {
                return Err(ConfigError::new(field, "a number of microseconds >= 0", v));
            }
        }
        check_noise(self.jitter, self.drift, self.drift_time_ms)?;
        if self.profile == Profile::Fast && self.profile_file.is_none() && self.disaggregated {
            return Err(ConfigError::new(
                "disaggregated",
                "off with the fast profile, which has no engine to split",
                "on",
            ));
        }
        Ok(())
    }

    /// The server profile this configuration selects, with its overrides
    /// applied: `None` for the fast profile (no engine). Reads `profile_file`.
    pub async fn server_profile(&self) -> Result<Option<ServerProfile>, crate::SimError> {
        let base = match &self.profile_file {
            Some(path) => {
                let shown = path.display().to_string();
                let text = tokio::fs::read_to_string(path).await.map_err(|source| {
                    crate::profile::ProfileError::Read {
                        path: shown.clone(),
                        source,
                    }
                })?;
                Some(ServerProfile::from_toml(&text, &shown)?)
            }
            None => self.profile.server(),
        };
        Ok(base.map(|p| self.overridden(p)))
    }

    /// `profile` with this configuration's overrides (every engine alike).
    fn overridden(&self, mut profile: ServerProfile) -> ServerProfile {
        let apply = |spec: &mut EngineSpec| {
            let (l, t) = (&mut spec.limits, &mut spec.time);
            set(&mut l.max_num_seqs, self.max_num_seqs.map(|v| v as u32));
            set(&mut l.max_num_batched_tokens, self.max_num_batched_tokens);
            set(&mut l.kv_blocks, self.kv_blocks);
            set(&mut l.block_size, self.block_size);
            if self.max_model_len.is_some() {
                l.max_model_len = self.max_model_len;
            }
            if self.no_enable_prefix_caching {
                l.enable_prefix_caching = false;
            }
            let micros = |v: Option<f64>| v.map(|us| us / 1e6);
            set(&mut t.step_overhead, micros(self.step_overhead_us));
            set(&mut t.prefill_per_token, micros(self.prefill_per_token_us));
            set(&mut t.decode_per_seq, micros(self.decode_per_seq_us));
            set(
                &mut t.decode_per_context_token,
                micros(self.decode_per_context_token_us),
            );
            set(&mut t.request_overhead, micros(self.request_overhead_us));
            set(&mut t.jitter, self.jitter);
            set(&mut t.drift, self.drift);
            set(&mut t.drift_time, self.drift_time_ms.map(|ms| ms / 1e3));
            set(&mut t.kv_transfer, micros(self.kv_transfer_us));
            set(
                &mut t.kv_transfer_per_token,
                micros(self.kv_transfer_per_token_us),
            );
            spec.time = spec.time.scaled(self.time_scale);
        };
        apply(&mut profile.engine);
        profile.prefill.iter_mut().for_each(apply);
        profile.decode.iter_mut().for_each(apply);
        set(&mut profile.chat_template_tokens, self.chat_template_tokens);
        set(&mut profile.default_max_tokens, self.default_max_tokens);
        // The flag turns the mode on; a profile fitted to a disaggregated
        // deployment has it on already.
        profile.disaggregated |= self.disaggregated;
        profile
    }

    /// Output tokens of a request without max_tokens, for the fast profile.
    pub fn fast_default_max_tokens(&self) -> u32 {
        self.default_max_tokens.unwrap_or(32)
    }

    /// Fast profile timings: (time to first token, time per further token).
    pub fn fast_timings(&self) -> (Duration, Duration) {
        (
            Duration::from_secs_f64(0.001 * self.time_scale),
            Duration::from_secs_f64(0.0005 * self.time_scale),
        )
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Role;

    #[tokio::test]
    async fn overrides_apply_to_every_engine_of_the_profile() {
        let config = SimConfig {
            kv_blocks: Some(64),
            decode_per_seq_us: Some(300.0),
            kv_transfer_us: Some(500.0),
            drift: Some(0.2),
            time_scale: 2.0,
            ..SimConfig::default()
        };
        let profile = config.server_profile().await.unwrap().unwrap();
        for role in [Role::Aggregate, Role::Prefill, Role::Decode] {
            let e = profile.engine(role);
            assert_eq!(e.limits.kv_blocks, 64, "{role:?}");
            assert!((e.time.decode_per_seq - 600e-6).abs() < 1e-12, "{role:?}");
            assert!((e.time.step_overhead - 2400e-6).abs() < 1e-12, "{role:?}");
            assert_eq!(e.time.drift, 0.2);
            assert!((e.time.kv_transfer - 1000e-6).abs() < 1e-12, "{role:?}");
        }
        let fast = SimConfig::fast().server_profile().await.unwrap();
        assert_eq!(fast, None, "the fast profile has no engine");
    }

    #[test]
    fn values_out_of_range_are_refused_with_their_field() {
        let field = |config: SimConfig| config.validate().unwrap_err().field;
        let base = SimConfig::default;
        let cases = [
            (
                SimConfig {
                    prefill_per_token_us: Some(-1.0),
                    ..base()
                },
                "prefill_per_token_us",
            ),
            (
                SimConfig {
                    jitter: Some(1.0),
                    ..base()
                },
                "jitter",
            ),
            (
                SimConfig {
                    kv_transfer_per_token_us: Some(f64::NAN),
                    ..base()
                },
                "kv_transfer_per_token_us",
            ),
            (
                SimConfig {
                    drift_time_ms: Some(0.0),
                    ..base()
                },
                "drift_time_ms",
            ),
            (
                SimConfig {
                    max_model_len: Some(0),
                    ..base()
                },
                "max_model_len",
            ),
            (
                SimConfig {
                    fault_cut_rate: 1.5,
                    ..base()
                },
                "fault_cut_rate",
            ),
            (
                SimConfig {
                    time_scale: 0.0,
                    ..base()
                },
                "time_scale",
            ),
            (
                SimConfig {
                    disaggregated: true,
                    ..SimConfig::fast()
                },
                "disaggregated",
            ),
        ];
        for (config, name) in cases {
            assert_eq!(field(config), name);
        }
        assert_eq!(
            SimConfig {
                jitter: Some(1.0),
                ..base()
            }
            .validate()
            .unwrap_err()
            .to_string(),
            "jitter must be in [0, 1), got 1"
        );
        assert_eq!(SimConfig::default().validate(), Ok(()));
    }
}
