"""Naming a profile set: the thesis's built-in one, or a file (JSON or YAML).

Apart from :mod:`~layerfit.schedule.profile` so that the profile format does not import
the thesis's figures, which are written in it (no import circle).
"""

from __future__ import annotations

from pathlib import Path

from layerfit.errors import ScheduleError
from layerfit.schedule.profile import NetworkProfile, ProfileSet, load_profiles


def resolve_profiles(spec: str | Path | None) -> ProfileSet:
    """The profile set named by ``spec``: ``None``/``"thesis"`` → built-in thesis set, else a file."""
    if spec is None or str(spec) == "thesis":
        from layerfit.schedule.experiments.thesis import thesis_profiles

        return thesis_profiles()
    return load_profiles(spec)


def resolve_network(name_or_path: str, profiles: ProfileSet | None = None) -> NetworkProfile:
    """One network profile from a file path, or by name from ``profiles`` (default: thesis set)."""
    path = Path(name_or_path)
    if path.suffix in (".json", ".yaml", ".yml") or path.exists():
        found = load_profiles(path)
        if len(found) != 1:
            raise ScheduleError(
                f"{path} holds {len(found)} networks ({', '.join(found.names())}); name one of them instead"
            )
        return next(iter(found.values()))
    return (profiles or resolve_profiles(None))[name_or_path]
