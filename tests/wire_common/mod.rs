//! The real `spate` binary for wire tests: a broker on a free port with its own data
//! directory and log, started with the given flags, and connections to it through
//! Spate's own blocking client. Its log's tail is printed when a test fails.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spate::client::Connection;

pub const spate: &str = env!("CARGO_BIN_EXE_spate");
pub const broker_start_ms_max: u64 = 15_000;

pub struct Broker {
    pub child: Child,
    pub bootstrap: String,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_log(self.dir.path());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(bootstrap: &str, dir: &std::path::Path, args: &[String]) -> Child {
    Command::new(spate)
        .args(["serve", "--listen", bootstrap, "--metrics-listen", &format!("127.0.0.1:{}", free_port())])
        .args(args)
        .arg("--data-dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(log_file(dir))
        .spawn()
        .unwrap()
}

fn log_file(dir: &std::path::Path) -> std::fs::File {
    std::fs::OpenOptions::new().create(true).append(true).open(dir.join("broker.log")).unwrap()
}

fn print_log(dir: &std::path::Path) {
    if let Ok(text) = std::fs::read_to_string(dir.join("broker.log")) {
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        eprintln!(
            "----- broker log {} (last lines):\n{}",
            dir.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

fn wait_up(b: &mut Broker) -> bool {
    let started = Instant::now();
    while TcpStream::connect(&b.bootstrap).is_err() {
        if b.child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(started.elapsed() < Duration::from_millis(broker_start_ms_max), "broker did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    b.child.try_wait().unwrap().is_none()
}

/// A broker started with `args` (after `serve --listen --metrics-listen`), retried on a
/// new port when its port was taken meanwhile.
pub fn start_broker(args: &[&str]) -> Broker {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let bootstrap = format!("127.0.0.1:{}", free_port());
        let child = spawn(&bootstrap, dir.path(), &args);
        let mut b = Broker { child, bootstrap, dir, args: args.clone() };
        if wait_up(&mut b) {
            return b;
        }
    }
    panic!("broker did not start");
}

impl Broker {
    pub fn kill9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(&self.bootstrap, self.dir.path(), &self.args);
        assert!(wait_up(self), "broker did not restart");
    }

    /// A connection, retried while the broker starts (its startup checks of the port can
    /// accept a connection before its shards listen).
    pub fn conn(&self) -> Connection {
        let started = Instant::now();
        loop {
            match Connection::open(&self.bootstrap, Duration::from_secs(30), "wire-test") {
                Ok(c) => return c,
                Err(e) if started.elapsed() > Duration::from_millis(broker_start_ms_max) => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    pub fn create_topic(&self, name: &str, partitions: i32) {
        let mut client = spate::client::Client::connect(spate::client::ClientConfig::new(&self.bootstrap)).unwrap();
        client.create_topic(name, partitions, 1, &[]).unwrap();
    }
}
