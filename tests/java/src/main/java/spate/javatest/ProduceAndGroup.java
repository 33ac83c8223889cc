package spate.javatest;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.IntStream;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.Utils;

/**
 * The Java producer with all its defaults (idempotence, acks=all, the default partitioner)
 * and a two-member consumer group that shrinks to one.
 *
 * <p>Usage: ProduceAndGroup BOOTSTRAP REPLICATION_FACTOR default|cooperative
 *
 * <ol>
 *   <li>Creates a 6-partition topic; starts consumers A and B in one group (the
 *       consumer's default assignors, or CooperativeStickyAssignor) and waits until they
 *       split the partitions between them.
 *   <li>Produces 1500 records (two in three keyed, one in three without a key, a header
 *       each) and checks every send callback: no error, each keyed record in
 *       murmur2(key) % 6, per-partition offsets 0..n-1 with no gap or duplicate.
 *   <li>Waits until A and B have read them all; B pauses; 1500 more are produced; A reads
 *       its share; B commits and leaves. A must take B's partitions over from B's
 *       committed offsets (cooperatively: without revoking its own).
 *   <li>Checks every record read against what was sent at its offset (key, value,
 *       header, timestamp), each offset read once, per partition in order; A's committed()
 *       and the admin's listConsumerGroupOffsets equal the log end offsets;
 *       describeProducers shows one idempotent producer per partition whose last
 *       sequence covers the partition.
 * </ol>
 */
public final class ProduceAndGroup {
    static final int PARTITIONS = 6;
    static final int PER_PHASE = 1500;
    static final Duration WAIT = Duration.ofSeconds(90);

    /** What the producer's callback reported for one record. */
    record Sent(int index, String key, String value, long timestamp) {}

    public static void main(String[] args) {
        Check.main(() -> scenario(args));
    }

    static void scenario(String[] args) throws Exception {
        String bootstrap = args[0];
        short rf = Short.parseShort(args[1]);
        boolean cooperative = switch (args[2]) {
            case "default" -> false;
            case "cooperative" -> true;
            default -> throw new IllegalArgumentException("assignor: default|cooperative, not " + args[2]);
        };
        String suffix = Long.toString(System.nanoTime(), 36);
        String topic = "java-group-" + args[2] + "-" + suffix;
        String group = "java-group-" + args[2] + "-" + suffix;

        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(List.of(new NewTopic(topic, PARTITIONS, rf))).all().get(60, TimeUnit.SECONDS);
            // The admin asks any broker, which may learn of the new topic a moment later.
            Check.eventually(WAIT, "describeTopics of the new topic", () -> {
                TopicDescription td = admin.describeTopics(List.of(topic)).allTopicNames().get(60, TimeUnit.SECONDS).get(topic);
                Check.equal(PARTITIONS, td.partitions().size(), "partitions of " + topic);
                td.partitions().forEach(p -> Check.equal((int) rf, p.replicas().size(), "replicas of " + topic + "/" + p.partition()));
            });
            run(bootstrap, admin, topic, group, cooperative);
        }
        Check.log("PASS: ProduceAndGroup " + args[2] + " rf=" + rf);
    }

    static void run(String bootstrap, Admin admin, String topic, String group, boolean cooperative) throws Exception {
        Set<TopicPartition> all = IntStream.range(0, PARTITIONS).mapToObj(p -> new TopicPartition(topic, p))
                .collect(Collectors.toCollection(HashSet::new));

        Member a = new Member("A", bootstrap, topic, group, cooperative);
        Member b = new Member("B", bootstrap, topic, group, cooperative);
        a.start();
        b.start();
        Check.waitUntil(WAIT, "A and B to split the partitions", () -> {
            Set<TopicPartition> sa = a.ready(), sb = b.ready();
            if (sa.isEmpty() || sb.isEmpty()) return false;
            Set<TopicPartition> union = new HashSet<>(sa);
            union.addAll(sb);
            return union.equals(all) && sa.size() + sb.size() == PARTITIONS;
        }, () -> "A=" + a.ready() + " B=" + b.ready() + errors(a, b));
        Set<TopicPartition> aFirst = a.ready(), bFirst = b.ready();
        Check.log("assignments: A=" + sorted(aFirst) + " B=" + sorted(bFirst));
        Check.equal(3, aFirst.size(), "A's share of 6 partitions between 2 members");
        if (!cooperative) {
            // The default assignors are [range, cooperative-sticky]: every member supports
            // range first, so range decides: contiguous halves.
            Set<Integer> pa = aFirst.stream().map(TopicPartition::partition).collect(Collectors.toSet());
            Check.that(pa.equals(Set.of(0, 1, 2)) || pa.equals(Set.of(3, 4, 5)),
                    "range assignor gives contiguous halves, A has " + sorted(aFirst));
        }

        // Phase 1: the producer with every default.
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        Map<TopicPartition, Map<Long, Sent>> sent = new ConcurrentHashMap<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            produce(producer, topic, 0, PER_PHASE, sent);
            Check.waitUntil(WAIT, "A and B to read phase 1", () -> a.count() + b.count() == PER_PHASE,
                    () -> "A read " + a.count() + ", B read " + b.count() + errors(a, b));

            // B stops reading (paused, still in the group); phase 2 lands on every partition.
            int bRead = b.count();
            b.pauseAll = true;
            Check.that(b.paused.await(WAIT.toSeconds(), TimeUnit.SECONDS), "B paused its partitions" + errors(a, b));
            produce(producer, topic, PER_PHASE, PER_PHASE, sent);
            long aShare = aFirst.stream().mapToLong(tp -> sent.get(tp).size()).sum();
            Check.waitUntil(WAIT, "A to read all of its partitions", () -> a.count() == aShare,
                    () -> "A read " + a.count() + " of " + aShare + errors(a, b));
            Check.equal(bRead, b.count(), "records B read while paused");
        }

        // B commits, reads its commits back and leaves; A takes its partitions over.
        int aRevocationsBefore = a.revoked.size();
        int aAssignmentsBefore = a.assigned.size();
        b.stop();
        Check.that(b.error == null, "B failed: " + b.error);
        for (TopicPartition tp : bFirst) {
            long expected = lastOffset(b.records, tp) + 1;
            Check.equal(expected, b.committedAtClose.get(tp).offset(), "B's committed() for " + tp);
            // The commit carries the leader epoch of the last record read (KIP-320), which
            // the broker keeps and gives back.
            var lastEpoch = lastRecord(b.records, tp).leaderEpoch();
            Check.that(lastEpoch.isPresent(), "leader epoch of the last record B read from " + tp);
            Check.equal(lastEpoch, b.committedAtClose.get(tp).leaderEpoch(), "B's committed() leader epoch for " + tp);
        }
        Check.waitUntil(WAIT, "A to read everything", () -> a.count() + b.count() == 2 * PER_PHASE,
                () -> "A read " + a.count() + ", B read " + b.count() + " of " + 2 * PER_PHASE + errors(a));
        Check.equal(all, a.ready(), "A's assignment after B left");

        List<Set<TopicPartition>> revokedAtTakeover = new ArrayList<>(a.revoked.subList(aRevocationsBefore, a.revoked.size()));
        List<Set<TopicPartition>> assignedAtTakeover = new ArrayList<>(a.assigned.subList(aAssignmentsBefore, a.assigned.size()));
        Check.log("A at takeover: revoked " + revokedAtTakeover + " assigned " + assignedAtTakeover);
        if (cooperative) {
            Check.that(revokedAtTakeover.stream().allMatch(Set::isEmpty),
                    "cooperative: A revokes none of its partitions when B leaves, revoked " + revokedAtTakeover);
            Check.equal(List.of(bFirst), assignedAtTakeover, "cooperative: A is given exactly B's partitions");
        } else {
            Check.equal(List.of(aFirst), revokedAtTakeover, "eager: A revokes all it had when B leaves");
            Check.equal(List.of(all), assignedAtTakeover, "eager: A is given every partition");
        }
        // A resumes each of B's partitions exactly where B committed.
        for (TopicPartition tp : bFirst) {
            long first = a.records.stream().filter(r -> r.partition() == tp.partition()).mapToLong(ConsumerRecord::offset)
                    .min().orElse(-1);
            Check.equal(b.committedAtClose.get(tp).offset(), first, "A's first offset read from B's " + tp);
        }

        // Every record read is the one sent at its offset, read once, in order.
        Map<TopicPartition, Set<Long>> seen = new HashMap<>();
        for (Member m : List.of(a, b)) {
            Map<Integer, Long> last = new HashMap<>();
            for (ConsumerRecord<String, String> r : m.records) {
                TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                Sent s = sent.getOrDefault(tp, Map.of()).get(r.offset());
                Check.that(s != null, m.name + " read " + tp + "@" + r.offset() + " which was never acknowledged");
                Check.equal(s.key(), r.key(), "key at " + tp + "@" + r.offset());
                Check.equal(s.value(), r.value(), "value at " + tp + "@" + r.offset());
                Check.equal(s.timestamp(), r.timestamp(), "timestamp at " + tp + "@" + r.offset());
                Header h = r.headers().lastHeader("i");
                Check.that(h != null, "header i at " + tp + "@" + r.offset());
                Check.equal(Integer.toString(s.index()), new String(h.value(), StandardCharsets.UTF_8), "header i at " + tp + "@" + r.offset());
                Check.that(seen.computeIfAbsent(tp, k -> new HashSet<>()).add(r.offset()),
                        tp + "@" + r.offset() + " read twice");
                Long prev = last.put(r.partition(), r.offset());
                Check.that(prev == null || r.offset() > prev, m.name + " read " + tp + " out of order: " + prev + " then " + r.offset());
            }
        }
        for (TopicPartition tp : all) {
            Check.equal(sent.get(tp).keySet(), seen.getOrDefault(tp, Set.of()), "offsets read from " + tp);
        }

        // A commits and reads its commits back; the admin sees the same.
        a.stop();
        Check.that(a.error == null, "A failed: " + a.error);
        Map<TopicPartition, Long> ends = new HashMap<>();
        for (TopicPartition tp : all) ends.put(tp, (long) sent.get(tp).size());
        Map<TopicPartition, Long> aCommitted = new HashMap<>();
        a.committedAtClose.forEach((tp, om) -> aCommitted.put(tp, om.offset()));
        Check.equal(ends, aCommitted, "A's committed() at the end");
        Map<TopicPartition, Long> adminCommitted = new HashMap<>();
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get(60, TimeUnit.SECONDS)
                .forEach((tp, om) -> adminCommitted.put(tp, om.offset()));
        Check.equal(ends, adminCommitted, "listConsumerGroupOffsets after the group emptied");
        ConsumerGroupDescription gd = admin.describeConsumerGroups(List.of(group)).describedGroups().get(group)
                .get(60, TimeUnit.SECONDS);
        Check.equal(GroupState.EMPTY, gd.groupState(), "group state after both left");
        Check.equal(0, gd.members().size(), "members after both left");

        // The producer was idempotent: the broker tracked one producer id per partition, with
        // sequences 0..n-1 over that partition's n records.
        var producers = admin.describeProducers(all).all().get(60, TimeUnit.SECONDS);
        Set<Long> ids = new TreeSet<>();
        for (TopicPartition tp : all) {
            Collection<ProducerState> states = producers.get(tp).activeProducers();
            Check.equal(1, states.size(), "active producers on " + tp + ": " + states);
            ProducerState st = states.iterator().next();
            Check.equal(sent.get(tp).size() - 1, st.lastSequence(), "last sequence on " + tp);
            Check.that(st.producerId() >= 0, "producer id on " + tp + ": " + st);
            ids.add(st.producerId());
        }
        Check.equal(1, ids.size(), "one producer id over every partition: " + ids);
        Check.log("records per partition: " + new TreeMap<>(ends.entrySet().stream()
                .collect(Collectors.toMap(e -> e.getKey().partition(), Map.Entry::getValue))));
    }

    /** Sends records [from, from+n) and waits for every callback; checks them. */
    static void produce(KafkaProducer<String, String> producer, String topic, int from, int n,
                        Map<TopicPartition, Map<Long, Sent>> sent) throws Exception {
        List<String> errors = Collections.synchronizedList(new ArrayList<>());
        CountDownLatch done = new CountDownLatch(n);
        for (int i = from; i < from + n; i++) {
            final int index = i;
            String key = i % 3 == 2 ? null : "key-" + (i % 50);
            String value = "value-" + i + "-" + "x".repeat(i % 97);
            ProducerRecord<String, String> rec = new ProducerRecord<>(topic, key, value);
            rec.headers().add("i", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
            producer.send(rec, (md, e) -> {
                try {
                    if (e != null) {
                        errors.add("record " + index + ": " + e);
                        return;
                    }
                    if (key != null) {
                        int expected = Utils.toPositive(Utils.murmur2(key.getBytes(StandardCharsets.UTF_8))) % PARTITIONS;
                        if (md.partition() != expected) {
                            errors.add("record " + index + " with key " + key + " went to partition " + md.partition()
                                    + ", the default partitioner's murmur2 says " + expected);
                        }
                    }
                    Sent prev = sent.computeIfAbsent(new TopicPartition(topic, md.partition()), k -> new ConcurrentHashMap<>())
                            .put(md.offset(), new Sent(index, key, value, md.timestamp()));
                    if (prev != null) {
                        errors.add("offset " + md.partition() + "@" + md.offset() + " acknowledged for records "
                                + prev.index() + " and " + index);
                    }
                } finally {
                    done.countDown();
                }
            });
        }
        producer.flush();
        Check.that(done.await(WAIT.toSeconds(), TimeUnit.SECONDS), "send callbacks: " + done.getCount() + " missing");
        Check.that(errors.isEmpty(), "send errors (" + errors.size() + "): " + errors.subList(0, Math.min(10, errors.size())));
        // Per partition, the acknowledged offsets are exactly 0..n-1.
        int total = 0;
        for (Map.Entry<TopicPartition, Map<Long, Sent>> e : sent.entrySet()) {
            int size = e.getValue().size();
            Set<Long> expected = LongRange.of(size);
            Check.equal(expected, new HashSet<>(e.getValue().keySet()), "acknowledged offsets on " + e.getKey());
            total += size;
        }
        Check.equal(from + n, total, "records acknowledged so far");
        Check.equal(PARTITIONS, sent.size(), "partitions that received records");
    }

    static final class LongRange {
        static Set<Long> of(int n) {
            Set<Long> s = new HashSet<>();
            for (long i = 0; i < n; i++) s.add(i);
            return s;
        }
    }

    static ConsumerRecord<String, String> lastRecord(List<ConsumerRecord<String, String>> records, TopicPartition tp) {
        return records.stream().filter(r -> r.partition() == tp.partition()).reduce((x, y) -> y)
                .orElseThrow(() -> new AssertionError("no record read from " + tp));
    }

    static long lastOffset(List<ConsumerRecord<String, String>> records, TopicPartition tp) {
        return records.stream().filter(r -> r.partition() == tp.partition()).mapToLong(ConsumerRecord::offset).max()
                .orElseThrow(() -> new AssertionError("no record read from " + tp));
    }

    static List<Integer> sorted(Set<TopicPartition> s) {
        return s.stream().map(TopicPartition::partition).sorted().toList();
    }

    static String errors(Member... ms) {
        StringBuilder sb = new StringBuilder();
        for (Member m : ms) if (m.error != null) sb.append("; ").append(m.name).append(" failed: ").append(m.error);
        return sb.toString();
    }

    /** One group member, polling on its own thread (KafkaConsumer is single-threaded). */
    static final class Member implements Runnable, ConsumerRebalanceListener {
        final String name;
        final KafkaConsumer<String, String> consumer;
        final String topic;
        final Thread thread;
        final List<ConsumerRecord<String, String>> records = Collections.synchronizedList(new ArrayList<>());
        final List<Set<TopicPartition>> revoked = Collections.synchronizedList(new ArrayList<>());
        final List<Set<TopicPartition>> assigned = Collections.synchronizedList(new ArrayList<>());
        final CountDownLatch paused = new CountDownLatch(1);
        volatile Set<TopicPartition> readyAssignment = Set.of();
        volatile boolean pauseAll;
        volatile boolean stopping;
        volatile Throwable error;
        volatile Map<TopicPartition, OffsetAndMetadata> committedAtClose;

        Member(String name, String bootstrap, String topic, String group, boolean cooperative) {
            this.name = name;
            this.topic = topic;
            Properties cp = new Properties();
            cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            cp.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-check-" + name);
            cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            if (cooperative) {
                cp.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
                        "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
            }
            this.consumer = new KafkaConsumer<>(cp);
            this.thread = new Thread(this, "member-" + name);
            this.thread.setDaemon(true);
        }

        void start() {
            thread.start();
        }

        int count() {
            return records.size();
        }

        /** The assignment, once a position is known for each of its partitions. */
        Set<TopicPartition> ready() {
            return readyAssignment;
        }

        void stop() throws InterruptedException {
            stopping = true;
            thread.join(WAIT.toMillis());
            Check.that(!thread.isAlive(), name + " did not stop");
        }

        @Override
        public void run() {
            try {
                consumer.subscribe(List.of(topic), this);
                while (!stopping) {
                    if (pauseAll) {
                        consumer.pause(consumer.assignment());
                        paused.countDown();
                    }
                    ConsumerRecords<String, String> polled = consumer.poll(Duration.ofMillis(100));
                    polled.forEach(records::add);
                    if (!polled.isEmpty()) {
                        try {
                            consumer.commitSync();
                        } catch (RebalanceInProgressException e) {
                            // Cooperative rebalance under way: these positions are committed
                            // at the next poll, or by onPartitionsRevoked for revoked ones.
                        }
                    }
                    Set<TopicPartition> asg = consumer.assignment();
                    for (TopicPartition tp : asg) consumer.position(tp, Duration.ofSeconds(30));
                    readyAssignment = Set.copyOf(asg);
                }
                consumer.commitSync();
                committedAtClose = consumer.committed(consumer.assignment(), Duration.ofSeconds(30));
            } catch (Throwable t) {
                error = t;
                t.printStackTrace();
            } finally {
                consumer.close();
            }
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            revoked.add(Set.copyOf(partitions));
            if (!partitions.isEmpty()) {
                Map<TopicPartition, OffsetAndMetadata> offs = new HashMap<>();
                for (TopicPartition tp : partitions) {
                    // With the leader epoch of the last record read, as commitSync() would.
                    long position = consumer.position(tp);
                    java.util.Optional<Integer> epoch = records.stream()
                            .filter(r -> r.partition() == tp.partition() && r.offset() == position - 1)
                            .findFirst().flatMap(ConsumerRecord::leaderEpoch);
                    offs.put(tp, new OffsetAndMetadata(position, epoch, ""));
                }
                consumer.commitSync(offs);
            }
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            assigned.add(Set.copyOf(partitions));
        }
    }
}
