//! FindCoordinator: on a single node this broker coordinates every group. v4+ asks for
//! several keys at once. Transaction coordinators do not exist yet.

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{ApiKey, BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};

use crate::config::split_host_port;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

const KEY_TYPE_GROUP: i8 = 0;

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: FindCoordinatorRequest = decode_body(frame)?;
    let (host, port) = split_host_port(ctx.config.advertised()).expect("validated at startup");
    let node = BrokerId(ctx.config.node_id);
    let answer = |key: &str| -> (i16, Option<String>) {
        if req.key_type != KEY_TYPE_GROUP {
            (error_code::COORDINATOR_NOT_AVAILABLE, Some("transactions are not supported yet".into()))
        } else if key.is_empty() {
            (error_code::INVALID_GROUP_ID, Some("empty group id".into()))
        } else {
            (error_code::NONE, None)
        }
    };
    let mut body = FindCoordinatorResponse::default();
    if frame.api_version >= 4 {
        body.coordinators = req
            .coordinator_keys
            .iter()
            .map(|k| {
                let (code, msg) = answer(k.as_str());
                let c = Coordinator::default().with_key(k.clone()).with_error_code(code);
                if code == error_code::NONE {
                    c.with_node_id(node).with_host(str_bytes(host.clone())).with_port(port)
                } else {
                    c.with_node_id(BrokerId(-1)).with_port(-1).with_error_message(msg.map(str_bytes))
                }
            })
            .collect();
    } else {
        let (code, msg) = answer(req.key.as_str());
        body.error_code = code;
        if code == error_code::NONE {
            body = body.with_node_id(node).with_host(str_bytes(host)).with_port(port);
        } else {
            body = body.with_node_id(BrokerId(-1)).with_port(-1);
            if frame.api_version >= 1 {
                body.error_message = msg.map(str_bytes);
            }
        }
    }
    respond(ApiKey::FindCoordinator, frame, &body)
}
