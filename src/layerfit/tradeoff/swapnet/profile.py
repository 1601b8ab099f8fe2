"""SwapNet's delay model (Section 6.1): per-layer profiling and the device coefficients.

SwapNet predicts the three delays of a block from quantities of its layers:

* input delay ``t_in = alpha * s + beta * d`` - reading the block (proportional to its
  bytes ``s``) plus assembling it (binding ``d`` tensors to the skeleton by reference);
* execution delay ``t_ex = gamma * f`` - the kernel, proportional to its MACs ``f``;
* output delay ``t_out = eta * d`` - swap-out: resetting the ``d`` references.

Two per-block constants complete the model, because here more blocks cost more (the
paper's Fig. 16) and nothing in the three formulas says so: ``kappa_read``, the fixed
cost of one read request (the intercept of ``t_in = alpha*s + beta*d + kappa_read``,
identifiable because every profiled layer is read by its own request; the paper's form
without it is fitted and reported too), and ``kappa_exec``, the executing thread's cost
of handing over a block (waiting on the reader, releasing the buffer): the extra
latency of streaming layer by layer with the whole model in the buffer over running
with every weight resident, less the bind and unbind times, per layer.

:func:`measure_model` times, for every layer of a prepared model on this device, the
read (direct I/O, as the engine reads), the bind and unbind on a meta skeleton (exactly
the engine's functions) and the kernel (the engine's ``preload`` timeline), and the
"glue" between two layers' kernels (the non-parametric operators - activations, adds,
pooling - that belong to no layer but run on the same thread). :func:`fit_profile` fits
the four coefficients by least squares over every layer of every given model, with R²,
and :class:`DeviceProfile` stores them in a versioned JSON file stamped with a device
fingerprint. ``s`` is the padded segment size (``Segment.nbytes``): it is what is read
and what occupies the buffer; the payload size is kept beside it.

The per-layer measurements stay in the profile. A model that was profiled is predicted
from its *measured* kernel, glue, bind and unbind times (``exec_source = "measured"``);
any other model from the regression (``"regression"``: ``gamma * f`` scaled by the
profiled glue ratio). Reads are always ``alpha * s``, because a block is read in one
request whatever its layers. A profile from another device or format version is
refused with a :class:`~layerfit.errors.ProfileWarning` and the model is measured
instead (:func:`profile_for`).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from layerfit.engine import load
from layerfit.engine.skeleton import bind, build_skeleton, segment_bindings, unbind
from layerfit.errors import LayerfitError, ProfileError, ProfileWarning
from layerfit.store import SegmentReader, aligned_buffer, example_call, read_manifest
from layerfit.store.manifest import Manifest

FORMAT = "layerfit-device-profile"
VERSION = 1
BIND_SAMPLES = 8  # bind/unbind take microseconds: time several per repeat


def default_profile_path() -> Path:
    """``$XDG_CACHE_HOME/layerfit/device-profile.json`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "layerfit" / "device-profile.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_fingerprint() -> dict[str, Any]:
    """What makes delays of this device differ from another's: CPU, cores, memory, torch."""
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def model_key(manifest: Manifest) -> str:
    """Identity of a prepared model for the per-layer table: factory, input, layer count."""
    m = manifest.model
    kwargs = json.dumps(m.get("kwargs", {}), sort_keys=True)
    shape = "x".join(str(d) for d in manifest.input_shape)
    return f"{m['source']}:{m['name']}({kwargs})@{shape}/{manifest.input_dtype}/{len(manifest.units)}u"


@dataclass
class LayerTimes:
    """Per-layer quantities and median times (seconds) of one model on this device."""

    key: str
    name: str
    input_shape: tuple[int, ...]
    layer_names: list[str]
    nbytes: list[int]
    payload_bytes: list[int]
    d: list[int]
    f: list[int]
    read_s: list[float]
    bind_s: list[float]
    unbind_s: list[float]
    kernel_s: list[float]
    glue_s: list[float]  # non-parametric work on the executing thread before each layer
    tail_s: float = 0.0  # after the last layer (output post-processing)
    latency_s: float = 0.0  # median latency of the preload run (all weights resident)
    stream_latency_s: float = 0.0  # median latency streaming layer by layer, whole buffer

    @property
    def exec_overhead_s(self) -> float:
        """Per-layer hand-over cost of streaming (``kappa_exec`` of this model)."""
        extra = self.stream_latency_s - self.latency_s - sum(self.bind_s) - sum(self.unbind_s)
        extra -= self.read_s[0] if self.read_s else 0.0  # the first read is never hidden
        return max(extra, 0.0) / max(len(self.nbytes), 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> LayerTimes:
        """Read one model's table, checking every field (ProfileError naming it)."""
        d = _mapping(d, where)
        unknown = set(d) - _LAYER_FIELDS
        if unknown:
            raise ProfileError(f"{where}: unknown field(s) {sorted(unknown)}")
        missing = [k for k in _LAYER_FIELDS if k not in d and k not in ("tail_s", "latency_s", "stream_latency_s")]
        if missing:
            raise ProfileError(f"{where}: missing field(s) {sorted(missing)}")
        names = d["layer_names"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ProfileError(f"{where}.layer_names: expected a non-empty list of layer names")
        shape = d["input_shape"]
        if not isinstance(shape, list) or not all(_is_int(v) and v > 0 for v in shape):
            raise ProfileError(f"{where}.input_shape: expected a list of positive integers, got {shape!r}")
        lists: dict[str, list] = {}
        for key in ("nbytes", "payload_bytes", "d", "f"):
            lists[key] = _list(d[key], f"{where}.{key}", len(names), integer=True)
        for key in ("read_s", "bind_s", "unbind_s", "kernel_s", "glue_s"):
            lists[key] = _list(d[key], f"{where}.{key}", len(names), integer=False)
        return cls(
            key=_string(d["key"], f"{where}.key"),
            name=_string(d["name"], f"{where}.name"),
            input_shape=tuple(shape),
            layer_names=list(names),
            tail_s=_seconds(d.get("tail_s", 0.0), f"{where}.tail_s"),
            latency_s=_seconds(d.get("latency_s", 0.0), f"{where}.latency_s"),
            stream_latency_s=_seconds(d.get("stream_latency_s", 0.0), f"{where}.stream_latency_s"),
            **lists,
        )


@dataclass(frozen=True)
class Fit:
    """One regression: coefficients by regressor name, R², number of layers used."""

    coefficients: dict[str, float]
    r2: float
    samples: int


@dataclass
class DeviceProfile:
    """The device coefficients, their fits and the per-layer tables they came from."""

    device: dict[str, Any]
    alpha: float  # s per byte read
    beta: float  # s per tensor bound
    gamma: float  # s per MAC
    eta: float  # s per tensor unbound
    glue_ratio: float  # non-parametric time / kernel time over the profiled models
    fits: dict[str, Fit]
    models: dict[str, LayerTimes] = field(default_factory=dict)
    created: str = ""
    repeats: int = 0
    version: int = VERSION
    kappa_read: float = 0.0  # s per block read (one request)
    kappa_exec: float = 0.0  # s per block on the executing thread (hand-over)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "created": self.created,
            "device": self.device,
            "repeats": self.repeats,
            "coefficients": {
                "alpha_s_per_byte": self.alpha,
                "beta_s_per_tensor": self.beta,
                "gamma_s_per_mac": self.gamma,
                "eta_s_per_tensor": self.eta,
                "kappa_read_s_per_block": self.kappa_read,
                "kappa_exec_s_per_block": self.kappa_exec,
                "glue_ratio": self.glue_ratio,
            },
            "fits": {k: asdict(v) for k, v in self.fits.items()},
            "models": {k: v.to_dict() for k, v in self.models.items()},
        }

    @classmethod
    def from_dict(cls, d: Any) -> DeviceProfile:
        """Read a profile, checking every field: a malformed one raises ProfileError
        naming the field (e.g. ``coefficients.alpha_s_per_byte``) and what it expects."""
        d = _mapping(d, "the profile")
        for key in ("version", "device", "coefficients"):
            if key not in d:
                raise ProfileError(f"missing field {key!r}")
        c = _mapping(d["coefficients"], "coefficients")
        coefficient = {}
        for key in _COEFFICIENTS:
            if key in c:
                coefficient[key] = _seconds(c[key], f"coefficients.{key}")
            elif key in _OPTIONAL_COEFFICIENTS:
                coefficient[key] = 0.0
            else:
                raise ProfileError(f"coefficients: missing {key!r}")
        fits = {}
        for name, fit in _mapping(d.get("fits", {}), "fits").items():
            where = f"fits.{name}"
            fit = _mapping(fit, where)
            coefs = _mapping(fit.get("coefficients"), f"{where}.coefficients")
            r2, samples = fit.get("r2"), fit.get("samples")
            if not _is_number(r2):
                raise ProfileError(f"{where}.r2: expected a finite number, got {r2!r}")
            if not (_is_int(samples) and samples >= 0):
                raise ProfileError(f"{where}.samples: expected a non-negative integer, got {samples!r}")
            fits[str(name)] = Fit({str(k): _seconds(v, f"{where}.coefficients.{k}", negative=True)
                                   for k, v in coefs.items()}, float(r2), int(samples))
        models = {
            str(key): LayerTimes.from_dict(value, f"models[{key!r}]")
            for key, value in _mapping(d.get("models", {}), "models").items()
        }
        version, repeats = d["version"], d.get("repeats", 0)
        if not _is_int(version):
            raise ProfileError(f"version: expected an integer, got {version!r}")
        if not (_is_int(repeats) and repeats >= 0):
            raise ProfileError(f"repeats: expected a non-negative integer, got {repeats!r}")
        return cls(
            device=dict(_mapping(d["device"], "device")),
            alpha=coefficient["alpha_s_per_byte"],
            beta=coefficient["beta_s_per_tensor"],
            gamma=coefficient["gamma_s_per_mac"],
            eta=coefficient["eta_s_per_tensor"],
            glue_ratio=coefficient["glue_ratio"],
            kappa_read=coefficient["kappa_read_s_per_block"],
            kappa_exec=coefficient["kappa_exec_s_per_block"],
            fits=fits,
            models=models,
            created=str(d.get("created", "")),
            repeats=int(repeats),
            version=int(version),
        )

    def save(self, path: str | Path) -> Path:
        """Write atomically (temporary file, then rename); never over a file that is not a
        device profile, nor over a directory (:func:`check_profile_target`)."""
        path = check_profile_target(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".device-profile-", suffix=".json")
        except OSError as exc:
            raise ProfileError(f"cannot write device profile {path}: {exc.strerror or exc}") from exc
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_dict(), fh, indent=1, allow_nan=False)
            os.replace(tmp, path)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise ProfileError(f"cannot write device profile {path}: {exc.strerror or exc}") from exc
            raise
        return path

    def summary(self) -> dict[str, Any]:
        """Coefficients and R² without the per-layer tables."""
        d = self.to_dict()
        d["models"] = sorted(m.name for m in self.models.values())
        return d


# --- reading a profile: every field checked -----------------------------------------------

_COEFFICIENTS = (
    "alpha_s_per_byte",
    "beta_s_per_tensor",
    "gamma_s_per_mac",
    "eta_s_per_tensor",
    "kappa_read_s_per_block",
    "kappa_exec_s_per_block",
    "glue_ratio",
)
_OPTIONAL_COEFFICIENTS = {"kappa_read_s_per_block", "kappa_exec_s_per_block", "glue_ratio"}
_LAYER_FIELDS = {f.name for f in dataclass_fields(LayerTimes)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: expected a mapping, got {type(value).__name__} {value!r:.60}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"{where}: expected a string, got {value!r:.60}")
    return value


def _seconds(value: Any, where: str, negative: bool = False) -> float:
    """A finite number, >= 0 unless ``negative`` (NaN and infinity are refused)."""
    if not _is_number(value) or (not negative and value < 0):
        kind = "a finite number" if negative else "a finite number >= 0"
        raise ProfileError(f"{where}: expected {kind}, got {value!r:.60}")
    return float(value)


def _list(value: Any, where: str, length: int, *, integer: bool) -> list:
    """One value per layer: ``length`` non-negative integers or finite seconds."""
    if not isinstance(value, list) or len(value) != length:
        got = f"{len(value)} values" if isinstance(value, list) else f"{type(value).__name__} {value!r:.60}"
        raise ProfileError(f"{where}: expected a list of {length} values (one per layer), got {got}")
    for k, v in enumerate(value):
        if integer and not (_is_int(v) and v >= 0):
            raise ProfileError(f"{where}[{k}]: expected a non-negative integer, got {v!r:.60}")
        if not integer:
            _seconds(v, f"{where}[{k}]")
    return [int(v) for v in value] if integer else [float(v) for v in value]


# --- measuring ---------------------------------------------------------------------------


def _median(samples: list[list[float]]) -> list[float]:
    return [statistics.median(col) for col in zip(*samples, strict=True)] if samples else []


def _time_reads(directory: Path, manifest: Manifest, repeats: int) -> list[float]:
    units = manifest.units
    buf = aligned_buffer(max(u.nbytes for u in units))
    view = memoryview(buf)
    samples = []
    try:
        with SegmentReader(directory / manifest.weights_file, manifest.weights_size) as reader:
            for _ in range(repeats):
                row = []
                for u in units:
                    t0 = time.perf_counter()
                    reader.read(u, view)
                    row.append(time.perf_counter() - t0)
                samples.append(row)
    finally:
        view.release()
        buf.close()
    return _median(samples)


def _time_binding(manifest: Manifest, repeats: int) -> tuple[list[float], list[float]]:
    model = build_skeleton(manifest)
    largest = max(u.nbytes for u in manifest.units)
    raw = aligned_buffer(largest)
    buffer = torch.frombuffer(raw, dtype=torch.uint8)
    binds: list[list[float]] = []
    unbinds: list[list[float]] = []
    bindings = [segment_bindings(model, u) for u in manifest.units]
    for _ in range(repeats * BIND_SAMPLES):
        row_b, row_u = [], []
        for b in bindings:
            t0 = time.perf_counter()
            bind(b, buffer, 0)
            t1 = time.perf_counter()
            unbind(b)
            t2 = time.perf_counter()
            row_b.append(t1 - t0)
            row_u.append(t2 - t1)
        binds.append(row_b)
        unbinds.append(row_u)
    del buffer, bindings, model
    return _median(binds), _median(unbinds)


def _time_kernels(
    directory: Path, manifest: Manifest, repeats: int, warmup: int
) -> tuple[list[float], list[float], float, float, float]:
    """Kernel and glue per layer (``preload`` timeline), and both latencies.

    Runs with every weight resident alternate with runs streaming layer by layer with a
    buffer for the whole model, so that drifting load on the machine affects both alike;
    the streaming latency is the resident one plus the median paired difference.
    """
    x, kwargs = example_call(manifest)  # one input, or each keyword argument it was prepared from
    kernels, glues, tails, latencies, extra = [], [], [], [], []
    with (
        load(directory, pipeline="preload", trace=True) as engine,
        load(directory, pipeline="async", units="layers", budget=manifest.total_bytes) as stream,
    ):
        for _ in range(warmup):
            engine(*x, **kwargs)
            stream(*x, **kwargs)
        for _ in range(repeats):
            engine(*x, **kwargs)
            tl = engine.last_timeline
            t0 = time.perf_counter()
            stream(*x, **kwargs)
            extra.append(time.perf_counter() - t0 - tl.latency_s)
            events = sorted((e for e in tl.events if e.stage == "kernel"), key=lambda e: e.unit)
            if len(events) != len(manifest.units):
                raise ProfileError(
                    f"{directory}: the preload run traced {len(events)} of {len(manifest.units)} layers"
                )
            kernels.append([e.end - e.start for e in events])
            ends = [0.0] + [e.end for e in events[:-1]]
            glues.append([max(e.start - end, 0.0) for e, end in zip(events, ends, strict=True)])
            tails.append(max(tl.latency_s - events[-1].end, 0.0))
            latencies.append(tl.latency_s)
    latency = statistics.median(latencies)
    return _median(kernels), _median(glues), statistics.median(tails), latency, latency + statistics.median(extra)


def measure_model(directory: str | Path, *, repeats: int = 5, warmup: int = 1) -> LayerTimes:
    """Median read, bind, unbind, kernel and glue time of every layer of a prepared model."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if not manifest.units:
        raise ProfileError(f"{directory} has no streamed layers to profile")
    repeats = max(1, repeats)
    reads = _time_reads(directory, manifest, repeats)
    binds, unbinds = _time_binding(manifest, repeats)
    kernels, glues, tail, latency, stream = _time_kernels(directory, manifest, repeats, warmup)
    units = manifest.units
    return LayerTimes(
        key=model_key(manifest),
        name=str(manifest.model["name"]),
        input_shape=tuple(manifest.input_shape),
        layer_names=[u.name for u in units],
        nbytes=[u.nbytes for u in units],
        payload_bytes=[u.payload_bytes for u in units],
        d=[u.d for u in units],
        f=[u.f for u in units],
        read_s=reads,
        bind_s=binds,
        unbind_s=unbinds,
        kernel_s=kernels,
        glue_s=glues,
        tail_s=tail,
        latency_s=latency,
        stream_latency_s=stream,
    )


# --- fitting -------------------------------------------------------------------------------


def nonnegative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares without intercept and with coefficients >= 0.

    A delay cannot shrink as a block grows, so a negative coefficient (noise on a weak
    regressor) is dropped and the rest refitted (an active set over a few columns).
    """
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot`` (about the mean of ``y``)."""
    ss_res = float(((y - predicted) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def _fit(names: Sequence[str], x: np.ndarray, y: np.ndarray) -> Fit:
    coef = nonnegative_lstsq(x, y)
    return Fit(dict(zip(names, map(float, coef), strict=True)), r_squared(y, x @ coef), int(len(y)))


def fit_profile(models: Sequence[LayerTimes], *, repeats: int = 0) -> DeviceProfile:
    """Fit ``alpha, beta, kappa_read`` (t_in), ``gamma`` (t_ex), ``eta`` (t_out) over every layer.

    ``t_in_paper`` is the paper's exact form (no per-request constant), reported for
    comparison; the model uses ``t_in``.
    """
    if not models:
        raise ProfileError("no measured models to fit the delay model to")
    col = lambda attr: np.array([v for m in models for v in getattr(m, attr)], dtype=float)  # noqa: E731
    s, d, f = col("nbytes"), col("d"), col("f")
    t_in = col("read_s") + col("bind_s")
    fits = {
        "t_in": _fit(("alpha", "beta", "kappa_read"), np.column_stack([s, d, np.ones_like(s)]), t_in),
        "t_in_paper": _fit(("alpha", "beta"), np.column_stack([s, d]), t_in),
        "t_ex": _fit(("gamma",), f[:, None], col("kernel_s")),
        "t_out": _fit(("eta",), d[:, None], col("unbind_s")),
    }
    kernel = float(col("kernel_s").sum())
    glue = float(col("glue_s").sum()) + sum(m.tail_s for m in models)
    layers = sum(len(m.nbytes) for m in models)
    kappa_exec = sum(m.exec_overhead_s * len(m.nbytes) for m in models) / max(layers, 1)
    return DeviceProfile(
        device=device_fingerprint(),
        alpha=fits["t_in"].coefficients["alpha"],
        beta=fits["t_in"].coefficients["beta"],
        gamma=fits["t_ex"].coefficients["gamma"],
        eta=fits["t_out"].coefficients["eta"],
        glue_ratio=glue / kernel if kernel > 0 else 0.0,
        fits=fits,
        models={m.key: m for m in models},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        repeats=repeats,
        kappa_read=fits["t_in"].coefficients["kappa_read"],
        kappa_exec=kappa_exec,
    )


def profile_models(
    directories: Sequence[str | Path],
    *,
    repeats: int = 5,
    warmup: int = 1,
    previous: DeviceProfile | None = None,
    progress: Callable[[LayerTimes], None] | None = None,
) -> DeviceProfile:
    """Measure every model and fit; layers of ``previous`` (same device) are kept too."""
    measured = dict(previous.models) if previous is not None else {}
    for directory in directories:
        times = measure_model(directory, repeats=repeats, warmup=warmup)
        measured[times.key] = times
        if progress:
            progress(times)
    return fit_profile(list(measured.values()), repeats=repeats)


# --- loading -------------------------------------------------------------------------------


class _Unusable(Exception):
    """A profile that is readable but not for this device or format version."""


def _read(path: Path) -> DeviceProfile:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProfileError(
            f"cannot read device profile {path}: {exc} (delete it and run `layerfit profile` again)"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"{path} is not a layerfit device profile")
    if data.get("version") != VERSION:
        raise _Unusable(
            f"device profile {path} has format version {data.get('version')!r}, this layerfit "
            f"reads version {VERSION}"
        )
    try:
        return DeviceProfile.from_dict(data)
    except ProfileError as exc:
        raise ProfileError(
            f"device profile {path} is malformed: {exc} (delete it and run `layerfit profile` again)"
        ) from exc


def check_profile_target(path: str | Path) -> Path:
    """``path`` expanded, if a device profile may be written there; else ProfileError.

    Call it before measuring: a directory, a path under a file, or an existing file that
    is not a layerfit device profile (the user's data, which writing would destroy) is
    refused. An existing profile may be replaced.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise ProfileError(
            f"device profile path {path} is a directory: give a file, e.g. {path / 'device-profile.json'}"
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ProfileError(f"cannot write device profile {path}: {parent} is not a directory")
            break
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ProfileError(
                f"{path} exists and is not a layerfit device profile; writing the profile there would "
                "destroy it: choose another --profile path, or move that file away"
            )
    return path


def load_profile(path: str | Path | None = None) -> DeviceProfile:
    """The profile at ``path`` (default path if None); ProfileError if unusable here."""
    path = Path(path).expanduser() if path is not None else default_profile_path()
    if not path.is_file():
        raise ProfileError(f"no device profile at {path}: run `layerfit profile DIR ...` first")
    try:
        profile = _read(path)
    except _Unusable as exc:
        raise ProfileError(str(exc)) from None
    return profile


def mismatch(profile: DeviceProfile) -> str | None:
    """Why ``profile`` does not describe this device (None when it does)."""
    here = device_fingerprint()
    diffs = [f"{k}: {profile.device.get(k)!r} there, {v!r} here" for k, v in here.items() if profile.device.get(k) != v]
    return "; ".join(diffs) or None


def profile_for(
    directory: str | Path,
    path: str | Path | None = None,
    *,
    repeats: int = 2,
) -> DeviceProfile:
    """A usable profile for the model in ``directory``.

    The stored profile if it was made on this device with this format version;
    otherwise a :class:`ProfileWarning` says why it is not used and the model is
    measured now (``repeats`` runs; the result is returned, not written).
    """
    path = Path(path).expanduser() if path is not None else default_profile_path()
    reason = None
    if not path.is_file():
        reason = f"no device profile at {path}"
    else:
        try:
            profile = _read(path)
            why = mismatch(profile)
            if why is None:
                return profile
            reason = f"device profile {path} was made on another device ({why})"
        except _Unusable as exc:
            reason = str(exc)
    warnings.warn(
        f"{reason}; measuring {directory} now instead (run `layerfit profile` to store a profile)",
        ProfileWarning,
        stacklevel=2,
    )
    try:
        return profile_models([directory], repeats=repeats, warmup=1)
    except LayerfitError:
        raise
    except OSError as exc:
        raise ProfileError(f"measuring {directory} failed: {exc}") from exc


def previous_profile(path: str | Path) -> DeviceProfile | None:
    """The profile at ``path`` to add new models to, or None to start a new one.

    A profile from another device or format version is not extended (a warning says
    so); a missing file simply starts a new profile.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        return None
    try:
        profile = _read(path)
    except _Unusable as exc:
        warnings.warn(f"{exc}; starting a new profile", ProfileWarning, stacklevel=2)
        return None
    why = mismatch(profile)
    if why is not None:
        warnings.warn(
            f"device profile {path} was made on another device ({why}); starting a new profile",
            ProfileWarning,
            stacklevel=2,
        )
        return None
    return profile
