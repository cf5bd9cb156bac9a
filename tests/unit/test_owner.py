"""Who made a leftover, and whether it is gone: the decisions ``kernelexec gc`` rests on."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from kernelexec.backends._owner import Owner, owner_state, this_process

pytestmark = pytest.mark.unit


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_this_process_is_alive_and_its_record_reads_back() -> None:
    me = this_process()
    assert owner_state(me) == "alive"
    assert Owner.from_text(me.to_text()) == me
    assert me.start is not None and me.boot and me.pidns and me.timens


def test_a_dead_process_is_gone_and_a_reused_pid_is_not_its_owner() -> None:
    me = this_process()
    assert owner_state(dataclasses.replace(me, pid=_dead_pid())) == "gone"
    assert me.start is not None
    # Same pid, started at another time: another process got the number; the owner is gone.
    assert owner_state(dataclasses.replace(me, start=me.start - 1)) == "gone"


def test_what_cannot_be_judged_from_here_is_unknown() -> None:
    me = this_process()
    dead = dataclasses.replace(me, pid=_dead_pid())
    # Another machine (another boot and host name): its processes are not ours to see.
    assert owner_state(dataclasses.replace(dead, boot="x", host="elsewhere")) == "unknown"
    # Start times in another time namespace are shifted: no verdict from them.
    assert owner_state(dataclasses.replace(dead, timens="time:[1]")) == "unknown"
    # An older record, pid and host only, from another host.
    old = dataclasses.replace(dead, start=None, boot=None, pidns=None, host="elsewhere")
    assert owner_state(old) == "unknown"
    assert owner_state(dataclasses.replace(old, host=me.host)) == "gone"
    assert owner_state(dataclasses.replace(old, host=me.host, pid=me.pid)) == "alive"


def test_this_host_before_a_reboot_is_gone() -> None:
    me = this_process()
    assert owner_state(dataclasses.replace(me, boot="another-boot")) == "gone"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "null",
        "[]",
        "{}",
        '{"pid": "1"}',
        '{"pid": -1, "start": 1, "boot": "b", "pidns": null, "timens": null, "host": "h"}',
        "{" * 10000,
        "[" * 100000,
    ],
)
def test_a_record_that_is_not_one_is_none(text: str) -> None:
    assert Owner.from_text(text) is None


def test_a_cgroup_name_records_its_owner_and_a_reused_pid_is_not_it() -> None:
    from kernelexec.backends._containment import _owner_gone

    me = this_process()
    assert me.start is not None
    assert not _owner_gone(f"kernelexec-{me.pid}-t{me.start}-0123456789ab")
    assert not _owner_gone(f"kernelexec-{me.pid}-0123456789ab")  # an older name: pid only
    assert _owner_gone(f"kernelexec-{me.pid}-t{me.start + 1}-0123456789ab")  # pid reused
    assert _owner_gone(f"kernelexec-{_dead_pid()}-t1-0123456789ab")
    assert _owner_gone(f"kernelexec-probe-{_dead_pid()}-01234567")
    assert not _owner_gone("kernelexec-someone-else")
