//! `spate acl create|list|delete`: ACLs through CreateAcls / DescribeAcls / DeleteAcls,
//! with the options of Kafka's kafka-acls (`--allow-principal`, `--deny-principal`,
//! `--operation`, `--topic`, `--group`, `--cluster`, `--transactional-id`, `--host`,
//! `--resource-pattern-type`).
//!
//! create makes every combination of principal, host, operation and resource. list and
//! delete take the same options as a filter: what is not given matches anything
//! (`--resource-pattern-type` defaults to literal when a resource is named, as
//! kafka-acls, and to any when none is).

use std::collections::BTreeSet;

use clap::{Args, Subcommand};
use serde_json::json;

use super::output::{self, table};
use super::ConnArgs;
use spate::client::{AclBinding, Client, Error};
use spate::security::acl::{
    AclEntry, AclFilter, AclOperation, PatternType, Permission, ResourcePattern, ResourceType, CLUSTER_RESOURCE_NAME,
};

#[derive(Subcommand)]
pub enum AclCommand {
    /// Add ACLs: every principal x host x operation x resource given.
    Create(AclArgs),
    /// List the ACLs matching the options (all of them with none).
    List(AclArgs),
    /// Delete the ACLs matching the options (at least a resource or a principal).
    Delete(AclArgs),
}

#[derive(Args)]
pub struct AclArgs {
    /// A principal to allow, e.g. User:alice (repeatable).
    #[arg(long = "allow-principal")]
    allow_principals: Vec<String>,
    /// A principal to deny (repeatable).
    #[arg(long = "deny-principal")]
    deny_principals: Vec<String>,
    /// list/delete: a principal, allowed or denied (repeatable).
    #[arg(long = "principal")]
    principals: Vec<String>,
    /// Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs,
    /// AlterConfigs, IdempotentWrite, All (repeatable).
    #[arg(long = "operation")]
    operations: Vec<String>,
    /// A topic (repeatable; `*` for every topic).
    #[arg(long)]
    topic: Vec<String>,
    /// A consumer group (repeatable).
    #[arg(long)]
    group: Vec<String>,
    /// The cluster.
    #[arg(long)]
    cluster: bool,
    /// A transactional id (repeatable).
    #[arg(long = "transactional-id")]
    transactional_id: Vec<String>,
    /// literal or prefixed; list and delete also take match and any.
    #[arg(long = "resource-pattern-type")]
    resource_pattern_type: Option<String>,
    /// A client host the ACL applies to (repeatable; create's default: * for any).
    #[arg(long = "host")]
    hosts: Vec<String>,
    #[command(flatten)]
    conn: ConnArgs,
}

impl AclArgs {
    fn resources(&self) -> Vec<(ResourceType, String)> {
        let named = |t: ResourceType, names: &[String]| names.iter().map(move |n| (t, n.clone())).collect::<Vec<_>>();
        let mut out = named(ResourceType::Topic, &self.topic);
        out.extend(named(ResourceType::Group, &self.group));
        out.extend(named(ResourceType::TransactionalId, &self.transactional_id));
        if self.cluster {
            out.push((ResourceType::Cluster, CLUSTER_RESOURCE_NAME.to_string()));
        }
        out
    }

    fn pattern_type(&self, default: PatternType) -> Result<PatternType, Error> {
        let Some(name) = &self.resource_pattern_type else { return Ok(default) };
        [PatternType::Literal, PatternType::Prefixed, PatternType::Match, PatternType::Any]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::Usage(format!("--resource-pattern-type {name:?}: literal, prefixed, match or any")))
    }

    fn operations(&self) -> Result<Vec<AclOperation>, Error> {
        self.operations
            .iter()
            .map(|o| AclOperation::from_name(o).ok_or_else(|| Error::Usage(format!("unknown --operation {o:?}"))))
            .collect()
    }

    /// (principal, permission) pairs: allowed, denied, and (list/delete) either.
    fn principals(&self) -> Vec<(String, Permission)> {
        let with = |ps: &[String], perm: Permission| ps.iter().map(move |p| (p.clone(), perm)).collect::<Vec<_>>();
        let mut out = with(&self.allow_principals, Permission::Allow);
        out.extend(with(&self.deny_principals, Permission::Deny));
        out.extend(with(&self.principals, Permission::Any));
        out
    }

    /// The filters list and delete send: one per resource x principal x operation x
    /// host given (`Any` / `None` where an option is not given).
    fn filters(&self) -> Result<Vec<AclFilter>, Error> {
        let resources = self.resources();
        let pattern_type =
            self.pattern_type(if resources.is_empty() { PatternType::Any } else { PatternType::Literal })?;
        let resources: Vec<(ResourceType, Option<String>)> = if resources.is_empty() {
            vec![(ResourceType::Any, None)]
        } else {
            resources.into_iter().map(|(t, n)| (t, Some(n))).collect()
        };
        let principals: Vec<(Option<String>, Permission)> = match self.principals() {
            ps if ps.is_empty() => vec![(None, Permission::Any)],
            ps => ps.into_iter().map(|(p, perm)| (Some(p), perm)).collect(),
        };
        let operations = match self.operations()? {
            ops if ops.is_empty() => vec![AclOperation::Any],
            ops => ops,
        };
        let hosts: Vec<Option<String>> =
            if self.hosts.is_empty() { vec![None] } else { self.hosts.iter().cloned().map(Some).collect() };
        let mut out = Vec::new();
        for (resource_type, name) in &resources {
            for (principal, permission) in &principals {
                for operation in &operations {
                    for host in &hosts {
                        out.push(AclFilter {
                            resource_type: *resource_type,
                            pattern_type,
                            name: name.clone(),
                            principal: principal.clone(),
                            host: host.clone(),
                            operation: *operation,
                            permission: *permission,
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

pub fn run(cmd: AclCommand) -> Result<(), Error> {
    match cmd {
        AclCommand::Create(args) => {
            let bindings = bindings_to_create(&args)?;
            let mut client = args.conn.connect()?;
            client.create_acls(&bindings)?;
            print(&args.conn, "created", &bindings);
        }
        AclCommand::List(args) => {
            let found = per_filter(&args, |client, f| client.describe_acls(f))?;
            print(&args.conn, "acls", &found);
        }
        AclCommand::Delete(args) => {
            if args.resources().is_empty() && args.principals().is_empty() {
                return Err(Error::Usage("delete needs a resource (--topic, --group, ...) or a principal".into()));
            }
            let deleted = per_filter(&args, |client, f| client.delete_acls(f))?;
            print(&args.conn, "deleted", &deleted);
        }
    }
    Ok(())
}

/// `call` once per filter of `args`; the bindings answered, each once, sorted.
fn per_filter(
    args: &AclArgs,
    mut call: impl FnMut(&mut Client, &AclFilter) -> Result<Vec<AclBinding>, Error>,
) -> Result<Vec<AclBinding>, Error> {
    let filters = args.filters()?;
    let mut client = args.conn.connect()?;
    let mut out = BTreeSet::new();
    for f in &filters {
        out.extend(call(&mut client, f)?);
    }
    Ok(out.into_iter().collect())
}

fn bindings_to_create(args: &AclArgs) -> Result<Vec<AclBinding>, Error> {
    let resources = args.resources();
    let principals = args.principals();
    let operations = args.operations()?;
    if resources.is_empty() || operations.is_empty() {
        return Err(Error::Usage("create needs a resource (--topic, --group, ...) and an --operation".into()));
    }
    if principals.is_empty() || !args.principals.is_empty() {
        return Err(Error::Usage("create needs --allow-principal or --deny-principal (not --principal)".into()));
    }
    let pattern_type = args.pattern_type(PatternType::Literal)?;
    if !pattern_type.is_concrete() {
        return Err(Error::Usage("create takes --resource-pattern-type literal or prefixed".into()));
    }
    let hosts = if args.hosts.is_empty() { vec!["*".to_string()] } else { args.hosts.clone() };
    let mut out = Vec::new();
    for (resource_type, name) in &resources {
        for (principal, permission) in &principals {
            for host in &hosts {
                for operation in &operations {
                    let pattern = ResourcePattern::new(*resource_type, pattern_type, name.clone());
                    let entry = AclEntry {
                        principal: principal.clone(),
                        host: host.clone(),
                        operation: *operation,
                        permission: *permission,
                    };
                    out.push((pattern, entry));
                }
            }
        }
    }
    Ok(out)
}

/// A table of bindings, or JSON `{"<what>": [{resource_type, ...}]}`.
fn print(conn: &ConnArgs, what: &str, bindings: &[AclBinding]) {
    if conn.json {
        let list: Vec<_> = bindings
            .iter()
            .map(|(p, e)| {
                json!({
                    "resource_type": p.resource_type.name(), "name": p.name, "pattern_type": p.pattern_type.name(),
                    "principal": e.principal, "host": e.host, "operation": e.operation.name(),
                    "permission": e.permission.name(),
                })
            })
            .collect();
        output::json(&json!({ what: list }));
        return;
    }
    let rows: Vec<Vec<String>> = bindings
        .iter()
        .map(|(p, e)| {
            vec![
                p.resource_type.name().to_string(),
                p.name.clone(),
                p.pattern_type.name().to_string(),
                e.principal.clone(),
                e.host.clone(),
                e.operation.name().to_string(),
                e.permission.name().to_string(),
            ]
        })
        .collect();
    table(&["RESOURCE TYPE", "NAME", "PATTERN", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"], &rows);
}
