"""What a serving process carries besides PyTorch: none of the libraries that only the
command line, the planners and the benchmarks need. Each costs resident memory that no
budget counts (networkx alone: 12 MB here), so it is checked in a fresh process that
starts a server, answers requests and schedules their task graphs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from serve_helpers import child_env

NOT_FOR_SERVING = ("networkx", "matplotlib", "ortools", "pymoo", "simpy", "hypothesis")

_SCRIPT = """
import json, sys
import httpx, torch
from serve_helpers import json_body, settings
from layerfit.serve.server import ServerThread

with ServerThread(settings(sys.argv[1])) as running:
    for name, shape in (("cnn", [1, 3, 8, 8]), ("chain", [1, 8])):
        x = torch.randn(shape)
        answer = httpx.post(f"{running.url}/v2/models/{name}/infer", json=json_body(x), timeout=60)
        assert answer.status_code == 200, answer.text
    jobs = running.built.runtime.stats()["jobs"]
print(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules}), "jobs": jobs}))
"""


def test_a_serving_process_loads_no_library_it_does_not_need(repository: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(repository)], capture_output=True, text=True,
                         env=child_env(), timeout=180)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["jobs"]["done"] == 2, seen["jobs"]  # both requests went through the scheduler
    assert "fastapi" in seen["modules"] and "torch" in seen["modules"]
    assert sorted(set(NOT_FOR_SERVING) & set(seen["modules"])) == []
