//! Admin requests on a broker that is not the active coordinator: CreateTopics,
//! DeleteTopics, CreatePartitions, ElectLeaders, AlterPartitionReassignments,
//! AlterConfigs, IncrementalAlterConfigs,
//! CreateAcls, DeleteAcls, AlterClientQuotas, AlterUserScramCredentials and
//! InitProducerId without a transactional id (producer ids come from the coordinator's
//! blocks) go to the active
//! coordinator as the client sent them (same header, same correlation id, same
//! version: every broker speaks the same versions), wrapped in an Envelope (KIP-590)
//! that carries the client's principal and address: the coordinator authorizes the
//! forwarding broker (CLUSTER_ACTION) and then the request as the client's, so a client
//! gets no more through another broker than it would from the coordinator itself. The
//! inner answer goes back to the client unchanged. Before answering, this broker pulls
//! the snapshot that includes the change, so a client that creates a topic here then
//! asks here for its metadata sees it.
//!
//! Runs on the blocking pool: it waits on another broker.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, EnvelopeRequest, TopicName};
use kafka_protocol::protocol::Encodable;

use crate::client::{sb, Connection};
use crate::coordinator::owner::Metadata;
use crate::coordinator::view::ClusterView;
use crate::model::NodeId;
use crate::protocol::{error_code, RequestFrame};

use super::context::ShardContext;
use super::link;

/// How long a forwarded admin request may take on the coordinator.
const forward_timeout_ms: u64 = 30_000;

/// The APIs a broker forwards to the active coordinator.
pub fn is_forwarded(key: ApiKey) -> bool {
    matches!(
        key,
        ApiKey::CreateTopics
            | ApiKey::DeleteTopics
            | ApiKey::CreatePartitions
            | ApiKey::ElectLeaders
            | ApiKey::AlterPartitionReassignments
            | ApiKey::AlterConfigs
            | ApiKey::IncrementalAlterConfigs
            | ApiKey::InitProducerId
            | ApiKey::CreateAcls
            | ApiKey::DeleteAcls
            | ApiKey::AlterClientQuotas
            | ApiKey::AlterUserScramCredentials
    )
}

/// Whether this request goes to the active coordinator: InitProducerId only without a
/// transactional id (a transactional one goes to the id's transaction coordinator,
/// which is the broker that received it or answers NOT_COORDINATOR).
pub fn is_forwarded_request(key: ApiKey, frame: &RequestFrame) -> bool {
    if key != ApiKey::InitProducerId {
        return is_forwarded(key);
    }
    match crate::protocol::decode_body::<kafka_protocol::messages::InitProducerIdRequest>(frame) {
        Ok(req) => req.transactional_id.is_none(),
        Err(_) => true, // the coordinator answers what does not decode
    }
}

/// The active coordinator's address, when this broker is not it and knows it.
fn coordinator_address(reg: &ClusterView) -> Option<String> {
    if reg.is_active() {
        return None;
    }
    let b = reg.broker_info(reg.active_controller_id()?)?;
    Some(format!("{}:{}", b.endpoint.host, b.endpoint.port))
}

/// How long a forwarded request waits for a reachable coordinator (a failover takes
/// the ZooKeeper session timeout plus a moment for the brokers to find the new one).
const coordinator_wait_ms: u64 = 25_000;
/// Pause between attempts to reach the coordinator.
const coordinator_retry_ms: u64 = 200;

enum Attempt<T> {
    Done(T),
    /// The coordinator could not be reached: nothing was sent, try again.
    Unreachable(String),
}

/// Run `f` (on the blocking pool) with a connection to the active coordinator, waiting
/// through a failover for up to `coordinator_wait_ms`. `Err` when no coordinator could
/// be reached in time.
pub(super) async fn with_coordinator<T: Send + 'static>(
    ctx: &ShardContext,
    f: impl Fn(&mut Connection, &Metadata) -> T + Send + Sync + 'static,
) -> Result<T, String> {
    let f = Arc::new(f);
    let deadline = std::time::Instant::now() + Duration::from_millis(coordinator_wait_ms);
    let mut last = "no active coordinator is known".to_string();
    loop {
        if let Some(addr) = coordinator_address(&ctx.view()) {
            let (f, metadata) = (f.clone(), ctx.metadata.clone());
            let security = ctx.config.inter_broker_security()?.clone();
            let attempt = ctx
                .run_blocking(move || {
                    let timeout = Duration::from_millis(forward_timeout_ms);
                    match Connection::open_secure(&addr, timeout, "spate-forward", &security) {
                        Ok(mut conn) => Attempt::Done(f(&mut conn, &metadata)),
                        Err(e) => Attempt::Unreachable(e.to_string()),
                    }
                })
                .await;
            match attempt {
                Attempt::Done(t) => return Ok(t),
                Attempt::Unreachable(e) => last = e,
            }
        } else if ctx.view().is_active() {
            return Err("this broker became the active coordinator".into());
        }
        if std::time::Instant::now() >= deadline || ctx.stopping.get() {
            return Err(last);
        }
        glommio::timer::sleep(Duration::from_millis(coordinator_retry_ms)).await;
    }
}

/// What became of a forwarded request.
#[derive(Debug)]
pub enum Forwarded {
    /// The coordinator's answer, a whole response frame for the client.
    Answer(Bytes),
    /// No coordinator took it (none reachable, or it is no longer the active one): the
    /// caller answers NOT_CONTROLLER and the client tries again.
    NoCoordinator,
    /// The coordinator could not read the inner request: the client's connection closes,
    /// as for a request that does not decode here.
    Malformed,
}

/// The Envelope that carries `frame` (its header and body) with its principal and
/// client address. The address is the client's IP as 4 or 16 bytes (0.0.0.0 if the
/// connection has none).
pub fn envelope_of(frame: &RequestFrame) -> Option<EnvelopeRequest> {
    let key = ApiKey::try_from(frame.api_key).ok()?;
    let header = frame.header.as_ref()?;
    let header_version = key.request_header_version(frame.api_version);
    let mut inner = BytesMut::with_capacity(header.compute_size(header_version).ok()? + frame.body.len());
    header.encode(&mut inner, header_version).ok()?;
    inner.extend_from_slice(&frame.body);
    let ip: IpAddr = frame.client_host.trim_start_matches('/').parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let address = match ip {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    };
    Some(
        EnvelopeRequest::default()
            .with_request_data(inner.freeze())
            .with_request_principal(Some(frame.principal.encode_forwarded()))
            .with_client_host_address(address),
    )
}

/// Forward `frame` to the active coordinator in an Envelope and return its answer.
pub async fn forward(ctx: &ShardContext, frame: &RequestFrame) -> Forwarded {
    let (Ok(key), Some(envelope)) = (ApiKey::try_from(frame.api_key), envelope_of(frame)) else {
        return Forwarded::Malformed;
    };
    let broker_id = NodeId(ctx.config.node_id);
    let outcome = with_coordinator(ctx, move |conn, metadata| {
        let answer = conn.call_version(ENVELOPE_VERSION, &envelope).map_err(|e| e.to_string())?;
        if answer.error_code == error_code::NONE {
            catch_up(metadata, conn, broker_id);
        }
        Ok::<_, String>(answer)
    })
    .await;
    let answer = match outcome.and_then(|r| r) {
        Ok(answer) => answer,
        Err(e) => {
            tracing::warn!(api = ?key, error = %e, "cannot forward to the active coordinator");
            return Forwarded::NoCoordinator;
        }
    };
    match (answer.error_code, answer.response_data) {
        (error_code::NONE, Some(data)) => {
            let mut whole = BytesMut::with_capacity(4 + data.len());
            whole.put_i32(data.len() as i32);
            whole.extend_from_slice(&data);
            Forwarded::Answer(whole.freeze())
        }
        (error_code::INVALID_REQUEST, _) => Forwarded::Malformed,
        (code, _) => {
            if code == error_code::CLUSTER_AUTHORIZATION_FAILED {
                tracing::error!(api = ?key, "the active coordinator refused this broker's forwarded request: \
                    its inter-broker principal needs CLUSTER_ACTION on the cluster (or to be a super user)");
            } else {
                tracing::warn!(api = ?key, error_code = code, "the active coordinator refused a forwarded request");
            }
            Forwarded::NoCoordinator
        }
    }
}

/// The Envelope version Spate's brokers send and handle (Kafka's only one).
pub const ENVELOPE_VERSION: i16 = 0;

/// Create a topic through the active coordinator (auto-creation on a broker that is not
/// it). Errors are (Kafka error code, message).
pub async fn create_topic(ctx: &ShardContext, name: &str, partitions: i32) -> Result<(), (i16, String)> {
    let (broker_id, name) = (NodeId(ctx.config.node_id), name.to_string());
    let outcome = with_coordinator(ctx, move |conn, metadata| {
        let req = CreateTopicsRequest::default().with_timeout_ms(forward_timeout_ms as i32).with_topics(vec![
            CreatableTopic::default()
                .with_name(TopicName(sb(&name)))
                .with_num_partitions(partitions)
                .with_replication_factor(-1),
        ]);
        let (_, resp) = conn.call(&req).map_err(|e| (error_code::NOT_CONTROLLER, e.to_string()))?;
        let code = resp.topics.first().map(|t| t.error_code).unwrap_or(error_code::UNKNOWN_SERVER_ERROR);
        catch_up(metadata, conn, broker_id);
        match code {
            error_code::NONE => Ok(()),
            code => Err((code, format!("the coordinator answered error code {code}"))),
        }
    })
    .await;
    outcome.map_err(|e| (error_code::NOT_CONTROLLER, e))?
}

/// Pull the snapshot that carries what the coordinator just did.
fn catch_up(metadata: &Metadata, conn: &mut Connection, broker_id: NodeId) {
    if let Err(e) = link::pull(metadata, conn, broker_id, Duration::ZERO) {
        tracing::debug!(error = %e, "snapshot pull after a forwarded request failed");
    }
}
