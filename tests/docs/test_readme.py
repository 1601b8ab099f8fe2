"""The README is the front door: short, the two commands first, links that resolve inside
the repository (the docs site's --strict build checks the site's own links)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = README.splitlines()
    assert len(lines) <= 150
    assert lines[0] == "# layerfit"
    first = next(line for line in lines[1:] if line.strip())
    assert first.startswith("```"), "the first thing after the title is the commands' block"
    block = lines[lines.index(first) + 1 : lines.index("```", lines.index(first) + 1)]
    assert [line.split()[:2] for line in block] == [["make", "demo"], ["make", "test"]]


def test_every_link_of_the_readme_resolves_inside_the_repository():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links its guides"
    for target in local:
        path = (ROOT / target).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), target


def test_no_link_of_the_readme_names_a_generated_file():
    """A clean clone lacks what git ignores (make docs writes docs/benchmarks/), so a link
    there resolves on a developer's machine and breaks on CI's."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", *local],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert ignored == []
