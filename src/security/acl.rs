//! ACLs and the authorizer, as Kafka's `AclAuthorizer` / `StandardAuthorizer` decide.
//!
//! Pure: a set of ACL bindings (`Acls`, carried in every `ClusterView`) and the broker's
//! authorizer settings (`AuthorizerConfig`) in, a decision out. No I/O, no clock, no
//! lock; a check is a few map lookups on the shard's view.
//!
//! The rules, each with a unit test below:
//! - The authorizer is on only when configured (`authorizer.class.name`); off, every
//!   request is allowed, as a Kafka broker without an authorizer.
//! - `super.users` (semicolon-separated principals) are allowed everything.
//! - The ACLs that apply to a resource are the literal ones of its exact name, the
//!   literal ones of the wildcard name `*`, and the prefixed ones whose prefix starts
//!   its name. With none at all, `allow.everyone.if.no.acl.found` decides (false).
//! - An ACL matches a request when its principal is the request's or `User:*`, its host
//!   is the client's or `*`, and its operation is the one asked or `All`.
//! - Deny wins: a matching DENY refuses, whatever ALLOWs match.
//! - An ALLOW of Read, Write, Delete or Alter also allows Describe; AlterConfigs also
//!   allows DescribeConfigs (a DENY denies only what it names, or All).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::Principal;

/// Kafka's resource names: the one cluster resource is called this.
pub const CLUSTER_RESOURCE_NAME: &str = "kafka-cluster";
/// The wildcard resource name and host, and the name part of the wildcard principal.
pub const WILDCARD: &str = "*";
/// The wildcard principal, `User:*`.
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// Kafka's `ResourceType`, with its wire codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceType {
    Any = 1,
    Topic = 2,
    Group = 3,
    Cluster = 4,
    TransactionalId = 5,
    DelegationToken = 6,
    User = 7,
}

impl ResourceType {
    pub const CONCRETE: [ResourceType; 6] = [
        ResourceType::Topic,
        ResourceType::Group,
        ResourceType::Cluster,
        ResourceType::TransactionalId,
        ResourceType::DelegationToken,
        ResourceType::User,
    ];

    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            1 => Self::Any,
            2 => Self::Topic,
            3 => Self::Group,
            4 => Self::Cluster,
            5 => Self::TransactionalId,
            6 => Self::DelegationToken,
            7 => Self::User,
            _ => return None,
        })
    }

    pub fn code(self) -> i8 {
        self as i8
    }

    /// The name in ZooKeeper paths and the authorizer log (Kafka's
    /// `SecurityUtils.resourceTypeName`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Any => "Any",
            Self::Topic => "Topic",
            Self::Group => "Group",
            Self::Cluster => "Cluster",
            Self::TransactionalId => "TransactionalId",
            Self::DelegationToken => "DelegationToken",
            Self::User => "User",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::CONCRETE.into_iter().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The operations Kafka reports in authorized-operations bitmasks for this type.
    pub fn supported_operations(self) -> &'static [AclOperation] {
        use AclOperation::*;
        match self {
            Self::Topic => &[Read, Write, Create, Describe, Delete, Alter, DescribeConfigs, AlterConfigs],
            Self::Group => &[Read, Describe, Delete],
            Self::Cluster => &[Create, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, Alter, Describe],
            Self::TransactionalId => &[Describe, Write],
            Self::DelegationToken => &[Describe],
            Self::User => &[CreateTokens, DescribeTokens],
            Self::Any => &[],
        }
    }
}

/// Kafka's `PatternType`: stored patterns are Literal or Prefixed; filters may also say
/// Any (either, by name equality) or Match (what would apply to a resource of that name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PatternType {
    Any = 1,
    Match = 2,
    Literal = 3,
    Prefixed = 4,
}

impl PatternType {
    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            1 => Self::Any,
            2 => Self::Match,
            3 => Self::Literal,
            4 => Self::Prefixed,
            _ => return None,
        })
    }

    pub fn code(self) -> i8 {
        self as i8
    }

    /// As Kafka prints it (`PatternType.name()`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Any => "ANY",
            Self::Match => "MATCH",
            Self::Literal => "LITERAL",
            Self::Prefixed => "PREFIXED",
        }
    }

    pub fn is_concrete(self) -> bool {
        matches!(self, Self::Literal | Self::Prefixed)
    }
}

/// Kafka's `AclOperation`, with its wire codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AclOperation {
    Any = 1,
    All = 2,
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    ClusterAction = 9,
    DescribeConfigs = 10,
    AlterConfigs = 11,
    IdempotentWrite = 12,
    CreateTokens = 13,
    DescribeTokens = 14,
    TwoPhaseCommit = 15,
}

impl AclOperation {
    const ALL_CODES: [AclOperation; 15] = [
        Self::Any,
        Self::All,
        Self::Read,
        Self::Write,
        Self::Create,
        Self::Delete,
        Self::Alter,
        Self::Describe,
        Self::ClusterAction,
        Self::DescribeConfigs,
        Self::AlterConfigs,
        Self::IdempotentWrite,
        Self::CreateTokens,
        Self::DescribeTokens,
        Self::TwoPhaseCommit,
    ];

    pub fn from_code(code: i8) -> Option<Self> {
        Self::ALL_CODES.into_iter().find(|o| o.code() == code)
    }

    pub fn code(self) -> i8 {
        self as i8
    }

    /// Kafka's `SecurityUtils.operationName`: stored in ZooKeeper documents and logged.
    pub fn name(self) -> &'static str {
        match self {
            Self::Any => "Any",
            Self::All => "All",
            Self::Read => "Read",
            Self::Write => "Write",
            Self::Create => "Create",
            Self::Delete => "Delete",
            Self::Alter => "Alter",
            Self::Describe => "Describe",
            Self::ClusterAction => "ClusterAction",
            Self::DescribeConfigs => "DescribeConfigs",
            Self::AlterConfigs => "AlterConfigs",
            Self::IdempotentWrite => "IdempotentWrite",
            Self::CreateTokens => "CreateTokens",
            Self::DescribeTokens => "DescribeTokens",
            Self::TwoPhaseCommit => "TwoPhaseCommit",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL_CODES.into_iter().filter(|o| *o != Self::Any).find(|o| o.name().eq_ignore_ascii_case(name))
    }

    /// The operations an ALLOW of `self` grants: itself, and Describe for Read, Write,
    /// Delete and Alter, DescribeConfigs for AlterConfigs (Kafka's implied operations).
    fn allows(self, asked: AclOperation) -> bool {
        self == asked
            || self == Self::All
            || (asked == Self::Describe && matches!(self, Self::Read | Self::Write | Self::Delete | Self::Alter))
            || (asked == Self::DescribeConfigs && self == Self::AlterConfigs)
    }

    /// A DENY of `self` refuses `asked` only when it names it, or is All.
    fn denies(self, asked: AclOperation) -> bool {
        self == asked || self == Self::All
    }
}

/// Kafka's `AclPermissionType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    Any = 1,
    Deny = 2,
    Allow = 3,
}

impl Permission {
    pub fn from_code(code: i8) -> Option<Self> {
        Some(match code {
            1 => Self::Any,
            2 => Self::Deny,
            3 => Self::Allow,
            _ => return None,
        })
    }

    pub fn code(self) -> i8 {
        self as i8
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Any => "Any",
            Self::Deny => "Deny",
            Self::Allow => "Allow",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Deny, Self::Allow].into_iter().find(|p| p.name().eq_ignore_ascii_case(name))
    }
}

/// A stored resource pattern: a type, a Literal or Prefixed pattern type, a name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourcePattern {
    pub resource_type: ResourceType,
    pub pattern_type: PatternType,
    pub name: String,
}

impl ResourcePattern {
    pub fn new(resource_type: ResourceType, pattern_type: PatternType, name: impl Into<String>) -> Self {
        ResourcePattern { resource_type, pattern_type, name: name.into() }
    }

    pub fn literal(resource_type: ResourceType, name: impl Into<String>) -> Self {
        Self::new(resource_type, PatternType::Literal, name)
    }

    pub fn prefixed(resource_type: ResourceType, name: impl Into<String>) -> Self {
        Self::new(resource_type, PatternType::Prefixed, name)
    }
}

impl fmt::Display for ResourcePattern {
    /// `Topic:LITERAL:t`, as Kafka's authorizer log names a resource.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.resource_type.name(), self.pattern_type.name(), self.name)
    }
}

/// One access control entry: who, from where, what, allowed or denied.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclEntry {
    /// `User:alice`, or `User:*` for everyone.
    pub principal: String,
    pub host: String,
    pub operation: AclOperation,
    pub permission: Permission,
}

/// What is wrong with an ACL a client asked to create (Kafka INVALID_REQUEST, with
/// this as the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("invalid ACL binding: {0}")]
    Invalid(String),
}

/// Check a binding before it is stored, as Kafka's `AclControlManager.validateNewAcl`.
pub fn validate_binding(pattern: &ResourcePattern, entry: &AclEntry) -> Result<(), AclError> {
    let bad = |why: &str| Err(AclError::Invalid(why.to_string()));
    if pattern.resource_type == ResourceType::Any {
        return bad("resource type ANY is only for filters");
    }
    if !pattern.pattern_type.is_concrete() {
        return bad("pattern type must be LITERAL or PREFIXED");
    }
    if pattern.name.is_empty() {
        return bad("resource name must not be empty");
    }
    if pattern.pattern_type == PatternType::Prefixed && pattern.name == WILDCARD {
        return bad("a PREFIXED pattern may not be the wildcard *; use a LITERAL *");
    }
    if pattern.resource_type == ResourceType::Cluster && pattern.name != CLUSTER_RESOURCE_NAME {
        return bad("the cluster resource is named kafka-cluster");
    }
    if matches!(entry.operation, AclOperation::Any) {
        return bad("operation ANY is only for filters");
    }
    if matches!(entry.permission, Permission::Any) {
        return bad("permission ANY is only for filters");
    }
    if Principal::parse(&entry.principal).is_none() {
        return bad("principal must be type:name, e.g. User:alice");
    }
    if entry.host.is_empty() {
        return bad("host must not be empty (* for any)");
    }
    Ok(())
}

/// A DescribeAcls / DeleteAcls filter (Kafka's `AclBindingFilter`): `None` fields
/// match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: ResourceType,
    pub pattern_type: PatternType,
    pub name: Option<String>,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: AclOperation,
    pub permission: Permission,
}

impl AclFilter {
    /// Kafka's `ResourcePatternFilter.matches`.
    pub fn matches_pattern(&self, p: &ResourcePattern) -> bool {
        if self.resource_type != ResourceType::Any && self.resource_type != p.resource_type {
            return false;
        }
        if !matches!(self.pattern_type, PatternType::Any | PatternType::Match) && self.pattern_type != p.pattern_type {
            return false;
        }
        let Some(name) = &self.name else { return true };
        if self.pattern_type == PatternType::Any || self.pattern_type == p.pattern_type {
            return *name == p.name;
        }
        match p.pattern_type {
            PatternType::Literal => *name == p.name || p.name == WILDCARD,
            PatternType::Prefixed => name.starts_with(&p.name),
            PatternType::Any | PatternType::Match => false,
        }
    }

    /// Kafka's `AccessControlEntryFilter.matches`.
    pub fn matches_entry(&self, e: &AclEntry) -> bool {
        self.principal.as_ref().is_none_or(|p| *p == e.principal)
            && self.host.as_ref().is_none_or(|h| *h == e.host)
            && (self.operation == AclOperation::Any || self.operation == e.operation)
            && (self.permission == Permission::Any || self.permission == e.permission)
    }
}

/// Every ACL binding in the cluster, by resource pattern. Immutable once in a view.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Acls {
    #[serde(with = "acls_serde")]
    by_pattern: BTreeMap<ResourcePattern, BTreeSet<AclEntry>>,
}

impl Acls {
    pub fn is_empty(&self) -> bool {
        self.by_pattern.is_empty()
    }

    /// The number of bindings.
    pub fn len(&self) -> usize {
        self.by_pattern.values().map(BTreeSet::len).sum()
    }

    pub fn patterns(&self) -> impl Iterator<Item = (&ResourcePattern, &BTreeSet<AclEntry>)> {
        self.by_pattern.iter()
    }

    pub fn entries(&self, pattern: &ResourcePattern) -> Option<&BTreeSet<AclEntry>> {
        self.by_pattern.get(pattern)
    }

    /// Replace the entries of one pattern (removed when empty).
    pub fn set(&mut self, pattern: ResourcePattern, entries: BTreeSet<AclEntry>) {
        if entries.is_empty() {
            self.by_pattern.remove(&pattern);
        } else {
            self.by_pattern.insert(pattern, entries);
        }
    }

    /// Every binding a filter matches.
    pub fn matching(&self, filter: &AclFilter) -> Vec<(ResourcePattern, AclEntry)> {
        let mut out = Vec::new();
        for (pattern, entries) in &self.by_pattern {
            if filter.matches_pattern(pattern) {
                out.extend(entries.iter().filter(|e| filter.matches_entry(e)).map(|e| (pattern.clone(), e.clone())));
            }
        }
        out
    }

    /// The entry sets that apply to resource `name` of `resource_type`: its literal
    /// name, the literal wildcard, and every prefix of it that is a prefixed pattern.
    fn applying<'a>(
        &'a self,
        resource_type: ResourceType,
        name: &'a str,
    ) -> impl Iterator<Item = &'a BTreeSet<AclEntry>> + 'a {
        let literal = self.by_pattern.get(&ResourcePattern::literal(resource_type, name));
        let wildcard = (name != WILDCARD)
            .then(|| self.by_pattern.get(&ResourcePattern::literal(resource_type, WILDCARD)))
            .flatten();
        // Prefixes in the range [type:Prefixed:"", type:Prefixed:name]; only those that
        // start `name` apply. A name's prefixes are at most its length, so walk them.
        let prefixed = name
            .char_indices()
            .map(|(i, c)| i + c.len_utf8())
            .filter_map(move |end| self.by_pattern.get(&ResourcePattern::prefixed(resource_type, &name[..end])));
        literal.into_iter().chain(wildcard).chain(prefixed)
    }
}

/// Stored as a list of `{resource, entries}` pairs: JSON object keys must be strings.
mod acls_serde {
    use super::*;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Binding {
        resource_type: i8,
        pattern_type: i8,
        name: String,
        entries: Vec<Entry>,
    }

    #[derive(Serialize, Deserialize)]
    struct Entry {
        principal: String,
        host: String,
        operation: i8,
        permission: i8,
    }

    pub fn serialize<S: Serializer>(
        map: &BTreeMap<ResourcePattern, BTreeSet<AclEntry>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let list: Vec<Binding> = map
            .iter()
            .map(|(p, es)| Binding {
                resource_type: p.resource_type.code(),
                pattern_type: p.pattern_type.code(),
                name: p.name.clone(),
                entries: es
                    .iter()
                    .map(|e| Entry {
                        principal: e.principal.clone(),
                        host: e.host.clone(),
                        operation: e.operation.code(),
                        permission: e.permission.code(),
                    })
                    .collect(),
            })
            .collect();
        list.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<ResourcePattern, BTreeSet<AclEntry>>, D::Error> {
        use serde::de::Error;
        let list = Vec::<Binding>::deserialize(d)?;
        let mut map = BTreeMap::new();
        for b in list {
            let resource_type =
                ResourceType::from_code(b.resource_type).ok_or_else(|| D::Error::custom("resource type"))?;
            let pattern_type =
                PatternType::from_code(b.pattern_type).ok_or_else(|| D::Error::custom("pattern type"))?;
            let mut entries = BTreeSet::new();
            for e in b.entries {
                entries.insert(AclEntry {
                    principal: e.principal,
                    host: e.host,
                    operation: AclOperation::from_code(e.operation).ok_or_else(|| D::Error::custom("operation"))?,
                    permission: Permission::from_code(e.permission).ok_or_else(|| D::Error::custom("permission"))?,
                });
            }
            map.insert(ResourcePattern::new(resource_type, pattern_type, b.name), entries);
        }
        Ok(map)
    }
}

/// The Kafka class names `authorizer.class.name` accepts; `acl` is Spate's short form.
pub const AUTHORIZER_CLASS_NAMES: &[&str] =
    &["org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer", "acl"];

/// The broker's authorizer settings (Kafka's `authorizer.class.name`, `super.users`,
/// `allow.everyone.if.no.acl.found`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    pub enabled: bool,
    pub super_users: BTreeSet<String>,
    pub allow_everyone_if_no_acl_found: bool,
}

impl AuthorizerConfig {
    /// From the configured strings: `class_name` empty or absent means no authorizer;
    /// `super_users` is Kafka's semicolon-separated list (`User:admin;User:bob`).
    pub fn parse(class_name: Option<&str>, super_users: &str, allow_everyone: bool) -> Result<Self, String> {
        let enabled = match class_name.map(str::trim).filter(|c| !c.is_empty()) {
            None => false,
            Some(c) if AUTHORIZER_CLASS_NAMES.contains(&c) => true,
            Some(c) => {
                return Err(format!("authorizer.class.name {c:?} is not one of {}", AUTHORIZER_CLASS_NAMES.join(", ")))
            }
        };
        let mut users = BTreeSet::new();
        for u in super_users.split(';').map(str::trim).filter(|u| !u.is_empty()) {
            Principal::parse(u).ok_or_else(|| format!("super.users: {u:?} is not a principal (User:name)"))?;
            users.insert(u.to_string());
        }
        Ok(AuthorizerConfig { enabled, super_users: users, allow_everyone_if_no_acl_found: allow_everyone })
    }

    /// Whether `principal` (`User:x`) may do `op` on resource `name` of `resource_type`
    /// from `host`, given `acls`.
    pub fn authorize(
        &self,
        acls: &Acls,
        principal: &Principal,
        host: &str,
        op: AclOperation,
        resource_type: ResourceType,
        name: &str,
    ) -> bool {
        if !self.enabled {
            return true;
        }
        let who = principal.to_string();
        if self.super_users.contains(&who) {
            return true;
        }
        let principal_matches = |e: &AclEntry| e.principal == who || e.principal == WILDCARD_PRINCIPAL;
        let host_matches = |e: &AclEntry| e.host == host || e.host == WILDCARD;
        let mut any_acl = false;
        let mut allowed = false;
        for entries in acls.applying(resource_type, name) {
            any_acl |= !entries.is_empty();
            for e in entries.iter().filter(|e| principal_matches(e) && host_matches(e)) {
                match e.permission {
                    Permission::Deny if e.operation.denies(op) => return false,
                    Permission::Allow if e.operation.allows(op) => allowed = true,
                    _ => {}
                }
            }
        }
        if !any_acl {
            return self.allow_everyone_if_no_acl_found;
        }
        allowed
    }

    /// Whether `principal` may do `op` on at least one resource of `resource_type`
    /// (Kafka's `authorizeByResourceType`): some ALLOW pattern of that type that no
    /// matching DENY covers (a DENY on the literal wildcard covers all; a DENY on the same
    /// literal name or on a prefix of the pattern's name covers it).
    pub fn authorize_by_resource_type(
        &self,
        acls: &Acls,
        principal: &Principal,
        host: &str,
        op: AclOperation,
        resource_type: ResourceType,
    ) -> bool {
        if !self.enabled {
            return true;
        }
        let who = principal.to_string();
        if self.super_users.contains(&who) {
            return true;
        }
        let matches = |e: &AclEntry| {
            (e.principal == who || e.principal == WILDCARD_PRINCIPAL) && (e.host == host || e.host == WILDCARD)
        };
        let of_type: Vec<(&ResourcePattern, &BTreeSet<AclEntry>)> =
            acls.by_pattern.iter().filter(|(p, _)| p.resource_type == resource_type).collect();
        if of_type.is_empty() {
            return self.allow_everyone_if_no_acl_found;
        }
        let denied: Vec<&ResourcePattern> = of_type
            .iter()
            .filter(|(_, es)| {
                es.iter().any(|e| matches(e) && e.permission == Permission::Deny && e.operation.denies(op))
            })
            .map(|(p, _)| *p)
            .collect();
        if denied.iter().any(|d| d.pattern_type == PatternType::Literal && d.name == WILDCARD) {
            return false;
        }
        let covered = |p: &ResourcePattern| {
            denied.iter().any(|d| match d.pattern_type {
                PatternType::Prefixed => p.name.starts_with(&d.name),
                _ => p.pattern_type == PatternType::Literal && d.name == p.name,
            })
        };
        of_type.iter().any(|(p, es)| {
            es.iter().any(|e| matches(e) && e.permission == Permission::Allow && e.operation.allows(op)) && !covered(p)
        })
    }

    /// Kafka's authorized-operations bitmask of a resource: bit `op.code()` set for each
    /// of the type's supported operations `principal` may do.
    pub fn authorized_operations(
        &self,
        acls: &Acls,
        principal: &Principal,
        host: &str,
        resource_type: ResourceType,
        name: &str,
    ) -> i32 {
        resource_type
            .supported_operations()
            .iter()
            .filter(|op| self.authorize(acls, principal, host, **op, resource_type, name))
            .fold(0, |bits, op| bits | (1 << op.code()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> AuthorizerConfig {
        AuthorizerConfig::parse(Some("org.apache.kafka.metadata.authorizer.StandardAuthorizer"), "", false).unwrap()
    }

    fn entry(principal: &str, op: AclOperation, permission: Permission) -> AclEntry {
        AclEntry { principal: principal.into(), host: WILDCARD.into(), operation: op, permission }
    }

    fn acls(bindings: &[(ResourcePattern, AclEntry)]) -> Acls {
        let mut acls = Acls::default();
        for (p, e) in bindings {
            let mut set = acls.entries(p).cloned().unwrap_or_default();
            set.insert(e.clone());
            acls.set(p.clone(), set);
        }
        acls
    }

    fn alice() -> Principal {
        Principal::user("alice")
    }

    use AclOperation::*;
    use Permission::*;
    use ResourceType::*;

    #[test]
    fn off_allows_everything_and_on_denies_without_acls() {
        let none = Acls::default();
        let off = AuthorizerConfig::default();
        assert!(off.authorize(&none, &alice(), "h", Write, Topic, "t"));
        assert!(!on().authorize(&none, &alice(), "h", Write, Topic, "t"));
        let everyone = AuthorizerConfig { allow_everyone_if_no_acl_found: true, ..on() };
        assert!(everyone.authorize(&none, &alice(), "h", Write, Topic, "t"));
        // An ACL on the resource, for someone else: no longer "no ACL found".
        let other = acls(&[(ResourcePattern::literal(Topic, "t"), entry("User:bob", Read, Allow))]);
        assert!(!everyone.authorize(&other, &alice(), "h", Write, Topic, "t"));
        assert!(everyone.authorize(&other, &alice(), "h", Write, Topic, "u"));
    }

    #[test]
    fn super_users_are_allowed_everything_even_when_denied() {
        let config =
            AuthorizerConfig::parse(Some("kafka.security.authorizer.AclAuthorizer"), "User:admin; User:ops", false)
                .unwrap();
        let deny = acls(&[(ResourcePattern::literal(Topic, "t"), entry(WILDCARD_PRINCIPAL, All, Deny))]);
        assert!(config.authorize(&deny, &Principal::user("admin"), "h", Write, Topic, "t"));
        assert!(config.authorize(
            &Acls::default(),
            &Principal::user("ops"),
            "h",
            Alter,
            Cluster,
            CLUSTER_RESOURCE_NAME
        ));
        assert!(!config.authorize(&deny, &alice(), "h", Write, Topic, "t"));
        assert!(AuthorizerConfig::parse(Some("com.example.Other"), "", false).is_err());
        assert!(AuthorizerConfig::parse(None, "admin", false).is_err());
        assert!(!AuthorizerConfig::parse(Some(""), "", false).unwrap().enabled);
    }

    #[test]
    fn literal_acls_apply_to_their_name_only() {
        let a = acls(&[(ResourcePattern::literal(Topic, "a"), entry("User:alice", Write, Allow))]);
        assert!(on().authorize(&a, &alice(), "h", Write, Topic, "a"));
        assert!(!on().authorize(&a, &alice(), "h", Write, Topic, "ab"));
        assert!(!on().authorize(&a, &alice(), "h", Write, Group, "a"), "another resource type");
        assert!(!on().authorize(&a, &alice(), "h", Read, Topic, "a"), "another operation");
        assert!(!on().authorize(&a, &Principal::user("bob"), "h", Write, Topic, "a"), "another principal");
    }

    #[test]
    fn prefixed_acls_apply_to_every_name_they_start() {
        let a = acls(&[(ResourcePattern::prefixed(Topic, "orders-"), entry("User:alice", Read, Allow))]);
        assert!(on().authorize(&a, &alice(), "h", Read, Topic, "orders-eu"));
        assert!(on().authorize(&a, &alice(), "h", Read, Topic, "orders-"));
        assert!(!on().authorize(&a, &alice(), "h", Read, Topic, "orders"));
        assert!(!on().authorize(&a, &alice(), "h", Read, Topic, "x-orders-eu"));
        // Multibyte names are walked by character.
        let u = acls(&[(ResourcePattern::prefixed(Topic, "é"), entry("User:alice", Read, Allow))]);
        assert!(on().authorize(&u, &alice(), "h", Read, Topic, "éa"));
    }

    #[test]
    fn wildcards_match_every_name_principal_and_host() {
        let a = acls(&[
            (ResourcePattern::literal(Topic, WILDCARD), entry(WILDCARD_PRINCIPAL, Describe, Allow)),
            (
                ResourcePattern::literal(Group, "g"),
                AclEntry {
                    principal: "User:alice".into(),
                    host: "10.0.0.1".into(),
                    operation: Read,
                    permission: Allow,
                },
            ),
        ]);
        assert!(on().authorize(&a, &alice(), "h", Describe, Topic, "anything"));
        assert!(on().authorize(&a, &Principal::user("bob"), "h", Describe, Topic, "x"));
        assert!(on().authorize(&a, &alice(), "10.0.0.1", Read, Group, "g"));
        assert!(!on().authorize(&a, &alice(), "10.0.0.2", Read, Group, "g"), "host must match");
    }

    #[test]
    fn deny_wins_over_allow() {
        let a = acls(&[
            (ResourcePattern::prefixed(Topic, ""), entry("User:alice", All, Allow)),
            (ResourcePattern::literal(Topic, WILDCARD), entry("User:alice", All, Allow)),
            (ResourcePattern::literal(Topic, "secret"), entry("User:alice", Read, Deny)),
        ]);
        assert!(!on().authorize(&a, &alice(), "h", Read, Topic, "secret"));
        assert!(on().authorize(&a, &alice(), "h", Write, Topic, "secret"), "deny names Read only");
        assert!(on().authorize(&a, &alice(), "h", Read, Topic, "public"));
        let all = acls(&[
            (ResourcePattern::literal(Topic, "t"), entry("User:alice", Write, Allow)),
            (ResourcePattern::prefixed(Topic, "t"), entry(WILDCARD_PRINCIPAL, All, Deny)),
        ]);
        assert!(!on().authorize(&all, &alice(), "h", Write, Topic, "t"));
    }

    #[test]
    fn read_write_delete_alter_imply_describe_and_alter_configs_implies_describe_configs() {
        for op in [Read, Write, Delete, Alter] {
            let a = acls(&[(ResourcePattern::literal(Topic, "t"), entry("User:alice", op, Allow))]);
            assert!(on().authorize(&a, &alice(), "h", Describe, Topic, "t"), "{op:?} implies Describe");
            assert!(!on().authorize(&a, &alice(), "h", DescribeConfigs, Topic, "t"));
        }
        for op in [Create, DescribeConfigs, ClusterAction] {
            let a = acls(&[(ResourcePattern::literal(Topic, "t"), entry("User:alice", op, Allow))]);
            assert!(!on().authorize(&a, &alice(), "h", Describe, Topic, "t"), "{op:?} does not imply Describe");
        }
        let a = acls(&[(ResourcePattern::literal(Topic, "t"), entry("User:alice", AlterConfigs, Allow))]);
        assert!(on().authorize(&a, &alice(), "h", DescribeConfigs, Topic, "t"));
        // A deny of Read does not deny Describe.
        let d = acls(&[
            (ResourcePattern::literal(Topic, "t"), entry("User:alice", Write, Allow)),
            (ResourcePattern::literal(Topic, "t"), entry("User:alice", Read, Deny)),
        ]);
        assert!(on().authorize(&d, &alice(), "h", Describe, Topic, "t"));
    }

    #[test]
    fn all_allows_every_operation() {
        let a = acls(&[(ResourcePattern::literal(Cluster, CLUSTER_RESOURCE_NAME), entry("User:alice", All, Allow))]);
        for op in Cluster.supported_operations() {
            assert!(on().authorize(&a, &alice(), "h", *op, Cluster, CLUSTER_RESOURCE_NAME), "{op:?}");
        }
        let bits = on().authorized_operations(&a, &alice(), "h", Cluster, CLUSTER_RESOURCE_NAME);
        // Create 5, ClusterAction 9, DescribeConfigs 10, AlterConfigs 11, IdempotentWrite 12, Alter 7, Describe 8.
        assert_eq!(bits, (1 << 5) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12) | (1 << 7) | (1 << 8));
    }

    #[test]
    fn authorized_operations_of_a_topic_follow_the_rules() {
        let a = acls(&[(ResourcePattern::literal(Topic, "t"), entry("User:alice", Write, Allow))]);
        assert_eq!(on().authorized_operations(&a, &alice(), "h", Topic, "t"), (1 << 4) | (1 << 8));
        assert_eq!(on().authorized_operations(&a, &alice(), "h", Topic, "u"), 0);
    }

    #[test]
    fn by_resource_type_needs_an_allow_no_deny_covers() {
        let a = acls(&[(ResourcePattern::literal(Topic, "t"), entry("User:alice", Write, Allow))]);
        assert!(on().authorize_by_resource_type(&a, &alice(), "h", Write, Topic));
        assert!(!on().authorize_by_resource_type(&a, &alice(), "h", Write, Group));
        assert!(!on().authorize_by_resource_type(&a, &Principal::user("bob"), "h", Write, Topic));
        let denied = acls(&[
            (ResourcePattern::literal(Topic, "t"), entry("User:alice", Write, Allow)),
            (ResourcePattern::prefixed(Topic, "t"), entry("User:alice", Write, Deny)),
        ]);
        assert!(!on().authorize_by_resource_type(&denied, &alice(), "h", Write, Topic));
        let star = acls(&[
            (ResourcePattern::literal(Topic, "t"), entry("User:alice", Write, Allow)),
            (ResourcePattern::literal(Topic, WILDCARD), entry(WILDCARD_PRINCIPAL, All, Deny)),
        ]);
        assert!(!on().authorize_by_resource_type(&star, &alice(), "h", Write, Topic));
    }

    #[test]
    fn filters_match_as_kafkas() {
        let lit = ResourcePattern::literal(Topic, "orders");
        let star = ResourcePattern::literal(Topic, WILDCARD);
        let pre = ResourcePattern::prefixed(Topic, "ord");
        let f = |pattern_type, name: Option<&str>| AclFilter {
            resource_type: Topic,
            pattern_type,
            name: name.map(str::to_string),
            principal: None,
            host: None,
            operation: AclOperation::Any,
            permission: Permission::Any,
        };
        let m = f(PatternType::Match, Some("orders"));
        assert!(m.matches_pattern(&lit) && m.matches_pattern(&star) && m.matches_pattern(&pre));
        let any = f(PatternType::Any, Some("orders"));
        assert!(any.matches_pattern(&lit) && !any.matches_pattern(&star) && !any.matches_pattern(&pre));
        let p = f(PatternType::Prefixed, Some("ord"));
        assert!(!p.matches_pattern(&lit) && p.matches_pattern(&pre));
        assert!(f(PatternType::Any, None).matches_pattern(&pre));
        assert!(!AclFilter { resource_type: Group, ..f(PatternType::Any, None) }.matches_pattern(&lit));
        let e = entry("User:alice", Read, Allow);
        assert!(AclFilter { principal: Some("User:alice".into()), ..m.clone() }.matches_entry(&e));
        assert!(!AclFilter { principal: Some("User:bob".into()), ..m.clone() }.matches_entry(&e));
        assert!(!AclFilter { operation: Write, ..m.clone() }.matches_entry(&e));
        assert!(!AclFilter { permission: Deny, ..m }.matches_entry(&e));
    }

    #[test]
    fn bindings_are_validated() {
        let ok = entry("User:alice", Read, Allow);
        assert!(validate_binding(&ResourcePattern::literal(Topic, "t"), &ok).is_ok());
        assert!(validate_binding(&ResourcePattern::literal(Topic, ""), &ok).is_err());
        assert!(validate_binding(&ResourcePattern::prefixed(Topic, WILDCARD), &ok).is_err());
        assert!(validate_binding(&ResourcePattern::literal(Cluster, "c"), &ok).is_err());
        assert!(validate_binding(&ResourcePattern::new(Topic, PatternType::Match, "t"), &ok).is_err());
        assert!(validate_binding(&ResourcePattern::literal(Topic, "t"), &entry("alice", Read, Allow)).is_err());
        assert!(validate_binding(&ResourcePattern::literal(Topic, "t"), &entry("User:a", AclOperation::Any, Allow))
            .is_err());
    }

    #[test]
    fn acls_round_trip_through_the_snapshot_form() {
        let a = acls(&[
            (ResourcePattern::prefixed(Group, "g"), entry("User:alice", Read, Allow)),
            (ResourcePattern::literal(Topic, "t"), entry(WILDCARD_PRINCIPAL, Write, Deny)),
        ]);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Acls>(&json).unwrap(), a);
        assert_eq!(a.len(), 2);
    }
}
