//! OffsetCommit: validated by the group's coordinator, written to `__consumer_offsets`
//! (and fsynced first under `--fsync always`) with acks=all, as Kafka writes offsets:
//! the answer waits until the partition's in-sync replicas have the commit, so an
//! acknowledged commit survives the loss of the coordinator's broker. The coordinator
//! serves OffsetFetch from memory, where the commit is applied at once. A partition
//! of a topic the metadata does not know (or past its partition count) is answered
//! UNKNOWN_TOPIC_OR_PARTITION and not committed, as Kafka does; the rest go ahead.
//! v10 names topics by id (`protocol::newer`): an id this broker does not know is
//! UNKNOWN_TOPIC_ID (after the group's authorization, before the topic's).

use bytes::Bytes;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::{ApiKey, OffsetCommitRequest, OffsetCommitResponse};

use crate::config::FsyncMode;
use crate::group::OffsetCommit;
use crate::protocol::{decode_body, decode_newer_body, error_code, newer, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{group_error_code, respond, respond_newer};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let by_id = frame.api_version >= 10;
    let mut req: OffsetCommitRequest =
        if by_id { decode_newer_body(frame, newer::decode_offset_commit_v10)? } else { decode_body(frame)? };
    if by_id {
        let view = ctx.view();
        req.topics.iter_mut().for_each(|t| t.name = super::name_topic_by_id(&view, t.topic_id));
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
            let code = if group_denied {
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
    let op = GroupOp::Commit {
        group_id: req.group_id.to_string(),
        member_id: req.member_id.to_string(),
        instance: req.group_instance_id.as_ref().map(|s| s.to_string()),
        generation: req.generation_id_or_member_epoch,
        offsets,
        now_ms: now_ms(),
        durable: ctx.config.fsync == FsyncMode::Always,
        member_epochs: frame.api_version >= 9,
    };
    // One code for every known partition, or one per known partition.
    let codes: Vec<i16> = if nr_known == 0 {
        Vec::new() // nothing to commit: the group is not consulted (as Kafka)
    } else {
        match ctx.call_group(op, None).await {
            Some(GroupReply::Commit { results: Ok(results), waits, replicated }) => {
                // Written (io_uring), and fsynced under --fsync always, before the answer.
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
            Some(GroupReply::Commit { results: Err(Some(e)), .. }) => vec![group_error_code(&e); nr_known],
            other => vec![ctx.group_unavailable_code(req.group_id.as_str(), &other); nr_known],
        }
    };
    let mut codes = codes.into_iter();
    let mut known = known.into_iter();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_topic_id(t.topic_id).with_partitions(
                t.partitions
                    .iter()
                    .map(|p| {
                        OffsetCommitResponsePartition::default()
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
    let answer = OffsetCommitResponse::default().with_topics(topics);
    if by_id {
        return respond_newer(ApiKey::OffsetCommit, frame, |buf| {
            newer::encode_offset_commit_response_v10(&answer, buf)
        });
    }
    respond(ApiKey::OffsetCommit, frame, &answer)
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
