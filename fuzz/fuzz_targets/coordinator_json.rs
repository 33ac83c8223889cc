#![no_main]
//! `cargo +nightly fuzz run coordinator_json`: see spate::fuzzing::coordinator_json.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::coordinator_json(data));
