# shellcheck shell=bash
# Sourced by .ci/run: gVisor (runsc) as a second runtime of the Docker engine docker.sh brought up,
# so the Docker tier runs under runc and under gVisor (tests/docker/test_gvisor.py).
#
#   gvisor_install   apt-install runsc when missing (we are root in CI), register it with the
#                    engine (merged into /etc/docker/daemon.json, the engine reloaded with SIGHUP),
#                    run the kernel image under it once, then require it: with
#                    KERNELEXEC_REQUIRE_GVISOR=1 the gVisor tests fail instead of skipping.
#
# The runtime's arguments are the ones that work on these machines: the ptrace platform (the
# default, systrap/KVM, fails here) and no sandbox network (gVisor's own network stack fails
# here too; kernelexec's containers have no network anyway, and the Docker kernel reaches its
# sockets through a relay over `docker exec`).

_KX_DAEMON_JSON=/etc/docker/daemon.json

_kx_runsc_registered() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep '"runsc"' >/dev/null
}

# Add the runsc runtime to daemon.json, keeping every other key the file has.
_kx_runsc_register() {
    local runsc
    runsc="$(command -v runsc)"
    mkdir -p "$(dirname "$_KX_DAEMON_JSON")"
    python3 - "$_KX_DAEMON_JSON" "$runsc" <<'EOF' || return 1
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
config = {}
if os.path.exists(path) and os.path.getsize(path):
    with open(path) as f:
        config = json.load(f)
config.setdefault("runtimes", {})["runsc"] = {
    "path": runsc,
    "runtimeArgs": ["--platform=ptrace", "--network=none"],
}
tmp = path + ".kernelexec-tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
os.replace(tmp, path)
EOF
    local pid
    pid="${_KX_DOCKERD_PID:-$(pidof dockerd || true)}"
    if [ -z "$pid" ]; then
        echo "gvisor.sh: no dockerd process to reload (is the engine remote?)" >&2
        return 1
    fi
    echo "gvisor.sh: registered runsc in $_KX_DAEMON_JSON; reloading dockerd (pid $pid)"
    # shellcheck disable=SC2086  # pidof may name more than one process
    kill -HUP $pid
    for _ in $(seq 1 50); do
        _kx_runsc_registered && return 0
        sleep 0.2
    done
    echo "gvisor.sh: the engine did not pick up runsc; its runtimes:" >&2
    docker info --format '{{json .Runtimes}}' >&2
    return 1
}

gvisor_install() {
    if ! command -v runsc >/dev/null 2>&1; then
        if [ "$(id -u)" != "0" ]; then
            echo "gvisor.sh: runsc is missing and we are not root: cannot install it" >&2
            return 1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q runsc >/dev/null ||
            { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q runsc >/dev/null; } ||
            return 1
    fi
    runsc --version 2>&1 | sed -n 1p
    _kx_runsc_registered || _kx_runsc_register || return 1
    # Once, the way the tests run it: the kernel image under gVisor with no network.
    docker run --rm --runtime runsc --network none kernelexec/python:latest \
        python3 -c 'import ipykernel; print("gvisor.sh: the kernel image runs under runsc")'
    export KERNELEXEC_REQUIRE_GVISOR=1
}
