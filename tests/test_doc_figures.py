"""The figures README.md and docs/*.md quote come from BENCHMARKS.md: every number between the markers
``<!-- figures: BENCHMARKS.md -->`` and ``<!-- /figures -->`` must appear, written the same way, in BENCHMARKS.md
(scripts/bench.sh regenerates BENCHMARKS.md; a quoted figure that the run no longer shows fails here). And
BENCHMARKS.md is what benchmarks/report.py makes of the runs kept in benchmarks/results/, with every chart it shows,
so a figure quoted anywhere goes back to a stored run.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

# the source tree's documents: a check of the checkout, not of an installed wheel
pytestmark = pytest.mark.lint

ROOT = Path(os.environ.get("SPOCKWIRE_SOURCE_DIR") or Path(__file__).resolve().parents[1])
START, END = "<!-- figures: BENCHMARKS.md -->", "<!-- /figures -->"
#: a figure: a number with thousands separators or decimals, or a ratio ("4.99x", "16x"); plain integers without
#: either ("7 columns") are prose, not figures
FIGURE = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?x?(?![\w])"
                    r"|(?<![\w.,])\d+\.\d+x?(?![\w])|(?<![\w.,])\d+x(?![\w])")
#: every document that may quote figures: the README and the docs pages
QUOTING = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))


def quoted_figures(text: str) -> list[str]:
    out = []
    for block in re.findall(re.escape(START) + r"(.*?)" + re.escape(END), text, flags=re.S):
        out += FIGURE.findall(block)
    return out


def test_figure_pattern():
    assert quoted_figures(f"{START} 2,719,438 rows/s, 4.99x, 16x, 0.27 of it; 7 columns {END} 3.5") == [
        "2,719,438", "4.99x", "16x", "0.27"]


@pytest.mark.parametrize("name", QUOTING)
def test_quoted_figures_appear_in_benchmarks(name):
    text = (ROOT / name).read_text()
    figures = quoted_figures(text)
    assert text.count(START) == text.count(END)
    if name == "README.md":
        assert figures, "README.md quotes its figures between the markers"
    bench = set(FIGURE.findall((ROOT / "BENCHMARKS.md").read_text()))
    missing = [f for f in figures if f not in bench]
    assert not missing, f"{name} quotes figures that BENCHMARKS.md does not show: {missing}"


def test_benchmarks_md_is_rendered_from_the_stored_runs():
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import report, runs
    finally:
        sys.path.remove(str(ROOT))
    main, pipeline = runs.load()
    assert (ROOT / "BENCHMARKS.md").read_text() == report.render(main, pipeline, runs.load_soak()), (
        "BENCHMARKS.md differs from `python benchmarks/report.py` over benchmarks/results/: regenerate it, or change "
        "the generator")
    text = (ROOT / "BENCHMARKS.md").read_text()
    charts = re.findall(r"!\[[^\]]*\]\(([^)]+\.svg)\)", text)
    assert {Path(c).name for c in charts} == {name for name, _ in report.CHARTS}
    assert all((ROOT / c).is_file() for c in charts), charts
