"""The headline bench pages open with what they show: a chart drawn from the committed
JSON and a summary of at most five lines whose numbers come from that JSON; the Results
page gathers one chart per area and is the committed output of ``tools/docs_pages.py``;
no page names a folder of the machine that measured it."""

from __future__ import annotations

import copy
import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

pytest.importorskip("matplotlib")

import chart_style  # noqa: E402
import docs_pages  # noqa: E402
import result_charts  # noqa: E402

HEADLINE = {"vs_mmap", "vs_accelerate", "demand_layering", "moe_decoding", "speculative_trained",
            "memory_planner", "masa", "serve_load", "serve_generate", "vs_llamacpp_quantized"}
MACHINE_PATH = re.compile(r"/(work|home|root|Users)/")


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> tuple[Path, dict[Path, bytes]]:
    out = tmp_path_factory.mktemp("benchmarks")
    files = docs_pages.bench_pages(out, out / "img", warnings=[], history=[], only=HEADLINE)
    return out, files


def _png_width(data: bytes) -> int:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", data[16:20])[0]


def test_every_headline_bench_has_an_opening() -> None:
    assert set(result_charts.OPENINGS) >= HEADLINE


@pytest.mark.parametrize("script", sorted(HEADLINE))
def test_each_headline_page_opens_with_its_chart_and_a_short_summary(pages, script: str) -> None:
    out, files = pages
    text = files[out / f"{script}.md"].decode()
    head = text.split("\n## ", 1)[0]  # what comes before the first section: the opening
    assert head.startswith(f"# {script}\n")
    images = re.findall(r"!\[[^\]]+\]\(img/([^)]+\.png)\)", head)
    assert images, f"{script}: its page opens without a chart"
    for name in images:
        picture = out / "img" / name
        assert picture in files and picture.exists()
        assert _png_width(files[picture]) >= 2 * 500, "drawn at twice the page's width"
    summary = [line for line in head.splitlines() if line.startswith("- ")]
    assert 2 <= len(summary) <= 5
    assert summary[-1].startswith("- Measured on ") and "cores" in summary[-1]
    assert "## Method" in text and text.index("## Method") > text.index(images[0])


def _jitter(value, counter=[0]):  # noqa: B006 - a running counter across the walk
    """``value`` with every measurement (each float, each int over 1000: byte counts) moved
    by its own factor, so ratios move too."""
    if isinstance(value, dict):
        return {k: _jitter(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jitter(v) for v in value]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, int) and value <= 1000):
        return value
    counter[0] += 1
    moved = value * (1.1 + 0.07 * (counter[0] % 11))
    return int(moved) if isinstance(value, int) else moved


@pytest.mark.parametrize("script", sorted(HEADLINE))
def test_the_summary_numbers_are_computed_from_the_json(script: str) -> None:
    data = json.loads((ROOT / "bench" / "results" / f"{script}.json").read_text())
    summary = result_charts.OPENINGS[script].summary
    said = summary(copy.deepcopy(data))
    assert re.search(r"\d", " ".join(said[1:])), "a summary gives the number that matters"
    assert summary(_jitter(data)) != said, f"{script}: its summary does not follow its JSON"


def test_no_page_names_a_folder_of_the_machine_that_measured_it(pages) -> None:
    out, files = pages
    for path, data in files.items():
        if path.suffix == ".md":
            assert not MACHINE_PATH.search(data.decode()), path.name


def test_machine_paths_become_general() -> None:
    general = docs_pages.without_machine_paths
    assert general("/work/cache/llamacpp-venv/bin/python") == "…/llamacpp-venv/bin/python"
    assert general("at /work/main/bench/.cache/vs_mmap/x.gguf") == "at bench/.cache/vs_mmap/x.gguf"
    assert general("/tmp/wt-bench/bench/.cache/masa-64") == "bench/.cache/masa-64"
    assert general("2.1 GB/s, tokens/s, /v1/completions") == "2.1 GB/s, tokens/s, /v1/completions"


def test_the_results_page_has_one_chart_per_area_each_linking_its_bench_page(tmp_path) -> None:
    text = docs_pages.results_page([], tmp_path, {}, draw=False)
    sections = text.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == [area for area, _, _ in result_charts.AREAS]
    for section, (_, script, _) in zip(sections, result_charts.AREAS, strict=True):
        assert f"](benchmarks/img/{script}_" in section
        assert f"[{script}](benchmarks/{script}.md)" in section
        assert "Measured on " in section


def test_the_results_page_shows_the_readme_picture() -> None:
    readme = (ROOT / "README.md").read_text()
    picture = re.search(r"!\[[^\]]*\]\((docs/img/[^)]+)\)", readme)
    assert picture, "the README shows a picture"
    results = (ROOT / "docs" / "results.md").read_text()
    assert f"]({picture.group(1).removeprefix('docs/')})" in results


def test_results_comes_right_after_home_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].splitlines()
    assert nav[:2] == ["  - Home: index.md", "  - Results: results.md"]


def _full_history() -> bool:
    try:
        shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return shallow == "false"


@pytest.mark.skipif(not _full_history(), reason="needs the repository's whole git history")
def test_the_committed_results_page_is_what_the_tool_writes(tmp_path) -> None:
    history = docs_pages.freshness.read_history(ROOT)
    expected = docs_pages.results_page(history, tmp_path, {}, draw=False)
    assert (ROOT / "docs" / "results.md").read_text() == expected, "run tools/docs_pages.py and commit docs/results.md"


def test_each_chart_has_its_systems_colours() -> None:
    """Every labelled line or bar of every chart is drawn in its label's colour, and no two
    systems on one chart share one."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    for script, spec in result_charts.OPENINGS.items():
        data = json.loads((ROOT / "bench" / "results" / f"{script}.json").read_text())
        for chart in spec.charts:
            fig = chart.draw(data)
            seen: dict[str, str] = {}
            for ax in fig.axes:
                drawn = [(line.get_label(), line.get_color()) for line in ax.lines]
                drawn += [(bars.get_label(), bars.patches[0].get_facecolor()) for bars in ax.containers]
                for label, colour in drawn:
                    if label.startswith("_"):
                        continue
                    assert to_hex(colour) == chart_style.colour(label), (script, label)
                    seen[label] = to_hex(colour)
            assert len(set(seen.values())) == len(seen), f"{script}: two systems share a colour: {seen}"
            plt.close(fig)


def test_the_peers_and_layerfit_each_have_a_colour_of_their_own() -> None:
    systems = ["layerfit", "PyTorch mmap", "llama.cpp", "Accelerate", "transformers", "preload"]
    assert len({chart_style.colour(s) for s in systems}) == len(systems)
    assert chart_style.colour("a model no chart has named") == chart_style.colour("a model no chart has named")
    assert chart_style.colour("layerfit") == chart_style.colour("async"), "layerfit's own pipeline is layerfit"


def test_no_bench_script_tells_its_reader_a_folder_of_the_measuring_machine() -> None:
    """A bench page starts from its script's docstring; the JSON's own paths are made
    general as they are rendered (above)."""
    for script in sorted((ROOT / "bench").glob("*.py")):
        assert not MACHINE_PATH.search(docs_pages._docstring(script)), script.name
