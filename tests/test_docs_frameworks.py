"""The recipes of docs/frameworks.md run as written: a plain loop (and its resume),
torchrun with DDP, Lightning with DDP, accelerate under torchrun."""

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import stoker
from conftest import epoch_labels, run_framework_script, write_dataset

DOC = Path(__file__).resolve().parent.parent / "docs" / "frameworks.md"
pytestmark = pytest.mark.slow  # framework runs: the full tier (README's command) only


def recipe(title):
    section = DOC.read_text().split(f"## Recipe: {title}", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, title
    return blocks[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    write_dataset(tmp_path / "data" / "train", 40, shard_size="1KB")
    write_dataset(tmp_path / "data" / "val", 23, shard_size="1KB")
    rng = np.random.default_rng(0)
    with stoker.ShardWriter(tmp_path / "data" / "docs", {"tokens": stoker.tokens("uint16")}) as w:
        for _ in range(30):
            w.write({"tokens": rng.integers(0, 256, int(rng.integers(5, 60))).astype(np.uint16)})
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(args, cwd):
    run_framework_script(args, cwd=cwd)


def _script(workdir, title, footer=""):
    path = workdir / "train.py"
    path.write_text(recipe(title) + footer)
    return str(path)


def test_plain_loop_recipe_and_its_resume(workdir):
    import torch

    code = recipe("a plain training loop with checkpoints")
    exec(compile(code, str(DOC), "exec"), {})
    saved = torch.load("checkpoint.pt")["loader"]
    assert saved["epoch"] == 2 and saved["position"] == 3 * 8  # the last one: epoch 2, step 2
    seen = []
    # the second run resumes from that checkpoint: it finishes epoch 2 from batch 3
    exec(compile(code.replace("for step, batch in enumerate(loader):",
                              "for step, batch in enumerate(loader):\n"
                              "        seen.append(batch['label'].tolist())"),
                 str(DOC), "exec"), {"seen": seen})
    want = stoker.Loader("data/train", batch_size=8, shuffle=True, seed=0, drop_last=True)
    want.set_epoch(2)
    assert seen == epoch_labels(want)[3:]


def test_torchrun_recipe(workdir):
    footer = ("\nimport json\njson.dump({'results': results, 'accuracy': accuracy}, "
              "open(f'out.{int(os.environ[\"RANK\"])}.json', 'w'))\n")
    p = run_framework_script(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         _script(workdir, "torchrun and DistributedDataParallel", "\nimport os" + footer)],
        cwd=workdir)
    # what the reader sees on success: rank 0's loss per epoch, then the accuracy
    assert re.findall(r"^epoch (\d): loss [\d.]+, 5 batches a rank$", p.stdout, re.M) == \
        ["0", "1"], p.stdout
    assert re.search(r"^accuracy [\d.]+ on 23 samples, each on one rank$", p.stdout, re.M), \
        p.stdout
    import torch

    state = torch.load(workdir / "checkpoint.pt")["loader"]
    assert state["epoch"] == 2 and state["position"] == 0 and state["world_size"] == 2
    for rank in range(2):  # the 23 validation samples, each scored once, on every rank
        out = json.loads((workdir / f"out.{rank}.json").read_text())
        assert sorted(map(len, out["results"])) == [11, 12]
        assert out["accuracy"] == sum(map(sum, out["results"])) / 23


def test_lightning_recipe(workdir):
    pytest.importorskip("lightning", reason="the test extra installs lightning")
    # the validation loader ran on both ranks: val_loss was logged (in fit and validate)
    footer = ("\n    import json\n    json.dump({'val_loss': float(trainer.callback_metrics"
              "['val_loss']), 'world': trainer.world_size}, "
              "open(f'out.{trainer.global_rank}.json', 'w'))\n")
    p = run_framework_script([sys.executable, _script(workdir, "PyTorch Lightning", footer)],
                             cwd=workdir)
    for rank in range(2):
        out = json.loads((workdir / f"out.{rank}.json").read_text())
        # a finite loss, near an untrained model's cross-entropy over 10 classes (ln 10)
        assert out["world"] == 2 and 0 < out["val_loss"] < 5, out
    assert "val_loss" in p.stdout and "inf" not in p.stdout, p.stdout


def test_accelerate_recipe(workdir):
    pytest.importorskip("accelerate", reason="the test extra installs accelerate")
    footer = ("\nimport json\njson.dump({'labels': labels, 'state': loader.state_dict()}, "
              "open(f'out.{accelerator.process_index}.json', 'w'))\n")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          _script(workdir, "HuggingFace accelerate", footer)], workdir)
    for rank in range(2):
        out = json.loads((workdir / f"out.{rank}.json").read_text())
        assert sorted(out["labels"]) == list(range(40))  # every sample once, on every rank
        assert out["state"]["epoch"] == 2
    assert (workdir / "checkpoint").is_dir()


def test_hf_trainer_recipe_resumes_where_it_stopped(workdir):
    """The recipe run to its end, then again from its checkpoint at step 5 (epoch 1):
    the second run trains on exactly the batches the first had after step 5."""
    pytest.importorskip("transformers", reason="the test extra installs transformers")
    # the batches the Trainer trains on, recorded around the recipe as written
    header = ("import atexit, json, stoker\n"
              "seen, _iter = [], stoker.Loader.__iter__\n"
              "def _recording(self):\n"
              "    for batch in _iter(self):\n"
              "        seen.append(batch['input_ids'].tolist())\n"
              "        yield batch\n"
              "stoker.Loader.__iter__ = _recording\n"
              "atexit.register(lambda: json.dump(seen, open('seen.json', 'w')))\n")
    path = workdir / "train.py"
    path.write_text(header + recipe("HuggingFace Trainer"))
    _run([sys.executable, str(path)], workdir)
    full = json.loads((workdir / "seen.json").read_text())
    checkpoints = sorted(p.name for p in (workdir / "out").iterdir())
    assert "checkpoint-5" in checkpoints and len(full) > 5 and len(full) % 2 == 0
    assert 5 > len(full) // 2  # step 5 is in epoch 1
    for name in checkpoints:  # as if the run had been killed right after step 5
        if name != "checkpoint-5":
            shutil.rmtree(workdir / "out" / name)
    _run([sys.executable, str(path)], workdir)
    assert json.loads((workdir / "seen.json").read_text()) == full[5:]
