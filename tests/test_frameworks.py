"""stoker under the frameworks users train with: PyTorch Lightning (single process and
DDP on 2 CPU processes, resumed from mid-epoch and end-of-epoch checkpoints, reloaded
loaders), HuggingFace accelerate under torchrun, and plain torchrun with gloo. The
scripts in tests/frameworks/ are written as a user would write them."""

import json
import os
import subprocess
import sys

import pytest
import stoker
from conftest import epoch_labels, write_dataset

HERE = os.path.join(os.path.dirname(__file__), "frameworks")
pytest.importorskip("lightning", reason="the test extra installs lightning")
pytest.importorskip("accelerate", reason="the test extra installs accelerate")


def _run(args, timeout=240):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def _torchrun(script, *args):
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc_per_node=2", os.path.join(HERE, script), *map(str, args)])


def _results(out, world):
    got = []
    for r in range(world):
        with open(f"{out}.{r}") as f:
            got.append(json.load(f))
    return got


def _order(ds, epoch, rank=0, world=1, batch_size=4, seed=3):
    loader = stoker.Loader(ds, batch_size=batch_size, shuffle=True, seed=seed, rank=rank,
                           world_size=world, prefetch_next_epoch=False)
    loader.set_epoch(epoch)
    return epoch_labels(loader)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("fw") / "ds", 40, shard_size="1KB")


def _by_epoch(seen, epochs):
    return [[labels for e, labels in seen if e == epoch] for epoch in range(epochs)]


# -- Lightning -------------------------------------------------------------------------

def test_lightning_single_process_epochs_and_checkpoint_resume(ds, tmp_path):
    out = str(tmp_path / "run")
    script = os.path.join(HERE, "lightning_train.py")
    _run([sys.executable, script, ds.path, out + "-full", "--max-epochs", "3"])
    full = _results(out + "-full", 1)[0]
    assert _by_epoch(full["seen"], 3) == [_order(ds, e) for e in range(3)]
    # interrupted mid-epoch (step 3 of 10) and at an epoch's end (step 10), then resumed
    for step in (3, 10):
        ck = str(tmp_path / f"ck{step}")
        _run([sys.executable, script, ds.path, out + f"-a{step}", "--max-steps", str(step),
              "--ckpt-dir", ck, "--every-n-steps", str(step)])
        _run([sys.executable, script, ds.path, out + f"-b{step}", "--max-epochs", "3",
              "--resume", os.path.join(ck, f"step={step}.ckpt")])
        seen = _results(out + f"-a{step}", 1)[0]["seen"] + _results(out + f"-b{step}", 1)[0]["seen"]
        assert seen == full["seen"], f"resumed at step {step}"


def test_lightning_reloaded_loaders_follow_the_epoch(ds, tmp_path):
    out = str(tmp_path / "run")
    _run([sys.executable, os.path.join(HERE, "lightning_train.py"), ds.path, out,
          "--max-epochs", "3", "--reload"])
    seen = _results(out, 1)[0]["seen"]
    assert _by_epoch(seen, 3) == [_order(ds, e) for e in range(3)]


def test_lightning_ddp_two_processes_shard_and_resume(ds, tmp_path):
    """The loader is made before Lightning starts the process group; each rank must get
    its own share, every epoch the order of that stoker epoch, and a mid-epoch checkpoint
    (saved by rank 0, loaded on both ranks) must resume exactly."""
    script = os.path.join(HERE, "lightning_train.py")
    out = str(tmp_path / "ddp")
    _run([sys.executable, script, ds.path, out, "--devices", "2", "--max-epochs", "2"])
    res = _results(out, 2)
    assert {r["world"] for r in res} == {2}
    for r in res:
        assert _by_epoch(r["seen"], 2) == [_order(ds, e, r["rank"], 2) for e in range(2)]
    ranks = [sum(_by_epoch(r["seen"], 2)[0], []) for r in res]
    assert not set(ranks[0]) & set(ranks[1]) and len(ranks[0]) == len(ranks[1]) == 20
    ck = str(tmp_path / "ck")
    _run([sys.executable, script, ds.path, out + "-a", "--devices", "2", "--max-steps", "2",
          "--ckpt-dir", ck, "--every-n-steps", "2"])
    _run([sys.executable, script, ds.path, out + "-b", "--devices", "2", "--max-epochs", "2",
          "--resume", os.path.join(ck, "step=2.ckpt")])
    for a, b, full in zip(_results(out + "-a", 2), _results(out + "-b", 2), res):
        assert a["seen"] + b["seen"] == full["seen"]


# -- accelerate ------------------------------------------------------------------------------

def test_accelerate_under_torchrun(ds, tmp_path):
    evalset = write_dataset(tmp_path / "eval", 101, shard_size="2KB")
    out = str(tmp_path / "acc")
    _torchrun("accelerate_train.py", ds.path, evalset.path, out)
    res = _results(out, 2)
    for r in res:
        rank = r["rank"]
        assert r["world"] == 2
        want = [_order(ds, e, rank, 2, seed=5) for e in range(2)]
        assert r["epochs"] == want
        assert r["resumed"] == want[1][3:]  # saved after 3 batches of epoch 1
        assert r["skipped"] == _order(ds, 2, rank, 2, seed=5)[2:]
    # gather_for_metrics over 101 samples: each exactly once, on every rank
    for r in res:
        assert sorted(r["eval"]) == [10 * i for i in range(101)]
    assert res[0]["eval_batches"] == res[1]["eval_batches"] == 6


# -- torchrun ---------------------------------------------------------------------------------

def test_torchrun_loader_made_before_the_process_group(ds, tmp_path):
    out = str(tmp_path / "tr")
    _torchrun("torchrun_world.py", ds.path, out)
    res = _results(out, 2)
    for r in res:
        assert r["before"] == 8 and r["after"] == 4  # 40 samples, batch 5: whole, then half
        assert "world changed" in r["changed"]
        assert r["labels"] == _order(ds, 1, r["rank"], 2, batch_size=5, seed=1)
    a, b = (sum(r["labels"], []) for r in res)
    assert sorted(a + b) == list(range(40))
