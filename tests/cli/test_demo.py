"""``make demo``'s job on a small model: every pipeline it shows gives the same output,
and each claim it prints is one figure, saying how it was measured."""

from __future__ import annotations

import re
from pathlib import Path

from layerfit.demo import in_turn, main


def test_demo_streams_and_keeps_a_small_model_exactly(tmp_path: Path, capsys):
    assert main("mobilenet_v1_025", str(tmp_path / "out"), 2) == 0  # 1: the outputs differ
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert "outputs bit-identical: yes" in flat
    assert "layers resident and streams the rest" in flat
    assert (tmp_path / "out" / "gantt.png").stat().st_size > 1000
    assert (tmp_path / "out" / "trace.json").is_file()
    # Issue 52: a table's latencies (async +59 %, runs taken apart) beside a line's delay
    # (+6.9 %, alternating runs) contradicted each other. Now one latency and one delay
    # per pipeline, in the table, the delay computed from the latencies printed beside it.
    assert "latency (median of 2 rounds)" in flat and "delay vs preload" in flat
    assert "run in turn, 2 rounds" in flat and "loaded alone" in flat
    assert "delay overhead" not in flat
    rows = {name: (ms, delay) for name, ms, delay in re.findall(r"│ (\w+) .*?│ ([\d.]+) ms +│ ([-+]\d+\.\d%|-) ", out)}
    assert set(rows) == {"preload", "async", "auto"}, out
    preload = float(rows["preload"][0])
    for name in ("async", "auto"):
        latency, delay = float(rows[name][0]), float(rows[name][1].rstrip("%")) / 100
        # each ms is printed rounded to a whole ms (off by 0.5 at most) and the delay to 0.1 %:
        # the delay times the printed preload is off by (1 + delay) * 0.5 + 0.5 + 0.0005 * preload
        assert abs((1 + delay) * preload - latency) <= 0.5 * (2 + delay) + 0.001 * preload, (name, rows)
    assert len(re.findall(r"[-+]\d+\.\d%", out)) == 2, out  # async's and auto's delay, once each


def test_in_turn_times_each_run_once_a_round() -> None:
    calls: list[str] = []
    medians = in_turn({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] * 3 and set(medians) == {"a", "b"} and all(m >= 0 for m in medians.values())
