//! Incremental fetch sessions (KIP-227), per shard. A client (a follower's fetcher, the
//! Java consumer) that asks for a session gets an id; later requests name only the
//! partitions whose fetch position changed, and answers carry only the partitions with
//! records, an error, or a changed high watermark / log start offset. Sessions live on
//! the shard of the connection that made them; a client that reconnects elsewhere gets
//! FETCH_SESSION_ID_NOT_FOUND and starts a new one, as it would after an eviction.
//! A session opened with Fetch v13+ holds its partitions by topic id (KIP-516), older
//! ones by name; the handler names topics from their ids after `prepare`, so a partition
//! held by the id of a deleted topic is answered UNKNOWN_TOPIC_ID, never served from a
//! new topic of the same name. Switching between ids and names within a session is
//! FETCH_SESSION_TOPIC_ID_ERROR, as in Kafka.

use std::collections::HashMap;
use std::time::Instant;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::FetchableTopicResponse;
use kafka_protocol::messages::{FetchRequest, TopicName};
use uuid::Uuid;

use crate::protocol::error_code;

/// Sessions one shard keeps; the least recently used goes when a new one needs room
/// (Kafka's max.incremental.fetch.session.cache.slots is 1000 per broker).
const fetch_sessions_per_shard_max: usize = 1000;
/// Partitions one session may hold.
const fetch_session_partitions_max: usize = 100_000;

/// KIP-227's epochs: 0 asks for a new session, -1 for none (or to close one).
const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;

/// The first Fetch version that names topics by id (KIP-516).
pub const first_topic_id_version: i16 = 13;

struct SessionPartition {
    /// The name as requested: empty in a session by topic id.
    topic: TopicName,
    /// The id as requested: zero in a session by name.
    topic_id: Uuid,
    request: FetchPartition,
    /// (high watermark, last stable offset, log start offset) last sent for it.
    sent: Option<(i64, i64, i64)>,
}

struct Session {
    next_epoch: i32,
    /// Opened with Fetch v13+: its partitions are held by topic id.
    by_id: bool,
    partitions: Vec<SessionPartition>,
    last_used: Instant,
}

/// How a Fetch request is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No session: every requested partition, answered in full, session id 0.
    Sessionless,
    /// Within session `id`; `incremental` answers only what changed.
    Session { id: i32, incremental: bool },
}

pub struct FetchSessions {
    sessions: HashMap<i32, Session>,
    next_id: i32,
}

impl FetchSessions {
    pub fn new(shard: usize) -> Self {
        // Ids of different shards differ (a stale id sent to another shard is not found
        // there rather than mistaken for another session).
        Self { sessions: HashMap::new(), next_id: (shard as i32 + 1).wrapping_mul(1 << 20) }
    }

    /// Apply the session fields of `req`: the request to serve (for an incremental one,
    /// every partition of the session) and how to answer. `Err`: a Kafka error code for
    /// the whole request.
    pub fn prepare(&mut self, req: &FetchRequest, version: i16) -> Result<(FetchRequest, Mode), i16> {
        if version < 7 {
            return Ok((req.clone(), Mode::Sessionless));
        }
        match (req.session_id, req.session_epoch) {
            (0, FINAL_EPOCH) => Ok((req.clone(), Mode::Sessionless)),
            (0, INITIAL_EPOCH) => Ok(self.create(req, version)),
            (0, _) => Err(error_code::INVALID_FETCH_SESSION_EPOCH),
            (id, FINAL_EPOCH) => {
                self.sessions.remove(&id);
                Ok((req.clone(), Mode::Sessionless))
            }
            (id, INITIAL_EPOCH) => {
                self.sessions.remove(&id);
                Ok(self.create(req, version))
            }
            (id, epoch) => {
                let session = self.sessions.get_mut(&id).ok_or(error_code::FETCH_SESSION_ID_NOT_FOUND)?;
                if epoch != session.next_epoch {
                    return Err(error_code::INVALID_FETCH_SESSION_EPOCH);
                }
                if session.by_id != (version >= first_topic_id_version) {
                    return Err(error_code::FETCH_SESSION_TOPIC_ID_ERROR);
                }
                for t in &req.forgotten_topics_data {
                    session.partitions.retain(|p| {
                        !(p.topic == t.topic && p.topic_id == t.topic_id && t.partitions.contains(&p.request.partition))
                    });
                }
                for t in &req.topics {
                    for p in &t.partitions {
                        let found = session.partitions.iter().position(|s| {
                            s.topic == t.topic && s.topic_id == t.topic_id && s.request.partition == p.partition
                        });
                        match found {
                            Some(i) => session.partitions[i].request = p.clone(),
                            None if session.partitions.len() < fetch_session_partitions_max => {
                                session.partitions.push(SessionPartition::new(t, p))
                            }
                            None => return Err(error_code::INVALID_REQUEST),
                        }
                    }
                }
                session.next_epoch = if epoch == i32::MAX { 1 } else { epoch + 1 };
                session.last_used = Instant::now();
                let mut effective = req.clone();
                effective.topics = group_by_topic(&session.partitions);
                Ok((effective, Mode::Session { id, incremental: true }))
            }
        }
    }

    fn create(&mut self, req: &FetchRequest, version: i16) -> (FetchRequest, Mode) {
        let count: usize = req.topics.iter().map(|t| t.partitions.len()).sum();
        if count > fetch_session_partitions_max {
            return (req.clone(), Mode::Sessionless);
        }
        if self.sessions.len() >= fetch_sessions_per_shard_max {
            if let Some((&lru, _)) = self.sessions.iter().min_by_key(|(_, s)| s.last_used) {
                self.sessions.remove(&lru);
            }
        }
        let id = loop {
            self.next_id = self.next_id.wrapping_add(1);
            if self.next_id > 0 && !self.sessions.contains_key(&self.next_id) {
                break self.next_id;
            }
        };
        let partitions =
            req.topics.iter().flat_map(|t| t.partitions.iter().map(|p| SessionPartition::new(t, p))).collect();
        let by_id = version >= first_topic_id_version;
        self.sessions.insert(id, Session { next_epoch: 1, by_id, partitions, last_used: Instant::now() });
        (req.clone(), Mode::Session { id, incremental: false })
    }

    /// Before answering within a session: remember what is sent, and for an incremental
    /// answer leave out partitions with nothing new. A session by id matches the answers
    /// by `topic_id`, one by name by `topic`.
    pub fn finish(&mut self, mode: Mode, topics: &mut Vec<FetchableTopicResponse>) {
        let Mode::Session { id, incremental } = mode else { return };
        let Some(session) = self.sessions.get_mut(&id) else { return };
        let by_id = session.by_id;
        for t in topics.iter_mut() {
            let same_topic = |s: &SessionPartition| if by_id { s.topic_id == t.topic_id } else { s.topic == t.topic };
            t.partitions.retain(|p| {
                let now = (p.high_watermark, p.last_stable_offset, p.log_start_offset);
                let Some(s) =
                    session.partitions.iter_mut().find(|s| same_topic(s) && s.request.partition == p.partition_index)
                else {
                    return true;
                };
                let has_records = p.records.as_ref().is_some_and(|r| !r.is_empty());
                let changed = has_records || p.error_code != 0 || s.sent != Some(now);
                s.sent = Some(now);
                changed || !incremental
            });
        }
        topics.retain(|t| !t.partitions.is_empty() || !incremental);
    }
}

impl SessionPartition {
    fn new(t: &FetchTopic, p: &FetchPartition) -> Self {
        Self { topic: t.topic.clone(), topic_id: t.topic_id, request: p.clone(), sent: None }
    }
}

fn group_by_topic(partitions: &[SessionPartition]) -> Vec<FetchTopic> {
    let mut out: Vec<FetchTopic> = Vec::new();
    for p in partitions {
        match out.iter_mut().find(|t| t.topic == p.topic && t.topic_id == p.topic_id) {
            Some(t) => t.partitions.push(p.request.clone()),
            None => out.push(
                FetchTopic::default()
                    .with_topic(p.topic.clone())
                    .with_topic_id(p.topic_id)
                    .with_partitions(vec![p.request.clone()]),
            ),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use kafka_protocol::messages::fetch_request::ForgottenTopic;
    use kafka_protocol::messages::fetch_response::PartitionData;
    use kafka_protocol::protocol::StrBytes;

    fn name(s: &str) -> TopicName {
        TopicName(StrBytes::from_string(s.into()))
    }

    fn request(id: i32, epoch: i32, parts: &[(&str, i32, i64)]) -> FetchRequest {
        let mut req = FetchRequest::default().with_session_id(id).with_session_epoch(epoch);
        for (t, p, offset) in parts {
            let fp = FetchPartition::default().with_partition(*p).with_fetch_offset(*offset);
            match req.topics.iter_mut().find(|x| x.topic == name(t)) {
                Some(x) => x.partitions.push(fp),
                None => req.topics.push(FetchTopic::default().with_topic(name(t)).with_partitions(vec![fp])),
            }
        }
        req
    }

    fn answer(req: &FetchRequest, with_records: &[(&str, i32)], hw: i64) -> Vec<FetchableTopicResponse> {
        req.topics
            .iter()
            .map(|t| {
                FetchableTopicResponse::default().with_topic(t.topic.clone()).with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            let records = with_records.contains(&(t.topic.as_str(), p.partition));
                            PartitionData::default()
                                .with_partition_index(p.partition)
                                .with_high_watermark(hw)
                                .with_records(Some(if records { Bytes::from_static(b"x") } else { Bytes::new() }))
                        })
                        .collect(),
                )
            })
            .collect()
    }

    fn listed(topics: &[FetchableTopicResponse]) -> Vec<(String, i32)> {
        topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.topic.to_string(), p.partition_index))).collect()
    }

    #[test]
    fn a_session_answers_only_what_changed_and_checks_epochs() {
        let mut s = FetchSessions::new(0);
        // Full request opening a session.
        let (eff, mode) = s.prepare(&request(0, 0, &[("a", 0, 0), ("a", 1, 0), ("b", 0, 5)]), 12).unwrap();
        let Mode::Session { id, incremental: false } = mode else { panic!("{mode:?}") };
        let mut topics = answer(&eff, &[], 10);
        s.finish(mode, &mut topics);
        assert_eq!(listed(&topics).len(), 3, "a full answer lists everything");

        // Incremental with nothing new: the session's partitions are fetched, none listed.
        let (eff, mode) = s.prepare(&request(id, 1, &[]), 12).unwrap();
        assert_eq!(listed(&answer(&eff, &[], 10)).len(), 3, "every session partition is fetched");
        let mut topics = answer(&eff, &[], 10);
        s.finish(mode, &mut topics);
        assert!(topics.is_empty(), "{topics:?}");

        // Records on one, a new high watermark on all: all listed; then only records.
        let (eff, mode) = s.prepare(&request(id, 2, &[("a", 1, 7)]), 12).unwrap();
        let a1 = eff.topics.iter().flat_map(|t| &t.partitions).find(|p| p.partition == 1).unwrap().fetch_offset;
        assert_eq!(a1, 7, "the new fetch offset is used");
        let mut topics = answer(&eff, &[("b", 0)], 11);
        s.finish(mode, &mut topics);
        assert_eq!(listed(&topics).len(), 3);
        let (eff, mode) = s.prepare(&request(id, 3, &[]), 12).unwrap();
        let mut topics = answer(&eff, &[("b", 0)], 11);
        s.finish(mode, &mut topics);
        assert_eq!(listed(&topics), vec![("b".to_string(), 0)]);

        // Forgotten partitions leave the session.
        let mut req = request(id, 4, &[]);
        req.forgotten_topics_data = vec![ForgottenTopic::default().with_topic(name("a")).with_partitions(vec![0, 1])];
        let (eff, _) = s.prepare(&req, 12).unwrap();
        assert_eq!(listed(&answer(&eff, &[], 11)), vec![("b".to_string(), 0)]);

        // Wrong epoch, unknown session, epoch without a session.
        assert_eq!(s.prepare(&request(id, 9, &[]), 12).unwrap_err(), error_code::INVALID_FETCH_SESSION_EPOCH);
        assert_eq!(s.prepare(&request(id + 1000, 1, &[]), 12).unwrap_err(), error_code::FETCH_SESSION_ID_NOT_FOUND);
        assert_eq!(s.prepare(&request(0, 3, &[]), 12).unwrap_err(), error_code::INVALID_FETCH_SESSION_EPOCH);
        // Closing: a sessionless full fetch, and the id is gone.
        assert_eq!(s.prepare(&request(id, -1, &[("a", 0, 0)]), 12).unwrap().1, Mode::Sessionless);
        assert_eq!(s.prepare(&request(id, 5, &[]), 12).unwrap_err(), error_code::FETCH_SESSION_ID_NOT_FOUND);
        // Old versions never have sessions.
        assert_eq!(s.prepare(&request(0, 0, &[("a", 0, 0)]), 6).unwrap().1, Mode::Sessionless);
    }

    /// KIP-516: a session opened with v13+ holds partitions by topic id. The same name
    /// under two ids is two topics (a topic deleted and created again), forgetting goes
    /// by id, and names and ids do not mix within a session.
    #[test]
    fn a_session_by_topic_id_keeps_ids_apart_and_refuses_names() {
        let by_id = |id: u128, p: i32, offset: i64| {
            FetchTopic::default()
                .with_topic_id(Uuid::from_u128(id))
                .with_partitions(vec![FetchPartition::default().with_partition(p).with_fetch_offset(offset)])
        };
        let mut s = FetchSessions::new(0);
        let open = FetchRequest::default().with_session_epoch(0).with_topics(vec![by_id(1, 0, 0)]);
        let (_, mode) = s.prepare(&open, 16).unwrap();
        let Mode::Session { id, incremental: false } = mode else { panic!("{mode:?}") };

        // A second id for partition 0 joins beside the first; both are fetched, by id.
        let next = FetchRequest::default().with_session_id(id).with_session_epoch(1).with_topics(vec![by_id(2, 0, 5)]);
        let (eff, mode) = s.prepare(&next, 16).unwrap();
        let ids: Vec<u128> = eff.topics.iter().map(|t| t.topic_id.as_u128()).collect();
        assert_eq!(ids, vec![1, 2]);
        assert!(eff.topics.iter().all(|t| t.topic.is_empty()), "named later, from the ids");

        // Answers match the session by id: a named answer for id 2 with nothing new is
        // left out of the next incremental answer, whatever its name.
        let answer = |eff: &FetchRequest| -> Vec<FetchableTopicResponse> {
            eff.topics
                .iter()
                .map(|t| {
                    FetchableTopicResponse::default()
                        .with_topic(name("t"))
                        .with_topic_id(t.topic_id)
                        .with_partitions(vec![PartitionData::default().with_partition_index(0).with_high_watermark(3)])
                })
                .collect()
        };
        let mut topics = answer(&eff);
        s.finish(mode, &mut topics);
        assert_eq!(topics.len(), 2, "first answer of each partition");
        let (eff, mode) = s.prepare(&FetchRequest::default().with_session_id(id).with_session_epoch(2), 16).unwrap();
        let mut topics = answer(&eff);
        s.finish(mode, &mut topics);
        assert!(topics.is_empty(), "nothing new: {topics:?}");

        // Forgetting id 1 leaves id 2.
        let mut forget = FetchRequest::default().with_session_id(id).with_session_epoch(3);
        forget.forgotten_topics_data =
            vec![ForgottenTopic::default().with_topic_id(Uuid::from_u128(1)).with_partitions(vec![0])];
        let (eff, _) = s.prepare(&forget, 17).unwrap();
        let ids: Vec<u128> = eff.topics.iter().map(|t| t.topic_id.as_u128()).collect();
        assert_eq!(ids, vec![2]);

        // A v12 request (names) in this session, and a v13 one in a session by name.
        let v12 = FetchRequest::default().with_session_id(id).with_session_epoch(4);
        assert_eq!(s.prepare(&v12, 12).unwrap_err(), error_code::FETCH_SESSION_TOPIC_ID_ERROR);
        let (_, mode) = s.prepare(&request(0, 0, &[("a", 0, 0)]), 12).unwrap();
        let Mode::Session { id: named, .. } = mode else { panic!("{mode:?}") };
        assert_eq!(s.prepare(&request(named, 1, &[]), 13).unwrap_err(), error_code::FETCH_SESSION_TOPIC_ID_ERROR);
    }

    #[test]
    fn the_least_recently_used_session_makes_room() {
        let mut s = FetchSessions::new(1);
        let mut ids = Vec::new();
        for _ in 0..fetch_sessions_per_shard_max + 1 {
            let (_, mode) = s.prepare(&request(0, 0, &[("a", 0, 0)]), 12).unwrap();
            let Mode::Session { id, .. } = mode else { panic!() };
            ids.push(id);
        }
        assert_eq!(s.sessions.len(), fetch_sessions_per_shard_max);
        assert!(!s.sessions.contains_key(&ids[0]));
        assert!(s.sessions.contains_key(ids.last().unwrap()));
    }
}
