//! Prompt text generators: `synthetic` (random words), `faker` (varied
//! prose) and `corpus` (sliding windows over real text).
//!
//! Every prompt is a pure function of (seed, conversation, turn, length), so a
//! run with `--seed` sends the same prompts again, and different
//! conversations never share a prefix by accident (which would let a prefix
//! cache flatter the server). Lengths are in characters; the runner turns a
//! token target into characters with the calibrated characters per token.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nyann_model::{Workload, WorkloadType};
use rand::{Rng, SeedableRng, rngs::SmallRng, seq::IndexedRandom};

/// Largest corpus read into memory.
const MAX_CORPUS_BYTES: u64 = 256 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("workload `corpus` needs `corpus_path` (a text file or a directory of text files)")]
    NoCorpusPath,
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
        };
        Ok(PromptGen { kind, seed })
    }

    /// Exactly `chars` characters of prompt text for this conversation and turn.
    pub fn text(&self, conversation: u64, turn: u32, chars: usize) -> String {
        let mut rng = SmallRng::seed_from_u64(mix(self.seed, conversation, turn));
        let mut out = String::with_capacity(chars + 64);
        match &self.kind {
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

fn load_corpus(path: &Path) -> Result<Arc<str>, WorkloadError> {
    let read_err = |error| WorkloadError::Read {
        path: path.to_owned(),
        error,
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    let mut files = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(read_err)? {
            let entry = entry.map_err(read_err)?;
            let p = entry.path();
            if p.is_file() {
                files.push(p);
            }
        }
        files.sort();
    } else if meta.is_file() {
        files.push(path.to_owned());
    } else {
        return Err(WorkloadError::NotAFile(path.to_owned()));
    }
    let mut text = String::new();
    let mut total = 0u64;
    for file in files {
        let read_err = |error| WorkloadError::Read {
            path: file.clone(),
            error,
        };
        // The limit is counted while reading: a file's metadata may not say
        // how much it holds.
        let mut bytes = Vec::new();
        std::fs::File::open(&file)
            .and_then(|f| f.take(MAX_CORPUS_BYTES - total + 1).read_to_end(&mut bytes))
            .map_err(read_err)?;
        total += bytes.len() as u64;
        if total > MAX_CORPUS_BYTES {
            return Err(WorkloadError::TooLarge {
                path: path.to_owned(),
                max: MAX_CORPUS_BYTES,
            });
        }
        // A directory may hold binaries: skip files that are not UTF-8 text.
        let Ok(content) = String::from_utf8(bytes) else {
            tracing::debug!("corpus: skipping {} (not UTF-8)", file.display());
            continue;
        };
        for word in content.split_whitespace() {
            push_word(&mut text, word);
        }
    }
    if text.is_empty() {
        return Err(WorkloadError::Empty(path.to_owned()));
    }
    Ok(Arc::from(text))
}

fn sentence(rng: &mut SmallRng, out: &mut String) {
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

const DETERMINERS: &[&str] = &[
    "the", "a", "every", "that", "one", "our", "their", "some", "this",
];
const ADJECTIVES: &[&str] = &[
    "quiet", "ancient", "restless", "bright", "careful", "hollow", "distant", "patient", "curious",
    "narrow", "golden", "stubborn", "gentle", "frozen", "crowded", "silver", "tired", "sudden",
    "modest", "wild", "polished", "fragile", "heavy", "honest", "late", "rusty", "vivid", "humble",
];
const NOUNS: &[&str] = &[
    "engineer",
    "river",
    "lantern",
    "committee",
    "harbor",
    "notebook",
    "garden",
    "compiler",
    "village",
    "mountain",
    "library",
    "signal",
    "merchant",
    "bicycle",
    "window",
    "orchard",
    "satellite",
    "teacher",
    "kettle",
    "bridge",
    "archive",
    "storm",
    "violin",
    "market",
    "server",
    "painter",
    "letter",
    "forest",
    "clock",
    "ferry",
    "recipe",
    "question",
    "tower",
    "neighbor",
];
const VERBS: &[&str] = &[
    "found",
    "carried",
    "ignored",
    "repaired",
    "followed",
    "described",
    "painted",
    "measured",
    "questioned",
    "borrowed",
    "watched",
    "remembered",
    "opened",
    "counted",
    "sold",
    "noticed",
    "crossed",
    "replaced",
    "welcomed",
    "studied",
    "moved",
    "answered",
    "delayed",
    "built",
];
const ADVERBS: &[&str] = &[
    "slowly",
    "again",
    "without a word",
    "before dawn",
    "every morning",
    "in silence",
    "with great care",
    "at last",
    "almost by accident",
    "twice",
    "for no reason",
    "quickly",
];
const PLACES: &[&str] = &[
    "near the station",
    "behind the old mill",
    "in the northern valley",
    "across the square",
    "under the bridge",
    "at the edge of town",
    "on the third floor",
    "beside the harbor",
    "in the back room",
    "along the coast",
    "by the river",
    "after the meeting",
];
const OPENERS: &[&str] = &[
    "In the morning",
    "Long ago",
    "Without warning",
    "By the end of the week",
    "Every winter",
    "Later that night",
    "As expected",
    "Meanwhile",
    "Despite the rain",
    "For a while",
];
const NAMES: &[&str] = &[
    "Maria", "Tomasz", "Aiko", "Daniel", "Fatima", "Lars", "Priya", "Omar", "Elena", "Kwame",
    "Sofia", "Hiro", "Nadia", "Pablo", "Ingrid", "Wei", "Amara", "Jonas",
];
const GERUNDS: &[&str] = &[
    "moving",
    "changing",
    "waiting",
    "humming",
    "drifting",
    "failing",
    "growing",
    "returning",
];
const WORDS: &[&str] = &[
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "blue",
    "green",
    "quick",
    "small",
    "large",
    "early",
    "young",
    "important",
    "few",
    "public",
    "bad",
    "same",
    "able",
    "run",
    "make",
    "take",
    "see",
    "know",
    "think",
    "look",
    "want",
    "give",
    "use",
    "find",
    "tell",
    "ask",
    "seem",
    "feel",
    "try",
    "leave",
    "call",
];

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

    #[test]
    fn faker_reads_like_varied_prose() {
        let g = PromptGen::new(&workload(WorkloadType::Faker), 1).unwrap();
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

    #[test]
    fn corpus_windows_slide_over_files_of_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.txt"),
            "alpha beta gamma delta epsilon ".repeat(50),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.txt"),
            "uno dos tres\ncuatro   cinco ".repeat(50),
        )
        .unwrap();
        std::fs::write(dir.path().join("c.bin"), [0xff, 0xfe, 0x00]).unwrap();
        let w = Workload {
            kind: WorkloadType::Corpus,
            corpus_path: Some(dir.path().display().to_string()),
            ..Workload::default()
        };
        let g = PromptGen::new(&w, 0).unwrap();
        let a = g.text(0, 1, 300);
        let b = g.text(1, 1, 300);
        assert_eq!(a.len(), 300);
        assert_ne!(a, b);
        assert!(
            !a.contains('\n') && !a.contains("  "),
            "whitespace normalised: {a:?}"
        );
        // Long windows wrap around the corpus.
        assert_eq!(g.text(2, 1, 20_000).len(), 20_000);
    }

    #[test]
    fn corpus_errors_say_what_to_fix() {
        let w = Workload {
            kind: WorkloadType::Corpus,
            ..Workload::default()
        };
        assert!(
            PromptGen::new(&w, 0)
                .unwrap_err()
                .to_string()
                .contains("corpus_path")
        );
        let dir = tempfile::tempdir().unwrap();
        let w = Workload {
            kind: WorkloadType::Corpus,
            corpus_path: Some(dir.path().display().to_string()),
            ..Workload::default()
        };
        assert!(matches!(
            PromptGen::new(&w, 0),
            Err(WorkloadError::Empty(_))
        ));
        // A device is refused without being read (it would never end).
        let w = Workload {
            kind: WorkloadType::Corpus,
            corpus_path: Some("/dev/zero".into()),
            ..Workload::default()
        };
        assert!(matches!(
            PromptGen::new(&w, 0),
            Err(WorkloadError::NotAFile(_))
        ));
    }
}
