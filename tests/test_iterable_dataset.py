"""IterableDataset (NOTE [ Iterable datasets ] in stoker/_stage/iterable.py): accepted as
DataLoader accepts it, with a batch count that does not depend on the workers, equal
batches across ranks, and an exact resume when the dataset has a state_dict."""

import math

import pytest
import stoker
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Range(IterableDataset):
    """n samples, sharded across workers by get_worker_info(), as the docs of
    IterableDataset show."""

    def __init__(self, n, start=0):
        self.n, self.start = n, start

    def __iter__(self):
        info = get_worker_info()
        lo, hi = self.start, self.start + self.n
        if info is not None:
            per = math.ceil(self.n / info.num_workers)
            lo = self.start + info.id * per
            hi = min(lo + per, self.start + self.n)
        for i in range(lo, hi):
            yield {"x": torch.full((2,), float(i)), "i": i}


def _ids(batches):
    return [b["i"].tolist() for b in batches]


def test_as_dataloader_without_workers():
    ds = Range(23)
    want = _ids(DataLoader(ds, batch_size=5))
    got = _ids(stoker.Loader(ds, batch_size=5, num_workers=0))
    assert got == want


# more workers than this machine may have cores: DataLoader's warning, not this test's
@pytest.mark.filterwarnings("ignore:.*excessive worker creation:UserWarning")
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_batch_count_does_not_depend_on_workers(workers):
    ds = Range(23)
    got = _ids(stoker.Loader(ds, batch_size=5, num_workers=workers))
    assert len(got) == 5 and [len(b) for b in got] == [5, 5, 5, 5, 3]
    assert sorted(sum(got, [])) == list(range(23))  # each sample once
    if workers == 2:  # DataLoader's count changes with the workers: each its own last batch
        assert len(list(DataLoader(ds, batch_size=5, num_workers=workers))) == 6


@pytest.mark.parametrize("even", [True, False])
def test_ranks_get_equal_batches(even):
    ds = Range(23)
    per_rank = [_ids(stoker.Loader(ds, batch_size=4, num_workers=2, rank=r, world_size=2,
                                   even_batches=even)) for r in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == 3
    rows = sorted(sum(per_rank[0] + per_rank[1], []))
    if even:  # padding repeats samples of the epoch's start
        assert len(rows) == 24 and set(rows) == set(range(23))
    else:
        assert rows == list(range(23))


class Resumable(Range):
    """A stream with its own state: where it starts."""

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, s):
        self.start = s["start"]


def test_state_dict_resumes_exactly_with_a_dataset_state():
    loader = stoker.Loader(Resumable(30), batch_size=4)
    it = iter(loader)
    head = [next(it)["i"].tolist() for _ in range(3)]
    state = loader.state_dict()
    rest = [b["i"].tolist() for b in it]
    other = stoker.Loader(Resumable(30), batch_size=4)
    other.load_state_dict(state)
    assert _ids(other) == rest
    assert sum(head + rest, []) == list(range(30))


def test_state_dict_without_a_dataset_state_is_a_clear_error():
    loader = stoker.Loader(Range(30), batch_size=4)
    it = iter(loader)
    next(it)
    with pytest.raises(RuntimeError, match="Range.*state_dict"):
        loader.state_dict()


def test_dataloader_rules():
    with pytest.raises(ValueError, match="shuffle"):
        stoker.Loader(Range(4), shuffle=True)
    with pytest.raises(ValueError, match="sampler"):
        stoker.Loader(Range(4), sampler=[0, 1])
    with pytest.raises(TypeError, match="len"):
        len(stoker.Loader(Range(4), batch_size=2))


class _Tagged(Range):
    """Range whose rows say what worker_init_fn set on the worker's dataset."""

    tag = -1

    def __iter__(self):
        for row in super().__iter__():
            yield {**row, "tag": get_worker_info().dataset.tag}


@pytest.mark.parametrize("python_workers", ["thread", "process"])
def test_errors_and_worker_init_fn(python_workers):
    class Bad(IterableDataset):
        def __iter__(self):
            yield {"i": 0}
            raise KeyError("broken stream")

    with pytest.raises(KeyError, match="broken stream") as e:
        list(stoker.Loader(Bad(), batch_size=1, num_workers=1, python_workers=python_workers))
    notes = "\n".join(getattr(e.value, "__notes__", []))
    assert "worker 0" in notes
    if python_workers == "process":  # its traceback's text, from the worker process
        assert 'raise KeyError("broken stream")' in notes
    if python_workers == "thread":
        seen = []
        got = _ids(stoker.Loader(Range(8), batch_size=4, num_workers=2, python_workers="thread",
                                 worker_init_fn=lambda w: seen.append(w)))
        assert sorted(seen) == [0, 1] and sorted(sum(got, [])) == list(range(8))
        return

    def init(w):  # each process has its own copy of the dataset (DataLoader's workers)
        get_worker_info().dataset.tag = w

    ds = _Tagged(8)
    batches = list(stoker.Loader(ds, batch_size=4, num_workers=2, worker_init_fn=init))
    assert sorted(sum(_ids(batches), [])) == list(range(8))
    # Range shards 0-3 to worker 0, 4-7 to worker 1; the loader's own copy untouched
    assert {(i, t) for b in batches for i, t in zip(b["i"].tolist(), b["tag"].tolist())} == \
        {(i, i // 4) for i in range(8)} and ds.tag == -1


class _Counting(IterableDataset):
    """Says 20, and yields 20 in each worker (no sharding by get_worker_info())."""

    def __len__(self):
        return 20

    def __iter__(self):
        return iter(range(20))


@pytest.mark.filterwarnings("ignore:.*excessive worker creation:UserWarning")
@pytest.mark.parametrize("workers", [None, 0, 2])
def test_more_than_len_warns_as_dataloader_once_len_was_asked(workers):
    """DataLoader warns when an IterableDataset yields more than len(loader) said, from
    the iterators started after len() was asked (its test matches these words)."""
    import warnings

    words = r"but [0-9]+ samples have been fetched\. " + (
        "For multiprocessing data-loading, this" if workers else r"$")
    loader = stoker.Loader(_Counting(), num_workers=workers)
    got = 20 * (workers or 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == got  # len() not asked: no warning
    assert len(loader) == 20
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            next(it)
    if workers:
        for _ in range(3):
            with pytest.warns(UserWarning, match=words):
                next(it)
    with pytest.raises(StopIteration):
        for _ in range(got):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                next(it)


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_a_datapipe_is_shuffled_and_sharded_as_dataloader_does_it(num_workers):
    from torch.utils.data.datapipes.iter import IterableWrapper

    def pipe():
        return IterableWrapper(list(range(50))).shuffle(buffer_size=20).sharding_filter()

    loader = stoker.Loader(pipe(), batch_size=None, shuffle=True, num_workers=num_workers)
    runs = []
    for seed in (123, 123, 321):
        torch.manual_seed(seed)  # DataLoader draws the DataPipe's seed at iter()
        runs.append([int(x) for x in loader])
    assert all(sorted(r) == list(range(50)) for r in runs)  # sharded: each item once
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert runs[0] != list(range(50))  # its shufflers were turned on
    # without shuffle=True, the DataPipe is left as it is (DataLoader's shuffle=None)
    assert [int(x) for x in stoker.Loader(IterableWrapper(list(range(10))).shuffle()
                                          .set_shuffle(False), batch_size=None)] == \
        list(range(10))
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        stoker.Loader(Range(8), batch_size=2, shuffle=True)


# -- ranks: DataLoader's rule, stoker's split only when asked ---------------------------------

def test_a_dataset_that_splits_itself_by_rank_is_read_whole_under_torchrun(tmp_path):
    """A webdataset-style dataset splitting its shards by rank (RANK/WORLD_SIZE, as
    split_by_node reads them) under 2 real ranks: each rank is given the dataset as it is,
    as DataLoader gives it, so the union of both ranks' samples is the whole dataset, once
    each. stoker's own split, asked for with even_batches=, gives equal batches over a
    dataset that does not split itself, and is said when the dataset splits too."""
    import json
    import os
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "frameworks", "torchrun_iterable.py")
    out = str(tmp_path / "it")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", script, out], capture_output=True, text=True,
                       timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = []
    for r in range(2):
        with open(f"{out}.{r}") as f:
            res.append(json.load(f))
    for key in ("dataloader", "stoker", "stoker_0"):
        rows = [x for r in res for b in r[key] for x in b]
        assert sorted(rows) == list(range(203)), key  # all of it, once each
    for r in res:  # each rank's samples are the ones DataLoader gives that rank
        assert sorted(x for b in r["stoker"] for x in b) == \
            sorted(x for b in r["dataloader"] for x in b)
    even = [[x for b in r["even"] for x in b] for r in res]
    assert len(res[0]["even"]) == len(res[1]["even"]) == 13  # ceil(203 / 16)
    assert set(even[0]) | set(even[1]) == set(range(203))
    assert len(even[0]) == len(even[1]) == 102  # ceil(203 / 2): one padding sample
    assert all(len(r["warned"]) == 1 for r in res)


class _SplitByNode(IterableDataset):
    """A WebDataset pipeline's shape: split_by_node among its stages."""

    def __init__(self):
        def split_by_node(src):
            yield from src
        self.pipeline = [lambda: iter(range(10)), split_by_node]

    def __iter__(self):
        yield from range(10)


def test_stokers_split_over_a_dataset_that_splits_itself_is_refused():
    with pytest.raises(ValueError, match="splits itself by rank.*split_by_node"):
        stoker.Loader(_SplitByNode(), batch_size=2, even_batches=True)
    with pytest.raises(ValueError, match="splits itself by rank"):
        stoker.Loader(_SplitByNode(), batch_size=2, rank=0, world_size=2)
    loader = stoker.Loader(_SplitByNode(), batch_size=2, rank=0, world_size=1)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert "as it is" in str(stoker.Loader(_SplitByNode(), batch_size=2).plan)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_pads_with_rows_through_map(workers):
    """The epoch's first rows pad its end (even_batches): after a resume they are read
    again, and go through map as they did the first time."""
    def fn(sample, rng):
        return {"i": sample["i"], "m": sample["i"] * 10}

    def make():  # 23 rows, steps of 8: rank 1's last batch ends with a padding row
        return stoker.Loader(Resumable(23), batch_size=4, rank=1, world_size=2,
                             even_batches=True, map=fn, num_workers=workers, seed=1)

    loader = make()
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    rest = [b["m"].tolist() for b in it]
    other = make()
    other.load_state_dict(state)
    assert [b["m"].tolist() for b in other] == rest and len(rest[-1]) == 4


def _children():
    """This process's live child processes."""
    import glob

    pids = set()
    for f in glob.glob("/proc/self/task/*/children"):
        with open(f) as fh:
            pids |= {int(x) for x in fh.read().split()}
    return {p for p in pids if not _gone(p)}


@pytest.mark.parametrize("python_workers", ["thread", "process"])
def test_the_core_runs_the_epochs_and_the_readings_end_with_their_streams(python_workers):
    """The core plans the batches and learns each epoch's end from the stream (NOTE [ Open-
    ended epochs ]): its stats count the rows, the stage's time is measured, and a reading
    whose iterator left early (its stream stopped) ends its workers once the next one
    starts, so many epochs left early hold no more worker threads (or processes) than
    one."""
    import gc
    import threading
    import time

    gc.collect()
    before = _children()
    loader = stoker.Loader(Range(1000), batch_size=4, num_workers=2,
                           python_workers=python_workers)
    assert type(loader._producer).__name__ == "IterableProducer"
    for _ in range(6):  # break after two batches of each epoch
        it = iter(loader)
        next(it)
        next(it)
        del it
    ids = _ids(loader)  # the next epoch, whole
    assert len(ids) == 250 and ids[:2] == [[0, 500, 1, 501], [2, 502, 3, 503]]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [t.name for t in threading.enumerate() if t.name.startswith("stoker-iterable-")]
        alive += sorted(_children() - before)
        if len(alive) <= 2:
            break
        time.sleep(0.05)
    assert len(alive) <= 2, alive  # the last reading's two at most
    s = loader.stats()
    assert s["samples"] == 6 * 8 + 1000 and s["batches"] == 6 * 2 + 250
    assert s["python_seconds"] > 0
    loader.close()


# -- worker processes (NOTE [ Iterable datasets in processes ]) -------------------------------

class _Slow(Range):
    """Range whose rows say the process that made them; `delay` seconds each."""

    def __init__(self, n, delay=0.0):
        super().__init__(n)
        self.delay = delay

    def __iter__(self):
        import os
        import time

        for row in super().__iter__():
            time.sleep(self.delay)
            yield {**row, "pid": os.getpid()}


def _drawing(sample, rng):
    sample["y"] = int(rng.integers(0, 1 << 30))
    return sample


def test_process_workers_serve_a_process_holding_over_1024_files():
    # a training process often holds more than 1024 files (shards, sockets, CUDA's); the
    # loader's own sockets then get fds past 1024, which select() cannot take
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1100
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"this machine allows {hard} open files, the test needs {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    held = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        with stoker.Loader(Range(10), batch_size=4, num_workers=2,
                           python_workers="process") as loader:
            got = sorted(i for b in loader for i in b["i"].tolist())
        assert got == list(range(10))
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_process_workers_give_the_batches_of_thread_workers():
    import os

    def run(python_workers, **kw):
        with stoker.Loader(_Slow(37), batch_size=4, num_workers=2, map=_drawing, seed=5,
                           python_workers=python_workers, **kw) as loader:
            loader.set_epoch(1)
            return list(loader)

    threads, processes = run("thread"), run("process")
    assert [b["i"].tolist() for b in threads] == [b["i"].tolist() for b in processes]
    assert [b["y"].tolist() for b in threads] == [b["y"].tolist() for b in processes]
    pids = {int(p) for b in processes for p in b["pid"]}
    assert len(pids) == 2 and os.getpid() not in pids  # map and the stream: in the workers
    assert {int(p) for b in threads for p in b["pid"]} == {os.getpid()}
    # DataLoader's arguments alone (num_workers > 0, python_workers left at "auto") mean
    # processes, as for a map-style dataset; num_workers=0 reads in the loop's thread
    assert "process workers" in str(stoker.Loader(Range(4), batch_size=2, num_workers=2).plan)
    auto = run("auto")
    assert [b["y"].tolist() for b in auto] == [b["y"].tolist() for b in threads]
    assert os.getpid() not in {int(p) for b in auto for p in b["pid"]}


class _Epochs(Range):
    """Range whose rows say the epoch set_epoch gave the worker's copy, and how many
    times worker_init_fn ran on it."""

    epoch, inits = -1, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        import os

        for row in super().__iter__():
            yield {**row, "epoch": self.epoch, "inits": self.inits, "pid": os.getpid()}


def _count_init(w):
    get_worker_info().dataset.inits += 1


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_processes_are_kept_across_epochs_and_told_each_epoch(persistent):
    with stoker.Loader(_Epochs(8), batch_size=4, num_workers=2, worker_init_fn=_count_init,
                       persistent_workers=persistent) as loader:
        epochs = []
        for e in range(3):
            loader.set_epoch(e)
            epochs.append(list(loader))
    for e, batches in enumerate(epochs):
        assert {int(x) for b in batches for x in b["epoch"]} == {e}  # set_epoch reached them
        # worker_init_fn again at each epoch, as in DataLoader's new workers, or once
        assert {int(x) for b in batches for x in b["inits"]} == {1 if persistent else e + 1}
    pids = [{int(p) for b in batches for p in b["pid"]} for batches in epochs]
    assert len(pids[0]) == 2 and pids[0] == pids[1] == pids[2]  # the same two processes


def _gone(pid):
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too, once its parent reaps it
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_worker_process_killed_raises_in_the_loop_and_nothing_hangs():
    import os
    import signal
    import time

    loader = stoker.Loader(_Slow(400, delay=0.005), batch_size=4, num_workers=2)
    it = iter(loader)
    first = next(it)
    pids = {int(p) for p in first["pid"]}
    victim = int(first["pid"][1])  # worker 1's (rows alternate 0, 1, 0, 1)
    assert victim != os.getpid()  # (never this process: the workers are processes)
    os.kill(victim, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by "
                                           r"signal: Killed") as e:
        for _ in it:
            pass
    assert f"pid {victim}" in str(e.value) and time.monotonic() - t0 < 30
    assert list(it) == []  # the iterator ended, as DataLoader's (NOTE [ After a failed batch ])
    t0 = time.monotonic()
    loader.close()
    assert time.monotonic() - t0 < 10 and all(_gone(p) for p in pids)
    # the next epoch starts new workers
    assert sorted(i for b in loader for i in b["i"].tolist()) == list(range(400))


def test_a_script_that_exits_mid_epoch_ends_its_worker_processes(tmp_path):
    """No close(), a live iterator, workers busy in the dataset: the interpreter's exit
    ends them (and does not hang)."""
    import subprocess
    import sys
    import time

    script = tmp_path / "exits.py"
    script.write_text(
        "import os, sys, time, torch, stoker\n"
        "class S(torch.utils.data.IterableDataset):\n"
        "    def __iter__(self):\n"
        "        while True:\n"
        "            time.sleep(0.01)\n"
        "            yield {'pid': os.getpid()}\n"
        "it = iter(stoker.Loader(S(), batch_size=2, num_workers=2))\n"
        "print(sorted({int(p) for _ in range(3) for p in next(it)['pid']}), flush=True)\n")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert time.monotonic() - t0 < 30
    pids = [int(x) for x in p.stdout.strip().strip("[]").split(",")]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(_gone(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(x) for x in pids)


class _Filled(IterableDataset):
    """n rows, each a 4 KiB array filled with its number (and its number), sharded across
    workers; a worker's replies overwrite its arenas once given back."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        import numpy as np

        info = get_worker_info()
        w, k = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(w, self.n, k):
            yield {"a": np.full(1024, i, np.int32), "raw": np.full(8, i, np.int64), "i": i}


def _same(sample, rng):
    return sample


def test_rows_from_processes_are_their_own_wherever_they_outlive_their_batch():
    """Rows of worker processes are views of their arenas, given back once their batch
    is made (NOTE [ Iterable datasets in processes ]): what outlives it is a copy (an
    object field, a collate_fn's rows, the epoch's first rows that pad its end), a step
    larger than the arenas a worker starts with gets new ones, and every batch is the
    threads' batch."""
    import numpy as np

    def run(python_workers, **kw):
        with stoker.Loader(_Filled(403), num_workers=2, python_workers=python_workers,
                           timeout=60, **kw) as loader:
            return list(loader)

    def check(batches, *, kept=False):
        for b in batches:
            rows = b if kept else [dict(zip(b, v)) for v in zip(*b.values())]
            for r in rows:
                i = int(r["i"])
                assert np.all(np.asarray(r["a"]) == i) and np.all(np.asarray(r["raw"]) == i)

    # a collate_fn that keeps its rows: they are copies, not views of reused arenas
    kept = run("process", batch_size=8, collate_fn=lambda rows: rows)
    assert sorted(int(r["i"]) for b in kept for r in b) == list(range(403))
    check(kept, kept=True)
    # an object field is kept in the batch as it is: a copy too
    objects = run("process", batch_size=8, map=_same, map_fields={"raw": object})
    assert sorted(int(i) for b in objects for i in b["i"]) == list(range(403))
    check(objects)
    # a step of more rows than a worker's first arenas hold (16 replies of 8 rows)
    for kw in (dict(batch_size=400), dict(batch_size=8, rank=1, world_size=2),
               dict(batch_size=16, rank=0, world_size=3, even_batches=True)):
        threads, processes = run("thread", **kw), run("process", **kw)
        assert len(threads) == len(processes) > 0, kw
        for t, p in zip(threads, processes):
            assert t.keys() == p.keys() and all(torch.equal(t[k], p[k]) for k in t), kw
        check(processes)


@pytest.mark.parametrize("python_workers", ["thread", "process"])
def test_stats_count_the_streams_workers(python_workers):
    """The stats and the stall verdict count the workers reading the stream (not the one
    C++ thread that numbers its rows), and their time in the dataset and map is the
    Python stage's."""
    for workers in (0, 1, 3):
        with stoker.Loader(Range(12), batch_size=4, num_workers=workers, map=_same,
                           python_workers=python_workers) as loader:
            assert len(list(loader)) == 3
            s = loader.stats()
        assert s["num_threads"] == max(1, workers)
        assert "1 of 1 thread" not in s["verdict"] or workers <= 1
        assert s["python_seconds"] > 0
        if workers:  # the workers' CPU reaches the stats
            assert s["python_cpu_seconds"] > 0
