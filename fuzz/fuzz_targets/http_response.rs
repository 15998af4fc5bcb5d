//! `nyann_load::fuzz_check::http_response` on each input; its doc says what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nyann_load::fuzz_check::http_response(data));
