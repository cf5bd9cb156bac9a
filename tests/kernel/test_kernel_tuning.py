"""What kernelexec's set-up code changes inside each kernel, checked in real kernels (local and
forked): IPython's formatter lookup (registries read once per lookup) gives the same printer
and the same errors as IPython's own; ipykernel's iopub wake-ups, sent only when none is
pending, lose and reorder nothing, from many threads at once and after a flood."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from kernelexec import SyncExecutor, make_executor

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module", params=["kernel", "fork-kernel"])
def ex(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SyncExecutor[Any]]:
    work = tmp_path_factory.mktemp(f"tuning-{request.param}")
    with make_executor(
        request.param, work_dir=work, timeout=120, output_limit=2_000_000
    ) as executor:
        yield executor


def run(ex: SyncExecutor[Any], code: str) -> str:
    result = ex.execute(textwrap.dedent(code))
    assert result.ok, result.output
    return result.output.strip()


def test_both_changes_are_in_place(ex: SyncExecutor[Any]) -> None:
    out = run(
        ex,
        """
        from IPython.core.formatters import BaseFormatter
        from ipykernel.kernelapp import IPKernelApp
        thread = IPKernelApp.instance().iopub_thread
        print(BaseFormatter.lookup_by_type._kx_fast, thread._kx_pending in (True, False))
        """,
    )
    assert out == "True True"


def test_the_lookup_answers_as_ipythons_own(ex: SyncExecutor[Any]) -> None:
    """Every case of IPython's lookup, answered by both and compared: a type and its subclass,
    a deferred printer by name (moved to the type registry on first use), a name string, a
    singleton, an unregistered type (same KeyError), a formatter class with its own deferred
    lookup."""
    out = run(
        ex,
        """
        import collections, decimal, fractions
        from IPython.core.formatters import BaseFormatter, HTMLFormatter
        fast = BaseFormatter.lookup_by_type
        slow = fast._kx_original

        def answer(lookup, fmt, typ):
            try:
                return ("ok", lookup(fmt, typ))
            except KeyError as exc:
                return ("KeyError", str(exc))

        class Base: pass
        class Child(Base): pass
        class Unknown: pass

        class Own(HTMLFormatter):
            def _in_deferred_types(self, cls):
                return cls is Unknown and self.type_printers.setdefault(cls, repr) is repr

        def build():
            fmt = HTMLFormatter()
            fmt.for_type(Base, lambda o: "<i>base</i>")
            fmt.for_type_by_name("decimal", "Decimal", lambda o: "<i>dec</i>")
            fmt.for_type_by_name("fractions", "Fraction", lambda o: "<i>frac</i>")
            return fmt

        cases = [Base, Child, decimal.Decimal, fractions.Fraction, Unknown, int, object,
                 collections.OrderedDict, "decimal.Decimal", "fractions.Fraction",
                 "__main__.Nothing", f"{__name__}.Base"]
        mismatches = []
        for typ in cases:
            a, b = build(), build()
            got, want = answer(fast, a, typ), answer(slow, b, typ)
            moved = (set(map(str, a.type_printers)), set(a.deferred_printers))
            want_moved = (set(map(str, b.type_printers)), set(b.deferred_printers))
            same = (got[0] == want[0] and (got[0] == "KeyError" and got == want
                    or got[1](None) == want[1](None)))
            if not same or moved != want_moved:
                mismatches.append((typ, got, want))
        own = Own()
        fast_own, slow_own = answer(fast, own, Unknown), answer(slow, Own(), Unknown)
        print(mismatches, fast_own == slow_own == ("ok", repr))
        """,
    )
    assert out == "[] True"


def test_registered_printers_still_reach_the_output(ex: SyncExecutor[Any]) -> None:
    result = ex.execute(
        textwrap.dedent(
            """
            import decimal
            ip = get_ipython()
            html = ip.display_formatter.formatters["text/html"]
            class Card: pass
            class Ace(Card): pass
            html.for_type(Card, lambda o: "<b>card</b>")
            html.for_type_by_name("decimal", "Decimal", lambda o: f"<b>{o}</b>")
            display(Ace(), decimal.Decimal("1.5"))
            """
        )
    )
    assert result.ok, result.output
    htmls = [o["data"].get("text/html") for o in result.outputs if "data" in o]
    assert htmls == ["<b>card</b>", "<b>1.5</b>"]


def test_threads_printing_at_once_lose_and_reorder_nothing(ex: SyncExecutor[Any]) -> None:
    result = ex.execute(
        textwrap.dedent(
            r"""
            import sys, threading
            from IPython.display import display
            def work(t):
                for i in range(1500):
                    sys.stdout.write(f"t{t} {i}\n")  # one write: print is two
                    if i % 100 == 0:
                        display({"text/plain": f"d{t} {i}"}, raw=True)
            threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for th in threads: th.start()
            for th in threads: th.join()
            print("end")
            """
        ),
        timeout=120,
    )
    assert result.ok, result.output
    lines = result.stdout.splitlines()
    assert lines[-1] == "end"
    for t in range(4):
        mine = [int(line.split()[1]) for line in lines if line.startswith(f"t{t} ")]
        assert mine == list(range(1500)), (
            f"thread {t}: {len(mine)} lines, order kept: {mine == sorted(mine)}"
        )
    shown = [o["data"]["text/plain"] for o in result.outputs if o["output_type"] == "display_data"]
    for t in range(4):
        assert [s for s in shown if s.startswith(f"d{t} ")] == [
            f"d{t} {i}" for i in range(0, 1500, 100)
        ]


def test_after_a_flood_the_next_output_still_comes(ex: SyncExecutor[Any]) -> None:
    flood = ex.execute(
        "from IPython.display import display\nfor i in range(3000):\n    display(i)\n"
    )
    assert flood.ok, flood.output
    for n in range(20):  # quick blocks after it: each one's output arrives, none is held back
        assert ex.execute(f"print({n})").output == f"{n}\n"
    late = ex.execute(
        "import threading\nt = threading.Thread(target=print, args=('late',))\nt.start(); t.join()"
    )
    assert late.output == "late\n"


def test_the_fd_readers_are_kernelexecs_and_ipykernels_have_ended(ex: SyncExecutor[Any]) -> None:
    out = run(
        ex,
        """
        import sys, threading
        names = sorted(t.name for t in threading.enumerate())
        ours = [n for n in names if n.startswith("kernelexec-std")]
        theirs = [t for t in threading.enumerate() if getattr(t, "_target", None) is not None
                  and getattr(t._target, "__name__", "") == "_watch_pipe_fd"]
        print(ours, len(theirs), sys.stdout.flush._kx_quick, sys.stderr.flush._kx_quick)
        """,
    )
    assert out == "['kernelexec-stderr', 'kernelexec-stdout'] 0 True True"


def test_text_written_to_the_fds_just_before_a_block_ends_is_never_missed(
    ex: SyncExecutor[Any],
) -> None:
    """Written under the language's own print (fd 1 and fd 2 directly, as C code and child
    processes do) as the very last thing a block does, many times over: each block's result
    has its own line. ipykernel's reader thread alone could deliver it after the block ended."""
    for i in range(150):
        result = ex.execute(f"import os\nos.write(2, b'err {i}\\n')\nos.write(1, b'out {i}\\n')")
        assert result.ok
        assert result.stdout == f"out {i}\n", (i, result.stdout, result.stderr)
        assert result.stderr == f"err {i}\n", (i, result.stdout, result.stderr)


def test_fd_text_from_a_child_process_and_a_split_character_arrive_whole(
    ex: SyncExecutor[Any],
) -> None:
    result = ex.execute(
        "import os, subprocess\n"
        "subprocess.run(['echo', 'from a child'])\n"
        "e = 'é'.encode()\n"
        "os.write(1, b'split ' + e[:1])\n"
        "os.write(1, e[1:] + b' done\\n')\n"
    )
    assert result.ok
    assert result.stdout == "from a child\nsplit é done\n", repr(result.stdout)


def test_a_large_fd_write_arrives_counted_and_the_kernel_answers_after(
    ex: SyncExecutor[Any],
) -> None:
    """100 MB written to fd 1 at once: far bigger than the pipe, so the write waits on the
    reader while the stream sends bounded pieces; every character is kept or counted. (A flush
    from inside the reader's own write once drained the pipe again, nesting once per 256 KiB,
    until the reader died of recursion and the write waited for ever.)"""
    result = ex.execute(
        "import os\nos.write(1, b'y' * 100_000_000)\nos.write(1, b'\\nend\\n')", timeout=300
    )
    assert result.ok, result.output
    kept = result.stdout.count("y")
    marker = re.search(r"\[\.\.\. (\d+) characters omitted", result.stdout)
    assert kept + (int(marker[1]) if marker else 0) == 100_000_000
    assert result.stdout.endswith("\nend\n")
    assert run(ex, "print('still here')") == "still here"


def test_a_flush_with_nothing_to_send_returns_and_one_with_text_still_sends(
    ex: SyncExecutor[Any],
) -> None:
    out = run(
        ex,
        """
        import sys, time
        t = time.perf_counter()
        for _ in range(200):
            sys.stdout.flush()
        quiet = time.perf_counter() - t
        print("with text")
        sys.stdout.flush()
        print(sys.stdout._buffers == {}, quiet < 5)
        """,
    )
    assert out == "with text\nTrue True"


def test_a_flush_first_moves_what_waits_in_the_fd_pipe_into_the_stream(
    ex: SyncExecutor[Any],
) -> None:
    """The mechanism itself: right after a write to fd 1, before the reader thread has had a
    turn, draining puts the text in the stream's buffer (so the flush that follows sends it).
    The iopub thread is parked meanwhile, so no timed flush takes the text first; each text is
    taken out of the buffer again, so none of it is sent."""
    out = run(
        ex,
        """
        import os, sys, threading
        from ipykernel.kernelapp import IPKernelApp
        thread = IPKernelApp.instance().iopub_thread
        sys.stdout.flush()
        gate, parked = threading.Event(), threading.Event()
        thread.schedule(lambda: (parked.set(), gate.wait(30)))
        parked.wait(30)
        seen = 0
        try:
            for i in range(50):
                os.write(1, b"drained %d|" % i)
                sys.stdout._kx_drain()
                held = "".join(b.getvalue() for b in sys.stdout._rotate_buffers().values())
                seen += f"drained {i}|" in held
        finally:
            gate.set()
        print(seen)
        """,
    )
    assert out == "50"


def test_the_kernels_own_flushes_keep_every_text_ahead_of_idle(ex: SyncExecutor[Any]) -> None:
    """ipykernel's flushes after a request do not wait for the iopub thread here: the text is
    taken and queued on the request's own thread, ahead of the idle status. Queued for the
    iopub thread to take instead, the idle status overtook it in about half these blocks."""
    for i in range(200):
        result = ex.execute(f"import sys\nprint({i})\nprint('e{i}', file=sys.stderr)")
        assert (result.stdout, result.stderr) == (f"{i}\n", f"e{i}\n"), i


def test_per_request_work_done_once_answers_as_before(ex: SyncExecutor[Any]) -> None:
    """The signature check is cached with the same answer; the kernel's logger skips records
    no handler would write; a cell is transformed once per request (a transformer sees each
    request once, magics and shell escapes still run, a cell given again is transformed
    again)."""
    out = run(
        ex,
        """
        from ipykernel import ipkernel
        from ipykernel.kernelapp import IPKernelApp
        check = ipkernel._accepts_parameters
        fresh = check.__closure__ and any(
            getattr(c.cell_contents, "__name__", "") == "_accepts_parameters"
            for c in check.__closure__
        )
        shell = get_ipython()
        same = check(shell.run_cell_async, ["cell_id", "cell_meta"]) == {
            "cell_id": True, "cell_meta": True}
        log = IPKernelApp.instance().log
        print(check._kx_cached, fresh, same, log.level == min(h.level for h in log.handlers))
        seen = []
        def counting(lines):
            seen.append("".join(lines))
            return lines
        shell.input_transformers_post.append(counting)
        """,
    )
    assert out == "True True True True"
    assert ex.execute("1 + 1").output == "2"
    assert ex.execute("1 + 1").output == "2"
    assert ex.execute("%time 2 + 2").ok
    assert ex.execute("!echo from-shell").output.strip() == "from-shell"
    out = run(ex, "shell.input_transformers_post.remove(counting)\nprint(seen[:-1])")
    # Each request's cell once (IPython alone transforms it twice per request); %time
    # transforms the statement it times itself.
    assert out == (
        "['1 + 1\\n', '1 + 1\\n', \"get_ipython().run_line_magic('time', '2 + 2')\\n\", "
        "'2 + 2\\n', \"get_ipython().system('echo from-shell')\\n\"]"
    )


def test_a_character_cut_off_at_a_blocks_end_stays_in_that_block(ex: SyncExecutor[Any]) -> None:
    result = ex.execute("import os\nos.write(1, b'cut ' + 'é'.encode()[:1])")
    assert result.ok and result.stdout == "cut \ufffd", repr(result.stdout)
    assert ex.execute("print('later')").stdout == "later\n"
