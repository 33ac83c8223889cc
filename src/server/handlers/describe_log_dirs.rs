//! DescribeLogDirs: this broker's one log directory (the data dir), with every partition
//! replica it hosts (or those of the requested topics): the bytes of its segments, its
//! offset lag (Kafka's `max(high watermark - log end offset, 0)`: 0 on a leader and on
//! a follower, whose high watermark never passes its log end), never a future replica
//! (no intra-broker moves); from v4 the file system's total and usable bytes (the disk
//! monitor's last statvfs reading, `server/disk.rs`); from v5 whether the directory is
//! cordoned (KIP-1066), never: Spate has no `cordoned.log.dirs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse};

use crate::coordinator::registry::Hosting;
use crate::model::TopicPartition;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::shard::{PartitionOp, PartitionReply};

use super::super::context::ShardContext;
use super::{respond, respond_newer, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeLogDirsRequest = decode_body(frame)?;
    // Kafka's handleDescribeLogDirsRequest: DESCRIBE on the cluster.
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), crate::security::acl::AclOperation::Describe) {
        let body = DescribeLogDirsResponse::default().with_error_code(error_code::CLUSTER_AUTHORIZATION_FAILED);
        return answer(frame, &body);
    }
    // The replicas hosted here, among those asked for (null: all of them).
    let hosted: Vec<TopicPartition> = {
        let view = ctx.view();
        let here = |topic: &str, p: i32| matches!(view.hosting(topic, p), Hosting::Leader | Hosting::Follower);
        let mut hosted = Vec::new();
        match &req.topics {
            None => {
                for (name, meta) in view.topics() {
                    hosted
                        .extend((0..meta.partitions).filter(|&p| here(name, p)).map(|p| TopicPartition::new(name, p)));
                }
            }
            Some(topics) => {
                for t in topics {
                    let name = t.topic.as_str();
                    hosted
                        .extend(t.partitions.iter().filter(|&&p| here(name, p)).map(|&p| TopicPartition::new(name, p)));
                }
            }
        }
        hosted.sort();
        hosted.dedup();
        hosted
    };
    let calls = hosted.iter().map(|tp| ctx.call(PartitionOp::DescribeLog { tp: tp.clone() }));
    let replies = futures::future::join_all(calls).await;
    let mut topics: BTreeMap<&str, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for (tp, reply) in hosted.iter().zip(replies) {
        // A replica whose log is not open (yet) is left out, as Kafka leaves out what it
        // has no log for.
        let Ok(PartitionReply::LogDescribed { size_bytes, log_end_offset, high_watermark }) = reply else { continue };
        topics.entry(tp.topic.as_str()).or_default().push(
            DescribeLogDirsPartition::default()
                .with_partition_index(tp.partition)
                .with_partition_size(size_bytes as i64)
                .with_offset_lag((high_watermark - log_end_offset).max(0))
                .with_is_future_key(false),
        );
    }
    let log_dir = log_dir(ctx);
    let (usable_bytes, total_bytes) = match ctx.disk.space() {
        Some((usable, total)) => (usable as i64, total as i64),
        None => (-1, -1),
    };
    let result = DescribeLogDirsResult::default()
        .with_error_code(error_code::NONE)
        .with_log_dir(str_bytes(log_dir.to_string_lossy()))
        .with_topics(
            topics
                .into_iter()
                .map(|(name, partitions)| {
                    DescribeLogDirsTopic::default()
                        .with_name(kafka_protocol::messages::TopicName(str_bytes(name)))
                        .with_partitions(partitions)
                })
                .collect(),
        )
        .with_total_bytes(total_bytes)
        .with_usable_bytes(usable_bytes);
    answer(frame, &DescribeLogDirsResponse::default().with_results(vec![result]))
}

/// This broker's one log dir: the data dir, absolute.
pub(super) fn log_dir(ctx: &ShardContext) -> PathBuf {
    absolute(&ctx.config.data_dir)
}

/// `path` made absolute against the working directory without touching the file
/// system (Java's `File.getAbsolutePath`); as given if that fails.
pub(super) fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn answer(frame: &RequestFrame, body: &DescribeLogDirsResponse) -> Result<Bytes, ProtocolError> {
    if frame.api_version >= 5 {
        return respond_newer(ApiKey::DescribeLogDirs, frame, |buf| {
            crate::protocol::newer::encode_describe_log_dirs_response_v5(body, buf)
        });
    }
    respond(ApiKey::DescribeLogDirs, frame, body)
}
