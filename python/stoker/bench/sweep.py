"""``stoker bench DATASET --sweep``: batch size x threads on your own dataset.

For each (batch_size, num_threads) the loader runs for a few seconds, as fast as it can go
(the loop does nothing with the batches), and the table gives: samples/s once running, the
time to the first batch, the loop's data stall (the first batch left out), the bottleneck
and its stage, the workers' time per sample by stage, and the batch size in memory. Then the
setting that loads fastest, and, measured on this data, what a larger batch costs: why
"a larger batch makes training slower" when it does (docs/tuning.md).

Each point runs ``repeats`` times (3 by default); the table shows the median and the range
of samples/s, and a setting is preferred, or a cost named, only when the difference is
larger than the spread of the runs (:mod:`._spread`): two sweeps of the same data then
give the same recommendation, or say that the settings are within noise of each other.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .._progress import Progress
from ..dataset import Dataset
from ..loader import Loader
from ._spread import Runs, change_text, differs
from ._timing import warm

STAGES = ("read", "decode", "ops", "plan")


@dataclass
class Point:
    """One (batch_size, num_threads) of a sweep."""

    batch_size: int
    threads: int
    samples_per_second: float  # from the first batch to the end
    first_batch_seconds: float
    stall: float               # the loop's wait / its time, the first batch left out
    bottleneck: str            # "loader", "copy", "consumer"
    stage: Optional[str]       # the stage to fix, when the loader is the bottleneck
    batches: int
    batch_bytes: int
    prefetch: int              # the window in force at the end
    worker_ms_per_sample: Dict[str, float] = field(default_factory=dict)
    # every run of the setting (the fields above are those of its median run)
    rate_runs: Runs = field(default_factory=Runs)
    worker_ms_runs: Runs = field(default_factory=Runs)
    first_batch_runs: Runs = field(default_factory=Runs)
    stage_shares: List[Dict[str, float]] = field(default_factory=list)  # per run

    @property
    def worker_ms(self) -> float:
        return sum(self.worker_ms_per_sample.values())


def default_threads() -> List[int]:
    """1, 2, 4, ... up to the cores this process may use, and that number itself."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    out, t = [], 1
    while t < cores:
        out.append(t)
        t *= 2
    return out + [cores]


def default_batch_sizes(n: int) -> List[int]:
    """32 ... 512, as many as the dataset has room for (at least 4 batches)."""
    sizes = [b for b in (32, 64, 128, 256, 512) if 4 * b <= n]
    return sizes or [max(1, n // 4)]


# Batches before the timed part of a point: by then every batch buffer the loader keeps
# (the window and a couple more) has been written once, so page faults of fresh memory
# are not counted as the loader's pace.
WARM_BATCHES = 6


def measure(ds: Dataset, batch_size: int, threads: int, transforms: dict, seconds: float,
            epoch: int = 0) -> Point:
    """Runs one setting (epochs on end) and reads the loader's own figures. samples/s is
    timed over about `seconds` after WARM_BATCHES batches, or from the first batch when a
    setting is so slow that 4 x `seconds` pass first."""
    loader = Loader(ds, batch_size=batch_size, shuffle=True, num_threads=threads,
                    transforms=transforms, stall_warning=None, prefetch_next_epoch=True)
    t0 = time.perf_counter()
    t_first = t_mark = None
    first = marked = samples = batches = 0
    done = False
    while not done:
        loader.set_epoch(epoch)
        epoch += 1
        it = iter(loader)
        for b in it:
            now = time.perf_counter()
            rows = len(next(iter(b.values())))
            if t_first is None:
                t_first, first = now, rows
            samples += rows
            batches += 1
            if batches == WARM_BATCHES:
                t_mark, marked = now, samples
            if (t_mark is not None and now - t_mark >= seconds and batches >= WARM_BATCHES + 3) \
                    or (now - t_first >= 4 * seconds and batches >= 3):
                done = True
                break
        it.close()
    end = time.perf_counter()
    if t_mark is None or end <= t_mark:
        t_mark, marked = t_first, first
    s = loader.stats()
    loader.close()
    warmup = s["warmup_seconds"] or 0.0
    run = s["run_seconds"] - warmup
    stall = max(0.0, s["wait_seconds"] - warmup) / run if run > 0 else 0.0
    produced = max(1, s["samples"])
    p = Point(
        batch_size=batch_size, threads=threads,
        samples_per_second=(samples - marked) / (end - t_mark) if end > t_mark else 0.0,
        first_batch_seconds=t_first - t0, stall=min(1.0, stall),
        bottleneck=s["bottleneck"], stage=s["bottleneck_stage"], batches=batches,
        batch_bytes=s["batch_bytes"], prefetch=s["prefetch"],
        worker_ms_per_sample={k: 1e3 * s[k + "_seconds"] / produced for k in STAGES})
    p.rate_runs = Runs([p.samples_per_second])
    p.worker_ms_runs = Runs([p.worker_ms])
    p.first_batch_runs = Runs([p.first_batch_seconds])
    return p


def _median_point(runs: List[Point]) -> Point:
    """The median run by samples/s, carrying every run's figures."""
    ordered = sorted(runs, key=lambda p: p.samples_per_second)
    p = ordered[len(ordered) // 2]
    p.rate_runs = Runs([r.samples_per_second for r in runs])
    p.worker_ms_runs = Runs([r.worker_ms for r in runs])
    p.first_batch_runs = Runs([r.first_batch_seconds for r in runs])
    p.stage_shares = [{k: v / r.worker_ms for k, v in r.worker_ms_per_sample.items()}
                      for r in runs if r.worker_ms > 0]
    return p


def _transforms(ds: Dataset, image_size: int) -> dict:
    from .dataset import _stoker_transforms

    return _stoker_transforms(ds, image_size)


def sweep(path: str, batch_sizes: Optional[Sequence[int]] = None,
          threads: Optional[Sequence[int]] = None, image_size: int = 224,
          seconds: float = 3.0, repeats: int = 3, plot: Optional[str] = None,
          progress: bool = True) -> List[Point]:
    """Runs the sweep and prints the table, the recommendation and the batch-size answer;
    writes the plot to `plot` (a PNG; needs matplotlib: ``pip install matplotlib``).
    Returns the points (the median run of `repeats` per setting, by samples/s, with every
    run's figures in ``rate_runs``, ``worker_ms_runs`` and ``first_batch_runs``)."""
    if plot is not None:
        _need_matplotlib()
    ds = Dataset(path)
    if len(ds) == 0:
        raise ValueError(f"{ds.path}: the dataset has no samples to benchmark")
    batch_sizes = sorted(set(batch_sizes or default_batch_sizes(len(ds))))
    threads = sorted(set(threads or default_threads()))
    if any(b < 1 for b in batch_sizes) or any(t < 1 for t in threads):
        raise ValueError("batch sizes and thread counts must be positive")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    transforms = _transforms(ds, image_size)
    print(f"{ds.path}: {len(ds)} samples; batch_size x num_threads = "
          f"{batch_sizes} x {threads}, about {seconds:g} s each after the first batch, "
          f"median (range) of {repeats} run(s); transforms: "
          + (", ".join(f"{k}: {v}" for k, v in transforms.items()) or "none"), flush=True)
    warm(ds.path)
    total = len(batch_sizes) * len(threads) * repeats
    # Round-robin over the settings, repeat after repeat: a slow minute of a shared
    # machine then lands on one run of every setting, not on all runs of one.
    settings = [(b, t) for b in batch_sizes for t in threads]
    runs: Dict[tuple, List[Point]] = {k: [] for k in settings}
    with Progress(total, "stoker bench --sweep", unit="runs", enabled=progress) as bar:
        for r in range(repeats):
            for b, t in settings:
                bar.note(f"batch_size={b} num_threads={t}")
                runs[b, t].append(measure(ds, b, t, transforms, seconds, epoch=r))
                bar.update()
    points = [_median_point(runs[k]) for k in settings]
    print(table(points))
    print()
    from ._pagecache import resident_fraction

    in_cache = resident_fraction([os.path.join(ds.path, s["path"]) for s in ds.shards])
    from ..fields import Image

    print(recommend(points, in_cache, any(isinstance(f, Image) for f in ds.fields.values())))
    print()
    print(larger_batch(points))
    if plot is not None:
        write_plot(points, plot, ds.path)
        print(f"\nplot: {plot}")
    return points


def table(points: List[Point]) -> str:
    head = (f"{'batch':>6} {'threads':>7} {'samples/s (range)':>30} {'first batch':>12} "
            f"{'stall':>6}  {'bottleneck':<16} {'worker ms/sample read/decode/ops/plan':<38} "
            f"{'batch MB':>9}")
    lines = [head]
    for p in points:
        where = p.bottleneck + (f": {p.stage}" if p.stage else "")
        ms = "/".join(f"{p.worker_ms_per_sample[k]:.3g}" for k in STAGES)
        r = p.rate_runs
        rate = f"{r.median:,.0f}" + (f" ({r.lo:,.0f}-{r.hi:,.0f})" if r.n > 1 else "")
        lines.append(f"{p.batch_size:>6} {p.threads:>7} {rate:>30} "
                     f"{p.first_batch_seconds:>10.3f} s {100 * p.stall:>5.0f}%  {where:<16} "
                     f"{ms:<38} {p.batch_bytes / 1e6:>9.2f}")
    return "\n".join(lines)


def _name(p: Point) -> str:
    return f"batch_size={p.batch_size}, num_threads={p.threads}"


def recommend(points: List[Point], in_cache: Optional[float] = None,
              images: bool = True) -> str:
    """The fastest setting, those within the noise of it, and the thread count to use.
    `in_cache`: the fraction of the data in page cache (mincore), for a read-bound verdict;
    `images`: whether the data has image fields (what the decode stage is)."""
    from .demo import where_the_time_goes

    best = max(points, key=lambda p: p.samples_per_second)
    runs = best.rate_runs.n
    near = [p for p in points if p is not best and not differs(p.rate_runs, best.rate_runs)]
    most = max(p.threads for p in points)
    lines = [f"Fastest: {_name(best)}: {best.rate_runs.text(unit='samples/s')}."]
    if runs < 2:
        lines.append("One run per setting: the spread is unknown, and another sweep may rank "
                     "the settings differently (--repeats 3, the default, shows the noise).")
    elif near:
        lines.append("Within the noise of it (their ranges and its are not apart by more than "
                     f"the spread of {runs} runs): "
                     + "; ".join(f"{_name(p)} ({p.rate_runs.median:,.0f})" for p in near) + ".")
    else:
        lines.append(f"Faster than every other setting beyond the spread of {runs} runs.")
    candidates = [best] + near
    fewest = min(p.threads for p in candidates)
    if fewest == most:
        lines.append("Recommended: num_threads=None (the default): the loader starts with "
                     f"every core ({most}) and keeps as many working as the loop needs.")
    else:
        lines.append(f"Recommended: num_threads={fewest} loads as fast here"
                     + (" (within noise)" if fewest != best.threads else "")
                     + "; num_threads=None (the default) finds it by itself while training.")
    if best.bottleneck == "consumer":
        lines.append("The loop itself (Python, per-batch overhead) was the limit at that "
                     "setting: larger batches amortize it.")
    elif best.stage_shares:
        what = {"read": "reading and verifying records",
                "decode": "decoding" if images else "copying the fields into the batch",
                "ops": "image ops", "plan": "planning batches"}
        lines += where_the_time_goes(best.stage_shares, what, in_cache,
                                     f"{_name(best)}, {len(best.stage_shares)} runs")[1:]
    return "\n".join(lines)


def _change(a: Runs, b: Runs) -> str:
    return change_text(a.median, b.median)


def larger_batch(points: List[Point]) -> str:
    """What a larger batch costs here: the measured answer to "why does a larger batch make
    training slower", each difference named only when it is beyond the spread of the runs."""
    sizes = sorted({p.batch_size for p in points})
    by = {(p.batch_size, p.threads): p for p in points}
    rate_at = {t: statistics.mean(by[b, t].samples_per_second for b in sizes if (b, t) in by)
               for t in {p.threads for p in points}}
    t = max(rate_at, key=rate_at.get)
    row = [by[b, t] for b in sizes if (b, t) in by]
    lines = [f"Why a larger batch can make training slower, measured on this data "
             f"(num_threads={t}):"]
    if len(row) < 2:
        lines.append("  (one batch size only: pass --batch-sizes with several)")
        return "\n".join(lines)
    a, z = row[0], row[-1]
    slower = differs(a.rate_runs, z.rate_runs) and z.rate_runs.median < a.rate_runs.median
    faster = differs(a.rate_runs, z.rate_runs) and not slower
    lines.append(f"  batch_size {a.batch_size} -> {z.batch_size}: the loader gives "
                 f"{a.rate_runs.median:,.0f} -> {z.rate_runs.median:,.0f} samples/s "
                 f"({_change(a.rate_runs, z.rate_runs)}"
                 + ("" if slower or faster else ": within the noise of these runs") + ").")
    per_a, per_z = a.worker_ms, z.worker_ms
    if per_a > 0:
        grew = differs(a.worker_ms_runs, z.worker_ms_runs) and \
            z.worker_ms_runs.median > a.worker_ms_runs.median
        parts = ", ".join(
            f"{k} {change_text(a.worker_ms_per_sample[k], z.worker_ms_per_sample[k])}"
            for k in STAGES if a.worker_ms_per_sample[k] > 0.02 * per_a)
        lines.append(f"  - worker time per sample {per_a:.3g} -> {per_z:.3g} ms "
                     f"({_change(a.worker_ms_runs, z.worker_ms_runs)}: {parts})"
                     + (": the same work costs more per sample in larger batches, beyond the "
                        "spread of the runs" if grew else
                        ": within the noise of these runs" if not differs(
                            a.worker_ms_runs, z.worker_ms_runs) else ""))
    fa, fz = a.first_batch_runs, z.first_batch_runs
    lines.append(f"  - the first batch takes {fa.median:.3f} -> {fz.median:.3f} s"
                 + (": every start of a job or of an epoch without next-epoch prefetch waits "
                    "for it" if differs(fa, fz) else ": within the noise of these runs"))
    lines.append(f"  - the batches in flight hold {a.batch_bytes * a.prefetch / 1e6:.3g} -> "
                 f"{z.batch_bytes * z.prefetch / 1e6:.3g} MB ({a.prefetch} and {z.prefetch} "
                 "batches)")
    lines.append("  The loader's samples/s is the most the training loop can take: a model "
                 "step faster than these waits for data:")
    for p in row:
        lines.append(f"    batch_size={p.batch_size:<5} step < "
                     f"{1e3 * p.batch_size / max(p.samples_per_second, 1e-12):9.1f} ms")
    for t2 in sorted({p.threads for p in points}):
        row2 = [by[b, t2] for b in sizes if (b, t2) in by]
        if t2 == t or len(row2) < 2:
            continue
        a2, z2 = row2[0], row2[-1]
        if differs(a2.rate_runs, z2.rate_runs) and z2.rate_runs.median < a2.rate_runs.median \
                and a2.worker_ms > 0:
            grew = max(STAGES, key=lambda k: z2.worker_ms_per_sample[k] -
                       a2.worker_ms_per_sample[k])
            lines.append(f"  - at num_threads={t2}: {a2.samples_per_second:,.0f} -> "
                         f"{z2.samples_per_second:,.0f} samples/s "
                         f"({_change(a2.rate_runs, z2.rate_runs)}, beyond the spread); per "
                         f"sample, {grew} grew most ({a2.worker_ms_per_sample[grew]:.3g} -> "
                         f"{z2.worker_ms_per_sample[grew]:.3g} ms: writing fresh batch memory "
                         "the first time is charged to the stage that writes it)")
    if slower:
        loss = 1 - z.rate_runs.median / a.rate_runs.median
        lines.append(f"  Here a larger batch loads {change_text(1, 1 + loss)[1:]} slower per "
                     "sample, beyond "
                     "the spread of the runs; training slows too once the model's step at "
                     "that size is faster than the figure above.")
    else:
        lines.append("  Here a larger batch does not load measurably slower per sample: if "
                     "training slows with it, the loader is the cause only when the model's "
                     "step at that size is faster than the figure above (see "
                     "stats()['verdict'] while training).")
    return "\n".join(lines)


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib (stoker's [plot] "
                         "extra)") from None


def write_plot(points: List[Point], path: str, title: str) -> None:
    """samples/s and first-batch time against batch size (a line per thread count, each
    point the median with a bar from the slowest to the fastest run), and the workers' time
    per sample by stage at the fastest thread count. Every y axis starts at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({p.batch_size for p in points})
    threads = sorted({p.threads for p in points})
    by = {(p.batch_size, p.threads): p for p in points}
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    for t in threads:
        xs = [b for b in sizes if (b, t) in by]
        for a, get in ((ax[0], lambda p: p.rate_runs), (ax[1], lambda p: p.first_batch_runs)):
            r = [get(by[b, t]) for b in xs]
            a.errorbar(xs, [x.median for x in r],
                       yerr=[[x.median - x.lo for x in r], [x.hi - x.median for x in r]],
                       marker="o", capsize=3, label=f"num_threads={t}")
    best_t = max(threads, key=lambda t: max(by[b, t].samples_per_second for b in sizes
                                            if (b, t) in by))
    xs = [b for b in sizes if (b, best_t) in by]
    bottom = [0.0] * len(xs)
    for k in STAGES:
        vals = [by[b, best_t].worker_ms_per_sample[k] for b in xs]
        ax[2].bar([str(b) for b in xs], vals, bottom=bottom, label=k)
        bottom = [u + v for u, v in zip(bottom, vals)]
    for a in ax[:2]:
        a.set_xscale("log", base=2)
        a.set_xticks(sizes)
        a.set_xticklabels([str(b) for b in sizes])
        a.minorticks_off()
        a.set_xlabel("batch_size")
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    for a in ax:
        a.set_ylim(bottom=0)
    runs = max(p.rate_runs.n for p in points)
    ax[0].set_ylabel("samples/s")
    ax[0].set_title(f"loader throughput (median, range of {runs} runs)")
    ax[1].set_ylabel("seconds")
    ax[1].set_title("time to the first batch")
    ax[2].set_xlabel("batch_size")
    ax[2].set_ylabel("worker ms per sample")
    ax[2].set_title(f"worker time by stage (num_threads={best_t})")
    ax[2].legend(fontsize=8)
    fig.suptitle(f"stoker bench --sweep: {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
