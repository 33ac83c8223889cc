//! ApiVersions: what we implement, exactly. A version we do not know is answered in v0
//! with UNSUPPORTED_VERSION and our table, so the client can retry with one we do. v3+
//! carry the feature flags (`protocol::features`): the supported ranges (below v4 without
//! those whose minimum is 0, as Kafka), the finalized levels and their epoch.
//!
//! v5 (KIP-1242) carries the cluster id and node id of the broker the client means to
//! talk to, both or neither (null and -1: it does not know yet). One without the other is
//! INVALID_REQUEST; a cluster or node that is not this broker's is REBOOTSTRAP_REQUIRED
//! (the client's metadata is stale: an address now used by another broker), with no
//! APIs listed, as Kafka 4.4 answers. The connection stays open.

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::{ApiVersion, FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

use crate::protocol::newer::{self, ApiVersionsV5};
use crate::protocol::{
    decode_newer_body, encode_response, error_code, features, supported_range, ProtocolError, RequestFrame,
    SUPPORTED_APIS,
};

use super::super::context::ShardContext;

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let (lo, hi) = supported_range(ApiKey::ApiVersions).expect("ApiVersions is supported");
    if frame.api_version == 5 && frame.header.is_some() {
        let req = decode_newer_body(frame, newer::decode_api_versions_v5)?;
        if let Some(code) = refused_v5(ctx, &req) {
            let body = ApiVersionsResponse::default().with_error_code(code);
            return encode_response(ApiKey::ApiVersions, 5, frame.correlation_id, &body)
                .map_err(|e| ProtocolError::BadBody(format!("encode: {e}")));
        }
    }
    let api_keys = SUPPORTED_APIS
        .iter()
        .map(|(k, lo, hi)| ApiVersion::default().with_api_key(*k as i16).with_min_version(*lo).with_max_version(*hi))
        .collect();
    let mut body = ApiVersionsResponse::default().with_api_keys(api_keys);
    let version = if frame.api_version < lo || frame.api_version > hi || frame.header.is_none() {
        body.error_code = error_code::UNSUPPORTED_VERSION;
        0
    } else {
        if frame.api_version >= 3 {
            body.supported_features = features::supported(frame.api_version)
                .map(|(name, min, max)| {
                    SupportedFeatureKey::default().with_name(name.into()).with_min_version(min).with_max_version(max)
                })
                .collect();
            body.finalized_features = features::finalized()
                .map(|(name, level)| {
                    FinalizedFeatureKey::default()
                        .with_name(name.into())
                        .with_min_version_level(level)
                        .with_max_version_level(level)
                })
                .collect();
            body.finalized_features_epoch = features::FINALIZED_FEATURES_EPOCH;
        }
        frame.api_version
    };
    encode_response(ApiKey::ApiVersions, version, frame.correlation_id, &body)
        .map_err(|e| ProtocolError::BadBody(format!("encode: {e}")))
}

/// v5's check of the broker the client means (Kafka 4.4's answers, measured side by side).
fn refused_v5(ctx: &ShardContext, req: &ApiVersionsV5) -> Option<i16> {
    match (&req.cluster_id, req.node_id) {
        (None, -1) => None,
        (None, _) | (Some(_), -1) => Some(error_code::INVALID_REQUEST),
        (Some(cluster), node) => {
            let view = ctx.view();
            let ours = view.cluster_id().unwrap_or(&ctx.cluster_id);
            (cluster.as_str() != ours || node != ctx.config.node_id).then_some(error_code::REBOOTSTRAP_REQUIRED)
        }
    }
}
