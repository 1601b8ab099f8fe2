"""Workload files (errors name the line and the field) and the scenario generators."""

from __future__ import annotations

import statistics

import pytest

from layerfit.errors import LayerfitError, ScheduleError, WorkloadError
from layerfit.schedule.experiments.thesis import thesis_profiles
from layerfit.schedule.experiments.workload import load_workload, parse_workload
from layerfit.schedule.experiments.workload_generators import (
    BATCH_SCENARIOS,
    batch_workload,
    scenario_workload,
    stochastic_workload,
)

PROFILES = thesis_profiles()

GOOD = """\
name: demo
mode: open
deadline: 20
arrivals:
  - at: 0
    networks: [agenet, gendernet]
    input: img/1.jpg
  - at: 2.5
    networks: tinyyolo
    deadline: 5
"""


def test_a_workload_file_reads_and_round_trips(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text(GOOD)
    workload = load_workload(path)
    assert workload.name == "demo" and len(workload.arrivals) == 2
    assert workload.arrivals[1].networks == ("tinyyolo",)
    jobs = workload.jobs()
    assert [j.id for j in jobs] == ["j0", "j1"]
    assert (jobs[0].deadline, jobs[1].deadline, jobs[1].arrival, jobs[0].input) == (
        20,
        5,
        2.5,
        "img/1.jpg",
    )
    again = parse_workload(workload.to_yaml(), "again.yaml")
    assert again.arrivals == workload.arrivals and again.deadline == 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "arrivals:\n  - at: 0\n    networks: [agenet, foonet]\n",
            r"w.yaml, line 3: arrivals\[0\].networks\[1\]: unknown network 'foonet'",
        ),
        (
            "arrivals:\n  - at: soon\n    networks: [agenet]\n",
            r"line 2: arrivals\[0\].at: expected a number of seconds >= 0",
        ),
        (
            "arrivals:\n  - at: -1\n    networks: [agenet]\n",
            r"line 2: arrivals\[0\].at: expected a number of seconds >= 0",
        ),
        (
            "arrivals:\n  - at: 1\n    netwrks: [agenet]\n",
            r"line 3: arrivals\[0\].netwrks: unknown field",
        ),
        ("arrivals:\n  - at: 1\n", r"line 2: arrivals\[0\].networks: missing"),
        (
            "arrivals:\n  - at: 1\n    networks: []\n",
            r"line 3: arrivals\[0\].networks: expected a non-empty list",
        ),
        (
            "arrivals:\n  - at: 1\n    networks: [3]\n",
            r"line 3: arrivals\[0\].networks\[0\]: expected a network name",
        ),
        ("mode: burst\narrivals: []\n", r"line 1: mode: expected one of open, closed"),
        ("deadline: 0\narrivals: []\n", r"line 1: deadline: expected a number of seconds > 0"),
        ("arrivals: []\n", r"line 1: arrivals: expected a non-empty list"),
        ("name: x\n", r"w.yaml: arrivals: missing"),
        ("speed: 3\narrivals: []\n", r"line 1: speed: unknown field"),
        (
            "arrivals:\n  - at: 1\n    at: 2\n    networks: [agenet]\n",
            r"line 3: 'at': appears twice",
        ),
        ("arrivals:\n  - [at, 1]\n", r"line 2: arrivals\[0\]: expected a mapping"),
        ("- 1\n- 2\n", r"w.yaml: the workload: expected a mapping with an 'arrivals' list, got \[1, 2\]"),
        ("arrivals:\n  - at: [1\n", r"w.yaml, line \d+: not valid YAML"),
        (
            "profiles: nowhere.yaml\narrivals:\n  - networks: [agenet]\n",
            r"line 1: profiles: cannot read profile file",
        ),
    ],
)
def test_malformed_workloads_name_the_line_and_the_field(text, expected):
    with pytest.raises(WorkloadError, match=expected) as info:
        parse_workload(text, "w.yaml")
    assert isinstance(info.value, LayerfitError)


def test_unreadable_workload_file(tmp_path):
    with pytest.raises(WorkloadError, match="cannot read workload"):
        load_workload(tmp_path / "missing.yaml")


def test_batch_scenarios_follow_the_thesis():
    small = batch_workload("small-3", 5)
    assert small.arrivals[0].networks == ("agenet", "gendernet", "tinyyolo")
    assert [a.at for a in small.arrivals] == [0, 20, 40, 60, 80] and small.deadline == 20
    assert set(BATCH_SCENARIOS) == {"small-3", "mixed-3", "large-3", "lifelogging", "all-networks"}
    closed = batch_workload(["agenet"], 3)
    assert closed.mode == "closed" and [j.arrival for j in closed.jobs(PROFILES)] == [0, 0, 0]
    with pytest.raises(ScheduleError, match="unknown batch scenario"):
        batch_workload("tiny-1")


def test_stochastic_scenarios_and_traffic_intensity():
    one = stochastic_workload(1, PROFILES, count=200, intensity=1.0, seed=3)
    assert all(len(a.networks) == 1 for a in one.arrivals)
    two = stochastic_workload("random-composition", PROFILES, count=50, intensity=1.0, seed=3)
    gaps = [b.at - a.at for a, b in zip(two.arrivals, two.arrivals[1:], strict=False)]
    assert max(gaps) - min(gaps) < 1e-5  # periodic
    assert any(len(a.networks) > 1 for a in two.arrivals)
    assert all(len(set(a.networks)) == len(a.networks) for a in two.arrivals)
    light = stochastic_workload(3, PROFILES, count=300, intensity=0.8, seed=1)
    heavy = stochastic_workload(3, PROFILES, count=300, intensity=1.2, seed=1)
    assert light.arrivals[-1].at / heavy.arrivals[-1].at == pytest.approx(1.5, rel=0.02)
    service = statistics.mean(sum(PROFILES[n].total_time for n in a.networks) for a in one.arrivals)
    assert one.arrivals[-1].at / (len(one.arrivals) - 1) == pytest.approx(service, rel=0.05)
    assert stochastic_workload(3, PROFILES, count=20, seed=9) == stochastic_workload(
        3, PROFILES, count=20, seed=9
    )
    with pytest.raises(ScheduleError, match="unknown stochastic scenario"):
        stochastic_workload(4, PROFILES)
    with pytest.raises(ScheduleError, match="unknown scenario"):
        scenario_workload("nope", PROFILES)
