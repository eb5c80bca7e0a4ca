"""GPU delivery through the host fake device: no GPU needed.

A Loader whose device is ``_testing.fake_device()`` (conftest.fake_device_loader) runs the
real transfer engine (copy thread, copy stream, events, device buffer pool) over a fake
device whose streams are threads and whose "device" memory is host memory, exported as
CPU tensors. Batches must equal the CPU path bit for bit.
"""

import gc
import itertools
import time

import numpy as np
import pytest
import stoker
import torch
from conftest import corrupt_record, fake_device_loader, native_testing, thread_names, write_dataset
from stoker import _core

_testing = native_testing()  # the test-only entry points (tests/ext/)


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


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape, k
            assert torch.equal(g[k], w[k]), k


# -- the transfer engine through the Loader, on the fake device ---------------------

@pytest.mark.parametrize("delay_us", [0, 300])
@pytest.mark.parametrize("prefetch", [1, 3])
def test_fake_transfer_equals_cpu_path(var_ds, delay_us, prefetch):
    cpu = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=5, num_threads=3)
    fake = fake_device_loader(var_ds, delay_us, batch_size=8, shuffle=True, seed=5,
                              num_threads=3, prefetch=prefetch)
    for epoch in range(2):
        cpu.set_epoch(epoch)
        fake.set_epoch(epoch)
        want = list(cpu)
        got = list(fake)
        assert_same_batches(got, want)
        assert all(v.device.type == "cpu" for b in got for v in b.values())
    fake.close()  # the copy thread waits for its copies and counts them
    s = fake.stats()
    assert s["copies"] >= 2 * len(want) and s["copy_bytes"] > 0


def test_fake_transfer_buffers_are_recycled(var_ds):
    cpu = [{k: v.clone() for k, v in b.items()}
           for b in stoker.Loader(var_ds, batch_size=4, num_threads=2)]
    fake = fake_device_loader(var_ds, 100, batch_size=4, num_threads=2, prefetch=2)
    got = [{k: v.clone() for k, v in b.items()} for b in fake]
    assert_same_batches(got, cpu)
    # dropped batches return their buffer: a few buffers serve 25 batches
    assert fake.stats()["device_buffers"] <= 2 + 4


def test_fake_transfer_kept_batches_stay_intact(var_ds):
    fake = fake_device_loader(var_ds, 50, batch_size=4, num_threads=2, prefetch=2)
    got = list(fake)  # all kept
    assert len(got) == 25 and fake.stats()["device_buffers"] >= 25
    for b in got:
        for j, label in enumerate(b["label"].tolist()):
            assert (b["x"][j] == label % 256).all()
    del fake
    gc.collect()
    for b in got:  # still valid after the loader is gone
        assert (b["x"][0] == b["label"][0] % 256).all()


def test_fake_transfer_early_stop_leaves_no_copy_thread(var_ds):
    fake = fake_device_loader(var_ds, 200, batch_size=2, num_threads=2, prefetch=2)
    it = iter(fake)
    first = next(it)
    assert "stoker-copy" in thread_names()
    it.close()  # stops the stream and joins the copy thread
    it.close()  # idempotent
    assert "stoker-copy" not in thread_names()
    with pytest.raises(StopIteration):
        next(it)
    assert first["label"].tolist() == [0, 1]
    del it, fake
    gc.collect()
    assert wait_until(lambda: "stoker-copy" not in thread_names())


def test_fake_transfer_dropped_without_close(var_ds):
    fake = fake_device_loader(var_ds, batch_size=2, num_threads=2, prefetch=3)
    it = iter(fake)
    next(it)
    del it
    gc.collect()
    assert wait_until(lambda: "stoker-copy" not in thread_names())


def test_fake_transfer_error_surfaces_at_its_batch(tmp_path):
    ds = write_dataset(tmp_path / "d", 40, shard_size="1MB")
    corrupt_record(ds, 23)
    ds = stoker.Dataset(tmp_path / "d")
    fake = fake_device_loader(ds, batch_size=4, num_threads=3, prefetch=4)
    it = iter(fake)
    got = [next(it)["label"].tolist()]
    time.sleep(0.2)  # the copy thread meets the error long before the consumer does
    got += [next(it)["label"].tolist() for _ in range(4)]
    assert got == [list(range(i, i + 4)) for i in range(0, 20, 4)]
    with pytest.raises(stoker.DataError, match="record 23"):
        next(it)
    # the failed batch is consumed and the batches after it follow (as DataLoader's)
    assert [b["label"].tolist() for b in it] == [list(range(i, i + 4)) for i in range(24, 40, 4)]
    fake.set_epoch(0)
    assert [b["label"].tolist() for b in itertools.islice(fake, 5)] == got


def test_fake_pinned_memory_handle():
    assert _core.pinned_memory(_testing.fake_device()).pinned


# -- through the Loader ---------------------------------------------------------

def test_loader_fake_device_equals_cpu_path(var_ds):
    cpu = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=1, num_threads=2)
    fake = fake_device_loader(var_ds, batch_size=8, shuffle=True, seed=1, num_threads=3)
    for epoch in range(2):
        cpu.set_epoch(epoch)
        fake.set_epoch(epoch)
        assert_same_batches(list(fake), list(cpu))


def test_loader_transfer_stats_add_up_across_epochs(var_ds):
    fake = fake_device_loader(var_ds, batch_size=8, num_threads=2)
    assert fake.stats()["copies"] == 0
    for _ in range(2):
        n = sum(1 for _ in fake)
    done = fake.stats()
    # copies are counted once the copy thread sees them complete: the last one may lag,
    # and the next epoch's first ones may already be in
    assert 2 * n - 1 <= done["copies"] <= 2 * n + fake.prefetch
    # the buffers stay in the loader's pool for the next epoch, no more than it keeps idle
    assert 1 <= done["device_buffers"] <= 2 * (fake.prefetch + 2)
    assert done["device_bytes"] > 0
    assert done["copy_bytes"] > 0 and done["copy_seconds"] > 0 and done["copy_gbps"] > 0
    # the consumer's wait means the same as without a device: time blocked in next()
    assert 0 < done["wait_seconds"] <= done["run_seconds"]


@pytest.mark.parametrize("delay_us", [0, 300])
def test_loader_fake_device_epochs_share_buffers_safely(var_ds, delay_us):
    """Epochs copy into one pool: a batch kept from an earlier epoch is never
    overwritten by a later one, and dropped batches' buffers serve the next epoch."""
    cpu = stoker.Loader(var_ds, batch_size=8, shuffle=True, seed=3, num_threads=2)
    fake = fake_device_loader(var_ds, delay_us, batch_size=8, shuffle=True, seed=3,
                              num_threads=2)
    want, kept = [], []
    for epoch in range(3):
        cpu.set_epoch(epoch)
        fake.set_epoch(epoch)
        want.append(list(cpu))
        got = list(fake) if epoch == 0 else [
            {k: v.clone() for k, v in b.items()} for b in fake]  # later epochs drop theirs
        kept.append(got)
        assert fake.stats()["device_buffers"] <= len(kept[0]) + 2 * (fake.prefetch + 2)
    for got, w in zip(kept, want, strict=True):
        assert_same_batches(got, w)  # epoch 0's buffers were not reused while held
    peak = fake.stats()["device_buffers"]
    assert peak >= len(kept[0])
    del kept[0], got
    gc.collect()
    # Returned buffers wait in the pool (freeing one needs a host wait for the GPU, never
    # done in a tensor's deleter); the next epoch's copies reuse them and free the surplus.
    fake.set_epoch(3)
    assert sum(1 for _ in fake) == len(want[0])
    left = fake.stats()["device_buffers"]
    assert left <= 2 * (fake.prefetch + 2) and left < peak


def test_loader_fake_device_concurrent_iterators(var_ds):
    fake = fake_device_loader(var_ds, batch_size=4, num_threads=2)
    cpu = [b for b in stoker.Loader(var_ds, batch_size=4, num_threads=2)]
    pairs = list(zip(fake, fake, strict=True))  # two iterators, each with its copy thread
    assert len(pairs) == len(cpu)
    assert_same_batches([a for a, _ in pairs], cpu)
    assert_same_batches([b for _, b in pairs], cpu)
    del pairs
    gc.collect()
    assert wait_until(lambda: thread_names().count("stoker-copy") <= 1)


def test_loader_fake_device_resume_and_break(var_ds):
    cpu = stoker.Loader(var_ds, batch_size=4, num_threads=2)
    want = list(cpu)
    fake = fake_device_loader(var_ds, batch_size=4, num_threads=2)
    it = iter(fake)
    head = [next(it) for _ in range(3)]
    state = fake.state_dict()
    del it
    gc.collect()
    assert wait_until(lambda: "stoker-copy" not in thread_names())
    again = fake_device_loader(var_ds, batch_size=4, num_threads=3)
    again.load_state_dict(state)
    assert_same_batches(head + list(again), want)


# -- no GPU: a clear error at construction -------------------------------------------

@pytest.mark.skipif(_core.cuda_status()[0], reason="checks the error where no GPU is usable")
def test_cuda_loader_without_gpu_fails_clearly_at_construction(var_ds):
    with pytest.raises(RuntimeError, match="CUDA is not usable here: .*libcuda.so.1"):
        stoker.Loader(var_ds, batch_size=4, device="cuda")


@pytest.mark.skipif(_core.cuda_status()[0], reason="checks the error where no GPU is usable")
def test_cuda_device_without_gpu_raises_cuda_error():
    with pytest.raises(stoker.CudaError, match="libcuda.so.1 not found|no CUDA device"):
        _core.cuda_device(0)
    available, count, reason = _core.cuda_status()
    assert not available and count == 0 and reason
