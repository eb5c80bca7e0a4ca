"""``stoker bench DATASET``: a user's own dataset (see :func:`run_dataset`)."""

from __future__ import annotations

import functools
import math
import os
import random
import statistics
from typing import Dict, List

import numpy as np
import torch

from .. import ops
from .._progress import Progress
from ..dataset import Dataset
from ..fields import Blob, Image, NDArray
from ..loader import Loader
from ._spread import Runs
from ._timing import _time_batches


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
    longest with ``<name>_lengths``, images ``[N, C, H, W]`` (HWC ones as a view)."""
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
        elif isinstance(f, Image) and f.layout == "HWC":
            out[name] = torch.from_numpy(np.stack(values)).permute(0, 3, 1, 2)
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
                max_batches: int = 50, dataloader: bool = True,
                progress: bool = True) -> Dict[str, float]:
    """Benchmarks stoker on the dataset at `path`, with what a training run would ask of
    it: shuffled batches of `batch_size`, and for image fields RandomResizedCrop(image_size)
    and a random flip (image_size=0: plain decodes, which need images of one size).

    Prints, in one run, samples/s and time to the first batch of
      * stoker.Loader with each thread count, and where its workers spend their time;
      * torch.utils.data.DataLoader over the same shards (Dataset[i], images decoded with
        PIL as torchvision would) with each num_workers, if `dataloader`;
      * for image datasets, a reference: full libjpeg-turbo/libpng decodes of a sample of
        the same images and nothing else, on as many threads (not a bound: a crop decodes
        only its region, so stoker can beat it);
    then the ratios. Each configuration runs `repeats` times over at most `max_batches`
    batches, after a read of the shards so that each starts from page cache; figures are
    medians with their range, and the stage shares of the workers' time name a stage
    only when it leads beyond the spread of the runs.
    """
    from .. import _core

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
    runs_of: Dict[str, Runs] = {}
    images = [k for k, f in ds.fields.items() if isinstance(f, Image)]
    total = repeats * (len(threads) + (len(workers) if dataloader else 0)
                       + (len(threads) if images else 0))
    bar = Progress(total, "stoker bench", unit="runs", enabled=progress)

    def report(name: str, runs: List[tuple], extra: str = "") -> None:
        runs_of[name] = Runs([r[0] for r in runs])
        results[name] = runs_of[name].median
        first = statistics.median(r[1] for r in runs)
        bar.write(f"  {name:<34} {runs_of[name].text(unit='samples/s'):<46} first batch "
                  f"{first * 1e3:7.1f} ms{extra}")

    stages = ("read", "decode", "ops", "plan")
    shares: Dict[int, List[Dict[str, float]]] = {}
    for t in threads:
        runs = []
        shares[t] = []
        for epoch in range(repeats):
            bar.update()
            loader = Loader(ds, batch_size=batch_size, shuffle=True, num_threads=t,
                            transforms=transforms, prefetch_next_epoch=False,
                            stall_warning=None)
            loader.set_epoch(epoch)
            runs.append(_time_batches(lambda loader=loader: loader, ds.path, limit))
            st = loader.stats()
            loader.close()
            work = sum(st[k + "_seconds"] for k in stages)
            if work > 0:
                shares[t].append({k: st[k + "_seconds"] / work for k in stages})
        report(f"stoker num_threads={t}", runs)

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
                # functools.partial, not a lambda: workers of any start method
                # (forkserver is Python 3.14's default) get it pickled
                runs = []
                for _ in range(repeats):
                    bar.update()
                    runs.append(_time_batches(lambda w=w: torch.utils.data.DataLoader(
                        peer, batch_size=batch_size, shuffle=True, num_workers=w,
                        collate_fn=functools.partial(collate, ds.fields)), ds.path, limit))
                report(f"DataLoader num_workers={w}", runs)

    if images:
        rng = np.random.default_rng(0)
        sample = [ds[int(i)][images[0]]
                  for i in rng.choice(len(ds), size=min(len(ds), 512), replace=False)]
        for t in threads:
            rates = []
            for _ in range(repeats):
                bar.update()
                rates.append(_core.decode_only_throughput(sample, t, 1))
            name = f"full decodes only, {t} thread(s)"
            runs_of[name] = Runs([r / len(images) for r in rates])
            results[name] = runs_of[name].median
            bar.write(f"  {name:<34} {runs_of[name].text(unit='samples/s'):<46} "
                      f"({images[0]!r}, {len(sample)} images; a reference, not a bound)")
    bar.close()

    def ratio(a: str, b: str) -> str:
        x, y = runs_of[a], runs_of[b]
        text = f"{x.median / y.median:.2f}x"
        if x.n > 1 and y.n > 1:
            text += f" ({x.lo / y.hi:.2f}x-{x.hi / y.lo:.2f}x)"
        return text

    best_t = max(threads, key=lambda t: results[f"stoker num_threads={t}"])
    best = f"stoker num_threads={best_t}"
    print("ratios (medians; in brackets the extremes of the runs):")
    dl = [k for k in runs_of if k.startswith("DataLoader")]
    if dl:
        name = max(dl, key=lambda k: runs_of[k].median)
        print(f"  {best} / best DataLoader ({name}): {ratio(best, name)}")
    for t in threads:
        key = f"full decodes only, {t} thread(s)"
        if key in runs_of:
            print(f"  stoker num_threads={t} / {key}: {ratio(f'stoker num_threads={t}', key)}")
    from .demo import STAGE_SHORT, where_the_time_goes

    what = {"read": "reading and verifying records",
            "decode": "decoding" if images else "copying the fields into the batch",
            "ops": "image ops", "plan": "planning batches"}
    short = dict(STAGE_SHORT, decode="decode" if images else STAGE_SHORT["decode"])
    from ._pagecache import resident_fraction

    in_cache = resident_fraction([os.path.join(ds.path, s["path"]) for s in ds.shards])
    for line in where_the_time_goes(shares[best_t], what, in_cache,
                                    f"num_threads={best_t}, {len(shares[best_t])} runs",
                                    short):
        print(line)
    return results
