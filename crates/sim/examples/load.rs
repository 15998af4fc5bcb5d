//! A minimal closed-loop streaming client, to measure how much the simulator
//! costs under many concurrent streams:
//! `cargo run -p nyann-sim --release --example load -- BASE_URL CONCURRENCY SECONDS [MAX_TOKENS]`.
//! Prints requests and SSE bytes per second.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    let base = a.get(1).expect("BASE_URL").clone();
    let c: usize = a.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let secs: f64 = a.get(3).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let max_tokens: u32 = a.get(4).and_then(|s| s.parse().ok()).unwrap_or(32);
    let client = nyann_testkit::http_client()
        .pool_max_idle_per_host(c)
        .build()
        .unwrap();
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let (reqs, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (client, url, reqs, bytes) = (
            client.clone(),
            format!("{base}/chat/completions"),
            reqs.clone(),
            bytes.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, "stream": true});
            while Instant::now() < end {
                let Ok(mut r) = client.post(&url).json(&body).send().await else { continue };
                while let Ok(Some(chunk)) = r.chunk().await {
                    bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                reqs.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let el = start.elapsed().as_secs_f64();
    let r = reqs.load(Ordering::Relaxed) as f64;
    println!(
        "c={c} {:.1}s requests/s={:.0} tokens/s={:.0} MB/s={:.1}",
        el,
        r / el,
        r * f64::from(max_tokens) / el,
        bytes.load(Ordering::Relaxed) as f64 / el / 1e6
    );
}
