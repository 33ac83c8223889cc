#![no_main]
//! `cargo +nightly fuzz run cluster_snapshot`: see spate::fuzzing::cluster_snapshot.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::cluster_snapshot(data));
