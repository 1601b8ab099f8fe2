"""What a profile holds: per-layer times of each model, the fits, the device coefficients.

:class:`LayerTimes` is one model's per-layer table, :class:`Fit` one regression and
:class:`DeviceProfile` the coefficients with both. ``to_dict`` gives the JSON a profile
file stores; ``from_dict`` reads it back, checking every field (:mod:`layerfit.fields`),
so a malformed file raises :class:`~layerfit.errors.ProfileError` naming the field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from layerfit.errors import ProfileError
from layerfit.fields import expect, integer, is_int, is_names, mapping, number
from layerfit.tradeoff.swapnet.profile.storage import FORMAT, VERSION, write_profile


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
        d = mapping(d, where, ProfileError, _LAYER_FIELDS)
        missing = [k for k in _LAYER_FIELDS if k not in d and k not in ("tail_s", "latency_s", "stream_latency_s")]
        if missing:
            raise ProfileError(f"{where}: missing field(s) {sorted(missing)}")
        names = d["layer_names"]
        if not names or not is_names(names):
            raise ProfileError(f"{where}.layer_names: expected a non-empty list of layer names")
        shape = d["input_shape"]
        if not isinstance(shape, list) or not all(is_int(v) and v > 0 for v in shape):
            raise ProfileError(f"{where}.input_shape: expected a list of positive integers, got {shape!r}")
        lists: dict[str, list] = {}
        for key in ("nbytes", "payload_bytes", "d", "f"):
            lists[key] = _per_layer(d[key], f"{where}.{key}", len(names), integer=True)
        for key in ("read_s", "bind_s", "unbind_s", "kernel_s", "glue_s"):
            lists[key] = _per_layer(d[key], f"{where}.{key}", len(names), integer=False)
        return cls(
            key=_string(d["key"], f"{where}.key"),
            name=_string(d["name"], f"{where}.name"),
            input_shape=tuple(shape),
            layer_names=list(names),
            tail_s=number(d.get("tail_s", 0.0), f"{where}.tail_s", ProfileError, 0),
            latency_s=number(d.get("latency_s", 0.0), f"{where}.latency_s", ProfileError, 0),
            stream_latency_s=number(d.get("stream_latency_s", 0.0), f"{where}.stream_latency_s", ProfileError, 0),
            **lists,
        )


_LAYER_FIELDS = {f.name for f in dataclass_fields(LayerTimes)}


def _string(value: Any, where: str) -> str:
    expect(isinstance(value, str), where, "a string", value, ProfileError)
    return value


def _per_layer(value: Any, where: str, length: int, *, integer: bool) -> list:
    """One value per layer: ``length`` non-negative integers or finite seconds."""
    if not isinstance(value, list) or len(value) != length:
        got = f"{len(value)} values" if isinstance(value, list) else f"{type(value).__name__} {value!r:.60}"
        raise ProfileError(f"{where}: expected a list of {length} values (one per layer), got {got}")
    check = _count if integer else _seconds
    return [check(v, f"{where}[{k}]") for k, v in enumerate(value)]


def _count(value: Any, where: str) -> int:
    return integer(value, where, ProfileError, 0)


def _seconds(value: Any, where: str) -> float:
    return number(value, where, ProfileError, 0)


@dataclass(frozen=True)
class Fit:
    """One regression: coefficients by regressor name, R², number of layers used."""

    coefficients: dict[str, float]
    r2: float
    samples: int

    @classmethod
    def from_dict(cls, fit: Any, where: str) -> Fit:
        """Read one regression, checking every field (ProfileError naming it)."""
        fit = mapping(fit, where, ProfileError)
        coefs = mapping(fit.get("coefficients"), f"{where}.coefficients", ProfileError)
        r2 = number(fit.get("r2"), f"{where}.r2", ProfileError)
        samples = integer(fit.get("samples"), f"{where}.samples", ProfileError, 0)
        return cls({str(k): number(v, f"{where}.coefficients.{k}", ProfileError) for k, v in coefs.items()}, r2, samples)


# the stored coefficients by their JSON names; the last three came after the first profiles
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


def _coefficients(c: dict[str, Any]) -> dict[str, float]:
    """Every coefficient by its JSON name, checked; an optional one missing is 0."""
    coefficient = {}
    for key in _COEFFICIENTS:
        if key in c:
            coefficient[key] = _seconds(c[key], f"coefficients.{key}")
        elif key in _OPTIONAL_COEFFICIENTS:
            coefficient[key] = 0.0
        else:
            raise ProfileError(f"coefficients: missing {key!r}")
    return coefficient


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
        d = mapping(d, "the profile", ProfileError)
        for key in ("version", "device", "coefficients"):
            if key not in d:
                raise ProfileError(f"missing field {key!r}")
        coefficient = _coefficients(mapping(d["coefficients"], "coefficients", ProfileError))
        fits = {str(name): Fit.from_dict(fit, f"fits.{name}") for name, fit in mapping(d.get("fits", {}), "fits", ProfileError).items()}
        models = {
            str(key): LayerTimes.from_dict(value, f"models[{key!r}]")
            for key, value in mapping(d.get("models", {}), "models", ProfileError).items()
        }
        version = integer(d["version"], "version", ProfileError)
        repeats = integer(d.get("repeats", 0), "repeats", ProfileError, 0)
        return cls(
            device=dict(mapping(d["device"], "device", ProfileError)),
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
            repeats=repeats,
            version=version,
        )

    def save(self, path: str | Path) -> Path:
        """Write atomically (temporary file, then rename); never over a file that is not a
        device profile, nor over a directory (:func:`.storage.check_profile_target`)."""
        return write_profile(self.to_dict(), path)

    def summary(self) -> dict[str, Any]:
        """Coefficients and R² without the per-layer tables."""
        d = self.to_dict()
        d["models"] = sorted(m.name for m in self.models.values())
        return d
