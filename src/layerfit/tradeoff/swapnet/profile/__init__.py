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

One module per responsibility, each building on the ones before it:

* :mod:`.fields` - the checks every stored JSON field passes (ProfileError naming it);
* :mod:`.storage` - the file: format tag and version, default path, safe atomic write;
* :mod:`.device` - the device fingerprint and the identity of a profiled model;
* :mod:`.records` - :class:`LayerTimes`, :class:`Fit`, :class:`DeviceProfile` and their JSON;
* :mod:`.timing` - :func:`measure_model`, one model's layers timed on this device;
* :mod:`.fitting` - :func:`fit_profile` and :func:`profile_models` (measure, then fit);
* :mod:`.loading` - :func:`load_profile`, :func:`profile_for`, :func:`previous_profile`:
  the stored profile where it describes this device, else a measurement.
"""

from layerfit.tradeoff.swapnet.profile.device import device_fingerprint, model_key
from layerfit.tradeoff.swapnet.profile.fitting import (
    fit_profile,
    nonnegative_lstsq,
    profile_models,
    r_squared,
)
from layerfit.tradeoff.swapnet.profile.loading import (
    load_profile,
    mismatch,
    previous_profile,
    profile_for,
)
from layerfit.tradeoff.swapnet.profile.records import DeviceProfile, Fit, LayerTimes
from layerfit.tradeoff.swapnet.profile.storage import (
    FORMAT,
    VERSION,
    check_profile_target,
    default_profile_path,
)
from layerfit.tradeoff.swapnet.profile.timing import BIND_SAMPLES, measure_model

__all__ = [
    "BIND_SAMPLES",
    "FORMAT",
    "VERSION",
    "DeviceProfile",
    "Fit",
    "LayerTimes",
    "check_profile_target",
    "default_profile_path",
    "device_fingerprint",
    "fit_profile",
    "load_profile",
    "measure_model",
    "mismatch",
    "model_key",
    "nonnegative_lstsq",
    "previous_profile",
    "profile_for",
    "profile_models",
    "r_squared",
]
