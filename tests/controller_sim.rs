//! Seeded deterministic simulation of the controller state machine
//! (`spate::coordinator::controller`): brokers join, heartbeat, pause, die, return and shut
//! down; topics are created, grown and deleted; leaders shrink and expand ISRs (and send
//! stale requests); preferred leaders are elected; operators reassign partitions (and
//! cancel); the active controller fails over to a
//! fresh one rebuilt from the ZooKeeper documents its changes were persisted as. Invariants
//! are checked after every step.
//!
//! A failure prints its seed; replay it with `SPATE_SIM_SEED=<seed> cargo test --profile ci
//! --test controller_sim sim_seeds -- --nocapture`. `SPATE_SIM_SEEDS=<n>` runs more fixed
//! seeds; `SPATE_TEST_SEED` (set by `scripts/test` from the commit) adds a window of
//! `SEEDS_EXPLORED` seeds past them (tests/explore/mod.rs).

#[path = "explore/mod.rs"]
mod explore;

use std::collections::{BTreeMap, BTreeSet};

use spate::coordinator::controller::{
    assign_replicas, Change, Controller, ControllerConfig, ControllerError, Election, Endpoint, FenceReason,
    PlacementBroker, TopicInfo, NO_LEADER, UNCLEAN_LEADER_ELECTION_CONFIG,
};
use spate::coordinator::layout;
use spate::model::{BrokerEpoch, LeaderEpoch, NodeId, PartitionEpoch};
use spate::replication::NO_BROKER_EPOCH;
use uuid::Uuid;

/// SplitMix64: small, seedable, good enough to drive a simulation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        spate::model::splitmix64(&mut self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            Some(&items[self.below(items.len() as u64) as usize])
        }
    }
}

const BROKER_IDS: [NodeId; 6] = [B1, B2, B3, B4, B5, B6];
const B1: NodeId = NodeId(1);
const B2: NodeId = NodeId(2);
const B3: NodeId = NodeId(3);
const B4: NodeId = NodeId(4);
const B5: NodeId = NodeId(5);
const B6: NodeId = NodeId(6);
const STEPS_PER_SEED: usize = 250;
/// Seeds past the fixed 300 that `sim_seeds` explores when `SPATE_TEST_SEED` is set.
const SEEDS_EXPLORED: u64 = 300;
/// Topic creation pauses at this many topics (deletes keep going), to bound a step's cost.
const TOPICS_MAX: usize = 10;
const SESSION_TIMEOUT_MS: u64 = 9_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Process {
    Down,
    Running,
    /// Alive but not heartbeating (a long GC pause, a partition from the coordinator).
    Paused,
}

/// The metadata store as the caller keeps it: znode path -> (data, znode version).
#[derive(Default, Clone)]
struct Store {
    nodes: BTreeMap<String, (Vec<u8>, i32)>,
}

impl Store {
    fn set(&mut self, path: String, data: Vec<u8>) -> i32 {
        let e = self.nodes.entry(path).or_insert((Vec::new(), -1));
        e.0 = data;
        e.1 += 1;
        e.1
    }
    fn remove_prefix(&mut self, prefix: &str) {
        let doomed: Vec<String> =
            self.nodes.keys().filter(|k| *k == prefix || k.starts_with(&format!("{prefix}/"))).cloned().collect();
        for k in doomed {
            self.nodes.remove(&k);
        }
    }
    fn children(&self, parent: &str) -> Vec<String> {
        let prefix = format!("{parent}/");
        self.nodes
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .filter(|rest| !rest.contains('/'))
            .map(str::to_string)
            .collect()
    }

    /// Persist a change the way the coordinator does, in Kafka's layout.
    fn apply(&mut self, change: &Change, now_ms: u64, trace: &mut Vec<String>) {
        match change {
            Change::ControllerEpoch { epoch } => {
                self.set(layout::paths::CONTROLLER_EPOCH.to_string(), layout::encode_controller_epoch(*epoch));
            }
            Change::BrokerRegistered { broker } => {
                let doc = layout::BrokerDoc {
                    endpoint: broker.endpoint.clone(),
                    rack: broker.rack.clone(),
                    timestamp_ms: now_ms,
                };
                self.set(layout::paths::broker(broker.id), layout::encode_broker(&doc));
            }
            Change::BrokerUnregistered { id } => self.remove_prefix(&layout::paths::broker(*id)),
            Change::BrokerFenced { .. } | Change::BrokerUnfenced { .. } => {}
            Change::TopicCreated { name, topic_id, assignment, configs } => {
                assert!(!self.nodes.contains_key(&layout::paths::topic(name)), "{name} created twice");
                self.set(layout::paths::topic(name), layout::encode_topic(*topic_id, assignment, &BTreeMap::new()));
                self.set(layout::paths::topic_config(name), layout::encode_topic_config(configs));
            }
            Change::PartitionsCreated { topic, topic_id, assignment, reassignments, .. }
            | Change::AssignmentChanged { topic, topic_id, assignment, reassignments } => {
                self.set(layout::paths::topic(topic), layout::encode_topic(*topic_id, assignment, reassignments));
            }
            Change::TopicDeleted { name, .. } => {
                self.remove_prefix(&layout::paths::topic(name));
                self.remove_prefix(&layout::paths::topic_config(name));
            }
            Change::PartitionChanged { topic, partition, state } => {
                assert!(self.nodes.contains_key(&layout::paths::topic(topic)), "state of unknown topic {topic}");
                let version =
                    self.set(layout::paths::partition_state(topic, *partition), layout::encode_partition_state(state));
                // Every change is persisted, so the znode version is the partition epoch.
                assert_eq!(
                    PartitionEpoch(version),
                    state.partition_epoch,
                    "{topic}-{partition}: znode version != partition epoch"
                );
            }
        }
        trace.push(format!("{change:?}"));
    }

    /// A new active controller, rebuilt from the documents (as after a failover).
    fn rebuild(&self, config: ControllerConfig, controller_epoch: i32, now_ms: u64) -> (Controller, Vec<Change>) {
        let mut c = Controller::new(config);
        let stored_epoch = self
            .nodes
            .get(layout::paths::CONTROLLER_EPOCH)
            .map(|(d, _)| layout::decode_controller_epoch(d).unwrap())
            .unwrap_or(0);
        assert!(controller_epoch > stored_epoch);
        let mut changes = c.becomes_active(controller_epoch).unwrap();
        for id in self.children(layout::paths::BROKER_IDS) {
            let (data, _) = &self.nodes[&format!("{}/{id}", layout::paths::BROKER_IDS)];
            let doc = layout::decode_broker(data).unwrap();
            c.restore_broker(NodeId(id.parse().unwrap()), doc.endpoint, doc.rack, 1, now_ms);
        }
        for name in self.children(layout::paths::TOPICS) {
            let doc = layout::decode_topic(&self.nodes[&layout::paths::topic(&name)].0).unwrap();
            let configs = layout::decode_topic_config(&self.nodes[&layout::paths::topic_config(&name)].0).unwrap();
            let partitions = (0..doc.assignment.len() as i32)
                .map(|p| {
                    let (data, version) = &self.nodes[&layout::paths::partition_state(&name, p)];
                    layout::decode_partition_state(data, *version).unwrap()
                })
                .collect();
            c.restore_topic(TopicInfo {
                name: name.clone(),
                topic_id: doc.topic_id.unwrap(),
                assignment: doc.assignment,
                configs,
                partitions,
                reassignments: doc.reassignments,
            })
            .unwrap();
        }
        changes.extend(c.reconcile());
        (c, changes)
    }
}

/// A partition as last seen: (leader_epoch, partition_epoch, leader, isr).
type Seen = (LeaderEpoch, PartitionEpoch, NodeId, Vec<NodeId>);

/// What the simulation remembers between steps, to check invariants over time.
#[derive(Default)]
struct History {
    controller_epoch: i32,
    /// (topic id, partition) -> (leader_epoch, partition_epoch, leader, isr)
    partitions: BTreeMap<(Uuid, i32), Seen>,
    /// (topic id, partition, leader_epoch) -> leader: one leader per epoch.
    leaders: BTreeMap<(Uuid, i32, LeaderEpoch), NodeId>,
    /// The partition an operator's unclean ElectLeaders was asked for in this step: the
    /// one election outside the ISR allowed without the topic's config.
    unclean_asked: Option<(Uuid, i32)>,
    /// ISR members committed by this step's changes, by (topic, partition): a step can
    /// expand the ISR and, in the same decision, complete a reassignment whose leader
    /// leaves for one of the members just added.
    step_isr: BTreeMap<(String, i32), BTreeSet<NodeId>>,
}

fn check(c: &Controller, h: &mut History, now_ms: u64) -> Result<(), String> {
    c.check_invariants()?;
    if c.controller_epoch() < h.controller_epoch {
        return Err(format!("controller epoch went back {} -> {}", h.controller_epoch, c.controller_epoch()));
    }
    h.controller_epoch = c.controller_epoch();
    for b in c.brokers() {
        if !b.fenced && now_ms.saturating_sub(b.last_heartbeat_ms) > SESSION_TIMEOUT_MS {
            return Err(format!("broker {} unfenced though silent since {}", b.id, b.last_heartbeat_ms));
        }
    }
    for t in c.topics() {
        let unclean = t.configs.get(UNCLEAN_LEADER_ELECTION_CONFIG).is_some_and(|v| v == "true");
        for (p, s) in t.partitions.iter().enumerate() {
            let tp = TpName(&t.name, p);
            let replicas = &t.assignment[p];
            if s.isr.iter().any(|r| !replicas.contains(r)) {
                return Err(format!("{tp}: isr {:?} not within replicas {replicas:?}", s.isr));
            }
            if s.leader != NO_LEADER {
                let b = c.broker(s.leader).ok_or_else(|| format!("{tp}: leader {} not registered", s.leader))?;
                if b.fenced {
                    return Err(format!("{tp}: fenced broker {} leads", s.leader));
                }
                if !s.isr.contains(&s.leader) {
                    return Err(format!("{tp}: leader {} not in isr {:?}", s.leader, s.isr));
                }
                if c.leader_of(&t.name, p as i32) != Some(s.leader) {
                    return Err(format!("{tp}: leader_of disagrees"));
                }
            }
            let key = (t.topic_id, p as i32);
            if let Some((le, pe, leader, isr)) = h.partitions.get(&key) {
                if s.leader_epoch < *le || s.partition_epoch < *pe {
                    return Err(format!(
                        "{tp}: epochs went back ({le},{pe}) -> ({},{})",
                        s.leader_epoch, s.partition_epoch
                    ));
                }
                if s.leader != *leader && s.leader_epoch == *le {
                    return Err(format!("{tp}: leader changed {leader} -> {} without a new epoch", s.leader));
                }
                if (s.leader != *leader || s.isr != *isr) && s.partition_epoch == *pe {
                    return Err(format!("{tp}: state changed without a new partition epoch"));
                }
                let asked = h.unclean_asked == Some(key);
                let in_step = h.step_isr.get(&(t.name.clone(), p as i32)).is_some_and(|m| m.contains(&s.leader));
                if s.leader != *leader
                    && s.leader != NO_LEADER
                    && !unclean
                    && !asked
                    && !isr.contains(&s.leader)
                    && !in_step
                {
                    return Err(format!("{tp}: unclean election of {} outside isr {isr:?}", s.leader));
                }
            }
            h.partitions.insert(key, (s.leader_epoch, s.partition_epoch, s.leader, s.isr.clone()));
            if s.leader != NO_LEADER {
                let prev = h.leaders.insert((t.topic_id, p as i32, s.leader_epoch), s.leader);
                if prev.is_some_and(|l| l != s.leader) {
                    return Err(format!("{tp}: two leaders in epoch {}: {prev:?} and {}", s.leader_epoch, s.leader));
                }
            }
        }
    }
    h.unclean_asked = None;
    h.step_isr.clear();
    Ok(())
}

/// `topic-partition` for messages, formatted only when one is written.
struct TpName<'a>(&'a str, usize);

impl std::fmt::Display for TpName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Run one seed; `Err` describes the first broken invariant and the trace before it.
fn run_seed(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let config = ControllerConfig {
        broker_session_timeout_ms: SESSION_TIMEOUT_MS,
        unclean_leader_election: false,
        // Preferred leaders come back now and then during the runs too.
        preferred_leader_check_interval_ms: 7_000,
        ..ControllerConfig::default()
    };
    let racks = rng.chance(50);
    let mut c = Controller::new(config.clone());
    let mut store = Store::default();
    let mut h = History::default();
    let mut trace: Vec<String> = Vec::new();
    let mut now_ms: u64 = 1_000;
    let mut procs: BTreeMap<NodeId, Process> = BROKER_IDS.iter().map(|&id| (id, Process::Down)).collect();
    let mut topic_seq = 0u32;
    let mut epoch = 1;
    for ch in c.becomes_active(epoch).unwrap() {
        store.apply(&ch, now_ms, &mut trace);
    }

    for step in 0..STEPS_PER_SEED {
        let mut changes: Vec<Change> = Vec::new();
        let roll = rng.below(100);
        let action;
        match roll {
            0..=19 => {
                // Time passes; running brokers heartbeat (most of the time); the controller ticks.
                let dt = rng.below(3_000);
                now_ms += dt;
                action = format!("advance {dt} ms");
                for (&id, &p) in &procs {
                    if p == Process::Running && rng.chance(90) {
                        match c.heartbeat(id, now_ms) {
                            Ok(ch) => changes.extend(ch),
                            Err(ControllerError::UnknownBroker(_)) => {
                                let rack = racks.then(|| format!("r{}", id.0 % 3));
                                changes.extend(
                                    c.register_broker(
                                        id,
                                        Endpoint::new("127.0.0.1", 9090 + id.0 as u16),
                                        rack,
                                        2,
                                        now_ms,
                                    )
                                    .map_err(|e| e.to_string())?,
                                );
                            }
                            Err(e) => return Err(format!("heartbeat {id}: {e}")),
                        }
                    }
                }
                changes.extend(c.tick(now_ms));
            }
            20..=31 => {
                // A broker process starts (or restarts) and registers.
                let id = *rng.pick(&BROKER_IDS).unwrap();
                action = format!("start broker {id}");
                let rack = racks.then(|| format!("r{}", id.0 % 3));
                changes.extend(
                    c.register_broker(id, Endpoint::new("127.0.0.1", 9090 + id.0 as u16), rack, 2, now_ms)
                        .map_err(|e| e.to_string())?,
                );
                procs.insert(id, Process::Running);
            }
            32..=37 => {
                // A broker dies (kill -9): it just stops heartbeating.
                let id = *rng.pick(&BROKER_IDS).unwrap();
                action = format!("kill broker {id}");
                procs.insert(id, Process::Down);
            }
            38..=41 => {
                // A broker pauses, or resumes after a pause.
                let id = *rng.pick(&BROKER_IDS).unwrap();
                let next = match procs[&id] {
                    Process::Running => Process::Paused,
                    Process::Paused => Process::Running,
                    Process::Down => Process::Down,
                };
                action = format!("broker {id} {:?} -> {next:?}", procs[&id]);
                procs.insert(id, next);
            }
            42..=44 => {
                // Controlled shutdown.
                let id = *rng.pick(&BROKER_IDS).unwrap();
                action = format!("shut down broker {id}");
                match c.unregister_broker(id) {
                    Ok(ch) => {
                        changes.extend(ch);
                        for t in c.topics() {
                            for (p, s) in t.partitions.iter().enumerate() {
                                if s.leader == id {
                                    return Err(format!("{}-{p} still led by shut down broker {id}", t.name));
                                }
                            }
                        }
                    }
                    Err(ControllerError::UnknownBroker(_)) => {}
                    Err(e) => return Err(format!("unregister {id}: {e}")),
                }
                procs.insert(id, Process::Down);
            }
            45..=56 if c.topics().count() < TOPICS_MAX => {
                topic_seq += 1;
                let name = format!("t{topic_seq}");
                let partitions = 1 + rng.below(6) as i32;
                let rf = 1 + rng.below(4) as i32;
                let mut configs = BTreeMap::new();
                if rng.chance(15) {
                    configs.insert(UNCLEAN_LEADER_ELECTION_CONFIG.to_string(), "true".to_string());
                }
                let id = Uuid::from_u64_pair(rng.next() | 1, rng.next());
                action = format!("create {name} p={partitions} rf={rf} {configs:?}");
                let live = c.live_brokers().count();
                match c.create_topic(&name, id, partitions, rf, configs, &mut || rng.next()) {
                    Ok(ch) => {
                        if rf as usize > live {
                            return Err(format!("rf {rf} accepted with {live} live brokers"));
                        }
                        changes.extend(ch);
                    }
                    Err(ControllerError::InvalidReplicationFactor { .. }) if rf as usize > live => {}
                    Err(e) => return Err(format!("create {name}: {e}")),
                }
            }
            45..=61 => {
                let names: Vec<String> = c.topics().map(|t| t.name.clone()).collect();
                match rng.pick(&names) {
                    Some(name) => {
                        action = format!("delete {name}");
                        changes.extend(c.delete_topic(name).map_err(|e| e.to_string())?);
                        if c.topic(name).is_some() {
                            return Err(format!("{name} still there after delete"));
                        }
                    }
                    None => action = "delete (no topics)".to_string(),
                }
            }
            62..=65 => {
                let topics: Vec<(String, i32, usize)> =
                    c.topics().map(|t| (t.name.clone(), t.partition_count(), t.assignment[0].len())).collect();
                match rng.pick(&topics).cloned() {
                    Some((name, count, rf)) => {
                        let total = count + 1 + rng.below(3) as i32;
                        action = format!("grow {name} {count} -> {total}");
                        let live = c.live_brokers().count();
                        match c.create_partitions(&name, total, &mut || rng.next()) {
                            Ok(ch) => changes.extend(ch),
                            Err(ControllerError::InvalidReplicationFactor { .. }) if rf > live => {}
                            Err(e) => return Err(format!("grow {name}: {e}")),
                        }
                        if let Err(e) = c.create_partitions(&name, count, &mut || rng.next()) {
                            if !matches!(e, ControllerError::InvalidPartitions(_)) {
                                return Err(format!("shrink {name}: {e}"));
                            }
                        } else {
                            return Err(format!("shrinking {name} accepted"));
                        }
                    }
                    None => action = "grow (no topics)".to_string(),
                }
            }
            84..=87 => {
                // An operator's AlterPartitionReassignments for one partition: a random
                // target of registered (and sometimes unknown) brokers, or a cancel.
                let all: Vec<(String, i32)> =
                    c.topics().flat_map(|t| (0..t.partition_count()).map(move |p| (t.name.clone(), p))).collect();
                match rng.pick(&all).cloned() {
                    Some((topic, p)) => {
                        let ongoing = c.reassignments().any(|(t, q, ..)| t == topic && q == p);
                        let current = c.replicas(&topic, p).unwrap().to_vec();
                        let target: Option<Vec<NodeId>> = if rng.chance(25) {
                            None
                        } else {
                            let mut pool: Vec<NodeId> = BROKER_IDS.to_vec();
                            let mut target = Vec::new();
                            for _ in 0..1 + rng.below(4) {
                                let i = rng.below(pool.len() as u64) as usize;
                                target.push(pool.remove(i));
                            }
                            Some(target)
                        };
                        action = format!("reassign {topic}-{p} {current:?} -> {target:?}");
                        match (c.alter_reassignment(&topic, p, target.clone(), true), &target) {
                            (Ok(ch), Some(target)) => {
                                changes.extend(ch);
                                let replicas = c.replicas(&topic, p).unwrap().to_vec();
                                let now = c.reassignments().find(|(t, q, ..)| *t == topic && *q == p);
                                match now {
                                    // In progress: the target first, then the leaving ones.
                                    Some((_, _, _, r))
                                        if replicas[..target.len()] != target[..]
                                            || replicas[target.len()..] != r.removing[..]
                                            || r.adding.iter().any(|a| !target.contains(a)) =>
                                    {
                                        return Err(format!("{action}: replicas {replicas:?}, {r:?}"));
                                    }
                                    None if replicas != *target => {
                                        return Err(format!("{action}: completed as {replicas:?}"));
                                    }
                                    Some(_) | None => {}
                                }
                            }
                            (Ok(ch), None) => {
                                if !ongoing {
                                    return Err(format!("{action}: a cancel with nothing in progress accepted"));
                                }
                                changes.extend(ch);
                                if c.reassignments().any(|(t, q, ..)| t == topic && q == p) {
                                    return Err(format!("{action}: still in progress after the cancel"));
                                }
                            }
                            (Err(ControllerError::NoReassignmentInProgress { .. }), None) if !ongoing => {}
                            (Err(ControllerError::InvalidReplicaAssignment(_)), Some(target))
                                if target.iter().any(|b| c.broker(*b).is_none())
                                    || target.iter().all(|b| c.broker(*b).is_none_or(|b| b.fenced)) => {}
                            // A cancel that would need an unclean election is refused.
                            (Err(ControllerError::InvalidReplicaAssignment(_)), None) if ongoing => {}
                            (Err(e), _) => return Err(format!("{action}: {e}")),
                        }
                    }
                    None => action = "reassign (no topics)".to_string(),
                }
            }
            66..=83 => {
                // A leader reports an ISR change: shrink, expand or a stale request.
                let led: Vec<(String, i32)> = c
                    .topics()
                    .flat_map(|t| {
                        t.partitions
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.leader != NO_LEADER)
                            .map(|(p, _)| (t.name.clone(), p as i32))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                match rng.pick(&led).cloned() {
                    Some((topic, p)) => {
                        let s = c.partition_state(&topic, p).unwrap().clone();
                        let replicas = c.replicas(&topic, p).unwrap().to_vec();
                        let kind = rng.below(10);
                        if kind < 4 {
                            // Shrink to the leader plus a random part of the ISR.
                            let isr: Vec<NodeId> =
                                s.isr.iter().copied().filter(|&r| r == s.leader || rng.chance(50)).collect();
                            action = format!("shrink {topic}-{p} {:?} -> {isr:?}", s.isr);
                            changes.extend(
                                c.alter_partition(&topic, p, s.leader, s.leader_epoch, s.partition_epoch, &ids(&isr))
                                    .map_err(|e| format!("{action}: {e}"))?,
                            );
                        } else if kind < 8 {
                            // Expand with caught-up live replicas.
                            let mut isr = s.isr.clone();
                            for &r in &replicas {
                                let live = c.broker(r).is_some_and(|b| !b.fenced);
                                if !isr.contains(&r) && live && rng.chance(70) {
                                    isr.push(r);
                                }
                            }
                            action = format!("expand {topic}-{p} {:?} -> {isr:?}", s.isr);
                            changes.extend(
                                c.alter_partition(&topic, p, s.leader, s.leader_epoch, s.partition_epoch, &ids(&isr))
                                    .map_err(|e| format!("{action}: {e}"))?,
                            );
                        } else {
                            action = format!("stale alter {topic}-{p}");
                            let isr = vec![s.leader];
                            let before = c.partition_state(&topic, p).unwrap().clone();
                            match c.alter_partition(
                                &topic,
                                p,
                                s.leader,
                                LeaderEpoch(s.leader_epoch.0 - 1),
                                s.partition_epoch,
                                &ids(&isr),
                            ) {
                                Err(ControllerError::FencedLeaderEpoch { .. }) => {}
                                other => return Err(format!("{action}: old leader epoch gave {other:?}")),
                            }
                            match c.alter_partition(
                                &topic,
                                p,
                                s.leader,
                                s.leader_epoch,
                                PartitionEpoch(s.partition_epoch.0 - 1),
                                &ids(&isr),
                            ) {
                                Err(ControllerError::InvalidUpdateVersion { .. }) => {}
                                other => return Err(format!("{action}: old partition epoch gave {other:?}")),
                            }
                            if let Some(&other) = replicas.iter().find(|&&r| r != s.leader) {
                                match c.alter_partition(
                                    &topic,
                                    p,
                                    other,
                                    s.leader_epoch,
                                    s.partition_epoch,
                                    &ids(&[other]),
                                ) {
                                    Err(ControllerError::NotLeader { .. }) => {}
                                    o => return Err(format!("{action}: follower {other} altering gave {o:?}")),
                                }
                            }
                            if let Some(&dead) = replicas.iter().find(|&&r| c.broker(r).is_none_or(|b| b.fenced)) {
                                let isr = vec![s.leader, dead];
                                match c.alter_partition(
                                    &topic,
                                    p,
                                    s.leader,
                                    s.leader_epoch,
                                    s.partition_epoch,
                                    &ids(&isr),
                                ) {
                                    Err(ControllerError::IneligibleReplica { .. }) => {}
                                    o => return Err(format!("{action}: dead {dead} in isr gave {o:?}")),
                                }
                            }
                            if *c.partition_state(&topic, p).unwrap() != before {
                                return Err(format!("{action}: a rejected request changed the state"));
                            }
                        }
                    }
                    None => action = "alter (nothing led)".to_string(),
                }
            }
            88..=89 => {
                // An operator's unclean ElectLeaders for one partition.
                // Mostly an offline partition, where there is one: what operators elect.
                let all: Vec<(String, i32, bool)> = c
                    .topics()
                    .flat_map(|t| {
                        let name = t.name.clone();
                        t.partitions
                            .iter()
                            .enumerate()
                            .map(move |(p, s)| (name.clone(), p as i32, s.leader == NO_LEADER))
                    })
                    .collect();
                let offline: Vec<(String, i32, bool)> = all.iter().filter(|x| x.2).cloned().collect();
                let pick = if !offline.is_empty() && rng.chance(70) { rng.pick(&offline) } else { rng.pick(&all) };
                match pick.cloned() {
                    Some((topic, p, _)) => {
                        let replicas = c.replicas(&topic, p).unwrap().to_vec();
                        let before = c.partition_state(&topic, p).unwrap().clone();
                        let live = |r: &NodeId| c.broker(*r).is_some_and(|b| !b.fenced);
                        let clean = replicas.iter().copied().find(|r| before.isr.contains(r) && live(r));
                        let any = replicas.iter().copied().find(|r| live(r));
                        let outcome = c.elect_unclean_leader(&topic, p, &mut changes);
                        action = format!("unclean election {topic}-{p}: {outcome:?}");
                        let s = c.partition_state(&topic, p).unwrap().clone();
                        let want = match (before.leader != NO_LEADER, clean, any) {
                            (true, ..) => (Election::NotNeeded, before.leader),
                            (false, Some(l), _) => (Election::Elected, l),
                            (false, None, Some(l)) => (Election::Elected, l),
                            (false, None, None) => (Election::EligibleNotAvailable, NO_LEADER),
                        };
                        if (outcome, s.leader) != want {
                            return Err(format!("{action}: want {want:?}, leader now {}", s.leader));
                        }
                        if clean.is_none() && outcome == Election::Elected && s.isr != [s.leader] {
                            return Err(format!("{action}: out-of-sync leader with isr {:?}", s.isr));
                        }
                        let id = c.topics().find(|t| t.name == topic).unwrap().topic_id;
                        h.unclean_asked = Some((id, p));
                    }
                    None => action = "unclean election (no partition)".to_string(),
                }
            }
            90..=93 => {
                action = "elect preferred leaders".to_string();
                changes.extend(c.elect_preferred_leaders());
                for t in c.topics() {
                    for (p, s) in t.partitions.iter().enumerate() {
                        let preferred = t.assignment[p][0];
                        let eligible = c.broker(preferred).is_some_and(|b| !b.fenced) && s.isr.contains(&preferred);
                        if eligible && s.leader != preferred {
                            return Err(format!(
                                "{}-{p}: preferred {preferred} eligible but {} leads",
                                t.name, s.leader
                            ));
                        }
                    }
                }
            }
            _ => {
                // The active controller dies; another is rebuilt from the store.
                epoch += 1;
                action = format!("controller failover to epoch {epoch}");
                for ch in changes.drain(..) {
                    store.apply(&ch, now_ms, &mut trace);
                }
                let (next, ch) = store.rebuild(config.clone(), epoch, now_ms);
                c = next;
                changes.extend(ch);
            }
        }
        for ch in &changes {
            store.apply(ch, now_ms, &mut trace);
            if let Change::PartitionChanged { topic, partition, state } = ch {
                h.step_isr.entry((topic.clone(), *partition)).or_default().extend(state.isr.iter().copied());
            }
        }
        trace.push(format!("step {step} @{now_ms}: {action}"));
        if let Err(e) = check(&c, &mut h, now_ms) {
            let tail: Vec<&String> = trace.iter().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(format!(
                "step {step} ({action}): {e}\nlast events:\n  {}",
                tail.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n  ")
            ));
        }
    }

    // The store holds exactly what the controller holds.
    for t in c.topics() {
        let doc = layout::decode_topic(&store.nodes[&layout::paths::topic(&t.name)].0).unwrap();
        assert_eq!(doc.assignment, t.assignment, "{}", t.name);
        assert_eq!(doc.reassignments, t.reassignments, "{}", t.name);
        assert_eq!(doc.topic_id, Some(t.topic_id));
        for (p, s) in t.partitions.iter().enumerate() {
            let (data, version) = &store.nodes[&layout::paths::partition_state(&t.name, p as i32)];
            let stored = layout::decode_partition_state(data, *version).unwrap();
            if stored != *s {
                return Err(format!("{}-{p}: store has {stored:?}, controller {s:?}", t.name));
            }
        }
    }
    let stored_topics: BTreeSet<String> = store.children(layout::paths::TOPICS).into_iter().collect();
    let topics: BTreeSet<String> = c.topics().map(|t| t.name.clone()).collect();
    if stored_topics != topics {
        return Err(format!("store topics {stored_topics:?} != controller topics {topics:?}"));
    }
    Ok(())
}

#[test]
fn sim_seeds() {
    let seeds: Vec<u64> = match std::env::var("SPATE_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SPATE_SIM_SEED is a u64")],
        Err(_) => {
            let n: u64 = std::env::var("SPATE_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
            (0..n).chain(explore::window("controller_sim", SEEDS_EXPLORED, 2)).collect()
        }
    };
    for seed in seeds {
        let result = std::panic::catch_unwind(|| run_seed(seed));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("controller simulation failed; replay with SPATE_SIM_SEED={seed}\n{e}"),
            Err(_) => panic!("controller simulation panicked; replay with SPATE_SIM_SEED={seed}"),
        }
    }
}

// ---- Targeted scenarios ----

fn cluster(ids: &[NodeId], racks: bool) -> Controller {
    let mut c = Controller::new(ControllerConfig::default());
    c.becomes_active(1).unwrap();
    for &id in ids {
        let rack = racks.then(|| format!("rack{}", id.0 % 3));
        c.register_broker(id, Endpoint::new("127.0.0.1", 9090 + id.0 as u16), rack, 4, 0).unwrap();
    }
    c
}

fn zero() -> impl FnMut() -> u64 {
    || 0
}

fn heartbeat_all_but(c: &mut Controller, dead: &[NodeId], now_ms: u64) {
    let ids: Vec<NodeId> = c.brokers().map(|b| b.id).filter(|id| !dead.contains(id)).collect();
    for id in ids {
        c.heartbeat(id, now_ms).unwrap();
    }
}

/// An ISR as AlterPartition v2 names it: ids without broker epochs.
fn ids(isr: &[NodeId]) -> Vec<(NodeId, BrokerEpoch)> {
    isr.iter().map(|id| (*id, NO_BROKER_EPOCH)).collect()
}

#[test]
fn rack_aware_placement_through_create_topic() {
    let mut c = cluster(&[B1, B2, B3, B4, B5, B6], true);
    let mut rng = Rng(7);
    c.create_topic("racked", Uuid::from_u128(1), 12, 3, BTreeMap::new(), &mut || rng.next()).unwrap();
    let t = c.topic("racked").unwrap();
    for replicas in &t.assignment {
        let racks: BTreeSet<i32> = replicas.iter().map(|id| id.0 % 3).collect();
        assert_eq!(racks.len(), 3, "{replicas:?} not spread over the three racks");
    }
    // And the pure placement agrees with what the controller did for the same draws.
    let brokers: Vec<PlacementBroker> =
        c.live_brokers().map(|b| PlacementBroker { id: b.id, rack: b.rack.clone() }).collect();
    let mut rng = Rng(7);
    let (start, shift) = ((rng.next() % 6) as usize, (rng.next() % 6) as usize);
    assert_eq!(assign_replicas(&brokers, 12, 3, 0, start, shift).unwrap(), t.assignment);
}

#[test]
fn replication_factor_above_live_brokers_is_refused() {
    let mut c = cluster(&[B1, B2], false);
    let err = c.create_topic("t", Uuid::from_u128(1), 3, 3, BTreeMap::new(), &mut zero()).unwrap_err();
    assert_eq!(err, ControllerError::InvalidReplicationFactor { requested: 3, available: 2 });
    assert!(matches!(
        c.create_topic("t", Uuid::from_u128(1), 3, 0, BTreeMap::new(), &mut zero()),
        Err(ControllerError::InvalidReplicationFactor { .. })
    ));
    assert!(matches!(
        c.create_topic("t", Uuid::from_u128(1), 0, 1, BTreeMap::new(), &mut zero()),
        Err(ControllerError::InvalidPartitions(0))
    ));
    c.create_topic("t", Uuid::from_u128(1), 3, 2, BTreeMap::new(), &mut zero()).unwrap();
    assert!(matches!(
        c.create_topic("t", Uuid::from_u128(2), 3, 2, BTreeMap::new(), &mut zero()),
        Err(ControllerError::TopicExists(_))
    ));
    // Fenced brokers do not count as live.
    c.tick(20_000);
    assert!(matches!(
        c.create_topic("u", Uuid::from_u128(3), 1, 1, BTreeMap::new(), &mut zero()),
        Err(ControllerError::InvalidReplicationFactor { requested: 1, available: 0 })
    ));
}

#[test]
fn fencing_moves_leadership_to_an_isr_member() {
    let mut c = cluster(&[B1, B2, B3], false);
    c.create_topic_with_assignment("t", Uuid::from_u128(1), vec![vec![B1, B2, B3]], BTreeMap::new()).unwrap();
    assert_eq!(c.leader_of("t", 0), Some(B1));
    heartbeat_all_but(&mut c, &[B1], 5_000);
    assert!(c.tick(9_000).is_empty(), "nobody is late yet");
    let changes = c.tick(9_001);
    assert!(changes.contains(&Change::BrokerFenced { id: B1, reason: FenceReason::SessionExpired }));
    let s = c.partition_state("t", 0).unwrap();
    assert_eq!(
        (s.leader, s.leader_epoch, s.isr.clone(), s.partition_epoch),
        (B2, LeaderEpoch(1), vec![B2, B3], PartitionEpoch(1))
    );
    assert!(changes.iter().any(|ch| matches!(ch, Change::PartitionChanged { state, .. } if state == s)));
    // Broker 1 comes back: unfenced, but not in the ISR until the leader says so.
    let changes = c.heartbeat(B1, 10_000).unwrap();
    assert_eq!(changes, vec![Change::BrokerUnfenced { id: B1 }]);
    c.alter_partition("t", 0, B2, LeaderEpoch(1), PartitionEpoch(1), &ids(&[B1, B2, B3])).unwrap();
    let s = c.partition_state("t", 0).unwrap().clone();
    assert_eq!(
        (s.leader, s.leader_epoch, s.isr.clone(), s.partition_epoch),
        (B2, LeaderEpoch(1), vec![B1, B2, B3], PartitionEpoch(2))
    );
    // Preferred leader election hands it back to 1.
    c.elect_preferred_leaders();
    let s = c.partition_state("t", 0).unwrap();
    assert_eq!((s.leader, s.leader_epoch, s.partition_epoch), (B1, LeaderEpoch(2), PartitionEpoch(3)));
}

#[test]
fn partition_goes_offline_when_no_isr_member_is_live_and_returns_with_it() {
    let mut c = cluster(&[B1, B2, B3], false);
    c.create_topic_with_assignment("t", Uuid::from_u128(1), vec![vec![B1, B2, B3]], BTreeMap::new()).unwrap();
    // The ISR shrinks to the leader alone.
    c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(0), &ids(&[B1])).unwrap();
    heartbeat_all_but(&mut c, &[B1], 8_000);
    c.tick(9_500);
    let s = c.partition_state("t", 0).unwrap().clone();
    assert_eq!(s.leader, NO_LEADER, "2 and 3 are live but not in the ISR: no unclean election");
    assert_eq!(s.isr, vec![B1], "the last ISR member stays, so it can come back");
    assert_eq!(c.leader_of("t", 0), None);
    assert_eq!((s.leader_epoch, s.partition_epoch), (LeaderEpoch(1), PartitionEpoch(2)));
    // 1 restarts and registers again: it leads again.
    c.register_broker(B1, Endpoint::new("127.0.0.1", 9091), None, 4, 10_000).unwrap();
    let s = c.partition_state("t", 0).unwrap();
    assert_eq!((s.leader, s.leader_epoch, s.isr.clone()), (B1, LeaderEpoch(2), vec![B1]));
}

#[test]
fn unclean_election_is_off_by_default_and_on_per_topic() {
    let mut c = cluster(&[B1, B2], false);
    c.create_topic_with_assignment("clean", Uuid::from_u128(1), vec![vec![B1, B2]], BTreeMap::new()).unwrap();
    let unclean = BTreeMap::from([(UNCLEAN_LEADER_ELECTION_CONFIG.to_string(), "true".to_string())]);
    c.create_topic_with_assignment("unclean", Uuid::from_u128(2), vec![vec![B1, B2]], unclean).unwrap();
    c.alter_partition("clean", 0, B1, LeaderEpoch(0), PartitionEpoch(0), &ids(&[B1])).unwrap();
    c.alter_partition("unclean", 0, B1, LeaderEpoch(0), PartitionEpoch(0), &ids(&[B1])).unwrap();
    heartbeat_all_but(&mut c, &[B1], 9_000);
    c.tick(10_000);
    assert_eq!(c.leader_of("clean", 0), None);
    let s = c.partition_state("unclean", 0).unwrap();
    assert_eq!((s.leader, s.isr.clone(), s.leader_epoch), (B2, vec![B2], LeaderEpoch(1)));

    // The broker-level default turns it on for every topic.
    let mut c = Controller::new(ControllerConfig { unclean_leader_election: true, ..ControllerConfig::default() });
    c.becomes_active(1).unwrap();
    c.register_broker(B1, Endpoint::new("h", 1), None, 1, 0).unwrap();
    c.register_broker(B2, Endpoint::new("h", 2), None, 1, 0).unwrap();
    c.create_topic_with_assignment("t", Uuid::from_u128(1), vec![vec![B1, B2]], BTreeMap::new()).unwrap();
    c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(0), &ids(&[B1])).unwrap();
    c.heartbeat(B2, 9_000).unwrap();
    c.tick(10_000);
    assert_eq!(c.leader_of("t", 0), Some(B2));
}

#[test]
fn controlled_shutdown_moves_leadership_first() {
    let mut c = cluster(&[B1, B2, B3], false);
    c.create_topic("t", Uuid::from_u128(1), 6, 3, BTreeMap::new(), &mut zero()).unwrap();
    let changes = c.unregister_broker(B2).unwrap();
    assert_eq!(changes.last(), Some(&Change::BrokerUnregistered { id: B2 }));
    let t = c.topic("t").unwrap();
    for s in &t.partitions {
        assert_ne!(s.leader, B2);
        assert_ne!(s.leader, NO_LEADER);
        assert!(!s.isr.contains(&B2));
    }
    assert!(c.broker(B2).is_none());
    assert_eq!(c.heartbeat(B2, 1), Err(ControllerError::UnknownBroker(B2)));
}

/// Fencing says why: only a missed heartbeat is a session expiry (the broker logs it as
/// a warning); a restart's re-registration and a controlled shutdown are not (a clean
/// single-node start and stop used to warn "no heartbeat" about itself).
#[test]
fn fencing_says_why() {
    let mut c = cluster(&[B1, B2], false);
    let changes = c.register_broker(B1, Endpoint::new("127.0.0.1", 9091), None, 4, 1_000).unwrap();
    assert!(changes.contains(&Change::BrokerFenced { id: B1, reason: FenceReason::Reregistered }), "{changes:?}");
    let changes = c.unregister_broker(B1).unwrap();
    assert!(changes.contains(&Change::BrokerFenced { id: B1, reason: FenceReason::ControlledShutdown }), "{changes:?}");
    let changes = c.tick(1_000_000);
    assert_eq!(
        changes.iter().filter(|ch| matches!(ch, Change::BrokerFenced { .. })).collect::<Vec<_>>(),
        vec![&Change::BrokerFenced { id: B2, reason: FenceReason::SessionExpired }]
    );
}

#[test]
fn alter_partition_rejects_stale_and_ineligible_requests() {
    let mut c = cluster(&[B1, B2, B3], false);
    c.create_topic_with_assignment("t", Uuid::from_u128(1), vec![vec![B1, B2, B3]], BTreeMap::new()).unwrap();
    assert!(
        matches!(c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(0), &ids(&[B1, B2])), Ok(ch) if ch.len() == 1)
    );
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(0), &ids(&[B1])),
        Err(ControllerError::InvalidUpdateVersion { request: PartitionEpoch(0), current: PartitionEpoch(1) })
    ));
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(1), PartitionEpoch(1), &ids(&[B1])),
        Err(ControllerError::UnknownLeaderEpoch { .. })
    ));
    assert!(matches!(
        c.alter_partition("t", 0, B2, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B2])),
        Err(ControllerError::NotLeader { .. })
    ));
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B2])),
        Err(ControllerError::InvalidIsr(_))
    ));
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B1, B1])),
        Err(ControllerError::InvalidIsr(_))
    ));
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B1, B4])),
        Err(ControllerError::IneligibleReplica { replica: B4, .. })
    ));
    assert!(matches!(
        c.alter_partition("t", 1, B1, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B1])),
        Err(ControllerError::UnknownTopicOrPartition { .. })
    ));
    // Same set, other order: nothing changes.
    assert_eq!(c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B2, B1])).unwrap(), vec![]);
    heartbeat_all_but(&mut c, &[B3], 9_000);
    c.tick(9_001);
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B1, B2, B3])),
        Err(ControllerError::IneligibleReplica { replica: B3, .. })
    ));
    // After a leader change the old leader's epoch is fenced. (The controller ticks
    // every second: a longer gap would be its own pause, which fences nobody.)
    for now in (10_001..18_000).step_by(1_000) {
        heartbeat_all_but(&mut c, &[B1, B3], now);
        c.tick(now);
    }
    heartbeat_all_but(&mut c, &[B1, B3], 18_000);
    c.tick(18_002);
    let s = c.partition_state("t", 0).unwrap().clone();
    assert_eq!(s.leader, B2);
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(1), &ids(&[B1, B2])),
        Err(ControllerError::FencedLeaderEpoch { request: LeaderEpoch(0), current: LeaderEpoch(1) })
    ));
}

/// KIP-903: a leader names each ISR member with the broker epoch of the incarnation it
/// saw fetching; the controller refuses a member that has registered again since (it may
/// have lost what that incarnation fetched), and accepts its current registration.
#[test]
fn alter_partition_refuses_a_member_from_a_previous_incarnation() {
    let mut c = cluster(&[B1, B2, B3], false);
    c.create_topic_with_assignment("t", Uuid::from_u128(1), vec![vec![B1, B2, B3]], BTreeMap::new()).unwrap();
    let epoch = |c: &Controller, id: NodeId| c.broker_epoch(id).unwrap();
    let (e1, e2, e3) = (epoch(&c, B1), epoch(&c, B2), epoch(&c, B3));
    c.alter_partition("t", 0, B1, LeaderEpoch(0), PartitionEpoch(0), &[(B1, e1), (B2, e2)]).unwrap();
    // 3 restarts: its new incarnation registers with a new broker epoch.
    c.register_broker(B3, Endpoint::new("127.0.0.1", 9093), None, 4, 1_000).unwrap();
    let e3_new = epoch(&c, B3);
    assert!(e3_new > e3);
    let pe = c.partition_state("t", 0).unwrap().partition_epoch;
    assert!(matches!(
        c.alter_partition("t", 0, B1, LeaderEpoch(0), pe, &[(B1, e1), (B2, e2), (B3, e3)]),
        Err(ControllerError::IneligibleReplica { replica: B3, .. })
    ));
    assert!(
        matches!(
            c.alter_partition("t", 0, B1, LeaderEpoch(0), pe, &[(B1, e1), (B2, BrokerEpoch(e2.0 + 1)), (B3, e3_new)]),
            Err(ControllerError::IneligibleReplica { replica: B2, .. })
        ),
        "every member is checked, not only the added one"
    );
    assert_eq!(c.partition_state("t", 0).unwrap().isr, vec![B1, B2], "refusals change nothing");
    c.alter_partition("t", 0, B1, LeaderEpoch(0), pe, &[(B1, NO_BROKER_EPOCH), (B2, e2), (B3, e3_new)]).unwrap();
    assert_eq!(c.partition_state("t", 0).unwrap().isr, vec![B1, B2, B3]);
}

#[test]
fn controller_epoch_only_grows() {
    let mut c = Controller::new(ControllerConfig::default());
    assert_eq!(c.becomes_active(3).unwrap(), vec![Change::ControllerEpoch { epoch: 3 }]);
    assert!(matches!(c.becomes_active(3), Err(ControllerError::StaleControllerEpoch { request: 3, current: 3 })));
    assert!(c.becomes_active(2).is_err());
    c.becomes_active(4).unwrap();
    assert_eq!(c.controller_epoch(), 4);
}

#[test]
fn create_partitions_continues_the_assignment() {
    let mut c = cluster(&[B1, B2, B3], false);
    c.create_topic("t", Uuid::from_u128(1), 2, 2, BTreeMap::new(), &mut zero()).unwrap();
    let changes = c.create_partitions("t", 5, &mut zero()).unwrap();
    assert!(
        matches!(&changes[0], Change::PartitionsCreated { first_new_partition: 2, assignment, .. } if assignment.len() == 5)
    );
    assert_eq!(changes.len(), 1 + 3);
    let t = c.topic("t").unwrap();
    assert_eq!(t.partitions.len(), 5);
    // Kafka's placement with start index 0 and shift 0 over brokers 1, 2, 3.
    assert_eq!(t.assignment, vec![vec![B1, B2], vec![B2, B3], vec![B3, B1], vec![B1, B3], vec![B2, B1]]);
    assert!(matches!(c.create_partitions("t", 5, &mut zero()), Err(ControllerError::InvalidPartitions(5))));
    assert!(matches!(c.create_partitions("nope", 5, &mut zero()), Err(ControllerError::UnknownTopic(_))));
    let ch = c.delete_topic("t").unwrap();
    assert!(matches!(&ch[..], [Change::TopicDeleted { partition_count: 5, .. }]));
    assert!(c.topic("t").is_none() && c.partition_state("t", 0).is_none());
}

/// One CreateTopics for 65,535 partitions (a mutated request did this) once made a
/// single broker open tens of thousands of partition logs and run out of file
/// descriptors; max.broker.partitions refuses it, and CreatePartitions alike, while
/// what fits is still created.
#[test]
fn broker_partitions_max_refuses_what_a_broker_cannot_host() {
    let mut c = Controller::new(ControllerConfig { broker_partitions_max: 10, ..ControllerConfig::default() });
    c.becomes_active(1).unwrap();
    for id in [B1, B2] {
        c.register_broker(id, Endpoint::new("127.0.0.1", 9090 + id.0 as u16), None, 4, 0).unwrap();
    }
    // RF 2 over 2 brokers: 10 partitions put 10 replicas on each, the most allowed.
    c.create_topic("fits", Uuid::from_u128(1), 10, 2, BTreeMap::new(), &mut zero()).unwrap();
    let err = c.create_topic("big", Uuid::from_u128(2), 65_535, 1, BTreeMap::new(), &mut zero()).unwrap_err();
    assert!(matches!(err, ControllerError::BrokerPartitionsExceeded { max: 10, .. }), "{err}");
    assert!(c.topic("big").is_none(), "nothing of a refused topic is kept");
    assert!(matches!(
        c.create_partitions("fits", 11, &mut zero()),
        Err(ControllerError::BrokerPartitionsExceeded { .. })
    ));
    assert_eq!(c.topic("fits").unwrap().partitions.len(), 10);
    c.delete_topic("fits").unwrap();
    c.create_topic("again", Uuid::from_u128(3), 10, 2, BTreeMap::new(), &mut zero()).unwrap();
}

/// The controller's own pause (a metadata write stalled by the disk for longer than the
/// session timeout, as seen on a loaded 2-core CI machine) fences nobody: the brokers'
/// heartbeats of that time were processed late, with their arrival times. A broker that
/// is really gone is fenced one session timeout after the pause.
#[test]
fn a_pause_of_the_controller_fences_nobody_and_a_dead_broker_a_session_later() {
    let mut c = cluster(&[B1, B2, B3], false);
    let session = c.config().broker_session_timeout_ms;
    c.create_topic_with_assignment("t", Uuid::from_u128(1), vec![vec![B1, B2, B3]], BTreeMap::new()).unwrap();
    heartbeat_all_but(&mut c, &[], 1_000);
    assert!(c.tick(1_000).is_empty());
    assert_eq!(c.take_pause(), None);
    // Stalled from 1,000 to 1,000 + 3 sessions; the heartbeats that came at 1,500 are
    // processed after it. Broker 1 died during the pause.
    heartbeat_all_but(&mut c, &[B1], 1_500);
    let resumed = 1_000 + 3 * session;
    assert!(c.tick(resumed).is_empty(), "fenced for the controller's own pause");
    assert_eq!(c.take_pause(), Some(3 * session));
    assert_eq!(c.take_pause(), None, "taken once");
    // Ticks every second again: 2 and 3 heartbeat, 1 does not and is fenced once its
    // fresh session runs out.
    let mut now = resumed;
    let fenced_at = loop {
        now += 1_000;
        heartbeat_all_but(&mut c, &[B1], now);
        let changes = c.tick(now);
        if changes.contains(&Change::BrokerFenced { id: B1, reason: FenceReason::SessionExpired }) {
            break now;
        }
        assert!(!changes.iter().any(|ch| matches!(ch, Change::BrokerFenced { .. })), "{changes:?}");
        assert!(now < resumed + 3 * session, "broker 1 never fenced");
    };
    assert!(fenced_at > resumed + session && fenced_at <= resumed + session + 1_000, "fenced at {fenced_at}");
    assert_eq!(c.take_pause(), None, "one-second ticks are no pause");
}

/// Turning `unclean.leader.election.enable` on for a topic whose partition is offline
/// (its only ISR member fenced, another replica live) elects that replica at once, as
/// Kafka's controller does on the config change. Before, the election waited for the
/// next broker event, and a heartbeat in between broke the invariant ("offline although
/// unclean election may pick a live replica"): a panic under debug assertions, caught by
/// test_replication.py against a `--profile ci` binary.
#[test]
fn enabling_unclean_election_elects_an_offline_partitions_live_replica_at_once() {
    let mut c = cluster(&[B1, B2], false);
    c.create_topic("u", Uuid::from_u128(9), 1, 2, BTreeMap::new(), &mut zero()).unwrap();
    heartbeat_all_but(&mut c, &[], 0);
    let s = c.partition_state("u", 0).unwrap().clone();
    let (leader, follower) = (s.leader, if s.leader == B1 { B2 } else { B1 });
    c.alter_partition("u", 0, leader, s.leader_epoch, s.partition_epoch, &ids(&[leader])).unwrap();
    // The leader misses its session; the follower, out of the ISR, heartbeats on.
    let later = ControllerConfig::default().broker_session_timeout_ms + 1;
    heartbeat_all_but(&mut c, &[leader], later);
    c.tick(later);
    assert_eq!(c.partition_state("u", 0).unwrap().leader, NO_LEADER, "offline: its only ISR member is fenced");
    let configs = BTreeMap::from([(UNCLEAN_LEADER_ELECTION_CONFIG.to_string(), "true".to_string())]);
    let changes = c.set_topic_configs("u", configs).unwrap();
    let s = c.partition_state("u", 0).unwrap();
    assert_eq!((s.leader, &s.isr[..]), (follower, &[follower][..]), "changes: {changes:?}");
    assert!(!changes.is_empty(), "the election is a change to persist");
    heartbeat_all_but(&mut c, &[leader], later + 1);
}
