//! The committed corpora of the fuzz targets (`fuzz/corpus/TARGET/`)
//! replayed through the checks the targets run (`nyann_signals::fuzz_check`),
//! on the stable toolchain: every input a fuzz run kept, and every crash it
//! found, stays a test. A missing or empty corpus fails. See docs/fuzzing.md.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use nyann_signals::fuzz_check;

/// Runs `check` on every file of `fuzz/corpus/{target}/`.
fn replay(target: &str, check: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut inputs = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            panic!("{target}: the input {} fails its check", path.display());
        }
        inputs += 1;
    }
    assert!(inputs > 0, "{} holds no input", dir.display());
}

#[test]
fn exposition() {
    replay("exposition", fuzz_check::exposition);
}

#[test]
fn prometheus_response() {
    replay("prometheus_response", fuzz_check::prometheus_response);
}
