//! Raw append throughput of the partition log, beside a plain sequential write of the
//! same bytes in the same run. 1 KiB records in 16 KiB, 256 KiB and 1 MiB batches,
//! without fsync (page cache; Kafka's default) and with one fdatasync per append.
//! The directory is `$SPATE_BENCH_DIR` or the system temp dir; say which disk it was.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use spate::log::{LogConfig, PartitionLog};

const RECORD_BYTES: usize = 1024;

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// An uncompressed magic-2 batch of `batch_bytes / 1 KiB` records of 1 KiB values.
fn build_batch(batch_bytes: usize) -> Vec<u8> {
    let n = batch_bytes / RECORD_BYTES;
    let mut body = Vec::with_capacity(batch_bytes + n * 16);
    for i in 0..n {
        let mut rec = vec![0u8];
        put_varint(&mut rec, 0);
        put_varint(&mut rec, i as i64);
        put_varint(&mut rec, -1);
        put_varint(&mut rec, RECORD_BYTES as i64);
        rec.extend(std::iter::repeat_n((i % 251) as u8, RECORD_BYTES));
        put_varint(&mut rec, 0);
        put_varint(&mut body, rec.len() as i64);
        body.extend_from_slice(&rec);
    }
    let mut b = Vec::with_capacity(61 + body.len());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((49 + body.len()) as i32).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(2);
    b.extend_from_slice(&[0; 4]);
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&((n - 1) as i32).to_be_bytes());
    b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&(n as i32).to_be_bytes());
    b.extend_from_slice(&body);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

struct Row {
    case: String,
    mb_s: f64,
    rec_s: f64,
    plain_mb_s: f64,
}

fn run_case(base: &std::path::Path, batch_bytes: usize, total_bytes: usize, fsync: bool) -> Row {
    let batch = build_batch(batch_bytes);
    let appends = (total_bytes / batch.len()).max(1);
    let records = appends * (batch_bytes / RECORD_BYTES);
    let bytes = appends * batch.len();

    let dir = tempfile::tempdir_in(base).unwrap();
    let config = LogConfig { max_message_bytes: 2 << 20, ..LogConfig::default() };
    let mut log = PartitionLog::open(&dir.path().join("bench-0"), config, 0).unwrap();
    let mut buf = batch.clone();
    let t = Instant::now();
    for _ in 0..appends {
        buf.copy_from_slice(&batch);
        log.append(&mut buf, 0).unwrap();
        if fsync {
            log.flush().unwrap();
        }
    }
    let log_s = t.elapsed().as_secs_f64();
    log.delete().unwrap();

    let file = File::create(dir.path().join("plain")).unwrap();
    let t = Instant::now();
    let mut pos = 0u64;
    for _ in 0..appends {
        buf.copy_from_slice(&batch);
        file.write_all_at(&buf, pos).unwrap();
        pos += buf.len() as u64;
        if fsync {
            file.sync_data().unwrap();
        }
    }
    let plain_s = t.elapsed().as_secs_f64();
    let mib = bytes as f64 / (1 << 20) as f64;
    Row {
        case: format!(
            "{:>5} KiB batch, {} ({} MiB)",
            batch_bytes / 1024,
            if fsync { "fdatasync/append" } else { "no fsync       " },
            mib as u64
        ),
        mb_s: mib / log_s,
        rec_s: records as f64 / log_s,
        plain_mb_s: mib / plain_s,
    }
}

fn main() {
    let base = std::env::var_os("SPATE_BENCH_DIR").map(Into::into).unwrap_or_else(std::env::temp_dir);
    println!("log_append: 1 KiB records, dir {}", std::path::Path::new(&base).display());
    let mut rows = Vec::new();
    for &(batch_kib, nofsync_mib, fsync_mib) in &[(16usize, 256usize, 8usize), (256, 256, 64), (1024, 256, 128)] {
        rows.push(run_case(base.as_ref(), batch_kib * 1024, nofsync_mib << 20, false));
        rows.push(run_case(base.as_ref(), batch_kib * 1024, fsync_mib << 20, true));
    }
    println!("{:<44} {:>10} {:>12} {:>16}", "case", "log MiB/s", "log rec/s", "plain write MiB/s");
    for r in rows {
        println!("{:<44} {:>10.0} {:>12.0} {:>16.0}", r.case, r.mb_s, r.rec_s, r.plain_mb_s);
    }
}
