"""``make demo``'s job on a small model: every pipeline it shows gives the same output."""

from __future__ import annotations

from pathlib import Path

from layerfit.demo import main


def test_demo_streams_and_keeps_a_small_model_exactly(tmp_path: Path, capsys):
    assert main("mobilenet_v1_025", str(tmp_path / "out"), pairs=1) == 0  # 1: the outputs differ
    out = " ".join(capsys.readouterr().out.split())
    assert "outputs bit-identical: yes" in out
    assert "async delay overhead" in out and "layers resident and streams the rest" in out
    assert (tmp_path / "out" / "gantt.png").stat().st_size > 1000
    assert (tmp_path / "out" / "trace.json").is_file()
