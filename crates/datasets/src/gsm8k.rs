//! GSM8K: JSONL of `question` and `answer` (worked solution ending
//! `#### N`); a reply's answer is the number after its `####`, else its
//! last number.

use std::path::Path;

use crate::{DatasetError, MARKER, Question, jsonl, numbers, read, record, without_reasoning};

/// One worked example: question and full answer.
struct Example {
    question: String,
    answer: String,
}

fn examples(path: &Path) -> Result<Vec<Example>, DatasetError> {
    let text = read(path)?;
    let mut out = Vec::new();
    for item in jsonl(path, &text) {
        let (line, map) = item?;
        let field = |name: &str| match map.get(name) {
            Some(serde_json::Value::String(s)) => Ok(s.clone()),
            _ => Err(record(
                path,
                line,
                format!("needs a string field {name:?} (GSM8K: question, answer)"),
            )),
        };
        out.push(Example {
            question: field("question")?,
            answer: field("answer")?,
        });
    }
    if out.is_empty() {
        return Err(DatasetError::Empty {
            path: path.display().to_string(),
            expected: "GSM8K: one JSON object per line with question and answer",
        });
    }
    Ok(out)
}

pub(crate) fn load(
    path: &Path,
    train: Option<&Path>,
    fewshot: usize,
) -> Result<Vec<Question>, DatasetError> {
    let mut prefix = String::new();
    if fewshot > 0 {
        let Some(train) = train else {
            return Err(DatasetError::Empty {
                path: path.display().to_string(),
                expected: "few-shot examples need train_path (a GSM8K train file)",
            });
        };
        for example in examples(train)?.iter().take(fewshot) {
            prefix.push_str(&format!(
                "{MARKER}{}\nAnswer: {}\n\n",
                example.question, example.answer
            ));
        }
    }
    examples(path)?
        .into_iter()
        .enumerate()
        .map(|(i, example)| {
            let expected = example
                .answer
                .rsplit_once("####")
                .and_then(|(_, n)| numbers::normalise(n))
                .ok_or_else(|| {
                    record(
                        path,
                        i + 1,
                        "its answer does not end with `#### NUMBER`".into(),
                    )
                })?;
            Ok(Question {
                prompt: format!("{prefix}{MARKER}{}\nAnswer:", example.question),
                correct: expected.clone(),
                expected,
            })
        })
        .collect()
}

/// The answer of a GSM8K reply: the number after the last `####`, else the
/// last number in it (reasoning in `<think>` blocks left out); `None` when
/// it has no number.
pub fn extract_number(reply: &str) -> Option<String> {
    let reply = without_reasoning(reply);
    if let Some((_, after)) = reply.rsplit_once("####")
        && let Some(first) = numbers::all(after).into_iter().next()
    {
        return Some(first);
    }
    numbers::all(&reply).pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_of_a_reply() {
        let cases = [
            ("Step 1: 3 + 4 = 7\n#### 7", Some("7")),
            ("#### $1,200.00", Some("1200")),
            ("She has 12 apples, gives 5, so 7 left.", Some("7")),
            ("The answer is -3.", Some("-3")),
            ("So 2.50 dollars.", Some("2.5")),
            ("<think>maybe 40, or 41</think>The answer is 42", Some("42")),
            ("#### 18 (from 9 * 2)", Some("18")),
            ("I cannot tell.", None),
            ("<think>12</think>no idea", None),
        ];
        for (reply, expected) in cases {
            assert_eq!(extract_number(reply).as_deref(), expected, "{reply:?}");
        }
    }

    #[test]
    fn a_test_answer_without_its_number_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, "{\"question\": \"q\", \"answer\": \"#### 1\"}\n{\"question\": \"q2\", \"answer\": \"no number\"}\n").unwrap();
        let err = load(&path, None, 0).unwrap_err().to_string();
        assert!(
            err.ends_with("record 2: its answer does not end with `#### NUMBER`"),
            "{err}"
        );
        let err = load(&path, None, 5).unwrap_err().to_string();
        assert!(err.contains("few-shot examples need train_path"), "{err}");
    }
}
