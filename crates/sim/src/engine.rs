//! The simulated vLLM engine core: continuous batching over a paged KV cache,
//! driven step by step on a clock the caller supplies (so tests run it on a
//! virtual clock and the server on the wall clock).
//!
//! # Model
//!
//! A sequence has a prompt of `P` tokens and must produce `max_tokens` output
//! tokens. Its KV cache holds `computed` tokens in blocks of `block_size`
//! tokens (`ceil(computed / block_size)` blocks, taken from a pool of
//! `kv_blocks`). The last sampled token has no KV entry until the next step,
//! as in vLLM.
//!
//! One engine step (vLLM V1's scheduler, simplified):
//! 1. Running sequences, oldest admission first, each get work within the
//!    step's token budget (`max_num_batched_tokens`, the chunked-prefill
//!    budget): a decode sequence one token, a sequence still prefilling the
//!    next chunk of its remaining prefill. Each needs KV blocks for what it
//!    computes; when none are free, the most recently admitted running
//!    sequence is preempted (possibly itself): its blocks are freed, it goes
//!    back to the FRONT of the waiting queue, its KV is dropped (it will
//!    recompute prompt + output so far as a prefill) and the preemption
//!    counter increases.
//! 2. If nothing was preempted in this step, waiting sequences are admitted in
//!    FIFO order while fewer than `max_num_seqs` run, budget remains and the
//!    blocks of the head's first chunk are free (no skipping: the head of the
//!    queue blocks the others, as in vLLM).
//! 3. The step lasts as long as the [`TimeModel`] says for its prefill
//!    tokens, decoding sequences and the context those read, with a seeded
//!    jitter.
//! 4. At the end of the step, every decode produced one token, and a prefill
//!    that finished produced one token (the first, or the next one after a
//!    recompute).
//!
//! Prefix cache (vLLM's automatic prefix caching, [`crate::prefix`]): a
//! sequence leaving the engine (finished or aborted) leaves its full
//! computed blocks cached; a waiting sequence admitted with a prompt whose
//! leading blocks are cached shares them (they count as used) and starts
//! its prefill after them, so the time model charges only the uncached
//! tokens. Idle cached blocks count as free and are evicted least recently
//! used first when a sequence needs blocks. A preempted sequence recomputes
//! everything, as without the cache: its own blocks are freed, not cached,
//! and its readmission does not look the cache up. (vLLM does both, which
//! makes its recomputes cheaper; the reference profile's time model was
//! fitted to a preempting server without that effect, and with it the
//! twin serves up to 30% more than the real server once it preempts.)
//!
//! A request's output is exactly `max_tokens` tokens. Roles: `Aggregate`
//! does everything; `Prefill` is given `max_tokens = 1`; `Decode` receives
//! sequences whose prompt KV is transferred (`kv_transferred`), as vLLM's
//! decode instance does with a KV connector (NixlConnector): the sequence
//! reaches the queue once the transfer is over
//! ([`TimeModel::kv_transfer_seconds`], after the request overhead), holds
//! the KV of every prompt token but the last, and its first step computes
//! that last token as a decode over the transferred context and samples the
//! first output token. The prefill engine's token is not the client's: the
//! decode engine produces all `max_tokens`, and its TTFT runs from the
//! request's arrival at it (transfer and queue included) to that first step.

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::metrics::{EngineMetrics, FinishedReason};
use crate::prefix::{BlockPool, PrefixKey};

mod time;
pub use time::{DEFAULT_KV_TRANSFER, DEFAULT_KV_TRANSFER_PER_TOKEN, StepWork, TimeModel};

/// The shortest step: time always moves on, whatever the time model (a
/// model whose costs are all 0 would otherwise produce tokens forever
/// without time passing).
const MIN_STEP: f64 = 1e-6;

/// Identifier of a sequence inside one engine (chosen by the caller).
pub type SeqId = u64;

/// What an engine can hold and how fast it steps.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: u32,
    pub kv_blocks: u32,
    pub block_size: u32,
    /// Longest prompt + output accepted (vLLM's `--max-model-len`); at most the KV capacity.
    pub max_model_len: u32,
    /// Keep the blocks of finished requests for later prompts with the same
    /// prefix (vLLM's `--enable-prefix-caching`, on by default in V1).
    pub prefix_caching: bool,
    pub time: TimeModel,
    pub seed: u64,
}

impl EngineConfig {
    /// Tokens the KV cache holds.
    pub fn kv_capacity(&self) -> u32 {
        self.kv_blocks.saturating_mul(self.block_size)
    }

    /// Longest prompt + output a request may need: `max_model_len`, never
    /// more than the whole KV cache (a longer sequence could never run).
    pub fn max_model_len(&self) -> u32 {
        self.max_model_len.min(self.kv_capacity())
    }
}

/// A sequence handed to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewSeq {
    pub id: SeqId,
    pub prompt_tokens: u32,
    /// Output tokens the sequence ends with.
    pub max_tokens: u32,
    /// The prompt's KV is transferred from a prefill engine (disaggregated
    /// decode): it arrives after the transfer, with no prefill to compute.
    pub kv_transferred: bool,
    /// How the request finishes when its tokens are done (`length` or `stop`).
    pub finish: FinishedReason,
}

impl NewSeq {
    /// A request whose whole output this engine generates, ending by length.
    pub fn new(id: SeqId, prompt_tokens: u32, max_tokens: u32) -> NewSeq {
        NewSeq {
            id,
            prompt_tokens,
            max_tokens,
            kv_transferred: false,
            finish: FinishedReason::Length,
        }
    }
}

/// A change a step made to one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqEvent {
    pub id: SeqId,
    /// Output tokens produced so far.
    pub generated: u32,
    /// The sequence completed with this step (its blocks are free).
    pub finished: bool,
    /// Prompt tokens its first admission found in the prefix cache (what it
    /// added to `vllm:prefix_cache_hits_total`; vLLM's `num_cached_tokens`).
    pub cached_tokens: u32,
}

/// Why a sequence was refused at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(
        "this model's maximum context length is {max_model_len} tokens; the request needs {needed} \
         ({prompt} in the prompt, {max_tokens} in the completion): shorten the prompt or lower max_tokens"
    )]
    TooLong {
        max_model_len: u32,
        needed: u64,
        prompt: u32,
        max_tokens: u32,
    },
    #[error("max_tokens must be at least 1")]
    NothingToGenerate,
    #[error("sequence id {0} is already in the engine")]
    DuplicateId(SeqId),
}

#[derive(Debug, Clone)]
struct Seq {
    new: NewSeq,
    prefix: PrefixKey,
    generated: u32,
    computed: u32,
    /// Blocks of its own (the cached ones it shares are `shared`).
    blocks: u32,
    /// Leading blocks of `prefix` found cached and shared, not computed.
    shared: usize,
    /// Prompt tokens found cached at its first admission (a readmission
    /// after a preemption looks nothing up): see [`SeqEvent::cached_tokens`].
    cached_tokens: u32,
    /// Whether it was admitted before: a readmission after a preemption
    /// recomputes everything (see the module's doc).
    admitted: bool,
    arrival: f64,
    first_scheduled: Option<f64>,
    prefill_done: Option<f64>,
    first_token: Option<f64>,
    last_token: Option<f64>,
    preemptions: u32,
    prefill_tokens_computed: u64,
}

impl Seq {
    /// Tokens a (re)computing prefill must bring into the KV cache.
    fn prefill_target(&self) -> u32 {
        if self.generated == 0 {
            self.new.prompt_tokens
        } else if self.computed + 1 >= self.new.prompt_tokens + self.generated {
            // Decode phase: invariant computed = prompt + generated - 1.
            self.computed
        } else {
            // Recompute after preemption: prompt and output so far.
            self.new.prompt_tokens + self.generated
        }
    }

    /// KV blocks it holds: its own and the cached ones it shares.
    fn held_blocks(&self) -> u32 {
        self.blocks + self.shared as u32
    }

    /// Whether its next token is a decode: after its prefill, or, with its
    /// prompt's KV transferred, its last prompt token (one query token over
    /// the transferred context: a decode's work, as on vLLM's decode instance).
    fn in_decode(&self) -> bool {
        self.computed + 1 >= self.new.prompt_tokens + self.generated
            && (self.generated > 0 || (self.new.kv_transferred && self.computed > 0))
    }

    /// Tokens this sequence computes in a step with `budget` tokens left:
    /// one when decoding, else the next chunk of its prefill.
    fn tokens_to_schedule(&self, budget: u32) -> u32 {
        if self.in_decode() {
            1.min(budget)
        } else {
            self.prefill_target()
                .saturating_sub(self.computed)
                .min(budget)
        }
    }
}

/// One sequence's part of a step.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// One token; `context` KV tokens are read.
    Decode { id: SeqId, context: u32 },
    /// A chunk of (re)computed prompt.
    Prefill(SeqId, u32),
}

impl Work {
    fn id(&self) -> SeqId {
        match *self {
            Work::Decode { id, .. } | Work::Prefill(id, _) => id,
        }
    }

    fn tokens(&self) -> u32 {
        match *self {
            Work::Decode { .. } => 1,
            Work::Prefill(_, n) => n,
        }
    }
}

/// See [`Engine::admission`].
struct Admission {
    shared: usize,
    tokens: u32,
    need: u32,
}

/// How [`Engine::allocate_or_preempt`] ended.
enum Allocation {
    /// The blocks are there; `preempted` tells whether others were preempted for them.
    Done { preempted: bool },
    /// The sequence itself was preempted (or is gone): it does not run in this step.
    PreemptedItself,
}

/// The engine: queues, KV pool, the step in progress and the metrics.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    rng: ChaCha8Rng,
    seqs: HashMap<SeqId, Seq>,
    /// Submitted, not queued yet: (time it reaches the queue, id), in order.
    arriving: VecDeque<(f64, SeqId)>,
    waiting: VecDeque<SeqId>,
    /// Admission order, oldest first.
    running: Vec<SeqId>,
    pool: BlockPool,
    in_step: Option<Vec<Work>>,
    metrics: EngineMetrics,
    /// The drift process's current value (standard normal in the long run).
    drift_state: f64,
}

fn blocks_for(tokens: u32, block_size: u32) -> u32 {
    tokens.div_ceil(block_size.max(1))
}

/// Give `seq`'s blocks back to `pool`; its full computed blocks stay
/// cached (idle) for later prompts with the same prefix.
fn release_blocks(pool: &mut BlockPool, block_size: u32, seq: &Seq) {
    let full = (seq.computed / block_size.max(1)) as usize;
    let own_full = full.saturating_sub(seq.shared).min(seq.blocks as usize);
    pool.release(&seq.prefix, seq.shared, seq.blocks, own_full);
}

impl Engine {
    pub fn new(cfg: EngineConfig, metrics: EngineMetrics) -> Engine {
        Engine {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            pool: BlockPool::new(cfg.kv_blocks, cfg.prefix_caching),
            cfg,
            seqs: HashMap::new(),
            arriving: VecDeque::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_step: None,
            metrics,
            drift_state: 0.0,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Fraction of KV blocks in use, 0..=1.
    pub fn kv_usage(&self) -> f64 {
        if self.cfg.kv_blocks == 0 {
            return 0.0;
        }
        f64::from(self.pool.used()) / f64::from(self.cfg.kv_blocks)
    }

    /// Cached blocks no sequence uses (kept for a later hit).
    pub fn idle_cached_blocks(&self) -> u32 {
        self.pool.idle_cached()
    }

    /// Prompt tokens a request of `prompt_tokens` keyed `prefix` would find
    /// cached if it were admitted now.
    pub fn cached_prefix_tokens(&self, prefix: &PrefixKey, prompt_tokens: u32) -> u32 {
        let size = self.cfg.block_size;
        self.pool
            .matching(prefix.lookup_blocks(prompt_tokens, size)) as u32
            * size
    }

    /// Whether a step would do anything.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// When the next submitted sequence reaches the queue, if one is on its
    /// way (see [`TimeModel::request_overhead`]): an idle engine wakes then.
    pub fn next_arrival(&self) -> Option<f64> {
        self.arriving.front().map(|(at, _)| *at)
    }

    /// Queue the sequences whose request overhead is over at `now`.
    fn queue_arrivals(&mut self, now: f64) {
        while let Some(&(at, id)) = self.arriving.front()
            && at <= now
        {
            self.arriving.pop_front();
            self.waiting.push_back(id);
        }
    }

    /// Queue a sequence (FIFO) at time `now`, with no prefix to share.
    pub fn submit(&mut self, new: NewSeq, now: f64) -> Result<(), SubmitError> {
        self.submit_with_prefix(new, PrefixKey::none(), now)
    }

    /// Queue a sequence whose token blocks hash to `prefix`: its prefill
    /// skips the leading blocks found cached, and its blocks stay cached
    /// when it ends.
    pub fn submit_with_prefix(
        &mut self,
        new: NewSeq,
        prefix: PrefixKey,
        now: f64,
    ) -> Result<(), SubmitError> {
        if new.max_tokens == 0 {
            return Err(SubmitError::NothingToGenerate);
        }
        let needed = u64::from(new.prompt_tokens) + u64::from(new.max_tokens);
        let max_model_len = self.cfg.max_model_len();
        if needed > u64::from(max_model_len) {
            return Err(SubmitError::TooLong {
                max_model_len,
                needed,
                prompt: new.prompt_tokens,
                max_tokens: new.max_tokens,
            });
        }
        if self.seqs.contains_key(&new.id) {
            return Err(SubmitError::DuplicateId(new.id));
        }
        // Transferred: the KV of every prompt token but the last, which the
        // first step computes to sample the first token (vLLM's decode
        // instance recomputes it, having no logits for it).
        let computed = if new.kv_transferred {
            new.prompt_tokens.saturating_sub(1)
        } else {
            0
        };
        self.seqs.insert(
            new.id,
            Seq {
                new,
                prefix,
                generated: 0,
                computed,
                blocks: 0,
                shared: 0,
                cached_tokens: 0,
                admitted: false,
                arrival: now,
                first_scheduled: None,
                prefill_done: if new.kv_transferred { Some(now) } else { None },
                first_token: None,
                last_token: None,
                preemptions: 0,
                prefill_tokens_computed: 0,
            },
        );
        let overhead = self.cfg.time.request_overhead;
        let transfer = if new.kv_transferred {
            self.cfg.time.kv_transfer_seconds(new.prompt_tokens)
        } else {
            0.0
        };
        if overhead > 0.0 || transfer > 0.0 {
            // The API server's latency varies: half to one and a half times the mean.
            let overhead = if overhead > 0.0 {
                overhead * self.rng.random_range(0.5..=1.5)
            } else {
                0.0
            };
            let at = now + overhead + transfer;
            let pos = self.arriving.partition_point(|(t, _)| *t <= at);
            self.arriving.insert(pos, (at, new.id));
        } else {
            self.waiting.push_back(new.id);
        }
        self.refresh_gauges();
        Ok(())
    }

    /// Remove a sequence (client went away). Returns whether it was present.
    pub fn abort(&mut self, id: SeqId, now: f64) -> bool {
        let Some(seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.arriving.retain(|(_, a)| *a != id);
        self.waiting.retain(|w| *w != id);
        self.running.retain(|r| *r != id);
        release_blocks(&mut self.pool, self.cfg.block_size, &seq);
        if let Some(work) = &mut self.in_step {
            work.retain(|w| w.id() != id);
        }
        self.finish_metrics(&seq, now, FinishedReason::Abort);
        self.refresh_gauges();
        true
    }

    /// Plan the next step at `now`: schedule work, admit, preempt. Returns
    /// the step's duration in seconds, or `None` if there is nothing to do.
    /// Must be followed by [`Engine::end_step`] before the next `begin_step`.
    pub fn begin_step(&mut self, now: f64) -> Option<f64> {
        debug_assert!(self.in_step.is_none(), "begin_step twice without end_step");
        self.queue_arrivals(now);
        if !self.has_work() {
            return None;
        }
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut work = Vec::new();
        let mut preempted_any = false;

        // 1. Running sequences, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(tokens) = self.seqs.get(&id).map(|s| s.tokens_to_schedule(budget)) else {
                i += 1;
                continue;
            };
            if tokens == 0 {
                i += 1;
                continue;
            }
            match self.allocate_or_preempt(id, tokens) {
                Allocation::Done { preempted } => preempted_any |= preempted,
                Allocation::PreemptedItself => {
                    preempted_any = true;
                    break;
                }
            }
            budget -= tokens;
            work.push(self.work_for(id, tokens));
            i += 1;
        }

        // 2. Admission, FIFO, only if nothing was preempted this step. The
        // head of the queue needs blocks for what it computes in this step
        // (its first chunk); if they are not free, nobody behind it passes.
        if !preempted_any {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(seq) = self.seqs.get(&id) else {
                    self.waiting.pop_front();
                    continue;
                };
                let plan = self.admission(seq, budget);
                let hit = &seq
                    .prefix
                    .lookup_blocks(seq.new.prompt_tokens, self.cfg.block_size)[..plan.shared];
                // Taking idle cached blocks makes them unavailable for the rest.
                if plan.need > self.pool.available() - self.pool.idle_among(hit) {
                    break;
                }
                self.waiting.pop_front();
                self.pool.share(hit);
                self.pool.take(plan.need);
                if let Some(s) = self.seqs.get_mut(&id) {
                    s.blocks += plan.need;
                    s.shared = plan.shared;
                    s.computed += plan.shared as u32 * self.cfg.block_size;
                    if s.first_scheduled.is_none() {
                        s.first_scheduled = Some(now);
                    }
                    // vLLM counts a query per request, in prompt tokens (a
                    // transferred prompt is no query of this engine's cache).
                    if !s.admitted && self.pool.caching() && !s.new.kv_transferred {
                        s.cached_tokens = plan.shared as u32 * self.cfg.block_size;
                        self.metrics.add_prefix_cache_query(
                            u64::from(s.new.prompt_tokens),
                            u64::from(s.cached_tokens),
                        );
                    }
                    s.admitted = true;
                }
                let tokens = plan.tokens;
                self.running.push(id);
                budget -= tokens;
                work.push(self.work_for(id, tokens));
            }
        }

        let duration = self.step_duration(&work);
        let tokens: u64 = work.iter().map(|w| u64::from(w.tokens())).sum();
        self.metrics.observe_iteration(tokens);
        self.in_step = Some(work);
        self.refresh_gauges();
        Some(duration)
    }

    /// What admitting the waiting `seq` takes: the leading cached blocks it
    /// shares instead of computing, the tokens it computes in this step (the
    /// first chunk after the cached ones) and the blocks those need.
    fn admission(&self, seq: &Seq, budget: u32) -> Admission {
        let size = self.cfg.block_size;
        let shared = if seq.computed == 0 && !seq.admitted {
            self.pool
                .matching(seq.prefix.lookup_blocks(seq.new.prompt_tokens, size))
        } else {
            0
        };
        let computed = seq.computed + shared as u32 * size;
        let tokens = if shared == 0 {
            seq.tokens_to_schedule(budget)
        } else {
            seq.prefill_target().saturating_sub(computed).min(budget)
        };
        let need =
            blocks_for(computed + tokens, size).saturating_sub(seq.held_blocks() + shared as u32);
        Admission {
            shared,
            tokens,
            need,
        }
    }

    /// The scheduled work of `tokens` tokens for sequence `id`.
    fn work_for(&self, id: SeqId, tokens: u32) -> Work {
        match self.seqs.get(&id) {
            Some(s) if s.in_decode() => Work::Decode {
                id,
                context: s.computed,
            },
            _ => Work::Prefill(id, tokens),
        }
    }

    /// Give `id` the blocks for `tokens` more tokens, preempting the most
    /// recently admitted running sequences (possibly `id` itself) while none
    /// are free.
    fn allocate_or_preempt(&mut self, id: SeqId, tokens: u32) -> Allocation {
        let mut preempted = false;
        loop {
            let Some(seq) = self.seqs.get(&id) else {
                return Allocation::PreemptedItself;
            };
            let need = blocks_for(seq.computed + tokens, self.cfg.block_size)
                .saturating_sub(seq.held_blocks());
            if self.pool.take(need) {
                if let Some(s) = self.seqs.get_mut(&id) {
                    s.blocks += need;
                }
                return Allocation::Done { preempted };
            }
            let Some(victim) = self.running.pop() else {
                return Allocation::PreemptedItself;
            };
            self.preempt(victim);
            preempted = true;
            if victim == id {
                return Allocation::PreemptedItself;
            }
        }
    }

    /// The time model applied to one step's work, with the seeded jitter.
    fn step_duration(&mut self, work: &[Work]) -> f64 {
        let mut done = StepWork::default();
        for w in work {
            match *w {
                Work::Decode { context, .. } => {
                    done.decode_seqs += 1;
                    done.context_tokens += u64::from(context);
                }
                Work::Prefill(_, n) => done.prefill_tokens += u64::from(n),
            }
        }
        let t = self.cfg.time;
        let u: f64 = if t.jitter > 0.0 {
            self.rng.random_range(-1.0..=1.0)
        } else {
            0.0
        };
        let step = t.step_seconds(done) * (1.0 + t.jitter * u);
        (step * self.drift_factor(step)).max(MIN_STEP)
    }

    /// The drift's factor for a step of `step` seconds: `exp(drift * x)`,
    /// `x` a standard Ornstein-Uhlenbeck process with correlation time
    /// `drift_time`, normalised so that the factor's mean is 1.
    fn drift_factor(&mut self, step: f64) -> f64 {
        let t = &self.cfg.time;
        if t.drift <= 0.0 || t.drift_time <= 0.0 {
            return 1.0;
        }
        let keep = (-step / t.drift_time).exp();
        // Box-Muller: a standard normal draw from two uniform ones.
        let (u1, u2): (f64, f64) = (
            self.rng.random_range(f64::EPSILON..1.0),
            self.rng.random_range(0.0..1.0),
        );
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        self.drift_state = self.drift_state * keep + (1.0 - keep * keep).sqrt() * normal;
        (t.drift * self.drift_state - t.drift * t.drift / 2.0).exp()
    }

    /// Finish the step planned by [`Engine::begin_step`] at time `now`:
    /// tokens are produced, finished sequences leave and free their blocks.
    pub fn end_step(&mut self, now: f64) -> Vec<SeqEvent> {
        let Some(work) = self.in_step.take() else {
            return Vec::new();
        };
        let mut events = Vec::with_capacity(work.len());
        let mut finished = Vec::new();
        for w in work {
            let (id, produced) = match w {
                Work::Decode { id, .. } => {
                    let Some(s) = self.seqs.get_mut(&id) else {
                        continue;
                    };
                    s.computed += 1;
                    (id, true)
                }
                Work::Prefill(id, n) => {
                    let Some(s) = self.seqs.get_mut(&id) else {
                        continue;
                    };
                    let target = s.prefill_target();
                    s.computed += n;
                    s.prefill_tokens_computed += u64::from(n);
                    let done = s.computed >= target;
                    if done && s.prefill_done.is_none() {
                        // Counted once per request, as vLLM does (recomputes are not prompt tokens).
                        s.prefill_done = Some(now);
                        self.metrics
                            .add_prompt_tokens(u64::from(s.new.prompt_tokens));
                    }
                    (id, done)
                }
            };
            if !produced {
                continue;
            }
            let Some(s) = self.seqs.get_mut(&id) else {
                continue;
            };
            s.generated += 1;
            self.metrics.add_generation_tokens(1);
            match s.last_token {
                Some(prev) => self.metrics.observe_itl(now - prev),
                None => {
                    s.first_token = Some(now);
                    self.metrics.observe_ttft(now - s.arrival);
                }
            }
            s.last_token = Some(now);
            let done = s.generated >= s.new.max_tokens;
            events.push(SeqEvent {
                id,
                generated: s.generated,
                finished: done,
                cached_tokens: s.cached_tokens,
            });
            if done {
                finished.push(id);
            }
        }
        for id in finished {
            self.running.retain(|r| *r != id);
            if let Some(seq) = self.seqs.remove(&id) {
                release_blocks(&mut self.pool, self.cfg.block_size, &seq);
                self.finish_metrics(&seq, now, seq.new.finish);
            }
        }
        self.refresh_gauges();
        events
    }

    fn preempt(&mut self, id: SeqId) {
        if let Some(s) = self.seqs.get_mut(&id) {
            // Its own blocks are freed, not cached (see the module's doc).
            self.pool.release(&s.prefix, s.shared, s.blocks, 0);
            s.blocks = 0;
            s.shared = 0;
            s.computed = 0;
            s.preemptions += 1;
            self.metrics.add_preemption();
        }
        self.running.retain(|r| *r != id);
        self.waiting.push_front(id);
    }

    fn finish_metrics(&mut self, seq: &Seq, now: f64, reason: FinishedReason) {
        let queued = seq
            .first_scheduled
            .map(|t| t - seq.arrival)
            .unwrap_or(now - seq.arrival);
        let inference = seq.first_scheduled.map(|t| now - t).unwrap_or(0.0);
        let prefill = match (seq.first_scheduled, seq.prefill_done) {
            (Some(a), Some(b)) if b >= a => b - a,
            _ => 0.0,
        };
        let decode = seq.prefill_done.map(|t| (now - t).max(0.0)).unwrap_or(0.0);
        let tpot = match (seq.first_token, seq.last_token) {
            (Some(a), Some(b)) if seq.generated > 1 => Some((b - a) / f64::from(seq.generated - 1)),
            _ => None,
        };
        self.metrics.observe_finished(crate::metrics::Finished {
            reason,
            e2e: now - seq.arrival,
            queued,
            inference,
            prefill,
            decode,
            tpot,
            prompt_tokens: seq.new.prompt_tokens,
            generation_tokens: seq.generated,
            max_tokens: seq.new.max_tokens,
            preemptions: seq.preemptions,
            prefill_kv_computed: seq.prefill_tokens_computed,
        });
    }

    fn refresh_gauges(&mut self) {
        let running = self.running.len();
        let waiting = self.waiting.len();
        let kv = self.kv_usage();
        self.metrics.set_gauges(running, waiting, kv);
    }
}

#[cfg(test)]
mod tests;
