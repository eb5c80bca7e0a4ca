"""One contract for every kind of dataset (DESIGN.md, "one engine"; NOTE [ Epochs and
iterators ] in csrc/pipeline/loader_core.h): each rule below runs against a stoker.Dataset
of records, a map-style torch Dataset, an IterableDataset (read by worker threads, and by
worker processes: NOTE [ Iterable datasets in processes ]), a TokenDataset and a stoker.Mix.

A kind that cannot keep a rule says so in CANNOT, the one table of exceptions, with the
reason; its test is then skipped with that reason (pytest -rs lists them)."""

import pickle
import threading

import numpy as np
import pytest
import stoker
import torch
from conftest import write_dataset

N = 40  # rows of each dataset (records, map-style, iterable); a mixture has two of them
B = 4  # batch_size

KINDS = ["records", "map-style", "iterable", "iterable-process", "tokens", "mixture"]

# (kind, rule) -> why that kind cannot keep that rule: the one place that says so.
CANNOT = {
    ("tokens", "map"): "map= is per sample, and token batches are windows cut from a token "
                       "stream, not samples (their rows are made in C++ only)",
    ("mixture", "map"): "map= takes samples of one stoker.Dataset; a mixture's batches mix "
                        "several (batch_map= takes them, with their 'source')",
    ("tokens", "user code"): "token batches run none of the user's code (map=, batch_map= "
                             "and collate_fn= are refused for them): nothing of the user's "
                             "can raise in the loop",
}


def _rule(kind, rule):
    why = CANNOT.get((kind, rule))
    if why is not None:
        pytest.skip(f"{kind} cannot keep '{rule}': {why}")


class Stream(torch.utils.data.IterableDataset):
    """An IterableDataset with what a real one has (WebDataset, HF datasets): set_epoch
    (each epoch its own order), __len__, state_dict/load_state_dict, sharding by
    get_worker_info()."""

    def __init__(self, n=N):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, nw = (0, 1) if info is None else (info.id, info.num_workers)
        for j in range(w, self.n, nw):
            i = (j * 7 + self.epoch * 11) % self.n  # 7 and n coprime: a permutation
            yield {"x": np.full(3, i, np.float32), "label": i}


class MapStyle(torch.utils.data.Dataset):
    def __init__(self, n=N, fail_at=None):
        self.n, self.fail_at = n, fail_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(f"bad row {i}")
        return {"x": np.full(3, i, np.float32), "label": i}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    a = write_dataset(root / "a", N, shard_size="1KB")
    b = write_dataset(root / "b", N // 2, shard_size="1KB",
                      make=lambda i: {"x": np.full((3, 4, 4), i, np.uint8), "label": 1000 + i})
    (np.arange(4000) % 60000).astype(np.uint16).tofile(root / "tokens.bin")
    return {"a": a, "b": b, "tokens": stoker.TokenDataset(str(root / "tokens.bin"),
                                                          dtype="uint16")}


def make(kind, data, fail_at=None, **kw):
    """A loader of `kind`; `fail_at`: the row whose user code raises."""
    kw.setdefault("batch_size", B)
    if kind == "records":
        if fail_at is not None:
            kw["map"] = _failing_map(fail_at)
        return stoker.Loader(data["a"], shuffle=True, seed=3, **kw)
    if kind == "map-style":
        return stoker.Loader(MapStyle(fail_at=fail_at), shuffle=True, seed=3, **kw)
    if kind in ("iterable", "iterable-process"):
        if fail_at is not None:
            kw["map"] = _failing_map(fail_at)
        if kind == "iterable-process":  # two worker processes, each its share of the stream
            kw.setdefault("num_workers", 2)
            kw.setdefault("python_workers", "process")
        return stoker.Loader(Stream(), seed=3, **kw)
    if kind == "tokens":
        if fail_at is not None:
            kw["batch_map"] = _failing_batch_map("input_ids", fail_at)
        return stoker.Loader(data["tokens"], seq_len=8, shuffle=True, seed=3, **kw)
    assert kind == "mixture"
    if fail_at is not None:
        kw["batch_map"] = _failing_batch_map("label", fail_at)
    return stoker.Loader(stoker.Mix({"a": data["a"], "b": data["b"]}, weights={"a": 2, "b": 1}),
                         shuffle=True, seed=3, **kw)


def _failing_map(row):
    def fn(sample, rng):
        if int(sample["label"]) == row:
            raise KeyError(f"bad row {row}")
        return sample
    return fn


def _failing_batch_map(key, row):
    def fn(batch, rng):
        if row in batch[key].reshape(len(batch[key]), -1)[:, 0].tolist():
            raise KeyError(f"bad row {row}")
        return batch
    return fn


def rows(batch):
    """The identity of each row of a batch."""
    if "input_ids" in batch:
        return [tuple(r) for r in batch["input_ids"].tolist()]
    return [int(x) for x in batch["label"]]


def epoch(loader_or_it):
    return [rows(b) for b in loader_or_it]


def reference(kind, data, e, **kw):
    """Epoch `e` of a fresh loader of `kind`."""
    loader = make(kind, data, **kw)
    loader.set_epoch(e)
    return epoch(loader)


# -- epochs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_iter_alone_uses_no_epoch(kind, data):
    loader = make(kind, data)
    iter(loader)
    iter(loader)
    assert loader.epoch == 0
    e0, e1 = reference(kind, data, 0), reference(kind, data, 1)
    assert e0 != e1  # each epoch its own order: the rule below could fail
    assert epoch(loader) == e0
    assert epoch(loader) == e1


@pytest.mark.parametrize("kind", KINDS)
def test_set_epoch_confirms_the_running_epoch(kind, data):
    loader = make(kind, data)
    it = iter(loader)
    head = [rows(next(it))]
    loader.set_epoch(0)  # a framework's set_epoch at the start of its epoch 0
    rest = epoch(it)
    assert head + rest == reference(kind, data, 0)
    assert epoch(loader) == reference(kind, data, 1)  # not epoch 0 again
    loader.sampler.set_epoch(3)  # the hook Lightning and accelerate call
    assert epoch(loader) == reference(kind, data, 3)
    it = iter(loader)
    loader.set_epoch(6)  # before its first next(): the iterator runs epoch 6
    assert epoch(it) == reference(kind, data, 6)


@pytest.mark.parametrize("kind", KINDS)
def test_live_iterators_each_yield_their_full_epoch(kind, data):
    loader = make(kind, data)
    want = reference(kind, data, 0)
    a = iter(loader)
    head = [rows(next(a)), rows(next(a))]
    state = loader.state_dict()
    assert epoch(iter(loader)) == want  # a peek inside the loop: the same epoch, whole
    assert loader.state_dict() == state  # the state follows the first iterator
    assert head + epoch(a) == want  # and the loop's iterator goes on undisturbed
    zipped = [(rows(x), rows(y)) for x, y in zip(loader, loader)]
    want1 = reference(kind, data, 1)
    assert [x for x, _ in zipped] == want1 and [y for _, y in zipped] == want1


@pytest.mark.parametrize("kind", KINDS)
def test_len_of_the_loader_and_of_its_iterator(kind, data):
    loader = make(kind, data)
    n = len(reference(kind, data, 0))
    assert len(loader) == n
    it = iter(loader)
    assert len(it) == n
    next(it)
    next(it)
    assert len(it) == n - 2
    assert len(list(it)) == n - 2
    assert len(it) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_skip(kind, data):
    loader = make(kind, data)
    want = reference(kind, data, 0)
    assert epoch(loader.skip(3)) == want[3:]
    assert epoch(loader) == reference(kind, data, 1)
    loader.skip(2)
    loader.set_epoch(4)  # transformers' Trainer skips first: the skip moves to the epoch set
    assert epoch(loader) == reference(kind, data, 4)[2:]


@pytest.mark.parametrize("kind", KINDS)
def test_the_epoch_a_loader_says(kind, data):
    loader = make(kind, data)
    assert loader.epoch == 0
    it = iter(loader)
    assert loader.epoch == 0 and it.epoch == 0
    next(it)
    assert it.epoch == 0 and loader.epoch == 1  # the next iterator's
    del it  # a break: the rest of epoch 0 is what a resume continues, the loader goes on
    assert loader.state_dict()["epoch"] == 0 and loader.epoch == 1
    assert epoch(loader) == reference(kind, data, 1)
    assert loader.epoch == 2


# -- resume ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_mid_epoch_resumes_exactly(kind, data):
    loader = make(kind, data)
    loader.set_epoch(2)
    it = iter(loader)
    head = [rows(next(it)) for _ in range(3)]
    state = loader.state_dict()
    rest = epoch(it)
    assert head + rest == reference(kind, data, 2)
    other = make(kind, data)
    other.load_state_dict(state)
    assert epoch(other) == rest
    assert epoch(other) == reference(kind, data, 3)


@pytest.mark.parametrize("kind", KINDS)
def test_a_resume_at_another_world_size(kind, data):
    loader = make(kind, data, rank=0, world_size=1)
    it = iter(loader)
    head = [rows(next(it)) for _ in range(3)]
    state = loader.state_dict()
    rest = sorted(r for b in epoch(it) for r in b)
    got = []
    for rank in range(2):
        other = make(kind, data, rank=rank, world_size=2)
        other.load_state_dict(state)
        got.append([r for b in epoch(other) for r in b])
    both = got[0] + got[1]
    assert len(got[0]) == len(got[1])  # equal shares (padded, as DistributedSampler pads)
    assert set(rest) <= set(both) and len(both) - len(rest) < 2  # the rest, at most a pad
    assert set(both) - set(rest) <= set(r for b in head for r in b)  # padding: the start


@pytest.mark.parametrize("kind", KINDS)
def test_a_pickled_loader_goes_on_where_it_was(kind, data):
    loader = make(kind, data)
    it = iter(loader)
    head = [rows(next(it)) for _ in range(2)]
    again = pickle.loads(pickle.dumps(loader))  # by configuration and state
    assert head + epoch(again) == reference(kind, data, 0)


# -- stats, closing, errors, where user code runs ---------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_stats_are_measured(kind, data):
    loader = make(kind, data, prefetch=3)
    s = loader.stats()
    assert s["batches"] == 0 and s["prefetch"] == 3
    n = len(epoch(loader))
    s = loader.stats()
    assert s["batches"] == n and s["samples"] > 0
    assert isinstance(s["data_stall"], float) and 0.0 <= s["data_stall"] <= 1.0
    assert s["run_seconds"] > 0 and s["wait_seconds"] >= 0
    assert s["prefetch"] == 3 and s["num_threads"] >= 1
    auto = make(kind, data)
    list(auto)
    assert auto.stats()["prefetch"] >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_close_and_with(kind, data):
    with make(kind, data) as loader:
        it = iter(loader)
        next(it)
    assert list(it) == []  # closing ended its iterators
    assert epoch(loader) == reference(kind, data, 1)  # and the loader stays usable
    loader.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_user_code_is_raised_in_the_loop(kind, data, workers):
    _rule(kind, "user code")
    want = reference(kind, data, 0)
    first_tokens = [r[0] if isinstance(r, tuple) else r for r in want[2]]
    bad = first_tokens[1]  # a row of batch 2
    loader = make(kind, data, fail_at=bad, num_workers=workers)
    it = iter(loader)
    assert [rows(next(it)) for _ in range(2)] == want[:2]
    with pytest.raises(KeyError, match=f"bad row {bad}"):
        next(it)
    assert epoch(it) == want[3:]  # the failed batch is consumed (DataLoader's rule)


@pytest.mark.parametrize("kind", KINDS)
def test_map_runs_on_the_stage_workers(kind, data):
    _rule(kind, "map")

    def recording(where):  # each loader its own record (a closed loader's late call apart)
        def fn(sample, rng):
            where.add(threading.current_thread() is threading.main_thread())
            sample["y"] = rng.integers(0, 1 << 30)
            return sample
        return fn

    threads = dict(num_workers=2, python_workers="thread", prefetch_next_epoch=False)
    where = set()
    with make(kind, data, map=recording(where), **threads) as loader:
        ys = [b["y"].tolist() for b in loader]
    assert where == {False}  # never in the loop's thread
    with make(kind, data, map=recording(set()), **threads) as again:
        assert [b["y"].tolist() for b in again] == ys  # draws keyed by the row
    inline = set()
    with make(kind, data, map=recording(inline), num_workers=0) as loader:
        list(loader)
    assert inline == {True}  # num_workers=0: in the loop's thread, as DataLoader's
