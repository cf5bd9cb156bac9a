# shellcheck shell=bash
# Sourced by .ci/run: bubblewrap for the sandboxed back ends (sandboxed-kernel, sandboxed-command).
#
#   sandbox_install   apt-install bubblewrap when missing (we are root in CI), then require it:
#                     with KERNELEXEC_REQUIRE_SANDBOX=1 the sandbox tests fail instead of skipping.

sandbox_install() {
    if ! command -v bwrap >/dev/null 2>&1; then
        if [ "$(id -u)" != "0" ]; then
            echo "sandbox.sh: bubblewrap is missing and we are not root: cannot install it" >&2
            return 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null
    fi
    bwrap --ro-bind / / --unshare-all -- true
    export KERNELEXEC_REQUIRE_SANDBOX=1
}
