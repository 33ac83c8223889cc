//! TxnOffsetCommit (v0-v5): a transactional producer commits a group's offsets inside
//! its transaction (`sendOffsetsToTransaction`, consume-transform-produce). Routed like
//! OffsetCommit to the shard that leads the group's `__consumer_offsets` partition,
//! checked there against the group (v3+ carry the consumer's member id, instance id and
//! generation: KIP-447 fences a zombie with ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID or
//! FENCED_INSTANCE_ID), appended as a transactional batch of the producer's id and
//! epoch with acks=all (fsynced first under `--fsync always`), then answered. The
//! offsets stay invisible to OffsetFetch until the transaction's COMMIT marker lands in
//! that partition; ABORT drops them.
//!
//! Errors as Kafka's coordinator maps its append's: a stale producer epoch is
//! INVALID_PRODUCER_EPOCH (the producer is fenced), too few replicas or an offsets
//! partition that is not open COORDINATOR_NOT_AVAILABLE, a moved leadership
//! NOT_COORDINATOR. Partitions of topics the metadata does not know are answered
//! UNKNOWN_TOPIC_OR_PARTITION and not committed; the rest go ahead.
//!
//! v5 is transaction version 2 (KIP-890 part 2): the client sends no AddOffsetsToTxn,
//! so the group's offsets partition joins the producer's transaction here, through the
//! transaction coordinator (AddPartitionsToTxn v4 when it is on another broker), before
//! the commit; its refusal is every partition's code, mapped as Kafka's group
//! coordinator maps it (CONCURRENT_TRANSACTIONS is the client's to retry).
//!
//! v6 names topics by id (`protocol::newer`): an id this broker does not know is
//! UNKNOWN_TOPIC_ID (after the transactional id's and the group's authorization).
//!
//! Not done yet: KIP-890 part 1's check for v4 and below (that the producer added the
//! group's offsets partition with AddOffsetsToTxn).

use bytes::Bytes;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, TxnOffsetCommitRequest, TxnOffsetCommitResponse};

use crate::config::FsyncMode;
use crate::group::OffsetCommit;
use crate::log::LogError;
use crate::protocol::{decode_body, decode_newer_body, error_code, newer, ProtocolError, RequestFrame};
use crate::shard::{group_partition, GroupOp, GroupReply, PartitionError, TxnCommitRefusal};
use crate::txn::coordinator::ProducerIdAndEpoch;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::offset_commit::replication_failure;
use super::{group_error_code, partition_error_code, respond, respond_newer};

/// The code for a transactional commit whose batch was not appended, as Kafka's
/// `GroupMetadataManager.storeOffsets` maps its append's errors.
fn append_error_code(e: &PartitionError) -> i16 {
    match e {
        PartitionError::UnknownTopicOrPartition(_) | PartitionError::NotEnoughReplicas { .. } => {
            error_code::COORDINATOR_NOT_AVAILABLE
        }
        PartitionError::NotLeader(_) => error_code::NOT_COORDINATOR,
        PartitionError::Log(LogError::MessageTooLarge { .. }) => error_code::INVALID_COMMIT_OFFSET_SIZE,
        other => partition_error_code(other),
    }
}

/// The first TxnOffsetCommit version of transaction version 2.
const first_v2_version: i16 = 5;

/// The code for a commit whose offsets partition the transaction coordinator did not
/// add, as Kafka's group coordinator maps it.
fn add_error_code(code: i16) -> i16 {
    match code {
        error_code::PRODUCER_FENCED => error_code::INVALID_PRODUCER_EPOCH,
        error_code::NETWORK_EXCEPTION => error_code::COORDINATOR_LOAD_IN_PROGRESS,
        error_code::COORDINATOR_LOAD_IN_PROGRESS
        | error_code::COORDINATOR_NOT_AVAILABLE
        | error_code::NOT_COORDINATOR
        | error_code::UNKNOWN_TOPIC_OR_PARTITION => error_code::COORDINATOR_NOT_AVAILABLE,
        other => other,
    }
}

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let by_id = frame.api_version >= 6;
    let (mut req, ids): (TxnOffsetCommitRequest, Vec<uuid::Uuid>) = if by_id {
        decode_newer_body(frame, newer::decode_txn_offset_commit_v6)?
    } else {
        (decode_body(frame)?, Vec::new())
    };
    if by_id {
        let view = ctx.view();
        req.topics.iter_mut().zip(&ids).for_each(|(t, id)| t.name = super::name_topic_by_id(&view, *id));
    }
    // Per request partition, in order: does the metadata know it?
    let known: Vec<bool> = {
        let reg = ctx.view();
        req.topics
            .iter()
            .flat_map(|t| {
                let partitions = reg.get(t.name.as_str()).map(|m| m.partitions).unwrap_or(0);
                t.partitions.iter().map(move |p| p.partition_index >= 0 && p.partition_index < partitions)
            })
            .collect()
    };
    // Authorization (Kafka's handleOffsetCommitRequest): READ on the group for the
    // whole request, READ on each topic for its partitions.
    let view = ctx.view();
    let txn_denied = !super::authz::authorize(
        ctx,
        frame,
        &view,
        crate::security::acl::AclOperation::Write,
        crate::security::acl::ResourceType::TransactionalId,
        req.transactional_id.as_str(),
    );
    let group_denied = !super::authz::authorize(
        ctx,
        frame,
        &view,
        crate::security::acl::AclOperation::Read,
        crate::security::acl::ResourceType::Group,
        req.group_id.as_str(),
    );
    let refused: Vec<Option<i16>> = req
        .topics
        .iter()
        .flat_map(|t| {
            let code = if txn_denied {
                Some(error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            } else if group_denied {
                Some(error_code::GROUP_AUTHORIZATION_FAILED)
            } else if by_id && t.name.is_empty() {
                Some(error_code::UNKNOWN_TOPIC_ID)
            } else if !super::authz::authorize(
                ctx,
                frame,
                &view,
                crate::security::acl::AclOperation::Read,
                crate::security::acl::ResourceType::Topic,
                t.name.as_str(),
            ) {
                Some(error_code::TOPIC_AUTHORIZATION_FAILED)
            } else {
                None
            };
            t.partitions.iter().map(move |_| code)
        })
        .collect();
    let known: Vec<bool> = known.iter().zip(&refused).map(|(k, r)| *k && r.is_none()).collect();
    let mut refused = refused.into_iter();
    let nr_known = known.iter().filter(|k| **k).count();
    let mut is_known = known.iter().copied();
    let offsets: Vec<OffsetCommit> = req
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
        .filter(|_| is_known.next().unwrap_or(false))
        .map(|(t, p)| OffsetCommit {
            topic: t.name.to_string(),
            partition: p.partition_index,
            offset: p.committed_offset,
            leader_epoch: p.committed_leader_epoch,
            metadata: p.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default(),
        })
        .collect();
    // v0-v2 carry no member: the decoder leaves member id "", no instance, generation -1.
    let op = GroupOp::TxnCommit {
        group_id: req.group_id.to_string(),
        producer_id: req.producer_id.0,
        producer_epoch: req.producer_epoch,
        member_id: req.member_id.to_string(),
        instance: req.group_instance_id.as_ref().map(|s| s.to_string()),
        generation: req.generation_id,
        offsets,
        now_ms: now_ms(),
        durable: ctx.config.fsync == FsyncMode::Always,
    };
    let added = if nr_known > 0 && frame.api_version >= first_v2_version && !req.transactional_id.is_empty() {
        let producer = ProducerIdAndEpoch { producer_id: req.producer_id.0, epoch: req.producer_epoch };
        let tp = group_partition(req.group_id.as_str());
        let (code, why) =
            super::produce::ask_coordinator(ctx, req.transactional_id.as_str(), producer, &tp, true).await;
        if code != error_code::NONE {
            tracing::debug!(
                group = req.group_id.as_str(),
                transactional_id = req.transactional_id.as_str(),
                code,
                why,
                "offsets partition not added to the transaction"
            );
        }
        add_error_code(code)
    } else {
        error_code::NONE
    };
    let codes: Vec<i16> = if nr_known == 0 {
        Vec::new() // nothing to commit: the group is not consulted (as Kafka)
    } else if added != error_code::NONE {
        vec![added; nr_known]
    } else {
        match ctx.call_group(op, None).await {
            Some(GroupReply::TxnCommit { results: Ok(results), waits, replicated }) => {
                let failed = if !super::writes_succeeded(waits).await {
                    Some(error_code::COORDINATOR_NOT_AVAILABLE)
                } else {
                    match replicated {
                        None => None,
                        Some(wait) => replication_failure(wait).await,
                    }
                };
                results
                    .iter()
                    .map(|r| match (r, failed) {
                        (_, Some(code)) => code,
                        (Ok(()), None) => error_code::NONE,
                        (Err(e), None) => group_error_code(e),
                    })
                    .collect()
            }
            Some(GroupReply::TxnCommit { results: Err(TxnCommitRefusal::Group(e)), .. }) => {
                vec![group_error_code(&e); nr_known]
            }
            Some(GroupReply::TxnCommit { results: Err(TxnCommitRefusal::Append(e)), .. }) => {
                vec![append_error_code(&e); nr_known]
            }
            other => vec![ctx.group_unavailable_code(req.group_id.as_str(), &other); nr_known],
        }
    };
    let mut codes = codes.into_iter();
    let mut known = known.into_iter();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        TxnOffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(match (known.next(), refused.next().flatten()) {
                                (_, Some(code)) => code,
                                (Some(true), None) => codes.next().unwrap_or(error_code::UNKNOWN_SERVER_ERROR),
                                _ => error_code::UNKNOWN_TOPIC_OR_PARTITION,
                            })
                    })
                    .collect(),
            )
        })
        .collect();
    let answer = TxnOffsetCommitResponse::default().with_topics(topics);
    if by_id {
        return respond_newer(ApiKey::TxnOffsetCommit, frame, |buf| {
            newer::encode_txn_offset_commit_response_v6(&answer, &ids, buf)
        });
    }
    respond(ApiKey::TxnOffsetCommit, frame, &answer)
}
