"""Two bounded remote datasets sharing one cache directory (a train and a val set: NOTE
[ Cache budget ] in stoker/remote/space.py) against each of them alone, in one run.

    python bench/bench_remote_shared.py [--rate 40000] [--repeats 3] [--window 2]
                                        [--budgets windows,double] [--step 0]

A train set (24 shards of ~66 KB) and a val set (16 shards) are served by nginx on
loopback, each download limited to --rate bytes/s (nginx ``limit_rate``: a per-connection
limit, as an object store's per-request throughput is). Each repeat reads two shuffled
epochs (``shard_window=--window``, 4 downloads in flight at most per dataset) of:

- train alone and val alone, each in its own fresh cache directory with the budget;
- train and val together, in threads, in one fresh directory with the budget;
- train alone and val alone with half the budget (what each gets when they share it).

Budgets (``--budgets``): ``windows`` is just above the sum of the two windows (each set
gets one window: its downloads for the next window cannot start before it gives back the
last); ``double`` is just above twice that (room for each set's next window while it reads
the current one, as each has alone with the ``windows`` budget).

Each batch of 8 costs the reading loop --step seconds (a training step: 0 by default, so
the downloads are the bottleneck). With a step and a fast enough --rate, the sets are
bound by their loops, as training mostly is, e.g. ``--rate 1000000 --step 0.05``: each
shard is then downloaded faster than it is read, and what is measured is whether sharing
the budget makes either set wait.

It prints, per budget, the median and min-max over the repeats of each time, of the ratio
of together to the slower alone, and of each set's downloads in flight (those with their
room reserved in the budget, sampled every 5 ms: mean over time, and peak). Runs are
interleaved within a repeat. nginx must be installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import stoker  # noqa: E402
from remote_servers import Nginx  # noqa: E402

REC = 4096
PER_SHARD = 16


def write(path, n, offset):
    fields = {"x": stoker.ndarray("uint8", (REC,)), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size=PER_SHARD * (REC + 40)) as w:
        for i in range(n):
            w.write({"x": np.full(REC, (offset + i) % 251, np.uint8), "label": offset + i})


class InFlight:
    """Samples a dataset's downloads in flight (those with their room reserved in the
    budget) every 5 ms: mean over time and peak."""

    def __init__(self, ds):
        self.ds, self.samples, self.peak = ds, [], 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.005):
            n = self.ds.remote.stats()["downloads_in_flight"]
            self.samples.append(n)
            self.peak = max(self.peak, n)

    def stop(self):
        self._stop.set()
        self._t.join()
        return (statistics.fmean(self.samples) if self.samples else 0.0), self.peak


def epochs(ds, window, step, out):
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, shard_window=window, seed=0,
                           num_threads=2, stall_warning=None)
    n = 0
    for e in range(2):
        loader.set_epoch(e)
        for b in loader:
            n += len(b["label"])
            if step:
                time.sleep(step)  # the training step: the GPU works, the host waits
    out.append(n)


def run(url, names, cache, limit, window, rate, step):
    """Seconds to read two epochs of each of ``names`` at once, and each one's downloads
    in flight (mean, peak)."""
    sets = [stoker.Dataset(f"{url}/{n}", cache_dir=cache, cache_limit=limit,
                           storage_options={"headers": {"X-Test-Rate": str(rate)}})
            for n in names]
    watch = [InFlight(ds) for ds in sets]
    done = []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=epochs, args=(ds, window, step, done)) for ds in sets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    flight = [w.stop() for w in watch]
    for ds in sets:
        ds.remote.close()
    if len(done) != len(sets):
        raise RuntimeError("a reader failed (see its traceback above)")
    return secs, flight


def spread(xs, fmt="{:.2f}"):
    return (f"{fmt.format(statistics.median(xs))} "
            f"[{fmt.format(min(xs))}-{fmt.format(max(xs))}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=40000, help="bytes/s per download")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--budgets", default="windows,double")
    ap.add_argument("--step", type=float, default=0.0,
                    help="seconds of training step per batch of 8 (0: download-bound)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="stoker-bench-shared-")
    try:
        www = os.path.join(tmp, "www")
        write(os.path.join(www, "train"), 24 * PER_SHARD, 0)
        write(os.path.join(www, "val"), 16 * PER_SHARD, 10**6)
        size = max(s["bytes"] for s in stoker.Dataset(os.path.join(www, "train")).shards)
        server = Nginx(www, os.path.join(tmp, "nginx"))
        try:
            for budget in args.budgets.split(","):
                windows = {"windows": 2, "double": 4}[budget]
                limit = windows * args.window * size + size // 2
                print(f"budget {budget}: cache_limit {limit} bytes ({limit / size:.1f} "
                      f"shards), window {args.window}, {args.rate} B/s per download, "
                      f"step {args.step} s per batch, {args.repeats} repeats; "
                      "median [min-max]")
                times = {k: [] for k in ("train", "val", "both", "train/2", "val/2")}
                flight = {k: [] for k in ("train", "val", "both:train", "both:val")}
                ratios, ratios_half = [], []
                for r in range(args.repeats):
                    cases = [("train", ["train"], limit), ("val", ["val"], limit),
                             ("both", ["train", "val"], limit),
                             ("train/2", ["train"], limit // 2), ("val/2", ["val"], limit // 2)]
                    cases = cases[r % len(cases):] + cases[:r % len(cases)]  # interleave
                    for key, names, lim in cases:
                        cache = tempfile.mkdtemp(dir=tmp, prefix="cache-")
                        secs, fl = run(server.url, names, cache, lim, args.window, args.rate,
                                       args.step)
                        shutil.rmtree(cache)
                        times[key].append(secs)
                        if key == "both":
                            flight["both:train"].append(fl[0])
                            flight["both:val"].append(fl[1])
                        elif key in flight:
                            flight[key].append(fl[0])
                    ratios.append(times["both"][-1] / max(times["train"][-1],
                                                          times["val"][-1]))
                    ratios_half.append(times["both"][-1] / max(times["train/2"][-1],
                                                               times["val/2"][-1]))
                for key, label in (("train", "train alone"), ("val", "val alone"),
                                   ("both", "together"),
                                   ("train/2", "train alone, half the budget"),
                                   ("val/2", "val alone, half the budget")):
                    print(f"  {label:30s} {spread(times[key])} s")
                print(f"  {'together / slower alone':30s} {spread(ratios)}x")
                print(f"  {'together / slower alone (half)':30s} {spread(ratios_half)}x")
                for key, xs in flight.items():
                    print(f"  downloads in flight {key:11s} mean "
                          f"{spread([m for m, _ in xs])}, peak {spread([p for _, p in xs], '{}')}")
        finally:
            server.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
