"""The first epoch of a new loader against its second, with and without warm mappings.

    python bench/bench_first_epoch.py [--samples 100000] [--repeats 5] [--threads 2]

Raw records (uint8[3,64,64] + int64 label), batch 256, shuffled, data in page cache. A new
Dataset and Loader map their shards anew, as a new process does: without warming, the
first epoch takes a minor page fault every few pages of every record it reads, which the
second does not (NOTE [ Warm mappings ] in csrc/producers/mapping_warmer.h). Contenders,
taking turns in every round:

  * stoker, warm mappings (the default): first and second epoch of a new Loader,
  * stoker, warming off (``warm_bytes=0``, as before warm mappings existed): the same,
  * the peer: a NumPy loop (random indices, fancy indexing, torch.from_numpy) over a
    freshly mapped ``np.load(mmap_mode="r")`` array, its first and second pass.

Prints medians with their range and the ratios: warm/off on the first epoch, first/second
epoch, and stoker's epochs against the NumPy loop's second pass (an array already mapped
and read: the issue's yardstick).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import tempfile
import time

import numpy as np
import stoker
import torch
from stoker import _core
from stoker.bench._spread import Runs
from stoker.bench._timing import warm
from stoker.bench.records import make_data


@contextlib.contextmanager
def warming_off():
    """Loaders made inside build their record options with warm_bytes=0: no warm thread."""
    real = _core.RecordOptions
    _core.RecordOptions = functools.partial(real, warm_bytes=0)
    try:
        yield
    finally:
        _core.RecordOptions = real


def rate(batches, n: int) -> float:
    t0 = time.perf_counter()
    seen = 0
    for b in batches:
        seen += len(b[0]) if isinstance(b, tuple) else len(b["label"])
    secs = time.perf_counter() - t0
    assert seen == n, (seen, n)
    return n / secs


def stoker_epochs(root: str, n: int, batch_size: int, threads: int, warmed: bool):
    """(first, second) epoch rates of a new Dataset and Loader."""
    ctx = contextlib.nullcontext() if warmed else warming_off()
    with ctx:
        loader = stoker.Loader(stoker.Dataset(os.path.join(root, "stoker")),
                               batch_size=batch_size, shuffle=True, num_threads=threads,
                               stall_warning=None)
    # The bytes into page cache (the mappings are what is new): the process doing
    # something else between making its loader and iterating, as a training script does.
    warm(root)
    out = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        out.append(rate(loader, n))
        warm(root)
    loader.close()
    return out


def numpy_epochs(root: str, n: int, batch_size: int):
    """(first, second) pass of a NumPy loop over a freshly mapped array."""
    warm(root)
    x = np.load(os.path.join(root, "x.npy"), mmap_mode="r")
    y = np.load(os.path.join(root, "y.npy"), mmap_mode="r")
    rng = np.random.default_rng(0)

    def loop():
        perm = rng.permutation(n)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            yield torch.from_numpy(x[idx]), torch.from_numpy(y[idx])

    out = []
    for _ in range(2):
        out.append(rate(loop(), n))
        warm(root)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--data", help="folder for the data (default: a temporary one)")
    a = p.parse_args()
    tmp = None
    root = a.data
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="stoker-first-epoch-")
        root = tmp.name
    os.makedirs(root, exist_ok=True)
    if not os.path.exists(os.path.join(root, "stoker", "index.json")):
        print(f"writing {a.samples} samples of uint8[3,64,64] + int64 to {root} ...", flush=True)
        make_data(root, a.samples)
    n = len(stoker.Dataset(os.path.join(root, "stoker")))

    runs = {k: Runs() for k in ("warm first", "warm second", "off first", "off second",
                                "numpy first", "numpy second")}
    for _ in range(a.repeats):  # contenders take turns
        for kind in ("warm", "off", "numpy"):
            if kind == "numpy":
                first, second = numpy_epochs(root, n, a.batch_size)
            else:
                first, second = stoker_epochs(root, n, a.batch_size, a.threads,
                                              warmed=kind == "warm")
            runs[f"{kind} first"].add(first)
            runs[f"{kind} second"].add(second)

    print(f"{n} samples, batch_size={a.batch_size}, shuffled, {a.threads} thread(s), data in "
          f"page cache; median (range) of {a.repeats} rounds, a new loader each")
    names = {"warm": "stoker, warm mappings", "off": "stoker, warming off",
             "numpy": "NumPy loop, new mmap"}
    for key, r in runs.items():
        kind, epoch = key.split()
        print(f"  {names[kind] + ', ' + epoch + ' epoch':<38} {r.text(unit='samples/s')}")

    def ratio(a: str, b: str) -> str:
        x, y = runs[a], runs[b]
        return f"{x.median / y.median:.2f}x ({x.lo / y.hi:.2f}-{x.hi / y.lo:.2f})"

    print("ratios (medians; in brackets the extremes of the runs):")
    print(f"  first epoch, warm / off:             {ratio('warm first', 'off first')}")
    print(f"  warm: first / second epoch:          {ratio('warm first', 'warm second')}")
    print(f"  off:  first / second epoch:          {ratio('off first', 'off second')}")
    for kind in ("warm", "off"):
        for epoch in ("first", "second"):
            print(f"  {kind + ' ' + epoch:<12} / NumPy loop (second pass): "
                  f"{ratio(f'{kind} {epoch}', 'numpy second')}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
