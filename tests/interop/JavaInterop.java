// The Java client (kafka-clients, the jars of the test broker) as an interop peer for
// tests/java_interop.rs. Run in source-file mode:
//   java -cp 'LIBS/*' tests/interop/JavaInterop.java produce BOOTSTRAP COUNT TOPIC=CODEC...
//   java -cp 'LIBS/*' tests/interop/JavaInterop.java consume BOOTSTRAP COUNT TIMEOUT_MS TOPIC...
// (one JVM serves several topics: a JVM start costs more than the records.)
// produce: per topic COUNT records, key "k<i>", value "java-<codec>-<i>", header "i" = "<i>",
//          through an idempotent acks=all producer with compression.type=CODEC; prints
//          "produced N TOPIC".
// consume: per topic, every partition from the beginning until COUNT records arrive (or the
//          timeout); prints one line per record:
//          topic TAB partition TAB offset TAB key TAB value TAB headers,
//          where headers is "name=value" joined by ";" and a null key or value is "<null>".
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaInterop {
    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "produce" -> {
                for (int a = 3; a < args.length; a++) {
                    String[] tc = args[a].split("=", 2);
                    produce(args[1], tc[0], tc[1], Integer.parseInt(args[2]));
                }
            }
            case "consume" -> {
                for (int a = 4; a < args.length; a++) {
                    consume(args[1], args[a], Integer.parseInt(args[2]), Long.parseLong(args[3]));
                }
            }
            default -> throw new IllegalArgumentException("unknown mode " + args[0]);
        }
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static String text(byte[] b) {
        return b == null ? "<null>" : new String(b, StandardCharsets.UTF_8);
    }

    static void produce(String bootstrap, String topic, String codec, int count) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("enable.idempotence", "true");
        p.put("compression.type", codec);
        p.put("linger.ms", "20");
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                ProducerRecord<byte[], byte[]> r =
                        new ProducerRecord<>(topic, utf8("k" + i), utf8("java-" + codec + "-" + i));
                r.headers().add("i", utf8(Integer.toString(i)));
                sent.add(producer.send(r));
            }
            for (Future<RecordMetadata> f : sent) {
                f.get();
            }
        }
        System.out.println("produced " + count + " " + topic);
    }

    static void consume(String bootstrap, String topic, int count, long timeoutMs) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("enable.auto.commit", "false");
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                parts.add(new TopicPartition(topic, info.partition()));
            }
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long deadline = System.currentTimeMillis() + timeoutMs;
            int seen = 0;
            StringBuilder out = new StringBuilder();
            while (seen < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    StringBuilder headers = new StringBuilder();
                    for (Header h : r.headers()) {
                        if (headers.length() > 0) {
                            headers.append(';');
                        }
                        headers.append(h.key()).append('=').append(text(h.value()));
                    }
                    out.append(topic).append('\t').append(r.partition()).append('\t').append(r.offset()).append('\t')
                            .append(text(r.key())).append('\t').append(text(r.value())).append('\t')
                            .append(headers).append('\n');
                    seen++;
                }
            }
            System.out.print(out);
            System.out.flush();
            if (seen < count) {
                System.err.println(topic + ": only " + seen + " of " + count + " records within " + timeoutMs + " ms");
                System.exit(2);
            }
        }
    }
}
