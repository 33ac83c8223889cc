//! DescribeClientQuotas and AlterClientQuotas (KIP-546): client quotas of users, client
//! ids and both, with `<default>` entities, stored in Kafka's layout
//! (`/config/users/...`, `/config/clients/...`; `security::entity`). Describe reads the
//! view; Alter runs on the active coordinator (forwarded there by other brokers), its
//! read-modify-write inside one registry call so concurrent alters never lose a key,
//! and keeps the other keys of the node (a user's SCRAM credentials).
//!
//! Validation as Kafka's (`ZkAdminManager.alterClientQuotas`): an entity of `user`,
//! `client-id` or both, each at most once (`ip` quotas are not supported); only quota
//! keys; LONG-typed keys (`producer_byte_rate`, `consumer_byte_rate`) take whole
//! numbers; every value finite and positive. A refusal is INVALID_REQUEST.
//!
//! Authorization as Kafka's: Describe needs DESCRIBE_CONFIGS on the cluster, Alter
//! ALTER_CONFIGS (CLUSTER_AUTHORIZATION_FAILED otherwise, for the request or every
//! entry).

use std::collections::BTreeMap;

use crate::security::acl::AclOperation;

use bytes::Bytes;
use kafka_protocol::messages::{
    alter_client_quotas_response, describe_client_quotas_response, AlterClientQuotasRequest, AlterClientQuotasResponse,
    ApiKey, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::entity::{self, EntityName, QuotaEntity, QUOTA_KEYS};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub const ENTITY_USER: &str = "user";
pub const ENTITY_CLIENT_ID: &str = "client-id";
pub const ENTITY_IP: &str = "ip";

const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

type Refusal = (i16, String);

fn invalid(message: impl Into<String>) -> Refusal {
    (error_code::INVALID_REQUEST, message.into())
}

/// A request's entity (type, name or None for the default) as a `QuotaEntity`.
fn parse_entity<'a>(parts: impl Iterator<Item = (&'a str, Option<&'a str>)>) -> Result<QuotaEntity, Refusal> {
    let mut entity = QuotaEntity { user: None, client_id: None };
    for (kind, name) in parts {
        let name = match name {
            None => EntityName::Default,
            Some(n) if n.len() > entity::entity_name_bytes_max => {
                return Err(invalid(format!("entity name longer than {} bytes", entity::entity_name_bytes_max)))
            }
            Some(n) => EntityName::Name(n.to_string()),
        };
        let slot = match kind {
            ENTITY_USER => &mut entity.user,
            ENTITY_CLIENT_ID => &mut entity.client_id,
            ENTITY_IP => return Err(invalid("ip quotas are not supported")),
            other => return Err(invalid(format!("Unhandled client quota entity type: {other}"))),
        };
        if slot.replace(name).is_some() {
            return Err(invalid(format!("Duplicate {kind} entity component")));
        }
    }
    if entity.path().is_none() {
        return Err(invalid("Invalid empty client quota entity"));
    }
    Ok(entity)
}

/// The entity as the protocol lists it: user first, then client-id.
fn entity_parts(entity: &QuotaEntity) -> Vec<(&'static str, Option<String>)> {
    let mut parts = Vec::with_capacity(2);
    if let Some(u) = &entity.user {
        parts.push((ENTITY_USER, u.name().map(String::from)));
    }
    if let Some(c) = &entity.client_id {
        parts.push((ENTITY_CLIENT_ID, c.name().map(String::from)));
    }
    parts
}

/// Checked quota changes: (key, Some(value as stored)) to set, (key, None) to remove.
fn check_ops<'a>(ops: impl Iterator<Item = (&'a str, f64, bool)>) -> Result<Vec<(String, Option<String>)>, Refusal> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for (key, value, remove) in ops {
        let Some((_, long)) = QUOTA_KEYS.iter().find(|(k, _)| *k == key) else {
            return Err(invalid(format!("Invalid configuration key {key}")));
        };
        if out.iter().any(|(k, _)| k == key) {
            return Err(invalid(format!("Duplicate quota key {key}")));
        }
        if remove {
            out.push((key.to_string(), None));
            continue;
        }
        if !value.is_finite() || value <= 0.0 {
            return Err(invalid(format!("Quota {key} must be a positive number, got {value}")));
        }
        if *long {
            let epsilon = 1e-6;
            let whole = (value + epsilon).trunc();
            if (whole - value).abs() > epsilon || whole > i64::MAX as f64 {
                return Err(invalid(format!("Configuration {key} must be a Long value")));
            }
        }
        out.push((key.to_string(), Some(entity::format_quota_value(key, value))));
    }
    Ok(out)
}

async fn alter_one(
    ctx: &ShardContext,
    entity: QuotaEntity,
    ops: Vec<(String, Option<String>)>,
    validate_only: bool,
) -> Result<(), Refusal> {
    if validate_only {
        return Ok(());
    }
    let path = entity.path().expect("checked non-empty");
    let written = path.clone();
    let result = ctx
        .metadata
        .write(move |reg| {
            let mut configs: BTreeMap<String, String> = reg.entity_configs(&written);
            for (k, v) in ops {
                match v {
                    Some(v) => configs.insert(k, v),
                    None => configs.remove(&k),
                };
            }
            reg.set_entity_configs(&written, configs)
        })
        .await;
    match result {
        Ok(()) => {
            tracing::info!(entity = %path, "altered client quotas");
            Ok(())
        }
        Err(e) => Err((super::registry_error_code(&e), e.to_string())),
    }
}

pub async fn handle_alter(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AlterClientQuotasRequest = decode_body(frame)?;
    let allowed = super::authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::AlterConfigs);
    let mut entries = Vec::with_capacity(req.entries.len());
    for e in &req.entries {
        let parts = e.entity.iter().map(|p| (p.entity_type.as_str(), p.entity_name.as_ref().map(|n| n.as_str())));
        let outcome = match (parse_entity(parts), check_ops(e.ops.iter().map(|o| (o.key.as_str(), o.value, o.remove))))
        {
            _ if !allowed => Err((error_code::CLUSTER_AUTHORIZATION_FAILED, super::authz::CLUSTER_DENIED.into())),
            (Ok(entity), Ok(ops)) => alter_one(ctx, entity, ops, req.validate_only).await,
            (Err(r), _) | (_, Err(r)) => Err(r),
        };
        let (code, message) = match outcome {
            Ok(()) => (error_code::NONE, None),
            Err((code, message)) => (code, Some(str_bytes(message))),
        };
        entries.push(
            alter_client_quotas_response::EntryData::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_entity(
                    e.entity
                        .iter()
                        .map(|p| {
                            alter_client_quotas_response::EntityData::default()
                                .with_entity_type(p.entity_type.clone())
                                .with_entity_name(p.entity_name.clone())
                        })
                        .collect(),
                ),
        );
    }
    respond(ApiKey::AlterClientQuotas, frame, &AlterClientQuotasResponse::default().with_entries(entries))
}

/// One filter component: the entity type, and what its name must be.
enum NameMatch {
    Exact(String),
    Default,
    Specified,
}

fn matches(name: &Option<EntityName>, m: &NameMatch) -> bool {
    match (name, m) {
        (None, _) => false,
        (Some(n), NameMatch::Exact(want)) => n.name() == Some(want.as_str()),
        (Some(n), NameMatch::Default) => *n == EntityName::Default,
        (Some(_), NameMatch::Specified) => true,
    }
}

pub fn handle_describe(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeClientQuotasRequest = decode_body(frame)?;
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::DescribeConfigs) {
        let body = DescribeClientQuotasResponse::default()
            .with_error_code(error_code::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(str_bytes(super::authz::CLUSTER_DENIED)));
        return respond(ApiKey::DescribeClientQuotas, frame, &body);
    }
    let refuse = |message: String| {
        let body = DescribeClientQuotasResponse::default()
            .with_error_code(error_code::INVALID_REQUEST)
            .with_error_message(Some(str_bytes(message)));
        respond(ApiKey::DescribeClientQuotas, frame, &body)
    };
    let (mut user, mut client_id) = (None, None);
    for c in &req.components {
        let m = match (c.match_type, &c._match) {
            (MATCH_EXACT, Some(name)) => NameMatch::Exact(name.to_string()),
            (MATCH_DEFAULT, None) => NameMatch::Default,
            (MATCH_SPECIFIED, None) => NameMatch::Specified,
            (t, _) => return refuse(format!("Invalid match type {t} for entity type {}", c.entity_type.as_str())),
        };
        let slot = match c.entity_type.as_str() {
            ENTITY_USER => &mut user,
            ENTITY_CLIENT_ID => &mut client_id,
            ENTITY_IP => return refuse("ip quotas are not supported".into()),
            other => return refuse(format!("Custom entity type '{other}' not supported")),
        };
        if slot.replace(m).is_some() {
            return refuse(format!("Duplicate {} filter component entity type", c.entity_type.as_str()));
        }
    }
    let view = ctx.view();
    let mut entries = Vec::new();
    for (entity, values) in &view.entity_configs().quotas {
        let ok = |name: &Option<EntityName>, filter: &Option<NameMatch>| match filter {
            Some(m) => matches(name, m),
            None => !req.strict || name.is_none(),
        };
        if !ok(&entity.user, &user) || !ok(&entity.client_id, &client_id) {
            continue;
        }
        let quota_values: Vec<_> = values
            .entries()
            .into_iter()
            .map(|(k, v)| describe_client_quotas_response::ValueData::default().with_key(str_bytes(k)).with_value(v))
            .collect();
        entries.push(
            describe_client_quotas_response::EntryData::default()
                .with_entity(
                    entity_parts(entity)
                        .into_iter()
                        .map(|(t, n)| {
                            describe_client_quotas_response::EntityData::default()
                                .with_entity_type(str_bytes(t))
                                .with_entity_name(n.map(str_bytes))
                        })
                        .collect(),
                )
                .with_values(quota_values),
        );
    }
    respond(ApiKey::DescribeClientQuotas, frame, &DescribeClientQuotasResponse::default().with_entries(Some(entries)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alterations_are_checked_as_kafka_checks_them() {
        let ops = check_ops([("producer_byte_rate", 1048576.0, false), ("request_percentage", 50.0, true)].into_iter())
            .unwrap();
        assert_eq!(
            ops,
            vec![("producer_byte_rate".into(), Some("1048576".into())), ("request_percentage".into(), None)]
        );
        for bad in [
            vec![("producer_byte_rate", 0.0, false)],
            vec![("producer_byte_rate", -1.0, false)],
            vec![("producer_byte_rate", 1.5, false)],
            vec![("consumer_byte_rate", f64::NAN, false)],
            vec![("request_percentage", f64::INFINITY, false)],
            vec![("SCRAM-SHA-256", 1.0, false)],
            vec![("retention.ms", 1.0, false)],
            vec![("producer_byte_rate", 1.0, false), ("producer_byte_rate", 2.0, false)],
        ] {
            assert_eq!(check_ops(bad.clone().into_iter()).unwrap_err().0, error_code::INVALID_REQUEST, "{bad:?}");
        }
        assert!(parse_entity([("user", Some("a")), ("user", Some("b"))].into_iter()).is_err());
        assert!(parse_entity([("ip", Some("1.2.3.4"))].into_iter()).is_err());
        assert!(parse_entity(std::iter::empty()).is_err());
        let e = parse_entity([("client-id", None), ("user", Some("a b"))].into_iter()).unwrap();
        assert_eq!(e.path().as_deref(), Some("users/a%20b/clients/<default>"));
    }
}
