"""Fitting the delay model's coefficients to measured layers: :func:`fit_profile`.

Least squares over every layer of every given model, each coefficient kept >= 0 (a
delay cannot shrink as a block grows), with R² per fit. :func:`profile_models` measures
models (:mod:`.timing`) and fits them in one step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from layerfit.errors import ProfileError
from layerfit.tradeoff.swapnet.profile.device import device_fingerprint
from layerfit.tradeoff.swapnet.profile.records import DeviceProfile, Fit, LayerTimes
from layerfit.tradeoff.swapnet.profile.timing import measure_model


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
