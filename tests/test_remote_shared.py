"""Remote datasets that share a cache directory (NOTE [ Cache budget ] in
stoker/remote/space.py): a train and a validation set, ranks with different schedules,
and the error when their windows cannot all fit. Real nginx on loopback, four downloads
in flight per dataset."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import stoker
from stoker.remote import RemoteError

REC = 4096  # bytes of each record's payload: shards of 16 records, ~64 KB
PER_SHARD = 16
# bytes/s per download (nginx limit_rate). nginx lets the first second's worth through at
# once, so at this rate a shard (~66 KB) is not slowed: the tests check progress and
# budgets, not times (a slower rate makes every download take a second or more).
RATE = "4000000"
# A rate at which a shard downloads for a second or so: long enough for the downloads in
# flight to be seen by sampling them, and for two readers to overlap.
SLOW = "40000"


def write(path, n, offset):
    fields = {"x": stoker.ndarray("uint8", (REC,)), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size=PER_SHARD * (REC + 40)) as w:
        for i in range(n):
            w.write({"x": np.full(REC, (offset + i) % 251, np.uint8), "label": offset + i})


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    write(root / "train", 24 * PER_SHARD, 0)
    write(root / "val", 16 * PER_SHARD, 10**6)
    return root


@pytest.fixture(scope="module")
def served_root(www):
    """What the `nginx` fixture (conftest.py) serves."""
    return www


def shard_bytes(www, name):
    return max(s["bytes"] for s in stoker.Dataset(www / name).shards)


def open_remote(nginx, name, cache, limit, rate=RATE):
    return stoker.Dataset(f"{nginx.url}/{name}", cache_dir=cache, cache_limit=limit,
                          storage_options={"headers": {"X-Test-Rate": rate}})


def run_epochs(ds, window, epochs=2, seed=0, out=None):
    """Labels of ``epochs`` epochs, each checked against its record's payload."""
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, shard_window=window, seed=seed,
                           num_threads=2)
    labels = []
    for e in range(epochs):
        loader.set_epoch(e)
        for b in loader:
            x, y = b["x"].numpy(), b["label"].numpy()
            assert (x[:, 0] == y % 251).all() and (x[:, -1] == y % 251).all()
            labels.extend(int(v) for v in y)
    if out is not None:
        out.append(labels)
    return labels


def in_threads(*jobs, timeout=120):
    """Runs each (fn, args) in its own thread; returns their results or raises the first
    error; a thread still running after ``timeout`` s fails the test."""
    results, errors = [None] * len(jobs), [None] * len(jobs)

    def run(k, fn, args):
        try:
            results[k] = fn(*args)
        except BaseException as e:  # re-raised below, in the test's thread
            errors[k] = e

    threads = [threading.Thread(target=run, args=(k, fn, args), daemon=True)
               for k, (fn, args) in enumerate(jobs)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"still running after {timeout} s"
    for e in errors:
        if e is not None:
            raise e
    return results


def test_train_and_val_share_one_budget(www, nginx, tmp_path):
    """A bounded train set and a bounded val set in one directory whose cache_limit is just
    above the sum of their windows: both finish two epochs, at the same time, and the
    directory never holds more than the budget. (Their times against each alone:
    bench/bench_remote_shared.py.)"""
    size = shard_bytes(www, "train")
    window = 2
    limit = 2 * window * size + size // 2
    cache = tmp_path / "cache"
    train = open_remote(nginx, "train", cache, limit)
    val = open_remote(nginx, "val", cache, limit)
    assert train.remote.cache.directory.budget() == limit
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            used, _ = train.remote.cache.directory.scan(clean=False)  # no eviction lock
            peak[0] = max(peak[0], used)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        got_train, got_val = in_threads((run_epochs, (train, window)), (run_epochs, (val, window)))
    finally:
        stop.set()
        watcher.join()
    assert sorted(got_train) == sorted(2 * list(range(24 * PER_SHARD)))
    assert sorted(got_val) == sorted(2 * list(range(10**6, 10**6 + 16 * PER_SHARD)))
    assert peak[0] <= limit
    for ds in (train, val):
        st = ds.remote.stats()
        assert st["released"] > 0 and st["evictions"] + st["released"] > 0
    train.remote.close()
    val.remote.close()
    assert os.listdir(cache / "tmp") == [] and os.listdir(cache / "holders") == []


@pytest.mark.slow
@pytest.mark.parametrize("room", ["windows", "double"])
def test_each_dataset_keeps_its_downloads_in_flight(www, nginx, tmp_path, room):
    """Sharing a budget costs a dataset no downloads that the budget has room for. With
    room for both windows (``windows``: the budget just above their sum), each dataset
    has its whole window downloading at once with the other's, and the two together never
    have more downloads reserved than the budget holds; with room for each one's next
    window too (``double``), each keeps all its ``max_inflight`` downloads going at once
    with the other's, as it does alone."""
    size = shard_bytes(www, "train")
    window = 2
    per = {"windows": window, "double": 2 * window}[room]  # shards of room per dataset
    limit = 2 * per * size + size // 2
    cache = tmp_path / "cache"
    sets = [stoker.Dataset(f"{nginx.url}/{name}", cache_dir=cache, cache_limit=limit,
                           storage_options={"headers": {"X-Test-Rate": SLOW}})
            for name in ("train", "val")]
    samples = []
    stop = threading.Event()

    def watch():
        while not stop.wait(0.002):
            samples.append(tuple(ds.remote.stats()["downloads_in_flight"] for ds in sets))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        got = in_threads(*((run_epochs, (ds, window, 1)) for ds in sets), timeout=150)
    finally:
        stop.set()
        watcher.join()
    assert sorted(got[0]) == list(range(24 * PER_SHARD))
    assert sorted(got[1]) == list(range(10**6, 10**6 + 16 * PER_SHARD))
    # never more reserved than the budget holds (each download reserves its whole shard)
    assert max(a + b for a, b in samples) <= limit // size
    # each with its own share downloading at once: a window, or max_inflight (4)
    each = min(per, sets[0].remote.max_inflight)
    assert any(a >= each and b >= each for a, b in samples), sorted(set(samples))
    for ds in sets:  # (a loader still alive prefetches its next epoch: close cancels it)
        ds.remote.close()
        assert ds.remote.stats()["downloads_in_flight"] == 0
    assert os.listdir(cache / "tmp") == [] and os.listdir(cache / "holders") == []


RANK = textwrap.dedent("""
    import json, sys
    import stoker
    url, cache, limit, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ds = stoker.Dataset(url, cache_dir=cache, cache_limit=limit,
                        storage_options={"headers": {"X-Test-Rate": sys.argv[5]}})
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, shard_window=2, seed=seed,
                           num_threads=2)
    labels = []
    for e in range(2):
        loader.set_epoch(e)
        for b in loader:
            assert (b["x"][:, 0].numpy() == b["label"].numpy() % 251).all()
            labels += [int(v) for v in b["label"]]
    print(json.dumps({"labels": labels, **ds.remote.stats()}))
""")


def test_three_processes_with_different_schedules(www, nginx, tmp_path):
    """Three processes (ranks, or three jobs) read one bounded dataset through one
    directory, each in its own order (another seed): all finish, every epoch whole."""
    size = shard_bytes(www, "train")
    limit = 3 * 2 * size + size // 2
    cache = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, f"{nginx.url}/train", cache,
                               str(limit), str(seed), RATE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in range(3)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            outs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    want = sorted(2 * list(range(24 * PER_SHARD)))
    for o in outs:
        assert sorted(o["labels"]) == want
    assert len({tuple(o["labels"]) for o in outs}) == 3  # three different orders
    assert sum(o["shared_hits"] + o["cache_hits"] for o in outs) > 0  # they shared
    assert os.listdir(os.path.join(cache, "holders")) == []


def test_windows_that_cannot_fit_together_are_named(www, nginx, tmp_path):
    """Each dataset's window fits the budget alone, but not both at once: the waiting
    download fails after a grace period, naming the directory, the budget, what each
    dataset pins and needs, and the smallest budget that would work."""
    size = shard_bytes(www, "train")
    window = 3
    limit = 4 * size
    cache = tmp_path / "cache"
    # slow downloads: the two readers overlap even when one thread starts late on a busy
    # machine (at full speed one could read both its epochs before the other begins)
    train = open_remote(nginx, "train", cache, limit, SLOW)
    val = open_remote(nginx, "val", cache, limit, SLOW)
    with pytest.raises(RemoteError) as e:
        in_threads((run_epochs, (train, window)), (run_epochs, (val, window)), timeout=90)
    msg = str(e.value)
    assert f"in the cache directory {cache}" in msg
    assert f"its budget is {limit / 1e3:.1f} KB ({limit} bytes)" in msg
    for name in ("train", "val"):
        assert f"{nginx.url}/{name}: pins " in msg
    need = train.remote.window_need(window) + val.remote.window_need(window)
    assert f"a budget of at least {need / 1e3:.1f} KB ({need} bytes) would work" in msg
    train.remote.close()
    val.remote.close()


def run_unbounded(ds, epochs=2, shuffle=False):
    """Labels of ``epochs`` epochs read without a shard_window (an evaluation loader)."""
    loader = stoker.Loader(ds, batch_size=8, shuffle=shuffle, seed=1, num_threads=2)
    labels = []
    for e in range(epochs):
        loader.set_epoch(e)
        for b in loader:
            x, y = b["x"].numpy(), b["label"].numpy()
            assert (x[:, 0] == y % 251).all()
            labels.extend(int(v) for v in y)
    return labels


@pytest.mark.parametrize("val_limit", ["none", "same"])
def test_a_bounded_and_an_unbounded_dataset_share_one_directory(www, nginx, tmp_path,
                                                                val_limit):
    """A bounded train set and a val set read without shard_window (its dataset opened
    with no cache_limit, or with the train set's) in one directory whose budget holds
    the train window and a few shards, far less than the val set: the val set does not
    keep every shard it has read pinned, so both finish two epochs, the directory never
    over its budget."""
    size = shard_bytes(www, "train")
    window = 2
    limit = 2 * window * size + 3 * size
    assert limit < sum(s["bytes"] for s in stoker.Dataset(www / "val").shards)
    cache = tmp_path / "cache"
    train = open_remote(nginx, "train", cache, limit)
    val = open_remote(nginx, "val", cache, None if val_limit == "none" else limit)
    assert train.remote.cache.directory.budget() == limit
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            used, _ = train.remote.cache.directory.scan(clean=False)  # no eviction lock
            peak[0] = max(peak[0], used)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        got_train, got_val = in_threads((run_epochs, (train, window)),
                                        (run_unbounded, (val,)), timeout=150)
    finally:
        stop.set()
        watcher.join()
    assert sorted(got_train) == sorted(2 * list(range(24 * PER_SHARD)))
    assert got_val == 2 * list(range(10**6, 10**6 + 16 * PER_SHARD))
    assert peak[0] <= limit
    assert val.remote.stats()["released"] > 0
    train.remote.close()
    val.remote.close()
    assert os.listdir(cache / "tmp") == [] and os.listdir(cache / "holders") == []
