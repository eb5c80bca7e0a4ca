"""A dataset read into memory at open (``stoker.Dataset(path, preload=True)``) against the
same dataset mapped (the default), from a cold page cache, in one run.

    python bench/bench_preload.py [--samples 20000] [--record 12288] [--repeats 5]

Before each timed run, every shard file's pages are dropped from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``: the reads then come from the disk, as on a
machine that has not read the dataset yet, or from a network filesystem). A run opens the
dataset and reads two shuffled epochs (batch 256, 2 threads, raw uint8 records: nothing to
decode, so reading is the whole cost); it reports the first epoch (open included: a
preloaded dataset reads every file there, in order) and the second (the page cache warm
for mmap, memory for preload), in samples/s, medians of --repeats, and the ratios
preload / mmap. Runs alternate (mmap, preload, mmap, ...).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import stoker


def drop_pages(ds_path: str) -> None:
    """Evicts the dataset's files from the page cache (clean pages nobody maps)."""
    for root, _, names in os.walk(ds_path):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def one_run(path: str, preload: bool, seed: int):
    t0 = time.perf_counter()
    ds = stoker.Dataset(path, preload=preload)
    opened = time.perf_counter() - t0
    loader = stoker.Loader(ds, batch_size=256, shuffle=True, seed=seed, num_threads=2,
                           stall_warning=None)
    times = []
    for e in range(2):
        loader.set_epoch(e)
        t1 = time.perf_counter()
        n = sum(len(b["label"]) for b in loader)
        times.append(time.perf_counter() - t1)
    tier = loader.stats()["tier"]
    loader.close()
    del loader, ds
    return n / (opened + times[0]), n / times[1], opened, tier


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--record", type=int, default=12288, help="bytes per record")
    p.add_argument("--shard-size", default="64MB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--data", default=None, help="directory for the dataset (default: temp)")
    args = p.parse_args()
    work = args.data or tempfile.mkdtemp(prefix="stoker-bench-preload-")
    path = os.path.join(work, "ds")
    try:
        if not os.path.exists(os.path.join(path, "index.json")):
            rng = np.random.default_rng(0)
            fields = {"x": stoker.ndarray("uint8", (args.record,)),
                      "label": stoker.scalar("int64")}
            with stoker.ShardWriter(path, fields, shard_size=args.shard_size) as w:
                for i in range(args.samples):
                    w.write({"x": rng.integers(0, 256, args.record, dtype=np.uint8),
                             "label": i})
        size = sum(s["bytes"] for s in stoker.Dataset(path).shards)
        print(f"{args.samples} samples of {args.record} bytes ({size / 1e6:.0f} MB), batch "
              f"256, 2 threads, shuffled; page cache dropped before each run; median of "
              f"{args.repeats}")
        res = {False: [], True: []}
        for r in range(args.repeats):
            for preload in (False, True):
                drop_pages(path)
                res[preload].append(one_run(path, preload, r))
        rows = {}
        for preload, runs in res.items():
            name = "preload=True" if preload else "mmap (default)"
            e1 = statistics.median(x[0] for x in runs)
            e2 = statistics.median(x[1] for x in runs)
            op = statistics.median(x[2] for x in runs)
            rows[preload] = (e1, e2)
            print(f"  {name:<16} epoch 1 (open included) {e1:>10,.0f} samples/s   "
                  f"epoch 2 {e2:>10,.0f} samples/s   open {op:.2f} s   tier {runs[0][3]!r}")
        print(f"  preload / mmap: epoch 1 {rows[True][0] / rows[False][0]:.2f}x, "
              f"epoch 2 {rows[True][1] / rows[False][1]:.2f}x")
    finally:
        if args.data is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
