//! The registry's owner: one thread (`spate-metadata`) holds the `Registry` and runs
//! every change to it (admin requests, the controller's tick, the coordinator link's
//! snapshots and takeovers), with all the store, ZooKeeper and snapshot-cache I/O they
//! do. After each change it publishes a new immutable `ClusterView`; readers load it
//! without a lock (`arc_swap`) and notice changes through a generation counter (one
//! atomic load).
//!
//! Writers send a closure and await the answer, which comes only after the view that
//! holds their change is published: a handler that created a topic sees it at once.
//! Data cores await that answer as a future, so a ZooKeeper round trip or an fsync
//! never blocks them; other threads (the link, startup, shutdown) may block on it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use arc_swap::ArcSwap;
use futures::channel::oneshot;

use super::registry::Registry;
use super::view::ClusterView;

/// A change to run on the owner thread; returns what to run once its view is published.
type Job = Box<dyn FnOnce(&mut Registry) -> Box<dyn FnOnce() + Send> + Send>;

/// The published view and the way to the owner thread.
pub struct Metadata {
    jobs: mpsc::Sender<Job>,
    view: ArcSwap<ClusterView>,
    /// The published view's generation, stored after the view: a reader that sees it
    /// move loads the new view.
    generation: AtomicU64,
}

impl Metadata {
    /// Start the owner thread with `registry`.
    pub fn start(registry: Registry) -> std::io::Result<Arc<Metadata>> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let view = registry.view();
        let metadata = Arc::new(Metadata {
            jobs,
            generation: AtomicU64::new(view.generation()),
            view: ArcSwap::from_pointee(view),
        });
        let published = Arc::downgrade(&metadata);
        std::thread::Builder::new().name("spate-metadata".into()).spawn(move || {
            let mut registry = registry;
            // Ends when every `Metadata` handle is gone (the sender with it).
            while let Ok(job) = rx.recv() {
                // A job that panics (a bug) drops its answer, which its caller reports;
                // the registry stays served for everyone else.
                let run = std::panic::AssertUnwindSafe(|| job(&mut registry));
                let Ok(done) = std::panic::catch_unwind(run) else {
                    tracing::error!("a metadata change panicked; its caller gets no answer");
                    continue;
                };
                if let Some(m) = published.upgrade() {
                    m.publish(&registry);
                }
                done();
            }
        })?;
        Ok(metadata)
    }

    /// The current view. Cheap; but each call touches the shared reference count, so
    /// data cores keep the `Arc` they hold until `generation` moves.
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.load_full()
    }

    /// The generation of the current view.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Run `f` on the registry, on the owner thread; resolves after the view holding the
    /// change is published. For data cores: awaiting never blocks the core.
    pub async fn write<R: Send + 'static>(&self, f: impl FnOnce(&mut Registry) -> R + Send + 'static) -> R {
        let (tx, rx) = oneshot::channel();
        self.send(f, tx);
        rx.await.expect("the metadata owner thread ended")
    }

    /// `write` for threads that may block (the coordinator link, startup, shutdown).
    /// Never from a data core, nor from the owner thread itself.
    pub fn write_blocking<R: Send + 'static>(&self, f: impl FnOnce(&mut Registry) -> R + Send + 'static) -> R {
        let (tx, rx) = oneshot::channel();
        self.send(f, tx);
        futures::executor::block_on(rx).expect("the metadata owner thread ended")
    }

    fn send<R: Send + 'static>(&self, f: impl FnOnce(&mut Registry) -> R + Send + 'static, tx: oneshot::Sender<R>) {
        let job: Job = Box::new(move |registry| {
            let result = f(registry);
            Box::new(move || {
                let _ = tx.send(result);
            })
        });
        // The owner thread lives as long as this handle; a send fails only if a job
        // panicked and took it down, and then the caller's receiver reports it.
        let _ = self.jobs.send(job);
    }

    /// Publish the registry's view if it changed since the last one.
    fn publish(&self, registry: &Registry) {
        let generation = registry.generation();
        if generation != self.generation.load(Ordering::Acquire) {
            self.view.store(Arc::new(registry.view()));
            self.generation.store(generation, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TopicConfig;
    use crate::coordinator::controller::Endpoint;
    use crate::coordinator::registry::LocalBroker;
    use crate::coordinator::store::LocalStore;

    /// An owner on a single-broker registry in a fresh embedded store.
    fn started() -> (tempfile::TempDir, Arc<Metadata>) {
        let dir = tempfile::tempdir().unwrap();
        let broker = LocalBroker {
            id: crate::model::NodeId(1),
            endpoint: Endpoint::new("127.0.0.1", 9092),
            rack: None,
            shards: 1,
        };
        let registry = Registry::open(Box::new(LocalStore::open(dir.path()).unwrap()), broker, 1_000).unwrap();
        (dir, Metadata::start(registry).unwrap())
    }

    #[test]
    fn a_write_is_visible_in_the_view_when_it_returns_and_old_views_never_change() {
        let (_dir, metadata) = started();
        let before = metadata.view();
        let generation = metadata.generation();
        assert!(before.get("orders").is_none());

        let created = metadata.write_blocking(|r| r.create("orders", 3, TopicConfig::default()));
        assert_eq!(created.unwrap().partitions, 3);
        let after = metadata.view();
        assert_eq!(after.get("orders").map(|m| m.partitions), Some(3));
        assert!(metadata.generation() > generation);
        assert_eq!(after.generation(), metadata.generation());
        assert!(before.get("orders").is_none(), "a published view is immutable");

        // A write that changes nothing publishes nothing.
        let unchanged = metadata.generation();
        assert!(metadata.write_blocking(|r| r.create("orders", 1, TopicConfig::default())).is_err());
        assert_eq!(metadata.generation(), unchanged);
        assert!(Arc::ptr_eq(&after, &metadata.view()));

        let removed = futures::executor::block_on(metadata.write(|r| r.delete("orders")));
        assert_eq!(removed.unwrap().partitions, 3);
        assert!(metadata.view().get("orders").is_none());
    }

    #[test]
    fn readers_never_wait_for_a_change_in_progress() {
        let (_dir, metadata) = started();
        // A change that stalls inside the owner (as a ZooKeeper round trip would) until
        // the test lets it go.
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let metadata = metadata.clone();
            std::thread::spawn(move || {
                metadata.write_blocking(move |r| {
                    entered_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    r.create("slow", 2, TopicConfig::default())
                })
            })
        };
        entered_rx.recv().unwrap();
        // The change is in progress: readers get the last published view at once.
        let generation = metadata.generation();
        for _ in 0..1000 {
            assert!(metadata.view().get("slow").is_none());
            assert_eq!(metadata.generation(), generation);
        }
        release_tx.send(()).unwrap();
        writer.join().unwrap().unwrap();
        assert_eq!(metadata.view().get("slow").map(|m| m.partitions), Some(2));
    }
}
