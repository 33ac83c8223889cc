//! OffsetCommit: validated by the group's coordinator, written to `__consumer_offsets`
//! (and fsynced first under `--fsync always`), then visible to OffsetFetch.

use bytes::Bytes;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};

use crate::config::FsyncMode;
use crate::group::OffsetCommit;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: OffsetCommitRequest = decode_body(frame)?;
    let offsets: Vec<OffsetCommit> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| OffsetCommit {
                topic: t.name.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default(),
            })
        })
        .collect();
    let op = GroupOp::Commit {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        instance: req.group_instance_id.as_ref().map(|s| s.to_string()),
        generation: req.generation_id_or_member_epoch,
        offsets,
        now_ms: now_ms(),
        durable: ctx.config.fsync == FsyncMode::Always,
    };
    // One code for every partition, or one per partition.
    let codes: Vec<i16> = match ctx.call_group(op, None).await {
        Some(GroupReply::Commit { results: Ok(results), waits }) => {
            // Written (io_uring), and fsynced under --fsync always, before the answer.
            let mut flushed = true;
            for wait in waits {
                flushed &= matches!(wait.await, Ok(Ok(())));
            }
            results
                .iter()
                .map(|r| match r {
                    _ if !flushed => error_code::COORDINATOR_NOT_AVAILABLE,
                    Ok(()) => error_code::NONE,
                    Err(e) => group_error_code(e),
                })
                .collect()
        }
        Some(GroupReply::Commit { results: Err(Some(e)), .. }) => vec![group_error_code(&e); count(&req)],
        _ => vec![ctx.group_unavailable_code(req.group_id.as_str()); count(&req)],
    };
    let mut codes = codes.into_iter();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        OffsetCommitResponsePartition::default()
                            .with_partition_index(p.partition_index)
                            .with_error_code(codes.next().unwrap_or(error_code::UNKNOWN_SERVER_ERROR))
                    })
                    .collect(),
            )
        })
        .collect();
    respond(ApiKey::OffsetCommit, frame, &OffsetCommitResponse::default().with_topics(topics))
}

fn count(req: &OffsetCommitRequest) -> usize {
    req.topics.iter().map(|t| t.partitions.len()).sum()
}
