"""What a DataLoader user passes, read as DataLoader reads it (stoker/_dropin.py): seeds
drawn from torch's generators, worker processes for num_workers, sampler items over a
stoker.Dataset, DataLoader's sampler and batch_sampler objects (YOLO's InfiniteDataLoader),
compared with DataLoader itself where the meaning is the same."""

import ctypes
import os
import random

import numpy as np
import pytest
import stoker
import torch
from conftest import write_dataset
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler


class Drawing(Dataset):
    """A __getitem__ that draws from Python's, NumPy's and torch's global generators, as
    torchvision-style augmentation code does."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"i": i, "r": random.random(), "n": float(np.random.rand()),
                "t": torch.rand(())}


def _draws(batches):
    return [(b["i"].tolist(), b["r"].tolist(), b["n"].tolist(), b["t"].tolist())
            for b in batches]


def _scramble(k):
    """Another process's global generators (what a new run starts from)."""
    random.seed(1000 + k)
    np.random.seed(2000 + k)


# -- seeds: torch.manual_seed selects the order (NOTE [ Seeds as DataLoader draws them ]) -----

def test_torch_manual_seed_selects_the_order_as_with_dataloader():
    ds = torch.utils.data.TensorDataset(torch.arange(50))

    def order(s, **kw):
        torch.manual_seed(s)
        return [b[0].tolist() for b in stoker.Loader(ds, batch_size=8, shuffle=True, **kw)]

    assert order(1) == order(1)
    assert len({str(order(s)) for s in range(4)}) == 4  # a seed sweep varies the order
    assert order(1, seed=5) == order(2, seed=5)  # an explicit seed is the loader's own
    torch.manual_seed(3)
    loader = stoker.Loader(ds, batch_size=8, shuffle=True)
    assert isinstance(loader.plan.sampling.seed, int) and loader.seed == loader.state_dict()["seed"]


def test_a_drawn_seed_is_kept_in_the_state_and_taken_by_a_resume():
    ds = torch.utils.data.TensorDataset(torch.arange(50))
    torch.manual_seed(11)
    loader = stoker.Loader(ds, batch_size=8, shuffle=True)
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b[0].tolist() for b in it]
    torch.manual_seed(12)  # another process: torch's generator elsewhere
    again = stoker.Loader(ds, batch_size=8, shuffle=True)
    again.load_state_dict(state)
    assert [b[0].tolist() for b in again] == rest and len(head) + len(rest) == 7
    assert again.seed == loader.seed
    with pytest.raises(ValueError, match="seed"):  # an explicit seed must match
        stoker.Loader(ds, batch_size=8, shuffle=True, seed=loader.seed + 1).load_state_dict(state)


# -- reproducible with DataLoader's arguments -------------------------------------------------

@pytest.mark.parametrize("kw", [dict(num_workers=2), dict(num_workers=3), dict()],
                         ids=["num_workers=2", "num_workers=3", "no flags"])
def test_global_draws_give_the_same_batches_run_to_run(kw):
    """A Dataset drawing from random / np.random / torch: the same torch.manual_seed gives
    the same batches, whatever the other generators' states, the worker count, and on
    stoker's own default (threads first: its watched first sample runs as a worker
    process runs it)."""
    runs = []
    for k in range(3):
        _scramble(k)
        torch.manual_seed(7)
        loader = stoker.Loader(Drawing(), batch_size=4, shuffle=True, **kw)
        runs.append(_draws(loader))
        loader.close()
    assert runs[0] == runs[1] == runs[2]
    torch.manual_seed(7)
    other = stoker.Loader(Drawing(), batch_size=4, shuffle=True, num_workers=2)
    assert _draws(other) == runs[0]  # the same draws for any worker count
    torch.manual_seed(8)
    assert _draws(stoker.Loader(Drawing(), batch_size=4, shuffle=True, num_workers=2)) != \
        runs[0]


def test_global_draws_resume_exactly_mid_epoch():
    torch.manual_seed(3)
    loader = stoker.Loader(Drawing(), batch_size=4, shuffle=True, num_workers=2)
    _draws(loader)  # epoch 0
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    rest = _draws(it)
    loader.close()
    _scramble(9)
    torch.manual_seed(4)
    again = stoker.Loader(Drawing(), batch_size=4, shuffle=True, num_workers=3)
    again.load_state_dict(state)
    assert _draws(again) == rest and len(head) + len(rest) == 6


def test_a_chunks_keys_seed_each_sample_as_its_own_key_does():
    """A worker makes the global generators' keys of a chunk at once: each sample's draws
    are those of its own key (what a thread's watched sample and a replacement use)."""
    from stoker._stage.workers import prepare_chunk, seed_globals

    draws = []
    for chunk in ([], [3, 9, 4]):
        prepare_chunk(5, 2, chunk)
        seed_globals(5, 2, 9)
        draws.append((random.random(), float(np.random.rand()), float(torch.rand(()))))
    prepare_chunk(5, 3, [9])  # another epoch's keys: sample 9 of epoch 2 draws otherwise
    seed_globals(5, 3, 9)
    assert draws[0] == draws[1] != (random.random(), float(np.random.rand()),
                                    float(torch.rand(())))
    prepare_chunk(-1, -1, [])


def test_num_workers_means_worker_processes():
    loader = stoker.Loader(Drawing(), batch_size=4, num_workers=2)
    assert loader.plan.stage.workers == "process"
    assert stoker.Loader(Drawing(), batch_size=4, num_workers=2,
                         python_workers="thread").plan.stage.workers == "thread"
    assert stoker.Loader(Drawing(), batch_size=4).plan.stage.workers == "auto"


class _Misfit(Dataset):
    """Sample 20 has another shape than the others (checked after the layout is fixed:
    at most four requests are out, of batches 0-1, when the loader starts)."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"i": i, "x": np.full((2, 4 if i == 20 else 3), i, np.float32)}


def test_a_sample_that_does_not_fit_fails_its_batch_from_a_worker_process():
    """The training process checks what a worker sends (the worker does not check it
    too): the error names the sample."""
    loader = stoker.Loader(_Misfit(), batch_size=4, num_workers=2)
    with pytest.raises(ValueError, match=r"dataset index 20: field 'x' has shape \(2, 4\)"):
        list(loader)
    loader.close()


def test_on_error_skip_replaces_a_sample_that_does_not_fit_in_the_worker():
    """With on_error="skip" the worker checks each sample too, and replaces one that does
    not fit by the next good one in dataset order, as the threads do."""
    loader = stoker.Loader(_Misfit(), batch_size=4, num_workers=2, on_error="skip")
    with pytest.warns(RuntimeWarning, match="replaced 1 unreadable"):
        batches = list(loader)
    loader.close()
    assert [b["i"].tolist() for b in batches][5] == [21, 21, 22, 23]
    assert batches[5]["x"].shape == (4, 2, 3)


class _Segfault(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return ctypes.string_at(0)


def test_a_segfault_in_getitem_raises_in_the_loop_as_dataloader():
    """PyTorch's test_segfault: the worker dies, the loop raises DataLoader's words, and
    the training process goes on."""
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by "
                                           r"signal: Segmentation fault"):
        next(iter(stoker.Loader(_Segfault(), batch_size=2, num_workers=2)))


def test_thread_workers_leave_the_global_generators_alone_between_epochs():
    """Thread workers running a Dataset that draws from the global generators (asked for:
    python_workers="thread") never run the next epoch ahead of the loop: the process's
    generators are as the loop left them while it does something else (a validation
    loader's draws stay its own)."""
    import time

    class Slow(Drawing):
        def __getitem__(self, i):
            time.sleep(0.02)  # the next epoch's prefetch would still be running at its end
            return super().__getitem__(i)

    loader = stoker.Loader(Slow(), batch_size=4, num_workers=2, python_workers="thread")
    with pytest.warns(RuntimeWarning, match="global random generators"):
        list(loader)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    time.sleep(0.5)  # (the next epoch's prefetch would have drawn by now)
    after = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    assert before[0] == after[0] and np.array_equal(before[1], after[1])
    assert torch.equal(before[2], after[2])
    assert len(list(loader)) == 6  # and the next epoch runs when asked
    loader.close()


def test_the_watched_first_sample_leaves_the_global_generators_as_they_were():
    _scramble(0)
    torch.manual_seed(0)
    want = (random.random(), float(np.random.rand()), float(torch.rand(())))
    _scramble(0)
    torch.manual_seed(0)
    loader = stoker.Loader(Drawing(), batch_size=4, shuffle=True, seed=1)
    next(iter(loader))
    loader.close()
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == want


# -- sampler items over a stoker.Dataset ------------------------------------------------------

@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("recs") / "ds", 1000, shard_size="64KB")


@pytest.mark.parametrize("map_fn", [None, lambda s, rng: s], ids=["native", "map"])
def test_a_sampler_item_that_is_not_an_index_is_refused_over_a_stoker_dataset(records, map_fn):
    kw = {} if map_fn is None else {"map": map_fn}
    with pytest.raises(ValueError, match=r"gave None at position 1: a stoker.Dataset is read "
                                         r"by integer index"):
        list(stoker.Loader(records, batch_size=2, sampler=[700, None, 900, 3], **kw))
    with pytest.raises(ValueError, match=r"gave None at batch 1, position 1"):
        list(stoker.Loader(records, batch_sampler=[[700, 701], [900, None]], **kw))
    with pytest.raises(ValueError, match=r"gave \[0, 1\].*is a batch_sampler="):
        list(stoker.Loader(records, batch_size=2, sampler=[[0, 1], [2, 3]], **kw))
    with pytest.raises(ValueError, match="outside the dataset"):
        list(stoker.Loader(records, batch_size=2, sampler=[5, 1000], **kw))
    got = [b["label"].tolist() for b in stoker.Loader(records, batch_size=2,
                                                      sampler=[700, 5, 900, 3], **kw)]
    assert got == [[700, 5], [900, 3]]


def test_a_batch_sampler_as_sampler_without_batch_size_loads_in_bulk(records):
    """DataLoader's bulk-loading pattern: BatchSampler(RandomSampler(ds), 4, False) passed
    as sampler= with batch_size=None: each of its lists is a batch of those indices."""
    bs = BatchSampler(RandomSampler(range(1000), generator=torch.Generator().manual_seed(1)),
                      4, False)
    want = [list(b) for b in BatchSampler(RandomSampler(
        range(1000), generator=torch.Generator().manual_seed(1)), 4, False)]
    loader = stoker.Loader(records, batch_size=None, sampler=bs)
    got = [b["label"].tolist() for b in loader]
    assert got == want and len(got) == 250
    assert loader.sampler is bs and loader.batch_sampler is None  # DataLoader's attributes
    again = [b["label"].tolist() for b in loader]
    assert again != got and sorted(sum(again, [])) == list(range(1000))  # reshuffled


# -- DataLoader's sampler and batch_sampler; YOLO's InfiniteDataLoader ------------------------

def test_sampler_and_batch_sampler_are_dataloaders_objects():
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    for shuffle, kind in ((True, torch.utils.data.RandomSampler),
                          (False, torch.utils.data.SequentialSampler)):
        loader = stoker.Loader(ds, batch_size=4, shuffle=shuffle, seed=2)
        assert isinstance(loader.sampler, kind)
        assert isinstance(loader.batch_sampler, torch.utils.data.BatchSampler)
        assert loader.batch_sampler.sampler is loader.sampler
        assert loader.batch_sampler.batch_size == 4 and not loader.batch_sampler.drop_last
        assert len(loader.batch_sampler) == len(loader) == 3 and len(loader.sampler) == 10
        # iterating them gives the loader's next epoch
        planned = list(loader.batch_sampler)
        assert planned == [b[0].tolist() for b in loader]
        assert list(loader.sampler) == [i for b in planned for i in b] or shuffle
    unbatched = stoker.Loader(ds, batch_size=None)
    assert unbatched.batch_sampler is None  # as DataLoader's with batch_size=None
    dl = DataLoader(ds, batch_size=4, num_workers=0)
    assert dl.batch_sampler is not None  # (DataLoader without workers has one too)
    user = torch.utils.data.SequentialSampler(ds)
    assert stoker.Loader(ds, batch_size=2, sampler=user).sampler is user


def _infinite(base):
    """YOLO's InfiniteDataLoader (ultralytics' data/build.py), on `base`."""

    class _RepeatSampler:
        def __init__(self, sampler):
            self.sampler = sampler

        def __iter__(self):
            while True:
                yield from iter(self.sampler)

    class InfiniteDataLoader(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "batch_sampler", _RepeatSampler(self.batch_sampler))
            self.iterator = super().__iter__()

        def __len__(self):
            return len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

        def reset(self):
            self.iterator = self._get_iterator()

    return InfiniteDataLoader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_yolos_infinite_dataloader_runs_as_with_dataloader(num_workers):
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    kw = dict(batch_size=4, shuffle=True, num_workers=num_workers)
    want = _infinite(DataLoader)(ds, generator=torch.Generator().manual_seed(4), **kw)
    got = _infinite(stoker.Loader)(ds, generator=torch.Generator().manual_seed(4), **kw)
    assert len(got) == len(want) == 3
    for _ in range(3):  # epochs of one iterator that never ends
        assert [b[0].tolist() for b in got] == [b[0].tolist() for b in want]
    got.reset()
    assert len([b for b in got]) == 3
    pids = got._stage.workers.pids() if num_workers else []
    assert len(pids) == num_workers
    got.close()  # its iterator never ends: close() ends its workers, as a dropped loader's
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


# -- collate_fn and worker_init_fn: answered and read as DataLoader's ---------------------------

class _Vectors(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"x": torch.full((2,), float(i)), "i": i}


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(5))


def test_collate_fn_answers_dataloaders_default(tmp_path):
    """Without collate_fn, DataLoader's attribute is default_collate (default_convert with
    batch_size=None), and native batching gives its batches: so does a Loader's over a
    torch dataset, and calling it batches as the loader does. Over a stoker dataset, whose
    batches are stoker's layout, it is None; a given one is the one given."""
    for ds in (_Vectors(), _Stream()):
        for kw in ({"batch_size": 2}, {"batch_size": None}, {"batch_size": 3, "num_workers": 2}):
            want = DataLoader(ds, **kw).collate_fn
            got = stoker.Loader(ds, **kw)
            assert got.collate_fn is want, (type(ds).__name__, kw)
            got.close()
    loader = stoker.Loader(_Vectors(), batch_size=3)
    first = next(iter(loader))
    again = loader.collate_fn([_Vectors()[i] for i in range(3)])
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    records = stoker.Dataset(write_dataset(tmp_path / "d", 8).path)
    assert stoker.Loader(records, batch_size=4).collate_fn is None

    def mine(rows):
        return rows

    assert stoker.Loader(_Vectors(), batch_size=2, collate_fn=mine).collate_fn is mine


def test_collate_fn_assigned_later_is_used_from_the_next_epoch_as_dataloaders():
    """DataLoader reads loader.collate_fn at each iter(): one assigned is used from the
    next epoch, a running epoch keeps its own. So does a Loader; never ignored."""
    def firsts(rows):
        return [int(r["i"]) for r in rows]

    def run(cls):
        loader = cls(_Vectors(), batch_size=2, shuffle=True,
                     generator=torch.Generator().manual_seed(5))
        out = []
        it = iter(loader)
        out.append(next(it)["i"].tolist())
        loader.collate_fn = firsts  # mid-epoch: this epoch keeps native batching
        out += [b["i"].tolist() for b in it]
        out.append(list(loader))  # the next epoch: the new one
        loader.collate_fn = torch.utils.data.default_collate  # back to the default
        out.append([b["i"].tolist() for b in loader])
        return out

    want = run(DataLoader)
    got = run(stoker.Loader)
    assert got == want
    assert all(isinstance(b, list) for b in got[3]) and sorted(sum(got[3], [])) == list(range(6))


def test_worker_init_fn_assigned_later_runs_in_the_workers(tmp_path):
    """Lightning assigns loader.worker_init_fn (PL_SEED_WORKERS=1) after the loader was
    made: it runs in each worker of the next epoch, as DataLoader's does; a resume loaded
    and not started yet is kept across it."""
    marks = tmp_path / "marks"
    marks.mkdir()

    class Marking(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"i": i, "inited": os.path.exists(marks / f"{os.getpid()}")}

    def mark(worker_id):
        (marks / f"{os.getpid()}").write_text(str(worker_id))

    loader = stoker.Loader(Marking(), batch_size=2, num_workers=2)
    it = iter(loader)
    first = next(it)
    assert not first["inited"].any()
    state = loader.state_dict()
    loader.close()
    again = stoker.Loader(Marking(), batch_size=2, num_workers=2)
    again.load_state_dict(state)
    again.worker_init_fn = mark
    rest = list(again)
    assert [b["i"].tolist() for b in rest] == [[2, 3], [4, 5], [6, 7]]  # the resume kept
    assert all(b["inited"].all() for b in rest)
    assert sorted(int(p.read_text()) for p in marks.iterdir()) == [0, 1]
    again.close()


def _firsts(rows):
    return [int(r["i"]) for r in rows]


def test_a_pickled_loader_keeps_a_collate_fn_assigned_since():
    import pickle

    loader = stoker.Loader(_Vectors(), batch_size=4)
    loader.collate_fn = _firsts
    copy = pickle.loads(pickle.dumps(loader))
    assert list(copy) == list(loader) == [[0, 1, 2, 3], [4, 5]]
    copy.close()
    loader.close()


def test_a_collate_fn_the_loader_cannot_take_is_refused_at_iter_and_the_loader_kept():
    """A collate_fn assigned that the loader cannot take (not a function) raises its
    error at the next iter(), as DataLoader's does at its first batch, and leaves the
    loader as it was: assigned again, the epochs go on from where they were."""
    loader = stoker.Loader(_Vectors(), batch_size=4, num_workers=2)
    first = [b["i"].tolist() for b in loader]
    loader.collate_fn = 5
    with pytest.raises(TypeError, match="collate_fn must be a function"):
        iter(loader)
    with pytest.raises(ValueError, match="batch_size attribute should not be set"):
        loader.batch_size = 2  # still a made loader (the refusal came before anything)
    with pytest.raises(TypeError):
        next(iter(DataLoader(_Vectors(), batch_size=4, collate_fn=5)))
    loader.collate_fn = _firsts
    assert list(loader) == first
    assert loader.epoch == 2  # two epochs read: the refused iter() used none
    loader.close()
