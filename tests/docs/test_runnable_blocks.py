"""Every code block the README and the docs mark as runnable is run, so an example that
stops working fails the suite.

A block is runnable when the line just before its fence is ``<!-- runnable -->`` (an
HTML comment: invisible on GitHub and in the site). A page's runnable blocks run in order
in one empty folder, so a block may use what an earlier one made: ``python`` blocks as a
script with this interpreter, ``bash`` and ``sh`` blocks with ``bash -e``, this
environment's ``bin`` first on ``PATH`` (so ``layerfit`` is the one under test). Port 8000
in a block is replaced by a free one, and ``LAYERFIT_CACHE`` points into the folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
LANGUAGES = {"python", "bash", "sh"}
BLOCK_TIMEOUT_S = 120


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [p for p in found if MARK in p.read_text()]


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each block whose fence follows the mark, in page order."""
    blocks = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        if before == MARK:
            language = match.group(1)
            if language not in LANGUAGES:
                raise AssertionError(f"a runnable block in {language!r}: only {sorted(LANGUAGES)} run")
            blocks.append((language, match.group(2)))
    return blocks


def test_the_mark_is_found_only_before_blocks() -> None:
    """A mark not followed by a block (a typo, a blank line between) would run nothing."""
    for page in pages():
        text = page.read_text()
        assert text.count(MARK) == len(runnable_blocks(text)), f"{page}: a mark without a block"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks(page: Path, tmp_path: Path) -> None:
    port = str(_free_port())
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["LAYERFIT_CACHE"] = str(tmp_path / ".cache")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    for i, (language, code) in enumerate(runnable_blocks(page.read_text())):
        code = code.replace(":8000", f":{port}").replace("--port 8000", f"--port {port}")
        if language == "python":
            script = tmp_path / f"block{i}.py"
            script.write_text(code)
            command = [sys.executable, str(script)]
        else:
            command = ["bash", "-e", "-c", code]
        # Its own session, so that what a block started in the background (a server) is
        # stopped with it even when the block fails before its own `kill`.
        block = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                 start_new_session=True)
        try:
            out, err = block.communicate(timeout=BLOCK_TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(block.pid, signal.SIGTERM)
            if block.poll() is None:
                block.kill()
                out, err = block.communicate()
        assert block.returncode == 0, (
            f"{page.name}, runnable block {i + 1} ({language}) exited {block.returncode}:\n{code}\n"
            f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
        )
