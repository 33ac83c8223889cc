//! Replays every fuzz target's corpus (fuzz/corpus/<target>, seeded by
//! scripts/capture-corpus from real clients and a real data directory) and every finding
//! kept as a regression (fuzz/regressions/<target>) through the same entry points the
//! cargo-fuzz targets call (src/fuzzing.rs), on stable Rust, in every `cargo test`.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) -> usize {
    replay_seeded(target, target, run)
}

/// A target whose corpus is another target's (`corpus`), with regressions of its own.
fn replay_seeded(target: &str, corpus: &str, run: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut count = 0;
    for dir in [root.join("corpus").join(corpus), root.join("regressions").join(target)] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
        files.sort();
        for f in files {
            run(&std::fs::read(&f).unwrap());
            count += 1;
        }
    }
    count
}

#[test]
fn request_corpus() {
    assert!(replay("request", spate::fuzzing::request) >= 50);
}

/// Every request of the corpus (and every finding) handled by a real shard, one after
/// the other on the same broker, as the `request_handler` fuzz target does.
#[test]
fn request_handler_corpus() {
    assert!(replay_seeded("request_handler", "request", spate::fuzzing::request_handler) >= 50);
}

#[test]
fn response_corpus() {
    assert!(replay("response", spate::fuzzing::response) >= 50);
}

#[test]
fn record_batch_corpus() {
    assert!(replay("record_batch", spate::fuzzing::record_batch) >= 5);
}

#[test]
fn segment_recovery_corpus() {
    assert!(replay("segment_recovery", spate::fuzzing::segment_recovery) >= 4);
}

#[test]
fn checkpoints_corpus() {
    assert!(replay("checkpoints", spate::fuzzing::checkpoints) >= 2);
}

#[test]
fn coordinator_json_corpus() {
    assert!(replay("coordinator_json", spate::fuzzing::coordinator_json) >= 4);
}

#[test]
fn sasl_corpus() {
    assert!(replay("sasl", spate::fuzzing::sasl) >= 4);
}

#[test]
fn pem_keystore_corpus() {
    assert!(replay("pem_keystore", spate::fuzzing::pem_keystore) >= 4);
}

#[test]
fn cluster_snapshot_corpus() {
    assert!(replay("cluster_snapshot", spate::fuzzing::cluster_snapshot) >= 3);
}

/// Every recorded connection (fuzz/corpus/connection: logins, bare SASL tokens, denied
/// and forwarded requests) through the SASL listener of a real shard, as the
/// `connection` fuzz target runs them.
#[test]
fn connection_corpus() {
    assert!(replay("connection", spate::fuzzing::connection) >= 8);
}
