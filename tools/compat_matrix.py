"""The compatibility matrix: the built wheel, installed (not editable) beside a given
torch, on the oldest and newest Python, and as the light core alone.

``make test-compat`` runs it after ``make test``. Each leg is a fresh virtual
environment holding a torch installed first, as a vendor's would be (NVIDIA's on a
Jetson); then the wheel with its extras goes in, constrained by the leg's lock for
everything but torch, and the leg fails if pip touched that torch. Then the leg runs
its marked subset of the suite against the installed package:

* ``oldest``: Python 3.10 (a Jetson's JetPack 6) and the oldest torch in the range,
  every extra, ``-m compat``;
* ``newest``: Python 3.13 and the newest torch on the index, every extra, ``-m compat``;
* ``core``: Python 3.11 and the tested torch, no extra at all, ``-m core`` (the missing-
  extra messages with the packages really absent).

A leg's environment is kept under ``$LAYERFIT_COMPAT_CACHE`` (default
``~/.cache/layerfit/compat``) and reused while its lock, the interpreter and the wheel's
requirements are unchanged; only the wheel is reinstalled then. Interpreters are
found as ``--python VERSION=PATH`` or ``$LAYERFIT_PYTHON3_10`` (and so on), then
pyenv's, then ``pythonX.Y`` on ``PATH``.

``--relock`` resolves each leg afresh and writes its lock (``requirements/compat-*.lock``).
The results go to ``build/compat/report.json`` and ``build/compat/report.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "build" / "compat" / "dist"
REPORT = ROOT / "build" / "compat"
TEST_TOOLS = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100"]
SERVE_TEST_TOOLS = ["httpx>=0.27", "tritonclient[http]>=2.40"]


@dataclass(frozen=True)
class Leg:
    name: str
    python: str  # "3.10"
    torch: str  # the vendor's torch, installed first
    extras: str  # "" for the core, "all"
    marker: str  # the pytest marker the leg runs
    tests: tuple[str, ...]  # where pytest collects (the core leg cannot import the rest)
    pins: tuple[str, ...] = ()  # what the resolver cannot know, for --relock

    @property
    def lock(self) -> Path:
        return ROOT / "requirements" / f"compat-{self.name}.lock"


LEGS = (
    # transformers 5 disables its models below torch 2.6 without saying so in its metadata
    Leg("oldest", "3.10", "2.5.1", "all", "compat", ("tests",), pins=("transformers<5",)),
    Leg("newest", "3.13", "2.15.0", "all", "compat", ("tests",)),
    Leg("core", "3.11", "2.13.0", "", "core", ("tests/install", "tests/engine/test_zoo_streaming.py")),
)


@dataclass
class LegResult:
    leg: str
    python: str = ""
    torch: str = ""
    extras: str = ""
    reused_env: bool = False
    torch_left_alone: bool = False
    install_s: float = 0.0
    test_s: float = 0.0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.failed == 0 and self.errors == 0 and self.passed > 0


class MatrixError(Exception):
    """A leg that cannot be set up; the message says what to do."""


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT, log: Path | None = None) -> str:
    """Run ``cmd``; its output goes to ``log`` (appended) and is returned."""
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    output = result.stdout + result.stderr
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{output}\n")
    if result.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise MatrixError(f"`{' '.join(cmd)}` failed ({result.returncode}):\n{tail}")
    return output


def pip_env() -> dict[str, str]:
    """pip's environment for the legs: no machine-wide cap on torch (a leg pins its own;
    some machines cap torch below the newest release), no version check."""
    env = dict(os.environ)
    env["PIP_CONSTRAINT"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PYTHONPATH", None)
    return env


def find_python(version: str, given: dict[str, str]) -> Path:
    """The interpreter for ``version``: given, from the environment, pyenv's, on PATH."""
    env_name = f"LAYERFIT_PYTHON{version.replace('.', '_')}"
    candidates: list[str | None] = [given.get(version), os.environ.get(env_name)]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    versions = sorted(
        (p for p in (pyenv_root / "versions").glob(f"{version}.*") if (p / "bin" / "python").exists()),
        key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()],
    )
    candidates += [str(p / "bin" / "python") for p in reversed(versions)]
    candidates.append(shutil.which(f"python{version}"))
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return Path(candidate)
    raise MatrixError(
        f"no Python {version} found: install it (pyenv install {version}) or point at one with "
        f"`make test-compat PYTHONS='{version}=/path/to/python{version}'` or ${env_name}"
    )


def build_distributions(log: Path) -> Path:
    """Build the wheel and the sdist, check them with twine; the wheel's path."""
    shutil.rmtree(DIST, ignore_errors=True)
    run([sys.executable, "-m", "build", "--outdir", str(DIST), str(ROOT)], log=log)
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, DIST.iterdir())], log=log)
    wheel = next(DIST.glob("layerfit-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    stray = [n for n in names if n.split("/")[0] in ("tests", "bench", "tools", "requirements")]
    if stray:
        raise MatrixError(f"the wheel carries files that are not the library: {stray[:5]}")
    return wheel


def install_requirements(wheel: Path) -> bytes:
    """The wheel's Requires-Python and Requires-Dist lines but the test, docs and bench extras':
    what pip resolves for a user, and nothing else of pyproject.toml (tool settings)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode().splitlines()
    kept = [line for line in lines if line.startswith(("Requires-Python:", "Requires-Dist:"))
            and not any(f'extra == "{extra}"' in line for extra in ("test", "docs", "bench"))]
    return "\n".join(kept).encode()


def env_key(leg: Leg, python: Path, wheel: Path) -> str:
    """What the leg's environment depends on: its lock, the wheel's requirements, the
    interpreter, the torch and the extras; a new wheel of the same requirements reuses it."""
    version = run([str(python), "-c", "import sys; print(sys.version)"])
    digest = hashlib.sha256()
    for part in (leg.lock.read_bytes() if leg.lock.exists() else b"", install_requirements(wheel),
                 version.encode(), leg.torch.encode(), leg.extras.encode(), " ".join(TEST_TOOLS + SERVE_TEST_TOOLS).encode()):
        digest.update(part)
    return digest.hexdigest()[:16]


def lock_without_torch(leg: Leg, directory: Path) -> Path:
    """The leg's lock less torch: the vendor's torch is already there and must stay."""
    lines = [line for line in leg.lock.read_text().splitlines() if not line.lower().startswith("torch==")]
    path = directory / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def torch_version(python: Path) -> str:
    return run([str(python), "-c", "import torch; print(torch.__version__)"]).strip().splitlines()[-1]


def prepare_env(leg: Leg, python: Path, wheel: Path, cache: Path, relock: bool, result: LegResult, log: Path) -> Path:
    """The leg's environment with the vendor's torch and the wheel; its python."""
    key = env_key(leg, python, wheel)
    venv = cache / f"{leg.name}-py{leg.python}-torch{leg.torch}-{key}"
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q"]
    extras = f"[{leg.extras}]" if leg.extras else ""
    tools = TEST_TOOLS + (SERVE_TEST_TOOLS if leg.extras else [])
    stamp = venv / ".layerfit-compat"
    if not relock and stamp.exists() and stamp.read_text() == key:
        result.reused_env = True
        run([*pip, "--force-reinstall", "--no-deps", str(wheel)], env=pip_env(), log=log)
    else:
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        run([str(python), "-m", "venv", str(venv)], log=log)
        # the vendor's torch first, alone
        run([*pip, f"torch=={leg.torch}"], env=pip_env(), log=log)
        constraints: list[str] = []
        if not relock:
            if not leg.lock.exists():
                raise MatrixError(f"{leg.lock.relative_to(ROOT)} is missing: run `make lock-compat`")
            constraints = ["-c", str(lock_without_torch(leg, venv))]
        pins = list(leg.pins) if relock else []
        run([*pip, *constraints, f"{wheel}{extras}", *tools, *pins], env=pip_env(), log=log)
        if relock:
            frozen = run([str(py), "-m", "pip", "freeze", "--exclude-editable"], env=pip_env())
            lines = [line for line in frozen.splitlines() if line and not line.startswith(("layerfit", "-e"))]
            header = (f"# `make test-compat` leg {leg.name}: Python {leg.python}, torch {leg.torch}, "
                      f"layerfit{extras}; written by `make lock-compat`.\n")
            leg.lock.write_text(header + "\n".join(lines) + "\n")
            key = env_key(leg, python, wheel)
            renamed = cache / f"{leg.name}-py{leg.python}-torch{leg.torch}-{key}"
            shutil.rmtree(renamed, ignore_errors=True)
            venv.rename(renamed)
            venv, py, stamp = renamed, renamed / "bin" / "python", renamed / ".layerfit-compat"
        stamp.write_text(key)
    run([str(py), "-m", "pip", "check"], env=pip_env(), log=log)
    installed = torch_version(py)
    result.torch = installed
    result.torch_left_alone = installed.split("+")[0] == leg.torch
    if not result.torch_left_alone:
        result.problems.append(f"pip replaced the vendor's torch {leg.torch} with {installed}")
    return py


def run_tests(leg: Leg, py: Path, result: LegResult, log: Path) -> None:
    junit = REPORT / f"junit-{leg.name}.xml"
    env = pip_env()
    env["LAYERFIT_COMPAT_LEG"] = leg.name
    env["LAYERFIT_COMPAT_TORCH"] = leg.torch
    cmd = [str(py), "-m", "pytest", "-m", leg.marker, "-p", "no:cacheprovider", f"--junitxml={junit}", *leg.tests]
    completed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{completed.stdout}{completed.stderr}\n")
    if not junit.exists():
        result.problems.append(f"pytest wrote no report (exit {completed.returncode}); see {log}")
        return
    suite = ElementTree.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total = int(suite.get("tests", 0))
    result.failed = int(suite.get("failures", 0))
    result.errors = int(suite.get("errors", 0))
    result.skipped = int(suite.get("skipped", 0))
    result.passed = total - result.failed - result.errors - result.skipped
    if completed.returncode not in (0,):
        tail = "\n".join(completed.stdout.strip().splitlines()[-20:])
        result.problems.append(f"pytest exit {completed.returncode}:\n{tail}")


def markdown(results: list[LegResult], wheel: str) -> str:
    rows = [
        "| leg | Python | torch (left alone) | extras | env | install s | tests s | passed | failed | skipped |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows.append(
            f"| {r.leg} | {r.python} | {r.torch} ({'yes' if r.torch_left_alone else 'NO'}) | {r.extras or 'none'} "
            f"| {'reused' if r.reused_env else 'new'} | {r.install_s:.0f} | {r.test_s:.0f} | {r.passed} | "
            f"{r.failed + r.errors} | {r.skipped} |"
        )
    return f"Compatibility matrix for {wheel}\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--legs", default=",".join(leg.name for leg in LEGS), help="comma list of legs to run")
    parser.add_argument("--python", action="append", default=[], metavar="VERSION=PATH",
                        help="the interpreter for a Python version, e.g. 3.10=/usr/bin/python3.10")
    parser.add_argument("--relock", action="store_true", help="resolve each leg afresh and write its lock")
    args = parser.parse_args(argv)
    given = dict(item.split("=", 1) for item in args.python if "=" in item)
    for value in os.environ.get("PYTHONS", "").split():
        version, _, path = value.partition("=")
        given.setdefault(version, path)
    chosen = [leg for leg in LEGS if leg.name in args.legs.split(",")]
    cache = Path(os.environ.get("LAYERFIT_COMPAT_CACHE", Path.home() / ".cache" / "layerfit" / "compat"))
    REPORT.mkdir(parents=True, exist_ok=True)
    log = REPORT / "compat.log"
    log.write_text("")
    try:
        wheel = build_distributions(log)
    except MatrixError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"built {wheel.name} and its sdist; twine check passed; the wheel holds the library only", flush=True)
    results: list[LegResult] = []
    for leg in chosen:
        result = LegResult(leg.name, python=leg.python, extras=leg.extras)
        results.append(result)
        print(f"[{leg.name}] Python {leg.python}, torch {leg.torch}, extras: {leg.extras or 'none'} ...", flush=True)
        try:
            python = find_python(leg.python, given)
            start = time.perf_counter()
            py = prepare_env(leg, python, wheel, cache, args.relock, result, log)
            result.install_s = time.perf_counter() - start
            start = time.perf_counter()
            run_tests(leg, py, result, log)
            result.test_s = time.perf_counter() - start
        except MatrixError as exc:
            result.problems.append(str(exc))
        status = "ok" if result.ok else "FAILED"
        print(f"[{leg.name}] {status}: {result.passed} passed, {result.failed + result.errors} failed, "
              f"{result.skipped} skipped (torch {result.torch or '?'}; install {result.install_s:.0f} s, "
              f"tests {result.test_s:.0f} s)", flush=True)
        for problem in result.problems:
            print(f"  {problem}", file=sys.stderr)
    table = markdown(results, wheel.name)
    (REPORT / "report.md").write_text(table)
    (REPORT / "report.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    print(table)
    passed = sum(r.passed for r in results)
    failed = sum(r.failed + r.errors for r in results)
    print(f"compat: {passed} passed, {failed} failed")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
