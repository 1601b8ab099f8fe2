"""``layerfit schedule``: graph, generate, run; user errors exit 2 with one line."""

from __future__ import annotations

import json

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
            "--memory",
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
    assert main(["schedule", "run", "--workload", str(bad), "--memory", "1GB", "--simulate"]) == 2
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
                "--memory",
                "1GB",
                "--policy",
                "lifo",
                "--simulate",
            ]
        )
        == 2
    )
    assert "unknown policy 'lifo'" in capsys.readouterr().err
    assert main(["schedule", "run", "--workload", str(good), "--memory", "lots", "--simulate"]) == 2
    assert "cannot read 'lots' as a size" in capsys.readouterr().err
    assert main(["schedule", "run", "--workload", str(good), "--memory", "1GB"]) == 2
    assert "pass --simulate" in capsys.readouterr().err
    assert (
        main(["schedule", "run", "--workload", str(good), "--memory", "100MB", "--simulate"]) == 0
    )
    assert "rejected" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schedule", "contention"], "Missing argument"),
        (["run", "--bogus"], "No such option: --bogus"),
        (["schedule", "run", "--workload", "w.yaml", "--memory", "1MB", "--workers", "0"], "--workers"),
    ],
)
def test_usage_errors_are_a_message_not_a_traceback(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
