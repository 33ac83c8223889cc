//! BrokerRegistration (between brokers): a broker joins the cluster through the active
//! coordinator with every listener it advertises, and gets the broker epoch its
//! heartbeats must carry; more than `limits::broker_listeners_max` listeners is an
//! INVALID_REQUEST. Any other broker
//! answers NOT_CONTROLLER, and the joining broker looks for the active one again.
//! Needs CLUSTER_ACTION on the cluster (CLUSTER_AUTHORIZATION_FAILED otherwise), as
//! Kafka's controller asks of a registering broker.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, BrokerRegistrationRequest, BrokerRegistrationResponse};

use crate::config::SecurityProtocol;
use crate::coordinator::controller::{AdvertisedListener, Endpoint};
use crate::coordinator::registry::LocalBroker;
use crate::model::NodeId;
use crate::protocol::{decode_body, ProtocolError, RequestFrame};
use crate::security::acl::AclOperation;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{registry_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: BrokerRegistrationRequest = decode_body(frame)?;
    let mut body = BrokerRegistrationResponse::default().with_broker_epoch(-1);
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::ClusterAction) {
        body.error_code = crate::protocol::error_code::CLUSTER_AUTHORIZATION_FAILED;
        return respond(ApiKey::BrokerRegistration, frame, &body);
    }
    // The inter-broker listener: the one named as this cluster's (all brokers share
    // inter.broker.listener.name, as in Kafka), else the first (Spate brokers send theirs
    // first).
    if req.listeners.len() > crate::model::limits::broker_listeners_max {
        tracing::warn!(
            broker = req.broker_id.0,
            listeners = req.listeners.len(),
            listeners_max = crate::model::limits::broker_listeners_max,
            "broker registration refused: too many listeners"
        );
        body.error_code = crate::protocol::error_code::INVALID_REQUEST;
        return respond(ApiKey::BrokerRegistration, frame, &body);
    }
    let inter_broker = ctx.config.inter_broker_listener().ok().map(|l| l.name);
    let listener = req
        .listeners
        .iter()
        .find(|l| Some(l.name.as_str()) == inter_broker.as_deref())
        .or_else(|| req.listeners.first());
    let listeners = req
        .listeners
        .iter()
        .map(|l| AdvertisedListener {
            name: l.name.to_ascii_uppercase(),
            protocol: SecurityProtocol::from_id(l.security_protocol).map_or("PLAINTEXT", |p| p.name()).to_string(),
            host: l.host.to_string(),
            port: l.port,
        })
        .collect();
    match listener {
        None => body.error_code = crate::protocol::error_code::INVALID_REQUEST,
        Some(l) => {
            let broker = LocalBroker {
                id: NodeId(req.broker_id.0),
                endpoint: Endpoint::new(l.host.to_string(), l.port).with_listeners(listeners),
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
