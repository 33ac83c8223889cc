//! The broker the `request_handler` fuzz target (src/fuzzing.rs) sends its frames to: one
//! real shard on a real glommio executor, over a data directory of its own, with a real
//! registry on the embedded store (single broker, active coordinator), the internal
//! offsets topic and a few topics named as in the seed corpus (fuzz/corpus/request).
//!
//! Built once per process, on first use, on a thread of its own that runs the executor;
//! each input is one request frame (without its length prefix), handed over a channel
//! and answered before the next is sent, so the channel holds at most one. The frame
//! takes the path a connection gives it (`connection::serve`): `decode_frame`, then
//! `handlers::handle`, on a task of its own, with the shard's append-write and
//! group-commit loops running beside it. State carries over from input to input, as it
//! does from request to request on a broker.
//!
//! What differs from a connection, so that one input cannot stall the next: requests
//! that wait by design (a long-poll fetch, an acks=all produce, a rebalance) are
//! cancelled after `request_wait_ms_max`, as if the client had gone; before each input
//! the shard acts on registry changes and runs its group timers, and every
//! `retention_inputs_interval` inputs its housekeeping (roll, retention) runs, so the
//! data directory stays small. Topics created by inputs count against
//! `partitions_max` (max.broker.partitions).
//!
//! The `connection` fuzz target uses a second broker of the same kind, built with a
//! SASL_PLAINTEXT listener (PLAIN and SCRAM; users `admin`, a super user, and `alice`)
//! and the ACL authorizer on: each input is the whole byte stream one client sends on
//! one connection, read in uneven pieces from memory by `connection::run`, the code
//! every accepted socket runs (framing, the frame-size caps, the SASL gate with
//! SaslHandshake v0's bare tokens, the authorizer, Envelope forwarding from a super
//! user), and cut off after `connection_ms_max` like a client that went away.
//!
//! It lives in src/server because it names glommio (only this module does).
//! A panic anywhere on the executor thread is re-raised on the fuzzer's thread (so
//! libFuzzer reports it), and so is an input that blocks the executor for
//! `input_ms_max` (a request that never yields).

use std::rc::Rc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::StreamExt;
use glommio::channels::channel_mesh::MeshBuilder;
use glommio::{LocalExecutorBuilder, Placement};

use crate::config::BrokerConfig;
use crate::coordinator::owner::Metadata;
use crate::coordinator::registry::Registry;
use crate::coordinator::store::LocalStore;
use crate::model::ShardId;
use crate::shard::Shard;

use super::context::ShardContext;
use super::ShardMessage;

/// How long one input's request may take before it is cancelled (long polls and acks
/// waits are legitimate; the fuzzer only needs them to start).
const request_wait_ms_max: u64 = 20;
/// How long one input may take in all: waits are cut at `request_wait_ms_max`, so an
/// input still running after this has blocked the core (a loop that never yields). A
/// panic says so, on stable (tests/fuzz_corpus.rs) as under libFuzzer (whose -timeout
/// is longer).
const input_ms_max: u64 = 5_000;
/// How often (in inputs) segment roll and retention run.
const retention_inputs_interval: u64 = 256;
/// max.broker.partitions of the fuzzed broker: inputs that create topics stop here.
const partitions_max: usize = 256;
/// Topic configs that keep the data directory small under a flood of produce.
const topic_defaults: [(&str, &str); 2] = [("segment.bytes", "1048576"), ("retention.bytes", "2097152")];
/// Topics created at start: (name, partitions), as named in the seed corpus.
const seed_topics: [(&str, i32); 8] = [
    ("plain", 1),
    ("corpus", 3),
    ("x-multi", 2),
    ("x-seq", 1),
    ("x-bin", 1),
    ("x-batch", 1),
    ("x-empty", 1),
    ("spate-kafkajs-smoke", 1),
];

/// How long one input of the `connection` target may keep its connection open: long
/// polls, rebalances and failed-login delays are cut off here, as if the client left.
const connection_ms_max: u64 = 50;
/// Users of the `connection` target's SASL listener (PLAIN): `admin` is a super user.
const connection_users: [(&str, &str); 2] = [("admin", "admin-secret"), ("alice", "alice-secret")];

/// One input and the way to say it is done (dropped unsent: the executor panicked).
type Job = (Bytes, std::sync::mpsc::SyncSender<()>);

/// Which fuzzed broker: a request frame at a time to the handlers, or a connection's
/// byte stream through a SASL listener.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Frames,
    Connections,
}

static HARNESS: OnceLock<Mutex<mpsc::UnboundedSender<Job>>> = OnceLock::new();
static CONNECTIONS: OnceLock<Mutex<mpsc::UnboundedSender<Job>>> = OnceLock::new();

/// Handle `frame` on the fuzzed broker and wait for its answer. Panics if the broker
/// panicked (on this input or an earlier one) or took longer than `input_ms_max`.
pub fn handle_frame(frame: &[u8]) {
    submit(&HARNESS, Kind::Frames, frame)
}

/// Serve `stream` as the bytes a client sends on one connection to the SASL listener of
/// the second fuzzed broker; panics as `handle_frame` does.
pub fn handle_connection(stream: &[u8]) {
    submit(&CONNECTIONS, Kind::Connections, stream)
}

fn submit(harness: &'static OnceLock<Mutex<mpsc::UnboundedSender<Job>>>, kind: Kind, input: &[u8]) {
    let sender = harness.get_or_init(|| Mutex::new(start(kind))).lock().unwrap_or_else(|p| p.into_inner()).clone();
    let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
    if sender.unbounded_send((Bytes::copy_from_slice(input), done_tx)).is_err() {
        panic!("the fuzzed broker's executor is gone (it panicked on an earlier input)");
    }
    match done_rx.recv_timeout(Duration::from_millis(input_ms_max)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the fuzzed broker did not finish an input within {input_ms_max} ms: its core is blocked")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the fuzzed broker panicked on this input"),
    }
}

fn start(kind: Kind) -> mpsc::UnboundedSender<Job> {
    let (tx, rx) = mpsc::unbounded::<Job>();
    let handle = LocalExecutorBuilder::new(Placement::Unbound)
        .name("spate-fuzz-shard")
        .io_memory(super::shard_io_memory_bytes)
        .spawn(move || async move { serve(rx, kind).await })
        .expect("cannot start the fuzzed broker's executor");
    // The executor runs until the process ends; a panic on it drops the job senders, so
    // `handle_frame` sees it.
    std::mem::forget(handle);
    tx
}

/// A fresh data directory on tmpfs when there is one (fsync costs nothing there). Left
/// behind by earlier fuzzing processes that are gone, directories are removed.
fn data_dir(kind: Kind) -> std::path::PathBuf {
    let prefixes = ["spate-fuzz-handler-", "spate-fuzz-connection-"];
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    if let Ok(entries) = std::fs::read_dir(&base) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = prefixes.iter().find_map(|p| name.strip_prefix(p)) else { continue };
            if !std::path::Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let prefix = if kind == Kind::Frames { prefixes[0] } else { prefixes[1] };
    let dir = base.join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create the fuzzed broker's data dir");
    dir
}

async fn context(kind: Kind) -> anyhow::Result<Rc<ShardContext>> {
    let mut config = BrokerConfig {
        data_dir: data_dir(kind),
        cores: Some(1),
        group_initial_rebalance_delay_ms: 0,
        max_broker_partitions: Some(partitions_max),
        topic_defaults: topic_defaults.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..BrokerConfig::default()
    };
    if kind == Kind::Connections {
        config.listeners = Some("SASL_PLAINTEXT://127.0.0.1:9093".into());
        config.sasl_enabled_mechanisms = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512".into();
        config.sasl_plain_users = connection_users.iter().map(|(u, p)| (u.to_string(), p.to_string())).collect();
        config.authorizer_class_name = Some("acl".into());
        config.super_users = "User:admin".into();
        config.connection_failed_authentication_delay_ms = 0;
    }
    let store = Box::new(LocalStore::open(&config.data_dir)?);
    let registry = Registry::open_with(
        store,
        super::local_broker(&config, 1),
        super::now_ms() as u64,
        super::controller_config(&config),
    )?;
    let metadata = Metadata::start(registry)?;
    super::ensure_offsets_topic(
        &metadata,
        crate::config::OffsetsTopic { replication_factor: 1, segment_bytes: 104_857_600 },
        true,
    )?;
    for (name, partitions) in seed_topics {
        let configs =
            crate::config::TopicConfig::from_pairs([], &Default::default()).map_err(|e| anyhow::anyhow!(e))?;
        metadata.write_blocking(move |reg| reg.create(name, partitions, configs))?;
    }
    let mesh: MeshBuilder<ShardMessage, _> = MeshBuilder::full(1, crate::model::limits::shard_channel_depth_max);
    let (senders, _receivers) = mesh.join().await.map_err(|_| anyhow::anyhow!("channel mesh join failed"))?;
    let mut shard = Shard::new(
        ShardId(0),
        1,
        config.data_dir.clone(),
        metadata.clone(),
        config.topic_defaults.clone(),
        config.group_config(),
    );
    shard.set_zero_copy_bytes_min(config.fetch_zero_copy_bytes_min);
    shard.set_append_ring(crate::shard::AppendRing::new()?);
    let jobs = shard.open_jobs()?;
    shard.install_opened(crate::shard::open_logs(jobs, super::now_ms()), super::now_ms());
    shard.sync_registry();
    // The seed topics' logs, opened here rather than in the background, so every input
    // finds them open.
    let opens = shard.take_open_jobs();
    shard.install_opened_later(crate::shard::open_logs(opens, super::now_ms()), super::now_ms());
    shard.run_group_loads_inline(super::now_ms());
    let admission = super::admission::Admission::new(
        config.max_connections,
        config.max_connections_per_ip,
        config.queued_max_request_bytes,
    );
    let disk = super::disk::DiskSpace::new(&config);
    let _ = disk.refresh();
    Ok(Rc::new_cyclic(|me| {
        ShardContext::new(
            ShardId(0),
            1,
            Arc::new(config),
            metadata,
            shard,
            senders,
            Arc::new(super::metrics::Metrics::new(1)),
            "spate-fuzz".to_string(),
            admission,
            disk,
            me.clone(),
        )
    }))
}

async fn serve(mut jobs: mpsc::UnboundedReceiver<Job>, kind: Kind) {
    let ctx = context(kind).await.expect("cannot build the fuzzed broker");
    let listener = super::listener::build(&ctx.config)
        .expect("the fuzzed broker's listeners")
        .into_iter()
        .find(|l| l.sasl.is_some() || kind == Kind::Frames)
        .expect("a SASL listener");
    glommio::spawn_local(ctx.clone().append_io_loop()).detach();
    glommio::spawn_local(ctx.clone().group_commit_loop()).detach();
    glommio::spawn_local(ctx.clone().log_start_loop()).detach();
    let mut inputs: u64 = 0;
    while let Some((bytes, done)) = jobs.next().await {
        inputs += 1;
        let now = super::now_ms();
        {
            let mut shard = ctx.shard.borrow_mut();
            shard.sync_registry();
            shard.group_tick(now);
            if inputs.is_multiple_of(retention_inputs_interval) {
                shard.tick(now, true);
            }
        }
        match kind {
            Kind::Frames => handle_one(&ctx, bytes).await,
            Kind::Connections => connection_one(&ctx, &listener, bytes).await,
        }
        let _ = done.send(());
    }
}

/// One frame as `connection::serve` takes it, answer included: file ranges of the answer
/// are read as sendfile would send them.
async fn handle_one(ctx: &Rc<ShardContext>, bytes: Bytes) {
    let Ok(mut frame) = crate::protocol::decode_frame(bytes) else { return };
    frame.client_host = "/127.0.0.1".to_string();
    let task = {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { super::handlers::handle(&ctx, frame).await })
    };
    let timer = Box::pin(glommio::timer::sleep(Duration::from_millis(request_wait_ms_max)));
    let answer = match futures::future::select(task, timer).await {
        futures::future::Either::Left((answer, _)) => answer,
        // Dropping the task cancels it, as a connection's would end with its client.
        futures::future::Either::Right(((), _task)) => return,
    };
    let Ok(Some(response)) = answer else { return };
    for part in response.parts {
        if let crate::protocol::zero_copy::ResponsePart::File { file, position, length } = part {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; length as usize];
            file.read_exact_at(&mut buf, position).expect("a fetch answer's file range lies inside its segment");
        }
    }
}

/// One client's byte stream on one connection of the SASL listener, as
/// `connection::serve` runs an accepted socket (with the TLS transport's writes, so that
/// fetched file ranges are read as bytes: there is no socket to sendfile to).
async fn connection_one(ctx: &Rc<ShardContext>, listener: &Arc<super::listener::ListenerRuntime>, bytes: Bytes) {
    let info =
        super::connection::ConnectionInfo { peer: "127.0.0.1:1".into(), client_host: "/127.0.0.1".into(), fd: -1 };
    let stream = MemoryStream { input: bytes, next_read: 1 };
    let run = Box::pin(super::connection::run(
        ctx.clone(),
        stream,
        info,
        super::connection::Transport::Tls,
        crate::security::Principal::anonymous_arc(),
        listener.clone(),
    ));
    let timer = Box::pin(glommio::timer::sleep(Duration::from_millis(connection_ms_max)));
    // Dropping the connection's future cancels its tasks, as a closed socket ends them.
    let _ = futures::future::select(run, timer).await;
}

/// A client's side of a connection in memory: what it sends is read back in pieces of
/// 1, 3, 9, ... bytes (up to 4 KiB, then again from 1), so frames and length prefixes are
/// split across reads; what the broker writes is dropped. The end of the input is the
/// client closing its side.
struct MemoryStream {
    input: Bytes,
    next_read: usize,
}

impl futures_lite::AsyncRead for MemoryStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.input.len()).min(self.next_read);
        buf[..n].copy_from_slice(&self.input[..n]);
        bytes::Buf::advance(&mut self.input, n);
        self.next_read = if self.next_read >= 4096 { 1 } else { self.next_read * 3 };
        std::task::Poll::Ready(Ok(n))
    }
}

impl futures_lite::AsyncWrite for MemoryStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
