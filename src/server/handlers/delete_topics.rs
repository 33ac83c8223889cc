//! DeleteTopics: remove the topic from the registry (durably), then have each owner
//! shard delete its partitions' logs. A crash in between is finished at startup: a
//! partition directory whose topic is not registered is removed.
//!
//! v6 (KIP-516) names each topic by name or by topic id (`Admin.deleteTopics` of a
//! `TopicCollection.ofTopicIds`): an id the metadata does not know is UNKNOWN_TOPIC_ID,
//! both a name and an id INVALID_REQUEST, as Kafka's controller answers them.

use bytes::Bytes;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{ApiKey, DeleteTopicsRequest, DeleteTopicsResponse, TopicName};

use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::PartitionOp;

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DeleteTopicsRequest = decode_body(frame)?;
    let mut responses = Vec::with_capacity(req.topics.len().max(req.topic_names.len()));
    let names: Vec<TopicName> = if frame.api_version >= 6 {
        let view = ctx.view();
        let mut names = Vec::with_capacity(req.topics.len());
        for t in &req.topics {
            let refused = |code: i16, why: &str| {
                DeletableTopicResult::default()
                    .with_name(t.name.clone())
                    .with_topic_id(t.topic_id)
                    .with_error_code(code)
                    .with_error_message(Some(str_bytes(why.to_string())))
            };
            match (&t.name, t.topic_id.is_nil()) {
                (Some(name), true) => names.push(name.clone()),
                (Some(_), false) => responses
                    .push(refused(error_code::INVALID_REQUEST, "You may not specify both topic name and topic id.")),
                (None, true) => {
                    responses.push(refused(error_code::INVALID_REQUEST, "Neither topic name nor id were specified."))
                }
                (None, false) => match view.by_id(t.topic_id) {
                    Some((name, _)) => names.push(TopicName(str_bytes(name.clone()))),
                    None => responses
                        .push(refused(error_code::UNKNOWN_TOPIC_ID, "This server does not host this topic ID.")),
                },
            }
        }
        names
    } else {
        req.topic_names.clone()
    };
    for name in names {
        // Kafka's handleDeleteTopicsRequest: DELETE on the topic.
        if !super::authz::authorize(
            ctx,
            frame,
            &ctx.view(),
            crate::security::acl::AclOperation::Delete,
            crate::security::acl::ResourceType::Topic,
            name.as_str(),
        ) {
            responses.push(
                DeletableTopicResult::default()
                    .with_name(Some(name.clone()))
                    .with_error_code(error_code::TOPIC_AUTHORIZATION_FAILED),
            );
            continue;
        }
        if name.as_str() == crate::group::OFFSETS_TOPIC {
            responses.push(
                DeletableTopicResult::default()
                    .with_name(Some(name.clone()))
                    .with_error_code(error_code::INVALID_TOPIC_EXCEPTION),
            );
            continue;
        }
        let topic = name.to_string();
        let removed = ctx.metadata.write(move |reg| reg.delete(&topic)).await;
        let mut r = DeletableTopicResult::default().with_name(Some(name.clone()));
        match removed {
            Ok(meta) => {
                if frame.api_version >= 6 {
                    r.topic_id = meta.id;
                }
                let deletions = (0..meta.partitions)
                    .map(|p| ctx.call(PartitionOp::DeletePartition { tp: TopicPartition::new(name.as_str(), p) }));
                for (p, result) in futures::future::join_all(deletions).await.into_iter().enumerate() {
                    if let Err(e) = result {
                        tracing::error!(topic = %name.as_str(), partition = p, error = %e, "partition delete failed; retried at restart");
                    }
                }
                tracing::info!(topic = %name.as_str(), "deleted topic");
            }
            Err(e) => {
                r = r.with_error_code(super::registry_error_code(&e));
                if frame.api_version >= 5 {
                    r.error_message = Some(str_bytes(e.to_string()));
                }
            }
        }
        responses.push(r);
    }
    respond(ApiKey::DeleteTopics, frame, &DeleteTopicsResponse::default().with_responses(responses))
}
