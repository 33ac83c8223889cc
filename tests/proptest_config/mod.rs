//! How every proptest in this crate is configured: `config(cases)` (included with
//! `#[path]` by tests/log_model.rs, tests/log_replica.rs and src/txn/producer_state.rs;
//! a new proptest uses it too). CI must be deterministic and every failure replayable:
//!
//! - The RNG seed is `SPATE_TEST_SEED` where it is set (`scripts/test` derives it from
//!   the commit and prints it, tests/explore/mod.rs: each commit explores new cases, and
//!   a run replays with the seed it printed), else `CI_SEED` under `CI=true`, else a fresh
//!   random one (so local runs keep exploring).
//! - The seed is printed as each test starts: the test harness shows a test's output
//!   only when it fails, so a failure reads "proptest seed N: replay with
//!   PROPTEST_RNG_SEED=N". `PROPTEST_RNG_SEED=<n>` (read here and by proptest itself)
//!   replays it; the cases are the same as long as the test's strategies are.
//! - Proptest saves each failing case's own seed as a `cc <hex>` line in
//!   `<test file>.proptest-regressions`, next to the test, and every later run tries
//!   the saved cases first. Commit that file with the fix: the failing seed becomes a
//!   regression test that survives changes to `CI_SEED`. Where the shrunk input is short,
//!   also write it down as a plain test (tests/log_model.rs has one).

use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};

/// The seed under `CI=true` without `SPATE_TEST_SEED`.
pub const CI_SEED: u64 = 21;

/// `cases` cases, seeded as the module comment says.
pub fn config(cases: u32) -> Config {
    let seed = match std::env::var("PROPTEST_RNG_SEED") {
        Ok(s) => s.trim().parse().expect("PROPTEST_RNG_SEED is a u64"),
        Err(_) if std::env::var("SPATE_TEST_SEED").is_ok() => {
            std::env::var("SPATE_TEST_SEED").unwrap().trim().parse().expect("SPATE_TEST_SEED is a u64")
        }
        Err(_) if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") => CI_SEED,
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish()
        }
    };
    eprintln!("proptest seed {seed}: replay with PROPTEST_RNG_SEED={seed}");
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..Config::default()
    }
}
