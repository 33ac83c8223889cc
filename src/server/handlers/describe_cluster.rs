//! DescribeCluster (KIP-700): the cluster id, the controller as Metadata names it, and
//! every live broker with its host, port and rack, from this broker's view. The
//! cluster's authorized operations only when asked for (without an authorizer, every
//! operation that applies, as Metadata answers them); otherwise Kafka's "not
//! requested", i32::MIN. v1 names the endpoint type: brokers answer requests for
//! brokers only (MISMATCHED_ENDPOINT_TYPE otherwise, as Kafka's brokers do). v2
//! (KIP-1073) lists the fenced brokers too when asked (`IncludeFencedBrokers`), each
//! with `IsFenced`.

use bytes::Bytes;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{ApiKey, BrokerId, DescribeClusterRequest, DescribeClusterResponse};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

/// DescribeCluster's endpoint type for brokers (1; controllers are 2).
const ENDPOINT_TYPE_BROKER: i8 = 1;
/// Kafka's "authorized operations not requested".
const AUTHORIZED_OPERATIONS_OMITTED: i32 = i32::MIN;

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeClusterRequest = decode_body(frame)?;
    let mut body = DescribeClusterResponse::default()
        .with_endpoint_type(ENDPOINT_TYPE_BROKER)
        .with_cluster_authorized_operations(AUTHORIZED_OPERATIONS_OMITTED);
    if frame.api_version >= 1 && req.endpoint_type != ENDPOINT_TYPE_BROKER {
        body = body.with_error_code(error_code::MISMATCHED_ENDPOINT_TYPE).with_error_message(Some(str_bytes(format!(
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type {}",
            req.endpoint_type
        ))));
        return respond(ApiKey::DescribeCluster, frame, &body);
    }
    let view = ctx.view();
    let include_fenced = frame.api_version >= 2 && req.include_fenced_brokers;
    let mut brokers: Vec<DescribeClusterBroker> = super::listed_brokers(ctx, &view, frame, include_fenced)
        .into_iter()
        .map(|b| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.id))
                .with_host(str_bytes(b.host))
                .with_port(b.port)
                .with_rack(b.rack.map(str_bytes))
                .with_is_fenced(b.fenced)
        })
        .collect();
    brokers.sort_by_key(|b| b.broker_id.0);
    body = body
        .with_cluster_id(str_bytes(view.cluster_id().unwrap_or(&ctx.cluster_id).to_string()))
        .with_controller_id(BrokerId(view.controller_id_for_clients().0))
        .with_brokers(brokers);
    if req.include_cluster_authorized_operations {
        use crate::security::acl::{AclOperation, ResourceType, CLUSTER_RESOURCE_NAME};
        let operations = if super::authz::authorize_cluster(ctx, frame, &view, AclOperation::Describe) {
            super::authz::authorized_operations(ctx, frame, &view, ResourceType::Cluster, CLUSTER_RESOURCE_NAME)
        } else {
            0
        };
        body = body.with_cluster_authorized_operations(operations);
    }
    respond(ApiKey::DescribeCluster, frame, &body)
}
