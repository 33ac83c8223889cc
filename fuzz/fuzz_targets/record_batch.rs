#![no_main]
//! `cargo +nightly fuzz run record_batch`: see spate::fuzzing::record_batch.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::record_batch(data));
