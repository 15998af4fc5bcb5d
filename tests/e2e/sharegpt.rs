//! ShareGPT conversations (made by `nyann_testkit::datasets`) replayed
//! against the simulator through a TCP tap that keeps every request and
//! response: the prompts are the file's human turns, each request's
//! `max_tokens` the recorded reply's length (and the simulator answers
//! that many tokens), later turns carry the replies the simulator really
//! gave, and the records say which conversation and turn each request was.
//! The fleet's share of a file is in `fleet.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use nyann_sim::SimConfig;
use nyann_testkit::datasets::{
    ShareGptChat, Spelling, sharegpt_chats, write_sharegpt_json, write_sharegpt_jsonl,
};
use nyann_testkit::tap::{Exchange, Tap};
use serde_json::Value;

use crate::support::{Run, generate_at, validate_against_schema};

/// A chat completion the tap saw, checked against the file.
struct Replayed {
    chat: usize,
    turn: usize,
    response_id: String,
}

/// Checks every chat completion the tap saw: its user messages are one
/// conversation's human turns in order, each assistant message between
/// them the text the simulator streamed in answer to the turn before (the
/// same history), its `max_tokens` the length of the reply the file
/// recorded after its prompt, and the simulator's answer that long (4
/// characters a token) and recorded so (`completion_tokens`).
fn replayed(tap: &Tap, sim: &nyann_sim::RunningSim, chats: &[ShareGptChat]) -> Vec<Replayed> {
    let exchanges: Vec<Exchange> = tap.exchanges_to("/chat/completions");
    // The replies to each history, by the history's JSON (a conversation
    // replayed again asks the same history once more).
    let mut answers: HashMap<String, Vec<String>> = HashMap::new();
    for e in &exchanges {
        let history = e.request_json()["messages"].to_string();
        answers.entry(history).or_default().push(e.streamed_text());
    }
    let completion_tokens: HashMap<String, u32> = sim
        .requests()
        .into_iter()
        .map(|r| (r.id, r.completion_tokens))
        .collect();
    exchanges
        .iter()
        .map(|e| {
            let body = e.request_json();
            let messages = body["messages"].as_array().unwrap();
            assert_eq!(messages.len() % 2, 1, "{body}");
            let first = messages[0]["content"].as_str().unwrap();
            let chat = chats
                .iter()
                .position(|c| c.turns[0].prompt == first)
                .unwrap_or_else(|| panic!("not a first human turn of the file: {first:?}"));
            let turn = messages.len().div_ceil(2);
            for (j, message) in messages.iter().enumerate() {
                let recorded = &chats[chat].turns[j / 2];
                if j % 2 == 0 {
                    assert_eq!(message["role"], "user");
                    assert_eq!(message["content"], recorded.prompt.as_str(), "{body}");
                } else {
                    assert_eq!(message["role"], "assistant");
                    let history = Value::Array(messages[..j].to_vec()).to_string();
                    let answered = answers
                        .get(&history)
                        .unwrap_or_else(|| panic!("turn {} was never asked", j / 2 + 1));
                    let content = message["content"].as_str().unwrap();
                    assert!(
                        answered.iter().any(|a| a == content),
                        "the real reply: {content:?} not in {answered:?}"
                    );
                    assert_eq!(content.len(), 4 * recorded.reply_tokens as usize);
                }
            }
            let want = chats[chat].turns[turn - 1].reply_tokens;
            assert_eq!(body["max_tokens"], want, "the recorded reply's length");
            assert_eq!(e.status, Some(200));
            assert_eq!(
                e.streamed_text().len(),
                4 * want as usize,
                "the simulator answers max_tokens tokens"
            );
            let response_id = e.response_id().unwrap();
            assert_eq!(completion_tokens.get(&response_id), Some(&want));
            Replayed {
                chat,
                turn,
                response_id,
            }
        })
        .collect()
}

/// The measured records of a run.
fn measured(run: &Run) -> Vec<Value> {
    std::fs::read_to_string(run.dir().join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["phase"] == "measured")
        .collect()
}

/// Which chat and turn a prompt of `prompt_chars` bytes is (each prompt
/// of the generated file has a length of its own).
fn by_length(chats: &[ShareGptChat], prompt_chars: u64) -> (usize, usize) {
    chats
        .iter()
        .enumerate()
        .find_map(|(c, chat)| {
            let t = chat
                .turns
                .iter()
                .position(|t| t.prompt.len() as u64 == prompt_chars)?;
            Some((c, t + 1))
        })
        .unwrap_or_else(|| panic!("no prompt of {prompt_chars} characters"))
}

/// 12 two-turn conversations in each form of the file (a JSON array in
/// ShareGPT's spelling, JSONL in OpenAI's), one stream, 24 requests: each
/// turn of each conversation is sent once, as the checks of [`replayed`]
/// say, and each record's conversation, turn, prompt length and output
/// tokens match the request the tap saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharegpt_file_is_replayed_turn_by_turn_with_the_recorded_lengths() {
    let data = tempfile::tempdir().unwrap();
    let chats = sharegpt_chats(12, 2);
    let array = data.path().join("ShareGPT_V3.json");
    let lines = data.path().join("sharegpt.jsonl");
    write_sharegpt_json(&array, &chats, Spelling::ShareGpt);
    write_sharegpt_jsonl(&lines, &chats, Spelling::OpenAi);
    for path in [array, lines] {
        let sim = nyann_sim::start(SimConfig {
            seed: 3,
            ..SimConfig::fast()
        })
        .await
        .unwrap();
        let tap = Tap::start(sim.endpoint()).await;
        let scenario = format!(
            "scenario(stages = [stage(\"60s\", concurrency=1, max_requests=24, workload=workload(\"sharegpt\", path={:?}, turns=2))])\n",
            path.display().to_string()
        );
        let run = generate_at(&tap.base_url(), &scenario, &[]).await;
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        assert!(
            run.stderr().contains("12 conversations replayed"),
            "{}",
            run.stderr()
        );

        let sent = replayed(&tap, &sim, &chats);
        let every: BTreeSet<(usize, usize)> = (0..12).flat_map(|c| [(c, 1), (c, 2)]).collect();
        let seen: BTreeSet<(usize, usize)> = sent.iter().map(|r| (r.chat, r.turn)).collect();
        assert_eq!(seen, every, "{}", path.display());
        assert_eq!(sent.len(), 24, "each turn once");

        let by_id: HashMap<&str, &Replayed> =
            sent.iter().map(|r| (r.response_id.as_str(), r)).collect();
        let records = measured(&run);
        assert_eq!(records.len(), 24);
        let mut chat_of: BTreeMap<u64, usize> = BTreeMap::new();
        for r in &records {
            let request = by_id[r["response_id"].as_str().unwrap()];
            let (chat, turn) = by_length(&chats, r["prompt_chars"].as_u64().unwrap());
            assert_eq!((chat, turn), (request.chat, request.turn), "{r}");
            assert_eq!(r["turn"], turn);
            assert_eq!(
                r["output_tokens"],
                chats[chat].turns[turn - 1].reply_tokens,
                "{r}"
            );
            let conversation = r["conversation"].as_u64().unwrap();
            assert_eq!(*chat_of.entry(conversation).or_insert(chat), chat, "{r}");
        }
        assert_eq!(chat_of.len(), 12, "one conversation id per conversation");
        validate_against_schema(run.dir());
        sim.shutdown().await;
    }
}

/// A conversation pool of 4 over 6 conversations of 3 turns, 3 streams:
/// every request replays its conversation's history with the simulator's
/// real replies, each conversation goes turn after turn, and those that
/// ended were replaced by the next ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_pool_replays_sharegpt_conversations() {
    let data = tempfile::tempdir().unwrap();
    let chats = sharegpt_chats(6, 3);
    let path = data.path().join("sharegpt.json");
    write_sharegpt_json(&path, &chats, Spelling::ShareGpt);
    let sim = nyann_sim::start(SimConfig {
        seed: 4,
        ..SimConfig::fast()
    })
    .await
    .unwrap();
    let tap = Tap::start(sim.endpoint()).await;
    let scenario = format!(
        "scenario(stages = [stage(\"60s\", mode=\"conversation_pool\", concurrency=3, conversation_pool_size=4, max_requests=30, workload=workload(\"sharegpt\", path={:?}, turns=3))])\n",
        path.display().to_string()
    );
    let run = generate_at(&tap.base_url(), &scenario, &[]).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr());
    let sent = replayed(&tap, &sim, &chats);
    assert!(sent.len() >= 30, "{}", sent.len());
    let records = measured(&run);
    assert_eq!(records.len(), 30);
    let mut turns: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut sorted = records.clone();
    sorted.sort_by_key(|r| r["id"].as_u64());
    for r in &sorted {
        turns
            .entry(r["conversation"].as_u64().unwrap())
            .or_default()
            .push(r["turn"].as_u64().unwrap());
    }
    for ts in turns.values() {
        let n = ts.len() as u64;
        assert_eq!(*ts, (1..=n).collect::<Vec<_>>(), "{turns:?}");
        assert!(n <= 3);
    }
    assert!(
        turns.len() >= 10,
        "30 turns of 3-turn conversations: {turns:?}"
    );
    let later = records.iter().filter(|r| r["turn"] != 1).count();
    assert!(later >= 15, "later turns carried: {later}");
}

/// A file with fewer conversations than the stage sends starts over: each
/// repeat carries a fresh cache salt (a prefix cache would serve its
/// prompt and flatter the TTFT), the run says how many repeated, and a
/// scenario that chose a salt keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_conversations_are_said_and_salted_afresh() {
    let data = tempfile::tempdir().unwrap();
    let chats = sharegpt_chats(3, 1);
    let path = data.path().join("sharegpt.json");
    write_sharegpt_json(&path, &chats, Spelling::ShareGpt);
    let sim = nyann_sim::start(SimConfig::fast()).await.unwrap();
    for (salt, expected) in [("", None), (", cache_salt=\"fixed:mine\"", Some("mine"))] {
        let tap = Tap::start(sim.endpoint()).await;
        let scenario = format!(
            "scenario(stages = [stage(\"60s\", concurrency=1, max_requests=9, \
             workload=workload(\"sharegpt\", path={:?}{salt}))])\n",
            path.display().to_string()
        );
        let run = generate_at(&tap.base_url(), &scenario, &[]).await;
        assert_eq!(run.code(), Some(0), "{}", run.stderr());
        let salts: Vec<Option<String>> = tap
            .exchanges_to("/chat/completions")
            .iter()
            .map(|e| e.request_json()["cache_salt"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(salts.len(), 9, "{salts:?}");
        match expected {
            None => {
                assert!(salts[..3].iter().all(Option::is_none), "{salts:?}");
                let repeats: BTreeSet<&String> = salts[3..].iter().flatten().collect();
                assert_eq!(repeats.len(), 6, "one fresh salt per repeat: {salts:?}");
                assert!(
                    repeats.iter().all(|s| s.starts_with("repeat-")),
                    "{salts:?}"
                );
                assert!(
                    run.stderr()
                        .contains("6 conversation(s) replayed a recorded one already sent"),
                    "{}",
                    run.stderr()
                );
            }
            Some(mine) => assert!(
                salts.iter().all(|s| s.as_deref() == Some(mine)),
                "{salts:?}"
            ),
        }
    }
}
