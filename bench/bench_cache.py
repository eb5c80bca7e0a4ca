"""Decode once: the decoded-sample cache and raw-pixel storage, RandomResizedCrop(224) + flip.

    python bench/make_jpegs.py /tmp/jpegs --n 2000
    python bench/bench_cache.py /tmp/jpegs [--threads 2] [--repeats 3] [--max-side 256]

Writes the JPEGs once as a stoker dataset (JPEG-stored) and once as raw pixels
(stoker.image(storage="raw")), then measures images/s, the median of `repeats` runs each,
in one run of this script:

  uncached         Loader over the JPEG dataset (each epoch decodes every image)
  cached epoch 1   a new Loader(cache="decoded") over it: its first epoch (decodes and keeps)
  cached epoch 2   the same loader's second epoch (no decode)
  max_side 1 / 2   the same with cache_max_side (one reduced copy per image)
  raw-stored       Loader over the raw dataset (no decode, no cache)

and prints the ratios: cached epoch 2 over its epoch 1 and over the uncached loader (target
>= 3x each), raw over JPEG-stored (target >= 3x). Then two processes (ranks 0 and 1 of a
world of 2) share one cache: each runs two epochs, and the script reads their proportional
set size (PSS) from /proc: the cache's file counts once between them (target: the two
ranks' PSS grows by about the cache's size, not twice it). The data files are read right
before each timed run (an idle machine pages them out after a minute).
"""

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time


def warm(paths):
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def write(files, out, storage):
    import stoker

    fields = {"image": stoker.image(storage=storage), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(out, fields, shard_size="256MB", overwrite=True) as w:
        for i, data in enumerate(files):
            w.write({"image": data, "label": i % 1000})
    ds = stoker.Dataset(out)
    return [os.path.join(ds.path, s["path"]) for s in ds.shards]


def transforms():
    from stoker import ops

    return {"image": [ops.RandomResizedCrop(224), ops.RandomHorizontalFlip()]}


def run_epoch(loader, epoch, shards):
    loader.set_epoch(epoch)
    warm(shards)
    t0 = time.perf_counter()
    n = sum(b["image"].shape[0] for b in loader)
    return n / (time.perf_counter() - t0)


def make_loader(path, threads, batch, **kw):
    import stoker

    return stoker.Loader(stoker.Dataset(path), batch_size=batch, shuffle=True, seed=0,
                         num_threads=threads, transforms=transforms(), stall_warning=None,
                         prefetch_next_epoch=False, **kw)


def pss_kib(pid, path=None):
    """Proportional set size of a process (KiB), or of its mappings of `path` only."""
    total, inside = 0, path is None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                inside = path is None or line.rstrip().endswith(path)
            elif first == "Pss:" and inside:
                total += int(line.split()[1])
    return total


RANK = """
import os, sys, time
sys.path.insert(0, {here!r})
from bench_cache import make_loader, run_epoch
rank = int(sys.argv[1])
kw = dict(cache="decoded", cache_size={size}) if {cached} else {{}}
loader = make_loader({path!r}, {threads}, {batch}, rank=rank, world_size=2, **kw)
rates = [run_epoch(loader, e, {shards!r}) for e in range(2)]
s = loader.stats().get("cache", {{}})
print("DONE", rates[0], rates[1], s.get("hits", 0), s.get("misses", 0), s.get("bytes", 0),
      s.get("path", ""), flush=True)
sys.stdin.readline()  # measured while it holds its memory
"""


def two_ranks(path, shards, threads, batch, size, cached):
    """Two processes, ranks 0 and 1 of 2, two epochs each; their PSS (KiB, the whole
    process and the cache file's mapping) once both are done, and their reports."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = RANK.format(here=here, path=path, threads=threads, batch=batch, size=size,
                       cached=cached, shards=shards)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    reports = []
    for p in procs:
        for line in p.stdout:
            if line.startswith("DONE"):
                reports.append(line.split()[1:])
                break
    cache_path = reports[0][5] if cached and len(reports[0]) > 5 else None
    total = sum(pss_kib(p.pid) for p in procs)
    in_cache = sum(pss_kib(p.pid, cache_path) for p in procs) if cache_path else 0
    for p in procs:
        p.stdin.close()
        p.wait()
        p.stdout.close()
    return total, in_cache, reports


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("images", help="folder of JPEGs (bench/make_jpegs.py)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="median of N per configuration")
    p.add_argument("--max-side", type=int, default=256)
    p.add_argument("--cache-size", default="8GB")
    p.add_argument("--limit", type=int, default=None, help="use the first N images")
    p.add_argument("--skip-ranks", action="store_true", help="no two-process measurement")
    args = p.parse_args()

    from stoker._index import parse_size

    size = parse_size(args.cache_size)
    paths = sorted(glob.glob(os.path.join(args.images, "*.jp*g")))[: args.limit]
    if not paths:
        sys.exit(f"no JPEGs in {args.images}: run bench/make_jpegs.py first")
    files = []
    for f in paths:
        with open(f, "rb") as fh:
            files.append(fh.read())
    t, b = args.threads, args.batch_size
    print(f"{len(files)} JPEGs, {sum(map(len, files)) / len(files) / 1e3:.0f} kB each, "
          f"{t} thread(s), batch {b}, RandomResizedCrop(224) + flip; images/s, median of "
          f"{args.repeats}")
    runs = {k: [] for k in ("uncached", "cached epoch 1", "cached epoch 2",
                            f"max_side={args.max_side} epoch 1",
                            f"max_side={args.max_side} epoch 2", "raw-stored", "JPEG-stored")}
    with tempfile.TemporaryDirectory(prefix="stoker-bench-cache-") as tmp:
        jpeg_ds, raw_ds = os.path.join(tmp, "jpeg"), os.path.join(tmp, "raw")
        jpeg_shards = write(files, jpeg_ds, "encoded")
        raw_shards = write(files, raw_ds, "raw")
        raw_bytes = sum(os.path.getsize(s) for s in raw_shards)
        jpeg_bytes = sum(os.path.getsize(s) for s in jpeg_shards)
        for r in range(args.repeats):  # interleaved: a slow stretch of the machine hits all
            runs["uncached"].append(run_epoch(make_loader(jpeg_ds, t, b), r, jpeg_shards))
            # A new cache each round (its size in the name): epoch 1 decodes everything.
            cached = make_loader(jpeg_ds, t, b, cache="decoded", cache_size=size + r)
            runs["cached epoch 1"].append(run_epoch(cached, 0, jpeg_shards))
            runs["cached epoch 2"].append(run_epoch(cached, 1, jpeg_shards))
            cache_bytes = cached.stats()["cache"]["bytes"]
            del cached
            small = make_loader(jpeg_ds, t, b, cache="decoded", cache_size=size + r,
                                cache_max_side=args.max_side)
            runs[f"max_side={args.max_side} epoch 1"].append(run_epoch(small, 0, jpeg_shards))
            runs[f"max_side={args.max_side} epoch 2"].append(run_epoch(small, 1, jpeg_shards))
            small_bytes = small.stats()["cache"]["bytes"]
            del small
            runs["raw-stored"].append(run_epoch(make_loader(raw_ds, t, b), r, raw_shards))
            runs["JPEG-stored"].append(run_epoch(make_loader(jpeg_ds, t, b), r, jpeg_shards))
        med = {k: statistics.median(v) for k, v in runs.items()}
        width = max(map(len, med))
        for k, v in runs.items():
            print(f"  {k:<{width}}  {med[k]:7.0f}  ({min(v):.0f}-{max(v):.0f})")
        print(f"cache: {cache_bytes / 2**20:.0f} MiB of pixels as decoded, "
              f"{small_bytes / 2**20:.0f} MiB at max_side={args.max_side}; data: "
              f"{jpeg_bytes / 2**20:.0f} MiB as JPEG, {raw_bytes / 2**20:.0f} MiB raw")
        e1, e2, u = med["cached epoch 1"], med["cached epoch 2"], med["uncached"]
        m1, m2 = med[f"max_side={args.max_side} epoch 1"], med[f"max_side={args.max_side} epoch 2"]
        print(f"cached epoch 2 / its epoch 1: {e2 / e1:.2f}x; / uncached: {e2 / u:.2f}x "
              "(targets >= 3x)")
        print(f"max_side={args.max_side} epoch 2 / its epoch 1: {m2 / m1:.2f}x; / uncached: "
              f"{m2 / u:.2f}x")
        print(f"cached epoch 1 / uncached: {e1 / u:.2f}x (the first epoch decodes whole images)")
        print(f"raw-stored / JPEG-stored: {med['raw-stored'] / med['JPEG-stored']:.2f}x "
              "(target >= 3x)")
        if not args.skip_ranks:
            base, _, _ = two_ranks(jpeg_ds, jpeg_shards, t, b, size, False)
            total, in_cache, reports = two_ranks(jpeg_ds, jpeg_shards, t, b, size, True)
            shared = int(reports[0][4]) / 1024
            print(f"two ranks sharing one cache ({shared / 1024:.0f} MiB): PSS of the two "
                  f"{total / 1024:.0f} MiB, {base / 1024:.0f} MiB without the cache: "
                  f"+{(total - base) / 1024:.0f} MiB = {(total - base) / shared:.2f}x the "
                  f"cache (one copy: ~1x); the cache file's PSS in the two: "
                  f"{in_cache / 1024:.0f} MiB")
            for r, rep in enumerate(reports):
                print(f"  rank {r}: epoch 1 {float(rep[0]):.0f}, epoch 2 {float(rep[1]):.0f} "
                      f"images/s; {rep[2]} hits, {rep[3]} misses")


if __name__ == "__main__":
    main()
