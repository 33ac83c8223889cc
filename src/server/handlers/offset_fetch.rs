//! OffsetFetch: committed offsets of one group (v1-7) or several (v8+); all partitions
//! the group committed when no topics are named. -1 means "no committed offset".
//! Offsets of open transactions are never shown; with `require_stable` (v7+, sent by
//! read_committed consumers, KIP-447) a partition that has one is answered
//! UNSTABLE_OFFSET_COMMIT (offset -1), which the client retries. v9 (KIP-848): a member
//! of a consumer group must fetch at its member epoch (STALE_MEMBER_EPOCH, or
//! UNKNOWN_MEMBER_ID, for the group). v10 names topics by id (`protocol::newer`): an id
//! this broker does not know is answered UNKNOWN_TOPIC_ID for each partition asked, and
//! an all-partitions answer leaves out topics that no longer exist (they have no id).

use bytes::Bytes;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{ApiKey, GroupId, OffsetFetchRequest, OffsetFetchResponse, TopicName};

use crate::protocol::{decode_body, decode_newer_body, error_code, newer, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply, OffsetList};

use super::super::context::ShardContext;
use super::{authz, group_error_code, respond, respond_newer, str_bytes};

/// Authorization (Kafka's handleOffsetFetchRequest): DESCRIBE on the group, else
/// GROUP_AUTHORIZATION_FAILED; a named partition of a topic the principal may not
/// DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED, and such topics are left out of an
/// all-partitions answer.
async fn fetch(
    ctx: &ShardContext,
    frame: &RequestFrame,
    group: &str,
    partitions: Option<Vec<(String, i32)>>,
    require_stable: bool,
    member: Option<(String, i32)>,
) -> Result<Vec<(String, Vec<PartitionAnswer>)>, i16> {
    use crate::security::acl::{AclOperation, ResourceType};
    let view = ctx.view();
    if !authz::authorize(ctx, frame, &view, AclOperation::Describe, ResourceType::Group, group) {
        return Err(error_code::GROUP_AUTHORIZATION_FAILED);
    }
    let named = partitions.is_some();
    let op = GroupOp::FetchOffsets { group_id: group.to_string(), partitions, require_stable, member };
    let list = match ctx.call_group(op, None).await {
        Some(GroupReply::Offsets(Ok(list))) => list,
        Some(GroupReply::Offsets(Err(e))) => return Err(group_error_code(&e)),
        other => return Err(ctx.group_unavailable_code(group, &other)),
    };
    let mut topics = by_topic(list);
    if authz::enabled(ctx) {
        topics.retain_mut(|(topic, partitions)| {
            let allowed = if named {
                authz::authorize(ctx, frame, &view, AclOperation::Describe, ResourceType::Topic, topic)
            } else {
                authz::authorize_quietly(ctx, frame, &view, AclOperation::Describe, ResourceType::Topic, topic)
            };
            if !allowed {
                for p in partitions.iter_mut() {
                    *p = (p.0, -1, -1, String::new(), error_code::TOPIC_AUTHORIZATION_FAILED);
                }
            }
            allowed || named
        });
    }
    Ok(topics)
}

/// One partition's answer: (partition, offset, leader epoch, metadata, error code).
type PartitionAnswer = (i32, i64, i32, String, i16);

/// Group the flat list by topic, in first-seen order.
fn by_topic(list: OffsetList) -> Vec<(String, Vec<PartitionAnswer>)> {
    let mut out: Vec<(String, Vec<PartitionAnswer>)> = Vec::new();
    for (topic, partition, o) in list {
        let entry = match o {
            Ok(Some(o)) => (partition, o.offset, o.leader_epoch, o.metadata, error_code::NONE),
            Ok(None) => (partition, -1, -1, String::new(), error_code::NONE),
            Err(e) => (partition, -1, -1, String::new(), group_error_code(&e)),
        };
        match out.iter_mut().find(|(t, _)| *t == topic) {
            Some((_, v)) => v.push(entry),
            None => out.push((topic, vec![entry])),
        }
    }
    out
}

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let v = frame.api_version;
    let by_id = v >= 10;
    let mut req: OffsetFetchRequest =
        if by_id { decode_newer_body(frame, newer::decode_offset_fetch_v10)? } else { decode_body(frame)? };
    let mut body = OffsetFetchResponse::default();
    if v >= 8 {
        for g in &mut req.groups {
            // v10: topics by id; those this broker does not know are answered here.
            let mut unknown = Vec::new();
            if by_id {
                let view = ctx.view();
                for t in g.topics.iter_mut().flatten() {
                    t.name = super::name_topic_by_id(&view, t.topic_id);
                }
                g.topics.iter_mut().flatten().filter(|t| t.name.is_empty()).for_each(|t| {
                    unknown.push(unknown_topic_id(t.topic_id, &t.partition_indexes));
                });
                if let Some(ts) = g.topics.as_mut() {
                    ts.retain(|t| !t.name.is_empty())
                }
            }
            let wanted = g.topics.as_ref().map(|ts| {
                ts.iter().flat_map(|t| t.partition_indexes.iter().map(move |p| (t.name.to_string(), *p))).collect()
            });
            let mut group = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
            // v9 (KIP-848): a consumer group's member names itself and its epoch; the
            // admin client and older clients send no member id and epoch -1.
            let member = match (&g.member_id, g.member_epoch) {
                (Some(id), epoch) if v >= 9 && !(id.is_empty() && epoch < 0) => Some((id.to_string(), epoch)),
                _ => None,
            };
            match fetch(ctx, frame, g.group_id.as_str(), wanted, req.require_stable, member).await {
                Ok(list) => {
                    group.topics = list
                        .into_iter()
                        .map(|(t, ps)| {
                            OffsetFetchResponseTopics::default().with_name(TopicName(str_bytes(t))).with_partitions(
                                ps.into_iter()
                                    .map(|(p, off, epoch, meta, code)| {
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(off)
                                            .with_committed_leader_epoch(epoch)
                                            .with_metadata(Some(str_bytes(meta)))
                                            .with_error_code(code)
                                    })
                                    .collect(),
                            )
                        })
                        .collect();
                    if by_id {
                        let view = ctx.view();
                        group.topics.iter_mut().for_each(|t| t.topic_id = super::topic_id_of(&view, &t.name));
                        group.topics.retain(|t| !t.topic_id.is_nil());
                        group.topics.extend(unknown);
                    }
                }
                Err(code) => group.error_code = code,
            }
            body.groups.push(group);
        }
    } else {
        let group: &GroupId = &req.group_id;
        let wanted = req.topics.as_ref().map(|ts| {
            ts.iter().flat_map(|t| t.partition_indexes.iter().map(move |p| (t.name.to_string(), *p))).collect()
        });
        // require_stable is a v7 field (false when decoded at older versions).
        match fetch(ctx, frame, group.as_str(), wanted, v >= 7 && req.require_stable, None).await {
            Ok(list) => {
                body.topics = list
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchResponseTopic::default().with_name(TopicName(str_bytes(t))).with_partitions(
                            ps.into_iter()
                                .map(|(p, off, epoch, meta, code)| {
                                    let r = OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(off)
                                        .with_metadata(Some(str_bytes(meta)))
                                        .with_error_code(code);
                                    if v >= 5 {
                                        r.with_committed_leader_epoch(epoch)
                                    } else {
                                        r
                                    }
                                })
                                .collect(),
                        )
                    })
                    .collect();
            }
            Err(code) if v >= 2 => body.error_code = code,
            Err(_) => {}
        }
    }
    if by_id {
        return respond_newer(ApiKey::OffsetFetch, frame, |buf| newer::encode_offset_fetch_response_v10(&body, buf));
    }
    respond(ApiKey::OffsetFetch, frame, &body)
}

/// v10: the answer for a topic id this broker does not know (Kafka 4.4's: no offset, an
/// empty metadata string, UNKNOWN_TOPIC_ID).
fn unknown_topic_id(id: uuid::Uuid, partitions: &[i32]) -> OffsetFetchResponseTopics {
    OffsetFetchResponseTopics::default().with_topic_id(id).with_partitions(
        partitions
            .iter()
            .map(|p| {
                OffsetFetchResponsePartitions::default()
                    .with_partition_index(*p)
                    .with_committed_offset(-1)
                    .with_committed_leader_epoch(-1)
                    .with_metadata(Some(str_bytes(String::new())))
                    .with_error_code(error_code::UNKNOWN_TOPIC_ID)
            })
            .collect(),
    )
}
