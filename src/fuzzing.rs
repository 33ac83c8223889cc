//! Entry points for the fuzz targets (fuzz/fuzz_targets/*.rs, cargo-fuzz) and for the
//! corpus replay in `cargo test` (tests/fuzz_corpus.rs): every parser of untrusted
//! bytes, network or disk, fed arbitrary input the way the broker feeds it.
//!
//! Each function must return for any input: no panic, no abort, no allocation beyond
//! what the input's size can justify (libFuzzer's -malloc_limit_mb catches those).

use std::path::Path;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::Decodable;

use crate::log::batch;
use crate::protocol::shape;

/// A request frame (without its length prefix) as a connection reads it: header, then
/// the shape check, then the codec every handler decodes with.
pub fn request(data: &[u8]) {
    // The principal an Envelope carries (KIP-590), decoded from the same bytes.
    let _ = crate::security::Principal::decode_forwarded(data);
    let Ok(frame) = crate::protocol::decode_frame(Bytes::copy_from_slice(data)) else { return };
    if frame.header.is_none() {
        return;
    }
    let Ok(key) = ApiKey::try_from(frame.api_key) else { return };
    if shape::check_request(frame.api_key, frame.api_version, &frame.body).is_ok() {
        let mut body = frame.body.clone();
        let _ = match crate::protocol::newer::codec_version(key, frame.api_version, true) {
            Some(version) => RequestKind::decode(key, &mut body, version).map(drop),
            None => crate::protocol::newer::decode_request(key, &mut body, frame.api_version).map(drop),
        };
    }
}

/// A request frame (without its length prefix) handled by a real broker: one shard on a
/// glommio executor over a data directory of its own, built once per process and kept
/// from input to input (src/server/fuzz_harness.rs), with the frame taking a
/// connection's path (header, shape check, codec, handler, shard, answer). Seeded from
/// the `request` corpus.
pub fn request_handler(data: &[u8]) {
    crate::server::fuzz_harness::handle_frame(data);
}

/// The bytes one client sends on one connection, to a real broker's SASL listener with
/// the ACL authorizer on (src/server/fuzz_harness.rs): framing and its size caps, the
/// SASL gate (SaslHandshake v0's bare tokens included), authorization, Envelope
/// forwarding from a super user, then the handlers, as `request_handler` drives them.
pub fn connection(data: &[u8]) {
    crate::server::fuzz_harness::handle_connection(data);
}

/// A peer's response: i16 api key, i16 version, then the frame without its prefix, as
/// the brokers' clients (replication fetchers, the coordinator link, the CLI) read it.
pub fn response(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let Ok(key) = ApiKey::try_from(i16::from_be_bytes([data[0], data[1]])) else { return };
    let version = i16::from_be_bytes([data[2], data[3]]);
    if !(key.valid_versions().min..=key.valid_versions().max).contains(&version) {
        return;
    }
    let mut body = Bytes::copy_from_slice(&data[4..]);
    if ResponseHeader::decode(&mut body, key.response_header_version(version)).is_err() {
        return;
    }
    if shape::check_response(key as i16, version, &body).is_ok() {
        let _ = ResponseKind::decode(key, &mut body, version);
    }
}

/// Record batches as produced or replicated: structure, CRC, producer fields, then the
/// records walk and the codec (and `__consumer_offsets` and `__transaction_state` keys
/// and values, which the coordinators decode when they load).
pub fn record_batch(data: &[u8]) {
    let mut buf = data;
    while !buf.is_empty() {
        let Ok((header, size)) = batch::check_structure(buf, crate::model::limits::message_bytes_max as usize) else {
            return;
        };
        let _ = batch::check_semantics(&header);
        let _ = batch::find_record_by_timestamp(&buf[..size], &header, 0);
        // Transaction markers, as followers and the producer-state replay read them.
        let _ = batch::control_marker(&buf[..size], &header);
        // The log cleaner reads segment batches the same way: decide the batch with a
        // map that supersedes whatever key its first record has, then read back what
        // it would write (a rebuilt batch must itself check out).
        clean_batch(&buf[..size], &header);
        if batch::check_records(&buf[..size], &header).is_ok() {
            if let Ok(set) =
                kafka_protocol::records::RecordBatchDecoder::decode(&mut Bytes::copy_from_slice(&buf[..size]))
            {
                for r in set.records {
                    if let Some(key) = &r.key {
                        let _ = crate::group::records::decode(key, r.value.as_ref());
                        let _ = crate::txn::log_records::decode_key(key);
                        let _ = crate::txn::log_records::decode_value(r.value.as_ref());
                    }
                }
            }
        }
        buf = &buf[size..];
    }
}

fn clean_batch(whole: &[u8], h: &batch::BatchHeader) {
    use crate::log::cleaner;
    let mut map = cleaner::KeyMap::new(1 << 20);
    if let Some((inflated, _)) = cleaner::batch_records(whole, h) {
        let bytes = inflated.as_deref().unwrap_or(&whole[batch::HEADER_BYTES..]);
        if let Some(first_key) = cleaner::parse_records(bytes, h).and_then(|r| r.first().and_then(|r| r.key)) {
            map.try_add(&[(first_key, h.last_offset())]);
        }
    }
    for keep_empty in [false, true] {
        let rules =
            cleaner::BatchRules { map: &map, map_end: i64::MAX, now_ms: i64::MAX, delete_retention_ms: 0, keep_empty };
        if let Ok(cleaner::Verdict::Rewrite { batch: rebuilt, .. }) = cleaner::clean_batch(whole, h, &rules) {
            let (nh, size) = batch::check_structure(&rebuilt, usize::MAX).expect("a rebuilt batch checks out");
            assert_eq!(size, rebuilt.len());
            assert_eq!((nh.base_offset, nh.last_offset_delta), (h.base_offset, h.last_offset_delta));
        }
    }
}

/// A partition directory after a crash: the bytes become a segment's `.log`, `.index`
/// and `.timeindex`, with or without a recovery point and the clean-shutdown marker
/// (which makes the log trust its indexes), then the log is opened and read through,
/// and what is read is replayed as a `__consumer_offsets` partition's groups are at
/// load (`GroupCoordinator::replay_batches`, as `Shard::group_load_apply` does). The
/// time-index bytes also serve as the segment's `.txnindex` (aborted transactions), which
/// each read asks for as a read_committed fetch does.
/// Layout: flags (1 byte), index length (u16), time-index length (u16), then the index,
/// the time index and the log.
pub fn segment_recovery(data: &[u8]) {
    if data.len() < 5 {
        return;
    }
    let flags = data[0];
    let rest = &data[5..];
    let index_len = (u16::from_be_bytes([data[1], data[2]]) as usize).min(rest.len());
    let time_len = (u16::from_be_bytes([data[3], data[4]]) as usize).min(rest.len() - index_len);
    let (index, rest) = rest.split_at(index_len);
    let (time_index, log) = rest.split_at(time_len);
    let Ok(dir) = scratch_dir("segment") else { return };
    let p = dir.path().join("fuzz-0");
    let written = std::fs::create_dir_all(&p)
        .and_then(|()| std::fs::write(p.join("00000000000000000000.log"), log))
        .and_then(|()| std::fs::write(p.join("00000000000000000000.index"), index))
        .and_then(|()| std::fs::write(p.join("00000000000000000000.timeindex"), time_index))
        .and_then(|()| std::fs::write(p.join("00000000000000000000.txnindex"), time_index))
        .and_then(|()| match flags & 1 {
            1 => std::fs::write(p.join(crate::log::CLEAN_SHUTDOWN_FILE), b""),
            _ => Ok(()),
        })
        .and_then(|()| match flags & 2 {
            // A recovery point somewhere in the log (its own format: version, offset, crc).
            2 => {
                std::fs::write(p.join(crate::log::RECOVERY_POINT_FILE), crate::log::checkpoint_text(flags as i64 >> 2))
            }
            _ => Ok(()),
        });
    if written.is_err() {
        return;
    }
    let Ok(mut log) = crate::log::PartitionLog::open(&p, crate::log::LogConfig::default(), 0) else { return };
    let end = log.log_end_offset();
    let _ = log.last_stable_offset(end);
    let mut groups = crate::group::GroupCoordinator::new(Default::default());
    let mut offset = log.log_start_offset();
    let end = log.log_end_offset();
    for _ in 0..1024 {
        if offset >= end {
            break;
        }
        let Ok(plan) = log.read(offset, 64 * 1024, end, true) else { break };
        let _ = log.aborted_txns(offset, &plan);
        let Ok(bytes) = plan.read_to_vec() else { break };
        if bytes.len() < batch::HEADER_BYTES {
            break;
        }
        let h = batch::BatchHeader::parse(&bytes);
        let _ = groups.replay_batches(bytes, offset, 0, crate::group::offsets_topic_partitions, 0);
        offset = crate::model::Offset(h.last_offset() + 1);
    }
    let _ = log.close();
}

/// Checkpoint files: the leader-epoch checkpoint (text), the log start checkpoint, the
/// high-watermark checkpoint (Kafka's replication-offset-checkpoint) and producer-state
/// `.snapshot` files, all read at start.
pub fn checkpoints(data: &[u8]) {
    let _ = crate::txn::producer_state::ProducerStates::decode_snapshot(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::log::leader_epoch::LeaderEpochCache::decode(text);
    }
    let _ = crate::log::start_offset::decode_log_start_checkpoint(data);
    let Ok(dir) = scratch_dir("checkpoint") else { return };
    let file = dir.path().join(format!("{}-0", crate::shard::HW_CHECKPOINT_PREFIX));
    if std::fs::write(&file, data).is_ok() {
        let _ = crate::shard::load_hw_checkpoints(dir.path());
    }
}

/// The coordinator's documents in Kafka's ZooKeeper layout (JSON), as read from
/// ZooKeeper or the embedded store, and the embedded store's own file.
pub fn coordinator_json(data: &[u8]) {
    use crate::coordinator::layout;
    let _ = layout::decode_broker(data);
    let _ = layout::decode_topic(data);
    let _ = layout::decode_partition_state(data, 0);
    let _ = layout::decode_topic_config(data);
    let _ = layout::decode_controller(data);
    let _ = layout::decode_cluster_id(data);
    let _ = layout::decode_controller_epoch(data);
    let _ = layout::decode_reassign_partitions(data);
    let _ = layout::decode_registrations(data);
    let _ = crate::txn::producer_id::ProducerIdBlock::decode(data);
    let _ = crate::coordinator::acl_store::decode_acls(data);
    let _ = crate::coordinator::acl_store::decode_change(data, false);
    let _ = crate::coordinator::acl_store::decode_change(data, true);
    let _ = layout::config_change_sequence(&String::from_utf8_lossy(data));
    // A user's or client's entity config: quotas and SCRAM credentials, as a registry
    // parses them for shards (under a user path, so credentials are read too).
    if let Ok(configs) = layout::decode_topic_config(data) {
        for path in ["users/alice", "users/<default>/clients/c%20d"] {
            let raw = std::collections::BTreeMap::from([(path.to_string(), configs.clone())]);
            let _ = crate::security::entity::EntityConfigs::parse(&raw);
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = crate::security::entity::QuotaEntity::from_path(s);
        for m in crate::security::scram::ScramMechanism::ALL {
            let _ = crate::security::scram::ScramCredential::from_kafka_string(m, s);
        }
    }
    let Ok(dir) = scratch_dir("store") else { return };
    let meta = dir.path().join("spate-meta");
    if std::fs::create_dir_all(&meta).and_then(|()| std::fs::write(meta.join("znodes.json"), data)).is_ok() {
        let _ = crate::coordinator::store::LocalStore::open(dir.path());
    }
}

/// The cluster snapshot a mirror broker takes from the active coordinator
/// (`Registry::apply_snapshot`, the peer's JSON) and reads back at start from its cache
/// (`cluster-snapshot.json` in its data directory, `Registry::mirror`): decoded, checked
/// against the controller epoch held, installed into the controller and turned into the
/// topics and partitions the shards are given.
pub fn cluster_snapshot(data: &[u8]) {
    use crate::coordinator::registry::{LocalBroker, Registry, SNAPSHOT_CACHE_FILE};
    let Ok(dir) = scratch_dir("snapshot") else { return };
    let broker = || LocalBroker {
        id: crate::model::NodeId(2),
        endpoint: crate::coordinator::controller::Endpoint::new("127.0.0.1", 9092),
        rack: None,
        shards: 2,
    };
    // From the peer, on a mirror that has no cache yet (the cache is written then).
    let mut from_peer = Registry::mirror(broker(), Some(dir.path()));
    let _ = from_peer.apply_snapshot(data);
    let _ = from_peer.apply_snapshot(data);
    // From the cache file at start.
    if std::fs::write(dir.path().join(SNAPSHOT_CACHE_FILE), data).is_ok() {
        let _ = Registry::mirror(broker(), Some(dir.path()));
    }
}

/// A fresh directory under the system's temporary directory, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch_dir(kind: &str) -> std::io::Result<Scratch> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "spate-fuzz-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(Scratch(dir))
}

/// SASL tokens from an unauthenticated client (SaslAuthenticate's auth_bytes): the input
/// is split at 0xFF bytes into successive tokens, played against each mechanism with a
/// known user (PLAIN alice/alice-secret; SCRAM "user"/"pencil", 4096 iterations); then
/// the same tokens as a broker's answers to a client login (`security::client`).
pub fn sasl(data: &[u8]) {
    use crate::security::client::{SaslClient, SaslLogin};
    use crate::security::sasl::{Credentials, Mechanism, SaslServer, Step};
    use crate::security::scram::{ScramCredential, ScramMechanism};
    struct Known;
    impl Credentials for Known {
        fn plain_password(&self, user: &str) -> Option<String> {
            (user == "alice").then(|| "alice-secret".to_string())
        }
        fn scram(&self, user: &str, m: ScramMechanism) -> Option<ScramCredential> {
            thread_local! {
                static CREDS: Vec<(ScramMechanism, ScramCredential)> = ScramMechanism::ALL
                    .into_iter()
                    .map(|m| (m, ScramCredential::from_password(m, b"pencil", b"salt", 4096)))
                    .collect();
            }
            (user == "user").then(|| CREDS.with(|c| c.iter().find(|(x, _)| *x == m).map(|(_, c)| c.clone())))?
        }
    }
    for m in Mechanism::ALL {
        let mut server = SaslServer::new(m);
        for token in data.split(|b| *b == 0xFF) {
            match server.step(token, &Known, "servernonce") {
                Step::Continue(_) => {}
                Step::Done { .. } | Step::Failed(_) => break,
            }
        }
        // The client side: a broker's answers (server-first, server-final) are untrusted
        // bytes for an inter-broker or CLI login.
        let login = SaslLogin { mechanism: m, username: "user".into(), password: "pencil".into() };
        let mut client = SaslClient::new(login, "clientnonce".into());
        let _ = client.first();
        for token in data.split(|b| *b == 0xFF) {
            match client.step(token) {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
}

/// A PEM key store as `ssl.keystore.location` names it (a file an operator or a
/// deployment tool wrote, read at start and on every reload): its certificates and the
/// subject of each, its private key with and without `ssl.key.password`, with small key
/// derivation limits so an input cannot buy seconds of PBKDF2, and the key as rustls
/// would load it.
pub fn pem_keystore(data: &[u8]) {
    use crate::security::tls::{self, KdfLimits};
    let path = Path::new("keystore.pem");
    if let Ok(certs) = tls::certificates(path, data) {
        for cert in certs {
            let _ = tls::certificate_subject(&cert);
        }
    }
    /// Derivation limits of the fuzz target: a few milliseconds of PBKDF2 or scrypt
    /// per input, well inside libFuzzer's -timeout.
    const fuzz_kdf_limits: KdfLimits = KdfLimits { pbkdf2_iterations_max: 4096, scrypt_bytes_max: 1 << 20 };
    let limits = fuzz_kdf_limits;
    for password in [Some("s3cret"), None] {
        if let Ok(key) = tls::private_key_within(path, data, password, limits) {
            let _ = rustls::crypto::ring::sign::any_supported_type(&key);
        }
    }
}
