//! Prompt text generators: `synthetic` (random words), `faker` (varied
//! prose), `corpus` (sliding windows over real text), the eval datasets'
//! questions (`gsm8k`, `gpqa`: see `nyann_datasets`), and ShareGPT's
//! recorded conversations replayed (`sharegpt`: the human turns as they
//! are, each request's `max_tokens` the recorded reply's length).
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

use nyann_datasets::{DatasetError, EvalSet, Exchange, Limits, Question, Selected, ShareGpt};
use nyann_model::{Workload, WorkloadType};
use rand::{SeedableRng, rngs::SmallRng, seq::IndexedRandom, seq::SliceRandom};

use self::corpus::load_corpus;
use self::faker::sentence;
use self::words::WORDS;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("workload `corpus` needs `corpus_path` (a text file or a directory of text files)")]
    NoCorpusPath,
    #[error("a dataset workload (`gsm8k`, `gpqa`, `sharegpt`) needs `path` (the dataset file)")]
    NoDatasetPath,
    /// (Not a `source`: a printed error chain says it once.)
    #[error("dataset {0}")]
    Dataset(DatasetError),
    /// A fleet's worker whose chunk of a dataset is empty.
    #[error(
        "dataset {path}: {items} {what} for {workers} workers leave worker {worker} none: use fewer workers or a larger file"
    )]
    NoShare {
        path: String,
        items: usize,
        /// What the dataset's items are: "questions", "conversations".
        what: &'static str,
        workers: usize,
        worker: usize,
    },
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

impl From<DatasetError> for WorkloadError {
    fn from(error: DatasetError) -> Self {
        WorkloadError::Dataset(error)
    }
}

/// Which part of an eval dataset this process asks. A fleet shuffles the
/// dataset once, with the leader's seed (so every worker sees the same
/// order and the same GPQA letters), and gives each worker a contiguous
/// chunk of it, the first `len % workers` chunks one question longer (as
/// counts are divided), so that each question is asked once per pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DatasetShare {
    /// The seed the dataset is shuffled with: the fleet's.
    pub seed: u64,
    /// This worker's position, 0-based.
    pub worker: usize,
    /// How many workers share the dataset.
    pub workers: usize,
}

impl DatasetShare {
    /// The whole dataset, shuffled with `seed`: a run of one process.
    pub fn whole(seed: u64) -> DatasetShare {
        DatasetShare {
            seed,
            worker: 0,
            workers: 1,
        }
    }

    /// This worker's chunk of `len` positions.
    fn chunk(&self, len: usize) -> std::ops::Range<usize> {
        let workers = self.workers.max(1);
        let (size, extra) = (len / workers, len % workers);
        let start = self.worker * size + self.worker.min(extra);
        let end = start + size + usize::from(self.worker < extra);
        start.min(len)..end.min(len)
    }

    /// This worker's part of `items`: its chunk of them shuffled with the
    /// share's seed.
    fn pick<T>(&self, mut items: Vec<T>) -> Vec<T> {
        items.shuffle(&mut SmallRng::seed_from_u64(self.seed));
        let chunk = self.chunk(items.len());
        items.truncate(chunk.end);
        items.drain(..chunk.start);
        items
    }

    /// The error of a worker whose chunk of `items` `what` is empty.
    fn left_none(&self, path: &str, items: usize, what: &'static str) -> WorkloadError {
        WorkloadError::NoShare {
            path: path.to_string(),
            items,
            what,
            workers: self.workers,
            worker: self.worker,
        }
    }
}

/// What conversation `conversation` takes of this process's `order`:
/// consecutive ids (counted from the worker's first, the low 40 bits) go
/// through it, starting over after its last.
fn nth<T>(order: &[T], conversation: u64) -> Option<&T> {
    let local = (conversation & ((1 << 40) - 1)) as usize;
    order.get(local.checked_rem(order.len())?)
}

/// Which pass through `order` conversation `conversation` belongs to: 0
/// the first, 1 the first repeat, ...
fn pass<T>(order: &[T], conversation: u64) -> Option<u64> {
    let local = conversation & ((1 << 40) - 1);
    local.checked_div(order.len() as u64)
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
    /// ShareGPT's conversations replayed.
    Replay(Replay),
}

/// A ShareGPT file replayed: its conversations that fit the length limits
/// once tokens are counted ([`PromptGen::calibrated`]), in an order
/// shuffled with the share's seed, this process's chunk of them.
#[derive(Debug, Clone)]
struct Replay {
    set: Arc<ShareGpt>,
    share: DatasetShare,
    max_isl: u32,
    max_osl: u32,
    /// Bytes per token; 0 until calibrated.
    chars_per_token: f64,
    /// This process's conversations, in the order they are sent (empty
    /// until calibrated).
    order: Vec<Selected>,
}

impl Replay {
    /// Conversation `conversation`'s pick, and its exchange of `turn`
    /// (from 1; a turn beyond the conversation's repeats its last ones).
    fn exchange(&self, conversation: u64, turn: u32) -> Option<(&Selected, &Exchange)> {
        let picked = nth(&self.order, conversation)?;
        let chat = self.set.chat(picked.index)?;
        let index = (turn.saturating_sub(1) % picked.turns.max(1)) as usize;
        Some((picked, chat.exchanges.get(index)?))
    }
}

impl PromptGen {
    /// Builds the generator; a corpus is read (and normalised) once here.
    /// `seed` varies the generated text; an eval dataset is ordered and
    /// divided by `share` instead.
    pub fn new(workload: &Workload, seed: u64, share: DatasetShare) -> Result<Self, WorkloadError> {
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
                    EvalSet::gpqa(Path::new(path), share.seed)
                }?;
                let order = share.pick((0..set.len()).collect());
                if order.is_empty() {
                    return Err(share.left_none(path, set.len(), "questions"));
                }
                Kind::Eval {
                    set: Arc::new(set),
                    order,
                }
            }
            WorkloadType::ShareGpt => {
                let path = workload
                    .path
                    .as_deref()
                    .ok_or(WorkloadError::NoDatasetPath)?;
                let set = ShareGpt::load(Path::new(path), workload.turns.max(1) as usize)?;
                Kind::Replay(Replay {
                    set: Arc::new(set),
                    share,
                    max_isl: workload.max_isl,
                    max_osl: workload.max_osl,
                    chars_per_token: 0.0,
                    order: Vec::new(),
                })
            }
        };
        Ok(PromptGen { kind, seed })
    }

    /// Whether lengths in tokens decide what this workload sends (a
    /// ShareGPT replay: [`PromptGen::calibrated`] must be called).
    pub fn needs_calibration(&self) -> bool {
        matches!(self.kind, Kind::Replay(_))
    }

    /// This generator once tokens count `chars_per_token` bytes: a ShareGPT
    /// replay keeps the conversations that fit its length limits, shuffles
    /// them with its share's seed and keeps its share's chunk (nothing
    /// left is an error that says why); any other workload is as it was.
    pub fn calibrated(&self, chars_per_token: f64) -> Result<PromptGen, WorkloadError> {
        let Kind::Replay(replay) = &self.kind else {
            return Ok(self.clone());
        };
        let limits = Limits {
            chars_per_token,
            max_isl: replay.max_isl,
            max_osl: replay.max_osl,
        };
        let selection = replay.set.select(&limits)?;
        let order = replay.share.pick(selection.kept.clone());
        if order.is_empty() {
            return Err(replay.share.left_none(
                replay.set.path(),
                selection.kept.len(),
                "conversations",
            ));
        }
        let dropped = selection.dropped.values().sum::<usize>();
        tracing::info!(
            "ShareGPT {}: {} records, {} conversations replayed{}{}, max_tokens at {chars_per_token:.3} characters per token",
            replay.set.path(),
            replay.set.records(),
            selection.kept.len(),
            if dropped > 0 {
                format!(" ({dropped} left out: {})", selection.dropped_text())
            } else {
                String::new()
            },
            if replay.share.workers > 1 {
                format!(", {} of them by this worker", order.len())
            } else {
                String::new()
            },
        );
        Ok(PromptGen {
            kind: Kind::Replay(Replay {
                chars_per_token,
                order,
                ..replay.clone()
            }),
            seed: self.seed,
        })
    }

    /// The text characters per token are measured on: the dataset's own
    /// for a ShareGPT replay, else a prompt of 8000 characters.
    pub fn calibration_text(&self) -> String {
        match &self.kind {
            Kind::Replay(replay) => replay.set.calibration_text(8000),
            _ => self.text(u64::MAX, 1, 8000),
        }
    }

    /// A ShareGPT replay's `max_tokens` for this conversation and turn:
    /// the recorded reply's length in tokens (`None`: not a replay).
    pub fn max_tokens(&self, conversation: u64, turn: u32) -> Option<u32> {
        let Kind::Replay(replay) = &self.kind else {
            return None;
        };
        let (_, exchange) = replay.exchange(conversation, turn)?;
        Some(nyann_datasets::tokens(
            exchange.reply_bytes,
            replay.chars_per_token,
        ))
    }

    /// How many turns this conversation has in a ShareGPT replay (its
    /// exchanges that fit, up to the workload's `turns`; `None`: not a
    /// replay).
    pub fn turns(&self, conversation: u64) -> Option<u32> {
        let Kind::Replay(replay) = &self.kind else {
            return None;
        };
        replay
            .exchange(conversation, 1)
            .map(|(picked, _)| picked.turns)
    }

    /// For a ShareGPT replay, which pass through this process's
    /// conversations `conversation` is: 0 the first time each is sent, 1
    /// when they ran out and start over, ... (`None`: not a replay).
    pub fn pass(&self, conversation: u64) -> Option<u64> {
        match &self.kind {
            Kind::Replay(replay) => pass(&replay.order, conversation),
            _ => None,
        }
    }

    /// How many conversations this process replays per pass (`None`: not
    /// a ShareGPT replay).
    pub fn conversations(&self) -> Option<usize> {
        match &self.kind {
            Kind::Replay(replay) => Some(replay.order.len()),
            _ => None,
        }
    }

    /// The eval dataset this workload asks, if it is one.
    pub fn eval_set(&self) -> Option<&EvalSet> {
        match &self.kind {
            Kind::Eval { set, .. } => Some(set),
            _ => None,
        }
    }

    /// How many questions this process asks per pass over its share of
    /// the eval dataset (`None`: not an eval workload).
    pub fn eval_questions(&self) -> Option<usize> {
        match &self.kind {
            Kind::Eval { order, .. } => Some(order.len()),
            _ => None,
        }
    }

    /// The question conversation `conversation` asks (an eval workload's):
    /// consecutive conversations go through this process's share of the
    /// shuffled dataset, each question once per pass.
    pub fn question(&self, conversation: u64) -> Option<&Question> {
        let Kind::Eval { set, order } = &self.kind else {
            return None;
        };
        set.question(*nth(order, conversation)?)
    }

    /// Exactly `chars` characters of prompt text for this conversation and
    /// turn; an eval workload's question, a ShareGPT conversation's human
    /// turn, as it is, whatever its length.
    pub fn text(&self, conversation: u64, turn: u32, chars: usize) -> String {
        if let Some(question) = self.question(conversation) {
            return question.prompt.clone();
        }
        if let Kind::Replay(replay) = &self.kind {
            // Only an uncalibrated replay has no conversation.
            return replay
                .exchange(conversation, turn)
                .map(|(_, exchange)| exchange.prompt.clone())
                .unwrap_or_default();
        }
        let mut rng = SmallRng::seed_from_u64(mix(self.seed, conversation, turn));
        let mut out = String::with_capacity(chars + 64);
        match &self.kind {
            // Only an empty dataset has no question (a loaded one never is).
            Kind::Eval { .. } | Kind::Replay(_) => {}
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
            let g = PromptGen::new(&workload(kind), 42, DatasetShare::whole(42)).unwrap();
            for chars in [0, 1, 7, 100, 5000] {
                let t = g.text(3, 1, chars);
                assert_eq!(t.len(), chars, "{kind:?}");
                assert_eq!(t, g.text(3, 1, chars));
            }
            assert_ne!(g.text(3, 1, 200), g.text(4, 1, 200), "conversations differ");
            assert_ne!(g.text(3, 1, 200), g.text(3, 2, 200), "turns differ");
            let other_seed = PromptGen::new(&workload(kind), 43, DatasetShare::whole(43)).unwrap();
            assert_ne!(g.text(3, 1, 200), other_seed.text(3, 1, 200));
        }
    }

    #[test]
    fn a_fleet_asks_each_question_once_in_contiguous_chunks() {
        for (len, workers) in [(10, 3), (7, 7), (3, 5), (200, 2), (0, 2)] {
            let chunks: Vec<_> = (0..workers)
                .map(|worker| {
                    DatasetShare {
                        seed: 9,
                        worker,
                        workers,
                    }
                    .chunk(len)
                })
                .collect();
            // Consecutive, covering 0..len, sizes as counts are divided.
            assert_eq!(chunks.first().map(|c| c.start), Some(0));
            assert_eq!(chunks.last().map(|c| c.end), Some(len));
            for pair in chunks.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "{len}/{workers}");
                assert!(pair[0].len() >= pair[1].len());
            }
        }
    }

    #[test]
    fn fleet_workers_ask_disjoint_questions_of_one_shuffle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("test.jsonl");
        let mut text = String::new();
        for i in 0..25 {
            text.push_str(&format!(
                "{{\"question\": \"What is {i} plus 0?\", \"answer\": \"#### {i}\"}}\n"
            ));
        }
        std::fs::write(&path, text).unwrap();
        let workload = Workload {
            kind: WorkloadType::Gsm8k,
            path: Some(path.display().to_string()),
            ..Workload::default()
        };
        let asked = |share: DatasetShare, seed: u64| {
            let g = PromptGen::new(&workload, seed, share).unwrap();
            let n = g.eval_questions().unwrap() as u64;
            (0..n)
                .map(|c| g.question(c).unwrap().expected.clone())
                .collect::<Vec<_>>()
        };
        let whole = asked(DatasetShare::whole(5), 5);
        // Workers have seeds of their own; the share's seed orders the set.
        let parts: Vec<Vec<String>> = (0..3)
            .map(|worker| {
                let share = DatasetShare {
                    seed: 5,
                    worker,
                    workers: 3,
                };
                asked(share, 100 + worker as u64)
            })
            .collect();
        assert_eq!(parts.iter().map(Vec::len).collect::<Vec<_>>(), [9, 8, 8]);
        assert_eq!(parts.concat(), whole, "the chunks of the one shuffle");
        let mut sorted = whole.clone();
        sorted.sort_by_key(|n| n.parse::<u32>().unwrap());
        assert_eq!(sorted, (0..25).map(|i| i.to_string()).collect::<Vec<_>>());
        assert_ne!(whole, sorted[..].to_vec(), "shuffled");
        // More workers than questions: one is left none, and says so
        // rather than sending prompts with no question in them.
        let share = DatasetShare {
            seed: 5,
            worker: 29,
            workers: 30,
        };
        let err = PromptGen::new(&workload, 1, share).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "test.jsonl: 25 questions for 30 workers leave worker 29 none: use fewer workers or a larger file"
            ),
            "{err}"
        );
    }

    /// The message of a dataset error is said once by a printed chain
    /// (`error: A: B`, as the binary prints them).
    #[test]
    fn a_dataset_error_is_said_once() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "[{\"conversations\": [{\"from\": \"gpt\"}]}]").unwrap();
        for (kind, path) in [
            (WorkloadType::ShareGpt, bad.clone()),
            (WorkloadType::Gsm8k, dir.path().join("missing.jsonl")),
        ] {
            let workload = Workload {
                kind,
                path: Some(path.display().to_string()),
                ..Workload::default()
            };
            let err = PromptGen::new(&workload, 1, DatasetShare::whole(1)).unwrap_err();
            let mut chain = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(s) = source {
                chain.push_str(&format!(": {s}"));
                source = s.source();
            }
            let file = path.display().to_string();
            assert_eq!(chain.matches(&file).count(), 1, "{chain}");
            assert!(chain.starts_with("dataset "), "{chain}");
        }
    }

    #[test]
    fn fleet_workers_replay_disjoint_chunks_of_one_shuffle() {
        use nyann_testkit::datasets::{Spelling, sharegpt_chats, write_sharegpt_json};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sharegpt.json");
        let chats = sharegpt_chats(25, 2);
        write_sharegpt_json(&path, &chats, Spelling::ShareGpt);
        let replay = Workload {
            kind: WorkloadType::ShareGpt,
            path: Some(path.display().to_string()),
            turns: 2,
            ..Workload::default()
        };
        let loaded = PromptGen::new(&replay, 5, DatasetShare::whole(5)).unwrap();
        assert!(loaded.needs_calibration());
        assert_eq!(loaded.text(0, 1, 10), "", "nothing before calibration");
        let replayed = |share: DatasetShare, seed: u64| {
            let g = PromptGen::new(&replay, seed, share)
                .unwrap()
                .calibrated(4.0)
                .unwrap();
            let n = g.conversations().unwrap() as u64;
            (0..n)
                .map(|c| {
                    let first = g.text(c, 1, 0);
                    let chat = chats
                        .iter()
                        .find(|chat| chat.turns[0].prompt == first)
                        .unwrap();
                    // The same conversation's second turn, and the lengths.
                    assert_eq!(g.text(c, 2, 0), chat.turns[1].prompt);
                    assert_eq!(g.turns(c), Some(2));
                    assert_eq!(g.max_tokens(c, 1), Some(chat.turns[0].reply_tokens));
                    assert_eq!(g.max_tokens(c, 2), Some(chat.turns[1].reply_tokens));
                    chat.id.clone()
                })
                .collect::<Vec<_>>()
        };
        let whole = replayed(DatasetShare::whole(5), 5);
        let parts: Vec<Vec<String>> = (0..3)
            .map(|worker| {
                let share = DatasetShare {
                    seed: 5,
                    worker,
                    workers: 3,
                };
                replayed(share, 100 + worker as u64)
            })
            .collect();
        assert_eq!(parts.iter().map(Vec::len).collect::<Vec<_>>(), [9, 8, 8]);
        assert_eq!(parts.concat(), whole, "the chunks of the one shuffle");
        let in_file: Vec<String> = chats.iter().map(|c| c.id.clone()).collect();
        let mut sorted = whole.clone();
        sorted.sort_by_key(|id| in_file.iter().position(|f| f == id));
        assert_eq!(sorted, in_file, "each conversation once");
        assert_ne!(whole, in_file, "shuffled");
        let other_seed = replayed(DatasetShare::whole(6), 6);
        assert_ne!(whole, other_seed, "the seed orders the replay");
        // Other workloads are as they were.
        let faker =
            PromptGen::new(&workload(WorkloadType::Faker), 1, DatasetShare::whole(1)).unwrap();
        assert!(!faker.needs_calibration());
        assert_eq!(faker.max_tokens(0, 1), None);
        assert_eq!(
            faker.calibrated(3.0).unwrap().text(2, 1, 50),
            faker.text(2, 1, 50)
        );
    }
}
