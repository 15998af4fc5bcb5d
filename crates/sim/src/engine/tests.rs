//! The engine's unit tests: scheduling, preemption, KV accounting and the
//! prefix cache on a virtual clock.

use super::*;
use crate::metrics::EngineMetrics;

fn cfg(max_num_seqs: usize, kv_blocks: u32) -> EngineConfig {
    EngineConfig {
        max_num_seqs,
        max_num_batched_tokens: 2048,
        kv_blocks,
        block_size: 16,
        max_model_len: u32::MAX,
        prefix_caching: true,
        time: TimeModel {
            step_overhead: 0.002,
            prefill_per_token: 0.00002,
            decode_per_seq: 0.0002,
            decode_per_context_token: 0.0,
            jitter: 0.1,
            request_overhead: 0.0,
            drift: 0.0,
            drift_time: 0.0,
            kv_transfer: 0.0,
            kv_transfer_per_token: 0.0,
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
        let new = NewSeq::new(id, self.prompt, self.max_tokens);
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
        e.submit(NewSeq::new(id, 128, 64), 0.0).unwrap();
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
    let err = e.submit(NewSeq::new(1, 60, 10), 0.0).unwrap_err();
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
            kv_transferred: true,
            ..NewSeq::new(1, 100, 5)
        },
        0.0,
    )
    .unwrap();
    let mut now = 0.0;
    let mut last = 0;
    while let Some(d) = e.begin_step(now) {
        now += d;
        for ev in e.end_step(now) {
            assert_eq!(ev.generated, last + 1, "one token a step, from the first");
            last = ev.generated;
        }
    }
    assert_eq!(last, 5, "every output token, the first included");
    assert_eq!(e.metrics().generation_tokens(), 5);
    assert_eq!(
        e.metrics().prompt_tokens(),
        0,
        "no prefill compute for transferred KV"
    );
}

/// The transfer of a prompt's KV delays the decode engine's queue by the
/// time model's amount (after the request overhead) and counts in its TTFT,
/// whose first step is a decode over the transferred context: the last
/// prompt token in, the first output token out.
#[test]
fn the_kv_transfer_delays_the_decode_queue_and_counts_in_ttft() {
    let time = TimeModel {
        decode_per_seq: 2e-4,
        decode_per_context_token: 1e-6,
        kv_transfer: 0.002,
        kv_transfer_per_token: 1e-5,
        ..NO_COST
    };
    let mut e = Engine::new(timed(time), EngineMetrics::new("m", "0", 4096));
    let transferred = NewSeq {
        kv_transferred: true,
        ..NewSeq::new(1, 100, 3)
    };
    e.submit(transferred, 0.0).unwrap();
    let at = e.next_arrival().unwrap();
    assert!((at - 0.003).abs() < 1e-12, "2 ms + 100 x 10 us: {at}");
    assert_eq!(
        e.begin_step(at - 1e-6),
        None,
        "not queued during the transfer"
    );
    let step = e.begin_step(at).unwrap();
    assert!(
        (step - (0.001 + 2e-4 + 99.0 * 1e-6)).abs() < 1e-12,
        "a decode reading the 99 transferred tokens: {step}"
    );
    let events = e.end_step(at + step);
    assert_eq!(events[0].generated, 1);
    let ttft = e.metrics().ttft().sum();
    assert!(
        (ttft - (at + step)).abs() < 1e-9,
        "TTFT from the arrival at the decode engine: {ttft}"
    );

    // The aggregate engine's requests transfer nothing.
    let mut e = Engine::new(timed(time), EngineMetrics::new("m", "0", 4096));
    e.submit(NewSeq::new(1, 100, 3), 0.0).unwrap();
    assert_eq!(e.next_arrival(), None);
    assert_eq!(e.num_waiting(), 1);
}

#[test]
fn abort_frees_blocks() {
    let mut e = Engine::new(cfg(4, 100), EngineMetrics::new("m", "0", 4096));
    e.submit(NewSeq::new(1, 100, 5), 0.0).unwrap();
    e.begin_step(0.0).unwrap();
    assert!(e.kv_usage() > 0.0);
    assert!(e.abort(1, 0.001));
    assert_eq!(e.kv_usage(), 0.0);
    assert!(e.end_step(0.002).is_empty());
    assert!(!e.has_work());
}

/// `cfg` without jitter and with the given time model.
fn timed(time: TimeModel) -> EngineConfig {
    EngineConfig {
        time,
        ..cfg(8, 10_000)
    }
}

const NO_COST: TimeModel = TimeModel {
    step_overhead: 0.001,
    prefill_per_token: 0.0,
    decode_per_seq: 0.0,
    decode_per_context_token: 0.0,
    jitter: 0.0,
    request_overhead: 0.0,
    drift: 0.0,
    drift_time: 0.0,
    kv_transfer: 0.0,
    kv_transfer_per_token: 0.0,
};

#[test]
fn each_cost_of_the_time_model_lengthens_the_step_it_applies_to() {
    let step = |time: TimeModel, prompt: u32, decoding: bool| {
        let mut e = Engine::new(timed(time), EngineMetrics::new("m", "0", 4096));
        e.submit(NewSeq::new(1, prompt, 100), 0.0).unwrap();
        let first = e.begin_step(0.0).unwrap();
        e.end_step(first);
        if decoding {
            e.begin_step(first).unwrap()
        } else {
            first
        }
    };
    let base = step(NO_COST, 100, false);
    assert!((base - 0.001).abs() < 1e-12);
    let prefill = TimeModel {
        prefill_per_token: 1e-5,
        ..NO_COST
    };
    assert!((step(prefill, 100, false) - (0.001 + 100.0 * 1e-5)).abs() < 1e-12);
    let decode = TimeModel {
        decode_per_seq: 2e-4,
        ..NO_COST
    };
    assert!((step(decode, 100, true) - 0.0012).abs() < 1e-12);
    // A decode reads its context: the 100 prompt tokens (the first
    // output token has no KV entry yet).
    let context = TimeModel {
        decode_per_context_token: 1e-6,
        ..NO_COST
    };
    assert!((step(context, 100, true) - (0.001 + 100.0 * 1e-6)).abs() < 1e-12);
    assert!(step(context, 1000, true) > step(context, 100, true));
}

#[test]
fn the_request_overhead_delays_the_queue_and_counts_in_ttft() {
    let time = TimeModel {
        request_overhead: 0.010,
        ..NO_COST
    };
    let mut e = Engine::new(timed(time), EngineMetrics::new("m", "0", 4096));
    e.submit(NewSeq::new(1, 10, 2), 0.0).unwrap();
    assert!(
        !e.has_work() && e.num_waiting() == 0,
        "still in the API server"
    );
    let at = e.next_arrival().unwrap();
    assert!(
        (0.005..=0.015).contains(&at),
        "half to 1.5 times the overhead: {at}"
    );
    assert_eq!(e.begin_step(at - 1e-6), None, "not queued before its time");
    let step = e.begin_step(at).unwrap();
    let events = e.end_step(at + step);
    assert_eq!(events.len(), 1);
    let ttft = e.metrics().ttft().sum();
    assert!(
        (ttft - (at + step)).abs() < 1e-9,
        "TTFT from submission: {ttft}"
    );
}

#[test]
fn a_time_model_of_no_cost_still_moves_time_on() {
    // Else a virtual sweep would produce tokens forever at one instant.
    let free = TimeModel {
        step_overhead: 0.0,
        ..NO_COST
    };
    let mut e = Engine::new(timed(free), EngineMetrics::new("m", "0", 4096));
    e.submit(NewSeq::new(1, 10, 2), 0.0).unwrap();
    assert_eq!(e.begin_step(0.0), Some(MIN_STEP));
}

#[test]
fn drift_is_seeded_and_keeps_the_mean_step() {
    let run = |drift: f64, seed: u64| {
        let time = TimeModel {
            drift,
            drift_time: 0.05,
            ..NO_COST
        };
        let mut e = Engine::new(
            EngineConfig {
                seed,
                ..timed(time)
            },
            EngineMetrics::new("m", "0", 4096),
        );
        e.submit(NewSeq::new(1, 10, 20_000), 0.0).unwrap();
        let (mut now, mut steps) = (0.0, Vec::new());
        while let Some(d) = e.begin_step(now) {
            now += d;
            steps.push(d);
            e.end_step(now);
        }
        steps
    };
    assert!(run(0.0, 1).iter().all(|d| (d - 0.001).abs() < 1e-12));
    let drifting = run(0.5, 1);
    assert_eq!(drifting, run(0.5, 1), "same seed, same steps");
    assert_ne!(drifting, run(0.5, 2));
    let mean = drifting.iter().sum::<f64>() / drifting.len() as f64;
    assert!((mean / 0.001 - 1.0).abs() < 0.05, "mean step {mean}");
    let (lo, hi) = drifting
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), d| (lo.min(*d), hi.max(*d)));
    assert!(lo < 0.0007 && hi > 0.0014, "it drifts: {lo}..{hi}");
}

#[test]
fn a_long_prompt_is_admitted_with_the_blocks_of_its_first_chunk() {
    // vLLM V1: the head of the queue needs blocks for what it computes
    // now (its first chunk), not for its whole prompt. 40 blocks of 16;
    // A holds 19 of them; B's 480-token prompt needs 30 but its first
    // 64-token chunk 4, so B starts in the same step as A's decode.
    let mut e = Engine::new(
        EngineConfig {
            max_num_batched_tokens: 64,
            ..cfg(8, 40)
        },
        EngineMetrics::new("m", "0", 4096),
    );
    e.submit(NewSeq::new(1, 300, 50), 0.0).unwrap();
    let mut now = 0.0;
    while e.num_running() == 0 || e.seqs[&1].generated == 0 {
        now += e.begin_step(now).unwrap();
        e.end_step(now);
    }
    e.submit(NewSeq::new(2, 480, 10), now).unwrap();
    now += e.begin_step(now).unwrap();
    assert_eq!(e.num_running(), 2, "B admitted with 21 blocks free");
    assert_eq!(e.seqs[&2].blocks, 4, "the first chunk's blocks only");
    e.end_step(now);
    // Both complete; B, the most recently admitted, yields when the
    // cache runs out.
    while let Some(d) = e.begin_step(now) {
        now += d;
        e.end_step(now);
    }
    assert_eq!(e.metrics().success(FinishedReason::Length), 2);
}
