//! `--profile vllm-cpu-ref` against the real vLLM sweep it was fitted to
//! (`nyann_sim::reference`), level by level, on the virtual clock with the
//! recording's 30-second stages (a few tenths of a second per sweep). The
//! bounds: output tokens/s within ±25%, waiting p50 within ±30% or ±2,
//! server TTFT p99 in the recording's vLLM histogram bucket or the next one
//! up, KV saturation (>= 95%) and the first preemptions at the same level.
//! Several seeds, so the profile's noise (jitter, drift) is not lucky once.

use nyann_sim::ServerProfile;
use nyann_sim::metrics::{Histogram, TTFT_BUCKETS};
use nyann_sim::profile::Role;
use nyann_sim::reference::{LEVELS, Level, OUTPUT_TOKENS, PROMPT_TOKENS, STAGE_SECONDS};
use nyann_sim::sweep::{StageFigures, SweepStage, run};

fn sweep(seed: u64) -> Vec<StageFigures> {
    let cfg = ServerProfile::vllm_cpu_ref()
        .engine(Role::Aggregate)
        .config(seed);
    let stages: Vec<SweepStage> = LEVELS
        .iter()
        .map(|l| SweepStage {
            concurrency: l.concurrency,
            duration_s: STAGE_SECONDS,
            prompt_tokens: PROMPT_TOKENS,
            output_tokens: OUTPUT_TOKENS,
        })
        .collect();
    run(&cfg, &stages)
}

/// What is out of bounds at one level, if anything.
fn misses(f: &StageFigures, rec: &Level) -> Vec<String> {
    let mut out = Vec::new();
    let ratio = f.client.output_tokens_per_second / rec.output_tokens_per_second;
    if !(0.75..=1.25).contains(&ratio) {
        out.push(format!(
            "output tok/s {:.0} vs {:.0}",
            f.client.output_tokens_per_second, rec.output_tokens_per_second
        ));
    }
    let waiting = f.server.waiting_requests_p50;
    let off = (waiting - rec.waiting_p50).abs();
    if off > 2.0 && off > 0.3 * rec.waiting_p50 {
        out.push(format!("waiting p50 {waiting} vs {}", rec.waiting_p50));
    }
    let buckets = Histogram::new(TTFT_BUCKETS);
    let ttft = f.server.ttft_p99_seconds;
    if rec.concurrency >= 12 {
        let up = buckets.bucket_of(ttft) as i64 - buckets.bucket_of(rec.server_ttft_p99) as i64;
        if !(0..=1).contains(&up) {
            out.push(format!(
                "server TTFT p99 {ttft:.3} s vs {} s ({up:+} buckets)",
                rec.server_ttft_p99
            ));
        }
    } else if ttft >= 0.1 {
        // Below the knee the recording's TTFT p99 (0.024-0.087 s) has tails
        // from a shared machine that the model does not draw; it must at
        // least not queue.
        out.push(format!("server TTFT p99 {ttft:.3} s at low load"));
    }
    let saturated = f.server.kv_cache_usage_max >= 0.95;
    if saturated != (rec.kv_max >= 0.95) {
        out.push(format!(
            "KV max {:.2} vs {}",
            f.server.kv_cache_usage_max, rec.kv_max
        ));
    }
    if (f.server.preemptions > 0.0) != (rec.preemptions > 0.0) {
        out.push(format!(
            "preemptions {} vs {}",
            f.server.preemptions, rec.preemptions
        ));
    }
    out
}

#[test]
fn the_reference_profile_reproduces_the_recorded_sweep() {
    let mut report = Vec::new();
    for seed in 1..=3 {
        for (f, rec) in sweep(seed).iter().zip(&LEVELS) {
            for miss in misses(f, rec) {
                report.push(format!("seed {seed} c={}: {miss}", rec.concurrency));
            }
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

#[test]
fn the_reference_sweep_is_the_same_for_the_same_seed() {
    assert_eq!(sweep(7), sweep(7));
    assert_ne!(sweep(7), sweep(8));
}
