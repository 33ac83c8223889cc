//! Test helpers for the log tests: an independent magic-2 record batch encoder and
//! decoder (own varints, own bitwise CRC32C), written from Kafka's documented format.
#![allow(dead_code)]

pub fn crc32c_bitwise(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

pub fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        if z < 0x80 {
            out.push(z as u8);
            return;
        }
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
}

pub fn get_varint(buf: &[u8], pos: &mut usize) -> i64 {
    let mut z = 0u64;
    let mut shift = 0;
    loop {
        let b = buf[*pos];
        *pos += 1;
        z |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// One record: timestamp (absolute), key, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Rec {
    pub timestamp: i64,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// An uncompressed magic-2 batch, baseOffset 0, producer fields -1, CreateTime.
pub fn build_batch(records: &[Rec]) -> Vec<u8> {
    assert!(!records.is_empty());
    let base_ts = records[0].timestamp;
    let max_ts = records.iter().map(|r| r.timestamp).max().unwrap();
    let mut body = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let mut rec = vec![0u8]; // attributes
        put_varint(&mut rec, r.timestamp - base_ts);
        put_varint(&mut rec, i as i64);
        match &r.key {
            Some(k) => {
                put_varint(&mut rec, k.len() as i64);
                rec.extend_from_slice(k);
            }
            None => put_varint(&mut rec, -1),
        }
        put_varint(&mut rec, r.value.len() as i64);
        rec.extend_from_slice(&r.value);
        put_varint(&mut rec, 0); // headers
        put_varint(&mut body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes()); // baseOffset
    b.extend_from_slice(&((49 + body.len()) as i32).to_be_bytes()); // batchLength
    b.extend_from_slice(&(-1i32).to_be_bytes()); // partitionLeaderEpoch
    b.push(2); // magic
    b.extend_from_slice(&[0; 4]); // crc, filled below
    b.extend_from_slice(&0i16.to_be_bytes()); // attributes
    b.extend_from_slice(&((records.len() - 1) as i32).to_be_bytes()); // lastOffsetDelta
    b.extend_from_slice(&base_ts.to_be_bytes());
    b.extend_from_slice(&max_ts.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producerId
    b.extend_from_slice(&(-1i16).to_be_bytes()); // producerEpoch
    b.extend_from_slice(&(-1i32).to_be_bytes()); // baseSequence
    b.extend_from_slice(&(records.len() as i32).to_be_bytes());
    b.extend_from_slice(&body);
    fix_crc(&mut b);
    b
}

pub fn fix_crc(b: &mut [u8]) {
    let crc = crc32c_bitwise(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
}

/// A decoded batch.
/// A decoded record: (offset, timestamp, key, value).
pub type DecodedRecord = (i64, i64, Option<Vec<u8>>, Vec<u8>);

#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub base_offset: i64,
    pub last_offset: i64,
    pub attributes: i16,
    pub max_timestamp: i64,
    pub size: usize,
    pub records: Vec<DecodedRecord>,
}

/// Decode back-to-back batches; panics on anything malformed (CRC included).
pub fn decode_batches(mut buf: &[u8]) -> Vec<Decoded> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let i64_at = |b: &[u8], at: usize| i64::from_be_bytes(b[at..at + 8].try_into().unwrap());
        let i32_at = |b: &[u8], at: usize| i32::from_be_bytes(b[at..at + 4].try_into().unwrap());
        let base_offset = i64_at(buf, 0);
        let size = 12 + i32_at(buf, 8) as usize;
        let b = &buf[..size];
        assert_eq!(b[16], 2, "magic");
        let crc = u32::from_be_bytes(b[17..21].try_into().unwrap());
        assert_eq!(crc, crc32c_bitwise(&b[21..]), "crc");
        let attributes = i16::from_be_bytes(b[21..23].try_into().unwrap());
        let last_delta = i32_at(b, 23);
        let base_ts = i64_at(b, 27);
        let max_timestamp = i64_at(b, 35);
        let count = i32_at(b, 57);
        let mut records = Vec::new();
        if attributes & 7 == 0 {
            let mut p = 61;
            for _ in 0..count {
                let len = get_varint(b, &mut p) as usize;
                let end = p + len;
                p += 1;
                let ts = base_ts + get_varint(b, &mut p);
                let od = get_varint(b, &mut p);
                let kl = get_varint(b, &mut p);
                let key = (kl >= 0).then(|| {
                    let k = b[p..p + kl as usize].to_vec();
                    p += kl as usize;
                    k
                });
                let vl = get_varint(b, &mut p) as usize;
                let value = b[p..p + vl].to_vec();
                p += vl;
                let _headers = get_varint(b, &mut p);
                assert_eq!(p, end, "record length");
                records.push((base_offset + od, ts, key, value));
            }
            assert_eq!(p, size, "batch length");
        }
        out.push(Decoded {
            base_offset,
            last_offset: base_offset + last_delta as i64,
            attributes,
            max_timestamp,
            size,
            records,
        });
        buf = &buf[size..];
    }
    out
}

pub fn small_config() -> spate::log::LogConfig {
    spate::log::LogConfig { segment_index_bytes: 4096, ..Default::default() }
}

pub fn recs(n: usize, ts: i64, value_bytes: usize) -> Vec<Rec> {
    (0..n)
        .map(|i| Rec { timestamp: ts + i as i64, key: Some(vec![b'k'; i % 3]), value: vec![i as u8; value_bytes] })
        .collect()
}
