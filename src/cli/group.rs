//! `spate group list|describe|reset-offsets`.

use std::collections::{BTreeMap, BTreeSet};

use clap::Subcommand;
use serde_json::json;

use super::output::table;
use super::{check_topic_name, output, ConnArgs};
use spate::client::{timestamp_earliest, timestamp_latest, Error};

#[derive(Subcommand)]
pub enum GroupCommand {
    /// List consumer groups.
    List {
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Members, assignments, committed offsets and lag of a group.
    Describe {
        group: String,
        #[command(flatten)]
        conn: ConnArgs,
    },
    /// Move a group's committed offsets (only while the group has no members).
    ResetOffsets {
        group: String,
        #[arg(long)]
        topic: String,
        #[arg(long, group = "target")]
        to_earliest: bool,
        #[arg(long, group = "target")]
        to_latest: bool,
        #[arg(long, group = "target")]
        to_offset: Option<i64>,
        #[command(flatten)]
        conn: ConnArgs,
    },
}

pub fn run(cmd: GroupCommand) -> Result<(), Error> {
    match cmd {
        GroupCommand::List { conn } => {
            let mut client = conn.connect()?;
            let groups = client.list_groups()?;
            if conn.json {
                output::json(&serde_json::to_value(&groups).map_err(output::json_err)?);
            } else {
                let rows: Vec<Vec<String>> =
                    groups.iter().map(|g| vec![g.group.clone(), g.state.clone(), g.protocol_type.clone()]).collect();
                table(&["GROUP", "STATE", "PROTOCOL TYPE"], &rows);
            }
        }
        GroupCommand::Describe { group, conn } => {
            let mut client = conn.connect()?;
            let desc = client.describe_group(&group)?;
            let committed = client.committed_offsets(&group)?;
            // Owner of each partition, from the members' assignments.
            let mut owner: BTreeMap<(String, i32), String> = BTreeMap::new();
            for m in &desc.members {
                for (t, ps) in &m.assignment {
                    for p in ps {
                        owner.insert((t.clone(), *p), m.member_id.clone());
                    }
                }
            }
            let keys: BTreeSet<(String, i32)> = committed.keys().cloned().chain(owner.keys().cloned()).collect();
            let topics: BTreeSet<String> = keys.iter().map(|(t, _)| t.clone()).collect();
            let mut log_end: BTreeMap<(String, i32), i64> = BTreeMap::new();
            for t in &topics {
                let parts: Vec<i32> = keys.iter().filter(|(kt, _)| kt == t).map(|(_, p)| *p).collect();
                // A deleted topic keeps its commits; show them without a log end.
                if let Ok(ends) = client.list_offsets(t, &parts, timestamp_latest) {
                    for (p, o) in ends {
                        log_end.insert((t.clone(), p), o);
                    }
                }
            }
            // (topic, partition, committed, log end, lag, member)
            type Row = (String, i32, Option<i64>, Option<i64>, Option<i64>, Option<String>);
            let rows: Vec<Row> = keys
                .iter()
                .map(|k| {
                    let c = committed.get(k).copied();
                    let e = log_end.get(k).copied();
                    let lag = e.map(|e| (e - c.unwrap_or(0)).max(0));
                    (k.0.clone(), k.1, c, e, lag, owner.get(k).cloned())
                })
                .collect();
            if conn.json {
                let offsets: Vec<_> = rows
                    .iter()
                    .map(|(t, p, c, e, lag, o)| {
                        json!({"topic": t, "partition": p, "committed_offset": c, "log_end_offset": e, "lag": lag, "member": o})
                    })
                    .collect();
                output::json(&json!({
                    "group": desc.group, "state": desc.state, "protocol_type": desc.protocol_type,
                    "protocol": desc.protocol,
                    "members": serde_json::to_value(&desc.members).map_err(output::json_err)?,
                    "offsets": offsets,
                    "total_lag": rows.iter().filter_map(|r| r.4).sum::<i64>(),
                }));
            } else {
                output::print_raw(&format!(
                    "group {} state {} protocol {} members {}\n\n",
                    desc.group,
                    desc.state,
                    if desc.protocol.is_empty() { "-" } else { &desc.protocol },
                    desc.members.len()
                ));
                if !desc.members.is_empty() {
                    let mrows: Vec<Vec<String>> = desc
                        .members
                        .iter()
                        .map(|m| {
                            let a: Vec<String> =
                                m.assignment.iter().map(|(t, ps)| format!("{t}:{}", output::ids(ps))).collect();
                            vec![m.member_id.clone(), m.client_id.clone(), m.client_host.clone(), a.join(" ")]
                        })
                        .collect();
                    table(&["MEMBER", "CLIENT ID", "HOST", "ASSIGNMENT"], &mrows);
                    output::print_raw("\n");
                }
                let show = |v: &Option<i64>| v.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
                let orows: Vec<Vec<String>> = rows
                    .iter()
                    .map(|(t, p, c, e, lag, o)| {
                        vec![
                            t.clone(),
                            p.to_string(),
                            show(c),
                            show(e),
                            show(lag),
                            o.clone().unwrap_or_else(|| "-".into()),
                        ]
                    })
                    .collect();
                table(&["TOPIC", "PARTITION", "COMMITTED", "LOG END", "LAG", "MEMBER"], &orows);
            }
        }
        GroupCommand::ResetOffsets { group, topic, to_earliest, to_latest, to_offset, conn } => {
            check_topic_name(&topic)?;
            if !to_earliest && !to_latest && to_offset.is_none() {
                return Err(Error::Usage("one of --to-earliest, --to-latest, --to-offset N is required".into()));
            }
            if to_offset.is_some_and(|o| o < 0) {
                return Err(Error::Usage("--to-offset must be >= 0".into()));
            }
            let mut client = conn.connect()?;
            let desc = client.describe_group(&group)?;
            if !desc.members.is_empty() {
                return Err(Error::State(format!(
                    "group '{group}' has {} active members (state {}); stop them before resetting offsets",
                    desc.members.len(),
                    desc.state
                )));
            }
            let info = client.describe_topic(&topic)?;
            let parts: Vec<i32> = info.partitions.iter().map(|p| p.partition).collect();
            let earliest = client.list_offsets(&topic, &parts, timestamp_earliest)?;
            let latest = client.list_offsets(&topic, &parts, timestamp_latest)?;
            let mut targets = Vec::new();
            for &p in &parts {
                let (lo, hi) = (earliest.get(&p).copied().unwrap_or(0), latest.get(&p).copied().unwrap_or(0));
                let target = match to_offset {
                    Some(o) => o.clamp(lo, hi),
                    None if to_earliest => lo,
                    None => hi,
                };
                targets.push((topic.clone(), p, target));
            }
            client.commit_offsets(&group, -1, "", &targets)?;
            if conn.json {
                let v: Vec<_> =
                    targets.iter().map(|(t, p, o)| json!({"topic": t, "partition": p, "offset": o})).collect();
                output::json(&json!({"group": group, "reset": v}));
            } else {
                let rows: Vec<Vec<String>> =
                    targets.iter().map(|(t, p, o)| vec![t.clone(), p.to_string(), o.to_string()]).collect();
                table(&["TOPIC", "PARTITION", "NEW OFFSET"], &rows);
            }
        }
    }
    Ok(())
}
