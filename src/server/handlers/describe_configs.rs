//! DescribeConfigs: every config of a topic (or the broker) with its value and source.
//! Stream frameworks read `retention.ms` and friends from here and fail on gaps. A broker's
//! configs layer as Kafka's: its dynamic config (`/config/brokers/<id>`), the cluster-wide
//! dynamic default (`/config/brokers/<default>`, resource name ""), the static config,
//! Kafka's default; the synonyms list each layer that sets a name. Resource name "" is
//! answered with the dynamic default alone, as Kafka does.

use bytes::Bytes;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, DescribeConfigsResponse};

use std::collections::BTreeMap;

use crate::config::kafka_broker::{kafka_broker_config, kafka_broker_configs, Mode, Ty, STARTUP_ONLY_BROKER_CONFIGS};
use crate::config::{ConfigSource, BROKER_DEFAULT_ENTITY};
use crate::model::limits;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
/// DescribeConfigs `config_type`s.
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_SHORT: i8 = 4;
const TYPE_LONG: i8 = 5;
const TYPE_DOUBLE: i8 = 6;
const TYPE_LIST: i8 = 7;
const TYPE_CLASS: i8 = 8;
const TYPE_PASSWORD: i8 = 9;

/// A topic config's type, from its value.
fn config_type(name: &str, value: &str) -> i8 {
    if value == "true" || value == "false" {
        TYPE_BOOLEAN
    } else if name.ends_with(".ms") || name.ends_with(".bytes") || name == "flush.messages" {
        TYPE_LONG
    } else if value.parse::<i32>().is_ok() {
        TYPE_INT
    } else {
        TYPE_STRING
    }
}

/// A Kafka broker config's type.
fn broker_config_type(ty: Ty) -> i8 {
    match ty {
        Ty::Boolean => TYPE_BOOLEAN,
        Ty::Short => TYPE_SHORT,
        Ty::Int => TYPE_INT,
        Ty::Long => TYPE_LONG,
        Ty::Double => TYPE_DOUBLE,
        Ty::String => TYPE_STRING,
        Ty::List => TYPE_LIST,
        Ty::Class => TYPE_CLASS,
        Ty::Password => TYPE_PASSWORD,
    }
}

/// One described config: its value in effect (None: null, or sensitive) and where it
/// comes from, and its synonyms: the same name in each layer that sets it, in
/// precedence order (this broker's dynamic config, the cluster-wide dynamic default, the
/// static config, Kafka's default).
struct Described {
    name: String,
    value: Option<String>,
    source: ConfigSource,
    read_only: bool,
    /// A password, or a name Kafka does not know (Kafka cannot tell it is not a secret):
    /// described without its value.
    sensitive: bool,
    config_type: i8,
    synonyms: Vec<(String, Option<String>, ConfigSource)>,
}

impl Described {
    /// A config set in one layer only.
    fn single(name: String, value: Option<String>, source: ConfigSource, config_type: i8) -> Self {
        let synonyms = vec![(name.clone(), value.clone(), source)];
        Self { name, value, source, read_only: false, sensitive: false, config_type, synonyms }
    }
}

/// The static layer of this broker's configs: the config file and Kafka's defaults.
fn static_broker_configs(ctx: &ShardContext) -> Vec<(String, String, ConfigSource)> {
    let c = &ctx.config;
    let mut out = vec![
        ("broker.id".to_string(), c.node_id.to_string(), ConfigSource::StaticBroker),
        ("node.id".to_string(), c.node_id.to_string(), ConfigSource::StaticBroker),
        ("log.dirs".to_string(), c.data_dir.display().to_string(), ConfigSource::StaticBroker),
        ("listeners".to_string(), listener_list(c, |l| &l.bind), ConfigSource::StaticBroker),
        ("advertised.listeners".to_string(), listener_list(c, |l| &l.advertised), ConfigSource::StaticBroker),
        ("auto.create.topics.enable".to_string(), c.auto_create_topics.to_string(), ConfigSource::StaticBroker),
        ("num.partitions".to_string(), c.num_partitions.to_string(), ConfigSource::StaticBroker),
        ("default.replication.factor".to_string(), "1".to_string(), ConfigSource::Default),
        ("socket.request.max.bytes".to_string(), limits::request_frame_bytes_max.to_string(), ConfigSource::Default),
    ];
    for name in crate::config::DYNAMIC_BROKER_RATE_CONFIGS {
        let unlimited = crate::config::THROTTLED_RATE_UNLIMITED.to_string();
        out.push((name.to_string(), unlimited, ConfigSource::Default));
    }
    // Topic defaults under their broker names (log.retention.ms, log.segment.bytes, ...).
    for (k, v, source) in crate::config::TopicConfig::default().describe(&c.topic_defaults) {
        let dynamic_name = crate::config::DYNAMIC_BROKER_TOPIC_CONFIGS.iter().find(|(_, t)| *t == k).map(|(b, _)| *b);
        let broker_name = match (dynamic_name, k.as_str()) {
            (Some(b), _) => b.to_string(),
            (None, "segment.jitter.ms") => "log.roll.jitter.ms".to_string(),
            (None, "file.delete.delay.ms") => "log.segment.delete.delay.ms".to_string(),
            (None, "min.insync.replicas" | "unclean.leader.election.enable") => k.clone(),
            (None, other) => format!("log.{other}"),
        };
        out.push((broker_name, v, if source == ConfigSource::Topic { ConfigSource::StaticBroker } else { source }));
    }
    out
}

/// The dynamic layers that set `name`, in precedence order (this broker's, then the
/// cluster-wide default's), as synonyms.
fn dynamic_synonyms(
    name: &str,
    layers: [(Option<&BTreeMap<String, String>>, ConfigSource); 2],
) -> Vec<(String, Option<String>, ConfigSource)> {
    layers
        .into_iter()
        .filter_map(|(layer, source)| layer?.get(name).map(|v| (name.to_string(), Some(v.clone()), source)))
        .collect()
}

/// This broker's configs: every config Kafka 4.4 describes (Spate's value where Spate has
/// one, else its config file's, else Kafka's default), Spate's throttle rates, and any
/// other name in the config file or set dynamically, each with its value in effect over
/// the dynamic layers.
fn broker_configs(ctx: &ShardContext, view: &crate::coordinator::view::ClusterView) -> Vec<Described> {
    let this_broker = view.broker_configs(&ctx.config.node_id.to_string());
    let cluster_default = view.broker_configs(BROKER_DEFAULT_ENTITY);
    let layers = [(this_broker, ConfigSource::DynamicBroker), (cluster_default, ConfigSource::DynamicDefaultBroker)];
    let spate: BTreeMap<String, (String, ConfigSource)> =
        static_broker_configs(ctx).into_iter().map(|(name, value, source)| (name, (value, source))).collect();
    let mut out: Vec<Described> = kafka_broker_configs()
        .iter()
        .filter(|c| !c.internal)
        .map(|c| {
            let name = c.name.to_string();
            let (value, source) = match (spate.get(c.name), ctx.config.kafka_static.get(c.name)) {
                (Some((v, source)), _) => (Some(v.clone()), *source),
                (None, Some(v)) => (Some(v.clone()), ConfigSource::StaticBroker),
                (None, None) => (c.default.map(str::to_string), ConfigSource::Default),
            };
            let mut synonyms = dynamic_synonyms(&name, layers);
            synonyms.push((name.clone(), value, source));
            // Kafka's default last, where it has one (as Kafka 4.4 lists it under a
            // static value).
            if let (ConfigSource::StaticBroker, Some(default)) = (source, c.default) {
                synonyms.push((name.clone(), Some(default.to_string()), ConfigSource::Default));
            }
            let (_, value, source) = synonyms[0].clone();
            let dynamic = crate::config::is_dynamic_broker_config(c.name)
                || (c.mode != Mode::ReadOnly && !STARTUP_ONLY_BROKER_CONFIGS.contains(&c.name));
            let sensitive = c.ty == Ty::Password;
            Described {
                name,
                value,
                source,
                read_only: !dynamic,
                sensitive,
                config_type: broker_config_type(c.ty),
                synonyms,
            }
        })
        .collect();
    // Spate's own dynamic configs outside Kafka's broker ConfigDef (the throttle rates,
    // Kafka's `DynamicConfig.Broker`), always, with their values (Kafka 4.4 describes them
    // only once set).
    for (name, (value, source)) in &spate {
        if kafka_broker_config(name).is_none() && crate::config::is_dynamic_broker_config(name) {
            let mut synonyms = dynamic_synonyms(name, layers);
            synonyms.push((name.clone(), Some(value.clone()), *source));
            let (_, value, source) = synonyms[0].clone();
            let config_type = config_type(name, value.as_deref().unwrap_or(""));
            out.push(Described {
                name: name.clone(),
                value,
                source,
                read_only: false,
                sensitive: false,
                config_type,
                synonyms,
            });
        }
    }
    // Names Kafka does not define, in the config file or set dynamically (a plugin's, a
    // listener's).
    let file = Some(&ctx.config.kafka_static);
    for (layer, source) in layers.into_iter().chain([(file, ConfigSource::StaticBroker)]) {
        for (name, value) in layer.into_iter().flatten() {
            if kafka_broker_config(name).is_some() || crate::config::is_dynamic_broker_config(name) {
                continue;
            }
            match out.iter_mut().find(|d| d.name == *name) {
                Some(d) => d.synonyms.push((name.clone(), Some(value.clone()), source)),
                None => {
                    let mut d = Described::single(name.clone(), Some(value.clone()), source, TYPE_STRING);
                    d.sensitive = true;
                    out.push(d);
                }
            }
        }
    }
    out
}

/// The cluster-wide dynamic default (resource name ""): only what is set there, as Kafka.
fn broker_default_configs(view: &crate::coordinator::view::ClusterView) -> Vec<Described> {
    view.broker_configs(BROKER_DEFAULT_ENTITY)
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let kafka = kafka_broker_config(k);
            let config_type = kafka.map_or(TYPE_STRING, |c| broker_config_type(c.ty));
            let mut d = Described::single(k.clone(), Some(v.clone()), ConfigSource::DynamicDefaultBroker, config_type);
            d.sensitive = kafka.map_or(!crate::config::is_dynamic_broker_config(k), |c| c.ty == Ty::Password);
            d
        })
        .collect()
}

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeConfigsRequest = decode_body(frame)?;
    let mut results = Vec::with_capacity(req.resources.len());
    for res in &req.resources {
        let name = res.resource_name.to_string();
        let mut r = DescribeConfigsResult::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        let view = ctx.view();
        // Kafka's handleDescribeConfigsRequest: DESCRIBE_CONFIGS on the topic, or on the
        // cluster for a broker.
        let configs = match res.resource_type {
            RESOURCE_TOPIC
                if !super::authz::authorize(
                    ctx,
                    frame,
                    &view,
                    crate::security::acl::AclOperation::DescribeConfigs,
                    crate::security::acl::ResourceType::Topic,
                    &name,
                ) =>
            {
                Err((error_code::TOPIC_AUTHORIZATION_FAILED, "Authorization failed.".to_string()))
            }
            RESOURCE_BROKER
                if !super::authz::authorize_cluster(
                    ctx,
                    frame,
                    &view,
                    crate::security::acl::AclOperation::DescribeConfigs,
                ) =>
            {
                Err((error_code::CLUSTER_AUTHORIZATION_FAILED, "Authorization failed.".to_string()))
            }
            RESOURCE_TOPIC => match view.get(&name) {
                Some(meta) => Ok(meta
                    .configs
                    .describe(&ctx.config.topic_defaults)
                    .into_iter()
                    .map(|(k, v, source)| {
                        let config_type = config_type(&k, &v);
                        Described::single(k, Some(v), source, config_type)
                    })
                    .collect::<Vec<Described>>()),
                None => Err((error_code::UNKNOWN_TOPIC_OR_PARTITION, format!("topic {name:?} does not exist"))),
            },
            RESOURCE_BROKER if name.is_empty() => Ok(broker_default_configs(&view)),
            RESOURCE_BROKER if name == ctx.config.node_id.to_string() => Ok(broker_configs(ctx, &view)),
            RESOURCE_BROKER => Err((error_code::INVALID_REQUEST, format!("broker {name:?} is not this broker"))),
            other => Err((error_code::INVALID_REQUEST, format!("resource type {other} is not supported"))),
        };
        match configs {
            Ok(configs) => {
                r.configs = configs
                    .into_iter()
                    .filter(|d| {
                        res.configuration_keys
                            .as_ref()
                            .map(|keys| keys.iter().any(|w| w.as_str() == d.name))
                            .unwrap_or(true)
                    })
                    .map(|d| {
                        let hide = |v: Option<String>| if d.sensitive { None } else { v.map(str_bytes) };
                        let mut c = DescribeConfigsResourceResult::default()
                            .with_name(str_bytes(d.name.clone()))
                            .with_value(hide(d.value.clone()))
                            .with_read_only(d.read_only)
                            .with_is_sensitive(d.sensitive)
                            .with_config_source(d.source as i8);
                        if frame.api_version >= 3 {
                            c.config_type = d.config_type;
                        }
                        if req.include_synonyms {
                            c.synonyms = d
                                .synonyms
                                .into_iter()
                                .map(|(k, v, source)| {
                                    DescribeConfigsSynonym::default()
                                        .with_name(str_bytes(k))
                                        .with_value(hide(v))
                                        .with_source(source as i8)
                                })
                                .collect();
                        }
                        c
                    })
                    .collect();
            }
            Err((code, msg)) => {
                r = r.with_error_code(code).with_error_message(Some(str_bytes(msg)));
            }
        }
        results.push(r);
    }
    respond(ApiKey::DescribeConfigs, frame, &DescribeConfigsResponse::default().with_results(results))
}

/// `NAME://host:port,...` of every listener, as Kafka describes `listeners`.
fn listener_list(c: &crate::config::BrokerConfig, addr: impl Fn(&crate::config::ListenerSpec) -> &String) -> String {
    c.listener_specs()
        .unwrap_or_default()
        .iter()
        .map(|l| format!("{}://{}", l.name, addr(l)))
        .collect::<Vec<_>>()
        .join(",")
}
