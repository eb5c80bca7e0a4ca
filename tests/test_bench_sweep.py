"""``stoker bench PATH --sweep`` (stoker.bench.sweep): the table, the recommendation, the
batch-size answer and the plot, on a small dataset with short points. Figures are checked
for consistency with each other, not for speed."""

import re

import pytest
from conftest import write_dataset
from stoker.bench import sweep
from stoker.cli import main


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("sweep") / "ds", 600)


def test_sweep_table_recommendation_and_answer(ds, capsys):
    points = sweep(ds.path, batch_sizes=[8, 32], threads=[1, 2], seconds=0.05,
                   progress=False)
    assert [(p.batch_size, p.threads) for p in points] == [(8, 1), (8, 2), (32, 1), (32, 2)]
    for p in points:
        assert p.samples_per_second > 0 and p.first_batch_seconds > 0
        assert 0 <= p.stall <= 1 and p.batches >= 3
        assert p.bottleneck in ("loader", "consumer", "copy")
        assert p.batch_bytes >= p.batch_size * (48 + 8)
        assert set(p.worker_ms_per_sample) == {"read", "decode", "ops", "plan"}
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"\s+(8|32)\s+[12]\s", line)]
    assert len(rows) == 4
    best = max(points, key=lambda p: p.samples_per_second)
    assert f"Fastest: batch_size={best.batch_size}, num_threads={best.threads}" in out
    assert "Recommended:" in out
    assert "Why a larger batch can make training slower" in out
    assert "batch_size 8 -> 32" in out
    t = int(re.search(r"measured on this data \(num_threads=(\d+)\)", out).group(1))
    for p in points:  # the step a model must not beat, per batch size: batch / samples/s
        if p.threads == t:
            ms = 1e3 * p.batch_size / p.samples_per_second
            assert f"batch_size={p.batch_size:<5} step < {ms:9.1f} ms" in out


def test_sweep_plot(ds, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra")  # the table is tested above
    png = tmp_path / "sweep.png"
    assert main(["bench", ds.path, "--sweep", "--batch-sizes", "8,16", "--threads", "1",
                 "--seconds", "0.05", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png}" in capsys.readouterr().out


def test_sweep_arguments_are_checked(ds, capsys):
    assert main(["bench", ds.path, "--plot", "x.png"]) == 2
    assert "argument --plot: goes with --sweep" in capsys.readouterr().err
    assert main(["bench", "--sweep"]) == 2
    assert main(["bench", ds.path, "--sweep", "--seconds", "0"]) == 2


def test_changes_round_honestly():
    """A change is never printed as "-0%" or "+0%", nor rounded to another sign."""
    from stoker.bench._spread import change_text

    assert change_text(100, 95) == "-5.0%"
    assert change_text(100, 99.6) == "-0.4%"
    assert change_text(100, 100.04) == "0%" and change_text(100, 100) == "0%"
    assert change_text(100, 104.96) == "+5.0%"
    assert change_text(100, 129) == "+29%" and change_text(100, 71) == "-29%"
    assert change_text(100, 90.6) == "-9.4%" and change_text(100, 90.4) == "-10%"
    for before in (1, 3, 7, 100):
        for after in [before * (1 + k / 1000) for k in range(-200, 201)]:
            text = change_text(before, after)
            assert text not in ("-0%", "+0%", "-0.0%", "+0.0%"), (before, after)
            if text != "0%":
                assert (text[0] == "-") == (after < before), (before, after, text)
