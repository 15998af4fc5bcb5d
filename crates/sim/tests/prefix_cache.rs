//! The engine's prefix cache on the virtual clock: a repeated prefix hits
//! and skips its prefill (by the time model's amount), the counters count
//! tokens, idle cached blocks are evicted least recently used first, and
//! with caching off nothing hits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nyann_sim::engine::{Engine, EngineConfig, NewSeq, TimeModel};
use nyann_sim::metrics::EngineMetrics;
use nyann_sim::prefix::PrefixKey;

const BLOCK: u32 = 16;
const PREFILL_PER_TOKEN: f64 = 1e-5;
const STEP: f64 = 1e-3;

/// No jitter, a fixed step cost and a prefill cost per token: a step's
/// length tells how many prompt tokens it computed.
fn config(kv_blocks: u32, prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 8,
        max_num_batched_tokens: 2048,
        kv_blocks,
        block_size: BLOCK,
        max_model_len: u32::MAX,
        prefix_caching,
        time: TimeModel {
            step_overhead: STEP,
            prefill_per_token: PREFILL_PER_TOKEN,
            decode_per_seq: 0.0,
            decode_per_context_token: 0.0,
            jitter: 0.0,
            request_overhead: 0.0,
            drift: 0.0,
            drift_time: 0.0,
            kv_transfer: 0.0,
            kv_transfer_per_token: 0.0,
        },
        seed: 1,
    }
}

fn engine(kv_blocks: u32, prefix_caching: bool) -> Engine {
    Engine::new(
        config(kv_blocks, prefix_caching),
        EngineMetrics::new("m", "0", 4096),
    )
}

/// A prompt of `tokens` ids, different for each `topic`.
fn prompt(topic: u32, tokens: u32) -> Vec<u32> {
    (0..tokens).map(|i| topic * 100_000 + i).collect()
}

/// Runs one request of `prompt` (2 output tokens) alone to its end from
/// `now`; returns the length of its first step (its prefill) and the end.
fn serve(e: &mut Engine, id: u64, prompt: &[u32], now: f64) -> (f64, f64) {
    let new = NewSeq::new(id, prompt.len() as u32, 2);
    let output: Vec<u32> = (0..2).map(|i| 7_000_000 + i).collect();
    let key = PrefixKey::of_ids(prompt, &output, BLOCK, None);
    e.submit_with_prefix(new, key, now).unwrap();
    let first = e.begin_step(now).unwrap();
    let mut t = now + first;
    e.end_step(t);
    while let Some(d) = e.begin_step(t) {
        t += d;
        e.end_step(t);
    }
    (first, t)
}

/// Prompt tokens the cache supplied to one more request of `prompt`.
fn hits_of(e: &mut Engine, id: u64, prompt: &[u32], now: f64) -> (u64, f64) {
    let before = e.metrics().prefix_cache_hits();
    let (_, end) = serve(e, id, prompt, now);
    (e.metrics().prefix_cache_hits() - before, end)
}

#[test]
fn a_repeated_prefix_hits_and_skips_its_prefill_by_the_time_models_amount() {
    let mut e = engine(100, true);
    let p = prompt(1, 100);
    let (cold, now) = serve(&mut e, 1, &p, 0.0);
    assert!((cold - (STEP + 100.0 * PREFILL_PER_TOKEN)).abs() < 1e-12);
    assert_eq!(e.metrics().prefix_cache_queries(), 100);
    assert_eq!(e.metrics().prefix_cache_hits(), 0);
    assert_eq!(e.kv_usage(), 0.0, "idle cached blocks count as free");
    assert_eq!(
        e.idle_cached_blocks(),
        6,
        "101 computed tokens: 6 full blocks"
    );

    let (warm, _) = serve(&mut e, 2, &p, now);
    // 6 blocks (96 tokens) cached; the prompt's last 4 are computed.
    assert!(
        (warm - (STEP + 4.0 * PREFILL_PER_TOKEN)).abs() < 1e-12,
        "warm prefill {warm}"
    );
    assert_eq!(e.metrics().prefix_cache_queries(), 200, "counted in tokens");
    assert_eq!(e.metrics().prefix_cache_hits(), 96);
    assert_eq!(
        e.metrics().prompt_tokens(),
        200,
        "cached tokens are prompt tokens"
    );
    let mut text = String::new();
    e.metrics().render(&mut text);
    for line in [
        "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 200.0",
        "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 96.0",
        "vllm:prompt_tokens_cached_total{engine=\"0\",model_name=\"m\"} 96.0",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[test]
fn a_prompt_that_is_all_cached_still_computes_its_last_token() {
    let mut e = engine(100, true);
    let p = prompt(1, 96);
    let (_, now) = serve(&mut e, 1, &p, 0.0);
    let (warm, _) = serve(&mut e, 2, &p, now);
    assert_eq!(e.metrics().prefix_cache_hits(), 80, "5 of 6 blocks");
    assert!((warm - (STEP + 16.0 * PREFILL_PER_TOKEN)).abs() < 1e-12);
}

#[test]
fn a_running_sequence_holds_the_cached_blocks_it_shares() {
    let mut e = engine(100, true);
    let p = prompt(1, 100);
    let (_, now) = serve(&mut e, 1, &p, 0.0);
    e.submit_with_prefix(
        NewSeq::new(2, 100, 50),
        PrefixKey::of_ids(&p, &[], BLOCK, None),
        now,
    )
    .unwrap();
    e.begin_step(now).unwrap();
    assert_eq!(e.idle_cached_blocks(), 0, "the 6 cached blocks are in use");
    assert!(
        (e.kv_usage() - 0.07).abs() < 1e-12,
        "6 shared + 1 own block of 100: {}",
        e.kv_usage()
    );
}

#[test]
fn under_kv_pressure_the_least_recently_used_blocks_are_evicted() {
    // 12 blocks. A and B each leave 3 full blocks cached (49 computed
    // tokens); A is used again, so B is the least recently used.
    let mut e = engine(12, true);
    let (a, b) = (prompt(1, 48), prompt(2, 48));
    let cached =
        |e: &Engine, p: &[u32]| e.cached_prefix_tokens(&PrefixKey::of_ids(p, &[], BLOCK, None), 48);
    let (_, now) = serve(&mut e, 1, &a, 0.0);
    let (_, now) = serve(&mut e, 2, &b, now);
    let (hit, now) = hits_of(&mut e, 3, &a, now);
    assert_eq!(hit, 32, "A's first two blocks (its last token is computed)");
    assert_eq!(e.idle_cached_blocks(), 6);
    // C needs 9 blocks (130 tokens): the 6 free ones and 3 evicted: A's
    // third block (not used again), then B's tail.
    serve(&mut e, 4, &prompt(3, 130), now);
    assert_eq!(cached(&e, &a), 32, "A, used recently, stayed cached");
    assert_eq!(
        cached(&e, &b),
        16,
        "B, the least recently used, lost its blocks tail first"
    );
}

#[test]
fn with_caching_off_nothing_hits_and_nothing_is_counted() {
    let mut e = engine(100, false);
    let p = prompt(1, 100);
    let (cold, now) = serve(&mut e, 1, &p, 0.0);
    let (again, _) = serve(&mut e, 2, &p, now);
    assert_eq!(cold, again, "the second prefill computes everything");
    assert_eq!(e.metrics().prefix_cache_hits(), 0);
    assert_eq!(
        e.metrics().prefix_cache_queries(),
        0,
        "vLLM counts no queries"
    );
    assert_eq!(e.idle_cached_blocks(), 0);
}

#[test]
fn different_cache_salts_share_nothing() {
    let mut e = engine(100, true);
    let p = prompt(1, 100);
    let mut now = 0.0;
    for (id, salt) in [(1, "a"), (2, "b")] {
        let key = PrefixKey::of_ids(&p, &[], BLOCK, Some(salt));
        e.submit_with_prefix(NewSeq::new(id, 100, 2), key, now)
            .unwrap();
        while let Some(d) = e.begin_step(now) {
            now += d;
            e.end_step(now);
        }
    }
    assert_eq!(e.metrics().prefix_cache_hits(), 0);
}

/// The reference twin's sweep (every prompt its own, preemptions from
/// c=12) measures the same with the cache on and off: distinct prompts
/// share nothing, and a preempted sequence recomputes everything either way.
#[test]
fn distinct_prompts_sweep_the_same_with_the_cache_on_and_off() {
    use nyann_sim::ServerProfile;
    use nyann_sim::profile::Role;
    use nyann_sim::sweep::{SweepStage, run};

    let stages: Vec<SweepStage> = [4, 32]
        .iter()
        .map(|&concurrency| SweepStage {
            concurrency,
            duration_s: 5.0,
            prompt_tokens: 76,
            output_tokens: 128,
        })
        .collect();
    let on = ServerProfile::vllm_cpu_ref()
        .engine(Role::Aggregate)
        .config(1);
    assert!(on.prefix_caching);
    let off = EngineConfig {
        prefix_caching: false,
        ..on.clone()
    };
    let (with, without) = (run(&on, &stages), run(&off, &stages));
    assert!(with[1].server.preemptions > 0.0, "c=32 preempts");
    assert_eq!(with, without);
}

/// Over HTTP, disaggregated: a chat repeated with its reply as history hits
/// the prefill engine's cache for its first prompt (its `/metrics` counts it); a different
/// `cache_salt` shares nothing; the decode engine, whose prompts arrive as
/// transferred KV, counts no queries. The answer's usage reports the prefill
/// engine's hits (`--enable-prompt-tokens-details`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_with_its_history_hits_the_prefill_engines_cache() {
    use nyann_sim::SimConfig;
    use serde_json::{Value, json};

    let sim = nyann_sim::start(SimConfig {
        disaggregated: true,
        enable_prompt_tokens_details: true,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let client = nyann_testkit::http_client().build().unwrap();
    let chat = |messages: Value, salt: &str| {
        let body = json!({"messages": messages, "max_tokens": 16, "cache_salt": salt});
        let request = client
            .post(format!("{}/chat/completions", sim.base_url()))
            .json(&body);
        async move {
            let reply: Value = request.send().await.unwrap().json().await.unwrap();
            let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            let content = reply["choices"][0]["message"]["content"].as_str();
            (content.unwrap().to_string(), cached)
        }
    };
    let counter = |role: &str, name: &str| {
        let addr = sim
            .metrics_endpoints()
            .into_iter()
            .find(|(r, _)| r == role)
            .unwrap()
            .1;
        let name = format!("{name}{{");
        async move {
            let text = nyann_testkit::get(format!("http://{addr}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let line = text.lines().find(|l| l.starts_with(&name)).unwrap();
            line.rsplit(' ').next().unwrap().parse::<f64>().unwrap()
        }
    };
    // 256 characters: 64 tokens, 4 blocks of 16.
    let question = "abcd".repeat(64);
    let first = json!([{"role": "user", "content": question}]);
    let (reply, cached) = chat(first.clone(), "s").await;
    assert_eq!(cached, 0);
    let history = json!([
        {"role": "user", "content": question},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and then?"},
    ]);
    assert_eq!(chat(history.clone(), "other").await.1, 0);
    assert_eq!(
        counter("prefill", "vllm:prefix_cache_hits_total").await,
        0.0
    );
    assert_eq!(chat(history, "s").await.1, 64);
    // The question's 4 blocks: the prefill engine never computes the
    // reply's KV (the decode engine does), so it caches the prompt only.
    assert_eq!(
        counter("prefill", "vllm:prefix_cache_hits_total").await,
        64.0
    );
    assert!(counter("prefill", "vllm:prefix_cache_queries_total").await > 64.0);
    assert_eq!(
        counter("decode", "vllm:prefix_cache_queries_total").await,
        0.0
    );
    assert_eq!(counter("decode", "vllm:prefix_cache_hits_total").await, 0.0);
    sim.shutdown().await;
}
