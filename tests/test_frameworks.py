"""stoker under the frameworks users train with: PyTorch Lightning (single process and
DDP on 2 CPU processes, resumed from mid-epoch and end-of-epoch checkpoints, reloaded
loaders), HuggingFace accelerate under torchrun, and plain torchrun with gloo. The
scripts in tests/frameworks/ are written as a user would write them."""

import json
import os
import sys
from pathlib import Path

import pytest
import stoker
import torch
from conftest import epoch_labels, run_framework_script, run_framework_scripts, write_dataset

# subprocesses of a framework with their own timeouts (pyproject: 120 s a test)
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

HERE = os.path.join(os.path.dirname(__file__), "frameworks")
pytest.importorskip("lightning", reason="the test extra installs lightning")
pytest.importorskip("accelerate", reason="the test extra installs accelerate")


def _run(args, timeout=240, returncode=0):
    return run_framework_script(args, timeout=timeout, returncode=returncode)


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
    return [[x[-1] for x in seen if x[0] == epoch] for epoch in range(epochs)]


def _train(seen):
    return [x for x in seen if isinstance(x[0], int)]


def _eval_runs(seen, kind):
    """The batches of each evaluation run of `kind` ("sanity", "val", "test", "predict")."""
    runs = {}
    for x in seen:
        if x[0] == kind:
            runs.setdefault(x[1], []).append(x[2])
    return list(runs.values())


def _batches(labels, size):
    return [labels[i:i + size] for i in range(0, len(labels), size)]


# -- the names frameworks probe ----------------------------------------------------------

def test_names_frameworks_probe_answer_without_raising(ds):
    """Lightning, accelerate and transformers read DataLoader attributes by name; each one
    answers as DataLoader's does (sampler and batch_sampler DataLoader's objects, over
    stoker's order), and Lightning's own helpers run on a stoker loader."""
    from lightning.fabric.utilities.data import _set_sampler_epoch, has_iterable_dataset
    from lightning.pytorch.utilities.data import _is_dataloader_shuffled

    loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=3)
    assert isinstance(loader.batch_sampler, torch.utils.data.BatchSampler)
    assert loader.collate_fn is None
    assert loader.num_workers == 0 and loader.worker_init_fn is None
    assert loader.dataset is ds and loader.batch_size == 4 and loader.drop_last is False
    assert _is_dataloader_shuffled(loader)  # a RandomSampler, as DataLoader's
    assert not _is_dataloader_shuffled(stoker.Loader(ds, batch_size=4))
    assert not has_iterable_dataset(loader)
    _set_sampler_epoch(loader, 4)
    assert loader.epoch == 4
    loader.worker_init_fn = print  # Lightning assigns it under PL_SEED_WORKERS=1
    assert epoch_labels(loader) == _order(ds, 4)


# -- habits ----------------------------------------------------------------------------------

def test_loader_and_dataset_as_context_managers(tmp_path):
    from conftest import settled_thread_count, stoker_threads

    with stoker.Dataset(write_dataset(tmp_path / "d", 40).path) as ds:
        with stoker.Loader(ds, batch_size=4, num_threads=2) as loader:
            first = epoch_labels(loader)
            assert stoker_threads()
        assert settled_thread_count() and not stoker_threads()  # closed: no worker left
        assert epoch_labels(loader) == first  # a closed loader stays usable
        kept = stoker.Loader(ds, batch_size=4)
    assert ds.closed and "closed" in repr(ds)
    with pytest.raises(ValueError, match="closed"):
        ds[0]
    with pytest.raises(ValueError, match="closed"):
        stoker.Loader(ds, batch_size=4)
    # a loader made before goes on over its own reference to the shards
    assert epoch_labels(kept) == first and kept.state_dict()["dataset"]["num_records"] == 40


def test_epoch_and_state_after_a_break(ds):
    """After a break out of epoch 0, loader.epoch says what the loader runs next (epoch
    1) and state_dict() what a resume continues (the rest of epoch 0), as documented."""
    loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=3)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    state = loader.state_dict()
    assert loader.epoch == 1 and (state["epoch"], state["position"]) == (0, 12)
    resumed = stoker.Loader(ds, batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    assert resumed.epoch == 0 and epoch_labels(resumed) == _order(ds, 0)[3:]
    assert epoch_labels(loader) == _order(ds, 1)


def test_even_batches_false_with_drop_last_is_an_error(ds):
    with pytest.raises(ValueError, match="even_batches=False does nothing with drop_last"):
        stoker.Loader(ds, batch_size=4, drop_last=True, even_batches=False)


# -- Lightning -------------------------------------------------------------------------

def test_lightning_single_process_epochs_and_checkpoint_resume(ds, tmp_path):
    out = str(tmp_path / "run")
    script = os.path.join(HERE, "lightning_train.py")
    # interrupted mid-epoch (step 3 of 10) and at an epoch's end (step 10), then resumed
    steps = (3, 10)
    run_framework_scripts(
        [sys.executable, script, ds.path, out + "-full", "--max-epochs", "3"],
        *([sys.executable, script, ds.path, out + f"-a{step}", "--max-steps", str(step),
           "--ckpt-dir", str(tmp_path / f"ck{step}"), "--every-n-steps", str(step)]
          for step in steps))
    run_framework_scripts(*(
        [sys.executable, script, ds.path, out + f"-b{step}", "--max-epochs", "3",
         "--resume", str(tmp_path / f"ck{step}" / f"step={step}.ckpt")] for step in steps))
    full = _results(out + "-full", 1)[0]
    assert _by_epoch(full["seen"], 3) == [_order(ds, e) for e in range(3)]
    for step in steps:
        seen = _results(out + f"-a{step}", 1)[0]["seen"] + _results(out + f"-b{step}", 1)[0]["seen"]
        assert seen == full["seen"], f"resumed at step {step}"


def test_lightning_with_a_python_stage_resumes_exactly(ds, tmp_path):
    """map and batch_map (draws from their generators) in the training loader: the order is
    the loader's, the rows are mapped, and a run stopped at a mid-epoch checkpoint and
    resumed trains on exactly the rows (pixels and batch_map's draws) of the run that was
    not stopped."""
    out = str(tmp_path / "run")
    script = os.path.join(HERE, "lightning_train.py")
    ck = str(tmp_path / "ck")
    run_framework_scripts(
        [sys.executable, script, ds.path, out + "-plain", "--max-epochs", "2"],
        [sys.executable, script, ds.path, out + "-full", "--max-epochs", "2", "--map"],
        [sys.executable, script, ds.path, out + "-a", "--max-steps", "13", "--ckpt-dir", ck,
         "--every-n-steps", "13", "--map"])
    plain, full = _results(out + "-plain", 1)[0], _results(out + "-full", 1)[0]
    assert _by_epoch(full["seen"], 2) == [_order(ds, e) for e in range(2)]
    assert len(full["rows"]) == 80 and not set(full["rows"]) & set(plain["rows"])
    _run([sys.executable, script, ds.path, out + "-b", "--max-epochs", "2", "--map",
          "--resume", os.path.join(ck, "step=13.ckpt")])
    a, b = _results(out + "-a", 1)[0], _results(out + "-b", 1)[0]
    assert a["seen"] + b["seen"] == full["seen"]
    assert a["rows"] + b["rows"] == full["rows"]


def test_lightning_validation_test_and_predict_loaders(ds, tmp_path):
    """A stoker loader for every kind Lightning takes: the sanity check, validation twice
    an epoch with limit_val_batches, then trainer.validate, trainer.test and
    trainer.predict. Each evaluation run reads its loader from the start."""
    evalset = write_dataset(tmp_path / "eval", 23, shard_size="1KB")
    out = str(tmp_path / "run")
    _run([sys.executable, os.path.join(HERE, "lightning_train.py"), ds.path, out,
          "--max-epochs", "2", "--val", evalset.path, "--val-check-interval", "0.5",
          "--limit-val-batches", "3", "--evaluate"])
    seen = _results(out, 1)[0]["seen"]
    assert _by_epoch(seen, 2) == [_order(ds, e) for e in range(2)]
    whole = _batches(list(range(23)), 5)
    assert _eval_runs(seen, "sanity") == [whole[:2]]
    assert _eval_runs(seen, "val") == [whole[:3]] * 5  # 2 per epoch, then validate()
    assert _eval_runs(seen, "test") == [whole]
    assert _eval_runs(seen, "predict") == [whole]
    # validation ran mid-epoch: after the 5th of each epoch's 10 batches
    kinds = [x[0] for x in seen if x[0] != "sanity"]
    assert kinds[:8] == [0] * 5 + ["val"] * 3 and kinds[8:16] == [0] * 5 + ["val"] * 3


def test_lightning_reloaded_loaders_follow_the_epoch(ds, tmp_path):
    out = str(tmp_path / "run")
    _run([sys.executable, os.path.join(HERE, "lightning_train.py"), ds.path, out,
          "--max-epochs", "3", "--reload"])
    seen = _results(out, 1)[0]["seen"]
    assert _by_epoch(seen, 3) == [_order(ds, e) for e in range(3)]


def test_lightning_ddp_two_processes_shard_evaluate_and_resume(ds, tmp_path):
    """The loader is made before Lightning starts the process group; each rank must get
    its own share, every epoch the order of that stoker epoch; validation, test and
    predict loaders (even_batches=False) cover their set exactly once across the ranks;
    and a mid-epoch checkpoint (saved by rank 0, loaded on both ranks) of a run with a
    validation loader must resume exactly."""
    evalset = write_dataset(tmp_path / "eval", 23, shard_size="1KB")
    script = os.path.join(HERE, "lightning_train.py")
    out = str(tmp_path / "ddp")
    val = ["--val", evalset.path]
    ck = str(tmp_path / "ck")
    run_framework_scripts(
        [sys.executable, script, ds.path, out, "--devices", "2", "--max-epochs", "2", *val,
         "--evaluate"],
        [sys.executable, script, ds.path, out + "-a", "--devices", "2", "--max-steps", "2",
         "--ckpt-dir", ck, "--every-n-steps", "2", *val])
    res = _results(out, 2)
    assert {r["world"] for r in res} == {2}
    for r in res:
        assert _by_epoch(r["seen"], 2) == [_order(ds, e, r["rank"], 2) for e in range(2)]
    ranks = [sum(_by_epoch(r["seen"], 2)[0], []) for r in res]
    assert not set(ranks[0]) & set(ranks[1]) and len(ranks[0]) == len(ranks[1]) == 20
    for kind, runs in (("val", 3), ("test", 1), ("predict", 1)):  # 2 in fit, validate()
        per_rank = [_eval_runs(r["seen"], kind) for r in res]
        assert len(per_rank[0]) == len(per_rank[1]) == runs
        for a, b in zip(*per_rank, strict=True):
            assert len(a) == len(b) == 3  # ceil(23 / 2 / 5) batches on each rank
            assert sorted(sum(a + b, [])) == list(range(23))  # every sample once
    _run([sys.executable, script, ds.path, out + "-b", "--devices", "2", "--max-epochs", "2",
          "--resume", os.path.join(ck, "step=2.ckpt"), *val])
    for a, b, full in zip(_results(out + "-a", 2), _results(out + "-b", 2), res, strict=True):
        assert _train(a["seen"]) + _train(b["seen"]) == _train(full["seen"])
        assert _eval_runs(b["seen"], "val") == _eval_runs(full["seen"], "val")[:2]


def _rows_of_epoch(result, epoch):
    """Content hashes of the rows a rank trained on in `epoch`."""
    sizes = [(e, len(labels)) for e, labels in _train(result["seen"])]
    rows, out = iter(result["rows"]), []
    for e, n in sizes:
        taken = [next(rows) for _ in range(n)]
        if e == epoch:
            out += taken
    return out


def test_lightning_elastic_resume_gives_every_row_of_the_epoch_once(tmp_path):
    """A mid-epoch checkpoint resumed on more or fewer processes (1 -> 2, 2 -> 1, 2 -> 3):
    the rows trained before it and after it are every row of the epoch exactly once, by
    content. Lightning would end the epoch by its own batch counter (batches of the old
    world size); stoker.lightning.ElasticResume, which Lightning adds to every Trainer
    through stoker's entry point, keeps it in step with the loader."""
    import hashlib

    import numpy as np

    d = write_dataset(tmp_path / "d", 48, shard_size="1KB")
    every = sorted(hashlib.sha1(np.full((3, 4, 4), i, np.uint8).tobytes()).hexdigest()
                   for i in range(48))
    script = os.path.join(HERE, "lightning_train.py")

    def args(out, devices, *more):
        return [sys.executable, script, d.path, str(tmp_path / out), "--devices", str(devices),
                "--batch-size", "2", *more]

    def checkpoint(out, devices, steps):
        return args(out, devices, "--max-steps", str(steps), "--ckpt-dir", str(tmp_path / out),
                    "--every-n-steps", str(steps))

    # mid-epoch checkpoints, each of 12 of the 48 rows, then resumed on other world sizes
    run_framework_scripts(checkpoint("one", 1, 6), checkpoint("two", 2, 3))
    before1 = sum((r["rows"] for r in _results(tmp_path / "one", 1)), [])
    before2 = sum((r["rows"] for r in _results(tmp_path / "two", 2)), [])
    ck1, ck2 = str(tmp_path / "one" / "step=6.ckpt"), str(tmp_path / "two" / "step=3.ckpt")
    resumes = ((before1, ck1, 2), (before2, ck2, 1), (before2, ck2, 3))
    run_framework_scripts(*(args(f"{devices}-from-{ck[-6]}", devices, "--max-epochs", "1",
                                 "--resume", ck) for _, ck, devices in resumes))
    for before, ck, devices in resumes:
        res = _results(tmp_path / f"{devices}-from-{ck[-6]}", devices)
        after = [_rows_of_epoch(r, 0) for r in res]
        assert len({len(a) for a in after}) == 1  # every rank the same share
        assert sorted(before + sum(after, [])) == every, (devices, ck)


@pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")  # Lightning's, under torch 2.13
def test_lightning_resume_at_another_world_size_without_the_callback_is_refused(ds):
    """Without ElasticResume active (a stoker installed without its entry points), the
    state of another world size loaded by Lightning is refused with what to do."""
    from lightning.pytorch.utilities import CombinedLoader

    saved = stoker.Loader(ds, batch_size=2, shuffle=True, seed=3, rank=0, world_size=2)
    it = iter(saved)
    next(it)
    state = saved.state_dict()  # each of the 2 ranks took its first batch
    it.close()
    resumed = stoker.Loader(ds, batch_size=2, shuffle=True, seed=3, rank=0, world_size=1)
    with pytest.raises(RuntimeError, match="ElasticResume"):
        CombinedLoader(resumed)._load_state_dicts([state])
    resumed.load_state_dict(state)  # a plain loop needs no callback: exact at any world size
    taken = _order(ds, 0, 0, 2, 2)[0] + _order(ds, 0, 1, 2, 2)[0]
    assert sorted(sum(epoch_labels(resumed), []) + taken) == list(range(40))


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


def test_accelerate_with_a_python_stage_under_torchrun(ds, tmp_path):
    """A training loader with map (per-sample draws, 2 threads) under accelerate and
    torchrun: each rank's order is the loader's, the ranks' draws differ, and the
    mid-epoch save_state resumes into the same batches, pixels included."""
    evalset = write_dataset(tmp_path / "eval", 11, shard_size="2KB")
    out = str(tmp_path / "acc")
    _torchrun("accelerate_train.py", ds.path, evalset.path, out, "map")
    res = _results(out, 2)
    for r in res:
        want = [_order(ds, e, r["rank"], 2, seed=5) for e in range(2)]
        assert [[labels for labels, _ in epoch] for epoch in r["epochs"]] == want
        assert r["resumed"] == r["epochs"][1][3:]  # labels and pixel sums
        assert [labels for labels, _ in r["skipped"]] == _order(ds, 2, r["rank"], 2,
                                                                seed=5)[2:]
    plain = sum(int(v) for i in range(40) for v in ds[i]["x"].ravel())
    sums = sum(s for r in res for _, s in r["epochs"][0])
    assert sums > plain  # the noise (0..999 a value) was added to every pixel


def test_accelerate_save_state_resumed_on_more_processes(ds, tmp_path):
    """save_state after 3 batches of 1 process, load_state on 2: the two ranks train on
    exactly the rows the first run had not, each once."""
    script = os.path.join(HERE, "accelerate_elastic.py")
    state, out = str(tmp_path / "state"), str(tmp_path / "out")
    _run([sys.executable, script, ds.path, state, out + "-one", "save", "3"])
    _torchrun("accelerate_elastic.py", ds.path, state, out, "resume")
    before = _results(out + "-one", 1)[0]["labels"]
    after = [r["labels"] for r in _results(out, 2)]
    assert before == sum(_order(ds, 0, seed=7)[:3], [])
    assert len(after[0]) == len(after[1]) == 14
    assert sorted(before + after[0] + after[1]) == list(range(40))


def test_accelerate_skip_first_batches_is_loader_skip(ds):
    """accelerate's skip_first_batches (and Accelerator's, and the name transformers'
    Trainer imports) take a stoker.Loader: the same loader, starting at batch n of the
    epoch set after it, without reading the batches before."""
    import accelerate
    import transformers.trainer

    for skip in (accelerate.skip_first_batches, accelerate.Accelerator(cpu=True).skip_first_batches,
                 transformers.trainer.skip_first_batches):
        loader = stoker.Loader(ds, batch_size=4, shuffle=True, seed=3)
        assert skip(loader, 3) is loader
        loader.set_epoch(1)  # after the skip, as the Trainer does
        assert epoch_labels(loader) == _order(ds, 1)[3:]
        assert loader.stats()["batches"] == 7  # the 3 skipped were never read
        assert epoch_labels(loader) == _order(ds, 2)  # the next epoch whole
    # anything else still goes to accelerate's own function
    import torch

    plain = torch.utils.data.DataLoader(list(range(10)), batch_size=2)
    assert [b.tolist() for b in accelerate.skip_first_batches(plain, 3)] == [[6, 7], [8, 9]]


def test_skip_first_batches_whatever_the_import_order(ds):
    """`import stoker` before or after accelerate: every name is stoker's wrapper, the
    user's `from accelerate import skip_first_batches` included (transformers' name:
    test_accelerate_skip_first_batches_is_loader_skip)."""
    check = ("import stoker\n"
             "loader = stoker.Loader(%r, batch_size=4)\n"
             "assert skip_first_batches(loader, 9) is loader\n"
             "assert [b['label'].tolist() for b in loader] == [[36, 37, 38, 39]]\n"
             "import accelerate, accelerate.accelerator\n"
             "assert accelerate.accelerator.skip_first_batches is skip_first_batches\n"
             "assert accelerate.skip_first_batches is skip_first_batches\n") % ds.path
    for first in ("import stoker\nfrom accelerate import skip_first_batches\n",
                  "import accelerate.data_loader\nimport stoker\n"
                  "from accelerate import skip_first_batches\n"):
        _run([sys.executable, "-c", first + check])


# -- transformers' Trainer -------------------------------------------------------------------

def test_hf_trainer_resumes_a_killed_run_exactly(tmp_path):
    """trainer.train(resume_from_checkpoint=...) over a stoker loader, no patching by the
    user: a run killed after its checkpoint at step 13 (epoch 1, gradient accumulation
    2) resumes with exactly the batches the uninterrupted run had from there."""
    pytest.importorskip("transformers", reason="the test extra installs transformers")
    import numpy as np

    tokens = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 64, 645).astype(np.uint16).tofile(tokens)
    script = os.path.join(HERE, "hf_trainer.py")
    full, first, rest = (str(tmp_path / f"{n}.json") for n in ("full", "first", "rest"))
    run_framework_scripts([sys.executable, script, tokens, tmp_path / "full", full],
                          [sys.executable, script, tokens, tmp_path / "run", first,
                           "--save-steps", "13", "--kill-at", "15"], returncodes=[0, -9])
    _run([sys.executable, script, tokens, tmp_path / "run", rest, "--save-steps", "13",
          "--resume", tmp_path / "run" / "checkpoint-13"])
    full, first, rest = (json.loads(Path(f).read_text()) for f in (full, first, rest))
    assert len(full) == 40  # 2 epochs of 20 batches (10 optimizer steps each)
    assert first == full[:30]
    assert rest == full[26:]  # 13 steps of 2 batches done
    assert rest[:14] != full[6:20]  # epoch 1's rows, not epoch 0's
    # The same checkpoint as 2 processes save it (one RNG file per rank), resumed by 1:
    # the Trainer's step arithmetic means other samples there, and that is refused.
    import shutil

    two = tmp_path / "two" / "checkpoint-13"
    shutil.copytree(tmp_path / "run" / "checkpoint-13", two)
    for rank in range(2):
        shutil.copy(two / "rng_state.pth", two / f"rng_state_{rank}.pth")
    os.remove(two / "rng_state.pth")
    p = _run([sys.executable, script, tokens, tmp_path / "two", tmp_path / "two.json",
              "--resume", two], returncode=1)
    assert "saved by 2 process(es) and this run has 1" in p.stderr


def test_hf_trainer_refuses_labels_shifted_twice(tmp_path):
    """labels='shifted' (nanoGPT's) under transformers' Trainer, whose models shift the
    labels again, would train on token t+2 in silence: refused, naming the fix."""
    import numpy as np

    tokens = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 64, 645).astype(np.uint16).tofile(tokens)
    script = os.path.join(HERE, "hf_trainer.py")
    p = _run([sys.executable, script, tokens, tmp_path / "run", tmp_path / "r.json",
              "--labels", "shifted"], returncode=1)
    assert "labels='unshifted'" in p.stderr and "t+2" in p.stderr


@pytest.mark.parametrize("packing", [None, "document"])
def test_hf_causal_lm_loss_is_the_intended_target(tmp_path, packing):
    """labels="unshifted": a HuggingFace causal LM (a tiny GPT-2, random weights) given a
    stoker batch as is, model(**batch).loss, trains on the next token of the same
    document and nothing else: the cross-entropy computed by hand, each document run
    through the model on its own, against the targets of labels="shifted"."""
    pytest.importorskip("transformers", reason="the test extra installs transformers")
    import numpy as np
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    rng = np.random.default_rng(5)
    with stoker.ShardWriter(tmp_path / "docs", {"tokens": stoker.tokens("uint16")}) as w:
        for _ in range(60):
            w.write({"tokens": rng.integers(0, 64, int(rng.integers(2, 20))).astype(np.uint16)})
    kw = dict(batch_size=4, seq_len=32, packing=packing, shuffle=True, seed=1)
    ds = stoker.TokenDataset(tmp_path / "docs")
    batch = next(iter(stoker.Loader(ds, labels="unshifted", **kw)))
    targets = next(iter(stoker.Loader(ds, **kw)))["labels"]  # nanoGPT's: the next token
    if packing is None:
        assert set(batch) == {"input_ids", "labels"}
        targets[:, -1] = -100  # the row's last token: its next one is not in the row
    else:
        assert list(batch) == ["input_ids", "labels", "position_ids", "cu_seq_lens_q",
                               "cu_seq_lens_k", "max_length_q", "max_length_k"]
        cu = batch["cu_seq_lens_q"]
        assert cu.dtype == torch.int32 and torch.equal(cu, batch["cu_seq_lens_k"])
        assert batch["max_length_q"] == batch["max_length_k"] == int(cu.diff().max())
        assert isinstance(batch["max_length_q"], int)  # as DataCollatorWithFlattening
    torch.manual_seed(0)
    # use_cache=False: a forward without a KV cache (training) is what makes HF build the
    # per-document attention mask from position_ids when flash-attention is not in use
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                       n_head=2, use_cache=False)).eval()
    with torch.no_grad():
        loss = model(**batch).loss
        # by hand: every sequence of every row through the model alone
        losses = []
        ids = batch["input_ids"].flatten()
        bounds = [0, *range(32, 129, 32)] if packing is None else cu.tolist()
        for a, b in zip(bounds, bounds[1:]):
            logits = model(ids[a:b][None]).logits[0]
            want = targets.flatten()[a:b]
            keep = want != -100
            losses.append(torch.nn.functional.cross_entropy(logits[keep], want[keep],
                                                            reduction="none"))
        by_hand = torch.cat(losses).mean()
    assert len(torch.cat(losses)) > 60
    torch.testing.assert_close(loss, by_hand, rtol=1e-5, atol=1e-6)
    # the old mistake, shifted labels given to an HF model, trains on token t + 2
    with torch.no_grad():
        wrong = model(**{**batch, "labels": next(iter(stoker.Loader(ds, **kw)))["labels"]}).loss
    assert abs(float(wrong) - float(by_hand)) > 1e-3


# -- torchrun ---------------------------------------------------------------------------------

def test_torchrun_scheduled_mix_made_before_the_process_group(tmp_path):
    """A schedule's steps are batches of the whole job: a loader built before the
    process group exists (one rank then) switches at step 20 on 2 ranks, not at step 10."""
    a = write_dataset(tmp_path / "a", 60, shard_size="1KB")
    b = write_dataset(tmp_path / "b", 60, shard_size="1KB")
    out = str(tmp_path / "mix")
    _torchrun("torchrun_mix_schedule.py", a.path, b.path, out)
    for r in _results(out, 2):
        assert r["batches"] == 50  # 400 rows, 4 a batch, 2 ranks
        assert r["sources"] == [[0]] * 20 + [[1]] * 30, r["rank"]


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
