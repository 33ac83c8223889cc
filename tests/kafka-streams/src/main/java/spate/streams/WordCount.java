package spate.streams;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

/**
 * The word count of Kafka Streams' own examples, run against Spate by
 * tests/test_kafka_streams.py:
 *
 *   input (lines) -> flatMapValues(split on spaces) -> groupBy(word) -> count() -> output
 *
 * groupBy re-keys the stream, so Streams writes it through a repartition topic
 * (APPLICATION_ID-word-counts-repartition) before the count; count() is materialized as
 * the persistent (RocksDB) key-value store "word-counts", which Streams backs with a
 * compacted changelog topic (APPLICATION_ID-word-counts-changelog). Streams creates both
 * topics itself; the input and output topics are the test's. Output records: the word as
 * a String key, its count as a Long value (8 bytes, big-endian).
 *
 * Configuration: only what Streams requires (application.id, bootstrap.servers), the
 * state directory (a per-test folder instead of /tmp/kafka-streams), and
 * processing.guarantee when the caller passes one other than "default"; Streams' and the
 * clients' defaults for everything else.
 *
 * usage: WordCount BOOTSTRAP APPLICATION_ID INPUT_TOPIC OUTPUT_TOPIC STATE_DIR GUARANTEE
 *
 * It reports on stdout, one JSON object a line after "EVENT ": state changes
 * {"event":"state",...}, restoration of the store from its changelog
 * {"event":"restore_start"|"restore_end",...}, an uncaught exception {"event":"error",...}
 * (then it exits 1). It reads commands on stdin: "store ID" prints the store's contents
 * as {"event":"store","id":ID,"counts":{word: count, ...}} (or "error" while the store
 * cannot be queried); "close" closes Streams and exits 0, as does the end of stdin.
 */
public final class WordCount {
    static final String STORE = "word-counts";

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: WordCount BOOTSTRAP APPLICATION_ID INPUT_TOPIC OUTPUT_TOPIC STATE_DIR GUARANTEE");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        if (!args[5].equals("default")) {
            props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args[5]);
        }

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()))
            .flatMapValues(line -> Arrays.asList(line.split(" ")))
            .groupBy((key, word) -> word, Grouped.with(Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(STORE)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()))
            .toStream()
            .to(args[3], Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch failed = new CountDownLatch(1);
        streams.setStateListener((now, before) ->
            event("{\"event\":\"state\",\"old\":" + str(before.name()) + ",\"new\":" + str(now.name()) + "}"));
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition tp, String store, long startingOffset, long endingOffset) {
                event("{\"event\":\"restore_start\",\"topic\":" + str(tp.topic()) + ",\"partition\":" + tp.partition()
                    + ",\"store\":" + str(store) + ",\"starting_offset\":" + startingOffset
                    + ",\"ending_offset\":" + endingOffset + "}");
            }

            @Override
            public void onBatchRestored(TopicPartition tp, String store, long batchEndOffset, long numRestored) {
            }

            @Override
            public void onRestoreEnd(TopicPartition tp, String store, long totalRestored) {
                event("{\"event\":\"restore_end\",\"topic\":" + str(tp.topic()) + ",\"partition\":" + tp.partition()
                    + ",\"store\":" + str(store) + ",\"total_restored\":" + totalRestored + "}");
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            e.printStackTrace();
            event("{\"event\":\"error\",\"exception\":" + str(String.valueOf(e)) + ",\"cause\":"
                + str(String.valueOf(e.getCause())) + "}");
            failed.countDown();
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });

        Thread commands = new Thread(() -> readCommands(streams), "commands");
        commands.setDaemon(true);
        streams.start();
        commands.start();
        failed.await();
        streams.close(Duration.ofSeconds(10));
        System.out.flush();
        Runtime.getRuntime().halt(1);
    }

    private static void readCommands(KafkaStreams streams) {
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                String[] words = line.trim().split(" ");
                if (words[0].equals("store") && words.length == 2) {
                    event(storeContents(streams, words[1]));
                } else if (words[0].equals("close")) {
                    break;
                } else {
                    System.err.println("unknown command: " + line);
                }
            }
        } catch (Exception e) {
            e.printStackTrace();
        }
        streams.close(Duration.ofSeconds(30));
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }

    private static String storeContents(KafkaStreams streams, String id) {
        StringBuilder out = new StringBuilder("{\"event\":\"store\",\"id\":" + str(id) + ",");
        try {
            ReadOnlyKeyValueStore<String, Long> store =
                streams.store(StoreQueryParameters.fromNameAndType(STORE, QueryableStoreTypes.keyValueStore()));
            out.append("\"counts\":{");
            boolean first = true;
            try (KeyValueIterator<String, Long> all = store.all()) {
                while (all.hasNext()) {
                    KeyValue<String, Long> kv = all.next();
                    out.append(first ? "" : ",").append(str(kv.key)).append(':').append(kv.value);
                    first = false;
                }
            }
            return out.append("}}").toString();
        } catch (Exception e) {
            return out.append("\"error\":").append(str(String.valueOf(e))).append('}').toString();
        }
    }

    private static synchronized void event(String json) {
        System.out.println("EVENT " + json);
        System.out.flush();
    }

    /** A JSON string. */
    private static String str(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
