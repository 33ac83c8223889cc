package spate.javatest;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The consumer with `group.protocol=consumer` (KIP-848: ConsumerGroupHeartbeat, the
 * broker assigns partitions). Reads back 30 records over 3 partitions and commits.
 *
 * <p>Usage: ConsumerProtocol BOOTSTRAP
 */
public final class ConsumerProtocol {
    public static void main(String[] args) {
        Check.main(() -> scenario(args));
    }

    static void scenario(String[] args) throws Exception {
        String bootstrap = args[0];
        String suffix = Long.toString(System.nanoTime(), 36);
        String topic = "java-kip848-" + suffix;
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap)) {
            admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all().get(60, TimeUnit.SECONDS);
        }
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaProducer<String, String> p = new KafkaProducer<>(pp)) {
            for (int i = 0; i < 30; i++) p.send(new ProducerRecord<>(topic, i % 3, null, "v" + i)).get(60, TimeUnit.SECONDS);
        }
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, "java-kip848-" + suffix);
        cp.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Map<Integer, Integer> next = new HashMap<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
            c.subscribe(List.of(topic));
            long deadline = System.nanoTime() + Duration.ofSeconds(40).toNanos();
            int read = 0;
            while (read < 30) {
                Check.that(System.nanoTime() < deadline, "read " + read + " of 30 records with group.protocol=consumer");
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    int expected = next.getOrDefault(r.partition(), 0);
                    Check.equal((long) expected, r.offset(), "offset on partition " + r.partition());
                    Check.equal("v" + (expected * 3 + r.partition()), r.value(), "value at " + r.partition() + "@" + r.offset());
                    next.put(r.partition(), expected + 1);
                    read++;
                }
            }
            c.commitSync();
        }
        Check.log("PASS: ConsumerProtocol");
    }
}
