"""``--memory-limit`` on the command line: inside a real memory cgroup of exactly that size,
``generate`` and ``run`` complete, never OOM-killed, with the outputs of an unlimited run,
at two limits, the larger streaming fewer bytes (issue #55); bad limits are one line each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cgroups import memory_cgroup, unavailable

from layerfit.memory_limit import machine_memory_bytes

CLI = [sys.executable, "-m", "layerfit.cli"]
IDS = "5,17,83,9,61,30,7,2"
MB = 1000**2
PAGE = 4096
MARGIN = 24 * MB  # above the need a roomy run measured: a second process differs a little


def _cli(*args: str, cgroup=None) -> subprocess.CompletedProcess:
    command = [*CLI, *args]
    return cgroup.run(command) if cgroup is not None else subprocess.run(
        command, capture_output=True, text=True, timeout=600
    )


def _json(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """A seeded Llama of ~55 MB of weights saved with save_pretrained, prepared as published."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("limit")
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=8000, max_position_embeddings=128,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).eval().save_pretrained(root / "hf")
    prepared = root / "prepared"
    result = _cli("prepare", f"hf:{root / 'hf'}", "-o", str(prepared))
    assert result.returncode == 0, result.stderr[-2000:]
    return prepared


def _limits(report: dict) -> tuple[int, int]:
    """A limit whose weights barely exceed the minimum, and one that holds them all, from the
    need a roomy run of the same command measured."""
    memory = report["memory_limit"]
    beside = memory["footprint_bytes"] + MARGIN
    small, large = beside + memory["minimum_weight_bytes"] + 2 * MB, beside + report["weights_total_bytes"] + 4 * MB
    return small // PAGE * PAGE, large // PAGE * PAGE  # a cgroup's limit is whole pages


needs_cgroup = pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")


@needs_cgroup
def test_generate_within_a_cgroup_of_its_limit_makes_the_unlimited_tokens(decoder: Path) -> None:
    args = ["generate", str(decoder), "--ids", IDS, "--max-new-tokens", "12", "--json"]
    unlimited = _json(_cli(*args))
    roomy = _json(_cli(*args, "--memory-limit", f"{machine_memory_bytes() // 2}B"))
    small, large = _limits(roomy)
    reads = []
    for limit in (small, large):
        with memory_cgroup(limit) as cgroup:
            report = _json(_cli(*args, "--memory-limit", f"{limit}B", cgroup=cgroup))
            assert cgroup.oom_kills() == 0 and cgroup.peak_bytes() <= limit
        assert report["token_ids"] == unlimited["token_ids"]
        memory = report["memory_limit"]
        assert memory["memory_limit_bytes"] == limit and memory["kv_reserved_bytes"] > 0
        assert report["weight_buffer_bytes"] <= memory["weight_budget_bytes"]
        reads.append(report["read_bytes_per_token"])
    assert reads[0] > 0 and reads[1] == 0  # the small limit streams, the large one holds every weight


@needs_cgroup
def test_run_within_a_cgroup_of_its_limit_gives_the_unlimited_output(decoder: Path) -> None:
    args = ["run", str(decoder), "--repeats", "2", "--json"]
    unlimited = _json(_cli(*args))
    small, large = _limits(_json(_cli(*args, "--memory-limit", f"{machine_memory_bytes() // 2}B")))
    reads = []
    for limit in (small, large):
        with memory_cgroup(limit) as cgroup:
            report = _json(_cli(*args, "--memory-limit", f"{limit}B", cgroup=cgroup))
            assert cgroup.oom_kills() == 0 and cgroup.peak_bytes() <= limit
        assert report["output_sha256"] == unlimited["output_sha256"]
        reads.append(report["read_bytes_per_pass"])
    assert reads[0] > reads[1]
    # asked for more than the cgroup it runs in allows: said, and the cgroup's limit used
    with memory_cgroup(large) as cgroup:
        result = _cli(*args, "--memory-limit", f"{large + 200 * MB}B", cgroup=cgroup)
        report = _json(result)
    assert report["memory_limit"]["memory_limit_bytes"] == large
    assert "runs in a memory cgroup limited to" in result.stderr


@pytest.mark.parametrize(
    ("limit", "says"),
    [
        ("700", "has no unit"),
        ("50%", "is a share"),
        ("900TB", "more than this machine's memory"),
        ("120MB", "cannot run this model: the process holds"),
    ],
)
def test_a_bad_limit_is_one_line_and_runs_nothing(decoder: Path, limit: str, says: str) -> None:
    result = _cli("run", str(decoder), "--memory-limit", limit)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def test_a_budget_the_limit_cannot_hold_is_one_line(decoder: Path) -> None:
    roomy = _json(_cli("inspect", str(decoder), "--memory-limit", f"{machine_memory_bytes() // 2}B", "--json"))
    memory = roomy["memory_limit"]
    limit = memory["footprint_bytes"] + memory["minimum_weight_bytes"] + 40 * MB
    result = _cli("run", str(decoder), "--memory-limit", f"{limit}B", "--budget", "50MB")
    assert result.returncode == 2 and "budget 50.0 MB does not fit memory limit" in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0
