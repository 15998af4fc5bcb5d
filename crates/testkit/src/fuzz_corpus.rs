//! The committed corpora of the fuzz targets (`fuzz/corpus/TARGET/`),
//! replayed through a target's check on the stable toolchain: every input a
//! fuzz run kept, and every crash it found, stays a test (docs/fuzzing.md).

use std::path::PathBuf;

/// Runs `check` on every file of `fuzz/corpus/{target}/`. Panics, naming
/// the input, when a check fails, and when the corpus is missing or empty.
pub fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut inputs = 0;
    for entry in entries {
        let path = match entry {
            Ok(entry) => entry.path(),
            Err(e) => panic!("{}: {e}", dir.display()),
        };
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            panic!("{target}: the input {} fails its check", path.display());
        }
        inputs += 1;
    }
    assert!(inputs > 0, "{} holds no input", dir.display());
}
