//! `spate topic create|list|describe|delete|alter-config`.

use clap::Subcommand;
use serde_json::json;

use super::output::{ids, table};
use super::{check_topic_name, output, parse_key_value, ConnArgs};
use spate::client::{Error, TopicInfo};

/// Kafka's "use the broker default" replication factor.
const replication_factor_default: i16 = -1;

#[derive(Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        /// Replicas per partition [default: the broker's default]
        #[arg(long, default_value_t = replication_factor_default)]
        replication_factor: i16,
        /// Topic config key=value (repeatable), e.g. retention.ms=60000
        #[arg(long = "config", value_parser = parse_key_value)]
        configs: Vec<(String, String)>,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// List topics with their partition counts.
    List {
        /// Also show internal topics (__consumer_offsets).
        #[arg(long)]
        internal: bool,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Partitions (leader, replicas, ISR, offsets) and configs of a topic.
    Describe {
        name: String,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Delete a topic.
    Delete {
        name: String,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Set topic configs (IncrementalAlterConfigs).
    AlterConfig {
        name: String,
        /// key=value (repeatable)
        #[arg(long = "set", value_parser = parse_key_value, required = true)]
        set: Vec<(String, String)>,
        #[command(flatten)]
        conn: ConnArgs,
    },
}

pub fn run(cmd: TopicCommand) -> Result<(), Error> {
    match cmd {
        TopicCommand::Create { name, partitions, replication_factor, configs, conn } => {
            check_topic_name(&name)?;
            if partitions < 1 {
                return Err(Error::Usage("--partitions must be at least 1".into()));
            }
            let mut client = conn.connect()?;
            client.create_topic(&name, partitions, replication_factor, &configs)?;
            if conn.json {
                output::json(&json!({"created": name, "partitions": partitions}));
            } else {
                output::print_raw(&format!("created topic {name} with {partitions} partitions\n"));
            }
        }
        TopicCommand::List { internal, conn } => {
            let mut client = conn.connect()?;
            let topics: Vec<TopicInfo> =
                client.list_topics()?.into_iter().filter(|t| internal || !t.internal).collect();
            if conn.json {
                output::json(&serde_json::to_value(&topics).map_err(output::json_err)?);
            } else {
                let rows: Vec<Vec<String>> = topics
                    .iter()
                    .map(|t| {
                        let rf = t.partitions.first().map(|p| p.replicas.len()).unwrap_or(0);
                        vec![t.name.clone(), t.partitions.len().to_string(), rf.to_string()]
                    })
                    .collect();
                table(&["NAME", "PARTITIONS", "REPLICAS"], &rows);
            }
        }
        TopicCommand::Describe { name, conn } => {
            check_topic_name(&name)?;
            let mut client = conn.connect()?;
            let info = client.describe_topic(&name)?;
            // Offline partitions (no leader) show "-" offsets and their error.
            let parts: Vec<i32> = info.partitions.iter().filter(|p| p.leader >= 0).map(|p| p.partition).collect();
            let earliest = client.list_offsets(&name, &parts, spate::client::timestamp_earliest)?;
            let latest = client.list_offsets(&name, &parts, spate::client::timestamp_latest)?;
            let configs = client.topic_configs(&name)?;
            if conn.json {
                let partitions: Vec<_> = info
                    .partitions
                    .iter()
                    .map(|p| {
                        json!({
                            "partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
                            "replicas": p.replicas, "in_sync_replicas": p.in_sync_replicas,
                            "offline_replicas": p.offline_replicas, "error": p.error,
                            "earliest_offset": earliest.get(&p.partition), "latest_offset": latest.get(&p.partition),
                        })
                    })
                    .collect();
                output::json(&json!({
                    "name": info.name, "internal": info.internal, "partitions": partitions,
                    "configs": serde_json::to_value(&configs).map_err(output::json_err)?,
                }));
            } else {
                output::print_raw(&format!(
                    "topic {}{}, {} partitions\n\n",
                    info.name,
                    if info.internal { " (internal)" } else { "" },
                    info.partitions.len()
                ));
                let rows: Vec<Vec<String>> = info
                    .partitions
                    .iter()
                    .map(|p| {
                        let off = |m: &std::collections::BTreeMap<i32, i64>| {
                            m.get(&p.partition).map(|o| o.to_string()).unwrap_or_else(|| "-".into())
                        };
                        vec![
                            p.partition.to_string(),
                            p.leader.to_string(),
                            p.leader_epoch.to_string(),
                            ids(&p.replicas),
                            ids(&p.in_sync_replicas),
                            off(&earliest),
                            off(&latest),
                            p.error.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                table(&["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "EARLIEST", "LATEST", "ERROR"], &rows);
                output::print_raw("\n");
                let rows: Vec<Vec<String>> = configs
                    .iter()
                    .map(|c| vec![c.name.clone(), c.value.clone().unwrap_or_else(|| "(null)".into()), c.source.into()])
                    .collect();
                table(&["CONFIG", "VALUE", "SOURCE"], &rows);
            }
        }
        TopicCommand::Delete { name, conn } => {
            check_topic_name(&name)?;
            let mut client = conn.connect()?;
            client.delete_topic(&name)?;
            if conn.json {
                output::json(&json!({"deleted": name}));
            } else {
                output::print_raw(&format!("deleted topic {name}\n"));
            }
        }
        TopicCommand::AlterConfig { name, set, conn } => {
            check_topic_name(&name)?;
            let mut client = conn.connect()?;
            client.alter_topic_configs(&name, &set)?;
            if conn.json {
                let set: serde_json::Map<String, serde_json::Value> =
                    set.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                output::json(&json!({"altered": name, "set": set}));
            } else {
                for (k, v) in &set {
                    output::print_raw(&format!("{name}: {k}={v}\n"));
                }
            }
        }
    }
    Ok(())
}
