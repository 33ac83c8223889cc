package spate.javatest;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The transactional producer at its defaults, which uses transactions v2 (KIP-890 part 2)
 * where the cluster finalizes `transaction.version` 2: no AddPartitionsToTxn or
 * AddOffsetsToTxn (the partition leaders and the group coordinator add the partitions,
 * Produce v12 and TxnOffsetCommit v5), and EndTxn v5 bumps the epoch at every end.
 *
 * <p>Three transactions (commit, abort, commit), each writing two partitions and
 * committing a group's offset; then the admin must see the epoch bumped three times, a
 * read_committed consumer exactly the committed records, the group the last committed
 * offset; a second producer with the same transactional id fences the first, whose
 * transaction then cannot commit.
 *
 * <p>Usage: Transactions BOOTSTRAP REPLICATION_FACTOR
 */
public final class Transactions {
    public static void main(String[] args) {
        Check.main(() -> scenario(args));
    }

    static KafkaProducer<String, String> producer(String bootstrap, String txnId) {
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        return new KafkaProducer<>(pp);
    }

    static void transaction(KafkaProducer<String, String> p, String topic, String tag, String input, String group,
            long offset, boolean commit) throws Exception {
        p.beginTransaction();
        for (int partition = 0; partition < 2; partition++) {
            p.send(new ProducerRecord<>(topic, partition, null, tag + "-" + partition)).get(60, TimeUnit.SECONDS);
        }
        p.sendOffsetsToTransaction(Map.of(new TopicPartition(input, 0), new OffsetAndMetadata(offset)),
                new ConsumerGroupMetadata(group));
        if (commit) {
            p.commitTransaction();
        } else {
            p.abortTransaction();
        }
    }

    static void scenario(String[] args) throws Exception {
        String bootstrap = args[0];
        short rf = Short.parseShort(args[1]);
        String suffix = Long.toString(System.nanoTime(), 36);
        String in = "java-txn-in-" + suffix;
        String out = "java-txn-out-" + suffix;
        String group = "java-txn-group-" + suffix;
        String txnId = "java-txn-" + suffix;
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            FeatureMetadata features = admin.describeFeatures().featureMetadata().get(60, TimeUnit.SECONDS);
            FinalizedVersionRange tv = features.finalizedFeatures().get("transaction.version");
            Check.that(tv != null && tv.maxVersionLevel() >= 2, "transaction.version 2 finalized: " + tv);
            admin.createTopics(List.of(new NewTopic(in, 1, rf), new NewTopic(out, 2, rf)))
                    .all().get(60, TimeUnit.SECONDS);

            try (KafkaProducer<String, String> p = producer(bootstrap, txnId)) {
                p.initTransactions();
                transaction(p, out, "committed1", in, group, 5, true);
                transaction(p, out, "aborted2", in, group, 6, false);
                transaction(p, out, "committed3", in, group, 7, true);

                TransactionDescription d = admin.describeTransactions(List.of(txnId)).description(txnId)
                        .get(60, TimeUnit.SECONDS);
                Check.equal("COMPLETE_COMMIT", d.state().name(), "state after the third transaction");
                Check.equal(3, d.producerEpoch(), "epoch after three transactions (one bump per end)");

                // A second producer fences the first: its open transaction cannot commit.
                p.beginTransaction();
                p.send(new ProducerRecord<>(out, 0, null, "zombie"));
                try (KafkaProducer<String, String> second = producer(bootstrap, txnId)) {
                    second.initTransactions();
                    boolean refused = false;
                    try {
                        p.commitTransaction();
                    } catch (KafkaException e) {
                        Check.log("the fenced producer's commit: " + e);
                        refused = true;
                    }
                    Check.that(refused, "the fenced producer's commit was refused");
                    transaction(second, out, "committed4", in, group, 8, true);
                }
            }

            Map<TopicPartition, OffsetAndMetadata> offsets = admin.listConsumerGroupOffsets(group)
                    .partitionsToOffsetAndMetadata().get(60, TimeUnit.SECONDS);
            Check.equal(8L, offsets.get(new TopicPartition(in, 0)).offset(), "the group's committed offset");
        }

        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
            List<TopicPartition> parts = List.of(new TopicPartition(out, 0), new TopicPartition(out, 1));
            c.assign(parts);
            c.seekToBeginning(parts);
            List<String> got = new ArrayList<>();
            long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
            while (got.size() < 6 && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    got.add(r.value());
                }
            }
            // Anything more (the aborted or the zombie's records) would come with these.
            for (ConsumerRecord<String, String> r : c.poll(Duration.ofSeconds(1))) {
                got.add(r.value());
            }
            got.sort(null);
            Check.equal(List.of("committed1-0", "committed1-1", "committed3-0", "committed3-1", "committed4-0",
                    "committed4-1"), got, "what read_committed reads");
        }
        Check.log("PASS: Transactions");
    }
}
