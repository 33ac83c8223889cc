//! Log compaction (`cleanup.policy=compact`): the cleaner keeps the newest record per key.
//!
//! The data core never cleans. It plans a pass (`PartitionLog::clean_job`: which rolled
//! segments, from which offset they are dirty), this module does the pass on the
//! blocking pool (`run`), and the data core swaps the result in with renames only
//! (`PartitionLog::install_cleaned`). Written by hand: no crate cleans Kafka segments.
//!
//! # One pass
//!
//! 1. Key map: every record of the dirty range `[dirty_from, end)` (the segments the job
//!    lists, from the cleaner checkpoint on) is read; the map keeps each key's newest
//!    offset. Keys are kept whole (no hash, so no collision can ever drop a record),
//!    bounded by `map_bytes_max` (`log.cleaner.dedupe.buffer.size`): where the next
//!    batch's new keys would not fit, the map stops at that batch and the pass cleans
//!    only below it (`CleanOutcome::cleaned_to`, the next checkpoint).
//! 2. Rewrite: the job's segments, grouped while the group stays within `segment.bytes`
//!    (small cleaned segments merge, as Kafka's), are copied into one new segment per
//!    group, `<base>.log.cleaned` with its `.index.cleaned` and `.timeindex.cleaned`
//!    (`base` is the group's first segment's), then fsynced. A record is dropped when
//!    a newer record of its key lies below `cleaned_to`, when it has no key (a compacted
//!    log cannot say what it is the newest of; Kafka's cleaner drops it too), or when it
//!    is a tombstone whose batch's delete horizon (KIP-534) has passed. A batch with a
//!    surviving tombstone and no horizon yet gets one: `now + delete.retention.ms`.
//!    Batches nothing changes in are copied byte for byte (compressed or not); the
//!    others are rebuilt with the same base offset, last offset delta, leader epoch and
//!    producer fields, their records re-encoded and recompressed with the same codec.
//!    A batch left with no record is dropped, unless it is a live producer's last batch
//!    (then it stays as an empty batch, as Kafka keeps it, so the producer's sequence
//!    survives a rebuild from the log) or the log's last batch (`CleanJob::log_end_batch`:
//!    the log never ends in a gap that readers could not get past). A later pass drops
//!    such an empty batch once neither holds (Kafka's `DELETE_EMPTY`).
//! 3. Transactions (Kafka's `CleanedTransactionMetadata`, KIP-98): both steps walk the
//!    batches in offset order with a `TxnWalk`, which takes the log's aborted
//!    transactions (`CleanJob::aborted`, the `.txnindex` entries) sorted by first offset
//!    as the walk reaches them, and keeps per producer its aborted transaction under way
//!    and whether a (not aborted) transactional batch was passed since its last marker:
//!    O(1) amortized per batch. A batch of an aborted transaction never enters the key
//!    map (an aborted record must not make a committed one look superseded) and is
//!    removed whole, whatever its keys; a live producer's last batch stays, emptied (as
//!    Kafka's `RETAIN_EMPTY`). An ABORT marker whose transaction kept no batch in this
//!    pass, and a COMMIT marker whose transaction had no batch left to pass, are
//!    discardable: as a tombstone, the first such pass gives the marker a delete horizon
//!    (`now + delete.retention.ms`, KIP-534) and a pass after it removes it. Until then
//!    a marker stays, so a rebuild from the log never finds a transaction left open.
//!    A cleaned segment's `.txnindex.cleaned` holds the entries of the segments it
//!    replaces but those of aborted transactions that lost every batch (Kafka appends
//!    an `AbortedTxn` to the cleaned index only while its transaction has batches);
//!    read_committed readers stay right either way (an entry whose batches are gone
//!    hides nothing, and a kept aborted batch is empty). Nothing at or above the last
//!    stable offset is cleaned.
//!
//! Offsets never move: a cleaned log has gaps, and readers (consumers and followers)
//! skip them. Batches whose records cannot be read (a codec error, a record that does
//! not parse, more than `DECOMPRESSED_BYTES_MAX` inflated) are kept whole and their
//! keys left out of the map, so nothing is dropped on their account.
//!
//! # The swap, crash-safe (written down in `PartitionLog::install_cleaned`)
//!
//! `.cleaned` files are complete and fsynced before the data core names them. The core
//! renames `<base>.log.cleaned` to `<base>.log.swap` (from here the swap is decided),
//! moves `<base>.txnindex.cleaned` (if any) over `<base>.txnindex` (not before: the
//! cleaned one lacks the aborted transactions whose batches the old segments still
//! hold), renames the other replaced segments to `*.deleted`, moves the cleaned indexes
//! over `<base>.index` / `<base>.timeindex`, and finally `<base>.log.swap` over
//! `<base>.log`. A group whose segments had aborted transactions always gets a
//! `.txnindex.cleaned` (empty if none is left), so a swap that finds none has moved it.
//! An open finishes a swap it finds (`finish_swaps`, the `.txnindex.cleaned` rename
//! included) and removes the other `.cleaned` leftovers.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::batch::{self, BatchHeader, HEADER_BYTES};
use super::segment::{self, Segment};
use super::txn_index::AbortedTxn;

/// Suffix of a segment's files while the cleaner writes them.
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// Suffix of a cleaned `.log` once the data core decided to swap it in.
pub const SWAP_SUFFIX: &str = ".swap";
/// The cleaner's progress in one partition: Kafka's `cleaner-offset-checkpoint` format
/// (version 0, one entry), kept in the partition's directory.
pub const CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";
/// What one batch may inflate to while the cleaner reads it; a larger one is kept whole.
pub const DECOMPRESSED_BYTES_MAX: usize = 64 << 20;
/// Bytes the key map counts per entry beyond the key itself (hash table slot, the
/// offset, the boxed key's header): an estimate that keeps the map's real size under
/// `log.cleaner.dedupe.buffer.size`.
pub const KEY_MAP_ENTRY_OVERHEAD_BYTES: usize = 48;
/// Kafka's delete horizon flag (KIP-534): the batch's base timestamp holds the time after
/// which its tombstones may go.
pub const ATTR_DELETE_HORIZON: i16 = 0x40;

/// A rolled segment as the job sees it: its file stays readable whatever the core does
/// to the name meanwhile.
#[derive(Clone)]
pub struct SegmentFile {
    pub base_offset: i64,
    /// `Segment::id` of the segment read.
    pub id: u64,
    pub next_offset: i64,
    pub size_bytes: u64,
    pub log: Arc<File>,
    /// The segment's aborted transactions (`.txnindex`): the cleaned segment keeps those
    /// that still have batches.
    pub aborted: Vec<AbortedTxn>,
}

/// One cleaning pass over one partition, planned by the data core.
pub struct CleanJob {
    pub dir: PathBuf,
    /// Contiguous rolled segments from the log's first; all below the cleanable end.
    pub segments: Vec<SegmentFile>,
    /// The cleaner checkpoint: records from here on are dirty (not yet in any map).
    pub dirty_from: i64,
    pub now_ms: i64,
    pub delete_retention_ms: i64,
    pub segment_bytes: u64,
    pub index_interval_bytes: u32,
    pub segment_index_bytes: u32,
    pub batch_bytes_max: usize,
    /// Live producers by id: (epoch, last offset of the last batch, -1 with none). A
    /// live producer's last batch is kept even when emptied (Kafka's RETAIN_EMPTY), and
    /// so is a marker of its current epoch above that batch: a coordinator that bumped
    /// the epoch with an ABORT leaves the producer no batch of that epoch, and without
    /// the marker a rebuild from the log would find the producer at its old epoch, or
    /// not at all (`keeps_producer`).
    pub live_producers: HashMap<i64, (i16, i64)>,
    /// The log's last offset when no batch lies above the job's segments (the active
    /// segment is empty): the batch that ends there stays, emptied if need be, so the log
    /// never ends in a gap. A reader fetching from a gap at the end gets nothing below the
    /// log end offset: librdkafka never reports the partition's end and the consumer's lag
    /// never reaches 0 until the next append. Kafka rolls only on an append, so its last
    /// batch is always in the uncleaned active segment; Spate also rolls by segment.ms
    /// with no append (`Shard::tick`).
    pub log_end_batch: Option<i64>,
    /// Every aborted transaction of the log: their batches never enter the key map (an
    /// aborted record must not make a committed one of its key look superseded).
    pub aborted: Vec<AbortedTxn>,
    /// log.cleaner.dedupe.buffer.size
    pub map_bytes_max: usize,
    /// log.cleaner.io.max.bytes.per.second (f64::INFINITY: no limit)
    pub io_bytes_per_second: f64,
    /// Set by the shard when the broker stops: the pass ends at the next batch
    /// (`ErrorKind::Interrupted`), its `.cleaned` files removed.
    pub cancel: Arc<std::sync::atomic::AtomicBool>,
}

fn cancelled(job: &CleanJob) -> std::io::Result<()> {
    if job.cancel.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(std::io::Error::new(std::io::ErrorKind::Interrupted, "cancelled: the broker is stopping"));
    }
    Ok(())
}

/// One group of segments replaced by one cleaned segment, `<base_offset>.*.cleaned`.
pub struct CleanedGroup {
    pub base_offset: i64,
    /// The segments it replaces (base offset, `Segment::id`): the core swaps only if
    /// these are still its segments.
    pub replaces: Vec<(i64, u64)>,
    pub size_bytes: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CleanStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_removed: u64,
    pub tombstones_removed: u64,
    /// Of `records_removed`: records of aborted transactions.
    pub aborted_records_removed: u64,
    /// Transaction markers removed (after their delete horizon).
    pub markers_removed: u64,
    pub batches_rewritten: u64,
}

pub struct CleanOutcome {
    pub groups: Vec<CleanedGroup>,
    /// The clock the pass was planned at.
    pub now_ms: i64,
    /// The next cleaner checkpoint: where the key map stopped.
    pub cleaned_to: i64,
    /// The earliest delete horizon still ahead of a tombstone or marker left in place
    /// (a later pass is due then even with nothing dirty).
    pub next_horizon_ms: Option<i64>,
    pub stats: CleanStats,
    pub elapsed: Duration,
}

/// Each key's newest offset, keys kept whole, within a byte budget.
pub struct KeyMap {
    map: HashMap<Box<[u8]>, i64>,
    bytes: usize,
    bytes_max: usize,
}

impl KeyMap {
    pub fn new(bytes_max: usize) -> Self {
        KeyMap { map: HashMap::new(), bytes: 0, bytes_max }
    }

    /// Take one batch's keyed records `(key, offset)`, all or none: false (and nothing
    /// taken) when its new keys would pass the budget.
    pub fn try_add(&mut self, keyed: &[(&[u8], i64)]) -> bool {
        let mut new_bytes = 0usize;
        let mut seen = HashSet::new();
        for (key, _) in keyed {
            if !self.map.contains_key(*key) && seen.insert(*key) {
                new_bytes += key.len() + KEY_MAP_ENTRY_OVERHEAD_BYTES;
            }
        }
        if self.bytes + new_bytes > self.bytes_max {
            return false;
        }
        self.bytes += new_bytes;
        for (key, offset) in keyed {
            match self.map.get_mut(*key) {
                Some(o) => *o = (*o).max(*offset),
                None => {
                    self.map.insert((*key).into(), *offset);
                }
            }
        }
        true
    }

    pub fn latest(&self, key: &[u8]) -> Option<i64> {
        self.map.get(key).copied()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// One record of a batch, borrowed from its (decompressed) bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub attributes: u8,
    pub timestamp: i64,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The header count and the headers, as they were.
    pub headers: &'a [u8],
}

/// The records of a batch whose record bytes (decompressed) are `records`; None when
/// they do not parse within their bytes. Never allocates for a count it has not seen.
pub fn parse_records<'a>(records: &'a [u8], h: &BatchHeader) -> Option<Vec<Record<'a>>> {
    // A record takes at least 7 bytes; a count beyond that cannot be there.
    if h.records_count < 0 || h.records_count as usize > records.len() / 7 + 1 {
        return None;
    }
    let mut out = Vec::with_capacity(h.records_count as usize);
    let mut pos = 0usize;
    let bytes_field = |pos: &mut usize, end: usize| -> Option<Option<&'a [u8]>> {
        let len = batch::read_varlong(records, pos)?;
        if len < 0 {
            return Some(None);
        }
        let len = usize::try_from(len).ok()?;
        if len > end.saturating_sub(*pos) {
            return None;
        }
        let b = &records[*pos..*pos + len];
        *pos += len;
        Some(Some(b))
    };
    for _ in 0..h.records_count {
        let length = usize::try_from(batch::read_varlong(records, &mut pos)?).ok()?;
        if length > records.len().saturating_sub(pos) {
            return None;
        }
        let end = pos + length;
        let attributes = *records.get(pos)?;
        pos += 1;
        let timestamp_delta = batch::read_varlong(records, &mut pos)?;
        let offset_delta = batch::read_varlong(records, &mut pos)?;
        let key = bytes_field(&mut pos, end)?;
        let value = bytes_field(&mut pos, end)?;
        if pos > end {
            return None;
        }
        let headers = &records[pos..end];
        pos = end;
        // With a delete horizon the base timestamp holds the horizon and the deltas are
        // from it (Kafka's builder writes them so): the sum is the record's time either way.
        let timestamp = h.base_timestamp.checked_add(timestamp_delta)?;
        let offset = h.base_offset.checked_add(offset_delta)?;
        if offset < h.base_offset || offset > h.last_offset() {
            return None;
        }
        out.push(Record { attributes, timestamp, offset, key, value, headers });
    }
    (pos == records.len()).then_some(out)
}

fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut raw = ((v << 1) ^ (v >> 63)) as u64;
    while raw >= 0x80 {
        out.push((raw as u8 & 0x7f) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

fn encode_record(out: &mut Vec<u8>, r: &Record, base_timestamp: i64, base_offset: i64) {
    let mut body = Vec::with_capacity(16 + r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len));
    body.push(r.attributes);
    put_varlong(&mut body, r.timestamp.wrapping_sub(base_timestamp));
    put_varlong(&mut body, r.offset - base_offset);
    for field in [r.key, r.value] {
        match field {
            Some(b) => {
                put_varlong(&mut body, b.len() as i64);
                body.extend_from_slice(b);
            }
            None => put_varlong(&mut body, -1),
        }
    }
    body.extend_from_slice(r.headers);
    put_varlong(out, body.len() as i64);
    out.extend_from_slice(&body);
}

/// Snappy as Kafka's Java client writes it (xerial framing, 32 KiB blocks): every
/// Kafka client reads it.
const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
const XERIAL_BLOCK_BYTES: usize = 32 * 1024;

/// Compress record bytes with Kafka codec `codec` (1 gzip, 2 snappy, 3 lz4, 4 zstd).
pub fn compress(codec: i16, data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let other = |e: String| std::io::Error::other(e);
    match codec {
        0 => Ok(data.to_vec()),
        1 => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data)?;
            e.finish()
        }
        2 => {
            let mut out = XERIAL_HEADER.to_vec();
            let mut enc = snap::raw::Encoder::new();
            for block in data.chunks(XERIAL_BLOCK_BYTES) {
                let c = enc.compress_vec(block).map_err(|e| other(e.to_string()))?;
                out.extend_from_slice(&(c.len() as u32).to_be_bytes());
                out.extend_from_slice(&c);
            }
            Ok(out)
        }
        3 => {
            let mut e = lz4::EncoderBuilder::new().build(Vec::new())?;
            e.write_all(data)?;
            let (out, r) = e.finish();
            r.map(|_| out)
        }
        4 => zstd::encode_all(data, 3),
        c => Err(other(format!("unknown codec {c}"))),
    }
}

/// Build a batch: `h`'s base offset, last offset delta, leader epoch, producer fields and
/// flags, with `records` (already in order) and `attributes`' codec.
fn build_batch(h: &BatchHeader, attributes: i16, base_timestamp: i64, records: &[Record]) -> std::io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    for r in records {
        encode_record(&mut raw, r, base_timestamp, h.base_offset);
    }
    let codec = attributes & batch::ATTR_COMPRESSION_MASK;
    let body = if records.is_empty() { raw } else { compress(codec, &raw)? };
    let max_timestamp = if h.is_log_append_time() {
        h.max_timestamp
    } else {
        records.iter().map(|r| r.timestamp).max().unwrap_or(h.max_timestamp)
    };
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&h.base_offset.to_be_bytes());
    out.extend_from_slice(&((HEADER_BYTES - batch::LOG_OVERHEAD_BYTES + body.len()) as i32).to_be_bytes());
    out.extend_from_slice(&h.partition_leader_epoch.to_be_bytes());
    out.push(2);
    out.extend_from_slice(&[0; 4]); // crc, below
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&h.last_offset_delta.to_be_bytes());
    out.extend_from_slice(&base_timestamp.to_be_bytes());
    out.extend_from_slice(&max_timestamp.to_be_bytes());
    out.extend_from_slice(&h.producer_id.to_be_bytes());
    out.extend_from_slice(&h.producer_epoch.to_be_bytes());
    out.extend_from_slice(&h.base_sequence.to_be_bytes());
    out.extend_from_slice(&(records.len() as i32).to_be_bytes());
    out.extend_from_slice(&body);
    let crc = batch::compute_crc(&out);
    out[batch::OFF_CRC..batch::OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Kafka's broker-side `compression.type`: the batch re-encoded with `codec` (records,
/// offsets, timestamps and producer fields as they were). None when it already uses that
/// codec or is a control batch; Err when its records cannot be read.
pub fn recompress_batch(whole: &[u8], h: &BatchHeader, codec: i16) -> Result<Option<Vec<u8>>, String> {
    if h.compression() == codec || h.attributes & batch::ATTR_CONTROL != 0 {
        return Ok(None);
    }
    let (inflated, _) = batch_records(whole, h).ok_or("the batch's records cannot be decompressed")?;
    let bytes = inflated.as_deref().unwrap_or(&whole[HEADER_BYTES..]);
    let records = parse_records(bytes, h).ok_or("the batch's records cannot be read")?;
    let attributes = (h.attributes & !batch::ATTR_COMPRESSION_MASK) | codec;
    build_batch(h, attributes, h.base_timestamp, &records).map(Some).map_err(|e| e.to_string())
}

/// What the cleaner does with one batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    Drop { records: u64, tombstones: u64 },
    Rewrite { batch: Vec<u8>, records_removed: u64, tombstones_removed: u64 },
}

/// The rules one batch is cleaned by.
pub struct BatchRules<'a> {
    pub map: &'a KeyMap,
    /// Records at or above this offset are not covered by the map: kept.
    pub map_end: i64,
    pub now_ms: i64,
    pub delete_retention_ms: i64,
    /// The batch is a live producer's last, or the log's last (`CleanJob::log_end_batch`):
    /// kept (empty if need be).
    pub keep_empty: bool,
}

/// The records of a whole, checked batch (decompressed up to DECOMPRESSED_BYTES_MAX);
/// None when they cannot be read. Control batches have none the cleaner looks at.
pub fn batch_records(batch: &[u8], h: &BatchHeader) -> Option<(Option<Vec<u8>>, usize)> {
    let body = batch.get(HEADER_BYTES..)?;
    match h.compression() {
        0 => Some((None, body.len())),
        codec => {
            let d = batch::decompress_bounded(codec, body, DECOMPRESSED_BYTES_MAX)?;
            let n = d.len();
            Some((Some(d), n))
        }
    }
}

/// Decide one batch (whole, CRC checked). Pure: the fuzz target drives it with any bytes.
pub fn clean_batch(batch: &[u8], h: &BatchHeader, rules: &BatchRules) -> std::io::Result<Verdict> {
    if h.attributes & batch::ATTR_CONTROL != 0 || h.base_offset >= rules.map_end {
        return Ok(Verdict::Keep);
    }
    let Some((inflated, _)) = batch_records(batch, h) else { return Ok(Verdict::Keep) };
    let bytes = inflated.as_deref().unwrap_or(&batch[HEADER_BYTES..]);
    let Some(records) = parse_records(bytes, h) else { return Ok(Verdict::Keep) };
    let horizon = (h.attributes & ATTR_DELETE_HORIZON != 0).then_some(h.base_timestamp);
    let mut kept = Vec::with_capacity(records.len());
    let (mut removed, mut tombstones_removed) = (0u64, 0u64);
    for r in &records {
        let keep = match r.key {
            None => r.offset >= rules.map_end,
            Some(_) if r.offset >= rules.map_end => true,
            Some(k) => match rules.map.latest(k) {
                Some(latest) if latest > r.offset => false,
                _ => r.value.is_some() || horizon.is_none_or(|t| rules.now_ms < t),
            },
        };
        if keep {
            kept.push(*r);
        } else {
            removed += 1;
            if r.value.is_none() {
                tombstones_removed += 1;
            }
        }
    }
    let tombstones_left = kept.iter().any(|r| r.value.is_none());
    let new_horizon = tombstones_left && horizon.is_none();
    if kept.is_empty() && !rules.keep_empty {
        // Also a batch an earlier pass left empty (a producer's last, or the log's last)
        // that no longer has to stay (Kafka's DELETE_EMPTY).
        return Ok(Verdict::Drop { records: removed, tombstones: tombstones_removed });
    }
    if removed == 0 && !new_horizon {
        return Ok(Verdict::Keep);
    }
    let mut attributes = h.attributes;
    let base_timestamp = if new_horizon {
        attributes |= ATTR_DELETE_HORIZON;
        rules.now_ms.saturating_add(rules.delete_retention_ms)
    } else if horizon.is_some() {
        h.base_timestamp
    } else {
        kept.iter().map(|r| r.timestamp).min().unwrap_or(h.base_timestamp)
    };
    if kept.is_empty() {
        // An empty batch carries no records and no codec (Kafka's empty header).
        attributes &= !batch::ATTR_COMPRESSION_MASK;
    }
    let batch = build_batch(h, attributes, base_timestamp, &kept)?;
    Ok(Verdict::Rewrite { batch, records_removed: removed, tombstones_removed })
}

/// A batch of an aborted transaction: all its records go, whatever their keys. A live
/// producer's last batch stays as an empty batch instead (Kafka's `RETAIN_EMPTY`), so
/// its sequence survives a rebuild from the log.
pub fn clean_aborted_batch(h: &BatchHeader, keep_empty: bool) -> std::io::Result<Verdict> {
    let records = u64::try_from(h.records_count).unwrap_or(0);
    if !keep_empty {
        return Ok(Verdict::Drop { records, tombstones: 0 });
    }
    if h.records_count == 0 {
        return Ok(Verdict::Keep);
    }
    let attributes = h.attributes & !batch::ATTR_COMPRESSION_MASK;
    let batch = build_batch(h, attributes, h.base_timestamp, &[])?;
    Ok(Verdict::Rewrite { batch, records_removed: records, tombstones_removed: 0 })
}

/// Whether `h` carries what a rebuild needs of a live producer: its last batch, or a
/// marker of its current epoch above its last batch (see `CleanJob::live_producers`).
pub fn keeps_producer(live: &HashMap<i64, (i16, i64)>, h: &BatchHeader) -> bool {
    let Some(&(epoch, last_offset)) = live.get(&h.producer_id) else { return false };
    if h.attributes & batch::ATTR_CONTROL != 0 {
        h.producer_epoch == epoch && h.last_offset() > last_offset
    } else {
        h.last_offset() == last_offset
    }
}

/// Decide one control batch (a transaction marker, whole and CRC checked) that the
/// transaction walk found `discardable` (`TxnWalk::on_marker`). As a tombstone: the first
/// pass that finds it discardable gives it a delete horizon (`now + delete.retention.ms`
/// in its base timestamp, KIP-534's attribute bit), a pass at or after the horizon drops
/// it. One that keeps a live producer (`keeps_producer`), or whose record does not parse, is
/// kept.
pub fn clean_marker(batch: &[u8], h: &BatchHeader, discardable: bool, rules: &BatchRules) -> std::io::Result<Verdict> {
    if !discardable || rules.keep_empty {
        return Ok(Verdict::Keep);
    }
    if h.attributes & ATTR_DELETE_HORIZON != 0 {
        if rules.now_ms >= h.base_timestamp {
            return Ok(Verdict::Drop { records: u64::try_from(h.records_count).unwrap_or(0), tombstones: 0 });
        }
        return Ok(Verdict::Keep);
    }
    let Some((inflated, _)) = batch_records(batch, h) else { return Ok(Verdict::Keep) };
    let bytes = inflated.as_deref().unwrap_or(&batch[HEADER_BYTES..]);
    let Some(records) = parse_records(bytes, h) else { return Ok(Verdict::Keep) };
    let horizon = rules.now_ms.saturating_add(rules.delete_retention_ms);
    let batch = build_batch(h, h.attributes | ATTR_DELETE_HORIZON, horizon, &records)?;
    Ok(Verdict::Rewrite { batch, records_removed: 0, tombstones_removed: 0 })
}

/// The transactions one walk over the log passes through, batch by batch in offset
/// order (Kafka's `CleanedTransactionMetadata`). Pure: batch headers and markers in,
/// answers out. Aborted transactions come from the transaction index entries, sorted
/// once by first offset and taken as the walk reaches them, so each batch costs O(1)
/// amortized (a hash lookup by producer id), not a scan of the log's aborted entries.
pub struct TxnWalk {
    /// Aborted transactions not reached yet, by first offset, the next one last.
    pending: Vec<AbortedTxn>,
    /// Per producer id: its aborted transaction under way, and whether a batch of it was
    /// kept by this pass.
    aborted: HashMap<i64, (AbortedTxn, bool)>,
    /// Producers with a batch of a (not aborted) transaction passed since their last marker.
    committed: HashSet<i64>,
}

/// What the walk says of a marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkerFate {
    /// No batch of its transaction is left behind it (ABORT: none kept by this pass;
    /// COMMIT: none passed in this pass): it may go, after its delete horizon.
    pub discardable: bool,
    /// An ABORT marker whose transaction lost all its batches: its index entry goes.
    pub drop_index_entry: Option<AbortedTxn>,
}

impl TxnWalk {
    /// A walk that starts at offset `from`, given the log's aborted transactions (any
    /// order): those that ended before `from` play no part.
    pub fn new(aborted: &[AbortedTxn], from: i64) -> TxnWalk {
        let mut pending: Vec<AbortedTxn> = aborted.iter().filter(|a| a.last_offset >= from).copied().collect();
        pending.sort_unstable_by_key(|a| std::cmp::Reverse((a.first_offset, a.last_offset)));
        TxnWalk { pending, aborted: HashMap::new(), committed: HashSet::new() }
    }

    /// Take the aborted transactions that start at or below `offset`. A producer has one
    /// transaction at a time: a newer entry replaces one whose marker the walk never met.
    fn reach(&mut self, offset: i64) {
        while self.pending.last().is_some_and(|a| a.first_offset <= offset) {
            let a = self.pending.pop().expect("checked above");
            match self.aborted.get(&a.producer_id) {
                Some((old, _)) if old.last_offset >= a.first_offset => {}
                _ => {
                    self.aborted.insert(a.producer_id, (a, false));
                }
            }
        }
    }

    /// A data batch: whether it belongs to an aborted transaction.
    pub fn on_data(&mut self, h: &BatchHeader) -> bool {
        self.reach(h.last_offset());
        if h.producer_id < 0 || h.attributes & batch::ATTR_TRANSACTIONAL == 0 {
            return false;
        }
        match self.aborted.get(&h.producer_id) {
            Some((a, _)) if a.first_offset <= h.base_offset && h.base_offset <= a.last_offset => true,
            _ => {
                self.committed.insert(h.producer_id);
                false
            }
        }
    }

    /// A batch of an aborted transaction stays in the cleaned log (a producer's last,
    /// emptied): its marker and index entry stay too.
    pub fn kept_aborted(&mut self, producer_id: i64) {
        if let Some((_, kept)) = self.aborted.get_mut(&producer_id) {
            *kept = true;
        }
    }

    /// A control batch; `commit` is its marker's type (None: it does not parse, kept).
    pub fn on_marker(&mut self, h: &BatchHeader, commit: Option<bool>) -> MarkerFate {
        self.reach(h.last_offset());
        let keep = MarkerFate { discardable: false, drop_index_entry: None };
        match commit {
            None => keep,
            Some(true) => MarkerFate { discardable: !self.committed.remove(&h.producer_id), drop_index_entry: None },
            Some(false) => match self.aborted.get(&h.producer_id) {
                Some(&(a, kept)) if a.last_offset == h.base_offset => {
                    self.aborted.remove(&h.producer_id);
                    MarkerFate { discardable: !kept, drop_index_entry: (!kept).then_some(a) }
                }
                // No entry: an earlier pass dropped it with the transaction's batches
                // (or an index lost it: then its batches counted as passed, as COMMIT's).
                _ => MarkerFate { discardable: !self.committed.remove(&h.producer_id), drop_index_entry: None },
            },
        }
    }
}

/// Walk the checked batches of one segment file: `f(header, whole batch)`, until it
/// answers false.
fn for_each_batch(
    seg: &SegmentFile,
    batch_bytes_max: usize,
    mut f: impl FnMut(&BatchHeader, &[u8]) -> std::io::Result<bool>,
) -> std::io::Result<()> {
    let mut pos = 0u64;
    let mut buf = Vec::new();
    let mut expected = seg.base_offset;
    while pos < seg.size_bytes {
        let corrupt = |why: String| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("segment {} at {pos}: {why}", seg.base_offset))
        };
        let left = seg.size_bytes - pos;
        if left < HEADER_BYTES as u64 {
            return Err(corrupt(format!("{left} bytes left, short of a batch header")));
        }
        let mut head = [0u8; HEADER_BYTES];
        seg.log.read_exact_at(&mut head, pos)?;
        let h = BatchHeader::parse(&head);
        if h.batch_length < batch::BATCH_LENGTH_MIN || h.size_bytes() > left || h.size_bytes() > batch_bytes_max as u64
        {
            return Err(corrupt(format!("batchLength {} with {left} bytes left", h.batch_length)));
        }
        buf.resize(h.size_bytes() as usize, 0);
        seg.log.read_exact_at(&mut buf, pos)?;
        let (h, _) = batch::check_structure(&buf, batch_bytes_max).map_err(|e| corrupt(e.to_string()))?;
        if h.base_offset < expected || h.last_offset_delta < 0 || h.last_offset() >= seg.next_offset {
            return Err(corrupt(format!("batch at offset {} out of order", h.base_offset)));
        }
        expected = h.last_offset() + 1;
        if !f(&h, &buf)? {
            return Ok(());
        }
        pos += h.size_bytes();
    }
    Ok(())
}

/// Keeps the cleaner's reads and writes under `log.cleaner.io.max.bytes.per.second` by
/// sleeping its own (blocking-pool) thread.
struct Throttle {
    bytes_per_second: f64,
    start: Instant,
    bytes: u64,
}

impl Throttle {
    fn account(&mut self, bytes: u64) {
        self.bytes += bytes;
        if !self.bytes_per_second.is_finite() || self.bytes_per_second <= 0.0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.bytes_per_second);
        let elapsed = self.start.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}

/// Groups of consecutive segments to merge: within `segment_bytes` together and within
/// the u32 offsets and positions a segment's indexes hold.
fn groups(segments: &[SegmentFile], segment_bytes: u64) -> Vec<&[SegmentFile]> {
    let cap = segment_bytes.min(u32::MAX as u64 / 2);
    let mut out = Vec::new();
    let mut start = 0;
    while start < segments.len() {
        let mut end = start + 1;
        let mut size = segments[start].size_bytes;
        while end < segments.len()
            && size + segments[end].size_bytes <= cap
            && segments[end].next_offset - segments[start].base_offset <= u32::MAX as i64
        {
            size += segments[end].size_bytes;
            end += 1;
        }
        out.push(&segments[start..end]);
        start = end;
    }
    out
}

/// Run one pass (blocking: file I/O, fsync). On an error the `.cleaned` files it wrote
/// are removed; nothing else is touched.
pub fn run(job: &CleanJob) -> std::io::Result<CleanOutcome> {
    let r = run_pass(job);
    if r.is_err() {
        for s in &job.segments {
            remove_cleaned(&job.dir, s.base_offset);
        }
    }
    r
}

fn run_pass(job: &CleanJob) -> std::io::Result<CleanOutcome> {
    let started = Instant::now();
    let mut throttle = Throttle { bytes_per_second: job.io_bytes_per_second, start: started, bytes: 0 };
    let mut stats = CleanStats::default();
    let end = job.segments.last().map_or(job.dirty_from, |s| s.next_offset);
    // 1. The key map over the dirty range.
    let mut map = KeyMap::new(job.map_bytes_max);
    let mut map_end = end;
    let dirty = job.segments.partition_point(|s| s.next_offset <= job.dirty_from);
    let mut walk = TxnWalk::new(&job.aborted, job.segments.get(dirty).map_or(end, |s| s.base_offset));
    'segments: for seg in &job.segments[dirty..] {
        let mut full = false;
        for_each_batch(seg, job.batch_bytes_max, |h, whole| {
            cancelled(job)?;
            stats.bytes_read += whole.len() as u64;
            throttle.account(whole.len() as u64);
            if h.attributes & batch::ATTR_CONTROL != 0 {
                walk.on_marker(h, batch::control_marker(whole, h).map(|m| m.commit));
                return Ok(true);
            }
            if walk.on_data(h) || h.last_offset() < job.dirty_from {
                return Ok(true);
            }
            let Some((inflated, _)) = batch_records(whole, h) else { return Ok(true) };
            let bytes = inflated.as_deref().unwrap_or(&whole[HEADER_BYTES..]);
            let Some(records) = parse_records(bytes, h) else { return Ok(true) };
            let keyed: Vec<(&[u8], i64)> = records.iter().filter_map(|r| r.key.map(|k| (k, r.offset))).collect();
            if !map.try_add(&keyed) {
                map_end = h.base_offset;
                full = true;
                return Ok(false);
            }
            Ok(true)
        })?;
        if full {
            break 'segments;
        }
    }
    if map_end <= job.dirty_from && !job.segments.is_empty() && map.is_empty() && end > job.dirty_from {
        return Err(std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("log.cleaner.dedupe.buffer.size ({} bytes) cannot hold one batch's keys", job.map_bytes_max),
        ));
    }
    // 2. Rewrite, group by group.
    let mut out_groups = Vec::new();
    let mut next_horizon: Option<i64> = None;
    let rules_base = |keep_empty| BatchRules {
        map: &map,
        map_end,
        now_ms: job.now_ms,
        delete_retention_ms: job.delete_retention_ms,
        keep_empty,
    };
    // Segments wholly above where the map stopped have nothing to lose this pass.
    let covered = job.segments.partition_point(|s| s.base_offset < map_end);
    let mut walk = TxnWalk::new(&job.aborted, job.segments.first().map_or(end, |s| s.base_offset));
    for group in groups(&job.segments[..covered], job.segment_bytes) {
        let base = group[0].base_offset;
        let mut seg = Segment::create_named(&job.dir, base, CLEANED_SUFFIX, job.segment_index_bytes)?;
        let mut changed = group.len() > 1;
        // Index entries of aborted transactions that lost every batch in this pass.
        let mut gone: HashSet<(i64, i64)> = HashSet::new();
        for old in group {
            for_each_batch(old, job.batch_bytes_max, |h, whole| {
                cancelled(job)?;
                stats.bytes_read += whole.len() as u64;
                throttle.account(whole.len() as u64);
                let rules =
                    rules_base(keeps_producer(&job.live_producers, h) || job.log_end_batch == Some(h.last_offset()));
                let mut aborted = false;
                let verdict = if h.attributes & batch::ATTR_CONTROL != 0 {
                    let fate = walk.on_marker(h, batch::control_marker(whole, h).map(|m| m.commit));
                    if let Some(a) = fate.drop_index_entry {
                        gone.insert((a.producer_id, a.last_offset));
                    }
                    clean_marker(whole, h, fate.discardable, &rules)?
                } else if walk.on_data(h) {
                    aborted = true;
                    clean_aborted_batch(h, rules.keep_empty)?
                } else {
                    clean_batch(whole, h, &rules)?
                };
                let bytes: &[u8] = match &verdict {
                    Verdict::Keep => whole,
                    Verdict::Drop { records, tombstones } => {
                        stats.records_removed += records;
                        stats.tombstones_removed += tombstones;
                        if h.attributes & batch::ATTR_CONTROL != 0 {
                            stats.markers_removed += 1;
                        } else if aborted {
                            stats.aborted_records_removed += records;
                        }
                        changed = true;
                        return Ok(true);
                    }
                    Verdict::Rewrite { batch, records_removed, tombstones_removed } => {
                        stats.records_removed += records_removed;
                        stats.tombstones_removed += tombstones_removed;
                        if aborted {
                            stats.aborted_records_removed += records_removed;
                        }
                        stats.batches_rewritten += 1;
                        changed = true;
                        batch
                    }
                };
                if aborted {
                    walk.kept_aborted(h.producer_id);
                }
                let nh = BatchHeader::parse(bytes);
                // A horizon still ahead makes a later pass due then; one already passed
                // belongs to a batch kept for another reason (a producer's last), which
                // no pass at that time would change.
                if nh.attributes & ATTR_DELETE_HORIZON != 0 && nh.base_timestamp >= job.now_ms {
                    next_horizon = Some(next_horizon.map_or(nh.base_timestamp, |t| t.min(nh.base_timestamp)));
                }
                let pos = seg.size_bytes;
                seg.file()?.write_all_at(bytes, pos)?;
                seg.note_batch(pos, &nh, job.index_interval_bytes);
                seg.size_bytes += bytes.len() as u64;
                stats.bytes_written += bytes.len() as u64;
                throttle.account(bytes.len() as u64);
                Ok(true)
            })?;
        }
        // The cleaned `.txnindex`: the group's entries but those whose transaction lost
        // every batch. Written (empty if need be) whenever the group had entries, so
        // that a swap finished after a crash knows what to put in place
        // (`finish_swaps`).
        let old_entries: Vec<AbortedTxn> = group.iter().flat_map(|s| s.aborted.iter().copied()).collect();
        if !old_entries.is_empty() {
            let kept: Vec<AbortedTxn> =
                old_entries.iter().filter(|a| !gone.contains(&(a.producer_id, a.last_offset))).copied().collect();
            changed |= kept.len() != old_entries.len();
            for e in kept {
                seg.txn_index.push(e)?;
            }
            if !seg.txn_index.has_file() {
                File::create(cleaned_txn_index_path(&job.dir, base))?.sync_all()?;
            }
        }
        let size_bytes = seg.size_bytes;
        if !changed {
            seg.delete_files()?;
            continue;
        }
        seg.become_inactive()?;
        for f in seg.sync_files(true) {
            f.sync()?;
        }
        drop(seg);
        out_groups.push(CleanedGroup {
            base_offset: base,
            replaces: group.iter().map(|s| (s.base_offset, s.id)).collect(),
            size_bytes,
        });
    }
    Ok(CleanOutcome {
        groups: out_groups,
        now_ms: job.now_ms,
        cleaned_to: map_end.max(job.dirty_from),
        next_horizon_ms: next_horizon,
        stats,
        elapsed: started.elapsed(),
    })
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// The three `.cleaned` files of the group at `base` (log, index, time index).
pub fn cleaned_paths(dir: &Path, base: i64) -> [PathBuf; 3] {
    [".log", ".index", ".timeindex"].map(|s| with_suffix(&dir.join(segment::file_name(base, s)), CLEANED_SUFFIX))
}

/// The group's cleaned `.txnindex` (written only when the group has aborted transactions).
pub fn cleaned_txn_index_path(dir: &Path, base: i64) -> PathBuf {
    with_suffix(&dir.join(segment::file_name(base, ".txnindex")), CLEANED_SUFFIX)
}

/// Unlink a group's `.cleaned` files (a pass that failed or lost its race with the core).
pub fn remove_cleaned(dir: &Path, base: i64) {
    for p in cleaned_paths(dir, base).into_iter().chain([cleaned_txn_index_path(dir, base)]) {
        let _ = std::fs::remove_file(p);
    }
}

/// Open, before segments are listed: finish every swap a crash interrupted and remove
/// `.cleaned` leftovers. A `<base>.log.swap` replaces every segment whose base lies in
/// `[base, its next offset)`: those go, it becomes `<base>.log`, and its indexes are
/// rebuilt (they may be the old segment's or the cleaned ones). Returns the bases
/// swapped in.
pub fn finish_swaps(dir: &Path, batch_bytes_max: usize, index_interval_bytes: u32) -> std::io::Result<Vec<i64>> {
    let mut swaps = Vec::new();
    let mut logs = Vec::new();
    let mut cleaned = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(CLEANED_SUFFIX) {
            cleaned.push(name.to_owned());
            continue;
        }
        let Some(stem) = name.get(..20).filter(|s| s.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(base) = stem.parse::<i64>() else { continue };
        match &name[20..] {
            ".log.swap" => swaps.push(base),
            ".log" => logs.push(base),
            _ => {}
        }
    }
    swaps.sort_unstable();
    logs.sort_unstable();
    // A decided swap's cleaned `.txnindex` still waiting takes its place; every other
    // `.cleaned` file is a pass that never got decided.
    for &base in &swaps {
        let txn_cleaned = cleaned_txn_index_path(dir, base);
        if txn_cleaned.exists() {
            std::fs::rename(&txn_cleaned, dir.join(segment::file_name(base, ".txnindex")))?;
        }
    }
    for name in cleaned {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    for &base in &swaps {
        let swap = with_suffix(&dir.join(segment::file_name(base, ".log")), SWAP_SUFFIX);
        let file = File::open(&swap)?;
        let size = file.metadata()?.len();
        // The swap file's end: the last batch's last offset + 1 (fsynced whole before
        // it was named, so every header reads; a short one stops the walk).
        let mut pos = 0u64;
        let mut next = base;
        let mut head = [0u8; HEADER_BYTES];
        while pos + HEADER_BYTES as u64 <= size {
            file.read_exact_at(&mut head, pos)?;
            let h = BatchHeader::parse(&head);
            if h.batch_length < batch::BATCH_LENGTH_MIN || h.size_bytes() > size - pos || h.last_offset_delta < 0 {
                break;
            }
            next = next.max(h.last_offset() + 1);
            pos += h.size_bytes();
        }
        for &old in logs.iter().filter(|&&o| o > base && o < next) {
            for s in [".log", ".index", ".timeindex", ".txnindex"] {
                match std::fs::remove_file(dir.join(segment::file_name(old, s))) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
        }
        for s in [".index", ".timeindex"] {
            match std::fs::remove_file(dir.join(segment::file_name(base, s))) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&swap, dir.join(segment::file_name(base, ".log")))?;
        let (mut seg, _) = Segment::open(dir, base)?;
        seg.recover(batch_bytes_max, index_interval_bytes)?;
        seg.become_inactive()?;
        for f in seg.sync_files(true) {
            f.sync()?;
        }
        tracing::info!(dir = %dir.display(), segment = base, "finished a cleaned segment's swap after a crash");
    }
    if !swaps.is_empty() {
        File::open(dir)?.sync_all()?;
    }
    Ok(swaps)
}

/// `cleaner-offset-checkpoint` text (Kafka's format: version 0, one entry).
pub fn checkpoint_text(topic: &str, partition: i32, offset: i64) -> String {
    format!("0\n1\n{topic} {partition} {offset}\n")
}

/// The offset in a `cleaner-offset-checkpoint`; None when missing or garbled (then the
/// whole log counts as dirty: a pass more, never a record lost).
pub fn read_checkpoint(dir: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(dir.join(CHECKPOINT_FILE)).ok()?;
    let mut lines = text.lines();
    if lines.next()? != "0" || lines.next()? != "1" {
        return None;
    }
    lines.next()?.rsplit(' ').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(offset: i64, key: Option<&'a [u8]>, value: Option<&'a [u8]>) -> Record<'a> {
        Record { attributes: 0, timestamp: 1_000 + offset, offset, key, value, headers: &[0] }
    }

    fn header_for(base: i64, last_delta: i32, codec: i16) -> BatchHeader {
        BatchHeader {
            base_offset: base,
            batch_length: 0,
            partition_leader_epoch: 3,
            magic: 2,
            crc: 0,
            attributes: codec,
            last_offset_delta: last_delta,
            base_timestamp: 1_000 + base,
            max_timestamp: 0,
            producer_id: 7,
            producer_epoch: 1,
            base_sequence: 10,
            records_count: 0,
        }
    }

    fn make(base: i64, recs: &[Record], codec: i16) -> Vec<u8> {
        let h = header_for(base, (recs.last().unwrap().offset - base) as i32, codec);
        build_batch(&h, codec, 1_000 + base, recs).unwrap()
    }

    #[test]
    fn a_rebuilt_batch_parses_back_for_every_codec() {
        for codec in 0..=4 {
            let recs = [record(5, Some(b"a"), Some(b"1")), record(6, None, Some(b"2")), record(8, Some(b"c"), None)];
            let b = make(5, &recs, codec);
            let (h, _) = batch::check_structure(&b, 1 << 20).unwrap();
            assert_eq!((h.last_offset(), h.records_count, h.compression()), (8, 3, codec));
            let (inflated, _) = batch_records(&b, &h).unwrap();
            let bytes = inflated.as_deref().unwrap_or(&b[HEADER_BYTES..]);
            assert_eq!(parse_records(bytes, &h).unwrap(), recs, "codec {codec}");
        }
    }

    #[test]
    fn superseded_and_keyless_records_go_and_offsets_stay() {
        let recs = [record(0, Some(b"a"), Some(b"1")), record(1, None, Some(b"x")), record(2, Some(b"b"), Some(b"2"))];
        let b = make(0, &recs, 1);
        let (h, _) = batch::check_structure(&b, 1 << 20).unwrap();
        let mut map = KeyMap::new(1 << 20);
        assert!(map.try_add(&[(b"a", 9)]));
        let rules = BatchRules { map: &map, map_end: 10, now_ms: 0, delete_retention_ms: 0, keep_empty: false };
        let Verdict::Rewrite { batch: nb, records_removed, .. } = clean_batch(&b, &h, &rules).unwrap() else {
            panic!("expected a rewrite")
        };
        assert_eq!(records_removed, 2);
        let (nh, _) = batch::check_structure(&nb, 1 << 20).unwrap();
        assert_eq!((nh.base_offset, nh.last_offset(), nh.records_count), (0, 2, 1));
        assert_eq!((nh.producer_id, nh.base_sequence, nh.partition_leader_epoch), (7, 10, 3));
        let (inflated, _) = batch_records(&nb, &nh).unwrap();
        assert_eq!(parse_records(inflated.as_deref().unwrap(), &nh).unwrap(), [recs[2]]);
    }

    #[test]
    fn a_tombstone_gets_a_horizon_then_goes_after_it() {
        let recs = [record(4, Some(b"a"), None)];
        let b = make(4, &recs, 0);
        let (h, _) = batch::check_structure(&b, 1 << 20).unwrap();
        let mut map = KeyMap::new(1 << 20);
        assert!(map.try_add(&[(b"a", 4)]));
        let mut rules = BatchRules { map: &map, map_end: 10, now_ms: 100, delete_retention_ms: 50, keep_empty: false };
        let Verdict::Rewrite { batch: marked, records_removed: 0, .. } = clean_batch(&b, &h, &rules).unwrap() else {
            panic!("expected a horizon")
        };
        let (mh, _) = batch::check_structure(&marked, 1 << 20).unwrap();
        assert_eq!((mh.attributes & ATTR_DELETE_HORIZON, mh.base_timestamp), (ATTR_DELETE_HORIZON, 150));
        // The record's own timestamp survives the new base.
        assert_eq!(parse_records(&marked[HEADER_BYTES..], &mh).unwrap(), recs);
        rules.now_ms = 149;
        assert_eq!(clean_batch(&marked, &mh, &rules).unwrap(), Verdict::Keep);
        rules.now_ms = 150;
        assert_eq!(clean_batch(&marked, &mh, &rules).unwrap(), Verdict::Drop { records: 1, tombstones: 1 });
        rules.keep_empty = true;
        let Verdict::Rewrite { batch: empty, .. } = clean_batch(&marked, &mh, &rules).unwrap() else {
            panic!("a producer's last batch stays")
        };
        let (eh, _) = batch::check_structure(&empty, 1 << 20).unwrap();
        assert_eq!((eh.base_offset, eh.last_offset(), eh.records_count, eh.base_sequence), (4, 4, 0, 10));
        // Kept empty while it has to stay; dropped by the first pass after it need not.
        assert_eq!(clean_batch(&empty, &eh, &rules).unwrap(), Verdict::Keep);
        rules.keep_empty = false;
        assert_eq!(clean_batch(&empty, &eh, &rules).unwrap(), Verdict::Drop { records: 0, tombstones: 0 });
    }

    #[test]
    fn the_key_map_takes_a_batch_whole_or_not_at_all() {
        let mut map = KeyMap::new(2 * (1 + KEY_MAP_ENTRY_OVERHEAD_BYTES));
        assert!(map.try_add(&[(b"a", 1), (b"a", 2)]));
        assert!(!map.try_add(&[(b"b", 3), (b"c", 4)]));
        assert_eq!((map.len(), map.latest(b"a"), map.latest(b"b")), (1, Some(2), None));
        assert!(map.try_add(&[(b"a", 5), (b"b", 6)]));
        assert_eq!(map.latest(b"a"), Some(5));
    }

    #[test]
    fn garbage_records_keep_the_batch() {
        let recs = [record(0, Some(b"a"), Some(b"1"))];
        let mut b = make(0, &recs, 0);
        b[HEADER_BYTES] = 0x7f; // a record length past the batch
        let crc = batch::compute_crc(&b);
        b[batch::OFF_CRC..batch::OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        let (h, _) = batch::check_structure(&b, 1 << 20).unwrap();
        let map = KeyMap::new(1 << 20);
        let rules = BatchRules { map: &map, map_end: 10, now_ms: 0, delete_retention_ms: 0, keep_empty: false };
        assert_eq!(clean_batch(&b, &h, &rules).unwrap(), Verdict::Keep);
    }
}
