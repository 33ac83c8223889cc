//! ListGroups: every shard coordinates some groups, so ask them all. v4 filters by
//! state, v5 by type ("classic", "consumer").

use bytes::Bytes;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{ApiKey, GroupId, ListGroupsRequest, ListGroupsResponse};

use crate::model::ShardId;
use crate::protocol::{decode_body, ProtocolError, RequestFrame};
use crate::shard::{GroupOp, GroupReply};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: ListGroupsRequest = decode_body(frame)?;
    let calls = (0..ctx.nr_shards).map(|s| ctx.call_group(GroupOp::List, Some(ShardId(s))));
    // Kafka's handleListGroupsRequest: DESCRIBE on the cluster lists every group, else
    // only those the principal may DESCRIBE.
    use crate::security::acl::{AclOperation, ResourceType, CLUSTER_RESOURCE_NAME};
    let view = ctx.view();
    let all = super::authz::authorize_quietly(
        ctx,
        frame,
        &view,
        AclOperation::Describe,
        ResourceType::Cluster,
        CLUSTER_RESOURCE_NAME,
    );
    let mut groups = Vec::new();
    let mut loading = false;
    for reply in futures::future::join_all(calls).await {
        loading |= matches!(reply, Some(GroupReply::Loading));
        if let Some(GroupReply::List(list)) = reply {
            for listed in list {
                let id = listed.group_id;
                if !all
                    && !super::authz::authorize_quietly(
                        ctx,
                        frame,
                        &view,
                        AclOperation::Describe,
                        ResourceType::Group,
                        &id,
                    )
                {
                    continue;
                }
                // As Kafka's coordinator, filters compare without regard to case.
                if !req.states_filter.is_empty()
                    && !req.states_filter.iter().any(|s| s.as_str().eq_ignore_ascii_case(listed.state))
                {
                    continue;
                }
                if frame.api_version >= 5
                    && !req.types_filter.is_empty()
                    && !req.types_filter.iter().any(|t| t.as_str().eq_ignore_ascii_case(listed.group_type))
                {
                    continue;
                }
                let mut g = ListedGroup::default()
                    .with_group_id(GroupId(str_bytes(id)))
                    .with_protocol_type(str_bytes(listed.protocol_type));
                if frame.api_version >= 4 {
                    g = g.with_group_state(str_bytes(listed.state));
                }
                if frame.api_version >= 5 {
                    g = g.with_group_type(str_bytes(listed.group_type));
                }
                groups.push(g);
            }
        }
    }
    // A shard loading groups from `__consumer_offsets` cannot list them all yet: as
    // Kafka's coordinator, COORDINATOR_LOAD_IN_PROGRESS (retriable) and no groups.
    let body = if loading {
        ListGroupsResponse::default().with_error_code(crate::protocol::error_code::COORDINATOR_LOAD_IN_PROGRESS)
    } else {
        ListGroupsResponse::default().with_groups(groups)
    };
    respond(ApiKey::ListGroups, frame, &body)
}
