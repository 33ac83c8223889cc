package spate.javatest;

import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListTopicsOptions;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.GroupIdNotFoundException;
import org.apache.kafka.common.errors.GroupNotEmptyException;
import org.apache.kafka.common.errors.GroupSubscribedToTopicException;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The AdminClient against Spate: the cluster, topics, configs, consumer groups and their
 * offsets, each result read back and compared.
 *
 * <p>Usage: AdminCheck BOOTSTRAP REPLICATION_FACTOR BROKER_COUNT
 */
public final class AdminCheck {
    static final Duration WAIT = Duration.ofSeconds(60);
    static final int RECORDS_PER_PARTITION = 10;

    public static void main(String[] args) {
        Check.main(() -> scenario(args));
    }

    static void scenario(String[] args) throws Exception {
        String bootstrap = args[0];
        short rf = Short.parseShort(args[1]);
        int brokers = Integer.parseInt(args[2]);
        String suffix = Long.toString(System.nanoTime(), 36);
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            cluster(admin, brokers);
            String t1 = "java-admin-a-" + suffix, t2 = "java-admin-b-" + suffix;
            topics(admin, t1, t2, rf);
            configs(admin, t1);
            groups(admin, bootstrap, t1, "java-admin-group-" + suffix);
            deleteTopic(admin, t2);
        }
        Check.log("PASS: AdminCheck rf=" + rf + " brokers=" + brokers);
    }

    static <T> T get(org.apache.kafka.common.KafkaFuture<T> f) throws Exception {
        return f.get(WAIT.toSeconds(), TimeUnit.SECONDS);
    }

    /** The cause of a failed future, which must be of `type`. */
    static Throwable failure(org.apache.kafka.common.KafkaFuture<?> f, Class<? extends Throwable> type, String what)
            throws Exception {
        try {
            Object v = f.get(WAIT.toSeconds(), TimeUnit.SECONDS);
            throw new AssertionError(what + ": expected " + type.getSimpleName() + ", it succeeded with " + v);
        } catch (ExecutionException e) {
            Check.that(type.isInstance(e.getCause()), what + ": expected " + type.getSimpleName() + ", got " + e.getCause());
            return e.getCause();
        }
    }

    static void cluster(Admin admin, int brokers) throws Exception {
        DescribeClusterResult dc = admin.describeCluster();
        Collection<Node> nodes = get(dc.nodes());
        Check.equal(brokers, nodes.size(), "describeCluster nodes " + nodes);
        Check.equal(brokers, nodes.stream().map(Node::id).distinct().count(), "distinct node ids " + nodes);
        Check.equal(brokers, nodes.stream().map(n -> n.host() + ":" + n.port()).distinct().count(), "distinct addresses " + nodes);
        Node controller = get(dc.controller());
        Check.that(controller != null && nodes.contains(controller), "controller " + controller + " among " + nodes);
        String clusterId = get(dc.clusterId());
        Check.that(clusterId != null && !clusterId.isEmpty(), "cluster id " + clusterId);
        Check.equal(clusterId, get(admin.describeCluster().clusterId()), "cluster id asked twice");
        Check.log("cluster " + clusterId + " nodes " + nodes + " controller " + controller.id());
    }

    static void topics(Admin admin, String t1, String t2, short rf) throws Exception {
        NewTopic n1 = new NewTopic(t1, 3, rf).configs(Map.of("retention.ms", "3600000", "max.message.bytes", "200000"));
        NewTopic n2 = new NewTopic(t2, 1, rf);
        var created = admin.createTopics(List.of(n1, n2));
        get(created.all());
        Check.equal(3, get(created.numPartitions(t1)), "numPartitions of created " + t1);
        Check.equal((int) rf, get(created.replicationFactor(t1)), "replicationFactor of created " + t1);
        Uuid createdId = get(created.topicId(t1));
        Check.that(!Uuid.ZERO_UUID.equals(createdId), "topic id of created " + t1 + ": " + createdId);

        failure(admin.createTopics(List.of(new NewTopic(t1, 3, rf))).all(), TopicExistsException.class, "creating " + t1 + " again");
        failure(admin.createTopics(List.of(new NewTopic(t1 + "-bad", 1, rf).configs(Map.of("no.such.config", "1")))).all(),
                InvalidConfigurationException.class, "creating a topic with an unknown config");

        // The admin asks any broker, which may learn of the new topics a moment later.
        Check.eventually(WAIT, "listTopics", () -> {
            Set<String> names = get(admin.listTopics().names());
            Check.that(names.containsAll(Set.of(t1, t2)), "listTopics " + names + " has " + t1 + " and " + t2);
            Check.that(!names.contains(t1 + "-bad"), "listTopics has the refused topic: " + names);
            Check.that(names.stream().noneMatch(n -> n.startsWith("__")), "listTopics without internal topics: " + names);
            var listings = get(admin.listTopics(new ListTopicsOptions().listInternal(true)).namesToListings());
            Check.that(listings.containsKey(t1), "listTopics(listInternal) has " + t1 + ": " + listings.keySet());
            Check.equal(false, listings.get(t1).isInternal(), t1 + " is internal");
            Check.equal(createdId, listings.get(t1).topicId(), "listTopics topic id of " + t1);
        });

        // In a cluster, every broker learns a new topic's leaders shortly after it is created.
        Check.waitUntil(WAIT, "leaders for every partition of " + t1, () -> {
            try {
                TopicDescription td = get(admin.describeTopics(List.of(t1)).allTopicNames()).get(t1);
                return td.partitions().stream().allMatch(p -> p.leader() != null && p.isr().size() == rf);
            } catch (Exception e) {
                return false;
            }
        }, () -> "not yet");
        TopicDescription td = get(admin.describeTopics(List.of(t1)).allTopicNames()).get(t1);
        Check.equal(t1, td.name(), "describeTopics name");
        Check.equal(false, td.isInternal(), "describeTopics internal");
        Check.equal(createdId, td.topicId(), "describeTopics topic id");
        Check.equal(List.of(0, 1, 2), td.partitions().stream().map(TopicPartitionInfo::partition).toList(), "partitions");
        for (TopicPartitionInfo p : td.partitions()) {
            Check.equal((int) rf, p.replicas().size(), "replicas of " + t1 + "/" + p.partition());
            Check.equal((int) rf, new HashSet<>(p.replicas()).size(), "distinct replicas of " + t1 + "/" + p.partition());
            Check.equal(new HashSet<>(p.replicas()), new HashSet<>(p.isr()), "isr of " + t1 + "/" + p.partition());
            Check.that(p.replicas().contains(p.leader()), "leader " + p.leader() + " among replicas " + p.replicas());
        }
        // Describing by topic id gives the same topic.
        var byId = get(admin.describeTopics(org.apache.kafka.common.TopicCollection.ofTopicIds(List.of(createdId))).allTopicIds());
        Check.equal(t1, byId.get(createdId).name(), "describeTopics by id");
        failure(admin.describeTopics(List.of(t1 + "-bad")).allTopicNames(), UnknownTopicOrPartitionException.class,
                "describing a topic that was refused");
    }

    static Map<String, ConfigEntry> describe(Admin admin, ConfigResource r) throws Exception {
        Config c = get(admin.describeConfigs(List.of(r)).all()).get(r);
        return c.entries().stream().collect(Collectors.toMap(ConfigEntry::name, e -> e));
    }

    static void configs(Admin admin, String t1) throws Exception {
        ConfigResource r = new ConfigResource(ConfigResource.Type.TOPIC, t1);
        Check.eventually(WAIT, "describeConfigs of the new topic", () -> {
            Map<String, ConfigEntry> c = describe(admin, r);
            Check.equal("3600000", c.get("retention.ms").value(), "retention.ms");
            Check.equal(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, c.get("retention.ms").source(), "retention.ms source");
            Check.equal("200000", c.get("max.message.bytes").value(), "max.message.bytes");
            Check.equal("1073741824", c.get("segment.bytes").value(), "segment.bytes default");
            Check.equal(ConfigEntry.ConfigSource.DEFAULT_CONFIG, c.get("segment.bytes").source(), "segment.bytes source");
            Check.equal("delete", c.get("cleanup.policy").value(), "cleanup.policy default");
        });

        var ops = List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("max.message.bytes", ""), AlterConfigOp.OpType.DELETE),
                new AlterConfigOp(new ConfigEntry("segment.bytes", "104857600"), AlterConfigOp.OpType.SET));
        get(admin.incrementalAlterConfigs(Map.of(r, ops)).all());
        // Each describeConfigs may land on another broker, which learns the change a moment
        // later (as in Kafka, metadata reaches the brokers one by one): every check of the
        // altered configs is one attempt, repeated until a broker answers it whole.
        Check.eventually(WAIT, "the altered configs of " + t1, () -> {
            Map<String, ConfigEntry> c = describe(admin, r);
            Check.equal("7200000", c.get("retention.ms").value(), "retention.ms after SET");
            Check.equal(ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG, c.get("retention.ms").source(), "retention.ms source after SET");
            Check.equal("104857600", c.get("segment.bytes").value(), "segment.bytes after SET");
            Check.equal(ConfigEntry.ConfigSource.DEFAULT_CONFIG, c.get("max.message.bytes").source(), "max.message.bytes source after DELETE");
            Check.equal("1048588", c.get("max.message.bytes").value(), "max.message.bytes after DELETE (the default)");
        });

        // An unknown config is refused, and nothing else in the request is applied.
        var bad = List.of(new AlterConfigOp(new ConfigEntry("retention.ms", "1000"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET));
        failure(admin.incrementalAlterConfigs(Map.of(r, bad)).all(), InvalidConfigurationException.class,
                "incrementalAlterConfigs with an unknown config");
        Check.eventually(WAIT, "retention.ms after a refused alter", () ->
                Check.equal("7200000", describe(admin, r).get("retention.ms").value(), "retention.ms after a refused alter"));

        // A broker's configs: its id, and the topic defaults under their broker names.
        Node any = get(admin.describeCluster().nodes()).iterator().next();
        Map<String, ConfigEntry> b = describe(admin, new ConfigResource(ConfigResource.Type.BROKER, Integer.toString(any.id())));
        Check.equal(Integer.toString(any.id()), b.get("broker.id").value(), "broker.id of node " + any.id());
        Check.that(b.containsKey("log.retention.ms"), "node " + any.id() + " describes log.retention.ms: " + b.keySet());
        Check.equal("604800000", b.get("log.retention.ms").value(), "log.retention.ms of node " + any.id());
    }

    static Map<TopicPartition, Long> offsets(Admin admin, String group) throws Exception {
        Map<TopicPartition, Long> out = new HashMap<>();
        get(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata()).forEach((tp, om) -> out.put(tp, om.offset()));
        return out;
    }

    static Properties consumerProps(String bootstrap, String group) {
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        cp.put(ConsumerConfig.CLIENT_ID_CONFIG, "java-admin-check");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        // The group starts from the beginning: the records were written before it existed.
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        return cp;
    }

    static void groups(Admin admin, String bootstrap, String topic, String group) throws Exception {
        Set<TopicPartition> all = Set.of(new TopicPartition(topic, 0), new TopicPartition(topic, 1), new TopicPartition(topic, 2));
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
            for (int part = 0; part < 3; part++) {
                for (int i = 0; i < RECORDS_PER_PARTITION; i++) {
                    p.send(new ProducerRecord<>(topic, part, null, part + "-" + i)).get(WAIT.toSeconds(), TimeUnit.SECONDS);
                }
            }
        }
        Map<TopicPartition, Long> ends = all.stream().collect(Collectors.toMap(tp -> tp, tp -> (long) RECORDS_PER_PARTITION));

        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(consumerProps(bootstrap, group))) {
            c.subscribe(List.of(topic));
            Map<TopicPartition, Long> read = new HashMap<>();
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (!read.equals(ends)) {
                Check.that(System.nanoTime() < deadline, "consumer read " + read + " of " + ends);
                for (ConsumerRecord<String, String> rec : c.poll(Duration.ofMillis(200))) {
                    TopicPartition tp = new TopicPartition(rec.topic(), rec.partition());
                    long expectedOffset = read.getOrDefault(tp, 0L);
                    Check.equal(expectedOffset, rec.offset(), "offset read from " + tp);
                    Check.equal(rec.partition() + "-" + rec.offset(), rec.value(), "value at " + tp + "@" + rec.offset());
                    read.put(tp, expectedOffset + 1);
                }
            }
            c.commitSync();
            Check.equal(ends, c.committed(all).entrySet().stream()
                    .collect(Collectors.toMap(Map.Entry::getKey, e -> e.getValue().offset())), "committed() after commitSync");

            // While the member is in the group.
            Collection<ConsumerGroupListing> listed = get(admin.listConsumerGroups().all());
            ConsumerGroupListing l = listed.stream().filter(g -> g.groupId().equals(group)).findFirst()
                    .orElseThrow(() -> new AssertionError("listConsumerGroups " + listed + " lacks " + group));
            Check.equal(false, l.isSimpleConsumerGroup(), "listed group is simple");
            Check.equal(java.util.Optional.of(GroupState.STABLE), l.groupState(), "listed group state");
            ConsumerGroupDescription d = get(admin.describeConsumerGroups(List.of(group)).describedGroups().get(group));
            Check.equal(GroupState.STABLE, d.groupState(), "described group state");
            Check.equal("range", d.partitionAssignor(), "described group assignor");
            Check.equal(1, d.members().size(), "described members " + d.members());
            MemberDescription m = d.members().iterator().next();
            Check.equal("java-admin-check", m.clientId(), "member client id");
            Check.equal(all, m.assignment().topicPartitions(), "member assignment");
            Check.that(d.coordinator() != null && d.coordinator().id() >= 0, "coordinator " + d.coordinator());
            failure(admin.deleteConsumerGroups(List.of(group)).all(), GroupNotEmptyException.class, "deleting a group with a member");
        }

        // Empty now: the offsets stay.
        ConsumerGroupDescription d = get(admin.describeConsumerGroups(List.of(group)).describedGroups().get(group));
        Check.equal(GroupState.EMPTY, d.groupState(), "group state after the member left");
        Check.equal(0, d.members().size(), "members after the member left");
        Check.equal(ends, offsets(admin, group), "listConsumerGroupOffsets");

        Map<TopicPartition, OffsetAndMetadata> altered = new HashMap<>();
        int i = 0;
        for (TopicPartition tp : all.stream().sorted((x, y) -> x.partition() - y.partition()).toList()) {
            altered.put(tp, new OffsetAndMetadata(2L + 3 * i++, "meta-" + tp.partition()));
        }
        get(admin.alterConsumerGroupOffsets(group, altered).all());
        Check.equal(altered.entrySet().stream().collect(Collectors.toMap(Map.Entry::getKey, e -> e.getValue().offset())),
                offsets(admin, group), "listConsumerGroupOffsets after alterConsumerGroupOffsets");
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(consumerProps(bootstrap, group))) {
            Map<TopicPartition, OffsetAndMetadata> committed = c.committed(all);
            for (TopicPartition tp : all) {
                Check.equal(altered.get(tp).offset(), committed.get(tp).offset(), "committed() of " + tp + " after the alter");
                Check.equal(altered.get(tp).metadata(), committed.get(tp).metadata(), "committed metadata of " + tp);
            }
            // A member resumes from the altered offsets.
            c.subscribe(List.of(topic));
            Map<TopicPartition, Long> first = new HashMap<>();
            long deadline = System.nanoTime() + WAIT.toNanos();
            while (first.size() < 3) {
                Check.that(System.nanoTime() < deadline, "first offsets read after the alter: " + first);
                for (ConsumerRecord<String, String> rec : c.poll(Duration.ofMillis(200))) {
                    first.putIfAbsent(new TopicPartition(rec.topic(), rec.partition()), rec.offset());
                }
            }
            for (TopicPartition tp : all) Check.equal(altered.get(tp).offset(), first.get(tp), "first offset read from " + tp);
            c.commitSync();
            // A group subscribed to the topic keeps its offsets (OffsetDelete).
            failure(admin.deleteConsumerGroupOffsets(group, Set.of(new TopicPartition(topic, 0))).all(),
                    GroupSubscribedToTopicException.class, "deleting the offsets of a subscribed topic");
        }

        // Empty again: one partition's offset deleted, the others kept.
        Map<TopicPartition, Long> before = offsets(admin, group);
        Check.equal(all, before.keySet(), "partitions with offsets before OffsetDelete");
        get(admin.deleteConsumerGroupOffsets(group, Set.of(new TopicPartition(topic, 0))).all());
        Map<TopicPartition, Long> kept = new HashMap<>(before);
        kept.remove(new TopicPartition(topic, 0));
        Check.equal(kept, offsets(admin, group), "offsets after deleting partition 0's");

        get(admin.deleteConsumerGroups(List.of(group)).all());
        Collection<ConsumerGroupListing> after = get(admin.listConsumerGroups().all());
        Check.that(after.stream().noneMatch(g -> g.groupId().equals(group)), "listConsumerGroups after delete: " + after);
        Check.equal(Map.of(), offsets(admin, group), "offsets of the deleted group");
        try {
            ConsumerGroupDescription gone = get(admin.describeConsumerGroups(List.of(group)).describedGroups().get(group));
            Check.equal(GroupState.DEAD, gone.groupState(), "state of the deleted group");
        } catch (ExecutionException e) {
            Check.that(e.getCause() instanceof GroupIdNotFoundException, "describing the deleted group: " + e.getCause());
        }
        Check.log("groups: list, describe, offsets, alter, delete ok");
    }

    /** Deletes t2 by its topic id (DeleteTopics v6, KIP-516), then again by name and by id. */
    static void deleteTopic(Admin admin, String t2) throws Exception {
        Uuid id = get(admin.describeTopics(List.of(t2)).allTopicNames()).get(t2).topicId();
        get(admin.deleteTopics(org.apache.kafka.common.TopicCollection.ofTopicIds(List.of(id))).all());
        // Each broker learns of the deletion a moment later (as in Kafka): the admin asks
        // any of them, so wait until neither listTopics nor describeTopics has it.
        Check.waitUntil(WAIT, t2 + " gone from listTopics and describeTopics", () -> {
            try {
                if (get(admin.listTopics().names()).contains(t2)) return false;
                get(admin.describeTopics(List.of(t2)).allTopicNames());
                return false;
            } catch (ExecutionException e) {
                return e.getCause() instanceof UnknownTopicOrPartitionException;
            } catch (Exception e) {
                return false;
            }
        }, () -> "still listed or described");
        // Not described once more here: the admin may ask another broker, which can
        // still be a moment behind (a loaded CI machine showed it). Deletion goes to the
        // controller, which knows.
        failure(admin.deleteTopics(List.of(t2)).all(), UnknownTopicOrPartitionException.class, "deleting " + t2 + " again");
        failure(admin.deleteTopics(org.apache.kafka.common.TopicCollection.ofTopicIds(List.of(id))).all(),
                org.apache.kafka.common.errors.UnknownTopicIdException.class, "deleting " + t2 + " again by its id");
    }
}
