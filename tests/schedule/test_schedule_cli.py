"""``layerfit schedule``: graph, generate, run; user errors exit 2 with one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from layerfit.cli import main


def test_generate_then_simulate_with_json_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["schedule", "generate", "small-3", "-o", "w.yaml", "--count", "2"]) == 0
    assert main(["schedule", "generate", "small-3", "-o", "w.yaml"]) == 2
    assert "already exists (pass --force" in capsys.readouterr().err
    capsys.readouterr()
    code = main(
        [
            "schedule",
            "run",
            "--workload",
            "w.yaml",
            "--policy",
            "masa",
            "--budget",
            "512MiB",
            "--workers",
            "2",
            "--simulate",
            "--json",
            "--plot",
        ]
    )
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == "masa" and data["jobs_by_status"] == {"done": 2}
    assert set(data["response_time_s"]) == {"mean", "p50", "p95", "max"}
    assert (tmp_path / "w-masa.png").exists() and data["plot"] == "w-masa.png"
    # no policy can beat the bound; `schedule bound` gives the same one without simulating
    least = data["lower_bound"]["mean_response_s"]
    assert 0 < least <= data["response_time_s"]["mean"]
    assert main(["schedule", "bound", "--workload", "w.yaml", "--workers", "2", "--json"]) == 0
    bound = json.loads(capsys.readouterr().out)
    assert bound["mean_response_s"] == pytest.approx(least) and bound["mode"] == "open"
    assert main(["schedule", "bound", "--workload", "w.yaml", "--workers", "1"]) == 0
    assert "2 jobs (open), 1 worker: no policy's mean response is below" in capsys.readouterr().out


def test_graph_command(tmp_path, capsys):
    out = tmp_path / "g.png"
    assert main(["schedule", "graph", "agenet", "--scheme", "bulk", "-o", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tasks"] == 1 + 3 * 19 and out.exists()
    assert (
        main(["schedule", "graph", "agenet", "--scheme", "sideways", "-o", str(tmp_path / "h.png")])
        == 2
    )
    assert "unknown scheme 'sideways'" in capsys.readouterr().err


def test_user_errors_exit_2_without_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("arrivals:\n  - at: 0\n    networks: [agenet, nonet]\n")
    assert main(["schedule", "run", "--workload", str(bad), "--budget", "1GB", "--simulate"]) == 2
    err = capsys.readouterr().err
    assert (
        "line 3: arrivals[0].networks[1]: unknown network 'nonet'" in err and "Traceback" not in err
    )
    good = tmp_path / "good.yaml"
    good.write_text("arrivals:\n  - networks: [agenet]\n")
    assert (
        main(
            [
                "schedule",
                "run",
                "--workload",
                str(good),
                "--budget",
                "1GB",
                "--policy",
                "lifo",
                "--simulate",
            ]
        )
        == 2
    )
    assert "unknown policy 'lifo'" in capsys.readouterr().err
    assert main(["schedule", "run", "--workload", str(good), "--budget", "lots", "--simulate"]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    assert main(["schedule", "run", "--workload", str(good), "--budget", "1GB"]) == 2
    assert "pass --simulate" in capsys.readouterr().err
    base = ["schedule", "run", "--workload", str(good), "--budget", "1GB"]
    assert main([*base, "--simulate", "--units", "merge:1MB"]) == 2
    assert "--units applies to a real run" in capsys.readouterr().err
    assert main([*base, "--units", "chunks"]) == 2
    assert "unknown unit granularity 'chunks'" in capsys.readouterr().err
    # a budget below every job's largest task serves nothing: the report, then exit 2
    assert (
        main(["schedule", "run", "--workload", str(good), "--budget", "100MB", "--simulate"]) == 2
    )
    captured = capsys.readouterr()
    assert "rejected" in captured.out and "Traceback" not in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schedule", "contention"], "Missing argument"),
        (["run", "--bogus"], "No such option: --bogus"),
        (["schedule", "run", "--workload", "w.yaml", "--budget", "1MB", "--workers", "0"], "--workers"),
    ],
)
def test_usage_errors_are_a_message_not_a_traceback(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def _run(argv, capsys):
    """Exit status, stdout and stderr of ``layerfit ARGV``; never a traceback."""
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return code, captured.out, captured.err


def _strict_json(text):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


ONE_AGENET = "arrivals:\n  - networks: [agenet]\n"


def test_zoo_cache_never_replaces_a_folder_it_did_not_prepare(tmp_path, capsys):
    workload = tmp_path / "g.yaml"
    workload.write_text("arrivals:\n  - networks: [googlenet]\n")
    run = ["schedule", "run", "--workload", str(workload), "--budget", "512MB", "--resolution", "32"]
    mine = tmp_path / "cache" / "googlenet"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    code, _, err = _run([*run, "--zoo-cache", str(tmp_path / "cache")], capsys)
    assert code == 2 and f"{mine} is not this cache's googlenet model" in err
    assert (mine / "notes.txt").read_text() == "precious" and os.listdir(mine) == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    code, _, err = _run([*run, "--zoo-cache", str(tmp_path / "file")], capsys)
    assert code == 2 and "is a file, not a folder" in err
    code, _, err = _run([*run, "--zoo-cache", "/proc/nope/cache"], capsys)
    assert code == 2 and "cannot create the --zoo-cache folder /proc/nope/cache" in err


def test_zoo_cache_replaces_only_its_own_entry_at_another_input(tmp_path, monkeypatch):
    from layerfit.errors import ScheduleError
    from layerfit.schedule.experiments.thesis_zoo import prepare_thesis_models

    cache = tmp_path / "cache"
    prepare_thesis_models(cache, ["googlenet"], resolution=32)
    prepared: list = []
    monkeypatch.setattr(
        "layerfit.store.prepare", lambda spec, out, **kw: prepared.append((out.name, kw))
    )
    prepare_thesis_models(cache, ["googlenet"], resolution=32)  # the same input: reused
    assert prepared == []
    shutil.copytree(cache / "googlenet", cache / "tinyyolo")  # a prepared model, not tinyyolo
    with pytest.raises(ScheduleError, match="tinyyolo is not this cache's tinyyolo model"):
        prepare_thesis_models(cache, ["googlenet", "tinyyolo"], resolution=64)
    (cache / "googlenet" / "mine.txt").write_text("x")  # our entry, plus a file of the user's
    with pytest.raises(ScheduleError, match="also holds mine.txt"):
        prepare_thesis_models(cache, ["googlenet"], resolution=64)
    assert prepared == [] and (cache / "googlenet" / "mine.txt").exists()
    (cache / "googlenet" / "mine.txt").unlink()
    prepare_thesis_models(cache, ["googlenet"], resolution=64)  # ours, another input: replaced
    assert prepared == [("googlenet", {"input_shape": (1, 3, 64, 64), "seed": 5, "force": True})]


def test_run_plot_needs_force_to_replace_an_image_and_plot_file_implies_plot(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    Path("w.yaml").write_text(ONE_AGENET)
    run = ["schedule", "run", "--workload", "w.yaml", "--budget", "1GB", "--simulate"]
    code, out, _ = _run([*run, "--plot-file", "p.png"], capsys)
    assert code == 0 and "plot written to p.png" in out
    before = Path("p.png").read_bytes()
    code, out, err = _run([*run, "--plot-file", "p.png"], capsys)
    assert code == 2 and "p.png already exists (pass --force" in err and out == ""  # not run
    assert Path("p.png").read_bytes() == before
    assert _run([*run, "--plot-file", "p.png", "--force"], capsys)[0] == 0
    assert _run([*run, "--plot", "--policy", "fcfs"], capsys)[0] == 0
    code, out, err = _run([*run, "--plot", "--policy", "fcfs"], capsys)
    assert code == 2 and "w-fcfs.png already exists" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "small-3", "-o", "missing/w.yaml"], "--output missing/w.yaml: folder missing does not exist"),
        (["profiles", "--save", "missing/p.json"], "--save missing/p.json: folder missing does not exist"),
        (["contention", "nomodel", "--save", "missing/c.json"], "--save missing/c.json: folder missing"),
        (["graph", "agenet", "-o", "missing/g.png"], "folder missing does not exist"),
        (["graph", "agenet", "-o", "g.txt"], "--output g.txt has '.txt', which matplotlib does not write"),
        (["graph", "agenet", "-o", "noext"], "--output noext has no extension: end the name with one of"),
        (["graph", "agenet", "-o", "adir"], "--output adir is a directory"),
        (["run", "--simulate", "--plot-file", "p.txt"], "--plot-file p.txt has '.txt', which matplotlib"),
        (["run", "--simulate", "--plot-file", "noext"], "--plot-file noext has no extension"),
        (["run", "--simulate", "--plot-file", "adir"], "--plot-file adir is a directory"),
        (["run", "--simulate", "--plot-file", "missing/p.png"], "folder missing does not exist"),
        (["run", "--zoo-cache", "cache", "--plot-file", "p.txt"], "--plot-file p.txt has '.txt', which matplotlib"),
    ],
)
def test_bad_output_paths_are_refused_before_any_work(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("w.yaml").write_text(ONE_AGENET)
    Path("adir").mkdir()
    if argv[0] == "run":
        argv = [*argv, "--workload", "w.yaml", "--budget", "1GB"]
    code, out, err = _run(["schedule", *argv], capsys)
    assert code == 2 and message in err and out == ""
    assert sorted(os.listdir()) == ["adir", "w.yaml"]  # nothing written, nothing prepared


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bound", "--workload", "bin.yaml"], "cannot read workload bin.yaml: not a UTF-8 text file"),
        (["run", "--workload", "bin.yaml", "--budget", "1GB", "--simulate"], "cannot read workload bin.yaml"),
        (["profiles", "--profiles", "bin.yaml"], "cannot read profile file bin.yaml: not a UTF-8"),
        (["bound", "--workload", "w.yaml", "--profiles", "bin.yaml"], "cannot read profile file bin.yaml"),
        (["graph", "bin.yaml", "-o", "g.png"], "cannot read profile file bin.yaml"),
        (["bound", "--workload", "w.yaml", "--contention", "adir"], "cannot read contention file adir: it is a directory"),
        (["bound", "--workload", "adir"], "cannot read workload adir: it is a directory"),
    ],
)
def test_unreadable_input_files_are_named(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("w.yaml").write_text(ONE_AGENET)
    Path("bin.yaml").write_bytes(b"\xff\xfe\x00\x01binary")
    Path("adir").mkdir()
    code, _, err = _run(["schedule", *argv], capsys)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--simulate", "--estimate-factor", "nan"], "--estimate-factor must be a finite number > 0, got nan"),
        (["run", "--zoo-cache", "cache", "--estimate-factor", "inf"], "--estimate-factor must be a finite"),
        (["run", "--simulate", "--budget", "0"], "--budget must be a positive size, got '0'"),
        (["run", "--simulate", "--physical-memory", "0"], "--physical-memory must be a positive size"),
        (["generate", "random-arrivals", "--intensity", "nan"], "traffic intensity must be a finite number > 0"),
        (["generate", "random-arrivals", "--intensity", "inf"], "traffic intensity must be a finite number > 0"),
        (["generate", "random-arrivals", "--iat-sd", "nan"], "standard deviation must be a finite number"),
        (["generate", "batch", "--networks", "agenet", "--period", "nan"], "period must be a finite number"),
        (["generate", "batch", "--networks", "agenet", "--period", "inf"], "period must be a finite number"),
        (["generate", "small-3", "--count", "1000001"], "at most 1,000,000 arrivals, got count=1,000,001"),
    ],
)
def test_bad_numbers_are_refused_naming_the_option(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("w.yaml").write_text(ONE_AGENET)
    if argv[0] == "run":
        argv = [*argv, "--workload", "w.yaml"] + ([] if "--budget" in argv else ["--budget", "1GB"])
    else:
        argv = [*argv, "-o", "out.yaml"]
    code, _, err = _run(["schedule", *argv], capsys)
    assert code == 2 and message in err and "physical memory must" not in err
    assert sorted(os.listdir()) == ["w.yaml"]


def test_no_job_served_exits_2_with_the_budget_needed_after_strict_json(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run(["schedule", "generate", "small-3", "-o", "s.yaml", "--count", "2"], capsys)[0] == 0
    run = ["schedule", "run", "--workload", "s.yaml", "--budget", "1MB", "--simulate"]
    code, out, err = _run([*run, "--json", "--plot-file", "none.png"], capsys)
    data = _strict_json(out)  # printed before the error: nothing is lost
    assert code == 2 and data["jobs_by_status"] == {"rejected": 2}
    assert data["response_time_s"] == {"mean": None, "p50": None, "p95": None, "max": None}
    assert data["job_results"][0]["min_budget"] == 164_349_174 and Path("none.png").exists()
    assert "no job was served (2 rejected)" in err
    assert "needs a budget of at least 164.3 MB (164349174 bytes)" in err
    code, out, err = _run(run, capsys)
    assert code == 2 and "response time: - (no job completed)" in out and "nan" not in out
    # some served: exit 0, and the report says what budget would serve the rest
    Path("mix.yaml").write_text(ONE_AGENET + "  - at: 1\n    networks: [scenenet]\n")
    code, out, _ = _run(["schedule", "run", "--workload", "mix.yaml", "--budget", "500MB", "--simulate"], capsys)
    assert code == 0 and "1 of 2 jobs rejected: a budget of at least 883.0 MB" in out


def test_profile_file_errors_name_the_file(tmp_path, capsys):
    bad = tmp_path / "p.yaml"
    bad.write_text("name: tiny\nlayers:\n  - name: l0\n    load_time: -1\n")
    code, _, err = _run(["schedule", "profiles", "--profiles", str(bad)], capsys)
    assert code == 2 and f"{bad}: profile 'tiny'.layers[0].load_time: expected a finite" in err
    bad.write_text(
        "format: layerfit-profiles\nversion: 1\nnetworks:\n"
        "  - name: tiny\n    layers:\n      - name: l0\n        exec_time: .inf\n"
    )
    code, _, err = _run(["schedule", "graph", str(bad), "-o", str(tmp_path / "g.png")], capsys)
    assert code == 2 and f"{bad}: networks[0]: profile 'tiny'.layers[0].exec_time" in err
