//! Prints a profile's congestion curve on the virtual clock: a closed-loop
//! sweep of 1..64 streams (each sends its next request when the previous one
//! ends), with what the client and the congestion policy would see per stage.
//!
//! `cargo run -p nyann-sim --features clap --release --example curve -- [PROFILE|FILE.toml] [STAGE_SECS] [PROMPT_TOKENS] [OUTPUT_TOKENS] [SEED]`
//!
//! PROFILE is a built-in profile name (default `default`); prompt tokens are
//! counted as the engine sees them (chat template included).

use clap::ValueEnum;
use nyann_sim::profile::Role;
use nyann_sim::sweep::{SweepStage, run};
use nyann_sim::{Profile, ServerProfile};

const LEVELS: &[u32] = &[1, 4, 8, 12, 16, 24, 32, 64];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let name = arg(1).unwrap_or("default");
    let profile = match Profile::from_str(name, false)
        .ok()
        .and_then(Profile::server)
    {
        Some(p) => p,
        None => ServerProfile::read(std::path::Path::new(name))?,
    };
    let seconds: f64 = arg(2).map_or(Ok(10.0), str::parse)?;
    let prompt_tokens: u32 = arg(3).map_or(Ok(128), str::parse)?;
    let output_tokens: u32 = arg(4).map_or(Ok(256), str::parse)?;
    let seed: u64 = arg(5).map_or(Ok(1), str::parse)?;
    let stages: Vec<SweepStage> = LEVELS
        .iter()
        .map(|&concurrency| SweepStage {
            concurrency,
            duration_s: seconds,
            prompt_tokens,
            output_tokens,
        })
        .collect();
    println!(
        "profile {} stages {seconds} s prompt {prompt_tokens} output {output_tokens} seed {seed}",
        profile.name
    );
    println!(
        "{:>4} {:>9} {:>10} {:>10} {:>8} {:>8} {:>12} {:>7} {:>8}",
        "c",
        "tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "wait p50",
        "srv TTFT p99",
        "KV max",
        "preempt"
    );
    for f in run(&profile.engine(Role::Aggregate).config(seed), &stages) {
        let (c, s) = (&f.client, &f.server);
        println!(
            "{:>4} {:>9.0} {:>10.3} {:>10.3} {:>8.4} {:>8.1} {:>12.3} {:>7.2} {:>8}",
            f.stage.concurrency,
            c.output_tokens_per_second,
            c.ttft_p50_seconds,
            c.ttft_p99_seconds,
            c.itl_p50_seconds,
            s.waiting_requests_p50,
            s.ttft_p99_seconds,
            s.kv_cache_usage_max,
            s.preemptions
        );
    }
    Ok(())
}
