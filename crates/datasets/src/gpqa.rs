//! GPQA: four-choice questions (its CSV, or JSONL with the same columns);
//! the choices are shuffled with the run's seed and the letter of the
//! correct one kept. A reply's answer is the letter it chose.

use std::path::Path;

use crate::{DatasetError, MARKER, Question, jsonl, read, record, without_reasoning};

pub(crate) const LETTERS: [&str; 4] = ["A", "B", "C", "D"];
const COLUMNS: [&str; 5] = [
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
];

/// The five columns of each record, in [`COLUMNS`]' order.
fn rows(path: &Path) -> Result<Vec<[String; 5]>, DatasetError> {
    let text = read(path)?;
    let csv = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"));
    let mut out = Vec::new();
    if csv {
        let mut reader = csv::Reader::from_reader(text.as_bytes());
        let headers = reader
            .headers()
            .map_err(|e| record(path, 0, format!("not CSV: {e}")))?
            .clone();
        let at: Vec<usize> = COLUMNS
            .iter()
            .map(|name| {
                headers
                    .iter()
                    .position(|h| h.trim() == *name)
                    .ok_or_else(|| {
                        record(
                            path,
                            0,
                            format!("no column {name:?} (GPQA: {})", COLUMNS.join(", ")),
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        for (i, row) in reader.records().enumerate() {
            let row = row.map_err(|e| record(path, i + 1, format!("not CSV: {e}")))?;
            let bytes = row.as_slice().len();
            if bytes > crate::MAX_RECORD_BYTES {
                return Err(crate::too_large(path, i + 1, bytes));
            }
            let fields: Vec<String> = at
                .iter()
                .map(|&c| row.get(c).unwrap_or_default().trim().to_string())
                .collect();
            out.push(fields.try_into().unwrap_or_default());
        }
    } else {
        for item in jsonl(path, &text) {
            let (line, map) = item?;
            let mut fields = Vec::with_capacity(5);
            for name in COLUMNS {
                match map.get(name) {
                    Some(serde_json::Value::String(s)) => fields.push(s.trim().to_string()),
                    _ => {
                        return Err(record(
                            path,
                            line,
                            format!(
                                "needs a string field {name:?} (GPQA: {})",
                                COLUMNS.join(", ")
                            ),
                        ));
                    }
                }
            }
            out.push(fields.try_into().unwrap_or_default());
        }
    }
    if out.is_empty() {
        return Err(DatasetError::Empty {
            path: path.display().to_string(),
            expected: "GPQA: a CSV or JSONL with a question and four answers per record",
        });
    }
    Ok(out)
}

pub(crate) fn load(path: &Path, seed: u64) -> Result<Vec<Question>, DatasetError> {
    Ok(rows(path)?
        .into_iter()
        .enumerate()
        .map(|(i, [question, correct, wrong1, wrong2, wrong3])| {
            let correct_text = correct.clone();
            let mut choices = [
                (correct, true),
                (wrong1, false),
                (wrong2, false),
                (wrong3, false),
            ];
            shuffle(
                &mut choices,
                seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
            let mut prompt = format!("{MARKER}{question}\n");
            let mut expected = String::new();
            for (letter, (text, right)) in LETTERS.iter().zip(&choices) {
                prompt.push_str(&format!("{letter}) {text}\n"));
                if *right {
                    expected = (*letter).to_string();
                }
            }
            prompt.push_str(
                "Answer with the letter of the correct choice, as `Answer: X` on the last line.",
            );
            Question {
                prompt,
                expected,
                correct: correct_text,
            }
        })
        .collect())
}

/// Fisher-Yates with a splitmix64 stream from `seed`.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    let mut next = || {
        seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in (1..items.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

/// The letter a GPQA reply chose: the last `Answer: X` (or `answer is
/// (X)`), else the last `(X)`, else a lone letter ending the reply;
/// reasoning in `<think>` blocks left out. `None` when it chose none.
pub fn extract_letter(reply: &str) -> Option<&'static str> {
    let reply = without_reasoning(reply);
    let lower = reply.to_ascii_lowercase();
    let letter_at = |text: &str| -> Option<&'static str> {
        let text = text.trim_start_matches([' ', ':', '(', '*', '$', '{']);
        let text = text
            .strip_prefix("is")
            .map_or(text, |t| t.trim_start_matches([' ', ':', '(', '*']));
        let first = text.chars().next()?;
        let after = text[first.len_utf8()..].chars().next();
        let alone = after.is_none_or(|c| !c.is_ascii_alphanumeric());
        LETTERS
            .iter()
            .find(|l| l.starts_with(first.to_ascii_uppercase()) && first.is_ascii_alphabetic())
            .copied()
            .filter(|_| alone)
    };
    if let Some(found) = lower
        .rmatch_indices("answer")
        .find_map(|(at, word)| letter_at(&reply[at + word.len()..]))
    {
        return Some(found);
    }
    if let Some(found) = reply.rmatch_indices('(').find_map(|(at, _)| {
        let inside = reply[at + 1..].split(')').next()?;
        LETTERS.iter().find(|l| inside.trim() == **l).copied()
    }) {
        return Some(found);
    }
    let last = reply.trim_end().trim_end_matches(['.', ')', '*']);
    let word = last
        .rsplit(|c: char| c.is_whitespace() || c == '(')
        .next()?;
    LETTERS.iter().find(|l| word == **l).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_letter_a_reply_chose() {
        let cases = [
            ("Let me think. Answer: C", Some("C")),
            ("answer: b", Some("B")),
            ("The answer is (D).", Some("D")),
            ("**Answer:** A", Some("A")),
            ("Both (A) and (B) look wrong, so (C)", Some("C")),
            ("I pick\nB", Some("B")),
            ("<think>Answer: A? no</think>Answer: D", Some("D")),
            ("A nice question. I am not sure.", None),
            ("Answer: none of them", None),
        ];
        for (reply, expected) in cases {
            assert_eq!(extract_letter(reply), expected, "{reply:?}");
        }
    }

    #[test]
    fn choices_are_shuffled_with_the_seed_and_the_letter_follows_the_correct_one() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("gpqa.csv");
        std::fs::write(
            &csv,
            "Pre-Revision Question,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n\
             x,\"Which is right,\nreally?\",right,w1,w2,w3\n",
        )
        .unwrap();
        let letters: std::collections::BTreeSet<String> = (0..16)
            .map(|seed| {
                let q = &load(&csv, seed).unwrap()[0];
                let line = q
                    .prompt
                    .lines()
                    .find(|l| l.ends_with(") right"))
                    .unwrap()
                    .to_string();
                assert!(line.starts_with(&q.expected), "{q:?}");
                assert!(q.prompt.starts_with("Question: Which is right,\nreally?\n"));
                q.expected.clone()
            })
            .collect();
        assert!(letters.len() > 1, "the correct answer moves with the seed");
        // Whoever shuffled, the expected letter is read from the prompt.
        let set = crate::EvalSet::gpqa(&csv, 99).unwrap();
        for seed in 0..8 {
            let asked = &load(&csv, seed).unwrap()[0];
            assert_eq!(set.expected_in(&asked.prompt), Some(asked.expected.clone()));
        }
        assert_eq!(load(&csv, 3).unwrap(), load(&csv, 3).unwrap());

        let jsonl = dir.path().join("gpqa.jsonl");
        std::fs::write(&jsonl, "{\"Question\": \"q\", \"Correct Answer\": \"r\"}\n").unwrap();
        let err = load(&jsonl, 1).unwrap_err().to_string();
        assert!(
            err.contains("record 1: needs a string field \"Incorrect Answer 1\""),
            "{err}"
        );
    }
}
