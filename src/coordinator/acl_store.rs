//! ACLs in Kafka's ZooKeeper layout (`kafka.zk.ZkData`'s `ZkAclStore` and
//! `ZkAclChangeStore`), so Kafka's tools and a ZooKeeper shell see what Kafka would:
//!
//! - `/kafka-acl/<ResourceType>/<name>`: the LITERAL pattern's entries;
//!   `/kafka-acl-extended/prefixed/<ResourceType>/<name>`: the PREFIXED one's. Resource
//!   types by Kafka's `SecurityUtils.resourceTypeName` (`Topic`, `Group`, `Cluster`,
//!   `TransactionalId`, `DelegationToken`, `User`). The document, key order as Kafka's:
//!   `{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read","host":"*"}]}`.
//!   A pattern with no entry left has no node.
//! - After each change of a pattern, a change notification, as Kafka's
//!   `ZkNodeChangeNotificationListener` reads them: `/kafka-acl-changes/acl_changes_NNNNNNNNNN`
//!   (ten digits, as a ZooKeeper sequential node) holding `TOPIC:name` for a literal
//!   pattern (Kafka's `ResourceType.toString`, then the name), and
//!   `/kafka-acl-extended-changes/acl_changes_NNNNNNNNNN` holding
//!   `{"version":1,"resourceType":"TOPIC","name":"orders-","patternType":"PREFIXED"}` for a
//!   prefixed one. The number is one past the highest present (the registry is the only
//!   writer); the oldest are removed past `acl_change_notifications_max` (Kafka removes
//!   them after 15 minutes). Spate's brokers learn ACLs from the coordinator's snapshot,
//!   not from these; they are written for Kafka-era tools that watch them.
//!
//! Pure encoding and decoding, plus `load` and `write`, which the registry runs on the
//! metadata owner thread against its `MetaStore`. Decoding is bounded: a document is at
//! most `zookeeper::znode_data_bytes_max` bytes and `acl_entries_per_resource_max`
//! entries, and every field must name a known value.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::layout::LayoutError;
use super::store::{MetaStore, StoreError};
use crate::model::limits;
use crate::security::acl::{AclEntry, AclOperation, Acls, PatternType, Permission, ResourcePattern, ResourceType};

pub const LITERAL_ROOT: &str = "/kafka-acl";
pub const EXTENDED_ROOT: &str = "/kafka-acl-extended";
pub const PREFIXED_ROOT: &str = "/kafka-acl-extended/prefixed";
pub const LITERAL_CHANGES: &str = "/kafka-acl-changes";
pub const EXTENDED_CHANGES: &str = "/kafka-acl-extended-changes";
pub const CHANGE_PREFIX: &str = "acl_changes_";
pub const ACL_DOC_VERSION: i32 = 1;

/// The znode of a pattern's entries.
pub fn path(pattern: &ResourcePattern) -> String {
    let root = match pattern.pattern_type {
        PatternType::Prefixed => PREFIXED_ROOT,
        _ => LITERAL_ROOT,
    };
    format!("{root}/{}/{}", pattern.resource_type.name(), pattern.name)
}

fn invalid(reason: impl ToString) -> LayoutError {
    LayoutError::Invalid { path_kind: "ACL", reason: reason.to_string() }
}

#[derive(Serialize)]
struct AclDocOut<'a> {
    version: i32,
    acls: Vec<AclEntryOut<'a>>,
}

#[derive(Serialize)]
struct AclEntryOut<'a> {
    principal: &'a str,
    #[serde(rename = "permissionType")]
    permission_type: &'static str,
    operation: &'static str,
    host: &'a str,
}

#[derive(Deserialize)]
struct AclDocIn {
    #[serde(default)]
    acls: Vec<AclEntryIn>,
}

#[derive(Deserialize)]
struct AclEntryIn {
    principal: String,
    #[serde(rename = "permissionType")]
    permission_type: String,
    operation: String,
    host: String,
}

/// A pattern's document, entries in their sorted order.
pub fn encode_acls(entries: &BTreeSet<AclEntry>) -> Vec<u8> {
    let doc = AclDocOut {
        version: ACL_DOC_VERSION,
        acls: entries
            .iter()
            .map(|e| AclEntryOut {
                principal: &e.principal,
                permission_type: e.permission.name(),
                operation: e.operation.name(),
                host: &e.host,
            })
            .collect(),
    };
    serde_json::to_vec(&doc).expect("ACL documents always serialise")
}

/// Decode a pattern's document (an empty node has no entries).
pub fn decode_acls(bytes: &[u8]) -> Result<BTreeSet<AclEntry>, LayoutError> {
    if bytes.is_empty() {
        return Ok(BTreeSet::new());
    }
    if bytes.len() > super::zookeeper::znode_data_bytes_max {
        return Err(invalid(format!("{} bytes is over {}", bytes.len(), super::zookeeper::znode_data_bytes_max)));
    }
    let doc: AclDocIn = serde_json::from_slice(bytes).map_err(invalid)?;
    if doc.acls.len() > limits::acl_entries_per_resource_max {
        return Err(invalid(format!("{} entries is over {}", doc.acls.len(), limits::acl_entries_per_resource_max)));
    }
    doc.acls
        .into_iter()
        .map(|e| {
            let operation = AclOperation::from_name(&e.operation)
                .filter(|o| *o != AclOperation::Any)
                .ok_or_else(|| invalid(format!("unknown operation {:?}", e.operation)))?;
            let permission = Permission::from_name(&e.permission_type)
                .ok_or_else(|| invalid(format!("unknown permission type {:?}", e.permission_type)))?;
            if crate::security::Principal::parse(&e.principal).is_none() {
                return Err(invalid(format!("bad principal {:?}", e.principal)));
            }
            Ok(AclEntry { principal: e.principal, host: e.host, operation, permission })
        })
        .collect()
}

#[derive(Serialize, Deserialize)]
struct ExtendedChange {
    version: i32,
    #[serde(rename = "resourceType")]
    resource_type: String,
    name: String,
    #[serde(rename = "patternType")]
    pattern_type: String,
}

/// Kafka's Java `ResourceType.toString`: the enum constant's name.
fn java_enum_name(t: ResourceType) -> &'static str {
    match t {
        ResourceType::Any => "ANY",
        ResourceType::Topic => "TOPIC",
        ResourceType::Group => "GROUP",
        ResourceType::Cluster => "CLUSTER",
        ResourceType::TransactionalId => "TRANSACTIONAL_ID",
        ResourceType::DelegationToken => "DELEGATION_TOKEN",
        ResourceType::User => "USER",
    }
}

fn resource_type_from_java(s: &str) -> Option<ResourceType> {
    ResourceType::CONCRETE.into_iter().find(|t| java_enum_name(*t).eq_ignore_ascii_case(s))
}

/// A change notification: its parent node and its data.
pub fn encode_change(pattern: &ResourcePattern) -> (&'static str, Vec<u8>) {
    match pattern.pattern_type {
        PatternType::Prefixed => (
            EXTENDED_CHANGES,
            serde_json::to_vec(&ExtendedChange {
                version: 1,
                resource_type: java_enum_name(pattern.resource_type).to_string(),
                name: pattern.name.clone(),
                pattern_type: pattern.pattern_type.name().to_string(),
            })
            .expect("change events always serialise"),
        ),
        _ => (LITERAL_CHANGES, format!("{}:{}", java_enum_name(pattern.resource_type), pattern.name).into_bytes()),
    }
}

/// Decode a change notification of either store (Kafka's readers accept both spellings
/// of a resource type).
pub fn decode_change(bytes: &[u8], extended: bool) -> Result<ResourcePattern, LayoutError> {
    if bytes.len() > super::zookeeper::znode_data_bytes_max {
        return Err(invalid("change notification too long"));
    }
    if extended {
        let c: ExtendedChange = serde_json::from_slice(bytes).map_err(invalid)?;
        let resource_type = resource_type_from_java(&c.resource_type)
            .or_else(|| ResourceType::from_name(&c.resource_type))
            .ok_or_else(|| invalid("unknown resource type"))?;
        let pattern_type = [PatternType::Literal, PatternType::Prefixed]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(&c.pattern_type))
            .ok_or_else(|| invalid("unknown pattern type"))?;
        return Ok(ResourcePattern::new(resource_type, pattern_type, c.name));
    }
    let s = std::str::from_utf8(bytes).map_err(invalid)?;
    let (t, name) = s.split_once(':').ok_or_else(|| invalid("expected ResourceType:name"))?;
    let resource_type = resource_type_from_java(t)
        .or_else(|| ResourceType::from_name(t))
        .ok_or_else(|| invalid("unknown resource type"))?;
    Ok(ResourcePattern::literal(resource_type, name))
}

fn children_or_empty(store: &dyn MetaStore, path: &str) -> Result<Vec<String>, StoreError> {
    match store.children(path) {
        Err(StoreError::NoNode(_)) => Ok(Vec::new()),
        other => other,
    }
}

/// Everything under `/kafka-acl` and `/kafka-acl-extended/prefixed`. Errors name the
/// path of a document that does not decode.
pub fn load(store: &dyn MetaStore) -> Result<Acls, (String, String)> {
    let mut acls = Acls::default();
    let mut total = 0usize;
    for (root, pattern_type) in [(LITERAL_ROOT, PatternType::Literal), (PREFIXED_ROOT, PatternType::Prefixed)] {
        let types = children_or_empty(store, root).map_err(|e| (root.to_string(), e.to_string()))?;
        for type_name in types {
            // Kafka leaves nodes of types it does not know alone; so do we.
            let Some(resource_type) = ResourceType::from_name(&type_name) else { continue };
            let dir = format!("{root}/{type_name}");
            for name in children_or_empty(store, &dir).map_err(|e| (dir.clone(), e.to_string()))? {
                let pattern = ResourcePattern::new(resource_type, pattern_type, name);
                let p = path(&pattern);
                let Some(node) = store.get(&p).map_err(|e| (p.clone(), e.to_string()))? else { continue };
                let entries = decode_acls(&node.data).map_err(|e| (p.clone(), e.to_string()))?;
                total += entries.len();
                if total > limits::acl_bindings_max {
                    return Err((p, format!("more than {} ACL bindings", limits::acl_bindings_max)));
                }
                acls.set(pattern, entries);
            }
        }
    }
    Ok(acls)
}

/// Write a pattern's entries (its node removed when there are none), then its change
/// notification, removing the oldest notifications past the limit.
pub fn write(store: &dyn MetaStore, pattern: &ResourcePattern, entries: &BTreeSet<AclEntry>) -> Result<(), StoreError> {
    let p = path(pattern);
    if entries.is_empty() {
        store.delete_all(&p)?;
    } else {
        store.put(&p, &encode_acls(entries))?;
    }
    let (parent, data) = encode_change(pattern);
    let existing: Vec<String> =
        children_or_empty(store, parent)?.into_iter().filter(|c| c.starts_with(CHANGE_PREFIX)).collect();
    let next = existing.iter().filter_map(|c| c[CHANGE_PREFIX.len()..].parse::<u64>().ok()).max().map_or(0, |n| n + 1);
    store.put(&format!("{parent}/{CHANGE_PREFIX}{next:010}"), &data)?;
    let mut numbered: Vec<(u64, &String)> =
        existing.iter().filter_map(|c| Some((c[CHANGE_PREFIX.len()..].parse::<u64>().ok()?, c))).collect();
    numbered.sort();
    let keep = limits::acl_change_notifications_max.saturating_sub(1);
    if numbered.len() > keep {
        for (_, c) in &numbered[..numbered.len() - keep] {
            store.delete_all(&format!("{parent}/{c}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::store::LocalStore;

    fn entry(principal: &str, op: AclOperation, permission: Permission) -> AclEntry {
        AclEntry { principal: principal.into(), host: "*".into(), operation: op, permission }
    }

    #[test]
    fn acl_documents_are_kafkas() {
        let entries: BTreeSet<AclEntry> = [entry("User:alice", AclOperation::Read, Permission::Allow)].into();
        let kafka = r#"{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read","host":"*"}]}"#;
        assert_eq!(String::from_utf8(encode_acls(&entries)).unwrap(), kafka);
        assert_eq!(decode_acls(kafka.as_bytes()).unwrap(), entries);
        // Kafka's own writer, several entries and operations.
        let two = r#"{"version":1,"acls":[{"principal":"User:*","permissionType":"Deny","operation":"IdempotentWrite","host":"10.0.0.1"},{"principal":"User:bob","permissionType":"Allow","operation":"DescribeConfigs","host":"*"}]}"#;
        assert_eq!(decode_acls(two.as_bytes()).unwrap().len(), 2);
        assert!(decode_acls(
            br#"{"version":1,"acls":[{"principal":"User:a","permissionType":"Maybe","operation":"Read","host":"*"}]}"#
        )
        .is_err());
        assert!(decode_acls(
            br#"{"version":1,"acls":[{"principal":"alice","permissionType":"Allow","operation":"Read","host":"*"}]}"#
        )
        .is_err());
        assert!(decode_acls(
            br#"{"version":1,"acls":[{"principal":"User:a","permissionType":"Allow","operation":"Any","host":"*"}]}"#
        )
        .is_err());
        assert!(decode_acls(b"[1,2").is_err());
        assert!(decode_acls(b"").unwrap().is_empty());
    }

    #[test]
    fn paths_and_change_notifications_are_kafkas() {
        let lit = ResourcePattern::literal(ResourceType::Topic, "orders");
        let pre = ResourcePattern::prefixed(ResourceType::TransactionalId, "app-");
        assert_eq!(path(&lit), "/kafka-acl/Topic/orders");
        assert_eq!(path(&pre), "/kafka-acl-extended/prefixed/TransactionalId/app-");
        assert_eq!(encode_change(&lit), (LITERAL_CHANGES, b"TOPIC:orders".to_vec()));
        let (parent, data) = encode_change(&pre);
        assert_eq!(parent, EXTENDED_CHANGES);
        assert_eq!(
            std::str::from_utf8(&data).unwrap(),
            r#"{"version":1,"resourceType":"TRANSACTIONAL_ID","name":"app-","patternType":"PREFIXED"}"#
        );
        assert_eq!(decode_change(&data, true).unwrap(), pre);
        assert_eq!(decode_change(b"TOPIC:orders", false).unwrap(), lit);
        assert_eq!(decode_change(b"Topic:a:b", false).unwrap(), ResourcePattern::literal(ResourceType::Topic, "a:b"));
        assert!(decode_change(b"Nothing:x", false).is_err());
    }

    #[test]
    fn acls_are_written_loaded_and_notified_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let lit = ResourcePattern::literal(ResourceType::Topic, "a");
        let pre = ResourcePattern::prefixed(ResourceType::Group, "g");
        let e: BTreeSet<AclEntry> = [entry("User:alice", AclOperation::Write, Permission::Allow)].into();
        write(&store, &lit, &e).unwrap();
        write(&store, &pre, &e).unwrap();
        let loaded = load(&store).unwrap();
        assert_eq!(loaded.entries(&lit), Some(&e));
        assert_eq!(loaded.entries(&pre), Some(&e));
        for _ in 0..limits::acl_change_notifications_max + 5 {
            write(&store, &lit, &e).unwrap();
        }
        let changes = store.children(LITERAL_CHANGES).unwrap();
        assert_eq!(changes.len(), limits::acl_change_notifications_max);
        assert_eq!(changes.last().unwrap(), &format!("acl_changes_{:010}", limits::acl_change_notifications_max + 5));
        assert_eq!(store.children(EXTENDED_CHANGES).unwrap(), ["acl_changes_0000000000"]);
        write(&store, &lit, &BTreeSet::new()).unwrap();
        assert!(store.get("/kafka-acl/Topic/a").unwrap().is_none());
        assert!(load(&store).unwrap().entries(&lit).is_none());
    }
}
