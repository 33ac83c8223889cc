//! Log compaction against the real `PartitionLog` and cleaner (`src/log/cleaner.rs`):
//! a property test against a model of what was appended, and the segment swap
//! interrupted at every step (a kill -9 between two renames), then reopened.

mod log_common;
#[path = "proptest_config/mod.rs"]
mod proptest_config;

use std::collections::BTreeMap;
use std::path::Path;

use log_common::{fix_crc, get_varint, put_varint};
use proptest::prelude::*;
use spate::log::{cleaner, CleanerSettings, LogConfig, PartitionLog};
use spate::model::Offset;

type Key = Vec<u8>;
/// (offset, key, value: None for a tombstone)
type Stored = (i64, Option<Key>, Option<Vec<u8>>);
/// A record to write: (key, value: None for a tombstone).
type Rec<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// An uncompressed batch of keyed records (None values are tombstones).
fn batch(records: &[Rec<'_>], ts: i64) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, (k, v)) in records.iter().enumerate() {
        let mut rec = vec![0u8];
        put_varint(&mut rec, i as i64); // timestamp delta
        put_varint(&mut rec, i as i64); // offset delta
        for f in [k, v] {
            match f {
                Some(b) => {
                    put_varint(&mut rec, b.len() as i64);
                    rec.extend_from_slice(b);
                }
                None => put_varint(&mut rec, -1),
            }
        }
        put_varint(&mut rec, 0);
        put_varint(&mut body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }
    let n = records.len() as i64;
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((49 + body.len()) as i32).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&((n - 1) as i32).to_be_bytes());
    b.extend_from_slice(&ts.to_be_bytes());
    b.extend_from_slice(&(ts + n - 1).to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&(n as i32).to_be_bytes());
    b.extend_from_slice(&body);
    fix_crc(&mut b);
    b
}

/// One stored batch as a reader sees it.
#[derive(Debug, Clone, PartialEq)]
struct ReadBatch {
    base: i64,
    last: i64,
    attributes: i16,
    base_timestamp: i64,
    producer_id: i64,
    records: Vec<Stored>,
}

const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;

/// Every batch the log holds from its start to `upper`, decoded (uncompressed batches).
fn read_batches(log: &PartitionLog, upper: Offset) -> Vec<ReadBatch> {
    let mut out = Vec::new();
    let mut at = log.log_start_offset();
    while at < upper {
        let plan = log.read(at, 1 << 20, upper, true).unwrap();
        let bytes = plan.read_to_vec().unwrap();
        if bytes.is_empty() {
            break;
        }
        let mut buf = &bytes[..];
        while !buf.is_empty() {
            let size = 12 + i32::from_be_bytes(buf[8..12].try_into().unwrap()) as usize;
            let b = &buf[..size];
            let base = i64::from_be_bytes(b[..8].try_into().unwrap());
            let last = base + i32::from_be_bytes(b[23..27].try_into().unwrap()) as i64;
            let count = i32::from_be_bytes(b[57..61].try_into().unwrap());
            let mut records = Vec::new();
            let mut p = 61;
            for _ in 0..count {
                let len = get_varint(b, &mut p) as usize;
                let end = p + len;
                p += 1;
                get_varint(b, &mut p);
                let od = get_varint(b, &mut p);
                let mut field = || {
                    let l = get_varint(b, &mut p);
                    (l >= 0).then(|| {
                        let f = b[p..p + l as usize].to_vec();
                        p += l as usize;
                        f
                    })
                };
                let key = field();
                let value = field();
                p = end;
                records.push((base + od, key, value));
            }
            out.push(ReadBatch {
                base,
                last,
                attributes: i16::from_be_bytes(b[21..23].try_into().unwrap()),
                base_timestamp: i64::from_be_bytes(b[27..35].try_into().unwrap()),
                producer_id: i64::from_be_bytes(b[43..51].try_into().unwrap()),
                records,
            });
            at = Offset(last + 1);
            buf = &buf[size..];
        }
    }
    out
}

/// Every record the log holds, from its start, decoded (uncompressed batches); markers
/// show as their control record.
fn contents(log: &PartitionLog) -> Vec<Stored> {
    read_batches(log, log.log_end_offset()).into_iter().flat_map(|b| b.records).collect()
}

/// What a consumer of the whole log sees, newest value per key (a tombstone removes
/// the key): read_uncommitted, every data record to the log end; read_committed, to the
/// last stable offset, dropping what the aborted transactions the fetches return
/// cover, as Kafka's consumer does (an aborted producer id from its transaction's first
/// offset to its ABORT marker).
fn view(log: &mut PartitionLog, committed: bool) -> BTreeMap<Key, Vec<u8>> {
    let end = log.log_end_offset();
    let upper = if committed { log.last_stable_offset(end) } else { end };
    let mut aborted: Vec<(i64, i64)> =
        if committed { all_aborted(log).into_iter().map(|(pid, first, _)| (first, pid)).collect() } else { Vec::new() };
    aborted.sort_unstable_by(|a, b| b.cmp(a));
    let mut aborted_pids = std::collections::HashSet::new();
    let mut out = BTreeMap::new();
    for b in read_batches(log, upper) {
        while aborted.last().is_some_and(|(first, _)| *first <= b.last) {
            aborted_pids.insert(aborted.pop().unwrap().1);
        }
        if b.attributes & ATTR_CONTROL != 0 {
            let abort = b.records.first().is_some_and(|r| r.1.as_deref() == Some(&[0, 0, 0, 0][..]));
            if abort {
                aborted_pids.remove(&b.producer_id);
            }
            continue;
        }
        if b.attributes & ATTR_TRANSACTIONAL != 0 && aborted_pids.contains(&b.producer_id) {
            continue;
        }
        for (_, k, v) in b.records {
            let k = k.expect("a compacted log's records have keys");
            match v {
                Some(v) => out.insert(k, v),
                None => out.remove(&k),
            };
        }
    }
    out
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 600,
        segment_index_bytes: 4096,
        index_interval_bytes: 128,
        compact: true,
        delete: false,
        min_cleanable_dirty_ratio: 0.0,
        delete_retention_ms: 1_000,
        ..Default::default()
    }
}

/// What one pass reported.
struct Pass {
    cleaned_to: i64,
    next_horizon_ms: Option<i64>,
    stats: cleaner::CleanStats,
}

/// One whole pass as the broker does it: plan, run (here, not on a pool), install.
fn clean(log: &mut PartitionLog, now_ms: i64, map_bytes_max: usize) -> Option<Pass> {
    log.flush().unwrap();
    let settings = CleanerSettings { map_bytes_max, io_bytes_per_second: f64::INFINITY };
    let end = log.log_end_offset();
    let job = log.clean_job(now_ms, end, &settings)?;
    let outcome = cleaner::run(&job).unwrap();
    let pass = Pass { cleaned_to: outcome.cleaned_to, next_horizon_ms: outcome.next_horizon_ms, stats: outcome.stats };
    let done = log.install_cleaned(outcome).unwrap();
    assert_eq!(done.groups_discarded, 0);
    Some(pass)
}

fn leftover_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap") || n.ends_with(".deleted"))
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// Keys 0..6, each with a value or (false) a tombstone.
    Append(Vec<(u8, bool)>),
    /// A transactional batch of producer `pid` (opens its transaction if none is).
    TxnAppend {
        pid: i64,
        recs: Vec<(u8, bool)>,
    },
    /// Producer `pid`'s marker, if it has a transaction open.
    TxnEnd {
        pid: i64,
        commit: bool,
    },
    Clean {
        advance_ms: i64,
        small_map: bool,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let recs = || proptest::collection::vec((0u8..6, proptest::bool::weighted(0.8)), 1..5);
    prop_oneof![
        5 => recs().prop_map(Op::Append),
        3 => (7i64..9, recs()).prop_map(|(pid, recs)| Op::TxnAppend { pid, recs }),
        2 => (7i64..9, proptest::bool::ANY).prop_map(|(pid, commit)| Op::TxnEnd { pid, commit }),
        2 => (0i64..3_000, proptest::bool::weighted(0.2)).prop_map(|(advance_ms, small_map)| Op::Clean { advance_ms, small_map }),
        1 => Just(Op::Reopen),
    ]
}

/// What was appended at an offset, and what it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Plain,
    /// A record of transaction number n.
    Txn(usize),
    Marker,
}

proptest! {
    #![proptest_config(proptest_config::config(48))]

    /// After every pass: each record still there is the one appended at its offset;
    /// offsets increase; every key's newest plain or committed record is there (a
    /// tombstone may go once its horizon passed); no record of an aborted transaction
    /// is left below where the pass's map reached, and no key appears twice there; a
    /// read_committed reader sees exactly the newest committed value per key below the
    /// last stable offset. Nothing appears that was not there. Reopening (as after a
    /// kill -9) changes nothing.
    #[test]
    fn cleaning_keeps_the_newest_record_per_key_at_its_offset(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut now = 1_000_000i64;
        let mut log = PartitionLog::open(dir.path(), config(), now).unwrap();
        let mut appended: BTreeMap<i64, (Key, Option<Vec<u8>>, Origin)> = BTreeMap::new();
        let mut seq = 0u32;
        // Per producer: its next sequence and its open transaction; each transaction's outcome.
        let mut sequences: BTreeMap<i64, i32> = BTreeMap::new();
        let mut open: BTreeMap<i64, usize> = BTreeMap::new();
        let mut outcomes: Vec<Option<bool>> = Vec::new();
        for op in ops {
            match op {
                Op::Append(_) | Op::TxnAppend { .. } => {
                    let (recs, pid) = match &op {
                        Op::Append(recs) => (recs, None),
                        Op::TxnAppend { pid, recs } => (recs, Some(*pid)),
                        _ => unreachable!(),
                    };
                    let owned: Vec<(Vec<u8>, Option<Vec<u8>>)> = recs
                        .iter()
                        .map(|(k, live)| {
                            seq += 1;
                            (vec![b'k', *k], live.then(|| format!("v{seq}").into_bytes()))
                        })
                        .collect();
                    let refs: Vec<Rec<'_>> =
                        owned.iter().map(|(k, v)| (Some(&k[..]), v.as_deref())).collect();
                    let (mut b, origin) = match pid {
                        None => (batch(&refs, now), Origin::Plain),
                        Some(pid) => {
                            let s = sequences.entry(pid).or_insert(0);
                            let b = txn_batch(&refs, now, pid, *s);
                            *s += refs.len() as i32;
                            let n = *open.entry(pid).or_insert_with(|| {
                                outcomes.push(None);
                                outcomes.len() - 1
                            });
                            (b, Origin::Txn(n))
                        }
                    };
                    let info = log.append(&mut b, now).unwrap();
                    for (i, (k, v)) in owned.into_iter().enumerate() {
                        appended.insert(info.base_offset.0 + i as i64, (k, v, origin));
                    }
                    now += 10;
                    log.maybe_roll(now).unwrap();
                }
                Op::TxnEnd { pid, commit } => {
                    let Some(n) = open.remove(&pid) else { continue };
                    outcomes[n] = Some(commit);
                    let at = log.log_end_offset().0;
                    end_txn(&mut log, pid, commit, now);
                    appended.insert(at, (vec![0, 0, 0, u8::from(commit)], Some(vec![0; 6]), Origin::Marker));
                    now += 10;
                    log.maybe_roll(now).unwrap();
                }
                Op::Clean { advance_ms, small_map } => {
                    now += advance_ms;
                    // A small map holds 4 keys: the largest batch here, so a pass always progresses.
                    let map = if small_map { 4 * (2 + cleaner::KEY_MAP_ENTRY_OVERHEAD_BYTES) } else { 1 << 20 };
                    let before = contents(&log);
                    if let Some(o) = clean(&mut log, now, map) {
                        let after = contents(&log);
                        // Each surviving record is the one appended at its offset.
                        for (off, k, v) in &after {
                            let (ak, av, _) = &appended[off];
                            prop_assert_eq!((Some(ak), v), (k.as_ref(), av));
                        }
                        prop_assert!(after.windows(2).all(|w| w[0].0 < w[1].0), "offsets increase");
                        // Every key's newest plain or committed record survives, tombstones
                        // while their horizon holds.
                        let counts = |origin: Origin| match origin {
                            Origin::Plain => true,
                            Origin::Txn(n) => outcomes[n] == Some(true),
                            Origin::Marker => false,
                        };
                        let mut newest: BTreeMap<&Key, i64> = BTreeMap::new();
                        for (off, (k, _, origin)) in &appended {
                            if counts(*origin) {
                                newest.insert(k, *off);
                            }
                        }
                        for (k, off) in &newest {
                            let there = after.iter().any(|(o, _, _)| o == off);
                            let is_tombstone = appended[off].1.is_none();
                            prop_assert!(there || is_tombstone, "key {:?}'s newest record {} lost", k, off);
                        }
                        // Nothing appeared that was not there before.
                        prop_assert!(after.iter().all(|r| before.contains(r)));
                        // Below where the map reached, no aborted record and keys are unique.
                        let mut seen = std::collections::BTreeSet::new();
                        for (off, k, _) in after.iter().filter(|r| r.0 < o.cleaned_to) {
                            let origin = appended[off].2;
                            prop_assert!(!matches!(origin, Origin::Txn(n) if outcomes[n] == Some(false)),
                                "aborted record at {} below {}", off, o.cleaned_to);
                            if origin != Origin::Marker {
                                prop_assert!(seen.insert(k.clone()), "key {:?} twice below {} (at {})", k, o.cleaned_to, off);
                            }
                        }
                        // A read_committed reader: the newest committed value per key below
                        // the last stable offset.
                        let stable = log.last_stable_offset(log.log_end_offset()).0;
                        let mut model: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
                        for (_, (k, v, origin)) in appended.range(..stable) {
                            if counts(*origin) {
                                match v {
                                    Some(v) => model.insert(k.clone(), v.clone()),
                                    None => model.remove(k),
                                };
                            }
                        }
                        prop_assert_eq!(view(&mut log, true), model);
                    }
                    prop_assert!(leftover_files(dir.path()).iter().all(|n| n.ends_with(".deleted")));
                }
                Op::Reopen => {
                    let before = contents(&log);
                    drop(log); // no close: as a kill -9
                    log = PartitionLog::open(dir.path(), config(), now).unwrap();
                    prop_assert_eq!(contents(&log), before);
                }
            }
        }
    }
}

/// A log of 3 rolled segments over keys a..c, with tombstones, plus an active one.
fn compactable_log(dir: &Path) -> (PartitionLog, i64) {
    let now = 5_000_000;
    let mut log = PartitionLog::open(dir, LogConfig { segment_bytes: 250, ..config() }, now).unwrap();
    for round in 0..12u8 {
        let v = [b'v', round];
        let recs: Vec<Rec<'_>> = vec![
            (Some(b"a"), Some(&v)),
            (Some(b"b"), if round == 11 { None } else { Some(&v) }),
            (Some(b"c"), Some(&v)),
        ];
        log.append(&mut batch(&recs, now + round as i64), now).unwrap();
    }
    // Roll the last batch out of the active segment (segment.ms), so the pass sees all.
    log.set_config(LogConfig { segment_ms: 1, ..config() });
    log.maybe_roll(now + 1_000).unwrap();
    log.flush().unwrap();
    assert!(log.segment_base_offsets().len() >= 4, "{:?}", log.segment_base_offsets());
    // Larger segments from here on: the pass merges every rolled segment into one.
    log.set_config(LogConfig { segment_bytes: 1 << 20, ..config() });
    (log, now)
}

/// The swap is a sequence of renames; a kill -9 may fall between any two. Each state
/// reopens to a consistent log: the old segments (swap not decided) or the cleaned
/// ones (decided: `.log.swap` present), never a mix, never a lost newest record.
#[test]
fn a_swap_interrupted_at_every_step_reopens_consistent() {
    for step in 0..=4 {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (mut log, now) = compactable_log(d);
        let original = contents(&log);
        let settings = CleanerSettings::default();
        let end = log.log_end_offset();
        let job = log.clean_job(now, end, &settings).expect("a pass is due");
        let outcome = cleaner::run(&job).unwrap();
        assert_eq!(outcome.groups.len(), 1, "the small segments merge into one");
        let g = &outcome.groups[0];
        let base = g.base_offset;
        let others: Vec<i64> = g.replaces.iter().skip(1).map(|(b, _)| *b).collect();
        let end_offset = log.log_end_offset();
        drop(log); // the crash: before or during the swap
        let name = |b: i64, s: &str| d.join(format!("{b:020}{s}"));
        if step >= 1 {
            std::fs::rename(name(base, ".log.cleaned"), name(base, ".log.swap")).unwrap();
        }
        if step >= 2 {
            for &o in &others {
                for s in [".log", ".index", ".timeindex"] {
                    std::fs::rename(name(o, s), name(o, &format!("{s}.deleted"))).unwrap();
                }
            }
        }
        if step >= 3 {
            std::fs::rename(name(base, ".index.cleaned"), name(base, ".index")).unwrap();
            std::fs::rename(name(base, ".timeindex.cleaned"), name(base, ".timeindex")).unwrap();
        }
        if step >= 4 {
            std::fs::rename(name(base, ".log.swap"), name(base, ".log")).unwrap();
        }
        let mut log = PartitionLog::open(d, config(), now).unwrap();
        let got = contents(&log);
        assert!(leftover_files(d).is_empty(), "step {step}: {:?}", leftover_files(d));
        assert_eq!(log.log_end_offset(), end_offset, "step {step}");
        if step == 0 {
            assert_eq!(got, original, "step {step}: not decided, the old segments stay");
        } else {
            // Decided: the cleaned log. Nothing new; every key's newest record is there;
            // below the active segment (what the pass covered) each key once.
            assert!(got.iter().all(|r| original.contains(r)), "step {step}");
            let newest: BTreeMap<Option<Key>, Stored> = original.iter().map(|r| (r.1.clone(), r.clone())).collect();
            for r in newest.values() {
                assert!(got.contains(r), "step {step}: newest {r:?} lost");
            }
            let active_base = log.segment_base_offsets().last().unwrap().0;
            let cleaned: Vec<&Stored> = got.iter().filter(|r| r.0 < active_base).collect();
            let keys: std::collections::BTreeSet<&Option<Key>> = cleaned.iter().map(|r| &r.1).collect();
            assert_eq!(keys.len(), cleaned.len(), "step {step}: {cleaned:?}");
            assert!(cleaned.len() < original.iter().filter(|r| r.0 < active_base).count(), "step {step}");
        }
        // The reopened log takes appends and reads them back.
        let info = log.append(&mut batch(&[(Some(b"z"), Some(b"after"))], now), now).unwrap();
        assert_eq!(info.base_offset, end_offset);
        assert_eq!(contents(&log).last().unwrap(), &(end_offset.0, Some(b"z".to_vec()), Some(b"after".to_vec())));
    }
}

/// Tombstones: the first pass gives their batch a delete horizon (now +
/// delete.retention.ms), a pass before it keeps them, a pass after it removes them;
/// the log is then only the live keys' newest values, and a reopen agrees.
#[test]
fn tombstones_go_after_the_delete_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, now) = compactable_log(dir.path());
    let first = clean(&mut log, now, 1 << 20).expect("due");
    assert_eq!(first.next_horizon_ms, Some(now + 1_000));
    let has_b = |log: &PartitionLog| contents(log).iter().any(|r| r.1.as_deref() == Some(b"b"));
    assert!(has_b(&log), "the tombstone stays until its horizon");
    assert!(clean(&mut log, now + 999, 1 << 20).is_none(), "nothing dirty, horizon not reached: no pass");
    let second = clean(&mut log, now + 1_000, 1 << 20).expect("the horizon makes a pass due");
    assert_eq!(second.stats.tombstones_removed, 1);
    assert!(!has_b(&log), "{:?}", contents(&log));
    let keys: Vec<Option<Key>> = contents(&log).into_iter().map(|r| r.1).collect();
    assert_eq!(keys, [Some(b"a".to_vec()), Some(b"c".to_vec())]);
    let before = contents(&log);
    drop(log);
    let log = PartitionLog::open(dir.path(), config(), now).unwrap();
    assert_eq!(contents(&log), before);
}

/// A pass that lost its race (retention removed a segment it read) swaps nothing in and
/// leaves its files for the trash; the checkpoint does not move.
#[test]
fn a_pass_whose_segments_changed_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, now) = compactable_log(dir.path());
    let end = log.log_end_offset();
    let job = log.clean_job(now, end, &CleanerSettings::default()).unwrap();
    let outcome = cleaner::run(&job).unwrap();
    let before = contents(&log);
    // Move the log start past the first segment: retention deletes it.
    let second = log.segment_base_offsets()[1];
    log.truncate_fully_and_start_at(Offset(log.log_end_offset().0)).unwrap();
    let _ = second;
    let done = log.install_cleaned(outcome).unwrap();
    assert_eq!((done.segments_written, done.groups_discarded), (0, 1));
    assert_eq!(log.cleaner_checkpoint(), Offset(0));
    let leftovers = log.take_cleaner_leftovers();
    assert_eq!(leftovers.len(), 3);
    assert!(leftovers.iter().all(|p| p.to_str().unwrap().ends_with(".cleaned")));
    assert!(before.len() > contents(&log).len());
}

/// Records without a key are refused on a compacted log (INVALID_RECORD, naming each
/// keyless record by its index: KIP-467's record errors); keyed ones go in.
#[test]
fn a_compacted_log_refuses_records_without_keys() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config(), 0).unwrap();
    let e = log.append(&mut batch(&[(Some(b"a"), Some(b"1")), (None, Some(b"2"))], 0), 0).unwrap_err();
    match &e {
        spate::log::LogError::InvalidRecords { record_errors, .. } => {
            assert_eq!(record_errors.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![1], "{e}");
            assert!(record_errors[0].1.contains("without key"), "{e}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(log.log_end_offset(), Offset(0));
    log.append(&mut batch(&[(Some(b"a"), Some(b"1"))], 0), 0).unwrap();
    let mut plain = PartitionLog::open(&dir.path().join("plain"), LogConfig::default(), 0).unwrap();
    plain.append(&mut batch(&[(None, Some(b"2"))], 0), 0).unwrap();
}

/// A follower copies a cleaned leader byte for byte: gaps between batches, rewritten
/// batches with fewer records than offsets, and the same log end.
#[test]
fn a_follower_copies_a_cleaned_log_with_its_gaps() {
    let root = tempfile::tempdir().unwrap();
    let (mut leader, now) = compactable_log(&root.path().join("leader"));
    let pass = clean(&mut leader, now, 1 << 20).expect("due");
    assert!(pass.stats.records_removed > 0 && pass.stats.batches_rewritten > 0);
    let mut follower = PartitionLog::open(&root.path().join("follower"), LogConfig::default(), now).unwrap();
    let end = leader.log_end_offset();
    let mut fetched = Vec::new();
    while follower.log_end_offset() < end {
        let from = follower.log_end_offset();
        let bytes = leader.read(from, 200, end, true).unwrap().read_to_vec().unwrap();
        assert!(!bytes.is_empty(), "the leader has data past {from:?}");
        follower.append_replicated(&bytes, now).unwrap();
        fetched.extend(bytes);
    }
    assert_eq!(follower.log_end_offset(), end);
    assert_eq!(contents(&follower), contents(&leader));
    let whole = leader.read(leader.log_start_offset(), 1 << 20, end, true).unwrap().read_to_vec().unwrap();
    assert_eq!(fetched, whole, "byte for byte");
    // And it survives a reopen (recovery re-reads the cleaned batches).
    let before = contents(&follower);
    drop(follower);
    let follower = PartitionLog::open(&root.path().join("follower"), LogConfig::default(), now).unwrap();
    assert_eq!((contents(&follower), follower.log_end_offset()), (before, end));
}

/// A pass cancelled (the broker is stopping) ends with `Interrupted` and leaves no
/// `.cleaned` file; the log is as it was.
#[test]
fn a_cancelled_pass_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, now) = compactable_log(dir.path());
    let before = contents(&log);
    let end = log.log_end_offset();
    let job = log.clean_job(now, end, &CleanerSettings::default()).unwrap();
    job.cancel.store(true, std::sync::atomic::Ordering::Relaxed);
    let e = cleaner::run(&job).err().expect("cancelled");
    assert_eq!(e.kind(), std::io::ErrorKind::Interrupted);
    assert!(leftover_files(dir.path()).is_empty(), "{:?}", leftover_files(dir.path()));
    assert_eq!(contents(&log), before);
}

/// After a restart, a compacted log with nothing dirty still gets a pass once
/// delete.retention.ms has passed again, so tombstones whose horizon passed go.
#[test]
fn tombstones_go_after_a_restart_without_new_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, now) = compactable_log(dir.path());
    clean(&mut log, now, 1 << 20).expect("due");
    let has_b = |log: &PartitionLog| contents(log).iter().any(|r| r.1.as_deref() == Some(b"b"));
    assert!(has_b(&log));
    drop(log);
    let reopened_at = now + 5_000;
    let mut log = PartitionLog::open(dir.path(), config(), reopened_at).unwrap();
    assert!(clean(&mut log, reopened_at + 999, 1 << 20).is_none(), "nothing dirty, no horizon due yet");
    let pass = clean(&mut log, reopened_at + 1_000, 1 << 20).expect("a pass one delete.retention.ms after the open");
    assert_eq!(pass.stats.tombstones_removed, 1);
    assert!(!has_b(&log));
}

/// A transactional batch of producer `pid` (epoch 0, sequence `seq`).
fn txn_batch(records: &[Rec<'_>], ts: i64, pid: i64, seq: i32) -> Vec<u8> {
    let mut b = batch(records, ts);
    b[21..23].copy_from_slice(&0x10i16.to_be_bytes());
    b[43..51].copy_from_slice(&pid.to_be_bytes());
    b[51..53].copy_from_slice(&0i16.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    fix_crc(&mut b);
    b
}

fn end_txn(log: &mut PartitionLog, pid: i64, commit: bool, now: i64) {
    end_txn_at_epoch(log, pid, 0, commit, now)
}

/// A marker written at producer epoch `epoch` (a coordinator that aborts a timed-out
/// transaction bumps the epoch in its marker).
fn end_txn_at_epoch(log: &mut PartitionLog, pid: i64, epoch: i16, commit: bool, now: i64) {
    use spate::log::batch::{encode_marker, ControlMarker};
    use std::os::unix::fs::FileExt;
    let mut b = encode_marker(pid, epoch, ControlMarker { commit, coordinator_epoch: 0 }, now);
    let (_, write, patches) = log.append_marker_shared(&b, 0, now, 0).unwrap();
    for p in patches {
        b[p.position..p.position + p.header.len()].copy_from_slice(&p.header);
    }
    let r = write.file.write_all_at(&b, write.position);
    log.write_done(write.id, r).unwrap();
}

/// Aborted records are never a key's newest: a committed value stays when an aborted
/// transaction wrote the same key later; a committed transaction's value supersedes
/// as a plain one does; markers stay; the cleaned (merged) segment keeps the aborted
/// transaction in its `.txnindex`, across a restart; nothing at or above the last stable
/// offset is cleaned.
#[test]
fn cleaning_keeps_committed_values_over_aborted_ones_and_the_aborted_index() {
    let dir = tempfile::tempdir().unwrap();
    let now = 5_000_000;
    let mut log = PartitionLog::open(dir.path(), LogConfig { segment_bytes: 250, ..config() }, now).unwrap();
    log.append(&mut batch(&[(Some(b"a"), Some(b"good")), (Some(b"b"), Some(b"old"))], now), now).unwrap();
    log.append(&mut txn_batch(&[(Some(b"a"), Some(b"bad")), (Some(b"b"), Some(b"bad"))], now, 7, 0), now).unwrap();
    log.append(&mut txn_batch(&[(Some(b"b"), Some(b"new"))], now, 8, 0), now).unwrap();
    end_txn(&mut log, 7, false, now);
    end_txn(&mut log, 8, true, now);
    // Producer 9 leaves a transaction open: it and everything after it stays dirty.
    for i in 0..6u8 {
        log.append(&mut batch(&[(Some(b"z"), Some(&[i]))], now), now).unwrap();
    }
    let open_at = log.log_end_offset().0;
    log.append(&mut txn_batch(&[(Some(b"z"), Some(b"open"))], now, 9, 0), now).unwrap();
    for i in 0..6u8 {
        log.append(&mut batch(&[(Some(b"z"), Some(&[i + 10]))], now), now).unwrap();
    }
    log.set_config(LogConfig { segment_ms: 1, ..config() });
    log.maybe_roll(now + 1_000).unwrap();
    log.set_config(LogConfig { segment_bytes: 1 << 20, ..config() });
    let aborted_before = all_aborted(&log);
    assert_eq!(aborted_before, vec![(7, 2, 5)]);
    let before = contents(&log);
    let pass = clean(&mut log, now, 1 << 20).expect("a pass is due");
    assert!(pass.cleaned_to <= open_at, "cleaned to {} past the open transaction at {open_at}", pass.cleaned_to);
    for log in [log, PartitionLog::open(dir.path(), config(), now).unwrap()] {
        let got = contents(&log);
        let has = |o: i64, k: &[u8], v: &[u8]| got.contains(&(o, Some(k.to_vec()), Some(v.to_vec())));
        assert!(has(0, b"a", b"good"), "the committed value stays: {got:?}");
        assert!(!has(1, b"b", b"old"), "superseded by the committed transaction");
        assert!(has(4, b"b", b"new"));
        // Both markers are still there (control records: key version 0, type 0 / 1).
        assert!(got.contains(&(5, Some(vec![0, 0, 0, 0]), Some(vec![0, 0, 0, 0, 0, 0]))), "{got:?}");
        assert!(got.contains(&(6, Some(vec![0, 0, 0, 1]), Some(vec![0, 0, 0, 0, 0, 0]))), "{got:?}");
        // What was not below the last stable offset is as it was.
        let tail = |c: &[Stored]| c.iter().filter(|r| r.0 >= open_at).cloned().collect::<Vec<_>>();
        assert_eq!(tail(&got), tail(&before));
        assert_eq!(all_aborted(&log), aborted_before, "the aborted transaction is still reported");
    }
}

/// Every aborted transaction a read_committed reader of the whole log is told of.
fn all_aborted(log: &PartitionLog) -> Vec<(i64, i64, i64)> {
    let (mut at, mut found) = (log.log_start_offset(), Vec::new());
    while at < log.log_end_offset() {
        let plan = log.read(at, 1 << 20, log.log_end_offset(), true).unwrap();
        for a in log.aborted_txns(at, &plan) {
            if !found.contains(&(a.producer_id, a.first_offset, a.last_offset)) {
                found.push((a.producer_id, a.first_offset, a.last_offset));
            }
        }
        let bytes = plan.read_to_vec().unwrap();
        let mut buf = &bytes[..];
        while !buf.is_empty() {
            let size = 12 + i32::from_be_bytes(buf[8..12].try_into().unwrap()) as usize;
            let base = i64::from_be_bytes(buf[..8].try_into().unwrap());
            at = Offset(base + i32::from_be_bytes(buf[23..27].try_into().unwrap()) as i64 + 1);
            buf = &buf[size..];
        }
    }
    found
}

fn kv(k: &str, v: &str) -> (Key, Vec<u8>) {
    (k.as_bytes().to_vec(), v.as_bytes().to_vec())
}

/// The aborted-transaction entries in every `.txnindex` file of `dir`, as (producer id,
/// first offset, last offset).
fn txn_index_files(dir: &Path) -> Vec<(i64, i64, i64)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(".txnindex"))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for p in names {
        for e in std::fs::read(&p).unwrap().chunks_exact(34) {
            let a = spate::log::txn_index::AbortedTxn::decode(e).unwrap();
            out.push((a.producer_id, a.first_offset, a.last_offset));
        }
    }
    out
}

/// Roll the active segment away (segment.ms) and let the next pass merge every rolled
/// segment into one.
fn roll_all(log: &mut PartitionLog, now: i64) {
    log.set_config(LogConfig { segment_ms: 1, ..config() });
    log.maybe_roll(now + 1_000).unwrap();
    log.set_config(LogConfig { segment_bytes: 1 << 20, ..config() });
}

/// The marker batch at `offset`, if it is still there.
fn marker_at(log: &PartitionLog, offset: i64) -> Option<ReadBatch> {
    read_batches(log, log.log_end_offset()).into_iter().find(|b| b.base == offset && b.attributes & ATTR_CONTROL != 0)
}

/// Producer 7 aborts a transaction over keys a and b, then commits one; producer 8
/// commits two. Offsets: 0 a=v0; 1-2 (7) a=bad b=bad; 3 (8) c=c8; 4 ABORT 7; 5 COMMIT 8;
/// 6 (7) d=d7; 7 COMMIT 7; 8 (8) e=e8; 9 COMMIT 8.
fn aborted_then_committed(dir: &Path, now: i64) -> PartitionLog {
    let mut log = PartitionLog::open(dir, LogConfig { segment_bytes: 250, ..config() }, now).unwrap();
    log.append(&mut batch(&[(Some(b"a"), Some(b"v0"))], now), now).unwrap();
    log.append(&mut txn_batch(&[(Some(b"a"), Some(b"bad")), (Some(b"b"), Some(b"bad"))], now, 7, 0), now).unwrap();
    log.append(&mut txn_batch(&[(Some(b"c"), Some(b"c8"))], now, 8, 0), now).unwrap();
    end_txn(&mut log, 7, false, now);
    end_txn(&mut log, 8, true, now);
    log.append(&mut txn_batch(&[(Some(b"d"), Some(b"d7"))], now, 7, 2), now).unwrap();
    end_txn(&mut log, 7, true, now);
    log.append(&mut txn_batch(&[(Some(b"e"), Some(b"e8"))], now, 8, 1), now).unwrap();
    end_txn(&mut log, 8, true, now);
    assert_eq!(log.log_end_offset(), Offset(10));
    roll_all(&mut log, now);
    log
}

/// An aborted transaction's records go in the first pass, whatever their keys; its
/// ABORT marker gets a delete horizon in that pass and goes in a pass after it; its
/// `.txnindex` entry goes with its records; COMMIT markers whose transactions still have
/// records stay; read_committed and read_uncommitted readers see the committed values
/// only, before and after a restart; the producers' sequences survive.
#[test]
fn aborted_records_go_and_their_marker_after_its_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let now = 5_000_000;
    let mut log = aborted_then_committed(dir.path(), now);
    let committed: BTreeMap<Key, Vec<u8>> =
        [kv("a", "v0"), kv("c", "c8"), kv("d", "d7"), kv("e", "e8")].into_iter().collect();
    assert_eq!(view(&mut log, true), committed);
    assert_eq!(view(&mut log, false)[&b"a".to_vec()], b"bad", "before a pass the aborted records are there");
    assert_eq!(all_aborted(&log), vec![(7, 1, 4)]);

    let first = clean(&mut log, now, 1 << 20).expect("a pass is due");
    assert_eq!((first.stats.aborted_records_removed, first.stats.markers_removed), (2, 0));
    let got = contents(&log);
    assert!(got.iter().all(|r| r.0 != 1 && r.0 != 2), "the aborted records are gone: {got:?}");
    assert_eq!(view(&mut log, true), committed);
    assert_eq!(view(&mut log, false), committed, "read_uncommitted sees no aborted record either");
    let abort = marker_at(&log, 4).expect("the ABORT marker stays until its horizon");
    assert_eq!((abort.attributes & 0x40, abort.base_timestamp), (0x40, now + 1_000), "{abort:?}");
    for commit in [5, 7, 9] {
        let m = marker_at(&log, commit).unwrap_or_else(|| panic!("COMMIT at {commit} gone: {got:?}"));
        assert_eq!(m.attributes & 0x40, 0, "COMMIT at {commit}: its records remain, no horizon");
    }
    assert_eq!(all_aborted(&log), vec![], "the aborted transaction has nothing left to hide");
    assert_eq!(txn_index_files(dir.path()), vec![]);
    assert_eq!(first.next_horizon_ms, Some(now + 1_000));

    assert!(clean(&mut log, now + 999, 1 << 20).is_none(), "nothing dirty, horizon not reached: no pass");
    let second = clean(&mut log, now + 1_000, 1 << 20).expect("the marker's horizon makes a pass due");
    assert_eq!(second.stats.markers_removed, 1);
    assert!(marker_at(&log, 4).is_none(), "{:?}", contents(&log));
    assert!([5, 7, 9].iter().all(|&o| marker_at(&log, o).is_some()));
    assert_eq!(view(&mut log, true), committed);

    let before = contents(&log);
    drop(log); // kill -9: no close
    let mut log = PartitionLog::open(dir.path(), config(), now + 2_000).unwrap();
    assert_eq!(contents(&log), before);
    assert_eq!((view(&mut log, true), view(&mut log, false)), (committed.clone(), committed));
    // Producer 7's last batch (offset 6, sequence 2) is still known: a retry is a
    // duplicate, a gap is out of order, the next sequence goes in.
    let retry = log.append(&mut txn_batch(&[(Some(b"d"), Some(b"d7"))], now, 7, 2), now).unwrap_err();
    assert!(matches!(&retry, spate::log::LogError::DuplicateBatch(i) if i.base_offset == Offset(6)), "{retry}");
    let gap = log.append(&mut txn_batch(&[(Some(b"f"), Some(b"f8"))], now, 8, 5), now).unwrap_err();
    assert!(matches!(gap, spate::log::LogError::Producer(_)), "{gap}");
    log.append(&mut txn_batch(&[(Some(b"f"), Some(b"f8"))], now, 8, 2), now).unwrap();
}

/// A COMMIT marker stays while its transaction's records are there (even superseded in
/// the same pass); once a pass finds none, it gets a horizon, and goes after it.
#[test]
fn a_commit_marker_goes_once_its_records_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let now = 5_000_000;
    let mut log = PartitionLog::open(dir.path(), LogConfig { segment_bytes: 250, ..config() }, now).unwrap();
    log.append(&mut txn_batch(&[(Some(b"c"), Some(b"old"))], now, 8, 0), now).unwrap();
    end_txn(&mut log, 8, true, now); // 1
    log.append(&mut txn_batch(&[(Some(b"x"), Some(b"x8"))], now, 8, 1), now).unwrap();
    end_txn(&mut log, 8, true, now); // 3
    log.append(&mut batch(&[(Some(b"c"), Some(b"new"))], now), now).unwrap();
    roll_all(&mut log, now);
    let first = clean(&mut log, now, 1 << 20).expect("due");
    assert_eq!(first.stats.records_removed, 1, "c=old superseded");
    assert_eq!(marker_at(&log, 1).expect("its record was still there in this pass").attributes & 0x40, 0);
    // New writes make a second pass due: it finds no record of the transaction at 1.
    log.append(&mut batch(&[(Some(b"y"), Some(b"y"))], now), now).unwrap();
    roll_all(&mut log, now);
    let second = clean(&mut log, now + 10, 1 << 20).expect("dirty");
    assert_eq!(second.next_horizon_ms, Some(now + 1_010));
    assert_eq!(marker_at(&log, 1).expect("kept until its horizon").base_timestamp, now + 1_010);
    clean(&mut log, now + 1_010, 1 << 20).expect("horizon");
    assert!(marker_at(&log, 1).is_none());
    let kept = marker_at(&log, 3).expect("x8 is producer 8's last batch: its COMMIT stays");
    assert_eq!(kept.attributes & 0x40, 0);
    let want: BTreeMap<Key, Vec<u8>> = [kv("c", "new"), kv("x", "x8"), kv("y", "y")].into_iter().collect();
    assert_eq!((view(&mut log, true), view(&mut log, false)), (want.clone(), want));
}

/// An aborted batch that is its producer's last stays, emptied (Kafka's RETAIN_EMPTY):
/// the producer's sequence survives, and so do its ABORT marker and index entry.
#[test]
fn a_producers_last_batch_if_aborted_stays_empty() {
    let dir = tempfile::tempdir().unwrap();
    let now = 5_000_000;
    let mut log = PartitionLog::open(dir.path(), LogConfig { segment_bytes: 250, ..config() }, now).unwrap();
    log.append(&mut batch(&[(Some(b"a"), Some(b"v0"))], now), now).unwrap();
    log.append(&mut txn_batch(&[(Some(b"a"), Some(b"bad")), (Some(b"b"), Some(b"bad"))], now, 7, 0), now).unwrap();
    end_txn(&mut log, 7, false, now); // 3
    roll_all(&mut log, now);
    for t in [now, now + 5_000] {
        let pass = clean(&mut log, t, 1 << 20);
        assert!(pass.is_some() || t > now);
        let b = read_batches(&log, log.log_end_offset());
        let kept = b.iter().find(|b| b.base == 1).expect("producer 7's last batch stays");
        assert_eq!((kept.last, kept.records.len()), (2, 0), "emptied");
        assert!(marker_at(&log, 3).is_some_and(|m| m.attributes & 0x40 == 0));
        assert_eq!(all_aborted(&log), vec![(7, 1, 3)]);
    }
    let want: BTreeMap<Key, Vec<u8>> = [kv("a", "v0")].into_iter().collect();
    assert_eq!((view(&mut log, true), view(&mut log, false)), (want.clone(), want));
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config(), now).unwrap();
    let retry = log.append(&mut txn_batch(&[(Some(b"a"), Some(b"bad")), (Some(b"b"), Some(b"bad"))], now, 7, 0), now);
    assert!(matches!(&retry, Err(spate::log::LogError::DuplicateBatch(i)) if i.base_offset == Offset(1)), "{retry:?}");
}

/// A producer whose last entry is a marker: the coordinator aborted its transaction with
/// a bumped epoch, so the producer has no batch of its current epoch. Its aborted batch
/// goes, and the marker is kept past its horizon (as Kafka keeps it): without it, a
/// rebuild from the log would forget the producer's epoch and let its old epoch write.
#[test]
fn a_marker_that_bumped_a_producers_epoch_stays() {
    let dir = tempfile::tempdir().unwrap();
    let now = 5_000_000;
    let mut log = PartitionLog::open(dir.path(), LogConfig { segment_bytes: 250, ..config() }, now).unwrap();
    log.append(&mut batch(&[(Some(b"a"), Some(b"v0"))], now), now).unwrap();
    log.append(&mut txn_batch(&[(Some(b"a"), Some(b"bad"))], now, 7, 0), now).unwrap(); // 1, epoch 0
    end_txn_at_epoch(&mut log, 7, 1, false, now); // 2: ABORT at epoch 1
    log.append(&mut batch(&[(Some(b"b"), Some(b"v1"))], now), now).unwrap();
    roll_all(&mut log, now);
    for t in [now, now + 5_000] {
        clean(&mut log, t, 1 << 20);
    }
    assert!(read_batches(&log, log.log_end_offset()).iter().all(|b| b.base != 1), "the aborted batch goes");
    let m = marker_at(&log, 2).expect("the marker of the producer's current epoch stays past its horizon");
    assert_eq!(m.attributes & 0x40, 0, "never given a delete horizon: {m:?}");
    let want: BTreeMap<Key, Vec<u8>> = [kv("a", "v0"), kv("b", "v1")].into_iter().collect();
    assert_eq!((view(&mut log, true), view(&mut log, false)), (want.clone(), want));
    // kill -9 (no close), then a rebuild from the log alone (no producer snapshot): the
    // producer is at epoch 1.
    drop(log);
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let path = f.unwrap().path();
        if path.extension().is_some_and(|e| e == "snapshot") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let mut log = PartitionLog::open(dir.path(), config(), now + 6_000).unwrap();
    let zombie = log.append(&mut txn_batch(&[(Some(b"z"), Some(b"zombie"))], now, 7, 1), now + 6_000);
    assert!(matches!(&zombie, Err(spate::log::LogError::Producer(_))), "epoch 0 after epoch 1: {zombie:?}");
}

/// The cleaned `.txnindex` lacks what the old segments still hold, so it takes its
/// place only once the swap is decided. A kill -9 before that keeps the old index with
/// the old segments; one after it (the `.log.swap` named) finishes the swap with the
/// cleaned index. Either way a read_committed reader sees the committed values only.
#[test]
fn a_swap_interrupted_keeps_the_aborted_index_with_the_aborted_records() {
    for decided in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let now = 5_000_000;
        let mut log = aborted_then_committed(d, now);
        let committed = view(&mut log, true);
        log.flush().unwrap();
        let end = log.log_end_offset();
        let job = log.clean_job(now, end, &CleanerSettings::default()).expect("due");
        let outcome = cleaner::run(&job).unwrap();
        let base = outcome.groups[0].base_offset;
        drop(log);
        let name = |s: &str| d.join(format!("{base:020}{s}"));
        assert_eq!(std::fs::metadata(name(".txnindex.cleaned")).unwrap().len(), 0, "written, empty");
        if decided {
            std::fs::rename(name(".log.cleaned"), name(".log.swap")).unwrap();
        }
        let mut log = PartitionLog::open(d, config(), now).unwrap();
        assert!(leftover_files(d).is_empty(), "{:?}", leftover_files(d));
        assert_eq!(view(&mut log, true), committed, "decided: {decided}");
        let aborted_records = contents(&log).iter().filter(|r| r.2.as_deref() == Some(b"bad")).count();
        if decided {
            assert_eq!((aborted_records, all_aborted(&log)), (0, vec![]));
        } else {
            assert_eq!((aborted_records, all_aborted(&log)), (2, vec![(7, 1, 4)]));
        }
    }
}

/// When tombstones were the log's last batch and a segment.ms roll (with no append) left
/// the active segment empty, the pass that removes them keeps that batch, emptied: a log
/// ending in a gap leaves a reader at the gap with nothing to read below the log end
/// offset (librdkafka never reported the partition's end; CI's test_compaction.py once
/// timed out on it). A batch that is not the log's last is dropped when emptied.
#[test]
fn the_logs_last_batch_stays_empty_when_its_tombstones_go() {
    let dir = tempfile::tempdir().unwrap();
    let now = 5_000_000;
    let mut log = PartitionLog::open(dir.path(), LogConfig { segment_bytes: 250, ..config() }, now).unwrap();
    for round in 0..6u8 {
        let v = [b'v', round];
        log.append(&mut batch(&[(Some(b"a"), Some(&v)), (Some(b"b"), Some(&v))], now + round as i64), now).unwrap();
    }
    // Tombstones for both keys in their own batches: b's first (not the log's last), then a's.
    log.append(&mut batch(&[(Some(b"b"), None)], now + 10), now).unwrap();
    log.append(&mut batch(&[(Some(b"a"), None)], now + 11), now).unwrap();
    let end = log.log_end_offset();
    log.set_config(LogConfig { segment_ms: 1, ..config() });
    log.maybe_roll(now + 1_000).unwrap();
    log.set_config(LogConfig { segment_bytes: 1 << 20, ..config() });
    clean(&mut log, now + 1_000, 1 << 20).expect("due");
    let pass = clean(&mut log, now + 2_000, 1 << 20).expect("the horizon makes a pass due");
    assert_eq!(pass.stats.tombstones_removed, 2);
    assert!(contents(&log).is_empty(), "{:?}", contents(&log));
    assert_eq!(log.log_end_offset(), end);
    let batches = read_batches(&log, end);
    let last = batches.last().expect("the log's last batch stays");
    assert_eq!((last.base, last.last, last.records.len()), (end.0 - 1, end.0 - 1, 0), "{batches:?}");
    assert!(batches.iter().all(|b| b.last == end.0 - 1 || !b.records.is_empty()), "{batches:?}");
    let before = read_batches(&log, end);
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config(), now + 3_000).unwrap();
    assert_eq!(read_batches(&log, end), before, "the empty batch survives a reopen");
    // Once it is no longer the log's last, a later pass drops it.
    log.append(&mut batch(&[(Some(b"c"), Some(b"1"))], now + 3_000), now + 3_000).unwrap();
    log.set_config(LogConfig { segment_ms: 1, ..config() });
    log.maybe_roll(now + 4_000).unwrap();
    log.set_config(config());
    clean(&mut log, now + 4_000, 1 << 20).expect("the new record makes a pass due");
    let end2 = log.log_end_offset();
    let batches = read_batches(&log, end2);
    assert!(batches.iter().all(|b| !b.records.is_empty()), "{batches:?}");
    assert_eq!(contents(&log), [(end.0, Some(b"c".to_vec()), Some(b"1".to_vec()))], "{batches:?}");
}
