#![no_main]
//! `cargo +nightly fuzz run checkpoints`: see spate::fuzzing::checkpoints.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::checkpoints(data));
