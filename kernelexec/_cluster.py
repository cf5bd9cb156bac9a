"""Kernelspecs and manifests for kernels on a cluster engine (``kernelexec cluster spec``).

The kernelspec is made by gateway_provisioners' own installer (it copies its launcher next to
``kernel.json``); kernelexec only adds the settings its image and its back end need. For
Kubernetes it also writes the objects the agent service needs around it (namespace, service
accounts, a role that may manage pods, a network policy that lets kernel pods talk to the
agent only, the agent's Deployment), and can render the kernel pod exactly as the package's
launcher would, from the package's own pod template, so everything can be checked against the
Kubernetes schema without a cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import BackendUnavailable
from .backends._docker_options import LAUNCHERS_IMAGE

CLUSTER_EXTRA_HINT = "pip install 'kernelexec[cluster]'"
#: the kernel pods' label (set by the package's pod template) and the agent's
KERNEL_LABELS = {"app": "gateway-provisioners", "component": "kernel"}
AGENT_LABELS = {"app": "kernelexec-agent"}
#: where gateway_provisioners' response manager listens for the launchers' reports by default
RESPONSE_PORT = 8877


@dataclass(frozen=True, kw_only=True)
class KubernetesSpec:
    """What ``kernelexec cluster spec --kubernetes`` writes."""

    kernel_name: str = "kernelexec_k8s_python"
    image: str = LAUNCHERS_IMAGE
    namespace: str = "kernelexec"
    #: the agent service: kernelexec with the cluster extra, using the kernelspec
    agent_image: str = "kernelexec/agent:latest"
    agent_replicas: int = 1
    kernel_service_account: str = "kernelexec-kernel"
    agent_service_account: str = "kernelexec-agent"
    #: per kernel: what the scheduler reserves, and the hard cap (see docs/scale.md)
    cpus: str = "250m"
    memory: str = "256Mi"
    cpus_limit: str = "1"
    memory_limit: str = "1Gi"
    uid: int = 1000
    gid: int = 1000
    launch_timeout: int = 60


@dataclass(frozen=True, kw_only=True)
class SwarmSpec:
    """What ``kernelexec cluster spec --swarm`` writes."""

    kernel_name: str = "kernelexec_swarm_python"
    image: str = LAUNCHERS_IMAGE
    #: an attachable overlay network the agent runs on too (services cannot use ``bridge``)
    network: str = "kernelexec"
    launch_timeout: int = 60


def install_kernelspec(spec: KubernetesSpec | SwarmSpec, prefix: Path) -> Path:
    """Install the kernelspec under ``prefix/share/jupyter/kernels``; its folder."""
    kubernetes = isinstance(spec, KubernetesSpec)
    module = "k8s_specapp" if kubernetes else "docker_specapp"
    argv = [sys.executable, "-m", f"gateway_provisioners.cli.{module}", "install"]
    argv += [f"--image-name={spec.image}", f"--kernel-name={spec.kernel_name}"]
    argv += [f"--prefix={prefix}", "--replace", f"--launch-timeout={spec.launch_timeout}"]
    if not kubernetes:
        argv.append("--swarm")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    folder = prefix / "share" / "jupyter" / "kernels" / spec.kernel_name
    if done.returncode != 0 or not (folder / "kernel.json").is_file():
        if "No module named 'gateway_provisioners'" in done.stderr:
            raise BackendUnavailable(f"gateway_provisioners is not installed: {CLUSTER_EXTRA_HINT}")
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise BackendUnavailable(f"gateway_provisioners' spec installer failed:\n{tail}")
    path = folder / "kernel.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    body["env"] = {**body.get("env", {}), **kernel_env(spec)}
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return folder


def kernel_env(spec: KubernetesSpec | SwarmSpec) -> dict[str, str]:
    """The kernelspec's ``env``: read by the launcher (``KERNEL_*`` fill the pod template)."""
    if isinstance(spec, SwarmSpec):
        return {"DOCKER_NETWORK": spec.network}
    return {
        "KERNEL_NAMESPACE": spec.namespace,
        "KERNEL_SERVICE_ACCOUNT_NAME": spec.kernel_service_account,
        "KERNEL_UID": str(spec.uid),
        "KERNEL_GID": str(spec.gid),
        "KERNEL_CPUS": spec.cpus,
        "KERNEL_MEMORY": spec.memory,
        "KERNEL_CPUS_LIMIT": spec.cpus_limit,
        "KERNEL_MEMORY_LIMIT": spec.memory_limit,
    }


def kernel_pod(folder: Path, kernel_id: str = "00000000-0000-0000-0000-000000000000") -> Any:
    """The pod the package's launcher would create for this kernelspec, rendered from the
    package's own template (copied into ``folder`` by its installer) the way it renders it:
    each ``KERNEL_*`` variable becomes a lower-cased keyword."""
    try:
        import jinja2
        import yaml
    except ImportError as exc:
        raise BackendUnavailable(f"rendering the kernel pod needs {exc.name}") from exc
    body = json.loads((folder / "kernel.json").read_text(encoding="utf-8"))
    env = dict(body.get("env", {}))
    env.update(
        KERNEL_ID=kernel_id,
        KERNEL_POD_NAME=f"kernelexec-{kernel_id}",
        KERNEL_IMAGE=body["metadata"]["kernel_provisioner"]["config"]["image_name"],
        KERNEL_NAME=folder.name,
    )
    keywords = {name.lower(): yaml.safe_load(value) for name, value in env.items()}
    loader = jinja2.FileSystemLoader(str(folder / "scripts"))
    templates = jinja2.Environment(loader=loader, trim_blocks=True, lstrip_blocks=True)
    text = templates.get_template("kernel-pod.yaml.j2").render(**keywords)
    pod = yaml.safe_load(text)
    # The launcher then puts its environment into the container's env stanza.
    container = pod["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": str(v)} for k, v in sorted(env.items())]
    return pod


def kubernetes_manifests(spec: KubernetesSpec) -> list[dict[str, Any]]:
    """The objects around the kernels: who may create their pods, and who may talk to them."""
    ns = spec.namespace
    meta = {"namespace": ns}
    agent_rules = [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    container = {
        "name": "agent",
        "image": spec.agent_image,
        "env": [
            # The launchers report back to the agent pod's own address.
            {"name": "KERNEL_NAMESPACE", "value": ns},
            {"name": "GP_RESPONSE_PORT", "value": str(RESPONSE_PORT)},
        ],
        "ports": [{"name": "launcher-reply", "containerPort": RESPONSE_PORT}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": spec.uid,
            "allowPrivilegeEscalation": False,
        },
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"cpu": "2", "memory": "1Gi"},
        },
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": spec.kernel_service_account, **meta},
            # kernels get no API access: they only run code
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": spec.agent_service_account, **meta},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "kernelexec-kernel-pods", **meta},
            "rules": agent_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "kernelexec-kernel-pods", **meta},
            "subjects": [
                {"kind": "ServiceAccount", "name": spec.agent_service_account, "namespace": ns}
            ],
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "kernelexec-kernel-pods",
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "kernelexec-kernels", **meta},
            "spec": {
                # Kernel pods: reached by the agent only, and reach the agent only.
                "podSelector": {"matchLabels": KERNEL_LABELS},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": AGENT_LABELS}}]}],
                "egress": [{"to": [{"podSelector": {"matchLabels": AGENT_LABELS}}]}],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "kernelexec-agent", **meta, "labels": AGENT_LABELS},
            "spec": {
                "replicas": spec.agent_replicas,
                "selector": {"matchLabels": AGENT_LABELS},
                "template": {
                    "metadata": {"labels": AGENT_LABELS},
                    "spec": {
                        "serviceAccountName": spec.agent_service_account,
                        "containers": [container],
                    },
                },
            },
        },
    ]


def manifest_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``kubectl apply -f`` document (JSON is YAML)."""
    return {"apiVersion": "v1", "kind": "List", "items": items}
