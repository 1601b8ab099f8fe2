"""The captured structure of a network: units, operators and activation tensors.

A :class:`ModelGraph` is what every later layer consumes. *Units* are the modules that
own parameters, in the order they first execute; each carries the paper quantities
``s`` (parameter bytes), ``d`` (parameter depth: number of tensors) and ``f`` (MACs).
*Ops* and *tensors* describe activations: every op names its input and output tensor
ids, and every tensor has a usage interval ``[first_op, last_op]`` over op indices in a
fixed topological order (Pisarchyk & Lee's tensor usage records).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT = "layerfit-graph"
VERSION = 1


@dataclass(frozen=True)
class ParamSpec:
    """One parameter or buffer tensor of a unit.

    ``name`` is the fully qualified state name (``layer1.0.conv1.weight``); ``attr`` is
    the attribute on the owning module (``weight``); ``kind`` is ``param`` or ``buffer``.
    """

    name: str
    attr: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class ResidentTensor:
    """A tensor kept in memory for the whole inference instead of being streamed.

    Tied or shared parameters (bound at several ``places``), tensors owned by a module
    whose children also own tensors, and tensors of a module called more than once are
    resident: they are stored once and bound everywhere they are used.
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    places: tuple[str, ...]  # "module.attr" for every place the tensor is bound
    reason: str


@dataclass(frozen=True)
class UnitInfo:
    """A module that owns tensors, executed as one unit (one layer by default)."""

    index: int
    name: str  # qualified module name, "" for the root module
    module_type: str
    params: tuple[ParamSpec, ...]
    s: int  # bytes of parameters and buffers
    d: int  # number of tensors (SwapNet's parameter depth)
    f: int  # multiply-accumulates of one execution at the captured input
    calls: int = 1  # how many times the module ran in one forward pass
    input_shapes: tuple[tuple[int, ...], ...] = ()
    output_shapes: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class TensorRecord:
    """An activation tensor: produced by op ``first_op``, last read by op ``last_op``."""

    id: int
    first_op: int
    last_op: int
    nbytes: int
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    alias_of: int | None = None  # a view sharing storage with another tensor


@dataclass(frozen=True)
class OpRecord:
    """One operator in topological order with the tensors it reads and writes."""

    index: int
    name: str
    kind: str  # call_module, call_function, call_method, module (hook fallback)
    target: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    inplace: bool = False  # may write its output over its (single) input


@dataclass
class ModelGraph:
    """Units, ops and activation tensors of one network at one input shape."""

    model_type: str
    input_shape: tuple[int, ...]
    input_dtype: str
    method: str  # "fx" or "hooks"
    units: list[UnitInfo]
    ops: list[OpRecord]
    tensors: list[TensorRecord]
    resident: list[ResidentTensor] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)  # tensors of modules never called
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    # The model's own name for each output tensor (a ModelOutput's keys; empty: captured
    # before names were kept), see :func:`layerfit.capture.activations.output_names`.
    output_names: list[str] = field(default_factory=list)
    # Most bytes of tensors the captured eager pass held at once, its inputs included and
    # the weights not (every operator's output, functional code's too; 0: not measured,
    # as in graphs captured before it was). See :mod:`layerfit.capture.allocations`.
    pass_peak_bytes: int = 0

    @property
    def total_param_bytes(self) -> int:
        """Bytes of every stored tensor: streamed units plus resident tensors."""
        return sum(u.s for u in self.units) + self.resident_bytes

    @property
    def resident_bytes(self) -> int:
        return sum(r.nbytes for r in self.resident)

    @property
    def largest_unit_bytes(self) -> int:
        return max((u.s for u in self.units), default=0)

    @property
    def total_macs(self) -> int:
        return sum(u.f for u in self.units)

    def tensor_usage_records(self) -> list[tuple[int, int, int, int]]:
        """``(tensor id, first op, last op, bytes)`` for every activation tensor."""
        return [(t.id, t.first_op, t.last_op, t.nbytes) for t in self.tensors]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = FORMAT
        data["version"] = VERSION
        return data

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelGraph:
        from layerfit.errors import ManifestError

        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ManifestError(
                f"graph is {data.get('format')!r} version {data.get('version')!r}; "
                f"this layerfit reads {FORMAT!r} version {VERSION} (re-run `layerfit prepare`)"
            )
        units = [
            UnitInfo(
                **{
                    **u,
                    "params": tuple(ParamSpec(**{**p, "shape": tuple(p["shape"])}) for p in u["params"]),
                    "input_shapes": tuple(tuple(s) for s in u.get("input_shapes", ())),
                    "output_shapes": tuple(tuple(s) for s in u.get("output_shapes", ())),
                }
            )
            for u in data["units"]
        ]
        ops = [
            OpRecord(**{**o, "inputs": tuple(o["inputs"]), "outputs": tuple(o["outputs"])})
            for o in data["ops"]
        ]
        tensors = [TensorRecord(**{**t, "shape": tuple(t["shape"])}) for t in data["tensors"]]
        pass_peak_bytes = int(data.get("pass_peak_bytes", 0))
        if pass_peak_bytes < 0:
            raise ValueError(f"pass_peak_bytes is {pass_peak_bytes}, a negative number of bytes")
        return cls(
            model_type=data["model_type"],
            input_shape=tuple(data["input_shape"]),
            input_dtype=data["input_dtype"],
            method=data["method"],
            units=units,
            ops=ops,
            tensors=tensors,
            resident=[
                ResidentTensor(
                    **{**r, "shape": tuple(r["shape"]), "places": tuple(r["places"])}
                )
                for r in data.get("resident", [])
            ],
            unused=list(data.get("unused", [])),
            output_shapes=[tuple(s) for s in data.get("output_shapes", [])],
            output_names=[str(n) for n in data.get("output_names", [])],
            pass_peak_bytes=pass_peak_bytes,
        )

    @classmethod
    def from_json(cls, text: str) -> ModelGraph:
        return cls.from_dict(json.loads(text))
