//! FindCoordinator: a group's coordinator is the broker that leads the group's partition
//! of `__consumer_offsets`, a transactional id's (key type 1) the broker that leads its
//! partition of `__transaction_state` (as in Kafka). v4+ asks for several keys at once.
//!
//! The first one asked of the active coordinator's broker before the topic exists
//! creates it (see `create_offsets_topic`, `create_txn_topic`); other brokers answer
//! COORDINATOR_NOT_AVAILABLE until it exists, and the client asks again (for
//! `__transaction_state`, which is created on demand, they first ask the active
//! coordinator for the same key, so that it creates the topic). An empty
//! transactional id is INVALID_REQUEST; other key types are INVALID_REQUEST too. v6
//! adds key type 2, a share group's share coordinator (KIP-932): Spate has no share
//! coordinator yet, and answers INVALID_REQUEST, as Kafka 4.4 does where none runs;
//! before that, as Kafka 4.4, such a key needs CLUSTER_ACTION on the cluster
//! (CLUSTER_AUTHORIZATION_FAILED).

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::{group_partition, txn_partition};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;
const KEY_TYPE_SHARE: i8 = 2;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: FindCoordinatorRequest = decode_body(frame)?;
    if req.key_type == KEY_TYPE_GROUP {
        let view = ctx.view();
        if view.is_active() && view.get(crate::group::OFFSETS_TOPIC).is_none() {
            let rf = ctx.config.offsets_topic();
            if let Err(e) = ctx.metadata.write(move |r| super::super::create_offsets_topic(r, rf, true)).await {
                tracing::warn!(error = %e, "cannot create the offsets topic");
            }
        }
    } else if req.key_type == KEY_TYPE_TRANSACTION {
        let view = ctx.view();
        if view.get(crate::txn::TXN_TOPIC).is_none() {
            if view.is_active() {
                let rf = ctx.config.offsets_topic();
                if let Err(e) = ctx.metadata.write(move |r| super::super::create_txn_topic(r, rf, true)).await {
                    tracing::warn!(error = %e, "cannot create the transaction state topic");
                }
            } else {
                let key = if frame.api_version >= 4 { req.coordinator_keys.first() } else { Some(&req.key) };
                if let Some(key) = key.filter(|k| !k.is_empty()) {
                    if let Err(e) = super::super::txn::create_topic_through_active(ctx, key.as_str()).await {
                        tracing::warn!(error = %e, "cannot have the active coordinator create the transaction state topic");
                    }
                }
            }
        }
    }
    let reg = ctx.view();
    let answer = |key: &str| -> Result<(BrokerId, String, i32), (i16, Option<String>)> {
        let tp = match req.key_type {
            KEY_TYPE_GROUP if key.is_empty() => {
                return Err((error_code::INVALID_GROUP_ID, Some("empty group id".into())));
            }
            // Kafka's handleFindCoordinatorRequest: DESCRIBE on the group or
            // transactional id.
            KEY_TYPE_GROUP
                if !super::authz::authorize(ctx, frame, &reg, AclOperation::Describe, ResourceType::Group, key) =>
            {
                return Err((error_code::GROUP_AUTHORIZATION_FAILED, None));
            }
            KEY_TYPE_GROUP => group_partition(key),
            KEY_TYPE_TRANSACTION if key.is_empty() => {
                return Err((error_code::INVALID_REQUEST, Some("empty transactional id".into())));
            }
            KEY_TYPE_TRANSACTION
                if !super::authz::authorize(
                    ctx,
                    frame,
                    &reg,
                    AclOperation::Describe,
                    ResourceType::TransactionalId,
                    key,
                ) =>
            {
                return Err((error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED, None));
            }
            KEY_TYPE_TRANSACTION => txn_partition(key),
            // Kafka 4.4: share coordinator keys are for brokers (CLUSTER_ACTION).
            KEY_TYPE_SHARE if !super::authz::authorize_cluster(ctx, frame, &reg, AclOperation::ClusterAction) => {
                return Err((error_code::CLUSTER_AUTHORIZATION_FAILED, None));
            }
            KEY_TYPE_SHARE => {
                return Err((error_code::INVALID_REQUEST, Some("share groups are not supported by this broker".into())))
            }
            other => return Err((error_code::INVALID_REQUEST, Some(format!("unknown key type {other}")))),
        };
        let leader = reg.leader_of(&tp.topic, tp.partition);
        match leader.and_then(|id| reg.broker_info(id).filter(|b| b.is_live())) {
            // This broker: the address of the listener the request came through.
            Some(_) | None if leader.map(|id| id.0) == Some(ctx.config.node_id) => {
                let (host, port) = ctx.config.advertised_for(&frame.listener);
                Ok((BrokerId(ctx.config.node_id), host, port))
            }
            // Another broker: its address on the listener of the same name.
            Some(b) => match b.endpoint.for_listener(&frame.listener) {
                Some((host, port)) => Ok((BrokerId(b.id.0), host.to_string(), port as i32)),
                None => Err((
                    error_code::COORDINATOR_NOT_AVAILABLE,
                    Some(format!("broker {} has no listener {}", b.id, frame.listener)),
                )),
            },
            None => Err((error_code::COORDINATOR_NOT_AVAILABLE, Some(format!("{tp} has no live leader")))),
        }
    };
    let mut body = FindCoordinatorResponse::default();
    if frame.api_version >= 4 {
        body.coordinators = req
            .coordinator_keys
            .iter()
            .map(|k| {
                let c = Coordinator::default().with_key(k.clone());
                match answer(k.as_str()) {
                    Ok((node, host, port)) => c.with_node_id(node).with_host(str_bytes(host)).with_port(port),
                    Err((code, msg)) => c
                        .with_error_code(code)
                        .with_node_id(BrokerId(-1))
                        .with_port(-1)
                        .with_error_message(msg.map(str_bytes)),
                }
            })
            .collect();
    } else {
        match answer(req.key.as_str()) {
            Ok((node, host, port)) => body = body.with_node_id(node).with_host(str_bytes(host)).with_port(port),
            Err((code, msg)) => {
                body = body.with_error_code(code).with_node_id(BrokerId(-1)).with_port(-1);
                if frame.api_version >= 1 {
                    body.error_message = msg.map(str_bytes);
                }
            }
        }
    }
    drop(reg);
    respond(ApiKey::FindCoordinator, frame, &body)
}
