//! Cluster snapshots for the other brokers: a Fetch of `__cluster_metadata` partition 0
//! (as KRaft brokers fetch the metadata log from the controller), long-polled. The
//! fetch offset is the version the broker holds; as soon as the active coordinator's
//! version differs (or at once, when it already does), the answer carries one record
//! whose value is the whole snapshot as JSON, and the high watermark is its version.
//! Snapshots are small (brokers, topics, partition states) and changes are rare, so a
//! whole snapshot per change is simpler than a delta log and never diverges.
//!
//! The snapshot holds ACLs, quotas and SCRAM credentials: a fetch of it needs
//! CLUSTER_ACTION on the cluster, as a follower's fetch does (TOPIC_AUTHORIZATION_FAILED
//! otherwise).

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};

use crate::coordinator::registry::CLUSTER_METADATA_TOPIC;
use crate::protocol::{error_code, plain_record, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{respond, str_bytes};

/// How often a long-poll looks at the registry's version.
const version_poll_interval_ms: u64 = 5;
/// The longest a snapshot long-poll waits.
const snapshot_wait_ms_max: i32 = 10_000;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame, req: FetchRequest) -> Result<Bytes, ProtocolError> {
    let known = req
        .topics
        .iter()
        .filter(|t| t.topic.as_str() == CLUSTER_METADATA_TOPIC)
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.fetch_offset)
        .next()
        .unwrap_or(-1);
    let deadline = Instant::now() + Duration::from_millis(req.max_wait_ms.clamp(0, snapshot_wait_ms_max) as u64);
    let mut partition = PartitionData::default().with_partition_index(0);
    let action = crate::security::acl::AclOperation::ClusterAction;
    let allowed = super::authz::authorize_cluster(ctx, frame, &ctx.view(), action);
    loop {
        if !allowed {
            partition = partition.with_error_code(error_code::TOPIC_AUTHORIZATION_FAILED).with_high_watermark(-1);
            break;
        }
        let answer = {
            let reg = ctx.view();
            if !reg.is_active() {
                Some(Err(error_code::NOT_CONTROLLER))
            } else if reg.metadata_version() as i64 != known || Instant::now() >= deadline || ctx.stopping.get() {
                Some(reg.snapshot_json().map_err(|_| error_code::UNKNOWN_SERVER_ERROR))
            } else {
                None
            }
        };
        match answer {
            None => glommio::timer::sleep(Duration::from_millis(version_poll_interval_ms)).await,
            Some(Err(code)) => {
                partition = partition.with_error_code(code).with_high_watermark(-1);
                break;
            }
            Some(Ok((version, json))) => {
                partition = partition.with_high_watermark(version as i64).with_last_stable_offset(version as i64);
                if version as i64 != known {
                    partition.records = Some(encode_snapshot(json)?);
                }
                break;
            }
        }
    }
    let body = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(TopicName(str_bytes(CLUSTER_METADATA_TOPIC)))
        .with_partitions(vec![partition])]);
    respond(ApiKey::Fetch, frame, &body)
}

fn encode_snapshot(json: Vec<u8>) -> Result<Bytes, ProtocolError> {
    let record = plain_record(0, -1, now_ms(), None, Some(Bytes::from(json)), Default::default());
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &[record],
        &RecordEncodeOptions { version: 2, compression: Compression::None },
    )
    .map_err(|e| ProtocolError::BadBody(format!("encoding the cluster snapshot: {e}")))?;
    Ok(buf.freeze())
}
