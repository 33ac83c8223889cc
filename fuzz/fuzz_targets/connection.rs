#![no_main]
//! `cargo +nightly fuzz run connection`: see spate::fuzzing::connection.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::connection(data));
