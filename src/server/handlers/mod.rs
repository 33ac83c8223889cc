//! One handler per Kafka API. Each decodes its request, does the work (fanning
//! partition operations out to their owner shards), and encodes the answer. Kafka error
//! codes are chosen here and nowhere else.

mod api_versions;
mod create_topics;
mod delete_topics;
mod describe_configs;
mod fetch;
mod list_offsets;
mod metadata;
mod produce;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::Encodable;

use crate::log::LogError;
use crate::protocol::{encode_response, error_code, supported_range, ProtocolError, RequestFrame};
use crate::shard::PartitionError;

use super::context::ShardContext;

/// Handle one request. `Ok(None)`: no answer is due (Produce with acks=0).
/// `Err`: the connection must be closed.
pub async fn handle(
    ctx: &ShardContext,
    frame: RequestFrame,
) -> Result<Option<Bytes>, ProtocolError> {
    let key = ApiKey::try_from(frame.api_key).ok();
    if key == Some(ApiKey::ApiVersions) {
        return api_versions::handle(ctx, &frame).map(Some);
    }
    let supported = key.and_then(|k| supported_range(k).map(|r| (k, r)));
    let Some((key, (lo, hi))) = supported else {
        ctx.metrics
            .shard(ctx.id)
            .unsupported_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(ProtocolError::BadHeader(format!(
            "unsupported API key {}",
            frame.api_key
        )));
    };
    if frame.api_version < lo || frame.api_version > hi {
        ctx.metrics
            .shard(ctx.id)
            .unsupported_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(ProtocolError::BadHeader(format!(
            "unsupported version {} of {key:?} (we support {lo}..={hi})",
            frame.api_version
        )));
    }
    match key {
        ApiKey::Metadata => metadata::handle(ctx, &frame).await.map(Some),
        ApiKey::Produce => produce::handle(ctx, &frame).await,
        ApiKey::Fetch => fetch::handle(ctx, &frame).await.map(Some),
        ApiKey::ListOffsets => list_offsets::handle(ctx, &frame).await.map(Some),
        ApiKey::CreateTopics => create_topics::handle(ctx, &frame).await.map(Some),
        ApiKey::DeleteTopics => delete_topics::handle(ctx, &frame).await.map(Some),
        ApiKey::DescribeConfigs => describe_configs::handle(ctx, &frame).map(Some),
        other => Err(ProtocolError::BadHeader(format!(
            "no handler for {other:?}"
        ))),
    }
}

/// Encode an answer to `frame`.
fn respond<T: Encodable>(
    key: ApiKey,
    frame: &RequestFrame,
    body: &T,
) -> Result<Bytes, ProtocolError> {
    encode_response(key, frame.api_version, frame.correlation_id, body)
        .map_err(|e| ProtocolError::BadBody(format!("encoding {key:?} v{} answer: {e}", frame.api_version)))}

/// The Kafka error code for a partition-level failure.
fn partition_error_code(e: &PartitionError) -> i16 {
    match e {
        PartitionError::UnknownTopicOrPartition(_) => error_code::UNKNOWN_TOPIC_OR_PARTITION,
        PartitionError::Log(l) => match l {
            LogError::MessageTooLarge { .. } => error_code::MESSAGE_TOO_LARGE,
            LogError::Corrupt(_) => error_code::CORRUPT_MESSAGE,
            LogError::InvalidRecord(_) => error_code::INVALID_RECORD,
            LogError::OffsetOutOfRange { .. } => error_code::OFFSET_OUT_OF_RANGE,
            LogError::Offline(_) | LogError::Io(_) => error_code::KAFKA_STORAGE_ERROR,
        },
    }
}

fn str_bytes(s: impl Into<String>) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.into())
}
