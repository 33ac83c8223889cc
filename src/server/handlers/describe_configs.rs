//! DescribeConfigs: every config of a topic (or the broker) with its value and source.
//! Stream frameworks read `retention.ms` and friends from here and fail on gaps.

use bytes::Bytes;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, DescribeConfigsResponse};

use crate::config::ConfigSource;
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
const TYPE_LONG: i8 = 5;

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

fn broker_configs(ctx: &ShardContext) -> Vec<(String, String, ConfigSource)> {
    let c = &ctx.config;
    let mut out = vec![
        ("broker.id".to_string(), c.node_id.to_string(), ConfigSource::StaticBroker),
        ("node.id".to_string(), c.node_id.to_string(), ConfigSource::StaticBroker),
        ("log.dirs".to_string(), c.data_dir.display().to_string(), ConfigSource::StaticBroker),
        ("listeners".to_string(), format!("PLAINTEXT://{}", c.listen), ConfigSource::StaticBroker),
        ("advertised.listeners".to_string(), format!("PLAINTEXT://{}", c.advertised()), ConfigSource::StaticBroker),
        ("auto.create.topics.enable".to_string(), c.auto_create_topics.to_string(), ConfigSource::StaticBroker),
        ("num.partitions".to_string(), c.num_partitions.to_string(), ConfigSource::StaticBroker),
        ("default.replication.factor".to_string(), "1".to_string(), ConfigSource::Default),
        ("socket.request.max.bytes".to_string(), limits::request_frame_bytes_max.to_string(), ConfigSource::Default),
        ("message.max.bytes".to_string(), limits::message_bytes_default.to_string(), ConfigSource::Default),
    ];
    // Topic defaults under their broker names (log.retention.ms, log.segment.bytes, ...).
    for (k, v, source) in crate::config::TopicConfig::default().describe(&c.topic_defaults) {
        let broker_name = match k.as_str() {
            "max.message.bytes" => continue, // message.max.bytes above
            "flush.messages" => "log.flush.interval.messages".to_string(),
            "flush.ms" => "log.flush.interval.ms".to_string(),
            "cleanup.policy" => "log.cleanup.policy".to_string(),
            "segment.ms" => "log.roll.ms".to_string(),
            "segment.index.bytes" => "log.index.size.max.bytes".to_string(),
            "index.interval.bytes" => "log.index.interval.bytes".to_string(),
            "message.timestamp.type" => "log.message.timestamp.type".to_string(),
            other => format!("log.{other}"),
        };
        out.push((broker_name, v, if source == ConfigSource::Topic { ConfigSource::StaticBroker } else { source }));
    }
    out
}

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeConfigsRequest = decode_body(frame)?;
    let mut results = Vec::with_capacity(req.resources.len());
    for res in &req.resources {
        let name = res.resource_name.to_string();
        let mut r = DescribeConfigsResult::default()
            .with_resource_type(res.resource_type)
            .with_resource_name(res.resource_name.clone());
        let configs = match res.resource_type {
            RESOURCE_TOPIC => {
                let reg = ctx.view();
                match reg.get(&name) {
                    Some(meta) => Ok(meta.configs.describe(&ctx.config.topic_defaults)),
                    None => Err((error_code::UNKNOWN_TOPIC_OR_PARTITION, format!("topic {name:?} does not exist"))),
                }
            }
            RESOURCE_BROKER if name.is_empty() || name == ctx.config.node_id.to_string() => Ok(broker_configs(ctx)),
            RESOURCE_BROKER => Err((error_code::INVALID_REQUEST, format!("broker {name:?} is not this broker"))),
            other => Err((error_code::INVALID_REQUEST, format!("resource type {other} is not supported"))),
        };
        match configs {
            Ok(configs) => {
                r.configs = configs
                    .into_iter()
                    .filter(|(k, _, _)| {
                        res.configuration_keys.as_ref().map(|keys| keys.iter().any(|w| w.as_str() == k)).unwrap_or(true)
                    })
                    .map(|(k, v, source)| {
                        let mut c = DescribeConfigsResourceResult::default()
                            .with_name(str_bytes(k.clone()))
                            .with_value(Some(str_bytes(v.clone())))
                            .with_read_only(res.resource_type == RESOURCE_BROKER)
                            .with_config_source(source as i8);
                        if frame.api_version >= 3 {
                            c.config_type = config_type(&k, &v);
                        }
                        if req.include_synonyms {
                            c.synonyms = vec![DescribeConfigsSynonym::default()
                                .with_name(str_bytes(k))
                                .with_value(Some(str_bytes(v)))
                                .with_source(source as i8)];
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
