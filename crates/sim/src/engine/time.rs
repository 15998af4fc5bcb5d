//! The time model: what an engine step costs from the work in it, and the
//! latencies a request meets before it reaches an engine's queue.

/// [`TimeModel::kv_transfer`] when a profile does not say: about one
/// decode-engine step of scheduling and notification around the transfer.
pub const DEFAULT_KV_TRANSFER: f64 = 1e-3;

/// [`TimeModel::kv_transfer_per_token`] when a profile does not say: a
/// tenth of the default profile's prefill cost per token (moving a token's
/// KV over the interconnect is much cheaper than computing it).
pub const DEFAULT_KV_TRANSFER_PER_TOKEN: f64 = 2e-6;

/// The time model: how long one engine step takes, from the work in it.
///
/// `step = step_overhead + prefill_per_token * prefill tokens
///        + decode_per_seq * decoding sequences
///        + decode_per_context_token * KV tokens those sequences read`,
/// then multiplied by `1 + jitter * u` (`u` uniform in [-1, 1]). All costs
/// are in seconds. Steps slow down as the batch grows and as the sequences
/// in it get longer, as on a real server where decoding reads the whole KV
/// of every running sequence.
///
/// Before a request reaches an engine's queue it spends `request_overhead`
/// (the API server's work) and, on a disaggregated decode engine, the
/// transfer of its prompt KV from the prefill engine:
/// `kv_transfer + kv_transfer_per_token * prompt tokens`. Both count in the
/// engine's TTFT and take no step time (vLLM's KV connector transfers
/// asynchronously while the engine steps on).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TimeModel {
    /// Fixed cost of any step (scheduling, launch, sampling, output handling).
    pub step_overhead: f64,
    /// Per prompt token computed in the step (prefill chunks and recomputes).
    pub prefill_per_token: f64,
    /// Per sequence that decodes one token in the step.
    pub decode_per_seq: f64,
    /// Per KV token read by the decoding sequences (their context length).
    pub decode_per_context_token: f64,
    /// Relative jitter of each step (0.1 = ±10%).
    pub jitter: f64,
    /// Latency of each request before it reaches the scheduler's queue
    /// (vLLM's API server: chat template, tokenization, hand-over to the
    /// engine), on average: each request's is uniform between half and one
    /// and a half times it. Counted in TTFT; takes no engine time.
    pub request_overhead: f64,
    /// Slow drift of the step speed (a machine shared with other work): every
    /// step time is multiplied by `exp(drift * x)`, `x` a standard Gaussian
    /// process that changes over `drift_time`, the factor's mean being 1. 0
    /// for none. It spreads TTFT in queueing stages the way a busy machine
    /// does.
    pub drift: f64,
    /// Correlation time of the drift, in seconds.
    pub drift_time: f64,
    /// Disaggregated mode, decode engine: fixed latency of moving a
    /// request's prompt KV from the prefill engine (scheduling, the
    /// transfer's set-up and its completion notice). Counted in the decode
    /// engine's TTFT; takes no engine time.
    pub kv_transfer: f64,
    /// Disaggregated mode, decode engine: transfer time per prompt token
    /// (the KV of every prompt token moves, cached on the prefill side or not).
    pub kv_transfer_per_token: f64,
}

/// What one step computes: the inputs of [`TimeModel::step_seconds`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepWork {
    pub prefill_tokens: u64,
    pub decode_seqs: u64,
    pub context_tokens: u64,
}

impl TimeModel {
    /// Duration of a step doing `work`, before jitter.
    pub fn step_seconds(&self, work: StepWork) -> f64 {
        self.step_overhead
            + self.prefill_per_token * work.prefill_tokens as f64
            + self.decode_per_seq * work.decode_seqs as f64
            + self.decode_per_context_token * work.context_tokens as f64
    }

    /// How long the prompt KV of `prompt_tokens` tokens takes to reach the
    /// decode engine.
    pub fn kv_transfer_seconds(&self, prompt_tokens: u32) -> f64 {
        self.kv_transfer + self.kv_transfer_per_token * f64::from(prompt_tokens)
    }

    /// Every duration multiplied by `factor` (jitter unchanged).
    pub fn scaled(self, factor: f64) -> TimeModel {
        TimeModel {
            step_overhead: self.step_overhead * factor,
            prefill_per_token: self.prefill_per_token * factor,
            decode_per_seq: self.decode_per_seq * factor,
            decode_per_context_token: self.decode_per_context_token * factor,
            jitter: self.jitter,
            request_overhead: self.request_overhead * factor,
            drift: self.drift,
            drift_time: self.drift_time * factor,
            kv_transfer: self.kv_transfer * factor,
            kv_transfer_per_token: self.kv_transfer_per_token * factor,
        }
    }
}
