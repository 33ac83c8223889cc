//! ElectLeaders (kafka-leader-election, the admin's `electLeaders`) on the active
//! coordinator (other brokers forward it). Each named partition, or every partition when
//! none are named, as Kafka's controller decides it:
//! - preferred (election type 0, and every v0 request): the first replica becomes the
//!   leader when it is live and in the ISR; already led by it is ELECTION_NOT_NEEDED, not
//!   live or not in sync PREFERRED_LEADER_NOT_AVAILABLE;
//! - unclean (type 1): a partition with no leader gets a live ISR member, else its first
//!   live replica even out of sync (its ISR is then just that replica, and what it lacks
//!   is lost); a partition with a leader is ELECTION_NOT_NEEDED, one with no live replica
//!   ELIGIBLE_LEADERS_NOT_AVAILABLE.
//!
//! ELECTION_NOT_NEEDED is left out of the answer when every partition was asked for, as
//! Kafka does. Other election types are INVALID_REQUEST.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ApiKey, ElectLeadersRequest, ElectLeadersResponse, TopicName};

use crate::coordinator::controller::{Election, ElectionKind};
use crate::model::limits;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

/// Kafka's `ElectionType`: 0, the preferred replica; 1, any live replica (unclean).
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: ElectLeadersRequest = decode_body(frame)?;
    let named = req.topic_partitions.as_ref().map(|ts| ts.iter().map(|t| t.partitions.len() as u64).sum::<u64>());
    let refuse = |code: i16, message: String| {
        let results = req
            .topic_partitions
            .iter()
            .flatten()
            .map(|t| {
                let partitions = t
                    .partitions
                    .iter()
                    .map(|p| {
                        PartitionResult::default()
                            .with_partition_id(*p)
                            .with_error_code(code)
                            .with_error_message(Some(str_bytes(message.clone())))
                    })
                    .collect();
                ReplicaElectionResult::default().with_topic(t.topic.clone()).with_partition_result(partitions)
            })
            .collect();
        let mut body = ElectLeadersResponse::default().with_replica_election_results(results);
        // Per partition when partitions were named (the message reaches the user that
        // way); the top-level code, which has no message, only when none were.
        if frame.api_version >= 1 && named.unwrap_or(0) == 0 {
            body.error_code = code;
        }
        respond(ApiKey::ElectLeaders, frame, &body)
    };
    // Kafka's handleElectLeaders: ALTER on the cluster.
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), crate::security::acl::AclOperation::Alter) {
        return refuse(error_code::CLUSTER_AUTHORIZATION_FAILED, super::authz::CLUSTER_DENIED.into());
    }
    let kind = match req.election_type {
        _ if frame.api_version == 0 => ElectionKind::Preferred,
        PREFERRED => ElectionKind::Preferred,
        UNCLEAN => ElectionKind::Unclean,
        other => {
            return refuse(
                error_code::INVALID_REQUEST,
                format!("election type {other} is not supported: preferred (0) or unclean (1)"),
            )
        }
    };
    // The shape walk already bounds the request's array elements as a whole, to the same
    // limit (tests/test_bad_input.py shows such a request closed before it gets here);
    // checked again because this handler builds one answer per named partition.
    if named.is_some_and(|n| n > limits::request_array_elements_max) {
        return refuse(error_code::INVALID_REQUEST, "too many partitions in one request".into());
    }
    let targets: Option<Vec<(String, i32)>> = req
        .topic_partitions
        .as_ref()
        .map(|ts| ts.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic.to_string(), *p))).collect());
    let all = targets.is_none();
    let outcome = ctx.metadata.write(move |reg| reg.elect(kind, targets)).await;
    let outcomes = match outcome {
        Ok(o) => o,
        Err(e) => return refuse(super::registry_error_code(&e), e.to_string()),
    };
    let mut by_topic: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    for (topic, partition, election) in outcomes {
        let (code, message) = match election {
            Election::Elected => (error_code::NONE, None),
            Election::NotNeeded if all => continue,
            Election::NotNeeded => {
                (error_code::ELECTION_NOT_NEEDED, Some("leader election not needed for topic partition"))
            }
            Election::PreferredNotAvailable => (
                error_code::PREFERRED_LEADER_NOT_AVAILABLE,
                Some("the preferred replica is not live or not in the ISR"),
            ),
            Election::EligibleNotAvailable => {
                (error_code::ELIGIBLE_LEADERS_NOT_AVAILABLE, Some("no replica of the partition is live"))
            }
            Election::UnknownPartition => (error_code::UNKNOWN_TOPIC_OR_PARTITION, Some("no such topic partition")),
        };
        if code == error_code::NONE {
            match kind {
                ElectionKind::Preferred => tracing::info!(topic = %topic, partition, "preferred leader elected"),
                ElectionKind::Unclean => {
                    tracing::warn!(topic = %topic, partition, "unclean leader election asked for: leader elected")
                }
            }
        }
        by_topic.entry(topic).or_default().push(
            PartitionResult::default()
                .with_partition_id(partition)
                .with_error_code(code)
                .with_error_message(message.map(str_bytes)),
        );
    }
    let results = by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            ReplicaElectionResult::default().with_topic(TopicName(str_bytes(topic))).with_partition_result(partitions)
        })
        .collect();
    respond(ApiKey::ElectLeaders, frame, &ElectLeadersResponse::default().with_replica_election_results(results))
}
