#![no_main]
//! `cargo +nightly fuzz run request`: see spate::fuzzing::request.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::request(data));
