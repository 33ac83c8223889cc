//! Envelope (between brokers, KIP-590): an admin request that another broker forwards
//! to the active coordinator (`server/forward.rs`), with the principal and address of
//! the client that sent it. Handled as Kafka's `KafkaApis.handleEnvelope`:
//! - only on the inter-broker listener (elsewhere the connection is closed, as Kafka
//!   closes it on a listener that is not privileged);
//! - the forwarding broker's own principal needs CLUSTER_ACTION on the cluster
//!   (CLUSTER_AUTHORIZATION_FAILED);
//! - only on the active coordinator (NOT_CONTROLLER: the forwarding broker answers its
//!   client NOT_CONTROLLER and the client tries again);
//! - the principal must decode (PRINCIPAL_DESERIALIZATION_FAILURE), the address be 4 or
//!   16 bytes, and the inner request be a well-formed request of an API that is
//!   forwarded, at a version this broker handles (INVALID_REQUEST otherwise; never an
//!   Envelope inside an Envelope).
//!
//! The inner request then runs through its own handler as if the client had sent it
//! here: with the client's principal and address, so the handler's ACL checks, quotas
//! and audit lines are the client's. Its answer (header and body) goes back inside the
//! Envelope's answer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, EnvelopeRequest, EnvelopeResponse};

use crate::protocol::zero_copy::ResponsePart;
use crate::protocol::{decode_body, decode_frame, error_code, handled_version, ProtocolError, RequestFrame};
use crate::security::acl::AclOperation;
use crate::security::Principal;

use super::super::context::ShardContext;
use super::super::forward::is_forwarded;
use super::respond;

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: EnvelopeRequest = decode_body(frame)?;
    let answer = |code: i16, data: Option<Bytes>| {
        let body = EnvelopeResponse::default().with_error_code(code).with_response_data(data);
        respond(ApiKey::Envelope, frame, &body)
    };
    let inter_broker = ctx.config.inter_broker_listener().map(|l| l.name);
    if !inter_broker.is_ok_and(|name| name.eq_ignore_ascii_case(&frame.listener)) {
        return Err(ProtocolError::BadHeader(format!(
            "Envelope on listener {}, which is not the inter-broker listener",
            frame.listener
        )));
    }
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::ClusterAction) {
        return answer(error_code::CLUSTER_AUTHORIZATION_FAILED, None);
    }
    if !ctx.view().is_active() {
        return answer(error_code::NOT_CONTROLLER, None);
    }
    let principal = match req.request_principal.as_deref().map(Principal::decode_forwarded) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            tracing::warn!(from = %frame.principal, error = %e, "forwarded principal does not decode");
            return answer(error_code::PRINCIPAL_DESERIALIZATION_FAILURE, None);
        }
        None => return answer(error_code::PRINCIPAL_DESERIALIZATION_FAILURE, None),
    };
    let Some(client) = client_address(&req.client_host_address) else {
        return answer(error_code::INVALID_REQUEST, None);
    };
    let Ok(mut inner) = decode_frame(req.request_data) else {
        return answer(error_code::INVALID_REQUEST, None);
    };
    let key = match ApiKey::try_from(inner.api_key) {
        Ok(key) if is_forwarded(key) && inner.header.is_some() && handled_version(key, inner.api_version) => key,
        _ => return answer(error_code::INVALID_REQUEST, None),
    };
    inner.principal = Arc::new(principal);
    inner.client_host = format!("/{client}");
    inner.listener = frame.listener.clone();
    let response = match Box::pin(super::route(ctx, key, inner)).await {
        Ok(Some(response)) => response,
        Ok(None) => return answer(error_code::INVALID_REQUEST, None),
        Err(e) => {
            tracing::info!(api = ?key, error = %e, "forwarded request refused");
            return answer(error_code::INVALID_REQUEST, None);
        }
    };
    // The inner answer as one buffer, without its length prefix. Admin answers are
    // plain bytes (only Fetch answers point into files).
    let mut data = Vec::with_capacity(response.len_bytes() as usize);
    for part in &response.parts {
        match part {
            ResponsePart::Bytes(b) => data.extend_from_slice(b),
            ResponsePart::File { .. } => return answer(error_code::UNKNOWN_SERVER_ERROR, None),
        }
    }
    if data.len() < 4 {
        return answer(error_code::UNKNOWN_SERVER_ERROR, None);
    }
    answer(error_code::NONE, Some(Bytes::from(data).slice(4..)))
}

/// The client's IP from the Envelope's 4 (IPv4) or 16 (IPv6) bytes.
fn client_address(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?))),
        16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_addresses_are_four_or_sixteen_bytes() {
        assert_eq!(client_address(&[127, 0, 0, 1]), Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        assert_eq!(client_address(&v6), Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(client_address(&[]), None);
        assert_eq!(client_address(&[1, 2, 3]), None);
        assert_eq!(client_address(&[0; 17]), None);
    }
}
