"""Open-ended epochs through the bindings (NOTE [ Open-ended epochs ] in
csrc/pipeline/batch_producer.h): the loader core over an ``IterableProducer``, its batches
filled by Python threads from one reading of a generator per stream, in rows' order, as
the Python stage fills an IterableDataset's. The core learns the epoch's length from the
stage (``task.end()`` at the first batch with no row left), and keeps its rules with it:
the last batch partial, the next epoch after the end, the resume state and skip() counted
in rows, several live iterators each reading the source once, the stats' samples."""

import threading

import numpy as np
import pytest
from stoker import _core


class RowStage:
    """The stage's part for a source read in order: per stream (``task.stream``), an
    iterator over ``range(rows)`` read forward as far as the batches ask; a batch with no
    row left ends the epoch, one cut short is the last."""

    def __init__(self, handoff, rows, threads=2):
        self.handoff, self.rows = handoff, rows
        self.lock = threading.Lock()
        self.readings = {}  # stream -> [iterator, rows read so far, buffered rows]
        self.streams = set()
        self.offsets = []
        self.stop = False
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(threads)]
        for t in self.threads:
            t.start()

    def row(self, stream, offset, i):
        """Row `i` of the stream's reading; None past its end. A resumed segment's reading
        starts at `offset` (the rows consumed are read again, not kept)."""
        with self.lock:
            r = self.readings.get(stream)
            if r is None:
                it = iter(range(self.rows))
                for _ in range(offset):
                    next(it, None)
                r = self.readings[stream] = [it, offset, {}]
            it, read, buf = r
            while read <= i:
                v = next(it, None)
                if v is None:
                    break
                buf[read] = v
                read += 1
            r[1] = read
            return buf.pop(i, None)

    def loop(self):
        while not self.stop:
            got = self.handoff.take(20)
            if got is None:
                continue
            task, lo, hi = got
            if not task.chunk_done():
                continue
            with self.lock:
                self.streams.add(task.stream)
                self.offsets.append(task.offset)
            values = [self.row(task.stream, task.offset, int(i)) for i in task.indices]
            values = [v * 10 for v in values if v is not None]
            if not values:
                task.end()
                continue
            if len(values) < task.samples:
                task.set_samples(len(values))
            a = np.asarray(values, dtype=np.int64)
            mem = task.allocate(a.nbytes)
            mem[:] = a.view(np.uint8)
            task.complete([("v", "int64", [len(values)], 0, a.nbytes)], a.nbytes, task.batch + 1,
                          0)

    def close(self):
        self.stop = True
        for t in self.threads:
            t.join()


@pytest.fixture
def loader():
    made = []

    def make(rows, batch_size, prefetch=3):
        handoff = _core.PythonHandoff(batch_size, batch_size)
        o = _core.LoaderOptions()
        o.num_threads = 2
        o.prefetch = prefetch
        o.auto_threads = False
        o.auto_prefetch = False
        o.finisher = handoff
        core = _core.LoaderCore(_core.IterableProducer(batch_size), o)
        handoff.bind(core)
        stage = RowStage(handoff, rows)
        made.append((core, handoff, stage))
        return core, stage

    yield make
    for core, handoff, stage in made:
        core.close()
        handoff.close()
        stage.close()


def values(batch):
    import torch

    (name, cap), = batch
    return torch.from_dlpack(cap).tolist()


def epoch(it):
    out = []
    while (b := it.next(timeout_ms=10_000)) is not None:
        assert b is not False, "no batch within 10 s"
        out.append(values(b))
    return out


def rows(lo, hi):
    return [i * 10 for i in range(lo, hi)]


@pytest.mark.parametrize("n", [23, 20, 0])
def test_the_epoch_ends_where_the_source_does(loader, n):
    core, _ = loader(n, 5)
    assert core.num_batches(0, 1) == _core.UNKNOWN_BATCHES  # len() is the dataset's to say
    for e in range(2):
        it = core.iter(0, 1)
        assert epoch(it) == [rows(lo, min(n, lo + 5)) for lo in range(0, n, 5)]
        assert it.epoch == e
        assert it.next(timeout_ms=100) is None  # and stays ended
        assert core.state()[:2] == (e + 1, 0)
    assert core.stats()["samples"] == 2 * n  # the last batch counts its rows


def test_resume_and_skip_count_rows(loader):
    core, _ = loader(23, 5)
    it = core.iter(0, 1)
    for _ in range(2):
        it.next(timeout_ms=10_000)
    state = core.state()
    assert state[:2] == (0, 10)
    want = [rows(10, 15), rows(15, 20), rows(20, 23)]
    resumed, stage = loader(23, 5)
    resumed.load_state(*state)
    assert epoch(resumed.iter(0, 1)) == want
    assert 10 in stage.offsets  # the stage is told where the segment starts
    skipped, _ = loader(23, 5)
    skipped.skip(2, 0, 1)
    assert epoch(skipped.iter(0, 1)) == want


def test_two_live_iterators_each_read_the_source(loader):
    core, stage = loader(14, 4)
    a, b = core.iter(0, 1), core.iter(0, 1)
    got = []
    while True:
        x, y = a.next(timeout_ms=10_000), b.next(timeout_ms=10_000)
        assert (x is None) == (y is None)
        if x is None:
            break
        got.append((values(x), values(y)))
    assert [x for x, _ in got] == [y for _, y in got] == \
        [rows(0, 4), rows(4, 8), rows(8, 12), rows(12, 14)]
    assert a.epoch == b.epoch == 0
    assert len(stage.streams) >= 2
    assert core.state()[:2] == (1, 0)
