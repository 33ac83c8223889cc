//! ConsumerGroupDescribe (KIP-848): a consumer group's epochs, assignor and members with
//! their current and target assignments (topic ids resolved to names here, from this
//! shard's view). A classic group, or none, is GROUP_ID_NOT_FOUND, as Kafka 4.4 answers;
//! the admin client then asks DescribeGroups.
//!
//! Each group needs DESCRIBE (GROUP_AUTHORIZATION_FAILED otherwise).

use bytes::Bytes;
use kafka_protocol::messages::consumer_group_describe_response::{Assignment, DescribedGroup, Member, TopicPartitions};
use kafka_protocol::messages::{ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, TopicName};

use crate::group::consumer;
use crate::group::Described;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::{authz, respond, str_bytes};

/// Member type (v1): a member of the consumer protocol.
const member_type_consumer: i8 = 1;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: ConsumerGroupDescribeRequest = decode_body(frame)?;
    let mut groups = Vec::with_capacity(req.group_ids.len());
    for id in &req.group_ids {
        let view = ctx.view();
        let mut g = DescribedGroup::default().with_group_id(id.clone()).with_authorized_operations(i32::MIN);
        if !authz::authorize(ctx, frame, &view, AclOperation::Describe, ResourceType::Group, id.as_str()) {
            groups.push(g.with_error_code(error_code::GROUP_AUTHORIZATION_FAILED));
            continue;
        }
        if req.include_authorized_operations {
            g.authorized_operations = authz::authorized_operations(ctx, frame, &view, ResourceType::Group, id.as_str());
        }
        let assignment = |a: consumer::TopicPartitions| {
            Assignment::default().with_topic_partitions(
                a.into_iter()
                    .map(|(topic_id, ps)| {
                        let name = view.by_id(topic_id).map(|(n, _)| n.clone()).unwrap_or_default();
                        TopicPartitions::default()
                            .with_topic_id(topic_id)
                            .with_topic_name(TopicName(str_bytes(name)))
                            .with_partitions(ps.into_iter().collect())
                    })
                    .collect(),
            )
        };
        let not_found = |g: DescribedGroup, why: String| {
            g.with_error_code(error_code::GROUP_ID_NOT_FOUND).with_error_message(Some(str_bytes(why)))
        };
        match ctx.call_group(GroupOp::Describe { group_id: id.to_string() }, None).await {
            Some(GroupReply::Describe(Some(Described::Consumer(d)))) => {
                g = g
                    .with_group_state(str_bytes(d.state))
                    .with_group_epoch(d.group_epoch)
                    .with_assignment_epoch(d.assignment_epoch)
                    .with_assignor_name(str_bytes(d.assignor));
                g.members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        Member::default()
                            .with_member_id(str_bytes(m.member_id))
                            .with_instance_id(m.instance_id.map(str_bytes))
                            .with_rack_id(m.rack_id.map(str_bytes))
                            .with_member_epoch(m.member_epoch)
                            .with_client_id(str_bytes(m.client_id))
                            .with_client_host(str_bytes(m.client_host))
                            .with_subscribed_topic_names(
                                m.subscribed_topic_names.into_iter().map(|t| TopicName(str_bytes(t))).collect(),
                            )
                            .with_subscribed_topic_regex(m.subscribed_topic_regex.map(str_bytes))
                            .with_assignment(assignment(m.assignment))
                            .with_target_assignment(assignment(m.target_assignment))
                            .with_member_type(if frame.api_version >= 1 { member_type_consumer } else { -1 })
                    })
                    .collect();
            }
            Some(GroupReply::Describe(Some(Described::Classic(_)))) => {
                g = not_found(g, format!("Group {} is not a consumer group.", id.as_str()));
            }
            Some(GroupReply::Describe(None)) => g = not_found(g, format!("Group {} not found.", id.as_str())),
            other => g = g.with_error_code(ctx.group_unavailable_code(id, &other)),
        }
        groups.push(g);
    }
    respond(ApiKey::ConsumerGroupDescribe, frame, &ConsumerGroupDescribeResponse::default().with_groups(groups))
}
