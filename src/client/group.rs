//! The consumer group APIs: coordinator lookup, membership (join, sync, heartbeat,
//! leave), offset commit and fetch, and the admin views (list, describe).

use std::collections::BTreeMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartitions;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, DescribeGroupsRequest, FindCoordinatorRequest, GroupId,
    HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest,
    SyncGroupRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable};

use super::{check, sb, topic_name, Client, Error};

/// Kafka's MEMBER_ID_REQUIRED: the first JoinGroup of a new member (v4+) is answered
/// with a member id to join again with.
const member_id_required: i16 = 79;
/// The only assignor this client offers: every partition to the leader's choice.
pub const assignor_name: &str = "range";
/// Most JoinGroup rounds before giving up (each MEMBER_ID_REQUIRED costs one).
const join_rounds_max: u32 = 3;

/// A member id and its assigned partitions (topic, partition indexes).
pub type MemberAssignment = (String, Vec<(String, Vec<i32>)>);

#[derive(Clone, Debug, serde::Serialize)]
pub struct ListedGroup {
    pub group: String,
    pub state: String,
    pub protocol_type: String,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct GroupMember {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    /// (topic, partitions) this member owns.
    pub assignment: Vec<(String, Vec<i32>)>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct GroupDescription {
    pub group: String,
    pub state: String,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<GroupMember>,
}

/// The outcome of JoinGroup for this member.
#[derive(Clone, Debug)]
pub struct Joined {
    pub generation_id: i32,
    pub member_id: String,
    pub leader: String,
    pub protocol_name: String,
    /// Every member with its subscribed topics (filled only for the leader).
    pub members: Vec<(String, Vec<String>)>,
}

fn group_id(g: &str) -> GroupId {
    GroupId(sb(g))
}

/// ConsumerProtocolAssignment with its version prefix.
fn decode_assignment(mut buf: Bytes) -> Vec<(String, Vec<i32>)> {
    if buf.len() < 2 {
        return Vec::new();
    }
    let version = buf.get_i16().clamp(0, 3);
    if crate::protocol::shape::check_embedded(&crate::protocol::shape::CONSUMER_PROTOCOL_ASSIGNMENT, version, &buf)
        .is_err()
    {
        return Vec::new();
    }
    match ConsumerProtocolAssignment::decode(&mut buf, version) {
        Ok(a) => a.assigned_partitions.into_iter().map(|tp| (tp.topic.to_string(), tp.partitions)).collect(),
        Err(_) => Vec::new(),
    }
}

fn encode_assignment(parts: &[(String, Vec<i32>)]) -> Result<Bytes, Error> {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(
        parts
            .iter()
            .map(|(t, ps)| AssignedPartitions::default().with_topic(topic_name(t)).with_partitions(ps.clone()))
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    a.encode(&mut buf, 0).map_err(|e| Error::Protocol(format!("encoding an assignment: {e}")))?;
    Ok(buf.freeze())
}

fn decode_subscription(mut buf: Bytes) -> Vec<String> {
    if buf.len() < 2 {
        return Vec::new();
    }
    let version = buf.get_i16().clamp(0, 3);
    if crate::protocol::shape::check_embedded(&crate::protocol::shape::CONSUMER_PROTOCOL_SUBSCRIPTION, version, &buf)
        .is_err()
    {
        return Vec::new();
    }
    match ConsumerProtocolSubscription::decode(&mut buf, version) {
        Ok(s) => s.topics.into_iter().map(|t| t.to_string()).collect(),
        Err(_) => Vec::new(),
    }
}

fn encode_subscription(topics: &[String]) -> Result<Bytes, Error> {
    let s = ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| sb(t)).collect());
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    s.encode(&mut buf, 0).map_err(|e| Error::Protocol(format!("encoding a subscription: {e}")))?;
    Ok(buf.freeze())
}

impl Client {
    /// The coordinator of `group` (cached until a retry clears it).
    pub fn coordinator(&mut self, group: &str) -> Result<i32, Error> {
        if let Some(&node) = self.coordinators.get(group) {
            return Ok(node);
        }
        let req = FindCoordinatorRequest::default().with_key(sb(group)).with_key_type(0);
        let (_, resp) = self.send_any(&req)?;
        check(|| format!("find coordinator of group '{group}'"), resp.error_code, resp.error_message.as_ref())?;
        let node = resp.node_id.0;
        self.brokers.insert(node, format!("{}:{}", resp.host, resp.port));
        self.coordinators.insert(group.to_string(), node);
        Ok(node)
    }

    fn send_coordinator<R: kafka_protocol::protocol::Request>(
        &mut self,
        group: &str,
        req: &R,
    ) -> Result<(i16, R::Response), Error> {
        let node = self.coordinator(group)?;
        self.send_to(node, req)
    }

    /// Join `group` as a consumer subscribed to `topics` (repeating the join once
    /// when the broker hands out a member id first).
    pub fn join_group(
        &mut self,
        group: &str,
        member_id: &str,
        topics: &[String],
        session_timeout_ms: i32,
        rebalance_timeout_ms: i32,
    ) -> Result<Joined, Error> {
        let metadata = encode_subscription(topics)?;
        let mut member_id = member_id.to_string();
        for _ in 0..join_rounds_max {
            let req = JoinGroupRequest::default()
                .with_group_id(group_id(group))
                .with_session_timeout_ms(session_timeout_ms)
                .with_rebalance_timeout_ms(rebalance_timeout_ms)
                .with_member_id(sb(&member_id))
                .with_protocol_type(sb("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default()
                    .with_name(sb(assignor_name))
                    .with_metadata(metadata.clone())]);
            let resp = self.with_retries(|c| {
                let (_, resp) = c.send_coordinator(group, &req)?;
                if resp.error_code != member_id_required {
                    check(|| format!("join group '{group}'"), resp.error_code, None)?;
                }
                Ok(resp)
            })?;
            if resp.error_code == member_id_required {
                member_id = resp.member_id.to_string();
                continue;
            }
            return Ok(Joined {
                generation_id: resp.generation_id,
                member_id: resp.member_id.to_string(),
                leader: resp.leader.to_string(),
                protocol_name: resp.protocol_name.map(|p| p.to_string()).unwrap_or_else(|| assignor_name.into()),
                members: resp
                    .members
                    .into_iter()
                    .map(|m| (m.member_id.to_string(), decode_subscription(m.metadata)))
                    .collect(),
            });
        }
        Err(Error::Protocol(format!("join group '{group}': no member id after {join_rounds_max} rounds")))
    }

    /// SyncGroup: the leader sends every member's assignment; returns this member's.
    pub fn sync_group(
        &mut self,
        group: &str,
        joined: &Joined,
        assignments: &[MemberAssignment],
    ) -> Result<Vec<(String, Vec<i32>)>, Error> {
        let mut encoded = Vec::new();
        for (member, parts) in assignments {
            encoded.push(
                SyncGroupRequestAssignment::default()
                    .with_member_id(sb(member))
                    .with_assignment(encode_assignment(parts)?),
            );
        }
        let mut req = SyncGroupRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id(joined.generation_id)
            .with_member_id(sb(&joined.member_id))
            .with_assignments(encoded);
        req.protocol_type = Some(sb("consumer"));
        req.protocol_name = Some(sb(&joined.protocol_name));
        let node = self.coordinator(group)?;
        let addr = self.node_addr(node)?;
        if self.conn_to_addr(&addr)?.version(kafka_protocol::messages::ApiKey::SyncGroup)? < 5 {
            req.protocol_type = None;
            req.protocol_name = None;
        }
        let (_, resp) = self.send_coordinator(group, &req)?;
        check(|| format!("sync group '{group}'"), resp.error_code, None)?;
        Ok(decode_assignment(resp.assignment))
    }

    /// Heartbeat; REBALANCE_IN_PROGRESS comes back as a broker error (code 27).
    pub fn heartbeat(&mut self, group: &str, generation_id: i32, member_id: &str) -> Result<(), Error> {
        let req = HeartbeatRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id(generation_id)
            .with_member_id(sb(member_id));
        let (_, resp) = self.send_coordinator(group, &req)?;
        check(|| format!("heartbeat to group '{group}'"), resp.error_code, None)
    }

    pub fn leave_group(&mut self, group: &str, member_id: &str) -> Result<(), Error> {
        let node = self.coordinator(group)?;
        let addr = self.node_addr(node)?;
        let version = self.conn_to_addr(&addr)?.version(kafka_protocol::messages::ApiKey::LeaveGroup)?;
        let mut req = LeaveGroupRequest::default().with_group_id(group_id(group));
        if version >= 3 {
            req.members = vec![MemberIdentity::default().with_member_id(sb(member_id))];
        } else {
            req.member_id = sb(member_id);
        }
        let (_, resp) = self.send_coordinator(group, &req)?;
        check(|| format!("leave group '{group}'"), resp.error_code, None)
    }

    /// Commit offsets (the next offset to read) for `(topic, partition, offset)`.
    /// Generation -1 and an empty member id commit as an admin, outside any
    /// generation (allowed only while the group is empty).
    pub fn commit_offsets(
        &mut self,
        group: &str,
        generation_id: i32,
        member_id: &str,
        offsets: &[(String, i32, i64)],
    ) -> Result<(), Error> {
        let mut by_topic: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (t, p, o) in offsets {
            by_topic.entry(t).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(*o)
                    .with_committed_leader_epoch(-1),
            );
        }
        let req = OffsetCommitRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id_or_member_epoch(generation_id)
            .with_member_id(sb(member_id))
            .with_retention_time_ms(-1)
            .with_topics(
                by_topic
                    .into_iter()
                    .map(|(t, ps)| OffsetCommitRequestTopic::default().with_name(topic_name(t)).with_partitions(ps))
                    .collect(),
            );
        self.with_retries(|c| {
            let (_, resp) = c.send_coordinator(group, &req)?;
            for t in &resp.topics {
                for p in &t.partitions {
                    check(
                        || {
                            format!(
                                "commit offset of group '{group}' for '{}' partition {}",
                                t.name.as_str(),
                                p.partition_index
                            )
                        },
                        p.error_code,
                        None,
                    )?;
                }
            }
            Ok(())
        })
    }

    /// Committed offsets of `group`, for every topic it has committed for.
    pub fn committed_offsets(&mut self, group: &str) -> Result<BTreeMap<(String, i32), i64>, Error> {
        let req = OffsetFetchRequest::default().with_group_id(group_id(group)).with_topics(None);
        self.with_retries(|c| {
            let (_, resp) = c.send_coordinator(group, &req)?;
            check(|| format!("committed offsets of group '{group}'"), resp.error_code, None)?;
            let mut out = BTreeMap::new();
            for t in &resp.topics {
                for p in &t.partitions {
                    if p.error_code == 0 && p.committed_offset >= 0 {
                        out.insert((t.name.to_string(), p.partition_index), p.committed_offset);
                    }
                }
            }
            Ok(out)
        })
    }

    /// Groups known to every broker of the cluster.
    pub fn list_groups(&mut self) -> Result<Vec<ListedGroup>, Error> {
        let nodes: Vec<i32> = self.brokers.keys().copied().collect();
        let mut out = Vec::new();
        for node in nodes {
            let (_, resp) = self.send_to(node, &ListGroupsRequest::default())?;
            check(|| format!("list groups on broker {node}"), resp.error_code, None)?;
            for g in resp.groups {
                out.push(ListedGroup {
                    group: g.group_id.to_string(),
                    state: g.group_state.to_string(),
                    protocol_type: g.protocol_type.to_string(),
                });
            }
        }
        out.sort_by(|a, b| a.group.cmp(&b.group));
        out.dedup_by(|a, b| a.group == b.group);
        Ok(out)
    }

    /// A group of either protocol: DescribeGroups, and for a consumer-protocol group
    /// (KIP-848; DescribeGroups answers GROUP_ID_NOT_FOUND) ConsumerGroupDescribe, as
    /// Kafka's admin client does the other way round.
    pub fn describe_group(&mut self, group: &str) -> Result<GroupDescription, Error> {
        match self.describe_classic_group(group) {
            Err(Error::Broker { code: crate::protocol::error_code::GROUP_ID_NOT_FOUND, .. }) => {
                self.describe_consumer_group(group)
            }
            other => other,
        }
    }

    fn describe_consumer_group(&mut self, group: &str) -> Result<GroupDescription, Error> {
        use kafka_protocol::messages::ConsumerGroupDescribeRequest;
        let req = ConsumerGroupDescribeRequest::default().with_group_ids(vec![group_id(group)]);
        self.with_retries(|c| {
            let (_, resp) = c.send_coordinator(group, &req)?;
            let g = resp
                .groups
                .into_iter()
                .next()
                .ok_or_else(|| Error::Protocol(format!("describe group '{group}': empty answer")))?;
            check(|| format!("describe group '{group}'"), g.error_code, g.error_message.as_ref())?;
            Ok(GroupDescription {
                group: g.group_id.to_string(),
                state: g.group_state.to_string(),
                protocol_type: "consumer".to_string(),
                protocol: g.assignor_name.to_string(),
                members: g
                    .members
                    .into_iter()
                    .map(|m| GroupMember {
                        member_id: m.member_id.to_string(),
                        client_id: m.client_id.to_string(),
                        client_host: m.client_host.to_string(),
                        assignment: m
                            .assignment
                            .topic_partitions
                            .into_iter()
                            .map(|t| (t.topic_name.to_string(), t.partitions))
                            .collect(),
                    })
                    .collect(),
            })
        })
    }

    fn describe_classic_group(&mut self, group: &str) -> Result<GroupDescription, Error> {
        let req = DescribeGroupsRequest::default().with_groups(vec![group_id(group)]);
        self.with_retries(|c| {
            let (_, resp) = c.send_coordinator(group, &req)?;
            let g = resp
                .groups
                .into_iter()
                .next()
                .ok_or_else(|| Error::Protocol(format!("describe group '{group}': empty answer")))?;
            check(|| format!("describe group '{group}'"), g.error_code, g.error_message.as_ref())?;
            Ok(GroupDescription {
                group: g.group_id.to_string(),
                state: g.group_state.to_string(),
                protocol_type: g.protocol_type.to_string(),
                protocol: g.protocol_data.to_string(),
                members: g
                    .members
                    .into_iter()
                    .map(|m| GroupMember {
                        member_id: m.member_id.to_string(),
                        client_id: m.client_id.to_string(),
                        client_host: m.client_host.to_string(),
                        assignment: decode_assignment(m.member_assignment),
                    })
                    .collect(),
            })
        })
    }
}
