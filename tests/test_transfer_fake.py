"""GPU delivery through the host fake device: no GPU needed.

``_core.CudaTransfer(fake=True)`` runs the real transfer engine (copy thread, copy
stream, events, device buffer pool) over a fake device whose streams are threads and
whose "device" memory is host memory, exported as CPU tensors. Batches must equal the
CPU path bit for bit. ``Loader(..., _fake_device=True)`` routes through it.
"""

import gc
import time

import numpy as np
import pytest
import stoker
import torch
from conftest import corrupt_record, thread_names, write_dataset
from stoker import _core


def wait_until(pred, seconds=3.0):
    deadline = time.time() + seconds
    while not pred() and time.time() < deadline:
        time.sleep(0.01)
    return pred()


@pytest.fixture
def var_ds(tmp_path):
    """Fixed, scalar and variable-length fields, several shards."""
    fields = {"x": stoker.ndarray("uint8", (3, 4, 4)), "label": stoker.scalar("int64"),
              "tok": stoker.ndarray("int32", (None,))}
    return write_dataset(
        tmp_path / "v", 100, fields=fields, shard_size="2KB",
        make=lambda i: {"x": np.full((3, 4, 4), i % 256, np.uint8), "label": i,
                        "tok": np.arange(i % 7, dtype=np.int32) * (i + 1)})


def fake_epoch(loader, epoch=0, prefetch=2, delay_us=0, keep=True):
    """One epoch through CudaTransfer(fake=True) over the loader's own host engine."""
    t = _core.CudaTransfer(loader._engine.start(epoch, 0), 0, prefetch, fake=True,
                           fake_delay_us=delay_us)
    out = []
    try:
        while True:
            caps = t.next(0)
            if caps is None:
                break
            b = {name: torch.from_dlpack(c) for name, c in caps}
            out.append(b if keep else {k: v.clone() for k, v in b.items()})
    finally:
        t.stop()
    return out, t


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape, k
            assert torch.equal(g[k], w[k]), k


# -- CudaTransfer(fake=True) directly ------------------------------------------

@pytest.mark.parametrize("delay_us", [0, 300])
@pytest.mark.parametrize("prefetch", [1, 3])
def test_fake_transfer_equals_cpu_path(var_ds, delay_us, prefetch):
    loader = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=5, num_threads=3)
    for epoch in range(2):
        loader.set_epoch(epoch)
        cpu = list(loader)
        got, t = fake_epoch(loader, epoch, prefetch=prefetch, delay_us=delay_us)
        assert_same_batches(got, cpu)
        s = t.stats()
        assert s["copies"] == len(cpu) and s["bytes"] > 0
        assert all(v.device.type == "cpu" for b in got for v in b.values())


def test_fake_transfer_buffers_are_recycled(var_ds):
    loader = stoker.Loader(var_ds, batch_size=4, num_threads=2)
    cpu = [{k: v.clone() for k, v in b.items()} for b in loader]
    got, t = fake_epoch(loader, prefetch=2, delay_us=100, keep=False)
    assert_same_batches(got, cpu)
    # dropped batches return their buffer: a few buffers serve 25 batches
    assert t.stats()["pool_buffers"] <= 2 + 4


def test_fake_transfer_kept_batches_stay_intact(var_ds):
    loader = stoker.Loader(var_ds, batch_size=4, num_threads=2)
    got, t = fake_epoch(loader, prefetch=2, delay_us=50)  # list(loader): all kept
    assert len(got) == 25 and t.stats()["pool_buffers"] >= 25
    for b in got:
        for j, label in enumerate(b["label"].tolist()):
            assert (b["x"][j] == label % 256).all()
    del t
    gc.collect()
    for b in got:  # still valid after the transfer is gone
        assert (b["x"][0] == b["label"][0] % 256).all()


def test_fake_transfer_early_stop_leaves_no_copy_thread(var_ds):
    loader = stoker.Loader(var_ds, batch_size=2, num_threads=2, prefetch=2)
    t = _core.CudaTransfer(loader._engine.start(0, 0), 0, 2, fake=True, fake_delay_us=200)
    first = {n: torch.from_dlpack(c) for n, c in t.next(0)}
    assert "stoker-copy" in thread_names()
    t.stop()  # stops the source too, then joins the copy thread
    t.stop()  # idempotent
    assert "stoker-copy" not in thread_names()
    with pytest.raises(ValueError, match="stopped"):
        t.next(0)
    assert first["label"].tolist() == [0, 1]
    del t, loader
    gc.collect()
    assert wait_until(lambda: "stoker-copy" not in thread_names())


def test_fake_transfer_dropped_without_stop(var_ds):
    loader = stoker.Loader(var_ds, batch_size=2, num_threads=2)
    t = _core.CudaTransfer(loader._engine.start(0, 0), 0, 3, fake=True)
    t.next(0)
    del t
    gc.collect()
    assert wait_until(lambda: "stoker-copy" not in thread_names())


def test_fake_transfer_error_surfaces_at_its_batch(tmp_path):
    ds = write_dataset(tmp_path / "d", 40, shard_size="1MB")
    corrupt_record(ds, 23)
    ds = stoker.Dataset(tmp_path / "d")
    loader = stoker.Loader(ds, batch_size=4, num_threads=3, prefetch=4)
    t = _core.CudaTransfer(loader._engine.start(0, 0), 0, 4, fake=True)
    time.sleep(0.2)  # the copy thread meets the error long before the consumer does
    got = [[int(v) for v in torch.from_dlpack(dict(t.next(0))["label"])] for _ in range(5)]
    assert got == [list(range(i, i + 4)) for i in range(0, 20, 4)]
    with pytest.raises(stoker.DataError, match="record 23"):
        t.next(0)
    with pytest.raises(stoker.DataError, match="record 23"):
        t.next(0)  # and stays failed
    t.stop()


def test_fake_pinned_allocator_handle():
    h = _core.fake_pinned_allocator()
    assert h.pinned


# -- through the Loader ---------------------------------------------------------

def test_loader_fake_device_equals_cpu_path(var_ds):
    cpu = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=1, num_threads=2)
    fake = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=1, num_threads=3,
                         _fake_device=True)
    for epoch in range(2):
        cpu.set_epoch(epoch)
        fake.set_epoch(epoch)
        assert_same_batches(list(fake), list(cpu))


def test_loader_transfer_stats_add_up_across_epochs(var_ds):
    fake = stoker.Loader(var_ds, batch_size=8, num_threads=2, _fake_device=True)
    assert "transfer" not in fake.stats()
    for _ in range(2):
        n = sum(1 for _ in fake)
    done = fake.stats()["transfer"]
    assert done["copies"] == 2 * n
    # the buffers stay in the loader's pool for the next epoch, no more than it keeps idle
    assert 1 <= done["pool_buffers"] <= fake.prefetch + 2 and done["pool_bytes"] > 0
    assert done["bytes"] > 0 and done["copy_seconds"] > 0 and done["copy_gbps"] > 0
    it = iter(fake)
    next(it)
    # A live epoch counts its copies once the copy thread has seen them complete,
    # which may lag the batches already taken; it never counts more than it made.
    s = fake.stats()["transfer"]
    assert 2 * n <= s["copies"] <= 2 * n + 1 + fake.prefetch + 2
    assert s["bytes"] >= done["bytes"] and s["pool_buffers"] >= 1
    it.close()  # the copy thread waits for its queued copies and counts them
    closed = fake.stats()["transfer"]
    assert closed["copies"] >= 2 * n + 1 and closed["bytes"] > done["bytes"]


@pytest.mark.parametrize("delay_us", [0, 300])
def test_loader_fake_device_epochs_share_buffers_safely(var_ds, delay_us):
    """Epochs copy into one pool: a batch kept from an earlier epoch is never
    overwritten by a later one, and dropped batches' buffers serve the next epoch."""
    cpu = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=3, num_threads=2)
    fake = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=3, num_threads=2,
                         _fake_device=True)
    fake._device_context  # noqa: B018 (created with the loader, before any epoch)
    want, kept = [], []
    for epoch in range(3):
        cpu.set_epoch(epoch)
        fake.set_epoch(epoch)
        want.append(list(cpu))
        got = list(fake) if epoch == 0 else [
            {k: v.clone() for k, v in b.items()} for b in fake]  # later epochs drop theirs
        kept.append(got)
        assert fake.stats()["transfer"]["pool_buffers"] <= len(kept[0]) + fake.prefetch + 2
    for got, w in zip(kept, want):
        assert_same_batches(got, w)  # epoch 0's buffers were not reused while held
    s = fake.stats()["transfer"]
    assert s["pool_buffers"] >= len(kept[0])
    del kept[0], got
    gc.collect()
    # Returned buffers wait in the pool (freeing one needs a host wait for the GPU, never
    # done in a tensor's deleter); the next epoch's copies reuse them and free the surplus.
    fake.set_epoch(3)
    assert sum(1 for _ in fake) == len(want[0])
    left = fake.stats()["transfer"]["pool_buffers"]
    assert left <= 2 * (fake.prefetch + 2) and left < s["pool_buffers"]


def test_loader_fake_device_new_iterator_stops_the_live_one(var_ds):
    fake = stoker.Loader(var_ds, batch_size=4, num_threads=2, _fake_device=True)
    it = iter(fake)
    first = next(it)
    it2 = iter(fake)  # stops `it` (and its copy thread) and counts its copies
    with pytest.raises(StopIteration):
        next(it)
    assert_same_batches([next(it2)], [first])  # the next epoch's first batch
    assert fake.stats()["transfer"]["copies"] >= 1
    del it, it2
    gc.collect()
    assert wait_until(lambda: "stoker-copy" not in thread_names())


def test_loader_fake_device_resume_and_break(var_ds):
    cpu = stoker.Loader(var_ds, batch_size=4, num_threads=2)
    want = list(cpu)
    fake = stoker.Loader(var_ds, batch_size=4, num_threads=2, _fake_device=True)
    it = iter(fake)
    head = [next(it) for _ in range(3)]
    state = fake.state_dict()
    del it
    gc.collect()
    assert wait_until(lambda: "stoker-copy" not in thread_names())
    again = stoker.Loader(var_ds, batch_size=4, num_threads=3, _fake_device=True)
    again.load_state_dict(state)
    assert_same_batches(head + list(again), want)


# -- no GPU: a clear error at construction -------------------------------------------

@pytest.mark.skipif(_core.cuda_status()[0], reason="checks the error where no GPU is usable")
def test_cuda_loader_without_gpu_fails_clearly_at_construction(var_ds):
    with pytest.raises(RuntimeError, match="CUDA is not usable here: .*libcuda.so.1"):
        stoker.Loader(var_ds, batch_size=4, device="cuda")


@pytest.mark.skipif(_core.cuda_status()[0], reason="checks the error where no GPU is usable")
def test_cuda_transfer_without_gpu_raises_cuda_error(var_ds):
    loader = stoker.Loader(var_ds, batch_size=4)
    it = loader._engine.start(0, 0)
    with pytest.raises(stoker.CudaError, match="libcuda.so.1 not found|no CUDA device"):
        _core.CudaTransfer(it, 0, 2)
    it.stop()
    with pytest.raises(stoker.CudaError, match="libcuda.so.1 not found|no CUDA device"):
        _core.pinned_allocator(0)
    with pytest.raises(stoker.CudaError, match="libcuda.so.1 not found|no CUDA device"):
        _core.DeviceContext(0, 2)
    available, count, reason = _core.cuda_status()
    assert not available and count == 0 and reason
