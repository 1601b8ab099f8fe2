"""Which profile a run uses: the stored one where it describes this device, else a measurement.

:func:`load_profile` reads a profile or raises; :func:`profile_for` falls back to
measuring the model now (with a :class:`~layerfit.errors.ProfileWarning` saying why)
when the stored profile is missing, from another device or of another format version;
:func:`previous_profile` is the one ``layerfit profile`` adds new models to.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from layerfit.errors import LayerfitError, ProfileError, ProfileWarning
from layerfit.tradeoff.swapnet.profile.device import device_fingerprint
from layerfit.tradeoff.swapnet.profile.fitting import profile_models
from layerfit.tradeoff.swapnet.profile.records import DeviceProfile
from layerfit.tradeoff.swapnet.profile.storage import FORMAT, VERSION, default_profile_path


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
