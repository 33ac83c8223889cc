//! TxnOffsetCommit (v0-v4): a transactional producer commits a group's offsets inside
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
//! Not done yet: Kafka's check, with the transaction coordinator, that the producer
//! added the group's offsets partition to its transaction (AddOffsetsToTxn; KIP-890
//! part 1's verification), and v5 (KIP-890 part 2).

use bytes::Bytes;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ApiKey, TxnOffsetCommitRequest, TxnOffsetCommitResponse};

use crate::config::FsyncMode;
use crate::group::OffsetCommit;
use crate::log::LogError;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply, PartitionError, TxnCommitRefusal};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::offset_commit::{merge, requested, screen, settle};
use super::{group_error_code, partition_error_code, respond};

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

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: TxnOffsetCommitRequest = decode_body(frame)?;
    let offsets: Vec<OffsetCommit> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                let metadata = p.committed_metadata.as_deref();
                requested(&t.name, p.partition_index, p.committed_offset, p.committed_leader_epoch, metadata)
            })
        })
        .collect();
    // Kafka's handleTxnOffsetCommitRequest: WRITE on the transactional id first.
    let whole = (!super::authz::may_write_transactional_id(ctx, frame, req.transactional_id.as_str()))
        .then_some(error_code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    let (refused, offsets) = screen(ctx, frame, req.group_id.as_str(), whole, offsets);
    let nr_accepted = offsets.len();
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
    let codes: Vec<i16> = if nr_accepted == 0 {
        Vec::new() // nothing to commit: the group is not consulted (as Kafka)
    } else {
        match ctx.call_group(op, None).await {
            Some(GroupReply::TxnCommit { results: Ok(results), waits, replicated }) => {
                settle(&results, waits, replicated).await
            }
            Some(GroupReply::TxnCommit { results: Err(TxnCommitRefusal::Group(e)), .. }) => {
                vec![group_error_code(&e); nr_accepted]
            }
            Some(GroupReply::TxnCommit { results: Err(TxnCommitRefusal::Append(e)), .. }) => {
                vec![append_error_code(&e); nr_accepted]
            }
            other => vec![ctx.group_unavailable_code(req.group_id.as_str(), &other); nr_accepted],
        }
    };
    let mut codes = merge(refused, codes).into_iter();
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
                            .with_error_code(codes.next().unwrap_or(error_code::UNKNOWN_SERVER_ERROR))
                    })
                    .collect(),
            )
        })
        .collect();
    respond(ApiKey::TxnOffsetCommit, frame, &TxnOffsetCommitResponse::default().with_topics(topics))
}
