"""The KServe manifests validate against KServe's published CRD schemas (v0.20.0,
vendored by deploy/kserve/vendor_schemas.py), strictly; a broken manifest does not; and
the two agree with each other and with the server they start."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from deploy_files import RUNTIME, SERVICE, container, manifest, option, schema, strict

jsonschema_rs = pytest.importorskip("jsonschema_rs")


def errors(kind: str, document: dict[str, Any]) -> list[str]:
    """What the CRD's schema (strict) says is wrong with ``document``, one line each."""
    validator = jsonschema_rs.Draft4Validator(strict(schema(kind)))
    return [f"{'/'.join(map(str, e.instance_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_schemas_are_kserves_published_ones() -> None:
    for kind in ("clusterservingruntime", "inferenceservice"):
        source = schema(kind)["x-vendored-from"]
        assert source["ref"] == "v0.20.0" and source["commit"] == "1fb781055dd1567164358233e1125142ca6ef1fe"


def test_the_serving_runtime_validates() -> None:
    runtime = manifest(RUNTIME)
    assert (runtime["apiVersion"], runtime["kind"]) == ("serving.kserve.io/v1alpha1", "ClusterServingRuntime")
    assert errors("clusterservingruntime", runtime) == []


def test_the_inference_service_validates() -> None:
    service = manifest(SERVICE)
    assert (service["apiVersion"], service["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert errors("inferenceservice", service) == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change that sets the field at ``path`` (dots; list indexes as numbers)."""
    def change(document: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = document
        for key in parents:
            node = node[key]
        node[last] = value
    return change


def _rename(path: str, new: str) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for key in parents:
            node = node[int(key) if key.isdigit() else key]
        node[new] = node.pop(last)
    return change


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = document
        for key in parents:
            node = node[int(key) if key.isdigit() else key]
        del node[last]
    return change


BROKEN = {  # case: (schema, file, change, where the error must be and what it must say)
    "runtime: a misspelled probe": ("clusterservingruntime", RUNTIME, _rename(
        "spec.containers.0.livenessProbe", "livenesProbe"), "spec/containers/0: ", "'livenesProbe' was unexpected"),
    "runtime: a port as text": ("clusterservingruntime", RUNTIME, _set(
        "spec.containers.0.ports.0.containerPort", "8080"), "containerPort: ", "not of type"),
    "runtime: a memory that is no quantity": ("clusterservingruntime", RUNTIME, _set(
        "spec.containers.0.resources.limits.memory", "1 GB"), "limits/memory: ", "does not match"),
    "runtime: a container without a name": ("clusterservingruntime", RUNTIME, _delete(
        "spec.containers.0.name"), "spec/containers/0: ", '"name" is a required property'),
    "runtime: a protocol as one string": ("clusterservingruntime", RUNTIME, _set(
        "spec.protocolVersions", "v2"), "spec/protocolVersions: ", "not of type"),
    "service: a scale metric KServe lacks": ("inferenceservice", SERVICE, _set(
        "spec.predictor.scaleMetric", "gpu"), "predictor/scaleMetric: ", "is not one of"),
    "service: a grace period as text": ("inferenceservice", SERVICE, _set(
        "spec.predictor.terminationGracePeriodSeconds", "30s"), "terminationGracePeriodSeconds: ", "not of type"),
    "service: a model format without a name": ("inferenceservice", SERVICE, _delete(
        "spec.predictor.model.modelFormat.name"), "model/modelFormat: ", '"name" is a required property'),
    "service: an unknown predictor field": ("inferenceservice", SERVICE, _rename(
        "spec.predictor.model.storageUri", "storageURI"), "predictor/model: ", "'storageURI' was unexpected"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_manifest_does_not_validate(case: str) -> None:
    kind, path, change, where, says = BROKEN[case]
    document = copy.deepcopy(manifest(path))
    change(document)
    found = errors(kind, document)
    assert any(where in e and says in e for e in found), found


def test_the_service_runs_on_this_runtime_within_its_grace() -> None:
    """The InferenceService selects this runtime and format; the grace period it declares
    outlasts the drain the runtime's server is given; memory is requested as limited."""
    runtime, service = manifest(RUNTIME), manifest(SERVICE)
    predictor = service["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {(f["name"], f["version"]) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    drain = float(option(container(runtime)["args"], "--shutdown-grace"))
    assert drain + 5 <= predictor["terminationGracePeriodSeconds"]  # 5 s or more to close after the drain
    for resources in (model["resources"], container(runtime)["resources"]):
        assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_probes_and_metrics_are_on_the_servers_port() -> None:
    runtime = manifest(RUNTIME)
    serving = container(runtime)
    port = int(option(serving["args"], "--port"))
    assert [p["containerPort"] for p in serving["ports"]] == [port]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert serving[probe]["httpGet"]["port"] == port
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == str(port)
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/path"] == "/metrics"
