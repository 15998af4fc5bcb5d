//! `nyann_signals::fuzz_check::prometheus_response` on each input; its doc says what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nyann_signals::fuzz_check::prometheus_response(data));
