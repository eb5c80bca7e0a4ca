"""Epochs as training frameworks count them, concurrent iterators, resume state, pickling
(NOTE [ Epochs and iterators ] in csrc/pipeline/loader_core.h)."""

import copy
import itertools
import pickle

import numpy as np
import pytest
import stoker
import torch
from conftest import epoch_labels, write_dataset

KW = dict(batch_size=10, shuffle=True, seed=4, num_threads=2)


def reference(ds, epoch, **kw):
    loader = stoker.Loader(ds, prefetch_next_epoch=False, **{**KW, **kw})
    loader.set_epoch(epoch)
    return epoch_labels(loader)


# -- which epoch an iterator runs --------------------------------------------------

def test_an_iterator_that_yields_nothing_uses_no_epoch(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    for _ in range(3):
        iter(loader)  # as Lightning does to check that the loader is iterable
    assert loader.epoch == 0
    assert epoch_labels(loader) == reference(small_ds, 0)
    assert epoch_labels(loader) == reference(small_ds, 1)


def test_sampler_set_epoch_is_the_framework_hook(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    loader.sampler.set_epoch(3)  # Lightning's and accelerate's _set_sampler_epoch
    assert loader.epoch == 3
    assert epoch_labels(loader) == reference(small_ds, 3)


def test_set_epoch_of_the_running_epoch_confirms_it(small_ds):
    """A framework calling set_epoch(e) at the start of epoch e, after the iterator of e
    started, must not make epoch e + 1 a copy of e."""
    loader = stoker.Loader(small_ds, **KW)
    orders = []
    for epoch in range(3):
        it = iter(loader)
        first = next(it)
        loader.set_epoch(epoch)  # on_train_epoch_start, after the fetcher's first batch
        orders.append([first["label"].tolist()] + [b["label"].tolist() for b in it])
    assert orders == [reference(small_ds, e) for e in range(3)]


def test_set_epoch_before_the_first_batch_applies_to_that_iterator(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    it = iter(loader)  # not advanced: no epoch fixed yet
    loader.set_epoch(5)
    assert [b["label"].tolist() for b in it] == reference(small_ds, 5)


def test_set_epoch_to_another_epoch_while_running_applies_to_the_next(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    it = iter(loader)
    head = [next(it)["label"].tolist()]
    loader.set_epoch(7)
    assert head + [b["label"].tolist() for b in it] == reference(small_ds, 0)
    assert epoch_labels(loader) == reference(small_ds, 7)


# -- concurrent iterators ---------------------------------------------------------------

def test_zip_of_a_loader_with_itself_yields_every_pair(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    pairs = list(zip(loader, loader, strict=True))
    assert len(pairs) == len(loader)
    want = reference(small_ds, 0)
    assert [a["label"].tolist() for a, _ in pairs] == want
    assert [b["label"].tolist() for _, b in pairs] == want  # the same epoch, on its own


def test_an_iterator_goes_on_when_another_starts(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    it = iter(loader)
    head = [next(it)["label"].tolist() for _ in range(5)]
    other = iter(loader)
    assert len(list(other)) == len(loader)  # a whole epoch of its own
    assert head + [b["label"].tolist() for b in it] == reference(small_ds, 0)


def test_peeking_inside_the_loop_changes_nothing(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        labels = []
        for step, b in enumerate(loader):
            labels.append(b["label"].tolist())
            if step == 2:
                sample = next(iter(loader))  # the common peek, e.g. to log a batch
                assert sample["label"].shape == (10,)
        epochs.append(labels)
    assert epochs == [reference(small_ds, e) for e in range(2)]
    assert epoch_labels(loader) == reference(small_ds, 2)  # and the next epoch is intact


# -- resume: one state for all ranks ------------------------------------------------------

def test_the_state_is_the_same_on_every_rank_and_loads_on_any(tmp_path):
    ds = write_dataset(tmp_path / "d", 103)
    world = 3
    loaders = [stoker.Loader(ds, **KW, rank=r, world_size=world) for r in range(world)]
    its = [iter(loader) for loader in loaders]
    for it in its:
        for _ in range(2):
            next(it)
    states = [loader.state_dict() for loader in loaders]
    assert states[0] == states[1] == states[2]
    assert states[0]["position"] == 2 * 10 * world
    # rank 0's state (what Lightning saves) resumes rank 2 exactly
    resumed = stoker.Loader(ds, **KW, rank=2, world_size=world)
    resumed.load_state_dict(states[0])
    rest = [b["label"].tolist() for b in its[2]]
    assert epoch_labels(resumed) == rest


@pytest.mark.parametrize("new_world", [1, 2, 4, 5])
def test_elastic_resume_continues_with_exactly_the_rest(tmp_path, new_world):
    """Saved at 3 ranks after 2 batches, resumed at another world size: across all new
    ranks, the remaining samples are exactly those not yet yielded, plus the wrap
    padding that equal batch counts need (never a sample consumed before)."""
    n = 103
    ds = write_dataset(tmp_path / "d", n)
    full = reference(ds, 0, batch_size=5)  # one rank: the epoch order
    order = sum(full, [])
    world = 3
    consumed = []
    for r in range(world):
        loader = stoker.Loader(ds, **{**KW, "batch_size": 5}, rank=r, world_size=world)
        it = iter(loader)
        consumed += sum((next(it)["label"].tolist() for _ in range(2)), [])
        state = loader.state_dict()
    assert sorted(consumed) == sorted(order[:30])
    rest = []
    counts = set()
    for r in range(new_world):
        loader = stoker.Loader(ds, **{**KW, "batch_size": 5}, rank=r, world_size=new_world)
        loader.load_state_dict(state)
        batches = epoch_labels(loader)
        counts.add(len(batches))
        rest += sum(batches, [])
    assert len(counts) == 1  # every rank the same number of batches
    left = order[30:]
    assert sorted(set(rest)) == sorted(left)  # nothing lost, nothing consumed comes again
    padding = len(rest) - len(left)
    assert 0 <= padding < new_world
    assert sorted(rest) == sorted(left + left[:padding])  # padding: the first ones left


def test_resume_refuses_another_dataset_or_settings(small_ds, tmp_path):
    state = stoker.Loader(small_ds, **KW).state_dict()
    other = write_dataset(tmp_path / "o", 101)
    with pytest.raises(ValueError, match="another dataset"):
        stoker.Loader(other, **KW).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        stoker.Loader(small_ds, **{**KW, "seed": 5}).load_state_dict(state)


def test_skip_starts_the_epoch_at_a_batch_without_reading_the_ones_before(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    loader.set_epoch(2)
    assert [b["label"].tolist() for b in loader.skip(3)] == reference(small_ds, 2)[3:]
    assert epoch_labels(loader) == reference(small_ds, 3)
    assert loader.stats()["batches"] == 7 + 10


# -- evaluation without repeats ------------------------------------------------------------

@pytest.mark.parametrize("n, world, bs", [(101, 2, 10), (103, 4, 5), (7, 8, 3), (100, 3, 7)])
def test_uneven_evaluation_covers_the_set_exactly_with_equal_batch_counts(tmp_path, n, world,
                                                                         bs):
    ds = write_dataset(tmp_path / "d", n)
    seen, counts = [], set()
    for r in range(world):
        loader = stoker.Loader(ds, batch_size=bs, rank=r, world_size=world,
                               even_batches=False)
        batches = epoch_labels(loader)
        assert len(batches) == len(loader)
        counts.add(len(batches))
        assert sum(len(b) for b in batches) == loader.num_samples
        seen += sum(batches, [])
    assert len(counts) == 1
    assert sorted(seen) == list(range(n))  # every sample exactly once


# -- pickling and copies ----------------------------------------------------------------------

def test_dataset_pickles_by_path_and_refuses_a_changed_one(tmp_path):
    ds = write_dataset(tmp_path / "d", 50)
    blob = pickle.dumps(ds)
    again = pickle.loads(blob)
    assert len(again) == 50 and again[7]["label"] == 7
    write_dataset(tmp_path / "d", 60, overwrite=True)
    with pytest.raises(stoker.DataError, match="changed since it was pickled"):
        pickle.loads(blob)


def test_loader_pickles_with_its_position(small_ds):
    loader = stoker.Loader(small_ds, **KW)
    loader.set_epoch(1)
    it = iter(loader)
    head = [next(it)["label"].tolist() for _ in range(4)]
    copied = pickle.loads(pickle.dumps(loader))
    deep = copy.deepcopy(loader)
    want = reference(small_ds, 1)
    assert head + epoch_labels(copied) == want
    assert head + epoch_labels(deep) == want
    assert copied.batch_size == 10 and copied.seed == 4


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_dataloader_workers_of_any_start_method_read_a_stoker_dataset(small_ds, context):
    dl = torch.utils.data.DataLoader(small_ds, batch_size=10, num_workers=2,
                                     multiprocessing_context=context)
    labels = sorted(itertools.chain.from_iterable(b["label"].tolist() for b in dl))
    assert labels == list(range(100))
    first = next(iter(dl))
    assert first["x"].shape == (10, 3, 4, 4)
    assert np.array_equal(first["x"][3].numpy(), small_ds[3]["x"])


# -- migration errors ------------------------------------------------------------------------

def test_dataloader_arguments_keep_their_meaning(small_ds):
    # DataLoader's arguments are stoker's too (tests/test_dataloader_args.py); without a
    # Python stage num_workers is the C++ workers' count
    assert stoker.Loader(small_ds, num_workers=3).num_threads == 3
    with pytest.raises(TypeError, match="unexpected keyword argument 'bach_size'"):
        stoker.Loader(small_ds, bach_size=4)

    # collate_fn and torch Datasets keep DataLoader's meaning (tests/test_python_stage.py)
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i * i

    assert [b.tolist() for b in stoker.Loader(Squares(), batch_size=2)] == [[0, 1], [4, 9]]
    assert list(stoker.Loader(Squares(), batch_size=2, collate_fn=sum)) == [1, 13]
