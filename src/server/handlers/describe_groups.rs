//! DescribeGroups: state, protocol and members (with metadata and assignment). Each
//! group needs DESCRIBE (GROUP_AUTHORIZATION_FAILED otherwise); its authorized
//! operations are the principal's. A consumer-protocol group (KIP-848) is answered
//! GROUP_ID_NOT_FOUND, as Kafka 4.4 does: ConsumerGroupDescribe describes those. An
//! unknown group is Dead with no members, and from v6 (KIP-1043) GROUP_ID_NOT_FOUND too.

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::{ApiKey, DescribeGroupsRequest, DescribeGroupsResponse};

use crate::group::Described;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::{authz, respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeGroupsRequest = decode_body(frame)?;
    let mut groups = Vec::with_capacity(req.groups.len());
    for id in &req.groups {
        let mut g = DescribedGroup::default().with_group_id(id.clone());
        let view = ctx.view();
        if !authz::authorize(ctx, frame, &view, AclOperation::Describe, ResourceType::Group, id.as_str()) {
            groups.push(g.with_error_code(error_code::GROUP_AUTHORIZATION_FAILED));
            continue;
        }
        if frame.api_version >= 3 && req.include_authorized_operations {
            // The principal's: READ 3, DELETE 6, DESCRIBE 8 where allowed.
            g.authorized_operations = authz::authorized_operations(ctx, frame, &view, ResourceType::Group, id.as_str());
        }
        match ctx.call_group(GroupOp::Describe { group_id: id.to_string() }, None).await {
            // Kafka 4.4: DescribeGroups describes classic groups only; the admin client
            // asks ConsumerGroupDescribe first.
            Some(GroupReply::Describe(Some(Described::Consumer(_)))) => {
                g = g.with_error_code(error_code::GROUP_ID_NOT_FOUND);
                if frame.api_version >= 6 {
                    g.error_message = Some(str_bytes(format!("Group {} is not a classic group.", id.as_str())));
                }
            }
            Some(GroupReply::Describe(Some(Described::Classic(d)))) => {
                g = g
                    .with_group_state(str_bytes(d.state.name()))
                    .with_protocol_type(str_bytes(d.protocol_type))
                    .with_protocol_data(str_bytes(d.protocol));
                g.members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        let dm = DescribedGroupMember::default()
                            .with_member_id(str_bytes(m.member_id))
                            .with_client_id(str_bytes(m.client_id))
                            .with_client_host(str_bytes(m.client_host))
                            .with_member_metadata(m.metadata)
                            .with_member_assignment(m.assignment);
                        if frame.api_version >= 4 {
                            dm.with_group_instance_id(m.group_instance_id.map(str_bytes))
                        } else {
                            dm
                        }
                    })
                    .collect();
            }
            // Kafka describes an unknown group as Dead with no members; from v6 (KIP-1043)
            // also as GROUP_ID_NOT_FOUND, with its message.
            Some(GroupReply::Describe(None)) => {
                g = g.with_group_state(str_bytes("Dead"));
                if frame.api_version >= 6 {
                    g.error_code = error_code::GROUP_ID_NOT_FOUND;
                    g.error_message = Some(str_bytes(format!("Group {} not found.", id.as_str())));
                }
            }
            other => g = g.with_error_code(ctx.group_unavailable_code(id, &other)),
        }
        groups.push(g);
    }
    respond(ApiKey::DescribeGroups, frame, &DescribeGroupsResponse::default().with_groups(groups))
}
