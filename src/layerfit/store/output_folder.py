"""The output folder of ``prepare``: what it may replace, how one run holds it, and what
is left beside it.

``prepare`` (:mod:`.writer`) writes a model into a folder beside ``OUT`` and renames it
into place; this module keeps the rules of everything it does beside the output (and
says how much room the output's file system has, :func:`free_space`):

- **what may be replaced** (:func:`check_output_dir`): a new ``OUT``, or with ``force``
  a prepared model or an empty folder — never a file, a link, the working directory
  or a folder holding anything else, which ``--force`` would otherwise delete;
- **one run at a time per output** (:func:`output_lock`): a lock file ``.OUT.layerfit-lock``
  held with ``flock`` for the whole write; a second run refuses in one line (or, given
  a bounded ``wait``, as ``layerfit.from_pretrained`` does for its cache, waits for the
  first with a blocking ``flock``, then refuses in one line if it is still held);
- **the rename decides again** (:func:`replace_dir`): whether ``OUT`` may be replaced is
  checked again under the lock (an ``OUT`` that appeared meanwhile is replaced only with
  ``force``), an existing one is moved into a marked ``.old`` folder first, and the
  rename itself never replaces (``renameat2`` ``RENAME_NOREPLACE``);
- **only what is proven ours is removed** (:func:`make_temporary`,
  :func:`proven_temporary`): every temporary folder (``.OUT.layerfit-DIGEST.tmp``, and
  the ``.old`` one) holds, written first, a marker with a random token whose digest is
  the name's; only a folder proven so, owned by this user, is ever removed, found by
  listing the parent and comparing names as strings (never a glob built from ``OUT``);
- **signals leave nothing** (:func:`stopped_by_signals`): SIGTERM, SIGINT or SIGHUP
  (unless ignored) while it writes removes the temporary folder and the lock, then the
  signal takes its usual course;
- **what SIGKILL leaves is found** (:func:`stale_temporaries`): removed by the next
  ``prepare`` of that output (:func:`remove_stale_temporaries`), and reported with its
  size and how to remove it (:func:`stale_warning`) by ``prepare`` of another output in
  that folder and by ``layerfit verify``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerfit.errors import LayerfitError, OutputExistsError, OutputPathError
from layerfit.sizes import format_bytes
from layerfit.store.manifest import MANIFEST, WEIGHTS

MARKER = ".layerfit-prepare"
"""Written first into every temporary folder ``prepare`` makes: a random token (whose
digest the folder's name carries), the writer's process id and the output's name."""
LOCK = ".layerfit-lock"  # ".OUT" + LOCK beside the output: held with flock while prepare writes OUT
_DIGEST = 16  # hex digits of the token's SHA-256 in a temporary folder's name
_TAIL = re.compile(rf"\.layerfit-([0-9a-f]{{{_DIGEST}}})\.(tmp|old)")
_TAIL_LENGTH = len(".layerfit-") + _DIGEST + len(".tmp")


class OutputBusyError(OutputExistsError):
    """Another ``prepare`` is writing the same output now."""

    def __init__(self, message: str, holder: str = "?") -> None:
        super().__init__(message)
        self.holder = holder  # the process id the lock file names ("?" if unreadable)


class PrepareStoppedError(LayerfitError):
    """A ``prepare`` stopped by a signal whose handler did not end the process."""


def check_output_dir(out: Path, force: bool) -> None:
    """Raise unless ``out`` may become the prepared model: it does not exist, or ``force``
    is given and it is a prepared model (or an empty directory) — never a file, a link,
    the working directory or a folder holding anything else, which ``--force`` would
    otherwise delete."""
    if not (out.exists() or out.is_symlink()):
        ancestor = next((a for a in out.absolute().parents if a.exists()), None)
        if ancestor is not None and not ancestor.is_dir():
            raise OutputPathError(f"cannot create {out}: {ancestor} is a file, not a folder")
        return
    if not force:
        raise OutputExistsError(f"{out} already exists: choose another directory or pass --force")
    refuse = f"{out} is not a prepared model, so --force leaves it alone: choose another directory"
    if out.is_symlink() or not out.is_dir():
        raise OutputExistsError(f"{refuse} (it is {'a link' if out.is_symlink() else 'a file'})")
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise OutputExistsError(f"{refuse} (it is or holds the working directory)")
    try:
        entries = set(os.listdir(out))
    except OSError as exc:
        raise OutputExistsError(f"{out} cannot be listed ({exc.strerror or exc}): choose another directory") from exc
    ours = {MANIFEST, WEIGHTS, MARKER, *_copied_files(out / MANIFEST)}
    if entries and (MANIFEST not in entries or entries - ours):
        foreign = sorted(entries - ours) or [f"no {MANIFEST}"]
        raise OutputExistsError(f"{refuse} (it holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''})")


def _copied_files(manifest: Path) -> set[str]:
    """The files a prepared folder's manifest says prepare copied (none if unreadable)."""
    try:
        files = json.loads(manifest.read_text()).get("files", [])
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return set()
    return {f for f in files if isinstance(f, str) and Path(f).name == f} if isinstance(files, list) else set()


@dataclass(frozen=True)
class Temporary:
    """A temporary folder proven to be one ``prepare`` made (see :func:`proven_temporary`)."""

    path: Path
    output: str  # the name of the output it was made for, beside it
    pid: int  # the process that made it

    @property
    def size(self) -> int:
        """Bytes of the files in it (links not followed)."""
        total = 0
        for root, _, names in os.walk(self.path):
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(root, name))
                    total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        return total


def make_temporary(out: Path, kind: str) -> Path:
    """A new folder ``.OUT.layerfit-DIGEST.KIND`` beside ``out``, private, whose marker
    (written before anything else) proves it ours: :func:`proven_temporary` reads it."""
    while True:
        token = secrets.token_hex(16)
        path = out.parent / f".{out.name}.layerfit-{hashlib.sha256(token.encode()).hexdigest()[:_DIGEST]}.{kind}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        break
    try:
        fd = os.open(path / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"token": token, "pid": os.getpid(), "output": out.name}, fh)
    except BaseException:  # never leave a folder that cannot be proven ours
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def proven_temporary(parent: Path, name: str) -> Temporary | None:
    """The temporary folder ``name`` in ``parent`` if ``prepare`` made it, else None: a
    folder (not a link) owned by this user, named ``.OUT.layerfit-DIGEST.tmp|old`` (the
    fixed tail matched, ``OUT`` taken as a plain string), holding a marker that is a
    regular file of this user whose token's digest is ``DIGEST`` and whose output is ``OUT``."""
    match = _TAIL.fullmatch(name[-_TAIL_LENGTH:])
    if not name.startswith(".") or len(name) <= _TAIL_LENGTH + 1 or match is None:
        return None
    output, path = name[1:-_TAIL_LENGTH], parent / name
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            mst = os.fstat(fd)
            if not stat.S_ISREG(mst.st_mode) or mst.st_uid != os.getuid() or mst.st_size > 4096:
                return None
            data = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    token, pid = data.get("token"), data.get("pid")
    if not isinstance(token, str) or not isinstance(pid, int) or data.get("output") != output:
        return None
    if hashlib.sha256(token.encode()).hexdigest()[:_DIGEST] != match.group(1):
        return None
    return Temporary(path, output, pid)


def stale_temporaries(parent: Path) -> list[Temporary]:
    """The temporary folders in ``parent`` that ``prepare`` made and whose writer is gone
    (killed with SIGKILL, or the machine lost power): only folders proven ours."""
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    found = (proven_temporary(parent, name) for name in names)
    return [t for t in found if t is not None and _gone(t.pid)]


def stale_warning(t: Temporary) -> str:
    """One line naming a stale temporary folder, its size and how to remove it."""
    return (
        f"{t.path} ({format_bytes(t.size)}) was left by a prepare of {t.output} that was killed: remove it with "
        f"`rm -r {shlex.quote(str(t.path))}`, or prepare {t.output} again"
    )


def remove_stale_temporaries(out: Path) -> None:
    """With ``out``'s lock held: remove the temporary folders an interrupted ``prepare``
    of ``out`` left (no live writer can own one: it would hold the lock), with a warning
    naming what was freed; warn of those left for other outputs in the same folder."""
    try:
        names = sorted(os.listdir(out.parent))
    except OSError:
        return
    for name in names:
        t = proven_temporary(out.parent, name)
        if t is None:
            continue
        if t.output == out.name:
            size = t.size
            shutil.rmtree(t.path, ignore_errors=True)
            warnings.warn(f"removed {name} ({format_bytes(size)}), left in {out.parent} by an interrupted prepare",
                          stacklevel=4)
        elif _gone(t.pid):
            warnings.warn(stale_warning(t), stacklevel=4)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` (a temporary folder's writer) no longer runs; this
    process's own folders are in use (another thread writes another output)."""
    return pid != os.getpid() and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def output_lock(out: Path, *, wait: float = 0.0, lock: str = LOCK) -> Iterator[None]:
    """Hold ``.OUT`` + ``lock`` beside ``out`` (flock, exclusive) for the block; the file is
    removed on release. Held by another process, it is refused in one line
    (:class:`OutputBusyError`, naming that process) at once, or with ``wait`` after
    waiting for it at most ``wait`` seconds (a blocking flock: nothing polls)."""
    path = out.parent / f".{out.name}{lock}"
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise OutputPathError(f"cannot create {out}: {exc.strerror or exc} (choose another directory)") from None
        try:
            locked = _flock_within(fd, deadline - time.monotonic())
        except OSError as exc:
            os.close(fd)
            raise OutputPathError(f"cannot lock {path}: {exc.strerror or exc}") from None
        except BaseException:
            os.close(fd)
            raise
        if not locked:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputBusyError(
                f"another prepare (process {holder}) is writing {out} now: wait for it to finish, or choose "
                "another directory",
                holder,
            )
        with contextlib.suppress(OSError):  # the holder before us removed it as we opened it: again
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _flock_within(fd: int, seconds: float) -> bool:
    """Lock ``fd`` (flock, exclusive), waiting at most ``seconds`` for its holder; whether
    it is locked. Another error than the lock being held is raised."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
    return seconds > 0 and _FlockWaiter(fd).within(seconds)


class _FlockWaiter:
    """A blocking flock of ``fd``'s open file (through a duplicate: the lock is the open
    file's, so ``fd`` holds it too) in a thread of its own, waited for with a timeout.
    Given up, the thread lets the lock go as soon as it gets it."""

    def __init__(self, fd: int) -> None:
        self._fd = os.dup(fd)
        self._guard = threading.Lock()
        self._done = threading.Event()
        self._given_up = False
        self._error: OSError | None = None
        threading.Thread(target=self._lock, name="layerfit-lock-wait", daemon=True).start()

    def _lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError as exc:
            self._error = exc
        with self._guard:
            if self._given_up and self._error is None:  # nobody waits for it any more
                with contextlib.suppress(OSError):
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._done.set()

    def within(self, seconds: float) -> bool:
        """Whether the lock was got within ``seconds`` (an interrupt gives it up too)."""
        try:
            self._done.wait(seconds)
        finally:
            with self._guard:
                self._given_up = not self._done.is_set()
        if self._given_up:
            return False
        if self._error is not None:
            raise self._error
        return True


class StoppedBySignal(BaseException):
    """Raised in the main thread by a signal that stops ``prepare`` while it writes."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """While the block writes: SIGTERM, SIGINT or SIGHUP raises inside it (so its cleanup
    runs: the temporary folder and the lock are removed), then the handler that was
    there before gets the signal (the default one ends the process as the signal does).
    A second signal during the cleanup is ignored. Only in the main thread (where
    Python runs handlers); elsewhere the block runs as it is. The caller catches
    :class:`StoppedBySignal` and raises :func:`signalled` outside its except block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    stopping: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        if not stopping:
            stopping.append(signum)
            raise StoppedBySignal(signum)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        previous.clear()

    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_IGN:  # ignored (nohup): it stays ignored
            continue
        with contextlib.suppress(OSError, ValueError):
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        restore()


def signalled(signum: int) -> PrepareStoppedError:
    """Give ``signum`` to the handler that was there before ``prepare`` (the default ends
    the process as the signal does; Python's SIGINT handler raises KeyboardInterrupt);
    the error to raise where that handler returns. Called outside any except block, so
    what the handler raises carries nothing of ``prepare``'s."""
    signal.raise_signal(signum)
    return PrepareStoppedError(f"prepare was stopped by {signal.Signals(signum).name}: nothing was kept")


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` only if ``dst`` does not exist, atomically where the
    kernel can (renameat2 RENAME_NOREPLACE; a plain rename would replace an empty folder)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), str(dst))
    if dst.exists() or dst.is_symlink():  # no renameat2 here: checked, then renamed
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def replace_dir(tmp: Path, out: Path, force: bool) -> None:
    """Move ``tmp`` to ``out``, with the output's lock held: whether ``out`` may be
    replaced is checked again here (it may have appeared while ``tmp`` was written), an
    existing one is moved into a marked ``.old`` folder first, and the rename never
    replaces what it finds."""
    check_output_dir(out, force)
    trash = None
    if out.exists() or out.is_symlink():
        trash = make_temporary(out, "old")
        os.rename(out, trash / "old")
    try:
        rename_noreplace(tmp, out)
    except FileExistsError:
        raise OutputExistsError(
            f"{out} appeared while prepare was writing it: it was left as it is and nothing was kept "
            "(pass --force to replace it)"
        ) from None
    with contextlib.suppress(OSError):
        os.unlink(out / MARKER)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_space(out: Path) -> int | None:
    """Free bytes on the file system ``out`` will be written to (its nearest existing folder)."""
    for folder in (out.absolute().parent, *out.absolute().parent.parents):
        if folder.is_dir():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None

