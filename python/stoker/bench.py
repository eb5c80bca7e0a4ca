"""Benchmarks of ``stoker bench``.

``stoker bench DATASET``: your own dataset (see :func:`run_dataset`).

``stoker bench`` (no dataset): fixed-size records. In one run, on the same data in page
cache, samples/s of:
  * stoker.Loader with 1 and 2 threads,
  * torch.utils.data.DataLoader over a map-style dataset reading a NumPy memmap of the
    same data, num_workers 0, 1, 2 (default collate),
  * a plain NumPy loop (random indices, fancy indexing, torch.from_numpy),
  * the ceiling: bytes per epoch over single-thread memcpy bandwidth,
then stoker's ratio to the best DataLoader configuration and to the ceiling, and each
loader's time to first batch.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from . import ops
from .dataset import Dataset
from .fields import Blob, Image, NDArray, ndarray, scalar
from .loader import Loader
from .writer import ShardWriter


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


def warm(root: str) -> None:
    """Reads every data file so the timed run finds it in page cache."""
    for dirpath, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(dirpath, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


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


def memcpy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Single-thread memcpy bandwidth in bytes/s (median)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def run(n: int = 20000, batch_size: int = 256, repeats: int = 3, data: str = None,
        workers: List[int] = (0, 1, 2), threads: List[int] = (1, 2)) -> Dict[str, float]:
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

    def measure(name: str, make_iter: Callable) -> None:
        rates, firsts = [], []
        for _ in range(repeats):
            rate, first, count = _time_batches(make_iter, data)
            assert count == n, (name, count, n)
            rates.append(rate)
            firsts.append(first)
        results[name] = statistics.median(rates)
        first_batch[name] = statistics.median(firsts)
        print(f"  {name:<28} {results[name]:>12,.0f} samples/s   first batch "
              f"{first_batch[name] * 1e3:8.1f} ms", flush=True)

    print(f"epoch of {n} samples, batch_size={batch_size}, shuffled, data in page cache; "
          f"median of {repeats}")
    for t in threads:
        loader = Loader(ds, batch_size=batch_size, shuffle=True, num_threads=t)
        measure(f"stoker threads={t}", lambda loader=loader: loader)

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

    bw = memcpy_bandwidth()
    ceiling = bw / sample_bytes
    results["ceiling (memcpy)"] = ceiling
    print(f"  {'ceiling: memcpy ' + f'{bw / 1e9:.1f} GB/s':<28} {ceiling:>12,.0f} samples/s")

    best_stoker = max(v for k, v in results.items() if k.startswith("stoker"))
    dl = {k: v for k, v in results.items() if k.startswith("DataLoader")}
    best_dl_name = max(dl, key=dl.get)
    print(f"stoker (best) / best DataLoader ({best_dl_name}): "
          f"{best_stoker / dl[best_dl_name]:.1f}x   (target >= 5x)")
    print(f"stoker (best) / NumPy loop: {best_stoker / results['NumPy loop']:.2f}x")
    print(f"stoker (best) / memcpy ceiling: {100 * best_stoker / ceiling:.0f}%   (target >= 50%)")
    if tmp is not None:
        tmp.cleanup()
    results["first_batch"] = first_batch
    return results


# -- your own dataset -----------------------------------------------------------------

def rrc_params(width: int, height: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
               rng=random) -> tuple:
    """torchvision's RandomResizedCrop.get_params, with Python's random:
    (top, left, height, width)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def pil_decode(data: bytes, size: int, layout: str = "HWC") -> np.ndarray:
    """The DataLoader peer's image path: PIL decode to RGB, then (size > 0)
    RandomResizedCrop(size) with a BILINEAR resize and a random horizontal flip, as
    torchvision does them; uint8 in `layout`."""
    import io

    from PIL import Image as PILImage

    img = PILImage.open(io.BytesIO(data)).convert("RGB")
    if size > 0:
        top, left, h, w = rrc_params(*img.size)
        img = img.crop((left, top, left + w, top + h)).resize((size, size),
                                                              PILImage.BILINEAR)
        if random.random() < 0.5:
            img = img.transpose(PILImage.FLIP_LEFT_RIGHT)
    arr = np.asarray(img)
    return np.ascontiguousarray(arr.transpose(2, 0, 1)) if layout == "CHW" else arr.copy()


class PythonDataset(torch.utils.data.Dataset):
    """The peer: a map-style dataset over the same shards, read with ``Dataset[i]`` and
    decoded in Python (PIL for images), for ``torch.utils.data.DataLoader``."""

    def __init__(self, path: str, image_size: int):
        self.image_size = image_size
        self.ds = Dataset(path)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Dict[str, np.ndarray]:
        out = {}
        for name, value in self.ds[i].items():
            f = self.ds.fields[name]
            if isinstance(f, Image):
                value = pil_decode(value, self.image_size, f.layout)
            elif isinstance(f, Blob):
                value = np.frombuffer(value, np.uint8)
            out[name] = value
        return out


def collate(fields: Dict[str, object], samples: List[Dict[str, np.ndarray]]):
    """Batches like stoker's: fixed fields stacked, variable ones zero-padded to the
    longest with ``<name>_lengths``."""
    out = {}
    for name, f in fields.items():
        values = [s[name] for s in samples]
        if isinstance(f, Blob) or (isinstance(f, NDArray) and f.variable):
            lengths = [len(v) for v in values]
            arr = np.zeros((len(values), max(lengths, default=0), *values[0].shape[1:]),
                           values[0].dtype)
            for row, v in zip(arr, values):
                row[:len(v)] = v
            out[name] = torch.from_numpy(arr)
            out[name + "_lengths"] = torch.tensor(lengths, dtype=torch.int64)
        else:
            out[name] = torch.from_numpy(np.stack(values))
    return out


def _stoker_transforms(ds: Dataset, image_size: int) -> Dict[str, list]:
    if image_size <= 0:
        return {}
    return {name: [ops.RandomResizedCrop(image_size), ops.RandomHorizontalFlip()]
            for name, f in ds.fields.items() if isinstance(f, Image)}


def run_dataset(path: str, batch_size: int = 256, threads: List[int] = None,
                workers: List[int] = (0, 1, 2), repeats: int = 3, image_size: int = 224,
                max_batches: int = 50, dataloader: bool = True) -> Dict[str, float]:
    """Benchmarks stoker on the dataset at `path`, with what a training run would ask of
    it: shuffled batches of `batch_size`, and for image fields RandomResizedCrop(image_size)
    and a random flip (image_size=0: plain decodes, which need images of one size).

    Prints, in one run, samples/s and time to the first batch of
      * stoker.Loader with each thread count, and where its workers spend their time;
      * torch.utils.data.DataLoader over the same shards (Dataset[i], images decoded with
        PIL as torchvision would) with each num_workers, if `dataloader`;
      * for image datasets, the ceiling: full libjpeg-turbo/libpng decodes of a sample of
        the same images and nothing else, on as many threads;
    then the ratios. Each configuration runs `repeats` times (median) over at most
    `max_batches` batches, after a read of the shards so that each starts from page cache.
    """
    from . import _core

    ds = Dataset(path)
    if len(ds) == 0:
        raise ValueError(f"{ds.path}: the dataset has no samples to benchmark")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = sorted(set(threads or {1, cores}))
    transforms = _stoker_transforms(ds, image_size)
    limit = max(1, min(max_batches, math.ceil(len(ds) / batch_size)))
    data_bytes = sum(s["bytes"] for s in ds.shards)
    print(f"{ds.path}: {len(ds)} samples in {len(ds.shards)} shard(s), "
          f"{data_bytes / max(len(ds), 1) / 1e3:.1f} kB per sample; fields: "
          + ", ".join(f"{k}={f!r}" for k, f in ds.fields.items()))
    print(f"batch_size={batch_size}, shuffled, up to {limit} batches per run, median of "
          f"{repeats}; transforms: "
          + (", ".join(f"{k}: {v}" for k, v in transforms.items()) or "none"))
    results: Dict[str, float] = {}

    def report(name: str, runs: List[tuple], extra: str = "") -> None:
        results[name] = statistics.median(r[0] for r in runs)
        first = statistics.median(r[1] for r in runs)
        print(f"  {name:<34} {results[name]:>10,.0f} samples/s   first batch "
              f"{first * 1e3:7.1f} ms{extra}", flush=True)

    for t in threads:
        runs = []
        for epoch in range(repeats):
            loader = Loader(ds, batch_size=batch_size, shuffle=True, num_threads=t,
                            transforms=transforms, prefetch_next_epoch=False)
            loader.set_epoch(epoch)
            runs.append(_time_batches(lambda loader=loader: loader, ds.path, limit))
            st = loader.stats()
            loader.close()
        work = st["read_seconds"] + st["decode_seconds"] + st["plan_seconds"]
        split = "   workers: " + ", ".join(
            f"{k} {100 * st[k + '_seconds'] / work:.0f}%"
            for k in ("read", "decode", "plan")) if work > 0 else ""
        report(f"stoker num_threads={t}", runs, split)

    images = [k for k, f in ds.fields.items() if isinstance(f, Image)]
    if dataloader:
        try:
            if images:
                import PIL  # noqa: F401  (the peer decodes with it)
        except ImportError:
            print("  DataLoader peer skipped: it decodes images with Pillow "
                  "(pip install pillow)")
        else:
            peer = PythonDataset(ds.path, image_size)
            for w in workers:
                runs = [_time_batches(lambda w=w: torch.utils.data.DataLoader(
                    peer, batch_size=batch_size, shuffle=True, num_workers=w,
                    collate_fn=lambda s: collate(ds.fields, s)), ds.path, limit)
                        for _ in range(repeats)]
                report(f"DataLoader num_workers={w}", runs)

    if images:
        rng = np.random.default_rng(0)
        sample = [ds[int(i)][images[0]]
                  for i in rng.choice(len(ds), size=min(len(ds), 512), replace=False)]
        for t in threads:
            rate = statistics.median(_core.decode_only_throughput(sample, t, 1)
                                     for _ in range(repeats))
            results[f"ceiling: decode only, {t} thread(s)"] = rate / len(images)
            print(f"  {f'ceiling: decode only, {t} thread(s)':<34} "
                  f"{results[f'ceiling: decode only, {t} thread(s)']:>10,.0f} samples/s"
                  f"   ({images[0]!r}, {len(sample)} images)")

    best_t = max(threads, key=lambda t: results[f"stoker num_threads={t}"])
    best = results[f"stoker num_threads={best_t}"]
    dl = {k: v for k, v in results.items() if k.startswith("DataLoader")}
    if dl:
        name = max(dl, key=dl.get)
        print(f"stoker (num_threads={best_t}) / best DataLoader ({name}): "
              f"{best / dl[name]:.2f}x")
    for t in threads:
        key = f"ceiling: decode only, {t} thread(s)"
        if key in results:
            print(f"stoker num_threads={t} / {key}: "
                  f"{results[f'stoker num_threads={t}'] / results[key]:.2f}x")
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", nargs="?", default=None,
                   help="a stoker dataset to benchmark; without it, a synthetic one of "
                        "fixed-size records")
    p.add_argument("--samples", type=int, default=20000,
                   help="synthetic dataset: number of samples")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=None,
                   help="synthetic dataset: directory to keep it in (default: temp)")
    p.add_argument("--workers", default="0,1,2", help="DataLoader num_workers to try")
    p.add_argument("--threads", default=None,
                   help="stoker num_threads to try (default: 1,2 synthetic; 1 and all "
                        "cores for a dataset)")
    p.add_argument("--image-size", type=int, default=224,
                   help="dataset: RandomResizedCrop size for image fields, 0 for none")
    p.add_argument("--max-batches", type=int, default=50,
                   help="dataset: batches per timed run at most")
    p.add_argument("--no-dataloader", action="store_true",
                   help="dataset: skip the DataLoader peer")


def _int_list(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"expected comma-separated ints, got {text!r}") from None
    if any(v < 0 for v in values):
        raise ValueError(f"expected non-negative ints, got {text!r}")
    return values


def main(args: argparse.Namespace) -> int:
    workers = _int_list(args.workers)
    threads = _int_list(args.threads) if args.threads else None
    if args.dataset is not None:
        run_dataset(args.dataset, args.batch_size, threads, workers, args.repeats,
                    args.image_size, args.max_batches, not args.no_dataloader)
    else:
        run(args.samples, args.batch_size, args.repeats, args.data, workers,
            threads or [1, 2])
    return 0
