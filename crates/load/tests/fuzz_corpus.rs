//! The committed corpora of the fuzz targets (`fuzz/corpus/TARGET/`)
//! replayed through the checks the targets run (`nyann_load::fuzz_check`),
//! on the stable toolchain: every input a fuzz run kept, and every crash it
//! found, stays a test. A missing or empty corpus fails. See docs/fuzzing.md.

use nyann_load::fuzz_check;
use nyann_testkit::fuzz_corpus::replay;

#[test]
fn sse_stream() {
    replay("sse_stream", fuzz_check::sse_stream);
}

#[test]
fn sse_chunk() {
    replay("sse_chunk", fuzz_check::sse_chunk);
}

#[test]
fn http_response() {
    replay("http_response", fuzz_check::http_response);
}
