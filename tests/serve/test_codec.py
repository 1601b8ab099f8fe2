"""Open Inference Protocol codecs: JSON and binary tensors, validation messages."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.schedule.runtime.repository import check_name
from layerfit.serve.codec import (
    HEADER_LENGTH,
    TensorSpec,
    decode_input,
    encode_response,
    loads,
    parse_request,
    split_body,
)
from layerfit.serve.datatypes import TORCH_DTYPES, datatype_of, torch_dtype
from layerfit.serve.errors import BadRequestError, status_of
from layerfit.serve.registry import output_names
from layerfit.serve.types import InferenceRequest

SPEC = TensorSpec("input", "FP32", (2, 3))


def binary_body(header: dict, *blobs: bytes) -> tuple[bytes, str]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), str(len(head))


def request(data, datatype="FP32", shape=(2, 3), name="input", **extra) -> bytes:
    return json.dumps({"inputs": [{"name": name, "shape": list(shape), "datatype": datatype, "data": data}], **extra}).encode()


def decode(body: bytes, header: str | None = None, spec: TensorSpec = SPEC) -> torch.Tensor:
    req, chunks = parse_request(body, header)
    return decode_input(req.inputs[0], chunks[0], spec, "m")


def test_datatypes_round_trip() -> None:
    for name, dtype in TORCH_DTYPES.items():
        assert datatype_of(dtype) == name
    assert datatype_of("float32") == "FP32"
    assert torch_dtype("BF16", tensor="x") == torch.bfloat16
    with pytest.raises(BadRequestError, match="BYTES is not supported"):
        torch_dtype("BYTES", tensor="x")
    with pytest.raises(BadRequestError, match="unknown datatype 'FLOAT'"):
        torch_dtype("FLOAT", tensor="x")


def test_json_flat_and_nested_are_row_major() -> None:
    flat = decode(request([1, 2, 3, 4, 5, 6.5]))
    nested = decode(request([[1, 2, 3], [4, 5, 6.5]]))
    expected = torch.tensor([[1, 2, 3], [4, 5, 6.5]], dtype=torch.float32)
    assert torch.equal(flat, expected) and torch.equal(nested, expected)
    assert flat.dtype == torch.float32


def test_json_float32_values_are_exact() -> None:
    x = torch.randn(2, 3)
    assert torch.equal(decode(request(x.reshape(-1).tolist())), x)


def test_binary_input() -> None:
    x = torch.randn(2, 3)
    header = {"inputs": [{"name": "input", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}}]}
    body, length = binary_body(header, x.numpy().tobytes())
    assert torch.equal(decode(body, length), x)


def test_wrong_shape_names_input_and_expected_shape() -> None:
    with pytest.raises(BadRequestError) as err:
        decode(request([1, 2, 3], shape=(1, 3)))
    assert "input 'input'" in str(err.value) and "[2, 3]" in str(err.value) and "FP32" in str(err.value)


def test_wrong_datatype_names_input_and_expected() -> None:
    with pytest.raises(BadRequestError) as err:
        decode(request([1, 2, 3, 4, 5, 6], datatype="INT64"))
    msg = str(err.value)
    assert "input 'input'" in msg and "FP32 with shape [2, 3]" in msg and "INT64" in msg


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ([1, 2, 3], "has 3 values"),
        ([[1, 2], [3]], "equal length"),
        (["a", "b", "c", "d", "e", "f"], "must be numbers"),
        ([True] * 6, "must be numbers"),
        ({"a": 1}, "JSON array"),
    ],
)
def test_bad_json_data(data, match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        decode(request(data))


def test_integer_ranges_and_kinds() -> None:
    spec = TensorSpec("input", "INT8", (2,))
    assert decode(request([-128, 127], "INT8", (2,)), spec=spec).tolist() == [-128, 127]
    with pytest.raises(BadRequestError, match="do not fit INT8"):
        decode(request([0, 300], "INT8", (2,)), spec=spec)
    with pytest.raises(BadRequestError, match="must be integers"):
        decode(request([0.5, 1], "INT8", (2,)), spec=spec)
    bspec = TensorSpec("input", "BOOL", (2,))
    assert decode(request([True, False], "BOOL", (2,)), spec=bspec).tolist() == [True, False]


@pytest.mark.parametrize(
    ("body", "header", "match"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b'{"inputs": []}', None, "inputs"),
        (b'{"inputs": [{"name": "input", "shape": "x", "datatype": "FP32", "data": [1]}]}', None, "inputs.0.shape"),
        (b'{"inputs": [{"name": "input", "shape": [1], "datatype": "FP32"}]}', None, "neither data"),
    ],
)
def test_malformed_requests(body: bytes, header: str | None, match: str) -> None:
    with pytest.raises(BadRequestError, match=match):
        parse_request(body, header)


def test_binary_header_beyond_body() -> None:
    body = b'{"inputs": []}'
    with pytest.raises(BadRequestError, match=f"{HEADER_LENGTH} is 999 but the request body has only {len(body)}"):
        split_body(body, "999")
    with pytest.raises(BadRequestError, match="whole number"):
        split_body(body, "abc")


def test_binary_size_beyond_body_and_leftovers() -> None:
    header = {"inputs": [{"name": "input", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}}]}
    body, length = binary_body(header, b"\0" * 20)
    with pytest.raises(BadRequestError, match="binary_data_size 24 but only 20 bytes"):
        parse_request(body, length)
    body, length = binary_body(header, b"\0" * 30)
    with pytest.raises(BadRequestError, match="6 bytes of binary data beyond"):
        parse_request(body, length)
    body, _ = binary_body(header, b"\0" * 24)
    with pytest.raises(BadRequestError, match=f"needs the {HEADER_LENGTH} header"):
        parse_request(body, None)
    with pytest.raises(BadRequestError, match=f"no {HEADER_LENGTH}"):
        parse_request(json.dumps(header).encode(), None)
    header["inputs"][0]["parameters"]["binary_data_size"] = 12
    header["inputs"][0]["shape"] = [2, 3]
    body, length = binary_body(header, b"\0" * 12)
    with pytest.raises(BadRequestError, match="binary_data_size is 12 bytes but FP32 with shape \\[2, 3\\] takes 24"):
        decode(body, length)


def test_encode_json_and_binary_outputs() -> None:
    a, b = torch.randn(2, 2), torch.arange(3, dtype=torch.int64)
    req = InferenceRequest.model_validate({"id": "7", "inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}]})
    body, headers = encode_response(req, "m", "1", [a, b], ["output_0", "output_1"])
    assert headers["content-type"] == "application/json" and HEADER_LENGTH not in headers
    out = json.loads(body)
    assert out["id"] == "7" and out["model_name"] == "m"
    assert torch.equal(torch.tensor(out["outputs"][0]["data"], dtype=torch.float32).reshape(2, 2), a)
    assert out["outputs"][1] == {"name": "output_1", "datatype": "INT64", "shape": [3], "data": [0, 1, 2]}

    req = InferenceRequest.model_validate({
        "parameters": {"binary_data_output": True},
        "inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}],
        "outputs": [{"name": "output_1", "parameters": {"binary_data": False}}, {"name": "output_0"}],
    })
    body, headers = encode_response(req, "m", "1", [a, b], ["output_0", "output_1"])
    body = bytes(body)
    n = int(headers[HEADER_LENGTH])
    head = json.loads(body[:n])
    assert [o["name"] for o in head["outputs"]] == ["output_1", "output_0"]
    assert head["outputs"][1]["parameters"] == {"binary_data_size": 16}
    assert torch.equal(torch.frombuffer(bytearray(body[n:]), dtype=torch.float32).reshape(2, 2), a)

    both = InferenceRequest.model_validate({
        "parameters": {"binary_data_output": True},
        "inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}],
    })
    c = torch.tensor([True, False, True])
    body, headers = encode_response(both, "m", "1", [a, b, c], ["a", "b", "c"])
    body, n = bytes(body), int(headers[HEADER_LENGTH])
    sizes = [o["parameters"]["binary_data_size"] for o in json.loads(body[:n])["outputs"]]
    assert sizes == [16, 24, 3] and len(body) == n + sum(sizes)  # each right after the one before
    assert body[n:] == a.numpy().tobytes() + b.numpy().tobytes() + c.numpy().tobytes()

    req.outputs[0].name = "nope"
    with pytest.raises(BadRequestError, match="no output 'nope'"):
        encode_response(req, "m", "1", [a, b], ["output_0", "output_1"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int8, torch.int16,
                                   torch.int32, torch.int64, torch.bool])
def test_json_outputs_read_back_bit_for_bit(dtype: torch.dtype) -> None:
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        edges = [v for v in (info.max, -info.max, info.tiny, info.tiny / 4, -0.0, 0.0, 1 / 3, 1e-5, 12345.678)
                 if abs(v) <= info.max]
        t = torch.cat([torch.tensor(edges, dtype=torch.float64).to(dtype), torch.randn(1000, dtype=dtype)])
    elif dtype == torch.bool:
        t = torch.tensor([True, False, True])
    else:
        info = torch.iinfo(dtype)
        t = torch.tensor([info.min, info.max, 0, 7], dtype=dtype)
    req = InferenceRequest.model_validate({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}]})
    body, _ = encode_response(req, "m", "1", [t], ["out"])
    back = torch.tensor(json.loads(bytes(body))["outputs"][0]["data"], dtype=dtype)  # as a client reads it
    if dtype.is_floating_point:  # the bits, so that -0.0 and 0.0 differ
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        assert torch.equal(back.view(bits), t.view(bits))
    else:
        assert torch.equal(back, t)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                          st.integers(-(2**63), 2**64 - 1)), max_size=50))
def test_request_json_reads_as_json_reads_it(values: list) -> None:
    text = json.dumps({"data": values}).encode()
    assert loads(text) == json.loads(text)  # every float to the same double
    assert all(type(a) is type(b) for a, b in zip(loads(text)["data"], values, strict=True))


def test_request_json_beyond_strict_json_still_reads() -> None:
    assert math.isnan(loads(b'{"x": [NaN, Infinity]}')["x"][0])  # the bare tokens Triton writes
    assert loads(b'[' + str(2**70).encode() + b']') == [2**70]  # beyond 64 bits
    with pytest.raises(json.JSONDecodeError, match="Extra data"):  # json's words, for the hint
        loads(b'{"a": 1} trailing')


def test_names_and_statuses() -> None:
    assert check_name("resnet-18_v1.2", BadRequestError) == "resnet-18_v1.2"
    for bad in ("..", "../etc", "a/b", ".", "", "a\\b", "x" * 200, "%2e%2e"):
        with pytest.raises(BadRequestError, match="invalid model name"):  # the server's 400
            check_name(bad, BadRequestError)
    assert output_names(1) == ["output"] and output_names(2) == ["output_0", "output_1"]
    from layerfit.errors import CorruptStoreError, QueueFullError

    assert status_of(QueueFullError("x")) == 429
    assert status_of(CorruptStoreError("x")) == 503  # the model is taken out of service: not the request's fault
    assert status_of(RuntimeError("x")) == 500


def test_decoding_is_reserved_before_parsing_and_nested_rows_are_not_extra_values() -> None:
    from layerfit.serve.codec import JSON_BYTES_PER_VALUE, TensorSpec, decoding_bytes

    spec = TensorSpec("input", "FP32", (64, 3, 2, 2))  # rows of 2: a comma between rows for every 2 values
    nested = torch.zeros(spec.shape).tolist()
    body = json.dumps({"inputs": [{"name": "input", "shape": list(spec.shape), "datatype": "FP32",
                                          "data": nested}]}).encode()
    values = body.count(b",") + 1
    assert values > 768  # more separators than values: a flat count would refuse it
    assert decoding_bytes(body, None, [spec], "m") == 768 * 4 + JSON_BYTES_PER_VALUE * values * (values > 4096)
    flood = b'{"inputs": [{"name": "input", "shape": [64, 3, 2, 2], "datatype": "FP32", "data": [' + b"0," * 10_000 + b"0]}]}"
    with pytest.raises(BadRequestError, match="refused before parsing"):
        decoding_bytes(flood, None, [spec], "m")
    binary = b'{"inputs": [{"name": "input"}]}' + b"\0" * 3072
    assert decoding_bytes(binary, "31", [spec], "m") == 768 * 4
