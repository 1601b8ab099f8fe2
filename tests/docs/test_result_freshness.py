"""A result page never goes stale silently: the staleness check finds the commits that
changed the code a result measured after the commit it measured, on made-up histories
(and once on a real, tiny git repository)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import result_freshness as rf  # noqa: E402

RESULT = "bench/results/vs_mmap.json"


def _history(*commits: tuple[str, str | None, set[str]]) -> list[rf.Commit]:
    """Commits oldest first as (sha, parent, files); returned newest first, as git log gives."""
    made = [rf.Commit(sha * 8, f"2026-12-0{k + 1}", (parent * 8,) if parent else (), frozenset(files))
            for k, (sha, parent, files) in enumerate(commits)]
    return made[::-1]


def _measured_at(sha: str | None) -> dict:
    return {"machine": {"layerfit_commit": sha * 3 + "-dirty" if sha else None}}


LINEAR = _history(
    ("a", None, {"src/layerfit/engine/reader.py"}),
    ("b", "a", {"bench/vs_mmap.py"}),  # the commit measured
    ("c", "b", {RESULT, "bench/results/vs_mmap.md", "bench/vs_mmap.py"}),  # commits the result
    ("d", "c", {"README.md", "src/layerfit/serve/server.py"}),  # other code
    ("e", "d", {"src/layerfit/engine/stream.py"}),  # the engine changed
)


def test_a_change_to_the_engine_after_the_commit_measured_makes_it_stale() -> None:
    fresh = rf.freshness(LINEAR, RESULT, "vs_mmap", _measured_at("b"))
    assert fresh.named and fresh.measured.sha.startswith("b") and fresh.recorded.sha.startswith("c")
    assert [c.sha[0] for c in fresh.changed_since] == ["e"], "the result's own commit and other code do not count"
    warning = rf.warning(fresh)
    assert warning is not None and "1 later commit changed" in warning and "`eeeeeee`" in warning
    assert "src/layerfit/engine/" in warning and "bench/vs_mmap.py" in warning


def test_nothing_changed_since_means_no_warning() -> None:
    history = LINEAR[1:]  # without e
    fresh = rf.freshness(history, RESULT, "vs_mmap", _measured_at("b"))
    assert not fresh.stale and rf.warning(fresh) is None
    assert rf.describe(fresh) == "Measured at commit `bbbbbbb`, recorded 2026-12-03."


def test_without_a_named_commit_the_commit_that_recorded_the_json_stands_in() -> None:
    fresh = rf.freshness(LINEAR, RESULT, "vs_mmap", {"rows": []})
    assert not fresh.named and fresh.measured.sha.startswith("c")
    assert [c.sha[0] for c in fresh.changed_since] == ["e"]
    assert "the JSON names none" in rf.describe(fresh)


def test_a_named_commit_git_does_not_know_falls_back_to_the_recording_commit() -> None:
    fresh = rf.freshness(LINEAR, RESULT, "vs_mmap", _measured_at("f"))
    assert not fresh.named and fresh.measured.sha.startswith("c")


def test_a_result_git_does_not_know_is_said_so() -> None:
    fresh = rf.freshness(LINEAR, "bench/results/new.json", "new", {})
    assert fresh.measured is None and not fresh.stale
    assert "not committed yet" in rf.describe(fresh)


def test_a_change_merged_from_a_branch_that_forked_before_counts_and_one_before_does_not() -> None:
    history = _history(
        ("a", None, {"src/layerfit/engine/a.py"}),
        ("b", "a", {"src/layerfit/engine/b.py"}),  # on the side branch, made after a
        ("c", "a", {"bench/vs_mmap.py"}),  # measured here, without b
        ("d", "c", {RESULT}),
    )
    merge = rf.Commit("m" * 8, "2026-12-09", ("d" * 8, "b" * 8), frozenset())
    fresh = rf.freshness([merge, *history], RESULT, "vs_mmap", _measured_at("c"))
    assert [c.sha[0] for c in fresh.changed_since] == ["b"], "b is not an ancestor of the commit measured"


def test_each_bench_measures_its_script_and_its_code() -> None:
    assert rf.code_of("vs_mmap") == ("bench/vs_mmap.py", "src/layerfit/engine/")
    assert rf.code_of("memory_planner") == ("bench/memory_planner.py", "src/layerfit/memory/")
    assert "src/layerfit/serve/" in rf.code_of("serve_load")
    history = _history(("a", None, {"bench/memory_planner.py"}), ("b", "a", {"bench/results/memory_planner.json"}),
                       ("c", "b", {"src/layerfit/engine/reader.py"}))
    assert not rf.freshness(history, "bench/results/memory_planner.json", "memory_planner", {}).stale


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_read_history_reads_a_real_repository(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], capture_output=True, text=True, check=True,
                              env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                                   "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path), "PATH": os.environ["PATH"]}
                              ).stdout.strip()

    git("init", "-q")
    for path, text in (("bench/vs_mmap.py", "1"), (RESULT, "{}"), ("src/layerfit/engine/x.py", "2")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", path)
        git("commit", "-q", "-m", path)
    history = rf.read_history(tmp_path)
    assert [sorted(c.files) for c in history] == [["src/layerfit/engine/x.py"], [RESULT], ["bench/vs_mmap.py"]]
    assert history[0].parents == (history[1].sha,) and history[-1].parents == ()
    fresh = rf.freshness(history, RESULT, "vs_mmap", {})
    assert [c.sha for c in fresh.changed_since] == [history[0].sha]
    assert rf.read_history(tmp_path / "not-a-repository") == []
