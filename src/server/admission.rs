//! Connection admission, shared by every shard: how many connections the broker holds
//! (`max.connections`) and per client IP (`max.connections.per.ip`), and how many bytes
//! requests being read or handled hold (`queued.max.request.bytes`).
//!
//! Invariants: `connections` is the number of live `ConnectionPermit`s; a client IP's
//! count is the number of its live permits (the entry goes when it reaches 0);
//! `queued_bytes` is the sum of live `ByteReservation`s and never exceeds
//! `queued_bytes_max`. All counts are released on drop, so a connection that ends any
//! way (EOF, error, cancellation) gives back what it held.
//!
//! Owner: one `Arc<Admission>` per process; the accept loops and connections of every
//! shard use it. Atomics for the byte budget (taken per request read); a mutex for
//! the per-IP map (taken per accepted and closed connection only, never per request).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max.connections` reached.
    Total,
    /// `max.connections.per.ip` reached for this client's IP.
    PerIp,
}

pub struct Admission {
    connections_max: usize,
    connections_per_ip_max: usize,
    queued_bytes_max: usize,
    connections: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    queued_bytes: AtomicUsize,
}

impl Admission {
    pub fn new(connections_max: usize, connections_per_ip_max: usize, queued_bytes_max: usize) -> Arc<Self> {
        assert!(connections_max > 0 && connections_per_ip_max > 0 && queued_bytes_max > 0);
        Arc::new(Self {
            connections_max,
            connections_per_ip_max,
            queued_bytes_max,
            connections: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
            queued_bytes: AtomicUsize::new(0),
        })
    }

    /// Admit a connection from `ip`, or say which cap refuses it.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionPermit, Refusal> {
        let mut per_ip = self.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if self.connections.load(Ordering::Acquire) >= self.connections_max {
            return Err(Refusal::Total);
        }
        let count = per_ip.entry(ip).or_insert(0);
        if *count >= self.connections_per_ip_max {
            if *count == 0 {
                per_ip.remove(&ip);
            }
            return Err(Refusal::PerIp);
        }
        *count += 1;
        // Under the mutex: admissions cannot race past the total.
        let before = self.connections.fetch_add(1, Ordering::AcqRel);
        assert!(before < self.connections_max, "connections {before} past max.connections");
        Ok(ConnectionPermit { admission: self.clone(), ip })
    }

    /// Take `bytes` of the request byte budget, or None when that would pass
    /// `queued.max.request.bytes` (the caller stops reading and tries again later).
    pub fn try_reserve(self: &Arc<Self>, bytes: usize) -> Option<ByteReservation> {
        let mut used = self.queued_bytes.load(Ordering::Acquire);
        loop {
            let next = used.checked_add(bytes).filter(|n| *n <= self.queued_bytes_max)?;
            match self.queued_bytes.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(ByteReservation { admission: self.clone(), bytes }),
                Err(now) => used = now,
            }
        }
    }

    pub fn queued_bytes_max(&self) -> usize {
        self.queued_bytes_max
    }

    /// (connections, bytes reserved) now.
    #[cfg(test)]
    pub fn usage(&self) -> (usize, usize) {
        (self.connections.load(Ordering::Acquire), self.queued_bytes.load(Ordering::Acquire))
    }
}

/// A connection's place under the caps; given back on drop.
pub struct ConnectionPermit {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut per_ip = self.admission.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        match per_ip.get_mut(&self.ip) {
            Some(n) if *n > 1 => *n -= 1,
            Some(_) => {
                per_ip.remove(&self.ip);
            }
            None => tracing::error!(ip = %self.ip, "connection permit of an IP with no count"),
        }
        let before = self.admission.connections.fetch_sub(1, Ordering::AcqRel);
        assert!(before > 0, "more connection permits released than taken");
    }
}

/// Bytes of the request budget a request holds; given back on drop.
pub struct ByteReservation {
    admission: Arc<Admission>,
    bytes: usize,
}

impl ByteReservation {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for ByteReservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let before = self.admission.queued_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
            assert!(before >= self.bytes, "more request bytes released than reserved");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_and_drops_give_back() {
        let a = Admission::new(3, 2, 100);
        let ip1: IpAddr = "10.0.0.1".parse().unwrap();
        let ip2: IpAddr = "10.0.0.2".parse().unwrap();
        let p1 = a.admit(ip1).unwrap();
        let p2 = a.admit(ip1).unwrap();
        assert_eq!(a.admit(ip1).err(), Some(Refusal::PerIp));
        let p3 = a.admit(ip2).unwrap();
        assert_eq!(a.admit(ip2).err(), Some(Refusal::Total));
        drop(p1);
        let p4 = a.admit(ip2).unwrap();
        assert_eq!(a.usage().0, 3);
        drop((p2, p3, p4));
        assert_eq!(a.usage().0, 0);
        assert!(a.per_ip.lock().unwrap().is_empty());

        let r = a.try_reserve(60).unwrap();
        assert!(a.try_reserve(41).is_none());
        let r2 = a.try_reserve(40).unwrap();
        assert_eq!((r.bytes() + r2.bytes(), a.usage().1), (100, 100));
        assert!(a.try_reserve(1).is_none());
        drop(r);
        assert_eq!(a.usage().1, 40);
        drop(r2);
        assert_eq!(a.usage().1, 0);
        assert!(a.try_reserve(usize::MAX).is_none());
    }
}
