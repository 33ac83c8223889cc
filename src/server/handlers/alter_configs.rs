//! AlterConfigs (replace a topic's or a broker's whole dynamic config) and
//! IncrementalAlterConfigs (set or delete single keys). Every value is checked as at
//! CreateTopics; the new config is stored durably (`/config/topics/<t>`,
//! `/config/brokers/<id>`, `/config/brokers/<default>`), then each partition's owner
//! applies it to its open log: a topic's at once, a broker's from the next metadata view
//! (topics without their own override).

use bytes::Bytes;
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest, AlterConfigsResponse, ApiKey,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};

use std::collections::BTreeMap;

use crate::config::{check_dynamic_broker_config, TopicConfig, BROKER_DEFAULT_ENTITY};
use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::PartitionOp;

use super::super::context::ShardContext;
use super::{respond, str_bytes};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// How a request changes the current overrides.
enum Change<'a> {
    Replace(Vec<(&'a str, Option<&'a str>)>),
    Incremental(Vec<(&'a str, i8, Option<&'a str>)>),
}

async fn alter(
    ctx: &ShardContext,
    frame: &RequestFrame,
    resource_type: i8,
    name: &str,
    change: Change<'_>,
    validate_only: bool,
) -> (i16, Option<String>) {
    // Kafka's handle(Incremental)AlterConfigsRequest: ALTER_CONFIGS on the topic, or on
    // the cluster for a broker.
    let view = ctx.view();
    match resource_type {
        RESOURCE_TOPIC
            if !super::authz::authorize(
                ctx,
                frame,
                &view,
                crate::security::acl::AclOperation::AlterConfigs,
                crate::security::acl::ResourceType::Topic,
                name,
            ) =>
        {
            (error_code::TOPIC_AUTHORIZATION_FAILED, Some("Authorization failed.".into()))
        }
        RESOURCE_BROKER
            if !super::authz::authorize_cluster(
                ctx,
                frame,
                &view,
                crate::security::acl::AclOperation::AlterConfigs,
            ) =>
        {
            (error_code::CLUSTER_AUTHORIZATION_FAILED, Some("Authorization failed.".into()))
        }
        RESOURCE_TOPIC => alter_topic(ctx, name, change, validate_only).await,
        RESOURCE_BROKER => alter_broker(ctx, name, change, validate_only).await,
        other => (error_code::INVALID_REQUEST, Some(format!("resource type {other} cannot be altered"))),
    }
}

/// A broker's dynamic configs: resource name "" is the cluster-wide default
/// (`/config/brokers/<default>`), a broker id that broker's own (`/config/brokers/<id>`).
/// Only `config::DYNAMIC_BROKER_TOPIC_CONFIGS` and `config::DYNAMIC_BROKER_RATE_CONFIGS`
/// may be set (APPEND and SUBTRACT on the list one, `log.cleanup.policy`); the others
/// Spate describes are
/// read-only (INVALID_REQUEST, as Kafka: "Cannot update these configs dynamically"),
/// unknown names and bad values are INVALID_CONFIG.
async fn alter_broker(
    ctx: &ShardContext,
    name: &str,
    change: Change<'_>,
    validate_only: bool,
) -> (i16, Option<String>) {
    // Any broker's id: a request for another broker comes here forwarded by it (admin
    // requests run on the active coordinator), as Kafka's controller takes them.
    let entity = if name.is_empty() {
        BROKER_DEFAULT_ENTITY.to_string()
    } else if name.parse::<i32>().is_ok_and(|id| id >= 0) {
        name.to_string()
    } else {
        return (error_code::INVALID_REQUEST, Some(format!("broker id must be an integer or empty, got {name:?}")));
    };
    let view = ctx.view();
    let mut configs: BTreeMap<String, String> = match change {
        Change::Replace(_) => BTreeMap::new(),
        Change::Incremental(_) => view.broker_configs(&entity).cloned().unwrap_or_default(),
    };
    let at_default = entity == BROKER_DEFAULT_ENTITY;
    let cluster_default = view.broker_configs(BROKER_DEFAULT_ENTITY).cloned().unwrap_or_default();
    // The value in effect before this change (for Kafka's thread-count rule): the
    // entity's, the cluster-wide default's, else Kafka's default.
    let current =
        |configs: &BTreeMap<String, String>, k: &str| -> Option<String> {
            configs.get(k).or_else(|| cluster_default.get(k)).cloned().or_else(|| {
                crate::config::kafka_broker::kafka_broker_config(k).and_then(|c| c.default).map(str::to_string)
            })
        };
    let check = |configs: &BTreeMap<String, String>, k: &str, v: Option<&str>| {
        check_dynamic_broker_config(k, v, at_default, current(configs, k).as_deref())
    };
    // Kafka answers every refused broker config with INVALID_REQUEST.
    let refuse = |message: String| (error_code::INVALID_REQUEST, Some(message));
    let ops: Vec<(&str, i8, Option<&str>)> = match change {
        Change::Replace(list) => {
            list.into_iter().map(|(k, v)| (k, if v.is_some() { OP_SET } else { OP_DELETE }, v)).collect()
        }
        Change::Incremental(ops) => ops,
    };
    for (k, op, v) in ops {
        match (op, v) {
            (OP_SET, Some(v)) => {
                if let Err(e) = check(&configs, k, Some(v)) {
                    return refuse(e);
                }
                configs.insert(k.to_string(), v.to_string());
            }
            (OP_DELETE, _) => {
                if let Err(e) = check(&configs, k, None) {
                    return refuse(e);
                }
                configs.remove(k);
            }
            (OP_APPEND | OP_SUBTRACT, Some(v))
                if crate::config::dynamic_broker_config_topic_name(k).is_some_and(TopicConfig::is_list) =>
            {
                // On the entity's current value, else the static default (as Kafka does).
                let now = configs.get(k).cloned().unwrap_or_else(|| {
                    let topic_name = crate::config::dynamic_broker_config_topic_name(k).unwrap_or_default();
                    TopicConfig::default()
                        .describe(&ctx.config.topic_defaults)
                        .into_iter()
                        .find(|(n, _, _)| n == topic_name)
                        .map(|(_, v, _)| v)
                        .unwrap_or_default()
                });
                let value = list_change(&now, op, v);
                if let Err(e) = check(&configs, k, Some(&value)) {
                    return refuse(e);
                }
                configs.insert(k.to_string(), value);
            }
            _ => {
                return (
                    error_code::INVALID_CONFIG,
                    Some(format!("{k}: SET (with a value) and DELETE apply; APPEND and SUBTRACT to list configs")),
                )
            }
        }
    }
    if validate_only {
        return (error_code::NONE, None);
    }
    let logged = configs.clone();
    let written = entity.clone();
    if let Err(e) = ctx.metadata.write(move |reg| reg.set_broker_configs(&written, configs)).await {
        return (super::registry_error_code(&e), Some(e.to_string()));
    }
    tracing::info!(entity = %entity, configs = ?logged, "altered dynamic broker config");
    (error_code::NONE, None)
}

async fn alter_topic(ctx: &ShardContext, name: &str, change: Change<'_>, validate_only: bool) -> (i16, Option<String>) {
    let (current, dynamic_defaults) = match ctx.view().get(name) {
        Some(meta) => (meta.configs.overrides.clone(), meta.configs.dynamic_defaults.clone()),
        None => return (error_code::UNKNOWN_TOPIC_OR_PARTITION, Some(format!("topic {name:?} does not exist"))),
    };
    let pairs: Vec<(String, Option<String>)> = match change {
        Change::Replace(list) => list.into_iter().map(|(k, v)| (k.to_string(), v.map(String::from))).collect(),
        Change::Incremental(ops) => {
            let mut merged = current.clone();
            for (k, op, v) in ops {
                match (op, v) {
                    (OP_SET, Some(v)) => {
                        merged.insert(k.to_string(), v.to_string());
                    }
                    (OP_DELETE, _) => {
                        merged.remove(k);
                        // Deleting a key we do not know is still an error worth reporting.
                        if let Err(e) = TopicConfig::from_pairs([(k, None)], &ctx.config.topic_defaults) {
                            return (error_code::INVALID_CONFIG, Some(e));
                        }
                    }
                    (OP_SET, None) => return (error_code::INVALID_CONFIG, Some(format!("no value to set for {k}"))),
                    (OP_APPEND | OP_SUBTRACT, Some(v)) if TopicConfig::is_list(k) => {
                        // On the effective value: the topic's, else the broker's default
                        // (dynamic, then static), else Kafka's (as Kafka does).
                        let now = merged.get(k).cloned().unwrap_or_else(|| {
                            let defaults =
                                TopicConfig { dynamic_defaults: dynamic_defaults.clone(), ..Default::default() }
                                    .describe(&ctx.config.topic_defaults);
                            defaults.into_iter().find(|(n, _, _)| n == k).map(|(_, v, _)| v).unwrap_or_default()
                        });
                        merged.insert(k.to_string(), list_change(&now, op, v));
                    }
                    _ => {
                        return (
                            error_code::INVALID_CONFIG,
                            Some(format!(
                                "{k}: APPEND and SUBTRACT need a list config and a value; SET and DELETE apply"
                            )),
                        )
                    }
                }
            }
            merged.into_iter().map(|(k, v)| (k, Some(v))).collect()
        }
    };
    let configs = match TopicConfig::from_pairs(
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_deref())),
        &ctx.config.topic_defaults,
    ) {
        Ok(c) => c,
        Err(e) => return (error_code::INVALID_CONFIG, Some(e)),
    };
    if validate_only {
        return (error_code::NONE, None);
    }
    let topic = name.to_string();
    let meta = match ctx.metadata.write(move |reg| reg.set_configs(&topic, configs)).await {
        Ok(m) => m,
        Err(e) => return (super::registry_error_code(&e), Some(e.to_string())),
    };
    tracing::info!(topic = name, configs = ?meta.configs.overrides, "altered topic config");
    let refreshes =
        (0..meta.partitions).map(|p| ctx.call(PartitionOp::RefreshConfig { tp: TopicPartition::new(name, p) }));
    for r in futures::future::join_all(refreshes).await {
        if let Err(e) = r {
            tracing::warn!(topic = name, error = %e, "config not applied to a partition");
        }
    }
    (error_code::NONE, None)
}

pub async fn handle_alter(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AlterConfigsRequest = decode_body(frame)?;
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in &req.resources {
        let change = Change::Replace(
            r.configs.iter().map(|c| (c.name.as_str(), c.value.as_ref().map(|v| v.as_str()))).collect(),
        );
        let (code, msg) = alter(ctx, frame, r.resource_type, r.resource_name.as_str(), change, req.validate_only).await;
        responses.push(
            alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg.map(str_bytes))
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone()),
        );
    }
    respond(ApiKey::AlterConfigs, frame, &AlterConfigsResponse::default().with_responses(responses))
}

pub async fn handle_incremental(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: IncrementalAlterConfigsRequest = decode_body(frame)?;
    let mut responses = Vec::with_capacity(req.resources.len());
    for r in &req.resources {
        let change = Change::Incremental(
            r.configs
                .iter()
                .map(|c| (c.name.as_str(), c.config_operation, c.value.as_ref().map(|v| v.as_str())))
                .collect(),
        );
        let (code, msg) = alter(ctx, frame, r.resource_type, r.resource_name.as_str(), change, req.validate_only).await;
        responses.push(
            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg.map(str_bytes))
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone()),
        );
    }
    respond(
        ApiKey::IncrementalAlterConfigs,
        frame,
        &IncrementalAlterConfigsResponse::default().with_responses(responses),
    )
}

/// IncrementalAlterConfigs APPEND or SUBTRACT of the comma-separated `items` on the list
/// value `now` (an item already there is not appended twice).
fn list_change(now: &str, op: i8, items: &str) -> String {
    // Sets, not pairwise scans: both lists are a client's, and may be long.
    let mut out: Vec<&str> = now.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
    let changes = items.split(',').map(str::trim).filter(|i| !i.is_empty());
    if op == OP_APPEND {
        let mut present: std::collections::HashSet<&str> = out.iter().copied().collect();
        out.extend(changes.filter(|item| present.insert(item)));
    } else if op == OP_SUBTRACT {
        let removed: std::collections::HashSet<&str> = changes.collect();
        out.retain(|i| !removed.contains(i));
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_changes_append_what_is_missing_and_subtract_every_copy() {
        assert_eq!(list_change("delete", OP_APPEND, "compact,delete,compact"), "delete,compact");
        assert_eq!(list_change("", OP_APPEND, " 0:1 , 1:2"), "0:1,1:2");
        assert_eq!(list_change("0:1,1:2,0:1", OP_SUBTRACT, "0:1"), "1:2");
        // Long lists from a client: linear, not a pairwise scan (2 x 10^10 comparisons
        // on a data core for these).
        let many: Vec<String> = (0..200_000).map(|i| format!("{i}:1")).collect();
        let appended = list_change("", OP_APPEND, &many.join(","));
        assert_eq!(appended.split(',').count(), 200_000);
        assert_eq!(list_change(&appended, OP_SUBTRACT, &many.join(",")), "");
    }
}
