//! One handler per Kafka API. Each decodes its request, does the work (fanning
//! partition operations out to their owner shards), and encodes the answer. Kafka error
//! codes are chosen here and nowhere else.

mod acls;
mod add_offsets_to_txn;
mod add_partitions_to_txn;
mod alter_configs;
mod alter_partition;
mod alter_partition_reassignments;
mod alter_replica_log_dirs;
mod api_versions;
mod authz;
mod broker_heartbeat;
mod broker_registration;
mod client_quotas;
mod cluster_metadata;
mod consumer_group_describe;
mod consumer_group_heartbeat;
mod create_partitions;
mod create_topics;
mod delete_groups;
mod delete_records;
mod delete_topics;
mod describe_cluster;
mod describe_configs;
mod describe_groups;
mod describe_log_dirs;
mod describe_producers;
mod describe_topic_partitions;
mod describe_transactions;
mod elect_leaders;
mod end_txn;
mod envelope;
mod fetch;
mod find_coordinator;
mod heartbeat;
mod init_producer_id;
mod join_group;
mod leave_group;
mod list_groups;
mod list_offsets;
mod list_partition_reassignments;
mod list_transactions;
mod metadata;
mod offset_commit;
mod offset_delete;
mod offset_fetch;
mod offset_for_leader_epoch;
mod produce;
mod sync_group;
mod txn_offset_commit;
mod update_features;
mod user_scram_credentials;
mod write_txn_markers;

use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::Encodable;

use crate::coordinator::controller::ControllerError;
use crate::coordinator::registry::RegistryError;
use crate::group::GroupError;
use crate::log::LogError;
use crate::protocol::zero_copy::Response;
use crate::protocol::{encode_response, error_code, handled_range, handled_version, ProtocolError, RequestFrame};
use crate::shard::PartitionError;
use crate::txn::producer_state::ProducerStateError;

use super::context::ShardContext;
use super::forward::Forwarded;

/// Handle one request. `Ok(None)`: no answer is due (Produce with acks=0).
/// `Err`: the connection must be closed. With a request quota configured, the handler's
/// time on this core is measured and may throttle the connection (`server::quotas`).
pub async fn handle(ctx: &ShardContext, frame: RequestFrame) -> Result<Option<Response>, ProtocolError> {
    let quota_exempt = ApiKey::try_from(frame.api_key).map_or(true, super::quotas::request_quota_exempt);
    if quota_exempt || !super::quotas::request_quota_configured(ctx) {
        return dispatch(ctx, frame).await;
    }
    // The frame goes to the handler; what the quota needs of it is kept.
    let client = super::quotas::QuotaClient::of(&frame);
    let (answer, busy) = super::quotas::Busy::new(dispatch(ctx, frame)).await;
    let throttle_ms = super::quotas::record_handler_time(ctx, &client, busy);
    answer.map(|r| {
        r.map(|mut r| {
            r.throttle_ms = r.throttle_ms.max(throttle_ms);
            r
        })
    })
}

async fn dispatch(ctx: &ShardContext, frame: RequestFrame) -> Result<Option<Response>, ProtocolError> {
    let key = ApiKey::try_from(frame.api_key).ok();
    if key == Some(ApiKey::ApiVersions) {
        return api_versions::handle(ctx, &frame).map(|b| Some(b.into()));
    }
    let supported = key.and_then(|k| handled_range(k).map(|r| (k, r)));
    let Some((key, (lo, hi))) = supported else {
        ctx.metrics.shard(ctx.id).unsupported_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(ProtocolError::BadHeader(format!("unsupported API key {}", frame.api_key)));
    };
    if !handled_version(key, frame.api_version) {
        ctx.metrics.shard(ctx.id).unsupported_requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Err(ProtocolError::BadHeader(format!(
            "unsupported version {} of {key:?} (we support {lo}..={hi})",
            frame.api_version
        )));
    }
    if super::forward::is_forwarded_request(key, &frame) && !ctx.view().is_active() {
        match Box::pin(super::forward::forward(ctx, &frame)).await {
            Forwarded::Answer(answer) => return Ok(Some(answer.into())),
            Forwarded::Malformed => {
                return Err(ProtocolError::BadBody(format!("{key:?}: the active coordinator could not read it")))
            }
            // No coordinator took it: the handler answers NOT_CONTROLLER.
            Forwarded::NoCoordinator => {}
        }
    }
    route(ctx, key, frame).await
}

/// The handler of `key` (checked as handled; forwarding decided).
///
/// Every request's task holds this future, which is as large as the largest handler
/// state it holds inline, and spawning the task copies it. Produce, the most frequent
/// request, runs inline; Fetch and every other handler put their state on the heap
/// (`route_other`), so a produce request's task is ~1.4 KB instead of ~7.7 KB
/// (bench/README.md, "Smaller request tasks").
async fn route(ctx: &ShardContext, key: ApiKey, frame: RequestFrame) -> Result<Option<Response>, ProtocolError> {
    match key {
        ApiKey::Produce => produce::handle(ctx, &frame).await,
        ApiKey::Fetch => Box::pin(fetch::handle(ctx, &frame)).await.map(Some),
        _ => Box::pin(route_other(ctx, key, frame)).await,
    }
}

/// The handlers of every API but Produce and Fetch.
async fn route_other(ctx: &ShardContext, key: ApiKey, frame: RequestFrame) -> Result<Option<Response>, ProtocolError> {
    let bytes = match key {
        ApiKey::Metadata => metadata::handle(ctx, &frame).await.map(Some),
        ApiKey::ListOffsets => list_offsets::handle(ctx, &frame).await.map(Some),
        ApiKey::CreateTopics => create_topics::handle(ctx, &frame).await.map(Some),
        ApiKey::DeleteTopics => delete_topics::handle(ctx, &frame).await.map(Some),
        ApiKey::DescribeConfigs => describe_configs::handle(ctx, &frame).map(Some),
        ApiKey::AlterConfigs => alter_configs::handle_alter(ctx, &frame).await.map(Some),
        ApiKey::IncrementalAlterConfigs => alter_configs::handle_incremental(ctx, &frame).await.map(Some),
        ApiKey::CreatePartitions => create_partitions::handle(ctx, &frame).await.map(Some),
        ApiKey::ElectLeaders => elect_leaders::handle(ctx, &frame).await.map(Some),
        ApiKey::AlterPartitionReassignments => alter_partition_reassignments::handle(ctx, &frame).await.map(Some),
        ApiKey::ListPartitionReassignments => list_partition_reassignments::handle(ctx, &frame).map(Some),
        ApiKey::FindCoordinator => find_coordinator::handle(ctx, &frame).await.map(Some),
        ApiKey::JoinGroup => join_group::handle(ctx, &frame).await.map(Some),
        ApiKey::SyncGroup => sync_group::handle(ctx, &frame).await.map(Some),
        ApiKey::Heartbeat => heartbeat::handle(ctx, &frame).await.map(Some),
        ApiKey::LeaveGroup => leave_group::handle(ctx, &frame).await.map(Some),
        ApiKey::OffsetCommit => offset_commit::handle(ctx, &frame).await.map(Some),
        ApiKey::OffsetFetch => offset_fetch::handle(ctx, &frame).await.map(Some),
        ApiKey::TxnOffsetCommit => txn_offset_commit::handle(ctx, &frame).await.map(Some),
        ApiKey::ListGroups => list_groups::handle(ctx, &frame).await.map(Some),
        ApiKey::DescribeGroups => describe_groups::handle(ctx, &frame).await.map(Some),
        ApiKey::ConsumerGroupHeartbeat => consumer_group_heartbeat::handle(ctx, &frame).await.map(Some),
        ApiKey::ConsumerGroupDescribe => consumer_group_describe::handle(ctx, &frame).await.map(Some),
        ApiKey::DeleteGroups => delete_groups::handle(ctx, &frame).await.map(Some),
        ApiKey::OffsetDelete => offset_delete::handle(ctx, &frame).await.map(Some),
        ApiKey::BrokerRegistration => broker_registration::handle(ctx, &frame).await.map(Some),
        ApiKey::BrokerHeartbeat => broker_heartbeat::handle(ctx, &frame).await.map(Some),
        ApiKey::AlterPartition => alter_partition::handle(ctx, &frame).await.map(Some),
        ApiKey::OffsetForLeaderEpoch => offset_for_leader_epoch::handle(ctx, &frame).await.map(Some),
        ApiKey::InitProducerId => init_producer_id::handle(ctx, &frame).await.map(Some),
        ApiKey::DescribeProducers => describe_producers::handle(ctx, &frame).await.map(Some),
        ApiKey::DeleteRecords => delete_records::handle(ctx, &frame).await.map(Some),
        ApiKey::DescribeLogDirs => describe_log_dirs::handle(ctx, &frame).await.map(Some),
        ApiKey::AlterReplicaLogDirs => alter_replica_log_dirs::handle(ctx, &frame).map(Some),
        ApiKey::DescribeCluster => describe_cluster::handle(ctx, &frame).map(Some),
        ApiKey::DescribeTopicPartitions => describe_topic_partitions::handle(ctx, &frame).map(Some),
        ApiKey::UpdateFeatures => update_features::handle(ctx, &frame).map(Some),
        ApiKey::AddPartitionsToTxn => add_partitions_to_txn::handle(ctx, &frame).await.map(Some),
        ApiKey::AddOffsetsToTxn => add_offsets_to_txn::handle(ctx, &frame).await.map(Some),
        ApiKey::EndTxn => end_txn::handle(ctx, &frame).await.map(Some),
        ApiKey::DescribeTransactions => describe_transactions::handle(ctx, &frame).await.map(Some),
        ApiKey::ListTransactions => list_transactions::handle(ctx, &frame).await.map(Some),
        ApiKey::WriteTxnMarkers => write_txn_markers::handle(ctx, &frame).await.map(Some),
        ApiKey::SaslHandshake | ApiKey::SaslAuthenticate => illegal_sasl_state(key, &frame).map(Some),
        ApiKey::CreateAcls => acls::handle_create(ctx, &frame).await.map(Some),
        ApiKey::DescribeAcls => acls::handle_describe(ctx, &frame).map(Some),
        ApiKey::DeleteAcls => acls::handle_delete(ctx, &frame).await.map(Some),
        ApiKey::DescribeClientQuotas => client_quotas::handle_describe(ctx, &frame).map(Some),
        ApiKey::AlterClientQuotas => client_quotas::handle_alter(ctx, &frame).await.map(Some),
        ApiKey::DescribeUserScramCredentials => user_scram_credentials::handle_describe(ctx, &frame).map(Some),
        ApiKey::AlterUserScramCredentials => user_scram_credentials::handle_alter(ctx, &frame).await.map(Some),
        ApiKey::Envelope => envelope::handle(ctx, &frame).await.map(Some),
        other => Err(ProtocolError::BadHeader(format!("no handler for {other:?}"))),
    };
    bytes.map(|b| b.map(Response::from))
}

/// SaslHandshake or SaslAuthenticate where no SASL exchange is due: on a listener
/// without SASL, or after authentication (a SASL listener's connection answers the
/// exchange itself, src/server/sasl_gate.rs). Kafka answers ILLEGAL_SASL_STATE.
fn illegal_sasl_state(key: ApiKey, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    use kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeResponse};
    let message = "SASL is not enabled on this listener, or this connection is authenticated already";
    match key {
        ApiKey::SaslHandshake => respond(
            key,
            frame,
            &SaslHandshakeResponse::default().with_error_code(crate::protocol::error_code::ILLEGAL_SASL_STATE),
        ),
        _ => respond(
            key,
            frame,
            &SaslAuthenticateResponse::default()
                .with_error_code(crate::protocol::error_code::ILLEGAL_SASL_STATE)
                .with_error_message(Some(str_bytes(message))),
        ),
    }
}

/// Encode an answer to `frame`.
fn respond<T: Encodable>(key: ApiKey, frame: &RequestFrame, body: &T) -> Result<Bytes, ProtocolError> {
    encode_response(key, frame.api_version, frame.correlation_id, body)
        .map_err(|e| ProtocolError::BadBody(format!("encoding {key:?} v{} answer: {e}", frame.api_version)))
}

/// Name a topic given by id (the KIP-516 versions of the offset APIs: OffsetCommit v10,
/// OffsetFetch v10, TxnOffsetCommit v6) from this broker's view. An id it does not know
/// leaves the name empty, which no topic has; the handler answers it UNKNOWN_TOPIC_ID.
fn name_topic_by_id(
    view: &crate::coordinator::view::ClusterView,
    id: uuid::Uuid,
) -> kafka_protocol::messages::TopicName {
    let name = view.by_id(id).map_or("", |(name, _)| name.as_str());
    kafka_protocol::messages::TopicName(crate::client::sb(name))
}

/// A topic's id in this broker's view, for an answer that names topics by id (nil when
/// the topic is gone).
fn topic_id_of(view: &crate::coordinator::view::ClusterView, name: &str) -> uuid::Uuid {
    view.get(name).map_or(uuid::Uuid::nil(), |t| t.id)
}

/// Encode an answer to `frame` at a version the crate does not code, with one of
/// `protocol::newer`'s encoders.
fn respond_newer(
    key: ApiKey,
    frame: &RequestFrame,
    encode: impl FnOnce(&mut bytes::BytesMut) -> anyhow::Result<()>,
) -> Result<Bytes, ProtocolError> {
    crate::protocol::encode_newer_response(key, frame.api_version, frame.correlation_id, encode)
        .map_err(|e| ProtocolError::BadBody(format!("encoding {key:?} v{} answer: {e}", frame.api_version)))
}

/// The Kafka error code for a partition-level failure.
fn partition_error_code(e: &PartitionError) -> i16 {
    match e {
        PartitionError::UnknownTopicOrPartition(_) => error_code::UNKNOWN_TOPIC_OR_PARTITION,
        PartitionError::NotLeader(_) | PartitionError::WritesInFlight(_) => error_code::NOT_LEADER_OR_FOLLOWER,
        // Kafka's answer to a fetch from a dead incarnation (KIP-903).
        PartitionError::StaleBrokerEpoch { .. } => error_code::NOT_LEADER_OR_FOLLOWER,
        PartitionError::FencedLeaderEpoch { .. } => error_code::FENCED_LEADER_EPOCH,
        PartitionError::UnknownLeaderEpoch { .. } => error_code::UNKNOWN_LEADER_EPOCH,
        PartitionError::NotEnoughReplicas { .. } => error_code::NOT_ENOUGH_REPLICAS,
        PartitionError::Log(l) => match l {
            LogError::MessageTooLarge { .. } => error_code::MESSAGE_TOO_LARGE,
            LogError::Corrupt(_) => error_code::CORRUPT_MESSAGE,
            LogError::InvalidRecord(_) | LogError::InvalidRecords { .. } | LogError::InvalidProducerFields(_) => {
                error_code::INVALID_RECORD
            }
            LogError::InvalidTimestamp(_) => error_code::INVALID_TIMESTAMP,
            LogError::OffsetOutOfRange { .. } => error_code::OFFSET_OUT_OF_RANGE,
            LogError::Offline(_) | LogError::Io(_) => error_code::KAFKA_STORAGE_ERROR,
            LogError::Producer(p) => match p {
                ProducerStateError::InvalidProducerEpoch { .. } => error_code::INVALID_PRODUCER_EPOCH,
                ProducerStateError::UnknownProducerId { .. } => error_code::UNKNOWN_PRODUCER_ID,
                ProducerStateError::OutOfOrderSequence { .. } => error_code::OUT_OF_ORDER_SEQUENCE_NUMBER,
                ProducerStateError::InvalidTxnState { .. } => error_code::INVALID_TXN_STATE,
                ProducerStateError::CoordinatorFenced { .. } => error_code::TRANSACTION_COORDINATOR_FENCED,
            },
            // The shard answers duplicates as appends; only a caller that does not gets here.
            LogError::DuplicateBatch(_) => error_code::DUPLICATE_SEQUENCE_NUMBER,
            // Produce verifies and appends again; an unverified batch that reaches a
            // client is not in the transaction, as far as this broker knows.
            LogError::TxnVerificationNeeded { .. } | LogError::TxnVerificationStale { .. } => {
                error_code::INVALID_TXN_STATE
            }
        },
    }
}

/// The Kafka error code for a failed metadata operation.
fn registry_error_code(e: &RegistryError) -> i16 {
    match e {
        RegistryError::TopicExists(_) => error_code::TOPIC_ALREADY_EXISTS,
        RegistryError::UnknownTopic(_) => error_code::UNKNOWN_TOPIC_OR_PARTITION,
        RegistryError::InvalidName(..) => error_code::INVALID_TOPIC_EXCEPTION,
        RegistryError::InvalidPartitions(_) => error_code::INVALID_PARTITIONS,
        RegistryError::InvalidReplicationFactor(_) => error_code::INVALID_REPLICATION_FACTOR,
        RegistryError::InvalidReplicaAssignment(_) => error_code::INVALID_REPLICA_ASSIGNMENT,
        RegistryError::NotController(_) | RegistryError::ControllerTaken(_) => error_code::NOT_CONTROLLER,
        RegistryError::StaleBrokerEpoch { .. } => error_code::STALE_BROKER_EPOCH,
        RegistryError::UnknownBroker(_) => error_code::BROKER_ID_NOT_REGISTERED,
        RegistryError::Controller(ControllerError::BrokerPartitionsExceeded { .. }) => error_code::POLICY_VIOLATION,
        RegistryError::Controller(ControllerError::InvalidReplicaAssignment(_)) => {
            error_code::INVALID_REPLICA_ASSIGNMENT
        }
        RegistryError::Controller(ControllerError::UnknownTopicOrPartition { .. }) => {
            error_code::UNKNOWN_TOPIC_OR_PARTITION
        }
        RegistryError::Controller(ControllerError::NoReassignmentInProgress { .. }) => {
            error_code::NO_REASSIGNMENT_IN_PROGRESS
        }
        RegistryError::Controller(_) | RegistryError::Store(_) | RegistryError::Corrupt { .. } => {
            error_code::UNKNOWN_SERVER_ERROR
        }
    }
}

/// The Kafka error code for a group protocol failure.
fn group_error_code(e: &GroupError) -> i16 {
    match e {
        GroupError::UnknownMemberId => error_code::UNKNOWN_MEMBER_ID,
        GroupError::IllegalGeneration => error_code::ILLEGAL_GENERATION,
        GroupError::RebalanceInProgress => error_code::REBALANCE_IN_PROGRESS,
        GroupError::FencedInstanceId => error_code::FENCED_INSTANCE_ID,
        GroupError::MemberIdRequired => error_code::MEMBER_ID_REQUIRED,
        GroupError::InconsistentGroupProtocol => error_code::INCONSISTENT_GROUP_PROTOCOL,
        GroupError::InvalidSessionTimeout => error_code::INVALID_SESSION_TIMEOUT,
        GroupError::GroupIdNotFound => error_code::GROUP_ID_NOT_FOUND,
        GroupError::NonEmptyGroup => error_code::NON_EMPTY_GROUP,
        GroupError::GroupSubscribedToTopic => error_code::GROUP_SUBSCRIBED_TO_TOPIC,
        GroupError::OffsetMetadataTooLarge => error_code::OFFSET_METADATA_TOO_LARGE,
        GroupError::InvalidGroupId => error_code::INVALID_GROUP_ID,
        GroupError::GroupMaxSizeReached => error_code::GROUP_MAX_SIZE_REACHED,
        GroupError::UnstableOffsetCommit => error_code::UNSTABLE_OFFSET_COMMIT,
        GroupError::FencedMemberEpoch => error_code::FENCED_MEMBER_EPOCH,
        GroupError::StaleMemberEpoch => error_code::STALE_MEMBER_EPOCH,
        GroupError::UnreleasedInstanceId => error_code::UNRELEASED_INSTANCE_ID,
        GroupError::UnsupportedAssignor => error_code::UNSUPPORTED_ASSIGNOR,
        GroupError::InvalidRegularExpression => error_code::INVALID_REGULAR_EXPRESSION,
        GroupError::InvalidRequest => error_code::INVALID_REQUEST,
        GroupError::UnsupportedVersion => error_code::UNSUPPORTED_VERSION,
    }
}

/// The Kafka error code for a transaction coordinator's refusal (as Kafka's
/// `TransactionCoordinator` answers; PRODUCER_FENCED is turned into
/// INVALID_PRODUCER_EPOCH for the old versions that do not know it, by each handler).
fn txn_error_code(e: &crate::txn::coordinator::TxnError) -> i16 {
    use crate::txn::coordinator::TxnError;
    match e {
        TxnError::ConcurrentTransactions => error_code::CONCURRENT_TRANSACTIONS,
        TxnError::InvalidTxnState => error_code::INVALID_TXN_STATE,
        TxnError::ProducerFenced => error_code::PRODUCER_FENCED,
        TxnError::InvalidProducerIdMapping => error_code::INVALID_PRODUCER_ID_MAPPING,
        TxnError::InvalidTransactionTimeout => error_code::INVALID_TRANSACTION_TIMEOUT,
    }
}

/// The Kafka error code of a transaction request's outcome (NONE for a success).
fn txn_outcome_code(o: &super::txn::TxnOutcome) -> i16 {
    use super::txn::TxnOutcome;
    match o {
        TxnOutcome::Answer(Ok(_)) | TxnOutcome::Describe(_) | TxnOutcome::List(_) | TxnOutcome::Verified(Ok(_)) => {
            error_code::NONE
        }
        TxnOutcome::Answer(Err(e)) | TxnOutcome::Verified(Err(e)) => txn_error_code(e),
        TxnOutcome::NotCoordinator => error_code::NOT_COORDINATOR,
        TxnOutcome::Loading => error_code::COORDINATOR_LOAD_IN_PROGRESS,
        TxnOutcome::NotAvailable | TxnOutcome::NeedProducerId => error_code::COORDINATOR_NOT_AVAILABLE,
    }
}

/// PRODUCER_FENCED for clients that know it (`first_version`: the first that does),
/// INVALID_PRODUCER_EPOCH for older ones, as Kafka answers them.
fn fenced_for_version(code: i16, version: i16, first_version: i16) -> i16 {
    if code == error_code::PRODUCER_FENCED && version < first_version {
        error_code::INVALID_PRODUCER_EPOCH
    } else {
        code
    }
}

/// A broker as Metadata and DescribeCluster list it: (id, host, port, rack).
struct ListedBroker {
    id: i32,
    host: String,
    port: i32,
    rack: Option<String>,
    fenced: bool,
}

/// The brokers clients are told about: the live ones (with `include_fenced`, the fenced
/// ones too: DescribeCluster v2), and this broker even when it is not registered yet
/// (clients must still be able to reach it). Each is listed at the address of its
/// listener with the name of the one `frame` came through, as Kafka does; a broker
/// without such a listener is left out (a broker that registered no listeners is listed
/// at its inter-broker address).
fn listed_brokers(
    ctx: &ShardContext,
    view: &crate::coordinator::view::ClusterView,
    frame: &RequestFrame,
    include_fenced: bool,
) -> Vec<ListedBroker> {
    let me = ctx.config.node_id;
    let (my_host, my_port) = ctx.config.advertised_for(&frame.listener);
    let mut brokers: Vec<ListedBroker> = view
        .registered_brokers()
        .filter(|b| include_fenced || b.is_live())
        .filter_map(|b| {
            let (host, port) = if b.id.0 == me {
                (my_host.clone(), my_port)
            } else {
                let (host, port) = b.endpoint.for_listener(&frame.listener)?;
                (host.to_string(), port as i32)
            };
            Some(ListedBroker { id: b.id.0, host, port, rack: b.rack.clone(), fenced: b.fenced })
        })
        .collect();
    if !brokers.iter().any(|b| b.id == me) {
        brokers.push(ListedBroker { id: me, host: my_host, port: my_port, rack: None, fenced: false });
    }
    brokers
}

/// KIP-951's leader hints (Produce v10+, Fetch v16+), as Kafka's KafkaApis fills them:
/// a partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH gets the leader and
/// leader epoch in this broker's view ((-1, -1) when it knows none), and the answer lists
/// the endpoints of the leaders named, on the request's listener. A client then goes to
/// the new leader without a Metadata round trip first.
pub(super) struct LeaderHints {
    view: std::sync::Arc<crate::coordinator::view::ClusterView>,
    leaders: std::collections::BTreeSet<i32>,
}

impl LeaderHints {
    pub(super) fn new(ctx: &ShardContext) -> Self {
        Self { view: std::sync::Arc::clone(&ctx.view()), leaders: std::collections::BTreeSet::new() }
    }

    /// Whether a partition answered `code` gets a hint.
    pub(super) fn wanted(code: i16) -> bool {
        code == error_code::NOT_LEADER_OR_FOLLOWER || code == error_code::FENCED_LEADER_EPOCH
    }

    /// The (leader, leader epoch) hint for a partition answered `code`, if it gets one.
    pub(super) fn hint(&mut self, code: i16, topic: &str, partition: i32) -> Option<(i32, i32)> {
        if !Self::wanted(code) {
            return None;
        }
        let hint = match self.view.partition(topic, partition) {
            Some((_, state)) if state.leader.0 >= 0 => (state.leader.0, state.leader_epoch.0),
            _ => (-1, -1),
        };
        if hint.0 >= 0 {
            self.leaders.insert(hint.0);
        }
        Some(hint)
    }

    /// The name of the topic with id `id`, if this broker knows it.
    pub(super) fn topic_name(&self, id: uuid::Uuid) -> Option<String> {
        self.view.by_id(id).map(|(name, _)| name.clone())
    }

    /// The endpoints of the leaders hinted at, as Metadata would list them.
    fn endpoints(&self, ctx: &ShardContext, frame: &RequestFrame) -> Vec<ListedBroker> {
        if self.leaders.is_empty() {
            return Vec::new();
        }
        listed_brokers(ctx, &self.view, frame, false).into_iter().filter(|b| self.leaders.contains(&b.id)).collect()
    }
}

fn str_bytes(s: impl Into<String>) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.into())
}

/// Whether every write (and fsync) a group coordinator's records waited for succeeded:
/// commits and deletions answer COORDINATOR_NOT_AVAILABLE otherwise.
pub(super) async fn writes_succeeded(waits: Vec<crate::shard::DurableWait>) -> bool {
    let mut ok = true;
    for wait in waits {
        ok &= matches!(wait.await, Ok(Ok(())));
    }
    ok
}
