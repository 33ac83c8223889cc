//! Property test: random append / read / roll / truncate / retention / reopen sequences
//! against an in-memory model (a list of batches). Lookups through the offset and time
//! indexes must equal a linear scan of the model. Appends stamped with a leader epoch
//! drive a model of the leader epoch cache, which must match the log's and its
//! checkpoint file after every operation (truncation, retention and reopen included).

#[path = "log_common/mod.rs"]
mod common;
#[path = "proptest_config/mod.rs"]
mod proptest_config;

use common::*;
use proptest::prelude::*;
use spate::log::leader_epoch::LeaderEpochCache;
use spate::log::{LogConfig, LogError, PartitionLog};
use spate::model::Offset;

#[derive(Debug, Clone)]
enum Op {
    /// batches: (records, first timestamp, value bytes)
    Append(Vec<(usize, i64, usize)>),
    /// `append_with_leader_epoch`: the same batches, stamped with this epoch.
    AppendEpoch(i32, Vec<(usize, i64, usize)>),
    Read {
        at: u16,
        max_bytes: usize,
        min_one: bool,
        upper_back: u8,
    },
    Tick(i64),
    Roll,
    Truncate(u16),
    RetainBytes(u16),
    RetainMs(i64),
    Reopen {
        clean: bool,
    },
    Timestamp(i64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec((1usize..5, 0i64..2000, 0usize..120), 1..4).prop_map(Op::Append),
        3 => (0i32..8, prop::collection::vec((1usize..5, 0i64..2000, 0usize..120), 1..4))
            .prop_map(|(epoch, specs)| Op::AppendEpoch(epoch, specs)),
        4 => (any::<u16>(), 0usize..1500, any::<bool>(), 0u8..3)
            .prop_map(|(at, max_bytes, min_one, upper_back)| Op::Read { at, max_bytes, min_one, upper_back }),
        1 => (0i64..20_000).prop_map(Op::Tick),
        1 => Just(Op::Roll),
        1 => any::<u16>().prop_map(Op::Truncate),
        1 => (0u16..3000).prop_map(Op::RetainBytes),
        1 => (0i64..3000).prop_map(Op::RetainMs),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
        2 => (0i64..2200).prop_map(Op::Timestamp),
    ]
}

struct Model {
    batches: Vec<Decoded>,
    bytes: Vec<Vec<u8>>,
    start: i64,
    end: i64,
    /// The leader epoch cache: (epoch, start offset).
    epochs: Vec<(i32, i64)>,
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 900,
        segment_ms: 10_000,
        segment_index_bytes: 48,
        index_interval_bytes: 150,
        retention_ms: -1,
        ..Default::default()
    }
}

fn check_whole_log(log: &PartitionLog, m: &Model) {
    let epochs: Vec<(i32, i64)> = log.epoch_entries().iter().map(|e| (e.epoch, e.start_offset)).collect();
    assert_eq!(epochs, m.epochs, "leader epoch cache");
    let saved = LeaderEpochCache::load(log.dir()).unwrap();
    assert_eq!(saved.entries(), log.epoch_entries(), "leader-epoch-checkpoint");
    assert_eq!(log.latest_epoch(), m.epochs.last().map(|e| e.0));
    assert_eq!(log.log_start_offset().0, m.start);
    assert_eq!(log.log_end_offset().0, m.end);
    if let Some(first) = m.batches.first() {
        assert_eq!(first.base_offset, m.start);
    }
    let mut got = Vec::new();
    let mut at = m.start;
    while at < m.end {
        let plan = log.read(Offset(at), 1 << 20, Offset(m.end), true).unwrap();
        assert!(plan.length_bytes > 0, "no progress at {at}");
        let bytes = plan.read_to_vec().unwrap();
        let d = decode_batches(&bytes);
        at = d.last().unwrap().last_offset + 1;
        got.push(bytes);
    }
    assert_eq!(got.concat(), m.bytes.concat());
    assert_eq!(log.size_bytes() as usize, m.bytes.iter().map(|b| b.len()).sum::<usize>());
}

fn run(ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let mut now = 0i64;
    let mut cfg = config();
    let mut log = Some(PartitionLog::open(dir.path(), cfg.clone(), now).unwrap());
    let mut m = Model { batches: vec![], bytes: vec![], start: 0, end: 0, epochs: vec![] };
    for op in ops {
        let l = log.as_mut().unwrap();
        match op {
            Op::Append(ref specs) | Op::AppendEpoch(_, ref specs) => {
                let mut set = Vec::new();
                for &(n, ts, value_bytes) in specs {
                    set.extend(build_batch(&recs(n, ts, value_bytes)));
                }
                let info = match op {
                    Op::AppendEpoch(epoch, _) => {
                        // A log's batches carry non-decreasing leader epochs (a leader
                        // stamps its epoch, the newest its log knows; a follower copies a
                        // leader's log after truncating where the two diverged), which
                        // recovery relies on when it replays the tail's epochs over the
                        // checkpoint: an older epoch drawn is stamped as the latest.
                        let epoch = epoch.max(m.epochs.last().map_or(0, |&(latest, _)| latest));
                        // A newer epoch starts at this append's first offset.
                        // (An epoch that retention left starting at the log end gives way.)
                        if m.epochs.last().is_none_or(|&(latest, _)| epoch > latest) {
                            m.epochs.retain(|&(_, start)| start < m.end);
                            m.epochs.push((epoch, m.end));
                        }
                        l.append_with_leader_epoch(&mut set, epoch, now).unwrap()
                    }
                    _ => l.append(&mut set, now).unwrap(),
                };
                assert_eq!(info.base_offset.0, m.end);
                for d in decode_batches(&set) {
                    m.end = d.last_offset + 1;
                    m.batches.push(d);
                }
                let mut at = 0;
                for d in &m.batches[m.batches.len() - specs.len()..] {
                    m.bytes.push(set[at..at + d.size].to_vec());
                    at += d.size;
                }
                assert_eq!(info.last_offset.0, m.end - 1);
            }
            Op::Read { at, max_bytes, min_one, upper_back } => {
                let span = (m.end - m.start + 1) as u64;
                let offset = m.start + (at as u64 % span) as i64;
                let upper = (m.end - upper_back as i64).max(offset);
                let plan = l.read(Offset(offset), max_bytes, Offset(upper), min_one).unwrap();
                let d = decode_batches(&plan.read_to_vec().unwrap());
                if offset >= upper {
                    assert!(d.is_empty());
                    continue;
                }
                let i = m.batches.iter().position(|b| b.last_offset >= offset).unwrap();
                if d.is_empty() {
                    // nothing fits, or the batch reaches `upper`
                    let b = &m.batches[i];
                    assert!(b.last_offset >= upper || (!min_one && b.size > max_bytes), "empty read at {offset}");
                    continue;
                }
                assert!(d[0].base_offset <= offset && offset <= d[0].last_offset);
                let total: usize = d.iter().map(|b| b.size).sum();
                assert!(total <= max_bytes || (min_one && d.len() == 1));
                for (k, b) in d.iter().enumerate() {
                    assert_eq!(b, &m.batches[i + k]);
                    assert!(b.last_offset < upper);
                }
                // stopped for a reason: end, upper, budget, or a segment boundary
                if let Some(next) = m.batches.get(i + d.len()) {
                    let segs = l.segment_base_offsets();
                    assert!(
                        next.last_offset >= upper
                            || total + next.size > max_bytes
                            || segs.contains(&Offset(next.base_offset)),
                        "read stopped early"
                    );
                }
            }
            Op::Tick(ms) => now += ms,
            Op::Roll => l.maybe_roll(now).unwrap(),
            Op::Truncate(at) => {
                let t = (at as i64) % (m.end + 3);
                l.truncate_to(Offset(t), Offset(t)).unwrap();
                if t < m.start {
                    m = Model { batches: vec![], bytes: vec![], start: t, end: t, epochs: vec![] };
                } else if t < m.end {
                    let keep = m.batches.iter().position(|b| b.last_offset >= t).unwrap();
                    m.batches.truncate(keep);
                    m.bytes.truncate(keep);
                    m.end = m.batches.last().map_or(m.start, |b| b.last_offset + 1);
                    m.epochs.retain(|&(_, start)| start < m.end);
                } else {
                    // No record goes, but the cache is cut at the log end all the same
                    // (Kafka's `UnifiedLog.truncateTo` -> `truncateFromEnd(logEndOffset)`):
                    // an epoch starting there has no record behind it.
                    m.epochs.retain(|&(_, start)| start < m.end);
                }
            }
            Op::RetainBytes(bytes) => {
                cfg = LogConfig { retention_bytes: bytes as i64, retention_ms: -1, ..cfg };
                l.set_config(cfg.clone());
                expect_retention(l, &mut m, now, |segs_bytes_left, seg_bytes, _| {
                    segs_bytes_left - seg_bytes >= bytes as i64
                });
            }
            Op::RetainMs(ms) => {
                cfg = LogConfig { retention_bytes: -1, retention_ms: ms, ..cfg };
                l.set_config(cfg.clone());
                expect_retention(l, &mut m, now, |_, _, max_ts| max_ts >= 0 && now - max_ts > ms);
            }
            Op::Reopen { clean } => {
                let l = log.take().unwrap();
                if clean {
                    l.close().unwrap();
                } else {
                    drop(l);
                }
                log = Some(PartitionLog::open(dir.path(), cfg.clone(), now).unwrap());
                // Open cuts the cache to the log, as Kafka's truncateFromEnd: an epoch that
                // retention left starting at the log end (empty active segment) goes.
                m.epochs.retain(|&(_, start)| start < m.end);
            }
            Op::Timestamp(ts) => {
                let expect =
                    m.batches.iter().flat_map(|b| b.records.iter()).find(|r| r.1 >= ts).map(|r| (Offset(r.0), r.1));
                assert_eq!(l.offset_for_timestamp(ts).unwrap(), expect, "timestamp {ts}");
            }
        }
        check_whole_log(log.as_ref().unwrap(), &m);
    }
    let trash = log.unwrap().delete().unwrap();
    assert!(!dir.path().exists(), "the partition's name is free at once");
    assert!(spate::log::is_trash_dir_name(trash.file_name().unwrap().to_str().unwrap()), "{trash:?}");
    assert!(spate::shard::parse_partition_dir(trash.file_name().unwrap().to_str().unwrap()).is_none());
    std::fs::remove_dir_all(trash).unwrap();
}

/// Apply Kafka's rule to the model's segments (from the log's segment list): delete the
/// oldest non-active segments while `expired(bytes left, segment bytes, segment max ts)`.
fn expect_retention(l: &mut PartitionLog, m: &mut Model, now: i64, expired: impl Fn(i64, i64, i64) -> bool) {
    let segs: Vec<i64> = l.segment_base_offsets().iter().map(|o| o.0).collect();
    let mut total: i64 = m.bytes.iter().map(|b| b.len() as i64).sum();
    let mut drop_below = m.start;
    for w in segs.windows(2) {
        let in_seg: Vec<usize> = (0..m.batches.len())
            .filter(|&i| m.batches[i].base_offset >= w[0] && m.batches[i].base_offset < w[1])
            .collect();
        let seg_bytes: i64 = in_seg.iter().map(|&i| m.bytes[i].len() as i64).sum();
        let max_ts = in_seg.iter().map(|&i| m.batches[i].max_timestamp).max().unwrap_or(-1);
        if !expired(total, seg_bytes, max_ts) {
            break;
        }
        total -= seg_bytes;
        drop_below = w[1];
    }
    let deleted = l.enforce_retention(now).unwrap();
    assert_eq!(deleted, segs.iter().filter(|&&b| b < drop_below).count(), "segments deleted");
    let keep = m.batches.iter().position(|b| b.base_offset >= drop_below).unwrap_or(m.batches.len());
    m.batches.drain(..keep);
    m.bytes.drain(..keep);
    m.start = drop_below.max(m.start);
    // The epoch covering the new start is kept, now starting there; earlier ones go.
    if let Some(i) = m.epochs.iter().rposition(|&(_, start)| start <= m.start) {
        m.epochs.drain(..i);
        m.epochs[0].1 = m.start;
    }
}

proptest! {
    #![proptest_config(proptest_config::config(128))]
    #[test]
    fn log_matches_model(ops in prop::collection::vec(op(), 1..40)) {
        run(ops);
    }
}

#[test]
fn read_errors_and_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config(), 0).unwrap();
    assert_eq!(log.read(Offset(0), 100, Offset(0), true).unwrap().length_bytes, 0);
    assert!(matches!(log.read(Offset(1), 100, Offset(1), true), Err(LogError::OffsetOutOfRange { .. })));
    log.append(&mut build_batch(&recs(3, 0, 500)), 0).unwrap();
    let plan = log.read(Offset(1), 10, Offset(3), true).unwrap();
    assert!(plan.length_bytes > 10, "min_one_batch returns the whole first batch");
    assert_eq!(log.read(Offset(1), 10, Offset(3), false).unwrap().length_bytes, 0);
    assert_eq!(log.read(Offset(3), 10_000, Offset(3), true).unwrap().length_bytes, 0);
    assert!(matches!(log.read(Offset(4), 100, Offset(4), true), Err(LogError::OffsetOutOfRange { .. })));
}

/// Found by `log_matches_model`: retention leaves epoch 1 starting at the log end (1),
/// and a truncation to the log end cuts it, in the log as in Kafka; the model used to
/// keep it ("leader epoch cache: left [] right [(1, 1)]").
#[test]
fn truncation_at_the_log_end_cuts_the_epoch_retention_left_there() {
    run(vec![Op::AppendEpoch(1, vec![(1, 0, 0)]), Op::Tick(10_000), Op::Roll, Op::RetainMs(0), Op::Truncate(1)]);
}

/// Retention that empties every segment but the (just rolled, empty) active one leaves the
/// covering epoch starting at the log end: a newer epoch's first append replaces it, and
/// a reopen drops it (Kafka's truncateFromEnd), in the log as in the model.
#[test]
fn epoch_left_at_the_log_end_by_retention() {
    let prefix = vec![Op::AppendEpoch(0, vec![(1, 0, 0)]), Op::Tick(10_000), Op::Roll, Op::RetainMs(0)];
    run([prefix.clone(), vec![Op::AppendEpoch(1, vec![(1, 0, 0)])]].concat());
    run([prefix.clone(), vec![Op::Reopen { clean: false }, Op::AppendEpoch(0, vec![(1, 0, 0)])]].concat());
    run([prefix, vec![Op::Reopen { clean: true }]].concat());
}

/// Found by `log_matches_model` when open began to replay the recovered tail's epochs
/// over the checkpoint: retention left epoch 7 starting at the new log start, whose
/// batch was appended without an epoch (-1, as a producer's batch before epochs were
/// stamped); a crash reopen must keep the entry, since such a batch cannot contradict it.
#[test]
fn a_batch_without_an_epoch_does_not_cut_the_checkpoint_at_reopen() {
    run(vec![
        Op::AppendEpoch(7, vec![(1, 0, 0)]),
        Op::Tick(10_000),
        Op::Roll,
        Op::Append(vec![(1, 0, 0)]),
        Op::Tick(10_000),
        Op::Roll,
        Op::Append(vec![(1, 0, 0)]),
        Op::RetainMs(0),
        Op::Reopen { clean: false },
    ]);
}
