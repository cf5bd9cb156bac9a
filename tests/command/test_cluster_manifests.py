"""``kernelexec cluster spec --kubernetes``: the kernelspec (made by gateway_provisioners' own
installer), the manifests around it, and the kernel pod its launcher would create, checked
against the Kubernetes schema offline (kubernetes-validate ships the schemas). In the command
tier: the package's installer runs as a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gateway_provisioners")
kv = pytest.importorskip("kubernetes_validate")

#: a Kubernetes minor still supported upstream when this was written
VERSION = "1.30"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("cluster-spec")
    out = root / "manifests.json"
    argv = [sys.executable, "-m", "kernelexec", "cluster", "spec", "--kubernetes"]
    argv += ["--prefix", str(root), "--with-pod", "--manifests", str(out), "--namespace", "agents"]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    folder = root / "share" / "jupyter" / "kernels" / "kernelexec_k8s_python"
    return folder, json.loads(out.read_text())


def test_every_manifest_validates_strictly(generated: tuple[Path, dict[str, Any]]) -> None:
    _, document = generated
    kinds = [item["kind"] for item in document["items"]]
    assert kinds == [
        "Namespace",
        "ServiceAccount",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "NetworkPolicy",
        "Deployment",
        "Pod",
    ]
    for item in document["items"]:  # (the List wrapper has no schema of its own)
        kv.validate(item, VERSION, strict=True)  # raises on the first error


def test_the_validator_does_reject_a_broken_manifest(
    generated: tuple[Path, dict[str, Any]],
) -> None:
    _, document = generated
    deployment = json.loads(json.dumps(document["items"][6]))
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, VERSION, strict=True)


def test_the_kernel_pod_is_what_the_kernelspec_asks_for(
    generated: tuple[Path, dict[str, Any]],
) -> None:
    folder, document = generated
    pod = document["items"][-1]
    assert pod["metadata"]["namespace"] == "agents"
    assert pod["metadata"]["labels"]["app"] == "gateway-provisioners"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "kernelexec/python:launchers"
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    spec = json.loads((folder / "kernel.json").read_text())
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "kubernetes-provisioner"
    assert (folder / "scripts" / "launch_kubernetes.py").is_file()  # the package's launcher
    # the network policy selects exactly the pods the launcher makes
    policy = document["items"][5]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
