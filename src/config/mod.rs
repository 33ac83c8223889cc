//! Broker configuration (flags, TOML file) and topic configuration by Kafka's own
//! property names.
//!
//! Topic configs are kept as Kafka writes them (`retention.ms` -> "604800000") so that
//! DescribeConfigs can answer every key with its value and source, and converted to a
//! typed `LogConfig` for the partition log.

mod broker_defs;
pub mod kafka_broker;
pub mod properties;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::log::{LogConfig, TimestampType};
use crate::model::limits;

/// When the broker fsyncs on the produce path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FsyncMode {
    /// Kafka's default: no fsync on the produce path; topic flush.messages / flush.ms apply.
    Never,
    /// Group commit: every produce is acknowledged only after an fdatasync covers it.
    Always,
}

/// The broker's settings, after merging the TOML file and the flags (flags win).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    pub data_dir: PathBuf,
    pub listen: String,
    pub advertise: Option<String>,
    pub cores: Option<usize>,
    /// Pin each shard's thread to its own CPU (one per core, while there are at least
    /// as many CPUs as shards). false leaves placement to the kernel's scheduler: for
    /// hosts whose cores the broker shares with other busy processes.
    pub pin_shards: bool,
    pub node_id: i32,
    pub auto_create_topics: bool,
    pub num_partitions: i32,
    pub fsync: FsyncMode,
    /// Tests only (hidden flag `--test-fsync-delay-ms`): each group-commit fdatasync
    /// round sleeps this long after its fdatasyncs, before the appends it covers are
    /// acknowledged, so a test can tell whether acks wait for the fsync (kill -9 keeps
    /// the page cache, so data surviving it cannot). A clean shutdown's close of the logs
    /// sleeps as long first (a slow disk's close: housekeeping ticks meanwhile). 0, the
    /// default: no sleep.
    pub test_fsync_delay_ms: u64,
    /// Tests only (`--test-group-load-delay-ms`): a group load sleeps this long on the
    /// blocking pool before each of its reads (a slow disk, a large partition), so tests
    /// can see COORDINATOR_LOAD_IN_PROGRESS and a data core that goes on meanwhile. 0,
    /// the default: no sleep.
    pub test_group_load_delay_ms: u64,
    /// Tests only (`--test-txn-verification-delay-ms`): a transactional Produce's
    /// verification with its coordinator (KIP-890) waits this long first (a slow or
    /// remote coordinator). 0, the default: no wait.
    pub test_txn_verification_delay_ms: u64,
    /// Tests only (`--test-segment-files-budget`): the segment files' descriptor budget
    /// instead of the one derived from the open-files limit, so that a test sees idle
    /// files closed and opened again with a few partitions.
    pub test_segment_files_budget: Option<usize>,
    /// Broker-wide defaults for topic configs, by Kafka name (`log.retention.ms` style
    /// broker names are accepted in their topic form: `retention.ms`).
    pub topic_defaults: BTreeMap<String, String>,
    /// group.initial.rebalance.delay.ms
    pub group_initial_rebalance_delay_ms: i64,
    /// group.min.session.timeout.ms
    pub group_min_session_timeout_ms: i32,
    /// group.consumer.session.timeout.ms: consumer-protocol members (KIP-848) are
    /// removed this long after their last heartbeat.
    pub group_consumer_session_timeout_ms: i32,
    /// group.consumer.heartbeat.interval.ms: what consumer-protocol members are told.
    pub group_consumer_heartbeat_interval_ms: i32,
    /// offsets.retention.minutes
    pub offsets_retention_minutes: i64,
    /// Fetched record sets of at least this many bytes go from the segment file to the
    /// socket with sendfile; smaller ones are copied (one syscall costs more than a
    /// small copy). 0 = always zero-copy.
    pub fetch_zero_copy_bytes_min: u64,
    /// Write appends through a per-shard io_uring ring (coalesced writev); false writes
    /// them in place with pwrite (kept for comparison and for kernels without io_uring).
    pub append_io_uring: bool,
    /// With the ring: write appends on the shard itself (pwritev) while the kernel would
    /// not throttle page-cache writers, and through the ring only past that point.
    pub append_inline: bool,
    /// With the ring, under `--fsync never`: hand each segment's appended pages to the
    /// kernel's writeback every this many bytes (sync_file_range, not an fsync), so the
    /// flusher never meets a large backlog of them at once. 0 = leave it to the flusher.
    pub write_behind_bytes: u64,
    /// With the ring: each shard keeps only its this many most recently appended bytes
    /// in the page cache and drops older appended pages (fadvise DONTNEED), so the page
    /// cache recycles pages rather than growing into free memory (tuning.md: for VMs
    /// whose host takes free memory back). 0 = leave it to the kernel, as Kafka does.
    pub drop_behind_bytes: u64,
    /// Where cluster metadata lives: `local` (embedded in the data dir) or
    /// `zookeeper://HOST:PORT[,HOST:PORT...]/CHROOT`.
    pub metadata: String,
    /// Where to serve Prometheus metrics (`/metrics`); None: not served.
    pub metrics_listen: Option<String>,
    /// Join the cluster whose active coordinator answers at HOST:PORT (a broker started
    /// with the embedded `local` store). None: this broker runs a coordinator itself.
    pub coordinator: Option<String>,
    /// broker.rack: replicas of a partition are spread over racks.
    pub rack: Option<String>,
    /// broker.session.timeout.ms: a broker that has not heartbeated for this long is
    /// fenced and its leaderships move.
    pub broker_session_timeout_ms: u64,
    /// broker.heartbeat.interval.ms
    pub broker_heartbeat_interval_ms: u64,
    /// zookeeper.session.timeout.ms: with `--metadata zookeeper://`, how long after the
    /// active coordinator dies its `/controller` node vanishes and a standby takes over.
    pub zookeeper_session_timeout_ms: u64,
    /// default.replication.factor: for topics created without one (and auto-created).
    pub default_replication_factor: i32,
    /// offsets.topic.replication.factor: replicas of each `__consumer_offsets`
    /// partition. The active coordinator creates the topic once this many brokers are
    /// live, or at the first FindCoordinator it answers with fewer live (then with as
    /// many replicas as there are live brokers: a single broker works as it is).
    pub offsets_topic_replication_factor: i32,
    /// offsets.topic.segment.bytes: `__consumer_offsets`' segment.bytes (compaction
    /// cleans rolled segments only).
    pub offsets_topic_segment_bytes: i64,
    /// replica.lag.time.max.ms: a follower not caught up for this long leaves the ISR.
    pub replica_lag_time_max_ms: i64,
    /// producer.id.expiration.ms: a producer id idle this long (by its last batch's
    /// timestamp) is forgotten by the partitions; its next batch is accepted as new.
    pub producer_id_expiration_ms: i64,
    /// leader.imbalance.check.interval.ms: how often leadership goes back to preferred
    /// replicas (auto.leader.rebalance.enable); 0 disables it.
    pub leader_imbalance_check_interval_ms: u64,
    /// log.retention.check.interval.ms: how often each shard deletes segments past
    /// retention.ms / retention.bytes (at once, every second, while the disk is short of
    /// space).
    pub log_retention_check_interval_ms: u64,
    /// log.cleaner.enable: compacted topics are cleaned (false: they only grow).
    pub log_cleaner_enable: bool,
    /// log.cleaner.dedupe.buffer.size: bytes one shard's cleaning pass may hold in its
    /// key map (Kafka shares 128 MiB among its cleaner threads; here each shard runs one
    /// pass at a time, each within this).
    pub log_cleaner_dedupe_buffer_size: usize,
    /// log.cleaner.io.max.bytes.per.second: reads plus writes of one pass (unlimited by
    /// default, as Kafka's).
    pub log_cleaner_io_max_bytes_per_second: f64,
    /// unclean.leader.election.enable (broker-wide; a topic config overrides it): elect a
    /// leader outside the ISR, losing data, rather than leave a partition offline.
    pub unclean_leader_election_enable: bool,
    /// max.broker.partitions (KIP-578's name): the most partition replicas one broker
    /// hosts; CreateTopics / CreatePartitions / auto-creation beyond it are refused
    /// (POLICY_VIOLATION). None: the segment files' descriptor budget (the open-files
    /// limit less what connections may take and 1,000; `segment_files_budget`).
    pub max_broker_partitions: Option<usize>,
    /// max.connections: connections the broker holds; more are closed at accept.
    pub max_connections: usize,
    /// max.connections.per.ip: connections from one client IP; more are closed at accept.
    pub max_connections_per_ip: usize,
    /// connections.max.idle.ms: a connection that sends nothing for this long (with no
    /// request in flight) is closed.
    pub connections_max_idle_ms: u64,
    /// queued.max.request.bytes: bytes all requests being read or handled may hold;
    /// connections stop reading while it is used up, and a longer frame is refused.
    pub queued_max_request_bytes: usize,
    /// disk.free.min.bytes: produce is refused (KAFKA_STORAGE_ERROR, retriable) while the
    /// data dir's file system has less free space than this or than
    /// `disk_free_min_percent` of its size, whichever is more; fetches, groups and admin
    /// requests go on, and produce resumes once retention or a deletion freed space.
    /// 0 and 0 disable the check.
    pub disk_free_min_bytes: u64,
    /// disk.free.min.percent: see `disk_free_min_bytes`.
    pub disk_free_min_percent: u32,
    /// listeners, as Kafka writes them: `NAME://host:port,...` (`PLAINTEXT://:9092,
    /// SASL_SSL://0.0.0.0:9093`). None: one PLAINTEXT listener on `listen`. Given, it
    /// replaces `listen` / `advertise`, which then hold the inter-broker listener's.
    pub listeners: Option<String>,
    /// advertised.listeners: `NAME://host:port,...`; a listener not named here is
    /// advertised at its bind address.
    pub advertised_listeners: Option<String>,
    /// listener.security.protocol.map: `NAME:PROTOCOL,...` over Kafka's default, where
    /// each of PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL maps to itself.
    pub listener_security_protocol_map: Option<String>,
    /// inter.broker.listener.name: the listener other brokers reach this one on [default:
    /// PLAINTEXT if there is one, else the first listener].
    pub inter_broker_listener_name: Option<String>,
    /// ssl.keystore.location: a PEM file with the private key and the certificate chain
    /// (Kafka's `ssl.keystore.type=PEM`), for SSL and SASL_SSL listeners.
    pub ssl_keystore_location: Option<PathBuf>,
    /// ssl.key.password: the password of an encrypted (PKCS#8) private key in the keystore.
    pub ssl_key_password: Option<String>,
    /// ssl.truststore.location: a PEM file of the CA certificates client certificates are
    /// checked against.
    pub ssl_truststore_location: Option<PathBuf>,
    /// ssl.client.auth: `none`, `requested` or `required`.
    pub ssl_client_auth: String,
    /// ssl.principal.mapping.rules: how a client certificate's subject becomes the
    /// principal's name (`RULE:pattern/replacement/[LU]` and `DEFAULT`, comma-separated,
    /// first match wins; see security/principal_mapping.rs) [default: DEFAULT, the subject
    /// itself].
    pub ssl_principal_mapping_rules: String,
    /// sasl.enabled.mechanisms: of PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.
    pub sasl_enabled_mechanisms: String,
    /// SASL/PLAIN's users and passwords (Kafka's `user_<name>="<password>"` entries of
    /// the PLAIN JAAS config).
    pub sasl_plain_users: BTreeMap<String, String>,
    /// sasl.mechanism.inter.broker.protocol: the mechanism this broker logs in with when
    /// the inter-broker listener is SASL_PLAINTEXT or SASL_SSL [default: PLAIN, as Kafka].
    pub sasl_mechanism_inter_broker_protocol: String,
    /// The user this broker logs in as on other brokers' SASL inter-broker listener (Kafka's
    /// `username="..."` of `listener.name.<listener>.<mechanism>.sasl.jaas.config` or
    /// `sasl.jaas.config`). With PLAIN, every broker's `sasl_plain_users` must hold it;
    /// with SCRAM, its credential must be stored (`spate user` / AlterUserScramCredentials).
    pub inter_broker_sasl_username: Option<String>,
    /// Its password (Kafka's `password="..."` of the same JAAS config).
    pub inter_broker_sasl_password: Option<String>,
    /// connection.failed.authentication.delay.ms: a failed login is answered (and its
    /// connection closed) only after this long, so passwords cannot be tried at line rate.
    pub connection_failed_authentication_delay_ms: u64,
    /// connections.max.reauth.ms (KIP-368): a SASL session lives this long; the client
    /// re-authenticates on the same connection before it ends, or the connection is
    /// closed. 0: sessions do not expire.
    pub connections_max_reauth_ms: u64,
    /// authorizer.class.name: ACLs are enforced when set to Kafka's
    /// `org.apache.kafka.metadata.authorizer.StandardAuthorizer` or
    /// `kafka.security.authorizer.AclAuthorizer` (or `acl`); unset, everything is allowed.
    pub authorizer_class_name: Option<String>,
    /// super.users: principals allowed everything, `;`-separated (`User:admin;User:ops`).
    pub super_users: String,
    /// allow.everyone.if.no.acl.found: a resource with no ACL at all is open to everyone.
    pub allow_everyone_if_no_acl_found: bool,
    /// Every `key=value` of a Kafka `server.properties` file, as written (passwords too):
    /// DescribeConfigs shows the ones Spate has no setting of its own for as
    /// STATIC_BROKER_CONFIG, as Kafka shows its file. Only from such a file.
    #[serde(skip)]
    pub kafka_static: BTreeMap<String, String>,
    /// The listeners, resolved by `resolve_listeners` (not read from the file).
    #[serde(skip)]
    pub resolved_listeners: Vec<ListenerSpec>,
    /// How this broker secures its connections to other brokers' inter-broker listener,
    /// built by `resolve_listeners` (not read from the file); Err says which setting is
    /// missing, for a broker that is not (yet) part of a cluster.
    #[serde(skip)]
    pub inter_broker_client: Result<crate::security::client::ClientSecurity, String>,
}

/// A listener's security protocol (Kafka's `SecurityProtocol`, with its wire ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext = 0,
    Ssl = 1,
    SaslPlaintext = 2,
    SaslSsl = 3,
}

impl SecurityProtocol {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "PLAINTEXT" => Some(Self::Plaintext),
            "SSL" => Some(Self::Ssl),
            "SASL_PLAINTEXT" => Some(Self::SaslPlaintext),
            "SASL_SSL" => Some(Self::SaslSsl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    /// The id Kafka's wire messages carry (BrokerRegistration's listeners).
    pub fn id(self) -> i16 {
        self as i16
    }

    /// From the wire id.
    pub fn from_id(id: i16) -> Option<Self> {
        [Self::Plaintext, Self::Ssl, Self::SaslPlaintext, Self::SaslSsl].into_iter().find(|p| p.id() == id)
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// One listener, resolved from `listeners`, `advertised.listeners` and the protocol map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    /// Upper case, as Kafka normalises listener names.
    pub name: String,
    pub protocol: SecurityProtocol,
    /// Where it accepts connections (`host:port`; an empty host is every address).
    pub bind: String,
    /// What clients are told (`host:port`).
    pub advertised: String,
}

/// Parse `NAME://host:port,...` into (NAME, host:port) pairs.
fn parse_listener_list(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, addr) =
            item.split_once("://").ok_or_else(|| format!("listener {item:?} is not NAME://host:port"))?;
        let name = name.to_ascii_uppercase();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return Err(format!("bad listener name in {item:?}"));
        }
        let addr = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr.to_string() };
        split_host_port(&addr).ok_or_else(|| format!("bad address in listener {item:?}"))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(format!("listener {name} is named twice"));
        }
        out.push((name, addr));
    }
    Ok(out)
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./data"),
            listen: "127.0.0.1:9092".to_string(),
            advertise: None,
            cores: None,
            pin_shards: true,
            node_id: 1,
            auto_create_topics: true,
            num_partitions: 1,
            fsync: FsyncMode::Never,
            test_fsync_delay_ms: 0,
            test_group_load_delay_ms: 0,
            test_txn_verification_delay_ms: 0,
            test_segment_files_budget: None,
            topic_defaults: BTreeMap::new(),
            group_initial_rebalance_delay_ms: 3000,
            group_min_session_timeout_ms: 6000,
            group_consumer_session_timeout_ms: 45_000,
            group_consumer_heartbeat_interval_ms: 5_000,
            offsets_retention_minutes: 7 * 24 * 60,
            fetch_zero_copy_bytes_min: 16 * 1024,
            append_io_uring: true,
            append_inline: true,
            write_behind_bytes: 1024 * 1024,
            drop_behind_bytes: 0,
            metadata: "local".to_string(),
            metrics_listen: None,
            coordinator: None,
            rack: None,
            broker_session_timeout_ms: 9_000,
            broker_heartbeat_interval_ms: 1_000,
            zookeeper_session_timeout_ms: 18_000,
            default_replication_factor: 1,
            offsets_topic_replication_factor: 3,
            offsets_topic_segment_bytes: 104_857_600,
            replica_lag_time_max_ms: 30_000,
            producer_id_expiration_ms: limits::producer_id_expiration_ms_default,
            leader_imbalance_check_interval_ms: 300_000,
            log_retention_check_interval_ms: 300_000,
            log_cleaner_enable: true,
            log_cleaner_dedupe_buffer_size: 128 << 20,
            log_cleaner_io_max_bytes_per_second: f64::INFINITY,
            unclean_leader_election_enable: false,
            max_broker_partitions: None,
            max_connections: limits::connections_max_default,
            max_connections_per_ip: limits::connections_per_ip_max_default,
            connections_max_idle_ms: limits::connection_idle_ms_max_default,
            queued_max_request_bytes: limits::queued_request_bytes_max_default,
            disk_free_min_bytes: limits::disk_free_min_bytes_default,
            disk_free_min_percent: limits::disk_free_min_percent_default,
            listeners: None,
            advertised_listeners: None,
            listener_security_protocol_map: None,
            inter_broker_listener_name: None,
            ssl_keystore_location: None,
            ssl_key_password: None,
            ssl_truststore_location: None,
            ssl_client_auth: "none".to_string(),
            ssl_principal_mapping_rules: "DEFAULT".to_string(),
            sasl_enabled_mechanisms: "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512".to_string(),
            sasl_plain_users: BTreeMap::new(),
            connection_failed_authentication_delay_ms: 100,
            connections_max_reauth_ms: 0,
            sasl_mechanism_inter_broker_protocol: "PLAIN".to_string(),
            inter_broker_sasl_username: None,
            inter_broker_sasl_password: None,
            resolved_listeners: Vec::new(),
            inter_broker_client: Ok(crate::security::client::ClientSecurity::plaintext()),
            authorizer_class_name: None,
            super_users: String::new(),
            allow_everyone_if_no_acl_found: false,
            kafka_static: BTreeMap::new(),
        }
    }
}

impl BrokerConfig {
    pub fn group_config(&self) -> crate::group::GroupConfig {
        crate::group::GroupConfig {
            initial_rebalance_delay_ms: self.group_initial_rebalance_delay_ms.max(0),
            session_timeout_min_ms: self.group_min_session_timeout_ms.max(1),
            offsets_retention_ms: self.offsets_retention_minutes.saturating_mul(60_000),
            consumer: crate::group::consumer::ConsumerGroupConfig {
                session_timeout_ms: self.group_consumer_session_timeout_ms.max(1),
                heartbeat_interval_ms: self.group_consumer_heartbeat_interval_ms.max(1),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    pub fn offsets_topic(&self) -> OffsetsTopic {
        OffsetsTopic {
            replication_factor: self.offsets_topic_replication_factor,
            segment_bytes: self.offsets_topic_segment_bytes,
        }
    }

    /// The authorizer settings (`authorizer.class.name`, `super.users`,
    /// `allow.everyone.if.no.acl.found`); checked by `validate`.
    pub fn authorizer(&self) -> Result<crate::security::acl::AuthorizerConfig, String> {
        crate::security::acl::AuthorizerConfig::parse(
            self.authorizer_class_name.as_deref(),
            &self.super_users,
            self.allow_everyone_if_no_acl_found,
        )
    }

    pub fn advertised(&self) -> &str {
        self.advertise.as_deref().unwrap_or(&self.listen)
    }

    /// Every listener, resolved. Without `listeners`: one PLAINTEXT listener on `listen`
    /// advertised at `advertise`.
    pub fn listener_specs(&self) -> Result<Vec<ListenerSpec>, String> {
        let Some(listeners) = &self.listeners else {
            return Ok(vec![ListenerSpec {
                name: "PLAINTEXT".into(),
                protocol: SecurityProtocol::Plaintext,
                bind: self.listen.clone(),
                advertised: self.advertised().to_string(),
            }]);
        };
        let mut map: Vec<(String, SecurityProtocol)> = ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
            .iter()
            .map(|p| (p.to_string(), SecurityProtocol::parse(p).expect("Kafka's protocol names")))
            .collect();
        for item in self.listener_security_protocol_map.iter().flat_map(|m| m.split(',')).map(str::trim) {
            if item.is_empty() {
                continue;
            }
            let (name, protocol) = item
                .split_once(':')
                .ok_or_else(|| format!("listener.security.protocol.map entry {item:?} is not NAME:PROTOCOL"))?;
            let protocol = SecurityProtocol::parse(&protocol.to_ascii_uppercase())
                .ok_or_else(|| format!("unknown security protocol in {item:?}"))?;
            map.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
            map.push((name.to_ascii_uppercase(), protocol));
        }
        let advertised = match &self.advertised_listeners {
            Some(a) => parse_listener_list(a)?,
            None => Vec::new(),
        };
        let bound = parse_listener_list(listeners)?;
        if bound.is_empty() {
            return Err("listeners names no listener".into());
        }
        if bound.len() > limits::broker_listeners_max {
            return Err(format!(
                "listeners names {} listeners, more than {}",
                bound.len(),
                limits::broker_listeners_max
            ));
        }
        for (name, _) in &advertised {
            if !bound.iter().any(|(n, _)| n == name) {
                return Err(format!("advertised.listeners names {name}, which listeners does not"));
            }
        }
        bound
            .into_iter()
            .map(|(name, bind)| {
                let protocol = map.iter().find(|(n, _)| *n == name).map(|(_, p)| *p).ok_or_else(|| {
                    format!("listener {name} has no security protocol (listener.security.protocol.map)")
                })?;
                let advertised = match advertised.iter().find(|(n, _)| *n == name) {
                    Some((_, a)) => a.clone(),
                    None if bind.starts_with("0.0.0.0:") => {
                        return Err(format!("listener {name} binds every address: give advertised.listeners"))
                    }
                    None => bind.clone(),
                };
                Ok(ListenerSpec { name, protocol, bind, advertised })
            })
            .collect()
    }

    /// The listener other brokers reach this one on.
    pub fn inter_broker_listener(&self) -> Result<ListenerSpec, String> {
        let specs = self.listener_specs()?;
        match &self.inter_broker_listener_name {
            Some(name) => specs
                .into_iter()
                .find(|l| l.name.eq_ignore_ascii_case(name))
                .ok_or_else(|| format!("inter.broker.listener.name {name} is not among the listeners")),
            None => Ok(specs.iter().find(|l| l.name == "PLAINTEXT").unwrap_or(&specs[0]).clone()),
        }
    }

    /// Resolve `listeners` into `listen` / `advertise` (the inter-broker listener's, which
    /// the broker registers) and check the security settings. Run once after the config
    /// file and the flags are merged.
    pub fn resolve_listeners(&mut self) -> Result<(), String> {
        let specs = self.listener_specs()?;
        if self.listeners.is_some() {
            let inter = self.inter_broker_listener()?;
            self.listen = inter.bind.clone();
            self.advertise = Some(inter.advertised.clone());
            // A broker that joins a cluster must be able to reach the others; a lone
            // broker (or the first of a cluster, which others join) learns of a missing
            // setting when it first dials a peer, where the error is logged.
            self.inter_broker_client = self.inter_broker_client_security(inter.protocol);
            let clustered = self.coordinator.is_some() || self.metadata != "local";
            if let (true, Err(e)) = (clustered, &self.inter_broker_client) {
                return Err(format!("the inter-broker listener {} ({}): {e}", inter.name, inter.protocol.name()));
            }
        }
        if specs.iter().any(|l| l.protocol.uses_tls()) && self.ssl_keystore_location.is_none() {
            return Err("an SSL or SASL_SSL listener needs ssl.keystore.location".into());
        }
        crate::security::tls::ClientAuth::parse(&self.ssl_client_auth).ok_or_else(|| {
            format!("ssl.client.auth must be none, requested or required, not {:?}", self.ssl_client_auth)
        })?;
        self.sasl_mechanisms()?;
        crate::security::principal_mapping::PrincipalMapper::parse(&self.ssl_principal_mapping_rules)?;
        self.resolved_listeners = self.listener_specs()?;
        Ok(())
    }

    /// How this broker's connections to other brokers (replica fetchers, the
    /// coordinator link, forwarded requests, transaction markers) secure themselves: the
    /// inter-broker listener's protocol, TLS trusting `ssl.truststore.location` and
    /// presenting `ssl.keystore.location`, and a SASL login with
    /// `sasl.mechanism.inter.broker.protocol` as `inter_broker_sasl_username`.
    pub fn inter_broker_security(&self) -> Result<&crate::security::client::ClientSecurity, String> {
        self.inter_broker_client.as_ref().map_err(|e| format!("inter-broker security: {e}"))
    }

    fn inter_broker_client_security(
        &self,
        protocol: SecurityProtocol,
    ) -> Result<crate::security::client::ClientSecurity, String> {
        use crate::security::client::{ClientSecurity, ClientTlsFiles, SaslLogin};
        let tls = self.ssl_truststore_location.clone().map(|truststore| ClientTlsFiles {
            truststore,
            keystore: self.ssl_keystore_location.clone(),
            key_password: self.ssl_key_password.clone(),
        });
        let mechanism = crate::security::sasl::Mechanism::from_name(&self.sasl_mechanism_inter_broker_protocol)
            .ok_or_else(|| {
                format!(
                    "sasl.mechanism.inter.broker.protocol: {} is not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
                    self.sasl_mechanism_inter_broker_protocol
                )
            })?;
        let sasl = match (&self.inter_broker_sasl_username, &self.inter_broker_sasl_password) {
            (Some(username), Some(password)) => {
                Some(SaslLogin { mechanism, username: username.clone(), password: password.clone() })
            }
            _ => None,
        };
        if protocol.uses_sasl() && sasl.is_none() {
            return Err("a SASL inter-broker listener needs inter_broker_sasl_username and \
                        inter_broker_sasl_password (Kafka: username and password in the listener's sasl.jaas.config)"
                .into());
        }
        ClientSecurity::new(protocol, tls.as_ref(), sasl)
    }

    /// Where clients of listener `name` reach this broker (`host`, `port`): the
    /// listener's advertised address; the inter-broker one (`advertise`) for a listener
    /// this broker does not have.
    pub fn advertised_for(&self, name: &str) -> (String, i32) {
        let addr = self
            .resolved_listeners
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.advertised.as_str())
            .unwrap_or_else(|| self.advertised());
        split_host_port(addr).expect("validated at startup")
    }

    /// sasl.enabled.mechanisms, parsed.
    pub fn sasl_mechanisms(&self) -> Result<Vec<crate::security::sasl::Mechanism>, String> {
        self.sasl_enabled_mechanisms
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(|m| {
                crate::security::sasl::Mechanism::from_name(m).ok_or_else(|| {
                    format!("sasl.enabled.mechanisms: {m} is not supported (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
                })
            })
            .collect()
    }

    /// The TLS settings of SSL and SASL_SSL listeners, when a keystore is configured.
    pub fn tls_settings(&self) -> Option<crate::security::tls::TlsSettings> {
        Some(crate::security::tls::TlsSettings {
            keystore: self.ssl_keystore_location.clone()?,
            key_password: self.ssl_key_password.clone(),
            truststore: self.ssl_truststore_location.clone(),
            client_auth: crate::security::tls::ClientAuth::parse(&self.ssl_client_auth)?,
        })
    }

    /// Check what cannot be checked by types alone.
    pub fn validate(&self) -> Result<(), String> {
        if self.num_partitions < 1 || self.num_partitions > limits::topic_partitions_max {
            return Err(format!("num-partitions must be in 1..={}", limits::topic_partitions_max));
        }
        if self.node_id < 0 {
            return Err("node-id must be >= 0".into());
        }
        if let Some(c) = &self.coordinator {
            split_host_port(c).ok_or_else(|| format!("bad coordinator address {c:?}"))?;
            if self.metadata != "local" {
                return Err("--coordinator joins an embedded coordinator; with --metadata zookeeper:// the \
                            brokers find the active coordinator in ZooKeeper"
                    .into());
            }
        }
        if self.broker_heartbeat_interval_ms == 0 || self.broker_heartbeat_interval_ms >= self.broker_session_timeout_ms
        {
            return Err("broker heartbeat interval must be above 0 and below the broker session timeout".into());
        }
        if self.max_connections == 0 || self.max_connections_per_ip == 0 {
            return Err("max-connections and max-connections-per-ip must be at least 1".into());
        }
        if self.connections_max_idle_ms == 0 {
            return Err("connections-max-idle-ms must be at least 1".into());
        }
        if self.disk_free_min_percent > 100 {
            return Err("disk-free-min-percent must be at most 100".into());
        }
        if self.queued_max_request_bytes < 1024 {
            return Err("queued-max-request-bytes must be at least 1024".into());
        }
        split_host_port(self.advertised()).ok_or_else(|| format!("bad advertise address {:?}", self.advertised()))?;
        self.authorizer()?;
        TopicConfig::from_pairs(
            self.topic_defaults.iter().map(|(k, v)| (k.as_str(), Some(v.as_str()))),
            &TopicConfig::kafka_defaults(),
        )
        .map_err(|e| format!("topic_defaults: {e}"))?;
        Ok(())
    }
}

pub fn split_host_port(addr: &str) -> Option<(String, i32)> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    Some((host.trim_matches(|c| c == '[' || c == ']').to_string(), port as i32))
}

/// How `__consumer_offsets` is created (offsets.topic.*).
#[derive(Debug, Clone, Copy)]
pub struct OffsetsTopic {
    pub replication_factor: i32,
    pub segment_bytes: i64,
}

/// Where a config value comes from (Kafka's DescribeConfigs `config_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// Set on the topic (DYNAMIC_TOPIC_CONFIG = 1).
    Topic = 1,
    /// Set for this broker at run time, `/config/brokers/<id>` (DYNAMIC_BROKER_CONFIG = 2).
    DynamicBroker = 2,
    /// Set for every broker at run time, `/config/brokers/<default>`
    /// (DYNAMIC_DEFAULT_BROKER_CONFIG = 3).
    DynamicDefaultBroker = 3,
    /// Set in the broker's config file (STATIC_BROKER_CONFIG = 4).
    StaticBroker = 4,
    /// Kafka's default (DEFAULT_CONFIG = 5).
    Default = 5,
}

/// One supported topic config: Kafka name, default, and how to check a value.
struct TopicConfigKey {
    name: &'static str,
    default: &'static str,
    kind: ValueKind,
}

#[derive(Clone, Copy)]
enum ValueKind {
    /// A long with a minimum value.
    Long { min: i64 },
    /// One of a fixed set.
    Choice(&'static [&'static str]),
    /// A comma-separated list of distinct items from a fixed set, at least one.
    List(&'static [&'static str]),
    /// A double in [0, 1].
    Ratio,
    /// A long within [min, max].
    Range { min: i64, max: i64 },
    /// Any text (stored as given).
    Text,
    /// Kafka's throttled replica list: empty, `*`, or `partition:broker` items.
    ThrottledReplicas,
}

/// Every topic config Kafka 3.9 documents, with Kafka's defaults and validation. Those
/// marked "accepted, no effect" are stored and described but change nothing here (the
/// README lists them: message format and down-conversion are gone with magic 2, remote
/// storage does not exist yet, files are not preallocated).
/// Anything else is refused (INVALID_CONFIG), not ignored, so a user never believes an
/// unknown setting took effect.
const TOPIC_CONFIG_KEYS: &[TopicConfigKey] = &[
    TopicConfigKey { name: "cleanup.policy", default: "delete", kind: ValueKind::List(&["compact", "delete"]) },
    TopicConfigKey { name: "compression.gzip.level", default: "-1", kind: ValueKind::Range { min: -1, max: 9 } },
    TopicConfigKey { name: "compression.lz4.level", default: "9", kind: ValueKind::Range { min: 1, max: 17 } },
    TopicConfigKey {
        name: "compression.type",
        default: "producer",
        kind: ValueKind::Choice(&["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"]),
    },
    TopicConfigKey { name: "compression.zstd.level", default: "3", kind: ValueKind::Range { min: -131072, max: 22 } },
    TopicConfigKey { name: "delete.retention.ms", default: "86400000", kind: ValueKind::Long { min: 0 } },
    // Accepted, no effect: retention's segments are unlinked off the data core at once.
    TopicConfigKey { name: "file.delete.delay.ms", default: "60000", kind: ValueKind::Long { min: 0 } },
    TopicConfigKey { name: "flush.messages", default: "9223372036854775807", kind: ValueKind::Long { min: 1 } },
    TopicConfigKey { name: "flush.ms", default: "9223372036854775807", kind: ValueKind::Long { min: 0 } },
    // Replication throttles (server::throttle): `partition:broker,...` or `*`.
    TopicConfigKey { name: "follower.replication.throttled.replicas", default: "", kind: ValueKind::ThrottledReplicas },
    TopicConfigKey { name: "index.interval.bytes", default: "4096", kind: ValueKind::Long { min: 0 } },
    TopicConfigKey { name: "leader.replication.throttled.replicas", default: "", kind: ValueKind::ThrottledReplicas },
    // Accepted, no effect (no tiered storage).
    TopicConfigKey { name: "local.retention.bytes", default: "-2", kind: ValueKind::Long { min: -2 } },
    TopicConfigKey { name: "local.retention.ms", default: "-2", kind: ValueKind::Long { min: -2 } },
    TopicConfigKey { name: "max.compaction.lag.ms", default: "9223372036854775807", kind: ValueKind::Long { min: 1 } },
    TopicConfigKey { name: "max.message.bytes", default: "1048588", kind: ValueKind::Long { min: 0 } },
    // Accepted, no effect: only magic 2 is stored and served.
    TopicConfigKey {
        name: "message.downconversion.enable",
        default: "true",
        kind: ValueKind::Choice(&["true", "false"]),
    },
    TopicConfigKey { name: "message.format.version", default: "3.0-IV1", kind: ValueKind::Text },
    // CreateTime records outside [now - before, now + after] are refused
    // (INVALID_TIMESTAMP); difference.max.ms caps both.
    TopicConfigKey {
        name: "message.timestamp.after.max.ms",
        default: "9223372036854775807",
        kind: ValueKind::Long { min: 0 },
    },
    TopicConfigKey {
        name: "message.timestamp.before.max.ms",
        default: "9223372036854775807",
        kind: ValueKind::Long { min: 0 },
    },
    TopicConfigKey {
        name: "message.timestamp.difference.max.ms",
        default: "9223372036854775807",
        kind: ValueKind::Long { min: 0 },
    },
    TopicConfigKey {
        name: "message.timestamp.type",
        default: "CreateTime",
        kind: ValueKind::Choice(&["CreateTime", "LogAppendTime"]),
    },
    TopicConfigKey { name: "min.cleanable.dirty.ratio", default: "0.5", kind: ValueKind::Ratio },
    TopicConfigKey { name: "min.compaction.lag.ms", default: "0", kind: ValueKind::Long { min: 0 } },
    TopicConfigKey { name: "min.insync.replicas", default: "1", kind: ValueKind::Long { min: 1 } },
    // Accepted, no effect: segments are not preallocated.
    TopicConfigKey { name: "preallocate", default: "false", kind: ValueKind::Choice(&["true", "false"]) },
    // Accepted, no effect (no tiered storage); "true" is refused, as by a Kafka without it.
    TopicConfigKey { name: "remote.log.copy.disable", default: "false", kind: ValueKind::Choice(&["true", "false"]) },
    TopicConfigKey {
        name: "remote.log.delete.on.disable",
        default: "false",
        kind: ValueKind::Choice(&["true", "false"]),
    },
    TopicConfigKey { name: "remote.storage.enable", default: "false", kind: ValueKind::Choice(&["false"]) },
    TopicConfigKey { name: "retention.bytes", default: "-1", kind: ValueKind::Long { min: -1 } },
    TopicConfigKey { name: "retention.ms", default: "604800000", kind: ValueKind::Long { min: -1 } },
    TopicConfigKey { name: "segment.bytes", default: "1073741824", kind: ValueKind::Long { min: 14 } },
    TopicConfigKey { name: "segment.index.bytes", default: "10485760", kind: ValueKind::Long { min: 4 } },
    // Accepted, no effect: segments roll at segment.ms exactly.
    TopicConfigKey { name: "segment.jitter.ms", default: "0", kind: ValueKind::Long { min: 0 } },
    TopicConfigKey { name: "segment.ms", default: "604800000", kind: ValueKind::Long { min: 1 } },
    TopicConfigKey {
        name: "unclean.leader.election.enable",
        default: "false",
        kind: ValueKind::Choice(&["true", "false"]),
    },
];

/// The configs set on one topic (only what differs from the defaults), by Kafka name.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct TopicConfig {
    pub overrides: BTreeMap<String, String>,
    /// The dynamic broker configs that stand for topic defaults on this broker, by topic
    /// name, with their source (per broker over cluster-wide default): below the topic's
    /// own overrides, above the static `topic_defaults`. Filled in from the cluster
    /// metadata (`coordinator::registry`), never stored with the topic.
    #[serde(skip)]
    pub dynamic_defaults: BTreeMap<String, (String, ConfigSource)>,
}

/// The entity name of the cluster-wide dynamic broker config, as Kafka's ZooKeeper layout
/// names it (`/config/brokers/<default>`); the wire protocol names it "".
pub const BROKER_DEFAULT_ENTITY: &str = "<default>";

/// Broker configs that can be set at run time (per broker or cluster-wide, Kafka's
/// `DynamicLogConfig`): the defaults of topic configs, by broker name, each with the topic
/// config it is the default of. Each takes effect for every topic without its own
/// override, through the metadata view the shards take. Other broker configs are read-only.
pub const DYNAMIC_BROKER_TOPIC_CONFIGS: &[(&str, &str)] = &[
    ("log.cleanup.policy", "cleanup.policy"),
    ("log.cleaner.delete.retention.ms", "delete.retention.ms"),
    ("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms"),
    ("log.cleaner.min.cleanable.ratio", "min.cleanable.dirty.ratio"),
    ("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms"),
    ("log.flush.interval.messages", "flush.messages"),
    ("log.flush.interval.ms", "flush.ms"),
    ("log.index.interval.bytes", "index.interval.bytes"),
    ("log.index.size.max.bytes", "segment.index.bytes"),
    ("log.message.timestamp.after.max.ms", "message.timestamp.after.max.ms"),
    ("log.message.timestamp.before.max.ms", "message.timestamp.before.max.ms"),
    ("log.message.timestamp.type", "message.timestamp.type"),
    ("log.retention.bytes", "retention.bytes"),
    ("log.retention.ms", "retention.ms"),
    ("log.roll.ms", "segment.ms"),
    ("log.segment.bytes", "segment.bytes"),
    ("message.max.bytes", "max.message.bytes"),
    ("compression.type", "compression.type"),
    ("min.insync.replicas", "min.insync.replicas"),
];

/// The topic config a dynamic broker config is the default of.
pub fn dynamic_broker_config_topic_name(broker_name: &str) -> Option<&'static str> {
    DYNAMIC_BROKER_TOPIC_CONFIGS.iter().find(|(b, _)| *b == broker_name).map(|(_, t)| *t)
}

/// Dynamic broker configs of their own (not topic defaults): the replication throttle
/// rates in bytes per second (Kafka's `QuotaConfig`), each a long >= 0, unlimited by
/// default. `replica.alter.log.dirs.io.max.bytes.per.second` is accepted with no effect
/// (one log dir per broker: nothing moves between dirs).
pub const DYNAMIC_BROKER_RATE_CONFIGS: &[&str] = &[
    "follower.replication.throttled.rate",
    "leader.replication.throttled.rate",
    "replica.alter.log.dirs.io.max.bytes.per.second",
];

/// Kafka's default of the throttle rates: no limit (`Long.MAX_VALUE`).
pub const THROTTLED_RATE_UNLIMITED: i64 = i64::MAX;

/// Whether `name` is a broker config that may be set at run time.
pub fn is_dynamic_broker_config(name: &str) -> bool {
    dynamic_broker_config_topic_name(name).is_some() || DYNAMIC_BROKER_RATE_CONFIGS.contains(&name)
}

/// Checks a dynamic change of broker config `name` to `value` (`None`: deleting it) on
/// a broker, or on the cluster-wide default (`at_default`), whose value in effect is
/// `current`. Refused as Kafka 4.4 refuses it (every refusal is INVALID_REQUEST there),
/// with Kafka's message: a read-only config, a per-broker one at the default, a value its
/// type or validator refuses (`kafka_broker`). Spate's own dynamic configs (topic
/// defaults, throttle rates) are also checked as Spate applies them; those Spate reads
/// only at startup are refused. A name Kafka does not define is accepted and stored, as
/// Kafka does (plugins read their own).
pub fn check_dynamic_broker_config(
    name: &str,
    value: Option<&str>,
    at_default: bool,
    current: Option<&str>,
) -> Result<(), String> {
    use kafka_broker::{check_kafka_dynamic, check_kafka_value, kafka_broker_config, KafkaConfigRefusal, Mode};
    let kafka = kafka_broker_config(name);
    if !is_dynamic_broker_config(name) {
        return match kafka {
            Some(config) => check_kafka_dynamic(config, value, at_default, current).map_err(|r| r.message(name)),
            None => Ok(()),
        };
    }
    if let Some(config) = kafka {
        if at_default && config.mode == Mode::PerBroker {
            return Err(KafkaConfigRefusal::PerBrokerOnly.message(name));
        }
        if let Some(v) = value {
            check_kafka_value(config, v)?;
        }
    }
    let Some(value) = value else { return Ok(()) };
    if DYNAMIC_BROKER_RATE_CONFIGS.contains(&name) {
        return match value.trim().parse::<i64>() {
            Ok(0..) => Ok(()),
            _ => Err(format!("{name} must be an integer >= 0")),
        };
    }
    let topic_name =
        dynamic_broker_config_topic_name(name).expect("a dynamic broker config is a rate or a topic default");
    let key =
        TOPIC_CONFIG_KEYS.iter().find(|k| k.name == topic_name).expect("dynamic broker configs name topic configs");
    check_value(key, value).map_err(|e| format!("{name}: {e}"))
}

/// The dynamic topic defaults in effect on broker `entity`: its own configs over the
/// cluster-wide default's, by topic name, with their source.
pub fn dynamic_topic_defaults(
    cluster_default: Option<&BTreeMap<String, String>>,
    this_broker: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, (String, ConfigSource)> {
    let mut out = BTreeMap::new();
    for (configs, source) in
        [(cluster_default, ConfigSource::DynamicDefaultBroker), (this_broker, ConfigSource::DynamicBroker)]
    {
        for (k, v) in configs.into_iter().flatten() {
            if let Some(t) = dynamic_broker_config_topic_name(k) {
                out.insert(t.to_string(), (v.clone(), source));
            }
        }
    }
    out
}

impl TopicConfig {
    pub fn kafka_defaults() -> BTreeMap<String, String> {
        TOPIC_CONFIG_KEYS.iter().map(|k| (k.name.to_string(), k.default.to_string())).collect()
    }

    /// Build from name/value pairs, checking every name and value. A `None` value
    /// resets to the default.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
        _defaults: &BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let mut overrides = BTreeMap::new();
        for (name, value) in pairs {
            let key = TOPIC_CONFIG_KEYS
                .iter()
                .find(|k| k.name == name)
                .ok_or_else(|| format!("unsupported topic config {name:?}"))?;
            let Some(value) = value else { continue };
            check_value(key, value)?;
            overrides.insert(name.to_string(), value.to_string());
        }
        Ok(Self { overrides, dynamic_defaults: BTreeMap::new() })
    }

    /// Kafka's LIST-type topic configs (IncrementalAlterConfigs APPEND / SUBTRACT).
    pub fn is_list(name: &str) -> bool {
        matches!(
            name,
            "cleanup.policy" | "follower.replication.throttled.replicas" | "leader.replication.throttled.replicas"
        )
    }

    /// Every supported config with the value the partition log runs with and its source
    /// (see `effective`), as DescribeConfigs shows it.
    pub fn describe(&self, broker_defaults: &BTreeMap<String, String>) -> Vec<(String, String, ConfigSource)> {
        TOPIC_CONFIG_KEYS
            .iter()
            .map(|key| {
                let (value, source) = self.effective(key, broker_defaults);
                (key.name.to_string(), value.to_string(), source)
            })
            .collect()
    }

    /// The value of one config and where it comes from: the first source, in precedence
    /// order (the topic's own, the dynamic defaults, the broker's, Kafka's), whose value
    /// checks out, taken trimmed as Kafka parses it (AlterConfigs accepts `"720000 "`). A
    /// value that does not check out (one another tool wrote to ZooKeeper was never checked
    /// here) is passed over rather than stop the data core that asked.
    fn effective<'a>(
        &'a self,
        key: &TopicConfigKey,
        broker_defaults: &'a BTreeMap<String, String>,
    ) -> (&'a str, ConfigSource) {
        [
            self.overrides.get(key.name).map(|v| (v, ConfigSource::Topic)),
            self.dynamic_defaults.get(key.name).map(|(v, source)| (v, *source)),
            broker_defaults.get(key.name).map(|v| (v, ConfigSource::StaticBroker)),
        ]
        .into_iter()
        .flatten()
        .find(|(v, _)| check_value(key, v).is_ok())
        .map(|(v, source)| (v.trim(), source))
        .unwrap_or((key.default, ConfigSource::Default))
    }

    /// The typed config the partition log runs with, from each config's `effective` value.
    pub fn log_config(&self, broker_defaults: &BTreeMap<String, String>) -> LogConfig {
        let values: BTreeMap<&str, &str> =
            TOPIC_CONFIG_KEYS.iter().map(|key| (key.name, self.effective(key, broker_defaults).0)).collect();
        let long = |name: &str| -> i64 {
            values.get(name).and_then(|v| v.parse::<i64>().ok()).expect("a checked value, or Kafka's default")
        };
        let clamp_u32 = |v: i64| v.clamp(0, u32::MAX as i64) as u32;
        let policy = values.get("cleanup.policy").copied().unwrap_or("delete");
        LogConfig {
            segment_bytes: long("segment.bytes").max(14) as u64,
            segment_ms: long("segment.ms"),
            segment_index_bytes: clamp_u32(long("segment.index.bytes")),
            index_interval_bytes: clamp_u32(long("index.interval.bytes")),
            max_message_bytes: clamp_u32(long("max.message.bytes")).min(limits::message_bytes_max),
            retention_ms: long("retention.ms"),
            retention_bytes: long("retention.bytes"),
            timestamp_type: if values.get("message.timestamp.type").copied() == Some("LogAppendTime") {
                TimestampType::LogAppendTime
            } else {
                TimestampType::CreateTime
            },
            flush_messages: long("flush.messages").max(1) as u64,
            flush_ms: long("flush.ms"),
            producer_id_expiration_ms: limits::producer_id_expiration_ms_default,
            timestamp_before_max_ms: long("message.timestamp.before.max.ms")
                .min(long("message.timestamp.difference.max.ms")),
            timestamp_after_max_ms: long("message.timestamp.after.max.ms")
                .min(long("message.timestamp.difference.max.ms")),
            compression: match values.get("compression.type").copied() {
                Some("uncompressed") => Some(0),
                Some("gzip") => Some(1),
                Some("snappy") => Some(2),
                Some("lz4") => Some(3),
                Some("zstd") => Some(4),
                _ => None,
            },
            delete: policy.split(',').any(|p| p.trim() == "delete"),
            compact: policy.split(',').any(|p| p.trim() == "compact"),
            delete_retention_ms: long("delete.retention.ms"),
            min_compaction_lag_ms: long("min.compaction.lag.ms"),
            max_compaction_lag_ms: long("max.compaction.lag.ms"),
            min_cleanable_dirty_ratio: values
                .get("min.cleanable.dirty.ratio")
                .and_then(|v| v.parse::<f64>().ok())
                .expect("a checked value, or Kafka's default"),
        }
    }
}

fn check_value(key: &TopicConfigKey, value: &str) -> Result<(), String> {
    match key.kind {
        ValueKind::Long { min } => {
            let v: i64 = value.trim().parse().map_err(|_| format!("{} must be an integer, got {value:?}", key.name))?;
            if v < min {
                return Err(format!("{} must be >= {min}, got {v}", key.name));
            }
            if key.name == "max.message.bytes" && v > limits::message_bytes_max as i64 {
                return Err(format!("max.message.bytes must be <= {}", limits::message_bytes_max));
            }
            Ok(())
        }
        ValueKind::List(choices) => {
            let items: Vec<&str> = value.split(',').map(str::trim).collect();
            let distinct: std::collections::BTreeSet<&str> = items.iter().copied().collect();
            if items.iter().all(|i| choices.contains(i)) && distinct.len() == items.len() {
                Ok(())
            } else {
                Err(format!("{} must be a list of distinct items from {choices:?}, got {value:?}", key.name))
            }
        }
        ValueKind::Range { min, max } => match value.trim().parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(()),
            _ => Err(format!("{} must be an integer in [{min}, {max}], got {value:?}", key.name)),
        },
        ValueKind::Text => Ok(()),
        ValueKind::ThrottledReplicas => {
            let item = |i: &str| {
                let mut parts = i.trim().splitn(2, ':');
                let number = |x: Option<&str>| x.is_some_and(|x| x.trim().parse::<u32>().is_ok());
                number(parts.next()) && number(parts.next())
            };
            let v = value.trim();
            if v.is_empty() || v == "*" || v.split(',').all(item) {
                Ok(())
            } else {
                Err(format!("{} must be a list of partition:broker items or \"*\", got {value:?}", key.name))
            }
        }
        ValueKind::Ratio => match value.trim().parse::<f64>() {
            Ok(v) if (0.0..=1.0).contains(&v) => Ok(()),
            _ => Err(format!("{} must be a number between 0 and 1, got {value:?}", key.name)),
        },
        ValueKind::Choice(choices) => {
            if choices.contains(&value) {
                Ok(())
            } else {
                Err(format!("{} must be one of {choices:?} (others are not supported yet), got {value:?}", key.name))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clustered_broker_needs_its_inter_broker_login() {
        let mut c = BrokerConfig {
            listeners: Some("CLIENT://127.0.0.1:9092,BROKER://127.0.0.1:9093".into()),
            listener_security_protocol_map: Some("CLIENT:SASL_PLAINTEXT,BROKER:SASL_PLAINTEXT".into()),
            inter_broker_listener_name: Some("BROKER".into()),
            coordinator: Some("127.0.0.1:9000".into()),
            ..BrokerConfig::default()
        };
        let e = c.clone().resolve_listeners().unwrap_err();
        assert!(e.contains("inter_broker_sasl_username"), "{e}");
        // The first broker of a cluster starts, and says what is missing when it dials.
        let mut first = BrokerConfig { coordinator: None, ..c.clone() };
        first.resolve_listeners().unwrap();
        assert!(first.inter_broker_security().unwrap_err().contains("inter_broker_sasl_username"));
        c.inter_broker_sasl_username = Some("broker".into());
        c.inter_broker_sasl_password = Some("secret".into());
        c.sasl_mechanism_inter_broker_protocol = "SCRAM-SHA-512".into();
        c.resolve_listeners().unwrap();
        let s = c.inter_broker_security().unwrap();
        assert_eq!(s.protocol, SecurityProtocol::SaslPlaintext);
        assert_eq!(s.sasl.as_ref().unwrap().mechanism, crate::security::sasl::Mechanism::ScramSha512);
        assert_eq!(c.listen, "127.0.0.1:9093");
        c.sasl_mechanism_inter_broker_protocol = "GSSAPI".into();
        assert!(c.resolve_listeners().unwrap_err().contains("sasl.mechanism.inter.broker.protocol"));
    }

    #[test]
    fn unsupported_config_is_refused() {
        let e = TopicConfig::from_pairs([("cleanup.policy", Some("compress"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("cleanup.policy"), "{e}");
        let e = TopicConfig::from_pairs([("cleanup.policy", Some("compact,compact"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("distinct"), "{e}");
        let e = TopicConfig::from_pairs([("min.cleanable.dirty.ratio", Some("1.5"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("between 0 and 1"), "{e}");
        let e = TopicConfig::from_pairs([("compression.typo", Some("lz4"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("unsupported"), "{e}");
        let e = TopicConfig::from_pairs([("compression.type", Some("brotli"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("compression.type"), "{e}");
        let e = TopicConfig::from_pairs([("compression.gzip.level", Some("10"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("[-1, 9]"), "{e}");
        let e = TopicConfig::from_pairs([("remote.storage.enable", Some("true"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("remote.storage.enable"), "{e}");
        for (k, v) in [("message.format.version", "2.8"), ("preallocate", "true"), ("segment.jitter.ms", "5")] {
            TopicConfig::from_pairs([(k, Some(v))], &BTreeMap::new()).unwrap();
        }
        let e = TopicConfig::from_pairs([("retention.ms", Some("abc"))], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("integer"), "{e}");
    }

    #[test]
    fn cleanup_policy_lists_set_delete_and_compact() {
        let lc = |v: &str| {
            TopicConfig::from_pairs([("cleanup.policy", Some(v))], &BTreeMap::new())
                .unwrap()
                .log_config(&BTreeMap::new())
        };
        assert_eq!((lc("delete").delete, lc("delete").compact), (true, false));
        assert_eq!((lc("compact").delete, lc("compact").compact), (false, true));
        assert_eq!((lc("compact,delete").delete, lc("compact,delete").compact), (true, true));
        assert_eq!((lc("delete, compact").delete, lc("delete, compact").compact), (true, true));
        let d = TopicConfig::default().log_config(&BTreeMap::new());
        assert_eq!((d.delete_retention_ms, d.min_compaction_lag_ms, d.min_cleanable_dirty_ratio), (86_400_000, 0, 0.5));
    }

    #[test]
    fn describe_lists_every_key_with_source() {
        let c = TopicConfig::from_pairs([("retention.ms", Some("1000"))], &BTreeMap::new()).unwrap();
        let mut broker = BTreeMap::new();
        broker.insert("segment.bytes".to_string(), "1048576".to_string());
        let d = c.describe(&broker);
        assert_eq!(d.len(), TOPIC_CONFIG_KEYS.len());
        let get = |n: &str| d.iter().find(|(k, _, _)| k == n).unwrap().clone();
        assert_eq!(get("retention.ms"), ("retention.ms".into(), "1000".into(), ConfigSource::Topic));
        assert_eq!(get("segment.bytes").2, ConfigSource::StaticBroker);
        assert_eq!(get("retention.bytes").2, ConfigSource::Default);
        let lc = c.log_config(&broker);
        assert_eq!(lc.retention_ms, 1000);
        assert_eq!(lc.segment_bytes, 1048576);
        assert_eq!(lc.max_message_bytes, 1_048_588);
    }

    /// A value AlterConfigs accepts is read as it was checked (trimmed), and one that was
    /// never checked (written to ZooKeeper by another tool) gives way to the broker's
    /// default, then Kafka's, where the log config used to panic the data core (the
    /// request_handler fuzz target's finding: AlterConfigs retention.ms "720000 ").
    #[test]
    fn log_config_reads_values_trimmed_and_never_panics_on_unchecked_ones() {
        for key in TOPIC_CONFIG_KEYS {
            assert!(check_value(key, key.default).is_ok(), "Kafka's default of {} checks out", key.name);
        }
        let checked = TopicConfig::from_pairs(
            [("retention.ms", Some("720000 ")), ("message.timestamp.type", Some("LogAppendTime"))],
            &BTreeMap::new(),
        )
        .unwrap();
        let lc = checked.log_config(&BTreeMap::new());
        assert_eq!((lc.retention_ms, lc.timestamp_type), (720_000, TimestampType::LogAppendTime));

        let unchecked = |pairs: &[(&str, &str)]| TopicConfig {
            overrides: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        let mut broker = BTreeMap::new();
        broker.insert("retention.ms".to_string(), "5000".to_string());
        let lc = unchecked(&[
            ("retention.ms", "abc"),
            ("segment.bytes", "-1"),
            ("min.cleanable.dirty.ratio", "NaN"),
            ("segment.index.bytes", "99999999999999999999"),
        ])
        .log_config(&broker);
        assert_eq!(lc.retention_ms, 5000, "the broker's default");
        assert_eq!(lc.segment_bytes, 1_073_741_824, "Kafka's default");
        assert_eq!(lc.min_cleanable_dirty_ratio, 0.5);
        assert_eq!(lc.segment_index_bytes, 10_485_760);
        // A bad override gives way to the next source in describe's order.
        let mut dynamic = unchecked(&[("retention.ms", "abc")]);
        dynamic.dynamic_defaults.insert("retention.ms".into(), ("7000".into(), ConfigSource::DynamicDefaultBroker));
        assert_eq!(dynamic.log_config(&broker).retention_ms, 7000, "the dynamic default first");
        broker.insert("retention.ms".to_string(), "also bad".to_string());
        assert_eq!(unchecked(&[("retention.ms", "abc")]).log_config(&broker).retention_ms, 604_800_000);
    }

    #[test]
    fn describe_shows_the_value_and_source_the_log_runs_with() {
        let shown = |c: &TopicConfig, broker: &BTreeMap<String, String>, name: &str| {
            c.describe(broker).into_iter().find(|(k, ..)| k == name).map(|(_, v, source)| (v, source)).unwrap()
        };
        let spaced = TopicConfig::from_pairs(
            [("retention.ms", Some("720000 ")), ("cleanup.policy", Some(" compact, delete"))],
            &BTreeMap::new(),
        )
        .unwrap();
        let none = BTreeMap::new();
        assert_eq!(shown(&spaced, &none, "retention.ms"), ("720000".to_string(), ConfigSource::Topic));
        assert_eq!(shown(&spaced, &none, "cleanup.policy"), ("compact, delete".to_string(), ConfigSource::Topic));

        // A value another tool wrote unchecked is passed over here as in log_config.
        let mut broker = BTreeMap::new();
        broker.insert("retention.ms".to_string(), " 5000".to_string());
        let bad = TopicConfig {
            overrides: [("retention.ms".to_string(), "soon".to_string())].into_iter().collect(),
            ..Default::default()
        };
        assert_eq!(shown(&bad, &broker, "retention.ms"), ("5000".to_string(), ConfigSource::StaticBroker));
        assert_eq!(bad.log_config(&broker).retention_ms, 5000);
        assert_eq!(shown(&bad, &none, "retention.ms"), ("604800000".to_string(), ConfigSource::Default));
    }
}
