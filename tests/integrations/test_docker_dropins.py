"""The Docker drop-ins (issue 19.3 / 19.4): kernelexec's replacements for AG2's and autogen-ext's
``DockerCommandLineCodeExecutor``, with the peers' constructor arguments, driving the kernelexec
image; the seed flows run through them end to end."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("autogen.coding", reason="the ag2 extra is installed in CI (.ci/extras.sh)")
pytest.importorskip("autogen_ext", reason="the autogen extra is installed in CI")

from autogen.coding import CodeBlock as AG2Block
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock as AutoGenBlock

from kernelexec import DockerConfigError, ExecutorNotStarted
from kernelexec.backends._docker import DEFAULT_IMAGE
from kernelexec.integrations import ag2, autogen

from . import _fixtures as flows
from .test_ag2 import ag2_chat

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("docker_ready")]


def image_pip_problem() -> str | None:
    """Why the image cannot ``pip install`` (None when it can)."""
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", DEFAULT_IMAGE, "python3", "-m", "pip"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return None if probe.returncode == 0 else probe.stderr.strip()[-300:]


# -- AG2 -----------------------------------------------------------------------------------------


def test_ag2_fibonacci_chat_through_the_docker_drop_in(tmp_path: Path) -> None:
    executor = ag2.DockerCommandLineCodeExecutor(image=DEFAULT_IMAGE, timeout=60, work_dir=tmp_path)
    with executor:
        assert executor.timeout == 60 and executor.work_dir == tmp_path
        assert executor.bind_dir == tmp_path  # AG2: bind_dir falls back to work_dir
        heard = ag2_chat(executor, "What is the 14th Fibonacci number?", flows.FIB, flows.DONE)
        # Files persist between blocks: one container serves the whole chat.
        heard += ag2_chat(
            executor,
            "files",
            "```sh\necho kept > note.txt\n```",
            "```python\nprint(open('note.txt').read().strip())\n```",
            flows.DONE,
        )
    assert heard[0] == "exitcode: 0 (execution succeeded)\nCode output: 377\n"
    assert heard[2] == "exitcode: 0 (execution succeeded)\nCode output: kept\n"
    assert executor.executor.closed


def test_ag2_docker_rules(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Timeout"):
        ag2.DockerCommandLineCodeExecutor(timeout=0)
    with ag2.DockerCommandLineCodeExecutor(timeout=2, work_dir=tmp_path) as executor:
        with pytest.raises(ValueError, match="No code blocks"):
            executor.execute_code_blocks([])
        timed_out = executor.execute_code_blocks([AG2Block(code="sleep 30", language="sh")])
        saved = executor.execute_code_blocks([AG2Block(code="<p>x</p>", language="html")])
        named = executor.execute_code_blocks(
            [AG2Block(code="# run_me.py\nprint('named')", language="python")]
        )
    assert timed_out.exit_code == 124 and "Timeout" in timed_out.output
    assert saved.exit_code == 0 and saved.output.startswith("Code saved to ")
    assert named.output == "named\n" and (tmp_path / "run_me.py").exists()


def test_ag2_missing_module_then_pip_install_in_the_same_container(tmp_path: Path) -> None:
    problem = image_pip_problem()
    assert problem is None, f"{DEFAULT_IMAGE} cannot pip install (rebuild the image): {problem}"
    wheel = flows.build_demo_wheel(tmp_path)  # in the work dir: the container sees it
    # As an agent writes it; no network: the wheel is a file in the work dir.
    install = f"```sh\npython3 -m pip install --no-index --no-deps {wheel.name}\n```"
    with ag2.DockerCommandLineCodeExecutor(timeout=120, work_dir=tmp_path) as executor:
        heard = ag2_chat(
            executor, "use kxdemo_pkg", flows.IMPORT_DEMO, install, flows.IMPORT_DEMO, flows.DONE
        )
    assert heard[0].startswith("exitcode: 1") and "ModuleNotFoundError" in heard[0]
    assert heard[1].startswith("exitcode: 0"), heard[1]
    assert heard[2] == "exitcode: 0 (execution succeeded)\nCode output: kxdemo says 42\n"


def test_ag2_docker_kernel_by_name(tmp_path: Path) -> None:
    with ag2.AG2CodeExecutor(kind="docker-kernel", work_dir=tmp_path, timeout=60) as executor:
        heard = ag2_chat(executor, "state", flows.SET_STATE, flows.USE_STATE, flows.DONE)
    assert heard[1] == "exitcode: 0 (execution succeeded)\nCode output: 42\n"


# -- autogen-ext ---------------------------------------------------------------------------------


def test_autogen_docker_drop_in(tmp_path: Path) -> None:
    fib = flows.FIB.split("```python\n", 1)[1].rsplit("```", 1)[0]

    async def go() -> tuple[Any, Any, Any]:
        executor = autogen.DockerCommandLineCodeExecutor(
            DEFAULT_IMAGE, timeout=2, work_dir=tmp_path
        )
        with pytest.raises(ExecutorNotStarted, match="not running"):  # a ValueError, as there
            await executor.execute_code_blocks(
                [AutoGenBlock(code="1", language="python")], CancellationToken()
            )
        async with executor:
            with pytest.raises(ValueError, match="No code blocks"):
                await executor.execute_code_blocks([], CancellationToken())
            ok = await executor.execute_code_blocks(
                [AutoGenBlock(code=fib, language="python")], CancellationToken()
            )
            late = await executor.execute_code_blocks(
                [AutoGenBlock(code="sleep 30", language="sh")], CancellationToken()
            )
            assert executor.bind_dir == executor.work_dir == tmp_path
        return executor, ok, late

    executor, ok, late = asyncio.run(go())
    assert ok.exit_code == 0 and ok.output == "377\n"
    assert late.exit_code == 124 and "Timeout" in late.output  # a result, as autogen-ext's
    assert Path(ok.code_file).exists()  # delete_tmp_files=False by default, as there
    assert executor.executor.closed


def test_autogen_docker_unknown_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="bogus"):
        autogen.DockerCommandLineCodeExecutor(bogus=1)


def test_ag2_container_name_and_a_kept_container(tmp_path: Path) -> None:
    import contextlib
    import uuid

    import docker

    name = f"kx-dropin-{uuid.uuid4().hex[:8]}"
    client = docker.from_env()
    try:
        with ag2.DockerCommandLineCodeExecutor(
            container_name=name, auto_remove=False, stop_container=False, work_dir=tmp_path
        ) as executor:
            result = executor.execute_code_blocks([AG2Block(code="print(1)", language="python")])
            assert result.exit_code == 0 and result.output == "1\n"
            assert client.containers.get(name).status == "running"
        kept = client.containers.get(name)  # closing the executor kept it, as AG2 does:
        assert kept.status == "exited"  # stopped (AG2's stop() stops it whatever stop_container)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(name).remove(force=True)
        client.close()


# -- bind_dir, kept containers and AG2's container_create_kwargs (issue 19.1 / 19.3) -----------

FRAMEWORKS = ["ag2", "autogen"]


def run_dropin(framework: str, code: str, **options: Any) -> Any:
    """Start ``framework``'s Docker drop-in with ``options``, run one Python block, close it."""
    if framework == "ag2":
        with ag2.DockerCommandLineCodeExecutor(**options) as executor:
            return executor.execute_code_blocks([AG2Block(code=code, language="python")])

    async def go() -> Any:
        async with autogen.DockerCommandLineCodeExecutor(**options) as executor:
            block = AutoGenBlock(code=code, language="python")
            return await executor.execute_code_blocks([block], CancellationToken())

    return asyncio.run(go())


def workspace_source(name: str) -> str:
    """The host folder the (kept) container ``name`` mounts at /workspace."""
    import docker

    client = docker.from_env()
    try:
        mounts = client.containers.get(name).attrs["Mounts"]
    finally:
        client.close()
    return next(str(m["Source"]) for m in mounts if m["Destination"] == "/workspace")


def remove_container(name: str) -> None:
    import contextlib

    import docker

    client = docker.from_env()
    with contextlib.suppress(docker.errors.NotFound):
        client.containers.get(name).remove(force=True)
    client.close()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bind_dir_is_the_folder_the_engine_mounts(framework: str, tmp_path: Path) -> None:
    import uuid

    host = tmp_path / "host"
    host.mkdir()
    app = tmp_path / "app"
    app.symlink_to(host)  # the work dir under another path, as in Docker out of Docker
    name = f"kx-bind-{uuid.uuid4().hex[:8]}"
    code = "open('seen.txt', 'w').write('x')\nprint('ok')"
    try:
        result = run_dropin(
            framework, code, work_dir=app, bind_dir=host, container_name=name, auto_remove=False
        )
        assert result.exit_code == 0 and result.output == "ok\n"
        assert (host / "seen.txt").read_text() == "x"
        # The engine was given bind_dir, not the work dir's path in this process.
        assert workspace_source(name) == str(host)
    finally:
        remove_container(name)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bind_dir_naming_another_host_folder_is_a_config_error(
    framework: str, tmp_path: Path
) -> None:
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()
    (other / "theirs.txt").write_text("not the work dir")
    with pytest.raises(DockerConfigError, match=r"bind_dir .* is not the work dir"):
        run_dropin(framework, "print(1)", work_dir=work, bind_dir=other)
    assert sorted(p.name for p in other.iterdir()) == ["theirs.txt"]  # nothing written there


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bind_dir_missing_on_the_host_is_a_config_error(framework: str, tmp_path: Path) -> None:
    missing = tmp_path / "not-on-the-host"
    # The peers mount with volumes= and the engine creates the folder: an empty work dir.
    with pytest.raises(DockerConfigError, match="does not exist on the Docker host"):
        run_dropin(framework, "print(1)", work_dir=tmp_path / "work", bind_dir=missing)
    assert not missing.exists()


def test_ag2_container_create_kwargs_reach_the_container(tmp_path: Path) -> None:
    result = run_dropin(
        "ag2",
        "import socket; print(socket.gethostname())",
        work_dir=tmp_path,
        container_create_kwargs={"hostname": "kx-created"},
    )
    assert result.exit_code == 0 and result.output == "kx-created\n"


# -- side by side with the real peers, on the kernelexec image (issue 19.3) ---------------------

AUTOGEN_PEER = "autogen_ext.code_executors.docker"
PEER_IMAGE = "kernelexec/python-peers:test"


def peer_image() -> str:
    """The kernelexec image plus a ``python`` command (both peers run ``python file``; the
    kernelexec image has only ``python3``), built offline from the local image: no pull.
    ``$KERNELEXEC_PEER_IMAGE`` names a ready one instead (``kernelexec/python`` once its recipe,
    which now links ``python``, is rebuilt)."""
    import io
    import os

    import docker

    if os.environ.get("KERNELEXEC_PEER_IMAGE"):
        return os.environ["KERNELEXEC_PEER_IMAGE"]

    client = docker.from_env()
    try:
        dockerfile = (
            f"FROM {DEFAULT_IMAGE}\nUSER 0:0\nRUN ln -sf /usr/bin/python3 /usr/local/bin/python\n"
            "USER 1000:1000\n"
        )
        client.images.build(
            fileobj=io.BytesIO(dockerfile.encode()),
            tag=PEER_IMAGE,
            pull=False,
            network_mode="none",
            rm=True,
            forcerm=True,
        )
    finally:
        client.close()
    return PEER_IMAGE


def peer_work_dir(path: Path) -> Path:
    """The peers run as the image's user (uid 1000) and write into the work dir."""
    path.mkdir()
    path.chmod(0o777)
    return path


def user_files(work: Path) -> list[str]:
    """The work dir's files but the code files (named differently, see below)."""
    return sorted(p.name for p in work.iterdir() if not p.name.startswith("tmp_code_"))


#: (language, code) blocks each run alone; named files use each peer's convention.
SIDE_BY_SIDE = [
    ("python", "print('hi')\nprint(6 * 7)"),
    ("python", "import sys; sys.stderr.write('to stderr\\n')"),
    ("python", "import sys; sys.stdout.write('caf\\u00e9, no newline')"),
    ("sh", "echo made > made.txt; cat made.txt"),
    ("python", "raise SystemExit(3)"),
    ("python", "import nothing_here"),
    ("bash", "echo $((6 * 7))"),
]
SLEEP = ("python", "import time; print('before', flush=True); time.sleep(30)")


def same_results(ours: list[Any], theirs: list[Any]) -> None:
    def text(result: Any) -> str:  # a traceback names the code file, named differently
        return str(result.output).replace(Path(result.code_file).name, "<code file>")

    for (lang, code), mine, peer in zip(SIDE_BY_SIDE, ours, theirs, strict=False):
        assert (mine.exit_code, text(mine)) == (peer.exit_code, text(peer)), (lang, code)
    # A timeout: exit code 124 for both, the output so far, then a "Timeout" note; the
    # note's words differ (deliberately: kernelexec says how long the block ran).
    mine, peer = ours[-1], theirs[-1]
    assert mine.exit_code == peer.exit_code == 124
    assert peer.output.startswith("before\n") and peer.output.rstrip().endswith("Timeout")
    assert mine.output.startswith("before\n") and "Timeout: the block ran longer than 3 s" in (
        mine.output
    )


def test_ag2_drop_in_side_by_side_with_ag2s_docker_executor(tmp_path: Path) -> None:
    from autogen.coding import DockerCommandLineCodeExecutor as Peer

    image = peer_image()
    blocks = [AG2Block(code=c, language=lang) for lang, c in [*SIDE_BY_SIDE, SLEEP]]
    named = AG2Block(code="# named.py\nprint('named')", language="python")
    runs = {}
    for side, make in (("peer", Peer), ("ours", ag2.DockerCommandLineCodeExecutor)):
        work = peer_work_dir(tmp_path / side)
        with make(image=image, work_dir=work, timeout=3) as executor:
            results = [executor.execute_code_blocks([b]) for b in [*blocks, named]]
        runs[side] = (results, work)
    (ours, our_dir), (theirs, their_dir) = runs["ours"], runs["peer"]
    same_results(ours[:-1], theirs[:-1])
    assert ours[-1].output == theirs[-1].output == "named\n"
    # Same files; kernelexec adds its own .kernelexec folder (its mount check's marker).
    assert user_files(our_dir) == [".kernelexec", *user_files(their_dir)]
    assert "named.py" in user_files(their_dir) and "made.txt" in user_files(their_dir)
    # Code files: the peer names them tmp_code_<md5>.<language> ("python"), kernelexec
    # tmp_code_<sha256 prefix>.<extension> (".py"): a deliberate difference.
    assert Path(str(theirs[0].code_file)).suffix == ".python"
    assert Path(str(ours[0].code_file)).suffix == ".py"


def test_autogen_drop_in_side_by_side_with_autogen_exts_docker_executor(tmp_path: Path) -> None:
    Peer = pytest.importorskip(AUTOGEN_PEER).DockerCommandLineCodeExecutor
    image = peer_image()
    code = [*SIDE_BY_SIDE, SLEEP, ("python", "# filename: named.py\nprint('named')")]
    blocks = [AutoGenBlock(code=c, language=lang) for lang, c in code]

    async def run(make: Any, work: Path) -> list[Any]:
        async with make(image, work_dir=work, timeout=3) as executor:
            return [await executor.execute_code_blocks([b], CancellationToken()) for b in blocks]

    theirs = asyncio.run(run(Peer, peer_work_dir(tmp_path / "peer")))
    ours = asyncio.run(run(autogen.DockerCommandLineCodeExecutor, peer_work_dir(tmp_path / "ours")))
    same_results(ours[:-1], theirs[:-1])
    assert ours[-1].output == theirs[-1].output == "named\n"
    assert user_files(tmp_path / "ours") == [".kernelexec", *user_files(tmp_path / "peer")]
    assert "named.py" in user_files(tmp_path / "peer")
    assert Path(theirs[0].code_file).name.startswith("tmp_code_")
    assert Path(theirs[0].code_file).suffix == ".python" and Path(ours[0].code_file).suffix == ".py"


def test_the_peers_run_python_on_the_kernelexec_image_once_rebuilt(tmp_path: Path) -> None:
    """The peers call ``python``; the kernelexec image's recipe now links it (issue 32). An
    image built from an older recipe has ``python3`` only: the peer's Python fails there (127)
    while the drop-ins run ``python3``. Shell blocks agree either way."""
    import docker
    from autogen.coding import DockerCommandLineCodeExecutor as Peer

    from kernelexec._image import LABEL_RECIPE, recipe_hash

    client = docker.from_env()
    try:
        current = client.images.get(DEFAULT_IMAGE).labels.get(LABEL_RECIPE) == recipe_hash(
            offline=True
        )
    finally:
        client.close()
    blocks = [AG2Block(code="print(1)", language="python"), AG2Block(code="echo 1", language="sh")]
    results = {}
    for side, make in (("peer", Peer), ("ours", ag2.DockerCommandLineCodeExecutor)):
        with make(image=DEFAULT_IMAGE, work_dir=peer_work_dir(tmp_path / side)) as executor:
            results[side] = [executor.execute_code_blocks([b]) for b in blocks]
    (peer_py, peer_sh), (our_py, our_sh) = results["peer"], results["ours"]
    if current:
        assert (peer_py.exit_code, peer_py.output) == (0, "1\n")
    else:
        assert peer_py.exit_code == 127 and "python" in peer_py.output
    assert (our_py.exit_code, our_py.output) == (0, "1\n")
    assert (our_sh.exit_code, our_sh.output) == (peer_sh.exit_code, peer_sh.output) == (0, "1\n")


@pytest.mark.parametrize("auto_remove", [True, False])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_kept_container_as_the_peer_keeps_it(
    framework: str, auto_remove: bool, tmp_path: Path
) -> None:
    """Leaving the executor stops the container in both peers whatever ``stop_container``
    says; ``auto_remove=False`` keeps it (exited). The drop-ins do the same."""
    import uuid

    import docker

    Peer: Any
    if framework == "ag2":
        from autogen.coding import DockerCommandLineCodeExecutor as AG2Peer

        Peer = AG2Peer

        def run(make: Any, name: str, work: Path) -> None:
            with make(
                image=DEFAULT_IMAGE,
                container_name=name,
                work_dir=work,
                auto_remove=auto_remove,
                stop_container=False,
            ) as executor:
                executor.execute_code_blocks([AG2Block(code="echo 1", language="sh")])

    else:
        Peer = pytest.importorskip(AUTOGEN_PEER).DockerCommandLineCodeExecutor

        def run(make: Any, name: str, work: Path) -> None:
            async def go() -> None:
                async with make(
                    DEFAULT_IMAGE,
                    container_name=name,
                    work_dir=work,
                    auto_remove=auto_remove,
                    stop_container=False,
                ) as executor:
                    block = AutoGenBlock(code="echo 1", language="sh")
                    await executor.execute_code_blocks([block], CancellationToken())

            asyncio.run(go())

    client = docker.from_env()
    states = {}
    names = {side: f"kx-keep-{side}-{uuid.uuid4().hex[:8]}" for side in ("peer", "ours")}
    makers = {"peer": Peer, "ours": getattr(globals()[framework], Peer.__name__)}
    try:
        for side, name in names.items():
            run(makers[side], name, peer_work_dir(tmp_path / side))
            try:
                client.containers.get(name).wait(timeout=30)  # auto_remove: removal is async
                status = client.containers.get(name).status
                states[side] = "removed" if status == "removing" else status
            except docker.errors.NotFound:
                states[side] = "removed"
    finally:
        for name in names.values():
            remove_container(name)
        client.close()
    assert states["ours"] == states["peer"] == ("removed" if auto_remove else "exited")


# -- issue 32.1 / 32.2: container_create_kwargs and the work dir, side by side with AG2's ---------


def test_ag2_container_create_kwargs_environment_and_labels_as_ag2(tmp_path: Path) -> None:
    """AG2 forwards ``container_create_kwargs`` to the engine; kernelexec raised TypeError for
    ``environment`` and let ``labels`` replace its own (``gc`` relies on them). Both now add
    to kernelexec's: the caller's values win, but never over kernelexec's owner labels."""
    import uuid

    import docker
    from autogen.coding import DockerCommandLineCodeExecutor as Peer

    from kernelexec.backends._docker_options import LABEL_SESSION
    from kernelexec.backends._owner import OWNER_LABEL

    forged = {OWNER_LABEL: "forged", LABEL_SESSION: "forged"}
    create = {
        "environment": {"GREETING": "hi", "HOME": "/work"},
        "labels": {"team": "kx", **forged},
    }
    block = AG2Block(code='echo "$GREETING $HOME"', language="sh")
    client = docker.from_env()
    seen = {}
    try:
        for side, make in (("peer", Peer), ("ours", ag2.DockerCommandLineCodeExecutor)):
            name = f"kx-create-{side}-{uuid.uuid4().hex[:8]}"
            with make(
                image=DEFAULT_IMAGE,
                container_name=name,
                work_dir=peer_work_dir(tmp_path / side),
                container_create_kwargs=create,
            ) as executor:
                result = executor.execute_code_blocks([block])
                seen[side] = (result.exit_code, result.output, client.containers.get(name).labels)
    finally:
        client.close()
    assert seen["ours"][:2] == seen["peer"][:2] == (0, "hi /work\n")
    assert seen["peer"][2]["team"] == seen["ours"][2]["team"] == "kx"
    ours = seen["ours"][2]
    assert ours[OWNER_LABEL] != "forged" and ours[LABEL_SESSION] != "forged"


def test_ag2_docker_work_dir_missing_parent_as_ag2(tmp_path: Path) -> None:
    """AG2's Docker executor makes the work dir, not its parents: FileNotFoundError, nothing
    made, nothing handed to the container user, no container left."""
    import os

    import docker
    from autogen.coding import DockerCommandLineCodeExecutor as Peer

    client = docker.from_env()

    def ours_or_peers() -> set[str]:  # other processes' containers come and go meanwhile
        mine = client.containers.list(
            all=True, filters={"label": f"kernelexec.owner_pid={os.getpid()}"}
        )
        peers = client.containers.list(
            all=True, ignore_removed=True, filters={"name": "autogen-code-exec-"}
        )
        return {c.id for c in [*mine, *peers]}

    before = ours_or_peers()
    try:
        for make in (Peer, ag2.DockerCommandLineCodeExecutor):
            with pytest.raises(FileNotFoundError):
                make(image=DEFAULT_IMAGE, work_dir=tmp_path / "no" / "such")
        assert not (tmp_path / "no").exists()
        assert ours_or_peers() <= before
    finally:
        client.close()
    with ag2.DockerCommandLineCodeExecutor(image=DEFAULT_IMAGE, work_dir=tmp_path / "new") as ex:
        result = ex.execute_code_blocks([AG2Block(code="echo made > made.txt", language="sh")])
    assert result.exit_code == 0 and (tmp_path / "new" / "made.txt").read_text() == "made\n"
