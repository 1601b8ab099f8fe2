"""Profiles: the built-in thesis set, serialisation, validation, estimates from capture."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.errors import ScheduleError
from layerfit.schedule.experiments.profile_sets import resolve_network
from layerfit.schedule.experiments.thesis import MIB, TABLE_6_1, thesis_profiles
from layerfit.schedule.profile import (
    LayerProfile,
    NetworkProfile,
    ProfileSet,
    load_profiles,
    profile_from_graph,
)


def test_thesis_profiles_match_table_6_1():
    profiles = thesis_profiles()
    assert profiles.names() == list(TABLE_6_1)
    for name, (_, storage, memory, conv, fc, total, _) in TABLE_6_1.items():
        p = profiles[name]
        assert p.source == "thesis-derived"
        assert len(p.layers) == total
        assert sum(layer.kind == "conv" for layer in p.layers) == conv
        assert sum(layer.kind == "fc" for layer in p.layers) == fc
        assert p.bulk_peak == pytest.approx(memory * MIB, rel=1e-6)
        assert p.notes["table_6_1"]["storage_mib"] == storage
        assert p.min_budget < p.bulk_peak


def test_round_trip_through_json_and_yaml(tmp_path):
    profiles = thesis_profiles()
    for suffix in (".json", ".yaml"):
        path = tmp_path / f"set{suffix}"
        profiles.save(path)
        again = load_profiles(path)
        assert again["agenet"] == profiles["agenet"] and len(again) == 9
    single = tmp_path / "one.json"
    ProfileSet([profiles["sos"]]).save(single)
    assert resolve_network(str(single)).name == "sos"
    assert resolve_network("SceneNet").name == "scenenet"


def test_profile_validation_names_the_field():
    with pytest.raises(ScheduleError, match=r"layers\[0\].kind: 'dense' is not one of"):
        NetworkProfile("x", (LayerProfile("l", kind="dense"),))
    with pytest.raises(
        ScheduleError, match=r"layers\[0\].memory: expected a whole number of bytes"
    ):
        NetworkProfile("x", (LayerProfile("l", memory=-1),))
    with pytest.raises(ScheduleError, match="needs at least one layer"):
        NetworkProfile("x", ())
    with pytest.raises(ScheduleError, match=r"p.layers\[0\].speed: unknown field; known: "):
        NetworkProfile.from_dict({"name": "x", "layers": [{"name": "l", "speed": 1}]}, "p")
    with pytest.raises(ScheduleError, match="unknown network 'zzz'"):
        thesis_profiles()["zzz"]


def test_derived_quantities():
    p = NetworkProfile(
        "n",
        (
            LayerProfile("a", "conv", 1, 2, 10, load_memory=20, exec_memory=3),
            LayerProfile("b", "fc", 1, 1, 30, exec_memory=1),
        ),
        init_time=0.5,
        init_memory=5,
    )
    assert p.total_time == 5.5 and p.weight_bytes == 40 and p.fc_start == 1
    assert p.largest_task_memory == 30 and p.min_budget == 5 + 31
    assert p.bulk_peak == 5 + 10 + 30 + 3
    scaled = p.scaled(memory_factor=2, time_factor=0.5)
    assert scaled.layers[0].load_memory == 40 and scaled.total_time == pytest.approx(2.75)


def test_grouping_layers_into_blocks_adds_times_and_weights():
    p = NetworkProfile(
        "n",
        (
            LayerProfile("a", "conv", 1, 2, 10, load_memory=20, exec_memory=3),
            LayerProfile("b", "conv", 1, 1, 30, exec_memory=1),
            LayerProfile("c", "fc", 0.5, 0.5, 4, exec_memory=7),
            LayerProfile("d", "fc", 0.5, 0.5, 6),
        ),
        init_time=0.5,
        init_memory=5,
        unload_time=0.1,
    )
    g = p.grouped([2, 1, 1])
    first = g.layers[0]
    assert (first.name, first.kind, first.load_time, first.exec_time) == ("a .. b", "conv", 2, 3)
    # one buffer of both layers' weights, plus the first layer's load transient (20 - 10)
    assert first.memory == 40 and first.load_peak == 50 and first.exec_memory == 3
    assert g.weight_bytes == p.weight_bytes and g.fc_start == 1
    assert g.total_time == pytest.approx(p.total_time - 0.1)  # one unload fewer
    assert g.min_budget == 5 + 50 and g.notes["layers_per_block"] == [2, 1, 1]
    mixed = p.grouped([1, 3]).layers[1]
    assert mixed.kind == "conv" and mixed.load_memory is None and mixed.exec_memory == 7
    assert p.grouped([1, 1, 1, 1]) is p
    for sizes in ([2, 1], [0, 4], [5]):
        with pytest.raises(ScheduleError, match="cannot group"):
            p.grouped(sizes)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 20), st.integers(0, 40), st.sampled_from(["conv", "fc", "other"])),
        min_size=1,
        max_size=25,
    ),
    st.integers(0, 30),
)
def test_blocks_within_the_min_budget_are_the_fewest_that_keep_it(layers, init):
    p = NetworkProfile(
        "n",
        tuple(
            LayerProfile(f"l{i}", kind, 0.1, 0.2, memory, load_memory=memory + extra if extra else None,
                         exec_memory=scratch)
            for i, (memory, extra, scratch, kind) in enumerate(layers)
        ),
        init_memory=init,
    )
    sizes = p.blocks_within_min_budget()
    assert sum(sizes) == len(p.layers) and all(n >= 1 for n in sizes)
    assert p.grouped(sizes).min_budget == p.min_budget
    start = 0
    for n in sizes[:-1]:  # the fewest: no block could also take the layer after it
        with_next = [1] * start + [n + 1] + [1] * (len(p.layers) - start - n - 1)
        assert p.grouped(with_next).min_budget > p.min_budget
        start += n


def test_profile_from_a_captured_graph():
    # the fields of layerfit.capture's ModelGraph/UnitInfo that are read (no torch import here)
    units = [
        SimpleNamespace(
            name="features.0",
            module_type="Conv2d",
            s=4000,
            f=10**6,
            calls=1,
            output_shapes=((1, 8, 4, 4),),
        ),
        SimpleNamespace(
            name="classifier",
            module_type="Linear",
            s=8000,
            f=2 * 10**6,
            calls=1,
            output_shapes=((1, 10),),
        ),
    ]
    graph = SimpleNamespace(model_type="Tiny", input_shape=(1, 3, 8, 8), units=units)
    p = profile_from_graph(graph, "tiny", disk_bytes_per_s=1000, macs_per_s=10**6)
    assert [layer.kind for layer in p.layers] == ["conv", "fc"]
    assert (p.layers[0].load_time, p.layers[1].exec_time, p.layers[0].exec_memory) == (
        4.0,
        2.0,
        8 * 16 * 4,
    )
    assert p.source == "capture-estimate"
