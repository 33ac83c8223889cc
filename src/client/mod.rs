//! A small blocking Kafka client for the operator tools (`spate topic`, `produce`,
//! `consume`, `group`, `acl`, `user`, `quota`). It speaks to any Kafka-compatible broker: versions are
//! negotiated with ApiVersions, requests are routed by Metadata to the partition leader
//! or the group coordinator, and retriable errors (leader moved, coordinator loading,
//! broken connection, timeout) are retried a bounded number of times after a metadata
//! refresh. One thread, one request in flight per connection; no runtime.

mod admin;
mod conn;
mod data;
mod group;
pub mod partitioner;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    BrokerId, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest,
    MetadataRequest, MetadataResponse, TopicName,
};
use kafka_protocol::protocol::{Request, StrBytes};

pub use admin::{entity_name, AclBinding, QuotaEntity, QuotaMatch};
pub use conn::Connection;
pub use data::{timestamp_earliest, timestamp_latest, ProduceRecord};

/// Requests that fail with a retriable error are tried at most this many more times.
pub const retries_max_default: u32 = 5;
/// Pause between retries (doubled each time, up to `retry_backoff_ms_max`).
pub const retry_backoff_ms_default: u64 = 100;
pub const retry_backoff_ms_max: u64 = 2_000;
/// Connect, read and write timeout for one request.
pub const request_timeout_ms_default: u64 = 10_000;
/// Broker-side timeout sent in admin requests (CreateTopics, DeleteTopics).
pub const admin_timeout_ms: i32 = 30_000;
/// Kafka's resource type for topics in DescribeConfigs / IncrementalAlterConfigs.
const resource_type_topic: i8 = 2;

/// What went wrong, sorted by what the caller does about it (see `exit_code`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No broker of the bootstrap list (or the one a request must go to) answers.
    #[error("{0}")]
    Unreachable(String),
    /// A connection broke mid-request.
    #[error("{0}")]
    Disconnected(String),
    /// No answer within the request timeout.
    #[error("{0}")]
    Timeout(String),
    /// The broker answered with a Kafka error code.
    #[error("{context}: {}{}", error_name(*code), message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Broker { context: String, code: i16, message: Option<String> },
    /// The broker does not speak an API (or a version) this needs.
    #[error("{0}")]
    Unsupported(String),
    /// A frame that does not encode or decode.
    #[error("{0}")]
    Protocol(String),
    /// The request is valid but the cluster's state forbids it now (exit 1).
    #[error("{0}")]
    State(String),
    /// The caller asked for something that cannot be (bad argument).
    #[error("{0}")]
    Usage(String),
    /// TLS or SASL failed: a certificate not trusted, a login refused.
    #[error("{0}")]
    Authentication(String),
}

impl Error {
    pub fn broker(context: impl Into<String>, code: i16, message: Option<&StrBytes>) -> Error {
        Error::Broker {
            context: context.into(),
            code,
            message: message.map(|m| m.to_string()).filter(|m| !m.is_empty()),
        }
    }

    /// Process exit code: 1 broker error, 2 bad usage, 3 unreachable.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Unreachable(_) | Error::Disconnected(_) | Error::Timeout(_) => 3,
            Error::Usage(_) => 2,
            Error::Broker { .. }
            | Error::Unsupported(_)
            | Error::Protocol(_)
            | Error::State(_)
            | Error::Authentication(_) => 1,
        }
    }

    fn retriable(&self) -> bool {
        match self {
            Error::Disconnected(_) | Error::Timeout(_) => true,
            Error::Broker { code, .. } => ResponseError::try_from_code(*code).is_some_and(|e| e.is_retriable()),
            _ => false,
        }
    }
}

/// A Kafka error code by its Java name (`UNKNOWN_TOPIC_OR_PARTITION`).
pub fn error_name(code: i16) -> String {
    let Some(e) = ResponseError::try_from_code(code) else { return "NONE".into() };
    if let ResponseError::Unknown(c) = e {
        return format!("error code {c}");
    }
    let camel = format!("{e}");
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, ch) in camel.chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(ch.to_ascii_uppercase());
    }
    out
}

fn check(context: impl FnOnce() -> String, code: i16, message: Option<&StrBytes>) -> Result<(), Error> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::broker(context(), code, message))
    }
}

pub fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

pub fn topic_name(s: &str) -> TopicName {
    TopicName(sb(s))
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub bootstrap: Vec<String>,
    pub request_timeout: Duration,
    pub retries_max: u32,
    pub client_id: String,
    /// How every connection secures itself (`--command-config`); PLAINTEXT by default.
    pub security: crate::security::client::ClientSecurity,
}

impl ClientConfig {
    pub fn new(bootstrap: &str) -> ClientConfig {
        ClientConfig {
            bootstrap: bootstrap.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
            request_timeout: Duration::from_millis(request_timeout_ms_default),
            retries_max: retries_max_default,
            client_id: "spate-cli".into(),
            security: crate::security::client::ClientSecurity::plaintext(),
        }
    }
}

/// One partition as Metadata describes it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PartitionInfo {
    pub partition: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub in_sync_replicas: Vec<i32>,
    pub offline_replicas: Vec<i32>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct TopicInfo {
    pub name: String,
    pub internal: bool,
    pub partitions: Vec<PartitionInfo>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ConfigEntry {
    pub name: String,
    pub value: Option<String>,
    pub source: &'static str,
    pub read_only: bool,
}

fn config_source_name(source: i8) -> &'static str {
    match source {
        1 => "topic",
        2 => "dynamic-broker",
        3 => "dynamic-default-broker",
        4 => "static-broker",
        5 => "default",
        6 => "dynamic-broker-logger",
        7 => "client-metrics",
        _ => "unknown",
    }
}

pub struct Client {
    config: ClientConfig,
    /// Open connections by address.
    conns: HashMap<String, Connection>,
    /// Known brokers (node id -> "host:port"), from the last Metadata.
    brokers: BTreeMap<i32, String>,
    /// Leader per (topic, partition), from the last Metadata.
    leaders: HashMap<(String, i32), i32>,
    /// Coordinator per group, from FindCoordinator.
    coordinators: HashMap<String, i32>,
}

impl Client {
    /// Connect to the first bootstrap broker that answers and learn the cluster.
    pub fn connect(config: ClientConfig) -> Result<Client, Error> {
        if config.bootstrap.is_empty() {
            return Err(Error::Usage("--bootstrap names no broker".into()));
        }
        let mut client = Client {
            config,
            conns: HashMap::new(),
            brokers: BTreeMap::new(),
            leaders: HashMap::new(),
            coordinators: HashMap::new(),
        };
        client.metadata(Some(&[]), false)?;
        Ok(client)
    }

    fn conn_to_addr(&mut self, addr: &str) -> Result<&mut Connection, Error> {
        if !self.conns.contains_key(addr) {
            let c = Connection::open_secure(
                addr,
                self.config.request_timeout,
                &self.config.client_id,
                &self.config.security,
            )?;
            self.conns.insert(addr.to_string(), c);
        }
        Ok(self.conns.get_mut(addr).expect("just inserted"))
    }

    /// An address that answers: an open connection, a known broker, or a bootstrap one.
    fn any_addr(&mut self) -> Result<String, Error> {
        if let Some(addr) = self.conns.keys().next() {
            return Ok(addr.clone());
        }
        let mut candidates: Vec<String> = self.brokers.values().cloned().collect();
        candidates.extend(self.config.bootstrap.iter().cloned());
        let mut last = None;
        for addr in candidates {
            match self.conn_to_addr(&addr) {
                Ok(_) => return Ok(addr),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Unreachable("no broker to connect to".into())))
    }

    fn node_addr(&mut self, node: i32) -> Result<String, Error> {
        if !self.brokers.contains_key(&node) {
            self.metadata(Some(&[]), false)?;
        }
        self.brokers
            .get(&node)
            .cloned()
            .ok_or_else(|| Error::Unreachable(format!("broker {node} is not in the cluster")))
    }

    fn send_addr<R: Request>(&mut self, addr: &str, req: &R) -> Result<(i16, R::Response), Error> {
        let result = self.conn_to_addr(addr)?.call(req);
        if matches!(result, Err(Error::Disconnected(_) | Error::Timeout(_) | Error::Protocol(_))) {
            self.conns.remove(addr); // the stream is out of step; start afresh
        }
        result
    }

    /// Send to any broker (admin requests the broker forwards to its controller).
    pub fn send_any<R: Request>(&mut self, req: &R) -> Result<(i16, R::Response), Error> {
        let addr = self.any_addr()?;
        self.send_addr(&addr, req)
    }

    pub fn send_to<R: Request>(&mut self, node: i32, req: &R) -> Result<(i16, R::Response), Error> {
        let addr = self.node_addr(node)?;
        self.send_addr(&addr, req)
    }

    /// Run `f`, retrying retriable errors after a backoff and a metadata refresh.
    pub fn with_retries<T>(&mut self, mut f: impl FnMut(&mut Client) -> Result<T, Error>) -> Result<T, Error> {
        let mut backoff_ms = retry_backoff_ms_default;
        let mut attempt = 0;
        loop {
            match f(self) {
                Err(e) if e.retriable() && attempt < self.config.retries_max => {
                    tracing::debug!(error = %e, attempt, "retrying");
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(backoff_ms));
                    backoff_ms = (backoff_ms * 2).min(retry_backoff_ms_max);
                    self.leaders.clear();
                    self.coordinators.clear();
                    let _ = self.metadata(Some(&[]), false);
                }
                other => return other,
            }
        }
    }

    /// Metadata for `topics` (None: all topics). Refreshes the broker and leader maps.
    pub fn metadata(&mut self, topics: Option<&[String]>, auto_create: bool) -> Result<MetadataResponse, Error> {
        let mut req = MetadataRequest::default().with_allow_auto_topic_creation(auto_create);
        req.topics = topics.map(|ts| {
            ts.iter()
                .map(|t| {
                    kafka_protocol::messages::metadata_request::MetadataRequestTopic::default()
                        .with_name(Some(topic_name(t)))
                })
                .collect()
        });
        let mut last = None;
        for _ in 0..=self.config.retries_max {
            match self.send_any(&req) {
                Ok((_, resp)) => {
                    self.brokers =
                        resp.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port))).collect();
                    for t in &resp.topics {
                        let Some(name) = &t.name else { continue };
                        for p in &t.partitions {
                            self.leaders.insert((name.to_string(), p.partition_index), p.leader_id.0);
                        }
                    }
                    return Ok(resp);
                }
                Err(e @ (Error::Disconnected(_) | Error::Timeout(_))) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Unreachable("metadata: no answer".into())))
    }

    fn topic_info(t: &kafka_protocol::messages::metadata_response::MetadataResponseTopic) -> TopicInfo {
        let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
        let mut partitions: Vec<PartitionInfo> = t
            .partitions
            .iter()
            .map(|p| PartitionInfo {
                partition: p.partition_index,
                leader: p.leader_id.0,
                leader_epoch: p.leader_epoch,
                replicas: ids(&p.replica_nodes),
                in_sync_replicas: ids(&p.isr_nodes),
                offline_replicas: ids(&p.offline_replicas),
                error: (p.error_code != 0).then(|| error_name(p.error_code)),
            })
            .collect();
        partitions.sort_by_key(|p| p.partition);
        TopicInfo {
            name: t.name.as_ref().map(|n| n.to_string()).unwrap_or_default(),
            internal: t.is_internal,
            partitions,
        }
    }

    pub fn list_topics(&mut self) -> Result<Vec<TopicInfo>, Error> {
        let resp = self.metadata(None, false)?;
        let mut topics: Vec<TopicInfo> = resp.topics.iter().map(Self::topic_info).collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(topics)
    }

    /// One topic's partitions; an unknown topic is an error.
    pub fn describe_topic(&mut self, name: &str) -> Result<TopicInfo, Error> {
        self.topic_partitions(name, false)
    }

    /// One topic's partitions, asking the broker to create the topic if it does not
    /// exist (Metadata `allow_auto_topic_creation`, as Kafka's producers do); still an
    /// error where the broker has `auto.create.topics.enable` off.
    pub fn describe_topic_auto_create(&mut self, name: &str) -> Result<TopicInfo, Error> {
        self.topic_partitions(name, true)
    }

    fn topic_partitions(&mut self, name: &str, auto_create: bool) -> Result<TopicInfo, Error> {
        self.with_retries(|c| {
            let resp = c.metadata(Some(&[name.to_string()]), auto_create)?;
            let t = resp
                .topics
                .iter()
                .find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == name))
                .ok_or_else(|| Error::broker(format!("topic '{name}'"), 3, None))?;
            check(|| format!("topic '{name}'"), t.error_code, None)?;
            Ok(Self::topic_info(t))
        })
    }

    /// The leader of a partition, from cached metadata or a refresh.
    pub fn leader(&mut self, topic: &str, partition: i32) -> Result<i32, Error> {
        if let Some(&l) = self.leaders.get(&(topic.to_string(), partition)) {
            if l >= 0 {
                return Ok(l);
            }
        }
        let info = self.describe_topic(topic)?;
        let p = info
            .partitions
            .iter()
            .find(|p| p.partition == partition)
            .ok_or_else(|| Error::broker(format!("topic '{topic}' partition {partition}"), 3, None))?;
        if p.leader < 0 {
            return Err(Error::broker(format!("topic '{topic}' partition {partition}"), 5, None));
        }
        Ok(p.leader)
    }

    pub fn create_topic(
        &mut self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &[(String, String)],
    ) -> Result<(), Error> {
        use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
        let topic = CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| CreatableTopicConfig::default().with_name(sb(k)).with_value(Some(sb(v))))
                    .collect(),
            );
        let req = CreateTopicsRequest::default().with_topics(vec![topic]).with_timeout_ms(admin_timeout_ms);
        let (_, resp) = self.send_any(&req)?;
        for t in &resp.topics {
            check(|| format!("create topic '{name}'"), t.error_code, t.error_message.as_ref())?;
        }
        Ok(())
    }

    pub fn delete_topic(&mut self, name: &str) -> Result<(), Error> {
        let req =
            DeleteTopicsRequest::default().with_topic_names(vec![topic_name(name)]).with_timeout_ms(admin_timeout_ms);
        let (_, resp) = self.send_any(&req)?;
        for t in &resp.responses {
            check(|| format!("delete topic '{name}'"), t.error_code, t.error_message.as_ref())?;
        }
        Ok(())
    }

    pub fn topic_configs(&mut self, name: &str) -> Result<Vec<ConfigEntry>, Error> {
        use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
        let req = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(resource_type_topic)
            .with_resource_name(sb(name))
            .with_configuration_keys(None)]);
        let (_, resp) = self.send_any(&req)?;
        let mut out = Vec::new();
        for r in &resp.results {
            check(|| format!("configs of topic '{name}'"), r.error_code, r.error_message.as_ref())?;
            for c in &r.configs {
                out.push(ConfigEntry {
                    name: c.name.to_string(),
                    value: if c.is_sensitive {
                        Some("(sensitive)".into())
                    } else {
                        c.value.as_ref().map(|v| v.to_string())
                    },
                    source: config_source_name(c.config_source),
                    read_only: c.read_only,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Set topic configs with IncrementalAlterConfigs (operation SET).
    pub fn alter_topic_configs(&mut self, name: &str, set: &[(String, String)]) -> Result<(), Error> {
        use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
        let configs = set
            .iter()
            .map(|(k, v)| AlterableConfig::default().with_name(sb(k)).with_config_operation(0).with_value(Some(sb(v))));
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(resource_type_topic)
            .with_resource_name(sb(name))
            .with_configs(configs.collect())]);
        let (_, resp) = self.send_any(&req).map_err(|e| match e {
            Error::Unsupported(_) => Error::Unsupported(
                "altering topic configs (IncrementalAlterConfigs) is not supported by this broker".into(),
            ),
            e => e,
        })?;
        for r in &resp.responses {
            check(|| format!("alter configs of topic '{name}'"), r.error_code, r.error_message.as_ref())?;
        }
        Ok(())
    }
}
