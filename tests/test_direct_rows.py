"""Worker processes write fixed-shape rows straight into their batch (NOTE [ Direct rows ]
in stoker/_stage/direct.py): the batches are DataLoader's, whatever goes in place and
whatever does not, and no memory is kept for it that the loader no longer needs."""

import multiprocessing
import os
import signal
import time

import numpy as np
import pytest
import stoker
import torch
from conftest import eventually
from stoker import _core


class Fixed(torch.utils.data.Dataset):
    """Fixed-shape tensors and arrays, nested, beside numbers and strings."""

    def __len__(self):
        return 90

    def __getitem__(self, i):
        g = np.random.default_rng(i)
        return {"image": torch.from_numpy(g.integers(0, 255, (3, 20, 24), dtype=np.uint8)),
                "pair": (g.standard_normal(7).astype(np.float32), torch.tensor([i, -i])),
                "label": i, "name": f"s{i}"}


class Varying(Fixed):
    """From sample 40 on, the dict value "boxes" has another first dimension: padded."""

    def __getitem__(self, i):
        d = super().__getitem__(i)
        d["boxes"] = np.full((4 if i < 40 else 1 + i % 5, 2), i, np.float32)
        return d


def _same(a, b):
    assert type(a) is type(b) or isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    else:
        assert a == b


def _pad_collate(samples):
    """default_collate, "boxes" padded with their lengths as stoker pads where they vary."""
    if len({len(s["boxes"]) for s in samples}) == 1:
        return torch.utils.data.default_collate(samples)
    out = torch.utils.data.default_collate([{k: v for k, v in s.items() if k != "boxes"}
                                            for s in samples])
    n = max(len(s["boxes"]) for s in samples)
    boxes = torch.zeros((len(samples), n, 2))
    for j, s in enumerate(samples):
        boxes[j, :len(s["boxes"])] = torch.from_numpy(s["boxes"])
    out["boxes"] = boxes
    out["boxes_lengths"] = torch.tensor([len(s["boxes"]) for s in samples])
    return out


def _loader(ds, **kw):
    return stoker.Loader(ds, batch_size=8, num_workers=2, python_workers="process", **kw)


def _mapped_blocks(pid):
    """{address range: inode} of the batch blocks process `pid` maps."""
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[0]: int(line.split()[4]) for line in f if "stoker-batch" in line}


def test_rows_written_in_place_give_dataloaders_batches_every_epoch():
    ds = Fixed()
    want = list(torch.utils.data.DataLoader(ds, batch_size=8))
    loader = _loader(ds, prefetch_next_epoch=False)  # (no request in flight after it)
    try:
        for _ in range(2):
            got = list(loader)
            assert len(got) == len(want)
            for a, b in zip(got, want):
                _same(a, b)
        # the rows did go in place: every batch but the first ones (before the layout
        # was known)
        assert loader._stage._chunks._direct.batches >= 2 * len(want) - 3
        for w in loader._stage._placement.workers._workers:
            # a worker maps the blocks it was sent, once each (and none inherited)
            assert len(_mapped_blocks(w.pid)) == len(w.blocks) > 0
            # and its arenas keep no more than the chunk's rows that went by them
            # (numbers and strings pickled: none)
            assert sum(a.resident() for a in w.arenas) <= 1 << 20
    finally:
        loader.close()


def test_a_field_whose_shape_changes_mid_epoch_is_batched_as_before():
    ds = Varying()
    want = list(torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=_pad_collate))
    loader = _loader(ds)
    try:
        got = list(loader)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            _same(a, b)
        assert not loader._stage._chunks._direct.enabled  # its rows go by the arenas now
        _same(list(loader)[-1], want[-1])
    finally:
        loader.close()


def test_a_batch_left_mid_epoch_does_not_write_into_the_next_ones():
    ds = Fixed()
    want = list(torch.utils.data.DataLoader(ds, batch_size=8))
    loader = _loader(ds, prefetch_factor=4)
    try:
        for stop in (1, 3, 5):
            for k, b in enumerate(loader):
                _same(b, want[k])
                if k == stop:
                    break
        for a, b in zip(loader, want):
            _same(a, b)
    finally:
        loader.close()


def test_a_worker_forked_while_batches_live_does_not_keep_their_memory():
    first = _loader(Fixed())
    second = _loader(Fixed())
    try:
        held = next(iter(first))  # its block lives in this process
        fd, _bid, _off, _size = _core.shared_block(held["image"].data_ptr())
        ino = os.fstat(fd).st_ino
        next(iter(second))  # forks the second loader's workers now
        for w in second._stage._placement.workers._workers:
            assert ino not in _mapped_blocks(w.pid).values()  # no inherited mapping ...
            for name in os.listdir(f"/proc/{w.pid}/fd"):  # ... nor descriptor
                try:
                    assert os.stat(f"/proc/{w.pid}/fd/{name}").st_ino != ino
                except FileNotFoundError:
                    pass
    finally:
        first.close()
        second.close()


def test_a_batch_kept_by_a_forked_child_stays_as_it_was():
    """The user's os.fork() while a batch lives: the child's batch is the parent's block
    itself (shared memory, not copied on write). The parent's loader frees that block when
    the parent lets go of it, never handing it to a later batch, so the child still reads
    its own batch after the parent went on for epochs (before: a later batch's rows)."""
    loader = _loader(Fixed())
    try:
        it = iter(loader)
        next(it)  # the first batch comes by the arenas: the second is written in place
        held = next(it)
        want = held["image"].numpy().tobytes()
        bid = _core.shared_block(held["image"].data_ptr())[1]
        go_r, go_w = os.pipe()
        res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: reads its batch once the parent has gone on
            code = 1
            try:
                os.read(go_r, 1)
                code = 0 if held["image"].numpy().tobytes() == want else 2
                os.write(res_w, bytes([code]))
            finally:
                os._exit(code)
        os.close(go_r)
        os.close(res_w)
        try:
            del held
            for _ in range(3):  # the pool's blocks go round several times
                for _ in loader:
                    pass
            freed = _core.dead_shared_blocks([bid])
        finally:  # the child never waits past the test
            os.write(go_w, b"x")
            os.close(go_w)
            got = os.read(res_r, 1)
            os.close(res_r)
            status = os.waitpid(pid, 0)[1]
        assert got == bytes([0]) and status == 0, "the child's batch changed under it"
        assert freed == [bid]  # freed when given back, not reused
    finally:
        loader.close()


def test_the_loaders_own_worker_forks_leave_its_blocks_in_use():
    first = _loader(Fixed())
    second = _loader(Fixed())
    try:
        it = iter(first)
        next(it)
        held = next(it)  # written in place: a shared block
        bid = _core.shared_block(held["image"].data_ptr())[1]
        next(iter(second))  # forks the second loader's workers while the block lives
        del held
        for _ in range(2):
            for _ in first:
                pass
        assert _core.dead_shared_blocks([bid]) == []  # given back, and used again
    finally:
        first.close()
        second.close()


def test_collate_fn_rows_are_the_users_own_copies():
    ds = Fixed()
    kept = []

    def collate(samples):
        kept.append(samples)
        return torch.utils.data.default_collate(samples)

    loader = _loader(ds, collate_fn=collate)
    try:
        got = list(loader)
        want = list(torch.utils.data.DataLoader(ds, batch_size=8))
        for a, b in zip(got, want):
            _same(a, b)
        assert len(kept) >= len(want)  # (and the next epoch's first, prefetched)
        for samples in kept:  # still the samples they were (collated in any order)
            _same(torch.utils.data.default_collate(samples), want[samples[0]["label"] // 8])
    finally:
        loader.close()


def test_shared_blocks_are_named_while_they_live_and_dead_after():
    loader = _loader(Fixed())
    try:
        batch = next(iter(loader))
        addr = batch["image"].data_ptr()
        got = _core.shared_block(addr)
        assert got is not None
        fd, bid, offset, size = got
        assert os.fstat(fd).st_size == size and 0 <= offset < size
        assert _core.dead_shared_blocks([bid, 1 << 60]) == [1 << 60]
        assert _core.shared_block(id(loader)) is None  # an address of no block
    finally:
        loader.close()
    del batch, loader
    import gc

    gc.collect()
    # the loader gone and its batches dropped, its blocks are freed
    assert _core.dead_shared_blocks([bid]) == [bid]


def test_threads_keep_pageable_memory():
    # threads never write from another process: their batches are not shared blocks
    loader = stoker.Loader(Fixed(), batch_size=8, num_workers=2, python_workers="thread")
    try:
        b = next(iter(loader))
        assert _core.shared_block(b["image"].data_ptr()) is None
    finally:
        loader.close()


class Big(torch.utils.data.Dataset):
    """Rows of 512 KiB: a chunk of 4 is 2 MiB of arena, when it goes by the arena."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"x": torch.full((512, 1024), i % 251, dtype=torch.uint8), "label": i}


def test_the_arenas_of_the_first_batches_give_their_pages_back():
    """The first batches' rows (before the layout was known) come by the arenas; once rows
    go into their batches, those arenas do not keep their pages, whichever slots the
    later chunks lease."""
    loader = _loader(Big(), prefetch_next_epoch=False)
    try:
        for _ in range(2):
            got = list(loader)
            assert [int(b["x"][j, 0, 0]) for b in got for j in range(8)] == \
                [i % 251 for i in range(64)]
        assert loader._stage._chunks._direct.batches >= 2 * 8 - 3
        for w in loader._stage._placement.workers._workers:
            assert len(w.arenas) >= 2  # (a chunk queued beside one mapped: two leases)
            assert sum(a.resident() for a in w.arenas) < 1 << 20
    finally:
        loader.close()


class Counted(torch.utils.data.Dataset):
    """Counts the samples begun, across the fork (unlocked: exact with one worker)."""

    def __init__(self, begun, delay=0.01):
        self.begun = begun
        self.delay = delay

    def __len__(self):
        return 48

    def __getitem__(self, i):
        self.begun.value += 1
        time.sleep(self.delay)
        return {"x": np.full(16, i, np.int32)}


def test_a_batchs_memory_is_taken_when_a_worker_begins_its_chunk(monkeypatch):
    """Not when the chunk is queued at the worker behind another: a worker's second
    request, for the next batch, holds no memory while the worker maps the first."""
    from stoker._stage import direct

    begun = multiprocessing.RawValue("q", 0)
    planned = []
    plan = direct.DirectRows._plan

    def recorded(self, task):
        planned.append((int(task.indices[0]) // 4, begun.value))
        return plan(self, task)

    monkeypatch.setattr(direct.DirectRows, "_plan", recorded)
    loader = stoker.Loader(Counted(begun), batch_size=4, num_workers=1,
                           python_workers="process", prefetch_factor=4)
    try:
        got = list(loader)
        assert [int(v) for b in got for v in b["x"][:, 0]] == list(range(48))
        assert len(planned) >= 8  # every batch after the first ones went in place
        for batch, samples_begun in planned:
            # one chunk per batch: every sample of the batches before it was begun
            assert samples_begun >= 4 * batch, planned
    finally:
        loader.close()


class Dies(Fixed):
    """Its worker is killed at sample 45 (mid-chunk, rows in place), once."""

    def __init__(self, armed):
        self.armed = armed

    def __getitem__(self, i):
        if i == 45 and self.armed.value:
            self.armed.value = 0
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


def _until_raises(loader, error, match):
    """The batches an epoch of `loader` gave before it raised `error`."""
    got = []
    with pytest.raises(error, match=match):
        for b in loader:
            got.append(b)
    return got


def test_a_worker_killed_mid_chunk_fails_the_batch_and_the_next_epoch_is_whole():
    armed = multiprocessing.RawValue("i", 1)
    ds = Dies(armed)
    armed.value = 0
    want = list(torch.utils.data.DataLoader(ds, batch_size=8))
    armed.value = 1
    loader = _loader(ds)
    try:
        got = _until_raises(loader, RuntimeError, "worker process")
        assert 3 <= len(got) <= 5  # batches 0-4 hold samples 0-39; 45 is in batch 5
        for a, b in zip(got, want):
            _same(a, b)
        for a, b in zip(loader, want):  # a new worker in its place
            _same(a, b)
    finally:
        loader.close()


def test_a_failed_plan_fails_its_batch_and_the_worker_goes_on(monkeypatch):
    from stoker._stage import direct

    plan = direct.DirectRows._plan

    def failing(self, task):
        if int(task.indices[0]) == 48:
            raise ValueError("no plan for batch 6")
        return plan(self, task)

    ds = Fixed()
    want = list(torch.utils.data.DataLoader(ds, batch_size=8))
    monkeypatch.setattr(direct.DirectRows, "_plan", failing)
    loader = _loader(ds)
    try:
        got = _until_raises(loader, ValueError, "no plan for batch 6")
        assert len(got) == 6
        pids = loader._stage._placement.workers.pids()
        monkeypatch.setattr(direct.DirectRows, "_plan", plan)
        for a, b in zip(loader, want):
            _same(a, b)
        assert loader._stage._placement.workers.pids() == pids  # nobody was killed
    finally:
        loader.close()


def test_close_while_workers_wait_for_their_blocks_ends_them():
    """close() mid-epoch, each worker mid-chunk (its ask sent, perhaps not answered):
    close() returns, every worker ended and reaped, and a new iter() reads a whole epoch
    (a worker waiting for its answer reads EOF; nothing waits on the stage's side)."""
    begun = multiprocessing.RawValue("q", 0)
    loader = stoker.Loader(Counted(begun, delay=0.05), batch_size=4, num_workers=2,
                           python_workers="process")
    it = iter(loader)
    for _ in range(3):  # past the first batches: the rows go in place
        next(it)
    assert loader._stage._chunks._direct.batches >= 1
    pids = loader._stage._placement.workers.pids()
    loader.close()
    for p in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(p, os.WNOHANG)
    try:
        got = list(loader)
        assert sorted(int(v) for b in got for v in b["x"][:, 0]) == list(range(48))
    finally:
        loader.close()


def _kept_blocks(run):
    """The batch blocks mapped here after `run()` (its loader closed and dropped) that
    were not before, with the garbage collector off: memory that only a collection
    would give back."""
    import gc

    gc.collect()
    before = set(_mapped_blocks(os.getpid()).values())
    gc.disable()
    try:
        run()
        return set(_mapped_blocks(os.getpid()).values()) - before
    finally:
        gc.enable()


def test_a_loader_closed_mid_epoch_and_dropped_keeps_no_batch_memory():
    """close() mid-epoch fails the chunks in flight (their workers ended): those errors
    held the frames that held their batches' memory, in a cycle through the batch's
    record, so a dropped loader's blocks stayed mapped until a garbage collection."""
    def run():
        loader = stoker.Loader(Counted(multiprocessing.RawValue("q", 0), delay=0.02),
                               batch_size=4, num_workers=2, python_workers="process")
        it = iter(loader)
        for _ in range(4):  # past the first batches: rows in place, chunks in flight
            next(it)
        assert loader._stage._chunks._direct.batches >= 1
        loader.close()
        del it, loader

    assert _kept_blocks(run) == set()



class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(w, 90, n):
            yield Fixed()[i]


@pytest.mark.parametrize("kind", ["process", "thread"])
@pytest.mark.parametrize("iterable", [False, True], ids=["map", "iterable"])
@pytest.mark.parametrize("leave", [False, True], ids=["whole", "break"])
def test_a_closed_loader_the_user_keeps_holds_no_batch_memory(kind, iterable, leave):
    """close() gives back every batch block the loader holds, not when the loader object
    is collected (a trainer keeps its loaders): a stage thread's record of its last chunk,
    a delivery or a batch waiting for the stage's threads held a stopped batch, and its
    block (10-30 MB in bench_python's loops), for the loader's life."""
    ds = _Stream() if iterable else Fixed()
    loader = stoker.Loader(ds, batch_size=8, num_workers=2, python_workers=kind,
                           persistent_workers=True)
    held = None
    for _ in range(2):
        for k, held in enumerate(loader):  # noqa: B007 (the loop holds its last batch)
            if leave and k == 3:
                break
    assert loader.stats()["host_blocks"] > 0  # (the batch the loop holds, at least)
    del held
    loader.close()
    s = loader.stats()
    assert (s["host_blocks"], s["host_bytes"]) == (0, 0)
    # and the loader works on after it
    assert sum(len(b["label"]) for b in loader) == 90
    loader.close()


def _busy(activity):
    """The stage threads whose record says they are on something: (name, phase)."""
    return [(d.name, d.phase) for d in activity.threads()
            if d.phase is not None or d.task is not None]


@pytest.mark.parametrize("iterable", [False, True], ids=["map", "iterable"])
def test_a_closed_loader_holds_no_batch_after_collate_fn_or_batch_map(iterable):
    """The same with the user's collate_fn or batch_map, which stage threads run after a
    batch's rows (their record marks the phase and the batch): once done, no thread's
    record holds a batch, and close() leaves no block held."""
    def collate(rows):
        return {k: torch.utils.data.default_collate([r[k] for r in rows])
                for k in ("image", "label")}

    for kw in (dict(collate_fn=collate), dict(batch_map=lambda b, rng: b)):
        loader = stoker.Loader(_Stream() if iterable else Fixed(), batch_size=8, num_workers=2,
                               persistent_workers=True, prefetch_next_epoch=False, **kw)
        assert sum(len(b["label"]) for b in loader) == 90
        activity = loader._stage._activity  # (no next epoch read ahead: nothing to do)
        assert eventually(lambda a=activity: not _busy(a)), _busy(activity)
        loader.close()
        s = loader.stats()
        assert (s["host_blocks"], s["host_bytes"]) == (0, 0), kw
