"""Scheduling policies, one per module, registered by name behind one interface.

``make_policy("masa")`` builds a fresh policy object; a policy holds the state of one
run, so every run (simulated or real) gets its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from layerfit.errors import ScheduleError
from layerfit.schedule.policies.base import Policy, ReadyQueue, fits
from layerfit.schedule.policies.bulk import Bulk
from layerfit.schedule.policies.bulk_multi import BulkMulti
from layerfit.schedule.policies.deepeye import DeepEye
from layerfit.schedule.policies.fcfs import Fcfs
from layerfit.schedule.policies.linear_fcfs import LinearFcfs
from layerfit.schedule.policies.masa import Masa
from layerfit.schedule.policies.masa_fair import MasaFair
from layerfit.schedule.policies.masa_fcfs import MasaFcfs
from layerfit.schedule.policies.round_robin import RoundRobin
from layerfit.schedule.policies.sjf import Sjf
from layerfit.schedule.policies.snf import Snf

POLICIES: Mapping[str, type[Policy]] = MappingProxyType(
    {
        cls.name: cls
        for cls in (
            Masa, Bulk, DeepEye, Fcfs, LinearFcfs, Sjf, Snf, RoundRobin, MasaFair, BulkMulti, MasaFcfs
        )
    }
)


def policy_names() -> list[str]:
    return list(POLICIES)


def make_policy(name: str | Policy, *, gated: bool = True) -> Policy:
    """A new policy object by name (``masa``, ``bulk``, ``deepeye``, ``fcfs``, …)."""
    if isinstance(name, Policy):
        return name
    key = name.lower().replace("_", "-")
    if key not in POLICIES:
        raise ScheduleError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}")
    return POLICIES[key](gated=gated)


__all__ = [
    "POLICIES",
    "Bulk",
    "BulkMulti",
    "DeepEye",
    "Fcfs",
    "LinearFcfs",
    "Masa",
    "MasaFair",
    "MasaFcfs",
    "Policy",
    "ReadyQueue",
    "RoundRobin",
    "Sjf",
    "Snf",
    "fits",
    "make_policy",
    "policy_names",
]
