//! The coordinator link: how a broker that is not the active coordinator stays in the
//! cluster. One thread per broker (metadata traffic is a few requests a second; it must
//! never wait on, or delay, a data core):
//!
//! 1. find the active coordinator: the `--coordinator` address, or, with ZooKeeper, the
//!    broker named by `/controller`. When `/controller` is empty this broker stands for
//!    election: it opens the store as the active coordinator (which bumps
//!    `/controller_epoch`) and the link ends, its job done;
//! 2. register (BrokerRegistration; the answer is this incarnation's broker epoch);
//! 3. heartbeat every broker.heartbeat.interval.ms (BrokerHeartbeat), and in between
//!    long-poll the coordinator for cluster snapshots (a Fetch of `__cluster_metadata`)
//!    and install each one in the registry (through its owner, which publishes the
//!    view the shards read);
//! 4. on any failure, go back to 1. Meanwhile the broker keeps serving what it leads
//!    with the metadata it has (the coordinator fences it if it stays away too long).
//!
//! On shutdown the last heartbeat asks for a controlled shutdown (`want_shut_down`): the
//! coordinator moves leadership away before this broker exits.
//!
//! Blocking client code on purpose: it uses the CLI's blocking Kafka client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::broker_registration_request::Listener;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerHeartbeatRequest, BrokerId, BrokerRegistrationRequest, FetchRequest, TopicName};
use kafka_protocol::records::RecordBatchDecoder;

use crate::client::{sb, Connection, Error as ClientError};
use crate::coordinator::controller::ControllerConfig;
use crate::coordinator::layout::{self, paths};
use crate::coordinator::owner::Metadata;
use crate::coordinator::registry::{LocalBroker, RegistryError, CLUSTER_METADATA_TOPIC};
use crate::coordinator::store::MetaStore;
use crate::coordinator::zookeeper::ZkStore;
use crate::model::{BrokerEpoch, NodeId};

/// How long one request to the coordinator may take (the snapshot long-poll included).
const coordinator_request_timeout_ms: u64 = 5_000;
/// The longest a snapshot long-poll waits before the link looks at its heartbeat clock.
const snapshot_wait_ms_max: u64 = 500;
/// How often a broker checks, with ZooKeeper, that its coordinator still holds
/// `/controller`.
const election_check_interval_ms: u64 = 2_000;
/// How often the active coordinator's link checks whether it stepped down.
const active_poll_ms: u64 = 200;
/// Pause between attempts to find or reach the coordinator.
const retry_backoff_ms: u64 = 500;

/// Where the active coordinator is.
#[derive(Debug, Clone)]
pub enum Locator {
    /// `--coordinator HOST:PORT`: the broker running the embedded coordinator.
    Fixed(String),
    /// `--metadata zookeeper://...`: whoever holds `/controller`; when nobody does, this
    /// broker stands for election.
    ZooKeeper { url: String, session_timeout_ms: u64 },
}

pub struct Link {
    pub metadata: Arc<Metadata>,
    pub broker: LocalBroker,
    pub cluster_id: String,
    pub locator: Locator,
    pub heartbeat_interval: Duration,
    pub controller_config: ControllerConfig,
    pub shutdown: Arc<AtomicBool>,
    /// How connections to the coordinator secure themselves (the inter-broker listener's
    /// security; Err: a setting is missing, reported on each attempt).
    pub security: Result<crate::security::client::ClientSecurity, String>,
    /// Run once this broker has become the active coordinator (ZooKeeper takeover).
    pub on_active: Box<dyn Fn(&Metadata) + Send>,
}

#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("coordinator answered error code {0} to {1}")]
    Refused(i16, &'static str),
    #[error("metadata store: {0}")]
    Registry(#[from] RegistryError),
    #[error("{0}")]
    Other(String),
}

enum Located {
    /// The coordinator's address, and with ZooKeeper its broker id (re-checked while
    /// connected: a coordinator that lost `/controller` is deposed).
    At(String, Option<NodeId>),
    /// This broker is now the active coordinator.
    Active,
}

impl Link {
    pub fn spawn(self) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new().name("spate-coordinator-link".into()).spawn(move || self.run())
    }

    fn run(self) {
        self.run_until_shutdown();
        self.metadata.write_blocking(|reg| reg.set_left_cluster());
    }

    fn run_until_shutdown(&self) {
        let incarnation = uuid::Uuid::new_v4();
        let mut zk: Option<ZkStore> = None;
        let mut last_error = String::new();
        while !self.shutdown.load(Ordering::SeqCst) {
            if self.metadata.view().is_active() {
                // The active coordinator itself (with ZooKeeper): nothing to do unless it
                // loses its session and steps down.
                std::thread::sleep(Duration::from_millis(active_poll_ms));
                continue;
            }
            let outcome = match self.locate(&mut zk) {
                Ok(Located::Active) => {
                    (self.on_active)(&self.metadata);
                    continue;
                }
                Ok(Located::At(addr, id)) => self.session(&addr, id.zip(zk.as_ref()), incarnation),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => return, // shutdown
                Err(e) => {
                    let text = e.to_string();
                    if text != last_error {
                        tracing::warn!(error = %text, "coordinator link: retrying");
                        last_error = text;
                    }
                    if matches!(e, LinkError::Registry(_)) {
                        zk = None; // reconnect to ZooKeeper on the next round
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(retry_backoff_ms));
        }
    }

    fn locate(&self, zk: &mut Option<ZkStore>) -> Result<Located, LinkError> {
        let (url, session_timeout_ms) = match &self.locator {
            Locator::Fixed(addr) => return Ok(Located::At(addr.clone(), None)),
            Locator::ZooKeeper { url, session_timeout_ms } => (url, *session_timeout_ms),
        };
        if zk.as_ref().is_none_or(|s| !s.session_alive()) {
            *zk = Some(ZkStore::connect(url, session_timeout_ms).map_err(RegistryError::from)?);
        }
        let store = zk.as_ref().expect("connected above");
        let holder = match store.get(paths::CONTROLLER).map_err(RegistryError::from)? {
            Some(node) => Some(layout::decode_controller(&node.data).map_err(|e| LinkError::Other(e.to_string()))?),
            None => None,
        };
        match holder {
            Some(id) if id != self.broker.id => {
                let node = store
                    .get(&paths::broker(id))
                    .map_err(RegistryError::from)?
                    .ok_or_else(|| LinkError::Other(format!("coordinator {id} has not registered its address yet")))?;
                let doc = layout::decode_broker(&node.data).map_err(|e| LinkError::Other(e.to_string()))?;
                Ok(Located::At(format!("{}:{}", doc.endpoint.host, doc.endpoint.port), Some(id)))
            }
            // Nobody, or a leftover of this broker's previous life: stand for election.
            _ => {
                let fresh = ZkStore::connect(url, session_timeout_ms).map_err(RegistryError::from)?;
                let now = super::now_ms() as u64;
                let controller_config = self.controller_config.clone();
                // On the owner thread: the takeover reads the store (ZooKeeper round
                // trips) and replaces the registry the shards' views come from.
                let attempt = self.metadata.write_blocking(move |reg| {
                    let active = reg.take_over(Box::new(fresh), now, controller_config)?;
                    reg.replace_with(active);
                    Ok(reg.controller_epoch())
                });
                match attempt {
                    Ok(epoch) => {
                        tracing::info!(controller_epoch = epoch, "this broker took over as the active coordinator");
                        Ok(Located::Active)
                    }
                    Err(RegistryError::ControllerTaken(id)) => {
                        Err(LinkError::Other(format!("broker {id} won the coordinator election")))
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Register with the coordinator at `addr`, then heartbeat and pull snapshots until
    /// something fails (Err) or the broker shuts down (Ok).
    fn session(
        &self,
        addr: &str,
        elected: Option<(NodeId, &ZkStore)>,
        incarnation: uuid::Uuid,
    ) -> Result<(), LinkError> {
        let timeout = Duration::from_millis(coordinator_request_timeout_ms);
        let security = self.security.as_ref().map_err(|e| LinkError::Other(e.clone()))?;
        let mut conn = Connection::open_secure(addr, timeout, &format!("spate-broker-{}", self.broker.id), security)?;
        let listeners = registration_listeners(&self.broker.endpoint);
        let req = BrokerRegistrationRequest::default()
            .with_broker_id(BrokerId(self.broker.id.0))
            .with_cluster_id(sb(&self.cluster_id))
            .with_incarnation_id(incarnation)
            .with_listeners(listeners)
            .with_rack(self.broker.rack.as_deref().map(sb));
        let (_, resp) = conn.call(&req)?;
        if resp.error_code != 0 {
            return Err(LinkError::Refused(resp.error_code, "BrokerRegistration"));
        }
        let epoch = BrokerEpoch(resp.broker_epoch);
        tracing::info!(coordinator = %addr, broker_epoch = %epoch, "registered with the active coordinator");
        // The coordinator has seen this process: once we hold a snapshot taken after that,
        // replicated partitions may take their roles (see ClusterView::may_take_roles).
        pull_snapshot(&self.metadata, &mut conn, self.broker.id, Duration::ZERO)?;
        self.metadata.write_blocking(|reg| reg.set_registered());
        let result = self.registered(&mut conn, elected, epoch);
        self.metadata.write_blocking(|reg| reg.set_link_up(false));
        result
    }

    /// Heartbeat and pull snapshots as broker epoch `epoch`.
    fn registered(
        &self,
        conn: &mut Connection,
        elected: Option<(NodeId, &ZkStore)>,
        epoch: BrokerEpoch,
    ) -> Result<(), LinkError> {
        let mut next_heartbeat = Instant::now();
        let mut next_election_check = Instant::now() + Duration::from_millis(election_check_interval_ms);
        loop {
            if let Some((id, store)) = elected.filter(|_| Instant::now() >= next_election_check) {
                next_election_check = Instant::now() + Duration::from_millis(election_check_interval_ms);
                let holder = store.get(paths::CONTROLLER).map_err(RegistryError::from)?;
                let holder = holder.map(|n| layout::decode_controller(&n.data).unwrap_or(NodeId::NONE));
                if holder != Some(id) {
                    return Err(LinkError::Other(format!("broker {id} is no longer the elected coordinator")));
                }
            }
            let stopping = self.shutdown.load(Ordering::SeqCst);
            if stopping || Instant::now() >= next_heartbeat {
                let req = BrokerHeartbeatRequest::default()
                    .with_broker_id(BrokerId(self.broker.id.0))
                    .with_broker_epoch(epoch.0)
                    .with_current_metadata_offset(self.metadata.view().metadata_version() as i64)
                    .with_want_shut_down(stopping);
                let (_, resp) = conn.call(&req)?;
                if stopping {
                    // Learn where our leaderships went, so that clients still talking to
                    // us are told NOT_LEADER_OR_FOLLOWER and move on.
                    let _ = pull_snapshot(&self.metadata, conn, self.broker.id, Duration::ZERO);
                    tracing::info!(done = resp.should_shut_down, "controlled shutdown: left the cluster");
                    return Ok(());
                }
                if resp.error_code != 0 {
                    return Err(LinkError::Refused(resp.error_code, "BrokerHeartbeat"));
                }
                self.metadata.write_blocking(|reg| reg.set_link_up(true));
                next_heartbeat += self.heartbeat_interval;
            }
            let wait = next_heartbeat
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(snapshot_wait_ms_max));
            pull_snapshot(&self.metadata, conn, self.broker.id, wait)?;
        }
    }
}

/// Ask the coordinator on `conn` for a snapshot newer than the one `metadata` holds,
/// waiting at most `wait`, and install it. Returns whether one came.
pub fn pull(metadata: &Metadata, conn: &mut Connection, broker_id: NodeId, wait: Duration) -> Result<bool, String> {
    pull_snapshot(metadata, conn, broker_id, wait).map_err(|e| e.to_string())
}

fn pull_snapshot(
    metadata: &Metadata,
    conn: &mut Connection,
    broker_id: NodeId,
    wait: Duration,
) -> Result<bool, LinkError> {
    let known = metadata.view().metadata_version() as i64;
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(broker_id.0))
        .with_max_wait_ms(wait.as_millis() as i32)
        .with_min_bytes(1)
        .with_max_bytes(crate::model::limits::fetch_response_bytes_max as i32)
        .with_topics(vec![FetchTopic::default().with_topic(TopicName(sb(CLUSTER_METADATA_TOPIC))).with_partitions(
            vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(known)
                .with_partition_max_bytes(i32::MAX)],
        )]);
    let (_, resp) = conn.call(&req)?;
    let Some(p) = resp.responses.first().and_then(|t| t.partitions.first()) else {
        return Err(LinkError::Other("empty answer to a snapshot fetch".into()));
    };
    if p.error_code != 0 {
        return Err(LinkError::Refused(p.error_code, "the snapshot fetch"));
    }
    let Some(mut records) = p.records.clone().filter(|r| !r.is_empty()) else {
        return Ok(false);
    };
    crate::log::batch::check_batches_records(&records).map_err(|e| LinkError::Other(format!("snapshot batch: {e}")))?;
    let set = RecordBatchDecoder::decode(&mut records).map_err(|e| LinkError::Other(format!("snapshot batch: {e}")))?;
    let value: Bytes = set
        .records
        .into_iter()
        .next()
        .and_then(|r| r.value)
        .ok_or_else(|| LinkError::Other("snapshot batch without a value".into()))?;
    // On the owner thread (which also writes the snapshot cache).
    let installed = metadata.write_blocking(move |reg| {
        if reg.is_active() {
            return Ok(None); // took over meanwhile: our own state wins
        }
        reg.apply_snapshot(&value).map(Some)
    });
    match installed.map_err(LinkError::Other)? {
        Some(version) => {
            tracing::debug!(version, "cluster snapshot installed");
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The Listeners of this broker's BrokerRegistration: every advertised listener by its
/// name and security protocol, the inter-broker one first (`Endpoint`'s order); with
/// none (Kafka's default listener alone), the inter-broker address under that name.
fn registration_listeners(endpoint: &crate::coordinator::controller::Endpoint) -> Vec<Listener> {
    let listeners = &endpoint.listeners;
    if listeners.is_empty() {
        return vec![Listener::default()
            .with_name(sb(layout::LISTENER))
            .with_host(sb(&endpoint.host))
            .with_port(endpoint.port)
            .with_security_protocol(0)];
    }
    listeners
        .iter()
        .map(|l| {
            let protocol = crate::config::SecurityProtocol::parse(&l.protocol).map_or(0, |p| p.id());
            Listener::default()
                .with_name(sb(&l.name))
                .with_host(sb(&l.host))
                .with_port(l.port)
                .with_security_protocol(protocol)
        })
        .collect()
}
