"""The deployment files under deploy/ as the tests read them: the KServe manifests, the
vendored CRD schemas (made strict, as ``kubectl apply``'s field validation is), the
image's entry point and the command line KServe gives it."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = Path(__file__).resolve().parent / "kserve_schemas"
RUNTIME = DEPLOY / "kserve" / "clusterservingruntime.yaml"
SERVICE = DEPLOY / "kserve" / "inferenceservice.yaml"
ENTRYPOINT = DEPLOY / "entrypoint.py"
CONTAINERFILE = DEPLOY / "Containerfile"


def manifest(path: Path) -> dict[str, Any]:
    """One Kubernetes object of a YAML file."""
    return yaml.safe_load(path.read_text())


def schema(kind: str) -> dict[str, Any]:
    """The vendored openAPIV3Schema of ``clusterservingruntime`` or ``inferenceservice``."""
    return json.loads((SCHEMAS / f"{kind}.json").read_text())


def strict(node: Any) -> Any:
    """The schema with unknown fields refused: an object schema that lists its properties
    and neither preserves unknown fields nor says what more it allows gets
    ``additionalProperties: false``. The API server prunes unknown fields silently, and
    ``kubectl apply`` (strict field validation, its default since Kubernetes 1.27) refuses
    them; a misspelled field is the usual broken manifest, so the tests refuse it too."""
    node = copy.deepcopy(node)
    _make_strict(node)
    return node


def _make_strict(node: Any) -> None:
    if isinstance(node, list):
        for item in node:
            _make_strict(item)
        return
    if not isinstance(node, dict):
        return
    for value in node.values():
        _make_strict(value)
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        node["additionalProperties"] = False


def container(runtime: dict[str, Any]) -> dict[str, Any]:
    """The runtime's one container (KServe's ``kserve-container``)."""
    (only,) = runtime["spec"]["containers"]
    return only


def option(args: list[str], name: str) -> str:
    """The value of ``--name=value`` among a container's arguments."""
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    return value


def image_entrypoint() -> list[str]:
    """The image's ENTRYPOINT (exec form), as the Containerfile declares it."""
    (line,) = re.findall(r"^ENTRYPOINT (\[.*\])$", CONTAINERFILE.read_text(), re.MULTILINE)
    return json.loads(line)


def kserve_command(runtime: dict[str, Any], python: str, model_dir: Path, name: str) -> list[str]:
    """The command line the image runs under KServe, here: the image's entry point with
    the runtime's arguments, ``{{.Name}}`` replaced as KServe does, the storage
    initializer's /mnt/models replaced by ``model_dir`` and a free port for 8080."""
    entry = image_entrypoint()
    assert entry[1] == "/opt/layerfit/entrypoint.py", entry  # deploy/entrypoint.py, copied there
    args = [a.replace("{{.Name}}", name) for a in container(runtime)["args"]]
    args = [f"--model-dir={model_dir}" if a == "--model-dir=/mnt/models" else a for a in args]
    args = ["--port=0" if a == "--port=8080" else a for a in args]
    return [python, str(ENTRYPOINT), *args]
