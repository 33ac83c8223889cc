//! The shape table (src/protocol/shapes.rs, generated from Kafka's message specs) against
//! the `kafka-protocol` codecs the broker decodes with, on real clients' frames
//! (fuzz/corpus, recorded by scripts/capture-corpus) re-encoded at every version both
//! know, and on mutations of them. If the crate is upgraded and its layout of any version
//! differs from the table, these fail.

use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::Decodable;
use spate::protocol::newer;
use spate::protocol::shape::{self, ShapeError};

fn corpus(kind: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(kind);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            let data = std::fs::read(&p).unwrap();
            (p, data)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 50, "{kind} corpus has only {} frames", out.len());
    out
}

/// A request frame (no length prefix) split into api key, version and body.
fn split_request(frame: &[u8]) -> Option<(ApiKey, i16, Bytes)> {
    let key = ApiKey::try_from(i16::from_be_bytes([frame[0], frame[1]])).ok()?;
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    // Versions past the crate's codecs: `newer_requests_pass` below.
    if !(key.valid_versions().min..=newer::crate_max(key)).contains(&version) {
        return None;
    }
    let mut buf = Bytes::copy_from_slice(frame);
    RequestHeader::decode(&mut buf, key.request_header_version(version)).ok()?;
    Some((key, version, buf))
}

fn versions_both_know(key: ApiKey, shape: &'static shape::MessageShape) -> impl Iterator<Item = i16> {
    let crate_range = key.valid_versions();
    (crate_range.min..=crate_range.max).filter(move |v| shape.valid.contains(*v))
}

#[test]
fn real_requests_pass_at_every_version() {
    let mut checked = 0;
    for (path, frame) in corpus("request") {
        let Some((key, version, body)) = split_request(&frame) else { continue };
        let shape = shape::request_shape(key as i16).expect("shape");
        assert_eq!(
            shape::check(shape, version, &body, u64::MAX),
            Ok(body.len()),
            "{}: {key:?} v{version} as recorded",
            path.display()
        );
        let decoded = RequestKind::decode(key, &mut body.clone(), version)
            .unwrap_or_else(|e| panic!("{}: crate cannot decode it: {e}", path.display()));
        for v in versions_both_know(key, shape) {
            let mut buf = BytesMut::new();
            if decoded.encode(&mut buf, v).is_err() {
                continue; // a field set that this version cannot carry
            }
            match shape::check(shape, v, &buf, u64::MAX) {
                // The crate writes a null array even at versions where it is not
                // nullable (Metadata v0 "all topics"); Kafka would refuse both ways.
                Err(ShapeError::NotNullable { .. }) => continue,
                verdict => assert_eq!(verdict, Ok(buf.len()), "{}: re-encoded as v{v}", path.display()),
            }
            RequestKind::decode(key, &mut buf.freeze(), v).expect("crate decodes its own encoding");
            checked += 1;
        }
    }
    assert!(checked > 300, "only {checked} (frame, version) pairs checked");
}

/// The corpus's requests at versions past the crate's: the shape table reads them to
/// their last byte and `protocol::newer` (or the crate at the version whose body they
/// share) decodes them.
#[test]
fn newer_requests_pass() {
    let mut checked = 0;
    for (path, frame) in corpus("request") {
        let key = ApiKey::try_from(i16::from_be_bytes([frame[0], frame[1]])).unwrap();
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        if version <= newer::crate_max(key) {
            continue;
        }
        let mut body = Bytes::copy_from_slice(&frame);
        RequestHeader::decode(&mut body, newer::request_header_version(key, version)).unwrap();
        let shape = shape::request_shape(key as i16).expect("shape");
        assert_eq!(shape::check(shape, version, &body, u64::MAX), Ok(body.len()), "{}", path.display());
        match newer::codec_version(key, version, true) {
            Some(v) => assert!(RequestKind::decode(key, &mut body.clone(), v).is_ok(), "{}", path.display()),
            None => assert!(newer::decode_request(key, &mut body.clone(), version).unwrap(), "{}", path.display()),
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} newer requests in the corpus");
}

#[test]
fn real_responses_pass_at_every_version() {
    let mut checked = 0;
    for (path, data) in corpus("response") {
        let key = ApiKey::try_from(i16::from_be_bytes([data[0], data[1]])).unwrap();
        let mut version = i16::from_be_bytes([data[2], data[3]]);
        let mut body = Bytes::copy_from_slice(&data[4..]);
        ResponseHeader::decode(&mut body, key.response_header_version(version)).unwrap();
        if key == ApiKey::ApiVersions && body[..2] == 35i16.to_be_bytes() {
            version = 0; // UNSUPPORTED_VERSION is answered at v0 (KIP-511)
        }
        let shape = shape::response_shape(key as i16).expect("shape");
        if !shape.valid.contains(version) {
            continue;
        }
        assert_eq!(
            shape::check(shape, version, &body, u64::MAX),
            Ok(body.len()),
            "{}: {key:?} v{version} as recorded",
            path.display()
        );
        let decoded = ResponseKind::decode(key, &mut body.clone(), version)
            .unwrap_or_else(|e| panic!("{}: crate cannot decode it: {e}", path.display()));
        for v in versions_both_know(key, shape) {
            let mut buf = BytesMut::new();
            if decoded.encode(&mut buf, v).is_err() {
                continue;
            }
            match shape::check(shape, v, &buf, u64::MAX) {
                Err(ShapeError::NotNullable { .. }) => continue,
                verdict => assert_eq!(verdict, Ok(buf.len()), "{}: re-encoded as v{v}", path.display()),
            }
            checked += 1;
        }
    }
    assert!(checked > 300, "only {checked} (frame, version) pairs checked");
}

/// SplitMix64: deterministic mutations without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// What an attacker does to a real request: flip bits, set length-like fields to
/// extremes, cut it short.
fn mutate(rng: &mut Rng, body: &[u8]) -> Vec<u8> {
    let mut b = body.to_vec();
    for _ in 0..1 + rng.below(3) {
        if b.is_empty() {
            break;
        }
        let at = rng.below(b.len());
        match rng.below(5) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next() as u8,
            2 => {
                let extreme: [u8; 4] =
                    [[0xff; 4], [0x7f, 0xff, 0xff, 0xff], [0, 0, 0xff, 0xff], [0x80, 0, 0, 0]][rng.below(4)];
                let n = 4.min(b.len() - at);
                b[at..at + n].copy_from_slice(&extreme[..n]);
            }
            3 => b[at] = [0x80, 0xff, 0x00, 0x7f][rng.below(4)],
            _ => b.truncate(at),
        }
    }
    b
}

/// Mutated real requests: the check never panics; whatever it accepts the codec decodes
/// without asking for more memory than the frame can back; and where it refuses a body
/// as truncated or negative-length, the codec refuses it too, so the table and the codec
/// read the same fields at the same places.
#[test]
fn mutated_requests_agree_with_the_codec() {
    let mut rng = Rng(0x5eed);
    let (mut accepted, mut refused) = (0, 0);
    for (path, frame) in corpus("request") {
        let Some((key, version, body)) = split_request(&frame) else { continue };
        for _ in 0..300 {
            let m = mutate(&mut rng, &body);
            let verdict = shape::check_request(key as i16, version, &m);
            match &verdict {
                Ok(()) => accepted += 1,
                // Where the check is stricter than the codec (as Kafka's own parser is:
                // over-long counts and varints, null in a non-nullable field, a tagged
                // field longer or shorter than its size), the codec would read on past
                // that point into bytes nothing vetted: it is not run on them.
                Err(
                    ShapeError::CountBeyondFrame { .. }
                    | ShapeError::TooManyElements(_)
                    | ShapeError::BadVarint { .. }
                    | ShapeError::NotNullable { .. }
                    | ShapeError::TaggedFieldOverrun { .. },
                ) => {
                    refused += 1;
                    continue;
                }
                Err(_) => refused += 1,
            }
            let decoded = RequestKind::decode(key, &mut Bytes::from(m.clone()), version);
            if let (Err(why), Ok(_)) = (&verdict, &decoded) {
                panic!("{}: {key:?} v{version}: refused ({why}) but the codec decodes {m:02x?}", path.display());
            }
        }
    }
    assert!(accepted > 1000 && refused > 1000, "accepted {accepted}, refused {refused}");
}

/// The frames from issue 16: a Metadata request whose topic count is near 2^31 (it
/// aborted the broker through `Vec::with_capacity`), in classic and compact encodings,
/// and the same trick on every array-bearing API the broker advertises.
#[test]
fn huge_counts_are_refused_before_decoding() {
    let classic = [0x7f, 0xff, 0xff, 0xf0];
    assert!(matches!(shape::check_request(3, 1, &classic), Err(ShapeError::CountBeyondFrame { .. })));
    let compact = [0xf0, 0xff, 0xff, 0xff, 0x0f];
    assert!(matches!(shape::check_request(3, 12, &compact), Err(ShapeError::CountBeyondFrame { .. })));
    // Every real request, each 4-byte window set to 0x7ffffff0 in turn: the check refuses
    // or accepts, and accepted ones decode (the codec then cannot ask for 2^31 elements).
    for (_, frame) in corpus("request") {
        let Some((key, version, body)) = split_request(&frame) else { continue };
        for at in 0..body.len().saturating_sub(4) {
            let mut m = body.to_vec();
            m[at..at + 4].copy_from_slice(&classic);
            if shape::check_request(key as i16, version, &m).is_ok() {
                let _ = RequestKind::decode(key, &mut Bytes::from(m), version);
            }
        }
    }
}
