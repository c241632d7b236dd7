# shellcheck shell=bash
# MIT Kerberos for the GSSAPI tests (tests/gssapi_broker.rs, tests/common/kdc.rs) and the
# `gssapi` cargo feature. Source this file; it defines functions only and changes no shell
# options.
#
#   krb5_ensure  -> installs Debian's krb5-kdc and krb5-admin-server (the test KDC:
#                   krb5kdc, kdb5_util, kadmin.local) and libkrb5-dev (libgssapi_krb5 to
#                   link against) when missing (apt-get update once); then sets
#                   KAFKAPIPE_GSSAPI_FEATURES to ",gssapi" to append to cargo's --features.
#                   Where they cannot be installed it warns and leaves the feature out, except
#                   with CI=true, where it fails.

_krb5_present() {
    command -v krb5-config >/dev/null &&
        [[ -x /usr/sbin/krb5kdc && -x /usr/sbin/kdb5_util && -x /usr/sbin/kadmin.local ]]
}

krb5_ensure() {
    KAFKAPIPE_GSSAPI_FEATURES=""
    if ! _krb5_present; then
        echo "installing MIT Kerberos (krb5-kdc krb5-admin-server libkrb5-dev) from Debian" >&2
        local sudo=""
        [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo="sudo"
        { $sudo apt-get update -qq &&
            $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                krb5-kdc krb5-admin-server libkrb5-dev >/dev/null; } >&2 || true
    fi
    if _krb5_present; then
        KAFKAPIPE_GSSAPI_FEATURES=",gssapi"
    elif [[ "${CI:-}" == "true" ]]; then
        echo "MIT Kerberos could not be installed: the GSSAPI tests cannot run" >&2
        return 1
    else
        echo "warning: MIT Kerberos not installed: building without the gssapi feature," \
            "tests/gssapi_broker.rs does not run" >&2
    fi
    export KAFKAPIPE_GSSAPI_FEATURES
}
