//! AlterReplicaLogDirs (kafka-reassign-partitions with "log_dirs" in its JSON, the
//! admin's `alterReplicaLogDirs`): move replicas on this broker to another of its log
//! dirs. A Spate broker has one log dir (the data dir, as DescribeLogDirs reports it),
//! so nothing ever moves; each named replica is answered as Kafka's
//! `ReplicaManager.alterReplicaLogDirs` answers it on a broker with that one dir:
//! - LOG_DIR_NOT_FOUND: the dir, made absolute as Kafka does (`File.getAbsolutePath`),
//!   is not this broker's log dir;
//! - NONE: the replica lives here, so it is already in that dir;
//! - REPLICA_NOT_AVAILABLE: the partition exists but has no replica here (yet: the
//!   reassignment tool retries it while a new replica is being created);
//! - UNKNOWN_TOPIC_OR_PARTITION: no such partition.
//!
//! A partition named under two dirs takes the last one, as Kafka's map of them does.
//! ALTER on the cluster is required; without it every replica is answered
//! CLUSTER_AUTHORIZATION_FAILED.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::{AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, ApiKey, TopicName};

use crate::coordinator::registry::Hosting;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::AclOperation;

use super::super::context::ShardContext;
use super::respond;

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AlterReplicaLogDirsRequest = decode_body(frame)?;
    let view = ctx.view();
    let authorized = super::authz::authorize_cluster(ctx, frame, &view, AclOperation::Alter);
    let here = super::describe_log_dirs::log_dir(ctx);
    // (topic, partition) -> the dir named for it (the last one wins).
    let mut named: BTreeMap<(TopicName, i32), PathBuf> = BTreeMap::new();
    for dir in &req.dirs {
        let path = super::describe_log_dirs::absolute(Path::new(dir.path.as_str()));
        for t in &dir.topics {
            for &p in &t.partitions {
                named.insert((t.name.clone(), p), path.clone());
            }
        }
    }
    let mut results: Vec<AlterReplicaLogDirTopicResult> = Vec::new();
    for ((topic, partition), path) in named {
        let code = if !authorized {
            error_code::CLUSTER_AUTHORIZATION_FAILED
        } else if path != here {
            error_code::LOG_DIR_NOT_FOUND
        } else {
            match view.hosting(topic.as_str(), partition) {
                Hosting::Leader | Hosting::Follower => error_code::NONE,
                Hosting::Elsewhere => error_code::REPLICA_NOT_AVAILABLE,
                Hosting::Unknown => error_code::UNKNOWN_TOPIC_OR_PARTITION,
            }
        };
        if code != error_code::NONE && code != error_code::CLUSTER_AUTHORIZATION_FAILED {
            tracing::info!(topic = %topic.as_str(), partition, dir = %path.display(), code, "AlterReplicaLogDirs refused");
        }
        let result = AlterReplicaLogDirPartitionResult::default().with_partition_index(partition).with_error_code(code);
        match results.last_mut() {
            Some(t) if t.topic_name == topic => t.partitions.push(result),
            _ => results
                .push(AlterReplicaLogDirTopicResult::default().with_topic_name(topic).with_partitions(vec![result])),
        }
    }
    respond(ApiKey::AlterReplicaLogDirs, frame, &AlterReplicaLogDirsResponse::default().with_results(results))
}
