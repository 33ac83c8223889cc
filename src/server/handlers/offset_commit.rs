//! OffsetCommit: validated by the group's coordinator, written to `__consumer_offsets`
//! (and fsynced first under `--fsync always`) with acks=all, as Kafka writes offsets:
//! the answer waits until the partition's in-sync replicas have the commit, so an
//! acknowledged commit survives the loss of the coordinator's broker. The coordinator
//! serves OffsetFetch from memory, where the commit is applied at once. A partition
//! of a topic the metadata does not know (or past its partition count) is answered
//! UNKNOWN_TOPIC_OR_PARTITION and not committed, as Kafka does; the rest go ahead.

use bytes::Bytes;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};

use crate::config::FsyncMode;
use crate::group::{GroupError, OffsetCommit};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::{DurableWait, GroupOp, GroupReply, ReplicatedWait};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: OffsetCommitRequest = decode_body(frame)?;
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
    let (refused, offsets) = screen(ctx, frame, req.group_id.as_str(), None, offsets);
    let nr_accepted = offsets.len();
    let op = GroupOp::Commit {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        instance: req.group_instance_id.as_ref().map(|s| s.to_string()),
        generation: req.generation_id_or_member_epoch,
        offsets,
        now_ms: now_ms(),
        durable: ctx.config.fsync == FsyncMode::Always,
    };
    // One code for every accepted partition, or one per accepted partition.
    let codes: Vec<i16> = if nr_accepted == 0 {
        Vec::new() // nothing to commit: the group is not consulted (as Kafka)
    } else {
        match ctx.call_group(op, None).await {
            Some(GroupReply::Commit { results: Ok(results), waits, replicated }) => {
                settle(&results, waits, replicated).await
            }
            Some(GroupReply::Commit { results: Err(Some(e)), .. }) => vec![group_error_code(&e); nr_accepted],
            other => vec![ctx.group_unavailable_code(req.group_id.as_str(), &other); nr_accepted],
        }
    };
    let mut codes = merge(refused, codes).into_iter();
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

/// One requested partition's commit, from an (Txn)OffsetCommit request's fields.
pub(super) fn requested(
    topic: &str,
    partition: i32,
    offset: i64,
    leader_epoch: i32,
    metadata: Option<&str>,
) -> OffsetCommit {
    OffsetCommit {
        topic: topic.to_string(),
        partition,
        offset,
        leader_epoch,
        metadata: metadata.map(str::to_string).unwrap_or_default(),
    }
}

/// Split an (Txn)OffsetCommit request's partitions, in request order, into those
/// refused before the group is asked (their codes, `None` for the others) and those
/// that go to the group. Kafka's order: `whole` (a code for the whole request, such as
/// a denied transactional id), READ on the group, READ on each topic
/// (TOPIC_AUTHORIZATION_FAILED), then a topic the metadata does not know or a
/// partition past its count (UNKNOWN_TOPIC_OR_PARTITION).
pub(super) fn screen(
    ctx: &ShardContext,
    frame: &RequestFrame,
    group_id: &str,
    whole: Option<i16>,
    offsets: Vec<OffsetCommit>,
) -> (Vec<Option<i16>>, Vec<OffsetCommit>) {
    let whole = whole.or_else(|| {
        (!super::authz::may_read_group(ctx, frame, group_id)).then_some(error_code::GROUP_AUTHORIZATION_FAILED)
    });
    let view = ctx.view();
    // A request lists each topic's partitions together: one check (and one denial
    // logged) per topic.
    let mut topic_read: Option<(String, bool)> = None;
    let mut refused = Vec::with_capacity(offsets.len());
    let mut accepted = Vec::with_capacity(offsets.len());
    for o in offsets {
        let readable = match &topic_read {
            Some((topic, readable)) if *topic == o.topic => *readable,
            _ => {
                let readable = whole.is_some()
                    || super::authz::authorize(ctx, frame, &view, AclOperation::Read, ResourceType::Topic, &o.topic);
                topic_read = Some((o.topic.clone(), readable));
                readable
            }
        };
        let partitions = view.get(&o.topic).map(|m| m.partitions).unwrap_or(0);
        let code = if whole.is_some() {
            whole
        } else if !readable {
            Some(error_code::TOPIC_AUTHORIZATION_FAILED)
        } else if o.partition < 0 || o.partition >= partitions {
            Some(error_code::UNKNOWN_TOPIC_OR_PARTITION)
        } else {
            None
        };
        if code.is_none() {
            accepted.push(o);
        }
        refused.push(code);
    }
    (refused, accepted)
}

/// The per-partition codes of a commit the group accepted: its own, once the records
/// are written (fsynced under `--fsync always`) and replicated, or the code of the
/// write or replication that failed for all of them.
pub(super) async fn settle(
    results: &[Result<(), GroupError>],
    waits: Vec<DurableWait>,
    replicated: Option<ReplicatedWait>,
) -> Vec<i16> {
    let mut flushed = true;
    for wait in waits {
        flushed &= matches!(wait.await, Ok(Ok(())));
    }
    let failed = if !flushed {
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

/// Every partition's code in request order: its refusal, or the next of the group's
/// `codes` (which answer the accepted partitions, in order).
pub(super) fn merge(refused: Vec<Option<i16>>, codes: Vec<i16>) -> Vec<i16> {
    let mut codes = codes.into_iter();
    refused.into_iter().map(|r| r.unwrap_or_else(|| codes.next().unwrap_or(error_code::UNKNOWN_SERVER_ERROR))).collect()
}

/// Kafka's `offsets.commit.timeout.ms` default: how long a commit waits for the in-sync
/// replicas of its offsets partition.
const offsets_commit_timeout_ms: u64 = 5_000;

/// Wait for the in-sync replicas to have a commit; the error to answer if they do not,
/// mapped as Kafka's group coordinator maps append errors: too few replicas means the
/// coordinator is not available (retry), a moved partition that it is not the
/// coordinator any more (find the new one).
pub(super) async fn replication_failure(wait: crate::shard::ReplicatedWait) -> Option<i16> {
    use futures::future::{select, Either};
    let timer = Box::pin(glommio::timer::sleep(std::time::Duration::from_millis(offsets_commit_timeout_ms)));
    match select(wait, timer).await {
        Either::Left((Ok(Ok(())), _)) => None,
        Either::Left((Ok(Err(error_code::NOT_LEADER_OR_FOLLOWER)), _)) | Either::Left((Err(_), _)) => {
            Some(error_code::NOT_COORDINATOR)
        }
        Either::Left((Ok(Err(_)), _)) => Some(error_code::COORDINATOR_NOT_AVAILABLE),
        Either::Right(_) => Some(error_code::REQUEST_TIMED_OUT),
    }
}
