//! Shape check: walk a message's bytes against Kafka's wire schema before any codec
//! allocates for it.
//!
//! Why: the `kafka-protocol` crate (0.18) reads an array's element count from the wire
//! and calls `Vec::with_capacity(count)` before it reads a single element, so a 20-byte
//! request can ask for ~100 GB and the allocation failure aborts the process. That
//! happens in every API with an array, at every version. Rather than trust each decoder,
//! every request body (and every response a peer sends us) is first walked here: each
//! array count, string and bytes length, and tagged-field size read from the frame is
//! checked against the bytes that are actually left (an array of N elements needs at
//! least N times the smallest encoding of one element) and against named limits. Only a
//! body that passes reaches the crate's decoder, whose allocations are then bounded by
//! the frame's size.
//!
//! The schema is data: `shapes.rs`, generated from Apache Kafka's message specs by
//! `scripts/gen-protocol-shapes`. The walk allocates nothing, reads each byte at most
//! once and is linear in the body's length (element counts are capped by the bytes
//! left). The tests prove the table agrees with the crate's codecs, version by version.
//!
//! What it does not check: UTF-8 in strings, values of fields (the handlers do that),
//! trailing bytes after the last field (Kafka ignores them too).

use crate::model::limits;

/// A version range, both ends inclusive; `Vr(1, 0)` is empty ("none").
#[derive(Debug, Clone, Copy)]
pub struct Vr(pub i16, pub i16);

impl Vr {
    pub fn contains(self, v: i16) -> bool {
        self.0 <= v && v <= self.1
    }
}

#[derive(Debug)]
pub enum Ty {
    Bool,
    Int8,
    Int16,
    Uint16,
    Int32,
    Uint32,
    Int64,
    Float64,
    Uuid,
    String,
    Bytes,
    Records,
    Struct(&'static [Field]),
    Array(&'static Ty),
}

#[derive(Debug)]
pub struct Field {
    pub versions: Vr,
    pub nullable: Vr,
    /// `(tag, tagged versions)`: in those versions the field lives in the tag buffer.
    pub tagged: Option<(u32, Vr)>,
    pub ty: Ty,
}

#[derive(Debug)]
pub struct MessageShape {
    pub api_key: i16,
    pub name: &'static str,
    pub valid: Vr,
    pub flexible: Vr,
    pub fields: &'static [Field],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("no schema for api key {0} version {1}")]
    UnknownMessage(i16, i16),
    #[error("frame ends at byte {at}: {need} more bytes needed")]
    Truncated { at: usize, need: usize },
    #[error("length {len} at byte {at} is negative")]
    NegativeLength { at: usize, len: i64 },
    #[error("null at byte {at} where the field is not nullable")]
    NotNullable { at: usize },
    #[error("array of {count} elements at byte {at} cannot fit in the {left} bytes left")]
    CountBeyondFrame { at: usize, count: u64, left: usize },
    #[error("message holds more than {0} array elements")]
    TooManyElements(u64),
    #[error("varint at byte {at} is longer than 5 bytes")]
    BadVarint { at: usize },
    #[error("tagged field {tag} at byte {at} overruns its {size} bytes")]
    TaggedFieldOverrun { at: usize, tag: u32, size: usize },
}

pub fn request_shape(api_key: i16) -> Option<&'static MessageShape> {
    super::shapes::REQUESTS.iter().find(|m| m.api_key == api_key)
}

pub fn response_shape(api_key: i16) -> Option<&'static MessageShape> {
    super::shapes::RESPONSES.iter().find(|m| m.api_key == api_key)
}

/// Check a request body (the bytes after the request header).
pub fn check_request(api_key: i16, version: i16, body: &[u8]) -> Result<(), ShapeError> {
    let shape = request_shape(api_key).ok_or(ShapeError::UnknownMessage(api_key, version))?;
    check(shape, version, body, limits::request_array_elements_max).map(|_| ())
}

/// Check a response body (the bytes after the response header) a peer sent us.
pub fn check_response(api_key: i16, version: i16, body: &[u8]) -> Result<(), ShapeError> {
    let shape = response_shape(api_key).ok_or(ShapeError::UnknownMessage(api_key, version))?;
    check(shape, version, body, limits::response_array_elements_max).map(|_| ())
}

/// Check bytes of a schema embedded in another message (group member metadata).
pub fn check_embedded(shape: &MessageShape, version: i16, body: &[u8]) -> Result<(), ShapeError> {
    check(shape, version, body, limits::request_array_elements_max).map(|_| ())
}

pub use super::shapes::{CONSUMER_PROTOCOL_ASSIGNMENT, CONSUMER_PROTOCOL_SUBSCRIPTION};

/// Walk `body` as `shape` at `version`, allowing at most `elements_max` array elements
/// in all; returns the number of bytes the message spans.
pub fn check(shape: &MessageShape, version: i16, body: &[u8], elements_max: u64) -> Result<usize, ShapeError> {
    if !shape.valid.contains(version) {
        return Err(ShapeError::UnknownMessage(shape.api_key, version));
    }
    let mut walk =
        Walk { buf: body, pos: 0, version, flexible: shape.flexible.contains(version), elements: 0, elements_max };
    walk.fields(shape.fields)?;
    Ok(walk.pos)
}

struct Walk<'a> {
    buf: &'a [u8],
    pos: usize,
    version: i16,
    flexible: bool,
    /// Array elements seen so far in this message, and how many it may hold.
    elements: u64,
    elements_max: u64,
}

impl Walk<'_> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn skip(&mut self, n: usize) -> Result<(), ShapeError> {
        if n > self.left() {
            return Err(ShapeError::Truncated { at: self.pos, need: n - self.left() });
        }
        self.pos += n;
        Ok(())
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], ShapeError> {
        let at = self.pos;
        self.skip(N)?;
        Ok(self.buf[at..at + N].try_into().expect("N bytes"))
    }

    fn varint(&mut self) -> Result<u32, ShapeError> {
        let at = self.pos;
        let mut value: u32 = 0;
        for i in 0..5 {
            let [b] = self.take::<1>()?;
            value |= ((b & 0x7f) as u32) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(ShapeError::BadVarint { at })
    }

    /// The length of a string, bytes or array: `None` for null. Compact (flexible)
    /// encodings carry length + 1 as an unsigned varint, classic ones an i16 (strings) or
    /// i32 (bytes, arrays) where -1 is null.
    fn length(&mut self, classic_i16: bool, nullable: bool) -> Result<Option<u64>, ShapeError> {
        let at = self.pos;
        let len: i64 = if self.flexible {
            self.varint()? as i64 - 1
        } else if classic_i16 {
            i16::from_be_bytes(self.take()?) as i64
        } else {
            i32::from_be_bytes(self.take()?) as i64
        };
        match len {
            -1 if nullable => Ok(None),
            -1 => Err(ShapeError::NotNullable { at }),
            n if n < 0 => Err(ShapeError::NegativeLength { at, len: n }),
            n => Ok(Some(n as u64)),
        }
    }

    fn fields(&mut self, fields: &[Field]) -> Result<(), ShapeError> {
        for f in fields {
            if !f.versions.contains(self.version) || self.is_tagged(f) {
                continue;
            }
            self.value(&f.ty, f.nullable.contains(self.version))?;
        }
        if self.flexible {
            self.tag_buffer(fields)?;
        }
        Ok(())
    }

    fn is_tagged(&self, f: &Field) -> bool {
        self.flexible && matches!(f.tagged, Some((_, tv)) if tv.contains(self.version))
    }

    /// The tagged fields of a flexible struct: count, then (tag, size, bytes) each. A tag
    /// this struct knows is walked as its type within its `size` bytes; others skipped.
    fn tag_buffer(&mut self, fields: &[Field]) -> Result<(), ShapeError> {
        let count = self.varint()? as usize;
        // Each tagged field needs at least two bytes (tag and size).
        if count > self.left() / 2 {
            return Err(ShapeError::CountBeyondFrame { at: self.pos, count: count as u64, left: self.left() });
        }
        for _ in 0..count {
            let tag = self.varint()?;
            let size = self.varint()? as usize;
            let at = self.pos;
            if size > self.left() {
                return Err(ShapeError::Truncated { at, need: size - self.left() });
            }
            let known = fields.iter().find(|f| {
                f.versions.contains(self.version)
                    && matches!(f.tagged, Some((t, tv)) if t == tag && tv.contains(self.version))
            });
            match known {
                Some(f) => {
                    let end = at + size;
                    let outer = self.buf;
                    self.buf = &outer[..end];
                    let walked = self.value(&f.ty, f.nullable.contains(self.version));
                    self.buf = outer;
                    walked?;
                    if self.pos != end {
                        // The crate decodes a known tag from the stream, not from its
                        // size: a value shorter or longer than `size` misaligns it.
                        return Err(ShapeError::TaggedFieldOverrun { at, tag, size });
                    }
                }
                None => self.pos = at + size,
            }
        }
        Ok(())
    }

    fn value(&mut self, ty: &Ty, nullable: bool) -> Result<(), ShapeError> {
        match ty {
            Ty::Bool | Ty::Int8 => self.skip(1),
            Ty::Int16 | Ty::Uint16 => self.skip(2),
            Ty::Int32 | Ty::Uint32 => self.skip(4),
            Ty::Int64 | Ty::Float64 => self.skip(8),
            Ty::Uuid => self.skip(16),
            Ty::String => self.blob(true, nullable),
            Ty::Bytes | Ty::Records => self.blob(false, nullable),
            Ty::Struct(fields) if nullable => {
                // A nullable struct carries an i8 presence marker: 1 present, else null.
                let [present] = self.take::<1>()?;
                if present as i8 == 1 {
                    self.fields(fields)
                } else {
                    Ok(())
                }
            }
            Ty::Struct(fields) => self.fields(fields),
            Ty::Array(elem) => {
                let at = self.pos;
                let Some(count) = self.length(false, nullable)? else { return Ok(()) };
                let min = self.min_bytes(elem).max(1) as u64;
                if count > self.left() as u64 / min {
                    return Err(ShapeError::CountBeyondFrame { at, count, left: self.left() });
                }
                self.elements += count;
                if self.elements > self.elements_max {
                    return Err(ShapeError::TooManyElements(self.elements_max));
                }
                for _ in 0..count {
                    self.value(elem, false)?;
                }
                Ok(())
            }
        }
    }

    fn blob(&mut self, string: bool, nullable: bool) -> Result<(), ShapeError> {
        let at = self.pos;
        match self.length(string, nullable)? {
            None => Ok(()),
            Some(len) if len > self.left() as u64 => {
                Err(ShapeError::Truncated { at, need: (len - self.left() as u64) as usize })
            }
            Some(len) => self.skip(len as usize),
        }
    }

    /// The fewest bytes one value of `ty` can take at this version.
    fn min_bytes(&self, ty: &Ty) -> usize {
        let len_prefix = |classic: usize| if self.flexible { 1 } else { classic };
        match ty {
            Ty::Bool | Ty::Int8 => 1,
            Ty::Int16 | Ty::Uint16 => 2,
            Ty::Int32 | Ty::Uint32 => 4,
            Ty::Int64 | Ty::Float64 => 8,
            Ty::Uuid => 16,
            Ty::String => len_prefix(2),
            Ty::Bytes | Ty::Records | Ty::Array(_) => len_prefix(4),
            Ty::Struct(fields) => {
                let own: usize = fields
                    .iter()
                    .filter(|f| f.versions.contains(self.version) && !self.is_tagged(f))
                    .map(|f| self.min_bytes(&f.ty))
                    .sum();
                own + usize::from(self.flexible)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, BytesMut};

    #[test]
    fn every_advertised_request_has_a_shape_for_every_version() {
        for (key, lo, hi) in crate::protocol::SUPPORTED_APIS.iter().chain(crate::protocol::PEER_APIS) {
            let shape = request_shape(*key as i16).unwrap_or_else(|| panic!("{key:?} has no request shape"));
            assert!(shape.valid.contains(*lo) && shape.valid.contains(*hi), "{key:?} {lo}..{hi} vs {:?}", shape.valid);
            assert!(response_shape(*key as i16).is_some(), "{key:?} has no response shape");
        }
    }

    #[test]
    fn metadata_array_count_beyond_the_frame_is_refused() {
        // Metadata v1: topics array with count 0x7fff_fff0 and nothing after it.
        let mut b = BytesMut::new();
        b.put_i32(0x7fff_fff0);
        let err = check_request(3, 1, &b).unwrap_err();
        assert!(matches!(err, ShapeError::CountBeyondFrame { count: 0x7fff_fff0, .. }), "{err}");
        // Flexible v12: compact count (varint 0xffff_fff0).
        let mut b = BytesMut::new();
        b.put_slice(&[0xf0, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(check_request(3, 12, &b), Err(ShapeError::CountBeyondFrame { .. })));
    }

    #[test]
    fn null_only_where_nullable() {
        // Metadata v0: topics not nullable; v1: nullable (all topics).
        let b = (-1i32).to_be_bytes();
        assert!(matches!(check_request(3, 0, &b), Err(ShapeError::NotNullable { .. })));
        assert_eq!(check_request(3, 1, &b), Ok(()));
    }

    #[test]
    fn total_elements_are_capped() {
        // Metadata v1 with request_array_elements_max + 1 empty topic names (2 bytes each).
        let n = limits::request_array_elements_max as usize + 1;
        let mut b = BytesMut::with_capacity(4 + 2 * n);
        b.put_i32(n as i32);
        for _ in 0..n {
            b.put_i16(0);
        }
        b.put_u8(1);
        assert_eq!(check_request(3, 1, &b), Err(ShapeError::TooManyElements(limits::request_array_elements_max)));
    }

    #[test]
    fn bad_varint_and_tag_sizes() {
        // ApiVersions v3: compact strings then a tag buffer.
        assert!(matches!(
            check_request(18, 3, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(ShapeError::BadVarint { .. })
        ));
        // software name "", version "", then one tagged field claiming 100 bytes.
        assert!(matches!(check_request(18, 3, &[1, 1, 1, 7, 100, 0]), Err(ShapeError::Truncated { .. })));
        assert_eq!(check_request(18, 3, &[1, 1, 1, 7, 1, 0]), Ok(()));
    }
}
