//! `nyann_load::fuzz_check::sse_stream` on each input; its doc says what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nyann_load::fuzz_check::sse_stream(data));
