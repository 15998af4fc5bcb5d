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
//!    step's token budget (`max_num_batched_tokens`): a decode sequence one
//!    token, a sequence still prefilling a chunk of its remaining prefill.
//!    A decode that needs a new block when none is free preempts the most
//!    recently admitted running sequence (possibly itself): its blocks are
//!    freed, it goes back to the FRONT of the waiting queue, its KV is dropped
//!    (it will recompute prompt + output so far as a prefill) and the
//!    preemption counter increases.
//! 2. If nothing was preempted in this step, waiting sequences are admitted in
//!    FIFO order while fewer than `max_num_seqs` run, budget remains and the
//!    head's whole prefill fits in the free blocks (no skipping: the head of
//!    the queue blocks the others, as in vLLM).
//! 3. The step lasts
//!    `(base + per_decode_seq * decode_seqs + per_prefill_token * prefill_tokens) * (1 + jitter * u)`
//!    seconds, `u` uniform in [-1, 1] from the seeded generator.
//! 4. At the end of the step, every decode produced one token, and a prefill
//!    that finished produced one token (the first, or the next one after a
//!    recompute).
//!
//! A request's output is exactly `max_tokens` tokens. Roles: `Aggregate`
//! does everything; `Prefill` is given `max_tokens = 1`; `Decode` receives
//! sequences whose prompt KV was transferred (`kv_transferred`) and whose
//! first token is already produced (`pre_generated = 1`), so they decode
//! straight away.

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::metrics::{EngineMetrics, FinishedReason};

/// Identifier of a sequence inside one engine (chosen by the caller).
pub type SeqId = u64;

/// Cost model of one engine step, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// Fixed cost of any step.
    pub base: f64,
    /// Added per sequence that decodes one token in the step.
    pub per_decode_seq: f64,
    /// Added per prompt token prefilled in the step.
    pub per_prefill_token: f64,
    /// Relative jitter: the step time is multiplied by `1 + jitter * u`, `u` in [-1, 1].
    pub jitter: f64,
}

/// What an engine can hold and how fast it steps.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: u32,
    pub kv_blocks: u32,
    pub block_size: u32,
    pub cost: StepCost,
    pub seed: u64,
}

impl EngineConfig {
    /// Largest prompt + output a single sequence may need: the whole KV cache.
    pub fn max_model_len(&self) -> u32 {
        self.kv_blocks.saturating_mul(self.block_size)
    }
}

/// A sequence handed to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewSeq {
    pub id: SeqId,
    pub prompt_tokens: u32,
    /// Total output tokens the sequence ends with (including `pre_generated`).
    pub max_tokens: u32,
    /// Output tokens produced elsewhere before it arrived (disaggregated decode: 1).
    pub pre_generated: u32,
    /// The prompt's KV arrives with the sequence (disaggregated decode): no prefill compute.
    pub kv_transferred: bool,
    /// How the request finishes when its tokens are done (`length` or `stop`).
    pub finish: FinishedReason,
}

/// A change a step made to one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqEvent {
    pub id: SeqId,
    /// Output tokens produced so far (including `pre_generated`).
    pub generated: u32,
    /// The sequence completed with this step (its blocks are free).
    pub finished: bool,
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
    #[error("max_tokens must be at least 1 and above the tokens already generated")]
    NothingToGenerate,
    #[error("sequence id {0} is already in the engine")]
    DuplicateId(SeqId),
}

#[derive(Debug, Clone)]
struct Seq {
    new: NewSeq,
    generated: u32,
    computed: u32,
    blocks: u32,
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

    fn in_decode(&self) -> bool {
        self.generated > 0 && self.computed + 1 >= self.new.prompt_tokens + self.generated
    }
}

#[derive(Debug, Clone, Copy)]
enum Work {
    Decode(SeqId),
    Prefill(SeqId, u32),
}

/// The engine: queues, KV pool, the step in progress and the metrics.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    rng: ChaCha8Rng,
    seqs: HashMap<SeqId, Seq>,
    waiting: VecDeque<SeqId>,
    /// Admission order, oldest first.
    running: Vec<SeqId>,
    free_blocks: u32,
    in_step: Option<Vec<Work>>,
    metrics: EngineMetrics,
}

fn blocks_for(tokens: u32, block_size: u32) -> u32 {
    tokens.div_ceil(block_size.max(1))
}

impl Engine {
    pub fn new(cfg: EngineConfig, metrics: EngineMetrics) -> Engine {
        Engine {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            free_blocks: cfg.kv_blocks,
            cfg,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_step: None,
            metrics,
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
        f64::from(self.cfg.kv_blocks - self.free_blocks) / f64::from(self.cfg.kv_blocks)
    }

    /// Whether a step would do anything.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Queue a sequence (FIFO) at time `now`.
    pub fn submit(&mut self, new: NewSeq, now: f64) -> Result<(), SubmitError> {
        if new.max_tokens == 0 || new.max_tokens <= new.pre_generated {
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
        let computed = if new.kv_transferred {
            new.prompt_tokens + new.pre_generated.saturating_sub(1)
        } else {
            0
        };
        self.seqs.insert(
            new.id,
            Seq {
                new,
                generated: new.pre_generated,
                computed,
                blocks: 0,
                arrival: now,
                first_scheduled: None,
                prefill_done: if new.kv_transferred { Some(now) } else { None },
                first_token: None,
                last_token: None,
                preemptions: 0,
                prefill_tokens_computed: 0,
            },
        );
        self.waiting.push_back(new.id);
        self.refresh_gauges();
        Ok(())
    }

    /// Remove a sequence (client went away). Returns whether it was present.
    pub fn abort(&mut self, id: SeqId, now: f64) -> bool {
        let Some(seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.waiting.retain(|w| *w != id);
        self.running.retain(|r| *r != id);
        self.free_blocks += seq.blocks;
        if let Some(work) = &mut self.in_step {
            work.retain(|w| match w {
                Work::Decode(s) | Work::Prefill(s, _) => *s != id,
            });
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
        if !self.has_work() {
            return None;
        }
        let bs = self.cfg.block_size;
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut work = Vec::new();
        let mut preempted_any = false;

        // 1. Running sequences, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(seq) = self.seqs.get(&id) else {
                i += 1;
                continue;
            };
            if seq.in_decode() {
                let need = blocks_for(seq.computed + 1, bs);
                let mut scheduled_self = true;
                while self.seqs.get(&id).map(|s| s.blocks).unwrap_or(need) < need {
                    if self.free_blocks > 0 {
                        self.free_blocks -= 1;
                        if let Some(s) = self.seqs.get_mut(&id) {
                            s.blocks += 1;
                        }
                        continue;
                    }
                    // No free block: preempt the most recently admitted.
                    let Some(victim) = self.running.pop() else {
                        scheduled_self = false;
                        break;
                    };
                    self.preempt(victim);
                    preempted_any = true;
                    if victim == id {
                        scheduled_self = false;
                        break;
                    }
                }
                if !scheduled_self {
                    break;
                }
                budget -= 1;
                work.push(Work::Decode(id));
            } else {
                let remaining = seq.prefill_target().saturating_sub(seq.computed);
                let chunk = remaining.min(budget);
                if chunk > 0 {
                    budget -= chunk;
                    work.push(Work::Prefill(id, chunk));
                }
            }
            i += 1;
        }

        // 2. Admission, FIFO, only if nothing was preempted this step.
        if !preempted_any {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(seq) = self.seqs.get(&id) else {
                    self.waiting.pop_front();
                    continue;
                };
                let target = seq.prefill_target();
                // A sequence whose KV arrived decodes at once: it needs room for one more token.
                let tokens = if seq.in_decode() {
                    seq.computed + 1
                } else {
                    target
                };
                let need = blocks_for(tokens, bs).saturating_sub(seq.blocks);
                if need > self.free_blocks {
                    break;
                }
                self.waiting.pop_front();
                self.free_blocks -= need;
                let chunk = target.saturating_sub(seq.computed).min(budget);
                if let Some(s) = self.seqs.get_mut(&id) {
                    s.blocks += need;
                    if s.first_scheduled.is_none() {
                        s.first_scheduled = Some(now);
                    }
                }
                self.running.push(id);
                if chunk > 0 {
                    budget -= chunk;
                    work.push(Work::Prefill(id, chunk));
                } else {
                    // KV already there (transferred): decode straight away.
                    budget -= 1;
                    work.push(Work::Decode(id));
                }
            }
        }

        let decode_seqs = work.iter().filter(|w| matches!(w, Work::Decode(_))).count();
        let prefill_tokens: u32 = work
            .iter()
            .map(|w| match w {
                Work::Prefill(_, n) => *n,
                Work::Decode(_) => 0,
            })
            .sum();
        let c = self.cfg.cost;
        let base = c.base
            + c.per_decode_seq * decode_seqs as f64
            + c.per_prefill_token * f64::from(prefill_tokens);
        let u: f64 = if c.jitter > 0.0 {
            self.rng.random_range(-1.0..=1.0)
        } else {
            0.0
        };
        let duration = (base * (1.0 + c.jitter * u)).max(0.0);
        self.metrics
            .observe_iteration(decode_seqs as u64 + u64::from(prefill_tokens));
        self.in_step = Some(work);
        self.refresh_gauges();
        Some(duration)
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
                Work::Decode(id) => {
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
            });
            if done {
                finished.push(id);
            }
        }
        for id in finished {
            self.running.retain(|r| *r != id);
            if let Some(seq) = self.seqs.remove(&id) {
                self.free_blocks += seq.blocks;
                self.finish_metrics(&seq, now, seq.new.finish);
            }
        }
        self.refresh_gauges();
        events
    }

    fn preempt(&mut self, id: SeqId) {
        if let Some(s) = self.seqs.get_mut(&id) {
            self.free_blocks += s.blocks;
            s.blocks = 0;
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
        let own_tokens = seq.generated.saturating_sub(seq.new.pre_generated);
        let tpot = match (seq.first_token, seq.last_token) {
            (Some(a), Some(b)) if own_tokens > 1 => Some((b - a) / f64::from(own_tokens - 1)),
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
            generation_tokens: own_tokens,
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
mod tests {
    use super::*;
    use crate::metrics::EngineMetrics;

    fn cfg(max_num_seqs: usize, kv_blocks: u32) -> EngineConfig {
        EngineConfig {
            max_num_seqs,
            max_num_batched_tokens: 2048,
            kv_blocks,
            block_size: 16,
            cost: StepCost {
                base: 0.002,
                per_decode_seq: 0.0002,
                per_prefill_token: 0.00002,
                jitter: 0.1,
            },
            seed: 7,
        }
    }

    /// Closed-loop driver on a virtual clock: `clients` clients, each sending
    /// `per_client` requests back to back. Returns per-request
    /// (ttft, tokens) and the maxima of waiting and KV usage seen.
    struct Outcome {
        ttft: Vec<f64>,
        tokens: HashMap<SeqId, u32>,
        max_waiting: usize,
        max_kv: f64,
        preemptions: u64,
        completed: usize,
    }

    struct Clients {
        next_id: SeqId,
        left: Vec<usize>,
        owner: HashMap<SeqId, usize>,
        arrival: HashMap<SeqId, f64>,
        prompt: u32,
        max_tokens: u32,
    }

    impl Clients {
        fn submit(&mut self, e: &mut Engine, client: usize, now: f64) {
            if self.left[client] == 0 {
                return;
            }
            self.left[client] -= 1;
            let id = self.next_id;
            self.next_id += 1;
            self.owner.insert(id, client);
            self.arrival.insert(id, now);
            let new = NewSeq {
                id,
                prompt_tokens: self.prompt,
                max_tokens: self.max_tokens,
                pre_generated: 0,
                kv_transferred: false,
                finish: FinishedReason::Length,
            };
            e.submit(new, now).unwrap();
        }
    }

    fn drive(
        cfg: EngineConfig,
        clients: usize,
        per_client: usize,
        prompt: u32,
        max_tokens: u32,
    ) -> Outcome {
        let mut e = Engine::new(cfg, EngineMetrics::new("m", "0", 4096));
        let mut now = 0.0;
        let mut cl = Clients {
            next_id: 0,
            left: vec![per_client; clients],
            owner: HashMap::new(),
            arrival: HashMap::new(),
            prompt,
            max_tokens,
        };
        let mut out = Outcome {
            ttft: Vec::new(),
            tokens: HashMap::new(),
            max_waiting: 0,
            max_kv: 0.0,
            preemptions: 0,
            completed: 0,
        };
        for c in 0..clients {
            cl.submit(&mut e, c, now);
        }
        let mut steps = 0u64;
        while let Some(d) = e.begin_step(now) {
            out.max_waiting = out.max_waiting.max(e.num_waiting());
            out.max_kv = out.max_kv.max(e.kv_usage());
            assert!(e.num_running() <= e.config().max_num_seqs);
            now += d;
            for ev in e.end_step(now) {
                let first = *out.tokens.get(&ev.id).unwrap_or(&0) == 0;
                if first {
                    out.ttft.push(now - cl.arrival[&ev.id]);
                }
                out.tokens.insert(ev.id, ev.generated);
                if ev.finished {
                    out.completed += 1;
                    let c = cl.owner[&ev.id];
                    cl.submit(&mut e, c, now);
                }
            }
            steps += 1;
            assert!(steps < 10_000_000, "engine did not drain");
        }
        out.preemptions = e.metrics().preemptions();
        out
    }

    fn p99(v: &mut [f64]) -> f64 {
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)]
    }

    #[test]
    fn at_or_below_max_num_seqs_nothing_waits() {
        let o = drive(cfg(8, 10_000), 8, 5, 128, 64);
        // Submissions land between steps; none stays queued past a step.
        assert_eq!(o.completed, 40);
        assert_eq!(o.preemptions, 0);
        assert_eq!(o.max_waiting, 0, "a request never waits past the next step");
        let mut e = Engine::new(cfg(8, 10_000), EngineMetrics::new("m", "0", 4096));
        for id in 0..8 {
            e.submit(
                NewSeq {
                    id,
                    prompt_tokens: 128,
                    max_tokens: 64,
                    pre_generated: 0,
                    kv_transferred: false,
                    finish: FinishedReason::Length,
                },
                0.0,
            )
            .unwrap();
        }
        e.begin_step(0.0).unwrap();
        assert_eq!(e.num_waiting(), 0, "all 8 admitted in the first step");
        assert_eq!(e.num_running(), 8);
    }

    #[test]
    fn four_times_max_num_seqs_queues_and_ttft_rises() {
        let mut low = drive(cfg(8, 10_000), 8, 6, 128, 64);
        let mut high = drive(cfg(8, 10_000), 32, 6, 128, 64);
        assert!(
            high.max_waiting >= 20,
            "waiting at 4x: {}",
            high.max_waiting
        );
        let (lo, hi) = (p99(&mut low.ttft), p99(&mut high.ttft));
        assert!(hi > 3.0 * lo, "ttft p99 low {lo} high {hi}");
    }

    #[test]
    fn tiny_kv_saturates_and_preempts_but_everything_completes() {
        // 40 blocks of 16 = 640 tokens; 8 requests of 64 + 128 need 8*12 = 96 blocks.
        let o = drive(cfg(8, 40), 8, 4, 64, 128);
        assert!(o.max_kv >= 0.95, "kv max {}", o.max_kv);
        assert!(o.preemptions > 0);
        assert_eq!(o.completed, 32);
        assert!(o.tokens.values().all(|&t| t == 128), "{:?}", o.tokens);
    }

    #[test]
    fn same_seed_same_timeline() {
        let a = drive(cfg(4, 30), 8, 3, 50, 40);
        let b = drive(cfg(4, 30), 8, 3, 50, 40);
        assert_eq!(a.ttft, b.ttft);
        assert_eq!(a.preemptions, b.preemptions);
    }

    #[test]
    fn too_long_is_refused() {
        let mut e = Engine::new(cfg(4, 4), EngineMetrics::new("m", "0", 4096));
        let err = e
            .submit(
                NewSeq {
                    id: 1,
                    prompt_tokens: 60,
                    max_tokens: 10,
                    pre_generated: 0,
                    kv_transferred: false,
                    finish: FinishedReason::Length,
                },
                0.0,
            )
            .unwrap_err();
        assert!(matches!(
            err,
            SubmitError::TooLong {
                max_model_len: 64,
                ..
            }
        ));
    }

    #[test]
    fn decode_role_starts_decoding_with_transferred_kv() {
        let mut e = Engine::new(cfg(4, 100), EngineMetrics::new("m", "0", 4096));
        e.submit(
            NewSeq {
                id: 1,
                prompt_tokens: 100,
                max_tokens: 5,
                pre_generated: 1,
                kv_transferred: true,
                finish: FinishedReason::Length,
            },
            0.0,
        )
        .unwrap();
        let mut now = 0.0;
        let mut last = 0;
        while let Some(d) = e.begin_step(now) {
            now += d;
            for ev in e.end_step(now) {
                assert_eq!(ev.generated, last.max(1) + 1);
                last = ev.generated;
            }
        }
        assert_eq!(last, 5);
        assert_eq!(
            e.metrics().prompt_tokens(),
            0,
            "no prefill compute for transferred KV"
        );
    }

    #[test]
    fn abort_frees_blocks() {
        let mut e = Engine::new(cfg(4, 100), EngineMetrics::new("m", "0", 4096));
        e.submit(
            NewSeq {
                id: 1,
                prompt_tokens: 100,
                max_tokens: 5,
                pre_generated: 0,
                kv_transferred: false,
                finish: FinishedReason::Length,
            },
            0.0,
        )
        .unwrap();
        e.begin_step(0.0).unwrap();
        assert!(e.kv_usage() > 0.0);
        assert!(e.abort(1, 0.001));
        assert_eq!(e.kv_usage(), 0.0);
        assert!(e.end_step(0.002).is_empty());
        assert!(!e.has_work());
    }
}
