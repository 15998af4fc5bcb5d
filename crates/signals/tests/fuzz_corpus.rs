//! The committed corpora of the fuzz targets (`fuzz/corpus/TARGET/`)
//! replayed through the checks the targets run (`nyann_signals::fuzz_check`),
//! on the stable toolchain: every input a fuzz run kept, and every crash it
//! found, stays a test. A missing or empty corpus fails. See docs/fuzzing.md.

use nyann_signals::fuzz_check;
use nyann_testkit::fuzz_corpus::replay;

#[test]
fn exposition() {
    replay("exposition", fuzz_check::exposition);
}

#[test]
fn prometheus_response() {
    replay("prometheus_response", fuzz_check::prometheus_response);
}
