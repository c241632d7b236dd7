# shellcheck shell=bash
# The SOCKS5 proxy the dial tests (tests/dial_broker.rs) run on loopback: Debian's
# `microsocks`. Source this file, then:
#   socks_ensure  -> installs microsocks with apt-get if it is not on PATH

socks_ensure() {
    if ! command -v microsocks >/dev/null 2>&1; then
        echo "installing microsocks (SOCKS5 proxy for tests/dial_broker.rs) from Debian" >&2
        apt-get update -qq && apt-get install -y -qq microsocks >/dev/null
    fi
}
