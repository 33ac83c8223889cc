//! Security admin requests for the operator tools (`spate acl`, `spate user scram`,
//! `spate quota`): CreateAcls / DescribeAcls / DeleteAcls, Describe- and
//! AlterUserScramCredentials, Describe- and AlterClientQuotas. Each goes to any broker
//! (which forwards what must reach the controller); a Kafka error code in the answer
//! becomes `Error::Broker`.
//!
//! SCRAM credentials are made here as Kafka's kafka-configs makes them: a random salt
//! (`scram_salt_bytes`), the salted password by PBKDF2 (RFC 5802's `Hi`, through
//! `security::scram`), and the two sent with the iteration count; the password never
//! leaves this process.

use bytes::Bytes;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterUserScramCredentialsRequest, CreateAclsRequest, DeleteAclsRequest,
    DescribeAclsRequest, DescribeClientQuotasRequest, DescribeUserScramCredentialsRequest,
};

use super::{check, sb, Client, Error};
use crate::security::acl::{AclEntry, AclFilter, AclOperation, PatternType, Permission, ResourcePattern, ResourceType};
use crate::security::scram::ScramMechanism;

/// Salt length of a credential this client makes (Kafka's `ScramFormatter` makes 32).
pub const scram_salt_bytes: usize = 32;

/// One ACL: what it is on, and the entry.
pub type AclBinding = (ResourcePattern, AclEntry);

/// A client-quota entity: (entity type `user` / `client-id`, name; None: the default).
pub type QuotaEntity = Vec<(String, Option<String>)>;

/// A quota entity and its quotas (name, value).
pub type EntityQuotas = (QuotaEntity, Vec<(String, f64)>);

/// A user and the iteration count of each SCRAM mechanism it has a credential for.
pub type UserScramCredentials = (String, Vec<(ScramMechanism, i32)>);

/// How DescribeClientQuotas matches one entity type (Kafka's `match_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaMatch {
    /// This name exactly.
    Exact(String),
    /// The default entity of the type.
    Default,
    /// Any entity of the type, the default included.
    Any,
}

impl QuotaMatch {
    fn wire(&self) -> (i8, Option<&str>) {
        match self {
            QuotaMatch::Exact(name) => (0, Some(name.as_str())),
            QuotaMatch::Default => (1, None),
            QuotaMatch::Any => (2, None),
        }
    }
}

/// An `AclFilter` in a DescribeAclsRequest or a DeleteAclsFilter (the same fields in
/// both messages, which share no type).
macro_rules! with_filter {
    ($wire:expr, $filter:expr) => {
        $wire
            .with_resource_type_filter($filter.resource_type.code())
            .with_resource_name_filter($filter.name.as_deref().map(sb))
            .with_pattern_type_filter($filter.pattern_type.code())
            .with_principal_filter($filter.principal.as_deref().map(sb))
            .with_host_filter($filter.host.as_deref().map(sb))
            .with_operation($filter.operation.code())
            .with_permission_type($filter.permission.code())
    };
}

/// Decode a binding the broker described; codes this client does not know are refused.
fn binding(
    (resource_type, name, pattern_type): (i8, &str, i8),
    (principal, host, operation, permission): (&str, &str, i8, i8),
) -> Result<AclBinding, Error> {
    let unknown = |what: &str, code: i8| Error::Protocol(format!("the broker answered an unknown ACL {what} {code}"));
    let pattern = ResourcePattern::new(
        ResourceType::from_code(resource_type).ok_or_else(|| unknown("resource type", resource_type))?,
        PatternType::from_code(pattern_type).ok_or_else(|| unknown("pattern type", pattern_type))?,
        name,
    );
    let entry = AclEntry {
        principal: principal.to_string(),
        host: host.to_string(),
        operation: AclOperation::from_code(operation).ok_or_else(|| unknown("operation", operation))?,
        permission: Permission::from_code(permission).ok_or_else(|| unknown("permission", permission))?,
    };
    Ok((pattern, entry))
}

/// A fresh random salt: the OS's generator, through uuid v4 (122 random bits each).
fn random_salt() -> Vec<u8> {
    let mut salt = Vec::with_capacity(scram_salt_bytes);
    while salt.len() < scram_salt_bytes {
        salt.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    salt.truncate(scram_salt_bytes);
    salt
}

impl Client {
    /// Create ACLs; the first refused binding is the error (the others may be created).
    pub fn create_acls(&mut self, bindings: &[AclBinding]) -> Result<(), Error> {
        use kafka_protocol::messages::create_acls_request::AclCreation;
        let creations = bindings
            .iter()
            .map(|(p, e)| {
                AclCreation::default()
                    .with_resource_type(p.resource_type.code())
                    .with_resource_name(sb(&p.name))
                    .with_resource_pattern_type(p.pattern_type.code())
                    .with_principal(sb(&e.principal))
                    .with_host(sb(&e.host))
                    .with_operation(e.operation.code())
                    .with_permission_type(e.permission.code())
            })
            .collect();
        let (_, resp) = self.send_any(&CreateAclsRequest::default().with_creations(creations))?;
        for (r, (p, e)) in resp.results.iter().zip(bindings) {
            check(|| format!("create ACL {} on {p}", e.operation.name()), r.error_code, r.error_message.as_ref())?;
        }
        Ok(())
    }

    /// The ACLs matching `filter`.
    pub fn describe_acls(&mut self, filter: &AclFilter) -> Result<Vec<AclBinding>, Error> {
        let req = with_filter!(DescribeAclsRequest::default(), filter);
        let (_, resp) = self.send_any(&req)?;
        check(|| "describe ACLs".to_string(), resp.error_code, resp.error_message.as_ref())?;
        let mut out = Vec::new();
        for r in &resp.resources {
            for a in &r.acls {
                out.push(binding(
                    (r.resource_type, r.resource_name.as_str(), r.pattern_type),
                    (a.principal.as_str(), a.host.as_str(), a.operation, a.permission_type),
                )?);
            }
        }
        Ok(out)
    }

    /// Delete the ACLs matching `filter`; the ones deleted.
    pub fn delete_acls(&mut self, filter: &AclFilter) -> Result<Vec<AclBinding>, Error> {
        use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
        let wire = with_filter!(DeleteAclsFilter::default(), filter);
        let (_, resp) = self.send_any(&DeleteAclsRequest::default().with_filters(vec![wire]))?;
        let mut out = Vec::new();
        for r in &resp.filter_results {
            check(|| "delete ACLs".to_string(), r.error_code, r.error_message.as_ref())?;
            for m in &r.matching_acls {
                check(|| "delete an ACL".to_string(), m.error_code, m.error_message.as_ref())?;
                out.push(binding(
                    (m.resource_type, m.resource_name.as_str(), m.pattern_type),
                    (m.principal.as_str(), m.host.as_str(), m.operation, m.permission_type),
                )?);
            }
        }
        Ok(out)
    }

    /// Set `user`'s credential for `mechanism` from `password` (a new random salt).
    pub fn set_scram_credential(
        &mut self,
        user: &str,
        mechanism: ScramMechanism,
        iterations: u32,
        password: &[u8],
    ) -> Result<(), Error> {
        use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
        let salt = random_salt();
        let salted = mechanism.salted_password(password, &salt, iterations);
        let iterations = i32::try_from(iterations).map_err(|_| Error::Usage("--iterations is too large".into()))?;
        let upsertion = ScramCredentialUpsertion::default()
            .with_name(sb(user))
            .with_mechanism(mechanism.wire_id())
            .with_iterations(iterations)
            .with_salt(Bytes::from(salt))
            .with_salted_password(Bytes::from(salted));
        let req = AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsertion]);
        self.alter_scram(&req, || format!("set {mechanism} credential of user '{user}'"))
    }

    /// Delete `user`'s credential for `mechanism`.
    pub fn delete_scram_credential(&mut self, user: &str, mechanism: ScramMechanism) -> Result<(), Error> {
        use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialDeletion;
        let deletion = ScramCredentialDeletion::default().with_name(sb(user)).with_mechanism(mechanism.wire_id());
        let req = AlterUserScramCredentialsRequest::default().with_deletions(vec![deletion]);
        self.alter_scram(&req, || format!("delete {mechanism} credential of user '{user}'"))
    }

    fn alter_scram(
        &mut self,
        req: &AlterUserScramCredentialsRequest,
        context: impl Fn() -> String,
    ) -> Result<(), Error> {
        let (_, resp) = self.send_any(req)?;
        for r in &resp.results {
            check(&context, r.error_code, r.error_message.as_ref())?;
        }
        Ok(())
    }

    /// Per user (all users with a credential when `users` is empty): each mechanism's
    /// iteration count. A user without credentials is an error (RESOURCE_NOT_FOUND).
    pub fn describe_scram_credentials(&mut self, users: &[String]) -> Result<Vec<UserScramCredentials>, Error> {
        use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
        let names = (!users.is_empty()).then(|| users.iter().map(|u| UserName::default().with_name(sb(u))).collect());
        let (_, resp) = self.send_any(&DescribeUserScramCredentialsRequest::default().with_users(names))?;
        check(|| "describe SCRAM credentials".to_string(), resp.error_code, resp.error_message.as_ref())?;
        let mut out = Vec::new();
        for r in &resp.results {
            check(|| format!("SCRAM credentials of user '{}'", r.user), r.error_code, r.error_message.as_ref())?;
            let infos = r
                .credential_infos
                .iter()
                .filter_map(|c| ScramMechanism::from_wire_id(c.mechanism).map(|m| (m, c.iterations)))
                .collect();
            out.push((r.user.to_string(), infos));
        }
        Ok(out)
    }

    /// Set (`Some`) or remove (`None`) quota keys of one entity.
    pub fn alter_client_quotas(&mut self, entity: &QuotaEntity, ops: &[(String, Option<f64>)]) -> Result<(), Error> {
        use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
        let entry = EntryData::default()
            .with_entity(
                entity
                    .iter()
                    .map(|(t, n)| EntityData::default().with_entity_type(sb(t)).with_entity_name(n.as_deref().map(sb)))
                    .collect(),
            )
            .with_ops(
                ops.iter()
                    .map(|(k, v)| {
                        OpData::default().with_key(sb(k)).with_value(v.unwrap_or(0.0)).with_remove(v.is_none())
                    })
                    .collect(),
            );
        let (_, resp) = self.send_any(&AlterClientQuotasRequest::default().with_entries(vec![entry]))?;
        for e in &resp.entries {
            check(|| format!("alter quotas of {}", entity_name(entity)), e.error_code, e.error_message.as_ref())?;
        }
        Ok(())
    }

    /// The quotas of the entities matching `components` (`strict`: entities of exactly
    /// those types).
    pub fn describe_client_quotas(
        &mut self,
        components: &[(String, QuotaMatch)],
        strict: bool,
    ) -> Result<Vec<EntityQuotas>, Error> {
        use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
        let components = components
            .iter()
            .map(|(t, m)| {
                let (match_type, name) = m.wire();
                ComponentData::default().with_entity_type(sb(t)).with_match_type(match_type).with_match(name.map(sb))
            })
            .collect();
        let req = DescribeClientQuotasRequest::default().with_components(components).with_strict(strict);
        let (_, resp) = self.send_any(&req)?;
        check(|| "describe client quotas".to_string(), resp.error_code, resp.error_message.as_ref())?;
        Ok(resp
            .entries
            .iter()
            .flatten()
            .map(|e| {
                let entity = e
                    .entity
                    .iter()
                    .map(|d| (d.entity_type.to_string(), d.entity_name.as_ref().map(|n| n.to_string())))
                    .collect();
                (entity, e.values.iter().map(|v| (v.key.to_string(), v.value)).collect())
            })
            .collect())
    }
}

/// `user=alice, client-id=<default>`: an entity as the CLI prints it.
pub fn entity_name(entity: &QuotaEntity) -> String {
    entity.iter().map(|(t, n)| format!("{t}={}", n.as_deref().unwrap_or("<default>"))).collect::<Vec<_>>().join(", ")
}
