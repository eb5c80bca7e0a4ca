"""Image benchmark: RandomResizedCrop(224) + RandomHorizontalFlip into uint8 batches.

    python bench/make_jpegs.py /tmp/jpegs --n 2000
    python bench/bench_images.py /tmp/jpegs [--batch-size 256] [--repeats 3]

Measures images/s, in one run, for
  (a) stoker: Loader over a dataset of the same JPEGs (written once with ShardWriter),
      num_threads = 1, 2 (and all cores if more); plus the bare per-image path
      (_core.decode_image in a loop, one thread, no loader);
  (b) torch.utils.data.DataLoader over a map-style dataset that reads the files and does
      the same transforms with PIL (stoker.bench.pil_decode: torchvision's
      RandomResizedCrop rule and crop-then-BILINEAR resize, written out since torchvision
      is not a dependency),
      num_workers = 0, 1, 2; batches collated to uint8 tensors as stoker yields them;
  (c) the ceiling: full decodes of the same files with libjpeg-turbo, nothing else,
      on 1 thread and on all cores (_core.decode_only_throughput);
  (d) stoker with cache="decoded", 2 threads: the second epoch of a loader, which decodes
      nothing (bench/bench_cache.py measures the cache in full).
Prints the ratios stoker / best DataLoader and stoker / ceiling at equal thread counts.
The shard and image files are read right before each timed run so that every run starts
from a warm page cache (an idle minute may evict it).
"""

import argparse
import glob
import os
import sys
import tempfile
import time


def read_files(paths):
    out = []
    for p in paths:
        with open(p, "rb") as f:
            out.append(f.read())
    return out


def warm(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


# --- (b) the PIL/DataLoader reference -------------------------------------------------

class PilImages:
    """Map-style dataset: file -> PIL decode -> RandomResizedCrop -> flip -> uint8 HWC."""

    def __init__(self, paths, size=224):
        self.paths, self.size = paths, size

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch
        from stoker.bench import pil_decode

        with open(self.paths[i], "rb") as f:
            return torch.from_numpy(pil_decode(f.read(), self.size))


def time_dataloader(paths, batch_size, workers):
    import torch

    loader = torch.utils.data.DataLoader(PilImages(paths), batch_size=batch_size, shuffle=True,
                                         num_workers=workers,
                                         persistent_workers=False)
    warm(paths)
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += batch.shape[0]
    return n / (time.perf_counter() - t0)


# --- (a) stoker ---------------------------------------------------------------------

def write_dataset(files, out):
    import stoker

    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(out, fields, overwrite=True) as w:
        for i, data in enumerate(files):
            w.write({"image": data, "label": i % 1000})
    ds = stoker.Dataset(out)
    return [os.path.join(ds.path, s["path"]) for s in ds.shards]  # in gen-<id>/ (format v2)


def time_stoker(out, shard_files, batch_size, threads, epoch):
    import stoker

    ds = stoker.Dataset(out)
    loader = stoker.Loader(ds, batch_size=batch_size, shuffle=True, seed=0, num_threads=threads,
                           transforms={"image": [stoker.ops.RandomResizedCrop(224),
                                                 stoker.ops.RandomHorizontalFlip()]})
    loader.set_epoch(epoch)
    warm(shard_files)
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += batch["image"].shape[0]
    return n / (time.perf_counter() - t0)


def time_cached(out, shard_files, batch_size, threads, key):
    """The second epoch of a Loader(cache="decoded") (a new cache each call: `key`)."""
    import stoker

    ds = stoker.Dataset(out)
    loader = stoker.Loader(ds, batch_size=batch_size, shuffle=True, seed=0, num_threads=threads,
                           transforms={"image": [stoker.ops.RandomResizedCrop(224),
                                                 stoker.ops.RandomHorizontalFlip()]},
                           cache="decoded", cache_size=(8 << 30) + key,
                           prefetch_next_epoch=False, stall_warning=None)
    for _ in loader:  # the first epoch decodes and keeps
        pass
    loader.set_epoch(1)
    warm(shard_files)
    t0 = time.perf_counter()
    n = 0
    for batch in loader:
        n += batch["image"].shape[0]
    return n / (time.perf_counter() - t0)


def time_bare(files):
    from stoker import _core, ops

    specs = ops.op_specs([ops.RandomResizedCrop(224), ops.RandomHorizontalFlip()])
    t0 = time.perf_counter()
    for i, data in enumerate(files):
        _core.decode_image(data, specs, seed=i)
    return len(files) / (time.perf_counter() - t0)


def best(f, repeats):
    return max(f() for _ in range(repeats))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", help="folder of JPEGs (bench/make_jpegs.py)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="best of N per configuration")
    p.add_argument("--limit", type=int, default=None, help="use the first N images")
    p.add_argument("--skip-dataloader", action="store_true")
    args = p.parse_args()

    from stoker import _core

    paths = sorted(glob.glob(os.path.join(args.images, "*.jp*g")))[: args.limit]
    if not paths:
        sys.exit(f"no JPEGs in {args.images}: run bench/make_jpegs.py first")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    files = read_files(paths)
    print(f"{len(files)} JPEGs, {sum(map(len, files)) / len(files) / 1e3:.0f} kB each, "
          f"{cores} cores, batch {args.batch_size}; images/s, best of {args.repeats}")

    results = {}
    with tempfile.TemporaryDirectory(prefix="stoker-bench-") as tmp:
        shard_files = write_dataset(files, os.path.join(tmp, "ds"))
        thread_counts = sorted({1, 2, cores})
        for t in thread_counts:
            epochs = iter(range(1000))
            results[f"stoker threads={t}"] = best(
                lambda t=t, epochs=epochs: time_stoker(os.path.join(tmp, "ds"), shard_files,
                                                       args.batch_size, t, next(epochs)),
                args.repeats)
        keys = iter(range(1000))
        results["stoker threads=2, cache='decoded', epoch 2"] = best(
            lambda: time_cached(os.path.join(tmp, "ds"), shard_files, args.batch_size, 2,
                                next(keys)), args.repeats)
    results["stoker bare decode_image loop, 1 thread"] = best(lambda: time_bare(files),
                                                             args.repeats)
    for t in sorted({1, cores}):
        results[f"ceiling: full decode only, {t} thread(s)"] = best(
            lambda t=t: _core.decode_only_throughput(files, t, 1), args.repeats)
    if not args.skip_dataloader:
        for w in (0, 1, 2):
            results[f"DataLoader+PIL workers={w}"] = best(
                lambda w=w: time_dataloader(paths, args.batch_size, w), args.repeats)

    width = max(map(len, results))
    for k, v in results.items():
        print(f"  {k:<{width}}  {v:9.0f}")
    s1, s2 = results["stoker threads=1"], results["stoker threads=2"]
    c1 = results["ceiling: full decode only, 1 thread(s)"]
    cn = results[f"ceiling: full decode only, {cores} thread(s)"]
    sn = results[f"stoker threads={cores}"]
    print(f"stoker RRC+flip, 1 thread / full decode only, 1 thread: {s1 / c1:.2f}x "
          "(target >= 1: the region + DCT-scaled decode pays for the crop and resize)")
    print(f"stoker threads={cores} / ceiling on {cores} cores: {sn / cn:.2f}x")
    cached = results["stoker threads=2, cache='decoded', epoch 2"]
    print(f"stoker threads=2 cached epoch 2 / uncached: {cached / s2:.2f}x")
    if not args.skip_dataloader:
        dl = max(v for k, v in results.items() if k.startswith("DataLoader"))
        print(f"stoker threads=2 / best DataLoader (<= 2 workers): {s2 / dl:.2f}x")
        print(f"stoker threads=1 / best DataLoader (<= 2 workers): {s1 / dl:.2f}x")


if __name__ == "__main__":
    main()
