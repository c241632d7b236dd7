// A share-group member on the Java client (kafka-clients' KafkaShareConsumer), a peer for
// tests/share_broker.rs. Run in source-file mode with the broker's jars on the class path:
//
//   java -cp 'LIBS/*' tests/interop/ShareMember.java BOOTSTRAP GROUP TOPIC STOP_FILE SLEEP_MS [REJECT_EVERY]
//
// Subscribes to TOPIC in share group GROUP (explicit acknowledgement), and for every record
// sleeps SLEEP_MS, prints "value<TAB>deliveryCount" and acknowledges it ACCEPT; commits
// after each poll. With REJECT_EVERY = N > 0, a record whose value is "r<i>" with
// i % N == N - 3 is rejected instead and printed "rejected<TAB>value". Stops (closing the consumer: leaves the group) once STOP_FILE exists.
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

public class ShareMember {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2];
        Path stop = Path.of(args[3]);
        long sleepMs = Long.parseLong(args[4]);
        long every = args.length > 5 ? Long.parseLong(args[5]) : 0;
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("share.acknowledgement.mode", "explicit");
        p.put("max.poll.records", "10");
        p.put("client.id", "java-share-member");
        try (KafkaShareConsumer<String, String> c =
                new KafkaShareConsumer<>(p, new StringDeserializer(), new StringDeserializer())) {
            c.subscribe(List.of(topic));
            System.err.println("java share member subscribed");
            while (!Files.exists(stop)) {
                ConsumerRecords<String, String> records = c.poll(Duration.ofMillis(200));
                for (ConsumerRecord<String, String> r : records) {
                    if (sleepMs > 0) {
                        Thread.sleep(sleepMs);
                    }
                    if (rejects(r.value(), every)) {
                        c.acknowledge(r, AcknowledgeType.REJECT);
                        System.out.println("rejected\t" + r.value());
                    } else {
                        System.out.println(r.value() + "\t" + r.deliveryCount().orElse((short) 0));
                        c.acknowledge(r, AcknowledgeType.ACCEPT);
                    }
                }
                System.out.flush();
                if (!records.isEmpty()) {
                    c.commitSync();
                }
            }
        }
    }

    /** The test's rejection rule: "r<i>" with i % every == every - 3. */
    static boolean rejects(String value, long every) {
        if (every <= 0 || value == null || !value.matches("r[0-9]+")) {
            return false;
        }
        return Long.parseLong(value.substring(1)) % every == every - 3;
    }
}
