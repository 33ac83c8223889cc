//! Format tests: hand-built Kafka batches are accepted and read back byte for byte; what
//! the log writes parses with an independent decoder; validation errors; index layout.

#[path = "log_common/mod.rs"]
mod common;

use common::*;
use spate::log::{LogConfig, LogError, PartitionLog, TimestampType};
use spate::model::Offset;

/// One record batch, every byte written out from Kafka's documented format
/// (KIP-98 / "Record Batch" in the protocol docs): one record, key "k", value "hi".
fn hand_built_batch() -> Vec<u8> {
    let mut b: Vec<u8> = vec![
        0, 0, 0, 0, 0, 0, 0, 0, // baseOffset 0
        0, 0, 0, 0x3A, // batchLength = 49 + 9 = 58
        0xFF, 0xFF, 0xFF, 0xFF, // partitionLeaderEpoch -1
        2,    // magic
        0, 0, 0, 0, // crc (computed below)
        0, 0, // attributes: no compression, CreateTime
        0, 0, 0, 0, // lastOffsetDelta 0
        0, 0, 0x01, 0x8B, 0xCF, 0xE5, 0x68, 0x00, // baseTimestamp 1700000000000
        0, 0, 0x01, 0x8B, 0xCF, 0xE5, 0x68, 0x00, // maxTimestamp
        0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, // producerId -1
        0xFF, 0xFF, // producerEpoch -1
        0xFF, 0xFF, 0xFF, 0xFF, // baseSequence -1
        0, 0, 0, 1, // recordsCount 1
        // record: length varint 8 (zig-zag 16), attributes 0, timestampDelta 0,
        // offsetDelta 0, keyLength 1 (2), "k", valueLength 2 (4), "hi", headers 0
        0x10, 0x00, 0x00, 0x00, 0x02, b'k', 0x04, b'h', b'i', 0x00,
    ];
    // record length counts the bytes after the length varint: 9
    b[61] = 0x12;
    assert_eq!(b.len(), 12 + 58 + 1 - 1 + 1);
    fix_crc(&mut b);
    b
}

#[test]
fn hand_built_batch_round_trips() {
    let mut b = hand_built_batch();
    // batchLength must be the real size - 12
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    fix_crc(&mut b);
    let decoded = decode_batches(&b);
    assert_eq!(decoded[0].records, vec![(0, 1_700_000_000_000, Some(b"k".to_vec()), b"hi".to_vec())]);

    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    let mut first = b.clone();
    log.append(&mut first, 0).unwrap();
    let mut second = b.clone();
    let info = log.append(&mut second, 0).unwrap();
    assert_eq!(info.base_offset, Offset(1));
    let plan = log.read(Offset(1), 1 << 20, Offset(2), true).unwrap();
    let bytes = plan.read_to_vec().unwrap();
    let mut expect = b.clone();
    expect[0..8].copy_from_slice(&1i64.to_be_bytes());
    assert_eq!(bytes, expect, "the stored batch is the produced one with baseOffset set");
    // the segment file is exactly the two batches back to back
    let raw = std::fs::read(dir.path().join("00000000000000000000.log")).unwrap();
    assert_eq!(raw.len(), 2 * b.len());
    assert_eq!(&raw[b.len()..], &expect[..]);
    assert_eq!(log.offset_for_timestamp(1_700_000_000_000).unwrap(), Some((Offset(0), 1_700_000_000_000)));
}

#[test]
fn written_batches_decode_independently() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    let mut set = build_batch(&recs(3, 1000, 10));
    set.extend(build_batch(&recs(2, 2000, 5)));
    let info = log.append(&mut set, 5).unwrap();
    assert_eq!((info.base_offset, info.last_offset, info.record_count), (Offset(0), Offset(4), 5));
    let bytes = log.read(Offset(0), 1 << 20, Offset(5), true).unwrap().read_to_vec().unwrap();
    let d = decode_batches(&bytes);
    assert_eq!(d.len(), 2);
    assert_eq!(d[1].records.iter().map(|r| r.0).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(d[1].records[1].1, 2001);
}

#[test]
fn log_append_time_sets_bit_and_crc() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { timestamp_type: TimestampType::LogAppendTime, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    let info = log.append(&mut build_batch(&recs(2, 10, 1)), 777).unwrap();
    assert_eq!(info.log_append_time_ms, 777);
    let d = decode_batches(&log.read(Offset(0), 1000, Offset(9), true).unwrap().read_to_vec().unwrap());
    assert_eq!(d[0].attributes & 0x08, 0x08);
    assert_eq!(d[0].max_timestamp, 777);
}

#[test]
fn validation_rejects_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { max_message_bytes: 200, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    let good = build_batch(&recs(1, 1, 1));

    let mut bad_crc = good.clone();
    *bad_crc.last_mut().unwrap() ^= 1;
    assert!(matches!(log.append(&mut bad_crc, 0), Err(LogError::Corrupt(_))));

    let mut magic1 = good.clone();
    magic1[16] = 1;
    assert!(matches!(log.append(&mut magic1, 0), Err(LogError::Corrupt(_))));

    let mut big = build_batch(&recs(1, 1, 300));
    assert!(matches!(log.append(&mut big, 0), Err(LogError::MessageTooLarge { .. })));

    let mut count = good.clone();
    count[57..61].copy_from_slice(&2i32.to_be_bytes());
    fix_crc(&mut count);
    assert!(matches!(log.append(&mut count, 0), Err(LogError::InvalidRecord(_))));

    let mut neg_ts = good.clone();
    neg_ts[35..43].copy_from_slice(&(-5i64).to_be_bytes());
    fix_crc(&mut neg_ts);
    assert!(matches!(log.append(&mut neg_ts, 0), Err(LogError::InvalidRecord(_))));

    let mut truncated = good[..good.len() - 1].to_vec();
    assert!(matches!(log.append(&mut truncated, 0), Err(LogError::Corrupt(_))));

    let mut huge_len = good.clone();
    huge_len[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
    assert!(log.append(&mut huge_len, 0).is_err());

    // a valid batch followed by an invalid one: nothing written
    let mut set = good.clone();
    set.extend(bad_crc.clone());
    assert!(log.append(&mut set, 0).is_err());
    assert_eq!(log.log_end_offset(), Offset(0));
    assert_eq!(log.size_bytes(), 0);

    log.append(&mut good.clone(), 0).unwrap();
    assert_eq!(log.log_end_offset(), Offset(1));
}

#[test]
fn index_files_have_kafka_layout() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { index_interval_bytes: 100, ..small_config() };
    let mut log = PartitionLog::open(dir.path(), config.clone(), 0).unwrap();
    let mut sizes = Vec::new();
    for i in 0..10 {
        let mut b = build_batch(&recs(2, 1000 + i * 10, 60));
        sizes.push(b.len());
        log.append(&mut b, 0).unwrap();
    }
    // preallocated while active
    let index_path = dir.path().join("00000000000000000000.index");
    assert_eq!(std::fs::metadata(&index_path).unwrap().len(), 4096);
    log.close().unwrap();
    let index = std::fs::read(&index_path).unwrap();
    let time = std::fs::read(dir.path().join("00000000000000000000.timeindex")).unwrap();
    assert_eq!(index.len() % 8, 0);
    assert_eq!(time.len() % 12, 0);
    assert!(!index.is_empty());
    // every entry: relative offset = last offset of the batch at that position
    let size = sizes[0] as u32;
    for e in index.chunks(8) {
        let rel = u32::from_be_bytes(e[0..4].try_into().unwrap());
        let pos = u32::from_be_bytes(e[4..8].try_into().unwrap());
        assert_eq!(pos % size, 0);
        assert_eq!(rel, (pos / size) * 2 + 1);
    }
    let last = &time[time.len() - 12..];
    assert_eq!(i64::from_be_bytes(last[0..8].try_into().unwrap()), 1000 + 9 * 10 + 1);
    assert_eq!(u32::from_be_bytes(last[8..12].try_into().unwrap()), 19);
    assert!(dir.path().join(".spate-clean-shutdown").exists());
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert!(!dir.path().join(".spate-clean-shutdown").exists());
    assert_eq!(log.log_end_offset(), Offset(20));
    assert_eq!(log.offset_for_timestamp(1055).unwrap(), Some((Offset(12), 1060)));
}

/// ListOffsets by timestamp inside compressed batches, as Kafka answers it: the offset
/// of the first record at or after the time, not the base offset of its batch. Three
/// batches of ten records (gzip, snappy, zstd), record n at 1000 + 10 n ms. franz-go's
/// ListOffsetsAfterMilli on its default snappy batches found this (tests/go).
#[test]
fn timestamp_search_inside_compressed_batches() {
    use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    for (b, compression) in [Compression::Gzip, Compression::Snappy, Compression::Zstd].into_iter().enumerate() {
        let records: Vec<_> = (0..10)
            .map(|i| {
                let n = b as i64 * 10 + i;
                let mut r = spate::protocol::plain_record(
                    i,
                    0,
                    1000 + 10 * n,
                    None,
                    Some(bytes::Bytes::from(format!("record {n} abcdefgh abcdefgh"))),
                    Default::default(),
                );
                r.sequence = i as i32;
                r
            })
            .collect();
        let mut buf = bytes::BytesMut::new();
        RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
        let mut batch = buf.to_vec();
        assert_ne!(batch[22] & 7, 0, "{compression:?} batch is compressed");
        assert_eq!(log.append(&mut batch, 0).unwrap().base_offset, Offset(b as i64 * 10));
    }
    for n in [0i64, 3, 9, 10, 15, 27, 29] {
        assert_eq!(log.offset_for_timestamp(1000 + 10 * n).unwrap(), Some((Offset(n), 1000 + 10 * n)), "record {n}");
        assert_eq!(
            log.offset_for_timestamp(1000 + 10 * n - 5).unwrap(),
            Some((Offset(n), 1000 + 10 * n)),
            "before {n}"
        );
    }
    assert_eq!(log.offset_for_timestamp(1000 + 10 * 29 + 1).unwrap(), None);
}
