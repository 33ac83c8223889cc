//! Kafka `server.properties` files: `spate serve --config FILE.properties` reads the
//! settings Spate shares with Kafka under Kafka's names.
//!
//! Each `key=value` (or `key: value`; `#`/`!` comments; a trailing `\` continues a
//! line, as Java's `Properties`) is mapped as follows:
//! - `log.dirs` / `log.dir` -> `data_dir` (the first directory), `node.id` / `broker.id`
//!   -> `node_id`, `auto.create.topics.enable` -> `auto_create_topics`;
//! - broker defaults of topic configs (`log.retention.ms`, `log.cleanup.policy`, ...) ->
//!   `topic_defaults` under the topic name;
//! - `[listener.name.<l>.]sasl.jaas.config` / `[listener.name.<l>.]<mechanism>.sasl.jaas.config`
//!   -> the PLAIN users of its `user_<name>="<password>"` entries, and its
//!   `username="..."` / `password="..."` -> `inter_broker_sasl_username` / `_password`
//!   (the login of the inter-broker listener's config when `inter.broker.listener.name`
//!   names one, else of the first that has one);
//! - `ssl.keystore.type` / `ssl.truststore.type` must be PEM (the only kind read);
//! - anything else whose name with `_` for `.` is a broker setting (`listeners`,
//!   `ssl.client.auth`, `sasl.enabled.mechanisms`, ...) -> that setting.
//!
//! Names Spate has no setting for are returned, so the broker can say it does not act on
//! them (a Kafka file holds many: `num.network.threads`, `zookeeper.connect`, ...). Every
//! pair is kept as written (`BrokerConfig::kafka_static`), for DescribeConfigs, and a value
//! Kafka's ConfigDef refuses (`kafka_broker`) stops the broker from starting, as it stops
//! Kafka.

use std::collections::BTreeMap;

use super::BrokerConfig;

/// The key/value pairs of a properties text, in order.
pub(crate) fn parse_pairs(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for raw in text.lines() {
        let line = raw.trim_start();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with('!')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                continue;
            }
            None => pending.push_str(line),
        }
        let entry = std::mem::take(&mut pending);
        let split = entry.find(['=', ':']).unwrap_or(entry.len());
        let key = entry[..split].trim().to_string();
        let value = entry.get(split + 1..).unwrap_or("").trim().to_string();
        if !key.is_empty() {
            out.push((key, value));
        }
    }
    out
}

/// `user_<name>="<password>"` entries of a JAAS config.
fn jaas_plain_users(jaas: &str) -> BTreeMap<String, String> {
    let mut users = BTreeMap::new();
    let mut rest = jaas;
    while let Some(i) = rest.find("user_") {
        rest = &rest[i + 5..];
        let Some((name, after)) = rest.split_once('=') else { break };
        let after = after.trim_start();
        let Some(quoted) = after.strip_prefix('"') else { continue };
        let Some(end) = quoted.find('"') else { break };
        users.insert(name.trim().to_string(), quoted[..end].to_string());
        rest = &quoted[end + 1..];
    }
    users
}

/// The quoted value of `key="..."` in a JAAS config (`username`, `password`).
pub(crate) fn jaas_value(jaas: &str, key: &str) -> Option<String> {
    let mut rest = jaas;
    while let Some(i) = rest.find(key) {
        let boundary = i == 0 || rest[..i].ends_with(|c: char| c.is_whitespace() || c == ';');
        rest = &rest[i + key.len()..];
        let Some(after) = rest.trim_start().strip_prefix('=') else { continue };
        let Some(quoted) = after.trim_start().strip_prefix('"') else { continue };
        let end = quoted.find('"')?;
        if boundary {
            return Some(quoted[..end].to_string());
        }
        rest = &quoted[end + 1..];
    }
    None
}

/// A properties value as TOML: an integer, a boolean or a float where it reads as one,
/// else a string.
fn typed(value: &str) -> toml::Value {
    if let Ok(i) = value.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(b) = value.parse::<bool>() {
        toml::Value::Boolean(b)
    } else if let Ok(f) = value.parse::<f64>() {
        toml::Value::Float(f)
    } else {
        toml::Value::String(value.to_string())
    }
}

/// Whether `field = value` is a broker setting BrokerConfig accepts (trying the typed
/// value, then the string).
fn accepted(field: &str, value: &str) -> Option<toml::Value> {
    [typed(value), toml::Value::String(value.to_string())].into_iter().find(|v| {
        let mut t = toml::Table::new();
        t.insert(field.to_string(), v.clone());
        toml::Value::Table(t).try_into::<BrokerConfig>().is_ok()
    })
}

/// Read a Kafka properties text into a broker config. Returns the config and the keys
/// it ignored; a value Spate cannot use for a key it knows is an error.
pub fn from_properties(text: &str) -> Result<(BrokerConfig, Vec<String>), String> {
    let mut table = toml::Table::new();
    let mut topic_defaults = toml::Table::new();
    let mut plain_users = toml::Table::new();
    // (listener name, upper case, or None for `sasl.jaas.config`; username; password)
    let mut logins: Vec<(Option<String>, String, String)> = Vec::new();
    let mut ignored = Vec::new();
    let pairs = parse_pairs(text);
    // Kafka refuses to start on a value its ConfigDef refuses: so does Spate, for every
    // config Kafka defines, whether Spate acts on it or not.
    for (key, value) in &pairs {
        if let Some(kafka) = super::kafka_broker::kafka_broker_config(key) {
            super::kafka_broker::check_kafka_value(kafka, value)?;
        }
    }
    let kafka_static: BTreeMap<String, String> = pairs.iter().cloned().collect();
    for (key, value) in pairs {
        let field = match key.as_str() {
            "log.dirs" | "log.dir" => {
                let first = value.split(',').next().unwrap_or("").trim();
                table.insert("data_dir".into(), toml::Value::String(first.to_string()));
                continue;
            }
            "node.id" | "broker.id" => "node_id".to_string(),
            "auto.create.topics.enable" => "auto_create_topics".to_string(),
            "ssl.keystore.type" | "ssl.truststore.type" => {
                if !value.eq_ignore_ascii_case("PEM") {
                    return Err(format!("{key}={value}: only PEM key and trust stores are read"));
                }
                continue;
            }
            k if k.ends_with("sasl.jaas.config") => {
                for (user, password) in jaas_plain_users(&value) {
                    plain_users.insert(user, toml::Value::String(password));
                }
                if let (Some(user), Some(password)) = (jaas_value(&value, "username"), jaas_value(&value, "password")) {
                    let listener = k
                        .strip_prefix("listener.name.")
                        .and_then(|r| r.split('.').next())
                        .map(|l| l.to_ascii_uppercase());
                    logins.push((listener, user, password));
                }
                continue;
            }
            k => match super::dynamic_broker_config_topic_name(k) {
                Some(topic_name) => {
                    topic_defaults.insert(topic_name.to_string(), toml::Value::String(value));
                    continue;
                }
                None => k.replace('.', "_"),
            },
        };
        match accepted(&field, &value) {
            Some(v) => {
                table.insert(field, v);
            }
            None if ["0", "x", "true", "0.5"].iter().any(|probe| accepted(&field, probe).is_some()) => {
                return Err(format!("{key}={value}: not a valid value"));
            }
            None => ignored.push(key),
        }
    }
    if !topic_defaults.is_empty() {
        table.insert("topic_defaults".into(), toml::Value::Table(topic_defaults));
    }
    if !plain_users.is_empty() {
        table.insert("sasl_plain_users".into(), toml::Value::Table(plain_users));
    }
    let inter_broker = table.get("inter_broker_listener_name").and_then(|v| v.as_str()).map(str::to_ascii_uppercase);
    let login = logins
        .iter()
        .find(|(l, _, _)| l.is_some() && *l == inter_broker)
        .or_else(|| logins.iter().find(|(l, _, _)| l.is_none()))
        .or_else(|| logins.first());
    if let Some((_, user, password)) = login {
        table.insert("inter_broker_sasl_username".into(), toml::Value::String(user.clone()));
        table.insert("inter_broker_sasl_password".into(), toml::Value::String(password.clone()));
    }
    let mut config = toml::Value::Table(table).try_into::<BrokerConfig>().map_err(|e| e.to_string())?;
    config.kafka_static = kafka_static;
    Ok((config, ignored))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kafka_server_properties_file_is_read() {
        let text = r#"
# Kafka's own file, trimmed
node.id=3
process.roles=broker,controller
listeners=PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093
advertised.listeners=PLAINTEXT://kafka1:9092,SASL_SSL://kafka1:9093
log.dirs=/var/lib/spate,/other
num.network.threads=3
log.retention.hours=168
log.retention.ms=86400000
ssl.keystore.type=PEM
ssl.keystore.location=/etc/spate/keystore.pem
ssl.key.password=key pass
ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \
    username="admin" password="admin-secret" \
    user_admin="admin-secret" user_alice="alice secret";
auto.create.topics.enable=false
"#;
        let (c, ignored) = from_properties(text).unwrap();
        assert_eq!(c.node_id, 3);
        assert_eq!(c.data_dir, std::path::PathBuf::from("/var/lib/spate"));
        assert_eq!(c.listeners.as_deref(), Some("PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093"));
        assert_eq!(c.advertised_listeners.as_deref(), Some("PLAINTEXT://kafka1:9092,SASL_SSL://kafka1:9093"));
        assert_eq!(c.ssl_keystore_location, Some("/etc/spate/keystore.pem".into()));
        assert_eq!(c.ssl_key_password.as_deref(), Some("key pass"));
        assert_eq!(c.ssl_client_auth, "required");
        assert_eq!(c.ssl_principal_mapping_rules, "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT");
        assert_eq!(c.sasl_enabled_mechanisms, "PLAIN,SCRAM-SHA-512");
        assert_eq!(c.topic_defaults.get("retention.ms").map(String::as_str), Some("86400000"));
        assert!(!c.auto_create_topics);
        assert_eq!(
            c.sasl_plain_users,
            BTreeMap::from([("admin".into(), "admin-secret".into()), ("alice".into(), "alice secret".into())])
        );
        assert_eq!(ignored, ["process.roles", "num.network.threads", "log.retention.hours"]);
        assert_eq!(c.inter_broker_sasl_username.as_deref(), Some("admin"));
        assert_eq!(c.inter_broker_sasl_password.as_deref(), Some("admin-secret"));
    }

    #[test]
    fn the_inter_broker_login_comes_from_its_listeners_jaas_config() {
        let text = r#"
inter.broker.listener.name=INTERNAL
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.client.plain.sasl.jaas.config=x required username="client" password="c";
listener.name.internal.scram-sha-512.sasl.jaas.config=x required username="broker" password="b=1";
"#;
        let (c, _) = from_properties(text).unwrap();
        assert_eq!(c.sasl_mechanism_inter_broker_protocol, "SCRAM-SHA-512");
        assert_eq!(c.inter_broker_sasl_username.as_deref(), Some("broker"));
        assert_eq!(c.inter_broker_sasl_password.as_deref(), Some("b=1"));
        assert_eq!(jaas_value(r#"a user_x="1" xusername="no" username = "yes""#, "username").as_deref(), Some("yes"));
    }

    #[test]
    fn every_pair_is_kept_and_kafkas_configs_are_checked_as_kafka_checks_them() {
        let (c, _) = from_properties("sasl.kerberos.service.name=kafka\nmy.plugin=1\nnode.id=2\n").unwrap();
        assert_eq!(
            c.kafka_static,
            BTreeMap::from([
                ("sasl.kerberos.service.name".into(), "kafka".into()),
                ("my.plugin".into(), "1".into()),
                ("node.id".into(), "2".into()),
            ])
        );
        // Kafka 4.4 refuses to start on these; so does Spate, with Kafka's message.
        assert_eq!(
            from_properties("num.io.threads=0\n").unwrap_err(),
            "Invalid value 0 for configuration num.io.threads: Value must be at least 1"
        );
        assert!(from_properties("log.cleanup.policy=compress\n").is_err());
    }

    #[test]
    fn bad_values_of_known_keys_are_refused() {
        assert!(from_properties("node.id=abc\n").is_err());
        assert!(from_properties("ssl.keystore.type=JKS\n").is_err());
        assert!(from_properties("auto.create.topics.enable=maybe\n").is_err());
    }
}
