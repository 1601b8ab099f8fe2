"""What sets the pipeline policies apart is data and methods of the policy object: the
engine asks those, never a policy's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import layerfit.engine
from layerfit.engine.policies import POLICIES
from layerfit.errors import BudgetError

ENGINE = Path(layerfit.engine.__file__).parent


@pytest.mark.parametrize(
    ("name", "resident", "external", "runs_ahead", "streams"),
    [
        ("preload", True, False, False, False),
        ("sequential", False, False, False, True),
        ("sync", False, False, False, True),
        ("async", False, False, True, True),
        ("external", False, True, False, False),
    ],
)
def test_each_policy_says_what_it_does(name, resident, external, runs_ahead, streams):
    policy = POLICIES[name]
    assert (policy.resident, policy.external, policy.runs_ahead, policy.streams) == (
        resident, external, runs_ahead, streams,
    )


def test_the_gates_are_the_papers():
    seq, sync, asyn = POLICIES["sequential"], POLICIES["sync"], POLICIES["async"]
    # sequential: a read (and a copy) once the kernel before it finished
    assert not seq.read_may_start(3, kernels_started=3, kernels_done=2)
    assert seq.read_may_start(3, kernels_started=3, kernels_done=3)
    assert not seq.copy_may_start(3, kernels_started=3, kernels_done=2)
    # sync: unit i read while kernel i - (stages - 1) runs; copied once kernel j - 1 started
    assert sync.read_may_start(3, kernels_started=3, kernels_done=0)
    assert not sync.read_may_start(3, kernels_started=2, kernels_done=0)
    assert sync.read_may_start(3, kernels_started=2, kernels_done=0, stages=3)
    assert not sync.read_may_start(3, kernels_started=1, kernels_done=0, stages=3)
    assert sync.copy_may_start(3, kernels_started=3, kernels_done=0)
    assert not sync.copy_may_start(3, kernels_started=2, kernels_done=2)
    # async: only the buffer holds it back
    assert asyn.read_may_start(9, kernels_started=0, kernels_done=0)
    assert asyn.copy_may_start(9, kernels_started=0, kernels_done=0)


def test_buffer_sizes_follow_the_policys_data():
    sizes = [4096, 8192, 4096]
    assert POLICIES["external"].buffer_bytes(sizes, 10**6) == 0
    assert POLICIES["async"].buffer_bytes(sizes, None) == 2 * 8192  # runs ahead: two of the largest
    assert POLICIES["sequential"].buffer_bytes(sizes, None) == 8192
    assert POLICIES["preload"].buffer_bytes(sizes, None) == sum(sizes)
    with pytest.raises(BudgetError, match="sync double-buffers and needs 2 x the largest unit"):
        POLICIES["sync"].buffer_bytes(sizes, 3 * 4096)
    assert POLICIES["async"].buffer_bytes(sizes, 3 * 4096) == 3 * 4096


def test_no_engine_module_compares_a_policys_name():
    """``policy.name == "..."`` stood in for behaviour in six files: a new policy had to
    find each. The name is for people (timelines, reports); the engine asks the policy."""
    found = []
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Attribute) and side.attr == "name" and _is_policy(side.value):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found, found


def _is_policy(node: ast.expr) -> bool:
    """``policy``, ``self`` (inside policies.py) or ``x.policy``."""
    if isinstance(node, ast.Name):
        return node.id in ("policy", "self")
    return isinstance(node, ast.Attribute) and node.attr == "policy"
