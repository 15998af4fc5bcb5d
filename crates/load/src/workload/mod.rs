//! Prompt text generators: `synthetic` (random words), `faker` (varied
//! prose), `corpus` (sliding windows over real text), and the eval
//! datasets' questions (`gsm8k`, `gpqa`: see `nyann_datasets`).
//!
//! Every prompt is a pure function of (seed, conversation, turn, length), so a
//! run with `--seed` sends the same prompts again, and different
//! conversations never share a prefix by accident (which would let a prefix
//! cache flatter the server). Lengths are in characters; the runner turns a
//! token target into characters with the calibrated characters per token.
//!
//! `corpus` reads the corpus, `faker` writes the sentences, `words` holds
//! the vocabulary of the synthetic and faker texts.

mod corpus;
mod faker;
mod words;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nyann_datasets::{DatasetError, EvalSet, Question};
use nyann_model::{Workload, WorkloadType};
use rand::{SeedableRng, rngs::SmallRng, seq::IndexedRandom, seq::SliceRandom};

use self::corpus::load_corpus;
use self::faker::sentence;
use self::words::WORDS;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("workload `corpus` needs `corpus_path` (a text file or a directory of text files)")]
    NoCorpusPath,
    #[error("an eval workload (`gsm8k`, `gpqa`) needs `path` (the dataset file)")]
    NoDatasetPath,
    #[error("eval dataset {0}")]
    Dataset(#[from] DatasetError),
    #[error("cannot read corpus {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("corpus {0} is neither a regular file nor a directory (a FIFO or a device?)")]
    NotAFile(PathBuf),
    #[error("corpus {0} holds no text (no readable UTF-8 .txt/.md files, or all empty)")]
    Empty(PathBuf),
    #[error("corpus {path} is larger than {max} bytes: point corpus_path at a smaller file")]
    TooLarge { path: PathBuf, max: u64 },
}

/// Generates prompt text for one workload.
#[derive(Debug, Clone)]
pub struct PromptGen {
    kind: Kind,
    seed: u64,
}

#[derive(Debug, Clone)]
enum Kind {
    Synthetic,
    Faker,
    /// Whitespace-normalised corpus text.
    Corpus(Arc<str>),
    /// An eval dataset's questions, in an order shuffled with the seed.
    Eval {
        set: Arc<EvalSet>,
        order: Vec<usize>,
    },
}

impl PromptGen {
    /// Builds the generator; a corpus is read (and normalised) once here.
    pub fn new(workload: &Workload, seed: u64) -> Result<Self, WorkloadError> {
        let kind = match workload.kind {
            WorkloadType::Synthetic => Kind::Synthetic,
            WorkloadType::Faker => Kind::Faker,
            WorkloadType::Corpus => {
                let path = workload
                    .corpus_path
                    .as_deref()
                    .ok_or(WorkloadError::NoCorpusPath)?;
                Kind::Corpus(load_corpus(Path::new(path))?)
            }
            WorkloadType::Gsm8k | WorkloadType::Gpqa => {
                let path = workload
                    .path
                    .as_deref()
                    .ok_or(WorkloadError::NoDatasetPath)?;
                let set = if workload.kind == WorkloadType::Gsm8k {
                    EvalSet::gsm8k(
                        Path::new(path),
                        workload.train_path.as_deref().map(Path::new),
                        workload.fewshot as usize,
                    )
                } else {
                    EvalSet::gpqa(Path::new(path), seed)
                }?;
                let mut order: Vec<usize> = (0..set.len()).collect();
                order.shuffle(&mut SmallRng::seed_from_u64(seed));
                Kind::Eval {
                    set: Arc::new(set),
                    order,
                }
            }
        };
        Ok(PromptGen { kind, seed })
    }

    /// The eval dataset this workload asks, if it is one.
    pub fn eval_set(&self) -> Option<&EvalSet> {
        match &self.kind {
            Kind::Eval { set, .. } => Some(set),
            _ => None,
        }
    }

    /// The question conversation `conversation` asks (an eval workload's):
    /// consecutive conversations go through the shuffled dataset, each
    /// question once per pass. Ids count from the worker's first id
    /// (the low 40 bits).
    pub fn question(&self, conversation: u64) -> Option<&Question> {
        let Kind::Eval { set, order } = &self.kind else {
            return None;
        };
        let local = (conversation & ((1 << 40) - 1)) as usize;
        let index = *order.get(local.checked_rem(order.len())?)?;
        set.question(index)
    }

    /// Exactly `chars` characters of prompt text for this conversation and
    /// turn; an eval workload's question as it is, whatever its length.
    pub fn text(&self, conversation: u64, turn: u32, chars: usize) -> String {
        if let Some(question) = self.question(conversation) {
            return question.prompt.clone();
        }
        let mut rng = SmallRng::seed_from_u64(mix(self.seed, conversation, turn));
        let mut out = String::with_capacity(chars + 64);
        match &self.kind {
            // Only an empty dataset has no question (a loaded one never is).
            Kind::Eval { .. } => {}
            Kind::Synthetic => {
                while out.len() < chars {
                    push_word(&mut out, WORDS.choose(&mut rng).copied().unwrap_or("token"));
                }
            }
            Kind::Faker => {
                while out.len() < chars {
                    if !out.is_empty() {
                        out.push(' ');
                    }
                    sentence(&mut rng, &mut out);
                }
            }
            Kind::Corpus(text) => {
                // Sliding windows: consecutive requests start a window further on.
                let step = (chars / 2).max(1) as u64;
                let index = conversation.wrapping_mul(31).wrapping_add(turn as u64);
                let len = text.len() as u64;
                let mut start = (index.wrapping_mul(step).wrapping_add(self.seed) % len) as usize;
                while !text.is_char_boundary(start) {
                    start += 1;
                }
                // Start at a word.
                if let Some(space) = text[start..].find(' ')
                    && space < 32
                {
                    start += space + 1;
                }
                let mut pos = start.min(text.len());
                while out.len() < chars {
                    let piece = &text[pos..];
                    let want = chars - out.len();
                    let take = floor_char_boundary(piece, want.min(piece.len()));
                    out.push_str(&piece[..take]);
                    pos += take;
                    if pos >= text.len() {
                        pos = 0;
                        out.push(' ');
                    }
                    if take == 0 && pos != 0 {
                        break;
                    }
                }
            }
        }
        truncate_chars(&mut out, chars);
        // Padding up (a multi-byte cut can leave it short).
        while out.len() < chars {
            out.push(' ');
        }
        out
    }
}

fn push_word(out: &mut String, word: &str) {
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(word);
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Cuts to at most `bytes` bytes on a character boundary.
fn truncate_chars(s: &mut String, bytes: usize) {
    if s.len() > bytes {
        let cut = floor_char_boundary(s, bytes);
        s.truncate(cut);
    }
}

/// A 64-bit mix of the run seed, conversation and turn (splitmix64 finaliser).
pub(crate) fn mix(seed: u64, conversation: u64, turn: u32) -> u64 {
    let mut z = seed ^ conversation.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((turn as u64) << 48);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(kind: WorkloadType) -> Workload {
        Workload {
            kind,
            ..Workload::default()
        }
    }

    #[test]
    fn exact_length_and_reproducible() {
        for kind in [WorkloadType::Synthetic, WorkloadType::Faker] {
            let g = PromptGen::new(&workload(kind), 42).unwrap();
            for chars in [0, 1, 7, 100, 5000] {
                let t = g.text(3, 1, chars);
                assert_eq!(t.len(), chars, "{kind:?}");
                assert_eq!(t, g.text(3, 1, chars));
            }
            assert_ne!(g.text(3, 1, 200), g.text(4, 1, 200), "conversations differ");
            assert_ne!(g.text(3, 1, 200), g.text(3, 2, 200), "turns differ");
            let other_seed = PromptGen::new(&workload(kind), 43).unwrap();
            assert_ne!(g.text(3, 1, 200), other_seed.text(3, 1, 200));
        }
    }
}
