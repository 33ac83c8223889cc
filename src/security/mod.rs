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
}

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
        assert!(!Principal::user("alice").is_anonymous());
    }
}
