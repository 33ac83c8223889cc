//! `spate quota set|delete|describe`: client quotas through AlterClientQuotas /
//! DescribeClientQuotas, on a user, a client id, both, or their defaults (Kafka's
//! entities: `--user alice --client-id app` is the pair, `--user-default` the default
//! user). Keys are Kafka's: producer_byte_rate, consumer_byte_rate, request_percentage.

use clap::{Args, Subcommand};
use serde_json::json;

use super::output::{self, table};
use super::ConnArgs;
use spate::client::{entity_name, Error, QuotaEntity, QuotaMatch};
use spate::security::entity::{CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE};

const USER: &str = "user";
const CLIENT_ID: &str = "client-id";

#[derive(Subcommand)]
pub enum QuotaCommand {
    /// Set quotas of an entity (the keys given; the others stay).
    Set {
        #[command(flatten)]
        entity: EntityArgs,
        /// Bytes per second a producer may send to one broker.
        #[arg(long)]
        producer_byte_rate: Option<f64>,
        /// Bytes per second a consumer may fetch from one broker.
        #[arg(long)]
        consumer_byte_rate: Option<f64>,
        /// Percent of one request handler's time (per window) the entity may use.
        #[arg(long)]
        request_percentage: Option<f64>,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Remove quotas of an entity: the keys named, or all three.
    Delete {
        #[command(flatten)]
        entity: EntityArgs,
        /// producer_byte_rate, consumer_byte_rate or request_percentage (repeatable).
        #[arg(long = "key")]
        keys: Vec<String>,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// The quotas of the entities matching the options (every entity with none).
    Describe {
        #[command(flatten)]
        entity: EntityArgs,
        #[command(flatten)]
        conn: ConnArgs,
    },
}

#[derive(Args)]
pub struct EntityArgs {
    /// A user (the principal's name).
    #[arg(long, conflicts_with = "user_default")]
    user: Option<String>,
    /// The default user.
    #[arg(long)]
    user_default: bool,
    /// A client id.
    #[arg(long, conflicts_with = "client_default")]
    client_id: Option<String>,
    /// The default client id.
    #[arg(long)]
    client_default: bool,
}

impl EntityArgs {
    /// Per entity type given: the exact name, or the default.
    fn parts(&self) -> Vec<(String, QuotaMatch)> {
        let part = |t: &str, name: &Option<String>, default: bool| match (name, default) {
            (Some(n), _) => Some((t.to_string(), QuotaMatch::Exact(n.clone()))),
            (None, true) => Some((t.to_string(), QuotaMatch::Default)),
            (None, false) => None,
        };
        [part(USER, &self.user, self.user_default), part(CLIENT_ID, &self.client_id, self.client_default)]
            .into_iter()
            .flatten()
            .collect()
    }

    /// The one entity set or delete act on.
    fn entity(&self) -> Result<QuotaEntity, Error> {
        let parts = self.parts();
        if parts.is_empty() {
            return Err(Error::Usage("name an entity: --user, --user-default, --client-id or --client-default".into()));
        }
        Ok(parts
            .into_iter()
            .map(|(t, m)| match m {
                QuotaMatch::Exact(n) => (t, Some(n)),
                _ => (t, None),
            })
            .collect())
    }
}

pub fn run(cmd: QuotaCommand) -> Result<(), Error> {
    match cmd {
        QuotaCommand::Set { entity, producer_byte_rate, consumer_byte_rate, request_percentage, conn } => {
            let entity = entity.entity()?;
            let ops: Vec<(String, Option<f64>)> = [
                (PRODUCER_BYTE_RATE, producer_byte_rate),
                (CONSUMER_BYTE_RATE, consumer_byte_rate),
                (REQUEST_PERCENTAGE, request_percentage),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), Some(v))))
            .collect();
            if ops.is_empty() {
                return Err(Error::Usage(
                    "set needs --producer-byte-rate, --consumer-byte-rate or --request-percentage".into(),
                ));
            }
            let mut client = conn.connect()?;
            client.alter_client_quotas(&entity, &ops)?;
            done(&conn, "set", &entity, &ops);
        }
        QuotaCommand::Delete { entity, keys, conn } => {
            let entity = entity.entity()?;
            let all = [PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE];
            if let Some(bad) = keys.iter().find(|k| !all.contains(&k.as_str())) {
                return Err(Error::Usage(format!("--key {bad:?}: one of {}", all.join(", "))));
            }
            let keys = if keys.is_empty() { all.iter().map(|k| k.to_string()).collect() } else { keys };
            let ops: Vec<(String, Option<f64>)> = keys.into_iter().map(|k| (k, None)).collect();
            let mut client = conn.connect()?;
            client.alter_client_quotas(&entity, &ops)?;
            done(&conn, "deleted", &entity, &ops);
        }
        QuotaCommand::Describe { entity, conn } => {
            let mut client = conn.connect()?;
            let described = client.describe_client_quotas(&entity.parts(), false)?;
            if conn.json {
                let list: Vec<_> = described
                    .iter()
                    .map(|(e, values)| {
                        let quotas: serde_json::Map<String, serde_json::Value> =
                            values.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                        json!({"entity": entity_json(e), "quotas": quotas})
                    })
                    .collect();
                output::json(&json!({ "quotas": list }));
            } else {
                let rows: Vec<Vec<String>> = described
                    .iter()
                    .flat_map(|(e, values)| {
                        values.iter().map(move |(k, v)| vec![entity_name(e), k.clone(), v.to_string()])
                    })
                    .collect();
                table(&["ENTITY", "KEY", "VALUE"], &rows);
            }
        }
    }
    Ok(())
}

/// `{"user": "alice", "client-id": null}`: null for a default entity.
fn entity_json(entity: &QuotaEntity) -> serde_json::Value {
    entity.iter().map(|(t, n)| (t.clone(), json!(n))).collect::<serde_json::Map<_, _>>().into()
}

fn done(conn: &ConnArgs, what: &str, entity: &QuotaEntity, ops: &[(String, Option<f64>)]) {
    if conn.json {
        let keys: serde_json::Map<String, serde_json::Value> = ops.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        output::json(&json!({ what: {"entity": entity_json(entity), "quotas": keys} }));
    } else {
        let keys: Vec<String> =
            ops.iter().map(|(k, v)| v.map(|v| format!("{k}={v}")).unwrap_or_else(|| k.clone())).collect();
        output::print_raw(&format!("{what} {} for {}\n", keys.join(" "), entity_name(entity)));
    }
}
