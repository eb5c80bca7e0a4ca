"""Workers stuck in user code (NOTE [ Stuck workers ] in stoker/_stage/stuck.py): past
``timeout``, or past the epoch they belonged to, a worker process is ended and a stage
thread left behind, each replaced, so the next epochs run whole; the error names the
sample. Whatever the workers did (killed, hung), no descriptor, memfd, shared-memory file
or worker process outlives close() or a dropped loader."""

import functools
import gc
import os
import signal
import threading
import time
import uuid

import pytest
import stoker
from conftest import eventually, fd_counts, process_alive, write_dataset

WORKERS = pytest.mark.parametrize("workers", ["thread", "process"])
HANG = (20, 44)  # samples whose map hangs the first time it meets them (batches 2 and 5)
_release = threading.Event()  # hung threads return once a test is over


@pytest.fixture(autouse=True)
def release_hung_threads():
    _release.clear()
    yield
    _release.set()


class HangOnce:
    """map: hangs on each of `samples` the first time any worker meets it (a marker file
    says it was met: the next meeting, in a successor, goes on)."""

    def __init__(self, folder, samples=HANG):
        self.folder = folder
        self.samples = samples

    def __call__(self, s, rng):
        label = int(s["label"])
        if label in self.samples:
            try:
                os.close(os.open(os.path.join(self.folder, str(label)),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                _release.wait(3600)  # a thread returns at the test's end; a process is ended
        return {"label": s["label"], "x": s["x"]}


def labels(loader, epoch, stop=None):
    loader.set_epoch(epoch)
    out = []
    for i, b in enumerate(loader):
        out += b["label"].tolist()
        if stop is not None and i + 1 == stop():
            break
    return out


@WORKERS
@pytest.mark.timeout(120)
def test_a_map_stuck_past_timeout_is_replaced(tmp_path, workers):
    """A map that hangs on two samples: the epoch fails at `timeout` with an error naming
    them, and the next three epochs are whole, each within its timeout."""
    ds = write_dataset(tmp_path / "ds", 64, shard_size="4KB")
    loader = stoker.Loader(ds, batch_size=8, num_workers=2, python_workers=workers,
                           map=HangOnce(str(tmp_path), (3, 44)), timeout=3.0, prefetch=8)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 3 seconds") as e:
        labels(loader, 0)  # batch 0 holds sample 3
    said = str(e.value)
    assert "sample 3 (" in said, said
    assert ("it was ended" if workers == "process" else "a new thread took its place") in said
    assert time.monotonic() - t0 < 15
    for epoch in (1, 2, 3):
        assert sorted(labels(loader, epoch)) == list(range(64)), epoch
    assert sorted(os.listdir(tmp_path)) == ["3", "44", "ds"]  # both met, each once
    loader.close()


@WORKERS
@pytest.mark.timeout(120)
def test_workers_stuck_past_their_epoch_are_replaced(tmp_path, workers):
    """No timeout: the loop leaves epoch 0 (a break) while both workers hang on samples of
    later batches; at the next iter() they are replaced, and epochs 1-3 are whole."""
    ds = write_dataset(tmp_path / "ds", 64, shard_size="4KB")
    loader = stoker.Loader(ds, batch_size=8, num_workers=2, python_workers=workers,
                           map=HangOnce(str(tmp_path)), prefetch=8)

    def both_met():  # the break, once both samples are in the map
        eventually(lambda: len(os.listdir(tmp_path)) == 3, 20)
        return 1

    assert labels(loader, 0, stop=both_met) == list(range(8))
    t0 = time.monotonic()
    for epoch in (1, 2, 3):
        assert sorted(labels(loader, epoch)) == list(range(64)), epoch
    assert time.monotonic() - t0 < 30
    if workers == "process":
        assert len(loader._stage.workers.pids()) == 2
    loader.close()


def _shm_files(folder):
    return sum(len(files) for _, _, files in os.walk(folder))


def _at_17(workers):
    """Whether a worker is on sample 17 (or gone: killed there)."""
    doing = [workers.doing(i) for i in range(2)]
    return any(d is None or d[1] == 17 for d in doing)


def _use(ds, how, folder):
    """One loader over `ds` (decoded cache, worker processes) whose map kills its worker,
    or hangs, on a sample of batch 2; the loop takes batch 0 and leaves; closed, or
    dropped. The workers' pids."""
    def map_fn(s, rng):
        if int(s["label"]) == 17 and os.getpid() != main:
            if how.startswith("kill"):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
        return {"label": s["label"], "image": s["image"]}

    main = os.getpid()
    loader = stoker.Loader(ds, batch_size=8, num_workers=2, python_workers="process",
                           map=map_fn, cache="decoded", cache_size="16MB", prefetch=4,
                           stall_warning=None)
    pids = []
    try:
        for _ in loader:
            pids = loader._stage.workers.pids()
            eventually(functools.partial(_at_17, loader._stage.workers), 5)
            break
    except RuntimeError:  # the killed worker's batch
        pass
    if how.endswith("close"):
        loader.close()
    del loader
    return pids


@pytest.mark.parametrize("loaders", [
    pytest.param(16, id="16"),
    pytest.param(100, id="100", marks=[pytest.mark.slow, pytest.mark.timeout(600)])])
@pytest.mark.timeout(300)
def test_nothing_outlives_loaders_whose_workers_were_killed_or_hung(tmp_path, monkeypatch,
                                                                   loaders):
    """Loaders whose worker processes were killed, or hung in map, closed or dropped: the
    process's descriptors and memfds, the cache's files in shared memory and the worker
    processes stay flat over all of them."""
    from stoker._stage import lifecycle

    monkeypatch.setattr(lifecycle, "_STOP_SECONDS", 0.05)  # a hung worker: SIGTERM sooner
    shm = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path),
                       f"stoker-stuck-{uuid.uuid4().hex[:8]}")
    os.makedirs(shm)
    monkeypatch.setenv("STOKER_CACHE_DIR", shm)
    import numpy as np
    from conftest import png

    ds = write_dataset(tmp_path / "ds", 48, fields={"image": stoker.image(),
                                                    "label": stoker.scalar("int64")},
                       make=lambda i: {"image": png(np.full((12, 16, 3), i, np.uint8)),
                                       "label": i})
    kinds = ["kill, close", "hang, close", "kill, drop", "hang, drop"]
    _use(ds, kinds[0], shm)  # what the first loader sets up once
    gc.collect()
    eventually(lambda: _shm_files(shm) == 0, 10)
    time.sleep(0.5)
    before = fd_counts()  # (other tests' loaders may hold memfds of their own)
    pids = []
    for i in range(loaders):
        pids += _use(ds, kinds[i % 4], shm)
        if i % 8 == 7:
            gc.collect()
    gc.collect()
    settled = eventually(lambda: fd_counts()[0] <= before[0] and
                         fd_counts()[1] <= before[1] and _shm_files(shm) == 0, 15)
    assert settled, (before, fd_counts(), _shm_files(shm))
    assert pids and not any(process_alive(p) for p in pids)
    for p in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(p, os.WNOHANG)


def test_a_thread_gone_idle_meanwhile_is_not_past_its_epoch():
    """The check at iter() reads a thread's batch once from its record: the thread may go
    idle meanwhile (its record's batch None), which is no batch past its epoch."""
    from types import SimpleNamespace

    from stoker._stage.stuck import _past

    assert not _past(None, 3)
    assert _past(SimpleNamespace(stopped=True, epoch=3), 3)
    assert _past(SimpleNamespace(stopped=False, epoch=2), 3)
    assert not _past(SimpleNamespace(stopped=False, epoch=3), 3)
    assert not _past(SimpleNamespace(stopped=False, epoch=2), None)
