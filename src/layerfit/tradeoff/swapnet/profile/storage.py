"""The profile's file: its format tag and version, its default place, and writing it safely.

A profile is one JSON file tagged ``"format": "layerfit-device-profile"`` with a format
:data:`VERSION`. It is written atomically (a temporary file, then a rename) and never
over something that is not a device profile: :func:`check_profile_target` refuses a
directory, a path under a file, or another file the user may care about. Reading one
back, and deciding whether it describes this device, is :mod:`.loading`'s.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from layerfit.errors import ProfileError

FORMAT = "layerfit-device-profile"
VERSION = 1


def default_profile_path() -> Path:
    """``$XDG_CACHE_HOME/layerfit/device-profile.json`` (``~/.cache`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "layerfit" / "device-profile.json"


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


def write_profile(data: dict[str, Any], path: str | Path) -> Path:
    """Write a profile's JSON to ``path`` atomically, where :func:`check_profile_target`
    allows it; the path written."""
    path = check_profile_target(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".device-profile-", suffix=".json")
    except OSError as exc:
        raise ProfileError(f"cannot write device profile {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, allow_nan=False)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ProfileError(f"cannot write device profile {path}: {exc.strerror or exc}") from exc
        raise
    return path
