//! Record batch (magic 2) header: parsing, validation and in-place rewriting.
//!
//! Pure functions over byte slices: no I/O, no clock. Everything here treats its input as
//! untrusted (network or disk): every length is checked against the slice and a limit
//! before it is used.

use super::LogError;

/// Bytes before `batchLength` counts: baseOffset (8) + batchLength (4).
pub const LOG_OVERHEAD_BYTES: usize = 12;
/// The fixed record batch header, magic 2.
pub const HEADER_BYTES: usize = 61;
/// Smallest legal `batchLength` value (header without the 12 bytes of log overhead).
pub const BATCH_LENGTH_MIN: i32 = (HEADER_BYTES - LOG_OVERHEAD_BYTES) as i32;

pub const OFF_BASE_OFFSET: usize = 0;
pub const OFF_BATCH_LENGTH: usize = 8;
pub const OFF_LEADER_EPOCH: usize = 12;
pub const OFF_MAGIC: usize = 16;
pub const OFF_CRC: usize = 17;
pub const OFF_ATTRIBUTES: usize = 21;
pub const OFF_LAST_OFFSET_DELTA: usize = 23;
pub const OFF_BASE_TIMESTAMP: usize = 27;
pub const OFF_MAX_TIMESTAMP: usize = 35;
pub const OFF_PRODUCER_ID: usize = 43;
pub const OFF_PRODUCER_EPOCH: usize = 51;
pub const OFF_BASE_SEQUENCE: usize = 53;
pub const OFF_RECORDS_COUNT: usize = 57;

pub const ATTR_COMPRESSION_MASK: i16 = 0x07;
pub const ATTR_TIMESTAMP_TYPE_LOG_APPEND: i16 = 0x08;
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
pub const ATTR_CONTROL: i16 = 0x20;
/// Codecs 0..=4: none, gzip, snappy, lz4, zstd.
pub const COMPRESSION_CODEC_MAX: i16 = 4;

/// No timestamp (Kafka's `RecordBatch.NO_TIMESTAMP`).
pub const NO_TIMESTAMP: i64 = -1;

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}

/// The 61-byte header of one batch, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl BatchHeader {
    /// Decode the header; `buf` must hold at least `HEADER_BYTES`.
    pub fn parse(buf: &[u8]) -> BatchHeader {
        assert!(buf.len() >= HEADER_BYTES);
        BatchHeader {
            base_offset: be_i64(buf, OFF_BASE_OFFSET),
            batch_length: be_i32(buf, OFF_BATCH_LENGTH),
            partition_leader_epoch: be_i32(buf, OFF_LEADER_EPOCH),
            magic: buf[OFF_MAGIC] as i8,
            crc: u32::from_be_bytes(buf[OFF_CRC..OFF_CRC + 4].try_into().unwrap()),
            attributes: be_i16(buf, OFF_ATTRIBUTES),
            last_offset_delta: be_i32(buf, OFF_LAST_OFFSET_DELTA),
            base_timestamp: be_i64(buf, OFF_BASE_TIMESTAMP),
            max_timestamp: be_i64(buf, OFF_MAX_TIMESTAMP),
            producer_id: be_i64(buf, OFF_PRODUCER_ID),
            producer_epoch: be_i16(buf, OFF_PRODUCER_EPOCH),
            base_sequence: be_i32(buf, OFF_BASE_SEQUENCE),
            records_count: be_i32(buf, OFF_RECORDS_COUNT),
        }
    }

    /// Whole batch size on disk, log overhead included. Only meaningful once
    /// `batch_length >= BATCH_LENGTH_MIN` was checked.
    pub fn size_bytes(&self) -> u64 {
        LOG_OVERHEAD_BYTES as u64 + self.batch_length.max(0) as u64
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }

    pub fn compression(&self) -> i16 {
        self.attributes & ATTR_COMPRESSION_MASK
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTR_TIMESTAMP_TYPE_LOG_APPEND != 0
    }
}

/// CRC32C (Castagnoli) over attributes..end of batch, as magic 2 defines it.
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[OFF_ATTRIBUTES..])
}

/// Structural checks shared by the produce path and recovery: enough bytes, a sane
/// length, magic 2, CRC. Returns the header and the batch size. `Corrupt` on failure,
/// `MessageTooLarge` when the size exceeds `batch_bytes_max`.
pub fn check_structure(buf: &[u8], batch_bytes_max: usize) -> Result<(BatchHeader, usize), LogError> {
    if buf.len() < HEADER_BYTES {
        return Err(LogError::Corrupt(format!("{} bytes left, a batch header needs {HEADER_BYTES}", buf.len())));
    }
    let header = BatchHeader::parse(buf);
    if header.batch_length < BATCH_LENGTH_MIN {
        return Err(LogError::Corrupt(format!("batchLength {} below {BATCH_LENGTH_MIN}", header.batch_length)));
    }
    let size_bytes = header.size_bytes() as usize;
    if size_bytes > batch_bytes_max {
        return Err(LogError::MessageTooLarge { size_bytes, limit_bytes: batch_bytes_max });
    }
    if size_bytes > buf.len() {
        return Err(LogError::Corrupt(format!("batch of {size_bytes} bytes but only {} bytes left", buf.len())));
    }
    if header.magic != 2 {
        return Err(LogError::Corrupt(format!("magic {} (only 2 is supported)", header.magic)));
    }
    let crc = compute_crc(&buf[..size_bytes]);
    if crc != header.crc {
        return Err(LogError::Corrupt(format!("crc {:#010x} but computed {crc:#010x}", header.crc)));
    }
    Ok((header, size_bytes))
}

/// Semantic checks on a producer's batch (after `check_structure`).
pub fn check_semantics(h: &BatchHeader) -> Result<(), LogError> {
    let invalid = |m: String| Err(LogError::InvalidRecord(m));
    if h.records_count < 1 {
        return invalid(format!("recordsCount {}", h.records_count));
    }
    if h.last_offset_delta != h.records_count - 1 {
        return invalid(format!("lastOffsetDelta {} with recordsCount {}", h.last_offset_delta, h.records_count));
    }
    if h.compression() > COMPRESSION_CODEC_MAX {
        return invalid(format!("unknown compression codec {}", h.compression()));
    }
    for (name, ts) in [("baseTimestamp", h.base_timestamp), ("maxTimestamp", h.max_timestamp)] {
        if ts < NO_TIMESTAMP {
            return invalid(format!("{name} {ts}"));
        }
    }
    if h.base_timestamp >= 0 && h.max_timestamp >= 0 && h.max_timestamp < h.base_timestamp {
        return invalid(format!("maxTimestamp {} below baseTimestamp {}", h.max_timestamp, h.base_timestamp));
    }
    if h.producer_id < -1 {
        return invalid(format!("producerId {}", h.producer_id));
    }
    if h.producer_id >= 0 && (h.producer_epoch < 0 || h.base_sequence < 0) {
        return Err(LogError::InvalidProducerFields(format!(
            "producerId {} with producerEpoch {} baseSequence {}",
            h.producer_id, h.producer_epoch, h.base_sequence
        )));
    }
    Ok(())
}

pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
}

pub fn set_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// LogAppendTime: set the timestamp-type bit and maxTimestamp, then recompute the CRC.
pub fn set_log_append_time(batch: &mut [u8], now_ms: i64) {
    let attributes = be_i16(batch, OFF_ATTRIBUTES) | ATTR_TIMESTAMP_TYPE_LOG_APPEND;
    batch[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    batch[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
    let crc = compute_crc(batch);
    batch[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// The header `batch` gets when appended, built without touching `batch` itself (its
/// bytes may be a shared request buffer): base offset, optionally the leader epoch, and
/// for LogAppendTime topics the timestamp type, max timestamp and a CRC to match
/// (computed over the patched header tail and the unchanged records).
pub fn patched_header(
    batch: &[u8],
    base_offset: i64,
    leader_epoch: Option<i32>,
    log_append_time_ms: Option<i64>,
) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h.copy_from_slice(&batch[..HEADER_BYTES]);
    set_base_offset(&mut h, base_offset);
    if let Some(epoch) = leader_epoch {
        set_leader_epoch(&mut h, epoch);
    }
    if let Some(now_ms) = log_append_time_ms {
        let attributes = be_i16(&h, OFF_ATTRIBUTES) | ATTR_TIMESTAMP_TYPE_LOG_APPEND;
        h[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
        h[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&h[OFF_ATTRIBUTES..]), &batch[HEADER_BYTES..]);
        h[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    }
    h
}

/// Zig-zag varint (Kafka's `varint`/`varlong`), bounds-checked: None on overrun.
pub fn read_varlong(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut raw: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        raw |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some(((raw >> 1) as i64) ^ -((raw & 1) as i64));
        }
    }
    None
}

/// Walk every record of an uncompressed batch (after `check_structure`) and check that
/// each length and count fits the bytes that are there, so a record decoder that
/// allocates for counts it reads (the `kafka-protocol` crate reserves a map for a
/// record's header count) is only handed batches it can parse within their size.
/// Compressed batches are refused: their records cannot be checked before inflating.
pub fn check_records(batch: &[u8], h: &BatchHeader) -> Result<(), LogError> {
    let bad = |m: String| Err(LogError::Corrupt(m));
    if h.compression() != 0 {
        return bad(format!("compression codec {}: records not checked", h.compression()));
    }
    let end = (h.size_bytes() as usize).min(batch.len());
    let body = &batch[..end];
    let mut pos = HEADER_BYTES;
    // A record takes at least 7 bytes (length, attributes, three varints, two lengths).
    if h.records_count < 0 || h.records_count as usize > (end - pos.min(end)) / 7 {
        return bad(format!("{} records cannot fit in {end} bytes", h.records_count));
    }
    let field = |pos: &mut usize, limit: usize| -> Option<()> {
        let len = read_varlong(body, pos)?;
        if len >= 0 {
            if len as u64 > (limit - (*pos).min(limit)) as u64 {
                return None;
            }
            *pos += len as usize;
        }
        Some(())
    };
    for i in 0..h.records_count {
        let length = read_varlong(body, &mut pos).filter(|l| *l >= 0);
        let Some(length) = length.filter(|l| *l as u64 <= (end - pos.min(end)) as u64) else {
            return bad(format!("record {i}: length overruns the batch"));
        };
        let record_end = pos + length as usize;
        let walked = (|| {
            pos += 1; // attributes
            read_varlong(body, &mut pos)?; // timestamp delta
            read_varlong(body, &mut pos)?; // offset delta
            field(&mut pos, record_end)?; // key
            field(&mut pos, record_end)?; // value
            let headers = read_varlong(body, &mut pos)?;
            // Each header needs two bytes at least (key and value lengths).
            if headers < 0 || headers as u64 > (record_end - pos.min(record_end)) as u64 / 2 {
                return None;
            }
            for _ in 0..headers {
                field(&mut pos, record_end)?;
                field(&mut pos, record_end)?;
            }
            (pos == record_end).then_some(())
        })();
        if walked.is_none() {
            return bad(format!("record {i}: fields do not fit its {length} bytes"));
        }
    }
    Ok(())
}

/// `check_structure` and `check_records` on every batch of a buffer of whole batches.
pub fn check_batches_records(mut buf: &[u8]) -> Result<(), LogError> {
    while !buf.is_empty() {
        let (h, size) = check_structure(buf, buf.len())?;
        check_records(&buf[..size], &h)?;
        buf = &buf[size..];
    }
    Ok(())
}

/// ListOffsets by timestamp reads the records of a compressed batch, as Kafka does
/// (`FileRecords.searchForTimestamp` iterates the batch's records). What it decompresses
/// is bounded by this; a batch that holds more (a decompression bomb) is answered with
/// its base offset, as if no record inside could be told apart.
pub const TIMESTAMP_SEARCH_DECOMPRESSED_BYTES_MAX: usize = 64 << 20;

/// The first record with timestamp >= `ts_ms` in a whole batch, as (offset, timestamp),
/// compressed or not (gzip, snappy, lz4, zstd, decompressed up to
/// TIMESTAMP_SEARCH_DECOMPRESSED_BYTES_MAX). None when the records cannot be read or none
/// qualifies. Batch bytes come from clients: malformed input gives None, never a panic.
pub fn find_record_by_timestamp(batch: &[u8], h: &BatchHeader, ts_ms: i64) -> Option<(i64, i64)> {
    let body = batch.get(HEADER_BYTES..)?;
    let decompressed;
    let records = match h.compression() {
        0 => body,
        codec => {
            decompressed = decompress_bounded(codec, body, TIMESTAMP_SEARCH_DECOMPRESSED_BYTES_MAX)?;
            &decompressed[..]
        }
    };
    first_record_at_or_after(records, h, ts_ms)
}

/// Walks `h.records_count` records in `records` (the bytes after the batch header, once
/// decompressed) for the first with timestamp >= `ts_ms`.
fn first_record_at_or_after(records: &[u8], h: &BatchHeader, ts_ms: i64) -> Option<(i64, i64)> {
    let mut pos = 0;
    for _ in 0..h.records_count.max(0) {
        let length = read_varlong(records, &mut pos)?;
        let start = pos;
        if length < 0 || (length as usize) > records.len().saturating_sub(start) {
            return None;
        }
        let _attributes = *records.get(pos)?;
        pos += 1;
        let timestamp_delta = read_varlong(records, &mut pos)?;
        let offset_delta = read_varlong(records, &mut pos)?;
        let timestamp = h.base_timestamp.checked_add(timestamp_delta)?;
        if timestamp >= ts_ms {
            return Some((h.base_offset.checked_add(offset_delta)?, timestamp));
        }
        pos = start + length as usize;
    }
    None
}

/// Snappy as Kafka's Java client writes it: xerial's framing (this 8-byte magic, two
/// 4-byte version fields, then blocks of [u32 length][raw snappy]); librdkafka and
/// franz-go may write one raw snappy block instead.
const XERIAL_SNAPPY_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const XERIAL_SNAPPY_HEADER_BYTES: usize = 16;

/// The decompressed bytes of a batch body with Kafka codec `codec` (1 gzip, 2 snappy,
/// 3 lz4, 4 zstd), or None when it is malformed, of an unknown codec, or longer than
/// `bytes_max` (checked as it is produced, so a bomb never takes more than that).
pub fn decompress_bounded(codec: i16, data: &[u8], bytes_max: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let read_bounded = |r: &mut dyn Read| -> Option<Vec<u8>> {
        let mut out = Vec::new();
        r.take(bytes_max as u64 + 1).read_to_end(&mut out).ok()?;
        (out.len() <= bytes_max).then_some(out)
    };
    match codec {
        1 => read_bounded(&mut flate2::read::MultiGzDecoder::new(data)),
        2 => {
            let mut out = Vec::new();
            let push_block = |block: &[u8], out: &mut Vec<u8>| -> Option<()> {
                let len = snap::raw::decompress_len(block).ok()?;
                if len > bytes_max.saturating_sub(out.len()) {
                    return None;
                }
                let at = out.len();
                out.resize(at + len, 0);
                let n = snap::raw::Decoder::new().decompress(block, &mut out[at..]).ok()?;
                out.truncate(at + n);
                Some(())
            };
            if data.len() >= XERIAL_SNAPPY_HEADER_BYTES && data.starts_with(XERIAL_SNAPPY_MAGIC) {
                let mut rest = &data[XERIAL_SNAPPY_HEADER_BYTES..];
                while !rest.is_empty() {
                    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
                    let block = rest.get(4..4usize.checked_add(len)?)?;
                    push_block(block, &mut out)?;
                    rest = &rest[4 + len..];
                }
            } else {
                push_block(data, &mut out)?;
            }
            Some(out)
        }
        3 => read_bounded(&mut lz4::Decoder::new(data).ok()?),
        4 => read_bounded(&mut zstd::stream::read::Decoder::new(data).ok()?),
        _ => None,
    }
}

/// A control record's key type: an end-of-transaction marker (Kafka's
/// `ControlRecordType`; other types exist, and are kept and skipped like these).
pub const CONTROL_TYPE_ABORT: i16 = 0;
pub const CONTROL_TYPE_COMMIT: i16 = 1;
/// Bytes of a marker batch as `encode_marker` writes it: the header and one record.
pub const MARKER_BATCH_BYTES: usize = HEADER_BYTES + 17;

/// The end-of-transaction marker of a control batch (Kafka's `EndTransactionMarker`):
/// key `version i16, type i16`, value `version i16, coordinatorEpoch i32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlMarker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// The marker a control batch carries: None for a data batch, a compressed one, a
/// control record of another type, or bytes that do not parse (read within the batch,
/// never past it). `batch` is one whole batch after `check_structure`.
pub fn control_marker(batch: &[u8], h: &BatchHeader) -> Option<ControlMarker> {
    if h.attributes & ATTR_CONTROL == 0 || h.compression() != 0 || h.records_count < 1 {
        return None;
    }
    let end = (h.size_bytes() as usize).min(batch.len());
    let body = batch.get(..end)?;
    let mut pos = HEADER_BYTES;
    let length = read_varlong(body, &mut pos)?;
    if length < 0 || length as u64 > (end - pos.min(end)) as u64 {
        return None;
    }
    pos += 1; // attributes
    read_varlong(body, &mut pos)?; // timestamp delta
    read_varlong(body, &mut pos)?; // offset delta
    let key_len = read_varlong(body, &mut pos)?;
    if key_len < 4 {
        return None;
    }
    let key = body.get(pos..pos + 4)?;
    let kind = i16::from_be_bytes([key[2], key[3]]);
    pos += key_len as usize;
    let value_len = read_varlong(body, &mut pos)?;
    if value_len < 6 {
        return None;
    }
    let value = body.get(pos..pos + 6)?;
    let coordinator_epoch = i32::from_be_bytes(value[2..6].try_into().unwrap());
    match kind {
        CONTROL_TYPE_ABORT => Some(ControlMarker { commit: false, coordinator_epoch }),
        CONTROL_TYPE_COMMIT => Some(ControlMarker { commit: true, coordinator_epoch }),
        _ => None,
    }
}

/// A control batch holding one end-of-transaction marker, as Kafka's leader writes it
/// (`MemoryRecords.withEndTransactionMarker`): transactional and control attributes, no
/// sequence, base offset 0 (the log assigns it), leader epoch -1 (stamped on append).
pub fn encode_marker(producer_id: i64, producer_epoch: i16, marker: ControlMarker, now_ms: i64) -> Vec<u8> {
    let mut b = vec![0u8; MARKER_BATCH_BYTES];
    let batch_length = (MARKER_BATCH_BYTES - LOG_OVERHEAD_BYTES) as i32;
    b[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&batch_length.to_be_bytes());
    b[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&(-1i32).to_be_bytes());
    b[OFF_MAGIC] = 2;
    b[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&(ATTR_TRANSACTIONAL | ATTR_CONTROL).to_be_bytes());
    b[OFF_BASE_TIMESTAMP..OFF_BASE_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
    b[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
    b[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&producer_id.to_be_bytes());
    b[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2].copy_from_slice(&producer_epoch.to_be_bytes());
    b[OFF_BASE_SEQUENCE..OFF_BASE_SEQUENCE + 4].copy_from_slice(&(-1i32).to_be_bytes());
    b[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4].copy_from_slice(&1i32.to_be_bytes());
    let kind = if marker.commit { CONTROL_TYPE_COMMIT } else { CONTROL_TYPE_ABORT };
    // One record of 16 bytes (zig-zag varints: 16 -> 32, 4 -> 8, 6 -> 12).
    let mut r = vec![32u8, 0, 0, 0, 8];
    r.extend_from_slice(&0i16.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.push(12);
    r.extend_from_slice(&0i16.to_be_bytes());
    r.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    r.push(0);
    b[HEADER_BYTES..].copy_from_slice(&r);
    let crc = compute_crc(&b);
    b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{Compression, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions};

    /// One batch of five records with keys, values and a header each.
    fn batch(compression: Compression) -> Vec<u8> {
        let records: Vec<_> = (0..5)
            .map(|i| {
                let mut headers = kafka_protocol::indexmap::IndexMap::new();
                headers
                    .insert(kafka_protocol::protocol::StrBytes::from_static_str("h"), Some(Bytes::from_static(b"v")));
                let mut r = crate::protocol::plain_record(
                    i,
                    0,
                    1_700_000_000_000,
                    Some(Bytes::from(format!("k{i}"))),
                    Some(Bytes::from(vec![b'x'; i as usize * 10])),
                    headers,
                );
                // The encoder starts a new batch where offset - sequence changes.
                r.sequence = i as i32;
                r
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
        buf.to_vec()
    }

    #[test]
    fn records_of_a_real_batch_pass() {
        let b = batch(Compression::None);
        let (h, size) = check_structure(&b, b.len()).unwrap();
        assert_eq!((h.records_count, size), (5, b.len()));
        check_records(&b, &h).unwrap();
        check_batches_records(&[b.clone(), b].concat()).unwrap();
        let z = batch(Compression::Gzip);
        let (h, _) = check_structure(&z, z.len()).unwrap();
        assert!(check_records(&z, &h).is_err(), "compressed records are not walked");
    }

    /// A header count near 2^31 made the codec reserve ~100 GB and abort. Every varint
    /// of the records area set to a huge value, and random byte flips: refused, or
    /// accepted and then decoded by the codec without trouble.
    #[test]
    fn mutated_records_are_refused_or_decode() {
        let b = batch(Compression::None);
        let huge = [0xfe, 0xff, 0xff, 0xff, 0x0f]; // zig-zag 2^31 - 1
        let mut refused = 0;
        for at in HEADER_BYTES..b.len() {
            for m in 0..3 {
                let mut x = b.clone();
                match m {
                    0 => {
                        let n = huge.len().min(x.len() - at);
                        x[at..at + n].copy_from_slice(&huge[..n]);
                    }
                    1 => x[at] ^= 0x80,
                    _ => x[at] = 0x7f,
                }
                // Not through check_structure: the CRC would catch most of these.
                let h = BatchHeader::parse(&x);
                match check_records(&x, &h) {
                    Ok(()) => {
                        let _ = RecordBatchDecoder::decode(&mut Bytes::from(x));
                    }
                    Err(_) => refused += 1,
                }
            }
        }
        assert!(refused >= 10, "only {refused} mutations refused");
        // The last record ends: header count (1), key length + "h", value length + "v".
        let mut x = b.clone();
        let at = x.len() - 5;
        x[at..].copy_from_slice(&huge);
        let h = BatchHeader::parse(&x);
        assert!(check_records(&x, &h).is_err(), "header count 2^31 - 1 accepted");
    }

    /// Twenty records, record i at 1_700_000_000_000 + 10 i ms with a compressible value,
    /// in one batch with this codec.
    fn timed_batch(compression: Compression) -> Vec<u8> {
        let records: Vec<_> = (0..20)
            .map(|i| {
                let mut r = crate::protocol::plain_record(
                    i,
                    0,
                    1_700_000_000_000 + 10 * i,
                    Some(Bytes::from(format!("k{i}"))),
                    Some(Bytes::from(format!("value {i} abcdefgh abcdefgh abcdefgh"))),
                    Default::default(),
                );
                r.sequence = i as i32;
                r
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
        buf.to_vec()
    }

    /// ListOffsets by timestamp finds the record inside a batch of every codec, as Kafka's
    /// FileRecords.searchForTimestamp does. It used to answer the base offset of a
    /// compressed batch: franz-go (snappy by default) saw ListOffsetsAfterMilli land up to a
    /// batch before the record (tests/go/franz_more_test.go).
    #[test]
    fn timestamp_search_finds_the_record_in_every_codec() {
        for compression in
            [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd]
        {
            let b = timed_batch(compression);
            let (h, size) = check_structure(&b, b.len()).unwrap();
            assert_eq!((size, h.records_count), (b.len(), 20), "{compression:?}");
            assert_eq!(h.compression() != 0, compression != Compression::None, "{compression:?}");
            let base = 1_700_000_000_000;
            assert_eq!(find_record_by_timestamp(&b, &h, 0), Some((0, base)), "{compression:?}");
            assert_eq!(find_record_by_timestamp(&b, &h, base + 70), Some((7, base + 70)), "{compression:?}");
            assert_eq!(find_record_by_timestamp(&b, &h, base + 71), Some((8, base + 80)), "{compression:?}");
            assert_eq!(find_record_by_timestamp(&b, &h, base + 190), Some((19, base + 190)), "{compression:?}");
            assert_eq!(find_record_by_timestamp(&b, &h, base + 191), None, "{compression:?}");
        }
    }

    /// Snappy in xerial's framing (the Java client's) and as one raw block (librdkafka's,
    /// franz-go's) both decompress.
    #[test]
    fn snappy_raw_and_xerial_framing() {
        let data: Vec<u8> = (0..100_000u32).flat_map(|i| (i % 251).to_be_bytes()).collect();
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(decompress_bounded(2, &raw, 1 << 20).unwrap(), data);
        let mut xerial = XERIAL_SNAPPY_MAGIC.to_vec();
        xerial.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
        for chunk in data.chunks(32 * 1024) {
            let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            xerial.extend_from_slice(&(block.len() as u32).to_be_bytes());
            xerial.extend_from_slice(&block);
        }
        assert_eq!(decompress_bounded(2, &xerial, 1 << 20).unwrap(), data);
        // A block length past the end: None, not a panic.
        let mut cut = xerial.clone();
        cut.truncate(xerial.len() - 1);
        assert_eq!(decompress_bounded(2, &cut, 1 << 20), None);
    }

    /// A decompression bomb stops at the bound: a megabyte of zeros in every codec, with a
    /// bound of 64 KiB, gives None (and the whole megabyte within a larger bound).
    #[test]
    fn decompression_is_bounded() {
        use std::io::Write;
        let zeros = vec![0u8; 1 << 20];
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&zeros).unwrap();
        let gz = gz.finish().unwrap();
        let snappy = snap::raw::Encoder::new().compress_vec(&zeros).unwrap();
        let mut lz = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        lz.write_all(&zeros).unwrap();
        let (lz, r) = lz.finish();
        r.unwrap();
        let zstd = zstd::stream::encode_all(&zeros[..], 1).unwrap();
        for (codec, data) in [(1, &gz), (2, &snappy), (3, &lz), (4, &zstd)] {
            assert!(data.len() < zeros.len() / 10, "codec {codec}: {} bytes", data.len());
            assert_eq!(decompress_bounded(codec, data, 64 << 10), None, "codec {codec}");
            assert_eq!(decompress_bounded(codec, data, 1 << 20).as_deref(), Some(&zeros[..]), "codec {codec}");
        }
        // Garbage and unknown codecs: None.
        for codec in 0..8 {
            assert_eq!(decompress_bounded(codec, b"not compressed at all", 1 << 20), None, "codec {codec}");
        }
    }

    #[test]
    fn a_marker_batch_is_what_kafka_protocol_reads_as_a_control_record() {
        for (commit, epoch) in [(true, 0), (false, 7), (true, i32::MAX)] {
            let marker = ControlMarker { commit, coordinator_epoch: epoch };
            let b = encode_marker(42, 3, marker, 1_700_000_000_000);
            let (h, size) = check_structure(&b, b.len()).unwrap();
            assert_eq!(size, MARKER_BATCH_BYTES);
            check_records(&b, &h).unwrap();
            assert_eq!(control_marker(&b, &h), Some(marker));
            let records = RecordBatchDecoder::decode(&mut Bytes::from(b.clone())).unwrap();
            assert_eq!(records.records.len(), 1);
            let r = &records.records[0];
            assert!(r.control && r.transactional);
            assert_eq!((r.producer_id, r.producer_epoch, r.sequence), (42, 3, -1));
            let kind: i16 = if commit { 1 } else { 0 };
            assert_eq!(r.key.as_deref(), Some(&[0u8, 0, (kind >> 8) as u8, kind as u8][..]));
            let mut value = vec![0u8, 0];
            value.extend_from_slice(&epoch.to_be_bytes());
            assert_eq!(r.value.as_deref(), Some(&value[..]));
            // Every truncation of the record parses to nothing, never past the bytes.
            for cut in HEADER_BYTES..b.len() {
                assert_eq!(control_marker(&b[..cut], &h), None, "cut at {cut}");
            }
        }
        let data = batch(Compression::None);
        let (h, _) = check_structure(&data, data.len()).unwrap();
        assert_eq!(control_marker(&data, &h), None);
    }
}
