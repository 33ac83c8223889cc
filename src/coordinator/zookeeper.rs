//! `ZkStore`: the `MetaStore` backend on a real Apache ZooKeeper ensemble, over the
//! ZooKeeper protocol with the `zookeeper-client` crate.
//!
//! Runtime: `zookeeper-client` is async. Its one background task (the session: socket,
//! pings, reconnects) runs on smol's global executor (crate feature `smol`), which owns its
//! own thread; socket readiness and timers come from async-io's reactor thread. The
//! blocking `MetaStore` calls send their request and wait with `async_io::block_on` on the
//! caller's thread. So nothing here touches glommio, and no call may be made from an
//! executor that must not block (the broker's data cores): the coordinator calls this from
//! its own thread.
//!
//! Invariants and lifecycle:
//! - One `ZkStore` is one ZooKeeper session. Ephemeral nodes it creates live as long as the
//!   session: dropping the store closes the session (Drop waits up to
//!   `close_wait_ms_max` for the server to confirm), after which the ensemble removes them
//!   at once; a process that dies without closing loses them after the session timeout.
//! - A session that expired (or was closed) never comes back: every later call returns
//!   `Unavailable`, and `session_alive()` is false. The owner connects a new `ZkStore` and
//!   re-creates its ephemeral nodes, as a Kafka broker does.
//! - While the connection is lost but the session still lives, requests queue in the client
//!   and complete after it reconnects, or fail with `Unavailable` when the session expires
//!   or `request_timeout` passes. `Unavailable` from a write means its outcome is unknown.
//! - All paths are relative to the chroot of the connect URL (created if missing); znode
//!   versions are ZooKeeper's `stat.version`.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use zookeeper_client as zk;

use crate::coordinator::store::{check_path, CreateMode, MetaStore, Node, StoreError};

/// URL scheme of `--metadata zookeeper://HOST:PORT[,HOST:PORT...]/CHROOT`.
pub const URL_SCHEME: &str = "zookeeper://";
/// A request waits at most this many session timeouts (the client itself fails it when the
/// session expires; this bounds a wedged connection too).
const request_timeout_session_timeouts: u32 = 2;
/// Drop waits at most this long for the server to confirm the session close.
const close_wait_ms_max: u64 = 5_000;
/// ZooKeeper's `jute.maxbuffer` default: bigger znode data is refused by the server.
pub const znode_data_bytes_max: usize = 1024 * 1024;

/// A parsed `zookeeper://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkUrl {
    /// `HOST:PORT[,HOST:PORT...]`, ZooKeeper's connect string without chroot.
    pub hosts: String,
    /// `/a/b`, or `/` when the URL has none.
    pub chroot: String,
}

impl ZkUrl {
    pub fn parse(url: &str) -> Result<ZkUrl, StoreError> {
        let bad = |why: &str| StoreError::Unavailable(format!("bad ZooKeeper url {url:?}: {why}"));
        let rest = url.strip_prefix(URL_SCHEME).ok_or_else(|| bad("must start with zookeeper://"))?;
        let (hosts, chroot) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let chroot = if chroot.len() > 1 { chroot.trim_end_matches('/') } else { "/" };
        if hosts.is_empty() {
            return Err(bad("no HOST:PORT"));
        }
        for host in hosts.split(',') {
            let (name, port) = host.rsplit_once(':').ok_or_else(|| bad("each host needs :PORT"))?;
            if name.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad("each host must be HOST:PORT"));
            }
        }
        check_path(chroot).map_err(|_| bad("bad chroot path"))?;
        Ok(ZkUrl { hosts: hosts.to_string(), chroot: chroot.to_string() })
    }
}

/// The ZooKeeper-backed store; one ZooKeeper session.
pub struct ZkStore {
    /// `None` only inside Drop.
    client: Option<zk::Client>,
    /// Session state, watched apart from the client so Drop can wait for `Closed`.
    state: Mutex<zk::StateWatcher>,
    /// Negotiated with the server, which clamps what we asked for to its min/max.
    session_timeout_ms: u64,
    request_timeout: Duration,
}

impl ZkStore {
    /// Connect to `zookeeper://HOST:PORT[,HOST:PORT...]/CHROOT` with a new session, creating
    /// the chroot node (and its ancestors) when missing.
    pub fn connect(url: &str, session_timeout_ms: u64) -> Result<ZkStore, StoreError> {
        let url = ZkUrl::parse(url)?;
        let session_timeout = Duration::from_millis(session_timeout_ms.max(1));
        let connect_timeout = session_timeout * request_timeout_session_timeouts;
        let connector = zk::Client::connector().with_session_timeout(session_timeout);
        let client = block_on_timeout(connect_timeout, connector.connect(&url.hosts))
            .ok_or_else(|| {
                StoreError::Unavailable(format!("no ZooKeeper session with {} in {connect_timeout:?}", url.hosts))
            })?
            .map_err(|e| StoreError::Unavailable(format!("connect to ZooKeeper {}: {e}", url.hosts)))?;
        let client = if url.chroot == "/" {
            client
        } else {
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            block_on_timeout(connect_timeout, client.mkdir(&url.chroot, &options))
                .ok_or_else(|| StoreError::Unavailable(format!("create chroot {}: timed out", url.chroot)))?
                .map_err(|e| map_error(&url.chroot, e))?;
            client.chroot(url.chroot.clone()).map_err(|_| StoreError::BadPath(url.chroot.clone()))?
        };
        let negotiated_ms = client.session_timeout().as_millis() as u64;
        assert!(negotiated_ms > 0, "ZooKeeper negotiated a zero session timeout");
        let state = Mutex::new(client.state_watcher());
        Ok(ZkStore {
            client: Some(client),
            state,
            session_timeout_ms: negotiated_ms,
            request_timeout: Duration::from_millis(negotiated_ms) * request_timeout_session_timeouts,
        })
    }

    /// The session timeout the ensemble granted.
    pub fn session_timeout_ms(&self) -> u64 {
        self.session_timeout_ms
    }

    /// ZooKeeper's session id (the `ephemeralOwner` of our ephemeral nodes).
    pub fn session_id(&self) -> i64 {
        self.client().session_id().0
    }

    /// False once the session has expired or been closed: its ephemeral nodes are gone (or
    /// going) and this store is dead. True while connected, and also while disconnected
    /// but not yet expired (the server may still hold our ephemerals; see `connected`).
    pub fn session_alive(&self) -> bool {
        !matches!(
            self.session_state(),
            zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
        )
    }

    /// True while the session has a live connection to a (writable) server. A coordinator
    /// that holds `/controller` should stop acting as soon as this turns false for longer
    /// than it can prove the session alive.
    pub fn connected(&self) -> bool {
        self.session_state() == zk::SessionState::SyncConnected
    }

    fn session_state(&self) -> zk::SessionState {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).peek_state()
    }

    /// Block until `path` does not exist, or `timeout` passes. `Ok(true)`: the node is gone
    /// (or never existed); `Ok(false)`: it still exists at the timeout. Uses a ZooKeeper
    /// watch, so a deletion is seen within a round trip; data changes re-arm the watch.
    /// `Unavailable` when the session ends while waiting. This is what a standby
    /// coordinator waits on for `/controller`.
    pub fn wait_deleted(&self, path: &str, timeout: Duration) -> Result<bool, StoreError> {
        check_path(path)?;
        let deadline = Instant::now() + timeout;
        let client = self.client();
        loop {
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            let (stat, watcher) = self.run(path, client.check_and_watch_stat(path))?;
            if stat.is_none() {
                return Ok(true);
            }
            if left.is_zero() {
                return Ok(false);
            }
            let Some(event) = block_on_timeout(left, watcher.changed()) else {
                return Ok(false);
            };
            match event.event_type {
                zk::EventType::NodeDeleted => return Ok(true),
                zk::EventType::Session if !self.session_alive() || is_terminal(event.session_state) => {
                    return Err(StoreError::Unavailable(format!(
                        "ZooKeeper session ended while watching {path}: {}",
                        event.session_state
                    )));
                }
                // Created/changed: look again (and re-arm the watch).
                _ => {}
            }
        }
    }

    fn client(&self) -> &zk::Client {
        self.client.as_ref().expect("ZkStore used after drop")
    }

    /// Wait for one request, bounded by `request_timeout`.
    fn run<T>(&self, path: &str, request: impl Future<Output = Result<T, zk::Error>>) -> Result<T, StoreError> {
        match block_on_timeout(self.request_timeout, request) {
            Some(result) => result.map_err(|e| map_error(path, e)),
            None => Err(StoreError::Unavailable(format!(
                "ZooKeeper request on {path} timed out after {:?}",
                self.request_timeout
            ))),
        }
    }
}

fn is_terminal(state: zk::SessionState) -> bool {
    matches!(state, zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed)
}

/// Run `future` on this thread until it finishes or `timeout` passes.
fn block_on_timeout<T>(timeout: Duration, future: impl Future<Output = T>) -> Option<T> {
    async_io::block_on(futures_lite::future::or(async { Some(future.await) }, async {
        async_io::Timer::after(timeout).await;
        None
    }))
}

/// ZooKeeper errors to the store's; `path` names the node the error is about.
fn map_error(path: &str, e: zk::Error) -> StoreError {
    match e {
        zk::Error::NoNode => StoreError::NoNode(path.to_string()),
        zk::Error::NodeExists => StoreError::NodeExists(path.to_string()),
        zk::Error::BadVersion => StoreError::BadVersion(path.to_string()),
        zk::Error::NotEmpty => StoreError::NotEmpty(path.to_string()),
        zk::Error::NoChildrenForEphemerals => StoreError::BadPath(format!("{path}: ephemeral parent")),
        zk::Error::BadArguments(why) => StoreError::BadPath(format!("{path}: {why}")),
        // Connection loss, session expiry or close, no hosts, timeouts, throttling, auth
        // and anything unexpected: the store cannot answer now.
        other => StoreError::Unavailable(format!("ZooKeeper on {path}: {other}")),
    }
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

impl MetaStore for ZkStore {
    fn session_alive(&self) -> bool {
        ZkStore::session_alive(self)
    }

    fn get(&self, path: &str) -> Result<Option<Node>, StoreError> {
        check_path(path)?;
        match self.run(path, self.client().get_data(path)) {
            Ok((data, stat)) => Ok(Some(Node { data, version: stat.version })),
            Err(StoreError::NoNode(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn children(&self, path: &str) -> Result<Vec<String>, StoreError> {
        check_path(path)?;
        let mut names = self.run(path, self.client().list_children(path))?;
        names.sort();
        Ok(names)
    }

    fn create(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<(), StoreError> {
        check_path(path)?;
        if path == "/" {
            return Err(StoreError::NodeExists(path.to_string()));
        }
        if data.len() > znode_data_bytes_max {
            return Err(StoreError::Unavailable(format!(
                "{path}: {} bytes is over {znode_data_bytes_max}",
                data.len()
            )));
        }
        let zk_mode = match mode {
            CreateMode::Persistent => zk::CreateMode::Persistent,
            CreateMode::Ephemeral => zk::CreateMode::Ephemeral,
        };
        let options = zk_mode.with_acls(zk::Acls::anyone_all());
        match self.run(path, self.client().create(path, data, &options)) {
            Ok(_) => Ok(()),
            // ZooKeeper says NoNode when the parent is missing: name the parent, as LocalStore does.
            Err(StoreError::NoNode(_)) => Err(StoreError::NoNode(parent(path).to_string())),
            Err(e) => Err(e),
        }
    }

    fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<i32, StoreError> {
        check_path(path)?;
        if data.len() > znode_data_bytes_max {
            return Err(StoreError::Unavailable(format!(
                "{path}: {} bytes is over {znode_data_bytes_max}",
                data.len()
            )));
        }
        let stat = self.run(path, self.client().set_data(path, data, expected_version))?;
        Ok(stat.version)
    }

    fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<(), StoreError> {
        check_path(path)?;
        self.run(path, self.client().delete(path, expected_version))
    }
}

impl Drop for ZkStore {
    /// Close the session now, so the ensemble drops our ephemeral nodes at once rather than
    /// after the session timeout: dropping the last client handle makes the session task send
    /// CloseSession; wait (bounded) until it reports the session closed. When disconnected
    /// there is no one to confirm the close, so Drop does not wait.
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let connected =
            matches!(state.peek_state(), zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly);
        drop(self.client.take());
        if !connected {
            // Nothing to confirm the close with: the session expires on the server instead.
            return;
        }
        let wait = Duration::from_millis(close_wait_ms_max.min(self.session_timeout_ms));
        let deadline = Instant::now() + wait;
        while !is_terminal(state.peek_state()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || block_on_timeout(left, state.changed()).is_none() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = ZkUrl::parse("zookeeper://127.0.0.1:2181,zk2:2182/spate/c1").unwrap();
        assert_eq!(u, ZkUrl { hosts: "127.0.0.1:2181,zk2:2182".into(), chroot: "/spate/c1".into() });
        assert_eq!(ZkUrl::parse("zookeeper://h:1").unwrap().chroot, "/");
        assert_eq!(ZkUrl::parse("zookeeper://h:1/").unwrap().chroot, "/");
        assert_eq!(ZkUrl::parse("zookeeper://h:1/a/").unwrap().chroot, "/a");
        for bad in ["h:1/a", "zookeeper:///a", "zookeeper://h/a", "zookeeper://h:x", "zookeeper://h:1/a//b"] {
            assert!(matches!(ZkUrl::parse(bad), Err(StoreError::Unavailable(_))), "{bad}");
        }
    }

    #[test]
    fn maps_errors() {
        assert!(matches!(map_error("/a", zk::Error::NoNode), StoreError::NoNode(p) if p == "/a"));
        assert!(matches!(map_error("/a", zk::Error::NodeExists), StoreError::NodeExists(_)));
        assert!(matches!(map_error("/a", zk::Error::BadVersion), StoreError::BadVersion(_)));
        assert!(matches!(map_error("/a", zk::Error::NotEmpty), StoreError::NotEmpty(_)));
        assert!(matches!(map_error("/a", zk::Error::ConnectionLoss), StoreError::Unavailable(_)));
        assert!(matches!(map_error("/a", zk::Error::SessionExpired), StoreError::Unavailable(_)));
        assert!(matches!(map_error("/a", zk::Error::ClientClosed), StoreError::Unavailable(_)));
    }

    #[test]
    fn connect_to_nothing_is_unavailable() {
        // Nothing listens on port 1; the client retries until the (short) deadline.
        let e = ZkStore::connect("zookeeper://127.0.0.1:1/x", 500).err().expect("no server");
        assert!(matches!(e, StoreError::Unavailable(_)), "{e}");
    }
}
