//! Producer-id blocks, as Kafka's ZooKeeper mode keeps them (`ProducerIdBlockZNode`,
//! `ZkProducerIdManager`): the active coordinator reserves `producer_id_block_size_max`
//! (1000) ids at a time by rewriting `/latest_producer_id_block`, conditionally on the
//! version it read, then hands them out from memory. A coordinator that restarts or
//! takes over reserves a fresh block, so an id is never issued twice (ids of a block
//! not used up are skipped, as in Kafka).
//!
//! `/latest_producer_id_block`, Kafka's JSON (the numbers are strings; `block_end` is
//! the last id of the block, inclusive):
//!
//! ```text
//! {"version":1,"broker":1,"block_start":"0","block_end":"999"}
//! ```
//!
//! Pure: the registry reads and writes the znode.

use serde::{Deserialize, Serialize};

use crate::model::{limits, ProducerId};

/// The znode (Kafka's `ProducerIdBlockZNode.path`).
pub const LATEST_PRODUCER_ID_BLOCK: &str = "/latest_producer_id_block";
pub const PRODUCER_ID_BLOCK_DOC_VERSION: i64 = 1;

/// One reserved block of ids, `start..=end`, and the broker that reserved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdBlock {
    pub broker: i32,
    pub start: i64,
    pub end: i64,
}

#[derive(Serialize, Deserialize)]
struct BlockDoc {
    version: i64,
    broker: i32,
    block_start: String,
    block_end: String,
}

impl ProducerIdBlock {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&BlockDoc {
            version: PRODUCER_ID_BLOCK_DOC_VERSION,
            broker: self.broker,
            block_start: self.start.to_string(),
            block_end: self.end.to_string(),
        })
        .expect("plain JSON")
    }

    /// Parse the znode's data (untrusted: a bad document is an error).
    pub fn decode(bytes: &[u8]) -> Result<ProducerIdBlock, String> {
        let d: BlockDoc = serde_json::from_slice(bytes).map_err(|e| format!("latest_producer_id_block: {e}"))?;
        if d.version != PRODUCER_ID_BLOCK_DOC_VERSION {
            return Err(format!("latest_producer_id_block: version {}", d.version));
        }
        let start: i64 = d.block_start.parse().map_err(|_| format!("block_start {:?}", d.block_start))?;
        let end: i64 = d.block_end.parse().map_err(|_| format!("block_end {:?}", d.block_end))?;
        if start < 0 || end < start {
            return Err(format!("latest_producer_id_block: block {start}..={end}"));
        }
        Ok(ProducerIdBlock { broker: d.broker, start, end })
    }

    /// The block after `previous` (the first block starts at 0), reserved by `broker`.
    /// None when the id space is exhausted.
    pub fn next_after(previous: Option<&ProducerIdBlock>, broker: i32) -> Option<ProducerIdBlock> {
        let start = match previous {
            None => 0,
            Some(p) => p.end.checked_add(1)?,
        };
        let end = start.checked_add(limits::producer_id_block_size_max - 1)?;
        Some(ProducerIdBlock { broker, start, end })
    }
}

/// Hands out the ids of the current block, in order.
#[derive(Debug, Default)]
pub struct ProducerIdAllocator {
    block: Option<ProducerIdBlock>,
    next: i64,
}

impl ProducerIdAllocator {
    /// The next id, or None when a new block must be reserved first (`install`).
    pub fn next_id(&mut self) -> Option<ProducerId> {
        let block = self.block?;
        if self.next > block.end {
            return None;
        }
        let id = self.next;
        self.next += 1;
        assert!(id >= block.start && id <= block.end);
        Some(ProducerId(id))
    }

    /// Use a freshly reserved block.
    pub fn install(&mut self, block: ProducerIdBlock) {
        if let Some(old) = self.block {
            assert!(block.start > old.end, "producer id blocks go forward: {old:?} then {block:?}");
        }
        self.block = Some(block);
        self.next = block.start;
    }

    /// The last id of the current block (ids above it were never issued by this
    /// allocator's blocks so far).
    pub fn block_end(&self) -> Option<i64> {
        self.block.map(|b| b.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_document_is_kafkas() {
        let b = ProducerIdBlock { broker: 2, start: 1000, end: 1999 };
        assert_eq!(
            String::from_utf8(b.encode()).unwrap(),
            r#"{"version":1,"broker":2,"block_start":"1000","block_end":"1999"}"#
        );
        assert_eq!(ProducerIdBlock::decode(&b.encode()), Ok(b));
        // As Kafka's ZkProducerIdManager writes it.
        let kafka = br#"{"version":1,"broker":0,"block_start":"0","block_end":"999"}"#;
        assert_eq!(ProducerIdBlock::decode(kafka), Ok(ProducerIdBlock { broker: 0, start: 0, end: 999 }));
        for bad in [&b"{}"[..], b"null", br#"{"version":1,"broker":0,"block_start":"5","block_end":"4"}"#, b"\xff"] {
            assert!(ProducerIdBlock::decode(bad).is_err());
        }
    }

    #[test]
    fn blocks_follow_each_other_and_ids_never_repeat() {
        let first = ProducerIdBlock::next_after(None, 1).unwrap();
        assert_eq!((first.start, first.end), (0, 999));
        let second = ProducerIdBlock::next_after(Some(&first), 2).unwrap();
        assert_eq!((second.start, second.end), (1000, 1999));
        let mut a = ProducerIdAllocator::default();
        assert_eq!(a.next_id(), None);
        a.install(first);
        let ids: Vec<i64> = std::iter::from_fn(|| a.next_id()).map(|p| p.0).collect();
        assert_eq!(ids, (0..1000).collect::<Vec<_>>());
        a.install(second);
        assert_eq!(a.next_id(), Some(ProducerId(1000)));
        let last = ProducerIdBlock { broker: 1, start: i64::MAX - 10, end: i64::MAX };
        assert_eq!(ProducerIdBlock::next_after(Some(&last), 1), None);
    }
}
