# shellcheck shell=bash
# Sourced by .ci/run: the cluster tier (tests/cluster) on a real single-node Docker Swarm.
#
#   cluster_install  the cluster extra (gateway_provisioners) into the current environment, and
#                    the launcher image on top of the kernel image (offline: no registry).
#   cluster_up       make the engine docker_up found a single-node Swarm manager, unless it is
#                    one already; a Swarm made here is left again when the calling shell exits
#                    (chained onto the EXIT trap, before docker.sh stops the engine).
#
# With KERNELEXEC_REQUIRE_CLUSTER=1 the cluster tests fail instead of skipping when the Swarm,
# the image or the provisioner package is missing.

_KX_SWARM_MADE=""

_kx_swarm_state() {
    docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null
}

_kx_swarm_leave() {
    if [ -n "$_KX_SWARM_MADE" ]; then
        echo "cluster.sh: leaving the Swarm made for this run"
        docker swarm leave --force >/dev/null 2>&1 || true
        _KX_SWARM_MADE=""
    fi
}

cluster_install() {
    local started=$SECONDS
    [ -n "${KX_MAIN_INSTALLED:-}" ] || kx_install python3 -e ".[cluster]" || return 1
    python3 -m kernelexec image build --offline --with-launchers || return 1
    echo "cluster_install: $((SECONDS - started)) s"
}

cluster_up() {
    local state previous
    state="$(_kx_swarm_state)"
    if [ "$state" = "active" ]; then
        echo "cluster.sh: the engine is a Swarm node already; using it (and leaving it as is)"
    else
        docker swarm init --advertise-addr 127.0.0.1 >/dev/null || return 1
        _KX_SWARM_MADE=1
        previous="$(trap -p EXIT | sed -e "s/^trap -- '\(.*\)' EXIT$/\1/")"
        # shellcheck disable=SC2064
        trap "_kx_swarm_leave${previous:+; $previous}" EXIT
        echo "cluster.sh: made a single-node Swarm (left again at exit)"
    fi
    export KERNELEXEC_REQUIRE_CLUSTER=1
}
