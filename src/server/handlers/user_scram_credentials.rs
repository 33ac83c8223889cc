//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): SCRAM
//! credentials per user and mechanism, stored in Kafka's layout (`/config/users/<user>`,
//! keys `SCRAM-SHA-256` / `SCRAM-SHA-512`, `security::scram`). Describe answers
//! mechanisms and iteration counts only, from the view; Alter runs on the active
//! coordinator (forwarded there by other brokers).
//!
//! The client sends salt, salted password and iterations; the broker keeps the salt,
//! `StoredKey` and `ServerKey` derived from them and forgets the salted password. Neither
//! it nor the keys are logged or answered.
//!
//! Errors as Kafka's (`ZkAdminManager.alterUserScramCredentials`), per user: an empty
//! name or a bad credential (iterations outside 4096..=16384, an empty or oversized
//! salt, a salted password not of the mechanism's length) is UNACCEPTABLE_CREDENTIAL, an
//! unknown mechanism UNSUPPORTED_SASL_MECHANISM, the same (user, mechanism) twice in one
//! request DUPLICATE_RESOURCE, deleting a credential that does not exist
//! RESOURCE_NOT_FOUND. A user with any error is left unchanged.
//!
//! Authorization as Kafka's: Describe needs DESCRIBE on the cluster, Alter ALTER on the
//! cluster (CLUSTER_AUTHORIZATION_FAILED otherwise, for the request or every user).

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, ApiKey, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};

use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::AclOperation;
use crate::security::entity::{self, EntityName, QuotaEntity};
use crate::security::scram::{self, ScramCredential, ScramMechanism};

use super::super::context::ShardContext;
use super::{respond, str_bytes};

type Refusal = (i16, String);

/// One user's changes: credentials to store, mechanisms to delete.
#[derive(Default)]
struct UserChanges {
    upserts: Vec<(ScramMechanism, ScramCredential)>,
    deletions: Vec<ScramMechanism>,
    error: Option<Refusal>,
}

fn user_path(user: &str) -> String {
    QuotaEntity { user: Some(EntityName::Name(user.to_string())), client_id: None }
        .path()
        .expect("a user entity has a path")
}

pub async fn handle_alter(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: AlterUserScramCredentialsRequest = decode_body(frame)?;
    let allowed = super::authz::authorize_cluster(ctx, frame, &ctx.view(), AclOperation::Alter);
    // (user, mechanism id, the upsertion's (iterations, salt, salted password) or None
    // for a deletion), deletions first as Kafka lists them.
    let ops = req.deletions.iter().map(|d| (d.name.as_str(), d.mechanism, None)).chain(
        req.upsertions
            .iter()
            .map(|u| (u.name.as_str(), u.mechanism, Some((u.iterations, &u.salt[..], &u.salted_password[..])))),
    );
    // Users in the order they first appear.
    let mut order: Vec<String> = Vec::new();
    let mut users: BTreeMap<String, UserChanges> = BTreeMap::new();
    let mut seen: Vec<(&str, i8)> = Vec::new();
    for (name, mechanism, upsert) in ops {
        if !users.contains_key(name) {
            order.push(name.to_string());
        }
        let changes = users.entry(name.to_string()).or_default();
        let twice = seen.contains(&(name, mechanism));
        seen.push((name, mechanism));
        if changes.error.is_some() {
            continue;
        }
        if !allowed {
            changes.error = Some((error_code::CLUSTER_AUTHORIZATION_FAILED, super::authz::CLUSTER_DENIED.to_string()));
            continue;
        }
        let m = match check_op(name, mechanism, twice, upsert) {
            Ok(m) => m,
            Err(refusal) => {
                changes.error = Some(refusal);
                continue;
            }
        };
        match upsert {
            Some((iterations, salt, salted_password)) => changes
                .upserts
                .push((m, ScramCredential::from_salted_password(m, salt, salted_password, iterations as u32))),
            None => changes.deletions.push(m),
        }
    }
    let mut results = Vec::with_capacity(order.len());
    for name in order {
        let changes = users.remove(&name).expect("every user in order has changes");
        let (code, message) = match changes.error {
            Some(refusal) => refusal,
            None => match apply(ctx, &name, changes.upserts, changes.deletions).await {
                Ok(()) => (error_code::NONE, String::new()),
                Err(refusal) => refusal,
            },
        };
        results.push(
            AlterUserScramCredentialsResult::default()
                .with_user(str_bytes(name))
                .with_error_code(code)
                .with_error_message((code != error_code::NONE).then(|| str_bytes(message))),
        );
    }
    respond(
        ApiKey::AlterUserScramCredentials,
        frame,
        &AlterUserScramCredentialsResponse::default().with_results(results),
    )
}

/// Kafka's checks of one deletion or upsertion; the mechanism when it passes.
fn check_op(
    name: &str,
    mechanism: i8,
    twice: bool,
    upsert: Option<(i32, &[u8], &[u8])>,
) -> Result<ScramMechanism, Refusal> {
    let refuse = |code, why: &str| Err((code, why.to_string()));
    if name.is_empty() {
        return refuse(error_code::UNACCEPTABLE_CREDENTIAL, "Username must not be empty");
    }
    if name.len() > entity::entity_name_bytes_max {
        return refuse(error_code::UNACCEPTABLE_CREDENTIAL, "Username is too long");
    }
    let Some(m) = ScramMechanism::from_wire_id(mechanism) else {
        return refuse(error_code::UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism");
    };
    if twice {
        return refuse(error_code::DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request");
    }
    if let Some((iterations, salt, salted_password)) = upsert {
        let why = if iterations < scram::scram_iterations_min as i32 {
            Some("Too few iterations")
        } else if iterations > scram::scram_iterations_max as i32 {
            Some("Too many iterations")
        } else if salt.is_empty() || salt.len() > scram::scram_salt_bytes_max {
            Some("Salt must be 1 to 1024 bytes")
        } else if salted_password.len() != m.key_bytes() {
            Some("Salted password has the wrong length for the mechanism")
        } else {
            None
        };
        if let Some(why) = why {
            return refuse(error_code::UNACCEPTABLE_CREDENTIAL, why);
        }
    }
    Ok(m)
}

/// Store one user's changes in one registry call (read, change, write), so that two
/// requests never lose each other's keys.
async fn apply(
    ctx: &ShardContext,
    user: &str,
    upserts: Vec<(ScramMechanism, ScramCredential)>,
    deletions: Vec<ScramMechanism>,
) -> Result<(), Refusal> {
    let path = user_path(user);
    let mechanisms: Vec<&str> =
        upserts.iter().map(|(m, _)| m.name()).chain(deletions.iter().map(|m| m.name())).collect();
    tracing::info!(user, ?mechanisms, "altering SCRAM credentials");
    let result = ctx
        .metadata
        .write(move |reg| {
            let mut configs = reg.entity_configs(&path);
            if deletions.iter().any(|m| !configs.contains_key(m.name())) {
                return Ok(Err((
                    error_code::RESOURCE_NOT_FOUND,
                    "Attempt to delete a user credential that does not exist".to_string(),
                )));
            }
            for m in deletions {
                configs.remove(m.name());
            }
            for (m, c) in upserts {
                configs.insert(m.name().to_string(), c.to_kafka_string());
            }
            reg.set_entity_configs(&path, configs).map(Ok)
        })
        .await;
    match result {
        Ok(outcome) => outcome,
        Err(e) => Err((super::registry_error_code(&e), e.to_string())),
    }
}

pub fn handle_describe(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: DescribeUserScramCredentialsRequest = decode_body(frame)?;
    let view = ctx.view();
    if !super::authz::authorize_cluster(ctx, frame, &view, AclOperation::Describe) {
        let body = DescribeUserScramCredentialsResponse::default()
            .with_error_code(error_code::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(str_bytes(super::authz::CLUSTER_DENIED)));
        return respond(ApiKey::DescribeUserScramCredentials, frame, &body);
    }
    let scram = &view.entity_configs().scram;
    let describe = |user: &str| -> DescribeUserScramCredentialsResult {
        let infos: Vec<CredentialInfo> = ScramMechanism::ALL
            .into_iter()
            .filter_map(|m| {
                let c = scram.get(&(user.to_string(), m))?;
                Some(CredentialInfo::default().with_mechanism(m.wire_id()).with_iterations(c.iterations as i32))
            })
            .collect();
        let result = DescribeUserScramCredentialsResult::default().with_user(str_bytes(user));
        if infos.is_empty() {
            result
                .with_error_code(error_code::RESOURCE_NOT_FOUND)
                .with_error_message(Some(str_bytes("Attempt to describe a user credential that does not exist")))
        } else {
            result.with_credential_infos(infos)
        }
    };
    let results: Vec<DescribeUserScramCredentialsResult> = match req.users.as_ref().filter(|u| !u.is_empty()) {
        None => {
            let mut users: Vec<&str> = scram.keys().map(|(u, _)| u.as_str()).collect();
            users.dedup();
            users.into_iter().map(describe).collect()
        }
        Some(asked) => {
            let names: Vec<&str> = asked.iter().map(|u| u.name.as_str()).collect();
            let mut results = Vec::with_capacity(names.len());
            for (i, name) in names.iter().enumerate() {
                if names[..i].contains(name) {
                    continue;
                }
                if names[i + 1..].contains(name) {
                    results.push(
                        DescribeUserScramCredentialsResult::default()
                            .with_user(str_bytes(*name))
                            .with_error_code(error_code::DUPLICATE_RESOURCE)
                            .with_error_message(Some(str_bytes(
                                "Cannot describe SCRAM credentials for the same user twice in a single request",
                            ))),
                    );
                } else {
                    results.push(describe(name));
                }
            }
            results
        }
    };
    respond(
        ApiKey::DescribeUserScramCredentials,
        frame,
        &DescribeUserScramCredentialsResponse::default().with_results(results),
    )
}
