//! ShareGPT conversations replayed against a local test server that keeps
//! every request: the human turns sent as they are, each request's
//! `max_tokens` the recorded reply's length (counted with `/tokenize` when
//! the server has it), the server's own replies carried into later turns,
//! conversations of fewer turns ended early, length limits, the
//! conversation pool, and the errors that stop a run before any load.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::scenarios::*;
use common::{Behaviour, TestServer, records};
use nyann_load::{DatasetShare, NoHook, Phase, RunError};
use nyann_model::{Mode, Scenario, Stage, Step, Workload, WorkloadType};
use nyann_testkit::datasets::{
    ShareGptChat, Spelling, sharegpt_chats, write_sharegpt_json, write_sharegpt_jsonl,
};
use serde_json::Value;

fn replay(path: &std::path::Path, turns: u32) -> Workload {
    Workload {
        kind: WorkloadType::ShareGpt,
        path: Some(path.display().to_string()),
        turns,
        ..Workload::default()
    }
}

fn stage(mode: Mode, concurrency: u32, max_requests: u64) -> Step {
    Step::Stage(Stage {
        concurrency: Some(concurrency),
        max_requests,
        ..Stage::new(60.0, mode)
    })
}

/// What the test server answers to a request of `messages` messages and
/// `tokens` max_tokens.
fn server_reply(messages: usize, tokens: u32) -> String {
    (0..tokens).map(|i| format!("m{messages}t{i} ")).collect()
}

/// Which chat and turn (from 1) a request replays, after checking that it
/// replays it: its user messages are the chat's prompts in order, the
/// replies between them the server's own, each as long as recorded, and
/// its `max_tokens` the length of the reply recorded after its prompt.
/// Reply lengths are `factor` times the generator's (tokens counted at 4
/// characters per token over `factor`).
fn replayed(body: &Value, chats: &[ShareGptChat], factor: u32) -> (usize, usize) {
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len() % 2, 1, "{body}");
    let first = messages[0]["content"].as_str().unwrap();
    let chat = chats
        .iter()
        .position(|c| c.turns[0].prompt == first)
        .unwrap_or_else(|| panic!("not a first prompt of the file: {first:?}"));
    let turn = messages.len().div_ceil(2);
    for (j, message) in messages.iter().enumerate() {
        let exchange = &chats[chat].turns[j / 2];
        if j % 2 == 0 {
            assert_eq!(message["role"], "user", "{body}");
            assert_eq!(message["content"], exchange.prompt.as_str(), "{body}");
        } else {
            assert_eq!(message["role"], "assistant", "{body}");
            assert_eq!(
                message["content"],
                server_reply(j, exchange.reply_tokens * factor),
                "turn {} carries the server's reply",
                j / 2 + 1
            );
        }
    }
    assert_eq!(
        body["max_tokens"],
        chats[chat].turns[turn - 1].reply_tokens * factor,
        "max_tokens is the recorded reply's length: {body}"
    );
    (chat, turn)
}

/// A JSONL file of 6 three-turn conversations, one stream, 18 requests:
/// every conversation replayed once, turn after turn, each request as the
/// file has it; the records say which conversation and turn each was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_are_replayed_turn_after_turn_with_the_recorded_lengths() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sharegpt.jsonl");
    let chats = sharegpt_chats(6, 3);
    write_sharegpt_jsonl(&path, &chats, Spelling::ShareGpt);
    let mut sc = scenario(vec![stage(Mode::Concurrent, 1, 18)]);
    sc.workload = replay(&path, 3);
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    let sent: BTreeSet<(usize, usize)> = server
        .requests()
        .iter()
        .map(|body| replayed(body, &chats, 1))
        .collect();
    let every: BTreeSet<(usize, usize)> =
        (0..6).flat_map(|c| (1..=3).map(move |t| (c, t))).collect();
    assert_eq!(sent, every, "each turn of each conversation once");
    assert_eq!(server.requests().len(), 18);

    // A record's conversation and turn, and its prompt's length (each
    // prompt of the file has its own), tell which one it was.
    let mut chat_of: BTreeMap<u64, usize> = BTreeMap::new();
    for r in records(dir.path()) {
        assert_eq!(r.phase, Phase::Measured);
        let (chat, turn) = chats
            .iter()
            .enumerate()
            .find_map(|(c, chat)| {
                let t = chat
                    .turns
                    .iter()
                    .position(|t| t.prompt.len() == r.prompt_chars)?;
                Some((c, t + 1))
            })
            .unwrap();
        assert_eq!(turn as u32, r.turn, "{r:?}");
        assert_eq!(*chat_of.entry(r.conversation).or_insert(chat), chat);
        assert_eq!(
            r.output_tokens,
            Some(u64::from(chats[chat].turns[turn - 1].reply_tokens))
        );
    }
    assert_eq!(chat_of.len(), 6);
}

/// A JSON array in OpenAI's spelling against a server with `/tokenize` at
/// 2 characters per token: lengths are counted in its tokens (replies
/// twice the generator's), `max_isl`/`max_osl` leave out the conversations
/// over them, and the kept ones come round again in the same order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lengths_are_counted_with_tokenize_and_limits_leave_conversations_out() {
    let server = TestServer::start(Behaviour {
        tokenize_chars_per_token: Some(2.0),
        ..Behaviour::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sharegpt.json");
    let chats = sharegpt_chats(10, 1);
    write_sharegpt_json(&path, &chats, Spelling::OpenAi);
    let mut sc = scenario(vec![stage(Mode::Concurrent, 1, 12)]);
    // Prompts of 48 + 2i tokens: i <= 6 fit max_isl=60; replies of
    // 2 * (8 + 5i % 25) tokens: i = 4 (56) is over max_osl=50.
    sc.workload = Workload {
        max_isl: 60,
        max_osl: 50,
        ..replay(&path, 1)
    };
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    assert!(
        server
            .state
            .tokenize_calls
            .load(std::sync::atomic::Ordering::SeqCst)
            > 0
    );
    let sent: Vec<usize> = server
        .requests()
        .iter()
        .map(|body| replayed(body, &chats, 2).0)
        .collect();
    assert_eq!(sent.len(), 12);
    let first_pass: BTreeSet<usize> = sent[..6].iter().copied().collect();
    assert_eq!(first_pass, BTreeSet::from([0, 1, 2, 3, 5, 6]));
    assert_eq!(sent[..6], sent[6..], "the second pass repeats the first");
    assert_ne!(sent[..6], [0, 1, 2, 3, 5, 6], "shuffled with the seed");
}

/// A pool of 3 conversations over 4 of which two have fewer turns than
/// the workload's 3: each conversation goes turn after turn, carries the
/// server's replies, and ends after its own last turn (its slot in the
/// pool taken by the next conversation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_pool_replays_each_conversation_to_its_own_end() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sharegpt.json");
    let mut chats = sharegpt_chats(4, 3);
    chats[1].turns.truncate(1);
    chats[2].turns.truncate(2);
    write_sharegpt_json(&path, &chats, Spelling::ShareGpt);
    let mut sc = scenario(vec![Step::Stage(Stage {
        concurrency: Some(2),
        conversation_pool_size: 3,
        max_requests: 20,
        ..Stage::new(60.0, Mode::ConversationPool)
    })]);
    sc.workload = replay(&path, 3);
    nyann_load::run(&sc, options(&server, dir.path()), NoHook)
        .await
        .unwrap();
    for body in server.requests() {
        let (chat, turn) = replayed(&body, &chats, 1);
        assert!(turn <= chats[chat].turns.len(), "{chat} has no turn {turn}");
    }
    // Per conversation: turns 1, 2, ... in order, up to its own count.
    let mut recs = records(dir.path());
    recs.sort_by_key(|r| r.id);
    let mut turns: BTreeMap<u64, (usize, Vec<u32>)> = BTreeMap::new();
    for r in &recs {
        let chat = chats
            .iter()
            .position(|c| c.turns.iter().any(|t| t.prompt.len() == r.prompt_chars))
            .unwrap();
        let entry = turns.entry(r.conversation).or_insert((chat, Vec::new()));
        assert_eq!(entry.0, chat, "one conversation, one chat");
        entry.1.push(r.turn);
    }
    assert_eq!(recs.len(), 20);
    let mut unfinished = 0;
    for (chat, ts) in turns.values() {
        let n = ts.len() as u32;
        assert_eq!(*ts, (1..=n).collect::<Vec<_>>());
        assert!(ts.len() <= chats[*chat].turns.len());
        unfinished += usize::from(ts.len() < chats[*chat].turns.len());
    }
    assert!(
        unfinished <= 3,
        "only those still in the pool at the end are unfinished: {turns:?}"
    );
    assert!(
        turns.len() > 3,
        "finished conversations were replaced: {turns:?}"
    );
}

/// Nothing left to replay stops the run before any request, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_to_replay_is_an_error_before_any_load() {
    let server = TestServer::start(Behaviour::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sharegpt.json");
    write_sharegpt_json(&path, &sharegpt_chats(3, 1), Spelling::ShareGpt);
    let run = |workload: Workload, share: Option<DatasetShare>| {
        let mut sc: Scenario = scenario(vec![stage(Mode::Concurrent, 1, 3)]);
        sc.workload = workload;
        let mut opts = options(&server, dir.path());
        opts.dataset_share = share;
        async move { nyann_load::run(&sc, opts, NoHook).await }
    };
    let too_short = Workload {
        max_isl: 10,
        ..replay(&path, 1)
    };
    let Err(RunError::Workload(err)) = run(too_short, None).await else {
        panic!("refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("sharegpt.json: no conversation to replay: all 3 conversations with a reply were left out by the length limits (max_isl=10, max_osl=0, at 4.00 characters per token): 3 with a first prompt over max_isl"),
        "{err}"
    );
    let share = DatasetShare {
        seed: 1,
        worker: 3,
        workers: 4,
    };
    let Err(RunError::Workload(err)) = run(replay(&path, 1), Some(share)).await else {
        panic!("refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("3 conversations for 4 workers leave worker 3 none"),
        "{err}"
    );
    std::fs::write(&path, "[{\"id\": \"x\", \"conversations\": {}}]").unwrap();
    let Err(RunError::Workload(err)) = run(replay(&path, 1), None).await else {
        panic!("refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("sharegpt.json: record 1: id \"x\": \"conversations\" is not a list"),
        "{err}"
    );
    assert!(server.requests().is_empty(), "no load was sent");
}
