"""Vendor the openAPIV3Schema of KServe's CRDs that tests/deploy/test_kserve_manifests.py
validates the manifests against.

    git clone --bare https://github.com/kserve/kserve kserve.git
    python deploy/kserve/vendor_schemas.py kserve.git v0.20.0

(any clone, bare or not, and any tag or commit) writes ``tests/deploy/kserve_schemas/{clusterservingruntime,inferenceservice}.json``:
the served version's schema of ``config/crd/full/serving.kserve.io_*.yaml`` at that
tag, its ``description`` texts dropped (they do not validate anything) and, of the
InferenceService, only ``spec.predictor`` kept whole: the transformer, explainer and
canary (together 380 kB of the 640) are kept as objects of any content, checked by
nothing. Each file names the KServe ref and commit it came from (``x-vendored-from``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[2] / "tests" / "deploy" / "kserve_schemas"
CRDS = {
    "clusterservingruntime": ("serving.kserve.io_clusterservingruntimes.yaml", "v1alpha1"),
    "inferenceservice": ("serving.kserve.io_inferenceservices.yaml", "v1beta1"),
}
TRIMMED = ("transformer", "explainer", "canary")  # InferenceService spec fields not vendored


def without_descriptions(node: object) -> object:
    """The schema with every ``description`` text dropped."""
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def schema_of(crd_text: str, version: str) -> dict:
    """The openAPIV3Schema of ``version`` in a CRD."""
    crd = yaml.safe_load(crd_text)
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise SystemExit(f"the CRD {crd['metadata']['name']} has no version {version}")


def main(repository: str, ref: str) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "--git-dir", repository, *args], capture_output=True, text=True,
                              check=True).stdout

    commit = git("rev-parse", f"{ref}^{{commit}}").strip()
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (file, version) in CRDS.items():
        text = git("show", f"{commit}:config/crd/full/{file}")
        schema = without_descriptions(schema_of(text, version))
        if name == "inferenceservice":
            spec = schema["properties"]["spec"]["properties"]
            for field in TRIMMED:
                spec[field] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                               "x-vendored-trimmed": True}
        schema["x-vendored-from"] = {"repository": "https://github.com/kserve/kserve", "ref": ref,
                                     "commit": commit, "file": f"config/crd/full/{file}", "version": version}
        (OUT / f"{name}.json").write_text(json.dumps(schema, separators=(",", ":"), sort_keys=True) + "\n")
        print(f"{name}: {ref} {commit} {file} {version}")


if __name__ == "__main__":
    main(str(Path(sys.argv[1]).resolve()), sys.argv[2])
