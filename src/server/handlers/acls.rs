//! CreateAcls, DescribeAcls, DeleteAcls (v1-3, as Kafka 4 serves them), as Kafka's
//! `AclApis`: with no authorizer configured every answer is SECURITY_DISABLED; creating
//! and deleting need ALTER on the cluster, describing DESCRIBE on the cluster
//! (CLUSTER_AUTHORIZATION_FAILED otherwise). Creations and deletions run on the active
//! coordinator's registry, which stores them in Kafka's ZooKeeper layout
//! (`coordinator::acl_store`); other brokers forward them there (`forward.rs`).
//! DescribeAcls reads this broker's view.

use bytes::Bytes;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse, DescribeAclsRequest,
    DescribeAclsResponse,
};

use crate::coordinator::registry::AclWriteError;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclEntry, AclFilter, AclOperation, PatternType, Permission, ResourcePattern, ResourceType};

use super::super::context::ShardContext;
use super::{authz, registry_error_code, respond, str_bytes};

const NO_AUTHORIZER: &str = "No Authorizer is configured on the broker";

fn write_error(e: &AclWriteError) -> (i16, String) {
    match e {
        AclWriteError::Invalid(m) => (error_code::INVALID_REQUEST, m.clone()),
        AclWriteError::Registry(r) => (registry_error_code(r), r.to_string()),
    }
}

/// A filter from the wire; `Err`: a code Kafka does not know.
#[allow(clippy::too_many_arguments)]
fn filter(
    resource_type: i8,
    name: Option<&str>,
    pattern_type: i8,
    principal: Option<&str>,
    host: Option<&str>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, String> {
    Ok(AclFilter {
        resource_type: ResourceType::from_code(resource_type).ok_or("unknown resource type")?,
        pattern_type: PatternType::from_code(pattern_type).ok_or("unknown pattern type")?,
        name: name.map(str::to_string),
        principal: principal.map(str::to_string),
        host: host.map(str::to_string),
        operation: AclOperation::from_code(operation).ok_or("unknown operation")?,
        permission: Permission::from_code(permission).ok_or("unknown permission type")?,
    })
}

pub async fn handle_create(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: CreateAclsRequest = decode_body(frame)?;
    let answer = |code: i16, message: &str| {
        let results = req
            .creations
            .iter()
            .map(|_| AclCreationResult::default().with_error_code(code).with_error_message(Some(str_bytes(message))))
            .collect();
        respond(ApiKey::CreateAcls, frame, &CreateAclsResponse::default().with_results(results))
    };
    if !authz::enabled(ctx) {
        return answer(error_code::SECURITY_DISABLED, NO_AUTHORIZER);
    }
    if !authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::Alter) {
        return answer(error_code::CLUSTER_AUTHORIZATION_FAILED, super::authz::CLUSTER_DENIED);
    }
    // Parse each creation; ones that do not parse get INVALID_REQUEST, the others go to
    // the registry together.
    let mut parsed: Vec<Result<(ResourcePattern, AclEntry), String>> = Vec::with_capacity(req.creations.len());
    for c in &req.creations {
        let pattern_type = if frame.api_version == 0 { PatternType::Literal.code() } else { c.resource_pattern_type };
        let binding = (|| {
            let resource_type = ResourceType::from_code(c.resource_type).ok_or("unknown resource type")?;
            let pattern_type = PatternType::from_code(pattern_type).ok_or("unknown pattern type")?;
            let operation = AclOperation::from_code(c.operation).ok_or("unknown operation")?;
            let permission = Permission::from_code(c.permission_type).ok_or("unknown permission type")?;
            Ok::<_, &str>((
                ResourcePattern::new(resource_type, pattern_type, c.resource_name.as_str()),
                AclEntry { principal: c.principal.to_string(), host: c.host.to_string(), operation, permission },
            ))
        })();
        parsed.push(binding.map_err(str::to_string));
    }
    let valid: Vec<(ResourcePattern, AclEntry)> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
    let written = ctx.metadata.write(move |reg| reg.create_acls(valid)).await;
    let mut written = written.into_iter();
    let results = parsed
        .into_iter()
        .map(|p| {
            let outcome = match p {
                Err(m) => Err((error_code::INVALID_REQUEST, m)),
                Ok(_) => written.next().expect("one result per valid binding").map_err(|e| write_error(&e)),
            };
            match outcome {
                Ok(()) => AclCreationResult::default(),
                Err((code, m)) => {
                    AclCreationResult::default().with_error_code(code).with_error_message(Some(str_bytes(m)))
                }
            }
        })
        .collect();
    respond(ApiKey::CreateAcls, frame, &CreateAclsResponse::default().with_results(results))
}

pub fn handle_describe(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeAclsRequest = decode_body(frame)?;
    let fail = |code: i16, message: &str| {
        respond(
            ApiKey::DescribeAcls,
            frame,
            &DescribeAclsResponse::default().with_error_code(code).with_error_message(Some(str_bytes(message))),
        )
    };
    if !authz::enabled(ctx) {
        return fail(error_code::SECURITY_DISABLED, NO_AUTHORIZER);
    }
    let view = ctx.view();
    if !authz::authorize_cluster(ctx, frame, &view, AclOperation::Describe) {
        return fail(error_code::CLUSTER_AUTHORIZATION_FAILED, super::authz::CLUSTER_DENIED);
    }
    let pattern_type = if frame.api_version == 0 { PatternType::Literal.code() } else { req.pattern_type_filter };
    let f = match filter(
        req.resource_type_filter,
        req.resource_name_filter.as_deref(),
        pattern_type,
        req.principal_filter.as_deref(),
        req.host_filter.as_deref(),
        req.operation,
        req.permission_type,
    ) {
        Ok(f) => f,
        Err(m) => return fail(error_code::INVALID_REQUEST, &m),
    };
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for (pattern, entry) in view.acls().matching(&f) {
        let description = AclDescription::default()
            .with_principal(str_bytes(entry.principal))
            .with_host(str_bytes(entry.host))
            .with_operation(entry.operation.code())
            .with_permission_type(entry.permission.code());
        let same = resources.last_mut().filter(|r| {
            r.resource_type == pattern.resource_type.code()
                && r.pattern_type == pattern.pattern_type.code()
                && r.resource_name.as_str() == pattern.name
        });
        match same {
            Some(r) => r.acls.push(description),
            None => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(pattern.resource_type.code())
                    .with_resource_name(str_bytes(pattern.name))
                    .with_pattern_type(pattern.pattern_type.code())
                    .with_acls(vec![description]),
            ),
        }
    }
    respond(ApiKey::DescribeAcls, frame, &DescribeAclsResponse::default().with_resources(resources))
}

pub async fn handle_delete(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DeleteAclsRequest = decode_body(frame)?;
    let answer = |code: i16, message: &str| {
        let results = req
            .filters
            .iter()
            .map(|_| {
                DeleteAclsFilterResult::default().with_error_code(code).with_error_message(Some(str_bytes(message)))
            })
            .collect();
        respond(ApiKey::DeleteAcls, frame, &DeleteAclsResponse::default().with_filter_results(results))
    };
    if !authz::enabled(ctx) {
        return answer(error_code::SECURITY_DISABLED, NO_AUTHORIZER);
    }
    if !authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::Alter) {
        return answer(error_code::CLUSTER_AUTHORIZATION_FAILED, super::authz::CLUSTER_DENIED);
    }
    let parsed: Vec<Result<AclFilter, String>> = req
        .filters
        .iter()
        .map(|f| {
            let pattern_type = if frame.api_version == 0 { PatternType::Literal.code() } else { f.pattern_type_filter };
            filter(
                f.resource_type_filter,
                f.resource_name_filter.as_deref(),
                pattern_type,
                f.principal_filter.as_deref(),
                f.host_filter.as_deref(),
                f.operation,
                f.permission_type,
            )
        })
        .collect();
    let valid: Vec<AclFilter> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
    let deleted = ctx.metadata.write(move |reg| reg.delete_acls(&valid)).await;
    let mut deleted = deleted.into_iter();
    let results = parsed
        .into_iter()
        .map(|p| {
            let outcome = match p {
                Err(m) => Err((error_code::INVALID_REQUEST, m)),
                Ok(_) => deleted.next().expect("one result per valid filter").map_err(|e| write_error(&e)),
            };
            match outcome {
                Ok(matched) => DeleteAclsFilterResult::default().with_matching_acls(
                    matched
                        .into_iter()
                        .map(|(p, e)| {
                            DeleteAclsMatchingAcl::default()
                                .with_resource_type(p.resource_type.code())
                                .with_resource_name(str_bytes(p.name))
                                .with_pattern_type(p.pattern_type.code())
                                .with_principal(str_bytes(e.principal))
                                .with_host(str_bytes(e.host))
                                .with_operation(e.operation.code())
                                .with_permission_type(e.permission.code())
                        })
                        .collect(),
                ),
                Err((code, m)) => {
                    DeleteAclsFilterResult::default().with_error_code(code).with_error_message(Some(str_bytes(m)))
                }
            }
        })
        .collect();
    respond(ApiKey::DeleteAcls, frame, &DeleteAclsResponse::default().with_filter_results(results))
}
