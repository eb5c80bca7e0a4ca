"""Drop-in for DataLoader: DataLoader's arguments with DataLoader's meanings (NOTE
[ DataLoader's arguments ] in stoker/_plan.py), each compared with DataLoader itself where
the meaning is the same."""

import threading
import time
import warnings

import numpy as np
import pytest
import stoker
import torch
from conftest import write_dataset
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
)

N = 37


@pytest.fixture(scope="module")
def tds():
    return TensorDataset(torch.arange(N) * 10, torch.arange(N))


def _labels(batches):
    return [b[1].tolist() for b in batches]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


class EveryThird(Sampler):
    """A user's sampler class: indices 0, 3, 6, ... then the rest."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(list(range(0, self.n, 3)) + [i for i in range(self.n) if i % 3])

    def __len__(self):
        return self.n


SAMPLERS = {
    "sequential": lambda: SequentialSampler(range(N)),
    "random": lambda: RandomSampler(range(N), generator=_gen(3)),
    "random_replacement": lambda: RandomSampler(range(N), replacement=True, num_samples=50,
                                                generator=_gen(4)),
    "weighted": lambda: WeightedRandomSampler(np.linspace(0.1, 1, N), 60, generator=_gen(5)),
    "subset": lambda: SubsetRandomSampler(list(range(5, 30)), generator=_gen(6)),
    "distributed": lambda: DistributedSampler(range(N), num_replicas=3, rank=1, shuffle=True,
                                              seed=7),
    "user_class": lambda: EveryThird(N),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_gives_dataloaders_batches(tds, name, drop_last):
    mine, theirs = SAMPLERS[name](), SAMPLERS[name]()
    want = [_labels(DataLoader(tds, batch_size=8, sampler=theirs, drop_last=drop_last))
            for _ in range(2)]  # two epochs: a random sampler's order differs between them
    loader = stoker.Loader(tds, batch_size=8, sampler=mine, drop_last=drop_last)
    got = [_labels(loader) for _ in range(2)]
    assert got == want
    assert len(loader) == len(want[1])


def test_distributed_sampler_follows_set_epoch(tds):
    mine = DistributedSampler(range(N), num_replicas=2, rank=0, shuffle=True, seed=1)
    theirs = DistributedSampler(range(N), num_replicas=2, rank=0, shuffle=True, seed=1)
    loader = stoker.Loader(tds, batch_size=4, sampler=mine)
    dl = DataLoader(tds, batch_size=4, sampler=theirs)
    for epoch in (0, 1, 5):
        loader.set_epoch(epoch)  # passed on to the sampler, as Lightning's calls are
        theirs.set_epoch(epoch)
        assert _labels(loader) == _labels(dl)


class Buckets(Sampler):
    """A batch sampler of varying batch sizes (length bucketing)."""

    def __iter__(self):
        yield from ([0, 1, 2], [5], [3, 4, 6, 7, 8], [9, 10])

    def __len__(self):
        return 4


def test_batch_sampler_gives_dataloaders_batches(tds):
    for make in (lambda: BatchSampler(RandomSampler(range(N), generator=_gen(2)), 5, False),
                 lambda: BatchSampler(SequentialSampler(range(N)), 6, True), Buckets):
        want = _labels(DataLoader(tds, batch_sampler=make()))
        loader = stoker.Loader(tds, batch_sampler=make())
        assert _labels(loader) == want
        assert len(loader) == len(want)
    with pytest.raises(ValueError, match="mutually exclusive"):
        stoker.Loader(tds, batch_size=4, batch_sampler=Buckets())
    with pytest.raises(ValueError, match="mutually exclusive"):
        stoker.Loader(tds, sampler=SequentialSampler(tds), shuffle=True)


def test_sampler_over_a_stoker_dataset(tmp_path):
    """A sampler's order over records: the C++ workers read in that order."""
    ds = write_dataset(tmp_path / "ds", 30)
    sampler = WeightedRandomSampler(np.linspace(1, 2, 30), 40, generator=_gen(9))
    ref = list(WeightedRandomSampler(np.linspace(1, 2, 30), 40, generator=_gen(9)))
    got = [b["label"].tolist() for b in stoker.Loader(ds, batch_size=16, sampler=sampler)]
    assert sum(got, []) == [int(i) for i in ref]
    assert [len(b) for b in got] == [16, 16, 8]


@pytest.mark.parametrize("make", ["random", "random_no_generator", "stateful", "weighted"])
def test_state_dict_with_a_sampler_resumes_exactly(tds, make):
    def sampler():
        if make == "random":
            return RandomSampler(range(N), generator=_gen(11))
        if make == "random_no_generator":
            return RandomSampler(range(N))  # draws from torch's global generator
        if make == "weighted":
            return WeightedRandomSampler(np.ones(N), N, generator=_gen(12))
        return Stateful(N)

    torch.manual_seed(0)
    loader = stoker.Loader(tds, batch_size=4, sampler=sampler())
    first = _labels(loader)  # epoch 0
    it = iter(loader)  # epoch 1, cut after 3 batches
    head = [next(it)[1].tolist() for _ in range(3)]
    state = loader.state_dict()
    rest_here = [b[1].tolist() for b in it]
    torch.manual_seed(123)  # whatever the global generator did since
    other = stoker.Loader(tds, batch_size=4, sampler=sampler())
    other.load_state_dict(state)
    assert _labels(other) == rest_here
    assert sorted(sum(head + rest_here, [])) == sorted(sum(first, [])) or make != "stateful"


class Stateful(Sampler):
    """torchdata's protocol: state_dict/load_state_dict; its order advances per epoch."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __iter__(self):
        g = torch.Generator().manual_seed(100 + self.epoch)
        self.epoch += 1
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, s):
        self.epoch = s["epoch"]


class Counting(Sampler):
    """A sampler with hidden state and no state_dict: not resumable exactly."""

    def __init__(self, n):
        self.n, self.calls = n, 0

    def __iter__(self):
        self.calls += 1
        return iter([(i + self.calls) % self.n for i in range(self.n)])

    def __len__(self):
        return self.n


def test_state_dict_refuses_a_sampler_it_cannot_resume(tds):
    loader = stoker.Loader(tds, batch_size=4, sampler=Counting(N))
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="Counting.*state_dict"):
        loader.state_dict()


def test_num_workers_zero_runs_in_the_loop_thread():
    seen = set()

    class D(Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            seen.add(threading.current_thread().name)
            return i

    got = [b.tolist() for b in stoker.Loader(D(), batch_size=5, num_workers=0)]
    assert got == [b.tolist() for b in DataLoader(D(), batch_size=5, num_workers=0)]
    assert seen == {threading.main_thread().name}


@pytest.mark.parametrize("workers", ["thread", "process"])
def test_worker_init_fn_and_get_worker_info(workers, tmp_path):
    class D(Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return {"i": i, "worker": -1 if info is None else info.id,
                    "n": 0 if info is None else info.num_workers,
                    "init": getattr(info.dataset, "inited", -1) if info else -1}

    def init(worker_id):
        info = torch.utils.data.get_worker_info()
        assert info is not None and info.id == worker_id
        info.dataset.inited = worker_id

    loader = stoker.Loader(D(), batch_size=4, num_workers=2, worker_init_fn=init,
                           python_workers=workers)
    batches = list(loader)
    assert [b["i"].tolist() for b in batches] == [list(range(k, k + 4)) for k in range(0, 24, 4)]
    workers_seen = {w for b in batches for w in b["worker"].tolist()}
    assert workers_seen <= {0, 1} and workers_seen
    assert all(n == 2 for b in batches for n in b["n"].tolist())
    if workers == "process":  # each worker process set its own copy of the dataset
        assert all(a == w for b in batches for a, w in zip(b["init"].tolist(),
                                                           b["worker"].tolist(), strict=True))
    assert torch.utils.data.get_worker_info() is None  # not in the loop's thread


def test_generator_draws_each_epochs_order_as_dataloader(tds):
    """NOTE [ Seeds as DataLoader draws them ]: with a generator, each epoch's permutation
    is RandomSampler's, drawn from it at iter(): DataLoader's batches for the same
    generator state, epoch after epoch; an advanced generator gives another order."""
    want = DataLoader(tds, batch_size=8, shuffle=True, generator=_gen(42))
    loader = stoker.Loader(tds, batch_size=8, shuffle=True, generator=_gen(42))
    for _ in range(3):
        assert _labels(loader) == _labels(want)
    advanced = _gen(42)
    torch.randperm(5, generator=advanced)
    assert _labels(stoker.Loader(tds, batch_size=8, shuffle=True, generator=advanced)) != \
        _labels(stoker.Loader(tds, batch_size=8, shuffle=True, generator=_gen(42)))
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)
    assert loader.sampler.generator is loader.generator
    with pytest.raises(ValueError, match="disagree"):
        stoker.Loader(tds, shuffle=True, seed=1, generator=_gen(2))


def test_generator_order_resumes_exactly_and_splits_across_ranks(tds):
    loader = stoker.Loader(tds, batch_size=4, shuffle=True, generator=_gen(7))
    list(loader)  # epoch 0
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = _labels(it)
    again = stoker.Loader(tds, batch_size=4, shuffle=True, generator=_gen(7))  # fresh
    again.load_state_dict(state)
    assert _labels(again) == rest and len(head) + len(rest) == len(loader)
    # the same permutation, split by rank as stoker's own order (DistributedSampler's way)
    whole = [x for b in _labels(stoker.Loader(tds, batch_size=4, shuffle=True,
                                              generator=_gen(3))) for x in b]
    ranks = [[x for b in _labels(stoker.Loader(tds, batch_size=2, shuffle=True,
                                               generator=_gen(3), rank=r, world_size=2))
              for x in b] for r in range(2)]
    padded = whole + whole[:len(whole) % 2]  # wrapped around: equal shares
    assert ranks[0] == padded[0::2] and ranks[1] == padded[1::2]


def test_timeout_raises_when_no_batch_comes():
    release = threading.Event()

    class Slow(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            release.wait(10)
            return i

    loader = stoker.Loader(Slow(), batch_size=2, timeout=0.3, python_workers="thread")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timeout=0.3"):
        next(iter(loader))
    assert time.monotonic() - start < 5
    release.set()
    loader.close()


def test_the_other_arguments_are_accepted_with_their_meaning(tds):
    loader = stoker.Loader(tds, batch_size=4, num_workers=2, prefetch_factor=3,
                           persistent_workers=True, in_order=False,
                           multiprocessing_context="fork", pin_memory_device="")
    assert loader.prefetch == 6 and not loader.auto_prefetch
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers) == (2, 3, True)
    assert _labels(loader) == _labels(DataLoader(tds, batch_size=4))
    with pytest.raises(ValueError, match="prefetch_factor"):
        stoker.Loader(tds, prefetch_factor=2)  # num_workers=0, as DataLoader refuses
    with pytest.raises(ValueError, match="persistent_workers"):
        stoker.Loader(tds, num_workers=0, persistent_workers=True)
    with pytest.raises(ValueError, match="fork"):
        stoker.Loader(tds, python_workers="process", multiprocessing_context="spawn")
    # spawn with threads: nothing to spawn
    assert _labels(stoker.Loader(tds, batch_size=4, multiprocessing_context="spawn")) == \
        _labels(DataLoader(tds, batch_size=4))


def test_positional_arguments_as_dataloader(tds):
    sampler = SequentialSampler(range(N))
    want = _labels(DataLoader(tds, 5, False, sampler, None, 0, None, False, True))
    got = _labels(stoker.Loader(tds, 5, False, sampler, None, 0, None, False, True))
    assert got == want


def test_unbatched_stoker_dataset(tmp_path):
    ds = write_dataset(tmp_path / "ds", 5)
    samples = list(stoker.Loader(ds, batch_size=None))
    assert [int(s["label"]) for s in samples] == list(range(5))
    assert samples[0]["x"].shape == (3, 4, 4)


@pytest.mark.parametrize("kind", ["map-style", "iterable"])
def test_timeout_error_says_what_dataloaders_says(kind):
    """DataLoader's words (its tests match r'DataLoader timed out after \\d+ seconds'), for
    a map-style dataset and an IterableDataset alike."""
    release = threading.Event()

    class Slow(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            release.wait(10)
            return i

    class SlowStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            release.wait(10)
            yield from range(4)

    ds = Slow() if kind == "map-style" else SlowStream()
    loader = stoker.Loader(ds, batch_size=2, num_workers=1, timeout=1)
    with pytest.raises(RuntimeError, match=r"^DataLoader timed out after 1 seconds"):
        next(iter(loader))
    release.set()
    loader.close()


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(20))


_BATCHES = BatchSampler(SequentialSampler(range(N)), 3, False)
BAD_ARGUMENTS = {  # DataLoader's own argument tests: the error type and the words it matches
    "negative_workers": ({"num_workers": -1}, ValueError,
                         "num_workers option should be non-negative"),
    "negative_timeout": ({"timeout": -1}, ValueError, "timeout option should be non-negative"),
    "unbatched_drop_last": ({"batch_size": None, "drop_last": True}, ValueError,
                            "batch_size=None option disables auto-batching and is mutually "
                            "exclusive"),
    "context_without_workers": ({"num_workers": 0, "multiprocessing_context": "fork"},
                                ValueError,
                                r"multi-process loading \(num_workers > 0\), but got"),
    "bad_start_method": ({"num_workers": 1, "multiprocessing_context": "bad"}, ValueError,
                         "should specify a valid start method in"),
    "bad_context": ({"num_workers": 1, "multiprocessing_context": object()}, TypeError,
                    "multiprocessing_context option should be a valid context "),
    "sampler_and_shuffle": ({"sampler": SequentialSampler(range(N)), "shuffle": 3},
                            ValueError, "sampler option is mutually exclusive with shuffle"),
    "sampler_batch_sampler_and_shuffle": ({"sampler": SequentialSampler(range(N)),
                                           "batch_sampler": _BATCHES, "shuffle": True},
                                          ValueError,
                                          "sampler option is mutually exclusive with shuffle"),
    "batch_sampler_and_drop_last": ({"batch_sampler": _BATCHES, "drop_last": 3}, ValueError,
                                    "batch_sampler option is mutually exclusive with"),
    "iterable_shuffle": ({"dataset": _Stream(), "shuffle": 3}, ValueError,
                         "DataLoader with IterableDataset: expected unspecified shuffle"),
    "iterable_sampler": ({"dataset": _Stream(), "sampler": 3}, ValueError,
                         "DataLoader with IterableDataset: expected unspecified sampler"),
}


@pytest.mark.parametrize("name", sorted(BAD_ARGUMENTS))
def test_bad_arguments_raise_as_dataloader(tds, name):
    kwargs, error, words = BAD_ARGUMENTS[name]
    kwargs = dict(kwargs)
    ds = kwargs.pop("dataset", tds)
    with pytest.raises(error, match=words):
        DataLoader(ds, **kwargs)
    with pytest.raises(error, match=words):
        stoker.Loader(ds, **kwargs)


def test_a_context_object_is_taken_as_its_start_method(tds):
    ctx = torch.multiprocessing.get_context("spawn")
    loader = stoker.Loader(tds, batch_size=4, num_workers=1, multiprocessing_context=ctx)
    assert _labels(loader) == _labels(DataLoader(tds, batch_size=4))


def test_more_workers_than_cores_warns_as_dataloader(tds, tmp_path):
    """DataLoader warns when num_workers exceeds the cores available (its test matches the
    words below); so does a Loader whose Python stage gets those workers. C++ workers over
    a stoker.Dataset do not warn."""
    from stoker._loader_args import available_cores

    n = available_cores() + 1
    words = "excessive worker creation might get DataLoader running slow or even freeze"
    with pytest.warns(UserWarning, match=words):
        DataLoader(tds, num_workers=n)
    with pytest.warns(UserWarning, match=words):
        stoker.Loader(tds, num_workers=n)
    with pytest.warns(UserWarning, match=words):
        stoker.Loader(_Stream(), num_workers=n)
    with warnings.catch_warnings():  # pyproject's filter ignores it: here it is an error
        warnings.simplefilter("error")
        stoker.Loader(write_dataset(tmp_path / "ds", 4), num_workers=n)
        stoker.Loader(tds, num_workers=available_cores())


# -- DataLoader's own names, and datasets whose workers wait for each other ------------------

class _Barrier(torch.utils.data.Dataset):
    """Its first `parties` samples wait for each other (PyTorch's SynchronizedDataset):
    they need that many workers at once, as DataLoader runs them."""

    def __init__(self, n, parties, draw=False):
        self.n, self.draw = n, draw
        self.barrier = threading.Barrier(parties)
        self.calls = 0
        self.lock = threading.Lock()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.calls += 1
            first = self.calls <= self.barrier.parties
        if first:
            self.barrier.wait(timeout=60)
        return {"i": i, "r": torch.rand(()).item() if self.draw else 0.0}


def test_num_workers_samples_run_at_once_as_dataloaders(monkeypatch):
    from stoker._stage import chunks
    monkeypatch.setattr(chunks, "PROBE_WAIT_SECONDS", 0.5)  # the first sample's watch
    loader = stoker.Loader(_Barrier(8, 4), batch_size=1, num_workers=4,
                           python_workers="thread")
    assert loader.plan.settings.prefetch == 8  # DataLoader's prefetch_factor=2 by default
    assert sorted(int(b["i"]) for b in loader) == list(range(8))


def test_a_first_sample_that_waits_for_others_is_said_when_it_drew(monkeypatch):
    from stoker._stage import chunks
    monkeypatch.setattr(chunks, "PROBE_WAIT_SECONDS", 0.5)
    # stoker's own default (no num_workers): threads first, the first sample watched
    loader = stoker.Loader(_Barrier(8, 3, draw=True), batch_size=1, num_threads=3)
    with pytest.warns(RuntimeWarning, match=r"first sample took over 0.5 s.*may differ"):
        got = sorted(int(b["i"]) for b in loader)
    assert got == list(range(8))
    loader.close()


def test_dataloaders_iterator_names(tds):
    loader = stoker.Loader(tds, batch_size=4, num_workers=2)
    assert loader._auto_collation
    assert not stoker.Loader(tds, batch_size=None)._auto_collation
    it = iter(loader)
    next(it)
    workers = it._workers
    assert len(workers) >= 2 and all(w.is_alive() and w.exitcode is None for w in workers)
    it.close()
    loader.close()
    for w in workers:
        w.join(10)
        assert not w.is_alive() and w.exitcode == 0


def test_a_dataset_that_grows_is_followed_between_epochs_as_dataloader():
    data = [torch.full((2,), float(i)) for i in range(4)]
    plain = stoker.Loader(data, batch_size=2)
    shuffled = stoker.Loader(data, batch_size=2, shuffle=True, seed=1)
    assert len(plain) == len(shuffled) == 2
    it = iter(plain)
    next(it)
    data.append(torch.full((2,), 4.0))
    assert len(it) == 1  # the running epoch keeps its order
    assert [b[:, 0].tolist() for b in it] == [[2.0, 3.0]]
    assert len(plain) == len(shuffled) == len(torch.utils.data.DataLoader(data, batch_size=2))
    assert [b[:, 0].tolist() for b in plain] == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    shuffled.set_epoch(2)
    got = sorted(x for b in shuffled for x in b[:, 0].tolist())
    assert got == [0.0, 1.0, 2.0, 3.0, 4.0] and shuffled.epoch == 3
    # the same order as a loader made over the grown dataset
    again = stoker.Loader(data, batch_size=2, shuffle=True, seed=1)
    again.set_epoch(2)
    shuffled.set_epoch(2)
    assert [b.tolist() for b in again] == [b.tolist() for b in shuffled]


class _Bulk(torch.utils.data.Dataset):
    """Loads in bulk: its items are lists of indices (PyTorch's BulkLoadingDataset)."""

    def __len__(self):
        return 35

    def __getitem__(self, indices):
        assert isinstance(indices, list), indices
        return torch.as_tensor(indices) * 10


class _BulkSampler(torch.utils.data.Sampler):
    def __init__(self, n, generator):
        self.n, self.generator = n, generator

    def __iter__(self):
        yield from (x.tolist() for x in torch.randperm(self.n, generator=self.generator)
                    .split(4))

    def __len__(self):
        return -(-self.n // 4)


@pytest.mark.parametrize("num_workers", [0, 3])
def test_a_sampler_of_index_lists_passes_them_whole_as_dataloader(num_workers):
    want = list(DataLoader(_Bulk(), batch_size=None, num_workers=0,
                           sampler=_BulkSampler(35, torch.Generator().manual_seed(3))))
    sampler = _BulkSampler(35, torch.Generator().manual_seed(3))
    loader = stoker.Loader(_Bulk(), batch_size=None, num_workers=num_workers, sampler=sampler)
    assert not loader._auto_collation
    got = list(loader)
    assert len(got) == len(want) == 9
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # the epoch's lists come again for a resume
    it = iter(loader)
    first = [next(it) for _ in range(4)]
    state = loader.state_dict()
    rest = [t.tolist() for t in it]
    again = stoker.Loader(_Bulk(), batch_size=None, num_workers=num_workers,
                          sampler=_BulkSampler(35, torch.Generator().manual_seed(99)))
    again.load_state_dict(state)
    assert [t.tolist() for t in again] == rest and len(first) + len(rest) == 9
    # worker processes get each chunk's items with it
    procs = stoker.Loader(_Bulk(), batch_size=None, num_workers=2, python_workers="process",
                          sampler=_BulkSampler(35, torch.Generator().manual_seed(3)))
    assert all(torch.equal(a, b) for a, b in zip(list(procs), want, strict=True))
    assert procs._stage.processes



class _Keyed(torch.utils.data.Dataset):
    """Indexed by int or by name, as a dict-backed dataset."""

    def __len__(self):
        return 6

    def __getitem__(self, key):
        return torch.tensor(float(key if isinstance(key, int) else 100 + ord(key[0])))


@pytest.mark.parametrize("how", ["sampler", "batch_sampler"])
def test_a_sampler_of_indices_then_keys_passes_each_as_dataloader(how):
    """Integers first, then items that are not (the order switches to keys at the first
    one): every item reaches __getitem__, in order, as DataLoader passes it."""
    items = [3, 0, "a", 5, "b", "c"]
    kw = dict(sampler=items, batch_size=2) if how == "sampler" else \
        dict(batch_sampler=[items[:2], items[2:5], items[5:]])
    want = [b.tolist() for b in DataLoader(_Keyed(), **kw)]
    got = [b.tolist() for b in stoker.Loader(_Keyed(), **kw)]
    assert got == want and len(got) == 3

def test_a_resume_loaded_then_the_dataset_grown_is_refused():
    data = [torch.full((2,), float(i)) for i in range(6)]
    loader = stoker.Loader(data, batch_size=2, shuffle=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    again = stoker.Loader(data, batch_size=2, shuffle=True)
    again.load_state_dict(state)
    data.append(torch.zeros(2))
    with pytest.raises(ValueError, match="7 samples now, 6 when this loader was made"):
        list(again)


def test_batches_in_flight_are_capped_for_many_workers(tds):
    from stoker import _core
    for kw in ({}, {"prefetch_factor": 4}):
        loader = stoker.Loader(tds, batch_size=4, num_workers=1000, **kw)
        assert loader.plan.settings.prefetch == _core.MAX_PREFETCH
        loader.close()
