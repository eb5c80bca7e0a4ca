"""device="cuda": batches on the GPU equal the CPU path bit for bit.

Skipped without a usable CUDA device. Run on a GPU machine with
``bash tests/gpu/run_gpu_checks.sh`` (also under compute-sanitizer).
"""

import gc
import time

import numpy as np
import pytest
import stoker
import torch
from conftest import thread_names, write_dataset
from stoker import _core

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (torch.cuda.is_available() and _core.cuda_status()[0]),
                       reason="needs a CUDA device"),
]

# GPU cycles a "slow kernel" spins: ~1 ms, long enough that the loader copies
# several batches (into recycled buffers) while the consumer's reads are queued.
SLOW_CYCLES = 2_000_000


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    fields = {"x": stoker.ndarray("uint8", (3, 32, 32)), "y": stoker.ndarray("float32", (17,)),
              "label": stoker.scalar("int64"), "tok": stoker.ndarray("int32", (None,))}

    def make(i):
        rng = np.random.default_rng(i)
        return {"x": rng.integers(0, 256, (3, 32, 32), dtype=np.uint8),
                "y": rng.standard_normal(17).astype(np.float32), "label": i,
                "tok": np.arange(i % 11, dtype=np.int32) * (i + 1)}

    return write_dataset(tmp_path_factory.mktemp("gpu") / "ds", 600, fields=fields,
                         shard_size="256KB", make=make)


def cpu_epoch(ds, epoch=0, **kw):
    loader = stoker.Loader(ds, num_threads=2, **kw)
    loader.set_epoch(epoch)
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def assert_equal_batches(gpu, cpu, device=0):
    assert len(gpu) == len(cpu)
    for g, c in zip(gpu, cpu):
        assert g.keys() == c.keys()
        for k in g:
            assert g[k].device == torch.device("cuda", device), k
            assert g[k].dtype == c[k].dtype and g[k].shape == c[k].shape, k
            assert torch.equal(g[k].cpu(), c[k]), k


@pytest.mark.parametrize("pin_memory", [True, False])
def test_gpu_batches_equal_cpu_path(ds, pin_memory):
    kw = dict(batch_size=32, shuffle=True, seed=7)
    loader = stoker.Loader(ds, device="cuda", pin_memory=pin_memory, num_threads=3, **kw)
    for epoch in range(2):
        loader.set_epoch(epoch)
        assert_equal_batches(list(loader), cpu_epoch(ds, epoch, **kw))


def test_explicit_device_index(ds):
    dev = torch.cuda.device_count() - 1
    loader = stoker.Loader(ds, batch_size=64, device=f"cuda:{dev}")
    assert_equal_batches(list(loader), cpu_epoch(ds, batch_size=64), device=dev)


def digest(batch):
    """Order-sensitive checksums computed on the GPU, on the current stream."""
    return torch.stack([
        (batch["x"].to(torch.int64) * torch.arange(1, batch["x"].numel() + 1, device="cuda")
         .view_as(batch["x"])).sum(),
        batch["y"].double().sum().to(torch.int64),
        batch["label"].sum(),
        batch["tok"].to(torch.int64).sum(),
    ])


def cpu_digests(ds, **kw):
    out = []
    for b in cpu_epoch(ds, **kw):
        out.append(digest({k: v.cuda() for k, v in b.items()}).cpu())
    return out


@pytest.mark.parametrize("use_side_stream", [False, True])
def test_slow_consumer_on_current_stream_never_sees_overwritten_buffer(ds, use_side_stream):
    """Each batch is read by kernels queued behind ~1 ms of GPU work and freed at once.
    The loader keeps copying into recycled buffers meanwhile; the copy must wait for the
    consumer stream's event, or the digests differ."""
    kw = dict(batch_size=16, shuffle=True, seed=3)
    want = cpu_digests(ds, **kw)
    stream = torch.cuda.Stream() if use_side_stream else torch.cuda.current_stream()
    got = []
    loader = stoker.Loader(ds, device="cuda", num_threads=3, prefetch=2, **kw)
    with torch.cuda.stream(stream):
        for batch in loader:
            torch.cuda._sleep(SLOW_CYCLES)
            got.append(digest(batch))
            del batch  # freed while the kernels above are still queued
    stream.synchronize()
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g.cpu(), w), f"batch {i}"


def test_slow_consumer_across_epochs_shares_buffers_safely(ds):
    """Epochs copy into the loader's one buffer pool: at each boundary the GPU is still
    busy with the last steps (nothing waits for it), the last batch is still held, and
    the next epoch's copies reuse the buffers freed behind the slow kernels."""
    kw = dict(batch_size=16, shuffle=True, seed=4)
    want = [cpu_digests(ds, epoch=e, **kw) for e in range(3)]
    loader = stoker.Loader(ds, device="cuda", num_threads=3, prefetch=2, **kw)
    stream = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(stream):
        for _ in range(3):
            got.append([])
            for batch in loader:  # `batch` stays bound to the last one across the boundary
                torch.cuda._sleep(SLOW_CYCLES)
                got[-1].append(digest(batch))
    stream.synchronize()
    for e in range(3):
        assert len(got[e]) == len(want[e])
        for i, (g, w) in enumerate(zip(got[e], want[e])):
            assert torch.equal(g.cpu(), w), f"epoch {e} batch {i}"
    assert loader.stats()["device_buffers"] <= 2 * (loader.prefetch + 2)
    assert loader.stats()["streams"] == 1  # the epochs flowed on, one copy thread


def test_consumer_holding_batches(ds):
    kw = dict(batch_size=8, shuffle=False)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        kept = list(stoker.Loader(ds, device="cuda", prefetch=2, **kw))
    s.synchronize()
    assert_equal_batches(kept, cpu_epoch(ds, **kw))


def test_dropping_batches_never_waits_for_the_gpu(ds):
    """NOTE [ Deferred frees ]: batches the GPU still reads are dropped at once, also
    beyond the buffers the pool keeps idle (whose frees must wait for those reads); the
    copy thread frees them once the reads are done, and the bytes read were the batch's."""
    kw = dict(batch_size=8, shuffle=False)
    want = cpu_epoch(ds, **kw)
    loader = stoker.Loader(ds, device="cuda", prefetch=1, **kw)  # keeps 3 buffers idle
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        it = iter(loader)
        kept = [next(it) for _ in range(12)]
        torch.cuda._sleep(200 * SLOW_CYCLES)  # ~0.2 s of GPU work queued behind them
        sums = [b["x"].sum(dtype=torch.int64) for b in kept]  # read after the sleep
        t0 = time.perf_counter()
        del kept
        gc.collect()
        dropped = time.perf_counter() - t0
    assert dropped < 0.05, f"dropping 12 batches took {dropped:.3f} s"
    assert loader.stats()["device_buffers"] >= 12  # nothing was freed under the reads
    s.synchronize()
    assert [int(v) for v in sums] == [int(b["x"].sum(dtype=torch.int64)) for b in want[:12]]
    with torch.cuda.stream(s):
        rest = sum(1 for _ in it)  # the copy thread frees the deferred buffers as it goes
    s.synchronize()
    assert rest == len(want) - 12
    assert loader.stats()["device_buffers"] <= 3 + 4


def test_batch_outlives_loader(ds):
    loader = stoker.Loader(ds, batch_size=10, device="cuda")
    b = next(iter(loader))
    del loader
    gc.collect()
    torch.cuda.synchronize()
    assert b["label"].tolist() == list(range(10))


def test_break_stops_the_copy_thread(ds):
    loader = stoker.Loader(ds, batch_size=4, device="cuda", prefetch=3)
    for i, _b in enumerate(loader):
        if i == 2:
            break
    gc.collect()
    deadline = time.time() + 3
    while "stoker-copy" in thread_names() and time.time() < deadline:
        time.sleep(0.01)
    assert "stoker-copy" not in thread_names()


def test_uint8_normalised_on_gpu(ds):
    # the recipe in docs/gpu.md
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    loader = stoker.Loader(ds, batch_size=32, device="cuda")
    ref = cpu_epoch(ds, batch_size=32)
    for b, c in zip(loader, ref):
        x = (b["x"].float() - mean) / std
        want = (c["x"].float() - mean.cpu()) / std.cpu()
        torch.testing.assert_close(x.cpu(), want)


def test_cuda_transfer_stats(ds):
    loader = stoker.Loader(ds, batch_size=64, device="cuda", prefetch=2,
                           prefetch_next_epoch=False)
    n = 0
    for b in loader:
        assert b["x"].is_cuda and b["x"].device == torch.device("cuda", 0)
        n += 1
    del b
    loader.close()  # the copy thread waits for its copies and counts them
    s = loader.stats()
    assert s["copies"] == n == len(loader) and s["copy_bytes"] > 0 and s["copy_gbps"] > 0
    assert s["device_buffers"] <= 2 + 2
    assert 0 <= s["data_stall"] <= 1


def test_pinned_memory_follows_the_current_device(ds):
    assert _core.pinned_memory(_core.cuda_device(0)).pinned
    loader = stoker.Loader(ds, batch_size=8, pin_memory=True)  # CPU delivery, pinned slots
    b = next(iter(loader))
    assert b["x"].is_pinned()
