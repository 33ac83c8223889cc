//! UpdateFeatures (KIP-584; `kafka-features.sh upgrade/downgrade/disable`, the admin's
//! `updateFeatures`). Spate's feature levels are fixed by its release
//! (`protocol::features`), so the only update that succeeds names each feature at the
//! level it has; anything else is refused with INVALID_UPDATE_VERSION, and, as Kafka's
//! controller does, the whole request fails with the first refusal ("The update failed
//! for all features since the following feature had an error: ..."). `validate_only`
//! (v1+, `--dry-run`) answers the same. v0-1 successes list each feature with NONE; v2
//! answers with the top-level error only. Every broker answers from its own table
//! (Kafka's brokers forward to the controller): brokers of one release agree.
//!
//! ALTER on the cluster is required: without it, CLUSTER_AUTHORIZATION_FAILED.

use bytes::Bytes;
use kafka_protocol::messages::update_features_response::UpdatableFeatureResult;
use kafka_protocol::messages::{ApiKey, UpdateFeaturesRequest, UpdateFeaturesResponse};

use crate::protocol::features::{self, SAFE_DOWNGRADE, UPGRADE};
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::AclOperation;

use super::super::context::ShardContext;
use super::{respond, str_bytes};

pub fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: UpdateFeaturesRequest = decode_body(frame)?;
    let mut body = UpdateFeaturesResponse::default();
    if !super::authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::Alter) {
        body.error_code = error_code::CLUSTER_AUTHORIZATION_FAILED;
        body.error_message = Some(str_bytes(super::authz::CLUSTER_DENIED.to_string()));
        return respond(ApiKey::UpdateFeatures, frame, &body);
    }
    let refused = req.feature_updates.iter().find_map(|u| {
        // v0 has no upgrade type, only whether a downgrade is allowed.
        let upgrade_type = match (frame.api_version, u.allow_downgrade) {
            (0, true) => SAFE_DOWNGRADE,
            (0, false) => UPGRADE,
            _ => u.upgrade_type,
        };
        features::check_update(u.feature.as_str(), u.max_version_level, upgrade_type).err()
    });
    match refused {
        Some(why) => {
            body.error_code = error_code::INVALID_UPDATE_VERSION;
            body.error_message = Some(str_bytes(format!(
                "The update failed for all features since the following feature had an error: {why}"
            )));
        }
        None if frame.api_version <= 1 => {
            body.results = req
                .feature_updates
                .iter()
                .map(|u| UpdatableFeatureResult::default().with_feature(u.feature.clone()))
                .collect();
        }
        None => {}
    }
    respond(ApiKey::UpdateFeatures, frame, &body)
}
