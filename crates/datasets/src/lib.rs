//! Datasets in the files users download. Eval datasets asked as load:
//! GSM8K and GPQA, each question as the prompt a request sends, and the
//! answer extracted from a reply and scored. The load generator asks them;
//! the simulator finds the question a prompt asks ([`EvalSet::find`]) to
//! answer it. And ShareGPT's real conversations, replayed as load
//! ([`ShareGpt`]: the human turns as prompts, the recorded replies'
//! lengths as each request's `max_tokens`).
//!
//! Every prompt ends with its question as a block that starts with
//! `Question: `: few-shot examples (GSM8K) come before it, the choices
//! (GPQA) after it.

use std::collections::HashMap;
use std::path::Path;

mod gpqa;
mod gsm8k;
mod numbers;
mod sharegpt;

pub use gpqa::extract_letter;
pub use gsm8k::extract_number;
pub use sharegpt::{
    Chat, Exchange, Limits, MIN_REPLY_TOKENS, Selected, Selection, ShareGpt, tokens,
};

/// Which dataset, and so how a reply is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalKind {
    /// Grade-school math: the answer is a number.
    Gsm8k,
    /// Four-choice questions: the answer is a letter, A to D.
    Gpqa,
}

/// One question as asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    /// The whole prompt (few-shot examples included).
    pub prompt: String,
    /// The answer that scores a reply: a normalised number, or a letter.
    pub expected: String,
    /// The right answer as the dataset writes it: the number (GSM8K), the
    /// correct choice's text (GPQA, whose letter depends on the shuffle).
    pub correct: String,
}

/// A reply, scored.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The answer read from the reply; `None`: it gave none (unanswerable).
    pub extracted: Option<String>,
    pub correct: bool,
}

/// Why a dataset cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// (The OS error is part of the message, not a `source`: a printed
    /// error chain says it once.)
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
    /// One record (a line of JSONL, a row of CSV) is not what the format
    /// needs.
    #[error("{path}: record {record}: {why}")]
    Record {
        path: String,
        record: usize,
        why: String,
    },
    /// The file is not UTF-8 text: where the first invalid byte is.
    #[error(
        "{path}: line {line} is not UTF-8 text (byte {column} of the line): save the file as UTF-8"
    )]
    NotUtf8 {
        path: String,
        line: usize,
        column: usize,
    },
    #[error("{path}: no question in the file ({expected})")]
    Empty {
        path: String,
        expected: &'static str,
    },
    /// A replay dataset with nothing left to send, and why.
    #[error("{path}: no conversation to replay: {why}")]
    NoneLeft { path: String, why: String },
}

/// The questions of a dataset, in the file's order.
#[derive(Debug, Clone)]
pub struct EvalSet {
    kind: EvalKind,
    questions: Vec<Question>,
    /// The first line of each question's block, capped: what
    /// [`EvalSet::find`] looks up.
    by_key: HashMap<String, usize>,
}

/// The largest record (a line of JSONL, a row of CSV) an eval dataset may
/// have: a question of GSM8K or GPQA is a few KB; a larger one is not a
/// question but a file that would be held and sent whole.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// The longest answer kept from a reply (a GSM8K number, a GPQA letter):
/// what a request's record stores.
pub const MAX_EXTRACTED_CHARS: usize = 64;

/// Where a prompt's own question starts.
const MARKER: &str = "Question: ";
/// Characters of a question's first line that identify it.
const KEY_CHARS: usize = 120;

impl EvalSet {
    /// A GSM8K test file (JSONL of `question`/`answer`, the answer ending
    /// `#### N`), each question preceded by the first `fewshot` worked
    /// examples of `train` (the same format; needed when `fewshot > 0`).
    pub fn gsm8k(
        path: &Path,
        train: Option<&Path>,
        fewshot: usize,
    ) -> Result<EvalSet, DatasetError> {
        gsm8k::load(path, train, fewshot).map(|q| EvalSet::new(EvalKind::Gsm8k, q))
    }

    /// A GPQA file (its CSV, or JSONL with the same columns: `Question`,
    /// `Correct Answer`, `Incorrect Answer 1..3`), each question's choices
    /// shuffled with `seed`.
    pub fn gpqa(path: &Path, seed: u64) -> Result<EvalSet, DatasetError> {
        gpqa::load(path, seed).map(|q| EvalSet::new(EvalKind::Gpqa, q))
    }

    fn new(kind: EvalKind, questions: Vec<Question>) -> EvalSet {
        let mut by_key = HashMap::new();
        for (index, question) in questions.iter().enumerate() {
            if let Some(key) = key(&question.prompt) {
                by_key.entry(key).or_insert(index);
            }
        }
        EvalSet {
            kind,
            questions,
            by_key,
        }
    }

    pub fn kind(&self) -> EvalKind {
        self.kind
    }

    pub fn len(&self) -> usize {
        self.questions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.questions.is_empty()
    }

    pub fn question(&self, index: usize) -> Option<&Question> {
        self.questions.get(index)
    }

    /// The question `prompt` asks (its last `Question: ` block), if it is
    /// one of this set's; `prompt` may carry a chat template around it.
    pub fn find(&self, prompt: &str) -> Option<&Question> {
        let index = *self.by_key.get(&key(prompt)?)?;
        self.questions.get(index)
    }

    /// Reads the answer in `reply` and scores it against `question`.
    pub fn score(&self, question: &Question, reply: &str) -> Scored {
        let extracted = match self.kind {
            EvalKind::Gsm8k => extract_number(reply),
            EvalKind::Gpqa => extract_letter(reply).map(String::from),
        };
        let correct = extracted.as_deref() == Some(question.expected.as_str());
        // Kept in every request's record: a reply of 200,000 digits is kept
        // as its first digits, marked cut.
        let extracted = extracted.map(|e| match e.char_indices().nth(MAX_EXTRACTED_CHARS) {
            Some((cut, _)) => format!("{}…", &e[..cut]),
            None => e,
        });
        Scored { extracted, correct }
    }

    /// The answer `prompt` expects, read from the prompt itself (a GPQA
    /// prompt's letter depends on the asker's shuffle, not this set's): what
    /// the simulator answers with.
    pub fn expected_in(&self, prompt: &str) -> Option<String> {
        let question = self.find(prompt)?;
        match self.kind {
            EvalKind::Gsm8k => Some(question.expected.clone()),
            EvalKind::Gpqa => gpqa::LETTERS
                .iter()
                .find(|letter| prompt.contains(&format!("\n{letter}) {}\n", question.correct)))
                .map(|letter| (*letter).to_string()),
        }
    }

    /// A reply giving the answer `expected` or, with `correct` false, a
    /// wrong one: what the simulator says.
    pub fn reply(&self, expected: &str, correct: bool) -> String {
        match self.kind {
            EvalKind::Gsm8k if correct => format!("#### {expected}"),
            EvalKind::Gsm8k => format!("#### {}", numbers::another(expected)),
            EvalKind::Gpqa => {
                let letter = if correct {
                    expected
                } else {
                    match expected {
                        "A" => "B",
                        "B" => "C",
                        "C" => "D",
                        _ => "A",
                    }
                };
                format!("Answer: {letter}")
            }
        }
    }
}

/// The first line of the last `Question: ` block of `text`, capped.
fn key(text: &str) -> Option<String> {
    let start = text.rfind(MARKER)? + MARKER.len();
    let line = text[start..].split('\n').next().unwrap_or_default();
    Some(line.chars().take(KEY_CHARS).collect())
}

/// Removes `<think>...</think>` blocks (reasoning models' reasoning, whose
/// numbers and letters are not the answer); an unclosed block runs to the
/// end.
fn without_reasoning(reply: &str) -> String {
    let mut out = String::with_capacity(reply.len());
    let mut rest = reply;
    while let Some(open) = rest.find("<think>") {
        out.push_str(&rest[..open]);
        match rest[open..].find("</think>") {
            Some(close) => rest = &rest[open + close + "</think>".len()..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// Each line of a JSONL file as an object, numbered from 1 (blank lines
/// skipped).
fn jsonl(
    path: &Path,
    text: &str,
) -> impl Iterator<Item = Result<(usize, serde_json::Map<String, serde_json::Value>), DatasetError>>
{
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(move |(i, line)| match serde_json::from_str(line) {
            _ if line.len() > MAX_RECORD_BYTES => Err(too_large(path, i + 1, line.len())),
            Ok(serde_json::Value::Object(map)) => Ok((i + 1, map)),
            Ok(_) => Err(record(path, i + 1, "not a JSON object".into())),
            Err(e) => Err(record(path, i + 1, format!("not JSON: {e}"))),
        })
}

fn read(path: &Path) -> Result<String, DatasetError> {
    let bytes = std::fs::read(path).map_err(|error| DatasetError::Read {
        path: path.display().to_string(),
        error,
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let bytes = e.as_bytes();
        let at = e.utf8_error().valid_up_to();
        let line_start = bytes[..at]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        DatasetError::NotUtf8 {
            path: path.display().to_string(),
            line: bytes[..at].iter().filter(|&&b| b == b'\n').count() + 1,
            column: at - line_start + 1,
        }
    })
}

/// A record over [`MAX_RECORD_BYTES`].
fn too_large(path: &Path, number: usize, bytes: usize) -> DatasetError {
    record(
        path,
        number,
        format!(
            "it is {:.1} MiB, over the {} MiB a record may be (a question of a real dataset is a \
             few KB)",
            bytes as f64 / f64::from(1 << 20),
            MAX_RECORD_BYTES >> 20
        ),
    )
}

fn record(path: &Path, record: usize, why: String) -> DatasetError {
    DatasetError::Record {
        path: path.display().to_string(),
        record,
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invalid UTF-8 is named with its line; a record of 2 MiB is refused
    /// (a 200 MB question was held and sent whole); an answer of 200,000
    /// digits is kept as its first 64.
    #[test]
    fn bad_and_oversized_records_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        let good = "{\"question\": \"What is 2 + 3?\", \"answer\": \"#### 5\"}\n";
        let mut bytes = good.repeat(2).into_bytes();
        bytes.extend_from_slice(b"{\"question\": \"caf\xe9\", \"answer\": \"#### 1\"}\n");
        std::fs::write(&path, &bytes).unwrap();
        let err = EvalSet::gsm8k(&path, None, 0).unwrap_err().to_string();
        assert!(
            err.ends_with(
                ": line 3 is not UTF-8 text (byte 18 of the line): save the file as UTF-8"
            ),
            "{err}"
        );
        let huge = format!(
            "{good}{{\"question\": \"{}\", \"answer\": \"#### 1\"}}\n",
            "x".repeat(2 << 20)
        );
        std::fs::write(&path, huge).unwrap();
        let err = EvalSet::gsm8k(&path, None, 0).unwrap_err().to_string();
        assert!(
            err.ends_with(": record 2: it is 2.0 MiB, over the 1 MiB a record may be (a question of a real dataset is a few KB)"),
            "{err}"
        );
        std::fs::write(&path, good).unwrap();
        let set = EvalSet::gsm8k(&path, None, 0).unwrap();
        let scored = set.score(
            set.question(0).unwrap(),
            &format!("#### {}", "9".repeat(200_000)),
        );
        assert!(!scored.correct);
        let kept = scored.extracted.unwrap();
        assert_eq!(kept, format!("{}…", "9".repeat(MAX_EXTRACTED_CHARS)));
    }

    #[test]
    fn reasoning_is_left_out() {
        assert_eq!(without_reasoning("<think>7</think>8"), "8");
        assert_eq!(
            without_reasoning("a<think>1</think>b<think>2</think>c"),
            "abc"
        );
        assert_eq!(without_reasoning("x<think>unclosed 9"), "x");
    }

    #[test]
    fn a_prompt_is_found_by_its_last_question_even_inside_a_template() {
        let dir = tempfile::tempdir().unwrap();
        let test = dir.path().join("test.jsonl");
        let train = dir.path().join("train.jsonl");
        std::fs::write(
            &test,
            "{\"question\": \"What is 2 + 3?\", \"answer\": \"2 + 3 = 5\\n#### 5\"}\n\
             {\"question\": \"What is 4 + 4?\", \"answer\": \"#### 8\"}\n",
        )
        .unwrap();
        std::fs::write(
            &train,
            "{\"question\": \"What is 1 + 1?\", \"answer\": \"1 + 1 = 2\\n#### 2\"}\n",
        )
        .unwrap();
        let set = EvalSet::gsm8k(&test, Some(&train), 1).unwrap();
        let second = set.question(1).unwrap();
        assert!(
            second
                .prompt
                .starts_with("Question: What is 1 + 1?\nAnswer: 1 + 1 = 2")
        );
        let templated = format!("<|user|>\n{}<|end|>\n<|assistant|>\n", second.prompt);
        assert_eq!(set.find(&templated), Some(second));
        assert_eq!(set.find("Question: What is 9 + 9?\nAnswer:"), None);
        assert_eq!(set.find("no question"), None);
        assert_eq!(set.expected_in(&templated).as_deref(), Some("8"));
        let right = set.reply("8", true);
        assert!(set.score(second, &right).correct);
        let wrong = set.reply("8", false);
        assert_eq!(
            set.score(second, &wrong),
            Scored {
                extracted: Some("9".into()),
                correct: false
            }
        );
    }
}
