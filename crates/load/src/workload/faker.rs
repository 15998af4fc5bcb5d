//! The `faker` workload's sentences: a few sentence shapes filled with
//! words drawn from the lists in `words`, capitalised and punctuated.

use rand::{Rng, rngs::SmallRng, seq::IndexedRandom};

use super::push_word;
use super::words::*;

pub(super) fn sentence(rng: &mut SmallRng, out: &mut String) {
    let pick = |rng: &mut SmallRng, list: &[&'static str]| list.choose(rng).copied().unwrap_or("");
    let start = out.len();
    match rng.random_range(0..5u8) {
        0 => {
            out.push_str(pick(rng, DETERMINERS));
            push_word(out, pick(rng, ADJECTIVES));
            push_word(out, pick(rng, NOUNS));
            push_word(out, pick(rng, VERBS));
            push_word(out, pick(rng, DETERMINERS));
            push_word(out, pick(rng, NOUNS));
            push_word(out, pick(rng, PLACES));
        }
        1 => {
            out.push_str(pick(rng, OPENERS));
            push_word(out, pick(rng, DETERMINERS));
            push_word(out, pick(rng, NOUNS));
            push_word(out, pick(rng, VERBS));
            push_word(out, pick(rng, ADVERBS));
        }
        2 => {
            out.push_str(pick(rng, NAMES));
            push_word(out, pick(rng, VERBS));
            push_word(out, pick(rng, DETERMINERS));
            push_word(out, pick(rng, ADJECTIVES));
            push_word(out, pick(rng, NOUNS));
            out.push_str(", and");
            push_word(out, pick(rng, DETERMINERS));
            push_word(out, pick(rng, NOUNS));
            push_word(out, pick(rng, VERBS));
            push_word(out, pick(rng, ADVERBS));
        }
        3 => {
            out.push_str("Why does");
            push_word(out, pick(rng, DETERMINERS));
            push_word(out, pick(rng, NOUNS));
            push_word(out, "keep");
            push_word(out, pick(rng, GERUNDS));
            push_word(out, pick(rng, PLACES));
            out.push('?');
            return capitalise(out, start);
        }
        _ => {
            out.push_str(pick(rng, NAMES));
            push_word(out, "said that");
            push_word(out, pick(rng, DETERMINERS));
            push_word(out, pick(rng, NOUNS));
            push_word(out, "was");
            push_word(out, pick(rng, ADJECTIVES));
            push_word(out, pick(rng, PLACES));
        }
    }
    out.push('.');
    capitalise(out, start);
}

fn capitalise(out: &mut String, start: usize) {
    if let Some(c) = out[start..].chars().next()
        && c.is_ascii_lowercase()
    {
        out.replace_range(start..start + 1, &c.to_ascii_uppercase().to_string());
    }
}

#[cfg(test)]
mod tests {
    use crate::workload::{DatasetShare, PromptGen};
    use nyann_model::{Workload, WorkloadType};

    #[test]
    fn faker_reads_like_varied_prose() {
        let g = PromptGen::new(
            &Workload {
                kind: WorkloadType::Faker,
                ..Workload::default()
            },
            1,
            DatasetShare::whole(1),
        )
        .unwrap();
        let t = g.text(0, 1, 2000);
        let sentences: Vec<&str> = t.split_inclusive(['.', '?']).map(str::trim).collect();
        assert!(sentences.len() > 10);
        assert!(
            sentences.iter().filter(|s| s.len() > 3).all(|s| s
                .chars()
                .next()
                .unwrap()
                .is_uppercase())
        );
        let distinct: std::collections::HashSet<&str> = t.split_whitespace().collect();
        assert!(distinct.len() > 60, "{}", distinct.len());
    }
}
