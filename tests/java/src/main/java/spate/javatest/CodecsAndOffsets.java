package spate.javatest;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Every compression codec of the Java producer (otherwise its defaults), read back by a
 * consumer without a group; offsets by time and the log's ends through the consumer and
 * the admin (ListOffsets); partitions added with createPartitions.
 *
 * <p>Usage: CodecsAndOffsets BOOTSTRAP REPLICATION_FACTOR
 *
 * <p>Lookups by time probe records inside uncompressed and compressed batches: Kafka
 * (FileRecords.searchForTimestamp) decompresses a batch to answer the exact record, where
 * Spate used to answer the batch's base offset.
 */
public final class CodecsAndOffsets {
    static final String[] CODECS = {"none", "gzip", "snappy", "lz4", "zstd"};
    static final int PER_CODEC = 300;
    static final long WAIT_S = 60;

    public static void main(String[] args) {
        Check.main(() -> scenario(args));
    }

    static void scenario(String[] args) throws Exception {
        String bootstrap = args[0];
        short rf = Short.parseShort(args[1]);
        String topic = "java-codecs-" + Long.toString(System.nanoTime(), 36);
        TopicPartition tp = new TopicPartition(topic, 0);
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(List.of(new NewTopic(topic, 1, rf))).all().get(WAIT_S, TimeUnit.SECONDS);

            // One partition, one producer per codec; timestamps 1000 apart from a base.
            long base = System.currentTimeMillis() - 10_000_000L;
            List<String> values = new ArrayList<>();
            List<Long> stamps = new ArrayList<>();
            for (String codec : CODECS) {
                Properties pp = new Properties();
                pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
                pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
                pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
                pp.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
                List<Future<RecordMetadata>> fs = new ArrayList<>();
                try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
                    for (int i = 0; i < PER_CODEC; i++) {
                        int n = values.size();
                        String v = codec + "-" + i + "-" + "abc".repeat(i % 40);
                        long ts = base + 1000L * n;
                        values.add(v);
                        stamps.add(ts);
                        fs.add(p.send(new ProducerRecord<>(topic, 0, ts, "k" + n, v)));
                    }
                    p.flush();
                }
                int first = values.size() - PER_CODEC;
                for (int i = 0; i < fs.size(); i++) {
                    RecordMetadata md = fs.get(i).get(WAIT_S, TimeUnit.SECONDS);
                    Check.equal((long) first + i, md.offset(), codec + " record " + i + " offset");
                    Check.equal(stamps.get(first + i), md.timestamp(), codec + " record " + i + " timestamp");
                }
            }
            int total = values.size();

            Properties cp = new Properties();
            cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
                c.assign(List.of(tp));
                Check.equal(Map.of(tp, 0L), c.beginningOffsets(List.of(tp)), "beginningOffsets");
                Check.equal(Map.of(tp, (long) total), c.endOffsets(List.of(tp)), "endOffsets");
                c.seekToBeginning(List.of(tp));
                int next = 0;
                long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(WAIT_S);
                while (next < total) {
                    Check.that(System.nanoTime() < deadline, "read " + next + " of " + total);
                    for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                        Check.equal((long) next, r.offset(), "offset");
                        Check.equal(values.get(next), r.value(), "value at " + r.offset());
                        Check.equal("k" + next, r.key(), "key at " + r.offset());
                        Check.equal(stamps.get(next), r.timestamp(), "timestamp at " + r.offset());
                        next++;
                    }
                }
                // offsetsForTimes: the first offset whose timestamp is at or after t.
                int probe = 117; // in the uncompressed batches
                Map<TopicPartition, OffsetAndTimestamp> byTime = c.offsetsForTimes(Map.of(tp, stamps.get(probe) - 500));
                Check.equal((long) probe, byTime.get(tp).offset(), "offsetsForTimes offset");
                Check.equal(stamps.get(probe), byTime.get(tp).timestamp(), "offsetsForTimes timestamp");
                Check.that(c.offsetsForTimes(Map.of(tp, stamps.get(total - 1) + 1)).get(tp) == null,
                        "offsetsForTimes after the last record is null");
            }

            Map<TopicPartition, OffsetSpec> specs = new HashMap<>();
            specs.put(tp, OffsetSpec.earliest());
            Check.equal(0L, admin.listOffsets(specs).partitionResult(tp).get(WAIT_S, TimeUnit.SECONDS).offset(), "admin earliest");
            specs.put(tp, OffsetSpec.latest());
            Check.equal((long) total, admin.listOffsets(specs).partitionResult(tp).get(WAIT_S, TimeUnit.SECONDS).offset(), "admin latest");
            int probe = 205; // in the uncompressed batches
            specs.put(tp, OffsetSpec.forTimestamp(stamps.get(probe)));
            ListOffsetsResult.ListOffsetsResultInfo info = admin.listOffsets(specs).partitionResult(tp).get(WAIT_S, TimeUnit.SECONDS);
            Check.equal((long) probe, info.offset(), "admin offset for timestamp");
            Check.equal(stamps.get(probe), info.timestamp(), "admin timestamp for timestamp");

            // One record inside the batches of each codec (0-299 none, 300-599 gzip, ...).
            for (int codec = 1; codec < CODECS.length; codec++) {
                int inside = PER_CODEC * codec + 17;
                specs.put(tp, OffsetSpec.forTimestamp(stamps.get(inside) - 500));
                var r = admin.listOffsets(specs).partitionResult(tp).get(WAIT_S, TimeUnit.SECONDS);
                Check.equal((long) inside, r.offset(), "offsetsForTimes in a compressed batch (" + CODECS[codec]
                        + "): the offset of the first record at or after the time");
                Check.equal(stamps.get(inside), r.timestamp(), "offsetsForTimes in a compressed batch (" + CODECS[codec]
                        + "): that record's timestamp");
            }

            admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get(WAIT_S, TimeUnit.SECONDS);
            Check.waitUntil(Duration.ofSeconds(WAIT_S), topic + " with 3 partitions", () -> {
                try {
                    var td = admin.describeTopics(List.of(topic)).allTopicNames().get(WAIT_S, TimeUnit.SECONDS).get(topic);
                    return td.partitions().size() == 3 && td.partitions().stream().allMatch(p -> p.leader() != null);
                } catch (Exception e) {
                    return false;
                }
            }, () -> "not yet");
            Properties pp = new Properties();
            pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
            try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
                RecordMetadata md = p.send(new ProducerRecord<>(topic, 2, null, "on the new partition")).get(WAIT_S, TimeUnit.SECONDS);
                Check.equal(2, md.partition(), "partition of the record sent to the new partition");
                Check.equal(0L, md.offset(), "offset of the first record on the new partition");
            }
        }
        Check.log("PASS: CodecsAndOffsets rf=" + args[1]);
    }
}
