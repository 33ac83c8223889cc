//! `ZkStore` against a real Apache ZooKeeper server (Debian's `zookeeper` package), which
//! each test starts itself, without systemd, on a free port with a temp data dir:
//!
//!   java -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar \
//!       org.apache.zookeeper.server.ZooKeeperServerMain <tmp>/zoo.cfg
//!
//! (zookeeper.jar's manifest Class-Path names its dependencies in /usr/share/java.) Without
//! java or the jar the tests FAIL, saying so: scripts/install-deps installs the package.

#![allow(non_upper_case_globals)]

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spate::coordinator::store::{check_store_semantics, CreateMode, MetaStore, StoreError};
use spate::coordinator::zookeeper::ZkStore;

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const ZOOKEEPER_CLASSPATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar";
/// Server tick; ZooKeeper grants session timeouts between 2 and 20 ticks.
const tick_ms: u64 = 500;
const server_start_ms_max: u64 = 60_000;
/// Long enough that an ephemeral node vanishing well before it proves the session was
/// closed, not expired.
const session_timeout_ms: u64 = 10_000;

/// A standalone ZooKeeper server; killed on drop.
struct ZkServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl ZkServer {
    fn start() -> ZkServer {
        assert!(
            Path::new(ZOOKEEPER_JAR).exists(),
            "ZooKeeper is not installed ({ZOOKEEPER_JAR} missing): run scripts/install-deps \
             (apt-get install -y zookeeper)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let cfg = dir.path().join("zoo.cfg");
        std::fs::write(
            &cfg,
            format!(
                "tickTime={tick_ms}\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\nmaxClientCnxns=0\n",
                data.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let child = Command::new("java")
            .arg("-Xmx256m")
            .arg("-cp")
            .arg(ZOOKEEPER_CLASSPATH)
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run java for ZooKeeper ({e}): run scripts/install-deps"));
        let mut server = ZkServer { child, port, dir };
        server.wait_listening();
        server
    }

    fn wait_listening(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(server_start_ms_max);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("ZooKeeper exited with {status} before listening:\n{}", self.log());
            }
            if TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "ZooKeeper not listening after {server_start_ms_max} ms:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self, chroot: &str) -> String {
        format!("zookeeper://127.0.0.1:{}{chroot}", self.port)
    }

    fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.path().join("server.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port()
}

fn connect(server: &ZkServer, chroot: &str) -> ZkStore {
    connect_with_timeout(server, chroot, session_timeout_ms)
}

fn connect_with_timeout(server: &ZkServer, chroot: &str, timeout_ms: u64) -> ZkStore {
    ZkStore::connect(&server.url(chroot), timeout_ms).unwrap_or_else(|e| panic!("connect: {e}\n{}", server.log()))
}

#[test]
fn zk_store_has_the_store_semantics() {
    let server = ZkServer::start();
    let store = connect(&server, "/spate/semantics");
    assert!(store.session_alive() && store.connected());
    assert!(store.session_timeout_ms() <= session_timeout_ms);
    check_store_semantics(&store);

    // The chroot was created with its ancestors, and confines the store.
    let root = connect(&server, "");
    assert_eq!(root.children("/spate").unwrap(), vec!["semantics".to_string()]);
    assert!(root.get("/spate/semantics/brokers/ids/1").unwrap().is_some());
    assert!(root.get("/brokers").unwrap().is_none());
    // Deleting the chroot's root is refused, not done.
    assert!(store.delete("/", None).is_err());
    // An ephemeral node cannot have children (as in LocalStore).
    assert!(matches!(store.create("/brokers/ids/1/x", b"", CreateMode::Persistent), Err(StoreError::BadPath(_))));
}

#[test]
fn ephemeral_nodes_live_with_the_session() {
    let server = ZkServer::start();
    let owner = connect(&server, "/eph");
    let observer = connect(&server, "/eph");
    owner.create_all("/brokers/ids/7", b"{\"host\":\"h\"}", CreateMode::Ephemeral).unwrap();
    owner.create("/controller", b"{\"brokerid\":7}", CreateMode::Ephemeral).unwrap();
    assert_eq!(observer.get("/brokers/ids/7").unwrap().unwrap().data, b"{\"host\":\"h\"}");
    assert!(matches!(
        observer.create("/controller", b"{\"brokerid\":8}", CreateMode::Ephemeral),
        Err(StoreError::NodeExists(_))
    ));
    // While the owner lives, a standby's wait times out with the node still there.
    assert!(!observer.wait_deleted("/controller", Duration::from_millis(300)).unwrap());

    // A standby waits on /controller in another thread while the owner goes away.
    let started = Instant::now();
    let waited = std::thread::scope(|s| {
        let waiter = s.spawn(|| observer.wait_deleted("/controller", Duration::from_millis(session_timeout_ms * 3)));
        std::thread::sleep(Duration::from_millis(200));
        drop(owner);
        waiter.join().unwrap()
    });
    assert!(waited.unwrap(), "/controller was not deleted");
    let vanished_ms = started.elapsed().as_millis() as u64;
    assert!(
        vanished_ms < session_timeout_ms / 2,
        "ephemeral vanished after {vanished_ms} ms: the session was not closed on drop"
    );
    assert!(observer.get("/brokers/ids/7").unwrap().is_none());
    assert!(observer.children("/brokers/ids").unwrap().is_empty());
    // The standby takes over.
    observer.create("/controller", b"{\"brokerid\":8}", CreateMode::Ephemeral).unwrap();
    assert!(observer.wait_deleted("/nothing/here", Duration::from_millis(10)).unwrap());
}

#[test]
fn stores_see_each_others_writes_and_fail_unavailable_without_server() {
    let mut server = ZkServer::start();
    let a = connect(&server, "/shared");
    let b = connect(&server, "/shared");
    let other = connect(&server, "/elsewhere");
    a.put("/brokers/topics/orders", b"{\"version\":2,\"partitions\":{\"0\":[1]}}").unwrap();
    let seen = b.get("/brokers/topics/orders").unwrap().unwrap();
    assert_eq!(seen.version, 0);
    assert_eq!(b.set("/brokers/topics/orders", b"{\"version\":2}", Some(0)).unwrap(), 1);
    assert!(matches!(a.set("/brokers/topics/orders", b"{}", Some(0)), Err(StoreError::BadVersion(_))));
    assert_eq!(a.get("/brokers/topics/orders").unwrap().unwrap().data, b"{\"version\":2}");
    b.create("/brokers/topics/orders/partitions", b"", CreateMode::Persistent).unwrap();
    assert_eq!(a.children("/brokers/topics/orders").unwrap(), vec!["partitions".to_string()]);
    assert!(other.get("/brokers/topics/orders").unwrap().is_none(), "chroots must not share nodes");
    b.delete_all("/brokers/topics/orders").unwrap();
    assert!(a.get("/brokers/topics/orders").unwrap().is_none());

    drop((a, b, other));

    // Without the server: Unavailable, not a hang and not a wrong answer (a short session,
    // so that this fails fast).
    let short_timeout_ms = 4 * tick_ms;
    let short = connect_with_timeout(&server, "/shared", short_timeout_ms);
    assert!(short.session_alive());
    server.kill();
    let started = Instant::now();
    match short.get("/brokers") {
        Err(StoreError::Unavailable(_)) => {}
        other => panic!("expected Unavailable without a server, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(took < Duration::from_millis(short_timeout_ms * 3), "took {took:?}");
    assert!(!short.connected());
}
