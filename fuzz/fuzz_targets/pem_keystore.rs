#![no_main]
//! `cargo +nightly fuzz run pem_keystore`: see spate::fuzzing::pem_keystore.
libfuzzer_sys::fuzz_target!(|data: &[u8]| spate::fuzzing::pem_keystore(data));
