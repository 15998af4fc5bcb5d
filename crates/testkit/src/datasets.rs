//! Small eval datasets in the real formats, made here (no dataset may be
//! downloaded or copied into the repository): arithmetic word problems as
//! GSM8K's JSONL, and four-choice questions as GPQA's CSV, each question's
//! first line unique.
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
