"""Workload generators for the thesis's batch and stochastic scenarios (§7.2.1, §7.3.1).

Batch scenarios: one image every ``period`` seconds, analysed by a fixed set of networks,
with the period as deadline (the analysis must finish before the next image); or, with
``period=None``, closed: each image arrives when the previous one is done.

Stochastic scenarios, with traffic intensity ρ (0.8, 1.0, 1.2 in the thesis):

- **I** (``random-arrivals``): each arrival is one network drawn uniformly from the
  candidates; inter-arrival times are normal with standard deviation ``iat_sd``
  (200 ms in the thesis);
- **II** (``random-composition``): periodic arrivals; each arrival asks for a uniformly
  drawn number of distinct networks, drawn uniformly;
- **III** (``all-random``): normal inter-arrival times and random compositions.

As in the thesis, compositions are drawn first; the mean inter-arrival time is then the
mean serial service time of the drawn jobs divided by ρ (service time of a job = the sum
of its networks' :attr:`~layerfit.schedule.profile.NetworkProfile.total_time`).
Inter-arrival times are clipped at zero.

Counts, periods, intensities and deviations are checked before anything is drawn: a
workload holds 1 to :data:`MAX_COUNT` arrivals (more would take minutes to generate
and simulate, and is almost certainly a typo), and every number must be finite.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from layerfit.errors import ScheduleError
from layerfit.schedule.experiments.workload import Arrival, Workload
from layerfit.schedule.profile import ProfileSet

ALL_NETWORKS = (
    "agenet",
    "gendernet",
    "facenet",
    "sos",
    "googlenet",
    "tinyyolo",
    "emotionnet",
    "memnet",
    "scenenet",
)

# Thesis §7.2.1: networks and the period (= deadline) between images. The thesis calls the
# third network of large-3 "ObjectNet"; Table 6.1's object network of that size is SceneNet.
# It gives no period for all-networks; 500 s (the largest) is used.
BATCH_SCENARIOS: dict[str, tuple[tuple[str, ...], float]] = {
    "small-3": (("agenet", "gendernet", "tinyyolo"), 20.0),
    "mixed-3": (("agenet", "emotionnet", "facenet"), 200.0),
    "large-3": (("memnet", "emotionnet", "scenenet"), 500.0),
    "lifelogging": (("tinyyolo", "emotionnet", "memnet", "scenenet", "sos"), 200.0),
    "all-networks": (ALL_NETWORKS, 500.0),
}

MAX_COUNT = 1_000_000  # arrivals in one generated workload
STOCHASTIC_SCENARIOS = {"random-arrivals": 1, "random-composition": 2, "all-random": 3}
SCENARIOS = (*BATCH_SCENARIOS, *STOCHASTIC_SCENARIOS)


def batch_workload(
    networks: Sequence[str] | str,
    count: int = 150,
    period: float | None = None,
    *,
    name: str | None = None,
    deadline: float | None = None,
) -> Workload:
    """``count`` images, each analysed by ``networks`` (or a named batch scenario).

    With a scenario name the thesis's period is used unless ``period`` is given; with
    ``period=None`` and explicit networks the workload is closed (batch mode).
    """
    _check_count(count)
    if isinstance(networks, str):
        if networks not in BATCH_SCENARIOS:
            raise ScheduleError(
                f"unknown batch scenario {networks!r}; choose one of: {', '.join(BATCH_SCENARIOS)}"
            )
        name = name or networks
        networks, default_period = BATCH_SCENARIOS[networks]
        period = default_period if period is None else period
    networks = tuple(networks)
    if not networks:
        raise ScheduleError("a batch workload needs at least one network")
    if period is None:
        arrivals = tuple(Arrival(0.0, networks) for _ in range(count))
        return Workload(
            arrivals, name=name or "batch", mode="closed", deadline=deadline, profiles="thesis"
        )
    if not math.isfinite(period) or period <= 0:
        raise ScheduleError(f"the period must be a finite number of seconds > 0, got {period}")
    arrivals = tuple(Arrival(i * period, networks) for i in range(count))
    return Workload(
        arrivals,
        name=name or "batch",
        mode="open",
        deadline=period if deadline is None else deadline,
        profiles="thesis",
    )


def stochastic_workload(
    scenario: int | str,
    profiles: ProfileSet,
    *,
    count: int = 150,
    intensity: float = 1.0,
    seed: int = 0,
    candidates: Sequence[str] = ALL_NETWORKS,
    iat_sd: float = 0.2,
    max_networks: int | None = None,
    profiles_spec: str | None = "thesis",
) -> Workload:
    """A stochastic scenario I, II or III (or its name) at traffic intensity ``intensity``."""
    _check_count(count)
    number = STOCHASTIC_SCENARIOS.get(scenario, scenario) if isinstance(scenario, str) else scenario
    if number not in (1, 2, 3):
        names = ", ".join(f"{n} ({k})" for k, n in STOCHASTIC_SCENARIOS.items())
        raise ScheduleError(f"unknown stochastic scenario {scenario!r}; choose one of: {names}")
    if not math.isfinite(intensity) or intensity <= 0:
        raise ScheduleError(f"traffic intensity must be a finite number > 0, got {intensity}")
    if not math.isfinite(iat_sd) or iat_sd < 0:
        raise ScheduleError(
            "the inter-arrival standard deviation must be a finite number of seconds >= 0, "
            f"got {iat_sd}"
        )
    candidates = tuple(candidates)
    if not candidates:
        raise ScheduleError("a stochastic workload needs at least one candidate network")
    for name in candidates:
        profiles[name]  # raises for an unknown network
    rng = random.Random(seed)
    top = min(max_networks or len(candidates), len(candidates))
    compositions: list[tuple[str, ...]] = []
    for _ in range(count):
        if number == 1:
            compositions.append((rng.choice(candidates),))
        else:
            compositions.append(tuple(rng.sample(candidates, rng.randint(1, top))))
    service = [sum(profiles[n].total_time for n in nets) for nets in compositions]
    mean_iat = (sum(service) / len(service)) / intensity
    at, arrivals = 0.0, []
    for nets in compositions:
        arrivals.append(Arrival(round(at, 6), nets))
        step = mean_iat if number == 2 else rng.gauss(mean_iat, iat_sd)
        at += max(0.0, step)
    label = {1: "random-arrivals", 2: "random-composition", 3: "all-random"}[number]
    return Workload(
        tuple(arrivals),
        name=f"{label}-rho{intensity:g}",
        mode="open",
        profiles=profiles_spec,
    )


def scenario_workload(
    scenario: str,
    profiles: ProfileSet,
    *,
    count: int = 150,
    intensity: float = 1.0,
    seed: int = 0,
    period: float | None = None,
    iat_sd: float = 0.2,
) -> Workload:
    """Any named scenario of :data:`SCENARIOS`."""
    if scenario in BATCH_SCENARIOS:
        return batch_workload(scenario, count, period)
    if scenario in STOCHASTIC_SCENARIOS:
        return stochastic_workload(
            scenario, profiles, count=count, intensity=intensity, seed=seed, iat_sd=iat_sd
        )
    raise ScheduleError(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}")


def _check_count(count: int) -> None:
    """1 to :data:`MAX_COUNT` arrivals: reject nonsense before generating it."""
    if count < 1:
        raise ScheduleError(f"a workload needs at least one arrival, got count={count}")
    if count > MAX_COUNT:
        raise ScheduleError(f"a workload holds at most {MAX_COUNT:,} arrivals, got count={count:,}")
