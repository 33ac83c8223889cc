//! Property test of the transaction coordinator's machine (src/txn/coordinator.rs), alone:
//! random sequences of client requests (some from a fenced producer), write outcomes
//! (acknowledged or failed), markers written, and the clock, against what clients may
//! rely on:
//! 1. a producer older than the newest one handed out is refused (PRODUCER_FENCED);
//! 2. the producers handed out are strictly newer each time (id, then epoch);
//! 3. markers name exactly the partitions acknowledged into the transaction;
//! 4. a transaction whose commit was acknowledged completes as a commit, one whose
//!    abort was decided as an abort, and its markers say so;
//! 5. a transaction aborted to fence its producer (InitProducerId during it, or its
//!    timeout) has markers with an epoch newer than any that producer held;
//! 6. every state the coordinator reaches is allowed after the one before (also asserted
//!    inside the machine), and a record survives its own encoding;
//! 7. transaction version 2 (EndTxn v5, `end_txn_v2`, mixed with version 1 ends): every
//!    end hands out a newer producer and its markers carry an epoch newer than the one
//!    that ended; a retry of an end (the epoch before) gets the producer already handed out.

#[path = "proptest_config/mod.rs"]
mod proptest_config;

use std::collections::BTreeSet;

use proptest::prelude::*;
use spate::model::TopicPartition;
use spate::txn::coordinator::{
    Answer, Decision, Markers, ProducerIdAndEpoch, TxnCoordinator, TxnError, TxnState, TRANSACTION_MAX_TIMEOUT_MS,
};
use spate::txn::log_records;

const ID: &str = "tx";
const TIMEOUT_MS: i32 = 10_000;

#[derive(Debug, Clone)]
enum Op {
    Init { kip360: bool },
    Add { partitions: Vec<u8>, stale: bool },
    End { commit: bool, stale: bool, v2: bool },
    Ack { ok: bool },
    MarkersWritten,
    Tick(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<bool>().prop_map(|kip360| Op::Init { kip360 }),
        4 => (prop::collection::vec(0u8..6, 1..3), prop::bool::weighted(0.15))
            .prop_map(|(partitions, stale)| Op::Add { partitions, stale }),
        2 => (any::<bool>(), prop::bool::weighted(0.15), any::<bool>())
            .prop_map(|(commit, stale, v2)| Op::End { commit, stale, v2 }),
        5 => prop::bool::weighted(0.85).prop_map(|ok| Op::Ack { ok }),
        2 => Just(Op::MarkersWritten),
        1 => (0u16..6000).prop_map(Op::Tick),
    ]
}

/// What the test knows from the answers it got.
#[derive(Default)]
struct Seen {
    /// Every producer handed out, oldest first.
    producers: Vec<ProducerIdAndEpoch>,
    /// Partitions acknowledged into the open transaction.
    open: BTreeSet<TopicPartition>,
    /// The outcome decided for the open transaction (true = commit), once decided.
    decided: Option<bool>,
    /// The epoch an abort must fence beyond (the newest handed out when it was decided).
    fence_beyond: Option<i16>,
    /// A write is outstanding; what it was for.
    writing: Option<Writing>,
    /// The partitions of an AddPartitionsToTxn being written.
    adding: Vec<TopicPartition>,
    /// The coordinator fenced the newest producer handed out (a fencing abort was
    /// written since).
    fenced: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Writing {
    Init,
    /// Whether it starts a transaction.
    Add(bool),
    End(bool),
    /// Transaction version 2: (commit, the producer that ended it, the decision it
    /// replaced: an abort with no transaction open follows the last one's).
    EndV2(bool, ProducerIdAndEpoch, Option<bool>),
    FenceAbort,
    Complete,
}

fn tp(p: u8) -> TopicPartition {
    TopicPartition::new("t", p as i32)
}

fn run(ops: Vec<Op>) {
    let mut c = TxnCoordinator::new(TRANSACTION_MAX_TIMEOUT_MS);
    let mut next_id = 100;
    let mut alloc = move || {
        next_id += 1;
        next_id
    };
    let mut seen = Seen::default();
    let mut now: i64 = 0;
    let mut prev_state: Option<TxnState> = None;
    for op in ops {
        let current = seen.producers.last().copied();
        let stale =
            seen.producers.iter().rev().find(|p| Some(**p) != current && p.producer_id == current.unwrap().producer_id);
        match op {
            Op::Init { kip360 } => {
                let expected = if kip360 { current } else { None };
                match c.init_producer_id(ID, TIMEOUT_MS, expected, now, &mut alloc) {
                    Ok(Decision::Write(r)) => {
                        seen.writing =
                            Some(if r.state == TxnState::PrepareAbort { Writing::FenceAbort } else { Writing::Init });
                        if r.state == TxnState::PrepareAbort {
                            assert_ne!(seen.decided, Some(true), "a decided commit is never aborted");
                            seen.decided = Some(false);
                            seen.fence_beyond = current.map(|p| p.epoch);
                        }
                    }
                    Ok(Decision::Answer(p)) => {
                        // A KIP-360 retry (KIP-588: also after the coordinator fenced the
                        // producer by itself) gets the coordinator's current producer.
                        let r = c.get(ID).unwrap();
                        assert_eq!((p.producer_id, p.epoch), (r.producer_id, r.producer_epoch));
                        assert!(
                            kip360
                                && current.is_some_and(|cur| (p.producer_id, p.epoch) >= (cur.producer_id, cur.epoch))
                        );
                        if current != Some(p) {
                            seen.producers.push(p);
                        }
                        seen.fenced = false;
                    }
                    Err(e) => {
                        assert!(matches!(e, TxnError::ConcurrentTransactions | TxnError::ProducerFenced), "{e:?}")
                    }
                }
            }
            Op::Add { partitions, stale: use_stale } => {
                let Some(cur) = current else { continue };
                let (producer, is_stale) = match (use_stale, stale) {
                    (true, Some(s)) => (*s, true),
                    _ => (cur, false),
                };
                let tps: Vec<TopicPartition> = partitions.iter().map(|&p| tp(p)).collect();
                match c.add_partitions(ID, producer, &tps, now) {
                    Err(TxnError::ProducerFenced) => {
                        assert!(is_stale || seen.producer_outdated(producer), "current producer fenced")
                    }
                    // Markers in flight: any producer waits, before it is checked (Kafka).
                    Err(TxnError::ConcurrentTransactions) if is_stale => {}
                    _ if is_stale => panic!("a fenced producer's AddPartitionsToTxn went through"),
                    Ok(Decision::Write(r)) => {
                        assert_eq!(r.state, TxnState::Ongoing);
                        seen.writing = Some(Writing::Add(!seen.in_transaction(&c)));
                        seen.pending_add(tps);
                    }
                    Ok(Decision::Answer(())) => assert!(tps.iter().all(|t| seen.open.contains(t))),
                    Err(e) => {
                        assert!(matches!(e, TxnError::ConcurrentTransactions | TxnError::InvalidTxnState), "{e:?}")
                    }
                }
            }
            Op::End { commit, stale: use_stale, v2: true } => {
                let Some(cur) = current else { continue };
                let (producer, is_stale) = match (use_stale, stale) {
                    (true, Some(s)) => (*s, true),
                    _ => (cur, false),
                };
                let before = c.get(ID).unwrap().state;
                let mut no_ids = || panic!("the sim's epochs never run out");
                match c.end_txn_v2(ID, producer, commit, now, &mut no_ids) {
                    Err(TxnError::ProducerFenced) => assert!(
                        is_stale
                            || seen.producer_outdated(producer)
                            || matches!(before, TxnState::PrepareCommit | TxnState::PrepareAbort),
                        "current producer fenced in {before:?}"
                    ),
                    // A retry whose answer was lost gets the coordinator's producer: the
                    // one handed out, or (an abort after the coordinator aborted by
                    // itself, as Kafka) the one its fence bumped to, which the client
                    // now learns.
                    Ok(Decision::Answer(p)) => {
                        let r = c.get(ID).unwrap();
                        assert_eq!((p.producer_id, p.epoch), (r.producer_id, r.producer_epoch));
                        assert_eq!(producer.epoch + 1, p.epoch, "only the epoch before retries");
                        assert_eq!(seen.decided, Some(commit), "a retry of the same decision");
                        assert!(current == Some(p) || (seen.fenced && !commit), "{p:?} after {current:?}");
                        if current != Some(p) {
                            seen.producers.push(p);
                            seen.fenced = false;
                        }
                    }
                    // Refusals before the producer's epoch is checked (a write in flight)
                    // or of a retry's opposite outcome are answered below, as to anyone.
                    Ok(Decision::Write(_)) if is_stale => panic!("a fenced producer's EndTxn v5 went through"),
                    Ok(Decision::Write(r)) => {
                        let prior = seen.decided;
                        if before.is_idle() {
                            // An abort with no transaction open.
                            assert!(!commit && r.partitions.is_empty());
                            seen.open.clear();
                            seen.decided = None;
                        }
                        assert_eq!(seen.decided, None, "one decision per transaction");
                        seen.decided = Some(commit);
                        seen.writing = Some(Writing::EndV2(commit, producer, prior));
                    }
                    Err(e) => {
                        assert!(matches!(e, TxnError::ConcurrentTransactions | TxnError::InvalidTxnState), "{e:?}")
                    }
                }
            }
            Op::End { commit, stale: use_stale, v2: false } => {
                let Some(cur) = current else { continue };
                let (producer, is_stale) = match (use_stale, stale) {
                    (true, Some(s)) => (*s, true),
                    _ => (cur, false),
                };
                match c.end_txn(ID, producer, commit, now) {
                    Err(TxnError::ProducerFenced) => assert!(is_stale || seen.producer_outdated(producer)),
                    _ if is_stale => panic!("a fenced producer's EndTxn went through"),
                    Ok(Decision::Write(_)) => {
                        assert_eq!(seen.decided, None, "one decision per transaction");
                        seen.decided = Some(commit);
                        seen.writing = Some(Writing::End(commit));
                    }
                    Ok(Decision::Answer(())) => assert_eq!(seen.decided, Some(commit), "a retry of the same decision"),
                    Err(e) => {
                        assert!(matches!(e, TxnError::ConcurrentTransactions | TxnError::InvalidTxnState), "{e:?}")
                    }
                }
            }
            Op::Ack { ok } => {
                let Some(writing) = seen.writing.take() else {
                    assert_eq!(c.written(ID, ok).answer, None);
                    continue;
                };
                let w = c.written(ID, ok);
                if !ok {
                    match writing {
                        Writing::EndV2(_, _, prior) => seen.decided = prior,
                        Writing::End(_) | Writing::FenceAbort => {
                            seen.decided = None;
                            seen.fence_beyond = None;
                        }
                        Writing::Add(_) => seen.drop_pending_add(),
                        _ => {}
                    }
                    continue;
                }
                match writing {
                    Writing::Init => match w.answer {
                        Some(Ok(Answer::Producer(p))) => {
                            if let Some(last) = seen.producers.last() {
                                assert!(
                                    (p.producer_id, p.epoch) > (last.producer_id, last.epoch),
                                    "{p:?} after {last:?}"
                                );
                            }
                            seen.producers.push(p);
                            seen.fenced = false;
                            seen.open.clear();
                            seen.decided = None;
                        }
                        other => panic!("InitProducerId answered {other:?}"),
                    },
                    Writing::Add(starting) => {
                        assert_eq!(w.answer, Some(Ok(Answer::Done)));
                        if starting {
                            seen.open.clear();
                            seen.decided = None;
                            seen.fence_beyond = None;
                        }
                        seen.commit_pending_add();
                    }
                    Writing::End(commit) => {
                        assert_eq!(w.answer, Some(Ok(Answer::Done)));
                        check_markers(&seen, w.markers.expect("markers"), commit);
                    }
                    Writing::EndV2(commit, ended, _) => {
                        let Some(Ok(Answer::Producer(p))) = w.answer else {
                            panic!("EndTxn v5 answered {:?}", w.answer)
                        };
                        let last = seen.producers.last().unwrap();
                        assert!((p.producer_id, p.epoch) > (last.producer_id, last.epoch), "{p:?} after {last:?}");
                        seen.producers.push(p);
                        let m = w.markers.expect("markers");
                        assert!(m.producer_epoch > ended.epoch, "markers at {} after {ended:?}", m.producer_epoch);
                        check_markers(&seen, m, commit);
                    }
                    Writing::FenceAbort => {
                        seen.fenced = true;
                        let m = w.markers.expect("abort markers");
                        if let Some(beyond) = seen.fence_beyond {
                            assert!(
                                m.producer_epoch > beyond,
                                "fencing epoch {} not beyond {beyond}",
                                m.producer_epoch
                            );
                        }
                        check_markers(&seen, m, false);
                    }
                    Writing::Complete => {
                        let state = c.get(ID).unwrap().state;
                        let want =
                            if seen.decided == Some(true) { TxnState::CompleteCommit } else { TxnState::CompleteAbort };
                        assert_eq!(state, want);
                        seen.open.clear();
                    }
                }
            }
            Op::MarkersWritten => {
                if seen.writing.is_some() {
                    continue;
                }
                if let Some(r) = c.markers_written(ID, now) {
                    assert!(matches!(r.state, TxnState::CompleteCommit | TxnState::CompleteAbort));
                    seen.writing = Some(Writing::Complete);
                }
            }
            Op::Tick(ms) => {
                now += ms as i64;
                if seen.writing.is_none() {
                    for (_, r) in c.expire(now, &mut alloc) {
                        assert_eq!(r.state, TxnState::PrepareAbort);
                        assert_ne!(seen.decided, Some(true), "a decided commit is never aborted");
                        seen.decided = Some(false);
                        seen.fence_beyond = current.map(|p| p.epoch);
                        seen.writing = Some(Writing::FenceAbort);
                    }
                }
            }
        }
        if let Some(r) = c.get(ID) {
            if let Some(prev) = prev_state {
                assert!(r.state == prev || r.state.may_follow(prev), "{prev:?} -> {:?}", r.state);
            }
            prev_state = Some(r.state);
            let decoded = log_records::decode_value(Some(&log_records::value(r))).unwrap();
            assert_eq!(decoded.as_ref(), Some(r));
        }
    }
}

fn check_markers(seen: &Seen, m: Markers, commit: bool) {
    assert_eq!(m.commit, commit);
    let named: BTreeSet<TopicPartition> = m.partitions.into_iter().collect();
    assert_eq!(named, seen.open, "markers name the transaction's partitions");
}

impl Seen {
    fn producer_outdated(&self, p: ProducerIdAndEpoch) -> bool {
        // The coordinator may have bumped the epoch by itself (a timeout, or an
        // InitProducerId during a transaction): the newest producer handed out is then
        // fenced too.
        self.fenced || self.producers.last() != Some(&p)
    }

    fn in_transaction(&self, c: &TxnCoordinator) -> bool {
        c.get(ID).is_some_and(|r| r.state == TxnState::Ongoing)
    }

    fn pending_add(&mut self, tps: Vec<TopicPartition>) {
        self.adding = tps;
    }

    fn commit_pending_add(&mut self) {
        self.open.extend(self.adding.drain(..));
    }

    fn drop_pending_add(&mut self) {
        self.adding.clear();
    }
}

proptest! {
    #![proptest_config(proptest_config::config(256))]
    #[test]
    fn the_coordinator_keeps_its_promises(ops in prop::collection::vec(op(), 1..60)) {
        run(ops);
    }
}
