//! The operator's subcommands of the `spate` binary (`topic`, `produce`, `consume`,
//! `group`, `acl`, `user`, `quota`, `doctor`). Each talks to any Kafka-compatible broker through
//! `spate::client`, prints a human table (or JSON with `--json`), and maps failures to
//! exit codes: 0 ok, 1 error from the broker, 2 bad usage, 3 broker unreachable.
//! Errors are one line on stderr; nothing here panics on user input.

mod acl;
mod consume;
pub mod doctor;
mod group;
mod output;
mod produce;
mod quota;
mod topic;
mod user;

use std::time::Duration;

use clap::Args;

use spate::client::{Client, ClientConfig, Error};

pub use acl::AclCommand;
pub use consume::ConsumeArgs;
pub use doctor::DoctorArgs;
pub use group::GroupCommand;
pub use produce::ProduceArgs;
pub use quota::QuotaCommand;
pub use topic::TopicCommand;
pub use user::UserCommand;

/// Flags every client subcommand takes.
#[derive(Args, Clone, Debug)]
pub struct ConnArgs {
    /// Brokers to bootstrap from, HOST:PORT[,HOST:PORT...]
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Connect, read and write timeout per request, in milliseconds.
    #[arg(long, default_value_t = spate::client::request_timeout_ms_default)]
    pub request_timeout_ms: u64,
    /// Kafka client properties for TLS and SASL (security.protocol, sasl.mechanism,
    /// sasl.jaas.config, ssl.truststore.location, ssl.keystore.location; PEM files).
    #[arg(long)]
    pub command_config: Option<std::path::PathBuf>,
}

impl ConnArgs {
    pub fn connect(&self) -> Result<Client, Error> {
        let mut config = ClientConfig::new(&self.bootstrap);
        config.request_timeout = Duration::from_millis(self.request_timeout_ms.max(1));
        if let Some(path) = &self.command_config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::Usage(format!("--command-config {}: {e}", path.display())))?;
            let (security, _ignored) = spate::security::client::ClientSecurity::from_properties(&text)
                .map_err(|e| Error::Usage(format!("--command-config {}: {e}", path.display())))?;
            config.security = security;
        }
        Client::connect(config)
    }
}

/// Parse `key=value`.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected key=value, got {s:?}")),
    }
}

/// Kafka's topic name rule, checked before anything is sent.
pub fn check_topic_name(name: &str) -> Result<(), Error> {
    spate::coordinator::registry::validate_topic_name(name).map_err(|e| Error::Usage(e.to_string()))
}

/// Run a client subcommand; the error carries its exit code.
pub fn run_topic(cmd: TopicCommand) -> Result<(), Error> {
    topic::run(cmd)
}

pub fn run_group(cmd: GroupCommand) -> Result<(), Error> {
    group::run(cmd)
}

pub fn run_produce(args: ProduceArgs) -> Result<(), Error> {
    produce::run(args)
}

pub fn run_consume(args: ConsumeArgs) -> Result<(), Error> {
    consume::run(args)
}

pub fn run_acl(cmd: AclCommand) -> Result<(), Error> {
    acl::run(cmd)
}

pub fn run_user(cmd: UserCommand) -> Result<(), Error> {
    user::run(cmd)
}

pub fn run_quota(cmd: QuotaCommand) -> Result<(), Error> {
    quota::run(cmd)
}
