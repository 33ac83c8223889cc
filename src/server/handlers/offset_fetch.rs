//! OffsetFetch: committed offsets of one group (v1-7) or several (v8+); all partitions
//! the group committed when no topics are named. -1 means "no committed offset".

use bytes::Bytes;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{ApiKey, GroupId, OffsetFetchRequest, OffsetFetchResponse, TopicName};

use crate::protocol::{decode_body, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply, OffsetList};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

async fn fetch(ctx: &ShardContext, group: &str, partitions: Option<Vec<(String, i32)>>) -> Result<OffsetList, i16> {
    match ctx.call_group(GroupOp::FetchOffsets { group_id: group.to_string(), partitions }, None).await {
        Some(GroupReply::Offsets(list)) => Ok(list),
        other => Err(ctx.group_unavailable_code(group, &other)),
    }
}

/// Group the flat list by topic, in first-seen order.
fn by_topic(list: OffsetList) -> Vec<(String, Vec<(i32, i64, i32, String)>)> {
    let mut out: Vec<(String, Vec<(i32, i64, i32, String)>)> = Vec::new();
    for (topic, partition, o) in list {
        let entry = match o {
            Some(o) => (partition, o.offset, o.leader_epoch, o.metadata),
            None => (partition, -1, -1, String::new()),
        };
        match out.iter_mut().find(|(t, _)| *t == topic) {
            Some((_, v)) => v.push(entry),
            None => out.push((topic, vec![entry])),
        }
    }
    out
}

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: OffsetFetchRequest = decode_body(frame)?;
    let v = frame.api_version;
    let mut body = OffsetFetchResponse::default();
    if v >= 8 {
        for g in &req.groups {
            let wanted = g.topics.as_ref().map(|ts| {
                ts.iter().flat_map(|t| t.partition_indexes.iter().map(move |p| (t.name.to_string(), *p))).collect()
            });
            let mut group = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
            match fetch(ctx, g.group_id.as_str(), wanted).await {
                Ok(list) => {
                    group.topics = by_topic(list)
                        .into_iter()
                        .map(|(t, ps)| {
                            OffsetFetchResponseTopics::default().with_name(TopicName(str_bytes(t))).with_partitions(
                                ps.into_iter()
                                    .map(|(p, off, epoch, meta)| {
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(off)
                                            .with_committed_leader_epoch(epoch)
                                            .with_metadata(Some(str_bytes(meta)))
                                    })
                                    .collect(),
                            )
                        })
                        .collect();
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
        match fetch(ctx, group.as_str(), wanted).await {
            Ok(list) => {
                body.topics = by_topic(list)
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchResponseTopic::default().with_name(TopicName(str_bytes(t))).with_partitions(
                            ps.into_iter()
                                .map(|(p, off, epoch, meta)| {
                                    let r = OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(off)
                                        .with_metadata(Some(str_bytes(meta)));
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
    respond(ApiKey::OffsetFetch, frame, &body)
}
