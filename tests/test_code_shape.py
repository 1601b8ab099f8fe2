"""The code keeps the shape a newcomer can read: no class over 400 lines, no function over
100 (a class past a few hundred lines holds two ideas), and ``docs/architecture.md`` names
every module of the package, so its map never goes stale silently."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "layerfit"
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 100


def oversized(source: str, name: str) -> list[str]:
    """Each class over MAX_CLASS_LINES and function over MAX_FUNCTION_LINES in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            limit = MAX_CLASS_LINES
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            limit = MAX_FUNCTION_LINES
        else:
            continue
        lines = node.end_lineno - node.lineno + 1
        if lines > limit:
            found.append(f"{name}:{node.lineno} {node.name} is {lines} lines (at most {limit})")
    return found


def test_no_class_over_400_lines_and_no_function_over_100() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += oversized(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []


def test_the_size_check_finds_a_long_function_and_a_long_class() -> None:
    body = "".join(f"    x{k} = {k}\n" for k in range(MAX_FUNCTION_LINES))
    assert oversized(f"def f():\n{body}", "m.py") == ["m.py:1 f is 101 lines (at most 100)"]
    methods = "".join(f"    def m{k}(self):\n        return {k}\n\n" for k in range(MAX_CLASS_LINES // 3 + 1))
    assert len(oversized(f"class C:\n{methods}", "m.py")) == 1
    assert oversized("def f():\n    return 1\n", "m.py") == []


def mapped(markdown: str) -> list[str]:
    """The module paths (or patterns) the first cell of each table row names: each
    backticked ``a/b.py``, and a bare ``c.py`` after it in the same cell meaning ``a/c.py``."""
    names = []
    for line in markdown.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for item in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if "/" in item:
                folder = item.rsplit("/", 1)[0] + "/"
                names.append(item)
            elif item.endswith(".py"):
                names.append(folder + item)
    return names


def unmapped(modules: list[str], markdown: str) -> list[str]:
    patterns = mapped(markdown)
    return [m for m in modules if not any(fnmatch.fnmatchcase(m, p) for p in patterns)]


def test_the_architecture_page_maps_every_module() -> None:
    modules = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name not in ("__init__.py", "__main__.py")
    ]
    assert len(modules) > 100
    assert unmapped(modules, (ROOT / "docs" / "architecture.md").read_text()) == []


def test_the_map_check_reads_rows_and_patterns() -> None:
    page = "| `engine/plan.py`, `policies.py` | x |\n| `memory/objects_*.py` | y |\n| plain | `serve/app.py` |\n"
    assert mapped(page) == ["engine/plan.py", "engine/policies.py", "memory/objects_*.py"]
    modules = ["engine/plan.py", "engine/policies.py", "memory/objects_naive.py", "serve/app.py"]
    assert unmapped(modules, page) == ["serve/app.py"]
