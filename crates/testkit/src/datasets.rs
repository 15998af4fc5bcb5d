//! Small datasets in the real formats, made here (no dataset may be
//! downloaded or copied into the repository): arithmetic word problems as
//! GSM8K's JSONL, and four-choice questions as GPQA's CSV, each question's
//! first line unique; ShareGPT conversations (JSON array or JSONL) with
//! known prompts and reply lengths.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write;
use std::path::Path;

/// `n` GSM8K records: "Tom has A apples and buys B more...", `#### A+B`.
pub fn write_gsm8k(path: &Path, n: usize) {
    let mut out = String::new();
    for i in 0..n {
        let (a, b) = (3 + i, 7 + 2 * i);
        let record = serde_json::json!({
            "question": format!("Tom has {a} apples and buys {b} more. How many apples does he have now?"),
            "answer": format!("He has {a} + {b} = <<{a}+{b}={}>>{} apples.\n#### {}", a + b, a + b, a + b),
        });
        writeln!(out, "{record}").unwrap();
    }
    std::fs::write(path, out).unwrap();
}

/// `n` GPQA rows (with its extra leading column, as the real CSV has):
/// "What is A times B?", the product right, three near misses wrong.
pub fn write_gpqa_csv(path: &Path, n: usize) {
    let mut writer = csv::Writer::from_path(path).unwrap();
    writer
        .write_record([
            "Pre-Revision Question",
            "Question",
            "Correct Answer",
            "Incorrect Answer 1",
            "Incorrect Answer 2",
            "Incorrect Answer 3",
        ])
        .unwrap();
    for i in 0..n {
        let (a, b) = (2 + i, 3 + i % 7);
        let product = a * b;
        writer
            .write_record([
                String::new(),
                format!("What is {a} times {b}?\nGive the exact product."),
                product.to_string(),
                (product + 1).to_string(),
                (product + 2).to_string(),
                (product + 3).to_string(),
            ])
            .unwrap();
    }
    writer.flush().unwrap();
}

/// One human turn of a generated ShareGPT conversation, and the length of
/// the reply recorded after it.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareGptTurn {
    /// ASCII; starts with `c{conversation}t{turn} ` (turns from 1).
    pub prompt: String,
    /// The recorded reply's length in tokens: its text is this many
    /// 4-byte words (` abc`), so 4 bytes a token.
    pub reply_tokens: u32,
}

/// A generated ShareGPT conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareGptChat {
    /// `conv-{index}`.
    pub id: String,
    pub turns: Vec<ShareGptTurn>,
}

impl ShareGptChat {
    /// The recorded reply of turn `index` (0-based).
    pub fn reply(&self, index: usize) -> String {
        reply_text(index, self.turns[index].reply_tokens)
    }
}

/// `n` conversations of `turns` exchanges each (human turn, then reply).
/// Conversation `i`'s turn `t` (0-based) has a prompt of `4 * (24 + i *
/// turns + t)` bytes, so every prompt's length is its own (a request's
/// `prompt_chars` tells which conversation and turn it was), and a reply of
/// `8 + (5 i + 3 t) % 25` tokens (8 to 32).
pub fn sharegpt_chats(n: usize, turns: usize) -> Vec<ShareGptChat> {
    (0..n)
        .map(|i| ShareGptChat {
            id: format!("conv-{i}"),
            turns: (0..turns)
                .map(|t| {
                    let bytes = 4 * (24 + i * turns + t);
                    let mut prompt = format!("c{i}t{} please tell me about", t + 1);
                    let mut k = 0;
                    while prompt.len() < bytes {
                        prompt.push(' ');
                        prompt.push_str(FILLER[(i + t + k) % FILLER.len()]);
                        k += 1;
                    }
                    prompt.truncate(bytes);
                    ShareGptTurn {
                        prompt,
                        reply_tokens: 8 + ((5 * i + 3 * t) % 25) as u32,
                    }
                })
                .collect(),
        })
        .collect()
}

const FILLER: [&str; 8] = [
    "rivers",
    "and",
    "the",
    "mountains",
    "of",
    "distant",
    "lands",
    "today",
];

/// `tokens` words of 4 bytes.
fn reply_text(turn: usize, tokens: u32) -> String {
    const WORDS: [&str; 4] = [" sky", " sea", " sun", " map"];
    (0..tokens as usize)
        .map(|k| WORDS[(turn + k) % WORDS.len()])
        .collect()
}

/// How a ShareGPT file spells its keys and roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// `conversations`, `from`/`value`, `human`/`gpt` (ShareGPT_V3's).
    ShareGpt,
    /// `messages`, `role`/`content`, `user`/`assistant` (OpenAI's).
    OpenAi,
}

fn sharegpt_record(chat: &ShareGptChat, spelling: Spelling) -> serde_json::Value {
    let (list, who, text, human, reply) = match spelling {
        Spelling::ShareGpt => ("conversations", "from", "value", "human", "gpt"),
        Spelling::OpenAi => ("messages", "role", "content", "user", "assistant"),
    };
    let mut messages =
        vec![serde_json::json!({who: "system", text: "You are a helpful assistant."})];
    for (t, turn) in chat.turns.iter().enumerate() {
        messages.push(serde_json::json!({who: human, text: turn.prompt}));
        messages.push(serde_json::json!({who: reply, text: chat.reply(t)}));
    }
    serde_json::json!({"id": chat.id, list: messages})
}

/// `chats` as a ShareGPT JSON array (as `ShareGPT_V3_unfiltered_cleaned_split.json`
/// is, pretty-printed), each conversation after a system message.
pub fn write_sharegpt_json(path: &Path, chats: &[ShareGptChat], spelling: Spelling) {
    let records: Vec<serde_json::Value> =
        chats.iter().map(|c| sharegpt_record(c, spelling)).collect();
    let text = serde_json::to_string_pretty(&records).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `chats` as JSONL: one conversation a line.
pub fn write_sharegpt_jsonl(path: &Path, chats: &[ShareGptChat], spelling: Spelling) {
    let mut out = String::new();
    for chat in chats {
        writeln!(out, "{}", sharegpt_record(chat, spelling)).unwrap();
    }
    std::fs::write(path, out).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharegpt_chats_have_the_said_lengths_each_prompt_its_own() {
        let chats = sharegpt_chats(30, 3);
        let mut lengths = std::collections::BTreeSet::new();
        for (i, chat) in chats.iter().enumerate() {
            assert_eq!(chat.id, format!("conv-{i}"));
            for (t, turn) in chat.turns.iter().enumerate() {
                assert_eq!(turn.prompt.len(), 4 * (24 + i * 3 + t));
                assert!(turn.prompt.starts_with(&format!("c{i}t{} ", t + 1)));
                assert!(lengths.insert(turn.prompt.len()), "unique lengths");
                assert!((8..=32).contains(&turn.reply_tokens));
                assert_eq!(chat.reply(t).len(), 4 * turn.reply_tokens as usize);
            }
        }
        assert_eq!(sharegpt_chats(30, 3), chats, "deterministic");
    }

    #[test]
    fn both_forms_and_spellings_hold_the_conversations() {
        let chats = sharegpt_chats(3, 2);
        let dir = tempfile::tempdir().unwrap();
        for spelling in [Spelling::ShareGpt, Spelling::OpenAi] {
            let (list, who, text) = match spelling {
                Spelling::ShareGpt => ("conversations", "from", "value"),
                Spelling::OpenAi => ("messages", "role", "content"),
            };
            let array = dir.path().join("a.json");
            let lines = dir.path().join("l.jsonl");
            write_sharegpt_json(&array, &chats, spelling);
            write_sharegpt_jsonl(&lines, &chats, spelling);
            let from_array: Vec<serde_json::Value> =
                serde_json::from_str(&std::fs::read_to_string(&array).unwrap()).unwrap();
            let from_lines: Vec<serde_json::Value> = std::fs::read_to_string(&lines)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(from_array, from_lines);
            let second = &from_array[1];
            assert_eq!(second["id"], "conv-1");
            let messages = second[list].as_array().unwrap();
            assert_eq!(messages.len(), 5, "system, then two exchanges");
            assert_eq!(messages[0][who], "system");
            assert_eq!(messages[3][text], chats[1].turns[1].prompt);
            assert_eq!(messages[4][text], chats[1].reply(1));
        }
    }
}
