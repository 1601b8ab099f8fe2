"""The container's entry point: ``layerfit serve`` on the models the pod was given, within
the container's own memory limit.

The image runs ``python /opt/layerfit/entrypoint.py [--model-dir DIR] [--model-name NAME]
[serve options...]``; everything it does not read itself is handed to ``layerfit serve``
unchanged, after these rules (each can be overridden by giving the option yourself):

* **The models.** ``--model-dir`` (or ``$LAYERFIT_MODEL_DIR``), else KServe's
  storage-initializer path ``/mnt/models`` where it exists, else ``/models`` (a mounted
  volume). A folder of prepared models (one sub-folder each) is served as the repository.
  A folder that *is* one prepared model (its ``manifest.json`` at the top: what KServe's
  storage initializer leaves when ``storageUri`` names one model) is served under
  ``--model-name`` (KServe passes the InferenceService's name), through a repository made
  in a writable temporary folder (its weights linked, its small files copied): the
  mounted folder is only read.
* **The memory.** ``--memory-limit`` is the container's own memory limit, read from this
  process's cgroup (:func:`layerfit.memory_limit.cgroup_limit_bytes`), so the server
  measures its footprint and gives the weights what the limit leaves; no limit set (or
  ``$LAYERFIT_MEMORY_LIMIT=off``): the server's ``--budget`` alone. ``$LAYERFIT_MEMORY_LIMIT``
  may also name a size (``1500MB``).
* **The cores.** ``--threads`` is the container's CPU limit (its cgroup's CPU quota over
  its period, rounded down, at least 1): PyTorch would otherwise start one thread per core
  of the *node* and a pod limited to 2 CPUs would run 64 threads on them. No quota: the
  server's default.
* **The network.** ``--host 0.0.0.0 --port $PORT`` (8080, KServe's default port).

It then *replaces itself* with the server (``exec``): the server is the container's main
process, receives SIGTERM itself and drains (``--shutdown-grace``) before it exits, and
no wrapper outlives or outwaits it. A bad setting is one line on stderr and exit status 2,
as the ``layerfit`` command does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

KSERVE_MODEL_DIR = Path("/mnt/models")  # where KServe's storage initializer puts storageUri
VOLUME_MODEL_DIR = Path("/models")  # the image's mount point for a plain volume
MANIFEST = "manifest.json"  # a prepared model's top file (layerfit.store.manifest.MANIFEST)
DEFAULT_PORT = "8080"
CGROUP_ROOT = Path("/sys/fs/cgroup")  # the container's own cgroups (a namespace or a mount)
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # the runtime's model names


class SettingError(Exception):
    """A setting of the entry point that cannot work: one line for the pod's log."""


def split_arguments(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The entry point's own options (``--model-dir``, ``--model-name``) and the rest,
    which are ``layerfit serve``'s, in their order."""
    own: dict[str, str] = {}
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        name, equals, value = item.partition("=")
        if name in ("--model-dir", "--model-name"):
            if not equals:
                value = next(items, "")
            if not value:
                raise SettingError(f"{name} needs a value")
            own[name] = value
        else:
            rest.append(item)
    return own, rest


def given(options: list[str], name: str) -> bool:
    """Whether ``layerfit serve``'s option ``name`` is among ``options``."""
    return any(item == name or item.startswith(name + "=") for item in options)


def model_directory(own: dict[str, str], environ: dict[str, str]) -> Path:
    """The folder the pod was given: the option, the environment, KServe's path, the volume."""
    chosen = own.get("--model-dir") or environ.get("LAYERFIT_MODEL_DIR")
    if chosen:
        return Path(chosen)
    return KSERVE_MODEL_DIR if KSERVE_MODEL_DIR.is_dir() else VOLUME_MODEL_DIR


def repository_for(directory: Path, name: str | None, workspace: Path) -> Path:
    """The repository to serve: ``directory`` itself, or, where it is one prepared model,
    a folder in ``workspace`` holding it as sub-folder ``name``: its weights file linked
    (it may be gigabytes, and is only read), every other file copied (the server reads a
    tokenizer's files only where they really lie, and a model folder only inside its
    repository, so neither a linked folder nor linked tokenizer files would serve)."""
    if not directory.is_dir():
        raise SettingError(
            f"model folder {directory} does not exist: mount prepared models there, or give --model-dir"
        )
    if not (directory / MANIFEST).is_file():
        return directory
    if not name:
        raise SettingError(f"{directory} is one prepared model: give its name with --model-name")
    if not NAME_PATTERN.fullmatch(name):
        raise SettingError(
            f"invalid model name {name!r}: letters, digits, '.', '_', '-', starting with a letter or digit"
        )
    weights = weights_file(directory)
    repository = workspace / "layerfit-repository"
    shutil.rmtree(repository, ignore_errors=True)  # what a previous start of this container left
    (repository / name).mkdir(parents=True)
    for entry in directory.iterdir():
        target = repository / name / entry.name
        if entry.name == weights:
            target.symlink_to(entry.absolute())
        elif entry.is_dir():
            shutil.copytree(entry, target)
        else:
            shutil.copy2(entry, target)
    return repository


def weights_file(directory: Path) -> str:
    """The name of a prepared model's weights file, from its manifest."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        return str(manifest["weights"]["file"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SettingError(f"{directory / MANIFEST} is not a prepared model's manifest: {error}") from None


def memory_limit(environ: dict[str, str]) -> str | None:
    """``--memory-limit``'s value: the container's cgroup limit (``auto``, the default),
    a size, or none (``off``, or no limit set on the container)."""
    asked = environ.get("LAYERFIT_MEMORY_LIMIT", "auto").strip()
    if asked.lower() == "off":
        return None
    if asked.lower() != "auto":
        return asked
    from layerfit.memory_limit import cgroup_limit_bytes

    found = cgroup_limit_bytes()
    return None if found is None else f"{found[0]}B"


def cpu_limit(cgroup_root: Path | None = None) -> int | None:
    """The container's CPU limit in whole cores (at least 1), from its cgroup's quota:
    v2's ``cpu.max`` (``QUOTA PERIOD`` or ``max``) or v1's ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us`` (-1: none). Inside a container both lie at the root of the
    container's own cgroup mount. None where no quota is set."""
    cgroup_root = CGROUP_ROOT if cgroup_root is None else cgroup_root
    try:
        quota_text, _, period_text = (cgroup_root / "cpu.max").read_text().partition(" ")
    except OSError:
        try:
            quota_text = (cgroup_root / "cpu" / "cpu.cfs_quota_us").read_text()
            period_text = (cgroup_root / "cpu" / "cpu.cfs_period_us").read_text()
        except OSError:
            return None
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:  # "max": no quota
        return None
    return None if quota <= 0 or period <= 0 else max(1, quota // period)


def serve_command(argv: list[str], environ: dict[str, str], workspace: Path) -> list[str]:
    """The ``layerfit serve`` command line the container runs (without the interpreter)."""
    own, rest = split_arguments(argv)
    command = ["serve"]
    if not given(rest, "--repository"):
        directory = model_directory(own, environ)
        command += ["--repository", str(repository_for(directory, own.get("--model-name"), workspace))]
    if not given(rest, "--memory-limit"):
        limit = memory_limit(environ)
        if limit is not None:
            command += ["--memory-limit", limit]
    if not given(rest, "--threads"):
        cores = cpu_limit()
        if cores is not None:
            command += ["--threads", str(cores)]
    if not given(rest, "--host"):
        command += ["--host", "0.0.0.0"]
    if not given(rest, "--port"):
        command += ["--port", environ.get("PORT", DEFAULT_PORT)]
    return command + rest


def main(argv: list[str] | None = None) -> int:
    """Build the command line and become the server; a bad setting is one line, status 2."""
    environ = dict(os.environ)
    try:
        command = serve_command(sys.argv[1:] if argv is None else argv, environ, Path(tempfile.gettempdir()))
    except SettingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("layerfit entrypoint: layerfit " + " ".join(command), file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "layerfit.cli", *command])
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main())
