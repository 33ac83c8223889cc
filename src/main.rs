//! The `spate` binary: `spate serve` runs a broker; `topic`, `produce`, `consume`,
//! `group` and `doctor` are the operator's tools (they talk to any Kafka-compatible
//! broker). Exit codes: 0 ok, 1 error from the broker, 2 bad usage, 3 unreachable.

// Limits are named TigerBeetle-style, lower case with the unit last.
#![allow(non_upper_case_globals)]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use spate::config::{BrokerConfig, FsyncMode};

#[derive(Parser)]
#[command(name = "spate", version, about = "A Kafka-compatible message broker, thread-per-core on io_uring")]
struct Cli {
    /// Log level (error, warn, info, debug, trace) or a tracing filter; RUST_LOG also works.
    #[arg(long, global = true)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker.
    Serve(Box<ServeArgs>),
    /// Create, list, describe, alter and delete topics.
    #[command(subcommand)]
    Topic(cli::TopicCommand),
    /// Send stdin lines as messages, one per line.
    Produce(cli::ProduceArgs),
    /// Print messages of a topic.
    Consume(cli::ConsumeArgs),
    /// List and describe consumer groups, reset their offsets.
    #[command(subcommand)]
    Group(cli::GroupCommand),
    /// Create, list and delete ACLs.
    #[command(subcommand)]
    Acl(cli::AclCommand),
    /// Users' SCRAM credentials.
    #[command(subcommand)]
    User(cli::UserCommand),
    /// Client quotas of users and client ids.
    #[command(subcommand)]
    Quota(cli::QuotaCommand),
    /// Check this host against tuning.md and say what to change.
    Doctor(cli::DoctorArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML config file, or a Kafka server.properties (a `.properties` name); flags given
    /// on the command line win over it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where partition logs and metadata live [default: ./data]
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address to accept Kafka clients on [default: 127.0.0.1:9092]
    #[arg(long)]
    listen: Option<String>,
    /// Address given to clients in Metadata [default: the listen address]
    #[arg(long)]
    advertise: Option<String>,
    /// listeners: NAME://host:port,... (replaces --listen; e.g. PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093)
    #[arg(long)]
    listeners: Option<String>,
    /// advertised.listeners: NAME://host:port,...
    #[arg(long)]
    advertised_listeners: Option<String>,
    /// listener.security.protocol.map: NAME:PROTOCOL,... over Kafka's default
    #[arg(long)]
    listener_security_protocol_map: Option<String>,
    /// inter.broker.listener.name [default: PLAINTEXT, else the first listener]
    #[arg(long)]
    inter_broker_listener_name: Option<String>,
    /// Number of cores (one shard each) [default: all]
    #[arg(long)]
    cores: Option<usize>,
    /// Pin each shard to its own CPU; false lets the kernel place them (a host shared with busy clients) [default: true]
    #[arg(long)]
    pin_shards: Option<bool>,
    /// This broker's node id [default: 1]
    #[arg(long)]
    node_id: Option<i32>,
    /// auto.create.topics.enable [default: true]
    #[arg(long)]
    auto_create_topics: Option<bool>,
    /// num.partitions for auto-created topics [default: 1]
    #[arg(long)]
    num_partitions: Option<i32>,
    /// never: Kafka's default, no fsync on the produce path; always: group commit, acks after fdatasync [default: never]
    #[arg(long, value_enum)]
    fsync: Option<FsyncMode>,
    /// Tests only: sleep this long after each group-commit fdatasync round, before its
    /// acks go out, and before the logs close at a clean shutdown [default: 0]
    #[arg(long, hide = true)]
    test_fsync_delay_ms: Option<u64>,
    /// Tests only: sleep this long before each read of a group load (the replay of a
    /// `__consumer_offsets` partition when this broker begins to lead it) [default: 0]
    #[arg(long, hide = true)]
    test_group_load_delay_ms: Option<u64>,
    /// Tests only: a transactional Produce's verification with its coordinator waits
    /// this long first [default: 0]
    #[arg(long, hide = true)]
    test_txn_verification_delay_ms: Option<u64>,
    /// Tests only: the descriptor budget of segment files [default: from the open-files limit]
    #[arg(long, hide = true)]
    test_segment_files_budget: Option<usize>,
    /// group.initial.rebalance.delay.ms [default: 3000]
    #[arg(long)]
    group_initial_rebalance_delay_ms: Option<i64>,
    /// group.min.session.timeout.ms [default: 6000]
    #[arg(long)]
    group_min_session_timeout_ms: Option<i32>,
    /// group.consumer.session.timeout.ms: consumer-protocol (KIP-848) sessions [default: 45000]
    #[arg(long)]
    group_consumer_session_timeout_ms: Option<i32>,
    /// group.consumer.heartbeat.interval.ms [default: 5000]
    #[arg(long)]
    group_consumer_heartbeat_interval_ms: Option<i32>,
    /// offsets.retention.minutes [default: 10080]
    #[arg(long)]
    offsets_retention_minutes: Option<i64>,
    /// Fetched record sets of at least this many bytes are sent with sendfile (zero-copy) [default: 16384]
    #[arg(long)]
    fetch_zero_copy_bytes_min: Option<u64>,
    /// Write appends through io_uring (coalesced writev) rather than pwrite [default: true]
    #[arg(long)]
    append_io_uring: Option<bool>,
    /// With io_uring appends: write them on the shard while the kernel's dirty pages are well below its throttling point, through the ring past it [default: true]
    #[arg(long)]
    append_inline: Option<bool>,
    /// With io_uring appends and --fsync never: hand each segment's appended pages to the kernel's writeback every N bytes (sync_file_range; durability is unchanged), 0 = off [default: 1048576]
    #[arg(long)]
    write_behind_bytes: Option<u64>,
    /// With io_uring appends: each shard keeps only its N most recently appended bytes in the page cache and drops older appended pages (fadvise DONTNEED), so the page cache recycles its pages instead of growing; consumers further back read from disk (tuning.md); 0 = off [default: 0]
    #[arg(long)]
    drop_behind_bytes: Option<u64>,
    /// Cluster metadata store: `local` (in the data dir) or zookeeper://HOST:PORT[,HOST:PORT...]/CHROOT [default: local]
    #[arg(long)]
    metadata: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics [default: off]
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Join the cluster whose embedded coordinator runs in the broker at HOST:PORT [default: run one here]
    #[arg(long)]
    coordinator: Option<String>,
    /// broker.rack [default: none]
    #[arg(long)]
    rack: Option<String>,
    /// broker.session.timeout.ms: brokers silent this long are fenced [default: 9000]
    #[arg(long)]
    broker_session_timeout_ms: Option<u64>,
    /// broker.heartbeat.interval.ms [default: 1000]
    #[arg(long)]
    broker_heartbeat_interval_ms: Option<u64>,
    /// zookeeper.session.timeout.ms [default: 18000]
    #[arg(long)]
    zookeeper_session_timeout_ms: Option<u64>,
    /// default.replication.factor for topics created without one [default: 1]
    #[arg(long)]
    default_replication_factor: Option<i32>,
    /// offsets.topic.replication.factor: replicas of __consumer_offsets, capped by the live brokers at its creation [default: 3]
    #[arg(long)]
    offsets_topic_replication_factor: Option<i32>,
    /// offsets.topic.segment.bytes: __consumer_offsets' segment size [default: 104857600]
    #[arg(long)]
    offsets_topic_segment_bytes: Option<i64>,
    /// replica.lag.time.max.ms: followers not caught up this long leave the ISR [default: 30000]
    #[arg(long)]
    replica_lag_time_max_ms: Option<i64>,
    /// producer.id.expiration.ms: idle producer ids are forgotten [default: 86400000]
    #[arg(long)]
    producer_id_expiration_ms: Option<i64>,
    /// How often leadership goes back to preferred replicas; 0: never [default: 300000]
    #[arg(long)]
    leader_imbalance_check_interval_ms: Option<u64>,
    /// log.retention.check.interval.ms: how often segments past retention are deleted [default: 300000]
    #[arg(long)]
    log_retention_check_interval_ms: Option<u64>,
    /// log.cleaner.enable: compact topics with cleanup.policy=compact [default: true]
    #[arg(long)]
    log_cleaner_enable: Option<bool>,
    /// log.cleaner.dedupe.buffer.size: bytes of keys one cleaning pass holds [default: 134217728]
    #[arg(long)]
    log_cleaner_dedupe_buffer_size: Option<usize>,
    /// log.cleaner.io.max.bytes.per.second: the cleaner's read+write budget [default: unlimited]
    #[arg(long)]
    log_cleaner_io_max_bytes_per_second: Option<f64>,
    /// unclean.leader.election.enable: elect leaders outside the ISR (data loss) [default: false]
    #[arg(long)]
    unclean_leader_election_enable: Option<bool>,
    /// max.broker.partitions: partition replicas one broker may host [default: open-files limit - connections - 1000]
    #[arg(long)]
    max_broker_partitions: Option<usize>,
    /// max.connections: connections the broker holds; more are closed [default: 10000]
    #[arg(long)]
    max_connections: Option<usize>,
    /// max.connections.per.ip: connections from one client IP; more are closed [default: 1000]
    #[arg(long)]
    max_connections_per_ip: Option<usize>,
    /// connections.max.idle.ms: close connections silent this long [default: 600000]
    #[arg(long)]
    connections_max_idle_ms: Option<u64>,
    /// queued.max.request.bytes: bytes requests being read or handled may hold [default: 536870912]
    #[arg(long)]
    queued_max_request_bytes: Option<usize>,
    /// disk.free.min.bytes: refuse produce (retriable KAFKA_STORAGE_ERROR) below this much free space on the data dir's file system [default: 1073741824]
    #[arg(long)]
    disk_free_min_bytes: Option<u64>,
    /// disk.free.min.percent: ... or below this percentage of its size, whichever is more; 0 and 0 disable [default: 1]
    #[arg(long)]
    disk_free_min_percent: Option<u32>,
    /// authorizer.class.name: enforce ACLs (org.apache.kafka.metadata.authorizer.StandardAuthorizer, kafka.security.authorizer.AclAuthorizer or acl) [default: none, everything allowed]
    #[arg(long)]
    authorizer_class_name: Option<String>,
    /// super.users: principals allowed everything, ';'-separated (User:admin;User:ops)
    #[arg(long)]
    super_users: Option<String>,
    /// allow.everyone.if.no.acl.found: a resource without any ACL is open to everyone [default: false]
    #[arg(long)]
    allow_everyone_if_no_acl_found: Option<bool>,
}

fn load_config(args: ServeArgs) -> Result<BrokerConfig, String> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if path.extension().is_some_and(|e| e == "properties") {
                // A Kafka server.properties: Kafka's names for what Spate shares with it.
                let (config, ignored) = spate::config::properties::from_properties(&text)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                if !ignored.is_empty() {
                    eprintln!(
                        "{}: settings Spate does not act on (kept and described): {}",
                        path.display(),
                        ignored.join(", ")
                    );
                }
                config
            } else {
                toml::from_str::<BrokerConfig>(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
        }
        None => BrokerConfig::default(),
    };
    if let Some(v) = args.data_dir {
        config.data_dir = v;
    }
    if let Some(v) = args.listen {
        config.listen = v;
    }
    if let Some(v) = args.advertise {
        config.advertise = Some(v);
    }
    if let Some(v) = args.listeners {
        config.listeners = Some(v);
    }
    if let Some(v) = args.advertised_listeners {
        config.advertised_listeners = Some(v);
    }
    if let Some(v) = args.listener_security_protocol_map {
        config.listener_security_protocol_map = Some(v);
    }
    if let Some(v) = args.inter_broker_listener_name {
        config.inter_broker_listener_name = Some(v);
    }
    if let Some(v) = args.cores {
        if v == 0 {
            return Err("--cores must be at least 1".into());
        }
        config.cores = Some(v);
    }
    if let Some(v) = args.pin_shards {
        config.pin_shards = v;
    }
    if let Some(v) = args.node_id {
        config.node_id = v;
    }
    if let Some(v) = args.auto_create_topics {
        config.auto_create_topics = v;
    }
    if let Some(v) = args.num_partitions {
        config.num_partitions = v;
    }
    if let Some(v) = args.group_initial_rebalance_delay_ms {
        config.group_initial_rebalance_delay_ms = v;
    }
    if let Some(v) = args.group_min_session_timeout_ms {
        config.group_min_session_timeout_ms = v;
    }
    if let Some(v) = args.group_consumer_session_timeout_ms {
        config.group_consumer_session_timeout_ms = v;
    }
    if let Some(v) = args.group_consumer_heartbeat_interval_ms {
        config.group_consumer_heartbeat_interval_ms = v;
    }
    if let Some(v) = args.offsets_retention_minutes {
        config.offsets_retention_minutes = v;
    }
    if let Some(v) = args.metadata {
        config.metadata = v;
    }
    if let Some(v) = args.append_io_uring {
        config.append_io_uring = v;
    }
    if let Some(v) = args.append_inline {
        config.append_inline = v;
    }
    if let Some(v) = args.write_behind_bytes {
        config.write_behind_bytes = v;
    }
    if let Some(v) = args.drop_behind_bytes {
        config.drop_behind_bytes = v;
    }
    if let Some(v) = args.fetch_zero_copy_bytes_min {
        config.fetch_zero_copy_bytes_min = v;
    }
    if let Some(v) = args.metrics_listen {
        config.metrics_listen = Some(v);
    }
    if let Some(v) = args.coordinator {
        config.coordinator = Some(v);
    }
    if let Some(v) = args.rack {
        config.rack = Some(v);
    }
    if let Some(v) = args.broker_session_timeout_ms {
        config.broker_session_timeout_ms = v;
    }
    if let Some(v) = args.broker_heartbeat_interval_ms {
        config.broker_heartbeat_interval_ms = v;
    }
    if let Some(v) = args.zookeeper_session_timeout_ms {
        config.zookeeper_session_timeout_ms = v;
    }
    if let Some(v) = args.default_replication_factor {
        config.default_replication_factor = v;
    }
    if let Some(v) = args.offsets_topic_segment_bytes {
        if v < 14 {
            return Err("--offsets-topic-segment-bytes must be at least 14".into());
        }
        config.offsets_topic_segment_bytes = v;
    }
    if let Some(v) = args.offsets_topic_replication_factor {
        config.offsets_topic_replication_factor = v.max(1);
    }
    if let Some(v) = args.replica_lag_time_max_ms {
        config.replica_lag_time_max_ms = v;
    }
    if let Some(v) = args.producer_id_expiration_ms {
        config.producer_id_expiration_ms = v.max(1);
    }
    if let Some(v) = args.unclean_leader_election_enable {
        config.unclean_leader_election_enable = v;
    }
    if let Some(v) = args.max_broker_partitions {
        config.max_broker_partitions = Some(v);
    }
    if let Some(v) = args.leader_imbalance_check_interval_ms {
        config.leader_imbalance_check_interval_ms = v;
    }
    if let Some(v) = args.log_retention_check_interval_ms {
        if v == 0 {
            return Err("--log-retention-check-interval-ms must be at least 1".into());
        }
        config.log_retention_check_interval_ms = v;
    }
    if let Some(v) = args.fsync {
        config.fsync = v;
    }
    if let Some(v) = args.log_cleaner_enable {
        config.log_cleaner_enable = v;
    }
    if let Some(v) = args.log_cleaner_dedupe_buffer_size {
        if v < 1024 {
            return Err("--log-cleaner-dedupe-buffer-size must be at least 1024".into());
        }
        config.log_cleaner_dedupe_buffer_size = v;
    }
    if let Some(v) = args.log_cleaner_io_max_bytes_per_second {
        if v.is_nan() || v <= 0.0 {
            return Err("--log-cleaner-io-max-bytes-per-second must be positive".into());
        }
        config.log_cleaner_io_max_bytes_per_second = v;
    }
    if let Some(v) = args.test_fsync_delay_ms {
        config.test_fsync_delay_ms = v;
    }
    if let Some(v) = args.test_group_load_delay_ms {
        config.test_group_load_delay_ms = v;
    }
    if let Some(v) = args.test_txn_verification_delay_ms {
        config.test_txn_verification_delay_ms = v;
    }
    if args.test_segment_files_budget.is_some() {
        config.test_segment_files_budget = args.test_segment_files_budget;
    }
    if let Some(v) = args.max_connections {
        config.max_connections = v;
    }
    if let Some(v) = args.max_connections_per_ip {
        config.max_connections_per_ip = v;
    }
    if let Some(v) = args.connections_max_idle_ms {
        config.connections_max_idle_ms = v;
    }
    if let Some(v) = args.disk_free_min_bytes {
        config.disk_free_min_bytes = v;
    }
    if let Some(v) = args.authorizer_class_name {
        config.authorizer_class_name = Some(v);
    }
    if let Some(v) = args.super_users {
        config.super_users = v;
    }
    if let Some(v) = args.allow_everyone_if_no_acl_found {
        config.allow_everyone_if_no_acl_found = v;
    }
    if let Some(v) = args.disk_free_min_percent {
        config.disk_free_min_percent = v;
    }
    if let Some(v) = args.queued_max_request_bytes {
        config.queued_max_request_bytes = v;
    }
    config.resolve_listeners()?;
    config.validate()?;
    Ok(config)
}

fn init_logging(level: Option<&str>) {
    let filter = match level {
        Some(l) => tracing_subscriber::EnvFilter::new(l),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
}

/// Parse the command line; a usage error is one line on stderr and exit code 2.
fn parse_cli() -> Result<Cli, ExitCode> {
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion) => {
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            Err(ExitCode::from(2))
        }
        Err(e) => {
            let text = e.render().to_string();
            let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("bad arguments");
            eprintln!("spate: {}", line.trim_start_matches("error: "));
            Err(ExitCode::from(2))
        }
    }
}

/// Let glibc's malloc keep the memory requests free and hand it to the next ones
/// (`limits::malloc_reuse_bytes`), instead of returning it to the kernel and taking it
/// back page fault by page fault.
fn keep_freed_memory() {
    let bytes = spate::model::limits::malloc_reuse_bytes as libc::c_int;
    // SAFETY: mallopt only sets the allocator's parameters (under its own lock).
    let set = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, bytes) == 1
    };
    if !set {
        tracing::warn!(
            "mallopt refused M_MMAP_THRESHOLD / M_TRIM_THRESHOLD: freed request memory goes back to the kernel"
        );
    }
}

/// The exit of a client subcommand.
fn client_exit(result: Result<(), spate::client::Error>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let text = e.to_string();
            eprintln!("spate: {}", text.lines().next().unwrap_or("error"));
            ExitCode::from(e.exit_code())
        }
    }
}

fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let is_serve = matches!(cli.command, Command::Serve(_));
    if is_serve || cli.log_level.is_some() {
        init_logging(cli.log_level.as_deref());
    } else {
        // The tools keep stderr for their one-line errors unless asked for more.
        init_logging(Some(&std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into())));
    }
    match cli.command {
        Command::Topic(cmd) => client_exit(cli::run_topic(cmd)),
        Command::Produce(args) => client_exit(cli::run_produce(args)),
        Command::Consume(args) => client_exit(cli::run_consume(args)),
        Command::Group(cmd) => client_exit(cli::run_group(cmd)),
        Command::Acl(cmd) => client_exit(cli::run_acl(cmd)),
        Command::User(cmd) => client_exit(cli::run_user(cmd)),
        Command::Quota(cmd) => client_exit(cli::run_quota(cmd)),
        Command::Doctor(args) => ExitCode::from(cli::doctor::run(args)),
        Command::Serve(args) => {
            keep_freed_memory();
            let config = match load_config(*args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("spate: {e}");
                    return ExitCode::from(2);
                }
            };
            match spate::server::run(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("spate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
