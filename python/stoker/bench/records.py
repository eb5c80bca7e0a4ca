"""``stoker bench`` without a dataset: fixed-size records. In one run, on the same data in
page cache, samples/s of:
  * stoker.Loader with 1 and 2 threads, and the first and second epoch of a new Dataset and
    Loader (new mappings: what a new process's first epoch pays),
  * torch.utils.data.DataLoader over a map-style dataset reading a NumPy memmap of the
    same data, num_workers 0, 1, 2 (default collate),
  * a plain NumPy loop (random indices, fancy indexing, torch.from_numpy),
  * upper bounds: the epoch's bytes over memcpy bandwidth with 1 and N threads (less work
    than stoker does, which also verifies every record's checksum),
  * a reference: random record reads into batch-sized buffers (``_core.random_read_rate``),
then stoker's ratios to the best DataLoader configuration, the NumPy loop and the memcpy
bound, and each loader's time to first batch. Every figure is the median of ``repeats``
runs with its range (:mod:`._spread`).
"""

from __future__ import annotations

import itertools
import os
import statistics
import tempfile
from typing import Callable, Dict, List

import numpy as np
import torch

from .._progress import Progress
from ..dataset import Dataset
from ..fields import ndarray, scalar
from ..loader import Loader
from ..writer import ShardWriter
from ._spread import Runs
from ._timing import _time_batches, memcpy_bandwidth, warm


def make_data(root: str, n: int, shape=(3, 64, 64), seed: int = 0) -> None:
    """Writes the same samples as a stoker dataset (root/stoker) and .npy files."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    y = rng.integers(0, 1000, size=n, dtype=np.int64)
    np.save(os.path.join(root, "x.npy"), x)
    np.save(os.path.join(root, "y.npy"), y)
    fields = {"x": ndarray("uint8", shape), "label": scalar("int64")}
    with ShardWriter(os.path.join(root, "stoker"), fields, shard_size="64MB",
                     overwrite=True) as w:
        for i in range(n):
            w.write({"x": x[i], "label": y[i]})


class _MemmapDataset(torch.utils.data.Dataset):
    def __init__(self, root: str):
        self.root = root
        self.x = None
        self.n = len(np.load(os.path.join(root, "y.npy")))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.x is None:  # opened lazily, in the worker
            self.x = np.load(os.path.join(self.root, "x.npy"), mmap_mode="r")
            self.y = np.load(os.path.join(self.root, "y.npy"), mmap_mode="r")
        return torch.from_numpy(np.array(self.x[i])), int(self.y[i])


def run(n: int = 20000, batch_size: int = 256, repeats: int = 3, data: str = None,
        workers: List[int] = (0, 1, 2), threads: List[int] = (1, 2),
        progress: bool = True, epochs: int = 1) -> Dict[str, float]:
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    tmp = None
    if data is None:
        tmp = tempfile.TemporaryDirectory(prefix="stoker-bench-")
        data = tmp.name
    os.makedirs(data, exist_ok=True)
    if not os.path.exists(os.path.join(data, "stoker", "index.json")):
        print(f"writing {n} samples of uint8[3,64,64] + int64 to {data} ...", flush=True)
        make_data(data, n)
    ds = Dataset(os.path.join(data, "stoker"))
    n = len(ds)
    sample_bytes = 3 * 64 * 64 + 8
    results: Dict[str, float] = {}
    first_batch: Dict[str, float] = {}
    runs: Dict[str, Runs] = {}

    bar = Progress(repeats * (2 * len(threads) + len(workers) + 1), "stoker bench", unit="runs",
                   enabled=progress)

    def measure(name: str, make_iter: Callable) -> None:
        rates, firsts = [], []
        def timed():  # `epochs` consecutive epochs in one timed run, for every contender
            return itertools.chain.from_iterable(make_iter() for _ in range(epochs))

        for _ in range(repeats):
            bar.update()
            rate, first, count = _time_batches(timed, data)
            assert count == n * epochs, (name, count, n * epochs)
            rates.append(rate)
            firsts.append(first)
        runs[name] = Runs(rates)
        results[name] = statistics.median(rates)
        first_batch[name] = statistics.median(firsts)
        bar.write(f"  {name:<28} {runs[name].text(unit='samples/s'):<48} first batch "
                  f"{first_batch[name] * 1e3:8.1f} ms")

    def measure_fresh(t: int) -> None:
        """The first and the second epoch of a new Dataset and Loader (new mappings, as in
        a new process: NOTE [ Warm mappings ] in csrc/producers/mapping_warmer.h)."""
        rates: List[List[float]] = [[], []]
        for _ in range(repeats):
            bar.update()
            fresh = Loader(Dataset(os.path.join(data, "stoker")), batch_size=batch_size,
                           shuffle=True, num_threads=t, stall_warning=None)
            for e in range(2):
                rate, _, count = _time_batches(lambda fresh=fresh: fresh, data)
                assert count == n, (t, e, count, n)
                rates[e].append(rate)
            del fresh
        for e, name in enumerate(("first", "second")):
            key = f"{name} epoch: stoker threads={t}"
            runs[key] = Runs(rates[e])
            results[key] = runs[key].median
            bar.write(f"  {key:<36} {runs[key].text(unit='samples/s'):<48} "
                      "(a new Dataset and Loader)")

    what = "epoch" if epochs == 1 else f"{epochs} consecutive epochs"
    print(f"{what} of {n} samples, batch_size={batch_size}, shuffled, data in page cache; "
          f"median (range) of {repeats} run(s)")
    for t in threads:
        loader = Loader(ds, batch_size=batch_size, shuffle=True, num_threads=t,
                        stall_warning=None)
        measure(f"stoker threads={t}", lambda loader=loader: loader)
    for t in threads:
        measure_fresh(t)

    mm = _MemmapDataset(data)
    for w in workers:
        def make(w=w):
            return torch.utils.data.DataLoader(mm, batch_size=batch_size, shuffle=True,
                                               num_workers=w)
        measure(f"DataLoader num_workers={w}", make)

    x = np.load(os.path.join(data, "x.npy"), mmap_mode="r")
    y = np.load(os.path.join(data, "y.npy"), mmap_mode="r")

    def numpy_loop():
        perm = np.random.default_rng().permutation(n)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            yield torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
    measure("NumPy loop", numpy_loop)
    bar.close()

    # Upper bounds: the same bytes copied by memcpy, with as many threads as each stoker
    # configuration (stoker copies them too, and reads them once more for the checksum).
    print("upper bounds: the epoch's bytes at memcpy bandwidth (less work than stoker's: "
          "no checksum)")
    bound: Dict[int, Runs] = {}
    for t in sorted(set(threads)):
        bw = Runs([memcpy_bandwidth(threads=t, repeats=1) for _ in range(repeats)])
        bound[t] = Runs([v / sample_bytes for v in bw.values])
        results[f"memcpy bound, {t} thread(s)"] = bound[t].median
        print(f"  {f'memcpy, {t} thread(s)':<28} {bound[t].text(unit='samples/s'):<48} "
              f"({bw.median / 1e9:.1f} GB/s)")

    from .. import _core

    print(f"reference: random record reads into batch-sized buffers, {max(threads)} "
          "threads (no batching or scheduling around them)")
    for v in (True, False):
        warm(data)
        r = Runs([_core.random_read_rate(ds._core, max(threads), v, 1) for _ in range(repeats)])
        what = "verified" if v else "no checksum"
        results[f"random reads, {what}"] = r.median
        print(f"  {f'random reads, {what}':<28} {r.text(unit='samples/s')}")

    def ratio(a: str, b: Runs, pct: bool = False) -> str:
        x = runs[a]
        fmt = (lambda v: f"{100 * v:.0f}%") if pct else (lambda v: f"{v:.2f}x")
        text = fmt(x.median / b.median)
        if x.n > 1 and b.n > 1:
            text += f" ({fmt(x.lo / b.hi)}-{fmt(x.hi / b.lo)})"
        return text

    stoker_names = [k for k in runs if k.startswith("stoker")]
    best = max(stoker_names, key=lambda k: runs[k].median)
    dl = [k for k in runs if k.startswith("DataLoader")]
    best_dl = max(dl, key=lambda k: runs[k].median)
    print("ratios (medians; in brackets the extremes of the runs):")
    print(f"  {best} / best DataLoader ({best_dl}): {ratio(best, runs[best_dl])}")
    print(f"  {best} / NumPy loop: {ratio(best, runs['NumPy loop'])}")
    for t in threads:
        for e in ("first", "second"):
            name = f"{e} epoch: stoker threads={t}"
            print(f"  {name} (a new Dataset and Loader) / NumPy loop: "
                  f"{ratio(name, runs['NumPy loop'])}")
    for t in sorted(set(threads)):
        name = f"stoker threads={t}"
        print(f"  {name} / memcpy, {t} thread(s): {ratio(name, bound[t], pct=True)}"
              + ("  (above the bound: memcpy did not reach this machine's bandwidth in "
                 "these runs)" if runs[name].lo > bound[t].hi else ""))
    if tmp is not None:
        tmp.cleanup()
    results["first_batch"] = first_batch
    return results
