"""Hypothesis against the readers of what users and files hand layerfit: manifests, the
weights file's safetensors header, ``.npy`` and ``.safetensors`` inputs, budget strings.
Each must give a correct result or one LayerfitError (a one-line message), never
another exception or a hang."""

from __future__ import annotations

import contextlib
import json
import shutil
import struct
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from layerfit.cli import main
from layerfit.cli.models import _load_input, _read_safetensors
from layerfit.errors import BudgetError, LayerfitError
from layerfit.sizes import parse_budget, parse_bytes
from layerfit.store import prepare, read_manifest

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fuzz") / "m"
    prepare("mobilenet_v1_025", out, input_shape=(1, 3, 32, 32))
    return out


@pytest.fixture(scope="module")
def scratch(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scratch") / "m"
    shutil.copytree(prepared, folder)
    return folder


def paths_of(value, prefix=()):
    """Every path (keys and indices) into a JSON value, the root's included."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths_of(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            yield from paths_of(v, (*prefix, i))


def replaced(document, path, value):
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return copy


@given(data=st.data())
@FUZZ
def test_any_edit_of_a_manifest_is_read_or_refused_in_one_line(prepared: Path, scratch: Path, data) -> None:
    original = json.loads((prepared / "manifest.json").read_text())
    paths = list(paths_of(original))
    path = data.draw(st.sampled_from(paths))
    value = data.draw(json_values)
    (scratch / "manifest.json").write_text(json.dumps(replaced(original, path, value)))
    with contextlib.suppress(LayerfitError):  # refused with its message, or read
        read_manifest(scratch)


@given(header=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()), declared=st.integers(0, 2**64 - 1))
@FUZZ
def test_any_weights_header_is_checked_or_refused(prepared: Path, scratch: Path, header: bytes, declared: int) -> None:
    shutil.copy(prepared / "manifest.json", scratch / "manifest.json")
    real = (prepared / "weights.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", real[:8])
    body = header.ljust(length, b" ")[:length] if declared % 2 else header
    size = declared if declared % 3 == 0 else len(body)
    damaged = struct.pack("<Q", size) + body + real[8 + length:]
    (scratch / "weights.safetensors").write_bytes(damaged[: len(real)].ljust(len(real), b"\0"))
    try:
        read_manifest(scratch)
    except LayerfitError:
        pass
    finally:
        shutil.copy(prepared / "weights.safetensors", scratch / "weights.safetensors")


npy_headers = st.fixed_dictionaries({
    "descr": st.sampled_from(["<f4", ">f4", "<f8", "|O", "<i8", "|b1", "<U3", "V8", "{}", "<f4 "]) | st.text(max_size=6),
    "fortran_order": st.booleans() | st.integers(),
    "shape": st.lists(st.integers(-2, 2**40), max_size=5).map(tuple) | st.text(max_size=5),
})


@given(header=npy_headers | st.text(max_size=60), payload=st.binary(max_size=64), version=st.sampled_from([1, 2, 3]))
# numpy 2's string dtype, which has no byte order to ask for (a traceback once)
@example(header={"descr": "T", "fortran_order": False, "shape": (1, 3)}, payload=b"", version=1)
@FUZZ
def test_any_npy_input_is_loaded_or_refused(prepared: Path, tmp_path_factory, header, payload: bytes,
                                            version: int) -> None:
    manifest = read_manifest(prepared)
    text = (repr(header) if isinstance(header, dict) else header).ljust(100) + "\n"
    size = struct.pack("<H", len(text)) if version == 1 else struct.pack("<I", len(text))
    path = tmp_path_factory.mktemp("npy") / "x.npy"
    path.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + size + text.encode("utf-8", "replace") + payload)
    try:
        x = _load_input(str(path), manifest)
    except LayerfitError:
        return
    assert tuple(x.shape) == manifest.input_shape  # accepted: exactly what the model takes


def test_a_valid_npy_input_is_loaded(prepared: Path, tmp_path: Path) -> None:
    manifest = read_manifest(prepared)
    value = np.random.default_rng(0).standard_normal(manifest.input_shape).astype(np.float32)
    np.save(tmp_path / "x.npy", value)
    assert np.array_equal(_load_input(str(tmp_path / "x.npy"), manifest).numpy(), value)
    np.save(tmp_path / "big.npy", value.astype(">f4"))  # the other byte order: same values
    assert np.array_equal(_load_input(str(tmp_path / "big.npy"), manifest).numpy(), value)


@given(raw=st.binary(max_size=200), header=json_values)
@FUZZ
def test_any_safetensors_input_is_read_or_refused(tmp_path_factory, raw: bytes, header) -> None:
    path = tmp_path_factory.mktemp("st") / "x.safetensors"
    encoded = json.dumps(header).encode()
    path.write_bytes(raw if len(raw) % 2 else struct.pack("<Q", len(encoded)) + encoded + raw)
    try:
        tensors = _read_safetensors(str(path), "input", "")
    except LayerfitError:
        return
    assert isinstance(tensors, dict)


@given(text=st.text(max_size=30))
@settings(max_examples=500, deadline=None, database=None)
def test_any_budget_string_is_a_size_or_one_error(text: str) -> None:
    for parse in (lambda t: parse_bytes(t), lambda t: parse_budget(t, 10**9)):
        try:
            value = parse(text)
        except BudgetError:
            continue
        assert isinstance(value, int) and 0 <= value < 2**63


@given(number=st.decimals(min_value=0, max_value=10**6, places=3), unit=st.sampled_from(
    ["kB", "MB", "GB", "KiB", "MiB", "GiB", "mb", "GIB"]), space=st.sampled_from(["", " "]))
@settings(max_examples=300, deadline=None, database=None)
def test_a_size_means_what_its_unit_says(number: Decimal, unit: str, space: str) -> None:
    scale = {"kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}[unit.lower()]
    assert parse_bytes(f"{number}{space}{unit}") == int((number * scale).to_integral_value())


@given(argv=st.lists(st.sampled_from(["run", "inspect", "verify", "--budget", "50%", "-1", "x", "--input", "",
                                      "--json", "--pipeline", "nope", "\0", "١٢MB"]), max_size=6))
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_any_command_line_exits_cleanly(prepared: Path, argv: list[str], capsys) -> None:
    code = main([a if a != "x" else str(prepared) for a in argv])
    assert code in (0, 1, 2)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
