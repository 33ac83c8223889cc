#![no_main]
//! `cargo +nightly fuzz run segment_recovery`: see spate::fuzzing::segment_recovery.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::segment_recovery(data));
