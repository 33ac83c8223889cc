//! `spate produce TOPIC`: one message per stdin line. Lines are gathered per partition
//! and sent as one record batch per request (as Kafka's producers do), up to
//! `batch_records_max` lines or `batch_bytes_max` bytes. A topic that does not exist is
//! created if the broker auto-creates topics (Metadata `allow_auto_topic_creation`, as
//! Kafka's console producer asks).

use std::io::BufRead;

use bytes::Bytes;
use kafka_protocol::records::Compression;
use serde_json::json;

use super::{check_topic_name, output, ConnArgs};
use spate::client::{Error, ProduceRecord};

/// Lines sent per batch, and bytes per batch, at most.
const batch_records_max: usize = 1000;
const batch_bytes_max: usize = 512 * 1024;
/// Longest stdin line accepted (Kafka's default max.message.bytes is ~1 MiB).
const line_bytes_max: usize = 1024 * 1024;

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CompressionArg {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

#[derive(clap::Args)]
pub struct ProduceArgs {
    pub topic: String,
    /// Split each line into key and value at the first occurrence of this string.
    #[arg(long)]
    key_separator: Option<String>,
    /// Send every message to this partition [default: by key hash, or round robin per batch]
    #[arg(long)]
    partition: Option<i32>,
    /// Acks: 0, 1, or -1/all.
    #[arg(long, default_value = "all", value_parser = parse_acks)]
    acks: i16,
    #[arg(long, value_enum, default_value = "none")]
    compression: CompressionArg,
    #[command(flatten)]
    conn: ConnArgs,
}

fn parse_acks(s: &str) -> Result<i16, String> {
    match s {
        "all" | "-1" => Ok(-1),
        "0" => Ok(0),
        "1" => Ok(1),
        _ => Err(format!("acks must be 0, 1, -1 or all, got {s:?}")),
    }
}

pub fn run(args: ProduceArgs) -> Result<(), Error> {
    check_topic_name(&args.topic)?;
    let compression = match args.compression {
        CompressionArg::None => Compression::None,
        CompressionArg::Gzip => Compression::Gzip,
        CompressionArg::Snappy => Compression::Snappy,
        CompressionArg::Lz4 => Compression::Lz4,
        CompressionArg::Zstd => Compression::Zstd,
    };
    let mut client = args.conn.connect()?;
    let info = client.describe_topic_auto_create(&args.topic)?;
    let nr_partitions = info.partitions.len() as i32;
    if nr_partitions == 0 {
        return Err(Error::broker(format!("topic '{}'", args.topic), 5, None));
    }
    if let Some(p) = args.partition {
        if p < 0 || p >= nr_partitions {
            return Err(Error::Usage(format!(
                "--partition {p}: topic '{}' has partitions 0..{nr_partitions}",
                args.topic
            )));
        }
    }
    // Per-partition pending batches.
    let mut pending: Vec<Vec<ProduceRecord>> = (0..nr_partitions).map(|_| Vec::new()).collect();
    let mut pending_bytes: Vec<usize> = vec![0; nr_partitions as usize];
    let mut round_robin = 0i32;
    let mut sent = 0u64;
    let stdin = std::io::stdin();
    let mut reader = stdin.lock();
    let mut line = Vec::new();
    let mut line_no = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(|e| Error::Usage(format!("reading stdin: {e}")))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        while line.last().is_some_and(|&b| b == b'\n' || b == b'\r') {
            line.pop();
        }
        if line.len() > line_bytes_max {
            return Err(Error::Usage(format!("line {line_no} is longer than {line_bytes_max} bytes")));
        }
        let (key, value) = match &args.key_separator {
            Some(sep) if !sep.is_empty() => match memchr::memmem::find(&line, sep.as_bytes()) {
                Some(i) => (Some(Bytes::copy_from_slice(&line[..i])), Bytes::copy_from_slice(&line[i + sep.len()..])),
                None => (None, Bytes::copy_from_slice(&line)),
            },
            _ => (None, Bytes::copy_from_slice(&line)),
        };
        let partition = match (args.partition, &key) {
            (Some(p), _) => p,
            (None, Some(k)) => spate::client::partitioner::partition_for_key(k, nr_partitions),
            (None, None) => round_robin,
        };
        let size = key.as_ref().map_or(0, |k| k.len()) + value.len();
        let slot = partition as usize;
        pending[slot].push(ProduceRecord { key, value: Some(value), headers: Vec::new(), timestamp_ms: now_ms() });
        pending_bytes[slot] += size;
        if pending[slot].len() >= batch_records_max || pending_bytes[slot] >= batch_bytes_max {
            client.produce(&args.topic, partition, &pending[slot], args.acks, compression)?;
            sent += pending[slot].len() as u64;
            pending[slot].clear();
            pending_bytes[slot] = 0;
            round_robin = (round_robin + 1) % nr_partitions;
        }
    }
    for (partition, batch) in pending.iter().enumerate() {
        if !batch.is_empty() {
            client.produce(&args.topic, partition as i32, batch, args.acks, compression)?;
            sent += batch.len() as u64;
        }
    }
    if args.conn.json {
        output::json(&json!({"topic": args.topic, "produced": sent}));
    } else {
        eprintln!("produced {sent} messages to {}", args.topic);
    }
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}
