"""The image's entry point run as the image runs it under KServe: the same command line
(the Containerfile's ENTRYPOINT with the ClusterServingRuntime's arguments), on one
prepared model where the storage initializer would have put it, inside a memory cgroup
as a container's. Its probes answer on the paths the runtime declares, it reads its
memory limit from the cgroup, and SIGTERM with a request in flight answers the request
and ends the process within the grace period the InferenceService declares.

The image's user (uid 10001) is used where this interpreter can run as that user; a
virtual environment under a private home (as here, /root) cannot, and then the test runs
as the current user and says so in its output."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from deploy_files import RUNTIME, SERVICE, container, kserve_command, manifest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # cgroups.py, tinymodels.py (tests/), as the other tests import them
import cgroups  # noqa: E402

from layerfit.store import ModelSpec, prepare  # noqa: E402

NAME = "mobilenet"  # the InferenceService's name, as KServe puts it for {{.Name}}
SLEEPY = {"widths": [4, 4, 4], "delays": [1.0, 1.0]}  # 2 s a request: one is in flight at SIGTERM
LIMIT = 1024 * 1024 * 1024  # the container's memory limit
IMAGE_UID = 10001


def _runs_as(uid: int) -> bool:
    """Whether this interpreter and the tests' modules can run as ``uid`` (root only)."""
    if os.geteuid() != 0:
        return False
    try:
        probe = subprocess.run([sys.executable, "-c", "import layerfit, tinymodels"], capture_output=True,
                               env=_env(), preexec_fn=lambda: _become(uid), timeout=120)
    except OSError:  # the interpreter itself is out of its reach
        return False
    return probe.returncode == 0


def _become(uid: int) -> None:
    os.setgid(uid)
    os.setuid(uid)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS), "LAYERFIT_TRUST_FACTORY": "tinymodels",
            "LAYERFIT_MEMORY_LIMIT": "auto"}


class Pod:
    """The entry point's process and what it printed, read on a thread."""

    def __init__(self, command: list[str], cgroup: cgroups.MemoryCgroup | None, uid: int | None,
                 workdir: Path) -> None:
        def start() -> None:
            if cgroup is not None:
                (cgroup.path / "cgroup.procs").write_text(str(os.getpid()))
            if uid is not None:
                _become(uid)

        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**_env(), "TMPDIR": str(workdir)}, cwd=workdir, preexec_fn=start)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def url(self) -> str:
        """The server's URL once it serves (its one line saying so), on loopback."""
        while True:
            try:
                line = self.lines.get(timeout=300)
            except queue.Empty:
                raise AssertionError("no 'serving' line:\n" + "".join(self.output)) from None
            found = re.search(r"at http://[^:]+:(\d+)/v2", line)
            if found:
                return f"http://127.0.0.1:{found.group(1)}"
            assert self.process.poll() is None, "".join(self.output)


@pytest.fixture(scope="module")
def pod() -> Iterator[tuple[Pod, str, cgroups.MemoryCgroup | None]]:
    """The entry point serving one prepared model from /mnt/models' stand-in (in a folder
    of /tmp every user may enter, so the image's user can read the model)."""
    root = Path(tempfile.mkdtemp(prefix="layerfit-pod-"))
    try:
        os.chmod(root, 0o755)
        model = root / "mnt-models"
        prepare(ModelSpec("factory", "tinymodels:chain", SLEEPY), model, input_shape=(1, 4))
        workdir = root / "tmp"  # the container's /tmp: where the entry point builds its repository
        workdir.mkdir()
        uid = IMAGE_UID if _runs_as(IMAGE_UID) else None
        if uid is not None:
            os.chown(workdir, uid, uid)
        print(f"entry point runs as uid {os.geteuid() if uid is None else uid}")
        command = kserve_command(manifest(RUNTIME), sys.executable, model, NAME)
        with (cgroups.memory_cgroup(LIMIT) if cgroups.unavailable() is None else _nothing()) as cgroup:
            running = Pod(command, cgroup, uid, workdir)
            try:
                yield running, running.url(), cgroup
            finally:
                if running.process.poll() is None:
                    running.process.kill()
                    running.process.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _probe(url: str, probe: dict) -> httpx.Response:
    return httpx.get(url + probe["httpGet"]["path"].replace("{{.Name}}", NAME), timeout=30)


def test_the_probes_answer_on_the_runtimes_paths(pod) -> None:
    running, url, _ = pod
    serving = container(manifest(RUNTIME))
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        answer = _probe(url, serving[probe])
        assert answer.status_code == 200, (probe, answer.text)
    assert httpx.get(f"{url}/v2/models/{NAME}", timeout=30).json()["name"] == NAME


def test_the_memory_limit_is_the_containers_and_metrics_say_so(pod) -> None:
    running, url, cgroup = pod
    metrics = httpx.get(url + manifest(RUNTIME)["spec"]["annotations"]["prometheus.kserve.io/path"], timeout=30).text
    said = "".join(running.output)
    if cgroup is None:
        assert "--memory-limit" not in said  # no limit on this "container": the budget alone
        pytest.skip(cgroups.unavailable() or "")
    assert f"--memory-limit {LIMIT}B" in said
    gauges = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("layerfit_memory_limit_bytes"))
    assert float(gauges['layerfit_memory_limit_bytes{kind="limit"}']) == LIMIT
    footprint = float(gauges['layerfit_memory_limit_bytes{kind="footprint"}'])
    assert float(gauges['layerfit_memory_limit_bytes{kind="budget"}']) == LIMIT - footprint > 0


def test_sigterm_answers_the_request_in_flight_within_the_grace_period(pod) -> None:
    """Kubernetes sends SIGTERM, then SIGKILL after terminationGracePeriodSeconds: the
    request admitted before SIGTERM is answered, and the process has ended before then."""
    running, url, cgroup = pod
    grace = manifest(SERVICE)["spec"]["predictor"]["terminationGracePeriodSeconds"]
    body = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.5] * 4}]}
    answers: list[httpx.Response] = []
    request = threading.Thread(target=lambda: answers.append(
        httpx.post(f"{url}/v2/models/{NAME}/infer", json=body, timeout=grace)))
    request.start()
    _wait_until(lambda: "layerfit_inflight_requests 1.0" in httpx.get(f"{url}/metrics", timeout=30).text)
    running.process.send_signal(signal.SIGTERM)
    request.join(grace)
    try:
        code = running.process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {grace} s after SIGTERM: Kubernetes would SIGKILL it\n" + "".join(running.output))
    assert [a.status_code for a in answers] == [200], [a.text for a in answers]
    assert code in (0, -signal.SIGTERM), "".join(running.output)  # drained, then the signal re-raised
    assert cgroup is None or cgroup.oom_kills() == 0
    with pytest.raises(httpx.ConnectError):  # the server itself ended: the entry point became it, left no orphan
        httpx.get(f"{url}/v2/health/live", timeout=30)


def _wait_until(predicate, attempts: int = 3000) -> None:
    """Poll a condition the test cannot be notified of (10 ms steps, bounded)."""
    import time

    for _ in range(attempts):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError("condition never held")
