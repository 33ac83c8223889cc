//! Moving partitions' log start offsets (DeleteRecords on the leader; a follower taking
//! its leader's log start from a fetch answer). Owned by the partition's owner shard.
//!
//! A move is asked for (`request_log_start`), then done in rounds by the runtime: it
//! takes the moves asked for (`take_log_start_moves`), writes each partition's
//! `spate-log-start-offset` checkpoint and fsyncs it off the data core, then hands the
//! outcome back (`complete_log_start_moves`), which applies the move to the log (readers
//! below it get OFFSET_OUT_OF_RANGE from then on) and answers whoever waits with the new
//! log start. So an answer is never given before the new start is durable, and readers
//! never see a start that a crash could take back.
//!
//! DeleteRecords answers after a second step, as Kafka's DelayedDeleteRecords: once the
//! partition's low watermark (`LeaderState::low_watermark`: the smallest log start over
//! the leader and its followers on live brokers, each follower's as its last fetch said)
//! reaches the new log start (`await_low_watermark`). It is checked again after every
//! follower fetch of a partition with waits, and on every housekeeping tick (a follower's
//! broker died, or the leadership moved: then NOT_LEADER_OR_FOLLOWER). The handler bounds
//! the wait by the request's timeout.
//!
//! Invariants: one round at a time per shard, so writes of one partition's checkpoint
//! never overlap; a round writes at least the log start already applied, so the file
//! never goes back; a move names the log's `instance`, so a move for a log deleted (and
//! maybe created again) meanwhile is dropped.

use std::collections::HashMap;
use std::path::PathBuf;

use futures::channel::oneshot;

use crate::log::LogError;
use crate::model::{Offset, TopicPartition};

use super::{PartitionError, Shard};

/// Resolves with the log start after the move (Err: the partition went away, or its log
/// offline).
pub type LogStartWait = oneshot::Receiver<Result<Offset, PartitionError>>;
type LogStartWaiter = oneshot::Sender<Result<Offset, PartitionError>>;

/// Answer every waiter: the new log start, or an error made for each.
fn answer(waiters: Vec<LogStartWaiter>, outcome: Result<Offset, &dyn Fn() -> PartitionError>) {
    for w in waiters {
        let _ = w.send(match &outcome {
            Ok(offset) => Ok(*offset),
            Err(error) => Err(error()),
        });
    }
}

/// DeleteRecords answers waiting for the low watermark to reach an offset, by partition.
#[derive(Default)]
pub(super) struct LowWatermarkWaits {
    waits: HashMap<TopicPartition, Vec<(i64, LogStartWaiter)>>,
}

/// Moves asked for and not taken by a round yet, by partition.
#[derive(Default)]
pub(super) struct LogStartMoves {
    asked: HashMap<TopicPartition, Asked>,
}

struct Asked {
    offset: i64,
    waiters: Vec<LogStartWaiter>,
}

/// One partition's move in a round: write `offset` to `dir`'s checkpoint, then apply.
pub struct LogStartMove {
    pub tp: TopicPartition,
    pub dir: PathBuf,
    pub offset: Offset,
    log: u64,
    waiters: Vec<LogStartWaiter>,
}

impl Shard {
    /// Ask for `tp`'s log start to move up to `offset` (already checked against the
    /// high watermark by the caller); `waiter` is answered after the move, or at once
    /// when the log already starts there or later.
    pub(super) fn request_log_start(&mut self, tp: &TopicPartition, offset: Offset, waiter: Option<LogStartWaiter>) {
        let Some(p) = self.partitions.get(tp) else { return };
        let current = p.log.log_start_offset();
        let asked = self.log_start_moves.asked.get(tp).map_or(i64::MIN, |a| a.offset);
        if offset <= current && asked == i64::MIN {
            answer(waiter.into_iter().collect(), Ok(current));
            return;
        }
        let entry = self
            .log_start_moves
            .asked
            .entry(tp.clone())
            .or_insert_with(|| Asked { offset: i64::MIN, waiters: Vec::new() });
        entry.offset = entry.offset.max(offset.0);
        entry.waiters.extend(waiter);
    }

    /// DeleteRecords on the leader: move the log start to `offset` (-1: the high
    /// watermark). Above the high watermark, or negative, is OFFSET_OUT_OF_RANGE.
    pub(super) fn delete_records(&mut self, tp: &TopicPartition, offset: i64) -> Result<LogStartWait, PartitionError> {
        let p = self.partitions.get(tp).ok_or_else(|| PartitionError::NotLeader(tp.clone()))?;
        let high_watermark = super::replica::high_watermark(p).0;
        let target = if offset == -1 { high_watermark } else { offset };
        if target < 0 || target > high_watermark {
            return Err(PartitionError::Log(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: p.log.log_start_offset().0,
                log_end_offset: high_watermark,
            }));
        }
        let (tx, rx) = oneshot::channel();
        self.request_log_start(tp, Offset(target), Some(tx));
        Ok(rx)
    }

    /// `tp`'s low watermark if this broker leads it (see `LeaderState::low_watermark`).
    fn low_watermark(&self, tp: &TopicPartition) -> Option<i64> {
        let p = self.partitions.get(tp)?;
        let leader = p.replica.leader_state()?;
        let live = |b| self.view.broker_info(b).is_some_and(|info| info.is_live());
        Some(leader.low_watermark(p.log.log_start_offset().0, live))
    }

    /// DeleteRecords, second step: resolves with `tp`'s low watermark once it reaches
    /// `offset` (at once if it has), or with NOT_LEADER_OR_FOLLOWER if the leadership
    /// goes first.
    pub(super) fn await_low_watermark(&mut self, tp: &TopicPartition, offset: i64) -> LogStartWait {
        let (tx, rx) = oneshot::channel();
        self.low_watermark_waits.waits.entry(tp.clone()).or_default().push((offset, tx));
        self.check_low_watermarks(Some(tp));
        rx
    }

    /// Answer the DeleteRecords waits that are settled: of `tp`, or of every partition.
    /// Waits whose requests are gone (timed out) are dropped.
    pub(super) fn check_low_watermarks(&mut self, tp: Option<&TopicPartition>) {
        if self.low_watermark_waits.waits.is_empty() {
            return;
        }
        let tps: Vec<TopicPartition> = match tp {
            Some(tp) if self.low_watermark_waits.waits.contains_key(tp) => vec![tp.clone()],
            Some(_) => return,
            None => self.low_watermark_waits.waits.keys().cloned().collect(),
        };
        for tp in tps {
            let low = self.low_watermark(&tp);
            let Some(waits) = self.low_watermark_waits.waits.get_mut(&tp) else { continue };
            waits.retain(|(_, w)| !w.is_canceled());
            let mut i = 0;
            while i < waits.len() {
                let settled = match low {
                    None => Some(Err(PartitionError::NotLeader(tp.clone()))),
                    Some(low) if low >= waits[i].0 => Some(Ok(Offset(low))),
                    Some(_) => None,
                };
                match settled {
                    Some(outcome) => {
                        let _ = waits.swap_remove(i).1.send(outcome);
                    }
                    None => i += 1,
                }
            }
            if waits.is_empty() {
                self.low_watermark_waits.waits.remove(&tp);
            }
        }
    }

    /// A follower learned its leader's log start from a fetch answer: its own moves up
    /// to it (never past its own log end), as Kafka's follower does.
    pub fn follower_log_start(&mut self, tp: &TopicPartition, leader_log_start: i64) -> bool {
        let Some(p) = self.partitions.get(tp) else { return false };
        let target = leader_log_start.min(p.log.log_end_offset().0);
        if target <= p.log.log_start_offset().0 {
            return false;
        }
        self.request_log_start(tp, Offset(target), None);
        true
    }

    /// Whether a round has work.
    pub fn has_log_start_moves(&self) -> bool {
        !self.log_start_moves.asked.is_empty()
    }

    /// A round, step 1: the moves asked for, each at least the log start already
    /// applied. Moves of partitions gone (or offline) are answered here.
    pub fn take_log_start_moves(&mut self) -> Vec<LogStartMove> {
        let mut moves = Vec::new();
        for (tp, asked) in std::mem::take(&mut self.log_start_moves.asked) {
            let Some(p) = self.partitions.get(&tp) else {
                answer(asked.waiters, Err(&|| PartitionError::NotLeader(tp.clone())));
                continue;
            };
            if let Some(reason) = p.log.offline_reason() {
                answer(asked.waiters, Err(&|| PartitionError::Log(LogError::Offline(reason.to_string()))));
                continue;
            }
            let current = p.log.log_start_offset().0;
            let offset = asked.offset.max(current).min(p.log.log_end_offset().0);
            if offset <= current {
                answer(asked.waiters, Ok(Offset(current)));
                continue;
            }
            moves.push(LogStartMove {
                dir: p.log.dir().to_path_buf(),
                offset: Offset(offset),
                log: p.log.instance(),
                waiters: asked.waiters,
                tp,
            });
        }
        moves
    }

    /// A round, step 3 (step 2, `write_log_start_checkpoint` for each move, ran off the
    /// data core): apply each move whose checkpoint is durable and answer its waiters.
    /// A failed write takes the log offline, as a failed fsync does.
    pub fn complete_log_start_moves(&mut self, done: Vec<(LogStartMove, std::io::Result<()>)>) {
        for (m, result) in done {
            let outcome: Result<Offset, String> =
                match self.partitions.get_mut(&m.tp).filter(|p| p.log.instance() == m.log) {
                    None => {
                        answer(m.waiters, Err(&|| PartitionError::NotLeader(m.tp.clone())));
                        continue;
                    }
                    Some(p) => match result {
                        Err(e) => Err(p.log.log_start_checkpoint_failed(&e).to_string()),
                        // Never past the log end (a follower may have truncated meanwhile).
                        Ok(()) => match p.log.advance_log_start_offset(m.offset.min(p.log.log_end_offset())) {
                            Ok(deleted) => {
                                tracing::info!(partition = %m.tp, log_start_offset = %p.log.log_start_offset(),
                                segments_deleted = deleted, "log start offset moved");
                                Ok(p.log.log_start_offset())
                            }
                            Err(e) => Err(e.to_string()),
                        },
                    },
                };
            match outcome {
                Ok(offset) => answer(m.waiters, Ok(offset)),
                Err(reason) => answer(m.waiters, Err(&|| PartitionError::Log(LogError::Offline(reason.clone())))),
            }
        }
    }
}
