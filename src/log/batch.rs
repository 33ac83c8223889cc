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

/// The first record of a batch (whole, header included) with timestamp >= `ts_ms`, as
/// (offset, timestamp); a compressed batch's records are decompressed first, up to
/// `limits::decompressed_batch_bytes_max`. None when the records cannot be read (or
/// inflate past the limit) or none qualifies.
pub fn find_record_by_timestamp(batch: &[u8], h: &BatchHeader, ts_ms: i64) -> Option<(i64, i64)> {
    let records = batch.get(HEADER_BYTES..)?;
    if h.compression() == 0 {
        return find_in_records(records, h, ts_ms);
    }
    let inflated = super::decompress::decompress_records(
        h.compression() as u8,
        records,
        crate::model::limits::decompressed_batch_bytes_max,
    )?;
    find_in_records(&inflated, h, ts_ms)
}

/// The walk over a batch's records section (uncompressed bytes).
fn find_in_records(records: &[u8], h: &BatchHeader, ts_ms: i64) -> Option<(i64, i64)> {
    let batch = records;
    let mut pos = 0;
    for _ in 0..h.records_count.max(0) {
        let length = read_varlong(batch, &mut pos)?;
        let start = pos;
        if length < 0 || (length as usize) > batch.len().saturating_sub(start) {
            return None;
        }
        let _attributes = *batch.get(pos)?;
        pos += 1;
        let timestamp_delta = read_varlong(batch, &mut pos)?;
        let offset_delta = read_varlong(batch, &mut pos)?;
        let timestamp = h.base_timestamp.checked_add(timestamp_delta)?;
        if timestamp >= ts_ms {
            return Some((h.base_offset + offset_delta, timestamp));
        }
        pos = start + length as usize;
    }
    None
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
}
