"""DockerOptions' safe defaults and the image recipe helpers (no engine needed)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from kernelexec import DockerCommand, DockerKernel, DockerOptions
from kernelexec._image import apt_mirror, recipe_hash, recipe_text
from kernelexec.backends._docker import UNPRIVILEGED_USER, container_env, container_kwargs


def test_options_are_frozen_and_keyword_only() -> None:
    options = DockerOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.network = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        DockerOptions("kernelexec/python:latest")  # type: ignore[misc]


def test_defaults_are_the_safe_ones() -> None:
    kwargs = container_kwargs(DockerOptions(), labels={"a": "b"})
    assert kwargs["cap_drop"] == ["ALL"]
    assert kwargs["security_opt"] == ["no-new-privileges"]
    assert kwargs["network_mode"] == "none"
    assert kwargs["pids_limit"] > 0
    assert kwargs["mem_limit"] == kwargs["memswap_limit"]  # no swap
    assert kwargs["nano_cpus"] == 1_000_000_000
    assert "read_only" not in kwargs
    assert kwargs["tmpfs"]["/tmp"].startswith("rw,nosuid,nodev")
    assert not kwargs["user"].startswith("0:")
    ro = container_kwargs(DockerOptions(read_only=True, network=True), labels={})
    assert ro["read_only"] is True and "network_mode" not in ro


def test_user_is_the_caller_but_never_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getuid", lambda: 0)
    assert DockerOptions().resolved_user() == UNPRIVILEGED_USER
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    monkeypatch.setattr(os, "getgid", lambda: 99)
    assert DockerOptions().resolved_user() == "1234:99"
    assert DockerOptions(user="0:0").resolved_user() == "0:0"  # only when asked for


def test_container_env_is_not_the_hosts() -> None:
    env = container_env(DockerOptions(environment={"A": "1"}), {"B": "2"})
    assert env["HOME"] == "/tmp" and env["A"] == "1" and env["B"] == "2"
    assert "PATH" not in env


def test_back_ends_take_option_overrides() -> None:
    backend = DockerCommand(image="x:y", memory="1g", options=DockerOptions(cpus=2))
    assert (backend.options.image, backend.options.memory, backend.options.cpus) == ("x:y", "1g", 2)
    assert backend.workspace == "/workspace"
    assert backend.argv_for("python", "a.py") == ["python3", "a.py"]
    assert DockerKernel(network=True).options.network is True
    with pytest.raises(TypeError):
        DockerKernel(no_such_option=1)


def test_apt_mirror_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\n# comment\nURIs: http://mirror.example/debian\nSuites: x\n")
    one_line = tmp_path / "sources.list"
    one_line.write_text("deb [arch=amd64] http://other.example/debian/ bookworm main\n")
    other = tmp_path / "node.sources"
    other.write_text("URIs: https://deb.nodesource.com/node_20.x\n")
    assert apt_mirror([other, deb822]) == "http://mirror.example/debian"
    assert apt_mirror([one_line]) == "http://other.example/debian"
    assert apt_mirror([other, tmp_path / "missing"]) == "http://deb.debian.org/debian"


def test_recipe_hash_follows_the_recipe() -> None:
    assert recipe_hash(offline=True) != recipe_hash(offline=False)
    assert recipe_hash(offline=True) == recipe_hash(offline=True)
    assert "ipykernel_launcher" in recipe_text("Dockerfile.offline")
    assert "USER 1000:1000" in recipe_text("Dockerfile")


def test_run_kwargs_labels_and_environment_add_to_kernelexecs() -> None:
    """Issue 32.1: ``run_kwargs`` (the AG2 drop-in's ``container_create_kwargs``) labels and
    environment merge, in docker-py's dict or list form; kernelexec's own labels win."""
    run_kwargs = {
        "labels": ["team", "kernelexec.owner=forged"],
        "environment": ["GREETING=hi", "HOME=/work", "BARE"],
        "hostname": "kx",
    }
    options = DockerOptions(run_kwargs=run_kwargs, environment={"GREETING": "hello"})
    kwargs = container_kwargs(options, labels={"kernelexec.owner": "me"})
    assert kwargs["labels"] == {"team": "", "kernelexec.owner": "me"}
    assert "environment" not in kwargs and kwargs["hostname"] == "kx"
    env = container_env(options, {"EXTRA": "1"})
    assert env["HOME"] == "/work" and env["GREETING"] == "hello" and env["EXTRA"] == "1"
    assert "BARE" not in env and env["LANG"] == "C.UTF-8"
