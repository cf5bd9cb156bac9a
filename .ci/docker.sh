# shellcheck shell=bash
# Sourced by .ci/run: a real Docker engine and the kernelexec image for the docker tests.
#
#   docker_up     when no engine answers and we are root: apt-install docker.io (+ debootstrap)
#                 if missing, start dockerd in the background, wait for `docker info`, and stop
#                 that dockerd again when the calling shell exits (a trap).
#   docker_image  build kernelexec/python offline (skipped when the recipe is already built).
#
# With KERNELEXEC_REQUIRE_DOCKER=1 the docker tests fail instead of skipping when either is missing.

export KERNELEXEC_REQUIRE_DOCKER=1

_KX_DOCKERD_PID=""
_KX_DOCKERD_LOG="${TMPDIR:-/tmp}/kernelexec-dockerd.log"

_kx_docker_answers() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

_kx_docker_stop() {
    if [ -n "$_KX_DOCKERD_PID" ] && kill -0 "$_KX_DOCKERD_PID" 2>/dev/null; then
        echo "docker.sh: stopping the dockerd started for this run (pid $_KX_DOCKERD_PID)"
        kill -TERM "$_KX_DOCKERD_PID" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$_KX_DOCKERD_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$_KX_DOCKERD_PID" 2>/dev/null || true
    fi
    _KX_DOCKERD_PID=""
}

docker_up() {
    if _kx_docker_answers; then
        echo "docker.sh: a Docker engine already answers; using it"
        return 0
    fi
    if [ "$(id -u)" != "0" ]; then
        echo "docker.sh: no Docker engine answers and we are not root: cannot start one" >&2
        return 1
    fi
    local missing=()
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "docker.sh: installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                "${missing[@]}" || return 1
    fi
    echo "docker.sh: starting dockerd (log: $_KX_DOCKERD_LOG)"
    dockerd >"$_KX_DOCKERD_LOG" 2>&1 &
    _KX_DOCKERD_PID=$!
    # Chain onto an EXIT trap the caller may already have, instead of replacing it.
    local previous
    previous="$(trap -p EXIT | sed -e "s/^trap -- '\(.*\)' EXIT$/\1/")"
    # shellcheck disable=SC2064
    trap "_kx_docker_stop${previous:+; $previous}" EXIT
    for _ in $(seq 1 120); do
        if _kx_docker_answers; then
            echo "docker.sh: dockerd answers"
            return 0
        fi
        if ! kill -0 "$_KX_DOCKERD_PID" 2>/dev/null; then
            echo "docker.sh: dockerd exited; last log lines:" >&2
            tail -n 20 "$_KX_DOCKERD_LOG" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "docker.sh: dockerd did not answer within 60 s" >&2
    return 1
}

docker_image() {
    # An engine that was already running says nothing about debootstrap being there.
    if ! command -v debootstrap >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
        echo "docker.sh: installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                debootstrap || return 1
    fi
    python3 -m kernelexec image build --offline
}
