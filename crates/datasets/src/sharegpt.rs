//! ShareGPT: real conversations to replay as load (what vLLM's `bench serve
//! --dataset-name sharegpt` reads). A JSON array of records, or JSONL (one
//! record a line), each `{"id": ..., "conversations": [{"from": "human",
//! "value": "..."}, {"from": "gpt", "value": "..."}, ...]}`.
//!
//! Spellings read alike: `conversations` or `messages` for the list, `from`
//! or `role` and `value` or `content` in a message (a content given as a
//! list of parts keeps their `text`); the roles `human`/`user` ask, and
//! `gpt`/`assistant` (also `chatgpt`, `bing`, `bard`, `model`) reply.
//! `system` messages are skipped (the replay sends the human turns only).
//! Messages with no text are skipped. A conversation is read as its
//! exchanges, each a prompt (the human turns before a reply, joined by a
//! blank line) and the reply that follows it (replies in a row joined too):
//! replies before the first human turn and a last human turn with no reply
//! are left out, and a message of another role (`tool`, ...) ends the
//! conversation there.
//!
//! Only the replies' lengths are kept: a replay asks the server for a reply
//! as long as the recorded one and sends the server's own reply in the
//! later turns.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::{Error as _, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::{DatasetError, jsonl, read, record};

/// What the format expects, for errors about a file that has nothing of it.
const EXPECTED: &str = "ShareGPT: a JSON array of {\"id\": ..., \"conversations\": [{\"from\": \"human\", \"value\": ...}, {\"from\": \"gpt\", \"value\": ...}]}, or JSONL with one such object a line";

/// Replies shorter than this (in tokens) are dropped, as vLLM's sampler does.
pub const MIN_REPLY_TOKENS: u32 = 4;

/// Reply texts kept (evenly spread over the file) to calibrate tokens on.
const SAMPLES: usize = 64;
/// Bytes of one sample piece.
const SAMPLE_PIECE: usize = 256;

/// One prompt and the reply the conversation recorded for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// The human turn(s) before the reply: the prompt to send.
    pub prompt: String,
    /// The recorded reply's length in bytes.
    pub reply_bytes: usize,
}

/// A conversation as replayed: its first exchanges (up to the `turns` it
/// was read with).
#[derive(Debug, Clone, PartialEq)]
pub struct Chat {
    /// The record's `id`, if it has one.
    pub id: Option<String>,
    /// The record's number in the file: its position in the array, or its
    /// line in JSONL (from 1).
    pub record: usize,
    pub exchanges: Vec<Exchange>,
}

/// A ShareGPT file's conversations that have at least one exchange, in
/// the file's order.
#[derive(Debug, Clone)]
pub struct ShareGpt {
    path: String,
    chats: Vec<Chat>,
    /// Records in the file (with an exchange or not).
    records: usize,
    /// The first reply of records evenly spread over the file, cut.
    samples: Vec<String>,
}

/// How the lengths of a replay are bounded, and how tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes per token (calibrated with the server, or given).
    pub chars_per_token: f64,
    /// Most input tokens of a turn (for a later turn, the conversation so
    /// far and its new prompt); 0: no limit.
    pub max_isl: u32,
    /// Most tokens of a recorded reply; 0: no limit.
    pub max_osl: u32,
}

impl Limits {
    /// `bytes` of text in tokens (at least 1).
    pub fn tokens(&self, bytes: usize) -> u32 {
        tokens(bytes, self.chars_per_token)
    }
}

/// `bytes` of text in tokens at `chars_per_token` bytes a token, rounded
/// (at least 1; 4.0 when `chars_per_token` is not a positive number).
pub fn tokens(bytes: usize, chars_per_token: f64) -> u32 {
    let per = if chars_per_token.is_finite() && chars_per_token > 0.0 {
        chars_per_token
    } else {
        4.0
    };
    ((bytes as f64 / per).round() as u32).max(1)
}

/// A conversation kept by [`ShareGpt::select`], and how many of its
/// exchanges fit the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selected {
    /// Its index in [`ShareGpt::chat`].
    pub index: usize,
    /// Its first exchanges that fit (at least 1).
    pub turns: u32,
}

/// What [`ShareGpt::select`] kept and left out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    pub kept: Vec<Selected>,
    /// Conversations left out, by reason (the reason of their first
    /// exchange).
    pub dropped: BTreeMap<&'static str, usize>,
}

impl Selection {
    /// "3 left out: 2 first prompt over max_isl, 1 ...".
    pub fn dropped_text(&self) -> String {
        self.dropped
            .iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl ShareGpt {
    /// Reads a ShareGPT file (a JSON array or JSONL), keeping the first
    /// `turns` exchanges of each conversation (at least one). Every record
    /// is checked, whatever `turns`; a file with no exchange at all is an
    /// error that says why.
    pub fn load(path: &Path, turns: usize) -> Result<ShareGpt, DatasetError> {
        let text = read(path)?;
        let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
        let mut reader = Reader {
            path,
            turns: turns.max(1),
            set: ShareGpt {
                path: path.display().to_string(),
                chats: Vec::new(),
                records: 0,
                samples: Vec::new(),
            },
            stride: 1,
            with_exchange: 0,
        };
        match text.trim_start().as_bytes().first() {
            Some(b'[') => reader.array(text)?,
            Some(b'{') => {
                for item in jsonl(path, text) {
                    let (line, map) = item?;
                    reader.record(line, &map)?;
                }
            }
            Some(_) => {
                return Err(record(
                    path,
                    1,
                    format!("neither a JSON array nor JSONL of objects ({EXPECTED})"),
                ));
            }
            None => {}
        }
        let set = reader.set;
        if set.records == 0 {
            return Err(DatasetError::NoneLeft {
                path: set.path,
                why: format!("the file holds no conversation ({EXPECTED})"),
            });
        }
        if set.chats.is_empty() {
            return Err(DatasetError::NoneLeft {
                path: set.path,
                why: format!(
                    "none of its {} conversations has a human turn followed by a reply",
                    set.records
                ),
            });
        }
        Ok(set)
    }

    /// The file, as it was named.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Conversations with at least one exchange.
    pub fn len(&self) -> usize {
        self.chats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.chats.is_empty()
    }

    /// Records in the file (with an exchange or not).
    pub fn records(&self) -> usize {
        self.records
    }

    pub fn chat(&self, index: usize) -> Option<&Chat> {
        self.chats.get(index)
    }

    /// Up to `max_bytes` of the dataset's own text, prompts and replies of
    /// conversations spread over the file: what characters per token are
    /// measured on.
    pub fn calibration_text(&self, max_bytes: usize) -> String {
        const PIECES: usize = 32;
        let mut out = String::new();
        let mut push = |text: &str| {
            let room = max_bytes.saturating_sub(out.len());
            let piece = cut(text.trim(), SAMPLE_PIECE.min(room));
            if !piece.is_empty() {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(piece);
            }
        };
        for k in 0..PIECES {
            if let Some(chat) = self.chats.get(k * self.chats.len() / PIECES)
                && let Some(first) = chat.exchanges.first()
            {
                push(&first.prompt);
            }
            if let Some(reply) = self.samples.get(k * self.samples.len() / PIECES) {
                push(reply);
            }
        }
        cut(&out, max_bytes).to_string()
    }

    /// The conversations that fit `limits`, each with its first exchanges
    /// that fit: a turn whose input (the conversation so far and its
    /// prompt) is over `max_isl`, whose reply is over `max_osl` or shorter
    /// than [`MIN_REPLY_TOKENS`], ends the conversation before it; a
    /// conversation whose first turn does not fit is left out. None left is
    /// an error that says why.
    pub fn select(&self, limits: &Limits) -> Result<Selection, DatasetError> {
        let mut selection = Selection::default();
        for (index, chat) in self.chats.iter().enumerate() {
            let mut input = 0u64;
            let mut turns = 0u32;
            let mut why = None;
            for exchange in &chat.exchanges {
                let prompt = limits.tokens(exchange.prompt.len());
                let reply = limits.tokens(exchange.reply_bytes);
                input += u64::from(prompt);
                if limits.max_isl > 0 && input > u64::from(limits.max_isl) {
                    why = Some("with a first prompt over max_isl");
                } else if reply < MIN_REPLY_TOKENS {
                    why = Some("with a first reply under 4 tokens");
                } else if limits.max_osl > 0 && reply > limits.max_osl {
                    why = Some("with a first reply over max_osl");
                }
                if why.is_some() {
                    break;
                }
                turns += 1;
                input += u64::from(reply);
            }
            match (turns, why) {
                (0, Some(why)) => *selection.dropped.entry(why).or_default() += 1,
                (0, None) => {}
                (turns, _) => selection.kept.push(Selected { index, turns }),
            }
        }
        if selection.kept.is_empty() {
            return Err(DatasetError::NoneLeft {
                path: self.path.clone(),
                why: format!(
                    "all {} conversations with a reply were left out by the length limits \
                     (max_isl={}, max_osl={}, at {:.2} characters per token): {}",
                    self.chats.len(),
                    limits.max_isl,
                    limits.max_osl,
                    limits.chars_per_token,
                    selection.dropped_text()
                ),
            });
        }
        Ok(selection)
    }
}

/// The longest prefix of `text` of at most `bytes` bytes, on a character
/// boundary.
fn cut(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What a message is, by its role.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Human,
    Reply,
    System,
    Other,
}

fn role(name: &str) -> Role {
    match name.to_ascii_lowercase().as_str() {
        "human" | "user" => Role::Human,
        "gpt" | "assistant" | "chatgpt" | "bing" | "bard" | "model" => Role::Reply,
        "system" => Role::System,
        _ => Role::Other,
    }
}

/// Reads records one at a time into the set.
struct Reader<'a> {
    path: &'a Path,
    turns: usize,
    set: ShareGpt,
    /// Every `stride`-th conversation with an exchange gives a sample.
    stride: usize,
    /// Conversations with an exchange so far.
    with_exchange: usize,
}

impl Reader<'_> {
    /// A JSON array, one element at a time (the file's records are never
    /// all held as JSON values at once).
    fn array(&mut self, text: &str) -> Result<(), DatasetError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let mut failed = None;
        let parsed = serde::Deserializer::deserialize_seq(
            &mut de,
            Elements {
                reader: self,
                failed: &mut failed,
            },
        );
        if let Some(err) = failed {
            return Err(err);
        }
        parsed
            .and_then(|()| de.end())
            .map_err(|e| record(self.path, self.set.records + 1, format!("not JSON: {e}")))
    }

    /// One record (`number`: its position or line).
    fn record(&mut self, number: usize, map: &Map<String, Value>) -> Result<(), DatasetError> {
        self.set.records += 1;
        let id = match map.get("id") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let named = |why: String| match &id {
            Some(id) => record(self.path, number, format!("id {id:?}: {why}")),
            None => record(self.path, number, why),
        };
        let messages = match map.get("conversations").or_else(|| map.get("messages")) {
            Some(Value::Array(messages)) => messages,
            Some(_) => return Err(named("\"conversations\" is not a list".into())),
            None => {
                return Err(named(format!(
                    "no \"conversations\" (or \"messages\") list ({EXPECTED})"
                )));
            }
        };
        let mut exchanges = Vec::new();
        let mut first_reply = None;
        let mut prompt: Option<String> = None;
        let mut reply: Option<usize> = None;
        let mut ended = false;
        for (i, message) in messages.iter().enumerate() {
            let (who, text) =
                message_of(message).map_err(|why| named(format!("message {}: {why}", i + 1)))?;
            if ended || text.trim().is_empty() {
                continue;
            }
            match role(who) {
                Role::System => {}
                Role::Other => ended = true,
                Role::Human => {
                    // A human turn after a reply: the exchange before it is complete.
                    if let Some(r) = reply.take()
                        && let Some(p) = prompt.take()
                    {
                        exchanges.push(Exchange {
                            prompt: p,
                            reply_bytes: r,
                        });
                        if exchanges.len() >= self.turns {
                            ended = true;
                            continue;
                        }
                    }
                    match &mut prompt {
                        Some(p) => {
                            p.push_str("\n\n");
                            p.push_str(&text);
                        }
                        None => prompt = Some(text.into_owned()),
                    }
                }
                // A reply before any human turn answers nothing.
                Role::Reply if prompt.is_none() => {}
                Role::Reply => {
                    if exchanges.is_empty() && first_reply.is_none() {
                        first_reply = Some(cut(&text, SAMPLE_PIECE).to_string());
                    }
                    reply = Some(match reply {
                        Some(r) => r + 2 + text.len(),
                        None => text.len(),
                    });
                }
            }
        }
        if let (Some(p), Some(r)) = (prompt, reply)
            && exchanges.len() < self.turns
        {
            exchanges.push(Exchange {
                prompt: p,
                reply_bytes: r,
            });
        }
        if exchanges.is_empty() {
            return Ok(());
        }
        if self.with_exchange.is_multiple_of(self.stride)
            && let Some(sample) = first_reply
        {
            self.set.samples.push(sample);
            if self.set.samples.len() >= SAMPLES {
                // Keep every other one: the samples stay evenly spread.
                let mut k = 0;
                self.set.samples.retain(|_| {
                    k += 1;
                    k % 2 == 1
                });
                self.stride *= 2;
            }
        }
        self.with_exchange += 1;
        self.set.chats.push(Chat {
            id,
            record: number,
            exchanges,
        });
        Ok(())
    }
}

/// A message's role and text; why not, when it has none.
fn message_of(message: &Value) -> Result<(&str, std::borrow::Cow<'_, str>), String> {
    let Value::Object(map) = message else {
        return Err("not an object ({\"from\": ..., \"value\": ...})".into());
    };
    let who = match map.get("from").or_else(|| map.get("role")) {
        Some(Value::String(s)) => s.as_str(),
        Some(_) => return Err("its \"from\" is not a string".into()),
        None => return Err("no \"from\" (or \"role\")".into()),
    };
    let text = match map.get("value").or_else(|| map.get("content")) {
        Some(Value::String(s)) => std::borrow::Cow::Borrowed(s.as_str()),
        Some(Value::Null) => std::borrow::Cow::Borrowed(""),
        // OpenAI's content parts: their text.
        Some(Value::Array(parts)) => std::borrow::Cow::Owned(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(_) => return Err("its \"value\" is not a string".into()),
        None => return Err("no \"value\" (or \"content\")".into()),
    };
    Ok((who, text))
}

/// The elements of the top-level array, handed to the reader one by one.
struct Elements<'r, 'a> {
    reader: &'r mut Reader<'a>,
    /// A record the reader refused (the parse is then stopped).
    failed: &'r mut Option<DatasetError>,
}

impl<'de> Visitor<'de> for Elements<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array of conversations")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(value) = seq.next_element::<Value>()? {
            let number = self.reader.set.records + 1;
            let result = match &value {
                Value::Object(map) => self.reader.record(number, map),
                _ => Err(record(self.reader.path, number, "not a JSON object".into())),
            };
            if let Err(err) = result {
                *self.failed = Some(err);
                return Err(A::Error::custom("refused"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str, name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    fn prompts(set: &ShareGpt) -> Vec<Vec<(String, usize)>> {
        (0..set.len())
            .map(|i| {
                set.chat(i)
                    .unwrap()
                    .exchanges
                    .iter()
                    .map(|e| (e.prompt.clone(), e.reply_bytes))
                    .collect()
            })
            .collect()
    }

    const ARRAY: &str = r#"[
      {"id": "a", "conversations": [
        {"from": "human", "value": "Hello there"},
        {"from": "gpt", "value": "Hi! How can I help?"},
        {"from": "human", "value": "Tell me a joke"},
        {"from": "gpt", "value": "No."}
      ]},
      {"id": 7, "conversations": [
        {"from": "system", "value": "be brief"},
        {"from": "gpt", "value": "I speak first"},
        {"from": "human", "value": "one"},
        {"from": "human", "value": "two"},
        {"from": "gpt", "value": "answer"},
        {"from": "gpt", "value": "more"},
        {"from": "human", "value": "left unanswered"}
      ]},
      {"id": "empty", "conversations": []}
    ]"#;

    #[test]
    fn an_array_is_read_as_exchanges() {
        let (_dir, path) = write(ARRAY, "sg.json");
        let set = ShareGpt::load(&path, 10).unwrap();
        assert_eq!(set.records(), 3);
        assert_eq!(set.len(), 2, "the empty conversation has no exchange");
        assert_eq!(
            prompts(&set),
            [
                vec![
                    ("Hello there".to_string(), "Hi! How can I help?".len()),
                    ("Tell me a joke".to_string(), 3),
                ],
                vec![("one\n\ntwo".to_string(), "answer\n\nmore".len())],
            ]
        );
        let second = set.chat(1).unwrap();
        assert_eq!((second.id.as_deref(), second.record), (Some("7"), 2));
        // turns=1: the first exchange only.
        let first = ShareGpt::load(&path, 1).unwrap();
        assert_eq!(first.chat(0).unwrap().exchanges.len(), 1);
    }

    #[test]
    fn jsonl_and_the_openai_spelling_read_alike() {
        let jsonl = "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"text\", \"text\": \"Hi! How can I help?\"}]}, {\"role\": \"USER\", \"content\": \"Tell me a joke\"}, {\"role\": \"assistant\", \"content\": \"No.\"}]}\n\n\
                     {\"conversations\": [{\"from\": \"human\", \"value\": \"x\"}, {\"from\": \"tool\", \"value\": \"ends it\"}, {\"from\": \"gpt\", \"value\": \"never read\"}]}\n\
                     {\"id\": 7, \"conversations\": [{\"from\": \"human\", \"value\": \"one\"}, {\"from\": \"human\", \"value\": \"two\"}, {\"from\": \"gpt\", \"value\": \"answer\"}, {\"from\": \"gpt\", \"value\": \"more\"}]}\n";
        let (_dir, path) = write(jsonl, "sg.jsonl");
        let set = ShareGpt::load(&path, 10).unwrap();
        assert_eq!(set.records(), 3);
        let (_dir2, array) = write(ARRAY, "sg.json");
        assert_eq!(prompts(&set), prompts(&ShareGpt::load(&array, 10).unwrap()));
        assert_eq!(set.chat(1).unwrap().record, 4, "JSONL records are lines");
    }

    #[test]
    fn malformed_records_are_named() {
        let cases = [
            (
                "[{\"id\": \"a\", \"conversations\": []}, 3]",
                "record 2: not a JSON object",
            ),
            (
                "[{\"id\": \"a\", \"conversations\": []}, {\"id\": \"b\"}]",
                "record 2: id \"b\": no \"conversations\" (or \"messages\") list",
            ),
            (
                "[{\"id\": \"a\", \"conversations\": [{\"from\": \"human\"}]}]",
                "record 1: id \"a\": message 1: no \"value\" (or \"content\")",
            ),
            (
                "[{\"conversations\": [{\"value\": \"hi\"}]}]",
                "record 1: message 1: no \"from\" (or \"role\")",
            ),
            (
                "[{\"conversations\": [{\"from\": \"human\", \"value\": 3}]}]",
                "record 1: message 1: its \"value\" is not a string",
            ),
            ("[{\"conversations\": []}, {\"conv", "record 2: not JSON: "),
            (
                "[{\"conversations\": []}] x",
                "record 2: not JSON: trailing characters",
            ),
            ("\"text\"", "record 1: neither a JSON array nor JSONL"),
        ];
        for (text, expected) in cases {
            let (_dir, path) = write(text, "bad.json");
            let err = ShareGpt::load(&path, 1).unwrap_err().to_string();
            assert!(err.starts_with(&path.display().to_string()), "{err}");
            assert!(err.contains(expected), "{text}: {err}");
        }
        let (_dir, path) = write("{\"conversations\": []}\nnot json\n", "bad.jsonl");
        let err = ShareGpt::load(&path, 1).unwrap_err().to_string();
        assert!(err.contains("record 2: not JSON"), "{err}");
    }

    #[test]
    fn a_file_with_nothing_to_replay_says_why() {
        for (text, expected) in [
            (
                "",
                "no conversation to replay: the file holds no conversation (ShareGPT:",
            ),
            (
                " []\n",
                "no conversation to replay: the file holds no conversation (ShareGPT:",
            ),
            (
                "[{\"conversations\": [{\"from\": \"gpt\", \"value\": \"alone\"}]}, {\"conversations\": []}]",
                "none of its 2 conversations has a human turn followed by a reply",
            ),
        ] {
            let (_dir, path) = write(text, "empty.json");
            let err = ShareGpt::load(&path, 1).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    /// Exchanges of `(prompt bytes, reply bytes)`, one conversation each.
    fn of_lengths(chats: &[&[(usize, usize)]]) -> (tempfile::TempDir, ShareGpt) {
        let records: Vec<Value> = chats
            .iter()
            .enumerate()
            .map(|(i, exchanges)| {
                let messages: Vec<Value> = exchanges
                    .iter()
                    .flat_map(|&(p, r)| {
                        [
                            serde_json::json!({"from": "human", "value": "p".repeat(p)}),
                            serde_json::json!({"from": "gpt", "value": "r".repeat(r)}),
                        ]
                    })
                    .collect();
                serde_json::json!({"id": i.to_string(), "conversations": messages})
            })
            .collect();
        let (dir, path) = write(&Value::Array(records).to_string(), "len.json");
        let set = ShareGpt::load(&path, 10).unwrap();
        (dir, set)
    }

    #[test]
    fn lengths_filter_conversations_and_cut_later_turns() {
        let (_dir, set) = of_lengths(&[
            &[(40, 80), (40, 80), (40, 80)], // 10+20 tokens a turn
            &[(400, 80)],                    // prompt of 100 tokens
            &[(40, 12)],                     // reply of 3 tokens
            &[(40, 800)],                    // reply of 200 tokens
            &[(40, 80), (40, 8)],            // second reply too short
        ]);
        let limits = |max_isl, max_osl| Limits {
            chars_per_token: 4.0,
            max_isl,
            max_osl,
        };
        let kept = |s: Selection| {
            s.kept
                .iter()
                .map(|k| (k.index, k.turns))
                .collect::<Vec<_>>()
        };
        let all = set.select(&limits(0, 0)).unwrap();
        assert_eq!(kept(all.clone()), [(0, 3), (1, 1), (3, 1), (4, 1)]);
        assert_eq!(all.dropped_text(), "1 with a first reply under 4 tokens");
        // The third turn's input: 10 + 20 + 10 + 20 + 10 = 70 tokens.
        let bounded = set.select(&limits(69, 100)).unwrap();
        assert_eq!(kept(bounded.clone()), [(0, 2), (4, 1)]);
        assert_eq!(
            bounded.dropped_text(),
            "1 with a first prompt over max_isl, 1 with a first reply over max_osl, 1 with a first reply under 4 tokens"
        );
        let err = set.select(&limits(5, 0)).unwrap_err().to_string();
        assert!(
            err.contains("all 5 conversations with a reply were left out by the length limits (max_isl=5, max_osl=0, at 4.00 characters per token): 5 with a first prompt over max_isl"),
            "{err}"
        );
    }

    #[test]
    fn tokens_are_rounded_and_at_least_one() {
        assert_eq!(tokens(400, 4.0), 100);
        assert_eq!(tokens(401, 4.0), 100);
        assert_eq!(tokens(402, 4.0), 101);
        assert_eq!(tokens(0, 4.0), 1);
        assert_eq!(tokens(40, 0.0), 10, "no calibration: 4.0");
        assert_eq!(tokens(40, f64::NAN), 10);
    }

    #[test]
    fn the_calibration_text_is_the_datasets_own_spread_over_the_file() {
        let chats: Vec<Vec<(usize, usize)>> = (0..1000).map(|i| vec![(10 + i % 7, 300)]).collect();
        let refs: Vec<&[(usize, usize)]> = chats.iter().map(Vec::as_slice).collect();
        let (_dir, set) = of_lengths(&refs);
        assert!(set.samples.len() < SAMPLES && set.samples.len() >= SAMPLES / 2);
        let text = set.calibration_text(8000);
        assert!(text.len() <= 8000);
        assert!(text.contains(&"r".repeat(SAMPLE_PIECE)), "replies in it");
        assert!(text.contains("pppppppppp"), "prompts in it");
        assert_eq!(set.calibration_text(100).len(), 100);
    }
}
