//! Multi-turn conversations end to end against a local test server:
//! replies replayed into the next turn, and the conversation pool.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::scenarios::*;
use common::{Behaviour, TestServer, assert_one_stream_over_three, records, turns_of};
use nyann_load::{NoHook, Phase};
use nyann_model::{CacheSalt, Mode, Stage, Step, Workload};

fn pool_stage(concurrency: u32, size: u32, max_requests: u64) -> Stage {
    Stage {
        concurrency: Some(concurrency),
        conversation_pool_size: size,
        max_requests,
        ..Stage::new(30.0, Mode::ConversationPool)
    }
}

/// One stream over a pool of three: the working set fills first (three
/// fresh conversations), then the least recently used comes back, one turn
/// at a time, carrying the model's real replies; max_requests counts turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_pool_runs_one_turn_of_the_least_recently_used() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sc = scenario(vec![Step::Stage(pool_stage(1, 3, 7))]);
    sc.workload.turns = 10;
    let result = nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    assert_one_stream_over_three(dir.path());
    assert_eq!(result.stages[0].detail.as_ref().unwrap().sent, 7);
    let detail = result.stages[0].detail.as_ref().unwrap();
    assert_eq!(
        detail.later_turns_ok, 4,
        "first and later turns counted apart"
    );
    // The fourth request is the first conversation's second turn: its
    // first prompt and the server's reply to it, then a new prompt.
    let reqs = server.requests();
    let (first, fourth) = (&reqs[0]["messages"], &reqs[3]["messages"]);
    assert_eq!(fourth.as_array().unwrap().len(), 3, "{fourth}");
    assert_eq!(fourth[0], first[0]);
    assert_eq!(fourth[1]["role"], "assistant");
    assert_eq!(fourth[1]["content"], "m1t0 m1t1 m1t2 m1t3 ");
}

/// Consecutive pool stages of one workload share the pool (the working
/// set grows with the load); a stage of another workload starts afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_persists_across_pool_stages_of_one_workload() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let other = Workload {
        isl: 8,
        ..workload()
    };
    let mut sc = scenario(vec![
        Step::Stage(pool_stage(1, 2, 2)),
        Step::Stage(pool_stage(2, 0, 4)),
        Step::Stage(Stage {
            workload: Some(Workload { turns: 10, ..other }),
            ..pool_stage(1, 1, 1)
        }),
    ]);
    sc.workload.turns = 100;
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let first = turns_of(dir.path(), 0);
    let second = turns_of(dir.path(), 1);
    let third = turns_of(dir.path(), 2);
    assert_eq!(first.iter().map(|t| t.1).collect::<Vec<_>>(), [1, 1]);
    assert_eq!(second.len(), 4);
    assert!(
        second
            .iter()
            .all(|(conv, turn)| first.iter().any(|f| f.0 == *conv) && *turn > 1),
        "the second stage goes on with the first's conversations: {first:?} then {second:?}"
    );
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].1, 1, "another workload: a fresh pool");
    assert!(first.iter().all(|f| f.0 != third[0].0));
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_replays_the_real_replies() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut sc = scenario(vec![Step::Stage(Stage {
        concurrency: Some(1),
        max_requests: 3,
        ..Stage::new(30.0, Mode::Concurrent)
    })]);
    sc.workload.turns = 3;
    sc.workload.subsequent_isl = Some(4);
    sc.workload.cache_salt = Some(CacheSalt::Fixed("abc".into()));
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let reqs = server.requests();
    let first = &reqs[0]["messages"];
    let third = &reqs[2]["messages"];
    assert_eq!(first.as_array().unwrap().len(), 1);
    assert_eq!(third.as_array().unwrap().len(), 5, "{third}");
    // The server's reply to turn 1 (1 message in) is replayed as the assistant turn.
    assert_eq!(third[1]["role"], "assistant");
    assert_eq!(third[1]["content"], "m1t0 m1t1 m1t2 m1t3 ");
    assert_eq!(third[3]["content"], "m3t0 m3t1 m3t2 m3t3 ");
    assert_eq!(third[0], first[0], "history is kept verbatim");
    assert_eq!(
        third[4]["content"].as_str().unwrap().len(),
        16,
        "subsequent_isl 4 tokens x 4.0 chars"
    );
    assert!(
        reqs.iter()
            .all(|r| r["cache_salt"] == "abc" && r["ignore_eos"] == true && r["min_tokens"] == 4)
    );
    let recs = records(dir.path());
    assert_eq!(
        recs.iter()
            .filter(|r| r.phase == Phase::Measured)
            .map(|r| r.turn)
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}
