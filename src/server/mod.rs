//! The runtime: one glommio executor pinned to each core, the channel mesh between them,
//! TCP accept on every shard (SO_REUSEPORT), group commit, housekeeping and shutdown.
//! This is the only module that names glommio.
//!
//! Lifecycle: `run` opens the topic registry, starts N shard threads, waits for them.
//! SIGINT/SIGTERM sets the shutdown flag: shards stop accepting, let in-flight requests
//! and their blocking-pool work (`ShardContext::run_blocking`) finish (bounded by
//! `shutdown_grace_ms`), write a last high-watermark checkpoint, close their logs (flush +
//! clean-shutdown marker) and exit. A second signal exits the process at once.

mod admission;
mod connection;
mod context;
mod disk;
mod fetch_sessions;
mod forward;
pub(crate) mod fuzz_harness;
mod handlers;
mod link;
mod listener;
pub mod metrics;
mod peer;
mod quotas;
mod replication;
mod sasl_gate;
mod throttle;
mod txn;

use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::channels::channel_mesh::MeshBuilder;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

use crate::config::BrokerConfig;
use crate::coordinator::owner::Metadata;
use crate::coordinator::registry::Registry;
use crate::model::ShardId;
use crate::shard::Shard;

use context::ShardContext;
pub use context::ShardMessage;

/// How long a shutdown waits for the coordinator to move leaderships away.
const controlled_shutdown_wait_ms: u64 = 10_000;
/// How long a clean shutdown waits for in-flight requests.
const shutdown_grace_ms: u64 = 10_000;
/// How often group timers (session expiry, rebalance completion) are checked.
const group_tick_interval_ms: u64 = 100;
/// How often each shard rolls segments by age and checks flush.ms.
const housekeeping_interval_ms: u64 = 1_000;
/// The wait before the next accept after one failed; out of file descriptors, longer.
const accept_error_backoff_ms: u64 = 10;
const accept_out_of_files_backoff_ms: u64 = 100;
/// While a shard starts, its executor wakes at least this often (see `run_shard`).
const startup_tick_ms: u64 = 10;
/// A mesh join slower than this is logged: a lost wake-up the ticker made up for.
const mesh_join_slow_ms: u64 = 1_000;
/// glommio's registered buffer pool per shard (only DMA file I/O uses it).
const shard_io_memory_bytes: usize = 1024 * 1024;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Start the broker and block until it has shut down.
pub fn run(config: BrokerConfig) -> anyhow::Result<()> {
    crate::log::on_dir_failure(halt_on_log_dir_failure);
    crate::model::create_dir_all_durably(&config.data_dir)?;
    // Held until the process exits (the kernel drops the lock on any exit, kill -9 too).
    let _data_dir_lock = lock_data_dir(&config.data_dir)?;
    let cores: Vec<usize> = match core_affinity::get_core_ids() {
        Some(ids) if !ids.is_empty() => ids.into_iter().map(|c| c.id).collect(),
        _ => (0..std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).collect(),
    };
    let nr_shards = config.cores.unwrap_or(cores.len()).max(1);
    let listeners = listener::build(&config)?;
    for l in &listeners {
        check_listen_address(&l.spec.bind)?;
    }
    // Before anything writes: on a full disk this releases the metadata reserve.
    let disk = disk::DiskSpace::new(&config);
    if let Err(e) = disk.refresh() {
        tracing::warn!(error = %e, "cannot read the free space of the data dir");
    }
    let cluster_id = cluster_id(&config.data_dir)?;
    let open_files = open_files_limit();
    let segment_files =
        config.test_segment_files_budget.unwrap_or_else(|| segment_files_budget(open_files, config.max_connections));
    crate::log::segment::set_log_files_budget(segment_files);
    tracing::info!(open_files, segment_files, "file descriptor budget");
    let (registry, locator) = open_registry(&config, nr_shards)?;
    // From here on one thread owns the registry; everyone else reads published views.
    let metadata = Metadata::start(registry)?;
    let shutdown = Arc::new(AtomicBool::new(false));
    install_signal_handlers(shutdown.clone())?;
    listener::spawn_tls_watcher(&listeners, shutdown.clone())?;
    disk::spawn_monitor(disk.clone(), shutdown.clone())?;
    if config.append_io_uring && config.append_inline {
        disk::spawn_writeback_monitor(shutdown.clone())?;
    }
    if metadata.view().is_active() {
        ensure_offsets_topic(&metadata, config.offsets_topic(), false)?;
    }
    let link = match locator {
        None => None,
        Some(locator) => Some(start_link(&config, nr_shards, &metadata, locator, &cluster_id, &shutdown)?),
    };
    let metrics = Arc::new(metrics::Metrics::new(nr_shards));
    if let Some(addr) = &config.metrics_listen {
        metrics::serve(addr, metrics.clone(), metadata.clone(), config.data_dir.clone(), shutdown.clone())?;
    }
    tracing::info!(
        listen = %config.listen, advertise = %config.advertised(), shards = nr_shards, pin_shards = config.pin_shards,
        data_dir = %config.data_dir.display(), node_id = config.node_id, fsync = ?config.fsync,
        write_behind_bytes = config.write_behind_bytes, drop_behind_bytes = config.drop_behind_bytes,
        "spate starting"
    );

    let admission = admission::Admission::new(
        config.max_connections,
        config.max_connections_per_ip,
        config.queued_max_request_bytes,
    );
    let config = Arc::new(config);
    let mesh: MeshBuilder<ShardMessage, _> =
        MeshBuilder::full(nr_shards, crate::model::limits::shard_channel_depth_max);
    let mut handles = Vec::new();
    for shard in 0..nr_shards {
        let placement = match shard_cpu(&config, shard, nr_shards, &cores) {
            Some(cpu) => Placement::Fixed(cpu),
            None => Placement::Unbound,
        };
        let listeners = listeners.clone();
        let (config, metadata, shutdown, mesh, metrics, cluster_id, admission, disk) = (
            config.clone(),
            metadata.clone(),
            shutdown.clone(),
            mesh.clone(),
            metrics.clone(),
            cluster_id.clone(),
            admission.clone(),
            disk.clone(),
        );
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("spate-shard-{shard}"))
            // No O_DIRECT buffers are used; a small pool keeps non-root users inside
            // the default 8 MiB memlock limit.
            .io_memory(shard_io_memory_bytes)
            // Not pinned to the shard's CPU (glommio's default for a fixed placement):
            // recovery's CRC checks and reads would take that core from the requests.
            .blocking_thread_pool_placement(glommio::PoolPlacement::Unbound(
                crate::model::limits::shard_blocking_threads,
            ))
            .spawn(move || async move {
                if let Err(e) = run_shard(
                    ShardId(shard),
                    nr_shards,
                    config,
                    metadata,
                    shutdown,
                    mesh,
                    metrics,
                    cluster_id,
                    admission,
                    disk,
                    listeners,
                )
                .await
                {
                    tracing::error!(shard, error = %e, "shard failed");
                    std::process::exit(1);
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start shard {shard}: {e}"))?;
        handles.push(handle);
    }
    for h in handles {
        h.join().map_err(|e| anyhow::anyhow!("shard thread: {e:?}"))?;
    }
    if let Some(link) = link {
        let _ = link.join();
    }
    metadata.write_blocking(|reg| reg.close());
    tracing::info!("spate stopped cleanly");
    Ok(())
}

/// The CPU shard `shard` is pinned to: its own, while pinning is on and every shard can
/// have one; None leaves the thread to the kernel's scheduler.
fn shard_cpu(config: &BrokerConfig, shard: usize, nr_shards: usize, cpus: &[usize]) -> Option<usize> {
    (config.pin_shards && nr_shards <= cpus.len()).then(|| cpus[shard])
}

/// Remove deleted partitions' directories and retention's segments (blocking: run it
/// on the blocking pool).
fn remove_trash(trash: crate::shard::Trash) {
    for segment in trash.segments {
        if let Err(e) = segment.remove() {
            tracing::warn!(error = %e, "cannot remove a segment retention deleted (an open removes it)");
        }
    }
    for file in trash.files {
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(file = %file.display(), error = %e, "cannot remove a cleaner's leftover (an open removes it)")
            }
            _ => {}
        }
    }
    let partitions_removed = !trash.dirs.is_empty();
    for dir in trash.dirs {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::debug!(dir = %dir.display(), "removed a deleted partition's directory"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a deleted partition's directory"),
        }
    }
    if partitions_removed {
        give_back_free_memory();
    }
}

/// Hand the heap's free memory back to the kernel, after partitions are deleted (rare,
/// and off the data core). A partition's structures are built on the threads that open
/// logs (up to `log_recovery_threads_max` at once), so they are spread over glibc's
/// arenas (up to 8 per CPU), and freed chunks stay stranded between live ones: creating
/// and deleting an 11,011-partition topic ten times took the broker's RSS from 17 to
/// 235 MiB with 21 MiB of it in use; with this, to about 90 MiB (each arena still keeps
/// its top free chunk, up to `malloc_reuse_bytes`, for its next requests).
/// `malloc_trim` holds each arena's lock while it walks it, so a data core allocating
/// from that arena meanwhile waits: 13-16 ms for all arenas after the 11,011-partition
/// deletion, 0.4-3 ms after small ones (2-core VM).
fn give_back_free_memory() {
    let started = std::time::Instant::now();
    // SAFETY: malloc_trim only releases free heap memory (under each arena's lock).
    let released = unsafe { libc::malloc_trim(0) } == 1;
    tracing::debug!(released, micros = started.elapsed().as_micros() as u64, "free heap memory given back");
}

/// This broker as it registers: its inter-broker address and every advertised listener.
fn local_broker(config: &BrokerConfig, nr_shards: usize) -> crate::coordinator::registry::LocalBroker {
    let (host, port) = crate::config::split_host_port(config.advertised()).expect("validated at startup");
    let listeners = config
        .resolved_listeners
        .iter()
        .map(|l| {
            let (host, port) = crate::config::split_host_port(&l.advertised).expect("validated at startup");
            crate::coordinator::controller::AdvertisedListener {
                name: l.name.clone(),
                protocol: l.protocol.name().to_string(),
                host,
                port: port as u16,
            }
        })
        .collect();
    crate::coordinator::registry::LocalBroker {
        id: crate::model::NodeId(config.node_id),
        endpoint: crate::coordinator::controller::Endpoint::new(host, port as u16).with_listeners(listeners),
        rack: config.rack.clone(),
        shards: nr_shards as u32,
    }
}

fn controller_config(config: &BrokerConfig) -> crate::coordinator::controller::ControllerConfig {
    crate::coordinator::controller::ControllerConfig {
        broker_session_timeout_ms: config.broker_session_timeout_ms,
        preferred_leader_check_interval_ms: config.leader_imbalance_check_interval_ms,
        unclean_leader_election: config.unclean_leader_election_enable,
        broker_partitions_max: config
            .max_broker_partitions
            .unwrap_or_else(|| segment_files_budget(open_files_limit(), config.max_connections)),
    }
}

/// The descriptors segment `.log` files may take: the open-files limit less what
/// connections (`max.connections`, at most a quarter of the limit) and the broker's
/// own files (`broker_descriptors_reserved`) may take. A segment holds at most one
/// descriptor (indexes are mapped without one; small files are opened for a write or
/// a sync and closed), and shards close the files of idle segments once three quarters
/// of this budget are open (`log::segment::log_files_sweep_due`). Also the default
/// max.broker.partitions: a partition in use needs its active segment's file. 14,000
/// at an open-files limit of 20,000.
fn segment_files_budget(open_files: u64, connections_max: usize) -> usize {
    use crate::model::limits::broker_descriptors_reserved;
    let open_files = open_files as usize;
    let connections = connections_max.min(open_files / 4);
    open_files.saturating_sub(connections + broker_descriptors_reserved).max(1)
}

/// The open-files limit, raised first from its soft value to the hard one (a broker
/// holds a segment file per partition at least, and a socket per connection).
fn open_files_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit / setrlimit read and write one struct rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Open the registry the flags ask for: the active coordinator on the embedded store
/// (`local`, no `--coordinator`), a mirror of the coordinator named by `--coordinator`,
/// or, with ZooKeeper, the active coordinator if this broker wins `/controller` and a
/// standby mirror of the winner otherwise. A mirror comes with where to find the
/// coordinator.
fn open_registry(config: &BrokerConfig, nr_shards: usize) -> anyhow::Result<(Registry, Option<link::Locator>)> {
    use crate::coordinator::registry::RegistryError;
    use crate::coordinator::store::LocalStore;
    use crate::coordinator::zookeeper::ZkStore;
    let broker = local_broker(config, nr_shards);
    let meta_dir = config.data_dir.join("spate-meta");
    if let Some(addr) = &config.coordinator {
        crate::model::create_dir_all_durably(&meta_dir)?;
        return Ok((Registry::mirror(broker, Some(&meta_dir)), Some(link::Locator::Fixed(addr.clone()))));
    }
    let now = now_ms() as u64;
    if config.metadata == "local" {
        let store = Box::new(LocalStore::open(&config.data_dir)?);
        return Ok((Registry::open_with(store, broker, now, controller_config(config))?, None));
    }
    if !config.metadata.starts_with("zookeeper://") {
        anyhow::bail!(
            "--metadata must be `local` or zookeeper://HOST:PORT[,HOST:PORT...]/CHROOT, got {:?}",
            config.metadata
        );
    }
    let store = Box::new(ZkStore::connect(&config.metadata, config.zookeeper_session_timeout_ms)?);
    crate::model::create_dir_all_durably(&meta_dir)?;
    // Every broker runs a coordinator candidate: the link stands for election whenever
    // `/controller` is free, and follows the winner otherwise.
    let locator = Some(link::Locator::ZooKeeper {
        url: config.metadata.clone(),
        session_timeout_ms: config.zookeeper_session_timeout_ms,
    });
    match Registry::open_with(store, broker.clone(), now, controller_config(config)) {
        Ok(mut active) => {
            active.set_snapshot_cache(&meta_dir);
            Ok((active, locator))
        }
        Err(RegistryError::ControllerTaken(id)) => {
            tracing::info!(active = %id, "another broker is the active coordinator: standing by");
            Ok((Registry::mirror(broker, Some(&meta_dir)), locator))
        }
        Err(e) => Err(e.into()),
    }
}

/// How long a broker without cached metadata waits for the coordinator's first
/// snapshot before it starts serving anyway (it keeps trying in the background).
const first_snapshot_wait_ms: u64 = 15_000;

/// Start the coordinator link, and wait for the first snapshot when there is none.
fn start_link(
    config: &BrokerConfig,
    nr_shards: usize,
    metadata: &Arc<Metadata>,
    locator: link::Locator,
    cluster_id: &str,
    shutdown: &Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let offsets_topic = config.offsets_topic();
    let handle = link::Link {
        metadata: metadata.clone(),
        broker: local_broker(config, nr_shards),
        cluster_id: cluster_id.to_string(),
        locator,
        heartbeat_interval: Duration::from_millis(config.broker_heartbeat_interval_ms),
        controller_config: controller_config(config),
        shutdown: shutdown.clone(),
        security: config.inter_broker_security().cloned(),
        on_active: Box::new(move |metadata| {
            if let Err(e) = ensure_offsets_topic(metadata, offsets_topic, false) {
                tracing::error!(error = %e, "cannot create the offsets topic");
            }
        }),
    }
    .spawn()?;
    let deadline = std::time::Instant::now() + Duration::from_millis(first_snapshot_wait_ms);
    while !metadata.view().has_metadata() {
        if std::time::Instant::now() >= deadline || shutdown.load(Ordering::SeqCst) {
            tracing::warn!("no cluster metadata yet: serving without it until the coordinator answers");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(handle)
}

/// Create `__consumer_offsets` on the active coordinator if it does not exist yet:
/// with `replication_factor` replicas once that many brokers are live, or, when
/// `capped` (a FindCoordinator asked for a group's coordinator), with as many as are
/// live. Kafka creates it at the first FindCoordinator too. Compacted, with
/// offsets.topic.segment.bytes segments (100 MiB). Returns whether it was created.
pub(crate) fn create_offsets_topic(
    reg: &mut crate::coordinator::registry::Registry,
    settings: crate::config::OffsetsTopic,
    capped: bool,
) -> anyhow::Result<bool> {
    use crate::group::{offsets_topic_partitions, OFFSETS_TOPIC};
    create_internal_topic(reg, OFFSETS_TOPIC, offsets_topic_partitions, settings, capped)
}

/// Create `__transaction_state` (on the active coordinator only, once): Kafka's
/// `transaction.state.log.num.partitions` (50), compacted, with the offsets topic's
/// replication factor and segment size (min of the configured factor and the live
/// brokers when `capped`). Ok(true) when created now.
pub(crate) fn create_txn_topic(
    reg: &mut crate::coordinator::registry::Registry,
    settings: crate::config::OffsetsTopic,
    capped: bool,
) -> anyhow::Result<bool> {
    use crate::txn::{txn_topic_partitions, TXN_TOPIC};
    create_internal_topic(reg, TXN_TOPIC, txn_topic_partitions, settings, capped)
}

/// A compacted internal topic of `partitions`, on the active coordinator only, once:
/// the configured replication factor and segment size (the factor capped at the live
/// brokers when `capped`, else nothing until enough are live). Ok(true) when created now.
fn create_internal_topic(
    reg: &mut crate::coordinator::registry::Registry,
    topic: &str,
    partitions: i32,
    settings: crate::config::OffsetsTopic,
    capped: bool,
) -> anyhow::Result<bool> {
    let replication_factor = settings.replication_factor;
    if !reg.is_active() || reg.get(topic).is_some() {
        return Ok(false);
    }
    let live = reg.live_broker_count() as i32;
    let replicas = match (live >= replication_factor, capped) {
        (true, _) => replication_factor,
        (false, true) if live > 0 => live,
        _ => return Ok(false),
    };
    let configs = crate::config::TopicConfig::from_pairs(
        [("cleanup.policy", Some("compact")), ("segment.bytes", Some(settings.segment_bytes.to_string().as_str()))],
        &Default::default(),
    )
    .map_err(|e| anyhow::anyhow!(e))?;
    reg.create_replicated(topic, partitions, replicas, configs)?;
    tracing::info!(
        topic,
        partitions,
        replication_factor = replicas,
        configured = replication_factor,
        "created internal topic"
    );
    Ok(true)
}

/// `create_offsets_topic` from a thread that may block (startup, the coordinator link).
fn ensure_offsets_topic(
    metadata: &Metadata,
    settings: crate::config::OffsetsTopic,
    capped: bool,
) -> anyhow::Result<()> {
    metadata.write_blocking(move |reg| create_offsets_topic(reg, settings, capped)).map(|_| ())
}

/// Take Kafka's `.lock` on the data directory: an exclusive `flock`, held for the
/// process lifetime by the returned file. A second broker on the same directory fails
/// here with a message naming it. The kernel releases the lock when the process exits,
/// however it exits, so a restart right after kill -9 finds it free.
fn lock_data_dir(data_dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = data_dir.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open the data directory lock {}: {e}", path.display()))?;
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            anyhow::bail!(
                "data directory {} is in use by another process (it holds {}): one broker per data directory",
                data_dir.display(),
                path.display()
            );
        }
        anyhow::bail!("cannot lock the data directory {}: {e}", path.display());
    }
    Ok(file)
}

/// How often startup probes the listen port while it waits.
const lingering_listener_probe_interval_ms: u64 = 50;

/// Fail fast, with a clear message, on an address that does not parse or that another
/// live process serves. (Shards bind with SO_REUSEPORT, which would otherwise let a
/// second broker of the same user share the port silently; a plain bind is no test,
/// since sockets of a previous run lingering in TIME_WAIT make it fail.) A listener that
/// no process owns (a killed broker's, still being torn down) is waited for, up to
/// `lingering_listener_wait_ms`: a supervisor restarting a killed broker at once gets a
/// broker, not an error. A second broker on the same data directory never gets here:
/// the data directory lock stops it first.
fn check_listen_address(listen: &str) -> anyhow::Result<()> {
    use crate::model::limits::lingering_listener_wait_ms;
    use std::net::ToSocketAddrs;
    let addr = listen
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?
        .next()
        .ok_or_else(|| anyhow::anyhow!("cannot listen on {listen}: no address"))?;
    let mut probe = addr;
    if probe.ip().is_unspecified() {
        probe.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let listening = || std::net::TcpStream::connect_timeout(&probe, Duration::from_millis(200)).is_ok();
    if !listening() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let mut warned = false;
    loop {
        if let Some(pid) = listener_owner(addr.port()) {
            anyhow::bail!("cannot listen on {listen}: another process (pid {pid}) is already listening there");
        }
        if !warned {
            tracing::warn!(
                %listen, wait_ms_max = lingering_listener_wait_ms,
                "a listener no process owns holds the port (a killed broker's socket being torn down): waiting for it to go"
            );
            warned = true;
        }
        if started.elapsed() >= Duration::from_millis(lingering_listener_wait_ms) {
            anyhow::bail!(
                "cannot listen on {listen}: the port still accepts connections after {lingering_listener_wait_ms} ms"
            );
        }
        std::thread::sleep(Duration::from_millis(lingering_listener_probe_interval_ms));
        if !listening() {
            tracing::info!(%listen, waited_ms = started.elapsed().as_millis() as u64, "the lingering listener is gone");
            return Ok(());
        }
    }
}

/// The pid of a process holding a listening TCP socket on `port`, when /proc shows one
/// (sockets in /proc/net/tcp{,6} in state LISTEN, matched by inode against every
/// process's fds). None when no process owns one, or when /proc does not let us see
/// it (another user's process without privileges).
fn listener_owner(port: u16) -> Option<u32> {
    let mut inodes = std::collections::HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode
            let (Some(local), Some(state), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9)) else {
                continue;
            };
            let local_port = local.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == "0A" && local_port == Some(port) && *inode != "0" {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc_entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc_entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if target.to_str().is_some_and(|t| inodes.contains(t)) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

fn cluster_id(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let path = data_dir.join("spate-meta").join("cluster_id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        let id = id.trim();
        if !id.is_empty() && id.len() < 64 {
            return Ok(id.to_string());
        }
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..22].to_string();
    crate::model::create_dir_all_durably(path.parent().expect("has parent"))?;
    crate::model::write_file_atomically(&path, id.as_bytes())?;
    Ok(id)
}

/// A log's disk failed (EIO, a failed fsync). The data dir is Spate's only log dir, and
/// Kafka halts when all its log dirs have failed: nothing on it is trusted again until a
/// restart recovers it, no acknowledgement the failure covers goes out, and in a cluster
/// the controller moves the leaderships when the session expires. No shutdown work runs
/// (it would write to the failed disk).
fn halt_on_log_dir_failure(partition_dir: &std::path::Path, reason: &str) {
    let log_dir = partition_dir.parent().unwrap_or(partition_dir);
    tracing::error!(log_dir = %log_dir.display(), partition = %partition_dir.display(), %reason,
        "log dir failed: the broker halts (as Kafka does when all its log dirs have failed); a restart recovers it");
    // SAFETY: _exit ends the process at once; nothing after it runs.
    unsafe { libc::_exit(1) }
}

fn install_signal_handlers(shutdown: Arc<AtomicBool>) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new().name("spate-signals".into()).spawn(move || {
        for sig in signals.forever() {
            if shutdown.swap(true, Ordering::SeqCst) {
                tracing::warn!(signal = sig, "second signal: exiting now");
                std::process::exit(130);
            }
            tracing::info!(signal = sig, "shutting down cleanly (send again to exit at once)");
        }
    })?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_shard(
    id: ShardId,
    nr_shards: usize,
    config: Arc<BrokerConfig>,
    metadata: Arc<Metadata>,
    shutdown: Arc<AtomicBool>,
    mesh: MeshBuilder<ShardMessage, glommio::channels::channel_mesh::Full>,
    metrics: Arc<metrics::Metrics>,
    cluster_id: String,
    admission: Arc<admission::Admission>,
    disk: Arc<disk::DiskSpace>,
    listeners: Vec<Arc<listener::ListenerRuntime>>,
) -> anyhow::Result<()> {
    // glommio 0.9 can lose the wake-up of an executor that sleeps on a shared channel:
    // with no timer pending it then sleeps for ever. Running, a shard always has timers
    // (housekeeping), which bound such a loss; while it starts, this ticker does. Seen in
    // a test run: shard 0 spinning in the mesh join's connect, shard 1 asleep in the
    // reactor, the broker never listening; earlier, both shards asleep after an empty
    // open handed to the blocking pool.
    let starting = Rc::new(std::cell::Cell::new(true));
    glommio::spawn_local({
        let starting = starting.clone();
        async move {
            while starting.get() {
                glommio::timer::sleep(Duration::from_millis(startup_tick_ms)).await;
            }
        }
    })
    .detach();
    let joined_at = std::time::Instant::now();
    let (senders, receivers) = mesh.join().await.map_err(|_| anyhow::anyhow!("channel mesh join failed"))?;
    if joined_at.elapsed() > Duration::from_millis(mesh_join_slow_ms) {
        tracing::warn!(
            shard = id.0,
            join_ms = joined_at.elapsed().as_millis() as u64,
            "the shards' channel mesh was slow to join"
        );
    }
    let mut shard = Shard::new(
        id,
        nr_shards,
        config.data_dir.clone(),
        metadata.clone(),
        config.topic_defaults.clone(),
        config.group_config(),
    );
    shard.set_zero_copy_bytes_min(config.fetch_zero_copy_bytes_min);
    shard.set_replica_lag_time_max_ms(config.replica_lag_time_max_ms);
    shard.set_producer_id_expiration_ms(config.producer_id_expiration_ms);
    shard.set_fsync_always(config.fsync == crate::config::FsyncMode::Always);
    shard.set_cleaner(config.log_cleaner_enable.then_some(crate::log::CleanerSettings {
        map_bytes_max: config.log_cleaner_dedupe_buffer_size,
        io_bytes_per_second: config.log_cleaner_io_max_bytes_per_second,
    }));
    if config.append_io_uring {
        // Group commit already writes every appended byte within its round.
        let write_behind = if config.fsync == crate::config::FsyncMode::Always { 0 } else { config.write_behind_bytes };
        match crate::shard::AppendRing::new() {
            Ok(ring) => shard.set_append_ring(
                ring.with_inline_writes(config.append_inline)
                    .with_write_behind(write_behind)
                    .with_drop_behind(config.drop_behind_bytes),
            ),
            Err(e) => tracing::warn!(shard = id.0, error = %e, "io_uring unavailable: appends are written in place"),
        }
    }
    // Recovery runs on threads of the blocking pool's task, not on this data core. A
    // new broker has nothing to open: no hop to the pool then. (Once in CI, a fresh
    // broker's two shards both waited forever for an empty open here, their pool
    // threads idle: a lost wake-up in glommio 0.9, which the startup ticker now bounds.)
    let jobs = shard.open_jobs()?;
    let started_ms = now_ms();
    let opened = if jobs.is_empty() {
        Vec::new()
    } else {
        glommio::executor().spawn_blocking(move || crate::shard::open_logs(jobs, started_ms)).await
    };
    shard.install_opened(opened, now_ms());
    tracing::info!(shard = id.0, open_ms = now_ms() - started_ms, "partition logs open");
    let ctx = Rc::new_cyclic(|me| {
        ShardContext::new(
            id,
            nr_shards,
            config.clone(),
            metadata,
            shard,
            senders,
            metrics,
            cluster_id,
            admission,
            disk,
            me.clone(),
        )
    });

    // Serve partition work sent by other shards.
    let mut receivers = receivers;
    for (peer, rx) in receivers.streams() {
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            while let Some(msg) = rx.recv().await {
                match ctx.opening_for(&msg) {
                    None => ctx.serve_remote(msg),
                    // A group operation whose `__consumer_offsets` partition's log is
                    // being opened: it waits in a task of its own. (Partition operations
                    // are parked by the shard, in order.)
                    Some(tp) => {
                        let ctx = ctx.clone();
                        glommio::spawn_local(async move {
                            ctx.opened(&tp).await;
                            ctx.serve_remote(msg);
                        })
                        .detach();
                    }
                }
            }
            tracing::debug!(shard = ctx.id.0, peer, "mesh channel closed");
        })
        .detach();
    }

    // Replication: partition roles, follower fetchers, ISR changes.
    {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { replication::manager(ctx).await }).detach();
    }

    // Appends through io_uring.
    {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { ctx.append_io_loop().await }).detach();
    }

    // Group commit: one fdatasync round at a time, covering every partition written.
    let flusher = {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { ctx.group_commit_loop().await })
    };
    flusher.detach();

    // Log start moves (DeleteRecords): checkpoints written on the blocking pool.
    {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { ctx.log_start_loop().await }).detach();
    }

    // Group timers: sessions, rebalance deadlines, offset expiry.
    {
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(Duration::from_millis(group_tick_interval_ms)).await;
                ctx.shard.borrow_mut().group_tick(now_ms());
            }
        })
        .detach();
    }

    // Transaction timeouts: open transactions past theirs are aborted.
    {
        let ctx = ctx.clone();
        glommio::spawn_local(async move { txn::tick_loop(ctx).await }).detach();
    }

    // The controller's heartbeat and fencing tick, on shard 0, in its own task: never
    // behind the housekeeping's blocking-pool work (one thread per shard, which partition
    // opens and fsyncs can hold for seconds under disk load).
    if id.0 == 0 {
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            while !ctx.stopping.get() {
                glommio::timer::sleep(Duration::from_millis(housekeeping_interval_ms)).await;
                // A store write only when something changed.
                let now = now_ms() as u64;
                if let Err(e) = ctx.metadata.write(move |r| r.tick(now)).await {
                    tracing::warn!(error = %e, "metadata tick failed");
                }
                // `__consumer_offsets` at its full replication factor as soon as enough
                // brokers are live.
                let view = ctx.view();
                if view.is_active() && view.get(crate::group::OFFSETS_TOPIC).is_none() {
                    let rf = ctx.config.offsets_topic();
                    if let Err(e) = ctx.metadata.write(move |r| create_offsets_topic(r, rf, false)).await {
                        tracing::warn!(error = %e, "cannot create the offsets topic");
                    }
                }
            }
        })
        .detach();
    }

    // Housekeeping.
    {
        let ctx = ctx.clone();
        let retention_check_interval = Duration::from_millis(config.log_retention_check_interval_ms);
        glommio::spawn_local(async move {
            let mut last_retention = std::time::Instant::now();
            loop {
                glommio::timer::sleep(Duration::from_millis(housekeeping_interval_ms)).await;
                // Once stopping, the shutdown path writes the last checkpoint and closes
                // the logs; nothing here may start blocking work behind its back.
                if ctx.stopping.get() {
                    break;
                }
                // A disk short of space runs retention every tick: a lowered retention.ms
                // or retention.bytes frees space at once, not within log.retention.check.interval.ms.
                let retention =
                    last_retention.elapsed() >= retention_check_interval || ctx.disk.produce_refusal().is_some();
                if retention {
                    last_retention = std::time::Instant::now();
                }
                ctx.shard.borrow_mut().tick(now_ms(), retention);
                ctx.start_queued_opens();
                // Log compaction: one pass at a time per shard, on the blocking pool;
                // the data core only plans it and swaps the result in.
                let task = ctx.shard.borrow_mut().take_clean_task(now_ms());
                if let Some(task) = task {
                    let ctx = ctx.clone();
                    glommio::spawn_local(async move {
                        let crate::shard::CleanTask { tp, instance, job } = task;
                        let result = ctx.run_blocking(move || crate::log::cleaner::run(&job)).await;
                        ctx.shard.borrow_mut().clean_done(&tp, instance, result);
                    })
                    .detach();
                }
                // High watermarks survive restarts (Kafka's replication-offset-checkpoint):
                // written off the data core, atomically, when any moved.
                let checkpoint = ctx.shard.borrow_mut().hw_checkpoint_due();
                if let Some((path, text)) = checkpoint {
                    let written =
                        ctx.run_blocking(move || crate::model::write_file_atomically(&path, text.as_bytes())).await;
                    if let Err(e) = written {
                        tracing::warn!(shard = ctx.id.0, error = %e, "cannot checkpoint high watermarks");
                    }
                }
                // Deleted partitions' directories, moved aside: removed off the data core.
                let trash = ctx.shard.borrow_mut().take_trash();
                if !trash.is_empty() {
                    ctx.run_blocking(move || remove_trash(trash)).await;
                }
                let status = ctx.shard.borrow().status();
                if let Ok(mut s) = ctx.metrics.shard(ctx.id).status.lock() {
                    *s = status;
                }
                ctx.wakeup();
            }
        })
        .detach();
    }

    let mut accepts = Vec::new();
    for runtime in listeners {
        let listener = TcpListener::bind(runtime.spec.bind.as_str())
            .map_err(|e| anyhow::anyhow!("cannot listen on {} ({}): {e}", runtime.spec.bind, runtime.spec.name))?;
        tracing::info!(
            shard = id.0, listener = %runtime.spec.name, protocol = runtime.spec.protocol.name(),
            listen = %runtime.spec.bind, "accepting connections"
        );
        let ctx = ctx.clone();
        accepts.push(glommio::spawn_local(async move {
            loop {
                match listener.accept().await {
                    Ok(stream) => {
                        // max.connections / max.connections.per.ip: over a cap, the
                        // connection is closed at once (dropped).
                        let Ok(peer) = stream.peer_addr() else { continue };
                        match ctx.admission.admit(peer.ip()) {
                            Ok(permit) => {
                                let ctx = ctx.clone();
                                let runtime = runtime.clone();
                                glommio::spawn_local(
                                    async move { connection::serve(ctx, stream, permit, runtime).await },
                                )
                                .detach();
                            }
                            Err(refusal) => {
                                ctx.metrics.shard(ctx.id).connections_refused.fetch_add(1, Ordering::Relaxed);
                                if ctx.client_error_log_allowed() {
                                    let cap = match refusal {
                                        admission::Refusal::Total => "max.connections",
                                        admission::Refusal::PerIp => "max.connections.per.ip",
                                    };
                                    tracing::warn!(%peer, cap, "refusing a connection: {cap} reached");
                                }
                            }
                        }
                    }
                    Err(e) => {
                        if ctx.client_error_log_allowed() {
                            tracing::warn!(error = %e, "accept failed");
                        }
                        // Out of file descriptors, an accept at once fails again: the
                        // connections wait in the backlog a little longer instead.
                        let out_of_files = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                        let backoff_ms =
                            if out_of_files { accept_out_of_files_backoff_ms } else { accept_error_backoff_ms };
                        glommio::timer::sleep(Duration::from_millis(backoff_ms)).await;
                    }
                }
            }
        }));
    }

    // Started: from here this loop's timer wakes the executor (see `starting` above).
    starting.set(false);
    while !shutdown.load(Ordering::SeqCst) {
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
    // Controlled shutdown: serve until the coordinator has moved this broker's
    // leaderships away (the coordinator link asks for it), so clients only ever see a
    // NOT_LEADER_OR_FOLLOWER they recover from.
    let deadline = std::time::Instant::now() + Duration::from_millis(controlled_shutdown_wait_ms);
    while !ctx.view().left_cluster() && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(20)).await;
    }
    for accept in accepts {
        accept.cancel().await;
    }
    ctx.stopping.set(true);
    ctx.shard.borrow().cancel_cleaning();
    let deadline = std::time::Instant::now() + Duration::from_millis(shutdown_grace_ms);
    while ctx.in_flight.get() > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    // Blocking work still out (a checkpoint write, an fsync round, partitions being
    // opened) ends before the logs close: it would race the close, and its thread would
    // panic answering an executor that is gone.
    while ctx.blocking_in_flight() > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    // The high watermarks as they stand now, the last checkpoint before the close.
    let checkpoint = ctx.shard.borrow_mut().hw_checkpoint_due();
    if let Some((path, text)) = checkpoint {
        if let Err(e) = ctx.run_blocking(move || crate::model::write_file_atomically(&path, text.as_bytes())).await {
            tracing::warn!(shard = id.0, error = %e, "cannot checkpoint high watermarks");
        }
    }
    let logs = ctx.shard.borrow_mut().take_logs_for_close();
    let closing_ms = now_ms();
    let test_delay = Duration::from_millis(ctx.config.test_fsync_delay_ms);
    ctx.run_blocking(move || {
        // Tests only (`--test-fsync-delay-ms`): a slow disk's close.
        if !test_delay.is_zero() {
            std::thread::sleep(test_delay);
        }
        crate::shard::close_logs(logs)
    })
    .await;
    tracing::info!(shard = id.0, close_ms = now_ms() - closing_ms, "partition logs closed");
    tracing::info!(shard = id.0, "shard stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_pinned_to_its_own_cpu_only_while_pinning_is_on_and_cpus_suffice() {
        let cpus = [2, 5, 7];
        let mut config = BrokerConfig::default();
        assert_eq!((0..3).map(|s| shard_cpu(&config, s, 3, &cpus)).collect::<Vec<_>>(), [Some(2), Some(5), Some(7)]);
        assert_eq!(shard_cpu(&config, 1, 2, &cpus), Some(5));
        // More shards than CPUs: none is pinned (two would share a CPU).
        assert_eq!(shard_cpu(&config, 0, 4, &cpus), None);
        config.pin_shards = false;
        assert_eq!(shard_cpu(&config, 0, 3, &cpus), None);
        assert_eq!(shard_cpu(&config, 2, 3, &cpus), None);
    }

    /// The segment files' budget leaves descriptors for connections and the broker's
    /// own files.
    #[test]
    fn the_segment_files_budget_fits_the_open_files_limit() {
        assert_eq!(segment_files_budget(20_000, 10_000), 14_000);
        assert_eq!(segment_files_budget(1_048_576, 10_000), 1_037_576);
        assert_eq!(segment_files_budget(1_024, 10_000), 1);
        for limit in [4_096u64, 16_384, 20_000, 65_536, 1_048_576] {
            let files = segment_files_budget(limit, 10_000);
            assert!(files + 10_000.min(limit as usize / 4) + 1_000 <= limit as usize, "{limit}");
        }
    }
}
