// The reference peer of benchmarks/compare.py: the same workloads on Apache Kafka Streams.
//
// Usage: java -cp <classes>:<libs>/* StreamsBench <workload> <bootstrap> <application.id> <source> <sink> <threads>
// workload: stateless | async-io | count, or a DSL workload of DslWorkloads.java. Runs until SIGTERM,
// then closes the client.
// Compiled and started by benchmarks/peers/kafka_streams.py; its jars come from pom.xml.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Produced;

public final class StreamsBench {
    private static final ObjectMapper JSON = new ObjectMapper();

    private StreamsBench() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: StreamsBench <workload> <bootstrap> <application.id> "
                + "<source> <sink> <threads>");
            System.exit(2);
        }
        String workload = args[0];
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[2]);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[5]));
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 1000);
        props.put(StreamsConfig.producerPrefix("linger.ms"), 5);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        props.put(StreamsConfig.STATE_DIR_CONFIG, System.getProperty("java.io.tmpdir") + "/streams-bench-" + args[2]);
        // Every count (and DSL) update goes out, as the Python peers do (no record cache holding updates back).
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);

        StreamsBuilder builder = new StreamsBuilder();
        // The DSL workloads read several topics: args[3] is then comma-separated, in their order.
        String[] sources = args[3].split(",");
        Produced<String, String> out = Produced.with(Serdes.String(), Serdes.String());
        switch (workload) {
            case "stateless" -> strings(builder, sources[0])
                .mapValues(StreamsBench::parse)
                .filter((key, order) -> order.get("amount").asDouble() >= 10)
                .mapValues(order -> write(((ObjectNode) order).put("vip", order.get("amount").asDouble() > 1000)))
                .to(args[4], out);
            case "async-io" -> strings(builder, sources[0])
                // Kafka Streams has no asynchronous processors: the 5 ms of I/O block the stream thread.
                .mapValues(value -> {
                    sleep(5);
                    return value;
                })
                .to(args[4], out);
            case "count" -> strings(builder, sources[0])
                .groupByKey()
                .count()
                .toStream()
                .mapValues(String::valueOf)
                .to(args[4], out);
            default -> DslWorkloads.build(workload, builder, sources, args[4]);
        }

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(10));
            stopped.countDown();
        }));
        streams.setUncaughtExceptionHandler(exc -> {
            exc.printStackTrace();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler
                .StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        streams.start();
        stopped.await();
    }

    private static KStream<String, String> strings(StreamsBuilder builder, String topic) {
        return builder.stream(topic, Consumed.with(Serdes.String(), Serdes.String()));
    }

    static JsonNode parse(String value) {
        try {
            return JSON.readTree(value);
        } catch (Exception exc) {
            throw new IllegalArgumentException("not JSON: " + value, exc);
        }
    }

    static String write(JsonNode node) {
        try {
            return JSON.writeValueAsString(node);
        } catch (Exception exc) {
            throw new IllegalStateException(exc);
        }
    }

    private static void sleep(long millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException exc) {
            Thread.currentThread().interrupt();
        }
    }
}
