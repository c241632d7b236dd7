#!/usr/bin/env bash
# Builds librdkafka's C benchmark tool `rdkafka_performance` from the source bundled in the
# `rdkafka-sys` crate (with zstd and lz4), caching it as
#   ${KAFKAPIPE_CACHE:-~/.cache/kafkapipe}/rdkafka-<librdkafka version>/rdkafka_performance
# and prints that path. Does nothing but print the path when the binary is already there.
#
# Needs a C toolchain and the compression headers:
#   apt-get install -y libzstd-dev liblz4-dev zlib1g-dev libssl-dev
# The crate is downloaded with cargo (a throw-away project that depends on rdkafka-sys,
# `cargo fetch`), so only crates.io is needed.
#
#   RDKAFKA_SYS_VERSION   the rdkafka-sys version to take the source from (default below)
set -euo pipefail

crate_version="${RDKAFKA_SYS_VERSION:-4.10.0+2.12.1}"
lib_version="${crate_version#*+}"
cache="${KAFKAPIPE_CACHE:-${HOME}/.cache/kafkapipe}"
out="${cache}/rdkafka-${lib_version}"
bin="${out}/rdkafka_performance"
if [[ -x "$bin" ]]; then
    echo "$bin"
    exit 0
fi

for h in zstd.h lz4.h zlib.h; do
    if [[ ! -f "/usr/include/$h" ]]; then
        echo "missing /usr/include/$h: apt-get install -y libzstd-dev liblz4-dev zlib1g-dev libssl-dev" >&2
        exit 1
    fi
done

# Find (or download) the crate's source in cargo's registry cache.
find_src() {
    local d
    for d in "${CARGO_HOME:-${HOME}/.cargo}"/registry/src/*/"rdkafka-sys-${crate_version}"/librdkafka; do
        if [[ -f "$d/examples/rdkafka_performance.c" ]]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}
if ! src="$(find_src)"; then
    echo "downloading rdkafka-sys ${crate_version} with cargo" >&2
    dl="$(mktemp -d -t rdkafka-sys-dl-XXXXXX)"
    cat >"$dl/Cargo.toml" <<TOML
[package]
name = "rdkafka-sys-download"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
rdkafka-sys = "=${crate_version}"
TOML
    mkdir -p "$dl/src"
    echo 'fn main() {}' >"$dl/src/main.rs"
    (cd "$dl" && cargo fetch -q)
    rm -rf "$dl"
    src="$(find_src)"
fi

build="$(mktemp -d -t rdkafka-build-XXXXXX)"
trap 'rm -rf "$build" "$build.configure-out"' EXIT
cp -a "$src/." "$build/"
cd "$build"
echo "building librdkafka ${lib_version} (zstd, lz4) in $build" >&2
./configure --enable-zstd --enable-lz4-ext --enable-ssl --disable-gssapi --disable-curl \
    >"$build.configure-out" 2>&1 || {
    cat "$build.configure-out" >&2
    exit 1
}
grep -qE '^#define WITH_ZSTD 1' config.h || {
    echo "configure did not enable zstd" >&2
    exit 1
}
make -s -j"$(nproc)" -C src librdkafka.a >&2
make -s -C examples rdkafka_performance >&2
mkdir -p "$out"
install -m 0755 examples/rdkafka_performance "$bin.tmp"
mv "$bin.tmp" "$bin"
echo "$bin"
