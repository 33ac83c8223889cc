//! BrokerHeartbeat (between brokers): keeps a broker's registration alive on the active
//! coordinator. A broker that stops heartbeating for broker.session.timeout.ms is fenced
//! (its leaderships move). `want_shut_down` is a controlled shutdown: the broker leaves
//! at once, leadership moving away before it exits.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, BrokerHeartbeatRequest, BrokerHeartbeatResponse};

use crate::model::{BrokerEpoch, NodeId};
use crate::protocol::{decode_body, ProtocolError, RequestFrame};
use crate::security::acl::AclOperation;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::{registry_error_code, respond};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: BrokerHeartbeatRequest = decode_body(frame)?;
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::ClusterAction) {
        let body = BrokerHeartbeatResponse::default()
            .with_error_code(crate::protocol::error_code::CLUSTER_AUTHORIZATION_FAILED)
            .with_is_fenced(true);
        return respond(ApiKey::BrokerHeartbeat, frame, &body);
    }
    let (id, epoch) = (NodeId(req.broker_id.0), BrokerEpoch(req.broker_epoch));
    let (now, leave) = (now_ms() as u64, req.want_shut_down);
    let outcome = ctx
        .metadata
        .write(move |reg| {
            let fenced = reg.heartbeat_remote(id, epoch, now)?;
            if leave {
                reg.unregister_remote(id)?;
            }
            Ok::<_, crate::coordinator::registry::RegistryError>(fenced)
        })
        .await;
    let body = match outcome {
        Ok(fenced) => BrokerHeartbeatResponse::default()
            .with_is_caught_up(true)
            .with_is_fenced(fenced)
            .with_should_shut_down(leave),
        Err(e) => {
            tracing::debug!(broker = %id, error = %e, "broker heartbeat refused");
            BrokerHeartbeatResponse::default().with_error_code(registry_error_code(&e)).with_is_fenced(true)
        }
    };
    respond(ApiKey::BrokerHeartbeat, frame, &body)
}
