//! `MetaStore`: a tree of znodes, ZooKeeper's data model, behind which cluster metadata
//! lives in Kafka's ZooKeeper layout (see `layout.rs`). Two backends: `LocalStore`
//! (embedded, durable in the data dir) and `ZkStore` (a real ZooKeeper ensemble).
//!
//! The interface is blocking: metadata writes are rare (topic create/delete, leader
//! changes) and the broker calls it off the data cores. Paths are absolute, `/`-separated,
//! without a trailing slash; a node's parent must exist (as in ZooKeeper), except that
//! `create_all` makes the missing ancestors.
//!
//! LocalStore file format (version 1): `<data>/spate-meta/znodes.json`, JSON
//! `{"version":1,"nodes":{"/path":{"data":"<base64>","version":N}}}`, rewritten whole
//! with write-temp, fsync, rename, fsync-dir on every change (once for a `batch` of
//! changes: the registry writes each controller decision as one). Ephemeral nodes are kept in
//! memory only (they die with the process, as a ZooKeeper session's would).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("znode {0} does not exist")]
    NoNode(String),
    #[error("znode {0} already exists")]
    NodeExists(String),
    #[error("znode {0} has a different version than expected")]
    BadVersion(String),
    #[error("znode {0} has children")]
    NotEmpty(String),
    #[error("bad znode path {0:?}")]
    BadPath(String),
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    #[error("metadata store i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("metadata store corrupt: {0}")]
    Corrupt(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    Persistent,
    /// Removed when the creating session ends (the process, for LocalStore).
    Ephemeral,
}

/// A znode's data and its version (ZooKeeper's `stat.version`: 0 at creation, +1 per set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub data: Vec<u8>,
    pub version: i32,
}

pub trait MetaStore: Send + Sync {
    fn get(&self, path: &str) -> Result<Option<Node>, StoreError>;
    /// Child names (not paths), sorted.
    fn children(&self, path: &str) -> Result<Vec<String>, StoreError>;
    /// Create a node; its parent must exist. `NodeExists` if it does.
    fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(), StoreError>;
    /// Replace a node's data; with `expected_version`, only if it still has that version
    /// (`BadVersion` otherwise). Returns the new version.
    fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<i32, StoreError>;
    /// Delete a node without children.
    fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<(), StoreError>;

    /// False once the store's session ended and its ephemeral nodes (`/controller`
    /// among them) are gone: a coordinator on it is no longer elected.
    fn session_alive(&self) -> bool {
        true
    }

    /// Run the writes `writes` makes as one durable step where the store can: the
    /// embedded store writes its file once at the end instead of once a write (a topic
    /// of N partitions is N + 2 writes), and on failure forgets them all. ZooKeeper
    /// applies them one by one, as they come.
    fn batch(&self, writes: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
        writes()
    }

    /// Create the missing ancestors of `path` (empty persistent nodes), then `path`.
    fn create_all(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(), StoreError> {
        check_path(path)?;
        let mut prefix = String::new();
        let parts: Vec<&str> = path.split('/').skip(1).collect();
        for part in &parts[..parts.len() - 1] {
            prefix.push('/');
            prefix.push_str(part);
            match self.create(&prefix, b"", CreateMode::Persistent) {
                Ok(()) | Err(StoreError::NodeExists(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.create(path, data, mode)
    }

    /// Create or overwrite, making ancestors as needed.
    fn put(&self, path: &str, data: &[u8]) -> Result<(), StoreError> {
        match self.set(path, data, None) {
            Ok(_) => Ok(()),
            Err(StoreError::NoNode(_)) => match self.create_all(path, data, CreateMode::Persistent) {
                Err(StoreError::NodeExists(_)) => self.set(path, data, None).map(|_| ()),
                other => other,
            },
            Err(e) => Err(e),
        }
    }

    /// Delete a node and everything below it.
    fn delete_all(&self, path: &str) -> Result<(), StoreError> {
        match self.children(path) {
            Ok(children) => {
                for c in children {
                    self.delete_all(&format!("{path}/{c}"))?;
                }
            }
            Err(StoreError::NoNode(_)) => return Ok(()),
            Err(e) => return Err(e),
        }
        match self.delete(path, None) {
            Ok(()) | Err(StoreError::NoNode(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Paths are `/a/b`: absolute, no empty segments, no trailing slash, no `.`/`..`.
pub fn check_path(path: &str) -> Result<(), StoreError> {
    let bad = || StoreError::BadPath(path.to_string());
    if path == "/" {
        return Ok(());
    }
    if !path.starts_with('/') || path.ends_with('/') {
        return Err(bad());
    }
    if path[1..].split('/').any(|s| s.is_empty() || s == "." || s == "..") {
        return Err(bad());
    }
    Ok(())
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

const LOCAL_STORE_VERSION: u32 = 1;
/// A metadata snapshot bigger than this is not ours.
const local_store_file_bytes_max: u64 = 256 * 1024 * 1024;

#[derive(serde::Serialize, serde::Deserialize)]
struct StoredNode {
    /// Node data, base64 (znode data is bytes; Kafka's documents happen to be JSON).
    data: String,
    version: i32,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct LocalFile {
    version: u32,
    nodes: BTreeMap<String, StoredNode>,
}

#[derive(Clone)]
struct LocalNode {
    node: Node,
    ephemeral: bool,
}

/// The embedded store: the whole tree in memory, persistent nodes written through to
/// one file atomically on every change (or once per `batch`).
pub struct LocalStore {
    path: PathBuf,
    nodes: Mutex<BTreeMap<String, LocalNode>>,
    /// Inside `batch`: writes change memory only; the file is written when it ends.
    batching: std::sync::atomic::AtomicBool,
}

impl LocalStore {
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let dir = data_dir.join("spate-meta");
        crate::model::create_dir_all_durably(&dir)?;
        let path = dir.join("znodes.json");
        let mut nodes = BTreeMap::new();
        nodes.insert("/".to_string(), LocalNode { node: Node { data: Vec::new(), version: 0 }, ephemeral: false });
        match std::fs::metadata(&path) {
            Ok(m) => {
                if m.len() > local_store_file_bytes_max {
                    return Err(StoreError::Corrupt(format!("{} is {} bytes", path.display(), m.len())));
                }
                let file: LocalFile = serde_json::from_slice(&std::fs::read(&path)?)
                    .map_err(|e| StoreError::Corrupt(format!("{}: {e}", path.display())))?;
                if file.version != LOCAL_STORE_VERSION {
                    return Err(StoreError::Corrupt(format!("unknown store version {}", file.version)));
                }
                for (p, n) in file.nodes {
                    check_path(&p).map_err(|_| StoreError::Corrupt(format!("bad path {p:?}")))?;
                    let data = base64_decode(&n.data).ok_or_else(|| StoreError::Corrupt(format!("bad data at {p}")))?;
                    nodes.insert(p, LocalNode { node: Node { data, version: n.version }, ephemeral: false });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Self { path, nodes: Mutex::new(nodes), batching: std::sync::atomic::AtomicBool::new(false) })
    }

    fn persist(&self, nodes: &BTreeMap<String, LocalNode>) -> Result<(), StoreError> {
        if self.batching.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let file = LocalFile {
            version: LOCAL_STORE_VERSION,
            nodes: nodes
                .iter()
                .filter(|(p, n)| !n.ephemeral && p.as_str() != "/")
                .map(|(p, n)| (p.clone(), StoredNode { data: base64_encode(&n.node.data), version: n.node.version }))
                .collect(),
        };
        let body = serde_json::to_vec(&file).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        crate::model::write_file_atomically(&self.path, &body)?;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, LocalNode>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn has_children(nodes: &BTreeMap<String, LocalNode>, path: &str) -> bool {
    let prefix = if path == "/" { "/".to_string() } else { format!("{path}/") };
    nodes.range(prefix.clone()..).next().is_some_and(|(p, _)| p.starts_with(&prefix) && p != "/")
}

impl MetaStore for LocalStore {
    fn batch(&self, writes: &mut dyn FnMut() -> Result<(), StoreError>) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        let before = self.lock().clone();
        assert!(!self.batching.swap(true, Ordering::AcqRel), "LocalStore batches do not nest");
        let written = writes();
        self.batching.store(false, Ordering::Release);
        let mut nodes = self.lock();
        let result = written.and_then(|()| self.persist(&nodes));
        if result.is_err() {
            *nodes = before; // memory stays what the file holds
        }
        result
    }

    fn get(&self, path: &str) -> Result<Option<Node>, StoreError> {
        check_path(path)?;
        Ok(self.lock().get(path).map(|n| n.node.clone()))
    }

    fn children(&self, path: &str) -> Result<Vec<String>, StoreError> {
        check_path(path)?;
        let nodes = self.lock();
        if !nodes.contains_key(path) {
            return Err(StoreError::NoNode(path.to_string()));
        }
        let prefix = if path == "/" { "/".to_string() } else { format!("{path}/") };
        Ok(nodes
            .range(prefix.clone()..)
            .take_while(|(p, _)| p.starts_with(&prefix))
            .filter(|(p, _)| p.as_str() != "/" && !p[prefix.len()..].contains('/'))
            .map(|(p, _)| p[prefix.len()..].to_string())
            .collect())
    }

    fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(), StoreError> {
        check_path(path)?;
        if path == "/" {
            return Err(StoreError::NodeExists(path.to_string()));
        }
        let mut nodes = self.lock();
        if nodes.contains_key(path) {
            return Err(StoreError::NodeExists(path.to_string()));
        }
        let par = parent(path);
        match nodes.get(par) {
            None => return Err(StoreError::NoNode(par.to_string())),
            Some(p) if p.ephemeral => return Err(StoreError::BadPath(format!("{path}: ephemeral parent"))),
            Some(_) => {}
        }
        let ephemeral = mode == CreateMode::Ephemeral;
        nodes.insert(path.to_string(), LocalNode { node: Node { data: data.to_vec(), version: 0 }, ephemeral });
        if !ephemeral {
            if let Err(e) = self.persist(&nodes) {
                nodes.remove(path);
                return Err(e);
            }
        }
        Ok(())
    }

    fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<i32, StoreError> {
        check_path(path)?;
        let mut nodes = self.lock();
        let n = nodes.get_mut(path).ok_or_else(|| StoreError::NoNode(path.to_string()))?;
        if expected_version.is_some_and(|v| v != n.node.version) {
            return Err(StoreError::BadVersion(path.to_string()));
        }
        let next = n.node.version + 1;
        let old = std::mem::replace(&mut n.node, Node { data: data.to_vec(), version: next });
        let (version, ephemeral) = (n.node.version, n.ephemeral);
        if !ephemeral {
            if let Err(e) = self.persist(&nodes) {
                nodes.get_mut(path).expect("present").node = old;
                return Err(e);
            }
        }
        Ok(version)
    }

    fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<(), StoreError> {
        check_path(path)?;
        let mut nodes = self.lock();
        let n = nodes.get(path).ok_or_else(|| StoreError::NoNode(path.to_string()))?;
        if expected_version.is_some_and(|v| v != n.node.version) {
            return Err(StoreError::BadVersion(path.to_string()));
        }
        if has_children(&nodes, path) {
            return Err(StoreError::NotEmpty(path.to_string()));
        }
        let removed = nodes.remove(path).expect("present");
        if !removed.ephemeral {
            if let Err(e) = self.persist(&nodes) {
                nodes.insert(path.to_string(), removed);
                return Err(e);
            }
        }
        Ok(())
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (small, for znode data in the local snapshot).
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = B64.iter().position(|&b| b == c)? as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The semantics every backend must have: tests run this against each backend (on a
/// fresh, empty store). Panics on the first difference.
#[doc(hidden)]
pub fn check_store_semantics(s: &dyn MetaStore) {
    assert!(s.get("/brokers").unwrap().is_none());
    assert!(matches!(s.create("/brokers/ids", b"", CreateMode::Persistent), Err(StoreError::NoNode(_))));
    s.create_all("/brokers/ids/1", b"{\"a\":1}", CreateMode::Ephemeral).unwrap();
    assert!(matches!(s.create("/brokers/ids/1", b"", CreateMode::Persistent), Err(StoreError::NodeExists(_))));
    assert_eq!(s.children("/brokers/ids").unwrap(), vec!["1".to_string()]);
    assert_eq!(s.get("/brokers/ids/1").unwrap().unwrap(), Node { data: b"{\"a\":1}".to_vec(), version: 0 });
    assert_eq!(s.set("/brokers/ids/1", b"x", Some(0)).unwrap(), 1);
    assert!(matches!(s.set("/brokers/ids/1", b"y", Some(0)), Err(StoreError::BadVersion(_))));
    assert!(matches!(s.delete("/brokers", None), Err(StoreError::NotEmpty(_))));
    s.put("/config/topics/t", b"{}").unwrap();
    s.put("/config/topics/t", b"{\"v\":2}").unwrap();
    assert_eq!(s.get("/config/topics/t").unwrap().unwrap().data, b"{\"v\":2}");
    s.delete_all("/config").unwrap();
    assert!(s.get("/config/topics/t").unwrap().is_none());
    assert!(matches!(s.get("relative"), Err(StoreError::BadPath(_))));
    assert!(matches!(s.get("/a//b"), Err(StoreError::BadPath(_))));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_store_semantics_and_durability() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = LocalStore::open(dir.path()).unwrap();
            check_store_semantics(&s);
            s.put("/brokers/topics/orders", b"{\"version\":3}").unwrap();
        }
        let s = LocalStore::open(dir.path()).unwrap();
        assert_eq!(s.get("/brokers/topics/orders").unwrap().unwrap().data, b"{\"version\":3}");
        assert!(s.get("/brokers/ids/1").unwrap().is_none(), "ephemeral nodes die with the process");
        assert_eq!(s.children("/brokers").unwrap(), vec!["ids".to_string(), "topics".to_string()]);
    }

    #[test]
    fn local_store_batch_is_one_step() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalStore::open(dir.path()).unwrap();
        s.batch(&mut || {
            for p in 0..3 {
                s.put(&format!("/brokers/topics/t/partitions/{p}/state"), b"{}")?;
            }
            Ok(())
        })
        .unwrap();
        // A failing batch leaves neither memory nor file changed.
        let failed = s.batch(&mut || {
            s.put("/brokers/topics/u", b"{}")?;
            s.create("/brokers/topics/t", b"", CreateMode::Persistent) // exists
        });
        assert!(matches!(failed, Err(StoreError::NodeExists(_))));
        assert!(s.get("/brokers/topics/u").unwrap().is_none());
        drop(s);
        let s = LocalStore::open(dir.path()).unwrap();
        assert_eq!(s.children("/brokers/topics/t/partitions").unwrap().len(), 3);
        assert!(s.get("/brokers/topics/u").unwrap().is_none());
    }

    #[test]
    fn base64_round_trip() {
        for n in 0..20 {
            let data: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(base64_decode(&base64_encode(&data)).unwrap(), data);
        }
        assert_eq!(base64_encode(b"Ma"), "TWE=");
    }
}
