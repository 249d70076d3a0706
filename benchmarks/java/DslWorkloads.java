// The DSL workloads of benchmarks/dsl_workloads.py on Kafka Streams: the same logic as
// benchmarks/peers/streamloop.py, JSON values through a Jackson serde (as streamloop's JsonSerde).
// Windows and gaps come as system properties (-Dbench.join.window.ms=...), set by
// benchmarks/peers/kafka_streams.py from dsl_workloads.PARAMETERS.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.time.Duration;
import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.JoinWindows;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.StreamJoined;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;

final class DslWorkloads {
    private static final ObjectMapper JSON = new ObjectMapper();
    static final Serde<JsonNode> JSON_SERDE = Serdes.serdeFrom(new JsonSerializer(), new JsonDeserializer());

    private DslWorkloads() {}

    static void build(String workload, StreamsBuilder builder, String[] sources, String sink) {
        Consumed<String, JsonNode> jsonIn = Consumed.with(Serdes.String(), JSON_SERDE);
        Produced<String, JsonNode> jsonOut = Produced.with(Serdes.String(), JSON_SERDE);
        Produced<String, String> textOut = Produced.with(Serdes.String(), Serdes.String());
        switch (workload) {
            case "join" -> {
                KStream<String, JsonNode> orders = builder.stream(sources[0], jsonIn);
                KStream<String, JsonNode> payments = builder.stream(sources[1], jsonIn);
                JoinWindows windows = JoinWindows.ofTimeDifferenceAndGrace(millis("join.window.ms"),
                    millis("join.grace.ms"));
                orders.join(payments, DslWorkloads::paid, windows,
                        StreamJoined.with(Serdes.String(), JSON_SERDE, JSON_SERDE))
                    .to(sink, jsonOut);
            }
            case "suppress" -> builder.stream(sources[0], Consumed.with(Serdes.String(), Serdes.String()))
                .groupByKey()
                .windowedBy(TimeWindows.ofSizeWithNoGrace(millis("suppress.window.ms")))
                .count()
                .suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()))
                .toStream()
                .map((window, n) -> KeyValue.pair(window.key() + "@" + window.window().start(), String.valueOf(n)))
                .to(sink, textOut);
            case "session" -> builder.stream(sources[0], Consumed.with(Serdes.String(), Serdes.String()))
                .groupByKey()
                .windowedBy(SessionWindows.ofInactivityGapWithNoGrace(millis("session.gap.ms")))
                .count()
                .toStream()
                // A merged-away session goes out as a tombstone (value null), as in streamloop.
                .map((session, n) -> KeyValue.pair(session.key() + "@" + session.window().start() + "-"
                    + session.window().end(), n == null ? null : String.valueOf(n)))
                .to(sink, textOut);
            case "table-join" -> {
                KTable<String, JsonNode> orders = builder.table(sources[0], jsonIn);
                KTable<String, JsonNode> customers = builder.table(sources[1], jsonIn);
                orders.join(customers, DslWorkloads::enriched).toStream().to(sink, jsonOut);
            }
            case "fk-join" -> {
                KTable<String, JsonNode> orders = builder.table(sources[0], jsonIn);
                KTable<String, JsonNode> customers = builder.table(sources[1], jsonIn);
                orders.join(customers, order -> order.get("customer").asText(), DslWorkloads::enriched)
                    .toStream().to(sink, jsonOut);
            }
            default -> {
                System.err.println("unknown workload: " + workload);
                System.exit(2);
            }
        }
    }

    private static Duration millis(String parameter) {
        String value = System.getProperty("bench." + parameter);
        if (value == null) {
            throw new IllegalStateException("missing -Dbench." + parameter + " (set by benchmarks/peers/kafka_streams.py)");
        }
        return Duration.ofMillis(Long.parseLong(value));
    }

    // dsl_workloads.paid
    private static JsonNode paid(JsonNode order, JsonNode payment) {
        ObjectNode joined = JSON.createObjectNode();
        joined.set("order", order.get("id"));
        joined.set("customer", order.get("customer"));
        joined.set("amount", order.get("amount"));
        joined.set("method", payment.get("method"));
        return joined;
    }

    // dsl_workloads.enriched
    private static JsonNode enriched(JsonNode order, JsonNode customer) {
        ObjectNode joined = JSON.createObjectNode();
        joined.set("order", order.get("id"));
        joined.set("customer", customer.get("id"));
        joined.set("amount", order.get("amount"));
        joined.set("tier", customer.get("tier"));
        joined.set("version", customer.get("version"));
        return joined;
    }

    private static final class JsonSerializer implements Serializer<JsonNode> {
        @Override
        public byte[] serialize(String topic, JsonNode value) {
            if (value == null) {
                return null;
            }
            try {
                return JSON.writeValueAsBytes(value);
            } catch (IOException exc) {
                throw new IllegalStateException(exc);
            }
        }
    }

    private static final class JsonDeserializer implements Deserializer<JsonNode> {
        @Override
        public JsonNode deserialize(String topic, byte[] data) {
            if (data == null) {
                return null;
            }
            try {
                return JSON.readTree(data);
            } catch (IOException exc) {
                throw new IllegalArgumentException("not JSON", exc);
            }
        }
    }
}
