//! Bounded decompression of a stored batch's records, for the broker paths that must look
//! inside a compressed batch (ListOffsets by timestamp: Kafka's
//! FileRecords.searchForTimestamp iterates the records of compressed batches too).
//!
//! Invariant: never more than the caller's `max_bytes` come out, however small the input;
//! past it the answer is None, as for a batch that does not decompress. The codecs are
//! Kafka's attribute values: 1 gzip, 2 snappy (xerial framing, or raw), 3 lz4 (frame),
//! 4 zstd. Pure: no I/O, callable from any shard.

use std::io::Read;

/// snappy-java's SnappyOutputStream header: the magic, then version and compatible
/// version (i32 each), then blocks of `length: u32 BE, raw snappy block`.
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_BYTES: usize = 16;

/// The records section of a batch compressed with `codec`, decompressed; None when it
/// does not decompress or would exceed `max_bytes`.
pub fn decompress_records(codec: u8, compressed: &[u8], max_bytes: usize) -> Option<Vec<u8>> {
    let limit = max_bytes as u64 + 1;
    let mut out = Vec::new();
    match codec {
        1 => flate2::read::GzDecoder::new(compressed).take(limit).read_to_end(&mut out).ok()?,
        2 => return snappy(compressed, max_bytes),
        3 => lz4::Decoder::new(compressed).ok()?.take(limit).read_to_end(&mut out).ok()?,
        4 => zstd::stream::read::Decoder::new(compressed).ok()?.take(limit).read_to_end(&mut out).ok()?,
        _ => return None,
    };
    (out.len() <= max_bytes).then_some(out)
}

fn snappy(data: &[u8], max_bytes: usize) -> Option<Vec<u8>> {
    let mut decoder = snap::raw::Decoder::new();
    if !data.starts_with(XERIAL_MAGIC) {
        // Raw snappy, as snappy-java's SnappyInputStream falls back to.
        if snap::raw::decompress_len(data).ok()? > max_bytes {
            return None;
        }
        return decoder.decompress_vec(data).ok();
    }
    let mut rest = data.get(XERIAL_HEADER_BYTES..)?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let length = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let end = 4usize.checked_add(length)?;
        let block = rest.get(4..end)?;
        let n = snap::raw::decompress_len(block).ok()?;
        let start = out.len();
        if start.checked_add(n)? > max_bytes {
            return None;
        }
        out.resize(start + n, 0);
        let written = decoder.decompress(block, &mut out[start..]).ok()?;
        assert!(written <= n, "snappy wrote {written} bytes into a block of {n}");
        out.truncate(start + written);
        rest = &rest[end..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::batch::HEADER_BYTES;
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};

    const CODECS: [(u8, Compression); 4] =
        [(1, Compression::Gzip), (2, Compression::Snappy), (3, Compression::Lz4), (4, Compression::Zstd)];

    /// A batch as the clients write it (kafka-protocol's encoder: Kafka's formats,
    /// snappy with xerial framing), `count` records of `value_bytes` each.
    fn batch(compression: Compression, count: i64, value: impl Fn(i64) -> Vec<u8>) -> Vec<u8> {
        let records: Vec<_> = (0..count)
            .map(|i| {
                let mut r = crate::protocol::plain_record(
                    i,
                    0,
                    1_700_000_000_000 + i,
                    Some(Bytes::from(format!("k{i}"))),
                    Some(Bytes::from(value(i))),
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

    #[test]
    fn every_codec_gives_back_the_uncompressed_records_and_stops_at_the_limit() {
        let value = |i: i64| (0..2000 + i * 37).map(|j| (j % 251) as u8).collect::<Vec<u8>>();
        let plain = batch(Compression::None, 50, value);
        let records = &plain[HEADER_BYTES..];
        for (codec, compression) in CODECS {
            let b = batch(compression, 50, value);
            assert_eq!(b[22] & 0x07, codec, "attributes of the {compression:?} batch");
            let compressed = &b[HEADER_BYTES..];
            let inflated = decompress_records(codec, compressed, records.len());
            assert!(inflated.as_deref() == Some(records), "{compression:?}: {:?} bytes", inflated.map(|v| v.len()));
            let capped = decompress_records(codec, compressed, records.len() - 1);
            assert!(capped.is_none(), "{compression:?} past the limit: {:?} bytes", capped.map(|v| v.len()));
        }
        assert_eq!(decompress_records(0, b"x", 10), None);
        assert_eq!(decompress_records(9, b"x", 10), None);
        assert_eq!(decompress_records(2, b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01\xff\xff\xff\xff", 10), None);
    }

    #[test]
    fn a_compression_bomb_stops_at_the_limit() {
        // 16 records of 1 MiB of zeros: a few KiB compressed, 16 MiB inflated.
        for (codec, compression) in CODECS {
            let b = batch(compression, 16, |_| vec![0u8; 1 << 20]);
            let compressed = &b[HEADER_BYTES..];
            assert!(compressed.len() < 1 << 20, "{compression:?}: {} bytes", compressed.len());
            assert_eq!(decompress_records(codec, compressed, 1 << 20), None, "{compression:?}");
        }
    }
}
