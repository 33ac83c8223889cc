//! Everything one shard's tasks share: its partitions, the mesh to the other shards,
//! the registry and the config. Lives on one core (`Rc`, never sent).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::{Arc, RwLock};

use futures::channel::oneshot;
use glommio::channels::channel_mesh::Senders;

use crate::config::BrokerConfig;
use crate::coordinator::registry::Registry;
use crate::model::{ShardId, TopicPartition};
use crate::shard::{owner_shard, PartitionError, PartitionOp, PartitionReply, Shard};

use super::metrics::Metrics;

/// A partition operation sent to its owner shard, with the way back.
pub struct ShardMessage {
    pub op: PartitionOp,
    pub reply: oneshot::Sender<Result<PartitionReply, PartitionError>>,
}

pub struct ShardContext {
    pub id: ShardId,
    pub nr_shards: usize,
    pub config: Arc<BrokerConfig>,
    pub registry: Arc<RwLock<Registry>>,
    pub shard: RefCell<Shard>,
    senders: Senders<ShardMessage>,
    pub metrics: Arc<Metrics>,
    pub cluster_id: String,
    /// Requests being handled on this shard's connections.
    pub in_flight: Cell<usize>,
    /// Set once shutdown began: connections stop reading new requests.
    pub stopping: Cell<bool>,
    flush_notify: RefCell<Option<oneshot::Sender<()>>>,
}

impl ShardContext {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: ShardId,
        nr_shards: usize,
        config: Arc<BrokerConfig>,
        registry: Arc<RwLock<Registry>>,
        shard: Shard,
        senders: Senders<ShardMessage>,
        metrics: Arc<Metrics>,
        cluster_id: String,
    ) -> Self {
        Self {
            id,
            nr_shards,
            config,
            registry,
            shard: RefCell::new(shard),
            senders,
            metrics,
            cluster_id,
            in_flight: Cell::new(0),
            stopping: Cell::new(false),
            flush_notify: RefCell::new(None),
        }
    }

    /// Run `op` on the partition's owner: here, or across the mesh.
    pub async fn call(&self, op: PartitionOp) -> Result<PartitionReply, PartitionError> {
        let owner = owner_shard(op.tp(), self.nr_shards);
        if owner == self.id {
            let result = self.shard.borrow_mut().execute(op);
            self.flush_wakeup();
            return result;
        }
        let tp = op.tp().clone();
        let (reply, rx) = oneshot::channel();
        if self
            .senders
            .send_to(owner.0, ShardMessage { op, reply })
            .await
            .is_err()
        {
            return Err(shard_gone(tp));
        }
        rx.await.unwrap_or_else(|_| Err(shard_gone(tp)))
    }

    /// Serve an operation another shard sent us.
    pub fn serve_remote(&self, msg: ShardMessage) {
        let result = self.shard.borrow_mut().execute(msg.op);
        self.flush_wakeup();
        let _ = msg.reply.send(result);
    }

    /// Tell the group-commit loop there may be work.
    pub fn flush_wakeup(&self) {
        if let Some(tx) = self.flush_notify.borrow_mut().take() {
            let _ = tx.send(());
        }
    }

    /// Group commit: while an fdatasync round runs on the blocking pool, new appends
    /// queue up and share the next round. Acks are released only after their round.
    pub async fn group_commit_loop(self: Rc<Self>) {
        loop {
            if !self.shard.borrow().has_flush_work() {
                let (tx, rx) = oneshot::channel();
                *self.flush_notify.borrow_mut() = Some(tx);
                let _ = rx.await;
                continue;
            }
            let batch = self.shard.borrow_mut().take_flush_batch();
            let started = std::time::Instant::now();
            let results = glommio::executor()
                .spawn_blocking(move || {
                    batch
                        .items
                        .into_iter()
                        .map(|(tp, handle)| {
                            let mut result = Ok(());
                            for f in &handle.files {
                                if let Err(e) = f.sync_data() {
                                    result = Err(e);
                                    break;
                                }
                            }
                            (tp, handle.upto, result)
                        })
                        .collect::<Vec<_>>()
                })
                .await;
            self.metrics.record_fsync(self.id, started.elapsed());
            self.shard.borrow_mut().complete_flush(results);
        }
    }
}

fn shard_gone(tp: TopicPartition) -> PartitionError {
    PartitionError::Log(crate::log::LogError::Offline(format!(
        "owner shard of {tp} is shutting down"
    )))
}
