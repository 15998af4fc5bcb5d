//! Both sources against the simulator under real load, with a real
//! Prometheus (nyann-testkit) scraping it every second as `vllm-aggregate`
//! (or `vllm-prefill`/`vllm-decode` for the disaggregated simulator) with a
//! pod label: over the same stages they agree (waiting p50 and KV max within
//! a tolerance, TTFT p99 in the same bucket), and both see congestion when the
//! simulator is overloaded and none when it is idle. Fails, never skips,
//! without `prometheus`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{bucket_of, congested, now};
use nyann_signals::{SignalOptions, SignalSource, StageSignals};
use nyann_sim::SimConfig;
use nyann_testkit::{PrometheusServer, ScrapeJob};

/// Closed-loop load: `concurrency` workers sending non-streaming completions
/// until `until` (bounded in time and in count). Every prompt starts with
/// its own worker and request number, so no two share a KV block in the
/// simulator's prefix cache: with one shared prompt the cache held far more
/// sequences, KV usage swung between 0.3 and 1.0, and the two sources'
/// maxima depended on which instants each sampled.
fn load(base_url: String, concurrency: usize, until: Instant) -> Vec<tokio::task::JoinHandle<()>> {
    let http = nyann_testkit::http_client().build().unwrap();
    let text = "the quick brown fox jumps over the lazy dog ".repeat(14);
    (0..concurrency)
        .map(|worker| {
            let (http, url, text) = (
                http.clone(),
                format!("{base_url}/completions"),
                text.clone(),
            );
            tokio::spawn(async move {
                for request in 0..10_000 {
                    if Instant::now() >= until {
                        break;
                    }
                    let prompt = format!("worker {worker} request {request}: {text}");
                    let body = serde_json::json!({
                        "model": "nyann-sim", "prompt": prompt, "max_tokens": 256, "stream": false
                    });
                    let req = http
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.to_string())
                        .send();
                    let remaining = until.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(remaining, req).await {
                        Ok(Ok(r)) => {
                            let _ = r.bytes().await;
                        }
                        Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                        Err(_) => break,
                    }
                }
            })
        })
        .collect()
}

fn agree(label: &str, prom: &StageSignals, scrape: &StageSignals) {
    assert!(
        prom.errors.is_empty(),
        "{label} prometheus: {:?}",
        prom.errors
    );
    assert!(
        scrape.errors.is_empty(),
        "{label} scrape: {:?}",
        scrape.errors
    );
    assert_eq!(prom.roles.len(), scrape.roles.len());
    for (p, s) in prom.roles.iter().zip(&scrape.roles) {
        eprintln!("{label} prometheus: {p:?}\n{label} scrape:     {s:?}");
        assert_eq!(p.role, s.role);
        // The two sample the server at different instants of a moving queue.
        let tol = 2.0 + 0.15 * p.waiting_requests_p50.max(s.waiting_requests_p50);
        assert!(
            (p.waiting_requests_p50 - s.waiting_requests_p50).abs() <= tol,
            "{label} {} waiting p50: {} vs {}",
            p.role,
            p.waiting_requests_p50,
            s.waiting_requests_p50
        );
        // KV max: a saturated cache reads the same to both; a bursty one (the
        // prefill engine frees blocks as soon as it hands a request over) is
        // caught by whichever sampler happens to look at the peak, so below
        // 0.5 (far from any pressure threshold) only "low" must agree.
        let (pk, sk) = (p.kv_cache_usage_max, s.kv_cache_usage_max);
        assert!(
            (pk - sk).abs() <= 0.05 || pk.max(sk) < 0.5,
            "{label} {} kv max: {pk} vs {sk}",
            p.role
        );
        // TTFT p99: same bucket; two values straddling a bound by < 5% count
        // as the same reading.
        let (pt, st) = (p.ttft_p99_seconds, s.ttft_p99_seconds);
        assert!(
            bucket_of(pt) == bucket_of(st) || (pt - st).abs() <= 0.05 * pt.max(st),
            "{label} {} ttft p99: {pt} vs {st}",
            p.role
        );
    }
}

async fn run(disaggregated: bool) {
    let sim = nyann_sim::start(SimConfig {
        disaggregated,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let endpoints = sim.metrics_endpoints();
    let jobs: Vec<ScrapeJob> = endpoints
        .iter()
        .map(|(role, addr)| {
            let pod = if role == "aggregate" {
                "sim-0".to_string()
            } else {
                format!("sim-{role}-0")
            };
            ScrapeJob::new(&format!("vllm-{role}")).target(*addr, &[("pod", pod.as_str())])
        })
        .collect();
    let prom = PrometheusServer::start(&jobs)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let deploy = if disaggregated { "sim-decode" } else { "sim" };
    let p = SignalSource::from_options(&SignalOptions {
        prometheus_url: Some(prom.url()),
        deploy_name: Some(deploy.into()),
        ..Default::default()
    })
    .await
    .unwrap()
    .unwrap();
    let s = SignalSource::from_options(&SignalOptions {
        scrape: endpoints
            .iter()
            .map(|(role, addr)| format!("{role}={addr}").parse().unwrap())
            .collect(),
        ..Default::default()
    })
    .await
    .unwrap()
    .unwrap();
    s.start();
    let mode = if disaggregated {
        "disaggregated"
    } else {
        "aggregate"
    };

    // Idle stage: no load at all.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let end = now();
    let (ps, ss) = (
        p.stage_signals(start, end, Default::default()).await,
        s.stage_signals(start, end, Default::default()).await,
    );
    agree(&format!("{mode} idle"), &ps, &ss);
    assert!(!congested(&ps.roles), "{mode} idle prometheus: {ps:?}");
    assert!(!congested(&ss.roles), "{mode} idle scrape: {ss:?}");

    // Overloaded stage: 96 clients against 16 sequence slots and a KV cache
    // that holds fewer than 16 full sequences; 3 s to build the queue first.
    let until = Instant::now() + Duration::from_secs(16);
    let workers = load(sim.base_url(), 96, until);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let start = now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let end = now();
    let (ps, ss) = (
        p.stage_signals(start, end, Default::default()).await,
        s.stage_signals(start, end, Default::default()).await,
    );
    agree(&format!("{mode} overloaded"), &ps, &ss);
    assert!(congested(&ps.roles), "{mode} overloaded prometheus: {ps:?}");
    assert!(congested(&ss.roles), "{mode} overloaded scrape: {ss:?}");
    for w in workers {
        let _ = w.await;
    }
    drop(prom);
    sim.shutdown().await;
}

/// One test, aggregate then disaggregated, so that the two loaded
/// simulators never compete for the CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_sources_agree_idle_and_overloaded() {
    run(false).await;
    run(true).await;
}
