#![no_main]
//! `cargo +nightly fuzz run response`: see spate::fuzzing::response.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::response(data));
