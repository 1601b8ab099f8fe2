"""What ``prepare`` does beside its output: it removes only the temporary folders it made
and can prove it made (never through a pattern built from the output's name), one run
at a time writes an output (a second refuses in one line), an output that appears while
it works is replaced only with ``--force``, and a signal that stops it leaves nothing —
while one SIGKILL leaves is reported, with its size and how to remove it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerfit.cli import main
from layerfit.errors import OutputExistsError
from layerfit.store import output_folder, prepare, read_manifest, writer
from layerfit.store.output_folder import (
    MARKER,
    OutputBusyError,
    make_temporary,
    proven_temporary,
    stale_temporaries,
)

TESTS = Path(__file__).resolve().parents[1]
TINY = "tinymodels:tiny_cnn"
SHAPE = (1, 3, 8, 8)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _foreign(folder: Path, name: str) -> Path:
    """A folder of the user's that merely looks like a temporary one."""
    path = folder / name
    path.mkdir()
    (path / "keep.txt").write_text("mine")
    return path


# --- item 3: remove only what prepare made and can prove it made -------------------------


def test_an_output_named_star_removes_nothing_of_the_users(tmp_path: Path):
    """``-o '*'`` used to glob ``.*.*.old`` and remove the user's ``.x.keep.old``."""
    keep = [_foreign(tmp_path, name) for name in (".x.keep.old", ".x.keep.tmp", ".*.abc.old", ".y.z.tmp")]
    prepare(TINY, tmp_path / "*", input_shape=SHAPE)
    for path in keep:
        assert (path / "keep.txt").read_text() == "mine"
    prepare(TINY, tmp_path / "*", input_shape=SHAPE, force=True)
    assert sorted(_names(tmp_path)) == sorted(["*", *(p.name for p in keep)])


def test_what_is_not_proven_ours_is_left_alone(tmp_path: Path):
    out = tmp_path / "m"
    old_format = _foreign(tmp_path, ".m.abcd1234.tmp")  # the old writer's name and pid file: no proof
    (old_format / ".prepare-pid").write_text("999999999")
    forged = _foreign(tmp_path, ".m.layerfit-0123456789abcdef.tmp")  # our name, a marker that does not match it
    (forged / MARKER).write_text(json.dumps({"token": "guess", "pid": 999999999, "output": "m"}))
    other = make_temporary(tmp_path / "n", "tmp")  # ours, but made for another output: reported, not removed
    (other / MARKER).write_text((other / MARKER).read_text().replace(str(os.getpid()), "999999999"))
    linked = tmp_path / ".m.layerfit-fedcba9876543210.tmp"
    linked.symlink_to(other)
    mine = make_temporary(out, "tmp")  # ours, for this output, its writer gone
    (mine / MARKER).write_text((mine / MARKER).read_text().replace(str(os.getpid()), "999999999"))
    with pytest.warns(UserWarning) as caught:
        prepare(TINY, out, input_shape=SHAPE)
    assert not mine.exists()
    assert (old_format / "keep.txt").exists() and (forged / "keep.txt").exists() and other.is_dir() and linked.is_symlink()
    said = [str(w.message) for w in caught]
    assert any(f"removed {mine.name}" in line for line in said), said
    assert any(f"{other} (" in line and "was left by a prepare of n that was killed" in line and "rm -r" in line
               for line in said), said


_NAME = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_NAME.filter(lambda n: n not in (".", "..")), other=_NAME.filter(lambda n: n not in (".", "..")))
def test_a_temporary_is_proven_for_its_own_output_only(tmp_path_factory: pytest.TempPathFactory, name: str, other: str):
    """For any output names: the folder made for ``name`` is proven ours and names
    ``name``; a plain folder named as if made for ``other`` is never proven."""
    parent = tmp_path_factory.mktemp("names")
    made = make_temporary(parent / name, "tmp")
    proof = proven_temporary(parent, made.name)
    assert proof is not None and proof.output == name and proof.pid == os.getpid()
    lookalike = parent / f".{other}.layerfit-{'0' * 16}.old"
    lookalike.mkdir()
    assert proven_temporary(parent, lookalike.name) is None
    (lookalike / MARKER).write_text((made / MARKER).read_text())  # a copied marker: its digest is not this name's
    assert proven_temporary(parent, lookalike.name) is None


# --- item 8: one writer per output, and --force decided at the rename ---------------------


def test_a_second_prepare_of_the_same_output_refuses_in_one_line(tmp_path: Path, capsys):
    out = tmp_path / "m"
    with output_folder.output_lock(out):
        with pytest.raises(OutputBusyError, match=f"another prepare \\(process {os.getpid()}\\) is writing {out} now"):
            prepare(TINY, out, input_shape=SHAPE)
        assert main(["prepare", TINY, "-o", str(out), "--input-shape", "1,3,8,8"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: another prepare") and "\n" not in err
        assert _names(tmp_path) == [".m.layerfit-lock"]
    prepare(TINY, out, input_shape=SHAPE)
    assert _names(tmp_path) == ["m"]  # the lock file goes with its holder


def test_a_bounded_wait_gets_the_lock_once_its_holder_lets_go(tmp_path: Path):
    """What ``layerfit.from_pretrained`` waits with: a blocking flock, given up after
    ``wait`` seconds in one line naming the holder; the command line never waits."""
    out = tmp_path / "m"
    holding = output_folder.output_lock(out)
    holding.__enter__()
    threading.Timer(0.3, holding.__exit__, (None, None, None)).start()
    started = time.monotonic()
    with output_folder.output_lock(out, wait=60):
        assert 0.2 < time.monotonic() - started < 30
        assert _names(tmp_path) == [".m.layerfit-lock"]
        busy = pytest.raises(OutputBusyError, match=f"another prepare \\(process {os.getpid()}\\) is writing")
        with busy, output_folder.output_lock(out, wait=0.2):
            pass
    assert _names(tmp_path) == []
    with output_folder.output_lock(out):  # the waiter that gave up let the lock go
        pass


def test_two_processes_preparing_one_output_never_both_succeed(tmp_path: Path):
    """Started together: one prepares, the other refuses (or, if it began after the first
    finished, finds the output there); never two successes where one replaced the other."""
    out = tmp_path / "m"
    command = [sys.executable, "-m", "layerfit.cli", "prepare", "mobilenet_v2", "-o", str(out), "--input-shape", "1,3,32,32"]
    runs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]  # type: ignore[union-attr]
    assert sorted(code for code, _ in results) == [0, 2], results
    err = next(err for code, err in results if code == 2)
    assert "another prepare" in err or "already exists" in err, err
    read_manifest(out)
    assert _names(tmp_path) == ["m"]


@pytest.mark.parametrize("appeared", ["a folder of the user's", "an empty folder"])
def test_an_output_that_appears_while_prepare_works_is_kept_without_force(tmp_path: Path, monkeypatch, appeared: str):
    out = tmp_path / "m"
    write = writer._write_weights

    def and_meanwhile(*args, **kwargs):
        out.mkdir()
        if appeared != "an empty folder":
            (out / "notes.txt").write_text("mine")
        return write(*args, **kwargs)

    monkeypatch.setattr(writer, "_write_weights", and_meanwhile)
    with pytest.raises(OutputExistsError, match="already exists"):
        prepare(TINY, out, input_shape=SHAPE)
    assert _names(tmp_path) == ["m"]
    assert _names(out) == ([] if appeared == "an empty folder" else ["notes.txt"])


def test_the_rename_never_replaces_an_empty_folder(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    with pytest.raises(FileExistsError):
        output_folder.rename_noreplace(tmp_path / "src", tmp_path / "dst")
    assert _names(tmp_path) == ["dst", "src"]


def test_force_replaces_through_a_marked_old_folder(tmp_path: Path, monkeypatch):
    out = tmp_path / "m"
    prepare(TINY, out, input_shape=SHAPE)
    seen: list[str] = []
    rmtree = output_folder.shutil.rmtree

    def spy(path, *args, **kwargs):
        seen.append(Path(path).name)
        assert proven_temporary(Path(path).parent, Path(path).name) is not None, path
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(output_folder.shutil, "rmtree", spy)
    prepare(TINY, out, input_shape=(1, 3, 16, 16), force=True)
    assert len(seen) == 1 and seen[0].startswith(".m.layerfit-") and seen[0].endswith(".old")
    assert read_manifest(out).input_shape == (1, 3, 16, 16) and _names(tmp_path) == ["m"]
    assert MARKER not in _names(out)


# --- item 11: signals while prepare writes, and what SIGKILL leaves -----------------------


def _prepare_killing_itself(out: Path, signum: int, ignored: bool = False) -> subprocess.CompletedProcess[str]:
    """``prepare`` in a child that sends itself ``signum`` once the weights are written
    (the temporary folder full, before the rename); ``ignored``: with ``signum`` ignored."""
    script = textwrap.dedent(f"""
        import os, signal
        if {ignored}:
            signal.signal({int(signum)}, signal.SIG_IGN)
        from layerfit.store import writer
        write = writer._write_weights
        def then_signal(*args, **kwargs):
            segments = write(*args, **kwargs)
            os.kill(os.getpid(), {int(signum)})
            return segments
        writer._write_weights = then_signal
        writer.prepare("mobilenet_v1_025", {str(out)!r}, input_shape=(1, 3, 32, 32))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                          check=False)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_while_prepare_writes_leaves_nothing(tmp_path: Path, signum: int):
    result = _prepare_killing_itself(tmp_path / "m", signum)
    assert result.returncode == -signum, (result.returncode, result.stderr[-2000:])  # as the signal ends a process
    if signum == signal.SIGINT:  # Python's own handler had its turn: KeyboardInterrupt, and nothing of ours
        assert "KeyboardInterrupt" in result.stderr and "StoppedBySignal" not in result.stderr, result.stderr[-2000:]
    assert _names(tmp_path) == []  # no temporary folder, no lock file


def test_an_ignored_signal_stays_ignored(tmp_path: Path):
    """Under nohup SIGHUP is ignored: prepare must not start honouring it."""
    result = _prepare_killing_itself(tmp_path / "m", signal.SIGHUP, ignored=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert _names(tmp_path) == ["m"]


def test_what_sigkill_leaves_is_reported_elsewhere_and_removed_by_the_next_prepare(tmp_path: Path, capsys):
    result = _prepare_killing_itself(tmp_path / "m", signal.SIGKILL)
    assert result.returncode == -signal.SIGKILL
    left = stale_temporaries(tmp_path)
    assert [t.output for t in left] == ["m"] and left[0].size > 1_000_000
    stale = left[0].path
    capsys.readouterr()
    assert main(["prepare", "mobilenet_v1_025", "-o", str(tmp_path / "other"), "--input-shape", "1,3,32,32"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {stale} (2.1 MB) was left by a prepare of m that was killed: remove it with `rm -r {stale}`" in err
    assert stale.is_dir()
    assert main(["verify", str(tmp_path / "other")]) == 0
    assert f"{stale} (2.1 MB) was left by a prepare of m" in capsys.readouterr().err
    assert main(["prepare", "mobilenet_v1_025", "-o", str(tmp_path / "m"), "--input-shape", "1,3,32,32"]) == 0
    assert f"removed {stale.name} (2.1 MB)" in capsys.readouterr().err
    assert _names(tmp_path) == ["m", "other"]
