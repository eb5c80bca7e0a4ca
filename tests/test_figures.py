"""The README's figures are drawn by scripts/make_figures.py, not by hand, and the benchmark
chart shows the numbers bench/RESULTS.md holds now."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_figures  # noqa: E402


def test_the_benchmark_chart_shows_the_results():
    numbers = make_figures.benchmark_numbers()
    assert len(numbers) == 3
    assert all(bars[0][0].startswith("stoker") for bars, _ in numbers.values())
    svg = (ROOT / "docs" / "img" / "benchmarks.svg").read_text(encoding="utf-8")
    missing = [f"{title}: {name} {make_figures.label(v)}" for title, (bars, _) in numbers.items()
               for name, v in bars if make_figures.label(v) not in svg or name not in svg]
    missing += [f"{title}: {make_figures.ratio_label(r)}" for title, (_, r) in numbers.items()
                if f"({make_figures.ratio_label(r)} DataLoader)" not in svg]
    assert missing == [], ("docs/img/benchmarks.svg does not show bench/RESULTS.md's numbers "
                           "(run `python scripts/make_figures.py`):\n" + "\n".join(missing))


def test_the_results_are_parsed_by_column_name():
    text = (ROOT / "bench" / "RESULTS.md").read_text(encoding="utf-8")
    # a column the parser reads renamed: an error that names it, never a wrong number
    with pytest.raises(ValueError, match="memcpy ceiling"):
        make_figures.benchmark_numbers(text.replace("| memcpy ceiling |", "| ceiling |", 1))


def test_the_script_draws_both_figures(tmp_path):
    pytest.importorskip("matplotlib")
    make_figures.draw_architecture(tmp_path / "a.svg")
    make_figures.draw_benchmarks(tmp_path / "b.svg", make_figures.benchmark_numbers())
    a = (tmp_path / "a.svg").read_text(encoding="utf-8")
    assert a.startswith("<?xml") and "worker threads" in a and "batch ring" in a
    for _, _, title, _, _ in make_figures.ARCHITECTURE:
        assert title in a
    assert (ROOT / "docs" / "img" / "architecture.svg").exists()  # what the README shows
