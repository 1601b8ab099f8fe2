"""``serve --memory-limit``: the runtime's budget is what the measured process leaves of the
limit (issue #55), reported in the runtime's stats and on /metrics; a budget given is
held to it, a model the budget cannot run is out of service, bad limits are one line."""

from __future__ import annotations

from pathlib import Path

import cgroups
import httpx
import pytest
from generate_helpers import make_repository, reference_tokens, word_tokenizer
from serve_helpers import child_env

from layerfit.errors import BudgetError
from layerfit.memory_limit import MIN_HEADROOM, machine_memory_bytes, process_memory
from layerfit.serve.server import ServerThread, ServeSettings, build

openai = pytest.importorskip("openai")  # the test extra has it; the compatibility legs do not

MB = 1000**2
PROMPT = "w1 w2 w3 w4"


@pytest.fixture(scope="module")
def lm_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Hugging Face folder, the repository of ``lm`` and ``chain``)."""
    folder = make_repository(tmp_path_factory.mktemp("limit"))
    return folder, folder.parent / "repo"


def _limited(repository: Path, limit: int | str, **overrides: object) -> ServeSettings:
    """Test settings (loopback, a free port, small limits) under a memory limit."""
    values = {"repository": repository, "workers": 2, "port": 0, "queue_limit": 8, "max_body": "64kB",
              "timeout": 20.0, "shutdown_grace": 5.0, "memory_limit": limit if isinstance(limit, str) else f"{limit}B"}
    return ServeSettings(**{**values, **overrides})


def _gauges(text: str) -> dict[str, float]:
    """Prometheus text as {series: value}."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_the_budget_is_what_the_measured_server_leaves_and_it_answers(lm_folders) -> None:
    folder, repository = lm_folders
    limit = process_memory().resident_bytes + 400 * MB  # this test process's own, and room
    with ServerThread(_limited(repository, limit)) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        stats = server.built.runtime.stats()
        memory = stats["memory_limit"]
        assert memory["memory_limit_bytes"] == limit
        assert memory["request_memory_bytes"] == 2 * 64_000  # twice --max-body
        assert memory["headroom_bytes"] == MIN_HEADROOM and memory["footprint_anon_bytes"] > 50 * MB
        assert stats["budget_bytes"] == memory["weight_budget_bytes"] == limit - memory["footprint_bytes"]
        metrics = _gauges(http.get("/metrics").text)
        assert metrics['layerfit_memory_limit_bytes{kind="limit"}'] == limit
        assert metrics['layerfit_memory_limit_bytes{kind="budget"}'] == stats["budget_bytes"]
        assert metrics['layerfit_memory_bytes{kind="budget"}'] == stats["budget_bytes"]
        assert metrics['layerfit_process_bytes{kind="anon"}'] > 50 * MB
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        answer = client.completions.create(model="lm", prompt=PROMPT, max_tokens=8, temperature=0)
        tokenizer = word_tokenizer()
        expected = reference_tokens(folder, tokenizer(PROMPT)["input_ids"], 8)
        assert answer.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)


def test_a_budget_the_limit_cannot_hold_is_refused(lm_folders) -> None:
    _, repository = lm_folders
    limit = process_memory().resident_bytes + 200 * MB
    with pytest.raises(BudgetError, match="does not fit memory limit") as caught:
        build(_limited(repository, limit, memory_budget="400MB"))
    assert "\n" not in str(caught.value)


def test_a_budget_within_the_limit_is_the_runtimes(lm_folders) -> None:
    _, repository = lm_folders
    limit = process_memory().resident_bytes + 300 * MB
    built = build(_limited(repository, limit, memory_budget="5MB"))
    try:
        assert built.runtime.stats()["budget_bytes"] == 5 * MB
    finally:
        built.runtime.shutdown()


@pytest.mark.parametrize(("limit", "says"), [("700", "has no unit"), ("90000TB", "more than this machine's memory")])
def test_a_limit_that_means_nothing_is_one_line(lm_folders, limit: str, says: str) -> None:
    _, repository = lm_folders
    with pytest.raises(BudgetError, match=says) as caught:
        _limited(repository, limit)
    assert "\n" not in str(caught.value) and machine_memory_bytes() > 0


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=cgroups.unavailable() or "")
def test_a_server_within_a_cgroup_of_its_limit_stays_up_and_answers(lm_folders, tmp_path: Path) -> None:
    """``layerfit serve --memory-limit L`` inside a memory cgroup of exactly L: it measures
    itself, serves concurrent completions with transformers' tokens, and is never killed."""
    import concurrent.futures
    import os
    import re
    import signal
    import subprocess
    import sys

    folder, repository = lm_folders
    limit = 700 * MB // 4096 * 4096
    with cgroups.memory_cgroup(limit) as cgroup:
        procs = cgroup.path / "cgroup.procs"
        server = subprocess.Popen(
            [sys.executable, "-m", "layerfit.cli", "--trust-factory", "tinymodels", "serve", "--repository",
             str(repository), "--port", "0", "--memory-limit", f"{limit}B", "--max-body", "64kB"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
        )
        try:
            line = server.stdout.readline()
            url = re.search(r"(http://\S+)/v2", line)
            assert url is not None, line + server.stderr.read()
            client = openai.OpenAI(base_url=f"{url.group(1)}/v1", api_key="none", max_retries=0, timeout=120)
            tokenizer = word_tokenizer()
            expected = tokenizer.decode(reference_tokens(folder, tokenizer(PROMPT)["input_ids"], 8),
                                        skip_special_tokens=True)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda _: client.completions.create(
                    model="lm", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text, range(8)))
            assert answers == [expected] * 8
            metrics = _gauges(httpx.get(f"{url.group(1)}/metrics").text)
            assert metrics['layerfit_memory_limit_bytes{kind="limit"}'] == limit
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        # ended by the SIGTERM it was sent (drained, then the signal re-raised), not killed for memory
        assert cgroup.oom_kills() == 0 and server.returncode == -signal.SIGTERM, server.stderr.read()[-2000:]
