"""No argument accepted and ignored (NOTE [ No argument ignored ] in stoker/_dropin.py):
DataLoader's worker arguments and the loader's settings either change what the loader does
for the kind of dataset given, or are refused with the reason and what to use."""

import logging
import multiprocessing as mp
import os
import time

import numpy as np
import pytest
import stoker
import torch
from conftest import write_dataset


class MapStyle(torch.utils.data.Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"i": i}


class Stream(torch.utils.data.IterableDataset):
    """n rows, sharded by get_worker_info(); `read` counts the rows its iterators made,
    `delay` slows each row down."""

    def __init__(self, n=24, delay=0.0):
        self.n, self.delay, self.read = n, delay, 0

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(w, self.n, nw):
            if self.delay:
                time.sleep(self.delay)
            self.read += 1
            yield {"i": i}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("honoured") / "d", 24)


# -- worker_init_fn and persistent_workers -------------------------------------------------------

def test_worker_init_fn_without_python_workers_is_refused(ds, tmp_path):
    def init(worker):
        pass

    tokens = tmp_path / "t.bin"
    np.arange(1000, dtype=np.uint16).tofile(tokens)
    refused = [dict(dataset=ds), dict(dataset=ds, batch_map=lambda b, rng: b),
               dict(dataset=stoker.TokenDataset(str(tokens), dtype="uint16"), seq_len=8),
               dict(dataset=stoker.Mix({"a": ds, "b": ds}))]
    for kw in refused:
        with pytest.raises(ValueError, match="worker_init_fn=.*has none.*Pass map="):
            stoker.Loader(batch_size=4, num_workers=2, worker_init_fn=init, **kw)
    seen = []
    with stoker.Loader(ds, batch_size=4, num_workers=2, worker_init_fn=seen.append,
                       map=lambda s, rng: s, python_workers="thread",
                       persistent_workers=True) as loader:
        list(loader)
    assert sorted(seen) == [0, 1]


_INITED = {}  # worker id -> the epoch its worker_init_fn last ran in (per process)


class _Recorded(torch.utils.data.Dataset):
    """Each row says which worker read it, in which epoch, after an init of which epoch."""

    def __init__(self, q, epoch):
        self.q, self.epoch = q, epoch

    def __len__(self):
        return 24

    def __getitem__(self, i):
        w = torch.utils.data.get_worker_info().id
        self.q.put(("row", w, self.epoch.value, _INITED.get(w)))
        return {"i": i}


class _RecordedStream(torch.utils.data.IterableDataset):
    def __init__(self, q, epoch):
        self.rows = _Recorded(q, epoch)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 24, info.num_workers):
            yield self.rows[i]


def _init_calls(persistent, kind):
    """(the workers' worker_init_fn calls as (worker, epoch), over three epochs; (the rows
    read without an init of their epoch by their worker before them, every call in order)).
    Queues and a shared epoch: worker processes call both in theirs."""
    ctx = mp.get_context("fork")
    q, epoch = ctx.SimpleQueue(), ctx.Value("i", 0)
    _INITED.clear()

    def init(worker):
        _INITED[worker] = epoch.value
        q.put(("init", worker, epoch.value, None))

    kw = dict(dataset=_RecordedStream(q, epoch)) if kind == "iterable" else \
        dict(dataset=_Recorded(q, epoch), python_workers=kind, prefetch_next_epoch=False)
    with stoker.Loader(batch_size=4, num_workers=2, worker_init_fn=init,
                       persistent_workers=persistent, **kw) as loader:
        for e in range(3):
            epoch.value = e
            assert len(list(loader)) == 6
    got = []
    while not q.empty():
        got.append(q.get())
    rows = [r for r in got if r[0] == "row"]
    assert len(rows) == 72
    stale = [r[1:] for r in rows if r[3] != r[2]]  # (worker, epoch, its last init's epoch)
    # the calls in the order they came, for an assertion's message
    return sorted(r[1:3] for r in got if r[0] == "init"), (stale, got)


@pytest.mark.parametrize("kind", ["thread", "process", "iterable"])
def test_persistent_workers_false_runs_worker_init_fn_each_epoch(kind):
    """As DataLoader, whose workers are made again at each epoch without
    persistent_workers: worker_init_fn runs again in each worker before it reads anything
    of a new epoch (stoker's threads and processes run it where DataLoader would start a
    new worker); with persistent_workers=True, once per worker."""
    inits, (stale, calls) = _init_calls(False, kind)
    # every row read after its worker's init of that epoch (a worker that read nothing of
    # the epoch it started in too: test_a_worker_given_work_first_in_a_later_epoch_...)
    assert not stale, (stale, calls)
    if kind == "iterable":  # each epoch's workers are its own: every worker, every epoch
        assert inits == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    else:  # a worker that got no work in an epoch has nothing to init for
        assert {(0, 0), (1, 0)} < set(inits) and len(inits) == len(set(inits))
    inits, (stale, _) = _init_calls(True, kind)
    assert inits == [(0, 0), (1, 0)] and stale  # rows of epochs 1, 2: after epoch 0's


class _OneRecorded(_Recorded):
    def __len__(self):
        return 1


def test_a_worker_given_work_first_in_a_later_epoch_runs_worker_init_fn_for_it():
    """persistent_workers=False: a worker process that read nothing in the epoch it was
    started in (its init ran for that epoch) runs worker_init_fn again before it reads
    anything of a later one, as every worker of DataLoader's, made again each epoch,
    would. One sample an epoch: one worker reads epoch 0; the other is then given epoch
    1's sample directly."""
    ctx = mp.get_context("fork")
    q, epoch = ctx.SimpleQueue(), ctx.Value("i", 0)
    _INITED.clear()

    def init(worker):
        _INITED[worker] = epoch.value
        q.put(("init", worker, epoch.value, None))

    with stoker.Loader(_OneRecorded(q, epoch), batch_size=1, num_workers=2,
                       python_workers="process", worker_init_fn=init,
                       persistent_workers=False, prefetch_next_epoch=False) as loader:
        assert len(list(loader)) == 1
        got = []
        # the row, and both workers' inits of epoch 0 (each runs as its process starts:
        # on a busy machine, perhaps after the epoch's one row)
        while len([r for r in got if r[0] == "row"]) < 1 or \
                len([r for r in got if r[0] == "init"]) < 2:
            got.append(q.get())
        (read,) = [r[1] for r in got if r[0] == "row"]
        idle = 1 - read  # the worker that read nothing of epoch 0
        epoch.value = 1
        rows, errors, _, _, lease = loader._stage.workers.run(idle, 1, [0], copy=True)
        assert not errors and rows[0]["i"] == 0
    while not q.empty():
        got.append(q.get())
    inits = sorted(r[1:3] for r in got if r[0] == "init")
    assert inits == sorted([(0, 0), (1, 0), (idle, 1)]), got
    assert [r[1:] for r in got if r[0] == "row"] == [(read, 0, 0), (idle, 1, 1)], got


def _children():
    """The pids of this process's children (every thread's)."""
    out = set()
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
                out |= set(f.read().split())
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return out


def test_multiprocessing_context_where_nothing_forks(ds):
    """With thread workers no process starts and nothing forks (what "spawn" is chosen
    for): taken, as DataLoader takes it with num_workers > 0 (an IterDataPipe's tests pass
    it); with num_workers=0 refused, as DataLoader refuses it."""
    for kw in (dict(dataset=MapStyle(), python_workers="thread"), dict(dataset=Stream()),
               dict(dataset=ds)):
        before = _children()
        with stoker.Loader(batch_size=4, num_workers=2, multiprocessing_context="spawn",
                           **kw) as loader:
            assert len(list(loader)) > 0
            assert _children() <= before  # no worker process started
        with pytest.raises(ValueError, match="multiprocessing_context can only be used "
                                             "with multi-process loading"):
            stoker.Loader(batch_size=4, num_workers=0, multiprocessing_context="spawn", **kw)
    # where it decides something, it is taken: processes fork; "spawn" keeps "auto" on threads
    with stoker.Loader(MapStyle(), batch_size=4, num_workers=2, python_workers="process",
                       multiprocessing_context="fork") as loader:
        assert len(list(loader)) == 6
    with stoker.Loader(MapStyle(), batch_size=4, multiprocessing_context="spawn") as loader:
        assert len(list(loader)) == 6 and loader._stage.workers is None


# -- an IterableDataset's settings ---------------------------------------------------------------

def test_iterable_refuses_the_core_settings():
    for kw in (dict(num_threads=2), dict(max_memory="1GB")):
        with pytest.raises(ValueError, match="IterableDataset is read by Python workers"):
            stoker.Loader(Stream(), batch_size=4, **kw)
    # the plan says what runs: no C++ core's memory budget, no next epoch read ahead (a
    # new iter(dataset), started with its iterator)
    plan = str(stoker.Loader(Stream(), batch_size=4).plan)
    assert "max_memory" not in plan and "prefetch_next_epoch=False" in plan
    with pytest.raises(ValueError, match="on_error='skip'.*there is no map="):
        stoker.Loader(Stream(), batch_size=4, on_error="skip")


class SharedStream(Stream):
    """Stream whose `read` counts the rows made in worker processes too."""

    def __init__(self, n):
        import multiprocessing

        super().__init__(n)
        self._count = multiprocessing.get_context("fork").Value("q", 0)

    @property
    def read(self):
        return self._count.value

    @read.setter
    def read(self, value):
        if hasattr(self, "_count"):
            self._count.value = value


@pytest.mark.parametrize("python_workers", ["thread", "process"])
@pytest.mark.parametrize("prefetch", [1, 8])
def test_iterable_prefetch_bounds_the_rows_read_ahead(prefetch, python_workers):
    ds = SharedStream(n=400)
    with stoker.Loader(ds, batch_size=4, num_workers=1, prefetch=prefetch,
                       python_workers=python_workers) as loader:
        it = iter(loader)
        next(it)
        time.sleep(0.3)  # the worker fills its window
        assert loader.stats()["prefetch"] == prefetch
        # the batch taken, prefetch batches queued, and the row the worker holds
        assert 4 + 4 * prefetch <= ds.read <= 4 + 4 * prefetch + 1
    with stoker.Loader(Stream(), batch_size=2, num_workers=3, prefetch_factor=3) as loader:
        list(loader)
        assert loader.stats()["prefetch"] == 9  # DataLoader's: prefetch_factor * num_workers


@pytest.mark.parametrize("python_workers", ["thread", "process"])
def test_iterable_on_error_skip_leaves_out_the_rows_map_raised_on(python_workers):
    def fn(sample, rng):
        if sample["i"] % 5 == 0:
            raise ValueError(f"bad {sample['i']}")
        return sample

    with stoker.Loader(Stream(), batch_size=4, map=fn, on_error="skip", seed=1,
                       num_workers=1, python_workers=python_workers) as loader:
        with pytest.warns(RuntimeWarning, match="left out 5 row") as w:
            got = [i for b in loader for i in b["i"].tolist()]
        assert got == [i for i in range(24) if i % 5] and loader.stats()["skipped"] == 5
    said = [str(x.message) for x in w if "left out" in str(x.message)]
    # each named: its place in the stream and its error
    assert "row 0 (ValueError: bad 0), row 5 (ValueError: bad 5)" in said[0]
    assert "row 20 (ValueError: bad 20)" in said[0] and "1 more" not in said[0]


def test_iterable_stall_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="stoker"):
        with stoker.Loader(Stream(n=150, delay=0.008), batch_size=1,
                           stall_warning=0.5) as loader:
            list(loader)
    said = [r.getMessage() for r in caplog.records if "waited for data" in r.getMessage()]
    assert len(said) == 1 and "stall_warning=0.5" in said[0]
    assert loader.stats()["data_stall"] > 0.5
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        with stoker.Loader(Stream(n=150, delay=0.008), batch_size=1,
                           stall_warning=None) as loader:
            list(loader)
    assert not [r for r in caplog.records if "waited for data" in r.getMessage()]
