"""Which commit a result measured, and whether the code it measured has changed since.

A bench's JSON is a measurement of the code at one commit. A page that shows it must say
which commit that was, and ``make docs`` must warn when the code has changed since (a
warning, not a failure: an old measurement is still worth reading, but not silently).

* The commit measured is the one the JSON records (``machine.layerfit_commit``, a
  ``-dirty`` suffix dropped), or else the last commit that changed the JSON file.
* The code it measured is the bench's own script plus the package folders that bench
  exercises (:data:`CODE_OF`; ``src/layerfit/engine/`` by default).
* It is stale when a commit that is not an ancestor of the commit measured (so: made
  after it) changed that code, leaving out commits that also changed the JSON itself
  (those committed the measured state).

The history is read once (``git log``) into :class:`Commit` records, and everything else
is a pure function of them, so a test can hand in a made-up history.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

ENGINE = "src/layerfit/engine/"

# The package code each bench measures besides its own script (by the script's name or
# the start of it); any other bench measures the engine.
CODE_OF: dict[str, tuple[str, ...]] = {
    "memory_planner": ("src/layerfit/memory/",),
    "activation_": ("src/layerfit/memory/", ENGINE),
    "masa": ("src/layerfit/schedule/",),
    "minakova": ("src/layerfit/schedule/",),
    "serve_": ("src/layerfit/serve/", "src/layerfit/schedule/", ENGINE),
    "swapnet": ("src/layerfit/tradeoff/",),
    "vs_llamacpp_quantized": ("src/layerfit/store/", ENGINE),
    "gguf_tolerance": ("src/layerfit/store/", ENGINE),
    "hf_checkpoints": ("src/layerfit/store/", ENGINE),
    "prepare_memory": ("src/layerfit/store/", "src/layerfit/capture/"),
}


@dataclass(frozen=True)
class Commit:
    """One commit of the history: its hash, date (YYYY-MM-DD), parents and changed files."""

    sha: str
    date: str
    parents: tuple[str, ...]
    files: frozenset[str]

    @property
    def short(self) -> str:
        return self.sha[:7]


@dataclass(frozen=True)
class Freshness:
    """What a page says about one result file's age."""

    measured: Commit | None  # the commit measured; None when git knows nothing of it
    recorded: Commit | None  # the last commit that changed the JSON file
    named: bool  # whether the JSON names the commit measured (else: the commit that recorded it)
    code: tuple[str, ...]  # the paths whose changes make it stale
    changed_since: tuple[Commit, ...]  # newest first

    @property
    def stale(self) -> bool:
        return bool(self.changed_since)


def code_of(script: str) -> tuple[str, ...]:
    """The paths a bench's results measure: its script, then the package code."""
    for prefix, paths in CODE_OF.items():
        if script == prefix or script.startswith(prefix):
            return (f"bench/{script}.py", *paths)
    return (f"bench/{script}.py", ENGINE)


def read_history(root: Path) -> list[Commit]:
    """The repository's commits, newest first; empty when ``root`` is not a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(root), "log", "--format=%x00%H %cs %P", "--name-only", "HEAD"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    history = []
    for block in out.split("\0")[1:]:
        head, *files = block.strip("\n").split("\n")
        sha, date, *parents = head.split()
        history.append(Commit(sha, date, tuple(parents), frozenset(f for f in files if f)))
    return history


def _touches(commit: Commit, paths: tuple[str, ...]) -> bool:
    return any(f == p or (p.endswith("/") and f.startswith(p)) for f in commit.files for p in paths)


def _ancestors(history: list[Commit], commit: Commit) -> set[str]:
    by_sha = {c.sha: c for c in history}
    seen, todo = {commit.sha}, [commit.sha]
    while todo:
        for parent in by_sha[todo.pop()].parents:
            if parent not in seen and parent in by_sha:
                seen.add(parent)
                todo.append(parent)
    return seen


def recorded_ref(data: object) -> str | None:
    """The commit a result file names as the one it measured, if it names one."""
    if not isinstance(data, dict):
        return None
    machine = data.get("machine")
    ref = machine.get("layerfit_commit") if isinstance(machine, dict) else None
    ref = ref or data.get("layerfit_commit")
    return ref.removesuffix("-dirty") if isinstance(ref, str) and ref else None


def freshness(history: list[Commit], result: str, script: str, data: object) -> Freshness:
    """How old ``result`` (a path from the repository's root) is against the code ``script``
    measured, from ``history`` (newest first)."""
    code = code_of(script)
    recorded = next((c for c in history if result in c.files), None)
    ref = recorded_ref(data)
    named = next((c for c in history if c.sha.startswith(ref)), None) if ref else None
    measured = named or recorded
    if measured is None:
        return Freshness(None, None, False, code, ())
    before = _ancestors(history, measured)
    changed = tuple(c for c in history if c.sha not in before and _touches(c, code) and result not in c.files)
    return Freshness(measured, recorded, named is not None, code, changed)


def commit_words(f: Freshness) -> str:
    """``at commit `abc1234`, recorded 2026-12-06``: the commit measured and the date its
    JSON was committed (where the JSON names no commit, the one that committed it: the
    code measured was that commit's or an earlier one's)."""
    if f.measured is None:
        return "at a commit git does not know (the result is not committed yet)"
    when = f.recorded.date if f.recorded else f.measured.date
    if not f.named:
        return f"at commit `{f.measured.short}` or before (the JSON names none; that commit recorded it), {when}"
    return f"at commit `{f.measured.short}`, recorded {when}"


def describe(f: Freshness) -> str:
    """One sentence for the page: the commit measured, and the date it was recorded."""
    return f"Measured {commit_words(f)}."


def warning(f: Freshness) -> str | None:
    """The staleness warning, or None when the code has not changed since."""
    if not f.stale:
        return None
    latest = f.changed_since[0]
    return (f"{len(f.changed_since)} later commit{'s' if len(f.changed_since) > 1 else ''} changed the code it "
            f"measured ({', '.join(f.code)}), the latest `{latest.short}` on {latest.date}: "
            "rerun the bench to refresh it.")
