# shellcheck shell=bash
# Helpers for the pinned Apache Kafka broker of the tests, examples and benches
# (testing/kafka/pom.xml). Source this file; it defines functions only and changes no shell
# options.
#
#   kafka_version       -> the broker version: KAFKAPIPE_KAFKA_VERSION, else the pom's
#   kafka_ensure        -> collects the broker's jars from Maven Central into
#                          KAFKAPIPE_KAFKA_LIBS (default ~/.cache/kafkapipe/kafka-VERSION)
#                          unless they are there; exports KAFKAPIPE_KAFKA_LIBS
#   confluent_ensure    -> pip-installs confluent-kafka (librdkafka) if it cannot be imported
#   oidc_ensure         -> pip-installs cryptography (the test identity provider) if missing
#   kafka_free_port     -> prints a free loopback TCP port
#   kafka_start         -> formats and starts a single-node KRaft broker with a PLAINTEXT
#                          listener; sets KAFKA_PID, KAFKA_ADDR, KAFKA_LOG, KAFKA_DIR;
#                          returns once it answers ApiVersions and lists itself in Metadata
#   kafka_stop          -> stops the broker started by kafka_start and removes its data
#
# The Rust test harness (tests/common/kafka.rs) starts its own brokers from the same jars.

_kafka_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# The broker version: KAFKAPIPE_KAFKA_VERSION when set (the version matrix, scripts/matrix.sh),
# else the one pinned in testing/kafka/pom.xml.
kafka_version() {
    if [[ -n "${KAFKAPIPE_KAFKA_VERSION:-}" ]]; then
        echo "${KAFKAPIPE_KAFKA_VERSION}"
        return
    fi
    kafka_pom_version
}

kafka_pom_version() {
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "${_kafka_repo}/testing/kafka/pom.xml"
}

kafka_ensure() {
    local dir="${KAFKAPIPE_KAFKA_LIBS:-${HOME}/.cache/kafkapipe/kafka-$(kafka_version)}"
    if [[ ! -f "$dir/.complete" ]]; then
        echo "collecting Apache Kafka $(kafka_version) from Maven Central into $dir" >&2
        local tmp="${dir}.tmp-$$"
        rm -rf "$tmp"
        # Maven Central can refuse a first request on a fresh machine: try three times, and
        # show Maven's own output (on stdout too, which CI logs keep) when it still fails.
        local attempt log
        log="$(mktemp)"
        for attempt in 1 2 3; do
            if mvn -B -f "${_kafka_repo}/testing/kafka/pom.xml" dependency:copy-dependencies \
                -Dkafka.version="$(kafka_version)" -DincludeScope=runtime -DoutputDirectory="$tmp" >"$log" 2>&1; then
                break
            fi
            echo "maven attempt ${attempt} failed:" >&2
            tail -n 40 "$log"
            if [[ $attempt -eq 3 ]]; then
                rm -f "$log"
                echo "could not collect Apache Kafka from Maven Central" >&2
                return 1
            fi
            sleep $((attempt * 5))
        done
        rm -f "$log"
        touch "$tmp/.complete"
        mkdir -p "$(dirname "$dir")"
        rm -rf "$dir"
        mv "$tmp" "$dir"
    fi
    export KAFKAPIPE_KAFKA_LIBS="$dir"
}

# pip install that also works where the system Python is marked externally managed (PEP 668).
pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@" >&2 ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@" >&2
}

# The interop tests (tests/interop/*.py) and the consumer bench use confluent-kafka.
confluent_ensure() {
    if ! python3 -c 'import confluent_kafka' 2>/dev/null; then
        echo "installing confluent-kafka from PyPI" >&2
        pip_install confluent-kafka
    fi
}

# The OIDC identity provider of tests/oidc_broker.rs (tests/oidc/idp.py) signs its JWTs
# with the `cryptography` wheel.
oidc_ensure() {
    if ! python3 -c 'import cryptography' 2>/dev/null; then
        echo "installing cryptography from PyPI" >&2
        pip_install cryptography
    fi
}

# A port below the kernel's ephemeral range (32768-60999), which outgoing connections take
# their source ports from: a port bind(0) handed out could be taken by a client connection
# before the broker binds it.
kafka_free_port() {
    python3 -c '
import random, socket
for _ in range(1000):
    port = random.randrange(20000, 32768)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("no free loopback port in 20000-32767")
'
}

# Succeeds once HOST:PORT answers a Metadata v4 request listing broker id 1.
kafka_ping() {
    python3 - "$1" "$2" <<'PY'
import socket, struct, sys
host, port = sys.argv[1], int(sys.argv[2])
client = b"ci-probe"
body = struct.pack(">hhih", 3, 4, 7, len(client)) + client + struct.pack(">ib", 0, 0)
try:
    with socket.create_connection((host, port), timeout=1.0) as s:
        s.settimeout(2.0)
        s.sendall(struct.pack(">i", len(body)) + body)
        buf = b""
        while len(buf) < 4:
            chunk = s.recv(4 - len(buf))
            if not chunk:
                sys.exit(1)
            buf += chunk
        (size,) = struct.unpack(">i", buf)
        data = b""
        while len(data) < size:
            chunk = s.recv(size - len(data))
            if not chunk:
                sys.exit(1)
            data += chunk
    corr, _throttle, n = struct.unpack(">iii", data[:12])
    first = struct.unpack(">i", data[12:16])[0] if n > 0 else None
    sys.exit(0 if corr == 7 and first == 1 else 1)
except (OSError, struct.error):
    sys.exit(1)
PY
}

kafka_start() {
    kafka_ensure
    local port controller deadline started=$SECONDS
    port="$(kafka_free_port)"
    controller="$(kafka_free_port)"
    KAFKA_ADDR="127.0.0.1:${port}"
    KAFKA_DIR="$(mktemp -d -t kafkapipe-kafka-XXXXXX)"
    KAFKA_LOG="${KAFKA_DIR}/kafka.log"
    cat >"${KAFKA_DIR}/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:${controller}
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://${KAFKA_ADDR},CONTROLLER://127.0.0.1:${controller}
advertised.listeners=PLAINTEXT://${KAFKA_ADDR}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=${KAFKA_DIR}/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=500
log.cleaner.dedupe.buffer.size=2097152
PROPS
    cat >"${KAFKA_DIR}/log4j2.properties" <<'PROPS'
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
PROPS
    local java="${JAVA_HOME:+${JAVA_HOME}/bin/}java"
    local log4j="-Dlog4j2.configurationFile=${KAFKA_DIR}/log4j2.properties"
    "$java" "$log4j" -cp "${KAFKAPIPE_KAFKA_LIBS}/*" kafka.tools.StorageTool format \
        --cluster-id a2Fma2FwaXBlLXRlc3Q --config "${KAFKA_DIR}/server.properties" \
        >"$KAFKA_LOG" 2>&1
    "$java" -Xmx512m -Xms128m -XX:+UseSerialGC "$log4j" -cp "${KAFKAPIPE_KAFKA_LIBS}/*" \
        kafka.Kafka "${KAFKA_DIR}/server.properties" </dev/null >>"$KAFKA_LOG" 2>&1 &
    KAFKA_PID=$!
    export KAFKA_ADDR KAFKA_PID KAFKA_LOG KAFKA_DIR
    deadline=$((SECONDS + ${KAFKA_START_TIMEOUT:-90}))
    until kafka_ping 127.0.0.1 "$port"; do
        if ! kill -0 "$KAFKA_PID" 2>/dev/null; then
            echo "kafka exited during startup; log:" >&2
            cat "$KAFKA_LOG" >&2
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "kafka did not answer on ${KAFKA_ADDR} in time; log:" >&2
            cat "$KAFKA_LOG" >&2
            kafka_stop
            return 1
        fi
        sleep 0.1
    done
    echo "kafka $(kafka_version) on ${KAFKA_ADDR} ready in $((SECONDS - started))s" >&2
}

kafka_stop() {
    if [[ -n "${KAFKA_PID:-}" ]]; then
        kill "$KAFKA_PID" 2>/dev/null || true
        wait "$KAFKA_PID" 2>/dev/null || true
        KAFKA_PID=
    fi
    if [[ -n "${KAFKA_DIR:-}" && -d "${KAFKA_DIR}" ]]; then
        rm -rf "${KAFKA_DIR}"
    fi
}
