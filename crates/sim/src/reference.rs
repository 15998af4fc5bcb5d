//! The recorded sweep behind `--profile vllm-cpu-ref`: a real vLLM 0.32.0
//! (CPU build, a tiny random Llama, 2 cores shared with the load generator)
//! started with `--max-num-seqs 16 --block-size 32
//! --num-gpu-blocks-override 64 --max-model-len 1024`, under a closed-loop
//! sweep of streaming chat requests (prompts of about 60 tokens, 76 with the
//! chat template; 128 output tokens with `ignore_eos`; 30 s per level),
//! Prometheus scraping `/metrics` every second.
//!
//! The profile's time model is what [`crate::fit`] finds for this recording
//! (`cargo run -p nyann-sim --release --example fit-reference` repeats it);
//! the tests check that the profile's sweep reproduces it.

use nyann_model::{ClientStats, RoleSignals};

use crate::fit::{RecordedRun, RecordedStage};

/// Prompt tokens per request as the server counted them (template included).
pub const PROMPT_TOKENS: u32 = 76;
/// Output tokens per request.
pub const OUTPUT_TOKENS: u32 = 128;
/// Seconds per level.
pub const STAGE_SECONDS: f64 = 30.0;

/// One level of the recording.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Level {
    pub concurrency: u32,
    pub output_tokens_per_second: f64,
    pub client_ttft_p50: f64,
    pub client_ttft_p99: f64,
    /// p50 over time of `vllm:num_requests_waiting`.
    pub waiting_p50: f64,
    /// `histogram_quantile(0.99, ...)` of `vllm:time_to_first_token_seconds`.
    pub server_ttft_p99: f64,
    /// Max of `vllm:kv_cache_usage_perc`.
    pub kv_max: f64,
    /// Increase of `vllm:num_preemptions_total` over the level.
    pub preemptions: f64,
}

const fn level(
    concurrency: u32,
    output_tokens_per_second: f64,
    (client_ttft_p50, client_ttft_p99): (f64, f64),
    waiting_p50: f64,
    server_ttft_p99: f64,
    kv_max: f64,
    preemptions: f64,
) -> Level {
    Level {
        concurrency,
        output_tokens_per_second,
        client_ttft_p50,
        client_ttft_p99,
        waiting_p50,
        server_ttft_p99,
        kv_max,
        preemptions,
    }
}

/// The recording, level by level.
pub const LEVELS: [Level; 8] = [
    level(1, 357.0, (0.011, 0.022), 0.0, 0.024, 0.11, 0.0),
    level(4, 1241.0, (0.016, 0.034), 0.0, 0.035, 0.41, 0.0),
    level(8, 1824.0, (0.022, 0.092), 0.0, 0.087, 0.79, 0.0),
    level(12, 2405.0, (0.023, 0.144), 0.0, 0.19, 1.0, 174.0),
    level(16, 1905.0, (0.045, 0.636), 4.0, 0.67, 1.0, 333.0),
    level(24, 1949.0, (0.657, 1.16), 13.0, 2.36, 1.0, 320.0),
    level(32, 1867.0, (1.055, 2.08), 18.0, 2.47, 1.0, 330.0),
    level(64, 2159.0, (2.81, 3.68), 50.0, 4.97, 1.0, 394.0),
];

/// The recording in the form [`crate::fit::fit`] reads.
pub fn recorded_run() -> RecordedRun {
    RecordedRun {
        name: "vllm-cpu-ref".into(),
        stages: LEVELS
            .iter()
            .map(|l| RecordedStage {
                label: format!("c={}", l.concurrency),
                concurrency: l.concurrency,
                duration_s: STAGE_SECONDS,
                prompt_tokens: f64::from(PROMPT_TOKENS),
                output_tokens: f64::from(OUTPUT_TOKENS),
                client: ClientStats {
                    requests_ok: (l.output_tokens_per_second * STAGE_SECONDS
                        / f64::from(OUTPUT_TOKENS)) as u64,
                    output_tokens_per_second: l.output_tokens_per_second,
                    ttft_p50_seconds: l.client_ttft_p50,
                    ttft_p99_seconds: l.client_ttft_p99,
                    ..ClientStats::default()
                },
                server: Some(RoleSignals {
                    role: "aggregate".into(),
                    waiting_requests_p50: l.waiting_p50,
                    ttft_p99_seconds: l.server_ttft_p99,
                    kv_cache_usage_max: l.kv_max,
                    preemptions: l.preemptions,
                    extra: Vec::new(),
                }),
                prefill: None,
            })
            .collect(),
    }
}
