//! ApiVersions: what we implement, exactly. A version we do not know is answered in v0
//! with UNSUPPORTED_VERSION and our table, so the client can retry with one we do. v3+
//! carry the feature flags (`protocol::features`): the supported ranges (below v4 without
//! those whose minimum is 0, as Kafka), the finalized levels and their epoch.

use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::{ApiVersion, FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

use crate::protocol::{
    encode_response, error_code, features, supported_range, ProtocolError, RequestFrame, SUPPORTED_APIS,
};

use super::super::context::ShardContext;

pub fn handle(_ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let (lo, hi) = supported_range(ApiKey::ApiVersions).expect("ApiVersions is supported");
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
