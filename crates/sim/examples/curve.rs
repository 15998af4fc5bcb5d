//! Prints the default profile's congestion curve: for each concurrency, a
//! closed loop of clients (each sends its next request when the previous one
//! ends) runs for one stage, and the table shows what the congestion policy
//! sees: waiting p50 (sampled every 250 ms), KV usage max, preemptions and
//! the server TTFT p99.
//!
//! `cargo run -p nyann-sim --release --example curve -- [virtual|live] [STAGE_SECS] [ISL] [OSL] [KV_BLOCKS]`
//!
//! `virtual` (default) steps the engine on a virtual clock (deterministic,
//! instant); `live` runs the HTTP server in process and real streaming clients;
//! `live-disagg` does the same in disaggregated mode and shows the decode
//! engine's waiting, KV and preemptions (TTFT stays the client-visible one).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nyann_sim::engine::{Engine, NewSeq};
use nyann_sim::metrics::{EngineMetrics, FinishedReason, TTFT_BUCKETS};
use nyann_sim::{SimArgs, start};

const LEVELS: &[usize] = &[1, 4, 8, 12, 16, 24, 32, 64];

fn p(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

/// histogram_quantile over the TTFT observations of the stage (bucket interpolation, like Prometheus).
fn ttft_p99(samples: &[f64]) -> f64 {
    let mut counts = vec![0u64; TTFT_BUCKETS.len() + 1];
    for s in samples {
        let i = TTFT_BUCKETS
            .iter()
            .position(|b| s <= b)
            .unwrap_or(TTFT_BUCKETS.len());
        counts[i] += 1;
    }
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return f64::NAN;
    }
    let rank = 0.99 * total as f64;
    let mut cum = 0u64;
    for (i, c) in counts.iter().enumerate() {
        if (cum + c) as f64 >= rank {
            if i == TTFT_BUCKETS.len() {
                return TTFT_BUCKETS[i - 1];
            }
            let lo = if i == 0 { 0.0 } else { TTFT_BUCKETS[i - 1] };
            let hi = TTFT_BUCKETS[i];
            return lo + (hi - lo) * (rank - cum as f64) / *c as f64;
        }
        cum += c;
    }
    f64::NAN
}

fn sim_args() -> SimArgs {
    let kv_blocks = std::env::args().nth(5).and_then(|s| s.parse().ok());
    SimArgs {
        kv_blocks,
        ..SimArgs::for_tests()
    }
}

fn virtual_stage(c: usize, stage: f64, isl: u32, osl: u32) -> (f64, f64, u64, f64, usize) {
    let args = sim_args();
    let cfg = args.engine_config(0);
    let mut e = Engine::new(
        cfg.clone(),
        EngineMetrics::new("m", "0", cfg.max_model_len()),
    );
    let mut now = 0.0;
    let mut next = 0u64;
    let mut arrival = HashMap::new();
    let mut ttfts = Vec::new();
    let mut waiting = Vec::new();
    let mut kv_max: f64 = 0.0;
    let mut next_sample = 0.0;
    let mut done = 0;
    let submit = |e: &mut Engine, now: f64, next: &mut u64, arrival: &mut HashMap<u64, f64>| {
        let id = *next;
        *next += 1;
        arrival.insert(id, now);
        e.submit(
            NewSeq {
                id,
                prompt_tokens: isl,
                max_tokens: osl,
                pre_generated: 0,
                kv_transferred: false,
                finish: FinishedReason::Length,
            },
            now,
        )
        .unwrap();
    };
    for _ in 0..c {
        submit(&mut e, now, &mut next, &mut arrival);
    }
    // Steady window as in the design: drop the first 20% and the last 5%.
    let (lo, hi) = (0.2 * stage, 0.95 * stage);
    while now < stage {
        let Some(d) = e.begin_step(now) else { break };
        while next_sample <= now {
            if next_sample >= lo && next_sample <= hi {
                waiting.push(e.num_waiting() as f64);
            }
            next_sample += 0.25;
        }
        if now >= lo && now <= hi {
            kv_max = kv_max.max(e.kv_usage());
        }
        now += d;
        for ev in e.end_step(now) {
            if ev.generated == 1 && now >= lo && now <= hi {
                ttfts.push(now - arrival[&ev.id]);
            }
            if ev.finished {
                done += 1;
                submit(&mut e, now, &mut next, &mut arrival);
            }
        }
    }
    (
        p(&mut waiting, 0.5),
        kv_max,
        e.metrics().preemptions(),
        ttft_p99(&ttfts),
        done,
    )
}

/// `disaggregated`: waiting, KV and preemptions are the decode engine's.
async fn live_stage(
    c: usize,
    stage: f64,
    isl: u32,
    osl: u32,
    disaggregated: bool,
) -> (f64, f64, u64, f64, usize) {
    let sim = start(SimArgs {
        disaggregated,
        ..sim_args()
    })
    .await
    .unwrap();
    let role = usize::from(disaggregated);
    let url = format!("{}/completions", sim.base_url());
    let client = reqwest::Client::new();
    let prompt = "x".repeat(isl as usize * 4);
    let end = Instant::now() + Duration::from_secs_f64(stage);
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (client, url, prompt) = (client.clone(), url.clone(), prompt.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < end {
                let body = serde_json::json!({"prompt": prompt, "max_tokens": osl, "stream": true});
                let r = client.post(&url).json(&body).send().await.unwrap();
                let _ = r.bytes().await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let start_t = Instant::now();
    let (mut waiting, mut kv_max) = (Vec::new(), 0.0f64);
    let (lo, hi) = (0.2 * stage, 0.95 * stage);
    let mut pre0 = 0;
    let mut ttft_at_lo = None;
    while start_t.elapsed().as_secs_f64() < stage {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let t = start_t.elapsed().as_secs_f64();
        let (_, m) = sim.engine_metrics().remove(role);
        let mut text = String::new();
        m.render(&mut text);
        let val = |name: &str| -> f64 {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .unwrap()
                .parse()
                .unwrap()
        };
        if t >= lo && ttft_at_lo.is_none() {
            ttft_at_lo = Some((m.ttft().count(), m.ttft().sum()));
            pre0 = m.preemptions();
        }
        if t >= lo && t <= hi {
            waiting.push(val("vllm:num_requests_waiting{"));
            kv_max = kv_max.max(val("vllm:kv_cache_usage_perc{"));
        }
    }
    let mut done = 0;
    for t in tasks {
        done += t.await.unwrap();
    }
    // Server TTFT p99 over the steady window from the records (first token sent - arrival).
    let recs = sim.requests();
    let t0 = recs.first().map(|r| r.arrival).unwrap_or(0.0);
    let mut ttfts: Vec<f64> = recs
        .iter()
        .filter(|r| r.arrival - t0 >= lo && r.arrival - t0 <= hi)
        .filter_map(|r| r.first_token.map(|f| f - r.arrival))
        .collect();
    let pre = sim.engine_metrics()[role].1.preemptions() - pre0;
    sim.shutdown().await;
    (p(&mut waiting, 0.5), kv_max, pre, p(&mut ttfts, 0.99), done)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("virtual");
    let stage: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let isl: u32 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let osl: u32 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(256);
    println!("mode={mode} stage={stage}s isl={isl} osl={osl}");
    println!(
        "{:>4} {:>11} {:>7} {:>11} {:>12} {:>9}",
        "c", "waiting_p50", "kv_max", "preemptions", "ttft_p99_s", "requests"
    );
    for &c in LEVELS {
        let (w, kv, pre, ttft, done) = if mode == "live" || mode == "live-disagg" {
            live_stage(c, stage, isl, osl, mode == "live-disagg").await
        } else {
            virtual_stage(c, stage, isl, osl)
        };
        println!("{c:>4} {w:>11.1} {kv:>7.3} {pre:>11} {ttft:>12.3} {done:>9}");
    }
}
