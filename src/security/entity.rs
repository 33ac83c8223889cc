//! Client entity configs: what `/config/users/<user>`, `/config/clients/<client-id>` and
//! `/config/users/<user>/clients/<client-id>` hold (Kafka's ZooKeeper layout): client
//! quotas (`producer_byte_rate`, `consumer_byte_rate`, `request_percentage`,
//! `controller_mutation_rate`) and, on a user, SCRAM credentials (`SCRAM-SHA-256`,
//! `SCRAM-SHA-512`).
//!
//! Entities are named by Kafka's entity path, relative to `/config`: `users/alice`,
//! `clients/app-1`, `users/alice/clients/app-1`, with `<default>` for the default
//! entity. Names in paths are sanitized as Kafka's `Sanitizer` does (URL-encoding, with
//! `%20` for a space and `%2A` for `*`), so `User:a b` lives in `users/a%20b`.
//!
//! `EntityConfigs::parse` turns the registry's raw documents into what shards read (in
//! the `ClusterView`): parsed quotas and credentials. A value that does not parse is
//! left out with a warning; it never panics.

use std::collections::BTreeMap;

use super::scram::{ScramCredential, ScramMechanism};

/// Kafka's name for a default entity, in paths and documents.
pub const DEFAULT_ENTITY: &str = "<default>";

pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";

/// The quota keys a user or client entity takes, with whether Kafka types them LONG
/// (integer text in the document) rather than DOUBLE.
pub const QUOTA_KEYS: [(&str, bool); 4] = [
    (PRODUCER_BYTE_RATE, true),
    (CONSUMER_BYTE_RATE, true),
    (REQUEST_PERCENTAGE, false),
    (CONTROLLER_MUTATION_RATE, false),
];

/// Longest entity name accepted (a user or client id), in bytes, before sanitizing.
pub const entity_name_bytes_max: usize = 1024;

/// One side of an entity: a name, or the default (`<default>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityName {
    Default,
    Name(String),
}

impl EntityName {
    /// As a path component: sanitized, or `<default>`.
    pub fn path_component(&self) -> String {
        match self {
            EntityName::Default => DEFAULT_ENTITY.to_string(),
            EntityName::Name(n) => sanitize(n),
        }
    }

    fn from_path_component(c: &str) -> Option<Self> {
        if c == DEFAULT_ENTITY {
            Some(EntityName::Default)
        } else {
            desanitize(c).map(EntityName::Name)
        }
    }

    pub fn name(&self) -> Option<&str> {
        match self {
            EntityName::Default => None,
            EntityName::Name(n) => Some(n),
        }
    }
}

/// A quota entity: a user, a client id, or both (Kafka's `ClientQuotaEntity`, without
/// the `ip` type, which Spate does not support).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QuotaEntity {
    pub user: Option<EntityName>,
    pub client_id: Option<EntityName>,
}

impl QuotaEntity {
    /// Kafka's entity path under `/config`; `None` for the empty entity.
    pub fn path(&self) -> Option<String> {
        match (&self.user, &self.client_id) {
            (Some(u), Some(c)) => Some(format!("users/{}/clients/{}", u.path_component(), c.path_component())),
            (Some(u), None) => Some(format!("users/{}", u.path_component())),
            (None, Some(c)) => Some(format!("clients/{}", c.path_component())),
            (None, None) => None,
        }
    }

    /// The entity a path names (`users/a`, `clients/c`, `users/a/clients/c`).
    pub fn from_path(path: &str) -> Option<Self> {
        let parts: Vec<&str> = path.splitn(5, '/').collect();
        match parts.as_slice() {
            ["users", u] => Some(QuotaEntity { user: Some(EntityName::from_path_component(u)?), client_id: None }),
            ["clients", c] => Some(QuotaEntity { user: None, client_id: Some(EntityName::from_path_component(c)?) }),
            ["users", u, "clients", c] => Some(QuotaEntity {
                user: Some(EntityName::from_path_component(u)?),
                client_id: Some(EntityName::from_path_component(c)?),
            }),
            _ => None,
        }
    }
}

/// Kafka's `Sanitizer.sanitize`: `URLEncoder.encode` (UTF-8; letters, digits and `.-*_`
/// kept, a space as `+`), then `*` as `%2A` and `+` as `%20`.
pub fn sanitize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Kafka's `Sanitizer.desanitize` (`URLDecoder.decode`: `%XX` and `+` as a space);
/// `None` for a malformed escape or bytes that are not UTF-8.
pub fn desanitize(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The quota values of one entity (absent: not set on it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuotaValues {
    pub producer_byte_rate: Option<f64>,
    pub consumer_byte_rate: Option<f64>,
    pub request_percentage: Option<f64>,
    pub controller_mutation_rate: Option<f64>,
}

impl QuotaValues {
    pub fn is_empty(&self) -> bool {
        *self == QuotaValues::default()
    }

    /// (key, value) for each value set, in Kafka's key names.
    pub fn entries(&self) -> Vec<(&'static str, f64)> {
        [
            (PRODUCER_BYTE_RATE, self.producer_byte_rate),
            (CONSUMER_BYTE_RATE, self.consumer_byte_rate),
            (REQUEST_PERCENTAGE, self.request_percentage),
            (CONTROLLER_MUTATION_RATE, self.controller_mutation_rate),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }

    pub fn get(&self, kind: QuotaKind) -> Option<f64> {
        match kind {
            QuotaKind::Produce => self.producer_byte_rate,
            QuotaKind::Fetch => self.consumer_byte_rate,
            QuotaKind::Request => self.request_percentage,
        }
    }
}

/// The quotas the broker enforces, as Kafka's `QuotaType` (controller mutations are
/// stored but not enforced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaKind {
    Produce,
    Fetch,
    Request,
}

impl QuotaKind {
    pub const ALL: [QuotaKind; 3] = [QuotaKind::Produce, QuotaKind::Fetch, QuotaKind::Request];

    /// Kafka's metric group name for it.
    pub fn name(self) -> &'static str {
        match self {
            QuotaKind::Produce => "produce",
            QuotaKind::Fetch => "fetch",
            QuotaKind::Request => "request",
        }
    }
}

/// Parse a quota value as stored (Kafka writes LONG keys as integers, DOUBLE keys as
/// Java's `Double.toString`): a finite, positive number.
pub fn parse_quota_value(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0)
}

/// How a quota value is written in a document: integer text for LONG keys, Java's
/// `Double.toString` for the others (`200.0`, `0.5`).
pub fn format_quota_value(key: &str, value: f64) -> String {
    let long = QUOTA_KEYS.iter().any(|(k, l)| *k == key && *l);
    if long {
        format!("{}", value.round() as i64)
    } else if value.fract() == 0.0 && value.abs() < 1e7 {
        format!("{value:.1}")
    } else {
        format!("{value}")
    }
}

/// Every client entity's parsed configs, as shards read them.
#[derive(Debug, Clone, Default)]
pub struct EntityConfigs {
    pub quotas: BTreeMap<QuotaEntity, QuotaValues>,
    /// By (user name, mechanism); user names desanitized.
    pub scram: BTreeMap<(String, ScramMechanism), ScramCredential>,
}

impl EntityConfigs {
    /// From the raw documents, by entity path (`users/alice` -> its config map).
    pub fn parse(raw: &BTreeMap<String, BTreeMap<String, String>>) -> Self {
        let mut out = EntityConfigs::default();
        for (path, configs) in raw {
            let Some(entity) = QuotaEntity::from_path(path) else {
                tracing::warn!(%path, "ignoring configs of an entity path that is not a user or client");
                continue;
            };
            let mut values = QuotaValues::default();
            for (key, value) in configs {
                let slot = match key.as_str() {
                    PRODUCER_BYTE_RATE => &mut values.producer_byte_rate,
                    CONSUMER_BYTE_RATE => &mut values.consumer_byte_rate,
                    REQUEST_PERCENTAGE => &mut values.request_percentage,
                    CONTROLLER_MUTATION_RATE => &mut values.controller_mutation_rate,
                    _ => {
                        let user = match (&entity.user, &entity.client_id) {
                            (Some(EntityName::Name(u)), None) => Some(u),
                            _ => None,
                        };
                        match (ScramMechanism::from_name(key), user) {
                            (Some(m), Some(user)) => match ScramCredential::from_kafka_string(m, value) {
                                Ok(c) => {
                                    out.scram.insert((user.clone(), m), c);
                                }
                                Err(e) => {
                                    tracing::warn!(%path, mechanism = %m, error = %e, "ignoring a SCRAM credential")
                                }
                            },
                            _ => tracing::warn!(%path, %key, "ignoring an unknown client entity config"),
                        }
                        continue;
                    }
                };
                match parse_quota_value(value) {
                    Some(v) => *slot = Some(v),
                    None => tracing::warn!(%path, %key, %value, "ignoring a quota that is not a positive number"),
                }
            }
            if !values.is_empty() {
                out.quotas.insert(entity, values);
            }
        }
        out
    }

    /// The quota of `kind` that applies to a connection of `user` with `client_id`, and
    /// the entity it was found on, by Kafka's precedence (`ClientQuotaManager`):
    /// /users/u/clients/c, /users/u/clients/<default>, /users/u,
    /// /users/<default>/clients/c, /users/<default>/clients/<default>, /users/<default>,
    /// /clients/c, /clients/<default>. The entity is the one the quota is accounted on
    /// (Kafka's metric tags): what applies to it by name, not the default's name.
    pub fn quota_for(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<(QuotaEntity, f64)> {
        if self.quotas.is_empty() {
            return None;
        }
        let u = || Some(EntityName::Name(user.to_string()));
        let c = || Some(EntityName::Name(client_id.to_string()));
        let d = || Some(EntityName::Default);
        let candidates = [
            (u(), c(), (u(), c())),
            (u(), d(), (u(), c())),
            (u(), None, (u(), None)),
            (d(), c(), (u(), c())),
            (d(), d(), (u(), c())),
            (d(), None, (u(), None)),
            (None, c(), (None, c())),
            (None, d(), (None, c())),
        ];
        for (user, client_id, (acct_user, acct_client)) in candidates {
            let found = QuotaEntity { user, client_id };
            if let Some(v) = self.quotas.get(&found).and_then(|q| q.get(kind)) {
                return Some((QuotaEntity { user: acct_user, client_id: acct_client }, v));
            }
        }
        None
    }

    /// The stored credential of `user` for `mechanism`.
    pub fn scram_credential(&self, user: &str, mechanism: ScramMechanism) -> Option<&ScramCredential> {
        self.scram.get(&(user.to_string(), mechanism))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitized_names_are_kafkas() {
        assert_eq!(sanitize("alice"), "alice");
        assert_eq!(sanitize("a b*c+d"), "a%20b%2Ac%2Bd");
        assert_eq!(sanitize("CN=x,O=y"), "CN%3Dx%2CO%3Dy");
        assert_eq!(sanitize("é"), "%C3%A9");
        assert_eq!(sanitize("<default>"), "%3Cdefault%3E");
        for n in ["alice", "a b*c+d", "CN=x,O=y", "é", "<default>", ""] {
            assert_eq!(desanitize(&sanitize(n)).as_deref(), Some(n));
        }
        assert_eq!(desanitize("a+b").as_deref(), Some("a b"));
        assert_eq!(desanitize("%"), None);
        assert_eq!(desanitize("%zz"), None);
        assert_eq!(desanitize("%FF"), None);
    }

    #[test]
    fn entity_paths_are_kafkas() {
        let e = |u: Option<EntityName>, c: Option<EntityName>| QuotaEntity { user: u, client_id: c };
        let n = |s: &str| Some(EntityName::Name(s.into()));
        for (entity, path) in [
            (e(n("alice"), None), "users/alice"),
            (e(None, n("app 1")), "clients/app%201"),
            (e(n("alice"), Some(EntityName::Default)), "users/alice/clients/<default>"),
            (e(Some(EntityName::Default), None), "users/<default>"),
        ] {
            assert_eq!(entity.path().as_deref(), Some(path));
            assert_eq!(QuotaEntity::from_path(path), Some(entity));
        }
        assert_eq!(e(None, None).path(), None);
        for bad in ["", "users", "topics/t", "users/a/clients", "users/a/clients/c/x", "users/%"] {
            assert_eq!(QuotaEntity::from_path(bad), None, "{bad}");
        }
    }

    fn raw(entries: &[(&str, &[(&str, &str)])]) -> BTreeMap<String, BTreeMap<String, String>> {
        entries
            .iter()
            .map(|(p, kv)| (p.to_string(), kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()))
            .collect()
    }

    #[test]
    fn quotas_resolve_in_kafkas_precedence() {
        let all = [
            "users/u/clients/c",
            "users/u/clients/<default>",
            "users/u",
            "users/<default>/clients/c",
            "users/<default>/clients/<default>",
            "users/<default>",
            "clients/c",
            "clients/<default>",
        ];
        // Remove the most specific entity one at a time: the next one in line applies.
        for first in 0..all.len() {
            let docs: Vec<(&str, &[(&str, &str)])> = all[first..]
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let v: &[(&str, &str)] = match first + i {
                        0 => &[(PRODUCER_BYTE_RATE, "1")],
                        1 => &[(PRODUCER_BYTE_RATE, "2")],
                        2 => &[(PRODUCER_BYTE_RATE, "3")],
                        3 => &[(PRODUCER_BYTE_RATE, "4")],
                        4 => &[(PRODUCER_BYTE_RATE, "5")],
                        5 => &[(PRODUCER_BYTE_RATE, "6")],
                        6 => &[(PRODUCER_BYTE_RATE, "7")],
                        _ => &[(PRODUCER_BYTE_RATE, "8")],
                    };
                    (*p, v)
                })
                .collect();
            let configs = EntityConfigs::parse(&raw(&docs));
            let (_, v) = configs.quota_for(QuotaKind::Produce, "u", "c").unwrap();
            assert_eq!(v, (first + 1) as f64, "with {:?} the most specific", all[first]);
            assert_eq!(configs.quota_for(QuotaKind::Fetch, "u", "c"), None);
        }
        let configs = EntityConfigs::parse(&raw(&[("clients/<default>", &[(CONSUMER_BYTE_RATE, "100")])]));
        let (entity, v) = configs.quota_for(QuotaKind::Fetch, "ANONYMOUS", "x").unwrap();
        assert_eq!(v, 100.0);
        assert_eq!(entity, QuotaEntity { user: None, client_id: Some(EntityName::Name("x".into())) });
    }

    #[test]
    fn bad_values_are_left_out_and_scram_lives_on_users_only() {
        let c = ScramCredential::from_password(ScramMechanism::Sha512, b"pw", b"salt-salt", 4096);
        let s = c.to_kafka_string();
        let configs = EntityConfigs::parse(&raw(&[
            ("users/alice", &[("SCRAM-SHA-512", &s), (PRODUCER_BYTE_RATE, "-5"), (REQUEST_PERCENTAGE, "50.0")]),
            ("clients/c", &[("SCRAM-SHA-512", &s), (CONSUMER_BYTE_RATE, "NaN")]),
            ("users/bob", &[("SCRAM-SHA-256", &s), ("nonsense", "1")]),
            ("brokers/1", &[(PRODUCER_BYTE_RATE, "1")]),
        ]));
        assert_eq!(configs.scram_credential("alice", ScramMechanism::Sha512), Some(&c));
        assert_eq!(configs.scram_credential("alice", ScramMechanism::Sha256), None);
        assert_eq!(configs.scram.len(), 1);
        let alice = QuotaEntity { user: Some(EntityName::Name("alice".into())), client_id: None };
        assert_eq!(configs.quotas.len(), 1);
        assert_eq!(configs.quotas[&alice].entries(), vec![(REQUEST_PERCENTAGE, 50.0)]);
    }

    #[test]
    fn values_are_written_as_kafka_types_them() {
        assert_eq!(format_quota_value(PRODUCER_BYTE_RATE, 1048576.0), "1048576");
        assert_eq!(format_quota_value(REQUEST_PERCENTAGE, 200.0), "200.0");
        assert_eq!(format_quota_value(REQUEST_PERCENTAGE, 0.5), "0.5");
        assert_eq!(parse_quota_value("1048576"), Some(1048576.0));
        assert_eq!(parse_quota_value("0"), None);
        assert_eq!(parse_quota_value("inf"), None);
    }
}
