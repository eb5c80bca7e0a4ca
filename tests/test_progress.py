"""Progress bars of the command line (stoker._progress): a tqdm bar with rate and ETA on a
terminal, stoker's own line with the same figures when tqdm is not installed, nothing when
stderr is not a terminal."""

import io
import re
import sys

import numpy as np
import pytest
import stoker
import stoker._progress
from conftest import write_dataset
from stoker._progress import Progress
from stoker.cli import main

pytest.importorskip("tqdm", reason="tqdm is in the test extra")


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Makes stderr a terminal; call it in the test (pytest's capture replaces sys.stderr
    again between a fixture's setup and the test)."""
    def install():
        err = Terminal()
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(stoker._progress, "_MININTERVAL", 0)  # redraw at every update
        return err
    return install


def test_bar_shows_rate_and_eta_on_a_terminal(terminal):
    terminal = terminal()
    with Progress(10, "work", unit="files") as bar:
        assert bar.active
        for _ in range(10):
            bar.update()
    out = terminal.getvalue()
    assert "work" in out and "10/10" in out
    assert re.search(r"\d[\d.]*files/s", out)  # the rate
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", out)  # elapsed<remaining (the ETA)


def test_no_bar_off_a_terminal(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with Progress(10, "work") as bar:
        assert not bar.active
        bar.update(10)
        bar.note("x")
    assert err.getvalue() == ""
    with Progress(10, "work", enabled=False) as bar:  # --quiet on a terminal
        assert not bar.active


def test_convert_npy_and_inspect_verify_draw_bars(tmp_path, terminal):
    terminal = terminal()
    np.save(tmp_path / "x.npy", np.arange(3000 * 4, dtype=np.int32).reshape(3000, 4))
    out = tmp_path / "ds"
    assert main(["convert", "npy", str(out), f"x={tmp_path / 'x.npy'}",
                 "--shard-size", "16KB"]) == 0
    text = terminal.getvalue()
    assert "stoker convert npy" in text and "3000/3000" in text
    assert re.search(r"\d[\d.k]*samples/s", text)
    assert "wrote 3000 samples" in text
    terminal.seek(0)
    terminal.truncate()
    assert main(["inspect", str(out), "--verify"]) == 0
    text = terminal.getvalue()
    assert "stoker inspect --verify" in text and re.search(r"\d[\d.]*[kM]?B/s", text)


def test_convert_npy_off_a_terminal_prints_only_the_result(tmp_path, capsys):
    np.save(tmp_path / "y.npy", np.arange(500, dtype=np.int64))
    assert main(["convert", "npy", str(tmp_path / "ds"), f"y={tmp_path / 'y.npy'}"]) == 0
    err = capsys.readouterr().err
    assert err.strip() == f"wrote 500 samples with fields ['y'] to {tmp_path / 'ds'}"


def test_bench_sweep_draws_a_bar(tmp_path, terminal):
    terminal = terminal()
    ds = write_dataset(tmp_path / "b", 256)
    assert isinstance(ds, stoker.Dataset)
    assert main(["bench", ds.path, "--sweep", "--batch-sizes", "16,32", "--threads", "1",
                 "--seconds", "0.05"]) == 0
    assert "stoker bench --sweep" in terminal.getvalue()


def test_without_tqdm_a_line_of_our_own_with_rate_and_eta(terminal, monkeypatch, tmp_path):
    terminal = terminal()
    monkeypatch.setattr(stoker._progress, "_tqdm", lambda: None)  # as if not installed
    with Progress(200, "work", unit="files") as bar:
        assert bar.active
        for i in range(200):
            bar.update()
            if i == 99:
                bar.note("half way")
                bar.write("a line between", file=sys.stderr)
    out = terminal.getvalue()
    assert "work:  50% 100/200 files [" in out and "half way" in out
    assert re.search(r"work: 100% 200/200 files \[\d\d:\d\d<00:00, [\d,]+ files/s\]", out)
    assert "\ra line between\n" in out  # the line cleared first, then redrawn
    assert out.endswith("\r")  # cleared at the end, as tqdm's leave=False
    # bytes are scaled, and the commands draw it too
    terminal.seek(0)
    terminal.truncate()
    np.save(tmp_path / "x.npy", np.arange(2000 * 4, dtype=np.int32).reshape(2000, 4))
    assert main(["convert", "npy", str(tmp_path / "ds"), f"x={tmp_path / 'x.npy'}"]) == 0
    assert main(["inspect", str(tmp_path / "ds"), "--verify"]) == 0
    text = terminal.getvalue()
    assert "stoker convert npy: 100% 2,000/2,000 samples" in text
    assert re.search(r"stoker inspect --verify: 100% [\d.]+k/[\d.]+k B \[.*B/s\]", text)
