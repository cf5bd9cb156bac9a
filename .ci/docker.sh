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

# TERM, up to 10 s to exit, then KILL.
_kx_end_pid() {
    [ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 0
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null || true
}

_kx_docker_stop() {
    if [ -n "$_KX_DOCKERD_PID" ] && kill -0 "$_KX_DOCKERD_PID" 2>/dev/null; then
        echo "docker.sh: stopping the dockerd started for this run (pid $_KX_DOCKERD_PID)"
    fi
    _kx_end_pid "$_KX_DOCKERD_PID"
    _kx_end_pid "$_KX_CONTAINERD_PID"
    _KX_DOCKERD_PID="" _KX_CONTAINERD_PID=""
}

# A machine restored from a snapshot can carry the last engine's pid files: dockerd then trusts
# a pid that now belongs to some other process ("containerd is still running") and waits for a
# socket nobody will open. Remove pid files and sockets whose process is not a live engine.
_kx_docker_clear_stale() {
    local f pid
    for f in /var/run/docker/containerd/containerd.pid /var/run/docker.pid; do
        [ -f "$f" ] || continue
        pid="$(cat "$f" 2>/dev/null)"
        if [ -n "$pid" ] && grep -qsE '^(containerd|dockerd)$' "/proc/$pid/comm"; then
            continue
        fi
        echo "docker.sh: removing stale $f (pid ${pid:-none} is not a running engine)"
        rm -f "$f"
    done
    if ! pgrep -x containerd >/dev/null 2>&1; then
        rm -f /var/run/docker/containerd/containerd.sock /var/run/docker/containerd/containerd.sock.ttrpc \
            /var/run/docker/containerd/containerd-debug.sock
    fi
    if ! pgrep -x dockerd >/dev/null 2>&1; then
        rm -f /var/run/docker.sock
    fi
}

# containerd is started on its own, before dockerd, with a generous wait: a dockerd that starts
# its own containerd gives it 15 s to answer, and a cold CI machine once took longer ("failed
# to start containerd: timeout waiting for containerd to start", CI exit 1 after 46 s).
_KX_CONTAINERD_PID=""
_KX_CONTAINERD_SOCK=/run/containerd/containerd.sock
_KX_CONTAINERD_LOG="${TMPDIR:-/tmp}/kernelexec-containerd.log"

_kx_containerd_start() {
    if [ -S "$_KX_CONTAINERD_SOCK" ] && ctr --address "$_KX_CONTAINERD_SOCK" version >/dev/null 2>&1; then
        return 0
    fi
    rm -f "$_KX_CONTAINERD_SOCK" "$_KX_CONTAINERD_SOCK.ttrpc"
    echo "docker.sh: starting containerd (log: $_KX_CONTAINERD_LOG)"
    containerd --address "$_KX_CONTAINERD_SOCK" >"$_KX_CONTAINERD_LOG" 2>&1 &
    _KX_CONTAINERD_PID=$!
    for _ in $(seq 1 240); do
        if ctr --address "$_KX_CONTAINERD_SOCK" version >/dev/null 2>&1; then
            echo "docker.sh: containerd answers"
            return 0
        fi
        if ! kill -0 "$_KX_CONTAINERD_PID" 2>/dev/null; then
            echo "docker.sh: containerd exited; last log lines:" >&2
            tail -n 20 "$_KX_CONTAINERD_LOG" >&2
            _KX_CONTAINERD_PID=""
            return 1
        fi
        sleep 0.5
    done
    echo "docker.sh: containerd did not answer within 120 s; last log lines:" >&2
    tail -n 20 "$_KX_CONTAINERD_LOG" >&2
    return 1
}

_kx_dockerd_start() {
    _kx_docker_clear_stale
    _kx_containerd_start || return 1
    echo "docker.sh: starting dockerd (log: $_KX_DOCKERD_LOG)"
    dockerd --containerd="$_KX_CONTAINERD_SOCK" >"$_KX_DOCKERD_LOG" 2>&1 &
    _KX_DOCKERD_PID=$!
    for _ in $(seq 1 240); do
        if _kx_docker_answers; then
            echo "docker.sh: dockerd answers"
            return 0
        fi
        if ! kill -0 "$_KX_DOCKERD_PID" 2>/dev/null; then
            echo "docker.sh: dockerd exited; its errors and last log lines:" >&2
            grep -E 'level=(error|fatal)' "$_KX_DOCKERD_LOG" | tail -n 10 >&2
            tail -n 20 "$_KX_DOCKERD_LOG" >&2
            _KX_DOCKERD_PID=""
            return 1
        fi
        sleep 0.5
    done
    echo "docker.sh: dockerd did not answer within 120 s" >&2
    _kx_docker_stop
    return 1
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
    # Chain onto an EXIT trap the caller may already have, instead of replacing it.
    local previous attempt
    previous="$(trap -p EXIT | sed -e "s/^trap -- '\(.*\)' EXIT$/\1/")"
    # shellcheck disable=SC2064
    trap "_kx_docker_stop${previous:+; $previous}" EXIT
    # A second try after a failed start: the first one's leftovers are cleared before it.
    for attempt in 1 2 3; do
        _kx_dockerd_start && return 0
        echo "docker.sh: dockerd start attempt $attempt failed" >&2
        sleep 2
    done
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
