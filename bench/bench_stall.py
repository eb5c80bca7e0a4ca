"""Data stall of a training loop, on the host: stoker vs DataLoader, across epoch boundaries.

    python bench/bench_stall.py [--samples 4096] [--batch-size 256] [--epochs 5] [--threads N]

A training-like loop whose step is a fixed wait (``time.sleep``) standing for work that
does not use the host's cores, such as a GPU step followed by ``loss.item()``: each step
takes a batch, "trains" on it, and drops it, in lock step. The step is 1.5x the time stoker
needs per batch (``--step-ms`` to set it), so a loader that keeps up never stalls in steady
state; what is left is the start of each epoch. Each loop runs two epochs of warm-up
first (workers started, batch buffers allocated and first touched). Printed, in one run:

  * the ideal loop (no data) and the loop fed by: stoker; stoker without next-epoch
    prefetch (``prefetch_next_epoch=False``); DataLoader(num_workers=N, persistent_workers)
    for each N in --dl-workers, the best reported;
  * for each: seconds per step, the stall (1 - ideal / step time: the share of the loop
    lost to waiting for data), and the waits of the steps that start an epoch.

This is the host half of the GPU delivery check (bench/bench_gpu.py), runnable anywhere.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import stoker
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu import DsMap, make_dataset  # noqa: E402


def read_files(path):
    """Reads the dataset's files, so that every loop starts from the page cache."""
    for root, _, names in os.walk(path):  # shards are in gen-<id>/ (format v2)
        for name in sorted(names):
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 24):
                    pass


def run_loop(make_epoch, epochs, step_s):
    """(seconds per step, waits of the epochs' first steps, waits of the other steps),
    after two epochs of warm-up (workers started, batch buffers allocated and first
    touched: the pool reaches its steady size only once the loop has held one batch while
    the workers filled the whole window, which can take more than an epoch)."""
    for epoch in range(2):
        for _ in make_epoch(epoch):
            time.sleep(step_s)
    first, rest = [], []
    steps = 0
    t0 = time.perf_counter()
    for epoch in range(2, epochs + 2):
        it = iter(make_epoch(epoch))
        i = 0
        while True:
            t = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            (first if i == 0 else rest).append(time.perf_counter() - t)
            del b
            time.sleep(step_s)  # the step: GPU work, then loss.item()
            i += 1
            steps += 1
    return (time.perf_counter() - t0) / steps, first, rest


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--shape", type=int, nargs=3, default=(3, 224, 224))
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="time per step; 0 = 1.5x stoker's measured time per batch")
    p.add_argument("--dl-workers", type=int, nargs="+", default=None,
                   help="DataLoader num_workers to try (default: 1, 2, 4, ... up to --threads)")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "stoker-bench-gpu"))
    a = p.parse_args(argv)
    ds = make_dataset(a.data, a.samples, tuple(a.shape))
    batch_mb = a.batch_size * int(np.prod(a.shape)) / 2**20
    kw = dict(batch_size=a.batch_size, shuffle=True, num_threads=a.threads,
              prefetch=a.prefetch, drop_last=True)

    def stoker_epochs(**extra):
        loader = stoker.Loader(ds, **kw, **extra)

        def epoch(e):
            loader.set_epoch(e)
            return loader
        return loader, epoch

    # stoker's own time per batch, with nothing else to do
    read_files(a.data)
    loader, _ = stoker_epochs()
    per = []
    for e in range(2):
        loader.set_epoch(e)
        t0 = time.perf_counter()
        n = sum(1 for _ in loader)
        per.append((time.perf_counter() - t0) / n)
    loader.close()
    per_batch = min(per)
    step_s = a.step_ms / 1e3 if a.step_ms > 0 else 1.5 * per_batch
    print(f"{len(ds)} samples of uint8{tuple(a.shape)}, batches of {a.batch_size} "
          f"(~{batch_mb:.1f} MiB), {len(ds) // a.batch_size} batches per epoch, "
          f"{a.epochs} epochs; {a.threads} threads / workers; torch {torch.__version__}")
    print(f"step {step_s * 1e3:.1f} ms (stoker alone: {per_batch * 1e3:.1f} ms per batch)\n")

    results = {}
    read_files(a.data)
    results["ideal (no data)"] = run_loop(lambda e: range(len(ds) // a.batch_size), a.epochs,
                                          step_s)
    for name, extra in (("stoker", {}), ("stoker, no next-epoch prefetch",
                                         {"prefetch_next_epoch": False})):
        loader, epoch = stoker_epochs(**extra)
        read_files(a.data)
        results[name] = run_loop(epoch, a.epochs, step_s)
        loader.close()
    workers = a.dl_workers or sorted({min(w, a.threads) for w in (1, 2, 4, 8, 16)})
    best = None
    for w in workers:
        dl = torch.utils.data.DataLoader(DsMap(a.data), batch_size=a.batch_size, shuffle=True,
                                         num_workers=w, drop_last=True, persistent_workers=True)
        read_files(a.data)
        r = run_loop(lambda e, dl=dl: dl, a.epochs, step_s)
        del dl
        results[f"DataLoader, {w} workers"] = r
        if best is None or r[0] < results[best][0]:
            best = f"DataLoader, {w} workers"

    ideal = results["ideal (no data)"][0]
    print(f"{'':34s}{'ms/step':>9s}{'stall':>8s}   epoch-start waits (ms)   other waits p50/max")
    for name, (step, first, rest) in results.items():
        mark = "  <- best DataLoader" if name == best else ""
        firsts = " ".join(f"{w * 1e3:.1f}" for w in first) if name != "ideal (no data)" else ""
        others = (f"{np.median(rest) * 1e3:.2f}/{max(rest) * 1e3:.1f}"
                  if rest and name != "ideal (no data)" else "")
        print(f"{name:34s}{step * 1e3:9.2f}{max(0.0, 1 - ideal / step):8.1%}   "
              f"{firsts:24s} {others}{mark}")
    st = results["stoker"][0]
    print(f"\nstep time, best DataLoader / stoker: {results[best][0] / st:.2f}x; "
          f"stoker stall {max(0.0, 1 - ideal / st):.1%} (target < 2%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
