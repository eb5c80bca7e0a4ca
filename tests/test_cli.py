import os
import subprocess
import sys

import numpy as np
import stoker
import torch
from conftest import write_dataset


def run(*args):
    return subprocess.run([sys.executable, "-m", "stoker.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_demo_runs_and_reports_throughput(tmp_path):
    r = run("demo", "--samples", "600", "--epochs", "2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "samples/s" in r.stdout and "epoch 1" in r.stdout


def test_inspect_verify_exit_status(tmp_path):
    ds = write_dataset(tmp_path / "d", 50)
    r = run("inspect", str(tmp_path / "d"), "--verify")
    assert r.returncode == 0, r.stderr
    assert "samples: 50" in r.stdout and "0 problem(s)" in r.stdout
    path = os.path.join(ds.path, ds.shards[0]["path"])
    with open(path, "r+b") as f:
        f.seek(70)
        b = f.read(1)
        f.seek(70)
        f.write(bytes([b[0] ^ 1]))
    r = run("inspect", str(tmp_path / "d"), "--verify")
    assert r.returncode == 1
    assert "BAD" in r.stdout and "record 0" in r.stdout


def test_inspect_missing_dataset_is_an_error(tmp_path):
    r = run("inspect", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such dataset" in r.stderr


def test_convert_npy(tmp_path):
    x = np.arange(40 * 6, dtype=np.float32).reshape(40, 2, 3)
    y = np.arange(40, dtype=np.int64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    r = run("convert", "npy", str(tmp_path / "out"), f"x={tmp_path / 'x.npy'}",
            f"label={tmp_path / 'y.npy'}")
    assert r.returncode == 0, r.stderr
    ds = stoker.Dataset(tmp_path / "out")
    assert len(ds) == 40
    np.testing.assert_array_equal(ds[7]["x"], x[7])
    b = next(iter(stoker.Loader(ds, batch_size=40)))
    assert torch.equal(b["x"], torch.from_numpy(x)) and torch.equal(b["label"], torch.from_numpy(y))
