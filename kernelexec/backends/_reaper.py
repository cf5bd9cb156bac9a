"""A child subreaper that runs one command and leaves nothing of it behind (standalone script).

``python -I _reaper.py ARGV...`` marks itself child subreaper (Linux ``prctl``), so whatever is
orphaned below it (a double fork, ``setsid``, ``nohup ... &``) is re-parented to it rather than
to init. It runs ARGV as its child with the same stdio. When that child exits, or on SIGUSR1 or
SIGTERM, it kills every process below it, reaps them, and exits as the child did (same code, or
the same signal). SIGINT is passed to the child's process group (it is the group's leader).
Only the standard library: it runs before, and apart from, kernelexec.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


def _children_of(parents: set[int]) -> set[int]:
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[1].split()
        if int(fields[1]) in parents:
            found.add(int(name))
    return found


def _descendants(root: int) -> set[int]:
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = _children_of(frontier) - found
        found |= frontier
    return found


def _kill_all_and_reap() -> None:
    """Kill every descendant, over and over, until none is left (a fork may race a kill)."""
    me = os.getpid()
    while True:
        for pid in _descendants(me):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write("kernelexec reaper: prctl(PR_SET_CHILD_SUBREAPER) failed\n")
        return 125

    def stop(signum: int, frame: object) -> None:
        _kill_all_and_reap()
        os._exit(128 + signum)

    # Handlers (not SIG_IGN) so the child starts with default dispositions after exec.
    signal.signal(signal.SIGUSR1, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, lambda signum, frame: None)  # the group gets it; we ignore it
    try:
        child = os.fork()
    except OSError as exc:
        sys.stderr.write(f"kernelexec reaper: fork failed: {exc}\n")
        return 125
    if child == 0:
        # If the helper itself is killed (SIGKILL to it alone), its direct child goes too.
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            sys.stderr.write(f"cannot run {argv[0]}: {exc.strerror or exc}\n")
        os._exit(127)
    while True:
        pid, status = os.waitpid(-1, 0)  # orphans re-parented to us are reaped here too
        if pid == child:
            break
    _kill_all_and_reap()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled anyway
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
