#![no_main]
//! `cargo +nightly fuzz run sasl`: see spate::fuzzing::sasl.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::sasl(data));
