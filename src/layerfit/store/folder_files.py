"""A model folder's files, each opened only where it really lies: inside the folder.

A model folder is data from someone else. A file of it that is a link (or a link's
target swapped in later) could make layerfit read, and ``prepare`` copy into a folder
others may read, any file this user can read, such as a system password file. So every
file of a Hugging Face folder (its config, tokenizer, index and weights) is opened
through :class:`FolderFiles`, by these rules:

- a file resolving outside the folder is refused (:class:`LinkOutOfFolderError`, one
  line naming where it points) unless the caller opts in (``--follow-symlinks-out``);
  a Hub cache snapshot's links to its repository's ``blobs`` are inside;
- what was opened is checked, not the name: the kernel says where the open descriptor
  really is, so a link swapped after a check is caught;
- only regular files: a FIFO or a device is refused without waiting on it;
- a file read whole has a size limit, and JSON goes through
  :func:`layerfit.strict_json.parse` (one line for any breakage).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from layerfit import strict_json
from layerfit.errors import InputError

FOLLOW_OPTION = "--follow-symlinks-out"
"""The command-line flag that lets a folder's links point outside it."""


class LinkOutOfFolderError(InputError):
    """A file of a model folder that is a link resolving outside the folder: layerfit
    would otherwise read (and ``prepare`` copy) whatever it points at, such as a system
    password file, into a folder others may read."""


class FolderFiles:
    """The files of a model folder, each opened only where it really lies inside the
    folder (or, for a Hugging Face cache snapshot, in its repository's ``blobs``).

    ``follow_links_out`` opts in to links that lead elsewhere (a folder assembled from
    links to a shared store); without it such a link is a :class:`LinkOutOfFolderError`
    naming the file and where it points.
    """

    def __init__(self, folder: Path, follow_links_out: bool = False) -> None:
        self.folder = folder
        self.follow_links_out = follow_links_out
        root = folder.resolve()
        self.roots = [root]
        # The Hub's cache: models--ORG--NAME/snapshots/REV/FILE links to ../../blobs/HASH.
        repo = root.parent.parent
        blobs = repo / "blobs"
        if root.parent.name == "snapshots" and "--" in repo.name and blobs.is_dir() and not blobs.is_symlink():
            self.roots.append(blobs)

    def open(self, name: str) -> int:
        """A read-only descriptor of the folder's regular file ``name``: a FIFO or device
        is refused without waiting on it, a link out of the folder unless opted in."""
        path = self.folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputError(f"{path} is not a regular file")
            where = self.where(fd, path)
            if not self.follow_links_out and not any(where.is_relative_to(r) for r in self.roots):
                raise LinkOutOfFolderError(
                    f"{path} is a link to {where}, outside the folder: layerfit reads only the folder's own "
                    f"files (copy that file into the folder, or pass {FOLLOW_OPTION} if you trust where it points)"
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def where(fd: int, path: Path) -> Path:
        """Where the open file ``fd`` lies: the kernel's answer (Linux), else ``path`` resolved."""
        try:
            return Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            return path.resolve()

    def read(self, name: str, limit: int) -> tuple[bytes, os.stat_result]:
        """The bytes of the folder's file ``name`` (at most ``limit``: a larger file is an
        error) and its status (its permission bits bound the copy's)."""
        fd = self.open(name)
        try:
            st = os.fstat(fd)
            if st.st_size > limit:
                raise InputError(f"{self.folder / name} is {st.st_size:,} bytes, more than the {limit:,} it may have")
            chunks, left = [], limit + 1
            while left > 0:
                chunk = os.read(fd, min(left, 2**20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as exc:
            raise InputError(f"cannot read {self.folder / name}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if len(data) > limit:
            raise InputError(f"{self.folder / name} is more than the {limit:,} bytes it may have")
        return data, st

    def json(self, name: str, limit: int = 64 * 2**20) -> Any:
        """The folder's JSON file ``name`` through :func:`layerfit.strict_json.parse`:
        one line for anything that is not a JSON document of sane depth."""
        raw, _ = self.read(name, limit)
        try:
            return strict_json.parse(raw, str(self.folder / name), limit)
        except strict_json.JSONTextError as exc:
            raise InputError(str(exc)) from None
