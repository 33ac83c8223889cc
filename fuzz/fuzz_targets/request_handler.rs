#![no_main]
//! `cargo +nightly fuzz run request_handler`: see spate::fuzzing::request_handler.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::request_handler(data));
