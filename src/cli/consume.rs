//! `spate consume TOPIC`: print records, by partition and offset or as a member of a
//! consumer group (with commits).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::records::Record;
use serde_json::json;

use super::{check_topic_name, output, ConnArgs};
use spate::client::{timestamp_earliest, timestamp_latest, Client, Error};

/// Group session and rebalance timeouts, and how often to heartbeat.
const session_timeout_ms: i32 = 10_000;
const rebalance_timeout_ms: i32 = 30_000;
const heartbeat_interval_ms: u64 = 3_000;
/// Kafka's REBALANCE_IN_PROGRESS and the errors that mean "join again".
const rejoin_codes: &[i16] = &[22, 25, 27];
/// How long one fetch waits at the broker for data.
const fetch_wait_ms: i32 = 500;

#[derive(clap::Args)]
pub struct ConsumeArgs {
    pub topic: String,
    /// Start at the earliest offset (without a group, or when the group has no commit).
    #[arg(long)]
    from_beginning: bool,
    /// Start at this offset (every consumed partition).
    #[arg(long, conflicts_with_all = ["from_beginning", "group"])]
    offset: Option<i64>,
    /// Only this partition.
    #[arg(long, conflicts_with = "group")]
    partition: Option<i32>,
    /// Consume as a member of this group; commits what was printed.
    #[arg(long)]
    group: Option<String>,
    /// Exit after this many messages.
    #[arg(long)]
    max_messages: Option<u64>,
    /// Exit after this long without a new message, in milliseconds.
    #[arg(long)]
    idle_timeout_ms: Option<u64>,
    /// Output format: %k key, %v value, %p partition, %o offset, %t timestamp (ms),
    /// %h headers (k=v,...), %s topic; \n and \t escapes [default: "%v\n"]
    #[arg(long)]
    format: Option<String>,
    #[command(flatten)]
    conn: ConnArgs,
}

struct Printer {
    format: Option<String>,
    json: bool,
    topic: String,
}

impl Printer {
    fn print(&self, partition: i32, r: &Record) {
        let text = |b: &Option<bytes::Bytes>| b.as_ref().map(|b| String::from_utf8_lossy(b).into_owned());
        if self.json {
            let headers: serde_json::Map<String, serde_json::Value> =
                r.headers.iter().map(|(k, v)| (k.to_string(), json!(text(v)))).collect();
            output::json(&json!({
                "topic": self.topic, "partition": partition, "offset": r.offset, "timestamp": r.timestamp,
                "key": text(&r.key), "value": text(&r.value), "headers": headers,
            }));
            return;
        }
        let Some(format) = &self.format else {
            output::print_raw(&format!("{}\n", text(&r.value).unwrap_or_default()));
            return;
        };
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            match c {
                '%' => match chars.next() {
                    Some('k') => out.push_str(&text(&r.key).unwrap_or_default()),
                    Some('v') => out.push_str(&text(&r.value).unwrap_or_default()),
                    Some('p') => out.push_str(&partition.to_string()),
                    Some('o') => out.push_str(&r.offset.to_string()),
                    Some('t') | Some('T') => out.push_str(&r.timestamp.to_string()),
                    Some('s') => out.push_str(&self.topic),
                    Some('h') => {
                        let hs: Vec<String> = r
                            .headers
                            .iter()
                            .map(|(k, v)| format!("{}={}", k.as_str(), text(v).unwrap_or_default()))
                            .collect();
                        out.push_str(&hs.join(","));
                    }
                    Some('%') => out.push('%'),
                    Some(other) => {
                        out.push('%');
                        out.push(other);
                    }
                    None => out.push('%'),
                },
                '\\' => match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some(other) => {
                        out.push('\\');
                        out.push(other);
                    }
                    None => out.push('\\'),
                },
                c => out.push(c),
            }
        }
        output::print_raw(&out);
    }
}

/// A member of a group: what it owns and the generation it owns it in.
struct Membership {
    group: String,
    generation_id: i32,
    member_id: String,
    last_heartbeat: Instant,
}

pub fn run(args: ConsumeArgs) -> Result<(), Error> {
    check_topic_name(&args.topic)?;
    if let Some(format) = &args.format {
        if format.is_empty() {
            return Err(Error::Usage("--format is empty".into()));
        }
    }
    let mut client = args.conn.connect()?;
    let info = client.describe_topic(&args.topic)?;
    let all: Vec<i32> = info.partitions.iter().map(|p| p.partition).collect();
    let printer = Printer { format: args.format.clone(), json: args.conn.json, topic: args.topic.clone() };

    let mut membership = None;
    let partitions: Vec<i32> = match (&args.group, args.partition) {
        (Some(group), _) => {
            let (m, parts) = join(&mut client, group, &args.topic, &all)?;
            membership = Some(m);
            parts
        }
        (None, Some(p)) => {
            if !all.contains(&p) {
                return Err(Error::Usage(format!(
                    "--partition {p}: topic '{}' has partitions 0..{}",
                    args.topic,
                    all.len()
                )));
            }
            vec![p]
        }
        (None, None) => all.clone(),
    };
    let mut positions = start_positions(&mut client, &args, &partitions)?;

    let mut printed = 0u64;
    let mut last_message = Instant::now();
    let mut committed: BTreeMap<i32, i64> = BTreeMap::new();
    'outer: loop {
        if args.max_messages.is_some_and(|max| printed >= max) {
            break;
        }
        if args.idle_timeout_ms.is_some_and(|ms| last_message.elapsed() >= Duration::from_millis(ms)) {
            break;
        }
        if let Some(m) = &mut membership {
            if m.last_heartbeat.elapsed() >= Duration::from_millis(heartbeat_interval_ms) {
                commit(&mut client, m, &args.topic, &positions, &mut committed)?;
                match client.heartbeat(&m.group, m.generation_id, &m.member_id) {
                    Ok(()) => m.last_heartbeat = Instant::now(),
                    Err(Error::Broker { code, .. }) if rejoin_codes.contains(&code) => {
                        let group = m.group.clone();
                        let (new_m, parts) = join(&mut client, &group, &args.topic, &all)?;
                        *m = new_m;
                        positions = start_positions(&mut client, &args, &parts)?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if positions.is_empty() {
            std::thread::sleep(Duration::from_millis(fetch_wait_ms as u64));
            continue;
        }
        let parts: Vec<i32> = positions.keys().copied().collect();
        for partition in parts {
            let offset = positions[&partition];
            let wait = if positions.len() > 1 { 0 } else { fetch_wait_ms };
            let fetched = match client.fetch(&args.topic, partition, offset, wait) {
                Ok(f) => f,
                Err(Error::Broker { code: 1, .. }) => {
                    // OFFSET_OUT_OF_RANGE: restart from the earliest offset still kept.
                    let earliest = client.list_offsets(&args.topic, &[partition], timestamp_earliest)?;
                    positions.insert(partition, earliest.get(&partition).copied().unwrap_or(0));
                    continue;
                }
                Err(e) => return Err(e),
            };
            for r in &fetched.records {
                if args.max_messages.is_some_and(|max| printed >= max) {
                    break 'outer;
                }
                printer.print(partition, r);
                printed += 1;
                last_message = Instant::now();
                positions.insert(partition, r.offset + 1);
            }
        }
        if positions.len() > 1 && printed == 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if let Some(m) = &membership {
        commit(&mut client, m, &args.topic, &positions, &mut committed)?;
        let _ = client.leave_group(&m.group, &m.member_id);
    }
    Ok(())
}

/// Join the group and take every partition when leader (a range split of the topic's
/// partitions among members subscribed to it).
fn join(client: &mut Client, group: &str, topic: &str, all: &[i32]) -> Result<(Membership, Vec<i32>), Error> {
    let joined = client.join_group(group, "", &[topic.to_string()], session_timeout_ms, rebalance_timeout_ms)?;
    let mut assignments = Vec::new();
    if joined.leader == joined.member_id {
        let mut members: Vec<&String> = joined.members.iter().map(|(m, _)| m).collect();
        members.sort();
        let n = members.len().max(1);
        for (i, m) in members.iter().enumerate() {
            let mine: Vec<i32> = all.iter().copied().enumerate().filter(|(j, _)| j % n == i).map(|(_, p)| p).collect();
            assignments.push(((*m).clone(), vec![(topic.to_string(), mine)]));
        }
    }
    let assigned = client.sync_group(group, &joined, &assignments)?;
    let parts: Vec<i32> = assigned.into_iter().filter(|(t, _)| t == topic).flat_map(|(_, ps)| ps).collect();
    let membership = Membership {
        group: group.to_string(),
        generation_id: joined.generation_id,
        member_id: joined.member_id,
        last_heartbeat: Instant::now(),
    };
    Ok((membership, parts))
}

fn start_positions(client: &mut Client, args: &ConsumeArgs, partitions: &[i32]) -> Result<BTreeMap<i32, i64>, Error> {
    let mut positions = BTreeMap::new();
    if partitions.is_empty() {
        return Ok(positions);
    }
    let committed = match &args.group {
        Some(g) => client.committed_offsets(g)?,
        None => BTreeMap::new(),
    };
    let reset = if args.from_beginning { timestamp_earliest } else { timestamp_latest };
    let defaults = client.list_offsets(&args.topic, partitions, reset)?;
    for &p in partitions {
        let start = match (args.offset, committed.get(&(args.topic.clone(), p))) {
            (Some(o), _) if o >= 0 => o,
            (Some(o), _) => return Err(Error::Usage(format!("--offset {o} must be >= 0"))),
            (None, Some(&c)) => c,
            (None, None) => defaults.get(&p).copied().unwrap_or(0),
        };
        positions.insert(p, start);
    }
    Ok(positions)
}

fn commit(
    client: &mut Client,
    m: &Membership,
    topic: &str,
    positions: &BTreeMap<i32, i64>,
    committed: &mut BTreeMap<i32, i64>,
) -> Result<(), Error> {
    let changed: Vec<(String, i32, i64)> = positions
        .iter()
        .filter(|(p, o)| committed.get(p) != Some(o))
        .map(|(p, o)| (topic.to_string(), *p, *o))
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    client.commit_offsets(&m.group, m.generation_id, &m.member_id, &changed)?;
    for (_, p, o) in changed {
        committed.insert(p, o);
    }
    Ok(())
}
