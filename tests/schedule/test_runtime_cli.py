"""``layerfit schedule run`` without --simulate: the real executor over prepared models."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import largest_task, prepare_models, runtime_threads

from layerfit.cli import main
from layerfit.engine.osmem import is_glibc
from layerfit.errors import WorkloadError
from layerfit.schedule.experiments.realrun import run_workload
from layerfit.schedule.experiments.workload import load_workload
from layerfit.schedule.runtime.executor import Runtime

WORKLOAD = """\
name: two-models
mode: open
arrivals:
  - at: 0.0
    networks: [tiny, chain]
  - at: 0.02
    networks: [chain]
  - at: 0.04
    networks: [tiny]
    deadline: 30
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return prepare_models(tmp_path_factory.mktemp("repo"), ["tiny", "chain"])


def test_real_run_reports_like_the_simulator_and_compares(repo, tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    args = ["schedule", "run", "--workload", str(workload), "--budget", "150KB", "--workers", "2"]
    contention = tmp_path / "contention.json"
    code = main(["schedule", "contention", str(repo / "chain"), "--repeats", "1", "--save", str(contention)])
    assert code == 0 and "load by load" in capsys.readouterr().out
    code = main([*args, "--repository", str(repo), "--json", "--compare-simulator", "--trace",
                 "--contention", str(contention)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["executor"] == "real" and data["jobs_by_status"] == {"done": 3}
    assert set(data["response_time_s"]) == {"mean", "p50", "p95", "max"}
    assert data["budget_violations"] == 0 and data["peak_ledger_bytes"] > 0
    assert len(data["worker_utilisation"]) == 2 and data["task_trace"]
    comparison = data["simulator_comparison"]
    for key in ("simulated_profiled_durations", "simulated_measured_durations",
                "simulated_profiled_durations_contention", "simulated_decontended_durations_contention"):
        assert comparison[key]["jobs_done"] == 3
        assert "mean_response_s" in comparison[key]["difference"]
    assert data["runtime"]["jobs"]["done"] == 3
    assert comparison["simulated_decontended_durations_contention"]["contention_model"]["source"] == "measured"
    for key in ("profiled_work", "run_work"):  # what no scheduler could beat, for these 3 jobs
        bound = comparison["lower_bound"][key]
        assert bound["jobs"] == 3 and bound["mean_response_s"] > 0
        assert bound["real_over_bound"] == pytest.approx(data["response_time_s"]["mean"] / bound["mean_response_s"])
    assert main([*args, "--repository", str(repo)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as one line, however the console wrapped it
    assert "(real executor, kernels on" in out and "response time: mean" in out
    # an existing file is not overwritten, a broken one is refused with its name
    assert main(["schedule", "contention", str(repo / "chain"), "--save", str(contention)]) != 0
    contention.write_text("{}")
    assert main([*args, "--simulate", "--contention", str(contention)]) != 0
    assert "not a layerfit-contention file" in capsys.readouterr().err
    assert runtime_threads() == []


def test_a_real_run_with_merged_units_schedules_one_task_per_block(repo, tmp_path, capsys):
    from layerfit.engine.units import make_blocks
    from layerfit.store import read_manifest

    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    code = main(["schedule", "run", "--workload", str(workload), "--budget", "150KB", "--repository", str(repo),
                 "--units", "merge:12kB", "--json", "--trace", "--compare-simulator"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["jobs_by_status"] == {"done": 3} and data["budget_violations"] == 0
    blocks = {n: len(make_blocks(read_manifest(repo / n).units, "merge:12kB")) for n in ("tiny", "chain")}
    execs = [t for t in data["task_trace"] if t["kind"] == "EXEC"]
    assert len(execs) == 2 * blocks["tiny"] + 2 * blocks["chain"]  # tiny twice, chain twice
    assert blocks["tiny"] < len(read_manifest(repo / "tiny").units)
    assert data["simulator_comparison"]["simulated_profiled_durations"]["jobs_done"] == 3


def test_a_real_run_with_cached_weights_reads_each_unit_once(repo, tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    args = ["schedule", "run", "--workload", str(workload), "--budget", "1MB", "--repository", str(repo), "--json"]
    assert main([*args, "--cache-weights"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["jobs_by_status"] == {"done": 3} and data["budget_violations"] == 0
    cache = data["runtime"]["weight_cache"]
    assert cache["hits"] > 0 and cache["hits"] + cache["misses"] == data["runtime"]["tasks_started"]["load"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["runtime"]["weight_cache"] is None
    assert main([*args, "--cache-weights", "--simulate"]) != 0
    assert "--cache-weights applies to a real run" in capsys.readouterr().err


def test_a_real_run_returns_freed_memory_as_told(repo, tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    args = ["schedule", "run", "--workload", str(workload), "--budget", "1MB", "--repository", str(repo), "--json"]
    for given, mode in (([], "after-pass"), (["--return-freed-memory", "eagerly"], "eagerly")):
        assert main([*args, *given]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["jobs_by_status"] == {"done": 3}
        assert data["runtime"]["freed_memory"] == (mode if is_glibc() else "never")
    assert main([*args, "--return-freed-memory", "often"]) != 0
    assert "--return-freed-memory must be one of after-pass, eagerly, never" in capsys.readouterr().err
    assert main([*args, "--return-freed-memory", "never", "--simulate"]) != 0
    assert "--return-freed-memory applies to a real run" in capsys.readouterr().err


def test_a_real_run_computes_on_the_threads_it_is_given(repo, tmp_path, capsys):
    import torch

    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    args = ["schedule", "run", "--workload", str(workload), "--budget", "1MB", "--repository", str(repo)]
    before = torch.get_num_threads()
    try:
        assert main([*args, "--threads", "1", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["jobs_by_status"] == {"done": 3} and data["runtime"]["compute_threads"] == 1
        torch.set_num_threads(2)
        assert main(args) == 0
        assert "kernels on 2 threads" in " ".join(capsys.readouterr().out.split())
    finally:
        torch.set_num_threads(before)
    assert main([*args, "--threads", "0"]) != 0
    assert "--threads must be a whole number of threads, 1 or more, not 0" in capsys.readouterr().err
    assert main([*args, "--threads", "1", "--simulate"]) != 0
    assert "--threads applies to a real run" in capsys.readouterr().err


def test_ungated_real_run_overcommits_like_the_thesis_baselines(repo, tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text(WORKLOAD)
    budget = largest_task(repo, ["tiny", "chain"])  # tiny's init; its bulk peak is more than twice that
    args = ["schedule", "run", "--workload", str(workload), "--budget", str(budget), "--policy", "bulk",
            "--repository", str(repo), "--json"]
    assert main(args) == 0
    gated = json.loads(capsys.readouterr().out)
    assert main([*args, "--ungated"]) == 0
    ungated = json.loads(capsys.readouterr().out)
    assert gated["jobs_by_status"] == ungated["jobs_by_status"] == {"done": 3}
    assert gated["overcommits"] == 0 and gated["runtime"]["gated"] is True
    assert ungated["overcommits"] > 0 and ungated["runtime"]["gated"] is False
    assert ungated["peak_ledger_bytes"] > budget


def test_workload_naming_an_unknown_network(repo, tmp_path, capsys):
    workload = tmp_path / "w.yaml"
    workload.write_text("arrivals:\n  - at: 0\n    networks: [tiny, alexnet]\n")
    code = main(
        ["schedule", "run", "--workload", str(workload), "--budget", "1MB", "--repository", str(repo)]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "line 3: arrivals[0].networks[1]: unknown network 'alexnet'; known: chain, tiny" in err
    with Runtime(repo, "1MB") as rt, pytest.raises(WorkloadError, match="unknown network 'alexnet'"):
        load_workload(workload, rt.profile_set())
    code = main(["schedule", "run", "--workload", str(workload), "--budget", "1MB"])
    assert code == 2 and "--repository DIR" in capsys.readouterr().err


def test_closed_workload_runs_one_job_after_the_other(repo, tmp_path):
    workload = tmp_path / "w.yaml"
    workload.write_text("mode: closed\narrivals:\n" + "  - networks: [chain, tiny]\n" * 3)
    with Runtime(repo, "150KB", trace=True) as rt:
        report = run_workload(rt, load_workload(workload, rt.profile_set()), warmup=True)
        assert rt.stats()["jobs"]["done"] == 3  # the two warm-up jobs are not counted
    jobs = report.jobs
    assert [j.status for j in jobs] == ["done"] * 3
    assert {t.job for t in report.tasks} == {j.id for j in jobs}
    assert report.budget_violations == 0 and report.ledger_history[0].used == 0
    for before, after in zip(jobs, jobs[1:], strict=False):
        assert after.arrival >= before.finished
