//! The seeds a test run explores beyond its fixed ones (included with `#[path]` by the
//! simulations, tests/replication_sim.rs and tests/controller_sim.rs; the proptests read
//! the same variable in tests/proptest_config/mod.rs).
//!
//! `scripts/test` sets `SPATE_TEST_SEED` from the commit under test (its first 12 hex
//! digits as a number) and prints it, so every commit runs a window of seeds no earlier
//! run had, and any run replays with the seed it printed:
//!
//! ```text
//! SPATE_TEST_SEED=<n> cargo test --profile ci --test replication_sim sim_seeds
//! ```
//!
//! Without the variable (a developer's `cargo test`) only the fixed seeds run. A seed
//! that fails in a window is replayed alone with `SPATE_SIM_SEED=<seed>` and, once fixed,
//! kept as a regression test of its own (`sim_seed_*`).

/// `SPATE_TEST_SEED`, when set.
pub fn test_seed() -> Option<u64> {
    std::env::var("SPATE_TEST_SEED").ok().map(|s| s.trim().parse().expect("SPATE_TEST_SEED is a u64"))
}

/// Where the windows start: past every fixed seed of the simulations.
const WINDOW_FLOOR: u64 = 1_000_000;

/// `len` seeds drawn from `SPATE_TEST_SEED` (empty without it), printed with the command
/// that replays them. `salt` keeps two tests of one run apart.
pub fn window(test: &str, len: u64, salt: u64) -> std::ops::Range<u64> {
    let Some(seed) = test_seed() else { return 0..0 };
    // SplitMix64's finaliser: neighbouring commits' seeds land far apart.
    let mut z = seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let start = WINDOW_FLOOR + z % (1u64 << 40);
    eprintln!(
        "{test}: exploring seeds {start}..{} (SPATE_TEST_SEED={seed}); replay one with SPATE_SIM_SEED=<seed>",
        start + len
    );
    start..start + len
}
