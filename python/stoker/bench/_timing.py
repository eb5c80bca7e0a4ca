"""Timing helpers shared by the benchmarks: page-cache warming, batch timing, memcpy."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable, Optional

import numpy as np


def warm(root: str) -> None:
    """Reads every data file so the timed run finds it in page cache."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def _time_batches(make_iter: Callable, root: str, limit: Optional[int] = None) -> tuple:
    """(samples/s, seconds to the first batch, samples) over the batches of `make_iter()`,
    at most `limit` of them, after reading the files under `root` into page cache. A batch
    is a dict of tensors or a tuple whose first item has one row per sample."""
    warm(root)
    t0 = time.perf_counter()
    it = iter(make_iter())
    first, n = None, 0
    for k, b in enumerate(it):
        if first is None:
            first = time.perf_counter() - t0
        n += len(next(iter(b.values())) if isinstance(b, dict) else b[0])
        if limit is not None and k + 1 >= limit:
            break
    secs = time.perf_counter() - t0
    del it  # stops the workers of a partial epoch
    return n / secs, first, n


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5, threads: int = 1) -> float:
    """memcpy bandwidth in bytes/s (median of `repeats`): `threads` threads each copying
    their own `nbytes` buffer at once (NumPy releases the GIL for large copies)."""
    import threading

    bufs = [(np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8))
            for _ in range(threads)]
    for src, dst in bufs:
        np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        start = threading.Barrier(threads + 1)

        def copy(src, dst, start=start):
            start.wait()
            np.copyto(dst, src)

        workers = [threading.Thread(target=copy, args=b) for b in bufs]
        for w in workers:
            w.start()
        t0 = time.perf_counter()
        start.wait()
        for w in workers:
            w.join()
        times.append(time.perf_counter() - t0)
    return threads * nbytes / statistics.median(times)
