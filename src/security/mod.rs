//! Who a connection is, and what it may do.
//!
//! Every connection has a principal, as Kafka's `KafkaPrincipal`: `User:ANONYMOUS` on a
//! PLAINTEXT listener, the SASL user once SaslAuthenticate has succeeded, the
//! certificate's subject on a TLS listener with client authentication. Each request
//! carries its connection's principal (`RequestFrame::principal`) so handlers, the
//! authorizer and quotas see it.

pub mod acl;
pub mod client;
pub mod entity;
pub mod principal_mapping;
pub mod quota;
pub mod sasl;
pub mod scram;
pub mod tls;

use std::fmt;
use std::sync::Arc;

/// A principal as Kafka names it: `type:name`, where the type is `User` for every
/// principal Kafka's default builder makes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Principal {
    pub kind: String,
    pub name: String,
}

impl Principal {
    pub const USER: &'static str = "User";
    pub const ANONYMOUS: &'static str = "ANONYMOUS";

    /// `User:<name>`.
    pub fn user(name: impl Into<String>) -> Self {
        Principal { kind: Self::USER.to_string(), name: name.into() }
    }

    /// `User:ANONYMOUS`: an unauthenticated connection's principal, as Kafka's.
    pub fn anonymous() -> Self {
        Self::user(Self::ANONYMOUS)
    }

    /// One shared `User:ANONYMOUS`, for frames made before a connection is known.
    pub fn anonymous_arc() -> Arc<Principal> {
        thread_local! {
            static ANON: Arc<Principal> = Arc::new(Principal::anonymous());
        }
        ANON.with(Arc::clone)
    }

    pub fn is_anonymous(&self) -> bool {
        self.kind == Self::USER && self.name == Self::ANONYMOUS
    }

    /// Parse Kafka's `type:name` form (`User:alice`); the name may contain ':'.
    pub fn parse(s: &str) -> Option<Self> {
        let (kind, name) = s.split_once(':')?;
        if kind.is_empty() || name.is_empty() {
            return None;
        }
        Some(Principal { kind: kind.to_string(), name: name.to_string() })
    }

    /// The principal as a forwarding broker puts it in an Envelope (KIP-590), in Kafka's
    /// `DefaultKafkaPrincipalBuilder.serialize` form: a 2-byte version, then
    /// `DefaultPrincipalData` at that version.
    pub fn encode_forwarded(&self) -> bytes::Bytes {
        use kafka_protocol::messages::DefaultPrincipalData;
        use kafka_protocol::protocol::{Encodable, StrBytes};
        let data = DefaultPrincipalData::default()
            .with_type(StrBytes::from_string(self.kind.clone()))
            .with_name(StrBytes::from_string(self.name.clone()))
            .with_token_authenticated(false);
        let mut buf = bytes::BytesMut::new();
        buf.extend_from_slice(&FORWARDED_PRINCIPAL_VERSION.to_be_bytes());
        data.encode(&mut buf, FORWARDED_PRINCIPAL_VERSION).expect("a principal always encodes");
        buf.freeze()
    }

    /// `encode_forwarded`'s bytes back. Untrusted (they come off the network): at most
    /// `forwarded_principal_bytes_max`, version 0 only, a type and a name that are not
    /// empty; any other input is an error, never a panic.
    pub fn decode_forwarded(bytes: &[u8]) -> Result<Principal, String> {
        use kafka_protocol::messages::DefaultPrincipalData;
        use kafka_protocol::protocol::Decodable;
        if bytes.len() > forwarded_principal_bytes_max {
            return Err(format!("{} bytes, above the {forwarded_principal_bytes_max} allowed", bytes.len()));
        }
        let (version, body) = bytes.split_at_checked(2).ok_or("no version")?;
        let version = i16::from_be_bytes([version[0], version[1]]);
        if version != FORWARDED_PRINCIPAL_VERSION {
            return Err(format!("version {version}"));
        }
        let mut body = bytes::Bytes::copy_from_slice(body);
        let data = DefaultPrincipalData::decode(&mut body, version).map_err(|e| e.to_string())?;
        if data._type.is_empty() || data.name.is_empty() {
            return Err("an empty principal type or name".into());
        }
        Ok(Principal { kind: data._type.to_string(), name: data.name.to_string() })
    }
}

/// The `DefaultPrincipalData` version Kafka's brokers write (its highest, 0).
const FORWARDED_PRINCIPAL_VERSION: i16 = 0;
/// The most bytes a forwarded principal may take (a type and a name; a certificate's
/// subject can be long, but not this long).
#[allow(non_upper_case_globals)]
pub const forwarded_principal_bytes_max: usize = 8 * 1024;

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_print_and_parse_as_kafka_writes_them() {
        assert_eq!(Principal::anonymous().to_string(), "User:ANONYMOUS");
        assert!(Principal::anonymous().is_anonymous());
        assert_eq!(Principal::parse("User:CN=a,O=b:c"), Some(Principal::user("CN=a,O=b:c")));
        assert_eq!(Principal::parse("alice"), None);
        assert_eq!(Principal::parse("User:"), None);
    }

    #[test]
    fn forwarded_principals_round_trip_and_bad_bytes_are_refused() {
        for p in [Principal::user("alice"), Principal::user("CN=a,O=b:c"), Principal::anonymous()] {
            let bytes = p.encode_forwarded();
            // Kafka's form: version 0, compact strings (length + 1), the bool, no tags.
            assert_eq!(&bytes[..3], &[0, 0, 5], "{p}");
            assert_eq!(Principal::decode_forwarded(&bytes), Ok(p));
        }
        let alice = Principal::user("alice").encode_forwarded();
        assert!(Principal::decode_forwarded(&alice[..alice.len() - 2]).is_err(), "cut short");
        assert!(Principal::decode_forwarded(&[]).is_err());
        assert!(Principal::decode_forwarded(&[0, 1, 5]).is_err(), "version 1");
        assert!(Principal::decode_forwarded(&[0, 0, 1, 1, 0, 0]).is_err(), "empty type and name");
        assert!(Principal::decode_forwarded(&vec![0u8; forwarded_principal_bytes_max + 1]).is_err());
        assert!(!Principal::user("alice").is_anonymous());
    }
}
