//! The `spate` binary: `spate serve` runs a broker.

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
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML config file; flags given on the command line win over it.
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
    /// Number of cores (one pinned shard each) [default: all]
    #[arg(long)]
    cores: Option<usize>,
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
    /// group.initial.rebalance.delay.ms [default: 3000]
    #[arg(long)]
    group_initial_rebalance_delay_ms: Option<i64>,
    /// group.min.session.timeout.ms [default: 6000]
    #[arg(long)]
    group_min_session_timeout_ms: Option<i32>,
    /// offsets.retention.minutes [default: 10080]
    #[arg(long)]
    offsets_retention_minutes: Option<i64>,
    /// Fetched record sets of at least this many bytes are sent with sendfile (zero-copy) [default: 16384]
    #[arg(long)]
    fetch_zero_copy_bytes_min: Option<u64>,
}

fn load_config(args: ServeArgs) -> Result<BrokerConfig, String> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            toml::from_str::<BrokerConfig>(&text).map_err(|e| format!("{}: {e}", path.display()))?
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
    if let Some(v) = args.cores {
        if v == 0 {
            return Err("--cores must be at least 1".into());
        }
        config.cores = Some(v);
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
    if let Some(v) = args.offsets_retention_minutes {
        config.offsets_retention_minutes = v;
    }
    if let Some(v) = args.fetch_zero_copy_bytes_min {
        config.fetch_zero_copy_bytes_min = v;
    }
    if let Some(v) = args.fsync {
        config.fsync = v;
    }
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_level.as_deref());
    match cli.command {
        Command::Serve(args) => {
            let config = match load_config(args) {
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
