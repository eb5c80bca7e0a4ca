"""Two builds of stoker on the same workloads, alternating: what a change costs, measured
where a shared machine's load moves by more than the change does.

    python bench/bench_ab.py BEFORE_PYTHON AFTER_PYTHON [--pairs 15] [--jpegs DIR]

BEFORE_PYTHON and AFTER_PYTHON are the interpreters of two environments with stoker
installed (e.g. a virtual environment built at the branch point and the current one). Each
pair runs one workload in a fresh process of each, back to back, in alternating order; the
script prints each build's median and the median of the pairs' ratios (after / before),
which cancels the load that changes between pairs. Workloads:

  raw        a Loader over 500,000 small fixed-size records (1 KB: the per-record work
             shows), two threads, verify="first": samples/s of epochs 2-4 together (records
             verified already), the data files read before them
  cached     a Loader over JPEGs (bench/make_jpegs.py; --jpegs, first 500) with
             cache="decoded", RandomResizedCrop(224) + flip: images/s of epochs 2 and 3
             (served from the cache), after epoch 1 filled it
  joined     the same, read by a second loader that joins the cache the first filled (as
             another rank does): images/s of its first epoch, where each entry is read for
             the first time in its mapping (and, since this change, hashed)
  decode     the same without the cache (every epoch decodes): the first epoch's cost
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

WORKER = r"""
import json, os, sys, time
import numpy as np
import stoker
from stoker import ops

kind, path = sys.argv[1], sys.argv[2]

def warm(ds):
    for s in ds.shards:
        with open(os.path.join(ds.path, s["path"]), "rb") as f:
            while f.read(1 << 22):
                pass

def rate(loader, epoch, ds):
    loader.set_epoch(epoch)
    warm(ds)
    t0 = time.perf_counter()
    n = 0
    for b in loader:
        n += len(next(iter(b.values())))
    return n / (time.perf_counter() - t0)

ds = stoker.Dataset(path)
if kind == "raw":
    ld = stoker.Loader(ds, batch_size=256, shuffle=True, num_threads=2, stall_warning=None)
    rate(ld, 0, ds)
    warm(ds)
    t0 = time.perf_counter()
    n = 0
    for e in (1, 2, 3):
        ld.set_epoch(e)
        n += sum(len(b["label"]) for b in ld)
    out = [n / (time.perf_counter() - t0)]
else:
    tf = {"image": [ops.RandomResizedCrop(224), ops.RandomHorizontalFlip()]}
    kw = dict(cache="decoded", cache_size="4GB") if kind != "decode" else {}
    ld = stoker.Loader(ds, batch_size=64, shuffle=True, num_threads=2, transforms=tf,
                       stall_warning=None, prefetch_next_epoch=False, **kw)
    first = rate(ld, 0, ds)
    if kind == "joined":
        other = stoker.Loader(ds, batch_size=64, shuffle=True, num_threads=2, transforms=tf,
                              stall_warning=None, prefetch_next_epoch=False, **kw)
        out = [rate(other, 1, ds)]
        assert other.stats()["cache"]["hits"] > 0.9 * len(ds)
    else:
        out = [first] if kind == "decode" else [rate(ld, e, ds) for e in (1, 2)]
print(json.dumps(sorted(out)[len(out) // 2]))
"""


def make_data(python: str, root: str, jpegs: str) -> dict:
    """The workloads' datasets, written once (by the before build: the format is the same)."""
    raw = os.path.join(root, "raw")
    images = os.path.join(root, "images")
    code = f"""
import glob, os
import numpy as np
import stoker
with stoker.ShardWriter({raw!r}, {{"x": stoker.ndarray("uint8", (1024,)),
                                   "label": stoker.scalar("int64")}}) as w:
    x = np.random.default_rng(0).integers(0, 255, 1024, dtype=np.uint8)
    for i in range(500000):
        w.write({{"x": x, "label": i}})
files = sorted(glob.glob(os.path.join({jpegs!r}, "*.jpg")))[:500]
with stoker.ShardWriter({images!r}, {{"image": stoker.image(),
                                      "label": stoker.scalar("int64")}}) as w:
    for i, p in enumerate(files):
        w.write({{"image": open(p, "rb").read(), "label": i}})
"""
    subprocess.run([python, "-c", code], check=True)
    return {"raw": raw, "cached": images, "joined": images, "decode": images}


def run(python: str, kind: str, path: str) -> float:
    """One process of `python` running workload `kind` on `path`: its samples/s."""
    r = subprocess.run([python, "-c", WORKER, kind, path], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{python} {kind}: {r.stderr[-2000:]}")
    return float(json.loads(r.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="python of the environment before the change")
    p.add_argument("after", help="python of the environment after it")
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--jpegs", help="folder of JPEGs (bench/make_jpegs.py)")
    p.add_argument("--only", default="raw,cached,joined,decode")
    a = p.parse_args()
    kinds = a.only.split(",")
    if any(k != "raw" for k in kinds) and not a.jpegs:
        p.error("--jpegs is needed for the image workloads")
    with tempfile.TemporaryDirectory() as root:
        data = make_data(a.before, root, a.jpegs or root)
        for kind in kinds:
            before, after, ratios = [], [], []
            t0 = time.monotonic()
            for i in range(a.pairs):
                order = [("before", a.before), ("after", a.after)]
                if i % 2:
                    order.reverse()
                got = {name: run(py, kind, data[kind]) for name, py in order}
                before.append(got["before"])
                after.append(got["after"])
                ratios.append(got["after"] / got["before"])
            q = statistics.quantiles(ratios, n=4)
            print(f"{kind:7s} before {statistics.median(before):12,.0f}/s  after "
                  f"{statistics.median(after):12,.0f}/s  after/before: median of {a.pairs} "
                  f"pairs {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}-{q[2]:.3f}) "
                  f"[{time.monotonic() - t0:.0f} s]", flush=True)


if __name__ == "__main__":
    main()
