//! Authorization of a request, as Kafka's `AuthHelper` does it for `KafkaApis`: each
//! handler asks here before touching a resource. A check is map lookups on the shard's
//! view (`ClusterView::acls`) with the broker's `AuthorizerConfig`: no lock, no I/O.
//!
//! Denials are logged at INFO in Kafka's authorizer log shape (target
//! `kafka.authorizer.logger`), at most `authorizer_log_lines_per_second_max` lines per
//! shard per second; the lines held back are counted and the count logged with the
//! next line, so a flood of refused requests cannot fill the disk.

use kafka_protocol::messages::ApiKey;

use crate::coordinator::view::ClusterView;
use crate::model::limits;
use crate::protocol::RequestFrame;
use crate::security::acl::{AclOperation, ResourceType, CLUSTER_RESOURCE_NAME};

use super::super::context::ShardContext;

/// Kafka's message for a request the cluster's ACLs refuse (its
/// `ClusterAuthorizationException`'s default).
pub(super) const CLUSTER_DENIED: &str = "Cluster authorization failed.";

/// The client's address as the authorizer matches it (`127.0.0.1`, not `/127.0.0.1`).
pub(super) fn host(frame: &RequestFrame) -> &str {
    frame.client_host.trim_start_matches('/')
}

/// Whether the authorizer is on at all (off: every check allows).
pub(super) fn enabled(ctx: &ShardContext) -> bool {
    ctx.authorizer.enabled
}

/// Whether a denial is written to the authorizer log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Audit {
    /// Logged (Kafka's `logIfDenied = true`: the request tried the resource).
    Logged,
    /// Not logged (Kafka's `logIfDenied = false`: what is left out of a listing is not
    /// an attempt).
    Quiet,
}

/// Whether the request's principal may do `op` on `name` of `resource_type`; a
/// denial is logged.
pub(super) fn authorize(
    ctx: &ShardContext,
    frame: &RequestFrame,
    view: &ClusterView,
    op: AclOperation,
    resource_type: ResourceType,
    name: &str,
) -> bool {
    check(ctx, frame, view, (op, resource_type, name), Audit::Logged)
}

/// As `authorize`, without logging a denial.
pub(super) fn authorize_quietly(
    ctx: &ShardContext,
    frame: &RequestFrame,
    view: &ClusterView,
    op: AclOperation,
    resource_type: ResourceType,
    name: &str,
) -> bool {
    check(ctx, frame, view, (op, resource_type, name), Audit::Quiet)
}

/// READ on the group: what JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit
/// and AddOffsetsToTxn need (GROUP_AUTHORIZATION_FAILED otherwise).
pub(super) fn may_read_group(ctx: &ShardContext, frame: &RequestFrame, group: &str) -> bool {
    authorize(ctx, frame, &ctx.view(), AclOperation::Read, ResourceType::Group, group)
}

/// WRITE on the transactional id: what every transactional request of a producer
/// needs (TRANSACTIONAL_ID_AUTHORIZATION_FAILED otherwise).
pub(super) fn may_write_transactional_id(ctx: &ShardContext, frame: &RequestFrame, txn_id: &str) -> bool {
    authorize(ctx, frame, &ctx.view(), AclOperation::Write, ResourceType::TransactionalId, txn_id)
}

/// `op` on the cluster resource.
pub(super) fn authorize_cluster(
    ctx: &ShardContext,
    frame: &RequestFrame,
    view: &ClusterView,
    op: AclOperation,
) -> bool {
    authorize(ctx, frame, view, op, ResourceType::Cluster, CLUSTER_RESOURCE_NAME)
}

fn check(
    ctx: &ShardContext,
    frame: &RequestFrame,
    view: &ClusterView,
    (op, resource_type, name): (AclOperation, ResourceType, &str),
    audit: Audit,
) -> bool {
    if !ctx.authorizer.enabled {
        return true;
    }
    let allowed = ctx.authorizer.authorize(view.acls(), &frame.principal, host(frame), op, resource_type, name);
    if !allowed && audit == Audit::Logged {
        log_denied(ctx, frame, op, resource_type, name);
    }
    allowed
}

/// Kafka's authorized-operations bitmask of a resource for this request's principal.
/// With no authorizer, every operation the type supports (as Kafka answers).
pub(super) fn authorized_operations(
    ctx: &ShardContext,
    frame: &RequestFrame,
    view: &ClusterView,
    resource_type: ResourceType,
    name: &str,
) -> i32 {
    if !ctx.authorizer.enabled {
        return resource_type.supported_operations().iter().fold(0, |bits, op| bits | (1 << op.code()));
    }
    ctx.authorizer.authorized_operations(view.acls(), &frame.principal, host(frame), resource_type, name)
}

/// Whether the principal may do `op` on some resource of `resource_type` (Kafka's
/// `authorizeByResourceType`, used for an idempotent producer's InitProducerId: WRITE on
/// any topic will do, KIP-679).
pub(super) fn authorize_any(
    ctx: &ShardContext,
    frame: &RequestFrame,
    view: &ClusterView,
    op: AclOperation,
    resource_type: ResourceType,
) -> bool {
    if !ctx.authorizer.enabled {
        return true;
    }
    ctx.authorizer.authorize_by_resource_type(view.acls(), &frame.principal, host(frame), op, resource_type)
}

/// One line as Kafka's `AclAuthorizer.logAuditMessage` writes it.
fn log_denied(ctx: &ShardContext, frame: &RequestFrame, op: AclOperation, resource_type: ResourceType, name: &str) {
    let now = std::time::Instant::now();
    let (since, lines, suppressed) = ctx.authorizer_log.get();
    let (since, lines, suppressed) =
        if now.duration_since(since).as_secs() >= 1 { (now, 0, suppressed) } else { (since, lines, suppressed) };
    if lines >= limits::authorizer_log_lines_per_second_max {
        ctx.authorizer_log.set((since, lines, suppressed + 1));
        return;
    }
    ctx.authorizer_log.set((since, lines + 1, 0));
    let request =
        ApiKey::try_from(frame.api_key).map(|k| format!("{k:?}")).unwrap_or_else(|_| frame.api_key.to_string());
    tracing::info!(
        target: "kafka.authorizer.logger",
        "Principal = {} is Denied Operation = {} from host = {} on resource = {}:LITERAL:{} for request = {} with resourceRefCount = 1{}",
        frame.principal,
        op.name(),
        host(frame),
        resource_type.name(),
        name,
        request,
        if suppressed > 0 { format!(" ({suppressed} earlier denials not logged)") } else { String::new() },
    );
}
