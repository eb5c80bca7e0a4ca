"""``stoker demo``: writes a small dataset, iterates it for a few epochs, and says what it
measured: samples/s as a median with its spread, and where the workers' time goes, naming a
stage only when it leads beyond the spread of the epochs."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Dict, List, Optional

from ._spread import Runs, differs, share_text

__all__ = ["demo", "STAGE_WHAT", "where_the_time_goes"]

# What each stage of the workers' time is, for a dataset without images (the demo's).
STAGE_WHAT = {"read": "reading and verifying records",
              "decode": "copying the fields into the batch",
              "ops": "image ops",
              "plan": "planning batches (reading the lengths of variable-length fields)"}


def demo(out: Optional[str] = None, samples: int = 10000, batch_size: int = 256,
         epochs: int = 4) -> int:
    import numpy as np

    from .. import Dataset, ShardWriter, ndarray, scalar

    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="stoker-demo-")
        out = tmp.name
    try:
        path = os.path.join(out, "demo")
        rng = np.random.default_rng(0)
        fields = {"x": ndarray("uint8", (3, 64, 64)), "tokens": ndarray("int32", (None,)),
                  "label": scalar("int64")}
        t0 = time.perf_counter()
        with ShardWriter(path, fields, shard_size="16MB", overwrite=True) as w:
            for i in range(samples):
                w.write({"x": rng.integers(0, 256, (3, 64, 64), dtype=np.uint8),
                         "tokens": rng.integers(0, 50000, rng.integers(1, 64),
                                                dtype=np.int32),
                         "label": i % 10})
        print(f"wrote {samples} samples to {path} in {time.perf_counter() - t0:.2f} s")
        ds = Dataset(path)
        print(ds)
        from .. import Loader  # torch, imported once there is something to load

        loader = Loader(ds, batch_size=batch_size, shuffle=True, seed=0)
        print(f"{loader}: {len(loader)} batches per epoch")
        report(loader, ds, epochs)
        loader.close()
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


# Their names in a list of shares.
STAGE_SHORT = {"read": "read and verify", "decode": "copy into the batch", "ops": "image ops",
               "plan": "plan"}


def _stage_seconds(stats: Dict) -> Dict[str, float]:
    return {k: float(stats[k + "_seconds"]) for k in STAGE_WHAT}


def report(loader, ds, epochs: int) -> None:
    """Iterates `epochs` epochs of `loader` (the loop does nothing with the batches, so the
    loader sets the pace) and prints what they measured."""
    from ._pagecache import resident_fraction

    rates: List[float] = []
    shares: List[Dict[str, float]] = []
    shapes: Dict = {}
    before = _stage_seconds(loader.stats())
    # The first epoch maps the shards and starts the worker threads: it is reported below
    # and left out of the figures after it when there are enough others.
    skip = 1 if epochs >= 4 else 0
    shard_paths = [os.path.join(ds.path, s["path"]) for s in ds.shards]
    in_cache = None
    for epoch in range(epochs):
        if epoch == skip:  # what the measured epochs start from
            in_cache = resident_fraction(shard_paths)
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        first = None
        n = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
                shapes = {k: tuple(v.shape) for k, v in batch.items()}
            n += len(batch["label"])
        secs = time.perf_counter() - t0
        now = _stage_seconds(loader.stats())
        spent = {k: now[k] - before[k] for k in now}
        before = now
        total = sum(spent.values())
        shares.append({k: v / total for k, v in spent.items()} if total > 0 else {})
        rates.append(n / secs)
        print(f"epoch {epoch}: {n} samples in {secs:.3f} s = {n / secs:,.0f} samples/s "
              f"(first batch after {(first or 0) * 1e3:.1f} ms)")
    runs = Runs(rates[skip:])
    steady = shares[skip:]
    which = f"epochs {skip}-{epochs - 1}" if epochs - skip > 1 else f"epoch {skip}"
    print(f"samples/s: {runs.text()} over {which}"
          + ("; epoch 0, which maps the shards and starts the threads, left out" if skip
             else ""))
    print(f"batch: {shapes}")
    st = loader.stats()
    mode = "settled" if st["settled"] else \
        "tuning" if st["auto_threads"] or st["auto_prefetch"] else "as given"
    print(f"settings in force: num_threads={st['num_threads']} prefetch={st['prefetch']}"
          f" ({mode})")
    print("The loop does nothing with the batches, so the loader sets the pace.")
    for line in where_the_time_goes(steady, STAGE_WHAT, in_cache, which, STAGE_SHORT):
        print(line)


def where_the_time_goes(shares: List[Dict[str, float]], what: Dict[str, str],
                        in_cache: Optional[float], runs_name: str,
                        short: Optional[Dict[str, str]] = None) -> List[str]:
    """Lines on the workers' time by stage over repeated runs (`shares`: one dict of
    stage -> fraction per run), and the leading stage only when it leads beyond the spread.
    `in_cache` is the fraction of the data's pages in page cache when the runs started
    (mincore; None: unknown): measured before a read stage is said to be storage."""
    shares = [s for s in shares if s]
    if not shares:
        return ["Where the workers' time goes: no worker time was measured."]
    stages = {k: Runs([s.get(k, 0.0) for s in shares]) for k in what}
    order = sorted((k for k in stages if stages[k].hi > 0.005),
                   key=lambda k: -stages[k].median)
    lines = ["Where the workers' time goes (" + runs_name + "): "
             + ", ".join(share_text((short or {}).get(k, k), stages[k].values)
                         for k in order) + "."]
    if len(shares) < 2:
        lines.append("One run: the spread is unknown, so no stage is named as the cause "
                     "(run more epochs or --repeats).")
        return lines
    top = order[0]
    rest = order[1:]
    if rest and not differs(stages[top], stages[rest[0]]):
        lines.append(f"No stage leads beyond the spread of these runs ({top} and {rest[0]} "
                     "overlap): no cause is named.")
        return lines
    evidence = f"{100 * stages[top].median:.0f}% of the workers' time, {len(shares)} runs"
    text = f"The largest part is {what[top]} ({evidence})"
    if top == "read":
        frac = in_cache
        if frac is None:
            text += "; whether the data was in page cache could not be measured."
        elif frac >= 0.99:
            text += (f"; the shards are {100 * frac:.0f}% in page cache (mincore), so this is "
                     "memory reads and checksums, not storage.")
        else:
            text += (f"; {100 * (1 - frac):.0f}% of the shards' pages are not in page cache "
                     "(mincore): part of it is storage.")
    else:
        text += "."
    lines.append(text)
    return lines
