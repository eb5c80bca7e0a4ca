"""GPU delivery benchmark: stoker device="cuda" vs pinned DataLoader + .to(non_blocking).

    python bench/bench_gpu.py [--samples 4096] [--batch-size 256] [--steps 60] [--data DIR]

Run from the repo root after `pip install .`, on a machine with a CUDA GPU. One run prints:

1. H2D copy bandwidth: the loader's copies (device time, CUDA events around each copy on
   its copy stream) vs a plain pinned `tensor.to("cuda", non_blocking=True)` of the same
   sizes (device time, CUDA events). Ratio printed; target >= 90%.
2. A training-like loop: a fixed GPU workload per step (a matmul chain, sized to take
   longer than the loader needs per batch), fed by stoker (device="cuda") vs
   DataLoader(pin_memory=True, num_workers=N) + `.to("cuda", non_blocking=True)`, in two
   forms: "queued", where the host runs ahead of the GPU (nothing waits for a step's
   result), and "lock step", where every step ends with `loss.item()`, so that nothing
   hides the time to the next batch, an epoch's first one included. Each loop first runs
   one epoch of warm-up. Reported: seconds per step; the stall, i.e. the fraction of step
   time spent waiting for data (1 - ideal/step, where ideal is the same loop on a batch
   already on the GPU); and the time the Python loop was blocked in next() (an upper
   bound).
"""

import argparse
import gc
import os
import sys
import tempfile
import time

import numpy as np
import stoker
import torch
from stoker import _core


def make_dataset(path, samples, shape):
    if os.path.exists(os.path.join(path, "index.json")):
        ds = stoker.Dataset(path)
        if len(ds) == samples:
            return ds
    fields = {"x": stoker.ndarray("uint8", shape), "label": stoker.scalar("int64")}
    rng = np.random.default_rng(0)
    block = rng.integers(0, 256, (64,) + shape, dtype=np.uint8)
    with stoker.ShardWriter(path, fields, shard_size="256MB") as w:
        for i in range(samples):
            w.write({"x": block[i % 64], "label": i})
    return stoker.Dataset(path)


# -- 1. copy bandwidth ---------------------------------------------------------------

def loader_copy_gbps(ds, batch_size, threads, prefetch, epochs):
    """Device-time bandwidth of the loader's own copies (copy-stream events, from
    loader.stats()) and the wall-clock rate: pinned slots feeding the CUDA transfer engine."""
    loader = stoker.Loader(ds, batch_size=batch_size, shuffle=False, drop_last=True,
                           num_threads=threads, prefetch=prefetch, device="cuda")
    sizes = []
    t_wall = time.perf_counter()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            if epoch == 0:
                tensors = list(batch.values())
                sizes.append(max(v.data_ptr() + v.nbytes for v in tensors)
                             - min(v.data_ptr() for v in tensors))
        del batch
    torch.cuda.synchronize()
    wall = time.perf_counter() - t_wall
    loader.close()  # the copy thread counts its last copies
    s = loader.stats()
    return s["copy_bytes"] / s["copy_seconds"] / 1e9, s["copy_bytes"] / wall / 1e9, sizes


def plain_copy_gbps(sizes, repeats):
    """Same sizes, pinned tensors, .to(cuda, non_blocking=True), timed with CUDA events."""
    srcs = [torch.empty(n, dtype=torch.uint8).pin_memory() for n in sizes]
    for s in srcs:
        s.fill_(1)
    dsts = []
    total_ms, total_bytes = 0.0, 0
    for _ in range(repeats):
        for s in srcs:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dsts.append(s.to("cuda", non_blocking=True))
            b.record()
            b.synchronize()
            total_ms += a.elapsed_time(b)
            total_bytes += s.nbytes
            dsts.clear()
    return total_bytes / (total_ms / 1e3) / 1e9


# -- 2. training-like loop --------------------------------------------------------------

class Workload:
    """A fixed GPU step: a chain of fp16 matmuls, plus a read of the batch."""

    def __init__(self, dim, depth):
        g = torch.Generator(device="cuda").manual_seed(0)
        self.w = [torch.randn(dim, dim, device="cuda", dtype=torch.float16, generator=g) / dim**0.5
                  for _ in range(depth)]
        self.h = torch.randn(dim, dim, device="cuda", dtype=torch.float16, generator=g)

    def step(self, x):
        s = x.float().mean()  # touches the batch, as a model's first layer would
        h = self.h
        for w in self.w:
            h = torch.tanh(h @ w)
        return h.float().mean() + s


def calibrate(work, x, target_s):
    """Depth so that one step takes about target_s of GPU time."""
    for _ in range(3):
        work.step(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        work.step(x)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 10
    return max(1, int(round(len(work.w) * target_s / per)))


def run_loop(batches, work, steps, to_device, waits=None, sync=False, warmup=3):
    """Runs `steps` steps; returns (seconds per step, fraction of time waiting for data).
    `waits`, a list, receives the seconds each step's next() blocked. `sync`: each step
    ends with .item() (lock step) instead of only the last one."""
    it = iter(batches)
    wait = 0.0
    acc = None
    # warm-up steps, not counted: worker start-up, buffers allocated and first touched
    for _ in range(warmup):
        b = to_device(next(it))
        acc = work.step(b["x"])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        b = to_device(next(it))
        dt = time.perf_counter() - t
        wait += dt
        if waits is not None:
            waits.append(dt)
        acc = work.step(b["x"])
        del b
        if sync:
            acc.item()
    acc.item()  # the last step's result, as a training loop's loss.item() would
    total = time.perf_counter() - t0
    return total / steps, wait / total


def repeat_epochs(make_iterable):
    while True:
        yield from make_iterable()


class DsMap(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path, self.ds = path, None

    def __len__(self):
        return len(stoker.Dataset(self.path)) if self.ds is None else len(self.ds)

    def __getitem__(self, i):
        if self.ds is None:  # opened per worker process
            self.ds = stoker.Dataset(self.path)
        r = self.ds[i]
        return {"x": torch.from_numpy(np.asarray(r["x"])), "label": int(r["label"])}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--shape", type=int, nargs=3, default=(3, 224, 224))
    p.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="GPU time per step; 0 = 1.5x the loader's measured time per batch")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stoker-bench-gpu"))
    a = p.parse_args(argv)
    if not torch.cuda.is_available() or not _core.cuda_status()[0]:
        print(f"no CUDA device: {_core.cuda_status()[2]}")
        return 1
    torch.cuda.init()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{_core.cuda_status()[2]}")
    ds = make_dataset(a.data, a.samples, tuple(a.shape))
    batch_mb = a.batch_size * int(np.prod(a.shape)) / 2**20
    print(f"dataset: {len(ds)} samples of uint8{tuple(a.shape)}, batches of {a.batch_size} "
          f"(~{batch_mb:.1f} MiB)")

    # 1. copy bandwidth
    dev_gbps, wall_gbps, sizes = loader_copy_gbps(ds, a.batch_size, a.threads, a.prefetch, 2)
    ref_gbps = plain_copy_gbps(sizes, 2)
    print("\n[1] H2D copy bandwidth (device time)")
    print(f"  stoker copy stream        {dev_gbps:7.2f} GB/s   (loading + copy, wall: "
          f"{wall_gbps:.2f} GB/s)")
    print(f"  pinned .to(non_blocking)  {ref_gbps:7.2f} GB/s")
    print(f"  ratio                     {dev_gbps / ref_gbps:7.1%}   (target >= 90%)")

    # 2. training-like loop
    loader = stoker.Loader(ds, batch_size=a.batch_size, shuffle=True, num_threads=a.threads,
                           prefetch=a.prefetch, device="cuda", drop_last=True)
    for _ in range(2):  # the second epoch: buffers already allocated
        t0 = time.perf_counter()
        n = sum(1 for _ in loader)
        torch.cuda.synchronize()
        per_batch = (time.perf_counter() - t0) / n
    step_s = a.step_ms / 1e3 if a.step_ms > 0 else 1.5 * per_batch
    x0 = torch.zeros((a.batch_size,) + tuple(a.shape), dtype=torch.uint8, device="cuda")
    work = Workload(4096, 4)
    work = Workload(4096, calibrate(work, x0, step_s))
    print(f"\n[2] training-like loop: {a.steps} steps, GPU work ~{step_s * 1e3:.1f} ms/step "
          f"({len(work.w)} fp16 4096^2 matmuls; stoker alone: {per_batch * 1e3:.1f} ms/batch)")

    # The ideal loop reads a different resident batch each step, as the fed loops do
    # (one batch, read over and over, would partly stay in the GPU's L2 cache).
    resident = [{"x": torch.full_like(x0, i)} for i in range(a.prefetch + 2)]
    dl = torch.utils.data.DataLoader(DsMap(a.data), batch_size=a.batch_size, shuffle=True,
                                     num_workers=a.threads, pin_memory=True, drop_last=True,
                                     persistent_workers=True, prefetch_factor=2)
    warm = len(loader) + 3
    for mode, sync in (("queued", False), ("lock step: loss.item() each step", True)):
        ideal, _ = run_loop(repeat_epochs(lambda: resident), work, a.steps, lambda b: b,
                            sync=sync)
        gc.collect()
        before = loader.stats()
        st_waits = []
        st_step, st_wait = run_loop(repeat_epochs(lambda: loader), work, a.steps, lambda b: b,
                                    st_waits, sync=sync, warmup=warm)
        gc.collect()
        after = loader.stats()
        dl_step, dl_wait = run_loop(
            repeat_epochs(lambda: dl), work, a.steps,
            lambda b: {k: v.to("cuda", non_blocking=True) for k, v in b.items()},
            sync=sync, warmup=warm)
        # "stall": the share of each step lost to data, against the same loop on a batch
        # already on the GPU. "host blocked": time the Python thread spent inside
        # next()/.to(); queued, it includes waiting for the GPU to drain its queue, so it
        # overstates the stall.
        print(f"\n  {mode}")
        print(f"  {'':28s}{'s/step':>10s}{'stall':>10s}{'host blocked':>14s}")
        print(f"  {'batch already on GPU':28s}{ideal:10.4f}{0.0:10.1%}{'':>14s}")
        for name, step, wait in (("stoker device=cuda", st_step, st_wait),
                                 ("DataLoader pinned + .to()", dl_step, dl_wait)):
            print(f"  {name:28s}{step:10.4f}{max(0.0, 1 - ideal / step):10.1%}{wait:14.1%}")
        print(f"  stoker / DataLoader step time: {st_step / dl_step:.2f}")
        # Where stoker's time went during its loop (per step), to tell a host-side
        # shortfall (workers behind: the copy thread waits for batches) from a device-side
        # one.
        steps = a.steps + warm

        def per_step_ms(key, steps=steps, after=after, before=before):
            return (after.get(key, 0) - before.get(key, 0)) / steps * 1e3

        print(f"  stoker per step (ms): next() blocked {per_step_ms('wait_seconds'):.2f}, "
              f"copy (device time) {per_step_ms('copy_seconds'):.2f}, "
              f"workers busy {per_step_ms('worker_busy_seconds'):.1f}, "
              f"idle {per_step_ms('worker_idle_seconds'):.1f} (thread-ms); "
              f"data_stall {after['data_stall']:.1%}")
        # An epoch boundary (every len(loader) steps) shows up as the largest waits.
        w = np.array(st_waits) * 1e3
        print(f"  stoker next() blocked per step (ms): median {np.median(w):.2f}, "
              f"p90 {np.percentile(w, 90):.2f}, max {w.max():.2f}; "
              f"{len(loader)} batches per epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
