"""Defaults against the best hand-tuned setting: does num_threads=None, prefetch=None find
what a sweep finds?

    python bench/bench_autotune.py [--data DIR] [--repeats 3] [--seconds 1.5]

Two datasets, written once under --data (default: a temp dir):
  * raw records: 20,000 x (uint8[3,64,64] + int64), batch 256;
  * JPEG: 2,000 synthetic photo-like JPEGs (bench/make_jpegs.py's generator, short side
    300-500), RandomResizedCrop(224) + flip, batch 64.
For each, in one run and from the page cache, samples/s of a loop that takes batches as fast
as they come (the loader is the bottleneck, which is where settings matter):
  * stoker.Loader with every hand-tuned setting of a sweep, num_threads in 1, 2, 4, ... up to
    the cores, x prefetch in 1, 2, 4, 8, 16;
  * stoker.Loader with all defaults (num_threads=None, prefetch=None: tuned online); its
    time includes whatever the tuner needs to settle, and the settled values are printed;
  * the ceiling: memcpy of the records' bytes (raw) and full libjpeg-turbo decodes of the
    same images on all cores (JPEG).
Each setting runs `--repeats` times (median), each run timed over `--seconds` after its first
batch (at least 5 batches), settings interleaved so that drift of a shared machine hits all
alike. Printed: the table,
defaults / best hand-tuned (target >= 0.90), and both against the ceiling.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import stoker
from stoker.bench import memcpy_bandwidth

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_jpegs import make_image  # noqa: E402

RAW_SHAPE = (3, 64, 64)


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def write_raw(path, n):
    if os.path.exists(os.path.join(path, "index.json")):
        return
    rng = np.random.default_rng(0)
    fields = {"x": stoker.ndarray("uint8", RAW_SHAPE), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size="64MB", overwrite=True) as w:
        for i in range(n):
            w.write({"x": rng.integers(0, 256, RAW_SHAPE, dtype=np.uint8), "label": i})


def write_jpeg(path, n):
    if os.path.exists(os.path.join(path, "index.json")):
        return
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    fields = {"image": stoker.image(), "label": stoker.scalar("int64")}
    with stoker.ShardWriter(path, fields, shard_size="64MB", overwrite=True) as w:
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(make_image(rng)).save(buf, format="JPEG", quality=90)
            w.write({"image": buf.getvalue(), "label": i})


def warm(path):
    """Reads the dataset's files so that every round starts from the page cache."""
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 24):
                    pass


def timed(loader, seconds, epoch0):
    """samples/s over about `seconds` after the first batch (epochs on end, 5 batches at
    least)."""
    seen = samples = 0
    t_first = None
    epoch = epoch0
    done = False
    while not done:
        loader.set_epoch(epoch)
        epoch += 1
        it = iter(loader)
        for b in it:
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            else:
                samples += len(b["label"])
            seen += 1
            if seen > 5 and now - t_first >= seconds:
                done = True
                break
        it.close()
    return samples / (time.perf_counter() - t_first)


def run_dataset(name, ds, batch_size, transforms, threads, prefetches, repeats, seconds,
                ceiling):
    settings = [(t, p) for t in threads for p in prefetches] + [(None, None)]
    rates = {s: [] for s in settings}
    settled = []
    print(f"\n{name}: {len(ds)} samples, batch_size={batch_size}, {seconds:g} s per run, "
          f"median of {repeats}", flush=True)
    for r in range(repeats):
        warm(ds.path)
        for s in settings:  # interleaved: every setting once per round
            t, p = s
            loader = stoker.Loader(ds, batch_size=batch_size, shuffle=True, num_threads=t,
                                   prefetch=p, transforms=transforms, stall_warning=None)
            rates[s].append(timed(loader, seconds, epoch0=100 * r))
            if s == (None, None):
                st = loader.stats()
                settled.append((st["num_threads"], st["prefetch"], st["settled"]))
            loader.close()
    med = {s: statistics.median(v) for s, v in rates.items()}
    hand = {s: v for s, v in med.items() if s != (None, None)}
    best = max(hand, key=hand.get)
    print(f"  {'num_threads':>11} " + " ".join(f"{'prefetch=' + str(p):>12}"
                                               for p in prefetches))
    for t in threads:
        print(f"  {t:>11} " + " ".join(f"{med[t, p]:>12,.0f}" for p in prefetches))
    d = med[None, None]
    print(f"  defaults (num_threads=None, prefetch=None): {d:,.0f} samples/s; settled on "
          + ", ".join(f"num_threads={a} prefetch={b}{'' if ok else ' (not yet settled)'}"
                      for a, b, ok in settled))
    print(f"  best hand-tuned: num_threads={best[0]}, prefetch={best[1]}: "
          f"{hand[best]:,.0f} samples/s")
    print(f"  ceiling: {ceiling[0]}: {ceiling[1]:,.0f} samples/s")
    print(f"  {name}: defaults / best hand-tuned = {d / hand[best]:.3f}   (target >= 0.90)")
    print(f"  {name}: defaults / ceiling = {d / ceiling[1]:.2f}, best hand-tuned / ceiling = "
          f"{hand[best] / ceiling[1]:.2f}", flush=True)
    return d / hand[best]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="where to keep the datasets (default: temp)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--raw-samples", type=int, default=20000)
    p.add_argument("--jpegs", type=int, default=2000)
    a = p.parse_args(argv)
    tmp = None
    if a.data is None:
        tmp = tempfile.TemporaryDirectory(prefix="stoker-autotune-")
        a.data = tmp.name
    raw_path, jpeg_path = os.path.join(a.data, "raw"), os.path.join(a.data, "jpeg")
    print(f"writing the datasets under {a.data} (once) ...", file=sys.stderr, flush=True)
    write_raw(raw_path, a.raw_samples)
    write_jpeg(jpeg_path, a.jpegs)
    n = cores()
    threads, t = [], 1
    while t < n:
        threads.append(t)
        t *= 2
    threads.append(n)
    prefetches = [1, 2, 4, 8, 16]
    print(f"{n} cores for this process; hand-tuned settings: num_threads {threads} x "
          f"prefetch {prefetches}")

    raw = stoker.Dataset(raw_path)
    bw = memcpy_bandwidth()
    ratios = [run_dataset("raw records", raw, 256, None, threads, prefetches, a.repeats,
                          a.seconds,
                          (f"memcpy {bw / 1e9:.1f} GB/s", bw / (np.prod(RAW_SHAPE) + 8)))]
    jpeg = stoker.Dataset(jpeg_path)
    sample = [jpeg[i]["image"] for i in range(min(len(jpeg), 512))]
    decode = statistics.median(stoker._core.decode_only_throughput(sample, n, 1)
                               for _ in range(a.repeats))
    ops = {"image": [stoker.ops.RandomResizedCrop(224), stoker.ops.RandomHorizontalFlip()]}
    ratios.append(run_dataset("JPEG", jpeg, 64, ops, threads, prefetches, a.repeats,
                              a.seconds, (f"full decodes on {n} threads", decode)))
    print(f"\ndefaults / best hand-tuned: raw {ratios[0]:.3f}, JPEG {ratios[1]:.3f} "
          f"(target >= 0.90 each)")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
