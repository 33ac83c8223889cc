//! BrokerRegistration (between brokers): a broker joins the cluster through the active
//! coordinator and gets the broker epoch its heartbeats must carry. Any other broker
//! answers NOT_CONTROLLER, and the joining broker looks for the active one again.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, BrokerRegistrationRequest, BrokerRegistrationResponse};

use crate::coordinator::controller::Endpoint;
use crate::coordinator::registry::LocalBroker;
use crate::model::NodeId;
use crate::protocol::{decode_body, ProtocolError, RequestFrame};

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{registry_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: BrokerRegistrationRequest = decode_body(frame)?;
    let mut body = BrokerRegistrationResponse::default().with_broker_epoch(-1);
    let listener = req.listeners.iter().find(|l| l.name.as_str() == crate::coordinator::layout::LISTENER);
    match listener {
        None => body.error_code = crate::protocol::error_code::INVALID_REQUEST,
        Some(l) => {
            let broker = LocalBroker {
                id: NodeId(req.broker_id.0),
                endpoint: Endpoint::new(l.host.to_string(), l.port),
                rack: req.rack.as_ref().map(|r| r.to_string()),
                shards: 0,
            };
            let now = now_ms() as u64;
            let incarnation = req.incarnation_id;
            match ctx.metadata.write(move |reg| reg.register_remote(broker, incarnation, now)).await {
                Ok(epoch) => body.broker_epoch = epoch.0,
                Err(e) => {
                    tracing::warn!(broker = req.broker_id.0, error = %e, "broker registration refused");
                    body.error_code = registry_error_code(&e);
                }
            }
        }
    }
    respond(ApiKey::BrokerRegistration, frame, &body)
}
