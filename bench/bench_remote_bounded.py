"""A bounded remote dataset: samples/s and the fetcher's CPU time per epoch, for one or
more builds of stoker in one run.

    python bench/bench_remote_bounded.py [--shards 200] [--window 8] [--epochs 2]
                                         [--repeats 5] [--python NAME=PYTHON ...]

A dataset of --shards shards of raw uint8[3,64,64] records is served by nginx on loopback.
Each run (a fresh process and a fresh cache directory) opens it with a cache_limit of
three windows' worth of shards (so it is bounded: shards are given back and fetched again
every epoch), reads --epochs shuffled epochs with ``shard_window=--window`` (batch 256, 2
threads), and reports samples/s and the CPU time of the fetcher thread per epoch (read
from /proc for the thread named ``stoker-fetcher``, so builds without
``stats()["network"]["fetcher_cpu_seconds"]`` are measured the same way; that stat is
printed too where there is one). With several --python (each an interpreter with a build
of stoker installed: ``--python before=/path/to/venv/bin/python``), runs alternate between
them (A B A B ...) and the medians are printed with their ratios to the first.

nginx must be installed (apt-get install nginx).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

RUN = r"""
import json, os, sys, threading, time
import stoker
url, cache, limit, window, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])

def fetcher_cpu():
    tick = os.sysconf("SC_CLK_TCK")
    for t in threading.enumerate():
        if t.name == "stoker-fetcher":
            with open(f"/proc/self/task/{t.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick   # utime + stime
    return float("nan")

ds = stoker.Dataset(url, cache_dir=cache, cache_limit=limit)
loader = stoker.Loader(ds, batch_size=256, shuffle=True, shard_window=window, seed=0,
                       num_threads=2, stall_warning=None)
cpu0 = fetcher_cpu()
t0 = time.perf_counter()
n = 0
for e in range(epochs):
    loader.set_epoch(e)
    for b in loader:
        n += len(b["label"])
wall = time.perf_counter() - t0
net = ds.remote.stats()
print(json.dumps({"samples_per_second": n / wall,
                  "fetcher_cpu_per_epoch": (fetcher_cpu() - cpu0) / epochs,
                  "stat_cpu_per_epoch": net.get("fetcher_cpu_seconds", float("nan")) / epochs,
                  "downloads": net["downloads"], "evictions": net["evictions"]}))
ds.remote.close()
"""


def make_dataset(root: str, shards: int, per_shard: int) -> int:
    import stoker

    fields = {"x": stoker.ndarray("uint8", (3, 64, 64)), "label": stoker.scalar("int64")}
    rng = np.random.default_rng(0)
    record = 3 * 64 * 64 + 8 + 8
    with stoker.ShardWriter(root, fields, shard_size=per_shard * (record + 16)) as w:
        for i in range(shards * per_shard):
            w.write({"x": rng.integers(0, 256, (3, 64, 64), dtype=np.uint8), "label": i})
    got = stoker.Dataset(root).shards
    assert len(got) == shards, (len(got), shards)
    return max(s["bytes"] for s in got)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=200)
    p.add_argument("--per-shard", type=int, default=40, help="records per shard")
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--python", action="append", default=[], metavar="NAME=PYTHON",
                   help="a build to run (default: this interpreter)")
    args = p.parse_args()
    builds = [tuple(b.split("=", 1)) for b in args.python] or [("this", sys.executable)]

    from remote_servers import Nginx

    work = tempfile.mkdtemp(prefix="stoker-bench-bounded-")
    try:
        shard = make_dataset(os.path.join(work, "www", "ds"), args.shards, args.per_shard)
        limit = 3 * args.window * shard
        server = Nginx(os.path.join(work, "www"), os.path.join(work, "nginx"))
        try:
            print(f"{args.shards} shards of {shard / 1e3:.0f} kB, shard_window={args.window}, "
                  f"cache_limit={limit / 1e6:.1f} MB (3 windows), {args.epochs} epochs per "
                  f"run, median of {args.repeats}, builds interleaved")
            results = {name: [] for name, _ in builds}
            for r in range(args.repeats):
                for name, python in builds:
                    cache = os.path.join(work, f"cache-{name}-{r}")
                    out = subprocess.run([python, "-c", RUN, f"{server.url}/ds", cache,
                                          str(limit), str(args.window), str(args.epochs)],
                                         capture_output=True, text=True, timeout=600)
                    if out.returncode != 0:
                        raise SystemExit(f"{name}: {out.stderr}")
                    results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
                    shutil.rmtree(cache, ignore_errors=True)
        finally:
            server.stop()
        base = None
        for name, runs in results.items():
            sps = statistics.median(x["samples_per_second"] for x in runs)
            cpu = statistics.median(x["fetcher_cpu_per_epoch"] for x in runs)
            stat = statistics.median(x["stat_cpu_per_epoch"] for x in runs)
            dl = statistics.median(x["downloads"] for x in runs)
            if base is None:
                base = (sps, cpu)
            ratio = f"  ({sps / base[0]:.2f}x samples/s, {cpu / base[1]:.2f}x fetcher CPU)" \
                if base[1] > 0 else ""
            stat_text = "" if stat != stat else f", stats(): {stat:.3f} s"
            print(f"  {name:<10} {sps:>10,.0f} samples/s   fetcher CPU {cpu:.3f} s/epoch"
                  f"{stat_text}   downloads {dl:.0f}{ratio if name != builds[0][0] else ''}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
