//! `mode="conversation_pool"` against the real simulator (in-process, real
//! HTTP on an ephemeral port, jitter off): the working set, the LRU order,
//! replies carried into the next turn (the simulator's prefix cache finds
//! them), `max_requests` counting turns, the pool kept across two pool
//! stages, and the effect a pool sweep exists to show: later turns hit the
//! prefix cache and start sooner, and with the cache off they do not; with
//! `--enable-prompt-tokens-details` the records say how many prompt tokens
//! the cache served.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::{assert_one_stream_over_three, records, turns_of};
use nyann_load::{NoHook, RunOptions, StageResult, TokenSource};
use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType};
use nyann_sim::{RunningSim, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Prefill cost per prompt token in these tests' simulator.
const PREFILL_PER_TOKEN: Duration = Duration::from_micros(500);

/// The simulator's default profile without jitter, its prefill made slow
/// (`PREFILL_PER_TOKEN`) so that a prefill the cache skips shows in TTFT
/// far above the noise of a shared machine.
async fn simulator(prefix_caching: bool) -> RunningSim {
    nyann_sim::start(sim_args(prefix_caching)).await.unwrap()
}

fn sim_args(prefix_caching: bool) -> SimConfig {
    SimConfig {
        jitter: Some(0.0),
        prefill_per_token_us: Some(PREFILL_PER_TOKEN.as_secs_f64() * 1e6),
        no_enable_prefix_caching: !prefix_caching,
        seed: 5,
        ..SimConfig::default()
    }
}

fn pool_stage(concurrency: u32, size: u32, max_requests: u64) -> Stage {
    Stage {
        concurrency: Some(concurrency),
        conversation_pool_size: size,
        max_requests,
        ..Stage::new(60.0, Mode::ConversationPool)
    }
}

/// Conversations of `turns` turns: a first prompt of `isl` tokens, later
/// ones of 16, replies of 16 tokens.
fn scenario(stages: Vec<Stage>, isl: u32, turns: u32) -> Scenario {
    Scenario {
        target: None,
        model: None,
        workload: Workload {
            kind: WorkloadType::Faker,
            isl,
            osl: 16,
            turns,
            subsequent_isl: Some(16),
            ..Workload::default()
        },
        steps: stages.into_iter().map(Step::Stage).collect(),
    }
}

async fn run(sim: &RunningSim, sc: &Scenario, dir: &Path) -> Vec<StageResult> {
    run_with(sim, sc, dir, false).await
}

/// `run`, asking for usage in the stream (`--stream-usage`) or not.
async fn run_with(
    sim: &RunningSim,
    sc: &Scenario,
    dir: &Path,
    stream_usage: bool,
) -> Vec<StageResult> {
    let mut options = RunOptions {
        target: Some(sim.base_url()),
        seed: 3,
        ready_timeout: Duration::from_secs(10),
        output_dir: Some(dir.to_path_buf()),
        ..RunOptions::default()
    };
    options.client.stream_usage = stream_usage;
    nyann_load::run(sc, options, NoHook).await.unwrap().stages
}

/// A counter's value in the simulator's `/metrics`, read over HTTP.
async fn counter(addr: SocketAddr, name: &str) -> f64 {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: sim\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    tcp.read_to_string(&mut text).await.unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

const HITS: &str = "vllm:prefix_cache_hits_total";
const QUERIES: &str = "vllm:prefix_cache_queries_total";

/// One stream over a pool of three: three fresh conversations, then the
/// least recently used comes back one turn at a time; `max_requests`
/// counts turns, as the server sees them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_takes_the_least_recently_used_conversation() {
    let sim = simulator(true).await;
    let dir = tempfile::tempdir().unwrap();
    let stages = run(
        &sim,
        &scenario(vec![pool_stage(1, 3, 7)], 64, 10),
        dir.path(),
    )
    .await;
    assert_one_stream_over_three(dir.path());
    assert_eq!(stages[0].detail.as_ref().unwrap().sent, 7);
    assert_eq!(sim.requests().len(), 7, "the server saw 7 turns");
    sim.shutdown().await;
}

/// Streams share the pool: with 3 streams over a pool of 5, the records
/// hold exactly 5 conversations, each with consecutive turns from 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_working_set_is_the_pool_size() {
    let sim = simulator(true).await;
    let dir = tempfile::tempdir().unwrap();
    run(
        &sim,
        &scenario(vec![pool_stage(3, 5, 20)], 64, 10),
        dir.path(),
    )
    .await;
    let turns = turns_of(dir.path(), 0);
    assert_eq!(turns.len(), 20, "max_requests counts turns");
    let conversations: BTreeSet<u64> = turns.iter().map(|t| t.0).collect();
    assert_eq!(conversations.len(), 5, "{turns:?}");
    for c in &conversations {
        let mut own: Vec<u32> = turns.iter().filter(|t| t.0 == *c).map(|t| t.1).collect();
        own.sort();
        assert_eq!(own, (1..=own.len() as u32).collect::<Vec<_>>(), "{turns:?}");
    }
    sim.shutdown().await;
}

/// One conversation of two turns: the second turn finds in the cache more
/// than its first prompt could supply, so the simulator received the
/// first turn's prompt and the model's reply verbatim before the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reply_is_carried_into_the_next_turn() {
    let sim = simulator(true).await;
    let dir = tempfile::tempdir().unwrap();
    run(
        &sim,
        &scenario(vec![pool_stage(1, 1, 2)], 100, 2),
        dir.path(),
    )
    .await;
    let recs = records(dir.path());
    let first = recs.iter().find(|r| r.turn == 1).unwrap();
    // The default profile: blocks of 16 tokens of 4 characters. Turn 1
    // leaves cached the full blocks of its prompt, a newline and its
    // 16-token reply; turn 2 starts with exactly those characters.
    let from_prompt_alone = (first.prompt_chars / 64 * 16) as f64;
    let with_reply = ((first.prompt_chars + 1 + 16 * 4) / 64 * 16) as f64;
    assert!(
        with_reply > from_prompt_alone,
        "the reply must fill a block"
    );
    assert_eq!(counter(sim.endpoint(), HITS).await, with_reply);
    let server = sim.requests();
    assert!(
        server[1].prompt_tokens > server[0].prompt_tokens + 16,
        "the history (prompt and 16-token reply) is in turn 2's prompt: {} then {}",
        server[0].prompt_tokens,
        server[1].prompt_tokens
    );
    sim.shutdown().await;
}

/// Two pool stages of one workload share the pool: the second goes on with
/// the first's conversations, their turn numbers continuing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_persists_across_two_pool_stages() {
    let sim = simulator(true).await;
    let dir = tempfile::tempdir().unwrap();
    run(
        &sim,
        &scenario(vec![pool_stage(2, 2, 4), pool_stage(2, 2, 4)], 64, 10),
        dir.path(),
    )
    .await;
    let (first, second) = (turns_of(dir.path(), 0), turns_of(dir.path(), 1));
    assert_eq!((first.len(), second.len()), (4, 4));
    for (conversation, turn) in &second {
        let last_before = first
            .iter()
            .filter(|f| f.0 == *conversation)
            .map(|f| f.1)
            .max();
        assert!(
            last_before.is_some_and(|last| *turn > last),
            "stage 2's {conversation} turn {turn} does not continue stage 1: {first:?} then {second:?}"
        );
    }
    sim.shutdown().await;
}

/// The pool sweep's point: later turns find their history in the prefix
/// cache and start far sooner than first turns; with the cache off they hit
/// nothing and pay their whole prefill again.
///
/// One stream, so that no two prefills share a step and every figure below
/// follows from the time model, not from how the machine schedules two
/// streams. A first turn prefills 400 tokens (200 ms); a later turn with the
/// cache computes about its 32 new tokens (16 ms). Bounds from below are
/// exact, since the simulator cannot answer before its modelled time (less
/// its 5 ms catch-up); the one bound from above, a later turn in under half
/// a first turn's time, leaves room for about 80 ms of stall per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_turns_hit_the_prefix_cache_and_start_sooner() {
    let first_prefill = (PREFILL_PER_TOKEN * 400).as_secs_f64() - 0.005;
    for caching in [true, false] {
        let sim = simulator(caching).await;
        let dir = tempfile::tempdir().unwrap();
        let stages = run(
            &sim,
            &scenario(vec![pool_stage(1, 4, 16)], 400, 4),
            dir.path(),
        )
        .await;
        let d = stages[0].detail.clone().unwrap();
        let (first, later) = (d.first_turn_ttft_p50_seconds, d.later_turn_ttft_p50_seconds);
        assert!(first >= first_prefill, "first turns {first} s");
        let hits = counter(sim.endpoint(), HITS).await;
        let queries = counter(sim.endpoint(), QUERIES).await;
        if caching {
            assert!(hits > 0.0 && queries > hits, "hits {hits} of {queries}");
            assert!(
                later < first / 2.0,
                "later turns {later} s, first turns {first} s"
            );
        } else {
            assert_eq!((hits, queries), (0.0, 0.0));
            assert!(
                later >= first_prefill,
                "no cache, yet later turns took {later} s, less than a 400-token prefill"
            );
        }
        sim.shutdown().await;
    }
}

/// With the simulator's `--enable-prompt-tokens-details` (and usage asked
/// for in the stream), every record says how many of its prompt tokens the
/// prefix cache served: none for the first turn of a fresh conversation,
/// some for every later turn, and over the stage exactly the simulator's
/// `vllm:prefix_cache_hits_total`; the stage's cached share is their sum
/// over the prompt tokens. Without the flag no record has `cached_tokens`
/// and the stage has no share (not a 0), though the cache is as busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_say_how_many_prompt_tokens_the_cache_served() {
    for details in [true, false] {
        let sim = nyann_sim::start(SimConfig {
            enable_prompt_tokens_details: details,
            ..sim_args(true)
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let stages = run_with(
            &sim,
            &scenario(vec![pool_stage(1, 3, 9)], 64, 10),
            dir.path(),
            true,
        )
        .await;
        let share = stages[0].detail.as_ref().unwrap().cached_prompt_share;
        let recs = records(dir.path());
        assert_eq!(recs.len(), 9);
        assert!(recs.iter().all(|r| r.status == nyann_load::Status::Ok));
        let hits = counter(sim.endpoint(), HITS).await;
        assert!(hits > 0.0);
        if details {
            let mut cached_sum = 0;
            let mut prompt_sum = 0;
            for r in &recs {
                let cached = r.cached_tokens.unwrap_or_else(|| panic!("{r:?}"));
                if r.turn == 1 {
                    assert_eq!(cached, 0, "a fresh conversation: {r:?}");
                } else {
                    assert!(cached > 0, "a later turn: {r:?}");
                }
                cached_sum += cached;
                prompt_sum += r.prompt_tokens.unwrap();
            }
            assert_eq!(cached_sum as f64, hits);
            let share = share.unwrap();
            assert!(share > 0.0 && share < 1.0, "{share}");
            assert_eq!(share, cached_sum as f64 / prompt_sum as f64);
            eprintln!("cached share {share:.3}: {cached_sum} of {prompt_sum} prompt tokens");
        } else {
            assert!(recs.iter().all(|r| r.cached_tokens.is_none()));
            assert!(recs.iter().all(|r| r.prompt_tokens.is_some()), "usage came");
            assert_eq!(share, None);
        }
        sim.shutdown().await;
    }
}

/// A server that sends usage unasked (vLLM's `--enable-force-include-usage`,
/// here the simulator's) gives every record its prompt and output tokens
/// without `--stream-usage`: what a twin's fit reads per request. Without
/// the flag the output tokens are the chunks counted, and the prompt's
/// tokens are unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_sent_unasked_is_recorded() {
    for forced in [true, false] {
        let sim = nyann_sim::start(SimConfig {
            enable_force_include_usage: forced,
            ..sim_args(false)
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        run_with(
            &sim,
            &scenario(vec![pool_stage(2, 2, 6)], 64, 1),
            dir.path(),
            false,
        )
        .await;
        let recs = records(dir.path());
        assert_eq!(recs.len(), 6);
        for r in &recs {
            assert_eq!(r.status, nyann_load::Status::Ok, "{r:?}");
            assert_eq!(r.output_tokens, Some(16), "{r:?}");
            if forced {
                assert_eq!(r.output_tokens_source, Some(TokenSource::Usage), "{r:?}");
                assert!(r.prompt_tokens.is_some_and(|p| p >= 64), "{r:?}");
            } else {
                assert_eq!(r.output_tokens_source, Some(TokenSource::Chunks), "{r:?}");
                assert_eq!(r.prompt_tokens, None, "{r:?}");
            }
        }
        sim.shutdown().await;
    }
}
