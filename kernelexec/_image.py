"""Building the kernelexec image, with a registry or without one.

``offline=True`` needs no registry at all: debootstrap a minimal Debian root file system from
the mirror apt already uses, install the Python stack with apt inside it (apt resolves
ipykernel's dependencies where debootstrap's ``--include`` does not), ``docker import`` it as a
base image, then ``docker build`` the small ``Dockerfile.offline`` FROM that local image.

Each image carries a hash of the recipe that made it; a build whose image already carries the
same hash is skipped (the base image has its own hash, so changing only the Dockerfile reuses it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ._errors import BackendUnavailable
from .backends._docker import (
    DEFAULT_IMAGE,
    DockerOptions,
    call,
    find_image,
    make_client,
    translate_errors,
)
from .backends._docker_options import (
    LABEL_LANGUAGES,
    LABEL_LAUNCHERS,
    LABEL_RECIPE,
    LANGUAGES_IMAGE,
    LAUNCHERS_IMAGE,
)

SUITE = "bookworm"
BASE_IMAGE = f"kernelexec/base:{SUITE}"
# pip too: a block may install a package (from a wheel in the work dir: no network), as the
# seed documents' agents do.
OFFLINE_PACKAGES = (
    "python3-ipykernel",
    "python3-numpy",
    "python3-pandas",
    "python3-matplotlib",
    "python3-pip",
)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
LABEL_BASE_RECIPE = "kernelexec.base-recipe"
# Bump when the build steps below change in a way the hashed inputs do not show.
_RECIPE_VERSION = "1"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    tag: str
    recipe: str
    skipped: bool


def recipe_text(name: str) -> str:
    """A recipe file shipped inside the package (``Dockerfile`` or ``Dockerfile.offline``)."""
    folder = resources.files("kernelexec").joinpath("_images")
    return folder.joinpath(name).read_text(encoding="utf-8")


def base_recipe_hash() -> str:
    parts = [_RECIPE_VERSION, SUITE, "minbase", *OFFLINE_PACKAGES]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def recipe_hash(*, offline: bool) -> str:
    if offline:
        parts = [_RECIPE_VERSION, base_recipe_hash(), recipe_text("Dockerfile.offline")]
    else:
        parts = [_RECIPE_VERSION, recipe_text("Dockerfile")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def apt_mirror(sources: Iterable[Path] | None = None) -> str:
    """The Debian archive apt is configured with (deb822 ``.sources`` or one-line format)."""
    if sources is None:
        root = Path("/etc/apt")
        sources = [root / "sources.list", *sorted(root.glob("sources.list.d/*"))]
    for path in sources:
        with contextlib.suppress(OSError):
            for uri in _uris(path.read_text(encoding="utf-8", errors="replace")):
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    return DEFAULT_MIRROR


def _uris(text: str) -> Iterator[str]:
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("URIs:"):
            yield from line[5:].split()
        elif line.startswith("deb "):
            match = re.match(r"deb\s+(?:\[[^\]]*\]\s+)?(\S+)", line)
            if match:
                yield match[1]


def _image_id(client: docker.DockerClient, tag: str) -> str | None:
    image = find_image(client, tag)
    image_id = None if image is None else image.id
    return image_id if isinstance(image_id, str) else None


def _labelled(client: docker.DockerClient, tag: str, label: str) -> str | None:
    image = find_image(client, tag)
    value = None if image is None else (image.labels or {}).get(label)
    return value if isinstance(value, str) else None


def build_image(
    *,
    offline: bool = False,
    tag: str = DEFAULT_IMAGE,
    mirror: str | None = None,
    force: bool = False,
    progress: Progress = print,
    options: DockerOptions | None = None,
) -> BuildResult:
    """Build ``tag`` unless an image with the same recipe hash already exists."""
    client = make_client(options or DockerOptions())
    try:
        recipe = recipe_hash(offline=offline)
        if not force and call("inspect", _labelled, client, tag, LABEL_RECIPE) == recipe:
            progress(f"{tag} is up to date (recipe {recipe}); nothing to build.")
            return BuildResult(tag=tag, recipe=recipe, skipped=True)
        previous = call("inspect", _image_id, client, tag)
        if offline:
            _ensure_base(client, mirror or apt_mirror(), force, progress)
            _docker_build(client, "Dockerfile.offline", tag, recipe, progress, {"BASE": BASE_IMAGE})
        else:
            _docker_build(client, "Dockerfile", tag, recipe, progress, {})
        progress(f"Built {tag} (recipe {recipe}).")
        if previous is not None and previous != call("inspect", _image_id, client, tag):
            # The image this build replaced is now untagged; drop it unless something uses it
            # (the engine refuses then, with an APIError: that refusal is the expected answer).
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(previous)
        return BuildResult(tag=tag, recipe=recipe, skipped=False)
    finally:
        client.close()


def _ensure_base(client: docker.DockerClient, mirror: str, force: bool, progress: Progress) -> None:
    wanted = base_recipe_hash()
    if not force and call("inspect", _labelled, client, BASE_IMAGE, LABEL_BASE_RECIPE) == wanted:
        progress(f"Reusing {BASE_IMAGE} (recipe {wanted}).")
        return
    _check_offline_tools()
    root = Path(tempfile.mkdtemp(prefix="kernelexec-rootfs-", dir="/var/tmp"))
    try:
        _make_rootfs(root, mirror, progress)
        progress(f"Importing the root file system as {BASE_IMAGE} ...")
        _import(client, root, wanted)
    finally:
        _remove_rootfs(root, progress)


def _check_offline_tools() -> None:
    if os.geteuid() != 0:
        raise BackendUnavailable("the offline image build needs root (debootstrap and chroot)")
    for tool in ("debootstrap", "chroot", "tar"):
        if shutil.which(tool) is None:
            raise BackendUnavailable(
                f"the offline image build needs {tool!r}: apt-get install -y debootstrap"
            )


def _make_rootfs(root: Path, mirror: str, progress: Progress) -> None:
    progress(f"debootstrap --variant=minbase {SUITE} from {mirror} (about a minute) ...")
    _run(["debootstrap", "--variant=minbase", SUITE, str(root), mirror], progress)
    # apt inside the chroot needs name resolution; the copy is removed again below.
    shutil.copyfile("/etc/resolv.conf", root / "etc" / "resolv.conf")
    progress(f"apt-get install {' '.join(OFFLINE_PACKAGES)} in the chroot (about a minute) ...")
    apt = ["chroot", str(root), "apt-get", "-y", "--no-install-recommends"]
    _run([*apt, "install", *OFFLINE_PACKAGES], progress)
    _run(["chroot", str(root), "apt-get", "clean"], progress)
    shutil.rmtree(root / "var" / "lib" / "apt" / "lists", ignore_errors=True)
    (root / "etc" / "resolv.conf").write_text("")


def _run(argv: list[str], progress: Progress) -> None:
    """Run a build step, passing its output on line by line; fail with its last lines."""
    env = {"PATH": _PATH, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    tail: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            progress("  " + line.rstrip())
            tail = [*tail[-19:], line.rstrip()]
    if proc.returncode != 0:
        last = "\n".join(tail)
        raise BackendUnavailable(f"{argv[0]} failed (exit {proc.returncode}):\n{last}")


def _import(client: docker.DockerClient, root: Path, base_hash: str) -> None:
    repo, _, image_tag = BASE_IMAGE.partition(":")
    changes = [f"LABEL {LABEL_BASE_RECIPE}={base_hash}", f"ENV PATH={_PATH}"]
    with subprocess.Popen(
        ["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE
    ) as tar:
        try:
            call(
                "docker import",
                client.api.import_image_from_stream,
                tar.stdout,
                repository=repo,
                tag=image_tag,
                changes=changes,
            )
        finally:
            if tar.poll() is None:  # the import failed half-way
                tar.kill()
    if tar.returncode not in (0, -9):
        raise BackendUnavailable(f"tar of the root file system failed (exit {tar.returncode})")


def _remove_rootfs(root: Path, progress: Progress) -> None:
    """Delete the temp root, but never through a mount (a leftover /proc would be fatal)."""
    mounted = [m for m in _mount_points() if m == root or root in m.parents]
    for point in sorted(mounted, reverse=True):
        subprocess.run(["umount", "-l", str(point)], check=False)
    if any(m == root or root in m.parents for m in _mount_points()):
        progress(f"warning: {root} still has mounts; left in place")
        return
    shutil.rmtree(root, ignore_errors=True)


def _mount_points() -> list[Path]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [Path(line.split()[1].replace("\\040", " ")) for line in lines if len(line.split()) > 1]


def _docker_build(
    client: docker.DockerClient,
    dockerfile: str,
    tag: str,
    recipe: str,
    progress: Progress,
    buildargs: dict[str, str],
    *,
    context: Path | None = None,
    labels: dict[str, str] | None = None,
    network_mode: str | None = None,
) -> None:
    """``docker build`` from the package's recipes, or from ``context`` when one is given."""
    progress(f"docker build {tag} from {dockerfile} ...")
    folder = resources.files("kernelexec").joinpath("_images")
    with contextlib.ExitStack() as stack:
        path = context or stack.enter_context(resources.as_file(folder))
        stack.enter_context(translate_errors("docker build"))
        for chunk in client.api.build(
            path=str(path),
            dockerfile=dockerfile,
            tag=tag,
            labels={**(labels or {}), LABEL_RECIPE: recipe},
            buildargs=buildargs,
            network_mode=network_mode,
            rm=True,
            forcerm=True,
            decode=True,
        ):
            _report(chunk, progress, offline=dockerfile != "Dockerfile")


def _report(chunk: dict[str, Any], progress: Progress, *, offline: bool) -> None:
    if "error" in chunk:
        hint = "" if offline else " (no registry reachable? try `kernelexec image build --offline`)"
        raise BackendUnavailable(f"docker build failed: {chunk['error'].strip()}{hint}")
    text = chunk.get("stream") or chunk.get("status")
    if text and text.strip():
        progress("  " + text.rstrip())


# -- the kernel launchers (``image build --with-launchers``) ------------------------------------
#: what the launcher image installs with pip: the provisioners' package (its bootstrap and
#: launchers) and the two libraries the launcher imports that Debian's Python stack lacks
LAUNCHER_DISTRIBUTIONS = ("gateway_provisioners", "pycryptodomex", "overrides")
#: the Python of the Debian suite the kernel image is made from (wheels are chosen for it)
IMAGE_PYTHON = "3.11"
CLUSTER_EXTRA_HINT = "pip install 'kernelexec[cluster]'"


def launcher_versions() -> dict[str, str]:
    """The installed versions of ``LAUNCHER_DISTRIBUTIONS``: the image gets the same ones."""
    from importlib import metadata

    versions: dict[str, str] = {}
    for name in LAUNCHER_DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise BackendUnavailable(
                f"the kernel launchers come from {name!r}, which is not installed here: "
                f"{CLUSTER_EXTRA_HINT}"
            ) from None
    return versions


def launcher_recipe_hash(base_recipe: str, versions: dict[str, str]) -> str:
    pins = [f"{name}=={version}" for name, version in sorted(versions.items())]
    parts = [_RECIPE_VERSION, base_recipe, recipe_text("Dockerfile.launchers"), *pins]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build_launcher_image(
    *,
    base: str = DEFAULT_IMAGE,
    tag: str = LAUNCHERS_IMAGE,
    force: bool = False,
    progress: Progress = print,
    options: DockerOptions | None = None,
) -> BuildResult:
    """Build ``tag``: ``base`` plus gateway_provisioners' kernel launchers, put in place by the
    package's own ``jupyter-image-bootstrap``.

    The build itself needs no registry and no index: the wheels are fetched here first, with
    pip (from its cache or the index this machine uses), for the versions installed here.
    """
    versions = launcher_versions()
    client = make_client(options or DockerOptions())
    try:
        base_recipe = call("inspect", _labelled, client, base, LABEL_RECIPE)
        if base_recipe is None:
            raise BackendUnavailable(
                f"the launcher image is built on {base}, which is not built yet: "
                "`kernelexec image build --offline` (or without --offline)"
            )
        recipe = launcher_recipe_hash(base_recipe, versions)
        if not force and call("inspect", _labelled, client, tag, LABEL_RECIPE) == recipe:
            progress(f"{tag} is up to date (recipe {recipe}); nothing to build.")
            return BuildResult(tag=tag, recipe=recipe, skipped=True)
        previous = call("inspect", _image_id, client, tag)
        with tempfile.TemporaryDirectory(prefix="kernelexec-launchers-") as tmp:
            context = Path(tmp)
            recipe_file = context / "Dockerfile.launchers"
            recipe_file.write_text(recipe_text("Dockerfile.launchers"), encoding="utf-8")
            _download_wheels(context / "wheels", versions, progress)
            labels = {LABEL_LAUNCHERS: versions["gateway_provisioners"]}
            _docker_build(
                client,
                "Dockerfile.launchers",
                tag,
                recipe,
                progress,
                {"BASE": base},
                context=context,
                labels=labels,
            )
        progress(f"Built {tag} (recipe {recipe}).")
        _drop_replaced(client, previous, tag)
        return BuildResult(tag=tag, recipe=recipe, skipped=False)
    finally:
        client.close()


def _drop_replaced(client: docker.DockerClient, previous: str | None, tag: str) -> None:
    """Remove the image ``tag`` named before a build, if the build replaced it (an image still
    in use stays: the engine refuses)."""
    if previous is not None and previous != call("inspect", _image_id, client, tag):
        with contextlib.suppress(docker.errors.APIError):
            client.images.remove(previous)


def _download_wheels(dest: Path, versions: dict[str, str], progress: Progress) -> None:
    """Wheels for the image's Python (binary only: nothing is compiled for the image)."""
    dest.mkdir()
    _pip_download(dest, versions, progress, what="the launcher wheels")


def _pip_download(dest: Path, versions: dict[str, str], progress: Progress, *, what: str) -> None:
    pins = [f"{name}=={version}" for name, version in sorted(versions.items())]
    progress(f"pip download {' '.join(pins)} (wheels for Python {IMAGE_PYTHON}) ...")
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    argv += ["--only-binary=:all:", "--python-version", IMAGE_PYTHON, "--dest", str(dest), *pins]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise BackendUnavailable(f"pip could not fetch {what}:\n{tail}")


# -- the other languages' kernels (``image build --languages r,js,bash``) -----------------------
#: what each language needs: Debian packages (from the base's mirror) and distributions from the
#: package index (the versions installed here; Deno's wheel is only a carrier for its binary)
_LANGUAGE_PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "r": (("r-base-core", "r-cran-irkernel"), ()),
    "javascript": ((), ("deno",)),
    "bash": ((), ("bash_kernel", "filetype")),
}
_LANGUAGE_NAMES = {"r": "r", "js": "javascript", "javascript": "javascript"}
_LANGUAGE_NAMES |= {"ts": "javascript", "typescript": "javascript", "deno": "javascript"}
_LANGUAGE_NAMES |= {"bash": "bash", "shell": "bash"}
LANGUAGES_HINT = "pip install 'kernelexec[languages]'"


def image_languages(names: Iterable[str]) -> tuple[str, ...]:
    """``r``, ``js`` (or ``ts``, ``javascript``), ``bash``, as the build knows them; sorted."""
    found = set()
    for name in names:
        key = name.strip().lower()
        if not key:
            continue
        if key not in _LANGUAGE_NAMES:
            known = ", ".join(sorted({"r", "js", "ts", "bash"}))
            raise ValueError(f"no image recipe for the language {name!r} (known: {known})")
        found.add(_LANGUAGE_NAMES[key])
    return tuple(sorted(found))


def language_versions(languages: Iterable[str]) -> dict[str, str]:
    """The installed versions of what ``languages`` take from the package index."""
    from importlib import metadata

    versions: dict[str, str] = {}
    for language in languages:
        for name in _LANGUAGE_PARTS[language][1]:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                raise BackendUnavailable(
                    f"the image's {language} kernel comes from {name!r}, which is not "
                    f"installed here: {LANGUAGES_HINT}"
                ) from None
    return versions


def language_recipe_hash(
    base_recipe: str, languages: tuple[str, ...], versions: dict[str, str]
) -> str:
    parts = [_RECIPE_VERSION, base_recipe, recipe_text("Dockerfile.langs"), *languages]
    parts += [f"{name}=={version}" for name, version in sorted(versions.items())]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build_language_image(
    languages: Iterable[str],
    *,
    base: str = DEFAULT_IMAGE,
    tag: str = LANGUAGES_IMAGE,
    force: bool = False,
    progress: Progress = print,
    options: DockerOptions | None = None,
) -> BuildResult:
    """Build ``tag``: ``base`` plus the kernels of ``languages`` (``r``, ``js``, ``bash``).

    R and IRkernel come from the Debian mirror the base was made from (apt inside the build,
    on the host's network); Deno's binary and bash_kernel's wheels are fetched here with pip,
    for the versions installed here. The build reuses ``base``: nothing is debootstrapped.
    """
    wanted = image_languages(languages)
    if not wanted:
        raise ValueError("no languages to build an image for (r, js, bash)")
    versions = language_versions(wanted)
    client = make_client(options or DockerOptions())
    try:
        base_recipe = call("inspect", _labelled, client, base, LABEL_RECIPE)
        if base_recipe is None:
            raise BackendUnavailable(
                f"the languages image is built on {base}, which is not built yet: "
                "`kernelexec image build --offline`"
            )
        recipe = language_recipe_hash(base_recipe, wanted, versions)
        if not force and call("inspect", _labelled, client, tag, LABEL_RECIPE) == recipe:
            progress(f"{tag} is up to date (recipe {recipe}); nothing to build.")
            return BuildResult(tag=tag, recipe=recipe, skipped=True)
        previous = call("inspect", _image_id, client, tag)
        apt = [pkg for lang in wanted for pkg in _LANGUAGE_PARTS[lang][0]]
        with tempfile.TemporaryDirectory(prefix="kernelexec-langs-", dir="/var/tmp") as tmp:
            context = Path(tmp)
            (context / "Dockerfile.langs").write_text(recipe_text("Dockerfile.langs"), "utf-8")
            _fetch_language_parts(context / "fetched", versions, progress)
            _docker_build(
                client,
                "Dockerfile.langs",
                tag,
                recipe,
                progress,
                {"BASE": base, "APT_PACKAGES": " ".join(apt)},
                context=context,
                labels={LABEL_LANGUAGES: ",".join(wanted)},
                network_mode="host",  # apt inside reaches the mirror as the host does
            )
        progress(f"Built {tag} (recipe {recipe}; languages {', '.join(wanted)}).")
        _drop_replaced(client, previous, tag)
        return BuildResult(tag=tag, recipe=recipe, skipped=False)
    finally:
        client.close()


def _fetch_language_parts(dest: Path, versions: dict[str, str], progress: Progress) -> None:
    """The wheels into ``dest``; Deno's wheel replaced by the binary it carries."""
    dest.mkdir()
    if versions:
        _pip_download(dest, versions, progress, what="the languages' wheels")
    for wheel in dest.glob("deno-*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            member = next((n for n in archive.namelist() if n.endswith(".data/scripts/deno")), "")
            if not member:
                raise BackendUnavailable(f"{wheel.name} holds no deno binary")
            with archive.open(member) as src, open(dest / "deno", "wb") as out:
                shutil.copyfileobj(src, out)
        wheel.unlink()
