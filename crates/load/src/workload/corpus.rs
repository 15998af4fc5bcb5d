//! The `corpus` workload's text: a file, or the UTF-8 text files of a
//! directory in name order, read once with a size limit and joined with
//! their whitespace normalised to single spaces.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use super::{WorkloadError, push_word};

/// Largest corpus read into memory.
const MAX_CORPUS_BYTES: u64 = 256 * 1024 * 1024;

pub(super) fn load_corpus(path: &Path) -> Result<Arc<str>, WorkloadError> {
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

#[cfg(test)]
mod tests {
    use crate::workload::{DatasetShare, PromptGen, WorkloadError};
    use nyann_model::{Workload, WorkloadType};

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
        let g = PromptGen::new(&w, 0, DatasetShare::whole(0)).unwrap();
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
            PromptGen::new(&w, 0, DatasetShare::whole(0))
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
            PromptGen::new(&w, 0, DatasetShare::whole(0)),
            Err(WorkloadError::Empty(_))
        ));
        // A device is refused without being read (it would never end).
        let w = Workload {
            kind: WorkloadType::Corpus,
            corpus_path: Some("/dev/zero".into()),
            ..Workload::default()
        };
        assert!(matches!(
            PromptGen::new(&w, 0, DatasetShare::whole(0)),
            Err(WorkloadError::NotAFile(_))
        ));
    }
}
